"""One chaos run: start the chain as separate processes, play the nemesis, heal, drain, check.

The main thread runs one cooperative loop (every spawn happens on it, see :mod:`.procs`): the
restarter, the coordinator's lane of operations and the nemesis are generators it advances.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aligner.connectors.subjects import create_subject
from aligner.embedded.ensemble import ZkEnsemble
from aligner.embedded.netns import NetLab
from aligner.embedded.spark_cluster import SparkCluster
from aligner.embedded.stack import EmbeddedStack, StackInfo
from aligner.errors import StackError
from aligner.ledger import Ledger
from experiments.chaos.nemesis import KILLS, NETWORK, Fault
from experiments.chaos.procs import Proc, python, signal_group

log = logging.getLogger("experiments.chaos")

ROOT = "/chaos"
IN, A_OUT, B_OUT, F_OUT = "in", "a", "b", "f"
JOB_A, JOB_A2, JOB_F, SINK_B = "A", "A2", "F", "B"
NAMES = {"in": IN, "a": A_OUT, "b": B_OUT, "f": F_OUT, "A": JOB_A, "A2": JOB_A2, "F": JOB_F, "B": SINK_B}
A_PARTITIONS = 4
"""Partitions of ``a``: every version of job A takes them over from the one before at its hot-swap (issue 19),
so ``a`` never grows, however many versions a soak swaps in."""
RESCALE = (2, 1, 2, 4)
"""Workers of job A's versions 1, 2, 3, 4, 5, ... with ``rescale`` (cycling): each swap changes the
parallelism, state handed over or rebuilt by the key rule; all divide the 4 partitions of ``in`` and ``a``."""


RETENTION_PASS = re.compile(r"retention pass: removed \d+ epochs of \d+ subjects, (\d+) nodes")


def retention_removed(line: str) -> bool:
    """Whether a retention pass's line says it removed any node: subject epochs, or only what a swapped-out
    job or a Spark query left (a short soak); either way the checker judges the retained window."""
    m = RETENTION_PASS.match(line)
    return m is not None and int(m.group(1)) > 0


def job_a_name(generation: int) -> str:
    """Job A's name in generation ``generation`` (1: A, then A2, A3, ...)."""
    return JOB_A if generation == 1 else f"{JOB_A}{generation}"


def workers_of(generation: int, rescale: bool) -> int:
    """Workers of job A's version ``generation``."""
    return RESCALE[(generation - 1) % len(RESCALE)] if rescale else 2
RESTART_DELAY = 0.5
"""Seconds the restarter waits before restarting a SIGKILLed component (systemd's RestartSec)."""

Step = Generator[None, None, Any]


def wait_until(t: float) -> Step:
    while time.time() < t:
        yield


