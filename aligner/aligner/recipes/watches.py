"""Watches on epochs and nodes: how waiters learn that something changed without polling.

Idempotent per (kind, path): the session registers one kazoo watcher for each and keeps one pending
callback per waiter (:class:`aligner.zk.Watches`), so a quiet loop that re-arms on every pass holds
the same few watchers all night."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError

from aligner.errors import EpochNotCommittedError
from aligner.recipes.reads import EpochReads
from aligner.recipes.store import Store
from aligner.watches import KeptFrontier


class WatchRecipes:
    """One-shot watches (one kazoo watch per path and kind: see aligner.zk.Watches)."""

    def __init__(self, store: Store, epochs: EpochReads) -> None:
        self.store = store
        self.epochs = epochs

    def arm_watch(self, subject: str, epoch: int, fired: threading.Event | Callable[[Any], None]) -> None:
        """Set ``fired`` (or call it) when the epoch node appears or gains a contribution.

        One-shot watches; kazoo also fires them when the session is lost, so a waiter re-arms and
        re-reads after every outage. Arming again from the same waiter replaces its earlier callback."""
        path = self.store.layout.epoch(subject, epoch)
        callback = (lambda _e: fired.set()) if isinstance(fired, threading.Event) else fired
        self.store._trip("read")
        if self.store.zk.exists(path, watch=callback) is not None:
            self.store._trip("read")
            try:
                self.store.zk.get_children(path, watch=callback)
            except NoNodeError:
                callback(None)

    def frontier_watched(self, subject: str) -> int | None:
        """``frontier`` for a caller that asks far more often than epochs commit (a Spark query plans every
        10 ms while idle): kept, and read again only once a watch on the next epoch fired (it appeared or
        gained a contribution), so an idle query costs ZooKeeper nothing. Never ahead of ``frontier``."""
        with self.store._lock:
            kept = self.store._frontiers.setdefault(subject, KeptFrontier())
        if kept.current():
            return kept.epoch
        kept.moved.clear()  # before reading: a change from here on is seen at the next call
        epoch = self.epochs.frontier(subject)
        if epoch is None:
            return None  # nothing committed yet: nothing to watch from
        self.arm_watch(subject, epoch + 1, kept.wake)  # the same waiter each time: it replaces its last arming
        try:  # committed between the read and the arming: no watch fires for it
            if self.epochs.is_committed(subject, epoch + 1):
                kept.moved.set()
        except EpochNotCommittedError:
            pass
        kept.keep(epoch)
        return epoch

    def watch_node(self, path: str, callback: Callable[[Any], None]) -> bool:
        """One-shot watch on a node's existence or data; returns whether it exists now."""
        self.store._trip("read")
        return self.store.zk.exists(path, watch=callback) is not None

    def wait_committed(self, subject: str, epoch: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Block until ``epoch`` commits, woken by ZooKeeper watches rather than a timer."""
        deadline = time.monotonic() + timeout
        while True:
            fired = threading.Event()
            self.arm_watch(subject, epoch, fired)
            try:
                if self.epochs.is_committed(subject, epoch):
                    return True
            except EpochNotCommittedError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            fired.wait(min(remaining, 1.0))
