"""The ``aligner`` command line: one CLI for the stack, the ledger, reads and the coordinator.

A root app with one typer sub-app per command group (stack, subjects, status/epochs/read, markers,
exporter, console, align/abort, lineage/verify, hotswap, gc, acl); :mod:`.connect` holds the settings and the
ZooKeeper and Kafka probes they share, :mod:`.render` the tables, :mod:`.errors` the error mapper.

Every user mistake and every unreachable service ends in one line on stderr and exit code 1
(2 for usage errors), within bounded time: :func:`main` turns exceptions into messages by their
type, never by their text. ``ALIGNER_DEBUG=1`` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated, NoReturn

import typer
from typer._click import exceptions as click_errors  # typer vendors click: its exceptions are these

from aligner.coordinator.cli import (
    acl,
    alignment,
    console,
    epochs,
    exporter,
    gc,
    hotswap,
    lineage,
    markers,
    retention,
    stack,
    subjects,
)
from aligner.coordinator.cli.connect import configure
from aligner.coordinator.cli.errors import describe, one_line

app = typer.Typer(help="Epoch alignment for chained Kafka streaming jobs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
for commands in (epochs, markers, exporter, console, alignment, lineage, hotswap, gc):
    app.add_typer(commands.app)  # no name: its commands are top-level commands
app.add_typer(stack.app, name="stack")
app.add_typer(subjects.app, name="subjects")
app.add_typer(acl.app, name="acl")
app.add_typer(retention.app, name="retention")


@app.callback()
def main_options(
    zk: Annotated[str | None, typer.Option(help="ZooKeeper connect string [env ALIGNER_ZK]")] = None,
    kafka: Annotated[str | None, typer.Option(help="Kafka bootstrap servers [env ALIGNER_KAFKA]")] = None,
    root: Annotated[str | None, typer.Option(help="ZooKeeper root of aligner state [env ALIGNER_ROOT]")] = None,
    zk_auth: Annotated[str | None, typer.Option(help="ZooKeeper identity digest:USER:PASSWORD [env ALIGNER_ZK_AUTH]",
                                                show_default=False)] = None,
    kafka_config: Annotated[str | None, typer.Option(help="Kafka client.properties file (SASL, TLS) "
                                                          "[env ALIGNER_KAFKA_CONFIG]")] = None,
) -> None:
    configure(zk, kafka, root, zk_auth, kafka_config)


def _setup_logging() -> None:
    """Library log lines (kazoo reconnects, ...) stay off stderr unless ALIGNER_LOG_LEVEL asks for them."""
    level = os.environ.get("ALIGNER_LOG_LEVEL", "ERROR").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level if level in logging.getLevelNamesMapping() else "ERROR", handlers=[handler])
    if "ALIGNER_LOG_LEVEL" not in os.environ:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # the command reports ZooKeeper failures itself


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the CLI; every failure becomes one line on stderr and exit 1 (2 for usage errors)."""
    _setup_logging()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="aligner", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        if exc.format_message().strip():  # typer's rich help has printed itself already
            typer.echo(exc.format_message())
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("aligner: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # the CLI's last line: each failure is one line and an exit code (ALIGNER_DEBUG re-raises)
        if os.environ.get("ALIGNER_DEBUG"):
            raise
        text, code = describe(exc)
        print(f"aligner: {one_line(text)}", file=sys.stderr)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
