"""The stamp every sink record carries: (sink, epoch, attempt) in one Kafka header.

ZooKeeper names the attempt that counts for each (sink, epoch); readers keep a record only when
its stamp equals that one, so aborted, leaked or zombie attempts never reach an aligned reader.
"""

from __future__ import annotations

from typing import NamedTuple

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
