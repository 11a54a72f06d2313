"""Cost of making one SourceRecord (frozen slots dataclass, as in connectors/source.py) vs alternatives.

    .venv/bin/python experiments/results/profiles/micro_record.py
"""
from __future__ import annotations

import timeit
from dataclasses import dataclass
from typing import NamedTuple

from aligner.connectors.source import SourceRecord


@dataclass(slots=True)
class Mutable:
    subject: str
    partition: int
    offset: int
    epoch: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class NT(NamedTuple):
    subject: str
    partition: int
    offset: int
    epoch: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class Plain:
    __slots__ = ("subject", "partition", "offset", "epoch", "key", "value", "timestamp")

    def __init__(self, subject, partition, offset, epoch, key, value, timestamp):
        self.subject = subject
        self.partition = partition
        self.offset = offset
        self.epoch = epoch
        self.key = key
        self.value = value
        self.timestamp = timestamp


new_nt = tuple.__new__
args = ("in", 1, 12345, 7, None, b"v" * 100, 1700000000000)
N = 300_000
for name, stmt in [
    ("SourceRecord (frozen slots dataclass)", lambda: SourceRecord(*args)),
    ("slots dataclass, not frozen", lambda: Mutable(*args)),
    ("plain __slots__ class", lambda: Plain(*args)),
    ("NamedTuple(...)", lambda: NT(*args)),
    ("NamedTuple via tuple.__new__(NT, args)", lambda: new_nt(NT, args)),
    ("plain tuple", lambda: tuple(args)),
]:
    best = min(timeit.repeat(stmt, number=N, repeat=7))
    print(f"{1e6 * best / N:6.3f} us  {name}")
