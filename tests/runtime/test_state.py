"""Keyed state as a subject: local stores, per-epoch changes, exact restore from a changelog subject."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aligner.connectors.runtime.state import (
    MemoryStore,
    RocksStore,
    StateStore,
    create_changelog,
    decode_change,
    encode_change,
    open_store,
    restore,
)
from aligner.connectors.sink import SinkProducer
from aligner.errors import AlignerError, EpochCollectedError, EpochNotCommittedError, StateDamagedError
from aligner.recipes.changelogs import ChangelogReads
from aligner.retention import Retention

Op = tuple[str, Any]
"""("k", value) puts a value, ("k", DELETE) deletes the key."""
DELETE = object()

# Epoch by epoch: overwrites, deletes (of a present and of an absent key), a JSON null value (not a
# delete), an empty epoch, a key deleted and put again, nested values.
EPOCHS: list[list[Op]] = [
    [("a", 1), ("b", {"x": [1, 2]}), ("c", "three")],
    [("a", 2), ("b", DELETE), ("d", None), ("never", DELETE)],
    [],
    [("c", DELETE), ("e", [True, 1.5]), ("a", 3), ("a", 4)],
    [("b", "back"), ("c", "again"), ("e", DELETE)],
    [("f", {"deep": {"er": 1}}), ("d", DELETE)],
]
ABORTED: dict[int, list[Op]] = {1: [("a", "aborted"), ("z", "aborted")], 4: [("b", DELETE), ("zz", 1)]}
"""Epochs with a first attempt that is flushed to the broker and aborted (Tansu shows its records)."""


def _apply(state: dict[str, Any], ops: list[Op]) -> dict[str, Any]:
    state = dict(state)
    for key, value in ops:
        if value is DELETE:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def _expected() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    for ops in EPOCHS:
        state = _apply(state, ops)
        out.append(state)
    return out


def _send(producer: SinkProducer, partition: int, ops: list[Op]) -> None:
    """The changelog records of an epoch, written the way the runtime will: through a store's changes."""
    store = MemoryStore()
    for key, value in ops:
        if value is DELETE:
            store.delete(key)
        else:
            store.put(key, value)
    for raw_key, raw_value in store.records():
        producer.send(raw_value, key=raw_key, partition=partition)


def _write_changelog(ledger, kafka: str, subject: str, partition: int, epochs: list[list[Op]],
                     aborted: dict[int, list[Op]]) -> list[int]:
    """Write one epoch per entry of ``epochs`` to ``partition``; returns the epoch numbers."""
    numbers = []
    with SinkProducer(ledger, kafka, subject, "job", str(partition), [partition]) as p:
        for i, ops in enumerate(epochs):
            epoch = p.begin()
            if i in aborted:
                _send(p, partition, aborted[i])
                p.kp.flush(30)  # the aborted attempt's records reach the broker
                p.abort()
                assert p.begin() == epoch
            _send(p, partition, ops)
            p.commit()
            numbers.append(epoch)
    return numbers


def _state(store: StateStore) -> dict[str, Any]:
    items = dict(store.items())
    assert len(items) == len(store)
    return items


@pytest.fixture
def changelog(stack, ledger, subject_name) -> tuple[str, list[int], list[int]]:
    """A two-worker changelog: both claim their partition first; worker 0 writes every epoch of EPOCHS,
    worker 1 only the first two, so later epochs are committed by worker 0 but not as a whole."""
    create_changelog(ledger, stack.kafka, subject_name, 2)
    with SinkProducer(ledger, stack.kafka, subject_name, "job", "1", [1]) as lagging:
        numbers = _write_changelog(ledger, stack.kafka, subject_name, 0, EPOCHS, ABORTED)
        lagged = []
        for value in (1, 2):
            lagged.append(lagging.begin())
            _send(lagging, 1, [("other", value)])
            lagging.commit()
    assert lagged[-1] < numbers[-1]
    return subject_name, numbers, lagged


# ---- codec and stores (no stack) -------------------------------------------------------------------

