"""Processes of the embedded stack's servers: finding Java and ZooKeeper, spawning a server in a session of
its own that dies with its parent, waiting on a condition, stopping a process group. Shared by the single
server stack (:mod:`aligner.embedded.stack`) and the ensemble (:mod:`aligner.embedded.ensemble`)."""

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
from aligner.settings import Settings

DEBIAN_ZK_JAR = Path("/usr/share/java/zookeeper.jar")
ZK_CONF = "/etc/zookeeper/conf"
ZK_JAR_ENV = "ALIGNER_ZOOKEEPER_JAR"
"""``Settings.zookeeper_jar``'s variable: another ZooKeeper server jar for the embedded stack (e.g. a newer
Debian package's, unpacked by ``make zookeeper-next``). Its own ``zookeeper-jute*.jar`` beside it goes first
on the class path; the other libraries still come from Debian's package (the jar's manifest names them)."""
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


def zk_jar() -> Path:
    """The ZooKeeper server jar the embedded stack runs: ``$ALIGNER_ZOOKEEPER_JAR``, else Debian's."""
    return Settings().zookeeper_jar or DEBIAN_ZK_JAR


def zk_classpath() -> tuple[str, ...]:
    """The server's class path: its jute jar (when it is not Debian's own), the jar, Debian's log config."""
    jar = zk_jar()
    jute = sorted(jar.parent.glob("zookeeper-jute*.jar")) if jar != DEBIAN_ZK_JAR else []
    return (*(str(j) for j in jute[-1:]), str(jar), ZK_CONF)


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise StackError("java not found: install OpenJDK (apt-get install -y default-jre-headless)")
    jar = zk_jar()
    if not jar.exists():
        hint = f"unset {ZK_JAR_ENV} or point it at a jar" if jar != DEBIAN_ZK_JAR else "apt-get install -y zookeeper"
        raise StackError(f"{jar} missing: {hint}")
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
