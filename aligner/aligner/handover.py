"""Partition hand-over at a hot-swap, without I/O: the new version takes the target partitions the old
version wrote up to the swap epoch S and writes them from S+1, so a target of P partitions serves any
number of versions and a key keeps its partition across versions.

A new version joins the target as a writer of no partition (its output voided while it follows the old
one). At its first writing epoch S+1, once S is committed at the target, each of its producers takes its
partitions over in one compare-and-set of the writers document: every producer of the old version is
finished after S (all of them at the first take-over, so no epoch after S can expect them), and the
taker holds its partitions from S+1, starting where their last writer's range of S ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aligner.errors import AlignerError, PartitionClaimedError
from aligner.layout import split_writer
from aligner.models import WriterEntry, WritersNode


@dataclass(frozen=True)
class HandOver:
    """The outcome of one take-over: the writers document to write and where each partition comes from."""

    doc: WritersNode
    givers: dict[int, str | None]
    """Per partition taken: the writer that held it at S (its node has the offset S ended at), None for a
    partition nobody wrote up to S (it starts at the log end, as a new claim does)."""
    finished: tuple[str, ...]
    """The old version's writers this take-over finished after S (their nodes are fenced with it)."""


def take_over(doc: WritersNode, subject: str, taker: str, partitions: Sequence[int], giver_sink: str,
              last: int) -> HandOver | None:
    """``taker`` (a producer of the new version, already a writer of no partition) takes ``partitions``
    over from the producers of ``giver_sink`` (the old version) after their epoch ``last`` (S).

    Returns None when it holds them already (a retried take-over whose reply was lost). Raises
    PartitionClaimedError when another writer than the old version holds one of them after S.
    """
    parts = tuple(sorted(set(partitions)))
    if not parts or len(parts) != len(partitions):
        raise AlignerError(f"a take-over needs distinct partitions, got {list(partitions)}")
    mine = doc.writers.get(taker)
    if mine is None:
        raise AlignerError(f"producer {taker} is not a writer of {subject!r}: it joins before it takes partitions over")
    if mine.partitions:
        if mine.partitions == parts and mine.since == last + 1:
            return None
        raise AlignerError(f"producer {taker} writes partitions {list(mine.partitions)} from epoch {mine.since}; "
                           f"it cannot take {list(parts)} over from epoch {last + 1}")
    if mine.first_epoch > last + 1:
        raise AlignerError(f"producer {taker} joined the target at epoch {mine.first_epoch}, after the swap epoch "
                           f"{last}: it cannot write epoch {last + 1}")
    writers = dict(doc.writers)
    finished = []
    for writer, entry in doc.writers.items():
        if split_writer(writer)[0] != giver_sink or (entry.finished_after is not None and entry.finished_after <= last):
            continue
        if entry.finished_after is not None or entry.since > last:  # it wrote (or will write) past S
            raise AlignerError(f"producer {writer} of the old version writes epochs after the swap epoch {last}")
        writers[writer] = entry.model_copy(update={"finished_after": last})
        finished.append(writer)
    for p in parts:
        for writer, entry in writers.items():
            if writer != taker and p in entry.partitions and (entry.finished_after is None
                                                              or entry.finished_after > last):
                raise PartitionClaimedError(subject, p, writer, taker)
    givers = {p: WritersNode(writers=writers).owner_of(p, last) for p in parts}
    writers[taker] = WriterEntry(partitions=parts, first_epoch=mine.first_epoch, holds_from=last + 1)
    return HandOver(WritersNode(writers=writers), givers, tuple(finished))


def ownership(doc: WritersNode) -> list[tuple[int, str, int, int | None]]:
    """Who writes which partition over which epochs: (partition, writer, first epoch, last epoch or None),
    by partition then epoch: what ``aligner status`` shows of a target's versions."""
    rows = [(p, w, e.since, e.finished_after) for w, e in doc.writers.items() for p in e.partitions]
    return sorted(rows, key=lambda r: (r[0], r[2], r[1]))
