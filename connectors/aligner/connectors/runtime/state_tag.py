"""What a store's committed base is consistent with; the store writes it with the base, restore checks it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tag:
    """What the base of a store is consistent with: an epoch of one writer's changelog partition."""

    identity: str
    """Subject node path (with the ZooKeeper root), writer, its first epoch and the partition."""
    epoch: int | None
    """The last changelog epoch applied; None: no epoch yet (an empty store)."""
    end: int | None = None
    """The partition's range end at ``epoch``, when known; checked against ZooKeeper on restore."""
