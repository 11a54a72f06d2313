"""The ledger's recipes, one module each, as objects over one store (kazoo's recipes are objects over one client):

``ledger.subjects`` (registration, writers, epoch numbers), ``ledger.epochs`` (committed epochs as readers see
them), ``ledger.claims`` (writers, incarnations), ``ledger.commits`` (the two round trips of an epoch commit),
``ledger.watches`` (frontiers kept by watches, waits). A Spark sink's micro-batch commit
(:class:`aligner.recipes.spark.SparkBatchRecipes`) is the Spark adapter's, built over a ledger; so are the
reads of one writer's changelog partition a state restore makes (:class:`aligner.recipes.changelogs.ChangelogReads`).
"""
