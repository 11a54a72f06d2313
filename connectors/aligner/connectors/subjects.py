"""Registering a subject: its Kafka topic and its ZooKeeper node, together."""

from __future__ import annotations

from collections.abc import Sequence

from aligner.connectors.kafka import ensure_topic
from aligner.ledger import Ledger
from aligner.models import FieldSpec, SubjectNode


def create_subject(
    ledger: Ledger,
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    topic: str | None = None,
    value_format: str = "json",
    fields: Sequence[FieldSpec] = (),
) -> SubjectNode:
    """Create (or confirm) the topic, then register the subject; idempotent for the same shape."""
    node = SubjectNode(name=name, topic=topic or name, partitions=partitions,
                       value_format=value_format, fields=tuple(fields))  # type: ignore[arg-type]
    ensure_topic(bootstrap, node.topic, partitions)
    return ledger.register_subject(node)