def test_codec_keeps_null_apart_from_delete() -> None:
    store = MemoryStore()
    store.put("n", None)
    store.put("v", {"b": 1, "a": [1, 2]})
    store.delete("gone")
    records = dict(store.records())
    assert records == {b"n": b"null", b"v": b'{"a":[1,2],"b":1}', b"gone": None}
    assert decode_change(*encode_change("k", b"1")) == ("k", b"1")
    assert decode_change(b"k", None) == ("k", None)
    with pytest.raises(ValueError):
        decode_change(None, b"1")
    assert store.get("n", "default") is None and store.get("gone", "default") == "default"
    assert "n" in store and "gone" not in store


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_store_api_epochs_and_rollback(backend: str, tmp_path: Path) -> None:
    store = open_store(tmp_path / "db" if backend == "rocksdb" else None)
    try:
        store.put("a", 1)
        store.put("b", [1])
        assert list(store.changes()) == [("a", b"1"), ("b", b"[1]")]
        store.mark_committed(0)
        assert store.dirty == 0 and list(store.changes()) == [] and store.committed_epoch == 0
        value = store.get("b")
        value.append(2)  # a copy: not kept without put
        assert store.get("b") == [1]
        store.delete("a")
        store.put("c", "x")
        assert _state(store) == {"b": [1], "c": "x"}
        store.rollback()  # the epoch aborted
        assert _state(store) == {"a": 1, "b": [1]} and store.committed_epoch == 0
        store.delete("a")
        store.mark_committed(1, end=7)
        assert _state(store) == {"b": [1]} and store.tag is not None and store.tag.end == 7
        store.put("new", 1)
        store.mark_all_changed()  # a hot-swap hand-off: the whole state goes to the new changelog
        assert dict(store.changes()) == {"b": b"[1]", "new": b"1"}
        store.rollback()
        with pytest.raises(AlignerError, match="JSON"):
            store.put("bad", object())
        with pytest.raises(AlignerError, match="strings"):
            store.put(1, "x")  # type: ignore[arg-type]
    finally:
        store.close()
    if backend == "rocksdb":  # reopened from disk: the committed base and its tag
        with RocksStore(tmp_path / "db") as again:
            assert _state(again) == {"b": [1]} and again.committed_epoch == 1
            assert again.tag is not None and again.tag.end == 7


_keys = st.sampled_from([f"k{i}" for i in range(12)])
_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                   max_size=3), max_leaves=6)
_ops = st.lists(st.tuples(st.booleans(), _keys, _values), max_size=20)
_epochs = st.lists(st.tuples(_ops, st.booleans()), max_size=8)
"""Epochs of (is_put, key, value) operations, each with whether the epoch commits or aborts."""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epochs=_epochs, rocks=st.booleans())
def test_replaying_changes_reproduces_the_store(epochs: list[tuple[list[tuple[bool, str, Any]], bool]],
                                                rocks: bool) -> None:
    """For any put/delete sequence split into epochs, some aborted: applying each committed epoch's
    changes() to an empty store (as a restore applies the changelog) gives the same state."""
    with tempfile.TemporaryDirectory() as tmp:
        store = RocksStore(Path(tmp) / "db") if rocks else MemoryStore()
        replica = MemoryStore()
        model: dict[str, Any] = {}
        try:
            for epoch, (ops, commits) in enumerate(epochs):
                pending = dict(model)
                for is_put, key, value in ops:
                    if is_put:
                        store.put(key, value)
                        pending[key] = value
                    else:
                        store.delete(key)
                        pending.pop(key, None)
                assert _state(store) == pending
                if not commits:
                    store.rollback()
                    assert _state(store) == model
                    continue
                for key, raw in store.changes():  # what the runtime writes to the changelog
                    if raw is None:
                        replica.delete(key)
                    else:
                        replica.put(key, json.loads(raw))
                store.mark_committed(epoch)
                replica.mark_committed(epoch)
                model = pending
                assert _state(store) == _state(replica) == model
        finally:
            store.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epochs=st.lists(st.tuples(st.lists(st.tuples(st.booleans(), _keys, st.booleans()), max_size=25),
                                 st.booleans()), max_size=8), rocks=st.booleans())
