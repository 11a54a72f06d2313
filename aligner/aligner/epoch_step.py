"""One job epoch of a worker between two hot-swaps, composed from the swap machine (no I/O).

A job version may be gated by two swaps at once: the one that hands it the target (``incoming``,
on the node of the version it follows: follow and void until S, then write) and, once it writes,
a swap of itself for a newer version (``outgoing``: write until S', then finish). Every engine (the
runtime, the Spark planner, Faust through the runtime) calls :func:`step` at the start of each job
epoch and only does the I/O its answer names: report the acknowledgement, wait, process, and
before committing, wait for S at the target. Written once here, so the rules cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aligner.models import Phase, SwapNode
from aligner.swap import Gate, awaits_target, gate

Seen = tuple[int, int]
"""(swap epoch S, job epoch at whose start the worker first saw the pre-commit of S)."""


class Act(StrEnum):
    """What a worker does with the job epoch it is about to start."""

    WRITE = "write"
    """Process and commit the epoch's output (after ``await_target`` is committed, if set)."""
    VOID = "void"
    """Process (state advances) but void the output: a new version before S+1 follows the old one."""
    WAIT = "wait"
    """S is only pre-committed and this is S+1 or later: wait for the commit or the abort."""
    FINISH = "finish"
    """The old version after S: finish the sink, end the job."""


@dataclass(frozen=True, slots=True)
class EpochStep:
    act: Act
    swap: SwapNode | None
    """The swap that decided (the one to wait for, or the swapped-out version's)."""
    ack: Seen | None
    """A new acknowledgement to report before anything else (None: what was reported stands)."""
    await_target: int | None
    """Commit only after this epoch (S) is committed at the target: the new version's S+1."""


_ACTS = {Gate.WRITE: Act.WRITE, Gate.VOID: Act.VOID, Gate.WAIT: Act.WAIT, Gate.STOP: Act.FINISH}


def live(swap: SwapNode | None) -> bool:
    """A swap that gates and is acknowledged: any but an aborted one."""
    return swap is not None and swap.phase != Phase.ABORTED


def acknowledge(swap: SwapNode | None, epoch: int, seen: Seen | None) -> Seen | None:
    """The acknowledgement of ``swap`` at the start of ``epoch``: once per S (an earlier one of the same
    S stands, since the gate held the worker from then on); None when nothing new is to be reported."""
    if not live(swap):
        return None
    assert swap is not None
    return None if seen is not None and seen[0] == swap.epoch else (swap.epoch, epoch)


def step(epoch: int, incoming: SwapNode | None, outgoing: SwapNode | None, new_version: bool,
         seen: Seen | None = None) -> EpochStep:
    """Both swaps' effect on job epoch ``epoch``: the incoming one decides until it lets the version
    write; from then on the outgoing one does. ``seen``: the acknowledgement reported so far."""
    swap, outcome = None, Gate.WRITE
    if new_version:
        swap, outcome = incoming, gate(incoming, epoch, new_version=True)
    if outcome is Gate.WRITE:
        swap, outcome = outgoing, gate(outgoing, epoch, new_version=False)
    target = None
    if outcome is Gate.WRITE and awaits_target(incoming, epoch, new_version):
        assert incoming is not None
        target = incoming.epoch
    return EpochStep(act=_ACTS[outcome], swap=swap, ack=acknowledge(swap, epoch, seen), await_target=target)


def old_decides(incoming: SwapNode | None, epoch: int) -> bool:
    """A new version follows the old one's job epoch records until it writes (after a committed S)."""
    return gate(incoming, epoch, new_version=True) is not Gate.WRITE


def writes(incoming: SwapNode | None, epoch: int, new_version: bool) -> bool:
    """Whether a version's epoch ``epoch`` reaches the target (else it is voided), outgoing aside."""
    return not new_version or not old_decides(incoming, epoch)


def void_limit(incoming: SwapNode | None) -> int | None:
    """The last job epoch a new version may run voided before the outcome of S is known (None: any)."""
    return incoming.epoch if incoming is not None and live(incoming) else None
