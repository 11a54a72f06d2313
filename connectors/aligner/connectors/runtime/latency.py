"""Per-operator, per-epoch latency records (thesis 6.1), for any job function of the runtime.

Wrap a job function and hand the probe's ``checkpoint`` to ``JobWorker(on_commit=...)``: every
committed job epoch then yields one :class:`EpochLatency` record, the thesis's log line.

- ``latency`` is the local time when the operator processes a record minus the record's creation
  time (``event_time``). Both the maximum and the average over the epoch are recorded.
- ``checkpoint latency`` is the worst case if the results only become visible at the commit: the
  local time of the commit minus the oldest creation time the epoch processed.
- ``visible average`` is the commit time minus the average creation time: what a read-committed
  consumer of the output waits on average, the measure exactly-once and aligned modes are compared on.

``offset`` counts the records this worker processed since it started (a restarted worker starts at 0).

Clocks: all operators of an experiment run on one machine, so local clocks agree (as in the thesis).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, cast

from prometheus_client import Histogram
from pydantic import BaseModel

from aligner.connectors.runtime.job_spec import (
    BatchFunction,
    Emitted,
    JobFunction,
    KeyedState,
    RecordFunction,
    batch,
    takes_batch,
)
from aligner.connectors.source import Records, SourceRecord
from aligner.models import WorkerEpochNode

CHECKPOINT_LATENCY = Histogram(
    "aligner_checkpoint_latency_seconds", "Commit time minus the oldest creation time of an epoch's records",
    ["operator"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
)


class EpochLatency(BaseModel):
    """One operator's epoch (thesis 6.1: CheckpointId, Offset, Count, Latency, Checkpoint Latency)."""

    operator: str
    worker: int
    run: str = ""
    """Which run of an experiment (several runs may share one log)."""
    epoch: int
    mode: str
    committed_at: float
    offset: int
    """Records processed by the operator so far."""
    count: int
    """Records with a creation time processed in this epoch."""
    max_ms: float | None
    avg_ms: float | None
    checkpoint_ms: float | None
    visible_avg_ms: float | None
    """Commit time minus the average creation time: the average wait of a read-committed reader."""


class LatencyProbe:
    """Measures a job function; ``checkpoint`` closes the epoch and emits its record."""

    def __init__(self, operator: str, worker: int, event_time: Callable[[SourceRecord], float | None],
                 emit: Callable[[EpochLatency], None], run: str = "") -> None:
        self.operator, self.worker, self.run = operator, worker, run
        self.event_time = event_time
        self.emit = emit
        self.offset = 0
        self._reset()

    def _reset(self) -> None:
        self.count, self.total, self.max, self.oldest, self.created_sum = 0, 0.0, 0.0, float("inf"), 0.0

    def wrap(self, fn: JobFunction) -> JobFunction:
        """``fn`` measuring every record it is given (a batch function stays one)."""
        if takes_batch(fn):
            whole = cast(BatchFunction, fn)

            def measured_batch(records: Records, state: KeyedState) -> Emitted:
                for record in records:
                    self._observe(record)
                return whole(records, state)

            return batch(measured_batch)
        each = cast(RecordFunction, fn)

        def measured(record: SourceRecord, state: KeyedState) -> Emitted:
            self._observe(record)
            return each(record, state)

        return measured

    def _observe(self, record: SourceRecord) -> None:
        self.offset += 1
        created = self.event_time(record)
        if created is not None:
            lag = time.time() - created
            self.count += 1
            self.total += lag
            self.created_sum += created
            self.max = max(self.max, lag)
            self.oldest = min(self.oldest, created)

    def checkpoint(self, node: WorkerEpochNode) -> None:
        now = time.time()
        n = self.count
        record = EpochLatency(
            operator=self.operator, worker=self.worker, run=self.run, epoch=node.epoch, mode=node.mode,
            committed_at=now, offset=self.offset, count=n,
            max_ms=1000 * self.max if n else None, avg_ms=1000 * self.total / n if n else None,
            checkpoint_ms=1000 * (now - self.oldest) if n else None,
            visible_avg_ms=1000 * (now - self.created_sum / n) if n else None,
        )
        if n:
            CHECKPOINT_LATENCY.labels(self.operator).observe(now - self.oldest)
        self._reset()
        self.emit(record)


def json_field(name: str) -> Callable[[SourceRecord], float | None]:
    """Creation time from a JSON value's field ``name`` (seconds since the epoch)."""

    def get(record: SourceRecord) -> float | None:
        try:
            value = json.loads(record.value or b"null")
            return float(value[name]) if isinstance(value, dict) and name in value else None
        except (ValueError, TypeError):  # not JSON, or the field is not a number: not measured
            return None

    return get


class LatencyLog:
    """Thread-safe collector of epoch records; optionally appends them as JSON lines to a file."""

    def __init__(self, path: Path | None = None) -> None:
        self.records: list[EpochLatency] = []
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a")

    def __call__(self, record: EpochLatency) -> None:
        with self._lock:
            self.records.append(record)
            if self._file is not None:
                self._file.write(record.model_dump_json() + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:  # a worker outliving its join still appends to records, not to a closed file
            if self._file is not None:
                self._file.close()
                self._file = None
