"""The soak's loops beside the chaos run: frontier polls (stall detection), samples, and ``aligner gc``.

They are generators advanced by the chaos run's main loop (:attr:`experiments.chaos.run.Run.watchers`), which
must never block: every ZooKeeper read, /proc walk and CLI call runs on a helper thread (``Run.ask``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from aligner.ledger import Ledger
from experiments.chaos.nemesis import FAULT_WEIGHTS
from experiments.chaos.procs import ROOT, _session_tied_to_parent
from experiments.chaos.run import A_OUT, B_OUT, F_OUT, IN, Run, Step, retention_removed
from experiments.soak.probes import CpuMeter, dir_bytes, mntr, process_table, tree

JOB_WORKER = re.compile(r"A\d*-\d+")
"""The runtime job workers' process names (job A's versions): they print their threads' stacks on SIGUSR1."""

UPSTREAM: dict[str, str | None] = {IN: None, A_OUT: IN, B_OUT: A_OUT, F_OUT: A_OUT}
"""Each subject's input: the outside producer for ``in``, else the subject its job reads."""


class Stalled(Exception):
    """A subject's frontier stood still for the stall bound of fault-free time while its input had data."""


@dataclass
class Settings:
    sample: float = 60.0
    """Seconds between samples."""
    poll: float = 5.0
    """Seconds between frontier polls (stall detection)."""
    stall_after: float = 120.0
    """Fault-free seconds a frontier may stand still while its input has data."""
    stop_on_stall: bool = True
    gc_every: float | None = None
    """Seconds between ``aligner gc`` runs (None: no retention)."""
    keep_epochs: int = 100
    keep_seconds: float | None = None
    retention_every: float | None = None
    """Seconds between passes of the coordinator's retention loop (``aligner retention run``, a process of
    the run with the policy ``keep_epochs`` / ``keep_seconds``); None: not started."""
    gc_subjects: list[str] = field(default_factory=lambda: [IN, A_OUT, B_OUT, F_OUT])
    """Subjects gc collects: the chain's, not the jobs' state changelogs (``A.state``, ``F.state``), whose
    epochs from 0 a restarted worker replays (gc'd, it fails with EpochCollectedError: issue 23, item 2)."""


@dataclass
class Frozen:
    """Where a subject's frontier last moved: when, to what, and where its input stood then."""

    at: float
    epoch: int
    upstream: int
    reported: bool = False


def run_cli(argv: list[str], timeout: float) -> dict[str, Any]:
    """A one-shot CLI call from a helper thread (tied to this process: it dies with the soak)."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_session_tied_to_parent)
    except subprocess.TimeoutExpired:
        return {"rc": None, "seconds": round(time.monotonic() - t0, 3), "stdout": "", "stderr": "timed out"}
    return {"rc": done.returncode, "seconds": round(time.monotonic() - t0, 3), "stdout": done.stdout,
            "stderr": done.stderr[-2000:]}


def faults_active(run: Run) -> list[tuple[float, float]]:
    """[start, end] (seconds since the run started) of every fault played so far."""
    return [(e["at"], e["at"] + e["duration"]) for e in run.events if e["kind"] in FAULT_WEIGHTS]


def fault_free(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which no fault was active."""
    covered, edge = 0.0, t0
    for a, b in sorted(spans):
        a, b = max(a, edge), min(b, t1)
        if b > a:
            covered += b - a
            edge = b
    return max(0.0, t1 - t0 - covered)


