"""The coordinator's alignment of a job (thesis 5.6), as a pure step over its recorded decision.

The coordinator observes the job's decision node and what the decision's phase depends on (the
consumers' aggregated states), :func:`step` names the next step, and the coordinator persists it
(a new decision phase) or waits for the consumers. Every decision is recorded before it takes
effect, so a coordinator killed anywhere is resumed by the next from the recorded phase:

    (none|aligned|aborted) --start--> catching_up --ready--> aligning(k, J) --aligned--> aligned
    aligning --a consumer rejected (k, J)--> aligning(k', J')        aborting: abort first
    (split) --> aborting, realign --> aborted --> catching_up ...     (the next align finishes that abort)

A split is sources (or one source's consumers) aligned at different points: a source that started
J under an earlier Align(k, J) just before the coordinator chose again rejects every later one.
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from aligner.alignment import ConsumerAlignment, State, aligned_together
from aligner.models import AlignmentDecision, DecisionPhase


class Settled(StrEnum):
    """How the consumers answered an Align(k, J)."""

    ALIGNED = "aligned"
    REJECTED = "rejected"
    SPLIT = "split"
    """A source aligned at another point than the others can ever reach: abort, then align again."""


class Next(StrEnum):
    DONE = "done"
    """Aligned as decided, every source aligned: nothing to do."""
    START = "start"
    """Record a new decision: catching up, with the next command seq."""
    FROM_START = "from_start"
    """Every source is aligned by construction (a Spark query, a new version): record it aligned."""
    AWAIT_READY = "await_ready"
    """Send CatchUp; wait until every source is ready (ahead of the second-last committed epoch)."""
    CHOOSE = "choose"
    """Choose k in every subject's future and J in every consumer's; record it (aligning)."""
    AWAIT_ALIGNED = "await_aligned"
    """Send Align(k, J); wait until every source aligned at J, or one rejected it."""
    RECORD_ALIGNED = "record_aligned"
    REALIGN = "realign"
    """The sources are split (see :class:`Settled`): abort the alignment, nothing lost, and align again."""
    BLOCKED = "blocked"
    """An operator's abort is under way: it must finish first."""
    FINISH_ABORT = "finish_abort"
    """The coordinator's own abort of a split alignment is under way (its coordinator died): finish it, then
    align again."""


@dataclass(frozen=True, slots=True)
class Observed:
    """The decision node and what its phase needs (None: not read)."""

    decision: AlignmentDecision | None
    subjects: tuple[str, ...]
    sources_aligned: bool | None = None
    from_start: bool | None = None
    ready: bool | None = None
    settled: Settled | None = None


def current(decision: AlignmentDecision | None, subjects: tuple[str, ...]) -> bool:
    """Whether the recorded decision is one in progress for these subjects (else a new one starts)."""
    return decision is not None and decision.subjects == subjects and \
        decision.phase not in (DecisionPhase.ALIGNED, DecisionPhase.ABORTED)


def needs(decision: AlignmentDecision | None, subjects: tuple[str, ...]) -> frozenset[str]:
    """Which observations the next step depends on, so the coordinator reads only those."""
    if not current(decision, subjects):
        aligned = decision is not None and decision.phase == DecisionPhase.ALIGNED and decision.subjects == subjects
        return frozenset({"sources_aligned", "from_start"} if aligned else {"from_start"})
    assert decision is not None
    if decision.phase == DecisionPhase.CATCHING_UP:
        return frozenset({"ready", "from_start"})
    return frozenset({"settled"} if decision.phase == DecisionPhase.ALIGNING else ())


def settle(decision: AlignmentDecision, sources: Sequence[ConsumerAlignment], rejected: bool) -> Settled | None:
    """How the job's sources (each its consumers' aggregate) answered the decision's Align(k, J); None:
    not yet. ``rejected``: a consumer rejected this decision's command.

    Aligned together, at (k, J) or at another point (a worker restarted from the alignment it had
    committed rejects every new Align), is done. A source aligned while another rejected, or aligned
    at another J than the decision's, is a split: it rejects every later Align, so choosing again
    would never end (and the job's epochs cannot run aligned until it is aborted).
    """
    if aligned_together(sources):
        return Settled.ALIGNED
    aligned_at = {s.job_epoch for s in sources if s.state is State.ALIGNED}
    if aligned_at and (rejected or aligned_at != {decision.job_epoch}):
        return Settled.SPLIT
    return Settled.REJECTED if rejected else None


def step(seen: Observed) -> Next:
    """The alignment's next step from what the coordinator observed."""
    decision = seen.decision
    if not current(decision, seen.subjects):
        if seen.sources_aligned:
            return Next.DONE
        return Next.FROM_START if seen.from_start else Next.START
    assert decision is not None
    if decision.phase == DecisionPhase.ABORTING:
        return Next.FINISH_ABORT if decision.realign else Next.BLOCKED
    if decision.phase == DecisionPhase.CATCHING_UP:
        if not seen.ready:
            return Next.AWAIT_READY
        return Next.FROM_START if seen.from_start else Next.CHOOSE
    if seen.settled == Settled.SPLIT:
        return Next.REALIGN
    if seen.settled == Settled.REJECTED:
        return Next.CHOOSE
    return Next.RECORD_ALIGNED if seen.settled == Settled.ALIGNED else Next.AWAIT_ALIGNED
