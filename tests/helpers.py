"""Process helpers for tests: start workers, wait on their output lines, never sleep-and-hope."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aligner.stamps import Stamp, stamp_of
from experiments.common import json_value as json_value  # the tests' jobs write JSON too
from tests import guard

ROOT = Path(__file__).resolve().parent.parent
CHILD_PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
"""A child's PYTHONPATH: this checkout first, then the caller's (a worktree's source folders stay ahead of an
installed checkout's)."""
SPARK_TEST_JVM = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""The driver JVM options of every Spark test and test worker: a short-lived local driver starts seconds faster
with the C1 JIT alone and the serial GC on two shared cores; what the queries do does not depend on them."""
_PR_SET_PDEATHSIG = 1


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
             on_wait: Callable[[], None] | None = None) -> None:
    """Poll ``condition`` until it holds; raise TimeoutError naming ``what`` when ``timeout`` passes.
    ``on_wait`` runs before each pause (a check that fails the wait early, e.g. a worker that died)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if on_wait is not None:
            on_wait()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def as_args(flag: str, options: dict[str, str]) -> list[str]:
    """``options`` as repeated ``flag K=V`` arguments of a worker process (e.g. ``--sink-option``)."""
    return [arg for k, v in options.items() for arg in (flag, f"{k}={v}")]


def _die_with_parent() -> None:
    """Child pre-exec hook: its own process group (so its whole tree can be stopped together) and
    SIGKILL when the test process dies, even by SIGKILL (Linux only)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Worker:
    """A Python module run as a child process whose stdout lines can be awaited.

    Stopped on every path: ``stop()`` / ``close()`` / leaving its ``with`` block kills its whole process
    group (a Spark driver's JVM too) and reaps it; the ``spawn`` fixture does so whatever the test did.
    """

    def __init__(self, module: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH, **(env or {})}, cwd=ROOT, preexec_fn=_die_with_parent,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._threads = [threading.Thread(target=self._pump, daemon=True, name=f"{module}-{self.proc.pid}-out"),
                         threading.Thread(target=self._drain, daemon=True, name=f"{module}-{self.proc.pid}-err")]
        guard.register(self)
        for t in self._threads:
            t.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.extend(self.proc.stderr)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)[-3000:]

    def said(self, text: str) -> bool:
        """Whether ``text`` is anywhere in what the worker wrote on stderr so far."""
        return text in "".join(self._stderr)

    def wait_line(self, predicate: Callable[[str], bool], timeout: float = 120.0) -> str:
        """The first new stdout line satisfying ``predicate``; fails with the worker's stderr. ``timeout`` is
        a liveness bound: generous, since the machine may be busy."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"worker {self.args} printed no matching line in {timeout}s: {self.lines[-5:]}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)  # stays at the end for the next caller
                self.proc.wait(10)
                raise AssertionError(f"worker exited {self.proc.returncode}: {self.stderr}")
            self.lines.append(line)
            if predicate(line):
                return line

    def healthy(self) -> None:
        """Fails with the worker's stderr if it exited with an error: pass as ``on_wait`` while waiting on
        its effects, so a crash fails the wait at once instead of at its bound."""
        if self.proc.poll() not in (None, 0):
            for t in self._threads:
                t.join(5)
            raise AssertionError(f"worker {self.args} exited {self.proc.returncode}: {self.stderr}")

    def kill(self) -> None:
        """SIGKILL the worker process (a crash, for fault injection) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def wait(self, timeout: float = 180.0) -> int:
        """The exit code once the worker ends by itself (a liveness bound)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.args} still running after {timeout:.0f}s: {self.stderr}") from None

    def finish(self, timeout: float = 180.0) -> None:
        self.wait_line(lambda line: line == "done", timeout)
        assert self.wait(timeout) == 0, self.stderr

    def stop(self) -> None:
        """Kill the worker's whole process group if anything of it still runs, reap it, end the pump threads."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own group (setsid): children too
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(30)
        for t in self._threads:
            t.join(10)

    close = stop

    def owns(self, thread: threading.Thread) -> bool:
        return any(thread is t for t in self._threads)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raw_records(bootstrap: str, topic: str, partitions: int) -> list:
    """Everything the broker shows a read_committed consumer, stamps ignored (leaked attempts too)."""
    from confluent_kafka import Consumer, TopicPartition

    from aligner.connectors.kafka import consumer_config

    c = Consumer(consumer_config(bootstrap))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    eof: set[int | None] = set()
    while len(eof) < partitions:
        for m in c.consume(10000, timeout=1):
            if m.error():
                eof.add(m.partition())
            else:
                out.append(m)
    c.close()
    return out


def record_stamp(message: Any) -> Stamp:
    """The stamp of a record a sink wrote (every one carries one)."""
    raw = stamp_of(message.headers())
    assert raw is not None, "a record without a stamp"
    return Stamp.decode(raw)


def raw_count(bootstrap: str, topic: str, partitions: int) -> int:
    return len(raw_records(bootstrap, topic, partitions))


def detached_stack_down(env: dict[str, str]) -> None:
    """`aligner stack down` for a test's private ALIGNER_HOME; whatever it could not stop is killed."""
    from aligner.embedded.stack import _alive, _kill_group
    from tests.conftest import run_cli

    state = Path(env["ALIGNER_HOME"]) / "stack.json"
    pids: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(state.read_text())
        pids = [v for k, v in saved.items() if k.endswith("_pid")] + list(saved.get("zk_pids", []))
    try:
        down = run_cli(env, "stack", "down", timeout=120)
    finally:
        for pid in pids:
            if _alive(pid):
                _kill_group(pid)
    assert down.returncode == 0, down.stderr


def faust_env(stack: Any, root: str, home: str, job: str, src: str, out: str, **job_env: str) -> dict[str, str]:
    """The environment of a Faust worker of ``experiments.faust_job``: ``job_env`` keys become
    ``FAUST_JOB_{KEY}`` (interval, version, follows, output_partitions, pause ...)."""
    return {"ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root, "ALIGNER_HOME": home,
            "FAUST_JOB_ID": job, "FAUST_JOB_INPUT": src, "FAUST_JOB_OUTPUT": out,
            "FAUST_DATADIR": f"{home}-faust-{job}", **{f"FAUST_JOB_{k.upper()}": v for k, v in job_env.items()}}


def faust_worker(spawn: Any, root: str, home: str, job: str, src: str, out: str, **job_env: str) -> Worker:
    """A started Faust worker of ``experiments.faust_job`` (the adapter's ``faust_app()``), owned by ``spawn``."""
    env = faust_env(spawn.stack, root, home, job, src, out, **job_env)
    return spawn.worker("experiments.faust_job", "worker", "-l", "warn", "--without-web", env=env)


@contextlib.contextmanager
def experiment_process(module: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``python -m module args`` in a session of its own (stdout and stderr merged, text); on the way out,
    SIGTERM to its group (the experiment unwinds and stops every component it started), then SIGKILL."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=root,
                            env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
