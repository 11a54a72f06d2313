"""A small local SparkSession (or a Spark Connect client session) for the demo, benchmarks and tests, with
``format("aligned")`` registered."""

from __future__ import annotations

import os
import sys
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

_MANAGER = "FileSystemBasedCheckpointFileManager.class"


@cache
def local_checkpoint_conf() -> dict[str, str]:
    """Spark settings that keep a streaming query's checkpoint writes in the JVM on a local file system.

    Spark's default checkpoint manager goes through Hadoop's FileContext, which without Hadoop's native
    library forks ``readlink`` per file status and ``chmod`` per file and writes a ``.crc`` beside each file:
    about 20 process forks per micro-batch (walCommit and commitOffsets were 0.06 and 0.1 s of a passthrough
    hop). The FileSystem-based manager over Hadoop's raw local file system does the same renames without
    them. Exactly-once does not rest on Spark's checkpoint (the ledger holds the offsets), so nothing is
    weakened. The manager's package moved between Spark versions: it is looked up in the installed jar, and
    nothing is set where it is not found.
    """
    try:
        import pyspark
    except ImportError:
        return {}
    for jar in sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar")):
        with zipfile.ZipFile(jar) as z:
            names = [n for n in z.namelist() if n.endswith("/" + _MANAGER)]
        if names:
            cls = names[0].removesuffix(".class").replace("/", ".")
            return {"spark.sql.streaming.checkpointFileManagerClass": cls,
                    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"}
    return {}


def local_session(master: str = "local[2]", app: str = "aligned", **conf: str) -> Any:
    """A quiet local session: no UI, two shuffle partitions, this interpreter on both sides, checkpoints
    written without process forks (``local_checkpoint_conf``); ``conf`` overrides any of them."""
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
    for key, value in {**local_checkpoint_conf(), **conf}.items():
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
