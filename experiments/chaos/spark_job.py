"""Job B: a Spark Structured Streaming query from subject ``a`` to ``b`` through format("aligned").

Continuous (processing-time trigger), restarted from its checkpoint after a SIGKILL. It stops by
itself once ``a`` is finished and a micro-batch has read its last epoch (prints ``done``), and on
SIGTERM. Prints ``jvm PID`` when the session is up and ``batch B`` for each committed micro-batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading


def say(line: str) -> None:
    print(line, flush=True)


def read_through(zk: str, root: str, source: str, target: str, sink: str) -> tuple[int | None, int]:
    """(last epoch of ``source`` when finished, else None; the last batch committed to ``target``'s sink,
    and the last source epoch that batch read), from ZooKeeper; (None, -1, -1) when unknown."""
    from aligner.connectors.spark.common import ledger_for
    from aligner.connectors.spark.lineage import source_batch
    from aligner.connectors.spark.writer import read_progress

    ledger = ledger_for(zk, root)
    finished = ledger.epochs.finished(source)
    progress, _ = read_progress(ledger, target, sink)
    if progress is None or progress.query is None:
        return finished, -1
    read = source_batch(ledger, progress.query, progress.batch).get(source)
    return finished, (read.last if read is not None else -1)


def main() -> None:
    ap = argparse.ArgumentParser(prog="chaos-spark")
    for name in ("zk", "kafka", "root", "source", "target", "sink", "checkpoint"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--epochs-per-batch", default=None, help="a cap (default: every committed epoch per batch)")
    ap.add_argument("--master", default="local[2]", help="local[2], or a standalone cluster's spark://...")
    ap.add_argument("--host", default=None, help="the driver's address (its network namespace's, with --netns)")
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    from pyspark.sql import functions as F

    from aligner.connectors.spark.checkpoint import clear_unfinished_writes
    from aligner.connectors.spark.session import local_session
    from experiments.common import SPARK_QUICK_DRIVER

    if args.host:  # executors connect back to the driver at this address
        os.environ["SPARK_LOCAL_IP"] = args.host
    where = {"spark.driver.host": args.host, "spark.driver.bindAddress": args.host} if args.host else {}
    spark = local_session(args.master, "chaos-b", **SPARK_QUICK_DRIVER, **where)
    say(f"jvm {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}")
    clear_unfinished_writes(args.checkpoint, spark)  # a SIGKILL mid-write must not keep it from starting again
    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root}
    v = F.col("value").cast("string")
    n = F.get_json_object(v, "$.n").cast("long")
    out = (spark.readStream.format("aligned").options(**conn, subject=args.source)
           .options(**({"maxEpochsPerBatch": args.epochs_per_batch} if args.epochs_per_batch else {})).load()
           .select("key", F.to_json(F.struct(n.alias("n"), F.get_json_object(v, "$.h").cast("long").alias("h"),
                                             (n * 2).alias("d"), F.col("epoch").alias("src_epoch"),
                                             F.col("partition").alias("src_partition"),
                                             F.col("offset").alias("src_offset"))).alias("value")))
    query = (out.writeStream.format("aligned").options(**conn, subject=args.target, sinkId=args.sink)
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="1 second").start())
    say(f"query {query.id}")
    done = False
    while not stop.is_set() and query.isActive:
        try:
            finished, read = read_through(args.zk, args.root, args.source, args.target, args.sink)
        except Exception as exc:  # ZooKeeper away: ask again later, the query rides it out on its own
            say(f"progress unknown: {type(exc).__name__}")
            finished, read = None, -1
        if finished is not None and read >= finished:
            done = True
            break
        stop.wait(0.5)
    failure = query.exception() if not query.isActive else None
    query.stop()
    spark.stop()
    if failure is not None:
        raise SystemExit(f"query failed: {failure}")
    say("done" if done else "stopped")


if __name__ == "__main__":
    main()
