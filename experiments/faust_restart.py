"""How fast a Faust worker on a plain ``faust.App`` starts its aligned job, resumes after a SIGKILL and
stops on SIGTERM (issue 11, items 2 and 7), on the embedded stack, with the output checked exactly once.

    python -m experiments.faust_restart [--rounds 5] [--plain/--adapter-app]

Each round: start a worker (``experiments.faust_job``, ``FAUST_JOB_PLAIN=1``) and time its first committed
epoch; SIGKILL it after its next epoch, start another and time from the kill to its first committed
epoch; SIGTERM that one mid-epoch and time until it exited (code 0 required). Input flows all along
(20 records per input epoch, one every 0.1 s). At the end every input record must be in the output,
read by epoch, exactly once. Prints a summary and writes ``experiments/results/faust_restart.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import EmbeddedStack
from aligner.ledger import Ledger
from experiments.common import EventLines, json_value, write_results

ROOT = Path(__file__).resolve().parent.parent
RECORDS = 20
BOUND = 120.0
"""Seconds after which a step counts as failed (a liveness bound, not a figure)."""


class Proc(EventLines):
    """A Faust worker process whose event lines (``open``, ``committed``, ...) can be awaited."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__("experiments.faust_job", ROOT, env, BOUND)

    def wait(self, event: str = "committed") -> str:
        """The worker's next ``event`` line (``committed``, ``finished``)."""
        return self.next_line(event)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def feed(ledger: Ledger, kafka: str, subject: str, finish: threading.Event, fed: list[int]) -> None:
    with SinkProducer(ledger, kafka, subject, "feeder", 0, [0, 1, 2, 3]) as producer:
        while not finish.is_set():
            epoch = producer.begin()
            for j in range(RECORDS):
                producer.send(json.dumps({"e": epoch, "j": j}).encode(), key=f"k{j % 7}".encode())
            producer.commit()
            fed.append(epoch)
            finish.wait(0.1)
        producer.finish()


def run(rounds: int, plain: bool, home: Path) -> dict[str, Any]:
    with EmbeddedStack() as info:
        root = f"/faust-restart-{uuid.uuid4().hex[:8]}"
        ledger = Ledger.connect(info.zk, root)
        src, out, job = "fr-in", "fr-out", "faust-restart"
        create_subject(ledger, info.kafka, src, 4)
        create_subject(ledger, info.kafka, out, 4)
        env = {"ALIGNER_ZK": info.zk, "ALIGNER_KAFKA": info.kafka, "ALIGNER_ROOT": root, "ALIGNER_HOME": str(home),
               "FAUST_JOB_ID": job, "FAUST_JOB_INPUT": src, "FAUST_JOB_OUTPUT": out, "FAUST_JOB_INTERVAL": "0.3",
               "FAUST_JOB_PLAIN": "1" if plain else "0"}
        finish, fed = threading.Event(), list[int]()
        feeder = threading.Thread(target=feed, args=(ledger, info.kafka, src, finish, fed), daemon=True)
        feeder.start()
        start_s, resume_s, stop_s = [], [], []
        procs: list[Proc] = []
        try:
            for i in range(rounds):
                t = time.monotonic()
                procs.append(p := Proc(env))
                p.wait()
                start_s.append(time.monotonic() - t)
                p.wait()
                p.kill()
                t = time.monotonic()
                procs.append(p := Proc(env))
                p.wait()
                resume_s.append(time.monotonic() - t)
                p.wait()
                t = time.monotonic()
                p.proc.send_signal(signal.SIGTERM)
                code = p.proc.wait(BOUND)
                stop_s.append(time.monotonic() - t)
                if code != 0:
                    raise RuntimeError(f"exit code {code} after SIGTERM: {''.join(p.stderr)[-2000:]}")
                print(f"round {i + 1}: start {start_s[-1]:.1f}s, resume after SIGKILL {resume_s[-1]:.1f}s, "
                      f"stop on SIGTERM {stop_s[-1]:.1f}s", flush=True)
            finish.set()
            feeder.join(60)
            procs.append(p := Proc(env))  # drains the rest of the input and finishes the output
            p.wait("finished")
            p.proc.send_signal(signal.SIGTERM)
            p.proc.wait(BOUND)
            with EpochReader(ledger, info.kafka) as reader:
                inputs = {(r.partition, r.offset) for r in reader.read(src, 0, ledger.epochs.finished(src))}
                results = Counter((v["src"][1], v["src"][2]) for e in ledger.subjects.epoch_numbers(out)
                                  for v in (json_value(r.value) for r in reader.read(out, e)))
        finally:
            finish.set()
            for p in procs:
                p.kill()
            feeder.join(60)
            ledger.close()
    lost = len(inputs - set(results))
    duplicated = sum(n - 1 for n in results.values() if n > 1)

    def stats(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs), 2), "max": round(max(xs), 2), "min": round(min(xs), 2)}

    return {"app": "plain faust.App" if plain else "aligned.faust_app()", "rounds": rounds,
            "start_to_first_epoch_s": stats(start_s), "sigkill_to_first_epoch_s": stats(resume_s),
            "sigterm_to_exit_s": stats(stop_s), "records": len(inputs), "lost": lost, "duplicated": duplicated,
            "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.faust_restart", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--adapter-app", action="store_true", help="use aligned.faust_app() instead of a plain faust.App")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="faust-restart-") as home:
        result = run(args.rounds, not args.adapter_app, Path(home))
    path = write_results("faust_restart" if not args.adapter_app else "faust_restart_adapter_app", result)
    print(json.dumps(result, indent=2))
    print(f"written to {path}")
    if result["lost"] or result["duplicated"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
