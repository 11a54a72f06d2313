"""Batches per partition per epoch that a sink writes (issue 23 item 3): the sink's linger against 5 ms.

The embedded broker (Tansu 0.6, memory storage) answers a fetch in time that grows with the batches a
partition holds (docs: The embedded stack), so what a chain writes per epoch in batches, not records, decides how fast
it slows down. This writes ``--epochs`` epochs of ``--rate`` records a second spread over each ``--interval``
(a chain's trickle, not a bulk load) through a ``SinkProducer`` on 2 partitions, with its output subject's
changelog-like second lane, once with 5 ms of linger (what the sinks used before) and once with
:data:`aligner.connectors.kafka.LINGER_MS`, and counts the batches librdkafka sent (its statistics'
``batchcnt``, summed over windows) and the epochs a second (the linger must not slow the epochs: a commit
flushes).

    python -m experiments.bench_batches [--epochs 10] [--rate 150] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from aligner.connectors.kafka import LINGER_MS
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import write_results

ROOT = "/bench-batches"
PARTITIONS = 2


def run(led: Ledger, kafka: str, linger: int, epochs: int, rate: float, interval: float) -> dict[str, Any]:
    """One sink writing ``epochs`` epochs at ``rate`` records/s with ``linger`` ms: batches and epochs/s."""
    name, state = f"out-{linger}", f"state-{linger}"
    for subject in (name, state):
        create_subject(led, kafka, subject, PARTITIONS)
    windows: list[dict[str, Any]] = []
    config = {"linger.ms": linger, "statistics.interval.ms": 100, "stats_cb": lambda s: windows.append(json.loads(s))}
    per_epoch = max(1, round(rate * interval))
    with SinkProducer(led, kafka, name, "k", 0, list(range(PARTITIONS)), kafka_config=config,
                      also={state: list(range(PARTITIONS))}) as p:
        t0 = time.monotonic()
        for _ in range(epochs):
            p.begin()
            for i in range(per_epoch):
                p.send(b"v" * 100, partition=i % PARTITIONS)
                if i % 10 == 0:
                    p.send_to(state, b'{"count": 1}', f"k{i}".encode(), (i // 10) % PARTITIONS)
                time.sleep(interval / per_epoch)
            p.commit()
        seconds = time.monotonic() - t0
        time.sleep(0.3)  # the last statistics window
    topics = {led.subjects.subject(s).topic: s for s in (name, state)}
    batches = {s: sum(w["topics"][t]["batchcnt"]["cnt"] for w in windows if t in w["topics"])
               for t, s in topics.items()}
    return {"linger_ms": linger, "epochs": epochs, "records_per_epoch": per_epoch, "epochs_per_s": epochs / seconds,
            "batches": batches, "per_partition_per_epoch": {
                "output" if s == name else "second lane": n / (PARTITIONS * epochs) for s, n in batches.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rate", type=float, default=150.0, help="records per second into the output")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds per epoch")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    console = Console(width=120)
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        try:
            rows = [run(led, info.kafka, linger, args.epochs, args.rate, args.interval) for linger in (5, LINGER_MS)]
        finally:
            led.close()
    table = Table(title=f"Batches per partition per epoch, {args.rate:g} records/s, {args.interval:g} s epochs, "
                        f"{PARTITIONS} partitions (commit markers not counted)")
    for col in ("linger.ms", "output", "second lane", "epochs/s"):
        table.add_column(col, justify="right")
    for r in rows:
        pp = r["per_partition_per_epoch"]
        table.add_row(str(r["linger_ms"]), f"{pp['output']:.1f}", f"{pp['second lane']:.1f}",
                      f"{r['epochs_per_s']:.2f}")
    console.print(table)
    out = write_results("bench_batches", {"benchmark": "bench_batches", "rate": args.rate, "interval": args.interval,
                                          "partitions": PARTITIONS, "runs": rows})
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
