"""The ZooKeeper half of a sink producer's epochs, apart from its leases: round trip 1 of each epoch (the
epoch's node, sent when the epoch begins and awaited before its Kafka commit), the commit point, and with
pipelined commits (``SinkProducer.commit(wait=False)``) the commit in flight until the sink waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aligner.connectors.lane import Written
from aligner.ledger import Contribution, Lease, Ledger, PendingCommit, PendingEpoch
from aligner.models import WritersNode
from aligner.ops import Op


@dataclass(frozen=True)
class Confirming:
    """An epoch whose Kafka transaction committed, with its ZooKeeper commit in flight (``commit(wait=False)``)."""

    pending: PendingCommit
    written: Mapping[str, Written]
    blocked: float
    """Seconds ``commit`` took to return: with the wait for the ZooKeeper reply, the epoch's commit time."""

    @property
    def epoch(self) -> int:
        return self.pending.epoch


@dataclass(frozen=True)
class Confirmed:
    """An epoch ZooKeeper committed: the leases carry the next epoch's versions and offsets."""

    epoch: int
    leases: list[Lease]
    written: Mapping[str, Written]
    seconds: float
    """The epoch's commit time, from its flush to ZooKeeper's reply."""


class SinkCommits:
    """Round trips to ZooKeeper of one sink producer's epochs; its leases stay with the sink."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.writers: dict[str, tuple[WritersNode, int]] = {}
        """Per subject: the writers document (and its version) its last epoch node was made with."""
        self.pending: list[PendingEpoch | str] = []
        """The open epoch's round trip 1 per subject: in flight, or (the subject's name) carried by the
        commit before it (see :meth:`ensure_async`)."""
        self.confirming: Confirming | None = None
        """The ZooKeeper commit in flight (``commit(wait=False)``), until the sink waited for it."""

    def reset(self) -> None:
        """The producer closed: a commit in flight is left to land or not; the next incarnation reads which."""
        self.pending = []
        self.confirming = None

    def forget(self, subject: str) -> None:
        """``subject``'s writers changed (or it is no longer written): its next epoch node is made afresh."""
        self.writers.pop(subject, None)

    def ensure_async(self, epoch: int, subjects: Iterable[str]) -> None:
        """Send round trip 1 of ``epoch`` (awaited in :meth:`ensured`, overlapping the epoch's sends); for a
        subject whose node the commit in flight makes (see CommitRecipes.commit_epoch_async), that commit is
        awaited instead."""
        ahead = self.confirming.pending.ahead if self.confirming is not None else {}
        self.pending = [s if s in ahead else self.ledger.commits.ensure_epoch_async(s, epoch, self.writers.get(s))
                        for s in subjects]

    def ensured(self, epoch: int) -> None:
        """Wait for the open epoch's round trip 1 (done already on a retried commit)."""
        while self.pending:
            ensure = self.pending[0]
            if not isinstance(ensure, str):
                self.writers[ensure.subject] = self.ledger.commits.epoch_ensured(ensure)
            elif ensure not in self.writers:  # the commit before could not make the node: the writers changed
                self.writers[ensure] = self.ledger.commits.ensure_epoch(ensure, epoch)
            self.pending.pop(0)

    def starts(self, leases: Mapping[str, Lease]) -> dict[str, Mapping[int, int]]:
        """Where the open epoch's ranges start in each subject: where the last epoch ended, committed or in flight."""
        if self.confirming is None:
            return {s: lease.node.next_offsets for s, lease in leases.items()}
        pending = self.confirming.pending
        return {c.lease.subject: n.next_offsets for c, n in zip(pending.contributions, pending.nodes, strict=True)}

    def commit(self, epoch: int, contributions: Sequence[Contribution], extra: Sequence[Op]) -> list[Lease]:
        """The commit point, waited for."""
        return self.ledger.commits.commit_epoch(epoch, contributions, extra)

    def send(self, epoch: int, contributions: Sequence[Contribution], extra: Sequence[Op],
             written: Mapping[str, Written], blocked: float) -> None:
        """The commit point, left in flight until :meth:`settle`."""
        pending = self.ledger.commits.commit_epoch_async(epoch, contributions, extra, self.writers)
        self.confirming = Confirming(pending, written, blocked)

    def settle(self) -> Confirmed | None:
        """Wait for the commit in flight, if any; raises what it failed with."""
        confirming, self.confirming = self.confirming, None
        if confirming is None:
            return None
        started = time.monotonic()
        leases, made = self.ledger.commits.epoch_committed(confirming.pending)
        for subject in confirming.pending.ahead:  # not made: the cached document is stale
            self.writers.pop(subject, None)
        self.writers.update(made)
        return Confirmed(confirming.epoch, leases, confirming.written, confirming.blocked + time.monotonic() - started)
