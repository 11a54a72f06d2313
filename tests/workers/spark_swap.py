"""A Spark driver process running one version of a stateful query as an aligned job, for hot-swap tests.

The query is ``experiments.running_query`` (v1 a running count per key, v2 a running sum: incompatible
state). Registered as job ``--job`` (``--follows`` the old version), writing target partitions
``--partitions`` (empty: the old version's, handed over at the swap); with ``--shadow`` (a new version) its
voided output goes to subject ``JOB.shadow``.

Prints ``jvm PID`` once the session is up (SIGKILL it with this process), ``query ID`` once started,
then ``swapped out`` and ``done`` when the query was stopped because its sink finished after a
committed hot-swap. SIGTERM stops the query and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
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
    ap.add_argument("--remote", default=None, help="a Spark Connect client of this server (sc://...)")
    ap.add_argument("--master", default="local[2,2]")
    ap.add_argument("--conf", action="append", default=[], help="a Spark setting K=V")
    ap.add_argument("--sink-option", action="append", default=[], help="an option K=V of the aligned sink")
    args = ap.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    from aligner.connectors.spark.job import AlignedQuery, register_query
    from aligner.connectors.spark.session import local_session, remote_session
    from aligner.ledger import Ledger
    from experiments.running_query import start_running_query
    from tests import spark_faults
    from tests.helpers import SPARK_TEST_JVM

    if args.remote:  # a Connect client: no driver JVM of its own (0); the server's settings apply
        spark = remote_session(args.remote)
        spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        say("jvm 0")
    else:
        spark = local_session(args.master, f"swap-{args.job}", **{
            **SPARK_TEST_JVM,
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            **dict(kv.split("=", 1) for kv in args.conf),
        })
        say(f"jvm {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}")
    ledger = Ledger.connect(args.zk, args.root)
    parts = [int(p) for p in args.partitions.split(",") if p] or None  # "": a version takes the partitions over
    register_query(ledger, args.job, [args.source], args.target, follows=args.follows, output_partitions=parts,
                   version=args.version, shadow=args.shadow)

    conn = {"zk": args.zk, "kafka": args.kafka, "root": args.root}
    options = dict(kv.split("=", 1) for kv in args.sink_option)
    sink = "aligned"
    if set(options) & spark_faults.OPTIONS:  # a fault: the tests' own aligned sink injects it
        spark_faults.register(spark)
        sink = spark_faults.FAULTY
    restarts = 0
    while True:
        query = start_running_query(spark, conn, args.source, args.target, args.job, int(args.version),
                                    args.checkpoint, options, sink)
        say(f"query {query.id}")
        try:
            swapped = AlignedQuery(ledger, query, args.job).run(stop)
            break
        except Exception as exc:
            failure = _failure(exc)
        # A failure inside Spark alone (no error of the data source's Python code): what a driver's
        # supervisor does, restart the query from its checkpoint, at most twice; anything else fails.
        if "PYTHON" in failure or "aligner" in failure or restarts == 2:
            raise SystemExit(failure)
        restarts += 1
        print(f"restarting the query from its checkpoint after a failure inside Spark:\n{failure}", file=sys.stderr,
              flush=True)
    if swapped:
        say("swapped out")
    spark.stop()
    ledger.close()
    say("done")


def _failure(exc: BaseException) -> str:
    """The query's failure, causes first: the JVM's stack trace (the test keeps the end) would hide them."""
    chain: list[str] = []
    cause: BaseException | None = exc
    root = exc
    while cause is not None and len(chain) < 8:
        chain.append(f"{type(cause).__name__}: {getattr(cause, '_desc', None) or cause}"[:600])
        root, cause = cause, getattr(cause, "_cause", None)
    trace = str(getattr(root, "_stackTrace", "") or "").splitlines()[:25]
    return "query failed:\n" + "\n".join(chain) + "\nroot cause at:\n" + "\n".join(trace)


if __name__ == "__main__":
    main()
