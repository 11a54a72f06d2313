"""Pure epoch logic: when an epoch is committed, what its ranges are, how epoch specs parse."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aligner.errors import AlignerError, EpochNotCommittedError, EpochOutOfRetentionError
from aligner.models import ContributionNode, EpochNode, Range
from aligner.stamps import Stamp


@dataclass(frozen=True, slots=True)
class Slice:
    """One partition of a committed epoch: its range and the stamp a record must carry to count."""

    partition: int
    start: int
    end: int
    stamp: bytes | None
    count: int | None = None
    """Records the committed attempt wrote in [start, end), when its writer recorded it."""
    sink: str = ""
    """The sink whose producer wrote it (a job's sink is the job): which writer's records these are, stamped or not."""

    @property
    def empty(self) -> bool:
        return self.start == self.end

    def only_committed(self, seen: int) -> bool:
        """Whether the ``seen`` records a reader found in [start, end), all visible ones, are the committed
        attempt's: that attempt's ``count`` records all lie in the range, so when the reader saw exactly that
        many, nothing else lies among them and their stamps need no check."""
        return self.stamp is None or self.count == seen

    def only_committed_from(self, first: int) -> bool:
        """Whether every record from offset ``first`` to the range's end is the committed attempt's, for a
        reader that saw no record in [start, first): that attempt's ``count`` records all lie in the range
        and are visible, so when [first, end) has room for exactly that many, nothing else lies among them
        and their stamps need no check (the previous epoch's commit marker usually sits at ``start``)."""
        return self.stamp is None or (self.count is not None and self.end - first == self.count)


@dataclass(frozen=True)
class CommittedEpoch:
    subject: str
    epoch: int
    slices: Mapping[int, Slice]
    committed_at: int

    @property
    def offsets(self) -> dict[int, tuple[int, int]]:
        return {p: (s.start, s.end) for p, s in sorted(self.slices.items())}


def missing_writers(node: EpochNode, contributed: set[str]) -> list[str]:
    return sorted(set(node.writers) - contributed)


def assemble(subject: str, node: EpochNode, contributions: Mapping[str, ContributionNode]) -> CommittedEpoch:
    """An epoch is committed once every expected writer has contributed; then its slices are fixed."""
    if not node.writers:
        raise EpochNotCommittedError(subject, node.epoch, "no producer writes this subject yet")
    missing = missing_writers(node, set(contributions))
    if missing:
        raise EpochNotCommittedError(subject, node.epoch, f"waiting for producers {', '.join(missing)}")
    slices: dict[int, Slice] = {}
    for writer in node.writers:
        c = contributions[writer]
        stamp = None if c.attempt is None else Stamp(c.sink, node.epoch, c.attempt).encode()
        for partition, rng in c.ranges.items():
            if partition in slices:
                raise AlignerError(f"epoch {node.epoch} of {subject!r}: partition {partition} contributed twice")
            slices[partition] = Slice(partition, rng.start, rng.end, stamp, c.counts.get(partition), c.sink)
    return CommittedEpoch(subject, node.epoch, slices, max(c.committed_at for c in contributions.values()))


def ranges_for(next_offsets: Mapping[int, int], last_delivered: Mapping[int, int]) -> dict[int, Range]:
    """Ranges of an epoch from where it started and the last delivered offset per partition."""
    return {
        p: Range(start=start, end=max(start, last_delivered[p] + 1) if p in last_delivered else start)
        for p, start in next_offsets.items()
    }


def dense_ranges(starts: Mapping[int, int], first: Mapping[int, int], last: Mapping[int, int],
                 counts: Mapping[int, int]) -> dict[int, Range] | None:
    """The ranges of an epoch written without stamps, or None when it needs them.

    A partition's range is [first, last + 1) from the delivery reports of its first and last record. When
    that range has room for exactly the ``count`` records the attempt wrote, each offset in it holds one of
    them: nothing else (another writer's record, an aborted attempt's, a commit marker) lies among them, so
    a reader keeps every record in the range and needs no stamp. Offsets before ``first`` (the previous
    transaction's marker, records of earlier attempts) fall outside the range. A partition without records
    gets the empty range at its start. Any other partition (a report missing, or records of another writer
    among this attempt's) makes the whole epoch need stamps: None."""
    ranges = {}
    for p, start in starts.items():
        n = counts.get(p, 0)
        if n == 0:
            ranges[p] = Range(start=start, end=start)
            continue
        if p not in first or p not in last or first[p] < start or last[p] - first[p] + 1 != n:
            return None
        ranges[p] = Range(start=first[p], end=last[p] + 1)
    return ranges


def parse_epoch_span(spec: str) -> tuple[int, int]:
    """'A:B' (inclusive) or 'N' into (first, last)."""
    try:
        if ":" in spec:
            a, b = spec.split(":", 1)
            first, last = int(a), int(b)
        else:
            first = last = int(spec)
    except ValueError:
        raise ValueError(f"epoch span {spec!r} is not N or A:B with integers") from None
    if first < 0 or last < first:
        raise ValueError(f"epoch span {spec!r} must satisfy 0 <= A <= B")
    return first, last


def check_retention(subject: str, epoch: int, partition: int, start: int, log_start: int) -> None:
    """Refuse a read whose first offset the log no longer holds: a short read would look exact."""
    if log_start > start:
        raise EpochOutOfRetentionError(subject, epoch, partition, start, log_start)
