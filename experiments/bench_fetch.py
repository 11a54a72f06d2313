"""Fetch latency vs batches per partition on the embedded broker, for candidate consumer fetch waits.

Why: Tansu 0.6 (memory storage) pays for every batch of a partition on each fetch and treats
``fetch.wait.max.ms`` as a deadline for finding the data. This measures,
for each partition size (one record per batch) and each wait, on one partition:

- tail first: time to the first record of a consumer assigned at the last offset;
- tail end: time until the consumer knows the partition's end (partition EOF), and for ``product``
  ``fetched_end_offsets`` with the product's adaptive consumer (it takes the end from the fetch's high
  watermark instead of waiting for an empty fetch, and raises the wait when fetches come back empty);
- head read: time to read the whole partition from offset 0 (records/s), or how many records came
  before the limit;
- caught-up CPU: the broker's CPU per consumer idling at the partition's end (4 consumers, 5 s);
- early answer: for a caught-up consumer, delay from producing a record to consuming it (does the
  broker answer a waiting fetch when data arrives, or at the end of the wait?).

    .venv/bin/python -m experiments.bench_fetch [--sizes 1000,10000,30000,60000] [--waits 10,100,500,2000]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from aligner.connectors import kafka as kafka_module
from aligner.connectors.kafka import QUIET, FetchingConsumer, consumer_config, ensure_topic, fetched_end_offsets
from aligner.embedded.stack import EmbeddedStack
from experiments import ForeignCpu, cpu_seconds
from experiments.common import write_results

TOPIC = "fetch-bench"
EARLY = "fetch-bench-early"
"""A small partition for the early-answer measurement (how the wait behaves, not the fetch cost)."""


def fill(bootstrap: str, count: int) -> float:
    """``count`` more records into partition 0, one batch each; returns batches/s."""
    p = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0,
                  "enable.idempotence": False, **QUIET})
    t0 = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                p.produce(TOPIC, b"x" * 100, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(120)
    return count / max(1e-9, time.perf_counter() - t0)


def consumer(bootstrap: str, wait: int, offset: int, topic: str = TOPIC) -> Consumer:
    c = Consumer(consumer_config(bootstrap, wait_ms=wait))
    c.assign([TopicPartition(topic, 0, offset)])
    return c


def until(c: Consumer, want: str, limit: float, end: int = 0) -> tuple[float | None, int]:
    """Seconds until the first record ("first"), EOF ("eof") or ``end`` reached ("all"); None past ``limit``."""
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < limit:
        for m in c.consume(10000, 0.05):
            err = m.error()
            if err is None:
                n += 1
                if want == "first" or (want == "all" and (m.offset() or 0) + 1 >= end):
                    return time.perf_counter() - t0, n
            elif err.code() == KafkaError._PARTITION_EOF and want == "eof":
                return time.perf_counter() - t0, n
    return None, n


def product_end(bootstrap: str) -> tuple[float, int]:
    """fetched_end_offsets with a fresh adaptive consumer (nothing learned): seconds and the wait it ended at."""
    kafka_module._learned.clear()
    fc = FetchingConsumer(bootstrap)
    try:
        t0 = time.perf_counter()
        fetched_end_offsets(fc, TOPIC, [0], bootstrap)
        return time.perf_counter() - t0, fc.wait_ms
    finally:
        fc.close()


def caught_up_cpu(bootstrap: str, pid: int, wait: int, end: int, seconds: float = 5.0, n: int = 4) -> float:
    """Broker CPU (% of a core) per consumer idling at the partition's end."""
    cs = [consumer(bootstrap, wait, end) for _ in range(n)]
    try:
        for c in cs:
            until(c, "eof", 10.0)
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for c in cs:
                c.consume(1000, 0.01)
        return 100 * (cpu_seconds(pid) - c0) / (time.perf_counter() - t0) / n
    finally:
        for c in cs:
            c.close()


