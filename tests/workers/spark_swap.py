"""A Spark driver process running one version of a stateful query as an aligned job, for hot-swap tests.

Reads subject X ({"n": N} records) and keeps per key k = N % 4 a running aggregate in Spark state
(applyInPandasWithState): version 1 a running count, version 2 a running sum (incompatible state).
Every input yields one output {"in": {"n": N}, "k", "count" | "sum", "v"} in the target, keyed N as
its input. With ``--shadow`` (a new version) the voided output goes to subject ``JOB.shadow``. Registered as
job ``--job`` (``--follows`` the old version), writing target partitions ``--partitions``.

Prints ``jvm PID`` once the session is up (SIGKILL it with this process), ``query ID`` once started,
then ``swapped out`` and ``done`` when the query was stopped because its sink finished after a
committed hot-swap. SIGTERM stops the query and exits 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("zk", "kafka", "root", "source", "target", "job", "checkpoint", "partitions"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--follows", default=None)
    ap.add_argument("--version", default="1", choices=["1", "2"])
    ap.add_argument("--shadow", action="store_true", help="a new version writing what it voids to JOB.shadow")
    args = ap.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from aligner.connectors.spark.job import AlignedQuery, register_query
    from aligner.connectors.spark.session import local_session
    from aligner.ledger import Ledger

    spark = local_session("local[2,2]", f"swap-{args.job}", **{
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    })
    say(f"jvm {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}")
    ledger = Ledger.connect(args.zk, args.root)
    parts = [int(p) for p in args.partitions.split(",")]
    register_query(ledger, args.job, [args.source], args.target, follows=args.follows, output_partitions=parts,
                   version=args.version, shadow=args.shadow)
    version = int(args.version)

    def running(key, frames, state):  # type: ignore[no-untyped-def]
        acc = state.get[0] if state.exists else 0
        ns = sorted(int(n) for f in frames for n in f["n"])
        out = []
        for n in ns:
            acc += 1 if version == 1 else n
            out.append(json.dumps({"in": {"n": n}, "k": int(key[0]), ("count" if version == 1 else "sum"): acc,
                                   "v": version}))
        state.update((acc,))
        yield pd.DataFrame({"key": [str(n) for n in ns], "value": out})

    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root}
    n = F.get_json_object(F.col("value").cast("string"), "$.n").cast("long")
    rows = (spark.readStream.format("aligned").options(**conn, subject=args.source, job=args.job).load()
            .select(n.alias("n")).withColumn("k", F.col("n") % 4))
    out = rows.groupBy("k").applyInPandasWithState(running, "key string, value string", "acc long", "append",
                                                   GroupStateTimeout.NoTimeout)
    query = (out.writeStream.format("aligned").options(**conn, subject=args.target, job=args.job)
             .option("checkpointLocation", args.checkpoint).outputMode("append").start())
    say(f"query {query.id}")
    try:
        swapped = AlignedQuery(ledger, query, args.job).run(stop)
    except Exception as exc:  # the Python cause first: the JVM's stack trace would hide it
        text = str(exc)
        causes = [line for line in text.splitlines() if "Error" in line or "aligner" in line][:40]
        raise SystemExit("query failed: " + "\n".join(causes) + "\n" + text[:1500]) from None
    if swapped:
        say("swapped out")
    spark.stop()
    ledger.close()
    say("done")


if __name__ == "__main__":
    main()
