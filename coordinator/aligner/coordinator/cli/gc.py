"""``aligner gc``: remove old epoch records and swapped-out jobs' state."""

from __future__ import annotations

from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, check_names, emit, out
from aligner.coordinator.cli.connect import ledger

app = typer.Typer()


@app.command()
def gc(
    keep_epochs: Annotated[int, typer.Option(min=1, help="Keep the last N committed epochs per subject")] = 100,
    keep_seconds: Annotated[float | None, typer.Option(min=0, help="Also keep epochs younger than T s")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", callback=check_names, help="Only these subjects")
                       ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, delete nothing")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove old epoch records and swapped-out jobs' state, keeping what readers and lineage need."""
    from aligner.coordinator.gc import collect

    with ledger() as led:
        report = collect(led, keep_epochs, keep_seconds, subject, dry_run)
    if not emit(report, as_json):
        for s, r in report["subjects"].items():
            out.print(f"{s}: first retained epoch {r['first_retained']}, {r['deleted_epochs']} epochs removed")
        for j, r in report["jobs"].items():
            out.print(f"job {j}: {r['deleted_nodes']} nodes removed" + (" (swapped out)" if r["swapped_out"] else ""))
