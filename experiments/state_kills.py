"""A job holding a large keyed state, SIGKILLed at random points: exactly once, and the same state.

    python -m experiments.state_kills --keys 500000 --kills 10 [--state rocksdb] [--damage]

The input holds ``keys`` records with distinct keys (about 100 bytes of state each: 50 MB at 500k
keys); the job puts one state entry per record and passes the record on. A worker process is
SIGKILLed ``kills`` times at random moments and restarted (on the same state directory, as a
supervisor would). At the end the output is read by epoch (every input exactly once?) and the
job's state is restored from its changelog exactly as a restart would and compared with the state
a run without failures holds (computed from the input). With ``--damage`` every kill also damages the
worker's RocksDB store while it is down (its largest table file truncated, or a byte flipped in it, in
turn): the restarted worker must find it, move it aside and restore from the changelog; at the end the
worker's own local store is compared with the expected state too.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from aligner.connectors.reader import EpochReader
from aligner.connectors.runtime import KeyedState
from aligner.connectors.runtime.state import RocksStore, open_store
from aligner.connectors.sink import SinkProducer
from aligner.connectors.source import SourceRecord
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import json_value

ROOT = Path(__file__).resolve().parent.parent
PAD = "x" * 80


def keep(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """The job: remember every record by key (about 100 bytes of state each) and pass it on."""
    n = json.loads(record.value or b"0")["n"]
    state.put(f"k{n}", {"n": n, "pad": PAD})
    yield record.key, record.value or b""


def expected_entry(n: int) -> dict[str, object]:
    return {"n": n, "pad": PAD}


def main(keys: Annotated[int, typer.Option(min=1)] = 500_000,
         kills: Annotated[int, typer.Option(min=0)] = 10,
         per_epoch: Annotated[int, typer.Option(min=1)] = 20_000,
         state: Annotated[str, typer.Option(help="memory or rocksdb")] = "rocksdb",
         damage: Annotated[bool, typer.Option(help="damage the RocksDB store at every kill")] = False,
         seed: int = 7) -> None:
    rng = random.Random(seed)
    with EmbeddedStack() as info, tempfile.TemporaryDirectory(prefix="state-kills-") as state_dir:
        root, name = f"/state-kills-{uuid.uuid4().hex[:6]}", f"big-{uuid.uuid4().hex[:6]}"
        ledger = Ledger.connect(info.zk, root)
        inp, out, job = name, f"{name}-out", f"{name}-job"
        for s in (inp, out):
            create_subject(ledger, info.kafka, s, 2)
        t0 = time.monotonic()
        with SinkProducer(ledger, info.kafka, inp, "gen", 0, [0, 1]) as producer:
            for first in range(0, keys, per_epoch):
                producer.begin()
                for n in range(first, min(keys, first + per_epoch)):
                    producer.send(json.dumps({"n": n}).encode(), f"k{n}".encode())
                producer.commit()
            producer.finish()
        print(f"input: {keys} records in {time.monotonic() - t0:.1f}s", flush=True)
        argv = [sys.executable, "-m", "aligner.connectors.runtime.worker", "--zk", info.zk, "--kafka", info.kafka,
                "--root", root, "--job", job, "--function", "experiments.state_kills:keep", "--input", inp,
                "--output", out, "--interval", "1.0", "--state", state, "--state-dir", state_dir]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        killed, t0 = 0, time.monotonic()
        while True:
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
            if killed < kills:
                try:
                    proc.wait(rng.uniform(2.0, 12.0))  # a random moment: opening, restoring, mid-epoch, committing
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    killed += 1
                    hurt = damage_store(Path(state_dir) / f"{job}-0", killed) if damage else ""
                    print(f"kill {killed} at epoch {ledger.epochs.frontier(out)}{hurt}", flush=True)
                    continue
            if proc.wait() != 0:
                raise SystemExit(f"worker exited with {proc.returncode}")
            break
        print(f"job done after {killed} kills in {time.monotonic() - t0:.1f}s", flush=True)
        last = ledger.epochs.frontier(out) or 0
        with EpochReader(ledger, info.kafka) as reader:
            seen = Counter(json_value(r.value)["n"] for r in reader.read(out, 0, last))
        lost = sum(1 for n in range(keys) if seen[n] == 0)
        duplicated = sum(1 for c in seen.values() if c > 1)
        t0 = time.monotonic()
        store = open_store()
        store.restore(ledger, info.kafka, f"{job}.state", 0, last)
        restore_s = time.monotonic() - t0
        wrong = sum(1 for n in range(keys) if store.get(f"k{n}") != expected_entry(n))
        extra = len(store) - keys
        store.close()
        local_wrong, aside = 0, len(list(Path(state_dir).glob(f"{job}-0.damaged-*")))
        if state == "rocksdb":  # the worker's own store, rebuilt after each damage, holds the same state
            with RocksStore(Path(state_dir) / f"{job}-0") as local:
                local_wrong = sum(1 for n in range(keys) if local.get(f"k{n}") != expected_entry(n))
                local_wrong += abs(len(local) - keys)
        ledger.close()
        print(json.dumps({"keys": keys, "state": state, "kills": killed, "output_epochs": last + 1,
                          "lost": lost, "duplicated": duplicated, "state_entries_wrong": wrong,
                          "state_entries_extra": extra, "full_restore_s": round(restore_s, 1),
                          "local_store_wrong": local_wrong, "stores_moved_aside": aside}), flush=True)
        if lost or duplicated or wrong or extra or local_wrong:
            raise SystemExit(1)


def damage_store(path: Path, kill: int) -> str:
    """Truncate (odd kills) or flip a byte in (even kills) the store's largest table file."""
    tables = sorted(path.glob("*.sst"), key=lambda f: f.stat().st_size)
    if not tables:
        return " (no table file to damage yet)"
    table = tables[-1]
    raw = bytearray(table.read_bytes())
    if kill % 2:
        table.write_bytes(bytes(raw[: len(raw) // 2]))
        return f", {table.name} truncated"
    raw[len(raw) // 3] ^= 0xFF
    table.write_bytes(bytes(raw))
    return f", a byte of {table.name} flipped"


if __name__ == "__main__":
    typer.run(main)
