"""Unit tests of the pure protocol pieces: payload models, stamps, epoch assembly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aligner.epochs import Slice, assemble, check_retention, dense_ranges, parse_epoch_span, ranges_for
from aligner.errors import AlignerError, EpochNotCommittedError, EpochOutOfRetentionError, MalformedNodeError
from aligner.layout import Layout, split_writer, writer_id
from aligner.models import (
    ContributionNode,
    EpochNode,
    ProducerNode,
    Range,
    SubjectNode,
    WriterEntry,
    WritersNode,
    parse,
)
from aligner.stamps import HEADER, STAMPED_FOR, Stamp, StampChoice, stamp_of


def test_parse_names_path_and_field():
    with pytest.raises(MalformedNodeError, match=r"/x/epochs/0000000003: .*EpochNode\.epoch"):
        parse(EpochNode, "/x/epochs/0000000003", b'{"schema_version": 1, "epoch": -1, "writers": []}')
    with pytest.raises(MalformedNodeError, match="Invalid JSON"):
        parse(EpochNode, "/p", b"{not json")
    with pytest.raises(MalformedNodeError, match="empty payload"):
        parse(EpochNode, "/p", b"")


def test_schema_version_is_checked():
    with pytest.raises(MalformedNodeError, match="schema_version"):
        parse(SubjectNode, "/s", b'{"schema_version": 2, "name": "a", "topic": "a", "partitions": 1}')


def test_round_trip_and_unknown_fields_refused():
    node = SubjectNode(name="orders", topic="orders", partitions=3)
    assert parse(SubjectNode, "/s", node.dump()) == node
    with pytest.raises(MalformedNodeError, match="Extra inputs"):
        parse(SubjectNode, "/s", node.dump()[:-1] + b', "surprise": 1}')


def test_identifiers_are_restricted():
    with pytest.raises(ValueError):
        SubjectNode(name="bad/name", topic="t", partitions=1)


def test_range_is_half_open_and_ordered():
    assert Range(start=4, end=4).empty
    with pytest.raises(ValueError, match="before start"):
        Range(start=5, end=4)


def test_producer_offsets_must_cover_its_partitions():
    with pytest.raises(ValueError, match="next_offsets"):
        ProducerNode(sink="k", producer="0", partitions=(0, 1), incarnation=1, next_offsets={0: 0})


def test_writers_expected_follow_first_and_last_epoch():
    doc = WritersNode(writers={
        "a:0": WriterEntry(partitions=(0,), first_epoch=0),
        "b:0": WriterEntry(partitions=(1,), first_epoch=3),
        "c:0": WriterEntry(partitions=(2,), first_epoch=0, finished_after=1),
    })
    assert doc.expected(0) == ("a:0", "c:0")
    assert doc.expected(2) == ("a:0",)
    assert doc.expected(3) == ("a:0", "b:0")
    assert doc.owner_of(1) == "b:0" and doc.owner_of(9) is None


def test_stamp_round_trip_and_lookup():
    s = Stamp("job.v1", 12, 3)
    assert Stamp.decode(s.encode()) == s
    assert stamp_of([("other", b"x"), (HEADER, s.encode())]) == s.encode()
    assert stamp_of(None) is None


def _contribution(sink: str, attempt: int | None, ranges: dict[int, tuple[int, int]]) -> ContributionNode:
    return ContributionNode(sink=sink, producer="0", attempt=attempt,
                            ranges={p: Range(start=a, end=b) for p, (a, b) in ranges.items()})


def test_assemble_requires_every_expected_writer():
    node = EpochNode(epoch=5, writers=("a:0", "b:0"))
    with pytest.raises(EpochNotCommittedError, match="waiting for producers b:0"):
        assemble("s", node, {"a:0": _contribution("a", 1, {0: (0, 3)})})
    with pytest.raises(EpochNotCommittedError, match="no producer"):
        assemble("s", EpochNode(epoch=0, writers=()), {})


def test_assemble_slices_carry_the_committed_stamp():
    node = EpochNode(epoch=5, writers=("a:0", "m:0"))
    parts = {"a:0": _contribution("a", 7, {0: (10, 20)}), "m:0": _contribution("m", None, {1: (3, 3)})}
    ce = assemble("s", node, parts)
    assert ce.slices[0].stamp == Stamp("a", 5, 7).encode()
    assert ce.slices[1].stamp is None and ce.slices[1].empty
    assert ce.offsets == {0: (10, 20), 1: (3, 3)}


def test_assemble_refuses_a_partition_twice():
    node = EpochNode(epoch=1, writers=("a:0", "b:0"))
    with pytest.raises(AlignerError, match="partition 0 contributed twice"):
        assemble("s", node, {"a:0": _contribution("a", 1, {0: (0, 1)}), "b:0": _contribution("b", 1, {0: (1, 2)})})


def test_a_slice_needs_no_stamp_check_only_where_its_count_fills_the_rest_of_the_range():
    """[10, 20) where the committed attempt wrote 9 records: the commit marker of the epoch before sits at 10."""
    sl = Slice(0, 10, 20, b"a/5/7", 9)
    assert sl.only_committed_from(11)  # first record at 11: 11..19 are the attempt's nine
    assert not sl.only_committed_from(10)  # a record at 10 as well: one of the ten is someone else's
    assert not sl.only_committed_from(12)  # impossible for a truthful count: checked, not trusted
    assert not Slice(0, 10, 20, b"a/5/7", None).only_committed_from(11)  # no count (older writers): checked
    assert Slice(0, 10, 20, None, None).only_committed_from(10)  # no stamp to check (cut by the marker)


def test_a_reader_that_saw_as_many_records_as_the_count_checks_no_stamp():
    sl = Slice(0, 10, 20, b"a/5/7", 9)
    assert sl.only_committed(9)
    assert not sl.only_committed(10)  # an aborted attempt's record, or an outsider's, lies among them
    assert not sl.only_committed(8)  # fewer than written: checked, not trusted
    assert not Slice(0, 10, 20, b"a/5/7", None).only_committed(9)  # no count (older writers): checked
    assert Slice(0, 10, 20, None, None).only_committed(3)


def test_ranges_from_delivery_reports():
    assert ranges_for({0: 5, 1: 9}, {0: 7}) == {0: Range(start=5, end=8), 1: Range(start=9, end=9)}


@pytest.mark.parametrize("spec,expected", [("3", (3, 3)), ("2:5", (2, 5))])
def test_epoch_span(spec, expected):
    assert parse_epoch_span(spec) == expected


@pytest.mark.parametrize("spec", ["a", "5:2", "-1:3", "1:x"])
def test_bad_epoch_span(spec):
    with pytest.raises(ValueError):
        parse_epoch_span(spec)


def test_layout_is_the_single_path_builder():
    lay = Layout("/r")
    assert lay.epoch("s", 7) == "/r/subjects/s/epochs/0000000000/0000000007"
    assert lay.contribution("s", 7, writer_id("k", "1")) == "/r/subjects/s/epochs/0000000000/0000000007/k:1"
    assert lay.epoch("s", 123_456) == "/r/subjects/s/epochs/0000120000/0000123456"  # buckets of 10,000
    assert lay.query_batch("q", 20_001) == "/r/spark/queries/q/batches/000000020000/000000020001"
    assert split_writer("k.v2:3") == ("k.v2", "3")


def test_retention_is_checked_against_the_log_start():
    check_retention("s", 3, 0, start=10, log_start=10)
    with pytest.raises(EpochOutOfRetentionError, match="epoch 3 of subject 's' is out of retention: partition 0"):
        check_retention("s", 3, 0, start=9, log_start=10)


@given(st.lists(st.sampled_from(["ours", "other", "marker"]), max_size=30), st.integers(0, 1000))
def test_an_unstamped_range_holds_exactly_the_attempts_records_or_none_is_given(log: list[str], start: int) -> None:
    """A partition's log from where the epoch started: the attempt's records, other writers' (or aborted
    attempts') records and commit markers, in any order. The range dense_ranges gives (from the delivery reports
    of the attempt's first and last record) holds every one of the attempt's records and nothing else; where
    that cannot be, it gives none and the attempt is written again with stamps."""
    ours = [start + i for i, who in enumerate(log) if who == "ours"]
    first = {0: ours[0]} if ours else {}
    last = {0: ours[-1]} if ours else {}
    ranges = dense_ranges({0: start}, first, last, {0: len(ours)})
    if not ours:
        assert ranges == {0: Range(start=start, end=start)}
        return
    among = set(range(ours[0], ours[-1] + 1)) - set(ours)
    if among:
        assert ranges is None
    else:
        assert ranges is not None
        assert list(range(ranges[0].start, ranges[0].end)) == ours


def test_an_unstamped_range_needs_both_reports_and_no_record_before_the_epoch() -> None:
    assert dense_ranges({0: 5}, {}, {0: 7}, {0: 3}) is None  # the first record's report is missing
    assert dense_ranges({0: 5}, {0: 5}, {}, {0: 3}) is None  # the last one's
    assert dense_ranges({0: 5}, {0: 4}, {0: 6}, {0: 3}) is None  # a first record before the epoch began: a lie
    assert dense_ranges({0: 5, 1: 0}, {0: 6}, {0: 8}, {0: 3}) == {0: Range(start=6, end=9), 1: Range(start=0, end=0)}


def test_a_sink_stamps_for_a_while_after_an_attempt_met_another_writer() -> None:
    now = [100.0]
    choice = StampChoice(clock=lambda: now[0])
    assert not choice.stamped()
    choice.mixed()
    now[0] += STAMPED_FOR - 1
    assert choice.stamped()
    now[0] += 1
    assert not choice.stamped()  # tried again without stamps
    assert StampChoice(always=True).stamped()
