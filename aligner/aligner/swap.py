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
from dataclasses import dataclass
from enum import StrEnum

from aligner.errors import AlignerError, IllegalTransition
from aligner.models import Phase, SwapNode, now_ms

__all__ = ["WAITS", "Acks", "Gate", "Next", "Observed", "Phase", "abort", "acks", "awaits_target", "choose", "commit",
           "coordinate", "finish", "gate", "needs", "precommit"]


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


def precommit(previous: SwapNode | None, old: str, new: str, target: str, epoch: int,
              accepted: int | None = None) -> SwapNode:
    """S = ``epoch``, chosen when the jobs had committed up to ``accepted``."""
    if previous is not None and previous.phase in (Phase.COMMIT, Phase.DONE):
        raise IllegalTransition(Phase(previous.phase), "precommit")
    return SwapNode(old=old, new=new, target=target, epoch=epoch, phase=Phase.PRECOMMIT,
                    seq=(previous.seq + 1) if previous else 1, accepted=accepted)


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


class Next(StrEnum):
    """The coordinator's next step of a hot-swap, from what it observed (:func:`coordinate`)."""

    ALIGN = "align"
    """The old version is not aligned: align it first."""
    AWAIT_FOLLOWER = "await_follower"
    """Every worker of the new version must follow the old one's epochs before S is chosen."""
    PRECOMMIT = "precommit"
    """Choose S (a later one after a late acknowledgement) and record the pre-commit."""
    AWAIT_ACKS = "await_acks"
    COMMIT = "commit"
    AWAIT_TARGET = "await_target"
    """Committed: the new version writes S+1 at the target."""
    FINISH = "finish"
    DONE = "done"


WAITS = frozenset({Next.AWAIT_FOLLOWER, Next.AWAIT_ACKS, Next.AWAIT_TARGET})
"""Steps that wait for the jobs (woken by watches) rather than act."""


@dataclass(frozen=True, slots=True)
class Observed:
    """What the coordinator read: the swap node, and what its phase needs (None: not read)."""

    swap: SwapNode | None
    old_aligned: bool | None = None
    new_follows: bool | None = None
    acks: Acks | None = None
    target_frontier: int | None = None


def needs(swap: SwapNode | None) -> frozenset[str]:
    """Which observations the next step depends on, so the coordinator reads only those."""
    if swap is None or swap.phase == Phase.ABORTED:
        return frozenset({"old_aligned", "new_follows"})
    return frozenset({"acks"} if swap.phase == Phase.PRECOMMIT else {"target_frontier"}
                     if swap.phase == Phase.COMMIT else ())


def coordinate(seen: Observed) -> Next:
    """The hot-swap's next step: the two-phase commit as the coordinator drives it."""
    swap = seen.swap
    if swap is None or swap.phase == Phase.ABORTED:
        if not seen.old_aligned:
            return Next.ALIGN
        return Next.PRECOMMIT if seen.new_follows else Next.AWAIT_FOLLOWER
    if swap.phase == Phase.PRECOMMIT:
        return {Acks.ALL: Next.COMMIT, Acks.LATE: Next.PRECOMMIT}.get(seen.acks or Acks.WAITING, Next.AWAIT_ACKS)
    if swap.phase == Phase.COMMIT:
        return Next.FINISH if seen.target_frontier is not None and seen.target_frontier > swap.epoch \
            else Next.AWAIT_TARGET
    return Next.DONE
