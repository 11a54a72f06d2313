"""The aligned source's per-run hot path (``SourceFetch._take`` and the stash it fills and ``_resume`` serves):
bisecting runs into pieces and keeping each piece whole keeps exactly what the rule, applied one record at a time,
keeps: whatever the runs, segments, leaked attempts, end-of-partition events, bound and stash."""

from __future__ import annotations

import types
from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.connectors.source.fetch import SourceFetch
from aligner.connectors.source.positions import Part
from aligner.connectors.source.record import Records
from aligner.epochs import Slice
from aligner.errors import DataLossError
from aligner.stamps import HEADER, Stamp, stamp_of

Segment = tuple[int, int, int, bytes, Slice]


@st.composite
def partition_reads(draw: Any) -> tuple[list[Segment], int, int, list[list[Message]]]:
    """The loaded epochs' segments, the bound, the bound after the next load (the stash is served up to it),
    and the runs consume hands over: one partition's messages in offset order (committed records, another
    attempt's, commit-marker gaps, end-of-partition events), a run now and then starting with a few the one
    before it ended with."""
    messages: list[Message] = []
    segments = []
    offset = draw(st.integers(0, 5))
    for epoch in range(draw(st.integers(1, 4))):
        start = offset
        if draw(st.booleans()):
            offset += 1  # the previous transaction's commit marker
        committed = Stamp("s", epoch, 1).encode()
        kept = 0
        for _ in range(draw(st.integers(0, 12))):
            leaked = draw(st.integers(0, 9)) == 0
            stamp = Stamp("s", epoch, 0).encode() if leaked else committed
            kept += not leaked
            messages.append(Message(topic="t", partition=0, offset=offset, key=b"k%d" % offset, value=b"v",
                                    headers=[(HEADER, stamp)], timestamp=(1, offset)))
            offset += 1
            if draw(st.integers(0, 7)) == 0:
                messages.append(Message(topic="t", partition=0, offset=offset,
                                        error=KafkaError(KafkaError._PARTITION_EOF)))
        counted = draw(st.booleans())
        sl = Slice(0, start, offset, committed, kept if counted else None)
        segments.append((epoch, start, offset, committed, sl))
        offset += draw(st.integers(0, 2))  # offsets no loaded epoch holds (a writer's registration)
    bound = draw(st.integers(0, offset + 2))
    moved = draw(st.integers(bound, offset + 2))
    cuts = sorted({c for c in draw(st.lists(st.integers(1, max(1, len(messages))), max_size=6)) if c <= len(messages)}
                  | {len(messages)})
    runs, i = [], 0
    for j in cuts:
        if i < j:
            runs.append(messages[max(0, i - draw(st.sampled_from([0, 0, 0, 1, 3]))):j])  # a range fetched again
        i = j
    return segments, bound, moved, runs


def _keep(part: Any, segments: list[Segment], m: Message, out: list[tuple[int, int, bytes]]) -> None:
    """The rule for one record below the bound and not read yet: it is kept when a loaded epoch's range holds
    it and its stamp is that epoch's committed attempt."""
    o: Any = m.offset()
    part.pos = o + 1
    for epoch, start, end, stamp, _sl in segments:
        if start <= o < end and stamp_of(m.headers()) == stamp:  # type: ignore[arg-type]
            out.append((o, epoch, m.key()))  # type: ignore[arg-type]


def _one_at_a_time(segments: list[Segment], bound: int, moved: int, runs: list[list[Message]]) -> tuple[Any, ...]:
    """The specification: every record in fetch order, then the stash served once the bound moves."""
    part = types.SimpleNamespace(pos=segments[0][1], bound=bound, paused=False, fetch_at=0, stash=[])
    out: list[tuple[int, int, bytes]] = []
    errors = 0
    for m in (m for run in runs for m in run):
        if m.error() is not None:
            errors += 1
            continue
        o: Any = m.offset()
        if part.paused:
            if o >= part.fetch_at:  # fetched past the bound
                part.stash.append(m)
                part.fetch_at = o + 1
        elif o >= part.pos:
            if o >= part.bound:
                part.paused, part.pos = True, part.bound
                part.stash.append(m)
                part.fetch_at = o + 1
            else:
                _keep(part, segments, m, out)
    before = (list(out), part.pos, [m.offset() for m in part.stash], errors)
    part.bound = moved
    if not part.paused:
        return before, (out, part.pos, [], False)
    served = [m for m in part.stash if m.offset() < moved]
    part.stash = part.stash[len(served):]
    for m in served:
        if m.offset() >= part.pos:
            _keep(part, segments, m, out)
    part.pos = part.bound if part.stash else min(max(part.pos, part.fetch_at), part.bound)
    still = bool(part.stash) or part.pos >= part.bound  # the next record lies past the new bound too
    return before, (out, part.pos, [m.offset() for m in part.stash], still)


