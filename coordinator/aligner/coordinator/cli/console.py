"""``aligner console``: the chain live in a browser (subjects, jobs, alignment, hot-swaps, lineage)."""

from __future__ import annotations

import logging
import threading
from typing import Annotated

import typer

from aligner.coordinator.cli.common import err

app = typer.Typer()


@app.command()
def console(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Serve the console on this port")] = 8080,
    host: Annotated[str, typer.Option(help="Listen on this address (0.0.0.0: every interface)")] = "127.0.0.1",
    allow_actions: Annotated[bool, typer.Option(
        "--allow-actions", help="Let pages align, abort, hot-swap and apply retention (with ZooKeeper ACLs on: "
                                "only as the admin identity)")] = False,
    refresh: Annotated[float, typer.Option(min=0.1, help="Seconds between ledger reads at most, however busy")
                       ] = 1.0,
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between ledger reads at least, however quiet")
                        ] = 5.0,
) -> None:
    """Serve a live web console of the chain: the graph of subjects and jobs, each job's alignment and
    lag, hot-swaps as they happen, lineage of any epoch; JSON for scripts at /api/state.

    Long-running: one reader of ZooKeeper for every open page, woken by watches; it rides out outages
    (the page shows the last picture and since when ZooKeeper is unreachable), and SIGTERM or SIGINT
    stops it within seconds with exit code 0."""
    from aligner.coordinator.cli.connect import settings
    from aligner.coordinator.console.app import Guard
    from aligner.coordinator.console.server import bind, serve
    from aligner.ledger import Ledger
    from aligner.settings import zk_security

    s = settings()
    sock = bind(host, port)  # a port in use: one line, exit 1
    stop = threading.Event()
    logging.getLogger("aligner").setLevel(logging.WARNING)
    auth = zk_security().auth
    guard = Guard(allow_actions, auth.user if auth is not None else None)
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    actions = "actions on" if allow_actions else "actions off (--allow-actions)"
    err.print(f"console on http://{shown}:{sock.getsockname()[1]}/ ({actions})", markup=False, highlight=False)
    serve(sock, lambda: Ledger.connect(s.zk, s.root, timeout=None, stop=stop), guard,
          ["--zk", s.zk, "--kafka", s.kafka, "--root", s.root], stop, refresh, interval)
