"""The alignment protocol (thesis 5.6) as a pure state machine.

The coordinator writes commands to a source's command node; every consumer applies them to its
own state and reports it; the source's state is the aggregate of its consumers'.

    Unaligned --CatchUp--> CatchingUp --(ahead of 2nd-last committed epoch)--> Ready
    Ready --Align(k, J)--> Aligning --(job epoch J starts at subject epoch k)--> Aligned(k)
    any --Abort--> Unaligned

``Align`` names both the subject epoch ``k`` the source aligns on and the job epoch ``J`` that
will start exactly there, so every consumer of the job switches at the same job epoch and the
job's epochs map to the same subject epochs whichever consumer is asked.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from aligner.errors import AlignerError, AlignmentSplitError, IllegalTransition


class State(StrEnum):
    UNALIGNED = "unaligned"
    CATCHING_UP = "catching_up"
    READY = "ready"
    ALIGNING = "aligning"
    ALIGNED = "aligned"


_ORDER = {s: i for i, s in enumerate(State)}

CommandKind = Literal["none", "catch_up", "align", "abort"]


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = 0
    kind: CommandKind = "none"
    subject_epoch: int | None = None
    """k: the first subject epoch of the aligned run (align only)."""
    job_epoch: int | None = None
    """J: the job epoch that starts exactly at subject epoch k (align only)."""


class Receipt(StrEnum):
    """What a consumer did with a command."""

    APPLIED = "applied"
    REJECTED = "rejected"
    """Skipped for good (too late, or not fitting the state); reported so the coordinator retries."""
    DEFERRED = "deferred"
    """Kept for the next job epoch boundary (Abort)."""
    IGNORED = "ignored"
    """Already applied, or no command."""


class ConsumerAlignment(BaseModel):
    """One consumer's alignment state; stored in its ZooKeeper node, changed only here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: State = State.UNALIGNED
    applied_seq: int = 0
    subject_epoch: int | None = None
    job_epoch: int | None = None

    def apply(self, command: Command) -> ConsumerAlignment:
        """Apply a command once (commands are numbered; an old one is a no-op)."""
        if command.seq <= self.applied_seq or command.kind == "none":
            return self
        seq = command.seq
        if command.kind == "abort":
            return ConsumerAlignment(applied_seq=seq)
        if command.kind == "catch_up":
            if self.state is not State.UNALIGNED:
                raise IllegalTransition(self.state, "CatchUp")
            return ConsumerAlignment(state=State.CATCHING_UP, applied_seq=seq)
        if self.state is not State.READY:
            raise IllegalTransition(self.state, "Align")
        if command.subject_epoch is None or command.job_epoch is None:
            raise AlignerError("Align needs a subject epoch k and a job epoch J")
        return ConsumerAlignment(state=State.ALIGNING, applied_seq=seq,
                                 subject_epoch=command.subject_epoch, job_epoch=command.job_epoch)

    def caught_up(self, ahead: bool) -> ConsumerAlignment:
        """After a checkpoint: CatchingUp becomes Ready once ahead of the second-last committed epoch."""
        if self.state is State.CATCHING_UP and ahead:
            return self.model_copy(update={"state": State.READY})
        return self

    def accepts(self, command: Command, open_epoch: int) -> bool:
        """Whether Align(k, J) can still be honoured: job epoch J must not have started yet."""
        return command.job_epoch is not None and open_epoch < command.job_epoch

    def started(self, job_epoch: int) -> ConsumerAlignment:
        """A job epoch starts; Aligning becomes Aligned from the agreed job epoch J on."""
        if self.state is State.ALIGNING and self.job_epoch is not None and job_epoch >= self.job_epoch:
            return self.model_copy(update={"state": State.ALIGNED})
        return self

    def receive(self, command: Command, open_epoch: int, next_load: int, boundary: bool,
                ) -> tuple[ConsumerAlignment, Receipt]:
        """A consumer's whole rule for a command that arrived while job epoch ``open_epoch`` is open.

        ``next_load``: the next subject epoch it would load (it may have read anything before it);
        ``boundary``: between job epochs. Align is taken at once (so the consumer stops loading
        past k) if it is Ready and can still honour it: J not started, k not loaded. Abort waits
        for a boundary. A command that does not fit the state is rejected, not fatal: the
        coordinator sees the state it left the consumer in and retries.
        """
        if command.seq <= self.applied_seq or command.kind == "none":
            return self, Receipt.IGNORED
        if command.kind == "abort" and not boundary:
            return self, Receipt.DEFERRED
        if command.kind == "align":
            late = not self.accepts(command, open_epoch) or next_load > (command.subject_epoch or 0)
            # A later Align replaces one whose J has not started: when another consumer rejected the
            # first, the coordinator chooses again, and a consumer holding on to the old (k, J) would
            # reject every new choice.
            pending = self.state is State.ALIGNING and self.job_epoch is not None and open_epoch < self.job_epoch
            if not (self.state is State.READY or pending) or late:
                return self.reject(command), Receipt.REJECTED
            if pending:
                return self.model_copy(update={"state": State.READY}).apply(command), Receipt.APPLIED
        try:
            return self.apply(command), Receipt.APPLIED
        except IllegalTransition:
            return self.reject(command), Receipt.REJECTED

    def reject(self, command: Command) -> ConsumerAlignment:
        """Skip an Align that came too late; the consumer stays Ready for a later one."""
        return self.model_copy(update={"applied_seq": command.seq})

    @property
    def aligned(self) -> bool:
        return self.state is State.ALIGNED

    @property
    def load_limit(self) -> int | None:
        """The last subject epoch the consumer may load before job epoch J: k - 1 while Aligning.

        Part of the state, not of the command's arrival: a consumer restored in Aligning must not
        load past k either, or its unaligned epochs would read into the aligned run.
        """
        if self.state is State.ALIGNING and self.subject_epoch is not None:
            return self.subject_epoch - 1
        return None


def aligned_together(states: Iterable[ConsumerAlignment]) -> bool:
    """Whether a job's sources are all aligned at one job epoch J: only then do its epochs run aligned.
    Sources aligned at different points are a split, which the coordinator aborts and aligns again."""
    states = list(states)
    return bool(states) and all(s.aligned for s in states) and len({s.job_epoch for s in states}) == 1


def aggregate(states: Iterable[ConsumerAlignment]) -> ConsumerAlignment:
    """A source is as far as its slowest consumer; aligned only when all agree on (k, J)."""
    states = list(states)
    if not states:
        return ConsumerAlignment()
    slowest = min(states, key=lambda s: _ORDER[s.state])
    if slowest.state in (State.ALIGNING, State.ALIGNED):
        keys = {(s.subject_epoch, s.job_epoch) for s in states}
        if len(keys) != 1:
            raise AlignmentSplitError(f"consumers disagree on the alignment point: {sorted(keys, key=str)}")
    return slowest

