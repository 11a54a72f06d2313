"""``aligner markers``: cut epochs of a subject written by outside producers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, Name, emit, out
from aligner.coordinator.cli.connect import kafka, ledger, stop_on_signals
from aligner.errors import StoppedError

if TYPE_CHECKING:
    from aligner.models import Range

app = typer.Typer()


@app.command()
def markers(
    subject: Name,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between epochs")] = 1.0,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after N epochs")] = None,
    from_end: Annotated[bool, typer.Option(help="Start at the current end instead of the log start")] = False,
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port")
                            ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Cut epochs of a subject written by outside producers, from stable end offsets.

    Long-running: it rides out ZooKeeper and broker outages, and SIGTERM or SIGINT stops it
    within seconds with exit code 0."""
    from aligner.connectors.marker import EpochMarker

    stop = stop_on_signals()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)  # a port in use is an OSError: one line, exit 1

    def show(epoch: int, ranges: dict[int, Range]) -> None:
        spans = {str(p): [r.start, r.end] for p, r in ranges.items()}
        if not emit({"epoch": epoch, "ranges": spans}, as_json):
            # One line per epoch however many partitions (rich wraps at 80 columns when not on a terminal)
            out.print(f"epoch {epoch}: " + " ".join(f"{p}:[{s},{e})" for p, (s, e) in spans.items()), soft_wrap=True)

    logging.getLogger("aligner").setLevel(logging.WARNING)  # a long-running component reports outages
    try:
        with ledger(outage_limit=None, stop=stop) as led:
            led.subjects.subject(subject)
            marker = EpochMarker(led, kafka(), subject, from_beginning=not from_end).open()
            try:
                marker.run(interval, stop, count, show)
            finally:
                marker.close()
    except StoppedError:
        if not stop.is_set():
            raise  # not ours: report it
