"""The coverage I/O of a runtime worker's aligned job epochs; the rules are :func:`aligner.coverage.step`'s.

The first worker to start job epoch E records which subject epochs it covers (create-if-absent),
every other worker, and a new version following the job in a hot-swap, reads that record. Waits are
woken by ZooKeeper watches: on the subject epochs it needs (zero alignment shift, thesis 6.4.1) or
on the old version's record of E.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from aligner import coverage
from aligner.alignment import ConsumerAlignment
from aligner.connectors.idle import Idle
from aligner.coverage import Coverage, Next
from aligner.errors import AlignerError, ContestedCoverageError
from aligner.jobs import PendingJobEpoch
from aligner.ledger import Ledger
from aligner.models import JobEpochNode, Span

log = logging.getLogger(__name__)


class JobEpochs:
    def __init__(self, ledger: Ledger, line: str, per: int, follows: bool, idle: Idle) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs
        self.line = line
        """Whose job epoch nodes are used: the first version's, so every version covers the same input."""
        self.per = per
        self.follows = follows
        self.idle = idle
        self._never: int | None = None
        """The epoch last found never to be decided by the line (warned once)."""
        self._last: JobEpochNode | None = None
        """The job epoch ``covered`` returned last (immutable once recorded): the next epoch starts from it."""
        self._pending: PendingJobEpoch | None = None
        """The record of the job epoch ``covered`` returned last while its create is in flight (see ``confirm``)."""
        self._contested: int | None = None
        """A job epoch whose record turned out to be another's: its next attempt reads before deciding."""

    def covered(self, epoch: int, alignments: Mapping[str, ConsumerAlignment], old_decides: Callable[[int], bool],
                inputs_finished: Callable[[], bool], stop: threading.Event) -> dict[str, Span | None]:
        """The subject epochs aligned job epoch ``epoch`` covers: recorded once, by the first to decide."""
        start: dict[str, int] | None = None
        # A version that decides for itself tries its own decision first: recording it is create-if-absent
        # and hands back another worker's earlier record, so the read of that record is needed only when
        # this worker cannot decide yet (one ZooKeeper round trip less per epoch).
        unread = not old_decides(epoch) and epoch != self._contested
        self._pending = None
        while True:
            recorded = None if unread else self.jobs.job_epoch(self.line, epoch)
            follow = recorded is None and old_decides(epoch) and not inputs_finished()
            if recorded is None and not follow and start is None:
                start = self._start(epoch, alignments)
            frontier, finished = self._observe(start) if recorded is None and not follow else ({}, {})
            decided = coverage.step(_coverage(recorded), follow, start, self.per, frontier, finished)
            if decided.next is Next.DECIDED:
                self._last = recorded
                self._prefetch()
                return dict(decided.coverage.covered)  # type: ignore[union-attr]
            if decided.next is Next.DECIDE:
                assert decided.coverage is not None
                self.idle.got_input()
                pending = self.jobs.fix_job_epoch_async(self.line, epoch, decided.coverage.covered,
                                                        decided.coverage.next)
                if self._sure(start, epoch):  # no other record can differ: read on while the create travels
                    self._pending, self._last = pending, pending.node
                else:
                    self._last = pending.get()
                self._prefetch()
                return dict(self._last.covered)
            if unread:  # perhaps another worker already recorded it: read before waiting
                unread = False
                continue
            self._wait(epoch, decided.next, start, stop)

    def _sure(self, start: Mapping[str, int] | None, epoch: int) -> bool:
        """Whether this worker's decision is the only one possible, so the job epoch may run before its record
        is confirmed. With one input subject it is: every worker starts the epoch at the same subject epoch
        (the previous record's ``next``, or the alignment's k) and covers exactly the epochs it waits for,
        whenever it decides. With several, a worker deciding later may take more of a subject that committed
        meanwhile, so the first record is waited for."""
        return start is not None and len(start) == 1 and epoch != self._contested

    def confirm(self, epoch: int) -> None:
        """Before the epoch's Kafka commit: the record created while it ran stands. If another one does (which
        ``_sure`` rules out, unless the job's versions decide differently), the epoch read the wrong input:
        :class:`ContestedCoverageError` aborts it, and its next attempt reads the record first."""
        pending, self._pending = self._pending, None
        if pending is None or pending.node.epoch != epoch:
            return
        stands = pending.get()
        self._last = stands
        if stands.covered != pending.node.covered:
            self._contested = epoch
            raise ContestedCoverageError(
                f"job {self.line!r} epoch {epoch}: another worker recorded coverage {stands.covered}, this one read "
                f"{pending.node.covered}; the epoch is aborted and read again")

    def _prefetch(self) -> None:
        """The subject epochs the next two job epochs cover, read while this one runs (when committed): the
        next job epoch starts without a read, and its source fetches on past its bound (see ``SubjectSource``)."""
        assert self._last is not None
        for subject, first in self._last.next.items():
            for e in range(first, first + 2 * self.per):
                self.ledger.epochs.prefetch_committed(subject, e)

    def _start(self, epoch: int, alignments: Mapping[str, ConsumerAlignment]) -> dict[str, int]:
        last = self._last
        previous = last if last is not None and last.epoch == epoch - 1 else self.jobs.job_epoch(self.line, epoch - 1)
        return coverage.starts(epoch, alignments, previous.next if previous else None, self.follows)

    def _observe(self, start: Mapping[str, int] | None) -> tuple[dict[str, int | None], dict[str, int | None]]:
        """Each subject's committed prefix from ``start``. Read first: epochs already committed (a job catching
        up) cost no watch; a prefix found short is read again after its watch is armed, so no commit is missed."""
        assert start is not None
        finished = {s: self.ledger.epochs.finished_watched(s) for s in start}
        wanted = {s: coverage.wanted(first, self.per, finished[s]) for s, first in start.items()}
        prefix = {s: self._committed_prefix(s, first, wanted[s]) for s, first in start.items()}
        for s, first in start.items():
            if prefix[s] < wanted[s]:
                self.watch_epoch(s, first + self.per - 1)
                finished[s] = self.ledger.epochs.finished_watched(s)
                wanted[s] = coverage.wanted(first, self.per, finished[s])
                prefix[s] += self._committed_prefix(s, first + prefix[s], wanted[s] - prefix[s])
        return {s: first + prefix[s] - 1 for s, first in start.items()}, finished

    def _wait(self, epoch: int, why: Next, start: Mapping[str, int] | None, stop: threading.Event) -> None:
        if why is Next.FOLLOW:
            path = self.ledger.layout.job_epoch(self.line, epoch)
            self.idle.arm(path, lambda cb: self.ledger.watches.watch_node(path, cb))
            if self.jobs.job_epoch(self.line, epoch) is not None:
                return
            self.idle.waiting(self._follow_wait(epoch))
        else:
            self.idle.waiting(f"subject epochs {start} to commit")
        self.idle.sleep(stop, 1.0)

    def _follow_wait(self, epoch: int) -> str:
        """What a follower waits for, and, when the line's records show it never comes, why (once, loudly)."""
        first = self.jobs.first_job_epoch(self.line)
        if first is None or first <= epoch:
            return f"{self.line} to decide job epoch {epoch}"
        why = (f"{self.line} to decide job epoch {epoch}, which it never will: its job epochs run from {first} "
               f"(it was not aligned when this version joined at {epoch}, or they were collected); stop this "
               f"version, align {self.line} and start the new version again under a new name")
        if self._never != epoch:
            self._never = epoch
            log.warning("%s", why)
        return why

    def watch_epoch(self, subject: str, epoch: int) -> None:
        watches = self.ledger.watches
        self.idle.arm(self.ledger.layout.epoch(subject, epoch), lambda cb: watches.arm_watch(subject, epoch, cb))

    def _committed_prefix(self, subject: str, start: int, per: int) -> int:
        n = 0
        while n < per:
            try:  # read whole: the source loads the same epochs next, from the ledger's cache
                if self.ledger.epochs.committed_if(subject, start + n) is None:
                    break
            except AlignerError:
                break
            n += 1
        return n


def _coverage(node: JobEpochNode | None) -> Coverage | None:
    return None if node is None else Coverage(covered=node.covered, next=node.next)
