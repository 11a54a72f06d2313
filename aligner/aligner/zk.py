"""A ZooKeeper session that rides out outages: every request retried, every wait stop-aware.

Long-running components must survive ZooKeeper restarts, pauses and session expiry. kazoo fails a
request with ``ConnectionLoss`` when the connection drops and holds requests made while it
reconnects, without a deadline. :class:`RetryingClient` wraps the kazoo client the ledger layer
uses so that

- every request goes through a :class:`kazoo.retry.KazooRetry` policy that retries connection
  loss, operation timeouts and session expiry (kazoo opens a new session by itself) forever, with
  capped backoff;
- no request is sent while the session is down (it waits in the retry's backoff instead), and a
  request in flight is awaited in short slices, so setting the owner's stop event ends any wait
  within a fraction of a second with :class:`StoppedError`;
- a connection-state listener logs SUSPENDED / LOST / CONNECTED and sets Prometheus gauges;
- it is the one place a node gets its ACL: every create (plain, in a multi-op, or by ``ensure_path``)
  carries the ACL that the policy (:mod:`aligner.acl`) gives its path, and a request ZooKeeper refuses
  under its ACLs raises :class:`AccessDeniedError` naming the path and the identity.

:mod:`aligner.zk_tls` tells why a first session does not come when TLS is the reason.

A retried request may have succeeded the first time (the reply was lost). Creates and versioned
sets report that as ``NodeExistsError`` / ``BadVersionError``; callers that care compare the node
with what they wrote (the producer node carries a per-incarnation token for exactly this).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, ConnectionLoss, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import ForceRetryError, KazooRetry
from kazoo.retry import InterruptedError as RetryInterrupted

from aligner.acl_policy import AclPolicy
from aligner.errors import StoppedError
from aligner.metrics import ZK_CONNECTED, ZK_OUTAGES
from aligner.ops import VERB, Check, Create, Delete, Op, SetData
from aligner.watches import SharedWatches, Watches

log = logging.getLogger(__name__)

T = TypeVar("T")

_SLICE = 0.25
"""Seconds a request in flight is awaited before the stop event is checked again."""


class Transaction:
    """A multi-op of typed ops (:mod:`aligner.ops`) whose commit goes through the client's retry policy.

    Every create gets the ACL of its path here, so no recipe can forget it."""

    def __init__(self, client: RetryingClient, ops: Iterable[Op] = ()) -> None:
        self._client = client
        self.ops: list[Op] = list(ops)

    def create(self, path: str, value: bytes = b"") -> None:
        self.ops.append(Create(path, value))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.ops.append(SetData(path, value, version))

    def check(self, path: str, version: int) -> None:
        self.ops.append(Check(path, version))

    def delete(self, path: str, version: int = -1) -> None:
        self.ops.append(Delete(path, version))

    def _build(self) -> Any:
        t = self._client.kazoo.transaction()
        for op in self.ops:
            if isinstance(op, Create):
                t.create(op.path, op.data, acl=self._client.policy.acl(op.path))
            elif isinstance(op, SetData):
                t.set_data(op.path, op.data, op.version)
            elif isinstance(op, Check):
                t.check(op.path, op.version)
            else:
                t.delete(op.path, op.version)
        return t

    def commit(self) -> list[object]:
        """The per-op results: a failed multi-op has its failing op's exception in place (see aligner.ops)."""
        return self._checked(self._client.call(lambda: self._build().commit_async()))

    def commit_async(self) -> Any:
        """Send now; the result's ``get()`` retries the whole multi-op on connection loss."""
        return _Deferred(self._client, lambda: self._build().commit_async(), self._checked)

    def _checked(self, results: list[object]) -> list[object]:
        """A multi-op refused under the ACLs fails as a whole: raise it, naming the refused op's path."""
        for op, result in zip(self.ops, results, strict=False):
            if isinstance(result, NoAuthError):
                raise self._client.policy.denied(VERB[type(op)], op.path)
        return results


class _Deferred:
    """An async request sent at once whose ``get`` retries it through the client if it fails."""

    def __init__(self, client: RetryingClient, send: Callable[[], Any],
                 check: Callable[[Any], Any] | None = None, path: str = "", op: str = "read") -> None:
        self._client = client
        self._send = send
        self._check = check
        self._path = path
        self._op = op
        self._first: Any = send() if client.kazoo.connected else None

    def get(self) -> Any:
        first, self._first = self._first, None

        def again() -> Any:
            nonlocal first
            pending, first = (first, None) if first is not None else (self._send(), None)
            return pending

        try:
            result = self._client.call(again)
        except NoAuthError:
            raise self._client.policy.denied(self._op, self._path) from None
        return self._check(result) if self._check is not None else result


class _Denials:
    """A kazoo recipe (and its lock) whose calls report an ACL refusal as :class:`AccessDeniedError`."""

    def __init__(self, target: Any, client: RetryingClient, path: str) -> None:
        self._target = target
        self._client = client
        self._path = path

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "lock":
            return _Denials(value, self._client, self._path)
        if not callable(value):
            return value

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except NoAuthError as exc:
                raise self._client.denied(exc, "joining the election", self._path) from None

        return guarded


