"""Keyed state operations at scale: get, put, delete, len and items per second, against a plain dict.

A job calls the store once or more per record, so every operation must cost O(1) amortized whatever
the state's size and however many keys the open epoch changed (``len`` used to walk every changed key
on each call: a job calling ``len(state)`` per record ran at ~1,400 records/s with 500k keys).

For the in-memory and the RocksDB store: ``--keys`` keys committed as the base, then one open epoch of
``--ops`` operations of each kind over random keys (len after every put, as such a job does), then the
commit. The baseline is the same sequence on a plain ``dict`` of JSON-encoded values in the same process.

``work`` in the results, per store summed over the rounds: as ``records``, the operations it ran (counted as they
ran) plus the items its ``items()`` yielded and its ``len`` after the round; only records are compared (no Kafka).

    .venv/bin/python -m experiments.bench_state_ops [--keys 1000000] [--ops 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.runtime.state import MemoryStore, RocksStore, StateStore
from experiments.common import Work, work_results, write_results

console = Console(highlight=False)
OPS = ("get", "put", "put+len", "delete", "items", "commit")


class DictStore:
    """The baseline: what a job would do with a plain dict (values JSON-encoded, as the store keeps them)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str, default: Any = None) -> Any:
        raw = self.data.get(key)
        return default if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = json.dumps(value).encode()

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def __len__(self) -> int:
        return len(self.data)

    def items(self) -> Any:
        return ((k, json.loads(v)) for k, v in self.data.items())

    def mark_committed(self, epoch: int) -> None:
        pass


def timed(fn: Callable[[], Any], done: list[int] | None = None) -> float:
    """Seconds ``fn`` took; ``done`` gets how many operations it ran (its result's length, or count)."""
    began = time.perf_counter()
    result = fn()
    took = time.perf_counter() - began
    if done is not None:
        done.append(result if isinstance(result, int) else len(result) if isinstance(result, list) else 0)
    return took


def one_round(store: StateStore | DictStore, keys: int, ops: int, seed: int,
              work: Work | None = None) -> dict[str, float]:
    """Operations per second of each kind on ``store``, which holds ``keys`` committed keys (``work`` gets the
    operations run, the items yielded and the store's final ``len`` as records)."""
    rng = random.Random(seed)
    picks = [f"k{rng.randrange(keys * 2)}" for _ in range(ops)]  # half of them new keys

    def put_len() -> int:
        n, i = 0, -1
        for i, k in enumerate(picks):
            store.put(k, i)
            n = len(store)
        assert n > 0
        return i + 1  # the operations run

    done: list[int] = []
    seconds = {
        "get": timed(lambda: [store.get(k) for k in picks], done),
        "put": timed(lambda: [store.put(k, i) for i, k in enumerate(picks)], done),
        "put+len": timed(put_len, done),
        "delete": timed(lambda: [store.delete(k) for k in picks[: ops // 2]], done),
        "items": timed(lambda: sum(1 for _ in store.items()), done),
        "commit": timed(lambda: store.mark_committed(1)),
    }
    if work is not None:
        work.add(Work(records=sum(done) + len(store)))
    counts = {"items": len(store), "commit": ops}
    return {op: counts.get(op, ops if op != "delete" else ops // 2) / s for op, s in seconds.items()}


def filled(kind: str, keys: int, tmp: Path) -> StateStore | DictStore:
    store: StateStore | DictStore = (DictStore() if kind == "dict" else MemoryStore() if kind == "memory"
                                     else RocksStore(tmp / f"db-{time.monotonic_ns()}"))
    for i in range(keys):
        store.put(f"k{i}", i)
    store.mark_committed(0)
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"dict": [], "memory": [], "rocksdb": []}
    work = {kind: Work() for kind in results}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind in results:  # interleaved, so a foreign load hits every kind alike
                store = filled(kind, args.keys, Path(tmp))
                try:
                    results[kind].append(one_round(store, args.keys, args.ops, seed=r, work=work[kind]))
                finally:
                    if isinstance(store, StateStore):
                        store.close()
    median = {kind: {op: statistics.median(run[op] for run in runs) for op in OPS} for kind, runs in results.items()}
    table = Table(title=f"state operations/s, {args.keys:,} keys, {args.ops:,} per kind, median of {args.rounds}")
    table.add_column("operation")
    for kind in ("dict", "memory", "rocksdb"):
        table.add_column(kind, justify="right")
    table.add_column("memory / dict", justify="right")
    table.add_column("rocksdb / dict", justify="right")
    for op in OPS:
        d = median["dict"][op]
        table.add_row(op, *(f"{median[k][op]:,.0f}" for k in ("dict", "memory", "rocksdb")),
                      f"{median['memory'][op] / d:.2f}", f"{median['rocksdb'][op] / d:.2f}")
    console.print(table)
    out = write_results("bench_state_ops", {"args": vars(args), "median": median, "runs": results,
                                            **work_results(work, ("records",))})
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
