"""ZooKeeper round trips per epoch per producer at parallelism 1, 2, 4, 8, 16 (counted, not timed).

For each parallelism P a 16-partition subject gets P SinkProducers, each with its own Ledger (so
``ledger.round_trips`` counts exactly that producer's ZooKeeper requests) and its own private
partitions (``partitions_for(i, P, 16)``). All producers live in this process and are driven
round-robin: all begin, all send a few records, all commit. After one warm-up epoch, ~20 epochs are
counted. The lock-free protocol promises 2 round trips per producer per epoch whatever P is.

For context it also times what one synchronous kazoo request costs on this stack (a plain create,
and a two-op multi like ours) and the wall time our two ZooKeeper calls take per producer per epoch.

    .venv/bin/python -m experiments.bench_zk_ops [--epochs 20] [--records 10]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import time
from typing import Any

from kazoo.client import KazooClient
from rich.console import Console
from rich.table import Table

from aligner.connectors.sink import SinkProducer, partitions_for
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments import ForeignCpu
from experiments.common import LedgerTimer, write_results

PARTITIONS = 16
PARALLELISM = (1, 2, 4, 8, 16)
VALUE = b"x" * 100
EXPECTED = 2.0


def one_epoch(producers: list[SinkProducer], records: int) -> list[float]:
    """All begin, all send, all commit; returns each producer's commit() wall time."""
    for p in producers:
        p.begin()
    for p in producers:
        for i in range(records):
            p.send(VALUE, partition=p.partitions[i % len(p.partitions)])
    took = []
    for p in producers:
        t0 = time.perf_counter()
        p.commit()
        took.append(time.perf_counter() - t0)
    return took


def run_parallelism(info: Any, parallelism: int, epochs: int, records: int) -> dict[str, Any]:
    subject = f"zk-p{parallelism}"
    setup = Ledger.connect(info.zk, "/bench")
    create_subject(setup, info.kafka, subject, PARTITIONS)
    ledgers = [Ledger.connect(info.zk, "/bench") for _ in range(parallelism)]
    producers = [SinkProducer(led, info.kafka, subject, "sink", i, partitions_for(i, parallelism, PARTITIONS))
                 for i, led in enumerate(ledgers)]
    try:
        for p in producers:
            p.open()
        one_epoch(producers, records)  # warm-up: first reads of the writers document, connections
        timers = [LedgerTimer(led.commits, ("ensure_epoch", "commit_epoch")) for led in ledgers]
        before = [led.round_trips for led in ledgers]
        commit_s: list[float] = []
        t0 = time.perf_counter()
        for _ in range(epochs):
            commit_s.extend(one_epoch(producers, records))
        wall = time.perf_counter() - t0
        per_producer = [(led.round_trips - b) / epochs for led, b in zip(ledgers, before, strict=True)]
        last = [p.next_epoch - 1 for p in producers]
        frontier = setup.epochs.frontier(subject)
    finally:
        for p in producers:
            p.close()
        for led in ledgers:
            led.close()
        setup.close()
    return {
        "parallelism": parallelism,
        "epochs": epochs,
        "round_trips_per_producer_epoch": per_producer,
        "mean": statistics.fmean(per_producer),
        "max": max(per_producer),
        "zk_ms_per_producer_epoch": 1000 * statistics.fmean(t.seconds for t in timers) / epochs,
        "commit_ms_mean": 1000 * statistics.fmean(commit_s),
        "epoch_round_ms": 1000 * wall / epochs,
        "frontier_ok": frontier == min(last),
    }


def kazoo_rate(hosts: str, n: int) -> dict[str, float]:
    """Synchronous kazoo requests, one at a time: a create, and a create+check multi like our commit."""
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(15)
    try:
        zk.ensure_path("/bench-kazoo")
        for i in range(100):  # warm-up of both request kinds
            zk.create(f"/bench-kazoo/w{i}", b"x" * 100)
            t = zk.transaction()
            t.create(f"/bench-kazoo/wm{i}", b"x" * 100)
            t.check("/bench-kazoo", 0)
            t.commit()
        t0 = time.perf_counter()
        for i in range(n):
            zk.create(f"/bench-kazoo/c{i}", b"x" * 100)
        create_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(n):
            t = zk.transaction()
            t.create(f"/bench-kazoo/m{i}", b"x" * 100)
            t.check("/bench-kazoo", 0)
            t.commit()
        multi_s = time.perf_counter() - t0
    finally:
        zk.stop()
        zk.close()
    return {"creates_per_s": n / create_s, "create_ms": 1000 * create_s / n,
            "multis_per_s": n / multi_s, "multi_ms": 1000 * multi_s / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=20, help="counted epochs after one warm-up epoch")
    ap.add_argument("--records", type=int, default=10, help="records each producer sends per epoch")
    ap.add_argument("--kazoo-ops", type=int, default=500)
    args = ap.parse_args()
    console = Console(width=120)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # a first-connect retry is logged as a warning

    rows = []
    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        kazoo = kazoo_rate(info.zk, args.kazoo_ops)
        for parallelism in PARALLELISM:
            row = run_parallelism(info, parallelism, args.epochs, args.records)
            console.print(f"P={parallelism}: {row['mean']:.2f} round trips per producer per epoch "
                          f"(max {row['max']:.2f}), ZooKeeper {row['zk_ms_per_producer_epoch']:.2f} ms")
            rows.append(row)
        foreign = cpu.cores()
        gc.collect()

    table = Table(title=f"ZooKeeper round trips per producer per epoch ({args.epochs} epochs after a warm-up, "
                        f"{PARTITIONS} partitions, {args.records} records per producer per epoch)")
    for col in ("parallelism", "round trips mean", "round trips max", "ZK wall ms / producer / epoch",
                "commit() ms (Kafka + ZK)", "ms per round of all producers", "frontier"):
        table.add_column(col, justify="right")
    for r in rows:
        flat = r["max"] <= EXPECTED
        table.add_row(str(r["parallelism"]), f"{r['mean']:.2f}", f"[{'green' if flat else 'red'}]{r['max']:.2f}[/]",
                      f"{r['zk_ms_per_producer_epoch']:.2f}", f"{r['commit_ms_mean']:.2f}",
                      f"{r['epoch_round_ms']:.1f}", "ok" if r["frontier_ok"] else "WRONG")
    console.print(table)
    console.print(f"kazoo baseline (plain KazooClient, synchronous, {args.kazoo_ops} each): "
                  f"create {kazoo['creates_per_s']:,.0f}/s ({kazoo['create_ms']:.2f} ms), "
                  f"2-op multi {kazoo['multis_per_s']:,.0f}/s ({kazoo['multi_ms']:.2f} ms); "
                  f"so 2 round trips cost about {2 * kazoo['multi_ms']:.2f} ms")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run "
                  "(the round-trip counts do not depend on it; the times do)")
    flat = all(r["max"] <= EXPECTED for r in rows)
    console.print(f"expected flat at {EXPECTED} round trips per producer per epoch: {'PASS' if flat else 'FAIL'}")

    out = write_results("bench_zk_ops", {
        "benchmark": "bench_zk_ops", "partitions": PARTITIONS, "epochs": args.epochs,
        "records_per_producer_epoch": args.records, "expected": EXPECTED, "pass": flat,
        "rows": rows, "kazoo": kazoo, "foreign_cpu_cores": foreign,
    })
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
