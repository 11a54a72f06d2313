"""Typed ZooKeeper operations: what a multi-op is made of, and how its failure is read.

Recipes build lists of these instead of string tuples, so a typo is a type error rather than a
``KeyError`` at commit time, and the executor (:class:`aligner.zk.Transaction`) is the one place that
turns them into kazoo transaction calls. ZooKeeper fails a multi-op as a whole: the op that failed
comes back as its exception, every other op as ``RolledBackError`` (or ``RuntimeInconsistency``);
:func:`first_failure` finds the real one by class, never by name or text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kazoo.exceptions import RolledBackError, RuntimeInconsistency


class _Op:
    kind: ClassVar[str]


@dataclass(frozen=True)
class Create(_Op):
    """Create-if-absent: fails with ``NodeExistsError`` when the node is there (another writer won)."""

    kind = "create"

    path: str
    data: bytes = b""


@dataclass(frozen=True)
class SetData(_Op):
    """Compare-and-set on ``version`` (-1: unconditional); ``BadVersionError`` fences a stale writer."""

    kind = "set"

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class Check(_Op):
    """The node still has ``version``: a multi-op that read it commits only if nobody wrote it since."""

    kind = "check"

    path: str
    version: int


@dataclass(frozen=True)
class Delete(_Op):
    kind = "delete"

    path: str
    version: int = -1


Op = Create | SetData | Check | Delete

VERB = {Create: "create", SetData: "write", Check: "read", Delete: "delete"}
"""What a refused op was trying to do, for :class:`aligner.errors.AccessDeniedError`."""


def first_failure(results: Sequence[object]) -> int | None:
    """Index of the op that failed a multi-op (the others report that they were rolled back), or None."""
    for i, r in enumerate(results):
        if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency)):
            return i
    return None


def raise_failure(results: Sequence[object]) -> None:
    """Raise the exception of the op that failed the multi-op, if one did."""
    failed = first_failure(results)
    if failed is not None:
        raise results[failed]  # type: ignore[misc]


def failed_with(results: Sequence[object], *kinds: type[Exception]) -> bool:
    """Whether the multi-op failed, and with one of ``kinds``."""
    failed = first_failure(results)
    return failed is not None and isinstance(results[failed], kinds)
