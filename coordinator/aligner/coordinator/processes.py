"""Processes of the embedded stack's servers: finding Java and ZooKeeper, spawning a server in a session of
its own that dies with its parent, waiting on a condition, stopping a process group. Shared by the single
server stack (:mod:`aligner.coordinator.stack`) and the ensemble (:mod:`aligner.coordinator.ensemble`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from aligner.errors import StackError

ZK_CLASSPATH = ("/usr/share/java/zookeeper.jar", "/etc/zookeeper/conf")
_PR_SET_PDEATHSIG = 1


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


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise StackError("java not found: install OpenJDK (apt-get install -y default-jre-headless)")
    if not Path(ZK_CLASSPATH[0]).exists():
        raise StackError(f"{ZK_CLASSPATH[0]} missing: apt-get install -y zookeeper")
    return java


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
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
    try:
        group = os.getpgid(pid) == pid
    except OSError:
        return
    send = os.killpg if group else os.kill
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, sig)
            if sig == signal.SIGTERM:
                send(pid, signal.SIGCONT)  # a paused process acts on SIGTERM only once continued
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not _alive(pid):
                return
            time.sleep(0.05)


def _spawn(argv: list[str], workdir: Path, log: str, tie_to_parent: bool,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(workdir / log, "ab")  # noqa: SIM115 - handed to the child; appended to across restarts
    try:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent if tie_to_parent else os.setsid, cwd=workdir, env=env)
    finally:
        out.close()
