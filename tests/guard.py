"""Leak guard of the test suite: which threads and child processes outlive their test, and stopping them.

A test that leaves a thread or a process behind can hang pytest at exit (a non-daemon thread is joined
forever) or keep hammering the stack after it is gone. The conftest hooks compare snapshots taken here
before and after every test and at the end of the session, name what leaked, stop it and fail loudly.

Objects that own a thread or a process (``tests.streams.Generator``, ``JobThread``, ``tests.helpers.Worker``)
register here, so a leaked thread is stopped through its owner's ``close()`` rather than just reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Stoppable(Protocol):
    def close(self) -> None: ...

    def owns(self, thread: threading.Thread) -> bool: ...


_owners: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()


def register(owner: Stoppable) -> None:
    """Remember an object that owns threads or processes, so the guard can stop it by its own means."""
    with _lock:
        _owners.add(owner)


def owner_of(thread: threading.Thread) -> Stoppable | None:
    with _lock:
        owners = list(_owners)
    return next((o for o in owners if o.owns(thread)), None)


# ---- child processes (from /proc: Linux, like every machine this suite runs on) ----------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int
    """Start time in clock ticks since boot: with ``pid``, names a process even after pid reuse."""
    cmdline: str

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start

    def __str__(self) -> str:
        return f"pid {self.pid} (pgid {self.pgid}): {self.cmdline[:200]}"


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or f"[{pid}]"
    except OSError:
        return f"[{pid}]"


def descendants(root: int | None = None) -> dict[tuple[int, int], Proc]:
    """Every live (non-zombie) descendant of ``root`` (this process by default), by (pid, start time)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[tuple[int, tuple[str, int, int, int]]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[1], []).append((int(name), st))
    out: dict[tuple[int, int], Proc] = {}
    todo = [root]
    while todo:
        for pid, (state, ppid, pgid, start) in children.get(todo.pop(), []):
            todo.append(pid)
            if state != "Z":
                proc = Proc(pid, ppid, pgid, start, _cmdline(pid))
                out[proc.key] = proc
    return out


def alive(proc: Proc) -> bool:
    st = _stat(proc.pid)
    return st is not None and st[0] != "Z" and st[3] == proc.start


def _reap(procs: list[Proc]) -> None:
    """Collect the exit of those killed processes that are our children, so they do not linger as zombies.
    Only these: waiting on any child would steal exit codes that a test's ``Popen`` objects wait for."""
    me = os.getpid()
    for p in procs:
        if p.ppid == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)


def kill(procs: list[Proc], grace: float = 5.0) -> list[Proc]:
    """SIGTERM each process, its process group when it leads its own, and everything below it; SIGKILL
    what is left after ``grace`` seconds. Returns the processes still alive after that (should be none)."""
    own_group = os.getpgid(0)
    targets = {p.key: p for p in procs}
    for p in procs:
        targets.update(descendants(p.pid))
    groups = {p.pgid for p in procs if p.pgid == p.pid and p.pgid != own_group}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for p in targets.values():
            if alive(p):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(list(targets.values()))
            if not any(alive(p) for p in targets.values()):
                return []
            time.sleep(0.05)
    return [p for p in targets.values() if alive(p)]


# ---- threads -----------------------------------------------------------------------------------------


def threads() -> dict[int, threading.Thread]:
    """Live threads other than the current one, by identity (idents are reused once threads end)."""
    me = threading.current_thread()
    return {id(t): t for t in threading.enumerate() if t is not me and t.is_alive()}


LONG_LIVED = ("py4j.",)
"""Modules whose daemon threads serve a client that lives longer than a test: PySpark's gateway starts its
callback server threads on first use and keeps them until the session fixture stops the gateway."""


def long_lived(thread: threading.Thread) -> bool:
    """A daemon thread of a client that outlives tests by design (checked at session end, not per test)."""
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) or type(getattr(target, "__self__", None)).__module__
    return thread.daemon and module.startswith(LONG_LIVED)


def describe(thread: threading.Thread) -> str:
    """Name, kind and where the thread is now (its innermost frames)."""
    kind = "daemon" if thread.daemon else "NON-DAEMON"
    frame = sys._current_frames().get(thread.ident or -1)
    where = ""
    if frame is not None:
        stack = traceback.extract_stack(frame)[-4:]
        where = " at " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(stack))
    return f"thread {thread.name!r} ({kind}){where}"


def stop_threads(leaked: list[threading.Thread], timeout: float = 15.0) -> list[threading.Thread]:
    """Stop leaked threads through their registered owners (stop flags, closed clients); returns the threads
    still alive after ``timeout`` (nothing can stop a thread from outside: those are reported only)."""
    owned = [t for t in leaked if owner_of(t) is not None]
    for owner in {id(o): o for o in filter(None, map(owner_of, owned))}.values():
        with contextlib.suppress(Exception):
            owner.close()
    deadline = time.monotonic() + timeout
    for t in owned:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in leaked if t.is_alive()]


@dataclass
class Snapshot:
    """What ran before some point: threads and child processes."""

    threads: dict[int, threading.Thread]
    procs: dict[tuple[int, int], Proc]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(threads(), descendants())

    def absorb(self, other: Snapshot) -> None:
        """Count what ``other`` holds as existing before (resources of wider-scoped fixtures)."""
        self.threads.update(other.threads)
        self.procs.update(other.procs)

    def new_since(self, ignore: Snapshot | None = None) -> tuple[list[threading.Thread], list[Proc]]:
        """Threads and processes alive now that this snapshot (and ``ignore``) did not hold."""
        skip_t = {**self.threads, **(ignore.threads if ignore else {})}
        skip_p = {**self.procs, **(ignore.procs if ignore else {})}
        procs = descendants()
        by_pid = {p.pid: p for p in procs.values()}

        def known(p: Proc) -> bool:
            """Held before, or started by a process held before (a Spark JVM's Python workers)."""
            while p is not None:
                if p.key in skip_p:
                    return True
                p = by_pid.get(p.ppid)  # type: ignore[assignment]
            return False

        return ([t for k, t in threads().items() if k not in skip_t],
                [p for p in procs.values() if not known(p)])

    def settle(self, ignore: Snapshot | None, grace: float,
               skip: Callable[[threading.Thread], bool] = lambda t: False) -> tuple[list[threading.Thread], list[Proc]]:
        """Like :meth:`new_since` (less threads ``skip`` accepts), after giving threads and processes that are
        ending ``grace`` seconds to end."""
        deadline = time.monotonic() + grace
        while True:
            leaked_t, leaked_p = self.new_since(ignore)
            leaked_t = [t for t in leaked_t if not skip(t)]
            if (not leaked_t and not leaked_p) or time.monotonic() >= deadline:
                return leaked_t, leaked_p
            time.sleep(0.05)


def stop_all(leaked_t: list[threading.Thread], leaked_p: list[Proc]) -> list[str]:
    """Name the leaked threads and processes, stop them, and say how that went (one line each)."""
    lines = [f"leaked {describe(t)}" for t in leaked_t] + [f"leaked process {p}" for p in leaked_p]
    for p in kill(leaked_p):
        lines.append(f"could not stop process {p}")
    for t in stop_threads(leaked_t):
        lines.append(f"could not stop {describe(t)}")
    return lines
