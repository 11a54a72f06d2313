"""What every command shares: the consoles, ``--json``, argument checks and the usage error.

Nothing here talks to ZooKeeper or Kafka, so a usage error is reported without loading their clients.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from typer._click import exceptions as click_errors  # typer vendors click: its exceptions are these
from typer._click.globals import get_current_context

out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def emit(data: Any, as_json: bool) -> bool:
    """Print ``data`` as JSON when asked; returns whether it did."""
    if as_json:
        out.print_json(json.dumps(data, default=str))
    return as_json


def usage(message: str) -> NoReturn:
    """A usage error of the running command: one line and exit 2 (see :func:`aligner.coordinator.cli.main`)."""
    raise click_errors.UsageError(message, ctx=get_current_context(silent=True))


def validation_text(exc: ValidationError) -> str:
    """A pydantic error as one line: the field, the value given and what is wrong with it."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or exc.title
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    cause = first.get("ctx", {}).get("error")
    msg = str(cause) if first["type"] == "value_error" and cause is not None else first["msg"]
    return f"invalid {where} {first.get('input')!r}: {msg}{more}"


def check_name(value: str | None) -> str | None:
    """Subject and job names are checked before anything is sent: they become znode names."""
    from pydantic import TypeAdapter

    from aligner.models import Ident

    if value is None:
        return value
    try:
        TypeAdapter(Ident).validate_python(value)
    except ValidationError:
        raise typer.BadParameter(f"{value!r} is not a valid name: use 1-120 of A-Z a-z 0-9 . _ -") from None
    return value


def check_names(values: list[str] | None) -> list[str] | None:
    return None if values is None else [v for v in values if check_name(v)]


def epoch_span(spec: str) -> tuple[int, int]:
    """``--epochs A:B`` as (A, B); a malformed span is a usage error naming the option."""
    from aligner.epochs import parse_epoch_span

    try:
        return parse_epoch_span(spec)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--epochs'") from None


def check_topic(value: str | None) -> str | None:
    if value is not None and not _TOPIC.match(value):
        raise typer.BadParameter(f"{value!r} is not a valid Kafka topic name: use 1-249 of A-Z a-z 0-9 . _ -")
    return value


Name = Annotated[str, typer.Argument(callback=check_name, show_default=False)]


class ValueFormat(StrEnum):
    json = "json"
    bytes = "bytes"
