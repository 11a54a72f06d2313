"""Loading committed subject epochs into a source's partition bounds.

Each committed epoch's slices move the bounds of the partitions they cover and, where a stamp must be
checked, add a segment the fetch filters by; a partition first named by an epoch starts fetching at its
slice's start. A load limit per subject is how alignment works: a consumer that must end a job epoch
exactly at subject epoch k loads nothing past k.
"""

from __future__ import annotations

from aligner.connectors.kafka import end_offsets
from aligner.connectors.source.fetch import SourceFetch
from aligner.connectors.source.positions import UNBOUNDED, Input, Part, SourcePositions
from aligner.epochs import CommittedEpoch, check_retention
from aligner.errors import EpochNotCommittedError
from aligner.ledger import Ledger
from aligner.models import Mode


class EpochLoader:
    """Follows the subjects' committed epochs from the ledger, up to each subject's limit."""

    def __init__(self, ledger: Ledger, bootstrap: str, mode: Mode, positions: SourcePositions,
                 fetch: SourceFetch) -> None:
        self.ledger = ledger
        self.bootstrap = bootstrap
        self.mode = mode
        self.positions = positions
        self.fetch = fetch

    def load(self) -> int:
        """Load newly committed epochs (up to the limits); returns how many were loaded."""
        loaded = 0
        for inp in self.positions.inputs.values():
            inp.frontier = None
            while inp.limit is None or inp.next_load <= inp.limit:
                try:
                    committed = self.ledger.epochs.committed_if(inp.subject, inp.next_load)
                except EpochNotCommittedError:  # not even created yet
                    committed = None
                if committed is None:
                    inp.frontier = inp.next_load - 1 if inp.next_load > 0 else None
                    break
                self._add(inp, committed)
                inp.next_load += 1
                loaded += 1
        self.positions.advance_consumed()
        return loaded

    def _add(self, inp: Input, ce: CommittedEpoch) -> None:
        inp.loaded.append(ce)
        parts = self.positions.parts
        starting = [p for p in inp.partitions if p in ce.slices and parts[(inp.subject, p)].pos is None]
        log_starts = end_offsets(self.bootstrap, inp.topic, starting, earliest=True) if starting else {}
        new: list[Part] = []
        for p in inp.partitions:
            sl = ce.slices.get(p)
            if sl is None:
                continue
            part = parts[(inp.subject, p)]
            if part.pos is None:
                part.pos = sl.start
                check_retention(inp.subject, ce.epoch, p, sl.start, log_starts[p])
                new.append(part)
            if not sl.empty and sl.end > part.pos and self.mode != "at_least_once":  # it reads unfiltered
                part.segments.append((ce.epoch, sl.start, sl.end, sl.stamp, sl))
            part.bound = UNBOUNDED if self.mode == "at_least_once" else max(part.bound, sl.end)
        self.fetch.fetch_from(new)

    def second_last_ahead(self) -> bool:
        """Thesis 5.6 Ready test: at or past the second-last committed epoch of every subject."""
        for subject, inp in self.positions.inputs.items():
            # What the last load found (it ran within this epoch) saves listing the subject's epochs each epoch.
            frontier = inp.frontier if inp.frontier is not None else self.ledger.epochs.frontier(subject)
            if frontier is not None and frontier >= 1 and inp.consumed < frontier - 1:
                return False
        return True
