"""State hand-over of a rescaling hot-swap: how long a new version's worker takes to get its keys.

For each state size (``--keys`` and a tenth of it) the old version (2 workers) has written its keyed state
into its changelog subject (one partition per worker, every key once, ``--value-bytes`` per value, in epochs
of 100,000 records). A new version of 1 worker, and one of 4, takes it over as
:meth:`aligner.connectors.runtime.worker_io.WorkerIO` does at its first epoch: every old changelog partition read
exactly as of the last epoch (those that can hold its keys, :func:`aligner.keys.sources`: both for the
worker of 1, one for each worker of 4), the keys :func:`aligner.keys.worker_of` gives the worker kept
(:func:`aligner.connectors.runtime.state.take_keys`). Reported per size, median of ``--rounds``: seconds for the
new worker of 1 (all keys) and for each new worker of 4 (a quarter, all four in turn), and the raw
baseline in the same process: a plain confluent-kafka read of the same partitions' offsets
(``experiments.common.read_raw``), keys filtered by the same rule.

``work`` in the results, per arm (raw, to_1, to_4) summed over both sizes and the rounds: the keys it got (raw: the
records it read, each key once; to_1 and to_4: the keys its workers took, all four workers' for to_4). Only records
are compared: take_keys reports no bytes, and a worker of 4 reads a whole partition to keep a quarter of it.

    .venv/bin/python -m experiments.bench_handover [--keys 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.runtime.state import MemoryStore, create_changelog, encode_value, take_keys
from aligner.connectors.sink import SinkProducer
from aligner.embedded.stack import EmbeddedStack
from aligner.keys import sources, worker_of
from aligner.ledger import Ledger
from experiments.common import Work, read_raw, work_results, write_results

OLD_WORKERS = 2
INPUT_PARTITIONS = 4
EPOCH_RECORDS = 100_000


def _write(led: Ledger, bootstrap: str, subject: str, keys: int, value_bytes: int) -> int:
    """The old version's changelog: worker w's keys in partition w; returns its last epoch."""
    pad = "x" * max(0, value_bytes - 12)
    mine: dict[int, list[str]] = {w: [] for w in range(OLD_WORKERS)}
    for k in range(keys):
        key = f"key-{k:08d}"
        mine[worker_of(key.encode(), INPUT_PARTITIONS, OLD_WORKERS)].append(key)
    producers = [SinkProducer(led, bootstrap, subject, "old", str(w), [w]).open() for w in range(OLD_WORKERS)]
    try:
        for start in range(0, max(len(v) for v in mine.values()), EPOCH_RECORDS):
            for w, p in enumerate(producers):
                p.begin()
                for key in mine[w][start:start + EPOCH_RECORDS]:
                    p.send(encode_value(f"{key}{pad}"), key=key.encode(), partition=w)
                p.commit()
        last = max(p.next_epoch for p in producers) - 1
        for p in producers:  # claimed one after the other, the first started an epoch earlier: end together
            while p.next_epoch <= last:
                p.begin()
                p.commit()
    finally:
        for p in producers:
            p.close()
    return last


def _bench(info: Any, led: Ledger, keys: int, args: argparse.Namespace, work: dict[str, Work]) -> dict[str, Any]:
    subject = f"old-{keys}.state"
    create_changelog(led, info.kafka, subject, OLD_WORKERS)
    last = _write(led, info.kafka, subject, keys, args.value_bytes)
    span = {p: (0, led.epochs.committed(subject, last).slices[p].end)  # a fresh topic
            for p in range(OLD_WORKERS)}
    times: dict[str, list[float]] = {"raw": [], "to_1": [], "to_4": []}
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        n = read_raw(info.kafka, subject, span, collect=False)
        times["raw"].append(time.perf_counter() - t0)
        work["raw"].add(Work(records=n))
        for new in (1, 4):
            took = 0
            t0 = time.perf_counter()
            for w in range(new):
                into = MemoryStore()

                def mine(key: str, w: int = w, new: int = new) -> bool:
                    return worker_of(key.encode(), INPUT_PARTITIONS, new) == w

                took += sum(take_keys(led, info.kafka, subject, p, last, None, into, mine)
                            for p in sources(w, new, OLD_WORKERS))
                into.close()
            times[f"to_{new}"].append(time.perf_counter() - t0)
            work[f"to_{new}"].add(Work(records=took))
            assert took == keys, (new, took, keys)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"keys": keys, "value_bytes": args.value_bytes, "old_workers": OLD_WORKERS, "raw_read_s": med["raw"],
            "to_1_worker_s": med["to_1"], "to_4_workers_s_each": med["to_4"] / 4,
            "to_1_ratio_to_raw": med["raw"] / med["to_1"], "to_4_ratio_to_raw": med["raw"] / (med["to_4"] / 4),
            "keys_per_s_to_1": keys / med["to_1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=150)
    rows = []
    work = {name: Work() for name in ("raw", "to_1", "to_4")}
    with EmbeddedStack() as info, Ledger.connect(info.zk, "/bench") as led:
        for keys in (max(1, args.keys // 10), args.keys):
            rows.append(_bench(info, led, keys, args, work))
            console.print(f"[dim]{keys:,} keys done[/dim]")
    table = Table(title=f"State hand-over of a rescaling swap ({OLD_WORKERS} old workers' changelog)")
    for col in ("keys", "raw read s", "to 1 worker s", "ratio to raw", "to 4 workers s each", "ratio to raw",
                "keys/s (to 1)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['keys']:,}", f"{r['raw_read_s']:.2f}", f"{r['to_1_worker_s']:.2f}",
                      f"{r['to_1_ratio_to_raw']:.2f}", f"{r['to_4_workers_s_each']:.2f}",
                      f"{r['to_4_ratio_to_raw']:.2f}", f"{r['keys_per_s_to_1']:,.0f}")
    console.print(table)
    path = write_results("bench_handover", {"args": vars(args), "rows": rows, **work_results(work, ("records",))})
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()
