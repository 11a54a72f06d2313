"""``aligner gc``: the retention policy applied once, by hand (its flags override the policy's bounds)."""

from __future__ import annotations

from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, check_names, emit, out
from aligner.coordinator.cli.connect import ledger

app = typer.Typer()


@app.command()
def gc(
    keep_epochs: Annotated[int | None, typer.Option(min=1, help="Keep the last N committed epochs per subject "
                                                    "(alone: no time bound) [policy: ALIGNER_RETENTION_MIN_EPOCHS]")
                           ] = None,
    keep_seconds: Annotated[float | None, typer.Option(min=0, help="Also keep epochs younger than T s "
                                                       "[policy: ALIGNER_RETENTION_HOURS]")] = None,
    subject: Annotated[list[str] | None, typer.Option("--subject", callback=check_names, help="Only these subjects")
                       ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, delete nothing")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove old epoch records and swapped-out jobs' state, keeping what readers, swaps and lineage need.

    Without flags: the retention policy (ALIGNER_RETENTION_*: 24 h and at least 1,000 epochs by default)."""
    from aligner.coordinator.gc import collect

    with ledger() as led:
        report = collect(led, keep_epochs, keep_seconds, subject, dry_run)
    if not emit(report, as_json):
        for s, r in report["subjects"].items():
            out.print(f"{s}: first retained epoch {r['first_retained']}, {r['deleted_epochs']} epochs removed")
        for j, r in report["jobs"].items():
            out.print(f"job {j}: {r['deleted_nodes']} nodes removed" + (" (swapped out)" if r["swapped_out"] else ""))
        if not report["enabled"]:
            out.print("retention is switched off (ALIGNER_RETENTION_ENABLED=false): nothing removed")
