"""``aligner status`` on a 24 h-equivalent ledger vs a raw kazoo read of the same facts.

A subject gets N committed epochs (default 172,800: a day of half-second epochs), built fast: each epoch
is its EpochNode and one ContributionNode per writer, exactly what a commit leaves, created with
pipelined multi-ops (hundreds of creates per multi, many multis in flight) instead of the two round
trips per epoch of the commit path. Then, interleaved and repeated (median of the rounds):

- status: the in-process ``aligner --zk .. --root .. status --json`` (typer's CliRunner: its own session,
  as a command has);
- raw: a fresh ``KazooClient`` session, ``get_children`` of the subject's epochs node (its buckets of
  10,000) and of its last bucket, ``get`` of its last epoch node, then close (the least any status could do
  to name the last epoch).

Then retention keeps the last ``--keep`` epochs (``aligner gc --keep-epochs``'s pass) and both are timed
again: retention is what keeps status fast on a ledger that runs for days.

    .venv/bin/python -m experiments.bench_status [--epochs 172800] [--rounds 5] [--keep 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import time
from typing import Any

from kazoo.client import KazooClient
from rich.console import Console
from rich.table import Table

from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.layout import BUCKET, Layout, writer_id
from aligner.ledger import Ledger
from aligner.models import ContributionNode, EpochNode, Range, parse
from aligner.ops import Create, Op, raise_failure
from experiments import ForeignCpu
from experiments.common import write_results

SUBJECT = "s"
PARTITIONS = 4
WRITERS = 2
RECORDS = 1000
"""Records per partition and epoch the built contributions claim (Kafka holds none: status never reads them)."""
OPS_PER_MULTI = 600
"""Creates per multi-op (well under ZooKeeper's 1 MB request limit with these payloads)."""
IN_FLIGHT = 8
"""Multi-ops sent before the oldest one's reply is awaited."""
TARGET_S = 2.0


class EpochPayloads:
    """The payloads a commit of an epoch by ``writers`` producers leaves (writer ``w``, ``bench:w``, owns the
    partitions ``p % writers == w``), from models dumped once: a pydantic model per node would make the
    build CPU-bound. Each template is checked to parse back to the model it stands for."""

    _MARK = 987_654_321

    def __init__(self, writers: int, partitions: int) -> None:
        self.names = [writer_id("bench", str(w)) for w in range(writers)]
        mark = self._MARK
        self.epoch = EpochNode(epoch=mark, writers=tuple(self.names)).dump().split(b"%d" % mark)
        self.contributions: list[bytes] = []
        for w in range(writers):
            ranges = {p: Range(start=mark, end=mark + 1) for p in range(partitions) if p % writers == w}
            raw = ContributionNode(sink="bench", producer=str(w), attempt=0, ranges=ranges).dump()
            self.contributions.append(raw.replace(b"%d" % (mark + 1), b"{end}").replace(b"%d" % mark, b"{start}"))
        self._check(writers, partitions)

    def _check(self, writers: int, partitions: int) -> None:
        node = parse(EpochNode, "check", self.epoch_node(7))
        ok = node.epoch == 7 and node.writers == tuple(self.names)
        for w in range(writers):
            c = parse(ContributionNode, "check", self.contribution(w, 7))
            ok = ok and c.ranges == {p: Range(start=7 * RECORDS, end=8 * RECORDS) for p in range(partitions)
                                     if p % writers == w}
        if not ok:
            raise RuntimeError("a payload template does not parse back to its model")

    def epoch_node(self, epoch: int) -> bytes:
        return (b"%d" % epoch).join(self.epoch)

    def contribution(self, w: int, epoch: int) -> bytes:
        raw = self.contributions[w]
        return raw.replace(b"{start}", b"%d" % (epoch * RECORDS)).replace(b"{end}", b"%d" % ((epoch + 1) * RECORDS))

    def ops(self, lay: Layout, subject: str, epoch: int, new_bucket: bool = False) -> list[Op]:
        path = lay.epoch(subject, epoch)
        ops: list[Op] = [Create(path.rsplit("/", 1)[0])] if new_bucket else []
        ops.append(Create(path, self.epoch_node(epoch)))
        ops += [Create(lay.contribution(subject, epoch, name), self.contribution(w, epoch))
                for w, name in enumerate(self.names)]
        return ops


def build_ledger(led: Ledger, subject: str, epochs: int, writers: int = WRITERS, partitions: int = PARTITIONS,
                 first: int = 0) -> float:
    """Committed epochs ``first .. first + epochs - 1`` of a registered subject, pipelined; returns seconds.

    Why not the commit path: two round trips per epoch make a day's ledger take many minutes to build."""
    t0 = time.perf_counter()
    payloads = EpochPayloads(writers, partitions)
    per_multi = max(1, OPS_PER_MULTI // (1 + writers))
    pending: list[Any] = []
    led.ensure_bucket(led.layout.epoch(subject, first))
    for lo in range(first, first + epochs, per_multi):
        ops = [op for e in range(lo, min(first + epochs, lo + per_multi))
               for op in payloads.ops(led.layout, subject, e, new_bucket=e % BUCKET == 0 and e != first)]
        pending.append(led.multi_async(*ops))
        if len(pending) >= IN_FLIGHT:
            raise_failure(pending.pop(0).get())
    for req in pending:
        raise_failure(req.get())
    return time.perf_counter() - t0


def status_once(zk: str, root: str) -> tuple[float, dict[str, Any]]:
    """Seconds of one in-process ``aligner status --json``, and what it printed."""
    from typer.testing import CliRunner

    from aligner.coordinator.cli import app

    t0 = time.perf_counter()
    done = CliRunner().invoke(app, ["--zk", zk, "--root", root, "status", "--json"])
    seconds = time.perf_counter() - t0
    if done.exit_code != 0:
        raise RuntimeError(f"aligner status exited {done.exit_code}: {done.output[-2000:]}")
    return seconds, json.loads(done.stdout)


def raw_once(zk: str, root: str, subject: str) -> tuple[float, int]:
    """Seconds of the raw baseline (session, listing, last epoch node, close) and the epochs it listed."""
    t0 = time.perf_counter()
    client = KazooClient(hosts=zk)
    client.start(timeout=15)
    try:
        base = Layout(root).epochs(subject)
        buckets = sorted(client.get_children(base))  # the last bucket's listing, its newest epoch node
        names = client.get_children(f"{base}/{buckets[-1]}") if buckets else []
        if names:
            client.get(f"{base}/{buckets[-1]}/{max(names)}")
    finally:
        client.stop()
        client.close()
    return time.perf_counter() - t0, len(names)


def measure(zk: str, root: str, rounds: int) -> dict[str, Any]:
    """Status and raw, interleaved, ``rounds`` times: their seconds, the median ratio and status's answer."""
    status_s: list[float] = []
    raw_s: list[float] = []
    answer: dict[str, Any] = {}
    for _ in range(rounds):
        gc.collect()
        seconds, answer = status_once(zk, root)
        status_s.append(seconds)
        gc.collect()
        raw_s.append(raw_once(zk, root, SUBJECT)[0])
    row = next(r for r in answer["subjects"] if r["subject"] == SUBJECT)
    return {"status_s": status_s, "raw_s": raw_s, "status_median_s": statistics.median(status_s),
            "raw_median_s": statistics.median(raw_s),
            "ratio": statistics.median(status_s) / statistics.median(raw_s),
            "epochs": row["epochs"], "last_committed": row["last_committed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=172_800, help="committed epochs built on the subject")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", type=int, default=1000, help="epochs retention keeps (aligner gc --keep-epochs)")
    args = ap.parse_args()
    console = Console(width=120)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    root = "/bench"

    with EmbeddedStack() as info:
        cpu = ForeignCpu(info.zk_pid, info.kafka_pid)
        led = Ledger.connect(info.zk, root)
        create_subject(led, info.kafka, SUBJECT, PARTITIONS)
        build_s = build_ledger(led, SUBJECT, args.epochs)
        nodes = args.epochs * (1 + WRITERS)
        console.print(f"built {args.epochs:,} committed epochs ({nodes:,} nodes) in {build_s:.1f}s "
                      f"({nodes / build_s:,.0f} creates/s)")
        before = measure(info.zk, root, args.rounds)
        console.print(f"before retention: status {before['status_median_s']:.3f}s, raw {before['raw_median_s']:.3f}s")
        from aligner.coordinator.gc import collect

        t0 = time.perf_counter()
        report = collect(led, keep_epochs=args.keep)
        gc_s = time.perf_counter() - t0
        floor = led.subjects.first_retained(SUBJECT)
        led.close()
        console.print(f"retention kept the last {args.keep:,} (floor {floor:,}): "
                      f"{report['deleted_nodes']:,} nodes in {gc_s:.1f}s")
        after = measure(info.zk, root, args.rounds)
        foreign = cpu.cores()

    table = Table(title=f"aligner status on {args.epochs:,} committed epochs ({WRITERS} writers), median of "
                        f"{args.rounds}; raw: kazoo session + get_children + get of the last epoch")
    for col in ("ledger", "epochs", "last committed", "status s", "raw s", "status/raw"):
        table.add_column(col, justify="right" if col != "ledger" else "left")
    for name, m in (("full", before), (f"after retention (keep {args.keep:,})", after)):
        style = "green" if m["status_median_s"] < TARGET_S else "red"
        table.add_row(name, f"{m['epochs']:,}", f"{m['last_committed']:,}",
                      f"[{style}]{m['status_median_s']:.3f}[/{style}]", f"{m['raw_median_s']:.3f}", f"{m['ratio']:.2f}")
    console.print(table)
    ok = before["status_median_s"] < TARGET_S and after["status_median_s"] < TARGET_S
    console.print(f"status under {TARGET_S:g}s on the full ledger and after retention: {'PASS' if ok else 'FAIL'}")
    console.print(f"other processes kept {foreign:.2f} of {os.cpu_count()} cores busy during the run"
                  + (" [red](numbers are noisy: rerun on a quiet machine)[/red]" if foreign > 0.3 else ""))
    result: dict[str, Any] = {
        "benchmark": "bench_status", "epochs": args.epochs, "writers": WRITERS, "partitions": PARTITIONS,
        "rounds": args.rounds, "keep": args.keep, "build_s": build_s, "build_creates_per_s": nodes / build_s,
        "full": before, "after_retention": after, "retention_s": gc_s, "retention_deleted_nodes":
        report["deleted_nodes"], "first_retained": floor, "target_s": TARGET_S, "pass": ok,
        "foreign_cpu_cores": foreign,
    }
    console.print(f"wrote {write_results('bench_status', result)}")


if __name__ == "__main__":
    main()
