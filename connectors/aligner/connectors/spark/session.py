"""A small local SparkSession (or a Spark Connect client session) for the demo, benchmarks and tests, with
``format("aligned")`` registered."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(master: str = "local[2]", app: str = "aligned", **conf: str) -> Any:
    """A quiet local session: no UI, two shuffle partitions, this interpreter on both sides."""
    from pyspark.sql import SparkSession

    from aligner.connectors.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def remote_session(url: str) -> Any:
    """A Spark Connect client session (``sc://host:port``) with ``format("aligned")`` registered: the data
    source's code travels with the plan, so the server needs the library installed, not registered."""
    from pyspark.sql import SparkSession

    from aligner.connectors.spark import register

    spark = SparkSession.builder.remote(url).getOrCreate()
    register(spark)
    return spark
