"""The subject epoch ledger in ZooKeeper: registration, partition claims, lock-free epoch commits.

Commit protocol (per producer per epoch, two round trips whatever the parallelism):

1. ``ensure_epoch``: create the epoch node listing the writers expected to contribute, in a
   multi-op that checks the version of the subject's writers document. Any producer may create
   it; ``NodeExists`` means another already did. Producers never wait for each other.
2. ``commit_epoch`` (``commit`` for one producer): after the Kafka transaction committed, one
   multi-op creates the producer's contribution (attempt + ranges) under the epoch node and
   compare-and-sets the producer node (next offsets, committed epoch). The version check fences
   zombie incarnations. Several producers commit the same epoch in one multi-op when their writes
   belong together: a Spark sink's slots (one micro-batch), or a job's output and its changelog
   subject (one Kafka transaction); the caller's own ops (a job's input offsets) ride along.

A writer that pipelines its commits and writes a subject alone makes its next epoch's node in the
commit multi-op of the epoch before (``commit_epoch_async`` with ``writers``): one round trip per epoch.

An epoch is committed once every expected writer's contribution exists. Writers join by a
multi-op that updates the writers document and creates the first epoch they write, so no epoch
can be created with a stale list of writers. There are no locks anywhere.

:class:`Ledger` is the session (:class:`aligner.recipes.store.Store`: typed reads and writes, one retrying client)
and holds the recipes as objects over it, as kazoo's recipes are objects over one client: ``ledger.subjects``,
``ledger.epochs``, ``ledger.claims``, ``ledger.commits`` and ``ledger.watches``, each defined in its module of
:mod:`aligner.recipes`, so a reader following a call lands in the file that defines it; ``ledger.jobs`` is its one
:class:`aligner.jobs.JobLedger`. The recipes keep no state of their own: what they remember (committed epochs, known
buckets, watched writers and frontiers) lives on the store, so every recipe of a ledger sees the same.
"""

from __future__ import annotations

import threading
import time

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from aligner.acl_policy import CREATOR_ONLY, AclPolicy
from aligner.errors import StoppedError, UnreachableError
from aligner.jobs import JobLedger
from aligner.layout import DEFAULT_ROOT, Layout, epoch_name
from aligner.recipes.claims import Claim, ClaimRecipes, Lease
from aligner.recipes.commits import CommitRecipes, Contribution, PendingCommit, PendingEpoch
from aligner.recipes.reads import EpochReads
from aligner.recipes.store import Store
from aligner.recipes.subjects import SubjectRecipes
from aligner.recipes.watches import WatchRecipes
from aligner.settings import zk_security
from aligner.zk import RetryingClient
from aligner.zk_tls import tls_mismatch

SESSION_TIMEOUT = 10.0
"""Seconds of silence after which ZooKeeper expires a session (fencing keeps a late worker harmless)."""
TLS_PROBE_AFTER, TLS_PROBE_EVERY = 1.0, 3.0
"""Seconds a first session may be late before ZooKeeper is probed for a TLS mismatch, and between probes."""


class Ledger(Store):
    """The subject epoch ledger: one session and its recipes (see the module docstring)."""

    def __init__(self, zk: KazooClient | RetryingClient, layout: Layout | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(zk, layout, stop)
        self.subjects = SubjectRecipes(self)
        self.epochs = EpochReads(self, self.subjects)
        self.claims = ClaimRecipes(self, self.subjects)
        self.commits = CommitRecipes(self, self.subjects, self.epochs, self.claims)
        self.watches = WatchRecipes(self, self.epochs)
        self.jobs = JobLedger(self, self.subjects)

    @classmethod
    def connect(cls, hosts: str, root: str = DEFAULT_ROOT, timeout: float | None = 15.0,
                stop: threading.Event | None = None, auth: str | None = None) -> Ledger:
        """Open a session; ``stop`` (when given) ends any later wait for ZooKeeper with StoppedError.

        ``timeout`` None waits for the first session as long as it takes (a long-running component
        started while ZooKeeper is down), until ``stop`` is set. Reconnects are retried forever with
        backoff capped at a second, so a ZooKeeper that comes back after minutes is found again at
        once (kazoo's default cap is an hour). ``auth`` (``digest:USER:PASSWORD``; '' for none) defaults
        to ``ALIGNER_ZK_AUTH``; the session's creates then carry the ACL policy's ACLs (aligner.acl).
        TLS comes from ``ALIGNER_ZK_TLS_*``; a session that is late because of TLS (a plaintext client on
        a secure port, an untrusted certificate, ...) fails at once with :class:`UnreachableError` saying so.
        """
        security = zk_security(auth)
        reconnect = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0)
        # With an identity, what kazoo's recipes create themselves (an election's nodes) is never open either.
        zk = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT, connection_retry=reconnect,
                         default_acl=CREATOR_ONLY if security.auth is not None else None, **security.kazoo_options())
        started = zk.start_async()
        deadline = None if timeout is None else time.monotonic() + timeout
        probe_at = time.monotonic() + TLS_PROBE_AFTER
        while not started.wait(0.25):
            if time.monotonic() > probe_at:
                probe_at = time.monotonic() + TLS_PROBE_EVERY
                mismatch = tls_mismatch(hosts, security.tls)
                if mismatch is not None:  # kazoo would retry it forever, only logging why
                    zk.stop()
                    zk.close()
                    raise UnreachableError("ZooKeeper", hosts, mismatch)
            stopped = stop is not None and stop.is_set()
            if stopped or (deadline is not None and time.monotonic() > deadline):
                zk.stop()
                zk.close()
                if stopped:
                    raise StoppedError(f"stopped while waiting for ZooKeeper at {hosts}")
                raise zk.handler.timeout_exception(f"no ZooKeeper session at {hosts} within {timeout:.0f}s")
        return cls(RetryingClient(zk, stop, AclPolicy(root, security.auth)), Layout(root))

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Claim", "Contribution", "Lease", "Ledger", "PendingCommit", "PendingEpoch", "epoch_name"]
