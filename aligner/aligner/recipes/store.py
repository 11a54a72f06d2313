"""The ledger's low level: the retrying session, typed reads, read-modify-write and multi-ops, round trips.

Every recipe module builds on :class:`Store`; nothing above it calls kazoo.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from cachetools import LRUCache
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError

from aligner.epochs import CommittedEpoch
from aligner.errors import MalformedNodeError
from aligner.layout import BUCKET, Layout
from aligner.metrics import ZK_ROUND_TRIPS
from aligner.models import M, WritersNode, parse
from aligner.ops import Op, failed_with, raise_failure
from aligner.watches import KeptFrontier
from aligner.zk import RetryingClient

T = TypeVar("T")

CACHED_EPOCHS = 20_000
"""Committed epochs a ledger keeps in memory (about 1 KB each): the least recently read go first."""
KNOWN_BUCKETS = 256
"""Buckets of numbered nodes a ledger remembers having made or found (one round trip per new bucket)."""


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
        self._buckets: LRUCache[str, bool] = LRUCache(KNOWN_BUCKETS)
        self._writers_seen: dict[str, WritersNode | None] = {}
        """Subjects' writers nodes as their DataWatches last saw them (EpochReads.finished_watched)."""
        self._frontiers: dict[str, KeptFrontier] = {}
        """Subjects' frontiers as WatchRecipes.frontier_watched last read them."""
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

    def sync(self) -> None:
        """Make the reads that follow see every write committed before this call, by any session
        (:meth:`aligner.zk.RetryingClient.sync`): for a decision taken in one process from what another one
        wrote, such as a Spark micro-batch planned in one Python worker after the previous one was
        committed in another."""
        self._trip("sync")
        self.zk.sync(self.layout.root)

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

    @staticmethod
    def read_registered(read: Callable[[], T], owner: Callable[[], object], missing: Callable[[], Exception]) -> T:
        """``read`` of a node that its owner's registration makes (a job's or a subject's, one multi-op each).
        On a missing node ``owner()`` raises when the owner is unknown; a known owner was read after the node,
        so it may have been registered between the two: read again, and only then raise ``missing()``."""
        try:
            return read()
        except NoNodeError:
            owner()
        try:
            return read()
        except NoNodeError:
            raise missing() from None

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

    # ---- numbered nodes in buckets (aligner.layout.BUCKET) -----------------------------------------

    def buckets(self, base: str) -> list[tuple[int, str]]:
        """(first number, name) of every bucket under ``base``, in order; NoNodeError when ``base`` is missing."""
        out = []
        for name in self._children(base):
            if not name.isdigit() or int(name) % BUCKET:
                raise MalformedNodeError(f"{base}/{name}", f"not a bucket of {BUCKET:,} numbered nodes (a ledger "
                                         "written before numbered nodes were bucketed needs a new root)")
            out.append((int(name), name))
        return sorted(out)

    def numbers(self, base: str, since: int | None = None) -> list[int]:
        """The numbers of the nodes under ``base``'s buckets, in order (with ``since``, only buckets that may
        hold numbers from ``since`` on); one listing per bucket, pipelined. NoNodeError when ``base`` is missing."""
        wanted = [name for start, name in self.buckets(base) if since is None or start + BUCKET > since]
        if not wanted:
            return []
        self._trip("read")
        sent = [(f"{base}/{name}", self.zk.get_children_async(f"{base}/{name}")) for name in wanted]
        out: list[int] = []
        for path, req in sent:
            try:
                out += _numbers_of(path, req.get())
            except NoNodeError:  # retention removed the bucket meanwhile
                continue
        return sorted(out)

    def numbers_from_last(self, base: str) -> Iterable[list[int]]:
        """The numbers under ``base`` bucket by bucket, the newest bucket first, each in order, listed as the
        caller goes (a caller after the last few numbers reads one bucket, not the whole history)."""
        return _LazyBuckets(self, base, [name for _, name in reversed(self.buckets(base))])

    def count(self, base: str) -> int:
        """How many numbered nodes ``base`` holds, from its buckets' child counts (no listing of numbers)."""
        names = [name for _, name in self.buckets(base)]
        if not names:
            return 0
        self._trip("read")
        sent = [self.zk.exists_async(f"{base}/{name}") for name in names]
        return sum(stat.numChildren for stat in (req.get() for req in sent) if stat is not None)

    def tree_size(self, path: str) -> int:
        """Nodes in the subtree at ``path``, itself included (what a ledger costs ZooKeeper), listed level by
        level with pipelined reads."""
        total, level = 0, [path]
        while level:
            total += len(level)
            self._trip("read")
            sent = [(p, self.zk.get_children_async(p)) for p in level]
            level = [f"{p}/{c}" for p, req in sent for c in req.get()]
        return total

    def first_number(self, base: str) -> int | None:
        """The lowest number under ``base`` (None: none), from its first non-empty bucket."""
        for _, name in self.buckets(base):
            numbers = self.bucket_numbers(base, name)
            if numbers:
                return numbers[0]
        return None

    def bucket_numbers(self, base: str, name: str) -> list[int]:
        path = f"{base}/{name}"
        try:
            return sorted(_numbers_of(path, self._children(path)))
        except NoNodeError:
            return []

    def ensure_bucket(self, path: str) -> None:
        """Make the bucket the numbered node at ``path`` goes in, once per bucket and process (remembered);
        NoNodeError when the bucket's own parent is missing."""
        bucket = path.rsplit("/", 1)[0]
        with self._lock:
            if bucket in self._buckets:
                return
        # Look before creating: a bucket usually exists already, and a create is checked against the parent's
        # ACL before existence, so a client without write rights would be refused on the bucket, not on the
        # node it writes (tests/ledger/test_acl.py names that node).
        self._trip("read")
        if self.zk.exists(bucket) is None:
            self._trip("write")
            with contextlib.suppress(NodeExistsError):
                self.zk.create(bucket)
        with self._lock:
            self._buckets[bucket] = True

    def multi(self, *ops: Op) -> list[object]:
        """One multi-op round trip; a failed op comes back as its exception (read with aligner.ops)."""
        self._trip("multi")
        return self.zk.transaction(ops).commit()

    def multi_cas(self, *ops: Op) -> list[object]:
        """A multi-op inside ``RetryingClient.retry_conflicts``: when one of its version checks or
        create-if-absent ops lost to another writer (or to our own retried write whose reply was lost),
        ask for a fresh read; any other failure is raised."""
        results = self.multi(*ops)
        if failed_with(results, BadVersionError, NodeExistsError):
            raise ForceRetryError()
        raise_failure(results)
        return results

    def multi_async(self, *ops: Op) -> Any:
        """Like ``multi`` but returns at once; ``.get()`` gives the results."""
        self._trip("multi")
        return self.zk.transaction(ops).commit_async()


def _numbers_of(path: str, names: list[str]) -> list[int]:
    bad = next((n for n in names if not n.isdigit()), None)
    if bad is not None:
        raise MalformedNodeError(f"{path}/{bad}", "the name of a numbered node is not a number")
    return [int(n) for n in names]


class _LazyBuckets:
    """The buckets of :meth:`Store.numbers_from_last`, each listed when the iteration reaches it."""

    def __init__(self, store: Store, base: str, names: list[str]) -> None:
        self.store, self.base, self.names = store, base, names

    def __iter__(self) -> Iterator[list[int]]:
        for name in self.names:
            yield self.store.bucket_numbers(self.base, name)
