"""The source of a job: one consumer's partitions of every input subject, made of its parts.

``SourcePositions`` holds where each partition stands, ``EpochLoader`` moves the bounds as subject epochs
commit, ``SourceFetch`` owns the consumer and cuts what it fetches into the loaded epochs' records, and
``SourceWatchdog`` looks after a fetch that stalls. This class is what the engines call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer

from aligner.connectors.source.fetch import SourceFetch
from aligner.connectors.source.loader import EpochLoader
from aligner.connectors.source.positions import SourcePositions
from aligner.connectors.source.record import Records
from aligner.connectors.source.watch import SourceWatchdog
from aligner.ledger import Ledger
from aligner.models import Mode


class SubjectSource:
    """What the runtime, Faust and the experiments call; each call goes to the part whose job it is."""

    def __init__(self, ledger: Ledger, bootstrap: str, assignment: Mapping[str, Sequence[int]],
                 mode: Mode = "exactly_once", name: str | None = None) -> None:
        self.ledger = ledger
        self.bootstrap = bootstrap
        self.mode = mode
        self.name = name or f"source of {', '.join(assignment)}"
        self.positions = SourcePositions(ledger, assignment)
        self.inputs = self.positions.inputs
        self.parts = self.positions.parts
        self._fetch = SourceFetch(ledger, bootstrap, mode, self.positions)
        self._loader = EpochLoader(ledger, bootstrap, mode, self.positions, self._fetch)
        self._watchdog = SourceWatchdog(self.name, self._fetch)

    @property
    def _consumer(self) -> Consumer:
        """The fetch's consumer (the benchmarks wrap it in a counting or timing proxy)."""
        return self._fetch.consumer

    @_consumer.setter
    def _consumer(self, consumer: Consumer) -> None:
        self._fetch.consumer = consumer

    def close(self) -> None:
        self._watchdog.close()
        self._fetch.close()

    # ---- positions ----------------------------------------------------------------------------

    def restore(self, offsets: Mapping[str, Mapping[int, int]], load_from: Mapping[str, int]) -> None:
        """Resume from a committed job epoch: positions and the first epoch still to consume."""
        self._fetch.fetch_from(self.positions.restore(offsets, load_from))

    def offsets(self) -> dict[str, dict[int, int]]:
        return self.positions.offsets()

    def load_from(self) -> dict[str, int]:
        return self.positions.load_from()

    def consumed(self, subject: str) -> int:
        """Last subject epoch this consumer has fully consumed on all of its partitions."""
        return self.inputs[subject].consumed

    def set_limit(self, subject: str, last_epoch: int | None) -> None:
        """Load no subject epoch after ``last_epoch`` (None: no limit)."""
        self.inputs[subject].limit = last_epoch

    def next_load(self, subject: str) -> int:
        """The next subject epoch this consumer will load once it commits (it may have read anything before)."""
        return self.inputs[subject].next_load

    # ---- loading committed epochs ---------------------------------------------------------------

    def load(self) -> int:
        """Load newly committed epochs (up to the limits); returns how many were loaded."""
        return self._loader.load()

    def readable(self) -> bool:
        """Whether any partition still has loaded data to read."""
        return self.positions.readable()

    def caught_up(self) -> bool:
        """Every loaded epoch fully consumed: nothing to read until the next epoch commits."""
        return self.positions.caught_up()

    def second_last_ahead(self) -> bool:
        """Thesis 5.6 Ready test: at or past the second-last committed epoch of every subject."""
        return self._loader.second_last_ahead()

    # ---- reading ------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.005, max_records: int = 10000) -> Records:
        """Kept records of loaded epochs, in offset order per partition."""
        out = self._fetch.poll(timeout, max_records)
        self._watchdog.watch()
        return out

    def stalled(self) -> dict[str, tuple[float, str]]:
        """Partitions reported stalled now: "topic[partition]" -> (seconds without progress, cause)."""
        return self._watchdog.stalled()
