"""A long silence on an aligned job's input: the job keeps running, idles, and resumes at once.

    python -m experiments.silence --minutes 30

An outside producer writes to a topic, ``aligner markers`` cuts its epochs, two runtime workers run an
aligned job on it. The marker is stopped (SIGTERM): no input epoch commits for ``--minutes``. Printed:
whether every component is still running, the workers' CPU seconds during the silence, and how long
after the first input epoch past the silence the job commits its next epoch; then every input is
checked exactly once.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import Producer

from aligner.connectors.reader import EpochReader
from aligner.connectors.subjects import create_subject
from aligner.coordinator.alignment import Coordinator
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import json_value

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose stdout lines can be awaited."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_line(self, prefix: str, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no line starting {prefix!r} within {timeout:.0f}s") from None
            if line.startswith(prefix):
                return line

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


def main(minutes: Annotated[float, typer.Option(min=0.1, help="Length of the silence")] = 30.0) -> None:
    with EmbeddedStack() as info:
        root, name = f"/silence-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
        ledger = Ledger.connect(info.zk, root)
        inp, out, job = name, f"{name}-out", f"{name}-job"
        for s in (inp, out):
            create_subject(ledger, info.kafka, s, 2)
        conn = ["--zk", info.zk, "--kafka", info.kafka, "--root", root]
        sent = [0]
        producing = threading.Event()
        producing.set()
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": info.kafka, "linger.ms": 5, "log_level": 3})
            while not stop.is_set():
                if producing.is_set():
                    p.produce(inp, json.dumps({"n": sent[0]}).encode(), str(sent[0]).encode())
                    sent[0] += 1
                    p.poll(0)
                stop.wait(0.01)
            p.flush(30)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        procs = [Proc("aligner.coordinator", *conn, "markers", inp, "--interval", "0.5")]
        for i in range(2):
            procs.append(Proc("aligner.connectors.runtime.worker", *conn, "--job", job,
                              "--function", "tests.jobs:tag_v1", "--input", inp, "--output", out,
                              "--worker", str(i), "--parallelism", "2", "--interval", "0.5"))
        try:
            for w in procs[1:]:
                w.wait_line("committed")
            Coordinator(ledger).align(job, timeout=300)
            for w in procs[1:]:
                w.wait_line("committed")
            producing.clear()  # the outside producer pauses too: a quiet night
            marker = procs.pop(0)
            marker.terminate()
            while Coordinator(ledger).source_status(job, inp)["lag_epochs"]:
                time.sleep(0.5)
            for w in procs:
                while not w.lines.empty():
                    w.lines.get()
            cpu = [w.cpu_seconds() for w in procs]
            print(f"silence of {minutes:g} min starts (input frontier {ledger.epochs.frontier(inp)})", flush=True)
            time.sleep(minutes * 60)
            used = [w.cpu_seconds() - c for w, c in zip(procs, cpu, strict=True)]
            alive = all(w.proc.poll() is None for w in procs)
            waiting = Coordinator(ledger).source_status(job, inp)["waiting_seconds"]
            producing.set()
            procs.insert(0, Proc("aligner.coordinator", *conn, "markers", inp, "--interval", "0.5"))
            procs[0].wait_line("epoch")  # the first input epoch after the silence is committed
            resumed = time.monotonic()
            for w in procs[1:]:
                w.wait_line("committed")
            after = time.monotonic() - resumed
            stop.set()
            producer.join(60)
            total = sent[0]
            seen: Counter[int] = Counter()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and len(seen) < total:  # every input through the job
                time.sleep(1.0)
                with EpochReader(ledger, info.kafka) as reader:
                    seen = Counter(json_value(r.value)["in"]["n"]
                                   for r in reader.read(out, 0, ledger.epochs.frontier(out) or 0))
            lost = sum(1 for n in range(total) if seen[n] == 0)
            dup = sum(1 for c in seen.values() if c > 1)
            print(json.dumps({"silence_minutes": minutes, "components_alive_after": alive,
                              "worker_cpu_seconds_during_silence": [round(u, 2) for u in used],
                              "status_waiting_seconds": waiting,
                              "next_job_epoch_after_input_epoch_s": round(after, 2),
                              "inputs": total, "lost": lost, "duplicated": dup}), flush=True)
        finally:
            codes = [w.terminate() for w in procs]
            print(f"SIGTERM exit codes: {codes}", flush=True)
            stop.set()
            ledger.close()


if __name__ == "__main__":
    typer.run(main)
