"""The stamp a sink record carries when it needs one: (sink, epoch, attempt) in one Kafka header.

ZooKeeper names the attempt that counts for each (sink, epoch); readers keep a stamped record only when
its stamp equals that one, so aborted, leaked or zombie attempts never reach an aligned reader.

Most epochs need no stamp: an epoch whose records lie at consecutive offsets in each partition commits
the range from its first record to its last, and nothing else lies in it (:func:`aligner.epochs.dense_ranges`).
A sink writes unstamped until an attempt finds another writer's records among its own; that attempt is
aborted, and the sink stamps its epochs for a while (:class:`StampChoice`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

STAMPED_FOR = 60.0
"""Seconds a sink stamps its epochs after an attempt found another writer's records among its own."""

HEADER = "aligner.stamp"


class Stamp(NamedTuple):
    sink: str
    epoch: int
    attempt: int

    def encode(self) -> bytes:
        return f"{self.sink}/{self.epoch}/{self.attempt}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> Stamp:
        sink, epoch, attempt = raw.decode().rsplit("/", 2)
        return cls(sink, int(epoch), int(attempt))


def stamp_of(headers: list[tuple[str, bytes]] | None) -> bytes | None:
    """The raw stamp header of a record, or None when it carries none."""
    if headers:
        for name, value in headers:
            if name == HEADER:
                return value
    return None


class StampChoice:
    """Whether a sink's next epoch carries stamps: always (``always``), or for :data:`STAMPED_FOR` seconds after
    an unstamped attempt was not dense, else not. Another writer on the partitions (a zombie the broker did not
    fence, a user's producer) makes every unstamped attempt fail; stamping for a while keeps that from costing
    each epoch two attempts, and trying again later gets the speed back once it is gone."""

    def __init__(self, always: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.always = always
        self._clock = clock
        self._until = float("-inf")

    def stamped(self) -> bool:
        return self.always or self._clock() < self._until

    def mixed(self) -> None:
        """An unstamped attempt found records of another writer among its own."""
        self._until = self._clock() + STAMPED_FOR
