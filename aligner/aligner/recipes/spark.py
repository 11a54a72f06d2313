"""A Spark sink's micro-batch commit as one recipe: the epoch, the sink's progress and its lineage, atomically."""

from __future__ import annotations

from aligner.recipes.watches import WatchRecipes


class SparkBatchRecipes(WatchRecipes):
    """The commit a Spark sink's driver makes per micro-batch (the adapter defines the node models)."""
