"""The swap I/O of a runtime worker: watch both swap nodes, acknowledge, wait; the rules are
:func:`aligner.epoch_step.step`'s.

A version is gated by the swap that hands it the target (the node of the job it follows) and by a
swap of itself for a newer version (its own node). Both arrive through ZooKeeper data watches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from aligner import epoch_step
from aligner.connectors.idle import Idle
from aligner.epoch_step import Act, EpochStep
from aligner.ledger import Ledger
from aligner.models import Phase, SwapNode
from aligner.zk import StoppedError

log = logging.getLogger(__name__)


class SwapGate:
    def __init__(self, ledger: Ledger, job: str, follows: str | None, idle: Idle,
                 report: Callable[[], None]) -> None:
        self.ledger = ledger
        self.job = job
        self.follows = follows
        self.idle = idle
        self.report = report
        self.incoming: SwapNode | None = None
        """For a new version: the swap that hands it the target (the swap node of the job it follows)."""
        self.outgoing: SwapNode | None = None
        """A swap of this version for a newer one (the swap node of this job)."""
        self.seen: epoch_step.Seen | None = None
        """The acknowledgement reported so far (in memory: a restarted worker acknowledges again)."""

    def follow(self) -> None:
        jobs = self.ledger.jobs
        if self.follows is not None:
            jobs.follow_swap(self.follows, self._on_incoming)
        jobs.follow_swap(self.job, self._on_outgoing)

    def _on_incoming(self, swap: SwapNode | None) -> None:
        self.incoming = swap
        self.idle.wake.set()

    def _on_outgoing(self, swap: SwapNode | None) -> None:
        self.outgoing = swap
        self.idle.wake.set()

    @property
    def swap(self) -> SwapNode | None:
        """The swap that gates the worker now: the one handing it the target until that is done, then
        a swap of it for a newer version."""
        if self.incoming is not None and self.incoming.phase != Phase.DONE:
            return self.incoming
        return self.outgoing

    def decide(self, epoch: int) -> EpochStep:
        """The step for ``epoch`` as things stand, its acknowledgement reported first."""
        decided = epoch_step.step(epoch, self.incoming, self.outgoing, self.follows is not None, self.seen)
        if decided.ack is not None:
            self.seen = decided.ack
            self.report()
        return decided

    def before(self, epoch: int, stop: threading.Event) -> EpochStep:
        """The step for ``epoch``; waits out a pre-commit at S+1 (woken by the swap watches)."""
        while (decided := self.decide(epoch)).act is Act.WAIT:
            self.idle.waiting(f"the outcome of the hot-swap at epoch {decided.swap.epoch if decided.swap else '?'}")
            self.idle.sleep(stop, 1.0)
        return decided

    def old_decides(self, epoch: int) -> bool:
        """A new version follows the old one's job epoch records until it writes."""
        return self.follows is not None and epoch_step.old_decides(self.incoming, epoch)

    def await_target(self, output: str, epoch: int | None, stop: threading.Event) -> None:
        if epoch is not None:
            await_target(self.ledger, self.job, output, epoch, stop)


def await_target(ledger: Ledger, job: str, output: str, epoch: int, stop: threading.Event | None = None) -> None:
    """The new version's S+1 commits only after S is committed at the target (by the old version)."""
    logged = False
    while not ledger.watches.wait_committed(output, epoch, timeout=1.0, stop=stop):
        if ledger.stopping() or (stop is not None and stop.is_set()):
            raise StoppedError(f"job {job!r}: stopped while waiting for epoch {epoch} of {output!r}")
        if not logged:
            log.info("job %s: waiting for %s epoch %d (the old version's last) before writing %d", job, output,
                     epoch, epoch + 1)
            logged = True
