"""Packing small read ranges into shared Spark tasks (pure planning, no session)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from aligner.connectors.reader import Segment
from aligner.connectors.spark.common import AlignedPartition, PackedPartition, ReadPlan, pack
from aligner.epochs import Slice

PLAN = ReadPlan(kafka="k", subject="s", topic="t", fields=(), stall_timeout=30.0)


def _part(partition: int, sizes: list[int]) -> AlignedPartition:
    segments, start = [], 0
    for epoch, size in enumerate(sizes):
        segments.append(Segment(epoch, Slice(partition, start, start + size, None)))
        start += size
    return AlignedPartition(PLAN, partition, segments)


def _members(task) -> list[AlignedPartition]:
    return task.parts if isinstance(task, PackedPartition) else [task]


def _size(part: AlignedPartition) -> int:
    return sum(s.slice.end - s.slice.start for s in part.segments)


@given(st.lists(st.lists(st.integers(0, 30_000), max_size=4), max_size=12), st.integers(0, 25_000))
def test_every_partition_is_read_once_and_only_small_ones_share(sizes, min_records):
    parts = [_part(p, s) for p, s in enumerate(sizes)]
    tasks = pack(parts, min_records)
    flat = [m for t in tasks for m in _members(t)]
    assert sorted(m.partition for m in flat) == list(range(len(parts)))  # each exactly once
    for i, task in enumerate(tasks):
        members = _members(task)
        if len(members) > 1:
            assert all(_size(m) < min_records for m in members)
            if i < len(tasks) - 1:  # only the last shared task may be short of the threshold
                assert sum(map(_size, members)) >= min_records
    if min_records == 0:
        assert tasks == parts


def test_small_partitions_share_and_large_ones_keep_their_task():
    small = [_part(p, [100, 200]) for p in range(3)]
    large = _part(3, [20_000])
    tasks = pack([small[0], large, small[1], small[2]], 10_000)
    assert tasks[0] is large and isinstance(tasks[1], PackedPartition) and tasks[1].parts == small
    assert pack([small[0]], 10_000) == [small[0]]  # alone it stays a plain partition