def test_len_counts_exactly_however_often_it_is_asked(epochs: list[tuple[list[tuple[bool, str, bool]], bool]],
                                                      rocks: bool) -> None:
    """len() is counted incrementally (only keys changed since the last len()): it equals the number of live
    keys whether it is asked after every change, after some, or once per epoch, across commits and aborts."""
    with tempfile.TemporaryDirectory() as tmp:
        store = RocksStore(Path(tmp) / "db") if rocks else MemoryStore()
        model: set[str] = set()
        try:
            for epoch, (ops, commits) in enumerate(epochs):
                pending = set(model)
                for is_put, key, ask in ops:
                    if is_put:
                        store.put(key, epoch)
                        pending.add(key)
                    else:
                        store.delete(key)
                        pending.discard(key)
                    if ask:
                        assert len(store) == len(pending)
                assert len(store) == len(pending) == sum(1 for _ in store.items())
                if commits:
                    store.mark_committed(epoch)
                    model = pending
                else:
                    store.rollback()
                assert len(store) == len(model)
        finally:
            store.close()


# ---- restore from the changelog on the stack -----------------------------------------------------

def test_mark_changed_keeps_the_committed_values_and_the_count() -> None:
    """Restore's repair: the keys count as changed (the next changelog epoch rewrites them) with their
    committed values, a key absent from the base as a delete; nothing a job reads changes."""
    with MemoryStore() as store:
        store.put("a", 1)
        store.put("b", 2)
        store.mark_committed(1)
        store.mark_changed(["a", "gone"])
        assert dict(store.changes()) == {"a": b"1", "gone": None}
        assert _state(store) == {"a": 1, "b": 2} and len(store) == 2


def test_the_changelog_reads_are_a_recipe_over_the_ledger() -> None:
    """Like the ledger's own recipes: no inheritance, and nothing kept but the ledger's store and reads."""
    from kazoo.client import KazooClient

    from aligner.ledger import Ledger

    led = Ledger(KazooClient(hosts="127.0.0.1:1"))  # never started: no connection is made
    reads = ChangelogReads(led, led.epochs)
    assert ChangelogReads.__mro__ == (ChangelogReads, object)
    assert reads.store is led and reads.epochs is led.epochs and set(vars(reads)) == {"store", "epochs"}


def test_changelog_reads_follow_the_owner_of_a_partition(stack, ledger, changelog) -> None:
    """The owner's own contribution where the subject's epoch is not committed as a whole (worker 1 lags)."""
    subject, numbers, lagged = changelog
    reads = ChangelogReads(ledger, ledger.epochs)
    writers, _ = ledger.subjects.writers(subject)
    owner, lagging = writers.owner_of(0), writers.owner_of(1)
    assert owner is not None and lagging is not None
    slices = reads.slices(subject, owner, writers.writers[owner].writes, 0, numbers[0], numbers[-1])
    assert set(slices) == set(numbers)  # the epochs worker 1 never wrote too, from worker 0's contributions
    last = slices[numbers[-1]]
    assert reads.end_at(subject, owner, 0, numbers[-1]) == last.end
    assert reads.committed_position(subject, owner, 0) == last.end
    assert reads.end_at(subject, owner, 0, numbers[-1] + 1) is None
    with pytest.raises(EpochNotCommittedError):
        reads.contribution(subject, owner, numbers[-1] + 1)
    assert reads.committed_position(subject, lagging, 1) == reads.end_at(subject, lagging, 1, lagged[-1])


def test_restore_is_exact_at_every_epoch(stack, ledger, changelog) -> None:
    subject, numbers, lagged = changelog
    expected = _expected()
    for i, epoch in enumerate(numbers):
        store = restore(ledger, stack.kafka, subject, 0, epoch)
        assert _state(store) == expected[i], f"epoch {epoch}"
        assert store.committed_epoch == epoch and store.dirty == 0
    with MemoryStore() as store:
        report = store.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        assert report.checkpoint is None and report.first == numbers[0]
        assert report.dropped == sum(len(ops) for ops in ABORTED.values())  # by stamp
        assert _state(store) == expected[-1]
        # Worker 1's partition, restored while its epochs after the second are not written at all.
        other = restore(ledger, stack.kafka, subject, 1, lagged[1])
        assert _state(other) == {"other": 2}
        with pytest.raises(EpochNotCommittedError):
            restore(ledger, stack.kafka, subject, 1, lagged[1] + 1)
        assert _state(restore(ledger, stack.kafka, subject, 0, None)) == {}


