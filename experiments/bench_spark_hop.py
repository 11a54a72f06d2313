"""Spark aligned hop latency with default options (issue 13.6).

Subject X commits an epoch every ``--interval`` seconds (default 0.5 s, 2 epochs/s); a Structured
Streaming passthrough query reads X with ``format("aligned")`` and no read options (the default
read limit takes every committed epoch) and writes subject Y through the aligned sink. For every
X epoch, the hop is the time from its commit to the commit of the Y epoch that holds its records
(read from the sink's lineage in ZooKeeper). Prints the median and p95 overall and per minute, how
far behind the query was at the end, and the median of each micro-batch phase Spark reports. The
baseline is the epoch interval itself, since no record can be older than one interval when its
epoch commits.

    python -m experiments.bench_spark_hop --minutes 10
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from typing import Any

from aligner.connectors.sink import SinkProducer
from aligner.connectors.spark.job import stop_query
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack, wait_for
from aligner.ledger import Ledger
from experiments.common import spark_reads, value, write_results

ROOT = "/bench-spark-hop"
X, Y, SINK = "hop-x", "hop-y", "hop"
PARTITIONS = 2


def _write(led: Ledger, kafka: str, interval: float, per_epoch: int, stop: threading.Event) -> int:
    """Commit one X epoch every ``interval`` seconds until ``stop``; returns the last epoch."""
    n, last = 0, -1
    with SinkProducer(led, kafka, X, "gen", 0, list(range(PARTITIONS))) as p:
        due = time.monotonic()
        while not stop.is_set():
            p.begin()
            for _ in range(per_epoch):
                p.send(value(n), partition=n % PARTITIONS)
                n += 1
            last = p.commit().epoch
            due += interval
            stop.wait(max(0.0, due - time.monotonic()))
    return last


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def hops(led: Ledger) -> list[tuple[float, float]]:
    """(X commit time s, hop s) for every X epoch the query has written to Y."""
    out = []
    for epoch, reads in spark_reads(led, Y, SINK).items():
        written = led.epochs.committed(Y, epoch).committed_at
        for read in reads.values():
            for e in range(read.first, read.last + 1):
                committed = led.epochs.committed(X, e).committed_at
                out.append((committed / 1000, (written - committed) / 1000))
    return sorted(out)


PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets")
"""The parts of a micro-batch Spark reports (StreamingQueryProgress.durationMs); addBatch runs the read and
write tasks and the sink's commit on the driver."""


def collect_progress(query: Any, seen: dict[int, dict[str, Any]]) -> None:
    """Keep the query's progress reports of micro-batches that read rows, by batch id (Spark keeps the last
    100 only, so this is called every 30 s)."""
    for p in query.recentProgress:
        if p.get("numInputRows"):
            seen[int(p["batchId"])] = p


def phase_medians(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per phase over the micro-batches that read rows."""
    out: dict[str, float] = {}
    for phase in PHASES:
        values = [p["durationMs"].get(phase, 0) / 1000 for p in progress]
        if values:
            out[phase] = round(statistics.median(values), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between X epochs")
    ap.add_argument("--records", type=int, default=50, help="records per X epoch")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    from aligner.connectors.spark.session import local_session

    with EmbeddedStack() as info, tempfile.TemporaryDirectory() as checkpoint:
        led = Ledger.connect(info.zk, ROOT)
        for name in (X, Y):
            create_subject(led, info.kafka, name, PARTITIONS, value_format="bytes")
        spark = local_session("local[2]", "bench-spark-hop", **{"spark.ui.showConsoleProgress": "false"})
        conn = {"zk": info.zk, "kafka": info.kafka, "root": ROOT, "settleHeap": "true"}  # as a tuned application
        query = (spark.readStream.format("aligned").options(**conn, subject=X).load().select("key", "value")
                 .writeStream.format("aligned").options(**conn, subject=Y, sinkId=SINK)
                 .option("checkpointLocation", checkpoint).start())
        # Warm-up, not measured: the JVM, Python workers and the first batch take tens of seconds.
        with SinkProducer(led, info.kafka, X, "gen", 0, list(range(PARTITIONS))) as p:
            p.begin()
            p.send(value(0), partition=0)
            warm = p.commit().epoch
        wait_for(lambda: bool(hops(led)), 600, "the warm-up epoch to come through")
        stop = threading.Event()
        result: dict[str, Any] = {}
        writer = threading.Thread(target=lambda: result.update(last=_write(led, info.kafka, args.interval,
                                                                            args.records, stop)), daemon=True)
        progress: dict[int, dict[str, Any]] = {}
        started = time.monotonic()
        writer.start()
        try:
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(min(30.0, args.minutes * 60))
                collect_progress(query, progress)
                done = hops(led)
                recent = [h for _, h in done[-2 * int(30 / args.interval):]]
                print(f"{(time.monotonic() - started) / 60:4.1f} min: {len(done)} X epochs through, "
                      f"last 30 s median hop {statistics.median(recent) if recent else float('nan'):.2f} s", flush=True)
                if query.exception() is not None:
                    raise SystemExit(f"query failed: {query.exception()}")
        finally:
            stop.set()
            writer.join(30)
        last = result["last"]
        behind_at_end = (led.epochs.frontier(X) or 0) - max((r.last for reads in spark_reads(led, Y, SINK).values()
                                                      for r in reads.values()), default=-1)
        wait_for(lambda: any(r.last >= last for reads in spark_reads(led, Y, SINK).values()
                             for r in reads.values()), 300,
                 "the query to write the last X epoch")
        collect_progress(query, progress)
        stop_query(query)  # between micro-batches: no abort errors
        spark.stop()
        done = [h for h in hops(led) if h[0] > led.epochs.committed(X, warm).committed_at / 1000]
        led.close()
    t0 = done[0][0]
    latencies = [h for _, h in done]
    # Whole minutes of input only: the epochs committed as the input stopped form no minute of their own.
    per_minute = [[h for t, h in done if m * 60 <= t - t0 < (m + 1) * 60] for m in range(max(1, int(args.minutes)))]
    per_minute = [m for m in per_minute if m]
    first, final = statistics.median(per_minute[0]), statistics.median(per_minute[-1])
    payload = {
        "interval_s": args.interval, "minutes": args.minutes, "x_epochs": len(done),
        "median_s": round(statistics.median(latencies), 3), "p95_s": round(_pct(latencies, 95), 3),
        "max_s": round(max(latencies), 3), "median_intervals": round(statistics.median(latencies) / args.interval, 2),
        "first_minute_median_s": round(first, 3), "last_minute_median_s": round(final, 3),
        "last_over_first": round(final / first, 2), "behind_epochs_at_end": behind_at_end,
        "per_minute_median_s": [round(statistics.median(m), 3) for m in per_minute],
        "micro_batches_with_rows": len(progress), "phase_median_s": phase_medians(list(progress.values())),
    }
    print(f"{len(done)} X epochs at {1 / args.interval:g}/s over {args.minutes:g} min, default read options")
    print(f"hop X commit -> Y commit: median {payload['median_s']} s ({payload['median_intervals']} intervals), "
          f"p95 {payload['p95_s']} s, max {payload['max_s']} s")
    print(f"first minute median {first:.3f} s, last minute median {final:.3f} s: ratio {final / first:.2f} "
          f"(target <= 1.5); {behind_at_end} X epochs behind when the input stopped")
    print(f"micro-batch phases, median s over {len(progress)} batches with rows: "
          + ", ".join(f"{k} {v}" for k, v in payload["phase_median_s"].items()))
    print(f"results: {write_results('bench_spark_hop', payload)}")


if __name__ == "__main__":
    main()
