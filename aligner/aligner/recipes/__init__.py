"""The ledger's recipes, one module each, stacked into :class:`aligner.ledger.Ledger`:

store (session, typed reads and writes) -> subjects -> reads (committed epochs) -> claims (writers,
incarnations) -> commits (the two round trips) -> watches -> spark (a Spark sink's batch commit).
"""
