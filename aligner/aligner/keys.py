"""Where a key goes: one rule for input partitions, job workers, keyed state and output partitions, so a key
keeps its worker, its state and its output partition across versions of any parallelism.

- A keyed record is in partition ``crc32(key) % P`` of a subject of P partitions: what a sink that owns
  every partition picks, and librdkafka's default partitioner (``consistent_random``) for keyed records.
  (Java clients hash with murmur2: produce inputs with ``partitioner=consistent_random`` semantics, or
  through a sink, for state to rescale.)
- Worker ``w`` of a job of parallelism ``n`` reads the input partitions ``q`` with ``q % n == w`` and
  writes the output partitions ``p`` with ``p % n == w``.
- So the worker that reads a key's records is ``crc32(key) % P_in % n``; it also owns the key's output
  partition ``crc32(key) % P_out`` when ``n`` divides both P_in and P_out. A job that rescales its state
  on a hot-swap keys its state by the record key (or by any key of the same input partition).
"""

from __future__ import annotations

import math
import zlib


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of a keyed record in a subject of ``partitions`` partitions."""
    return zlib.crc32(key) % partitions


def worker_of(key: bytes, partitions: int, parallelism: int) -> int:
    """The worker (of ``parallelism``) that reads the records of ``key`` from inputs of ``partitions``
    partitions, and so holds its state."""
    return partition_of(key, partitions) % parallelism


def routes(owned: list[int], partitions: int | None) -> list[int]:
    """The output partition of a keyed record by ``crc32(key) % len(table)``: the key's own partition when
    this producer owns it, else one of its partitions (``partitions`` None: the producer's own partitions
    only, in order)."""
    if not owned:
        return []
    if partitions is None:
        return list(owned)
    mine = set(owned)
    return [r if r in mine else owned[r % len(owned)] for r in range(partitions)]


def sources(worker: int, parallelism: int, old_parallelism: int) -> list[int]:
    """The workers of an old version (of ``old_parallelism``) that read any input partition, so hold any key,
    of ``worker`` of a new version (of ``parallelism``): those equal to it modulo the two parallelisms'
    greatest common divisor (a key's input partition q is read by q % n of either version). A rescaling
    hand-over reads only their changelog partitions: 2 -> 4 workers, one each; 2 -> 1, both."""
    g = math.gcd(parallelism, old_parallelism)
    return [i for i in range(old_parallelism) if i % g == worker % g]
