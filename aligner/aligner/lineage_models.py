"""ZooKeeper payloads of the lineage that Spark queries record, read by the one lineage walker.

They live here, not with the Spark adapter, so that ``aligner lineage`` and ``aligner status`` read
Spark sinks without importing an engine; ``aligner.connectors.spark.models`` re-exports them.

Layout (all under the ledger root)::

    subjects/{subject}/sinks/{sink}/spark/epochs/{epoch:010d}   SparkSinkEpochNode (batch -> epoch)
    spark/queries/{queryId}/batches/{batch:012d}/{subject}      SparkSourceBatchNode (batch -> epochs)
"""

from __future__ import annotations

from pydantic import Field, model_validator

from aligner.models import Ident, Node, now_ms


class SparkSinkEpochNode(Node):
    """Lineage of one epoch a Spark sink committed: the query and micro-batch that wrote it."""

    query: str | None
    batch: int = Field(ge=0)
    epoch: int = Field(ge=0)
    created_at: int = Field(default_factory=now_ms)


class SparkSourceBatchNode(Node):
    """Lineage of one micro-batch of a streaming read: the subject epochs [first, last] it covered."""

    query: str
    batch: int = Field(ge=0)
    subject: Ident
    first: int = Field(ge=0)
    last: int = Field(ge=0)
    job_first: int | None = Field(default=None, ge=0)
    """A query running as an aligned job: the job epochs [job_first, job_last] the batch covers."""
    job_last: int | None = Field(default=None, ge=0)
    created_at: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _ordered(self) -> SparkSourceBatchNode:
        if self.last < self.first:
            raise ValueError(f"last epoch {self.last} < first epoch {self.first}")
        return self
