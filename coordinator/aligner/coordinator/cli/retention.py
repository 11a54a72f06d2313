"""``aligner retention run|show``: the retention policy, applied by the leading coordinator by itself."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, emit, err, out
from aligner.coordinator.cli.connect import ledger, stop_on_signals
from aligner.errors import StoppedError

app = typer.Typer(help="Retention: ZooKeeper state bounded by policy (ALIGNER_RETENTION_*), not by uptime.",
                  no_args_is_help=True)


@app.command("run")
def run(
    every: Annotated[float, typer.Option(min=0.1, help="Seconds between retention passes")] = 60.0,
    hours: Annotated[float | None, typer.Option(min=0, help="Keep epochs younger than H hours "
                                                "[env ALIGNER_RETENTION_HOURS, 24]")] = None,
    min_epochs: Annotated[int | None, typer.Option(min=1, help="Keep at least the last N epochs per subject "
                                                   "[env ALIGNER_RETENTION_MIN_EPOCHS, 1000]")] = None,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics")] = None,
) -> None:
    """Hold coordinator leadership and apply the retention policy every interval (a second instance
    waits as a standby). Long-running: rides out ZooKeeper outages; SIGTERM or SIGINT stops it within
    seconds with exit code 0. ALIGNER_RETENTION_ENABLED=false: it leads but removes nothing."""
    from aligner.coordinator.retention_loop import RetentionLoop
    from aligner.retention_policy import policy_from_env

    policy = policy_from_env(hours=hours, min_epochs=min_epochs)
    stop = stop_on_signals()
    logging.getLogger("aligner").setLevel(logging.WARNING)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)  # a port in use is an OSError: one line, exit 1
    state = "on" if policy.enabled else "off (ALIGNER_RETENTION_ENABLED=false)"
    err.print(f"retention {state}: keep {policy.hours if policy.hours is not None else 'any'} h and at least "
              f"{policy.min_epochs} epochs per subject, a pass every {every:g}s", markup=False, soft_wrap=True)
    try:
        with ledger(outage_limit=None, stop=stop) as led:
            RetentionLoop(led, policy, every, stop, say=_say).run()
    except StoppedError:
        if not stop.is_set():
            raise


def _say(line: str) -> None:
    err.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("show")
def show(as_json: JsonFlag = False) -> None:
    """The retention policy in effect and what a pass would remove now (a dry run; nothing is removed)."""
    from aligner.coordinator.gc import collect
    from aligner.retention_policy import policy_from_env

    policy = policy_from_env()
    with ledger() as led:
        report = collect(led, dry_run=True, policy=policy)
    report["policy"] = policy.model_dump()
    if emit(report, as_json):
        return
    out.print(f"policy: enabled={policy.enabled} hours={policy.hours} min_epochs={policy.min_epochs}", markup=False)
    for s, r in report["subjects"].items():
        out.print(f"{s}: first retained epoch would be {r['first_retained']}, {r['deleted_epochs']} epochs to remove",
                  markup=False)
