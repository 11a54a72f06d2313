"""A Spark version of the upgrades run's job (:func:`experiments.chaos.jobs.job_a`) as an aligned job.

Per record ``{"n": N}`` keyed ``N % KEYS`` it writes ``{"n", "h", "c", "w", "v"}`` keyed the same, ``c``
counting the earlier records of the key: Spark keeps the counts in its state (``applyInPandasWithState``),
rebuilt from the start of the input, as a new checkpoint cannot take another engine's state over. Rows reach
the write task of their key's target partition (:func:`aligner.connectors.spark.keys.route_by_key`), so a
key keeps its partition, and its order, across the versions of every engine.

Registered as job ``--job`` following ``--follows``; no partitions of its own: it takes the old version's
over at the swap. Prints ``query ID`` once started, ``swapped out`` once its sink finished after a
committed hot-swap, then ends; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.upgrades_spark")
    for name in ("zk", "kafka", "root", "source", "target", "job", "follows", "checkpoint"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--version", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True, help="of the target (the key rule)")
    ap.add_argument("--keys", type=int, required=True, help="distinct keys of the input (N %% KEYS)")
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from aligner.connectors.spark.job import AlignedQuery, register_query
    from aligner.connectors.spark.keys import route_by_key
    from aligner.connectors.spark.session import local_session
    from aligner.ledger import Ledger
    from experiments.common import SPARK_QUICK_DRIVER

    spark = local_session("local[2]", f"upgrades-{args.job}", **{
        **SPARK_QUICK_DRIVER,
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.shuffle.partitions": str(args.partitions),
    })
    ledger = Ledger.connect(args.zk, args.root)
    register_query(ledger, args.job, [args.source], args.target, follows=args.follows, version=str(args.version))
    version = args.version

    def counted(key, frames, state):
        c = state.get[0] if state.exists else 0
        ns = sorted(int(n) for f in frames for n in f["n"])  # one key's records come from one input partition
        out = []
        for n in ns:
            # h(n) of experiments.chaos.jobs, written out: this runs in Spark's Python workers, which cannot
            # be relied on to import the experiments package
            out.append(json.dumps({"n": n, "h": (n * 7919 + 13) % 1_000_003, "c": c, "w": 0, "v": version}))
            c += 1
        state.update((c,))
        yield pd.DataFrame({"key": [str(key[0])] * len(ns), "value": out})

    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root}
    n = F.get_json_object(F.col("value").cast("string"), "$.n").cast("long")
    rows = (spark.readStream.format("aligned").options(**conn, subject=args.source, job=args.job).load()
            .select(n.alias("n")).withColumn("k", F.col("n") % args.keys))
    out = rows.groupBy("k").applyInPandasWithState(counted, "key string, value string", "c long", "append",
                                                   GroupStateTimeout.NoTimeout)
    query = (route_by_key(out, args.partitions).writeStream.format("aligned")
             .options(**conn, subject=args.target, job=args.job)
             .option("checkpointLocation", args.checkpoint).outputMode("append").start())
    print(f"query {query.id}", flush=True)
    swapped = AlignedQuery(ledger, query, args.job).run(stop)
    if swapped:
        print("swapped out", flush=True)
    spark.stop()
    ledger.close()


if __name__ == "__main__":
    main()
