"""``aligner align`` and ``abort``: move a running job's sources into aligned mode and back."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aligner.coordinator.cli.common import JsonFlag, Name, check_names, emit, err, out
from aligner.coordinator.cli.connect import ZK_OUTAGE_LIMIT, ledger

app = typer.Typer()


@app.command()
def align(
    job: Name,
    subject: Annotated[list[str] | None, typer.Option(
        "--subject", callback=check_names, help="Input subject(s) to align (default all)")] = None,
    at_epoch: Annotated[int | None, typer.Option(min=0, help="Align from this subject epoch at the earliest")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds the whole command may wait")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Align a job's sources on their subjects' epochs: CatchUp -> Ready -> Align(k) -> Aligned."""
    from rich.live import Live

    from aligner.coordinator.alignment import Coordinator, leadership

    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        coord = Coordinator(led)
        if as_json:
            decision = coord.align(job, subject, at_epoch, timeout=timeout)
        else:
            with Live(console=err, refresh_per_second=8, transient=True) as live:
                def progress(what: str, sources: dict[str, dict[str, Any]]) -> None:
                    lines = [f"[bold]{job}[/] {what}"] + [
                        f"  {s}: {st['state']} lag {st['lag_epochs']} epochs ({st['lag_seconds']:.2f}s)"
                        for s, st in sources.items()]
                    live.update("\n".join(lines))

                decision = coord.align(job, subject, at_epoch, timeout=timeout, progress=progress)
        status_row = coord.status(job)
    if not emit({"decision": decision.model_dump(), "status": status_row}, as_json):
        out.print(f"[green]aligned[/] {job}: job epoch {decision.job_epoch} starts at subject epochs "
                  f"{decision.subject_epochs}")


@app.command()
def abort(
    job: Name,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for every consumer")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Return a job's sources to unaligned mode from any alignment state."""
    from aligner.coordinator.alignment import Coordinator, leadership

    with ledger(max(ZK_OUTAGE_LIMIT, timeout)) as led, leadership(led, timeout=timeout):
        decision = Coordinator(led).abort(job, timeout=timeout)
    if not emit({"decision": decision.model_dump()}, as_json):
        out.print(f"[yellow]aborted[/] alignment of {job}: sources unaligned")
