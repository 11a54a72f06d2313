"""``aligner exporter``: the whole deployment's state for Prometheus."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from aligner.coordinator.cli.common import err
from aligner.coordinator.cli.connect import ledger, stop_on_signals
from aligner.errors import StoppedError

app = typer.Typer()


@app.command()
def exporter(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port")],
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between ledger reads")] = 5.0,
) -> None:
    """Export the whole deployment's state to Prometheus: subject frontiers, each job's lag and
    alignment state, hot-swap phases, Spark queries.

    Long-running: it waits for ZooKeeper and rides out outages (serving the last snapshot, marked
    stale), and SIGTERM or SIGINT stops it within seconds with exit code 0."""
    from prometheus_client import REGISTRY, start_http_server

    from aligner.coordinator.exporter import LedgerCollector

    stop = stop_on_signals()
    logging.getLogger("aligner").setLevel(logging.WARNING)
    try:
        with ledger(outage_limit=None, stop=stop) as led:
            collector = LedgerCollector(led, interval)
            REGISTRY.register(collector)
            start_http_server(port)  # a port in use is an OSError: one line, exit 1
            err.print(f"exporting on :{port}/metrics every {interval:g}s")
            collector.run(stop)
    except StoppedError:
        if not stop.is_set():
            raise
