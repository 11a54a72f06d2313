"""ZooKeeper payloads of the Spark adapter: pydantic models read back through ``aligner.models.parse``.

The two lineage records live in :mod:`aligner.lineage_models` (the engine-free lineage walker reads
them) and are re-exported here.

Layout (all under the ledger root)::

    subjects/{subject}/sinks/{sink}/spark                       SparkProgressNode  (compare-and-set)
    subjects/{subject}/sinks/{sink}/spark/epochs/{epoch:010d}   SparkSinkEpochNode (batch -> epoch)
    spark/queries/{queryId}/batches/{batch:012d}/{subject}      SparkSourceBatchNode (batch -> epochs)

The sink nodes are written by the driver's commit in the same multi-op as the epoch; the source
nodes are created-if-absent by the read tasks of a micro-batch (a batch's span is fixed in Spark's
offset log before it runs, so every task and every re-run records the same span).
"""

from __future__ import annotations

from pydantic import Field

from aligner.lineage_models import SparkSinkEpochNode, SparkSourceBatchNode
from aligner.models import Node, now_ms

__all__ = ["SparkProgressNode", "SparkSinkEpochNode", "SparkSourceBatchNode"]


class SparkProgressNode(Node):
    """The last Spark micro-batch a sink committed, and how many producers (slots) it writes with."""

    query: str | None
    batch: int = Field(ge=0)
    epoch: int | None = Field(default=None, ge=0)
    """The last epoch the sink committed (None: a query running as a job voided every batch so far
    before its producers' first epoch)."""
    producers: int = Field(ge=1)
    job_epoch: int | None = Field(default=None, ge=0)
    """A query running as an aligned job: the last job epoch its batches covered."""
    updated_at: int = Field(default_factory=now_ms)
