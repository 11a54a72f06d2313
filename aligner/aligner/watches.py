"""The watches of one ZooKeeper session: one kazoo watch per path, however many waiters arm it.

kazoo keeps every one-shot watch callback it is given until the node changes, and every DataWatch or
ChildrenWatch recipe registers a watcher of its own; a waiter that re-arms with a fresh lambda on every
pass of a quiet loop (a Spark planner asked every half second, a wait re-armed every second) piles up
callbacks all night. :class:`Watches` gives each (kind, path) one kazoo watcher and each waiter one
pending callback; :class:`SharedWatches` gives each path one recipe whose changes every subscriber gets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger(__name__)


def _identity(value: object) -> object:
    return value if isinstance(value, (str, int, float, bytes, type(None))) else id(value)


def _waiter(callback: Callable[..., Any]) -> Hashable:
    """Who is waiting, so that a waiter that arms again replaces its earlier callback instead of adding one.

    A plain function or callable object is itself. A lambda or bound method is its thread, its code and
    what it closes over or is bound to, except the :class:`threading.Event` it sets: a loop that arms
    ``lambda _e: woken.set()`` with a fresh event on every pass is one waiter whose last wait ended."""
    func = getattr(callback, "__func__", callback)
    code = getattr(func, "__code__", None)
    if code is None or not (getattr(func, "__closure__", None) or hasattr(callback, "__self__")
                            or func.__name__ == "<lambda>"):
        return callback
    bound = getattr(callback, "__self__", None)
    held = [bound, *(_contents(c) for c in func.__closure__ or ())]
    return (threading.get_ident(), code, tuple(_identity(v) for v in held if not isinstance(v, threading.Event)))


def _contents(cell: Any) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # a variable the closure names but that was never assigned
        return None


class _Dispatch:
    """The one kazoo watcher of a (kind, path): kazoo keeps a set of watchers per path, so passing the
    same object on every request leaves exactly one there, which fans its event out to every waiter."""

    def __init__(self, hub: Watches, key: tuple[str, str]) -> None:
        self.hub = hub
        self.key = key
        self.waiters: dict[Hashable, Callable[[Any], object]] = {}

    def __call__(self, event: Any) -> None:
        for callback in self.hub.fired(self):
            try:
                callback(event)
            except Exception:  # one waiter's bug must not starve the others of the event
                log.exception("watch callback on %s failed", self.key[1])


class Watches:
    """One kazoo watch per (kind, path) for the one-shot watches of a session, however often waiters arm.

    kazoo keeps every callback it is given until the node changes, so a waiter that re-arms with a fresh
    lambda on every pass of a quiet loop (a planner asked every half second, a wait re-armed every
    second) piles up callbacks all night. Here each (kind, path) has one dispatcher registered with kazoo,
    and each waiter (see :func:`_waiter`) one pending callback, replaced when it arms again."""

    def __init__(self) -> None:
        self._armed: dict[tuple[str, str], _Dispatch] = {}
        self._lock = threading.Lock()

    def arm(self, kind: str, path: str, callback: Callable[[Any], object]) -> _Dispatch:
        with self._lock:
            dispatch = self._armed.get((kind, path))
            if dispatch is None:
                dispatch = self._armed[(kind, path)] = _Dispatch(self, (kind, path))
            dispatch.waiters[_waiter(callback)] = callback
            return dispatch

    def disarm(self, dispatch: _Dispatch, callback: Callable[[Any], object]) -> None:
        """The request that set the watch failed (kazoo registered nothing): forget the callback."""
        with self._lock:
            key = _waiter(callback)
            if dispatch.waiters.get(key) is callback:
                del dispatch.waiters[key]
            if not dispatch.waiters and self._armed.get(dispatch.key) is dispatch:
                del self._armed[dispatch.key]

    def fired(self, dispatch: _Dispatch) -> list[Callable[[Any], object]]:
        with self._lock:
            if self._armed.get(dispatch.key) is dispatch:
                del self._armed[dispatch.key]
            waiters, dispatch.waiters = list(dispatch.waiters.values()), {}
        return waiters

    def pending(self) -> int:
        """Callbacks waiting for an event (a bound of what a quiet session holds)."""
        with self._lock:
            return sum(len(d.waiters) for d in self._armed.values())


class _Recipe:
    """One kazoo watch recipe on a path; every subscriber gets each change, in order, and a late
    subscriber first gets the last change the recipe saw (as a recipe of its own would read it)."""

    def __init__(self) -> None:
        self.subscribers: list[Callable[..., Any]] = []
        self.last: tuple[Any, ...] | None = None
        self.lock = threading.RLock()
        """Held while delivering, so no subscriber sees an older change after a newer one."""

    def data(self, data: bytes | None, stat: Any, _event: Any = None) -> None:
        self._deliver((data, stat))

    def children(self, children: list[str]) -> None:
        self._deliver((children,))

    def _deliver(self, args: tuple[Any, ...]) -> None:
        with self.lock:
            self.last = args
            for func in list(self.subscribers):
                _call(func, args)

    def add(self, func: Callable[..., Any]) -> None:
        with self.lock:
            if func in self.subscribers:
                return
            self.subscribers.append(func)
            if self.last is not None:
                _call(func, self.last)


def _call(func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        func(*args)
    except Exception:  # one subscriber's bug must not starve the others of the change
        log.exception("watch subscriber %r failed", func)


class SharedWatches:
    """One DataWatch and one ChildrenWatch recipe per path for a session (kazoo's recipes re-arm after
    a connection loss and on a new session); subscribers are called with ``(data, stat)`` or ``(children,)``.
    A subscriber stays for the session's lifetime; the same callable subscribed twice is called once."""

    def __init__(self, data_watch: Callable[[str, Callable[..., Any]], Any],
                 children_watch: Callable[[str, Callable[..., Any]], Any]) -> None:
        self._make = {"data": data_watch, "children": children_watch}
        self._recipes: dict[tuple[str, str], _Recipe] = {}
        self._lock = threading.Lock()

    def subscribe(self, kind: str, path: str, func: Callable[..., Any]) -> None:
        with self._lock:
            recipe = self._recipes.get((kind, path))
            created = recipe is None
            if recipe is None:
                recipe = self._recipes[(kind, path)] = _Recipe()
        recipe.add(func)
        if created:
            try:
                self._make[kind](path, recipe.data if kind == "data" else recipe.children)
            except BaseException:
                with self._lock:
                    self._recipes.pop((kind, path), None)
                raise

    def recipes(self) -> int:
        with self._lock:
            return len(self._recipes)


FRONTIER_REREAD = 5.0
"""Seconds after which ``frontier_watched`` reads the frontier again though no watch fired: how stale a
watch lost in some way nobody foresaw could leave it, at one read per subject every few seconds."""


class KeptFrontier:
    """A subject's frontier as last read, and whether its next epoch changed since (the watch's waiter: a
    bound method of its own, so no other waiter in the thread replaces it: see _waiter)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.read_at = 0.0
        self.moved = threading.Event()

    def keep(self, epoch: int) -> None:
        self.epoch, self.read_at = epoch, time.monotonic()

    def wake(self, _event: Any) -> None:
        self.moved.set()

    def current(self) -> bool:
        return (self.epoch is not None and not self.moved.is_set()
                and time.monotonic() - self.read_at < FRONTIER_REREAD)
