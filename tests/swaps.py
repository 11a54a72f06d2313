"""What the hot-swap tests share, for runtime jobs and Spark queries alike."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from aligner.connectors.runtime import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.coordinator.hotswap import HotSwap
from aligner.ledger import Ledger
from aligner.models import ContributionNode, JobNode, Phase, SwapNode
from aligner.swap import Next
from aligner.swap import commit as machine_commit
from tests.helpers import wait_for
from tests.jobs import tag_v1, tag_v2

LIVE = 180.0
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""


class Versions(NamedTuple):
    """A runtime job's two versions on one input, v1 aligned and v2 started, under continuous input."""

    target: str
    more: threading.Event
    """Set to end the input."""
    gen: Any
    old: JobSpec
    new: JobSpec
    v1: Any
    v2: Any


def start_versions(stack: Any, ledger: Ledger, spawn: Any, raw: str, v1_fn: Callable[..., Any] = tag_v1,
                   v2_fn: Callable[..., Any] = tag_v2, inherit_state: bool = False,
                   before_v2: Callable[[str], None] | None = None, shadow: bool = False, target_partitions: int = 4,
                   before_align: Callable[[], None] | None = None) -> Versions:
    """Subjects ``raw`` (2 partitions) and ``raw``-t, a generator on ``raw``, v1 writing target partitions 0-1
    and aligned, then v2 (following v1) on 2-3. ``before_align`` runs once v1 is started, ``before_v2`` (with
    the target) once it is aligned: a test looks there at what the next step changes."""
    target = f"{raw}-t"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, target, target_partitions)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more)
    old = JobSpec(job=f"{raw}-v1", inputs=(raw,), output=target, interval=0.2, output_partitions=(0, 1))
    new = JobSpec(job=f"{raw}-v2", inputs=(raw,), output=target, interval=0.2, output_partitions=(2, 3),
                  version="2", follows=old.job, inherit_state=inherit_state, shadow=shadow)
    v1 = spawn.job(old, v1_fn)
    if before_align is not None:
        before_align()
    Coordinator(ledger).align(old.job, timeout=LIVE)
    if before_v2 is not None:
        before_v2(target)
    v2 = spawn.job(new, v2_fn)
    return Versions(target, more, gen, old, new, v1, v2)


def finish(more: threading.Event, gen: Any, v1: Any, v2: Any) -> None:
    """End the input and wait (liveness bounds only) for both jobs to drain it and finish."""
    more.set()
    gen.finished()
    v1.join()
    v2.join()


def following(swapper: HotSwap, new: JobSpec, what: str = "v2 following") -> None:
    """Wait until the new version has committed an epoch of its own: a swap needs it following."""
    wait_for(lambda: swapper.committed(new.job, new.inputs) >= 0, LIVE, what)


def precommit_acked(swapper: HotSwap, o: JobNode, n: JobNode, live: float,
                    on_wait: Callable[[], None] | None = None) -> tuple[SwapNode, int]:
    """Run the hot-swap up to its commit: S pre-committed and acknowledged by both versions (a later S
    when one saw it too late, as on a busy machine); returns the swap node and its version."""
    swap = swapper.run(o.job, n.job, o.output, timeout=live, until=Next.COMMIT,
                       progress=(lambda _what, _info: on_wait()) if on_wait is not None else None)
    current, version = swapper.jobs.swap(o.job)
    assert current == swap and swap.phase is Phase.PRECOMMIT
    return swap, version


def committed(swap: SwapNode) -> SwapNode:
    """The commit the coordinator would write next (then a test kills it)."""
    return machine_commit(swap)


def assert_s_before_s_plus_1(ledger: Ledger, target: str, swap_epoch: int) -> float:
    """Target epoch S+1 committed no earlier than S; returns how far apart (seconds), for the log."""
    times = []
    for e in (swap_epoch, swap_epoch + 1):
        path = ledger.layout.epoch(target, e)
        times.append(max(ledger.read(ContributionNode, f"{path}/{c}")[0].committed_at
                         for c in ledger.zk.get_children(path)))
    assert times[0] <= times[1], f"the new version committed S+1 = {swap_epoch + 1} before the old one committed S"
    return (times[1] - times[0]) / 1000
