"""Spark batch epoch reads (``format("aligned")`` at local[2]) vs a plain confluent-kafka read of the same offsets.

A SinkProducer writes ~1,000,000 records of 100 bytes into a 4-partition bytes subject in epochs of
10,000. Then, interleaved and repeated (median of the rounds, after one warm-up of each):

- raw: one ``confluent_kafka.Consumer`` in this process (``aligner.connectors.kafka.consumer_config``),
  assigned to every partition from the span's first offset, ``consume(10000)`` until every position
  reaches the span's end, counting values;
- spark: ``spark.read.format("aligned").option("epochs", "A:B").load()`` written to Spark's ``noop``
  sink, so every row (all six columns) crosses from the Python workers into the JVM; planning (the
  ZooKeeper lookups and the retention check) is included;
- spark count(): the same read ending in ``count()``.

``work`` in the results, per arm summed over the measured rounds: the records it read (raw: its loop's count;
spark -> noop: the rows an ``Observation`` counted as they reached the sink; count(): its answer). Only records are
compared: counting bytes in the raw loop would slow the baseline, and ``count()`` reads no values.

    .venv/bin/python -m experiments.bench_spark_read [--records 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import VALUE_BYTES, Work, read_raw, work_results, write_numbered, write_results

PARTITIONS = 4
EPOCH = 10_000
TARGET = 0.8
SUBJECT = "s"
ROOT = "/bench-spark"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records written (a multiple of 10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from aligner.connectors.spark.session import local_session

    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        meta = create_subject(led, info.kafka, SUBJECT, PARTITIONS, value_format="bytes")
        first, last, write_s = write_numbered(led, info.kafka, SUBJECT, args.records, PARTITIONS, EPOCH)
        span = {p: (led.epochs.committed(SUBJECT, first).offsets[p][0], led.epochs.committed(SUBJECT,
                                                                                             last).offsets[p][1])
                for p in range(PARTITIONS)}
        led.close()
        print(f"wrote {args.records:,} records in epochs {first}..{last} ({args.records / write_s:,.0f}/s)")
        spark = local_session("local[2]", "bench-spark-read")

        def frame():
            return (spark.read.format("aligned").option("zk", info.zk).option("kafka", info.kafka)
                    .option("root", ROOT).option("subject", SUBJECT).option("epochs", f"{first}:{last}")
                    .option("settleHeap", "true").load())

        def spark_noop() -> int:
            """The rows that reached the noop sink, counted on the way (an observed count: one aggregate)."""
            seen = Observation("rows")
            frame().observe(seen, F.count(F.lit(1)).alias("rows")).write.format("noop").mode("overwrite").save()
            return int(seen.get["rows"])

        runs = {
            "raw consume (1 process)": lambda: read_raw(info.kafka, meta.topic, span, collect=False),
            "spark local[2] -> noop": spark_noop,
            "spark local[2] count()": lambda: frame().count(),
        }
        for run in runs.values():  # warm-up: JVM, Python workers, caches
            run()
        times: dict[str, list[float]] = {n: [] for n in runs}
        counts: dict[str, list[int]] = {n: [] for n in runs}
        work = {n: Work() for n in runs}
        for r in range(args.rounds):
            for name, run in runs.items():
                t0 = time.perf_counter()
                counts[name].append(run())
                times[name].append(time.perf_counter() - t0)
                work[name].add(Work(records=counts[name][-1]))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {counts[n][-1] / t[-1]:,.0f}/s" for n, t in times.items()))
        spark.stop()

    rate = {n: statistics.median(c / s for c, s in zip(counts[n], t, strict=True)) for n, t in times.items()}
    raw = rate["raw consume (1 process)"]
    exact = all(c == args.records for cs in counts.values() for c in cs)
    for name, value in rate.items():
        print(f"{name:28s} {value:12,.0f} records/s  ratio {value / raw:.2f}")
    ratio = rate["spark local[2] -> noop"] / raw
    print(f"spark/raw = {ratio:.3f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}; "
          f"counts exact: {'yes' if exact else 'NO'}; cores: {os.cpu_count()}")
    write_results("bench_spark_read", {
        "benchmark": "bench_spark_read", "records": args.records, "rounds": args.rounds,
        "epochs": last - first + 1, "partitions": PARTITIONS, "value_bytes": VALUE_BYTES,
        "records_per_s": rate, "ratio_spark_noop_vs_raw": ratio, "target": TARGET, "counts_exact": exact,
        "seconds": times, **work_results(work, ("records",)),
    })


if __name__ == "__main__":
    main()
