"""The key rule (:mod:`aligner.keys`) for a Spark query: rows reach the write task that owns their key's partition.

An aligned sink has one write task per target partition (task ``i`` writes partition ``i``), and a task
writes every row it gets to its own partition. Spark hands rows to tasks by its own hash partitioning,
``pmod(murmur3(columns), n)``, so a key would land in another partition than a runtime, Faust or Kafka
producer puts it (``crc32(key) % P``), and move across a hot-swap to or from the query. :func:`route_by_key`
repartitions by a column whose Spark hash is the key's partition: the key keeps its partition, and its
order, across versions of every engine.
"""

from __future__ import annotations

from typing import Any

ROUTE = "_aligner_route"
"""The column the repartition hashes, dropped right after it."""
PROBE = 64
"""Integers probed per task for one whose Spark hash lands on it (each lands on a given task with odds 1/n)."""


def route_by_key(df: Any, partitions: int, key: str = "key") -> Any:
    """``df`` repartitioned into ``partitions`` Spark partitions, each row in ``crc32(key) % partitions``:
    put it right before ``writeStream.format("aligned")`` of a subject of ``partitions`` partitions. Rows of
    one key keep their relative order when they come from one input partition (the key rule's input side)."""
    from pyspark.sql import functions as F

    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    tags = _tags(df.sparkSession, partitions)
    partition = F.pmod(F.crc32(F.col(key).cast("binary")), F.lit(partitions)).cast("int")
    tag = F.element_at(F.array(*[F.lit(t) for t in tags]), partition + F.lit(1))
    # The tag as a column of its own, not an expression of the shuffle: its projection hands the exchange the
    # rows it can serialize (after applyInPandasWithState, a shuffle by an expression failed with
    # "ColumnarBatchRow cannot be cast to UnsafeRow").
    return df.withColumn(ROUTE, tag).repartition(partitions, ROUTE).drop(ROUTE)


_TAGS: dict[int, tuple[int, ...]] = {}
"""Tags per task count: Spark's hash is fixed (Murmur3, seed 42), so one probe per process serves every query."""


def _tags(spark: Any, n: int) -> tuple[int, ...]:
    """For each task ``i`` of ``n``, an int whose Spark hash partitioning sends it to task ``i``, computed by
    Spark's own ``hash`` (the expression its HashPartitioning uses), so no copy of Murmur3 lives here."""
    if n not in _TAGS:
        buckets = [r[0] for r in spark.range(0, PROBE * n).selectExpr(f"pmod(hash(cast(id as int)), {n})").collect()]
        first: dict[int, int] = {}
        for value, bucket in enumerate(buckets):
            first.setdefault(bucket, value)
        if missing := sorted(set(range(n)) - set(first)):
            raise RuntimeError(f"no int below {len(buckets)} hashes to Spark partitions {missing} of {n}")
        _TAGS[n] = tuple(first[i] for i in range(n))
    return _TAGS[n]