def test_rocksdb_checkpoint_replays_only_the_tail(stack, ledger, changelog, tmp_path: Path) -> None:
    subject, numbers, lagged = changelog
    expected = _expected()
    path = tmp_path / "state"
    with RocksStore(path) as store:
        first = store.restore(ledger, stack.kafka, subject, 0, numbers[2])
        assert first.checkpoint is None and _state(store) == expected[2]
    with RocksStore(path) as store:  # a restart on the same disk
        assert store.committed_epoch == numbers[2]
        tail = store.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        assert (tail.checkpoint, tail.first) == (numbers[2], numbers[3])
        full = MemoryStore()
        replay = full.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        assert _state(store) == _state(full) == expected[-1]
        assert 0 < tail.records < replay.records and replay.checkpoint is None
        # In one process the memory store keeps its tag too: restoring the same epoch reads nothing.
        assert full.restore(ledger, stack.kafka, subject, 0, numbers[-1]).records == 0
    with RocksStore(path) as store:  # the tag is newer than the epoch asked for: a full replay
        older = store.restore(ledger, stack.kafka, subject, 0, numbers[1])
        assert older.checkpoint is None and _state(store) == expected[1]
    with RocksStore(path) as store:  # another partition's checkpoint is not ours: a full replay
        other = store.restore(ledger, stack.kafka, subject, 1, lagged[1])
        assert other.checkpoint is None and _state(store) == {"other": 2}
    with RocksStore(path) as store:  # same epoch again: nothing to read
        store.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        again = store.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        assert again.checkpoint == numbers[-1] and again.first is None and again.records == 0
        assert _state(store) == expected[-1]


def test_worker_cycle_with_checkpoint_matches_full_replay(stack, ledger, subject_name, tmp_path: Path) -> None:
    """The runtime's cycle (restore, changes -> sink, commit, mark_committed), a restart on the same disk
    in the middle and a local tag whose range end ZooKeeper contradicts."""
    create_changelog(ledger, stack.kafka, subject_name, 1)
    path = tmp_path / "state"
    rounds = [EPOCHS[:3], EPOCHS[3:]]
    for ops_of_round in rounds:
        with SinkProducer(ledger, stack.kafka, subject_name, "job", "0", [0]) as p, RocksStore(path) as store:
            last = p.lease.node.committed_epoch
            store.restore(ledger, stack.kafka, subject_name, 0, last, repair=True)
            for ops in ops_of_round:
                epoch = p.begin()
                for key, value in ops:
                    store.delete(key) if value is DELETE else store.put(key, value)
                for raw_key, raw_value in store.records():
                    p.send(raw_value, key=raw_key, partition=0)
                commit = p.commit()
                store.mark_committed(epoch, commit.ranges[0].end)
    last = ledger.epochs.frontier(subject_name)
    with RocksStore(path) as store:
        assert _state(store) == _expected()[-1] == _state(restore(ledger, stack.kafka, subject_name, 0, last))
        store.mark_committed(last, end=10**9)  # a tag ZooKeeper contradicts (another history)
    with RocksStore(path) as store:
        report = store.restore(ledger, stack.kafka, subject_name, 0, last)
        assert report.checkpoint is None and _state(store) == _expected()[-1]


def test_restore_from_a_state_base_after_the_epochs_below_it_are_collected(stack, ledger, subject_name,
                                                                          tmp_path: Path) -> None:
    """An epoch that holds the whole state (the runtime's state base) is where a restore starts (``since``):
    the changelog's epochs below it can go, and a local store older than the base is replaced, not patched."""
    create_changelog(ledger, stack.kafka, subject_name, 1)
    base_at = 3
    path = tmp_path / "state"
    numbers = []
    with SinkProducer(ledger, stack.kafka, subject_name, "job", "0", [0]) as p, RocksStore(path) as store:
        for i, ops in enumerate(EPOCHS):
            epoch = p.begin()
            for key, value in ops:
                store.delete(key) if value is DELETE else store.put(key, value)
            if i == base_at:
                store.mark_all_changed()
            for raw_key, raw_value in store.records():
                p.send(raw_value, key=raw_key, partition=0)
            store.mark_committed(epoch, p.commit().ranges[0].end)
            numbers.append(epoch)
    with RocksStore(tmp_path / "old") as old:  # a local store as of the first epoch: "b", deleted next, is in it
        old.restore(ledger, stack.kafka, subject_name, 0, numbers[0])
    base = numbers[base_at]
    Retention(ledger).collect_subject(subject_name, base, numbers[:base_at])
    assert ledger.subjects.epoch_numbers(subject_name) == numbers[base_at:]
    with pytest.raises(EpochCollectedError):
        restore(ledger, stack.kafka, subject_name, 0, numbers[-1])
    for i, upto in enumerate(numbers[base_at:], base_at):
        assert _state(restore(ledger, stack.kafka, subject_name, 0, upto, since=base)) == _expected()[i]
    with RocksStore(tmp_path / "old") as store:
        assert store.committed_epoch == numbers[0] and "b" in _state(store)
        report = store.restore(ledger, stack.kafka, subject_name, 0, numbers[-1], since=base)
        assert report.checkpoint is None and report.first == base and _state(store) == _expected()[-1]


