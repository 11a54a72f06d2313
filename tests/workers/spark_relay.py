"""A Spark driver process for crash tests: streams subject X into subject Y through format("aligned").

Every Y record is {"src_epoch", "src_partition", "src_offset", "j"} of the X record it came from, so a
test can check each X record's result reaches Y exactly once. Runs ``Trigger.AvailableNow`` from
``--checkpoint`` and prints ``jvm PID`` (the Spark driver JVM, to be SIGKILLed with this process)
once the session is up, then ``done`` when every X epoch committed at start is written.
``--pause-after-commit B`` hangs the driver right after batch B's ZooKeeper commit, before Spark's
commit log records it. ``--master spark://...`` runs it on a standalone cluster; ``--conf K=V`` and
``--sink-option K=V`` (repeatable) set Spark and sink options. With a fault (``--pause-after-commit`` or
a fault's sink option, e.g. ``hangTask``) it writes through the tests' ``format("aligned_faulty")``
(tests/spark_faults.py).
"""

from __future__ import annotations

import argparse
import json


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("zk", "kafka", "root", "source", "target", "sink", "checkpoint"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--pause-after-commit", default=None, help="hang after this batch's ZooKeeper commit")
    ap.add_argument("--master", default="local[2,2]")
    ap.add_argument("--remote", default=None, help="run through this Spark Connect server (sc://...) instead")
    ap.add_argument("--conf", action="append", default=[], help="a Spark setting K=V")
    ap.add_argument("--sink-option", action="append", default=[], help="an option K=V of the aligned sink")
    args = ap.parse_args()

    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from aligner.connectors.spark.session import local_session, remote_session
    from tests import spark_faults
    from tests.helpers import SPARK_TEST_JVM

    conf = {**SPARK_TEST_JVM, **dict(kv.split("=", 1) for kv in args.conf)}
    if args.remote:  # a Connect client: no driver JVM of its own (0)
        spark = remote_session(args.remote)
        say("jvm 0")
    else:
        spark = local_session(args.master, "spark-relay", **conf)
        say(f"jvm {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}")
    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root}
    j_of = F.udf(lambda value: json.loads(value)["j"], LongType())
    out = (spark.readStream.format("aligned").options(**conn, subject=args.source, maxEpochsPerBatch="1").load()
           .select("key", F.to_json(F.struct(F.col("epoch").alias("src_epoch"),
                                             F.col("partition").alias("src_partition"),
                                             F.col("offset").alias("src_offset"),
                                             j_of("value").alias("j"))).alias("value")))
    options = dict(kv.split("=", 1) for kv in args.sink_option)
    if args.pause_after_commit is not None:
        options["pauseAfterCommit"] = args.pause_after_commit
    sink = "aligned"
    if set(options) & spark_faults.OPTIONS:
        spark_faults.register(spark)
        sink = spark_faults.FAULTY
    writer = out.writeStream.format(sink).options(**conn, subject=args.target, sinkId=args.sink, **options)
    query = writer.option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
    say(f"query {query.id}")
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()
    say("done")


if __name__ == "__main__":
    main()
