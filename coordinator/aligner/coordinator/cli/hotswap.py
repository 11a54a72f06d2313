"""``aligner hotswap``: swap a running job for its new version at a future epoch S, exactly once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from aligner.coordinator.cli.common import JsonFlag, check_name, emit, err, out, usage
from aligner.coordinator.cli.connect import ZK_OUTAGE_LIMIT, kafka, ledger

if TYPE_CHECKING:
    from aligner.ledger import Ledger
    from aligner.models import SwapNode

app = typer.Typer()


@app.command()
def hotswap(
    old: Annotated[str, typer.Option("--old", callback=check_name, help="The running job")],
    new: Annotated[str, typer.Option("--new", callback=check_name, help="Its new version, started with follows=OLD")],
    subject: Annotated[str, typer.Option("--subject", callback=check_name, help="The target subject both write")],
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Swap at this target epoch at the earliest")] = None,
    abort_swap: Annotated[bool, typer.Option("--abort", help="Abort a swap that is not committed yet")] = False,
    verify_epochs: Annotated[int | None, typer.Option(
        min=1, help="First compare NEW's shadow with OLD over this many epochs; refuse the swap if they differ")
    ] = None,
    ignore_field: Annotated[list[str] | None, typer.Option(
        help="With --verify-epochs: a JSON field of the values that is meant to differ (repeat)")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds the whole command may wait")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Swap OLD for NEW on SUBJECT at a future epoch S, exactly once: OLD writes <= S, NEW writes > S."""
    from aligner.coordinator.alignment import leadership
    from aligner.coordinator.hotswap import HotSwap

    if old == new:
        usage("--old and --new must name two different jobs")
    if abort_swap and (at_epoch is not None or verify_epochs is not None):
        usage("--abort takes no --at-epoch or --verify-epochs")
    if ignore_field and verify_epochs is None:
        usage("--ignore-field needs --verify-epochs")
    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        if abort_swap:
            node = HotSwap(led).abort(old)
        else:
            node = _swap(led, old, new, subject, at_epoch, verify_epochs, ignore_field or [], timeout, as_json)
    if not emit(node.model_dump(), as_json):
        verb = "aborted" if node.phase == "aborted" else "swapped"
        out.print(f"[green]{verb}[/] {old} -> {new} on {subject}: {old} wrote epochs <= {node.epoch}, "
                  f"{new} writes from {node.epoch + 1}")


def _swap(led: Ledger, old: str, new: str, subject: str, at_epoch: int | None, verify_epochs: int | None,
          ignore_field: list[str], timeout: float, as_json: bool) -> SwapNode:
    """Verify NEW's shadow first when asked, then run the swap with a progress line."""
    from aligner.coordinator.hotswap import HotSwap
    from aligner.coordinator.verify import verify_before_swap

    swapper = HotSwap(led)
    if verify_epochs is not None:
        swapper.check(old, new, subject)
        report = verify_before_swap(led, kafka(), old, new, verify_epochs, ignore_field, timeout)
        if report is not None and not as_json:
            err.print(f"verified: {new} agrees with {old} over epochs {report['first']}..{report['last']} "
                      f"({report['records']} records)")

    def progress(what: str, info: dict[str, Any]) -> None:
        if not as_json:
            err.print(f"[dim]{what}[/] {info.get('phase', '')} S={info.get('epoch', '?')}", end="\r")

    return swapper.run(old, new, subject, at_epoch, timeout=timeout, progress=progress)