def test_repair_marks_keys_of_uncounted_records(stack, ledger, subject_name) -> None:
    """A crash between the Kafka and the ZooKeeper commit leaves committed Kafka records no epoch counts;
    compaction could keep them over the counted ones, so a repairing restore rewrites their keys."""
    create_changelog(ledger, stack.kafka, subject_name, 1)
    _write_changelog(ledger, stack.kafka, subject_name, 0, EPOCHS[:2], {})

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "after_kafka_commit":
            raise Crash

    zombie = SinkProducer(ledger, stack.kafka, subject_name, "job", "0", [0], fault=crash).open()
    try:
        zombie.begin()
        _send(zombie, 0, [("a", "uncounted"), ("b", "uncounted")])
        with pytest.raises(Crash):
            zombie.commit()
    finally:
        zombie.close()
    last = ledger.epochs.frontier(subject_name)
    store = restore(ledger, stack.kafka, subject_name, 0, last, repair=True)
    assert _state(store) == _expected()[1]
    assert dict(store.changes()) == {"a": b"2", "b": None}  # counted values again: newer than the strays


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_local_store_is_moved_aside_and_restored_from_the_changelog(stack, ledger, changelog, damage,
                                                                             tmp_path: Path, caplog) -> None:
    """A RocksDB store damaged while its worker was down (its table file truncated, or one byte flipped in
    its first data block) is never read: opening it finds the damage (open checks, or the checksum scan
    of existing state), moves it aside for a post-mortem, and the restore rebuilds the state from the
    changelog. A scan of a damaged store raises instead of ending early as rocksdict's iterators do."""
    subject, numbers, _ = changelog
    path = tmp_path / "state"
    with RocksStore(path) as rocks:
        rocks.restore(ledger, stack.kafka, subject, 0, numbers[-1])
    table = max(path.glob("*.sst"), key=lambda f: f.stat().st_size)
    if damage == "truncate":
        table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    else:
        raw = bytearray(table.read_bytes())
        raw[10] ^= 0xFF
        table.write_bytes(bytes(raw))
    caplog.set_level("WARNING", logger="aligner.connectors.runtime.state")
    store = open_store(path)
    try:
        assert store.tag is None and len(store) == 0, "a damaged store was opened as if whole"
        aside = list(tmp_path.glob("state.damaged-*"))
        assert len(aside) == 1 and (aside[0] / table.name).exists(), "the damaged store was not kept aside"
        assert any("is damaged" in r.getMessage() for r in caplog.records)
        report = store.restore(ledger, stack.kafka, subject, 0, numbers[-1])
        assert report.checkpoint is None and _state(store) == _expected()[-1]
    finally:
        store.close()


def test_a_scan_of_a_damaged_store_raises_instead_of_ending_early(tmp_path: Path) -> None:
    """Damage in a data block past the first (the tag reads fine): rocksdict's own iterators just stop
    there (a third of the keys, silently); the store's scan raises, and open_store's checksum scan of
    existing state finds it before any record is processed."""
    from aligner.connectors.runtime.state import Tag

    path = tmp_path / "big"
    with RocksStore(path) as store:
        value = json.dumps("v" * 100).encode()
        store._base_apply([(f"k{i:06d}", value) for i in range(50_000)], Tag("job-0", 5, None))
    table = max(path.glob("*.sst"), key=lambda f: f.stat().st_size)
    raw = bytearray(table.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    table.write_bytes(bytes(raw))
    damaged = RocksStore(path)
    try:
        assert damaged.tag == Tag("job-0", 5, None)
        with pytest.raises(StateDamagedError, match="checksum"):
            sum(1 for _ in damaged.items())
    finally:
        damaged.close()
    fresh = open_store(path)
    try:
        assert fresh.tag is None and len(fresh) == 0
    finally:
        fresh.close()
