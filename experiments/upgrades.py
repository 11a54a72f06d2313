"""Upgrades in a row (issue 19): one target, continuous keyed input, version after version of a job
swapped in by ``aligner hotswap`` — runtime, Faust and Spark versions mixed, the parallelism changing, each
new version taking the target's partitions over and inheriting the keyed state (a Spark version rebuilds
it from the start of the input, and so does the version after it: a new checkpoint takes no other engine's
state, and Spark's state is not a changelog) — with a random party SIGKILLed during each swap (a worker or
driver of the old version, one of the new version, or the coordinator).

Then it checks every record: each input's result exactly once, from the version that owned its epoch
(``v``), each key in one target partition throughout and its per-key count running 0, 1, 2, ... across
all versions (per-key order and the state handed over exactly), the target never grew; and after
``aligner gc`` the swapped-out versions' producers are gone from ZooKeeper. Per swap it measures the time
from the request to done, S against the jobs' epoch at the request and at the swap's acceptance, and the
largest commit gap of the target around S against its cadence before the request.

    python -m experiments.upgrades                 # ten swaps (docs: Benchmarks)
    python -m experiments.upgrades --swaps 3       # the first three of them
    python -m experiments.upgrades --plan runtime:2,runtime:4,faust:1,spark:4,runtime:2  # the tests' plan

Exit code 0 when every check passed; the report goes to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import StackInfo
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.models import Phase
from experiments.chain import open_stack
from experiments.chaos.jobs import KEYS
from experiments.chaos.procs import Proc, python

ROOT = "/upgrades"
IN, OUT = "in", "out"
PARTITIONS = 4
"""Of the input and the target: every parallelism of the plan divides it (the key rule, aligner.keys)."""
PLAN: list[tuple[str, int]] = [("runtime", 2), ("runtime", 1), ("faust", 2), ("runtime", 4), ("spark", 4),
                               ("faust", 1), ("runtime", 2), ("faust", 2), ("spark", 4), ("runtime", 1),
                               ("runtime", 2)]
"""Engine and parallelism of versions 1, 2, ...: runtime, Faust and Spark mixed, the parallelism changing 9
times (a Spark version's is its write tasks, one per target partition; one driver process)."""
LIVE = 300.0
"""Liveness bound on each wait (seconds): a run that gets stuck says where instead of hanging."""


def job_name(version: int) -> str:
    return f"job-v{version}"


@dataclass
class Upgrades:
    info: StackInfo
    out: Path
    swaps: int
    seed: int
    rate: float
    interval: float
    plan: list[tuple[str, int]] = field(default_factory=lambda: list(PLAN))
    procs: dict[str, Proc] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    led: Ledger | None = None

    # ---- processes ----------------------------------------------------------------------------

    def add(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.out / "logs", env or {})
        proc.start()
        self.procs[name] = proc
        return proc

    def cli(self, *args: str) -> list[str]:
        return python("aligner.coordinator", "--zk", self.info.zk, "--kafka", self.info.kafka, "--root", ROOT, *args)

    def start_version(self, v: int) -> list[Proc]:
        engine, workers = self.plan[v - 1]
        follows = job_name(v - 1) if v > 1 else None
        inherit = follows is not None and self.plan[v - 2][0] != "spark"  # after Spark: rebuilt from the input
        if engine == "spark":
            assert follows is not None, "version 1 is a runtime job (the coordinator aligns it)"
            argv = python("experiments.upgrades_spark", "--zk", self.info.zk, "--kafka", self.info.kafka,
                          "--root", ROOT, "--source", IN, "--target", OUT, "--job", job_name(v), "--follows", follows,
                          "--checkpoint", str(self.out / "checkpoints" / job_name(v)), "--version", str(v),
                          "--partitions", str(PARTITIONS), "--keys", str(KEYS))
            return [self.add(f"{job_name(v)}-driver", argv)]
        procs = []
        for w in range(workers):
            env = {"CHAOS_WORKER": str(w), "CHAOS_VERSION": str(v)}
            if engine == "runtime":
                argv = python("aligner.connectors.runtime.worker", "--zk", self.info.zk, "--kafka", self.info.kafka,
                              "--root", ROOT, "--job", job_name(v), "--version", str(v),
                              "--function", "experiments.chaos.jobs:job_a", "--input", IN, "--output", OUT,
                              "--worker", str(w), "--parallelism", str(workers), "--interval", str(self.interval),
                              *(["--follows", follows] if follows else []),
                              *(["--inherit-state"] if inherit else []))
            else:
                argv = python("experiments.faust_job", "worker", "-l", "warn", "--without-web")
                env |= {"ALIGNER_ZK": self.info.zk, "ALIGNER_KAFKA": self.info.kafka, "ALIGNER_ROOT": ROOT,
                        "ALIGNER_HOME": str(self.out / "home"), "ALIGNER_WORKER": str(w),
                        "FAUST_JOB_ID": job_name(v), "FAUST_JOB_VERSION": str(v), "FAUST_JOB_INPUT": IN,
                        "FAUST_JOB_OUTPUT": OUT, "FAUST_JOB_PARALLELISM": str(workers),
                        "FAUST_JOB_INTERVAL": str(self.interval),
                        "FAUST_JOB_FUNCTION": "experiments.chaos.jobs:job_a",
                        **({"FAUST_JOB_FOLLOWS": follows} if follows else {}),
                        **({"FAUST_JOB_INHERIT_STATE": "1"} if inherit else {})}
            procs.append(self.add(f"{job_name(v)}-{w}", argv, env))
        return procs

    def wait(self, cond: Callable[[], bool], what: str, on_tick: Callable[[], None] | None = None) -> None:
        deadline = time.monotonic() + LIVE
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no progress in {LIVE:.0f}s: {what}")
            for name, proc in self.procs.items():  # a component that died unasked is an anomaly; it restarts
                rc = proc.returncode()
                if proc.long_running and rc not in (None, 0, -signal.SIGKILL):
                    self.anomalies.append(f"{name} exited with {rc}: {proc.stderr_tail(500)!r}")
                    proc.start()
            if on_tick is not None:
                on_tick()
            time.sleep(0.2)

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        led = self.led = Ledger.connect(self.info.zk, ROOT)
        jobs = led.jobs
        rng = random.Random(self.seed)
        create_subject(led, self.info.kafka, IN, PARTITIONS)
        create_subject(led, self.info.kafka, OUT, PARTITIONS)
        self.add("producer", python("experiments.chaos.producer", "--kafka", self.info.kafka, "--topic", IN,
                                    "--rate", str(self.rate), "--out", str(self.out / "producer.json")))
        self.add("marker", self.cli("markers", IN, "--interval", str(self.interval)))
        current = self.start_version(1)
        self.wait(lambda: (led.epochs.frontier(OUT) or -1) >= 3, "version 1's first epochs")
        align = self.add("align", self.cli("align", job_name(1), "--subject", IN, "--timeout", "240"))
        align.long_running = False
        self.wait(lambda: align.returncode() == 0, "aligning version 1")
        swaps = []
        for v in range(2, self.swaps + 2):
            new = self.start_version(v)
            old_job, new_job = job_name(v - 1), job_name(v)

            def follows(new_job: str = new_job, n: int = len(new)) -> bool:
                if new_job not in jobs.job_names():
                    return False
                c = jobs.consumers(new_job, IN)
                return len(c) == n and all(x.job_epoch is not None for x in c.values())

            self.wait(follows, f"{new_job} following {old_job}")
            swaps.append(self.swap(v, current, new, rng))
            for proc in current:  # the old version finished after S; its processes end (Faust's on SIGTERM)
                proc.long_running = False
                proc.terminate(10)
            current = new
        self.wait(lambda: (led.epochs.frontier(OUT) or -1) >= swaps[-1]["S"] + 5, "the last version's output")
        self.procs["producer"].terminate(30)
        sent = json.loads((self.out / "producer.json").read_text())
        records = self.drain(set(sent["acked"]))
        check = self.check(records, sent, swaps)
        check["gc"] = self.collect(swaps)
        for proc in self.procs.values():
            proc.long_running = False
            proc.terminate(10)
        led.close()
        return {"swaps": swaps, "check": check, "anomalies": self.anomalies, "plan": self.plan[: self.swaps + 1],
                "events": self.events}

    def swap(self, v: int, old: list[Proc], new: list[Proc], rng: random.Random) -> dict[str, Any]:
        """``aligner hotswap`` v-1 -> v with one party SIGKILLed during it and restarted; timings from the ledger."""
        led = self.led
        assert led is not None
        jobs = led.jobs
        old_job, new_job = job_name(v - 1), job_name(v)
        before = [c for s in (old_job, new_job) for c in jobs.consumers(s, IN).values() if c.job_epoch is not None]
        at_request = max(c.job_epoch for c in before if c.job_epoch is not None)
        frontier = led.epochs.frontier(OUT) or 0
        cadence = _cadence(led, frontier)
        started = time.monotonic()
        argv = self.cli("hotswap", "--old", old_job, "--new", new_job, "--subject", OUT, "--timeout", "240", "--json")
        coordinator = self.add(f"hotswap-{v}", argv)
        coordinator.long_running = False
        victim_kind = rng.choice(["old worker", "new worker", "coordinator"])
        step = rng.choice([Phase.PRECOMMIT, Phase.COMMIT])  # the kill lands in this step of the swap (or later)
        order = [Phase.PRECOMMIT, Phase.COMMIT, Phase.DONE]
        killed: list[str] = []

        def reached() -> bool:
            swap = jobs.swap(old_job)[0]
            return swap is not None and swap.phase in order and order.index(Phase(swap.phase)) >= order.index(step)

        def tick() -> None:
            nonlocal coordinator
            if not killed and reached():
                wanted = [coordinator] if victim_kind == "coordinator" else old if victim_kind == "old worker" \
                    else new
                alive = [p for p in wanted if p.alive()] or [p for p in new if p.alive()]  # it ended: a new worker
                proc = rng.choice(alive or wanted)
                if proc.alive():
                    proc.kill()
                    killed.append(proc.name)
                    self.events.append({"swap": v, "killed": proc.name, "step": str(step),
                                        "at": round(time.monotonic() - started, 2)})
                    proc.start()  # restarted at once: a worker resumes from its last epoch, the command reruns
                else:
                    killed.append(f"({proc.name} had ended)")
            if coordinator.returncode() not in (None, 0):
                coordinator.start()  # a failed or killed hotswap command is run again until it is done

        self.wait(lambda: coordinator.returncode() == 0 and bool(killed), f"hotswap {old_job} -> {new_job}", tick)
        swap, _ = jobs.swap(old_job)
        assert swap is not None
        s = swap.epoch
        self.wait(lambda: (led.epochs.frontier(OUT) or -1) >= s + 2, f"{new_job} writing after S")
        times = {e: led.epochs.committed(OUT, e).committed_at for e in range(max(0, s - 2), s + 3)}
        gaps = [(times[e] - times[e - 1]) / 1000 for e in sorted(times)[1:]]
        row = {"version": v, "engine": self.plan[v - 1][0], "workers": self.plan[v - 1][1], "killed": killed,
               "seconds": round(time.monotonic() - started, 2), "S": s, "epoch_at_request": at_request,
               "S_after_request": s - at_request,
               "S_after_acceptance": None if swap.accepted is None else s - swap.accepted,
               "gap_around_S": round(max(gaps), 3) if gaps else None, "cadence": round(cadence, 3) if cadence else None}
        print(f"swap v{v - 1} -> v{v} ({row['engine']}, {row['workers']} workers): {row['seconds']}s, S={s} "
              f"({row['S_after_request']} epochs after the request, {row['S_after_acceptance']} after its "
              f"acceptance), killed {killed}, largest gap around S {row['gap_around_S']}s against a cadence of "
              f"{row['cadence']}s", flush=True)
        return row

    def drain(self, acked: set[int]) -> list[tuple[int, int, dict[str, Any]]]:
        """Wait until every acknowledged input has its result at the target; (epoch, partition, value) of each
        record there."""
        led = self.led
        assert led is not None
        got: list[tuple[int, int, dict[str, Any]]] = []
        read: dict[str, float] = {"at": 0.0}

        def done() -> bool:
            nonlocal got
            last = led.epochs.frontier(OUT)
            if last is None or time.monotonic() - read["at"] < 3.0:
                return False
            read["at"] = time.monotonic()
            with EpochReader(led, self.info.kafka) as reader:
                got = [(r.epoch, r.partition, json.loads(r.value or b"{}")) for r in reader.read(OUT, 0, last)]
            return acked <= {v["n"] for _, _, v in got}

        self.wait(done, "every input's result at the target")
        return got

    def check(self, records: list[tuple[int, int, dict[str, Any]]], sent: dict[str, Any],
              swaps: list[dict[str, Any]]) -> dict[str, Any]:
        led = self.led
        assert led is not None
        counts = Counter(v["n"] for _, _, v in records)
        dup = sorted(n for n, c in counts.items() if c > 1)
        lost = sorted(set(sent["acked"]) - set(counts))
        wrong_version = [(e, v["v"]) for e, _, v in records if v["v"] != 1 + sum(e > s["S"] for s in swaps)]
        by_key: dict[int, list[tuple[int, int]]] = {}
        partitions: dict[int, set[int]] = {}
        for _, p, v in records:
            by_key.setdefault(v["n"] % KEYS, []).append((v["n"], v["c"]))
            partitions.setdefault(v["n"] % KEYS, set()).add(p)
        order = [k for k, rows in by_key.items() if [c for _, c in sorted(rows)] != list(range(len(rows)))]
        moved = sorted(k for k, ps in partitions.items() if len(ps) != 1)
        grew = led.subjects.subject(OUT).partitions != PARTITIONS
        for what, bad in (("duplicated", dup), ("lost", lost), ("from the wrong version", wrong_version),
                          ("keys whose counts do not run on", order), ("keys in several partitions", moved)):
            if bad:
                self.anomalies.append(f"{len(bad)} {what}: {bad[:10]}")
        if grew:
            self.anomalies.append("the target grew")
        return {"records": len(records), "inputs_acked": len(sent["acked"]), "duplicated": len(dup),
                "lost": len(lost), "wrong_version": len(wrong_version), "keys_out_of_order": len(order),
                "keys_moved": len(moved), "target_partitions": led.subjects.subject(OUT).partitions}

    def collect(self, swaps: list[dict[str, Any]]) -> dict[str, Any]:
        """``aligner gc`` keeping the last 10 epochs: the swapped-out versions' producers go (nodes and
        writers entries); the figures say what stays."""
        led = self.led
        assert led is not None
        before = led.tree_size(ROOT)
        gc = self.add("gc", self.cli("gc", "--keep-epochs", "10", "--json"))
        gc.long_running = False
        self.wait(lambda: gc.returncode() is not None, "aligner gc")
        if gc.returncode() != 0:
            self.anomalies.append(f"aligner gc failed: {gc.stderr_tail(500)!r}")
        doc, _ = led.subjects.writers(OUT)
        floor = led.subjects.first_retained(OUT)
        writing = {split_writer(w)[0] for w, e in doc.writers.items() if e.finished_after is None
                   or e.finished_after >= floor}
        producers = {s: len(led.subjects.producers(OUT, s)) for s in led.subjects.sinks(OUT)}
        stale = sorted({split_writer(w)[0] for w in doc.writers} - writing
                       | {s for s, n in producers.items() if n and s not in writing})
        if stale:
            self.anomalies.append(f"versions that wrote only below the retention floor {floor} still have "
                                  f"producers on {OUT!r} after gc: {stale}")
        return {"znodes_before": before, "znodes_after": led.tree_size(ROOT), "first_retained": floor,
                "writers": sorted(doc.writers), "producers": producers}


def _cadence(led: Ledger, frontier: int) -> float | None:
    """Median seconds between the target's last 20 committed epochs."""
    first = max(0, frontier - 20)
    times = [led.epochs.committed(OUT, e).committed_at for e in range(first, frontier + 1)]
    diffs = [(b - a) / 1000 for a, b in itertools.pairwise(times)]
    return statistics.median(diffs) if diffs else None


class Interrupted(BaseException):  # not swallowed by any "except Exception"
    """SIGTERM: unwind through every finally (components stopped, the embedded stack too)."""


def _interrupt(*_: object) -> None:
    raise Interrupted()


def _plan(text: str) -> list[tuple[str, int]]:
    plan = []
    for part in text.split(","):
        engine, _, workers = part.partition(":")
        if engine not in ("runtime", "faust", "spark") or not workers.isdigit() or int(workers) < 1 or \
                PARTITIONS % int(workers):
            raise argparse.ArgumentTypeError(f"{part!r}: runtime, faust or spark, then :N with N dividing "
                                             f"{PARTITIONS}")
        if engine == "spark" and int(workers) != PARTITIONS:
            raise argparse.ArgumentTypeError(f"{part!r}: a Spark version writes with one task per target "
                                             f"partition, spark:{PARTITIONS}")
        plan.append((engine, int(workers)))
    if len(plan) < 2 or plan[0][0] != "runtime":
        raise argparse.ArgumentTypeError("two versions at least, the first a runtime job")
    return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.upgrades", description=__doc__.split("\n\n")[0])
    ap.add_argument("--swaps", type=int, default=None, help="swaps (default: every version of the plan)")
    ap.add_argument("--plan", type=_plan, default=PLAN,
                    help="engine:parallelism of each version, e.g. runtime:2,spark:4,faust:1 (version 1: runtime)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--rate", type=float, default=100.0, help="input records per second")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds per input epoch")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/upgrades"))
    args = ap.parse_args(argv)
    swaps = args.swaps or len(args.plan) - 1  # the default plan: ten
    if not 1 <= swaps < len(args.plan):
        ap.error(f"--swaps: 1 to {len(args.plan) - 1} with this plan")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    with open_stack(False) as info:
        run = Upgrades(info, args.out, swaps, args.seed, args.rate, args.interval, args.plan)
        try:
            report = run.run()
        finally:
            for proc in run.procs.values():
                with contextlib.suppress(Exception):
                    proc.terminate(10)
    (args.out / "upgrades.json").write_text(json.dumps(report, indent=1))
    ok = not report["anomalies"]
    print(json.dumps({"check": report["check"], "anomalies": report["anomalies"]}, indent=1))
    print(f"{swaps} upgrades: {len(report['anomalies'])} anomalies")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
