"""What the hot-swap tests share, for runtime jobs and Spark queries alike."""

from __future__ import annotations

from collections.abc import Callable

from aligner.coordinator.hotswap import HotSwap
from aligner.coordinator.stack import wait_for
from aligner.ledger import Ledger
from aligner.models import ContributionNode, JobNode, SwapNode


def precommit_acked(swapper: HotSwap, o: JobNode, n: JobNode, live: float,
                    on_wait: Callable[[], None] | None = None) -> tuple[SwapNode, int]:
    """Pre-commit a swap epoch S and wait until both versions acknowledged it; when one saw S too late
    (a busy machine: it had passed S already), choose a later S, as ``HotSwap.run`` does."""
    swap, version = swapper._precommit(o, n, None, -1, None)
    acks = ["waiting"]

    def settled() -> bool:
        acks.append(swapper._acks(o, n, swap))
        return acks[-1] != "waiting"

    while True:
        wait_for(settled, live, f"both versions to acknowledge S={swap.epoch}", on_wait=on_wait)
        if acks[-1] == "all":
            return swap, version
        swap, version = swapper._precommit(o, n, swap, version, None)


def assert_s_before_s_plus_1(ledger: Ledger, target: str, swap_epoch: int) -> float:
    """Target epoch S+1 committed no earlier than S; returns how far apart (seconds), for the log."""
    times = []
    for e in (swap_epoch, swap_epoch + 1):
        path = ledger.layout.epoch(target, e)
        times.append(max(ledger.read(ContributionNode, f"{path}/{c}")[0].committed_at
                         for c in ledger.zk.get_children(path)))
    assert times[0] <= times[1], f"the new version committed S+1 = {swap_epoch + 1} before the old one committed S"
    return (times[1] - times[0]) / 1000