def early_answer(bootstrap: str, wait: int, end: int, samples: int = 5) -> tuple[float, int]:
    """Median seconds from producing a record to a caught-up consumer getting it; the new end."""
    c = consumer(bootstrap, wait, end, EARLY)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **QUIET})
    lat = []
    try:
        until(c, "eof", 10.0)
        for i in range(samples):
            time.sleep(0.37 + 0.11 * i)  # different phases against the fetch cycle
            t0 = time.perf_counter()
            p.produce(EARLY, b"y", partition=0)
            p.flush(10)
            got, _ = until(c, "first", 10.0)
            lat.append(time.perf_counter() - t0 if got is not None else float("inf"))
            end += 1
    finally:
        c.close()
    return statistics.median(lat), end


def measure(bootstrap: str, pid: int, size: int, waits: list[int], limit: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for wait in waits:
        c = consumer(bootstrap, wait, size - 1)
        tail_first, _ = until(c, "first", limit)
        c.close()
        c = consumer(bootstrap, wait, size - 1)  # a fresh one: EOF may come with the first record
        tail_eof, _ = until(c, "eof", limit)
        c.close()
        c = consumer(bootstrap, wait, 0)
        head, n = until(c, "all", 3 * limit, size)
        c.close()
        rows.append({"batches": size, "wait_ms": wait, "tail_first_s": tail_first, "tail_eof_s": tail_eof,
                     "head_read_s": head, "head_records": n,
                     "caught_up_cpu_pct": caught_up_cpu(bootstrap, pid, wait, size)})
    seconds, ended_at = product_end(bootstrap)
    rows.append({"batches": size, "wait_ms": "product", "tail_eof_s": seconds, "ended_at_wait_ms": ended_at})
    return rows


def fmt(v: float | None, limit: float) -> str:
    return f"none in {limit:.0f}s" if v is None else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,30000,60000", help="batches in the partition, ascending")
    ap.add_argument("--waits", default="10,100,500,2000", help="fetch.wait.max.ms candidates")
    ap.add_argument("--limit", type=float, default=8.0, help="seconds before a tail measurement counts as none")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    waits = [int(x) for x in args.waits.split(",")]
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("aligner.connectors.watchdog").setLevel(logging.ERROR)
    console = Console(width=140)
    rows: list[dict[str, Any]] = []
    early: dict[int, float] = {}
    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        ensure_topic(info.kafka, TOPIC, 1)
        have = 0
        for size in sizes:
            rate = fill(info.kafka, size - have)
            have = size
            console.print(f"{size:,} batches (written at {rate:,.0f} batches/s)")
            rows += measure(info.kafka, info.kafka_pid, size, waits, args.limit)
        ensure_topic(info.kafka, EARLY, 1)
        end = 0
        for wait in waits:
            early[wait], end = early_answer(info.kafka, wait, end)
        foreign = cpu.cores()

    table = Table(title="Fetch latency vs batches per partition (one partition, one record per batch, read_committed)")
    for col in ("batches", "wait ms", "tail: first record s", "tail: end known s", "head: whole read s",
                "caught-up broker CPU % per consumer"):
        table.add_column(col, justify="right")
    for r in rows:
        if r["wait_ms"] == "product":
            table.add_row(f"{r['batches']:,}", f"product (ended at {r['ended_at_wait_ms']})", "",
                          fmt(r["tail_eof_s"], args.limit), "", "")
            continue
        head = fmt(r["head_read_s"], 3 * args.limit)
        if r["head_read_s"] is None:
            head += f" ({r['head_records']:,} records)"
        table.add_row(f"{r['batches']:,}", str(r["wait_ms"]), fmt(r["tail_first_s"], args.limit),
                      fmt(r["tail_eof_s"], args.limit), head, f"{r['caught_up_cpu_pct']:.2f}")
    console.print(table)
    console.print("early answer (caught-up consumer, produce -> consume, median of 5, small partition): "
                  + ", ".join(f"wait {w} ms: {s:.3f}s" for w, s in early.items()))
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run")
    out = write_results("bench_fetch", {"benchmark": "bench_fetch", "rows": rows, "early_answer_s": early,
                                        "limit_s": args.limit, "foreign_cpu_cores": foreign})
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
