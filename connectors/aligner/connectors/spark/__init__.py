"""Spark integration through the Python Data Source API (PySpark >= 4.2): ``format("aligned")``.

One line registers it::

    import aligner.connectors.spark
    aligner.connectors.spark.register(spark)

then ``spark.read.format("aligned")`` reads committed epochs of a subject,
``spark.readStream.format("aligned")`` streams every newly committed epoch (or at most ``maxEpochsPerBatch``)
per micro-batch, and ``df.writeStream.format("aligned")`` turns every micro-batch into one epoch of a
target subject. Kafka is read and written through confluent-kafka inside the executors; Spark's own
Kafka connector is not needed.
"""

from __future__ import annotations

from typing import Any

from aligner.extras import require

require("spark", "aligner.connectors.spark")  # one line naming the extra, not a No module named 'pyarrow'

from aligner.connectors.spark.source import SHORT_NAME, AlignedDataSource  # noqa: E402


def register(spark: Any) -> None:
    """Register ``format("aligned")`` with a SparkSession."""
    spark.dataSource.register(AlignedDataSource)


__all__ = ["SHORT_NAME", "AlignedDataSource", "register"]
