"""What the chain computes: pure functions of the input number, so the checker knows every right answer.

Input record ``n`` (written by the outside producer) is ``{"n": n}`` keyed ``n % KEYS``.
Job A emits ``{"n", "h": h(n), "c", "w", "v", "src": [partition, offset]}``, where ``c`` counts the
earlier records of the same key in keyed state (restored from the last committed epoch after a
crash, so a wrong restore shows up as wrong content), ``w``/``v`` are the worker and version.
Job B (Spark) emits ``{"n", "h", "d": 2n, "src_epoch", "src_partition", "src_offset"}`` of the
``a`` record it read; job F (Faust, :mod:`experiments.faust_job`) wraps the ``a`` record as ``in``.
Job A's even versions run :func:`job_a_batch`, the same computation as a batch function reading columns, so a
hot-swap hands the chain between the two runtime paths and the checker holds both to the same answers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from aligner.connectors.runtime import KeyedState, batch
from aligner.connectors.source import Records, SourceRecord

KEYS = 16
WORKER_ENV, VERSION_ENV = "CHAOS_WORKER", "CHAOS_VERSION"


def h(n: int) -> int:
    return (n * 7919 + 13) % 1_000_003


def key_of(n: int) -> bytes:
    return str(n % KEYS).encode()


def job_a(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    """Job A: numbered input -> numbered output with a derived value and a per-key count from state."""
    yield _a(record.value, record.partition, record.offset, state)


@batch
def job_a_batch(records: Records, state: KeyedState) -> list[tuple[bytes | None, bytes]]:
    """Job A as a batch function: values and offsets as columns, the partition from each record."""
    return [_a(value, record.partition, offset, state)
            for record, value, offset in zip(records, records.values, records.offsets, strict=True)]


def _a(value: bytes | None, partition: int, offset: int, state: KeyedState) -> tuple[bytes | None, bytes]:
    n = int(json.loads(value or b"{}")["n"])
    k = str(n % KEYS)
    c = state.get(k, 0)
    state.put(k, c + 1)
    out = {"n": n, "h": h(n), "c": c, "w": int(os.environ.get(WORKER_ENV, "0")),
           "v": int(os.environ.get(VERSION_ENV, "1")), "src": [partition, offset]}
    return key_of(n), json.dumps(out).encode()
