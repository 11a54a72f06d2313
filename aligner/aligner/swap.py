"""The hot-swap machine (thesis 2.3.1, 4.2): two-phase commit of swap epoch S, without I/O.

The new version runs beside the old one, following its aligned job epochs and voiding its output.
The coordinator picks S in the future of both and records it on the swap node:

    (none) --precommit(S)--> precommit --all acked--> commit --target past S--> done
    precommit --a worker saw S too late--> precommit(S' > S)
    precommit --abort--> aborted            commit, done: no abort (S may already be written)

Each worker runs :func:`gate` at the start of every job epoch: it acknowledges S at an epoch <= S
and waits at S+1 until the outcome is final, so neither version acts on S+1 before it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from aligner.errors import AlignerError, IllegalTransition
from aligner.models import Phase, SwapNode, now_ms

__all__ = ["Acks", "Gate", "Phase", "abort", "acks", "awaits_target", "choose", "commit", "finish", "gate",
           "precommit"]


class Gate(StrEnum):
    """What a worker does with the job epoch it is about to start."""

    WRITE = "write"
    """Process and commit its output."""
    VOID = "void"
    """Process (state advances) but write no output: the new version before S+1."""
    STOP = "stop"
    """The old version after S: finish the sink, end the job."""
    WAIT = "wait"
    """S+1 or later while S is only pre-committed: wait for commit or abort."""


class Acks(StrEnum):
    WAITING = "waiting"
    ALL = "all"
    """Every worker of both versions saw S in time."""
    LATE = "late"
    """A worker started an epoch past S+1 before it saw S: choose a later S."""


def gate(swap: SwapNode | None, epoch: int, new_version: bool) -> Gate:
    """The swap's effect on job epoch ``epoch`` of the old (``new_version`` False) or new version."""
    before = Gate.VOID if new_version else Gate.WRITE
    if swap is None or swap.phase == Phase.ABORTED or epoch <= swap.epoch:
        return before
    if swap.phase == Phase.PRECOMMIT:
        return Gate.WAIT
    return Gate.WRITE if new_version else Gate.STOP


def awaits_target(swap: SwapNode | None, epoch: int, new_version: bool) -> bool:
    """The new version never commits S+1 before S is committed at the target (by the old one)."""
    return (new_version and swap is not None and swap.phase in (Phase.COMMIT, Phase.DONE)
            and epoch == swap.epoch + 1)


def acks(seen: Iterable[tuple[int, int] | None], swap_epoch: int) -> Acks:
    """Aggregate every worker's (S it saw, job epoch at whose start it saw it) of both versions.

    Seen at the start of S+1 is still in time: the gate holds both versions there before any output.
    """
    seen = list(seen)
    if any(s is not None and s[0] == swap_epoch and s[1] > swap_epoch + 1 for s in seen):
        return Acks.LATE
    if seen and all(s is not None and s[0] == swap_epoch for s in seen):
        return Acks.ALL
    return Acks.WAITING


def choose(now: int, margin: int, at_epoch: int | None) -> int:
    """S: ``margin`` epochs past the furthest either version or the target has committed."""
    return max(now + margin, at_epoch or 0)


def precommit(previous: SwapNode | None, old: str, new: str, target: str, epoch: int) -> SwapNode:
    if previous is not None and previous.phase in (Phase.COMMIT, Phase.DONE):
        raise IllegalTransition(Phase(previous.phase), "precommit")
    return SwapNode(old=old, new=new, target=target, epoch=epoch, phase=Phase.PRECOMMIT,
                    seq=(previous.seq + 1) if previous else 1)


def _to(swap: SwapNode, phase: Phase) -> SwapNode:
    return swap.model_copy(update={"phase": phase, "updated_at": now_ms()})


def commit(swap: SwapNode) -> SwapNode:
    if swap.phase != Phase.PRECOMMIT:
        raise IllegalTransition(Phase(swap.phase), "commit")
    return _to(swap, Phase.COMMIT)


def finish(swap: SwapNode) -> SwapNode:
    if swap.phase != Phase.COMMIT:
        raise IllegalTransition(Phase(swap.phase), "finish")
    return _to(swap, Phase.DONE)


def abort(swap: SwapNode) -> SwapNode:
    """Only before the commit: afterwards the new version may already have written S+1."""
    if swap.phase in (Phase.COMMIT, Phase.DONE):
        raise AlignerError(f"the hot-swap of {swap.old!r} at epoch {swap.epoch} is committed; it cannot be aborted")
    return _to(swap, Phase.ABORTED)