@dataclass
class Soak:
    settings: Settings
    samples: list[dict[str, Any]] = field(default_factory=list)
    frontiers: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    gcs: list[dict[str, Any]] = field(default_factory=list)
    frozen: dict[str, Frozen] = field(default_factory=dict)
    on_sample: Callable[[], None] | None = None
    """Called after each sample (the soak rewrites its report: a soak killed outright still leaves one)."""

    def loops(self, run: Run) -> list[Step]:
        out = [self.poller(run), self.sampler(run)]
        if self.settings.gc_every:
            out.append(self.collector(run))
        if self.settings.retention_every:
            out.append(self.retention(run))
        return out

    # ---- stall detection -------------------------------------------------------------------------

    def poller(self, run: Run) -> Step:
        """Poll every subject's frontier (the ledger's public ``frontier``) and look for stalls."""
        while not run.draining:
            due = time.time() + self.settings.poll
            assert run.led is not None
            subjects = [s for s in UPSTREAM if run.faust or s != F_OUT]
            now = yield from run.ask(partial(frontiers, run.led, subjects), timeout=30.0)
            if now is not None and not run.draining:
                self.frontiers.append((run.rel(), now))
                self.look_for_stalls(run, now)
            yield from idle(run, due - time.time())

    def look_for_stalls(self, run: Run, now: dict[str, int]) -> None:
        t = run.rel()
        spans = faults_active(run)
        for subject, epoch in now.items():
            up = UPSTREAM[subject]
            upstream = now.get(up, -1) if up is not None else -1
            last = self.frozen.get(subject)
            if last is None or epoch != last.epoch:
                self.frozen[subject] = Frozen(t, epoch, upstream)
                continue
            has_data = run.procs["producer"].alive() if up is None else upstream > last.upstream
            still = fault_free(spans, last.at, t)
            if has_data and still >= self.settings.stall_after and not last.reported:
                last.reported = True
                moved = "the producer kept sending" if up is None else f"{up} moved {last.upstream} -> {upstream}"
                stall = {"at": t, "subject": subject, "epoch": epoch, "since": last.at, "fault_free_s": round(still, 1),
                         "why": f"{subject} frozen at epoch {epoch} since {last.at:.0f}s ({still:.0f}s without a "
                                f"fault) while {moved}"}
                self.stalls.append(stall)
                run.say(f"  [red]stall: {stall['why']}[/]")
                for name, proc in run.procs.items():  # where each job worker is: its stacks in its .err log
                    if JOB_WORKER.fullmatch(name):
                        proc.signal(signal.SIGUSR1)
                if self.settings.stop_on_stall:
                    raise Stalled(stall["why"])

    # ---- samples ---------------------------------------------------------------------------------

    def sampler(self, run: Run) -> Step:
        """One sample every ``settings.sample`` seconds from the start, and a last one when the nemesis ends."""
        meter = CpuMeter()
        last = time.time()
        next_at = run.started
        while True:
            while time.time() < next_at and not run.draining:
                yield
            now = time.time()
            seconds, last = now - last, now
            sample = yield from run.ask(partial(self.measure, run, meter, seconds), timeout=120.0)
            if sample is not None:
                sample["frontiers"] = self.frontiers[-1][1] if self.frontiers else {}
                self.samples.append(sample)
                if self.on_sample is not None:
                    self.on_sample()
            if run.draining:
                return
            next_at += self.settings.sample

    def measure(self, run: Run, meter: CpuMeter, seconds: float) -> dict[str, Any]:
        """One sample: ZooKeeper's mntr and data dir, RSS and CPU per component, ``aligner status`` time."""
        assert run.info is not None
        t = run.rel()
        table = process_table()
        groups: dict[str, list[int]] = {"zookeeper": tree(table, run.zk_pid() or -1),
                                        "broker": tree(table, run.info.kafka_pid), "soak": [os.getpid()]}
        for name, proc in list(run.procs.items()):
            if proc.alive() and proc.pid is not None:
                key = "coordinator" if name.startswith("coord-") else name
                groups[key] = groups.get(key, []) + tree(table, proc.pid)
        roots = {k: pids[0] for k, pids in groups.items() if pids and k != "coordinator"}
        cpu, busy = meter.measure(groups, table, seconds)
        rss = {k: sum(table[p].rss for p in pids if p in table) for k, pids in groups.items()}
        status = run_cli(run.cli("status", "--json"), timeout=60.0)
        return {"t": t, "mntr": mntr(run.info.zk), "zk_dir_bytes": dir_bytes(Path(run.info.workdir) / "zk-data"),
                "rss": rss, "cpu": cpu, "pids": roots, "machine_busy_cores": busy,
                "status_s": status["seconds"] if status["rc"] == 0 else None, "status_rc": status["rc"],
                **({} if status["rc"] == 0 else {"status_error": status["stderr"].strip()[-300:]}),
                "generation": run.generation, "faults": len(faults_active(run))}

    # ---- retention -------------------------------------------------------------------------------

    def collector(self, run: Run) -> Step:
        """``aligner gc`` every ``settings.gc_every`` seconds: the retention the coordinator does not do yet."""
        s = self.settings
        args = ["gc", "--keep-epochs", str(s.keep_epochs), "--json"]
        args += [a for x in s.gc_subjects for a in ("--subject", x)]
        if s.keep_seconds is not None:
            args += ["--keep-seconds", str(s.keep_seconds)]
        assert s.gc_every is not None
        while not run.draining:
            yield from idle(run, s.gc_every)
            if run.draining:
                return
            at = run.rel()
            done = yield from run.ask(lambda: run_cli(run.cli(*args), timeout=300.0), timeout=330.0)
            if done is None:
                continue
            entry = {"at": at, "seconds": done["seconds"], "rc": done["rc"]}
            try:
                entry["result"] = json.loads(done["stdout"])
            except ValueError:
                entry["stderr"] = done["stderr"][-500:]
            self.gcs.append(entry)
            run.retained = run.retained or done["rc"] == 0
            if done["rc"] != 0:
                run.say(f"  [yellow]gc failed (exit {done['rc']}): {done['stderr'].strip()[-200:]}[/]")


    def retention(self, run: Run) -> Step:
        """The leading coordinator's retention loop as one supervised process of the run (restarted when
        killed); each pass's one line is kept as a gc entry, so the verdict sees retention that stops."""
        s = self.settings
        args = ["retention", "run", "--every", str(s.retention_every), "--min-epochs", str(s.keep_epochs),
                "--hours", str((s.keep_seconds or 0.0) / 3600)]
        proc = run.add("retention", run.cli(*args))
        seen = 0
        while not run.draining:
            yield from idle(run, s.sample)
            lines = proc.stderr_tail(1 << 20).splitlines()
            passes = [ln for ln in lines if ln.startswith(("retention pass:", "retention pass failed"))]
            for line in passes[seen:]:
                entry: dict[str, Any] = {"at": run.rel(), "rc": 0 if line.startswith("retention pass:") else 1,
                                         "line": line}
                self.gcs.append(entry)
                run.retained = run.retained or retention_removed(line)
            seen = len(passes)


def idle(run: Run, seconds: float) -> Step:
    """Wait ``seconds``, or less once the run drains (a watcher must end then)."""
    deadline = time.time() + seconds
    while time.time() < deadline and not run.draining:
        yield


def frontiers(led: Ledger, subjects: list[str]) -> dict[str, int]:
    """Every subject's last committed epoch (-1 before the first)."""
    out = {}
    for s in subjects:
        last = led.epochs.frontier(s)
        out[s] = -1 if last is None else last
    return out
