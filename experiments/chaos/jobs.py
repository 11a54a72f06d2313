"""What the chain computes: pure functions of the input number, so the checker knows every right answer.

Input record ``n`` (written by the outside producer) is ``{"n": n}`` keyed ``n % KEYS``.
Job A emits ``{"n", "h": h(n), "c", "w", "v", "src": [partition, offset]}``, where ``c`` counts the
earlier records of the same key in keyed state (restored from the last committed epoch after a
crash, so a wrong restore shows up as wrong content), ``w``/``v`` are the worker and version.
Job B (Spark) emits ``{"n", "h", "d": 2n, "src_epoch", "src_partition", "src_offset"}`` of the
``a`` record it read; job F (Faust, :mod:`experiments.faust_job`) wraps the ``a`` record as ``in``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from aligner.connectors.runtime import KeyedState
from aligner.connectors.source import SourceRecord

KEYS = 16
WORKER_ENV, VERSION_ENV = "CHAOS_WORKER", "CHAOS_VERSION"


def h(n: int) -> int:
    return (n * 7919 + 13) % 1_000_003


def key_of(n: int) -> bytes:
    return str(n % KEYS).encode()


def job_a(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    """Job A: numbered input -> numbered output with a derived value and a per-key count from state."""
    n = int(json.loads(record.value or b"{}")["n"])
    k = str(n % KEYS)
    c = state.get(k, 0)
    state.put(k, c + 1)
    out = {"n": n, "h": h(n), "c": c, "w": int(os.environ.get(WORKER_ENV, "0")),
           "v": int(os.environ.get(VERSION_ENV, "1")), "src": [record.partition, record.offset]}
    yield key_of(n), json.dumps(out).encode()