def damage_store(path: Path, rng: random.Random) -> str:
    """Damage a RocksDB store while its worker is down: its largest table file truncated to half, or one
    byte in it flipped (the worker must find it, move it aside and restore from the changelog); with no
    table file yet, its write-ahead log cut short."""
    tables = sorted(path.glob("*.sst"), key=lambda f: f.stat().st_size)
    if not tables:  # everything is still in the write-ahead log: cut it (recovery keeps a consistent prefix)
        wals = sorted((f for f in path.glob("*.log") if f.stat().st_size), key=lambda f: f.stat().st_mtime)
        if not wals:
            return "nothing on disk yet"
        cut = rng.randrange(wals[-1].stat().st_size)
        os.truncate(wals[-1], cut)
        return f"write-ahead log {wals[-1].name} cut to {cut} bytes"
    table, raw = tables[-1], bytearray(tables[-1].read_bytes())
    if rng.random() < 0.5:
        table.write_bytes(bytes(raw[: len(raw) // 2]))
        return f"{table.name} truncated"
    raw[rng.randrange(len(raw))] ^= 0xFF
    table.write_bytes(bytes(raw))
    return f"a byte of {table.name} flipped"


def damage_zk_data(data: Path, rng: random.Random) -> str:
    """Damage a stopped ZooKeeper member's disk: its newest snapshot overwritten with garbage, or a byte of
    its transaction log flipped and the log's end cut."""
    if rng.random() < 0.5:
        snaps = sorted(data.glob("snapshot.*"), key=lambda f: f.stat().st_mtime)
        if snaps:
            snaps[-1].write_bytes(b"garbage")
            return f"{snaps[-1].name} overwritten"
    logs = sorted(data.glob("log.*"), key=lambda f: f.stat().st_mtime)
    if not logs:
        return "nothing on disk yet"
    raw = bytearray(logs[-1].read_bytes())
    used = len(raw.rstrip(b"\0")) or 1  # the log is preallocated with zeros past its last transaction
    raw = raw[: max(1, used - rng.randrange(used))]
    raw[rng.randrange(len(raw))] ^= 0xFF
    logs[-1].write_bytes(bytes(raw))
    return f"{logs[-1].name} cut to {len(raw)} bytes, a byte flipped"


def wait_for(cond: Callable[[], bool], timeout: float) -> Generator[None, None, bool]:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            return False
        yield
    return True


class Interrupted(BaseException):  # not swallowed by any "except Exception"
    """SIGTERM/SIGHUP of the checker: unwind through every finally."""


@dataclass
class Observation:
    """Something a component did that it should not have: exited by itself, or a command failed."""

    at: float
    component: str
    what: str
    stderr: str = ""


@dataclass
class Run:
    seed: int
    faults: list[Fault]
    ops: list[Fault]
    outdir: Path
    rate: float = 150.0
    linger_ms: float = 5.0
    """The outside producer's linger.ms (librdkafka's default: 5 ms, ~25 batches a second per partition at
    150 records/s; the embedded broker's fetches slow with the batches a partition holds)."""
    faust: bool = True
    say: Callable[[str], None] = print
    procs: dict[str, Proc] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    started: float = 0.0
    swap_committed: bool = False
    interval: float = 0.5
    """Seconds per epoch of the marker and of the jobs' unaligned epochs."""
    generations: int = 2
    """Versions of job A the run may start (a hot-swap starts the next one); sizes subject ``a``."""
    generation: int = 1
    """The version of job A that runs now (the last one a hot-swap committed)."""
    lasts_at_least: float = 0.0
    """Seconds the nemesis phase lasts at least, even when its faults are played sooner (a soak's duration)."""
    watchers: list[Step] = field(default_factory=list)
    """Extra loops of the main loop (a soak's sampler); each must end once ``draining`` is set."""
    draining: bool = False
    inherit_state: bool = False
    rescale: bool = True
    """Each hot-swap changes job A's parallelism (:data:`RESCALE`)."""
    """A new version of job A takes the old one's keyed state at the swap (``--inherit-state``) instead of
    rebuilding it from its input's first epoch, which retention may have collected."""
    retained: bool = False
    """Epochs were collected (a soak's ``aligner gc``): the checker checks the retained window."""
    zk_servers: int = 1
    """ZooKeeper servers: 3 or 5 run an ensemble, whose faults hit the leader (a pause, or a kill and restart
    of it) while the others keep the quorum."""
    ensemble: ZkEnsemble | None = None
    spark_workers: int = 0
    """Run job B on a Spark standalone cluster of this many workers (one core each); its executors are then
    a fault target of their own (kill-executor)."""
    spark: SparkCluster | None = None
    rocksdb: bool = False
    """Job A's workers keep their state in RocksDB (under the run's ``state`` directory); damage-state then
    kills a worker and damages its store (a table file truncated or a byte flipped) before its restart."""
    netns: bool = False
    """Every component in a network namespace of its own (:mod:`aligner.embedded.netns`): the network and
    clock faults can then cut, slow or skew one component while the others run on."""
    lab: NetLab | None = None
    history: Any = None
    """The committed epochs seen while the run went on (:class:`experiments.chaos.history.History`)."""

    # ---- plumbing ----------------------------------------------------------------------------

    def rel(self) -> float:
        return round(time.time() - self.started, 2)

    @staticmethod
    def host_of(name: str) -> str:
        """The network namespace a component runs in (--netns): its own, one for every coordinator command."""
        return "coord" if name.startswith("coord-") else name

    def clock(self, host: str) -> Path:
        """The file a component's skewed clock reads its offset from (:mod:`experiments.chaos.skew`)."""
        return self.outdir / "clock" / host

    def add(self, name: str, argv: list[str], env: dict[str, str] | None = None, supervised: bool = True) -> Proc:
        if self.lab is not None:  # in its namespace, its wall clock read through a file the nemesis may skew
            host = self.host_of(name)
            clock = self.clock(host)
            clock.parent.mkdir(parents=True, exist_ok=True)
            if not clock.exists():
                clock.write_text("0\n")
            if argv[1:2] == ["-m"]:
                argv = [argv[0], "-m", "experiments.chaos.skew", str(clock), *argv[2:]]
            argv = [*self.lab.prefix(host), *argv]
        proc = Proc(name, argv, self.outdir / "logs", env or {}, supervised=supervised)
        self.procs[name] = proc
        proc.start()
        return proc

    def cli(self, *args: str) -> list[str]:
        assert self.info is not None
        return python("aligner.coordinator", "--zk", self.info.zk, "--kafka", self.info.kafka, "--root", ROOT, *args)

    def observe(self, component: str, what: str, proc: Proc | None = None) -> None:
        obs = Observation(self.rel(), component, what, proc.stderr_tail() if proc else "")
        self.observations.append(obs)
        self.say(f"  [yellow]! {obs.at:.1f}s {component}: {what}[/]")

    # ---- the restarter -------------------------------------------------------------------------

    def restarter(self, restart_crashed: Callable[[], bool]) -> Step:
        """Restart what was SIGKILLed (after RESTART_DELAY); record any other exit that was not asked
        for, and restart those too once ``restart_crashed()`` (the heal phase)."""
        due: dict[str, float] = {}
        seen: dict[str, int] = {}
        while True:
            for name, proc in list(self.procs.items()):
                if not proc.supervised or proc.popen is None:
                    continue
                rc = proc.returncode()
                if rc is None:
                    continue
                ident = id(proc.popen)
                if seen.get(name) != ident:
                    seen[name] = ident
                    proc.exits.append(rc)
                    if rc == -signal.SIGKILL:
                        due[name] = time.time() + RESTART_DELAY
                    elif rc != 0 and proc.long_running:
                        self.observe(name, f"exited with code {rc} (not killed)", proc)
                        due[name] = float("inf")
                    else:
                        continue
                if name in due and (time.time() >= due[name] or restart_crashed()):
                    del due[name]
                    proc.start()
                    self.event("restart", name, 0.0)
            yield

    def event(self, kind: str, target: str, duration: float, **extra: Any) -> dict[str, Any]:
        ev = {"at": self.rel(), "kind": kind, "target": target, "duration": duration, **extra}
        self.events.append(ev)
        return ev

    # ---- the stack -----------------------------------------------------------------------------

    info: StackInfo | None = None
    zk_argv: list[str] = field(default_factory=list)
    zk_proc: Proc | None = None

    def zk_pid(self, role: str = "leader") -> int | None:
        """The ZooKeeper server the faults hit: the only one, or an ensemble's leader (or a follower)."""
        if self.ensemble is not None:
            with contextlib.suppress(StackError):
                leader = self.ensemble.leader()
                if role == "follower":
                    return next((p for i in range(self.ensemble.servers) if i != leader
                                 and (p := self.ensemble.pid(i)) is not None), None)
                return self.ensemble.pid(leader)
            return None
        if self.zk_proc is not None:
            return self.zk_proc.pid if self.zk_proc.alive() else None
        assert self.info is not None
        return self.info.zk_pid

    # ---- the chain -----------------------------------------------------------------------------

    def worker_argv(self, job: str, i: int, extra: list[str], workers: int = 2, generation: int = 1) -> list[str]:
        """A worker of job A's version ``generation``: even versions run the batch form (experiments.chaos.jobs)."""
        assert self.info is not None
        function = "experiments.chaos.jobs:" + ("job_a_batch" if generation % 2 == 0 else "job_a")
        return python("aligner.connectors.runtime", "--zk", self.info.zk, "--kafka", self.info.kafka, "--root", ROOT,
                      "--job", job, "--function", function, "--input", IN,
                      "--output", A_OUT, "--worker", str(i), "--parallelism", str(workers),
                      "--interval", str(self.interval),
                      *(["--state", "rocksdb", "--state-dir", str(self.outdir / "state")] if self.rocksdb else []),
                      *extra)

    def start_chain(self) -> None:
        info = self.info
        assert info is not None
        with Ledger.connect(info.zk, ROOT) as led:
            for name, parts in ((IN, 4), (A_OUT, A_PARTITIONS), (B_OUT, 4), (F_OUT, 2)):
                create_subject(led, info.kafka, name, parts)
        home = str(self.outdir / "home")
        self.add("producer", python("experiments.chaos.producer", "--kafka", info.kafka, "--topic", IN,
                                    "--rate", str(self.rate), "--linger-ms", str(self.linger_ms),
                                    "--out", str(self.outdir / "producer.json")),
                 supervised=False)
        self.add("marker", self.cli("markers", IN, "--interval", str(self.interval)))
        self.start_generation(1)
        self.add("spark", python("experiments.chaos.spark_job", "--zk", info.zk, "--kafka", info.kafka, "--root",
                                 ROOT, "--source", A_OUT, "--target", B_OUT, "--sink", SINK_B,
                                 "--checkpoint", str(self.outdir / "spark-checkpoint"),
                                 *(["--master", self.spark.url] if self.spark is not None else []),
                                 *(["--host", self.lab.ip("spark")] if self.lab is not None else [])))
        if not self.faust:
            return
        self.add("faust", python("experiments.faust_job", "worker", "-l", "warn", "--without-web"),
                 {"ALIGNER_ZK": info.zk, "ALIGNER_KAFKA": info.kafka, "ALIGNER_ROOT": ROOT, "ALIGNER_HOME": home,
                  "FAUST_JOB_ID": JOB_F, "FAUST_JOB_INPUT": A_OUT, "FAUST_JOB_OUTPUT": F_OUT,
                  "FAUST_JOB_INTERVAL": str(self.interval)})

    def start_generation(self, g: int) -> None:
        """Start job A's version ``g`` (following version ``g - 1`` after the first, to take ``a``'s partitions
        over at the swap), with its number of workers."""
        follows = ["--version", str(g), "--follows", job_a_name(g - 1)] if g > 1 else []
        if g > 1 and self.inherit_state:
            follows.append("--inherit-state")
        workers = workers_of(g, self.rescale)
        for i in range(workers):
            argv = self.worker_argv(job_a_name(g), i, follows, workers, g)
            self.add(f"{job_a_name(g)}-{i}", argv, {"CHAOS_WORKER": str(i), "CHAOS_VERSION": str(g)})
            if g > 1:
                self.event("start", f"{job_a_name(g)}-{i}", 0.0)

    def newest_generation(self) -> int:
        """The newest version of job A started (a hot-swap under way runs it beside the current one)."""
        return max(g for g in range(1, self.generations + 1) if f"{job_a_name(g)}-0" in self.procs)

    def workers(self) -> list[Proc]:
        """The job A workers of the newest version started (the one that finishes the run)."""
        g = self.newest_generation()
        return [self.procs[f"{job_a_name(g)}-{i}"] for i in range(workers_of(g, self.rescale))]

    # ---- the coordinator's lane ----------------------------------------------------------------

    coordinator: Proc | None = None

    def command(self, label: str, *args: str) -> Generator[None, None, bool]:
        """Run one coordinator command to its end; the restarter reruns it after a SIGKILL."""
        name = f"coord-{len([p for p in self.procs if p.startswith('coord-')])}"
        ev = self.event("op", label, 0.0)
        proc = self.add(name, self.cli(*args, "--timeout", "240", "--json"))
        proc.long_running = False
        self.coordinator = proc
        while (rc := proc.returncode()) is None or rc == -signal.SIGKILL:
            yield
        self.coordinator = None
        ev["duration"] = round(self.rel() - ev["at"], 2)
        ev["ok"] = rc == 0
        if rc != 0:
            self.say(f"  [yellow]{label}: failed (exit {rc})[/]")
        return rc == 0

    def ask(self, fn: Callable[[], Any], timeout: float = 60.0) -> Generator[None, None, Any]:
        """Ask ZooKeeper on a helper thread: the main loop must never block on a ZooKeeper that the nemesis
        paused (it is the main loop that resumes it). None when no answer came in time."""
        box: list[Any] = []

        def call() -> None:
            try:
                box.append(fn())
            except Exception:
                box.append(None)

        threading.Thread(target=call, daemon=True, name="chaos-zk-probe").start()
        yield from wait_for(lambda: bool(box), timeout)
        return box[0] if box else None

    def aligned(self, job: str, subject: str) -> Generator[None, None, bool]:
        from aligner.alignment import State

        assert self.led is not None
        led = self.led
        return bool((yield from self.ask(lambda: led.jobs.source_state(job, subject).state is State.ALIGNED)))

    def lane(self, ops: list[Fault], until_all: bool = True) -> Step:
        """The coordinator: each operation at its time (at once when late), one at a time."""
        for op in ops:
            yield from wait_until(self.started + op.at)
            self.say(f"{self.rel():7.1f}s  op {op.kind} {op.target}")
            if op.kind == "hotswap":
                yield from self.hotswap()
            elif op.kind == "align":
                job, subject = (job_a_name(self.generation), IN) if op.target == "A" else (JOB_F, A_OUT)
                yield from self.command(f"align {op.target}", "align", job, "--subject", subject)
            elif op.kind == "abort":
                job = job_a_name(self.generation) if op.target == "A" else JOB_F
                yield from self.command(f"abort {op.target}", "abort", job)

    def hotswap(self) -> Step:
        """Align the running version of A (unless it is), start the next one beside it, wait until it follows,
        swap; retried until done. A run's first swap is A -> A2, a soak's next ones A2 -> A3 and so on."""
        old, new = job_a_name(self.generation), job_a_name(self.generation + 1)
        if self.generation + 1 > self.generations:
            self.say(f"  [yellow]hot-swap skipped: the run planned {self.generations} versions of A[/]")
            return
        for attempt in range(5):
            if not (yield from self.aligned(old, IN)) and not (
                    yield from self.command(f"align {old} (for the swap)", "align", old, "--subject", IN)):
                self.say(f"  hot-swap attempt {attempt + 1}: {old} is not aligned; again")
                continue  # a new version joins only an aligned old one: it would wait for the alignment
            if f"{new}-0" not in self.procs:
                self.start_generation(self.generation + 1)
                yield from self._v2_follows(new)
            if (yield from self.command(f"hotswap {old} -> {new}", "hotswap", "--old", old, "--new", new,
                                        "--subject", A_OUT)):
                self.swap_committed = True
                self.generation += 1
                return
            self.say(f"  hot-swap attempt {attempt + 1} failed; again")

    def _v2_follows(self, new: str) -> Generator[None, None, bool]:
        assert self.led is not None
        led = self.led
        workers = workers_of(self.generation + 1, self.rescale)

        def follows() -> bool:
            c = led.jobs.consumers(new, IN)
            return len(c) == workers and all(n.job_epoch is not None for n in c.values())

        deadline = time.time() + 180
        while time.time() < deadline:
            if (yield from self.ask(follows)):
                return True
            yield from wait_until(time.time() + 0.5)
        return False

    # ---- the nemesis ---------------------------------------------------------------------------

    paused: set[int] = field(default_factory=set)

    def nemesis(self) -> Step:
        rng = random.Random(f"{self.seed}/targets")
        for f in self.faults:
            yield from wait_until(self.started + f.at)
            self.say(f"{self.rel():7.1f}s  {f.kind} {f.target}{f' for {f.duration:.1f}s' if f.duration else ''}")
            yield from self.perform(f, rng)
        yield from wait_until(self.started + self.lasts_at_least)

    def pause(self, pid: int | None, group: bool, seconds: float) -> Step:
        if pid is None:
            return
        sig = os.killpg if group else os.kill
        with contextlib.suppress(ProcessLookupError):
            sig(pid, signal.SIGSTOP)
            self.paused.add(pid)
        yield from wait_until(time.time() + seconds)
        with contextlib.suppress(ProcessLookupError):
            sig(pid, signal.SIGCONT)
        self.paused.discard(pid)

    def perform(self, f: Fault, rng: random.Random) -> Step:
        assert self.info is not None
        ev = self.event(f.kind, f.target, f.duration)
        if f.kind == "kill-coordinator" and (self.coordinator is None or not self.coordinator.alive()):
            # No operation under way: start one (idempotent: align the running version of A) to kill.
            self.start_idle_op()
            yield from wait_until(time.time() + rng.uniform(0.3, 2.0))
        if f.kind in NETWORK:
            yield from self.network_fault(f, ev)
            return
        if f.kind == "damage-state":
            proc = self.kill_target(Fault(f.at, "kill-worker", f.target), rng)
            if proc is None or not proc.kill():
                ev["target"] = "(none alive)"
                return
            proc.kills += 1
            ev["target"] = f"{proc.name}: {damage_store(self.outdir / 'state' / proc.name, rng)}"
            return
        if f.kind in KILLS:
            proc = self.kill_target(f, rng)
            ev["target"] = proc.name if proc is not None else "(none alive)"
            if proc is not None:
                proc.kills += 1
                proc.kill()
            return
        if f.kind == "kill-executor":
            executors = self.spark.executors() if self.spark is not None else []
            victim = rng.choice(executors) if executors else None
            ev["target"] = f"executor pid {victim}" if victim else "(none alive)"
            if victim:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)  # its worker starts another for the application
            return
        if f.kind == "restart-spark-worker" and self.spark is not None:
            spark = self.spark
            i = int(f.target.split()[-1]) % spark.workers if f.target else 0
            ev["target"] = f"spark worker {i + 1}"
            spark.kill_worker(i)  # its executors notice and exit; the driver reruns their tasks elsewhere
            yield from wait_until(time.time() + f.duration)
            spark.start_worker(i)
            yield from wait_for(lambda: spark.alive_workers() >= spark.workers, 120)
            return
        if f.kind == "damage-zk" and self.ensemble is not None:
            ensemble = self.ensemble
            with contextlib.suppress(StackError):
                member = next(i for i in range(ensemble.servers) if i != ensemble.leader()
                              and ensemble.pid(i) is not None)
                ensemble.kill(member)
                ev["target"] = f"server {member + 1}: {damage_zk_data(ensemble.data_dir(member), rng)}"
                yield from wait_until(time.time() + f.duration)
                # The operator's procedure for a member whose disk was damaged, whether ZooKeeper would refuse
                # the data or not: ZooKeeper 3.8.0 started on a garbage snapshot once and served an old tree
                # (docs: ZooKeeper ensemble guide). Moved aside, started empty,
                # it takes a snapshot from the leader while the quorum serves the chain.
                serving = lambda: ensemble.mode(member) in ("follower", "leader")  # noqa: E731
                ev["target"] += f"; rebuilt (data moved to {ensemble.rebuild(member).name})"
                yield from wait_for(serving, 120)
                yield from wait_until(time.time() + ZK_SETTLE)
            return
        if f.kind == "pause-zk":
            pid = self.zk_pid(f.target)
            if self.ensemble is not None:
                ev["target"] = f"{f.target} (pid {pid})"
            yield from self.pause(pid, False, f.duration)
        elif f.kind == "pause-broker":
            yield from self.pause(self.info.kafka_pid, False, f.duration)
        elif f.kind == "restart-zk" and self.ensemble is not None:
            ensemble = self.ensemble
            with contextlib.suppress(StackError):
                leader = ensemble.leader()
                ev["target"] = f"server {leader + 1} (leader)"
                ensemble.kill(leader)
                yield from wait_until(time.time() + f.duration)
                ensemble.start_server(leader)  # it rejoins the quorum from its data
                # ... and is let finish syncing before the next fault: ZooKeeper 3.8.0 (Debian 12) loses
                # acknowledged transactions when the leader dies while a restarted follower syncs
                # (ZOOKEEPER-4785, -4646; fixed in 3.8.4): a server bug, not what this checker is after.
                yield from wait_for(lambda: ensemble.mode(leader) in ("follower", "leader"), 120)
                yield from wait_until(time.time() + ZK_SETTLE)
        elif f.kind == "restart-zk":
            pid = self.zk_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if self.zk_proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.zk_proc.popen.wait(5)  # type: ignore[union-attr]
            yield from wait_until(time.time() + f.duration)
            self.start_zk()
        elif f.kind == "expire-session":
            live = [p for p in self.workers() if p.alive()]
            wanted = int(f.target.split()[-1]) if f.target else 0
            target = next((p for p in live if p.name.endswith(f"-{wanted}")), live[0] if live else None)
            ev["target"] = target.name if target is not None else "(none alive)"
            if target is not None:
                target.paused = True
                yield from self.pause(target.pid, True, f.duration)
                target.paused = False

    # ---- network and clock faults (--netns) ----------------------------------------------------

    def zk_hosts(self) -> list[str]:
        if self.ensemble is not None:
            return [self.ensemble.name(i) for i in range(self.ensemble.servers)]
        return ["zookeeper"]

    def net_host(self, target: str) -> str | None:
        """The namespace of a fault's target component (None: nothing of it runs)."""
        words = target.split()
        if words[0] == "worker":
            live = [p for p in self.workers() if p.alive()]
            proc = next((p for p in live if p.name.endswith(f"-{words[1]}")), live[0] if live else None)
            return proc.name if proc is not None else None
        if words[0] == "executor":
            return f"spark-w{int(words[1]) + 1}" if self.spark is not None else None
        if words[0] == "coordinator":
            return "coord"
        if words[0] == "broker":
            return "kafka"
        if words[:2] == ["zk", "leader"]:
            if self.ensemble is None:
                return "zookeeper"
            with contextlib.suppress(StackError):
                return self.ensemble.name(self.ensemble.leader())
            return None
        return words[0] if words[0] in self.procs else None

    def network_fault(self, f: Fault, ev: dict[str, Any]) -> Step:
        """Cut, slow or skew one component (or split the ensemble) for ``f.duration``, then heal it."""
        lab = self.lab
        assert lab is not None and self.info is not None
        if f.kind in ("split-zk", "bridge-zk"):
            ensemble = self.ensemble
            if ensemble is None:
                ev["target"] = "(none: one ZooKeeper server)"
                return
            try:
                leader = ensemble.leader()
            except StackError:
                ev["target"] = "(none: no leader)"
                return
            others = [i for i in range(ensemble.servers) if i != leader]
            if f.kind == "split-zk":  # a minority of one: the leader itself, or a follower
                alone = leader if f.target == "leader" else others[0]
                rest = [ensemble.name(i) for i in range(ensemble.servers) if i != alone]
                lab.cut(ensemble.name(alone), rest)
                ev["target"] = f"server {alone + 1} ({f.target}) alone"
                undo = [(ensemble.name(alone), rest)]
            else:  # a bridge: two sides that do not see each other, one server (the leader or not) in both
                bridge = leader if f.target == "leader" else others[0]
                a, b = [i for i in range(ensemble.servers) if i != bridge][:2]
                lab.cut(ensemble.name(a), [ensemble.name(b)])
                ev["target"] = f"servers {a + 1} and {b + 1} apart, server {bridge + 1} ({f.target}) bridges"
                undo = [(ensemble.name(a), [ensemble.name(b)])]
            yield from wait_until(time.time() + f.duration)
            for side, peers in undo:
                lab.join(side, peers)
            yield from wait_for(lambda: self._quorum_serves(), 120)
            yield from wait_until(time.time() + ZK_SETTLE)
            return
        if f.kind == "cut-driver":
            host = self.net_host(f.target)
            if host is None:
                ev["target"] = "(none: no cluster)"
                return
            peers = ["spark", "spark-master"]
            lab.cut(host, peers)
            ev["target"] = f"{host} from the driver and master"
            yield from wait_until(time.time() + f.duration)
            lab.join(host, peers)
            return
        words = f.target.split()
        if words[0] == "coordinator" and (self.coordinator is None or not self.coordinator.alive()):
            self.start_idle_op()
        host = self.net_host(f.target)
        if host is None:
            ev["target"] = f"{f.target} (none alive)"
            return
        if f.kind == "skew-clock":
            offset = float(words[-1].rstrip("s"))
            self.clock(host).write_text(f"{offset}\n")
            ev["target"] = f"{host} {offset:+.0f}s"
            yield from wait_until(time.time() + f.duration)
            self.clock(host).write_text("0\n")
            return
        if f.kind == "slow-link":
            rng = random.Random(f"{self.seed}/{f.at}/slow")
            kbit, loss = rng.choice((64, 256, 1024)), rng.choice((0, 20, 50, 100))
            lab.slow_link(host, kbit, loss)
            ev["target"] = f"{host} at {kbit} kbit/s, {loss / 10:g}% loss"
            yield from wait_until(time.time() + f.duration)
            lab.fast_link(host)
            return
        peers = {"cut-zk": self.zk_hosts(), "cut-kafka": ["kafka"], "cut-both": [*self.zk_hosts(), "kafka"]}[f.kind]
        lab.cut(host, peers)
        ev["target"] = f"{host} from " + {"cut-zk": "ZooKeeper", "cut-kafka": "Kafka", "cut-both": "both"}[f.kind]
        yield from wait_until(time.time() + f.duration)
        lab.join(host, peers)

    def _quorum_serves(self) -> bool:
        ensemble = self.ensemble
        if ensemble is None:
            return True
        modes = [ensemble.mode(i) for i in range(ensemble.servers)]
        return "leader" in modes and all(m in ("leader", "follower") for m in modes)

    def start_idle_op(self) -> None:
        """No coordinator operation under way: start one (idempotent: align the running version of A) for a
        fault to hit."""
        job = job_a_name(self.newest_generation())
        self.coordinator = self.add(f"coord-x{len(self.events)}",
                                    self.cli("align", job, "--subject", IN, "--timeout", "240", "--json"))
        self.coordinator.long_running = False

    def kill_target(self, f: Fault, rng: random.Random) -> Proc | None:
        if f.kind == "kill-worker":
            live = [p for p in self.workers() if p.alive()]
            wanted = int(f.target.split()[-1]) if f.target else 0
            return next((p for p in live if p.name.endswith(f"-{wanted}")), live[0] if live else None)
        if f.kind == "kill-coordinator":
            return self.coordinator if self.coordinator is not None and self.coordinator.alive() else None
        name = {"kill-marker": "marker", "kill-spark": "spark", "kill-faust": "faust"}[f.kind]
        proc = self.procs.get(name)
        return proc if proc is not None and proc.alive() else None

    def start_zk(self) -> None:
        assert self.info is not None
        if self.zk_proc is None:
            self.zk_proc = Proc("zookeeper", self.zk_argv, Path(self.info.workdir), cwd=Path(self.info.workdir),
                                supervised=False)
        self.zk_proc.start()

    # ---- heal and drain ------------------------------------------------------------------------

    def heal(self) -> None:
        if self.lab is not None:
            self.lab.heal()
            for clock in (self.outdir / "clock").glob("*"):
                clock.write_text("0\n")
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.paused.clear()
        if self.ensemble is not None:
            for i in range(self.ensemble.servers):
                if self.ensemble.pid(i) is None:
                    self.ensemble.start_server(i)
        elif self.zk_pid() is None:
            self.start_zk()

    led: Ledger | None = None


ZK_SETTLE = 3.0
"""Seconds a restarted ensemble server serves before the nemesis may hit ZooKeeper again (see restart-zk)."""
STOP_GRACE = 8.0
"""Seconds a run gets to unwind after the first SIGTERM, SIGINT or SIGHUP; then everything it started is
SIGKILLed and the checker exits 130, so a stop never takes more than 10 s whatever hangs."""


def _hard_stop(run: Run) -> None:
    """Runs in a timer thread once unwinding took too long."""
    for proc in list(run.procs.values()):
        if proc.popen is not None:
            signal_group(proc.popen.pid, signal.SIGKILL)
    if run.zk_proc is not None and run.zk_proc.popen is not None:
        signal_group(run.zk_proc.popen.pid, signal.SIGKILL)
    servers = run.ensemble.pids() if run.ensemble is not None else []
    for pid in (*servers, run.info.zk_pid, run.info.kafka_pid) if run.info is not None else ():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if run.lab is not None:
        with contextlib.suppress(Exception):  # the exit below must happen whatever the lab's removal meets
            run.lab.close()
    run.say(f"[red]stopped[/]: the run did not unwind within {STOP_GRACE:.0f}s of the signal; everything was killed")
    os._exit(130)


@contextlib.contextmanager
def interrupts_unwind(run: Run) -> Iterator[None]:
    """The first SIGTERM, SIGINT or SIGHUP raises, so the finally that kills every process runs, and arms a
    hard stop in case unwinding hangs; later signals change nothing (the unwinding is under way)."""
    stopping = threading.Event()

    def raise_(signum: int, _frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        timer = threading.Timer(STOP_GRACE, _hard_stop, args=(run,))
        timer.daemon = True  # a run that unwinds in time exits without waiting for it
        timer.start()
        raise Interrupted(f"signal {signum}")

    old = {s: signal.signal(s, raise_) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def run_stack(run: Run) -> Iterator[Run]:
    """The run's embedded stack (an ensemble with ``run.zk_servers`` > 1) and ledger, under the first-signal
    unwinding; every process the run started, and the stack, are stopped on every path. A previous run's
    directory is cleared first: its ZooKeeper data would outlive the embedded broker's topics (kept in
    memory), and its workers would find subjects without topics (a soak rerun in its default directory did)."""
    shutil.rmtree(run.outdir, ignore_errors=True)
    run.outdir.mkdir(parents=True, exist_ok=True)
    run.lab = NetLab().open() if run.netns else None
    stack = EmbeddedStack(workdir=run.outdir / "stack", zk_servers=run.zk_servers, netns=run.lab)
    run.ensemble = stack.ensemble
    (run.outdir / "stack").mkdir(parents=True, exist_ok=True)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        with interrupts_unwind(run):
            run.info = stack.start()
            if run.ensemble is None:
                run.zk_argv = [*stack.prefix("zookeeper"), *Path(f"/proc/{run.info.zk_pid}/cmdline").read_bytes()
                               .rstrip(b"\0").decode().split("\0")]
            run.say(f"stack: ZooKeeper {run.info.zk} (pid {run.info.zk_pid}), Kafka {run.info.kafka} "
                    f"(pid {run.info.kafka_pid}); logs in {run.outdir}")
            run.led = Ledger.connect(run.info.zk, ROOT)
            if run.spark_workers:
                run.spark = SparkCluster(run.outdir / "spark", workers=run.spark_workers, netns=run.lab)
                run.say(f"Spark standalone cluster {run.spark.start()}, {run.spark_workers} workers")
            yield run
    finally:
        if run.history is not None:
            run.history.stop()
        for proc in list(run.procs.values()):
            proc.kill()
        if run.zk_proc is not None:
            run.zk_proc.kill()
        if run.led is not None:
            with contextlib.suppress(Exception):  # a ledger that cannot close must not keep the stack up
                run.led.close()
        if run.spark is not None:
            run.spark.stop()
        stack.stop()
        if run.lab is not None:
            run.lab.close()


def execute(run: Run, drain_timeout: float = 600.0) -> dict[str, Any]:
    """Run the chain under the nemesis and return what the checker needs (raises on a broken run)."""
    with run_stack(run):
        return _play(run, drain_timeout)


def _play(run: Run, drain_timeout: float) -> dict[str, Any]:
    healing = False
    run.started = time.time()
    run.start_chain()
    from experiments.chaos.history import History

    assert run.info is not None
    run.history = History(run.info.zk, ROOT, [IN, A_OUT, B_OUT, F_OUT]).start()
    loops: list[Step] = [run.restarter(lambda: healing), run.nemesis(), run.lane(run.ops), *run.watchers]
    done: set[int] = set()

    def tick() -> None:
        for i, g in enumerate(loops):
            if i in done:
                continue
            try:
                next(g)
            except StopIteration:
                done.add(i)
        time.sleep(0.05)

    while not {1, 2} <= done:  # the nemesis and the coordinator's lane
        tick()
    nemesis_end = run.rel()
    run.say(f"{run.rel():7.1f}s  nemesis over: healing, finishing the input, draining")
    healing = True
    run.draining = True
    run.heal()
    if not run.swap_committed:
        loops.append(run.hotswap())
    deadline = time.time() + drain_timeout

    def until(cond: Callable[[], bool], what: str) -> None:
        while not cond():
            looping = [p.name for p in run.procs.values()
                       if p.long_running and sum(1 for rc in p.exits if rc not in (0, -signal.SIGKILL)) >= 3]
            if looping:
                raise RuntimeError(f"drain: {', '.join(looping)} keep exiting with errors; see their .err logs")
            if time.time() > deadline:
                raise TimeoutError(f"drain: {what} not reached in {drain_timeout:.0f}s")
            tick()

    until(lambda: len(done) == len(loops) - 1, "the coordinator's last operations")
    produced = _drain(run, until)
    retention = run.procs.get("retention")
    if retention is not None:  # the checker reads a ledger nothing removes from meanwhile (a soak's loop)
        retention.supervised = False
        retention.terminate(30)
        run.retained = run.retained or any(map(retention_removed, retention.stderr_tail(1 << 22).splitlines()))
    drained = run.rel()
    run.history.stop()
    run.say(f"{drained:7.1f}s  drained; checking every subject by epoch ({run.history.looks} looks at the ledger "
            "during the run)")
    from experiments.chaos.checker import check

    assert run.led is not None and run.info is not None
    versions = range(1, run.newest_generation() + 1)
    jobs_a = [job_a_name(g) for g in versions]
    result = check(run.led, run.info.kafka, produced, NAMES, faust=run.faust, jobs_a=jobs_a, retained=run.retained,
                   workers_a=[workers_of(g, run.rescale) for g in versions], history=run.history)
    result["history"] = run.history.as_json()
    return {"check": result, "nemesis_end": nemesis_end, "drained": drained, "checked": run.rel()}


def _drain(run: Run, until: Callable[[Callable[[], bool], str], None]) -> dict[str, Any]:
    """Stop the producer, finish the input, and wait until every job finished its output; returns what the
    producer sent and had acknowledged."""
    producer = run.procs["producer"]
    producer.signal(signal.SIGTERM)
    until(lambda: not producer.alive(), "the producer's flush")
    produced: dict[str, Any] = json.loads((run.outdir / "producer.json").read_text())
    run.say(f"{run.rel():7.1f}s  producer: sent {produced['sent']}, acked {len(produced['acked'])}")
    marker = run.procs["marker"]
    marker.supervised = False
    # A marker the nemesis just restarted is let past its start-up (its first epoch): a SIGTERM while the
    # interpreter still imports ends it by the default action (exit -15), which says nothing about the product.
    until(lambda: not marker.alive() or (marker.stdout_lines() or [""])[-1].startswith("epoch "),
          "the restarted marker's first epoch")
    if marker.terminate(30) != 0:
        run.observe("marker", f"SIGTERM: exit {marker.returncode()}", marker)
    assert run.led is not None and run.info is not None
    last_in = _finish_input(run.led, run.info.kafka)
    run.say(f"{run.rel():7.1f}s  input finished at epoch {last_in}")
    workers = run.workers()
    until(lambda: all(p.returncode() == 0 for p in workers), "job A's workers finishing subject a")
    if run.faust:
        until(lambda: any(line.startswith("finished") for line in run.procs["faust"].stdout_lines()),
              "the Faust job finishing subject f")
        run.procs["faust"].supervised = False
        run.procs["faust"].terminate(30)
    until(lambda: run.procs["spark"].returncode() == 0, "the Spark query reading every epoch of a")
    return produced


def _finish_input(led: Ledger, kafka: str) -> int | None:
    """The outside producer is done: cut one last epoch up to the stable ends and finish the subject."""
    from aligner.connectors.marker import EpochMarker

    marker = EpochMarker(led, kafka, IN).open()
    try:
        marker.mark()
        return marker.finish()
    finally:
        marker.close()
