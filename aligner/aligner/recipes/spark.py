"""A Spark sink's micro-batch commit as one recipe: the epoch, the sink's progress and its lineage, atomically.

The driver of a streaming query commits each micro-batch in one multi-op: every slot's contribution
to the epoch (through ``commit_epoch``, which fences zombie slots), the sink's progress node (the last
query id and batch id, so that a batch Spark runs again after a restart is recognised) and the
lineage record of the epoch (which micro-batch wrote it). The adapter defines the node models; the
paths are the layout's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kazoo.exceptions import BadVersionError, NodeExistsError

from aligner.errors import FencedError
from aligner.models import Node, WritersNode
from aligner.ops import Create, Op, SetData, raise_failure
from aligner.recipes.commits import CommitRecipes, Contribution
from aligner.recipes.store import Store


class SparkBatchRecipes:
    """The commit a Spark sink's driver makes per micro-batch: a recipe the Spark adapter holds, over the
    ledger's store and commits, built once per ledger and process
    (:func:`aligner.connectors.spark.common.spark_recipes`)."""

    def __init__(self, ledger: Store, commits: CommitRecipes) -> None:
        self.store = ledger
        self.commits = commits

    def commit_sink_batch(self, subject: str, sink: str, batch: int, epoch: int,
                          contributions: Sequence[Contribution], progress: Node, progress_version: int,
                          lineage: Node | None = None, writers: tuple[WritersNode, int] | None = None) -> None:
        """Commit micro-batch ``batch`` of Spark sink ``sink`` on ``subject``, all or nothing: the
        contributions to ``epoch`` (none: the progress alone, for a batch whose output is void), the
        progress (created with its epochs folder the first time, ``progress_version`` -1, else
        compare-and-set on it) and, when given, ``lineage`` as the record of ``epoch``. With ``writers`` (the
        subject's writers document as the batch was planned) the epoch node is made by the same multi-op, so the
        commit is one request; without, the caller made it (``ensure_epoch``).

        Another writer of the sink in between (a zombie driver, a restarted one) fails it with
        :class:`FencedError`, and nothing is committed."""
        lay, path = self.store.layout, self.store.layout.spark_progress(subject, sink)
        ops: list[Op]
        if progress_version < 0:
            ops = [Create(path, progress.dump()), Create(lay.spark_sink_epochs(subject, sink))]
        else:
            ops = [SetData(path, progress.dump(), progress_version)]
        if lineage is not None:
            record = lay.spark_sink_epoch(subject, sink, epoch)
            if progress_version < 0:  # the epochs folder is made by this multi-op: its first bucket too
                ops.append(Create(record.rsplit("/", 1)[0]))
            else:
                self.store.ensure_bucket(record)
            ops.append(Create(record, lineage.dump()))
        try:
            if contributions and writers is not None:
                self.commits.commit_new_epoch(subject, epoch, contributions, writers, ops)
            elif contributions:
                self.commits.commit_epoch(epoch, contributions, ops)
            else:
                raise_failure(self.store.multi(*ops))
        except (FencedError, BadVersionError, NodeExistsError) as exc:
            raise FencedError(f"batch {batch} of sink {sink!r} on {subject!r}: another writer changed the sink while "
                              f"this batch committed ({type(exc).__name__}); nothing was committed") from exc
