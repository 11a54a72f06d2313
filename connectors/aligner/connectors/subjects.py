"""Registering a subject: its Kafka topic and its ZooKeeper node, together."""

from __future__ import annotations

from collections.abc import Sequence

from aligner.connectors.kafka import ensure_topic
from aligner.errors import UnknownSubjectError
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
                       value_format=value_format, fields=tuple(fields))
    ensure_topic(bootstrap, node.topic, partitions)
    return ledger.subjects.register_subject(node)


def ensure_shadow(ledger: Ledger, bootstrap: str, name: str, output: str) -> SubjectNode:
    """A new version's shadow subject, shaped like the target it shadows (created by the first to start):
    its epoch E holds what the version voided at the target in job epoch E."""
    try:
        return ledger.subjects.subject(name)
    except UnknownSubjectError:
        out = ledger.subjects.subject(output)
        return create_subject(ledger, bootstrap, name, out.partitions, value_format=out.value_format)
