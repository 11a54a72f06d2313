"""The ledger's low level: the retrying session, typed reads, read-modify-write and multi-ops, round trips.

Every recipe module builds on :class:`Store`; nothing above it calls kazoo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError

from aligner.epochs import CommittedEpoch
from aligner.layout import Layout
from aligner.metrics import ZK_ROUND_TRIPS
from aligner.models import M, parse
from aligner.ops import Op, failed_with, raise_failure
from aligner.zk import RetryingClient

CACHED_EPOCHS = 20_000
"""Committed epochs a ledger keeps in memory (about 1 KB each): the least recently read go first."""


class Store:
    """Typed access to ZooKeeper nodes through one retrying client; counts its round trips."""

    def __init__(self, zk: KazooClient | RetryingClient, layout: Layout | None = None,
                 stop: threading.Event | None = None) -> None:
        self.zk = zk if isinstance(zk, RetryingClient) else RetryingClient(zk, stop)
        self.layout = layout or Layout()
        self.round_trips = 0
        self._committed: LRUCache[tuple[str, int], CommittedEpoch] = LRUCache(CACHED_EPOCHS)
        """Committed epochs never change, so readers keep them; bounded, so a reader that runs for days
        keeps the epochs it still reads, not every epoch it ever read."""
        self._lock = threading.Lock()

    @property
    def stop(self) -> threading.Event:
        """Set it to make every pending and later ZooKeeper wait raise :class:`StoppedError`."""
        return self.zk.stop

    def stop_on(self, event: threading.Event) -> None:
        """Also end ZooKeeper waits when ``event`` is set (the stop flag of the component using it)."""
        self.zk.stop_on(event)

    def stopping(self) -> bool:
        return self.zk.stopping()

    def close(self) -> None:
        self.zk.stop_session()

    def cached(self, subject: str, epoch: int) -> CommittedEpoch | None:
        with self._lock:
            return self._committed.get((subject, epoch))

    def cache(self, subject: str, epoch: int, committed: CommittedEpoch) -> None:
        with self._lock:
            self._committed[(subject, epoch)] = committed

    def _trip(self, kind: str) -> None:
        with self._lock:
            self.round_trips += 1
        ZK_ROUND_TRIPS.labels(kind).inc()

    def read(self, model: type[M], path: str) -> tuple[M, int]:
        """Read and validate a node; ``NoNodeError`` propagates for the caller to name."""
        self._trip("read")
        raw, stat = self.zk.get(path)
        return parse(model, path, raw), stat.version

    def read_optional(self, model: type[M], path: str) -> tuple[M | None, int]:
        """(node, version); (None, version) for a node created empty (a placeholder); (None, -1) for none."""
        self._trip("read")
        try:
            raw, stat = self.zk.get(path)
        except NoNodeError:
            return None, -1
        return (parse(model, path, raw) if raw else None), stat.version

    def update(self, model: type[M], path: str, change: Callable[[M | None], M | None],
               makepath: bool = False) -> M | None:
        """Typed read-modify-write of one node (``RetryingClient.update``): ``change`` gets the node (None
        when absent) and returns the new one, or None to leave it; returns the node as it stands after."""

        def on_bytes(raw: bytes | None) -> bytes | None:
            new = change(parse(model, path, raw) if raw else None)
            return None if new is None else new.dump()

        self._trip("write")
        after = self.zk.update(path, on_bytes, makepath)
        return parse(model, path, after) if after else None

    def _children(self, path: str) -> list[str]:
        self._trip("read")
        return self.zk.get_children(path)

    def multi(self, *ops: Op) -> list[object]:
        """One multi-op round trip; a failed op comes back as its exception (read with aligner.ops)."""
        return self._multi(*ops)

    def _multi(self, *ops: Op) -> list[object]:
        """The executor behind ``multi`` (tests/test_stamped.py wraps it to record a commit's ops)."""
        self._trip("multi")
        return self.zk.transaction(ops).commit()

    def multi_cas(self, *ops: Op) -> list[object]:
        """A multi-op inside ``RetryingClient.retry_conflicts``: when one of its version checks or
        create-if-absent ops lost to another writer (or to our own retried write whose reply was lost),
        ask for a fresh read; any other failure is raised."""
        results = self._multi(*ops)
        if failed_with(results, BadVersionError, NodeExistsError):
            raise ForceRetryError()
        raise_failure(results)
        return results

    def multi_async(self, *ops: Op) -> Any:
        """Like ``multi`` but returns at once; ``.get()`` gives the results."""
        self._trip("multi")
        return self.zk.transaction(ops).commit_async()
