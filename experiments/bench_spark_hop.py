"""Spark aligned hop latency with default options (issue 13.6).

Subject X commits an epoch every ``--interval`` seconds (default 0.5 s, 2 epochs/s); a Structured
Streaming passthrough query reads X with ``format("aligned")`` and no read options (the default
read limit takes every committed epoch) and writes subject Y through the aligned sink. For every
X epoch, the hop is the time from its commit to the commit of the Y epoch that holds its records
(read from the sink's lineage in ZooKeeper). Prints the median and p95 overall and per minute, how
far behind the query was at the end, and the median of each micro-batch phase Spark reports. The
baseline is the epoch interval itself, since no record can be older than one interval when its
epoch commits.

Spark's own floor for the same hop (``--plain-minutes``, after the aligned query, in the same session): the
plain Kafka pipeline of ``bench_spark_pipeline`` (``format("plainkafka")`` in and out: the Python Data Source
API the product uses, confluent-kafka clients, no ZooKeeper, no transactions on the output, at-least-once),
default trigger, reading a plain topic into which the same writer cadence commits a transaction of the same
records every interval. Its hop runs from a transaction's commit to the end of the micro-batch that read it
(Spark's progress report: its ``timestamp`` plus ``triggerExecution``; the batch's write tasks flushed their
records before it ends). What separates the two is the aligned source's and sink's own work; what they share is
Spark's micro-batch machinery (offset log, planning, two Python workers per task, commit log). Below both, the
engine's own floor without Python: Spark's built-in ``rate`` source (the same rows per second) into its ``noop``
sink, the median ``triggerExecution`` of its micro-batches with rows.

    python -m experiments.bench_spark_hop --minutes 10 [--plain-minutes 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import time
from typing import Any

from confluent_kafka import Producer

from aligner.connectors.kafka import QUIET, ensure_topic
from aligner.connectors.sink import SinkProducer
from aligner.connectors.spark.job import stop_query
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack, wait_for
from aligner.ledger import Ledger
from experiments.common import PRODUCER_SETTINGS, batch_ended, spark_reads, value, write_results

ROOT = "/bench-spark-hop"
X, Y, SINK = "hop-x", "hop-y", "hop"
PLAIN_IN, PLAIN_OUT = "hop-plain-in", "hop-plain-out"
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


def minute_medians(progress: list[dict[str, Any]], phase: str = "triggerExecution") -> list[float]:
    """The median duration of ``phase`` per whole minute of micro-batches with rows: whether it grows."""
    if not progress:
        return []
    t0 = min(batch_ended(p) for p in progress)
    minutes: dict[int, list[float]] = {}
    for p in progress:
        minutes.setdefault(int((batch_ended(p) - t0) // 60), []).append(p["durationMs"].get(phase, 0) / 1000)
    return [round(statistics.median(v), 3) for _, v in sorted(minutes.items())]


def phase_medians(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per phase over the micro-batches that read rows."""
    out: dict[str, float] = {}
    for phase in PHASES:
        values = [p["durationMs"].get(phase, 0) / 1000 for p in progress]
        if values:
            out[phase] = round(statistics.median(values), 3)
    return out


def _write_plain(kafka: str, interval: float, per_epoch: int, stop: threading.Event,
                 commits: list[tuple[float, dict[int, int]]]) -> None:
    """The plain arm's input: one transaction of ``per_epoch`` records every ``interval`` seconds until ``stop``;
    ``commits`` gets (commit time s, the partitions' end offsets after it) for each."""
    kp = Producer({"bootstrap.servers": kafka, "transactional.id": "bench-spark-hop.plain", **PRODUCER_SETTINGS,
                   **QUIET})
    kp.init_transactions(30)
    ends = dict.fromkeys(range(PARTITIONS), 0)
    n, due = 0, time.monotonic()
    while not stop.is_set():
        kp.begin_transaction()
        written = set()
        for _ in range(per_epoch):
            kp.produce(PLAIN_IN, value(n), None, n % PARTITIONS)
            ends[n % PARTITIONS] += 1
            written.add(n % PARTITIONS)
            n += 1
        kp.commit_transaction(60)
        for p in written:  # the commit marker after the transaction's records, in the partitions it wrote
            ends[p] += 1
        commits.append((time.time(), dict(ends)))
        due += interval
        stop.wait(max(0.0, due - time.monotonic()))


def _offsets(offset: Any) -> dict[int, int]:
    """A plain batch's offset as its progress report carries it (JSON text or already parsed)."""
    parsed = json.loads(offset) if isinstance(offset, str) else offset
    return {int(p): int(o) for p, o in (parsed or {}).items()}


def plain_hops(progress: list[dict[str, Any]], commits: list[tuple[float, dict[int, int]]]) -> list[float]:
    """For every input transaction, from its commit to the end of the first micro-batch whose end offsets
    cover its records (a broker may or may not count the commit marker after them in a partition's end)."""
    batches = [(_offsets(p["sources"][0]["endOffset"]), batch_ended(p))
               for p in sorted(progress, key=lambda p: int(p["batchId"]))]
    out, i = [], 0
    for committed, ends in commits:  # both in order: a later transaction is read by the same batch or a later one
        while i < len(batches) and not all(batches[i][0].get(q, 0) >= o - 1 for q, o in ends.items()):
            i += 1  # its last record, whatever the marker
        if i == len(batches):
            break
        out.append(batches[i][1] - committed)
    return out


