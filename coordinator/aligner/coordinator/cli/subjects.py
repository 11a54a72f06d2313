"""``aligner subjects create|list``: register and list subjects."""

from __future__ import annotations

from typing import Annotated

import typer

from aligner.coordinator.cli.common import JsonFlag, Name, ValueFormat, check_topic, emit, out
from aligner.coordinator.cli.connect import kafka, ledger

app = typer.Typer(help="Register and list subjects.", no_args_is_help=True)


@app.command("create")
def subjects_create(
    name: Name,
    partitions: Annotated[int, typer.Option(min=1, help="Partition count of the topic")] = 4,
    topic: Annotated[str | None, typer.Option(callback=check_topic, help="Kafka topic (default: the subject name)")
                     ] = None,
    value_format: Annotated[ValueFormat, typer.Option("--format", help="Record values")] = ValueFormat.json,
    as_json: JsonFlag = False,
) -> None:
    """Create the topic and register the subject (idempotent for the same shape)."""
    from aligner.connectors.subjects import create_subject

    with ledger() as led:
        node = create_subject(led, kafka(), name, partitions, topic=topic, value_format=value_format.value)
    if not emit(node.model_dump(), as_json):
        out.print(f"subject [bold]{node.name}[/] on topic {node.topic} ({node.partitions} partitions)")


@app.command("list")
def subjects_list(as_json: JsonFlag = False) -> None:
    """List registered subjects."""
    with ledger() as led:
        names = led.subjects.subject_names()
    if not emit(names, as_json):
        for n in names:
            out.print(n)