def _bisected(segments: list[Segment], bound: int, moved: int, runs: list[list[Message]]) -> tuple[Any, ...]:
    """The source's own ``_take`` over the runs consume cut, then its ``_resume`` once the bound moves."""
    source = types.SimpleNamespace(mode="exactly_once", _fetch_ahead=lambda part: None,
                                   _assign=lambda part: None, _unassign=lambda part: None)
    for name in ("_take_clean", "_take_each", "_stash_from", "_stop_at_bound"):
        setattr(source, name, getattr(SourceFetch, name).__get__(source))
    part = Part("in", "t", 0, pos=segments[0][1], bound=bound, segments=deque(segments))
    records = Records()
    errors = 0
    for run in runs:
        errors += SourceFetch._take(source, part, run, records)  # type: ignore[arg-type]
    before = ([(r.offset, r.epoch, r.key) for r in records], part.pos, [m.offset() for m in part.stash], errors)
    part.bound = moved
    if part.paused:
        SourceFetch._resume(source, part, records)  # type: ignore[arg-type]
    out = [(r.offset, r.epoch, r.key) for r in records]
    return before, (out, part.pos, [m.offset() for m in part.stash], part.paused)


@settings(max_examples=400, deadline=None)
@given(partition_reads())
def test_bisected_runs_keep_what_the_rule_keeps_one_record_at_a_time(read: Any) -> None:
    assert _bisected(*read) == _one_at_a_time(*read)


def test_a_run_whose_offsets_repeat_is_taken_one_record_at_a_time() -> None:
    """A refetched range inside one run (never seen from librdkafka) cannot be bisected: each record once."""
    stamp = Stamp("s", 0, 1).encode()
    ms = [Message(topic="t", partition=0, offset=o, key=b"%d" % o, value=b"v", headers=[(HEADER, stamp)],
                  timestamp=(1, o)) for o in (0, 1, 2, 1, 2, 3)]
    segment = (0, 0, 4, stamp, Slice(0, 0, 4, stamp, None))
    assert _bisected([segment], 4, 4, [ms])[0][0] == [(o, 0, b"%d" % o) for o in range(4)]


def test_a_log_that_lost_the_offsets_ends_the_read_with_data_loss() -> None:
    stamp = Stamp("s", 0, 1).encode()
    ms = [Message(topic="t", partition=0, offset=0, value=b"v", headers=[(HEADER, stamp)], timestamp=(1, 0)),
          Message(topic="t", partition=0, offset=1, error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE))]
    with pytest.raises(DataLossError, match=r"t\[0\]"):
        _bisected([(0, 0, 2, stamp, Slice(0, 0, 2, stamp, None))], 2, 2, [ms])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 9),
                          st.lists(st.tuples(st.none() | st.binary(max_size=3), st.binary(max_size=3)), max_size=5)),
                max_size=4))
def test_records_columns_are_the_records_fields(runs: list[tuple[str, int, int, list[tuple[bytes | None, bytes]]]]
                                                ) -> None:
    """A batch function reads the same data as columns as it does as records, in the same order."""
    records, offset = Records(), 0
    for subject, partition, epoch, kvs in runs:
        ms = []
        for key, value in kvs:
            ms.append(Message(topic=subject, partition=partition, offset=offset, key=key, value=value,
                              timestamp=(1, 1000 + offset)))
            offset += 1
        records.add(subject, partition, epoch, ms)
    as_records = list(records)
    assert len(records) == len(as_records) == sum(len(kvs) for *_, kvs in runs)
    assert records.values == [r.value for r in as_records]
    assert records.keys == [r.key for r in as_records]
    assert records.offsets == [r.offset for r in as_records]
    assert records.timestamps == [r.timestamp for r in as_records]
    assert records.pairs() == [(r.key, r.value) for r in as_records]
    assert [(r.subject, r.partition, r.epoch) for r in as_records] == [
        (s, p, e) for s, p, e, kvs in runs for _ in kvs]
    assert records == as_records and (records[-1:] == as_records[-1:])
