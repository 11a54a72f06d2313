"""Where a source stands: each partition's position and bound, each subject's loaded and consumed epochs.

Positions are the source's part of a committed job epoch: ``restore`` puts them back, ``offsets`` and
``load_from`` are what the next job epoch commits. The loader moves bounds, the fetch moves positions;
a subject epoch is consumed once every partition's position reaches its end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aligner.ledger import Ledger

UNBOUNDED = 1 << 62


@dataclass
class Part:
    subject: str
    topic: str
    partition: int
    pos: int | None = None
    bound: int = 0
    segments: deque = field(default_factory=deque)  # (epoch, start, end, stamp or None once unneeded, Slice)
    paused: bool = False
    """Stopped at its bound; ``stash`` holds records fetched past it, ``fetch_at`` follows them."""
    stash: list = field(default_factory=list)
    fetch_at: int = 0
    fetching: bool = False
    """Assigned in the consumer. A paused partition fetches on, into the stash, while its subject's next
    epoch is committed already (see ``SourceFetch._fetch_ahead``)."""


@dataclass
class Input:
    subject: str
    topic: str
    partitions: list[int]
    next_load: int
    limit: int | None = None
    loaded: deque = field(default_factory=deque)  # CommittedEpoch, oldest first
    consumed: int = -1
    frontier: int | None = None
    """The subject's frontier as the last ``load`` found it (the epoch before the first uncommitted one:
    committed epochs are a prefix); None when a limit stopped that load first."""


class SourcePositions:
    """The per-subject and per-partition state every other part of the source reads and moves."""

    def __init__(self, ledger: Ledger, assignment: Mapping[str, Sequence[int]]) -> None:
        self.inputs: dict[str, Input] = {}
        self.parts: dict[tuple[str, int], Part] = {}
        self.by_topic: dict[tuple[str, int], Part] = {}
        """The same parts by (topic, partition): how fetched messages find theirs."""
        for subject, partitions in assignment.items():
            topic = ledger.subjects.subject(subject).topic
            first = ledger.subjects.first_epoch(subject)
            self.inputs[subject] = Input(subject, topic, list(partitions), first if first is not None else 0)
            for p in partitions:
                part = Part(subject, topic, p)
                self.parts[(subject, p)] = part
                self.by_topic[(topic, p)] = part

    def restore(self, offsets: Mapping[str, Mapping[int, int]], load_from: Mapping[str, int]) -> list[Part]:
        """Resume from a committed job epoch; returns the partitions to fetch from their restored positions."""
        restored = []
        for subject, inp in self.inputs.items():
            inp.next_load = load_from.get(subject, inp.next_load)
            inp.consumed = inp.next_load - 1
            for p, off in offsets.get(subject, {}).items():
                if (subject, p) in self.parts:
                    self.parts[(subject, p)].pos = off
                    restored.append(self.parts[(subject, p)])
        return restored

    def offsets(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {s: {} for s in self.inputs}
        for part in self.parts.values():
            if part.pos is not None:
                out[part.subject][part.partition] = part.pos
        return out

    def load_from(self) -> dict[str, int]:
        return {s: inp.consumed + 1 for s, inp in self.inputs.items()}

    def advance_consumed(self) -> None:
        """Mark consumed the loaded epochs whose ends every partition's position has reached."""
        for inp in self.inputs.values():
            while inp.loaded:
                ce = inp.loaded[0]
                done = all(
                    self.parts[(inp.subject, p)].pos is not None and self.parts[(inp.subject, p)].pos >= sl.end
                    for p, sl in ce.slices.items() if (inp.subject, p) in self.parts
                )
                if not done:
                    break
                inp.loaded.popleft()
                inp.consumed = ce.epoch

    def readable(self) -> bool:
        """Whether any partition still has loaded data to read."""
        return any(p.pos is not None and p.pos < p.bound for p in self.parts.values())

    def caught_up(self) -> bool:
        """Every loaded epoch fully consumed: nothing to read until the next epoch commits."""
        return all(not inp.loaded for inp in self.inputs.values())
