"""Exact epoch reader throughput vs a raw confluent-kafka read of the same offsets.

A SinkProducer writes ~1,000,000 records of 100 bytes into a 4-partition subject in epochs of 10,000.
Then these readers read the whole span, interleaved and repeated (median of 3):

- raw: a ``confluent_kafka.Consumer`` with ``aligner.connectors.kafka.consumer_config`` (identical settings),
  assigned to every partition from the span's start offsets, ``consume(10000, timeout=0.05)`` until each
  partition's position reaches the end offset of the last epoch, collecting ``m.value()``;
- fast path: ``EpochReader.read_batches`` (stamp-checked Messages per epoch and partition);
- convenience path: ``EpochReader.read`` (one EpochRecord per record);
- diagnostic: the raw read done one partition at a time, as EpochReader does, to separate the cost of
  that strategy from the per-record work of the reader.

Each EpochReader run uses a freshly connected Ledger, so the epoch lookups in ZooKeeper (cached per
Ledger) are part of its time, as they are for any first read; the lookup time is reported separately.

``work`` in the results, per reader summed over the rounds: the records it returned and the bytes of their values
(counted after the timed read); readers commit no transactions, so records and bytes are compared.

    .venv/bin/python -m experiments.bench_reader [--records 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.reader import EpochReader
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments import ForeignCpu
from experiments.common import VALUE_BYTES, Work, read_raw, work_results, write_numbered, write_results

PARTITIONS = 4
EPOCH = 10_000
TARGET = 0.8
SUBJECT = "s"


def is_exact(values: list[bytes], records: int) -> bool:
    """Every record written, each exactly once, nothing else (checked outside the timed part)."""
    if len(values) != records:
        return False
    distinct = set(values)
    pad = b"x" * (VALUE_BYTES - 10)
    return len(distinct) == records and all(v[10:] == pad and int(v[:10]) < records for v in distinct)


def read_fast(zk: str, bootstrap: str, first: int, last: int) -> list[bytes]:
    values: list[bytes] = []
    with Ledger.connect(zk, "/bench") as led, EpochReader(led, bootstrap) as r:
        for _epoch, _partition, msgs in r.read_batches(SUBJECT, first, last):
            values.extend(m.value() for m in msgs)  # type: ignore[misc]  # the sink writes no tombstones
    return values


def read_records(zk: str, bootstrap: str, first: int, last: int) -> list[bytes]:
    with Ledger.connect(zk, "/bench") as led, EpochReader(led, bootstrap) as r:
        return [rec.value for rec in r.read(SUBJECT, first, last)]  # type: ignore[misc]


def lookup_seconds(zk: str, bootstrap: str, first: int, last: int) -> tuple[float, int]:
    """Wall time and round trips of the cold ZooKeeper lookups an EpochReader does before reading."""
    with Ledger.connect(zk, "/bench") as led, EpochReader(led, bootstrap) as r:
        t0 = time.perf_counter()
        r.epochs(SUBJECT, first, last)
        return time.perf_counter() - t0, led.round_trips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records written (a multiple of 10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=120)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # a first-connect retry is logged as a warning

    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        led = Ledger.connect(info.zk, "/bench")
        meta = create_subject(led, info.kafka, SUBJECT, PARTITIONS)
        first, last, write_s = write_numbered(led, info.kafka, SUBJECT, args.records, PARTITIONS, EPOCH)
        span = {p: (led.epochs.committed(SUBJECT, first).offsets[p][0], led.epochs.committed(SUBJECT,
                                                                                             last).offsets[p][1])
                for p in range(PARTITIONS)}
        led.close()
        console.print(f"wrote {args.records:,} records in epochs {first}..{last} "
                      f"({args.records / write_s:,.0f} records/s with the sink); offsets {span}")

        runs: dict[str, Callable[[], list[bytes]]] = {
            "raw consume": lambda: read_raw(info.kafka, meta.topic, span),
            "raw, one partition at a time": lambda: [
                v for p in sorted(span) for v in read_raw(info.kafka, meta.topic, {p: span[p]})],
            "EpochReader.read_batches": lambda: read_fast(info.zk, info.kafka, first, last),
            "EpochReader.read": lambda: read_records(info.zk, info.kafka, first, last),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        counts: dict[str, list[int]] = {name: [] for name in runs}
        work = {name: Work() for name in runs}
        exact = True
        for r in range(args.rounds):
            for name, run in runs.items():
                gc.collect()
                t0 = time.perf_counter()
                values = run()
                times[name].append(time.perf_counter() - t0)
                counts[name].append(len(values))
                work[name].add(Work(records=len(values), bytes=sum(map(len, values))))
                exact = exact and is_exact(values, args.records)
                del values
            console.print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {counts[n][-1] / t[-1]:,.0f}/s" for n, t in times.items()))
        foreign = cpu.cores()
        lookup_s, lookup_trips = lookup_seconds(info.zk, info.kafka, first, last)
        gc.collect()

    n_epochs = last - first + 1
    rate = {name: statistics.median(c / s for c, s in zip(counts[name], t, strict=True)) for name, t in times.items()}
    raw_rate = rate["raw consume"]
    seq_rate = rate["raw, one partition at a time"]
    table = Table(title=f"Exact epoch reads of {args.records:,} records ({n_epochs} epochs, {PARTITIONS} partitions, "
                        f"100 B values), median of {args.rounds}")
    table.add_column("reader")
    table.add_column("records/s (median)", justify="right")
    table.add_column("min .. max", justify="right")
    table.add_column("ratio vs raw", justify="right")
    table.add_column("ratio vs raw one at a time", justify="right")
    for name, t in times.items():
        rates = [c / s for c, s in zip(counts[name], t, strict=True)]
        ratio = rate[name] / raw_rate
        style = "" if name != "EpochReader.read_batches" else ("green" if ratio >= TARGET else "red")
        table.add_row(name, f"{rate[name]:,.0f}", f"{min(rates):,.0f} .. {max(rates):,.0f}",
                      f"[{style}]{ratio:.2f}[/{style}]" if style else f"{ratio:.2f}", f"{rate[name] / seq_rate:.2f}")
    console.print(table)
    fast = rate["EpochReader.read_batches"] / raw_rate
    console.print(f"read_batches/raw = {fast:.3f} (target >= {TARGET}): {'PASS' if fast >= TARGET else 'FAIL'}; "
                  f"every run returned each record exactly once: {'yes' if exact else 'NO'}")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run"
                  + (" [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""))
    console.print(f"cold ZooKeeper lookup of {n_epochs} epochs: {1000 * lookup_s:.0f} ms, {lookup_trips} round trips "
                  f"({100 * lookup_s / statistics.median(times['EpochReader.read_batches']):.1f}% of a fast-path read)")

    result: dict[str, Any] = {
        "benchmark": "bench_reader", "records": args.records, "rounds": args.rounds, "epochs": n_epochs,
        "epoch_records": EPOCH, "partitions": PARTITIONS, "value_bytes": VALUE_BYTES,
        "write_records_per_s": args.records / write_s,
        "seconds": times, "counts": counts,
        "records_per_s_median": rate,
        "ratio_vs_raw": {name: r / raw_rate for name, r in rate.items()},
        "ratio_vs_raw_one_partition_at_a_time": {name: r / seq_rate for name, r in rate.items()},
        "fast_ratio": fast, "target": TARGET, "pass": fast >= TARGET, "exact": exact,
        "foreign_cpu_cores": foreign,
        "zk_lookup_ms": 1000 * lookup_s, "zk_lookup_round_trips": lookup_trips,
        **work_results(work, ("records", "bytes")),
    }
    console.print(f"wrote {write_results('bench_reader', result)}")


if __name__ == "__main__":
    main()
