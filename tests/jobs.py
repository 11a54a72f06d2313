"""Job functions used by tests and the demo; workers import them by name."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from aligner.connectors.runtime import JobFunction, KeyedState, batch
from aligner.connectors.source import Records, SourceRecord


def tag_v1(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """Pass each input through, tagged with its origin, and count inputs per key in state."""
    value = json.loads(record.value or b"null")
    key = record.key.decode() if record.key else str(record.partition)
    seen = state.get(key, 0) + 1
    state.put(key, seen)
    out = {"in": value, "src": [record.subject, record.partition, record.offset, record.epoch], "seen": seen,
           "v": 1}
    yield record.key, json.dumps(out).encode()


Job = Callable[[SourceRecord, KeyedState], Iterable[tuple[bytes | None, bytes]]]


def _version(fn: Job, n: int) -> Job:
    """Version ``n`` of a job: the same outputs, visibly marked vN (for hot-swap tests)."""

    def vn(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
        for key, value in fn(record, state):
            out = json.loads(value)
            out["v"] = n
            yield key, json.dumps(out).encode()

    return vn


def count_v1(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """Pass each input through with a running count of the inputs of its partition so far (keyed state)."""
    key = f"p{record.partition}"
    count = state.get(key, 0) + 1
    state.put(key, count)
    out = {"in": json.loads(record.value or b"null"), "p": record.partition, "o": record.offset, "count": count,
           "v": 1}
    yield record.key, json.dumps(out).encode()


def count_key(version: int) -> JobFunction:
    """Pass each input through with a running count of the inputs of its key so far (state keyed by the
    record key, as a job whose state rescales on a hot-swap must be: see aligner.keys)."""
    def fn(record: SourceRecord, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
        key = (record.key or b"").decode()
        count = state.get(key, 0) + 1
        state.put(key, count)
        out = {"in": json.loads(record.value or b"null"), "k": key, "count": count, "v": version}
        yield record.key, json.dumps(out).encode()

    return fn


@batch
def count_batch(records: Records, state: KeyedState) -> Iterable[tuple[bytes | None, bytes]]:
    """count_v1 as a batch function: one call per fetch, state read and written once per partition of the
    batch, and each result says which call made it (``b``: first offset of the batch, ``n``: its size) and
    the input epoch of its record, so a test can check that batches stay inside one job epoch."""
    counts: dict[str, int] = {}
    first = (records[0].partition, records[0].offset)
    # values and offsets from the columns, the rest from the records: a column out of step shows in the output
    for record, value, offset in zip(records, records.values, records.offsets, strict=True):
        key = f"p{record.partition}"
        count = counts[key] = counts.get(key, state.get(key, 0)) + 1
        out = {"in": json.loads(value or b"null"), "p": record.partition, "o": offset,
               "count": count, "e": record.epoch, "b": first, "n": len(records), "v": 1}
        yield record.key, json.dumps(out).encode()
    for key, count in counts.items():
        state.put(key, count)


tag_v2 = _version(tag_v1, 2)
tag_v3 = _version(tag_v1, 3)
count_v2 = _version(count_v1, 2)
"""Versions 2 keep their version 1's state: a hot-swap may hand v1's state over."""
