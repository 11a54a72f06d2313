"""The aligned source's per-run hot path (``SubjectSource._take``): keeping a whole run with one comprehension
keeps exactly what the record-at-a-time path keeps, whatever the runs, segments, leaked attempts, end-of-partition
events and bound."""

from __future__ import annotations

import types
from collections import deque
from typing import Any

from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.connectors import source as srcmod
from aligner.epochs import Slice
from aligner.stamps import HEADER, Stamp


@st.composite
def partition_reads(draw: Any) -> tuple[list[Message], list[tuple[int, int, int, bytes, Slice]], int, list[int]]:
    """Messages of one partition in offset order (committed records, another attempt's, commit-marker gaps,
    end-of-partition events), the loaded epochs' segments, the bound, and where consume cut the runs."""
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
    cuts = sorted({c for c in draw(st.lists(st.integers(1, max(1, len(messages))), max_size=6)) if c <= len(messages)}
                  | {len(messages)})
    return messages, segments, bound, cuts


def _take_all(messages: list[Message], segments: list[Any], bound: int, cuts: list[int]) -> tuple[Any, ...]:
    def stop_at_bound(part: Any) -> None:
        part.paused = True
        part.pos = part.bound

    def stash(part: Any, m: Message, o: int) -> None:
        part.stash.append(o)

    source = types.SimpleNamespace(mode="exactly_once", _stop_at_bound=stop_at_bound, _stash=stash)
    part = srcmod._Part("in", "t", 0, pos=segments[0][1], bound=bound, segments=deque(segments))
    out: list[srcmod.SourceRecord] = []
    errors, i = 0, 0
    for j in cuts:
        if i < j:
            errors += srcmod.SubjectSource._take(source, part, messages, i, j, out)  # type: ignore[arg-type]
        i = j
    return [(r.offset, r.epoch, r.key) for r in out], part.pos, part.stash, errors


@settings(max_examples=300, deadline=None)
@given(partition_reads())
def test_a_run_kept_whole_is_what_the_record_path_keeps(read: Any) -> None:
    messages, segments, bound, cuts = read
    fast = _take_all(messages, segments, bound, cuts)
    whole_run = srcmod._whole_run
    try:
        srcmod._whole_run = lambda *_a: False
        slow = _take_all(messages, segments, bound, cuts)
    finally:
        srcmod._whole_run = whole_run
    assert fast == slow


def test_a_run_with_an_end_of_partition_event_inside_is_not_kept_whole() -> None:
    ok = [Message(topic="t", partition=0, offset=o, value=b"v") for o in (0, 2, 4)]  # commit markers between
    eof = Message(topic="t", partition=0, offset=3, error=KafkaError(KafkaError._PARTITION_EOF))
    assert srcmod._whole_run(ok, 0, 3, 10)
    assert not srcmod._whole_run([*ok[:2], eof, *ok[2:]], 0, 4, 10)
    assert not srcmod._whole_run([*ok, eof], 0, 4, 10)
    assert not srcmod._whole_run(ok, 0, 3, 4)  # its last record lies at the limit
    assert not srcmod._whole_run([*ok, *ok], 0, 6, 10)  # offsets not ascending
