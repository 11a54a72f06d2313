"""Keyed state as a subject: restore throughput against a raw read, and ZooKeeper bytes per epoch.

For each state size (``--keys`` and a tenth of it), on its own changelog subject of one partition:
epoch 0 writes every key (``--value-bytes`` per value), then ``--epochs`` epochs each change
``--changed`` of the keys (puts, and one delete in ten), through the runtime's cycle: store changes ->
SinkProducer -> commit -> ``mark_committed``. Reported per size:

- commit cost per epoch (changes, send, Kafka and ZooKeeper commit, ``mark_committed``), median;
- ZooKeeper bytes per epoch: the changelog contribution node the epoch commit writes, against the
  base64 zlib JSON blob the former ``KeyedState`` wrote into the worker's epoch node;
- restore (full replay) into a fresh in-memory store and a fresh RocksDB store, and the raw baseline:
  a plain confluent-kafka consume of the same offsets in the same process (``experiments.common.read_raw``),
  interleaved, median of ``--rounds``; records/s, keys/s and ratio to raw;
- RocksDB restart on the same disk with a checkpoint one epoch old: the tail replay's time.

``work`` in the results, per restore arm (raw, memory, rocksdb) summed over both sizes and the rounds: the
changelog records it read (the raw loop's count, each restore's own report). Only records are compared: a restore
reports no bytes, and counting them in the raw loop would slow the baseline it is measured against.

    .venv/bin/python -m experiments.bench_state [--keys 1000000] [--epochs 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.runtime.state import MemoryStore, RocksStore, StateStore, create_changelog
from aligner.connectors.sink import SinkProducer
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from aligner.models import ContributionNode
from experiments.common import Work, read_raw, work_results, write_results


def _blob_bytes(store: StateStore) -> int:
    """What the former KeyedState snapshot of this state would have put into ZooKeeper each epoch."""
    data = dict(store.items())
    return len(base64.b64encode(zlib.compress(json.dumps(data, sort_keys=True).encode())))


def _write(led: Ledger, bootstrap: str, subject: str, keys: int, epochs: int, changed: float,
           value_bytes: int) -> dict[str, Any]:
    rng = random.Random(7)
    pad = "x" * (value_bytes - 12)
    store = MemoryStore()
    commit_s: list[float] = []
    zk_bytes: list[int] = []
    records = 0
    with SinkProducer(led, bootstrap, subject, "job", "0", [0]) as p:
        for e in range(epochs + 1):
            if e == 0:
                for k in range(keys):
                    store.put(f"key-{k:08d}", f"{k:010d}{pad}")
            else:
                for k in rng.sample(range(keys), int(keys * changed)):
                    if k % 10 == 0:
                        store.delete(f"key-{k:08d}")
                    else:
                        store.put(f"key-{k:08d}", f"{e:04d}{k:06d}{pad}")
            t0 = time.perf_counter()
            epoch = p.begin()
            n = 0
            for key, value in store.records():
                p.send(value, key=key, partition=0)
                n += 1
            commit = p.commit()
            store.mark_committed(epoch, commit.ranges[0].end)
            if e > 0:
                commit_s.append(time.perf_counter() - t0)
            records += n
            node, _ = led.read(ContributionNode, led.layout.contribution(subject, epoch, "job:0"))
            zk_bytes.append(len(node.dump()))
        last = epoch
    return {"store": store, "last": last, "records": records, "commit_s": commit_s, "zk_bytes": zk_bytes,
            "blob_bytes": _blob_bytes(store)}


def _bench(info: Any, led: Ledger, keys: int, args: argparse.Namespace, tmp: Path,
           work: dict[str, Work]) -> dict[str, Any]:
    subject = f"changelog-{keys}"
    create_changelog(led, info.kafka, subject, 1)
    w = _write(led, info.kafka, subject, keys, args.epochs, args.changed, args.value_bytes)
    expected = dict(w["store"].items())
    last = w["last"]
    span = {0: (led.epochs.committed(subject, 0).slices[0].start, led.epochs.committed(subject, last).slices[0].end)}
    times: dict[str, list[float]] = {"raw": [], "memory": [], "rocksdb": []}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        n = read_raw(info.kafka, subject, span, collect=False)
        times["raw"].append(time.perf_counter() - t0)
        work["raw"].add(Work(records=n))
        assert n == w["records"], (n, w["records"])
        for name in ("memory", "rocksdb"):
            with Ledger.connect(info.zk, "/bench") as fresh:  # epoch lookups are part of a first restore
                store = MemoryStore() if name == "memory" else RocksStore(tmp / f"{subject}-{r}")
                try:
                    t0 = time.perf_counter()
                    report = store.restore(fresh, info.kafka, subject, 0, last)
                    times[name].append(time.perf_counter() - t0)
                    work[name].add(Work(records=report.records))
                    assert report.records == w["records"] and report.checkpoint is None
                    if r == 0:
                        assert dict(store.items()) == expected, f"{name} restore differs"
                finally:
                    store.close()
    # A restart on the same disk whose checkpoint is one epoch behind: only the tail is read.
    path = tmp / f"{subject}-tail"
    with RocksStore(path) as store:
        store.restore(led, info.kafka, subject, 0, last - 1)
    with RocksStore(path) as store:
        t0 = time.perf_counter()
        tail = store.restore(led, info.kafka, subject, 0, last)
        tail_s = time.perf_counter() - t0
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "keys": keys, "live_keys": len(expected), "records": w["records"], "epochs": args.epochs,
        "changed_per_epoch": int(keys * args.changed),
        "commit_ms_median": 1000 * statistics.median(w["commit_s"]),
        "zk_bytes_per_epoch": statistics.median(w["zk_bytes"][1:]), "zk_bytes_max": max(w["zk_bytes"]),
        "former_blob_bytes_per_epoch": w["blob_bytes"],
        "raw_records_per_s": w["records"] / med["raw"],
        **{f"{k}_restore_s": med[k] for k in ("memory", "rocksdb")},
        **{f"{k}_records_per_s": w["records"] / med[k] for k in ("memory", "rocksdb")},
        **{f"{k}_keys_per_s": len(expected) / med[k] for k in ("memory", "rocksdb")},
        **{f"{k}_ratio_to_raw": med["raw"] / med[k] for k in ("memory", "rocksdb")},
        "rocksdb_tail_restore_s": tail_s, "rocksdb_tail_records": tail.records,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=170)
    rows = []
    work = {name: Work() for name in ("raw", "memory", "rocksdb")}
    with EmbeddedStack() as info, Ledger.connect(info.zk, "/bench") as led, \
            tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        for keys in (max(1, args.keys // 10), args.keys):
            rows.append(_bench(info, led, keys, args, Path(tmp), work))
            console.print(f"[dim]{keys:,} keys done[/dim]")
    table = Table(title="Keyed state as a subject (one changelog partition)")
    for col in ("keys", "commit ms/epoch", "ZK B/epoch", "former blob B", "raw rec/s", "memory keys/s",
                "mem/raw", "rocksdb keys/s", "rocks/raw", "tail s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['keys']:,}", f"{r['commit_ms_median']:.1f}", f"{r['zk_bytes_per_epoch']:.0f}",
                      f"{r['former_blob_bytes_per_epoch']:,}", f"{r['raw_records_per_s']:,.0f}",
                      f"{r['memory_keys_per_s']:,.0f}", f"{r['memory_ratio_to_raw']:.2f}",
                      f"{r['rocksdb_keys_per_s']:,.0f}", f"{r['rocksdb_ratio_to_raw']:.2f}",
                      f"{r['rocksdb_tail_restore_s']:.2f}")
    console.print(table)
    path = write_results("bench_state", {"args": vars(args), "rows": rows, **work_results(work, ("records",))})
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()
