"""One reader of the ledger for every viewer: ZooKeeper watches wake it, it takes a picture, and every open
page gets the same picture. Twenty pages cost ZooKeeper what one does.

A watch firing marks the picture stale; the reader takes a new one at most every ``min_gap`` seconds (an
epoch a second on a hundred subjects is one read pass a second, not a hundred), and every ``interval``
seconds anyway, since lag in seconds grows without any node changing. During an outage the reader waits on
ZooKeeper while the last picture stays up, marked with the time the connection was lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from aligner.acl import AclLedger
from aligner.coordinator.console.picture import Picture, take
from aligner.errors import AccessDeniedError, AlignerError, StoppedError
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.models import SwapNode, now_ms
from aligner.session import Reachability

log = logging.getLogger(__name__)


class Hub:
    """The console's shared state: the newest picture, its JSON, and the pages waiting for the next one."""

    def __init__(self, min_gap: float = 1.0, interval: float = 5.0) -> None:
        self.min_gap = min_gap
        self.interval = interval
        self.picture: Picture | None = None
        self.version = 0
        self.pictures = 0
        """Pictures taken: with the ledger's request count, what the console costs ZooKeeper (per picture, not
        per viewer)."""
        self.error: str | None = None
        """Why the last read failed (a malformed node, ...), shown on the page until a read succeeds."""
        self.action: dict[str, Any] | None = None
        """The last action started from a page, as :mod:`.actions` reports it."""
        self.history: dict[tuple[str, str], list[tuple[str, int]]] = {}
        """(old, new) -> the phases of its hot-swap as the watches saw them."""
        self.ledger: Ledger | None = None
        """The reader's session, once connected (lineage lookups share it)."""
        self._reach: Reachability | None = None
        self._started = now_ms()
        """Before the first session, ZooKeeper has been unreachable since the console started."""
        self._stale = threading.Event()
        self._lock = threading.Lock()
        self._json = "{}"
        self._listeners: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._watched: set[str] = set()
        self._armed: set[str] = set()
        self._picture_json = "null"

    # ---- what pages read -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The state without the picture (see :meth:`state_json` for the whole)."""
        down = self._reach.down_since if self._reach is not None else self._started
        requests = self.ledger.round_trips if self.ledger is not None else 0
        return {"version": self.version, "pictures": self.pictures,
                "zookeeper": {"connected": down is None, "down_since": down, "requests": requests},
                "error": self.error, "action": self.action}

    def state_json(self) -> str:
        """The state as one JSON text, made once per change whatever the number of pages."""
        with self._lock:
            return self._json

    def listen(self) -> asyncio.Event:
        """An event set (on the caller's loop) at every change: one per open page's stream."""
        event = asyncio.Event()
        with self._lock:
            self._listeners.add((asyncio.get_running_loop(), event))
        return event

    def unlisten(self, event: asyncio.Event) -> None:
        with self._lock:
            self._listeners = {(loop, e) for loop, e in self._listeners if e is not event}

    def publish(self) -> None:
        """Tell every page: a new picture, a connection change or an action's progress. Runs on kazoo's
        connection thread too: the picture's JSON is made once, by the reader, and only spliced in here."""
        with self._lock:
            self.version += 1
            head = json.dumps(self.state(), default=str)
            self._json = f'{head[:-1]}, "picture": {self._picture_json}}}'
            listeners = list(self._listeners)
        for loop, event in listeners:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: the console is stopping
                loop.call_soon_threadsafe(event.set)

    @property
    def connected(self) -> bool:
        return self._reach is not None and self._reach.connected

    def wake(self, *_event: object) -> None:
        """Read again now (a watch fired, or the console is stopping)."""
        self._stale.set()

    # ---- the reader ------------------------------------------------------------------------------------

    def run(self, connect: Callable[[], Ledger], stop: threading.Event) -> None:
        """Connect (waiting for ZooKeeper as long as it takes), then read whenever something changed. Whatever
        fails is said on the page and in one log line, and tried again: the reader never dies of it."""
        self.publish()  # pages opened before the first session see "connecting"
        while not stop.is_set():
            try:
                self._session(connect, stop)
            except StoppedError:
                return
            except Exception as exc:  # always on: said on the page and logged (with a traceback if unexpected)
                self._failed(exc)
                self.publish()
                self._stale.wait(self.interval)

    def _session(self, connect: Callable[[], Ledger], stop: threading.Event) -> None:
        ledger = connect()
        try:
            self.ledger = ledger
            self._reach = Reachability(ledger, self.publish)
            self.publish()
            self._read_loop(ledger, stop)
        finally:
            self._reach = None
            self._watched.clear()
            self._armed.clear()
            ledger.close()

    def _read_loop(self, ledger: Ledger, stop: threading.Event) -> None:
        jobs = ledger.jobs
        acl = AclLedger(ledger)
        while not stop.is_set():
            self._stale.clear()
            try:
                for path in (ledger.layout.subjects, ledger.layout.jobs):
                    self._arm_children(ledger, jobs, path)
                picture = take(ledger, _acl_state(acl))
                self._watch(ledger, jobs, picture)
                self.picture, self.error = picture, None
                self._picture_json = picture.model_dump_json()
                self.pictures += 1
            except StoppedError:
                raise
            except Exception as exc:  # a malformed node, a node gone mid-read: keep the last picture, say why
                self._failed(exc)
            self.publish()
            if not stop.wait(self.min_gap):
                self._stale.wait(self.interval)

    def _failed(self, exc: Exception) -> None:
        text = str(exc) if isinstance(exc, AlignerError) else f"{type(exc).__name__}: {exc}"
        if self.error != text:
            log.warning("console: the ledger could not be read: %s", text, exc_info=not isinstance(exc, AlignerError))
        self.error = text

    def _arm_children(self, ledger: Ledger, jobs: JobLedger, path: str) -> None:
        """A children watch on ``path`` once it exists (kazoo's recipe ends for good on a missing node); until
        then a one-shot watch wakes the reader when it is created."""
        if path not in self._armed and ledger.watches.watch_node(path, self.wake):
            jobs.on_children_change(path, self.wake)
            self._armed.add(path)

    def _watch(self, ledger: Ledger, jobs: JobLedger, picture: Picture) -> None:
        """Watches on what the picture shows: each subject's next epoch (one-shot, re-armed every pass), each
        job's consumers, decision and swap (kazoo's recipes, armed once)."""
        for s in picture.subjects:
            ledger.watches.arm_watch(s.name, (s.frontier if s.frontier is not None else -1) + 1, self.wake)
        for job in picture.jobs:
            if job.job in self._watched:
                continue
            jobs.watch_consumers(job.job, job.inputs, self.wake)
            jobs.on_data_change(ledger.layout.decision(job.job), self.wake)
            jobs.on_swap(job.job, self._on_swap)
            self._watched.add(job.job)
        for swap in picture.swaps:
            swap.history = list(self.history.get((swap.old, swap.new), []))

    def _on_swap(self, swap: SwapNode | None) -> None:
        if swap is not None:
            seen = self.history.setdefault((swap.old, swap.new), [])
            if not seen or seen[-1][0] != swap.phase:
                seen.append((swap.phase, swap.updated_at))
        self._stale.set()


def _acl_state(acl: AclLedger) -> dict[str, Any]:
    try:
        return acl.state()
    except AccessDeniedError:  # the grants are the admin's to read: ACLs are in force, and we are not the admin
        return {"in_force": True, "mode": "policy", "admin": None,
                "line": "in force (the grants, and so the admin's name, are readable by the admin identity only)"}
