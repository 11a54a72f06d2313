"""One writer's partition of a subject as it committed it: what a state restore reads from the ledger.

A job's changelog subject has one producer per partition (its worker). A restore replays that producer's
ranges only, and must not wait for the other workers still writing an epoch: where the whole subject has
not committed an epoch yet, the owner's own contribution says what it wrote. The runtime engine holds this
recipe over a ledger (``ChangelogReads(ledger, ledger.epochs)``), as the Spark adapter holds its batch commit.
"""

from __future__ import annotations

from collections.abc import Callable

from kazoo.exceptions import NoNodeError

from aligner.epochs import Slice
from aligner.errors import EpochNotCommittedError
from aligner.layout import split_writer
from aligner.models import ContributionNode, ProducerNode
from aligner.recipes.reads import EpochReads
from aligner.recipes.store import Store
from aligner.stamps import Stamp


class ChangelogReads:
    """Reads of one writer's partition (``owner``: its ``sink:producer``), for an exact replay."""

    def __init__(self, store: Store, epochs: EpochReads) -> None:
        self.store = store
        self.epochs = epochs

    def contribution(self, subject: str, owner: str, epoch: int) -> ContributionNode:
        """The owner's contribution to ``epoch``; :class:`EpochNotCommittedError` when it has not committed it."""
        try:
            return self.store.read(ContributionNode, self.store.layout.contribution(subject, epoch, owner))[0]
        except NoNodeError:
            raise EpochNotCommittedError(subject, epoch, f"producer {owner} has not committed it") from None

    def end_at(self, subject: str, owner: str, partition: int, epoch: int) -> int | None:
        """The partition's range end in the owner's contribution to ``epoch`` (None: not committed, or no range):
        what a local store tagged with ``epoch`` is checked against before it is trusted."""
        try:
            rng = self.contribution(subject, owner, epoch).ranges.get(partition)
        except EpochNotCommittedError:
            return None
        return None if rng is None else rng.end

    def slices(self, subject: str, owner: str, writes: Callable[[int], bool], partition: int,
               first: int, last: int) -> dict[int, Slice]:
        """The partition's slice in each epoch of [first, last]; pipelined reads for the epochs the whole
        subject committed, one read of the owner's contribution for each epoch others still write."""
        out: dict[int, Slice] = {}
        e = first
        while e <= last:
            try:
                committed = self.epochs.committed_many(subject, e, last)
                bad = last + 1
            except EpochNotCommittedError as exc:
                bad = exc.epoch
                committed = self.epochs.committed_many(subject, e, bad - 1) if bad > e else []
            for ce in committed:
                sl = ce.slices.get(partition)
                if sl is not None:
                    out[ce.epoch] = sl
            if bad <= last and writes(bad):
                c = self.contribution(subject, owner, bad)
                rng = c.ranges.get(partition)
                if rng is not None:
                    stamp = None if c.attempt is None else Stamp(c.sink, bad, c.attempt).encode()
                    out[bad] = Slice(partition, rng.start, rng.end, stamp, c.counts.get(partition), c.sink)
            e = bad + 1
        return out

    def committed_position(self, subject: str, owner: str, partition: int) -> int | None:
        """The offset after the owner's last counted range of ``partition`` (None: it has none): records from
        there on are of attempts ZooKeeper never counted."""
        sink, producer = split_writer(owner)
        node, _ = self.store.read(ProducerNode, self.store.layout.producer(subject, sink, producer))
        return node.next_offsets.get(partition)
