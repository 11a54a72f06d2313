"""The per-operator epoch latency probe (thesis 6.1)."""

from __future__ import annotations

import json
import time
from typing import cast

from aligner.connectors.runtime.job_spec import RecordFunction
from aligner.connectors.runtime.latency import LatencyLog, LatencyProbe, json_field
from aligner.connectors.runtime.state import MemoryStore
from aligner.connectors.source import SourceRecord
from aligner.models import WorkerEpochNode


def _rec(created: float | None) -> SourceRecord:
    value = {"x": 1} if created is None else {"ts": created}
    return SourceRecord("s", 0, 0, 0, None, json.dumps(value).encode(), 0)


def test_probe_records_max_average_and_checkpoint_latency_per_epoch(tmp_path):
    log = LatencyLog(tmp_path / "latency.jsonl")
    probe = LatencyProbe("op", 3, json_field("ts"), log)
    fn = cast(RecordFunction, probe.wrap(lambda r, s: [(None, b"out")]))  # a record function stays one
    now = time.time()
    for created in (now - 0.4, now - 0.1, None):  # a record without a creation time is not measured
        assert list(fn(_rec(created), MemoryStore())) == [(None, b"out")]
    probe.checkpoint(WorkerEpochNode(epoch=7, mode="aligned", offsets={}, load_from={}))
    elapsed_ms = 1000 * (time.time() - now) + 1  # bounds the measured latencies above, however slow the machine
    probe.checkpoint(WorkerEpochNode(epoch=8, mode="aligned", offsets={}, load_from={}))
    log.close()
    first, empty = log.records
    assert (first.operator, first.worker, first.epoch, first.offset, first.count) == ("op", 3, 7, 3, 2)
    assert first.max_ms is not None and first.avg_ms is not None and first.checkpoint_ms is not None
    assert first.visible_avg_ms is not None
    assert 400 <= first.max_ms <= 400 + elapsed_ms and 250 <= first.avg_ms < first.max_ms
    assert first.max_ms <= first.checkpoint_ms <= 400 + elapsed_ms and first.visible_avg_ms >= first.avg_ms
    assert (empty.count, empty.offset, empty.max_ms, empty.checkpoint_ms) == (0, 3, None, None)
    lines = (tmp_path / "latency.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [7, 8]