def plain_floor(spark: Any, kafka: str, minutes: float, interval: float, records: int,
                checkpoint: str) -> dict[str, Any]:
    """Spark's own floor for the hop (module docstring): the plain pipeline under the same input cadence."""
    # By reference (that module by name): the Python workers import it.
    from experiments.bench_spark_pipeline import PlainKafkaSource

    spark.dataSource.register(PlainKafkaSource)
    for topic in (PLAIN_IN, PLAIN_OUT):
        ensure_topic(kafka, topic, PARTITIONS)
    opts = {"kafka": kafka, "partitions": str(PARTITIONS)}
    query = (spark.readStream.format("plainkafka").options(**opts, topic=PLAIN_IN).load().select("key", "value")
             .writeStream.format("plainkafka").options(**opts, topic=PLAIN_OUT)
             .option("checkpointLocation", checkpoint).start())
    commits: list[tuple[float, dict[int, int]]] = []
    stop = threading.Event()
    writer = threading.Thread(target=_write_plain, args=(kafka, interval, records, stop, commits), daemon=True)
    progress: dict[int, dict[str, Any]] = {}
    try:
        wait_for(lambda: bool(query.recentProgress), 600, "the plain query's first micro-batch")  # warm-up
        started = time.monotonic()
        writer.start()
        while time.monotonic() - started < minutes * 60:
            time.sleep(min(30.0, minutes * 60))
            collect_progress(query, progress)
            if query.exception() is not None:
                raise SystemExit(f"plain query failed: {query.exception()}")
    finally:
        stop.set()
        writer.join(30)
    sent = list(commits)

    def through() -> bool:
        collect_progress(query, progress)
        return len(plain_hops(list(progress.values()), sent)) >= len(sent)

    wait_for(through, 120, "the plain query to read the last transaction")
    stop_query(query)
    hops_s = plain_hops(list(progress.values()), sent)
    return {"minutes": minutes, "transactions": len(hops_s), "median_s": round(statistics.median(hops_s), 3),
            "p95_s": round(_pct(hops_s, 95), 3), "phase_median_s": phase_medians(list(progress.values())),
            "per_minute_micro_batch_s": minute_medians(list(progress.values()))}


def engine_floor(spark: Any, minutes: float, rows_per_s: float, checkpoint: str) -> dict[str, Any]:
    """The engine's floor (module docstring): ``rate`` -> ``noop``, no Python in the micro-batch."""
    query = (spark.readStream.format("rate").option("rowsPerSecond", str(max(1, round(rows_per_s)))).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint).start())
    progress: dict[int, dict[str, Any]] = {}
    started = time.monotonic()
    try:
        while time.monotonic() - started < minutes * 60:
            time.sleep(min(10.0, minutes * 60))
            collect_progress(query, progress)
    finally:
        stop_query(query)
    batches = [p for p in progress.values() if p["batchId"] > 0]  # the first one compiles the plan
    return {"minutes": minutes, "micro_batches": len(batches),
            "trigger_median_s": phase_medians(batches).get("triggerExecution")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between X epochs")
    ap.add_argument("--records", type=int, default=50, help="records per X epoch")
    ap.add_argument("--plain-minutes", type=float, default=3.0,
                    help="minutes of Spark's own floor, the plain pipeline (0: none)")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    from aligner.connectors.spark.session import local_session

    with EmbeddedStack() as info, tempfile.TemporaryDirectory() as checkpoint, \
            tempfile.TemporaryDirectory() as plain_checkpoint, tempfile.TemporaryDirectory() as rate_checkpoint:
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
        floor = (plain_floor(spark, info.kafka, args.plain_minutes, args.interval, args.records, plain_checkpoint)
                 if args.plain_minutes > 0 else None)
        engine = (engine_floor(spark, args.plain_minutes, args.records / args.interval, rate_checkpoint)
                  if args.plain_minutes > 0 else None)
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
        "per_minute_micro_batch_s": minute_medians(list(progress.values())),
        "plain": floor, "engine": engine,
    }
    print(f"{len(done)} X epochs at {1 / args.interval:g}/s over {args.minutes:g} min, default read options")
    print(f"hop X commit -> Y commit: median {payload['median_s']} s ({payload['median_intervals']} intervals), "
          f"p95 {payload['p95_s']} s, max {payload['max_s']} s")
    print(f"first minute median {first:.3f} s, last minute median {final:.3f} s: ratio {final / first:.2f} "
          f"(target <= 1.5); {behind_at_end} X epochs behind when the input stopped")
    print(f"micro-batch phases, median s over {len(progress)} batches with rows: "
          + ", ".join(f"{k} {v}" for k, v in payload["phase_median_s"].items()))
    print(f"micro-batch median per minute: {payload['per_minute_micro_batch_s']}")
    if floor is not None:
        print(f"Spark's own floor, the plain pipeline over {floor['minutes']:g} min: hop median {floor['median_s']} s, "
              f"p95 {floor['p95_s']} s over {floor['transactions']} transactions; phases "
              + ", ".join(f"{k} {v}" for k, v in floor["phase_median_s"].items())
              + f"; micro-batch median per minute: {floor['per_minute_micro_batch_s']}")
        print(f"aligned hop / Spark's floor: median {payload['median_s'] / floor['median_s']:.2f}")
    if engine is not None:
        print(f"the engine's floor without Python (rate -> noop, same rows/s): micro-batch median "
              f"{engine['trigger_median_s']} s over {engine['micro_batches']} micro-batches")
    print(f"results: {write_results('bench_spark_hop', payload)}")


if __name__ == "__main__":
    main()
