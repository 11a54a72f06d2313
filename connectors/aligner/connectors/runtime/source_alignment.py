"""The alignment I/O of a runtime worker's sources: commands in, consumer reports out; the rules are
:class:`aligner.alignment.ConsumerAlignment`'s.

Commands arrive through ZooKeeper data watches (re-armed by kazoo after outages) and are handed to
the alignment machine at the next check; its state sets the source's load limit, and every change
is reported on the worker's consumer node, which the coordinator aggregates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial

from aligner.alignment import Command, ConsumerAlignment, Receipt, aligned_together
from aligner.connectors.idle import Idle
from aligner.connectors.source import SubjectSource
from aligner.jobs import JobLedger
from aligner.models import ConsumerNode, Mode

log = logging.getLogger(__name__)


class SourceAlignment:
    def __init__(self, jobs: JobLedger, job: str, worker: int, inputs: Iterable[str], mode: Mode, idle: Idle) -> None:
        self.jobs = jobs
        self.job = job
        self.worker = worker
        self.mode = mode
        self.idle = idle
        self.states: dict[str, ConsumerAlignment] = {s: ConsumerAlignment() for s in inputs}
        self._commands: dict[str, Command] = {s: Command() for s in self.states}
        self._rejected: dict[str, int] = {}

    def follow(self) -> None:
        """Receive every source's commands (kazoo's DataWatch re-reads after a new session)."""
        for subject in self.states:
            self.jobs.follow_command(self.job, subject, partial(self._on_command, subject))

    def _on_command(self, subject: str, command: Command) -> None:
        self._commands[subject] = command
        self.idle.wake.set()

    def apply(self, source: SubjectSource, open_epoch: int, boundary: bool,
              report: Callable[[str], None]) -> None:
        """Hand new commands to the alignment machine; its state decides the source's load limit."""
        for subject, cmd in self._commands.items():
            new, receipt = self.states[subject].receive(cmd, open_epoch, source.next_load(subject), boundary)
            if receipt in (Receipt.IGNORED, Receipt.DEFERRED):
                continue
            if receipt is Receipt.REJECTED:
                self._rejected[subject] = cmd.seq  # reported until a later command; the coordinator retries
                log.info("%s worker %d: %s command %d rejected in state %s", self.job, self.worker, cmd.kind,
                         cmd.seq, self.states[subject].state.value)
            else:
                source.set_limit(subject, new.load_limit)
            self.states[subject] = new
            report(subject)

    def started(self, epoch: int) -> None:
        """Job epoch ``epoch`` starts: a consumer Aligning at J = ``epoch`` is Aligned from now on."""
        before = self.states
        self.states = {s: a.started(epoch) for s, a in before.items()}
        if self.states != before and all(a.aligned for a in self.states.values()) and not self.aligned:
            log.warning("%s worker %d: sources aligned at different job epochs (%s): its epochs run unaligned "
                        "until the coordinator aborts and aligns again", self.job, self.worker,
                        ", ".join(f"{s} at {a.job_epoch}" for s, a in self.states.items()))

    def node(self, subject: str, **fields: object) -> ConsumerNode:
        """The consumer node reporting ``subject``'s alignment (``fields``: epochs, swap seen, waiting)."""
        return ConsumerNode(alignment=self.states[subject], mode=self.mode_of(subject),
                            rejected_seq=self._rejected.get(subject, 0), **fields)

    def mode_of(self, subject: str) -> Mode:
        if self.states[subject].aligned:
            return "aligned"
        return "at_least_once" if self.mode == "at_least_once" else "exactly_once"

    @property
    def aligned(self) -> bool:
        """Every source aligned at one job epoch J. Sources aligned at different points (a split across
        sources) run unaligned epochs, nothing lost, until the coordinator aborts and aligns again."""
        return aligned_together(self.states.values())
