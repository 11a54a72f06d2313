"""Component processes of a chaos run: each in its own session, logged to files, killed on every path.

Everything is spawned from the main thread: ``PR_SET_PDEATHSIG`` fires when the *thread* that
forked a child ends, and it is what kills the children if the checker itself is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1


def _session_tied_to_parent() -> None:
    """Child pre-exec hook: a process group of its own (SIGKILL/SIGSTOP reach its children, such as
    the Spark driver's JVM) that receives SIGKILL when the checker dies."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to the process group of ``pid``; False when it is gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@dataclass
class Proc:
    """One supervised component: its command line, environment, logs and current process."""

    name: str
    argv: list[str]
    logdir: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    supervised: bool = True
    """Restarted by the restarter after a SIGKILL."""
    long_running: bool = True
    """Any exit but one asked for is an observation (a coordinator command may end, and fail, by itself)."""
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    paused: bool = False
    exits: list[int] = field(default_factory=list)
    """Return codes of past incarnations."""

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def start(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        out = open(self.logdir / f"{self.name}.out", "ab")  # noqa: SIM115 - handed to the child
        err = open(self.logdir / f"{self.name}.err", "ab")  # noqa: SIM115
        for f in (out, err):
            f.write(f"---- start {self.starts + 1} at {time.time():.3f}: {' '.join(self.argv)}\n".encode())
            f.flush()
        # faulthandler: a component that dies of a native crash (a marker once exited with SIGSEGV) leaves
        # every thread's Python stack in its log
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **self.env}
        self.popen = subprocess.Popen(self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                      cwd=self.cwd, preexec_fn=_session_tied_to_parent)
        out.close()
        err.close()
        self.starts += 1
        self.paused = False

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> bool:
        if not self.alive():
            return False
        assert self.popen is not None
        return signal_group(self.popen.pid, sig)

    def kill(self) -> bool:
        """SIGKILL the whole group (a paused process dies too) and reap it."""
        if not self.alive():
            return False
        self.signal(signal.SIGKILL)
        assert self.popen is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        self.paused = False
        return True

    def terminate(self, timeout: float) -> int | None:
        """SIGCONT + SIGTERM, wait up to ``timeout``; SIGKILL after. The return code, or None if it
        had to be killed."""
        if not self.alive():
            return self.returncode()
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def stderr_tail(self, chars: int = 3000) -> str:
        path = self.logdir / f"{self.name}.err"
        try:
            data = path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode(errors="replace")

    def stdout_lines(self) -> list[str]:
        try:
            return (self.logdir / f"{self.name}.out").read_text(errors="replace").splitlines()
        except OSError:
            return []


def python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
