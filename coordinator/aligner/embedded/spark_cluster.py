"""A Spark standalone cluster and a Spark Connect server on loopback, from pyspark's own jars.

The shape users deploy, small: a master and N workers started with ``spark-class`` (each worker launches
its own executor JVMs, and they their Python workers), and a Connect server started with ``spark-submit``.
Used by the tests, the demo and the chaos checker to prove the protocol where tasks run in other
processes than the driver; faults are SIGKILLs of those processes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aligner.embedded.processes import _alive, _kill_group, _spawn, free_port, wait_for
from aligner.errors import StackError

if TYPE_CHECKING:
    from aligner.embedded.netns import NetLab

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """pyspark's install directory: its ``bin/spark-class`` and ``jars/`` are a complete Spark."""
    spec = importlib.util.find_spec("pyspark")  # located, not imported: the coordinator runs without engines
    if spec is None or spec.origin is None:
        raise StackError("pyspark is not installed: pip install 'epoch-aligner[spark]'")
    return Path(spec.origin).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env |= {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
    return env


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def executor_of(pid: int) -> int | None:
    """The executor JVM a process (a Python worker of a task) runs under: the nearest such ancestor."""
    while pid > 1:
        if EXECUTOR_CLASS in _cmdline(pid):
            return pid
        pid = _parent(pid)
    return None


class SparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores each, in ``workdir``."""

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                 tie_to_parent: bool = True, netns: NetLab | None = None) -> None:
        """``netns``: the master (``spark-master``) and each worker (``spark-w1``, ...) in a network namespace
        of its own of that lab; executors run in their worker's."""
        self.workdir = Path(workdir).resolve()  # processes run in it: paths handed to them must be absolute
        self.workers, self.cores, self.memory = workers, cores, memory
        self.tie_to_parent = tie_to_parent
        self.netns = netns
        self.port, self.ui_port = free_port(), free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def master_host(self) -> str:
        return self.netns.ip("spark-master") if self.netns is not None else "127.0.0.1"

    def _prefix(self, name: str) -> list[str]:
        return self.netns.prefix(name) if self.netns is not None else []

    @property
    def url(self) -> str:
        return f"spark://{self.master_host}:{self.port}"

    def _class(self, cls: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), cls, *args]

    def start(self, timeout: float = 180.0) -> str:
        """Start the master and every worker; returns the master URL once all workers registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            host = self.master_host
            self._master = _spawn([*self._prefix("spark-master"), *self._class(
                "org.apache.spark.deploy.master.Master", "--host", host, "--port", str(self.port),
                "--webui-port", str(self.ui_port))], self.workdir, "master.log", self.tie_to_parent,
                _env() | {"SPARK_LOCAL_IP": host})
            for i in range(self.workers):
                self.start_worker(i)
            self.wait_workers(self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def start_worker(self, i: int) -> None:
        if self.worker_pid(i) is not None:
            raise StackError(f"Spark worker {i + 1} is still running (pid {self.worker_pid(i)})")
        work = self.workdir / f"worker-{i + 1}"
        work.mkdir(exist_ok=True)
        host = self.host(i)
        self._workers[i] = _spawn([*self._prefix(f"spark-w{i + 1}"), *self._class(
                                  "org.apache.spark.deploy.worker.Worker", "--host", host,
                                  "--cores", str(self.cores), "--memory", self.memory,
                                  "--webui-port", str(free_port()), "--work-dir", str(work), self.url)],
                                  self.workdir, f"worker-{i + 1}.log", self.tie_to_parent,
                                  _env() | {"SPARK_LOCAL_IP": host})

    def host(self, i: int) -> str:
        """Worker ``i``'s own address (loopback, or its namespace's): Spark treats each as a host of its own
        (a speculative copy of a task, for one, never runs on a host that already runs the task)."""
        return self.netns.ip(f"spark-w{i + 1}") if self.netns is not None else f"127.0.0.{i + 2}"

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, their state, applications."""
        with urllib.request.urlopen(f"http://{self.master_host}:{self.ui_port}/json/", timeout=5) as reply:
            return dict(json.load(reply))

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def wait_workers(self, n: int, timeout: float) -> None:
        def ready() -> bool:
            if self._master is None or self._master.poll() is not None:
                raise StackError(f"the Spark master exited; see {self.workdir / 'master.log'}")
            return self.alive_workers() >= n

        wait_for(ready, timeout, f"{n} Spark workers to register with {self.url}", interval=0.2)

    def worker_pid(self, i: int) -> int | None:
        proc = self._workers.get(i)
        return proc.pid if proc is not None and proc.poll() is None else None

    def executors(self) -> list[int]:
        """Every live executor JVM of the cluster (each worker launches its own)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and EXECUTOR_CLASS in _cmdline(int(entry.name)):
                pid = int(entry.name)
                parent = _parent(pid)
                if parent in {p.pid for p in self._workers.values()} and _alive(pid):
                    out.append(pid)
        return sorted(out)

    def worker_of(self, executor: int | None) -> int | None:
        """Index of the worker that launched executor JVM ``executor``."""
        parent = _parent(executor) if executor else 0
        return next((i for i in range(self.workers) if parent and self.worker_pid(i) == parent), None)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``'s JVM; its executors notice their worker is gone and exit."""
        proc = self._workers.get(i)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        """Stop the master, the workers and everything they started (executor JVMs, their Python workers):
        each worker's process group is killed and waited for until it is empty, not just its leader."""
        for proc in [*self._workers.values(), *([self._master] if self._master else [])]:
            _kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):  # the group is killed below anyway
                proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # executors still exiting after their worker
            with contextlib.suppress(TimeoutError):
                wait_for(functools.partial(_group_gone, proc.pid), 15, f"process group {proc.pid} to end")
        self._workers.clear()
        self._master = None


def _group_gone(pgid: int) -> bool:
    """Whether no live process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return False
    return True


class ConnectServer:
    """A Spark Connect server (``spark-submit --class SparkConnectServer``) on a loopback port."""

    def __init__(self, workdir: Path, master: str = "local[2]", tie_to_parent: bool = True,
                 conf: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.master = master
        self.port = free_port()
        self.tie_to_parent = tie_to_parent
        self.conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                     "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.connect.grpc.binding.address": "127.0.0.1",
                     "spark.connect.grpc.binding.port": str(self.port), **(conf or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 180.0) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [str(spark_home() / "bin" / "spark-submit"), "--class", CONNECT_CLASS, "--name", "aligner-connect",
                "--master", self.master]
        for key, value in self.conf.items():
            argv += ["--conf", f"{key}={value}"]
        self._proc = _spawn([*argv, "spark-internal"], self.workdir, "connect.log", self.tie_to_parent, _env())

        def serving() -> bool:
            if self._proc is None or self._proc.poll() is not None:
                raise StackError(f"the Spark Connect server exited; see {self.workdir / 'connect.log'}")
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        try:
            wait_for(serving, timeout, f"the Spark Connect server on port {self.port}", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):  # killed: reaped by whoever waits last
                self._proc.wait(timeout=5)
            self._proc = None
