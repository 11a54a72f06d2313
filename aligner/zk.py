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
- a connection-state listener logs SUSPENDED / LOST / CONNECTED and sets Prometheus gauges.

A retried request may have succeeded the first time (the reply was lost). Creates and versioned
sets report that as ``NodeExistsError`` / ``BadVersionError``; callers that care compare the node
with what they wrote (the producer node carries a per-incarnation token for exactly this).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import InterruptedError as RetryInterrupted
from kazoo.retry import KazooRetry

from aligner.errors import StoppedError
from aligner.metrics import ZK_CONNECTED, ZK_OUTAGES

log = logging.getLogger("aligner.zk")

_SLICE = 0.25
"""Seconds a request in flight is awaited before the stop event is checked again."""


class Transaction:
    """A kazoo multi-op whose commit goes through the client's retry policy."""

    def __init__(self, client: RetryingClient) -> None:
        self._client = client
        self._ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def create(self, *args: Any, **kwargs: Any) -> None:
        self._ops.append(("create", args, kwargs))

    def set_data(self, *args: Any, **kwargs: Any) -> None:
        self._ops.append(("set_data", args, kwargs))

    def check(self, *args: Any, **kwargs: Any) -> None:
        self._ops.append(("check", args, kwargs))

    def delete(self, *args: Any, **kwargs: Any) -> None:
        self._ops.append(("delete", args, kwargs))

    def _build(self) -> Any:
        t = self._client.kazoo.transaction()
        for kind, args, kwargs in self._ops:
            getattr(t, kind)(*args, **kwargs)
        return t

    def commit(self) -> list[object]:
        return self._client.call(lambda: self._build().commit_async())

    def commit_async(self) -> Any:
        """Send now; the result's ``get()`` retries the whole multi-op on connection loss."""
        return _Deferred(self._client, lambda: self._build().commit_async())


class _Deferred:
    """An async request sent at once whose ``get`` retries it through the client if it fails."""

    def __init__(self, client: RetryingClient, send: Callable[[], Any]) -> None:
        self._client = client
        self._send = send
        self._first: Any = send() if client.kazoo.connected else None

    def get(self) -> Any:
        first, self._first = self._first, None

        def again() -> Any:
            nonlocal first
            pending, first = (first, None) if first is not None else (self._send(), None)
            return pending

        return self._client.call(again)


class RetryingClient:
    """The kazoo calls the ledger layer makes, retried through one policy and stop-aware."""

    def __init__(self, kazoo: KazooClient, stop: threading.Event | None = None) -> None:
        self.kazoo = kazoo
        self.stop = stop or threading.Event()
        self._stops = [self.stop]
        self._retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True,
                                 interrupt=self.stopping)
        self._down_since: float | None = None
        kazoo.add_listener(self._on_state)
        ZK_CONNECTED.set(1 if kazoo.connected else 0)

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

    def get(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self.call(lambda: self.kazoo.get_async(path, watch=watch))

    def get_children(self, path: str, watch: Callable[..., Any] | None = None) -> list[str]:
        return self.call(lambda: self.kazoo.get_children_async(path, watch=watch))

    def exists(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self.call(lambda: self.kazoo.exists_async(path, watch=watch))

    def create(self, path: str, value: bytes = b"", **kwargs: Any) -> str:
        return self.call(lambda: self.kazoo.create_async(path, value, **kwargs))

    def set(self, path: str, value: bytes, version: int = -1) -> Any:
        return self.call(lambda: self.kazoo.set_async(path, value, version=version))

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> Any:
        if recursive:
            return self._retry.copy()(lambda: self.kazoo.delete(path, version=version, recursive=True))
        return self.call(lambda: self.kazoo.delete_async(path, version=version))

    def ensure_path(self, path: str) -> Any:
        return self.call(lambda: self.kazoo.ensure_path_async(path))

    def transaction(self) -> Transaction:
        return Transaction(self)

    def get_async(self, path: str) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.get_async(path))

    def get_children_async(self, path: str) -> _Deferred:
        return _Deferred(self, lambda: self.kazoo.get_children_async(path))

    # ---- recipes (they keep their watches across connection loss and session expiry) ----------

    def DataWatch(self, path: str, func: Callable[..., Any]) -> Any:
        return self.kazoo.DataWatch(path, func)

    def ChildrenWatch(self, path: str, func: Callable[..., Any]) -> Any:
        return self.kazoo.ChildrenWatch(path, func)

    def Election(self, path: str, identifier: str | None = None) -> Any:
        return self.kazoo.Election(path, identifier)

    def add_listener(self, listener: Callable[[str], Any]) -> None:
        self.kazoo.add_listener(listener)

    def stop_session(self) -> None:
        self.kazoo.remove_listener(self._on_state)  # a session closed on purpose is not an outage
        self.kazoo.stop()
        self.kazoo.close()