class RetryingClient:
    """The kazoo calls the ledger layer makes, retried through one policy and stop-aware."""

    def __init__(self, kazoo: KazooClient, stop: threading.Event | None = None,
                 policy: AclPolicy | None = None) -> None:
        self.kazoo = kazoo
        self.policy = policy or AclPolicy("/", None)
        """The identity and the grants that give every created node its ACL (none: open, as without auth)."""
        self.stop = stop or threading.Event()
        self._stops = [self.stop]
        self._retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True,
                                 interrupt=self.stopping)
        self._down_since: float | None = None
        self.watches = Watches()
        """The one-shot watches of ``get``, ``get_children`` and ``exists``: one kazoo watch per path and kind."""
        self.shared = SharedWatches(kazoo.DataWatch, kazoo.ChildrenWatch)
        """The DataWatch and ChildrenWatch recipes: one per path."""
        kazoo.add_listener(self._on_state)
        ZK_CONNECTED.set(1 if kazoo.connected else 0)
        if self.policy.auth is not None:
            self._watch_grants()

    def _watch_grants(self) -> None:
        """Keep the policy's grants current (kazoo's DataWatch re-arms after outages and new sessions)."""
        try:
            kazoo = self.kazoo
            kazoo.DataWatch(self.policy.grants_path, self.policy.on_grants)
        except NoAuthError:  # readers are restricted and this identity is none of them: it creates nothing
            self.policy.loaded.set()

    # ---- session state ------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            ZK_CONNECTED.set(1)
            if self._down_since is not None:
                log.warning("ZooKeeper session back after %.1fs", time.monotonic() - self._down_since)
            self._down_since = None
            return
        ZK_CONNECTED.set(0)
        if self._down_since is None:
            self._down_since = time.monotonic()
            ZK_OUTAGES.inc()
        if state == KazooState.LOST:
            log.warning("ZooKeeper session expired; a new session is being opened (watches are re-armed)")
        else:
            log.warning("ZooKeeper connection lost; retrying")

    def stop_on(self, event: threading.Event) -> None:
        """Also end waits when ``event`` is set (a component's own stop flag)."""
        if all(e is not event for e in self._stops):
            self._stops.append(event)

    def stopping(self) -> bool:
        return any(e.is_set() for e in self._stops)

    @property
    def connected(self) -> bool:
        return bool(self.kazoo.connected)

    # ---- requests -----------------------------------------------------------------------------

    def call(self, send: Callable[[], Any]) -> Any:
        """Send a request (``send`` returns a kazoo async result) and wait for it, retrying."""

        def attempt() -> Any:
            if self.stopping():
                raise StoppedError("stopped while waiting for ZooKeeper")
            if not self.kazoo.connected:
                raise ConnectionLoss("ZooKeeper session is down")  # retried after the policy's backoff
            pending = send()
            while True:
                try:
                    return pending.get(timeout=_SLICE)
                except KazooTimeoutError:
                    if self.stopping():
                        raise StoppedError("stopped while waiting for ZooKeeper") from None

        try:
            return self._retry.copy()(attempt)
        except RetryInterrupted:
            raise StoppedError("stopped while waiting for ZooKeeper") from None

    def retry_conflicts(self, attempt: Callable[[], T]) -> T:
        """Run a compare-and-set ``attempt`` until no other writer gets in between: kazoo's Counter recipe
        pattern. ``attempt`` reads with versions, computes and writes with those versions, raising
        ``ForceRetryError`` when a version check failed; the client's KazooRetry runs it again after
        its backoff (and also rides out connection loss), and the stop flag ends it."""
        try:
            return self._retry.copy()(attempt)
        except RetryInterrupted:
            raise StoppedError("stopped while waiting for ZooKeeper") from None

    def update(self, path: str, change: Callable[[bytes | None], bytes | None], makepath: bool = False) -> bytes | None:
        """Read-modify-write of one node: ``change`` maps its data (None: no node) to the new data, or to
        None to leave it; an absent node is created. Returns what the node holds afterwards.

        ``change`` may run more than once and must compute from what it is given: after a lost reply the
        retry finds our own write and applies ``change`` to it again, so it should be idempotent."""

        def attempt() -> bytes | None:
            try:
                data, stat = self.get(path)
            except NoNodeError:
                data, stat = None, None
            new = change(data)
            if new is None:
                return data
            try:
                if stat is None:
                    self.create(path, new, makepath=makepath)
                else:
                    self.set(path, new, version=stat.version)
            except (BadVersionError, NodeExistsError):
                raise ForceRetryError() from None  # another writer got there first: read again
            return new

        return self.retry_conflicts(attempt)

    def denied(self, exc: BaseException, op: str, path: str) -> BaseException:
        """``exc`` as the caller should see it: a NoAuth becomes one clear :class:`AccessDeniedError`."""
        return self.policy.denied(op, path) if isinstance(exc, NoAuthError) else exc

    def _guarded(self, op: str, path: str, send: Callable[[], Any]) -> Any:
        try:
            return self.call(send)
        except NoAuthError as exc:
            raise self.denied(exc, op, path) from None

    def _watched(self, kind: str, path: str, watch: Callable[..., Any] | None,
                 send: Callable[[Callable[..., Any] | None], Any]) -> Any:
        """A read that may leave a one-shot watch, through the session's :class:`Watches`."""
        if watch is None:
            return self._guarded("read", path, lambda: send(None))
        dispatch = self.watches.arm(kind, path, watch)
        try:
            return self._guarded("read", path, lambda: send(dispatch))
        except BaseException:
            self.watches.disarm(dispatch, watch)
            raise

    def sync(self, path: str = "/") -> None:
        """Bring the server this session reads from up to date with the leader (ZooKeeper's ``sync``), so the
        reads that follow see every write committed before it, whichever session or process made it.

        ZooKeeper promises a session its own writes, not other sessions': a follower serves what it has
        applied, and one cut off from its leader serves its old state until it notices (up to syncLimit
        ticks). A server that cannot reach the leader fails the sync with connection loss; the session moves
        to another server and the sync is retried there."""
        self._guarded("read", path, lambda: self.kazoo.sync_async(path))

    def get(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self._watched("data", path, watch, lambda w: self.kazoo.get_async(path, watch=w))

    def get_children(self, path: str, watch: Callable[..., Any] | None = None) -> list[str]:
        return self._watched("children", path, watch, lambda w: self.kazoo.get_children_async(path, watch=w))

    def exists(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self._watched("data", path, watch, lambda w: self.kazoo.exists_async(path, watch=w))

    def create(self, path: str, value: bytes = b"", **kwargs: Any) -> str:
        acl = self.policy.acl(path)
        if acl is None or kwargs.get("acl") is not None:
            return self._guarded("create", path, lambda: self.kazoo.create_async(path, value, **kwargs))
        if kwargs.pop("makepath", False):  # each missing parent gets the ACL of its own path
            parent = path.rsplit("/", 1)[0]
            if parent:
                self.ensure_path(parent)
        return self._guarded("create", path, lambda: self.kazoo.create_async(path, value, acl=acl, **kwargs))

    def set(self, path: str, value: bytes, version: int = -1) -> Any:
        return self._guarded("write", path, lambda: self.kazoo.set_async(path, value, version=version))

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> Any:
        if recursive:
            try:
                return self._retry.copy()(lambda: self.kazoo.delete(path, version=version, recursive=True))
            except NoAuthError as exc:
                raise self.denied(exc, "delete", path) from None
        return self._guarded("delete", path, lambda: self.kazoo.delete_async(path, version=version))

    def ensure_path(self, path: str) -> Any:
        if self.policy.acl(path) is None:
            return self._guarded("create", path, lambda: self.kazoo.ensure_path_async(path))
        # Like kazoo's ensure_path (exists first, then create from the deepest existing node down),
        # but each node gets the ACL of its own path.
        if self.exists(path) is not None:
            return True
        parent = path.rsplit("/", 1)[0]
        if parent:
            self.ensure_path(parent)
        with contextlib.suppress(NodeExistsError):
            self.create(path)
        return True

    def transaction(self, ops: Iterable[Op] = ()) -> Transaction:
        return Transaction(self, ops)

    def get_async(self, path: str) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.get_async(path), path=path)

    def exists_async(self, path: str) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.exists_async(path), path=path)

    def get_children_async(self, path: str) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.get_children_async(path), path=path)

    def set_async(self, path: str, value: bytes, version: int = -1) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.set_async(path, value, version=version), path=path, op="write")

    def get_acls(self, path: str) -> Any:
        return self._guarded("read the ACL", path, lambda: self.kazoo.get_acls_async(path))

    def set_acls_async(self, path: str, acls: list[Any]) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.set_acls_async(path, acls), path=path, op="setting the ACL")

    # ---- recipes (they keep their watches across connection loss and session expiry) ----------

    def DataWatch(self, path: str, func: Callable[[bytes | None, Any], Any]) -> None:
        """Call ``func(data, stat)`` now and after every change of the node (one recipe per path)."""
        self.shared.subscribe("data", path, func)

    def ChildrenWatch(self, path: str, func: Callable[[list[str]], Any]) -> None:
        """Call ``func(children)`` now and whenever they change (one recipe per path)."""
        self.shared.subscribe("children", path, func)

    def Election(self, path: str, identifier: str | None = None) -> Any:
        return _Denials(self.kazoo.Election(path, identifier), self, path)

    def add_listener(self, listener: Callable[[str], Any]) -> None:
        self.kazoo.add_listener(listener)

    def stop_session(self) -> None:
        self.kazoo.remove_listener(self._on_state)  # a session closed on purpose is not an outage
        self.kazoo.stop()
        self.kazoo.close()
