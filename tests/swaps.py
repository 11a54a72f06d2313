"""What the hot-swap tests share, for runtime jobs and Spark queries alike."""

from __future__ import annotations

from collections.abc import Callable

from aligner.coordinator.hotswap import HotSwap
from aligner.ledger import Ledger
from aligner.models import ContributionNode, JobNode, Phase, SwapNode
from aligner.swap import Next
from aligner.swap import commit as machine_commit


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
