"""Keyed state as a subject: a local store whose per-epoch changes go to a changelog subject.

A job's keyed state lives in a local store (in memory, or RocksDB through ``rocksdict`` for state
larger than memory). ZooKeeper never holds state: each epoch the store's changed keys are written
as stamped records to a changelog subject (one partition per worker) in the same Kafka transaction
as the job's output, and the job's epoch commit records the changelog range like any subject epoch.
So ZooKeeper bytes per epoch do not depend on state size, and there is no cap but disk.

The store keeps two layers, so an aborted epoch costs nothing to undo:

- the *base*: the state as of the last committed epoch (the *tag*), and
- the *overlay*: the keys changed since (``changes()``), applied to the base with the new tag in one
  atomic write by ``mark_committed``. ``rollback`` drops the overlay.

Restore is an exact read of the changelog up to the epoch to restore: only the contribution of the
producer that owns the worker's partition counts (other workers may still be writing that epoch),
and within its ranges only the committed attempt's records (stamps). The RocksDB base survives a
restart on the same disk tagged with its epoch, so a restart replays only the epochs after the tag;
a tag that is missing, foreign (another subject, root or writer) or newer than the epoch to
restore means a full replay from an empty store.

Compaction: the changelog topic is created with ``cleanup.policy=compact`` (keys are state keys,
tombstones are deletes), so on Apache Kafka its size follows the number of live keys, not history.
The exact reader tolerates the offset gaps compaction leaves. One hazard is specific to stamps: a
record of an attempt ZooKeeper never counted (a crash between the Kafka and the ZooKeeper commit)
is committed in Kafka, and compaction may keep it over the older counted record of the same key,
which the reader then drops. ``restore(..., repair=True)`` finds such stray records after the last
counted range and marks their keys changed, so the next committed epoch writes a counted record
that is newer than every stray; ``min.compaction.lag.ms`` keeps the cleaner from acting before that.
Tansu (the embedded broker) accepts the setting but never compacts (measured): there the changelog
grows with history, and restore time stays bounded by the local checkpoint.

State bases: every ``JobSpec.state_snapshot_every`` epochs (and at a hot-swap's hand-off) a worker
writes its whole state into that epoch's changelog records and records the epoch as its
``state_base`` in its worker epoch. A restore replays from the base (``since``) instead of the
writer's first epoch, so ZooKeeper's changelog epochs below every worker's base can be collected by
retention like any subject's: the changelog's ledger stays bounded by policy, not by uptime.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from kazoo.exceptions import NoNodeError

from aligner.connectors.kafka import FetchingConsumer, admin, consumer_config, end_offsets
from aligner.connectors.reader import Segment, read_partition
from aligner.connectors.subjects import create_subject
from aligner.epochs import Slice, check_retention
from aligner.errors import AlignerError, EpochNotCommittedError, StateDamagedError, UndecodableRecordError
from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.models import ContributionNode, ProducerNode, SubjectNode
from aligner.stamps import Stamp

CHANGELOG_CONFIG: dict[str, str] = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(24 * 3600 * 1000),
}
"""Topic settings of a changelog: compacted, and never cleaned within a day of a write, so a restarted
worker has time to supersede stray records (see the module docstring)."""

_BATCH = 20_000
"""Records per write batch while restoring; the tag advances with each batch."""

log = logging.getLogger(__name__)


# ---- codec ----------------------------------------------------------------------------------------

def encode_value(value: Any) -> bytes:
    """JSON bytes of a state value: sorted keys and no spaces, so equal values give equal records."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode_value(raw: bytes) -> Any:
    return json.loads(raw)


def encode_change(key: str, value: bytes | None) -> tuple[bytes, bytes | None]:
    """A changelog record (key, value) for a change; a delete is a tombstone (value None)."""
    return key.encode(), value


def decode_change(key: bytes | None, value: bytes | None) -> tuple[str, bytes | None]:
    """The (state key, JSON value bytes or None for a delete) of a changelog record."""
    if key is None:
        raise ValueError("a changelog record has no key")
    return key.decode(), value


# ---- stores ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tag:
    """What the base of a store is consistent with: an epoch of one writer's changelog partition."""

    identity: str
    """Subject node path (with the ZooKeeper root), writer, its first epoch and the partition."""
    epoch: int | None
    """The last changelog epoch applied; None: no epoch yet (an empty store)."""
    end: int | None = None
    """The partition's range end at ``epoch``, when known; checked against ZooKeeper on restore."""


@dataclass(frozen=True)
class Restored:
    """What a restore did: which epochs it replayed and how much it read."""

    first: int | None
    """First epoch replayed (None: nothing to replay)."""
    upto: int | None
    checkpoint: int | None
    """The tag's epoch the replay started after; None for a full replay."""
    records: int
    dropped: int
    strays: int
    seconds: float


class StateStore:
    """Keyed state of one worker: JSON values by string key, changes tracked per epoch.

    The same user-facing API as the runtime's former ``KeyedState`` (get, put, delete, items, len).
    Values are stored as JSON, so ``get`` returns a fresh copy: change a value in place and ``put`` it
    back, or the change is not kept (the same on every backend and after every restore).
    """

    def __init__(self) -> None:
        self._overlay: dict[str, bytes | None] = {}
        self._tag: Tag | None = None
        self._forget_count()

    def _forget_count(self) -> None:
        """``len`` counts the open epoch's effect incrementally: only keys changed since the last ``len`` are
        looked at again (and each key in the base once per epoch), so a job calling ``len(state)`` per record
        pays O(1) amortized, not O(keys changed this epoch)."""
        self._unsynced: set[str] = set()
        self._effect: dict[str, int] = {}
        self._in_base: dict[str, bool] = {}
        self._len_delta = 0

    # ---- backend, implemented by subclasses ----
    def _base_get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _base_items(self) -> Iterator[tuple[str, bytes]]:
        raise NotImplementedError

    def _base_len(self) -> int:
        raise NotImplementedError

    def _base_apply(self, changes: Iterable[tuple[str, bytes | None]], tag: Tag) -> None:
        """Apply changes and set the tag, atomically (a crash leaves the old or the new base)."""
        raise NotImplementedError

    def _base_apply_raw(self, records: list[tuple[bytes, bytes | None]], tag: Tag) -> None:
        """``_base_apply`` for changelog records as read (key bytes); the restore hot path."""
        self._base_apply(((k.decode(), v) for k, v in records), tag)

    def _base_clear(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend; uncommitted changes are dropped (they were never committed)."""
        self._overlay.clear()
        self._forget_count()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- user API ----
    def get(self, key: str, default: Any = None) -> Any:
        raw = self._overlay[key] if key in self._overlay else self._base_get(key)
        return default if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise AlignerError(f"state keys are strings, not {type(key).__name__} ({key!r:.60})")
        try:
            raw = encode_value(value)
        except (TypeError, ValueError) as exc:
            raise AlignerError(f"state value for key {key!r:.60} is not JSON-serialisable: {exc}") from None
        self._overlay[key] = raw
        self._unsynced.add(key)

    def delete(self, key: str) -> None:
        self._overlay[key] = None
        self._unsynced.add(key)

    def __contains__(self, key: object) -> bool:
        if key in self._overlay:
            return self._overlay[key] is not None
        return isinstance(key, str) and self._base_get(key) is not None

    def items(self) -> Iterator[tuple[str, Any]]:
        """Every (key, value); base keys in backend order, then keys first written this epoch."""
        overlay = self._overlay
        for key, raw in self._base_items():
            if key not in overlay:
                yield key, json.loads(raw)
        for key, pending in list(overlay.items()):
            if pending is not None:
                yield key, json.loads(pending)

    def __len__(self) -> int:
        for key in self._unsynced:
            in_base = self._in_base.get(key)
            if in_base is None:
                in_base = self._in_base[key] = self._base_get(key) is not None
            effect = (self._overlay[key] is not None) - in_base
            self._len_delta += effect - self._effect.get(key, 0)
            self._effect[key] = effect
        self._unsynced.clear()
        return self._base_len() + self._len_delta

    # ---- epochs ----
    def changes(self) -> Iterator[tuple[str, bytes | None]]:
        """(key, JSON value bytes or None for a delete) of every key changed since ``mark_committed``.

        Values come encoded (they are the changelog record values), which also keeps a stored JSON
        null (``b"null"``) apart from a delete (None)."""
        return iter(list(self._overlay.items()))

    def records(self) -> Iterator[tuple[bytes, bytes | None]]:
        """``changes`` as changelog records: (key bytes, value bytes or None for a tombstone)."""
        for key, raw in self.changes():
            yield encode_change(key, raw)

    @property
    def dirty(self) -> int:
        """Keys changed since the last ``mark_committed``."""
        return len(self._overlay)

    @property
    def tag(self) -> Tag | None:
        return self._tag

    @property
    def committed_epoch(self) -> int | None:
        """The epoch the base is consistent with (None: none yet)."""
        return None if self._tag is None else self._tag.epoch

    def mark_committed(self, epoch: int, end: int | None = None) -> None:
        """The epoch whose changes were just committed (Kafka and ZooKeeper): make them the base.

        ``end`` is the changelog partition's range end in that epoch, if the caller has it; a later
        restore checks it against ZooKeeper before trusting the local base."""
        identity = "" if self._tag is None else self._tag.identity
        self._base_apply(self._overlay.items(), Tag(identity, epoch, end))
        self._overlay = {}
        self._forget_count()

    def mark_all_changed(self) -> None:
        """Every key counts as changed in the open epoch: the next changelog epoch carries the whole state.

        For a store restored from another changelog (a hot-swap's new version starting from the old
        version's state as of epoch S): its own changelog then holds that state too. O(state), once.
        ``len`` is unchanged: each key added here holds its base value, an effect of 0."""
        overlay = self._overlay
        for key, raw in self._base_items():
            overlay.setdefault(key, raw)

    def take(self, other: StateStore, keep: Callable[[str], bool]) -> int:
        """Put the committed keys of ``other`` that ``keep`` accepts into the open epoch, their values as
        encoded (no decoding): part of another worker's state, handed over at a rescaling hot-swap.
        Returns how many keys it took."""
        overlay, unsynced, n = self._overlay, self._unsynced, 0
        for key, raw in other._base_items():
            if keep(key):
                overlay[key] = raw
                unsynced.add(key)
                n += 1
        return n

    def rollback(self) -> None:
        """Forget the changes of the open (aborted) epoch: the store is as of its tag again."""
        self._overlay = {}
        self._forget_count()

    # ---- restore ----
    def restore(self, ledger: Ledger, bootstrap: str, subject: str, partition: int, upto_epoch: int | None, *,
                since: int | None = None, repair: bool = False, stall_timeout: float = 30.0,
                consumer_extra: dict[str, Any] | None = None) -> Restored:
        """Make the store the state as of changelog epoch ``upto_epoch`` of ``partition`` (None: empty).

        Reads exactly the committed attempt's records of the partition's producer, from the epoch after
        the local tag when the tag is this writer's and not newer than ``upto_epoch``, else from its
        first epoch (or ``since``, an epoch that holds the partition's whole state: the worker's state
        base, below which retention may have collected) into an empty store. ``repair`` (a worker
        restoring its own last committed epoch to write on): keys of records after the last counted
        range are marked changed, see the module doc.
        """
        began = time.monotonic()
        self._overlay = {}
        self._forget_count()
        meta = ledger.subjects.subject(subject)
        if not 0 <= partition < meta.partitions:
            raise AlignerError(f"changelog {subject!r} has partitions 0..{meta.partitions - 1}, not {partition}")
        writers, _ = ledger.subjects.writers(subject)
        owner = writers.owner_of(partition)
        if owner is None:
            if upto_epoch is not None:
                raise EpochNotCommittedError(subject, upto_epoch, f"no producer writes partition {partition}")
            self._reset(Tag(f"{ledger.layout.subject(subject)}|-|{partition}", None))
            return Restored(None, None, None, 0, 0, 0, time.monotonic() - began)
        entry = writers.writers[owner]
        identity = f"{ledger.layout.subject(subject)}|{owner}|{entry.first_epoch}|{partition}"
        tag = self._tag
        based = since is not None and since > entry.first_epoch
        start = since if based and since is not None else entry.first_epoch
        checkpoint: int | None = None
        if (tag is not None and tag.identity == identity and upto_epoch is not None
                and (tag.epoch is None or tag.epoch <= upto_epoch)):
            if tag.epoch is not None and tag.epoch >= start:
                if tag.end is None or self._end_at(ledger, subject, owner, partition, tag.epoch) == tag.end:
                    start, checkpoint = tag.epoch + 1, tag.epoch
                else:
                    self._reset(Tag(identity, None))
            elif based:  # a local store older than the base: the base's whole state replaces it
                self._reset(Tag(identity, None))
            else:
                checkpoint = tag.epoch
        else:
            self._reset(Tag(identity, None))
        if upto_epoch is None or upto_epoch < start:
            if upto_epoch is not None and self._tag is not None and self._tag.epoch != upto_epoch:
                self._base_apply((), Tag(identity, upto_epoch, None))  # the producer wrote nothing before
            strays = self._repair(ledger, bootstrap, meta, owner, partition, consumer_extra) if repair else 0
            return Restored(None, upto_epoch, checkpoint, 0, 0, strays, time.monotonic() - began)
        slices = self._slices(ledger, subject, owner, entry.writes, partition, start, upto_epoch)
        records, dropped = self._replay(bootstrap, meta, identity, partition, slices, upto_epoch,
                                        stall_timeout, consumer_extra)
        strays = self._repair(ledger, bootstrap, meta, owner, partition, consumer_extra) if repair else 0
        return Restored(start, upto_epoch, checkpoint, records, dropped, strays, time.monotonic() - began)

    def _reset(self, tag: Tag) -> None:
        self._base_clear()
        self._base_apply((), tag)

    @staticmethod
    def _contribution(ledger: Ledger, subject: str, owner: str, epoch: int) -> ContributionNode:
        try:
            return ledger.read(ContributionNode, ledger.layout.contribution(subject, epoch, owner))[0]
        except NoNodeError:
            raise EpochNotCommittedError(subject, epoch, f"producer {owner} has not committed it") from None

    def _end_at(self, ledger: Ledger, subject: str, owner: str, partition: int, epoch: int) -> int | None:
        try:
            rng = self._contribution(ledger, subject, owner, epoch).ranges.get(partition)
        except EpochNotCommittedError:
            return None
        return None if rng is None else rng.end

    def _slices(self, ledger: Ledger, subject: str, owner: str, writes: Any, partition: int,
                first: int, last: int) -> dict[int, Slice]:
        """The partition's slice in each epoch of [first, last]; pipelined reads for the epochs the whole
        subject committed, one read of the owner's contribution for each epoch others still write."""
        out: dict[int, Slice] = {}
        e = first
        while e <= last:
            try:
                committed = ledger.epochs.committed_many(subject, e, last)
                bad = last + 1
            except EpochNotCommittedError as exc:
                bad = exc.epoch
                committed = ledger.epochs.committed_many(subject, e, bad - 1) if bad > e else []
            for ce in committed:
                sl = ce.slices.get(partition)
                if sl is not None:
                    out[ce.epoch] = sl
            if bad <= last and writes(bad):
                c = self._contribution(ledger, subject, owner, bad)
                rng = c.ranges.get(partition)
                if rng is not None:
                    stamp = None if c.attempt is None else Stamp(c.sink, bad, c.attempt).encode()
                    out[bad] = Slice(partition, rng.start, rng.end, stamp, c.counts.get(partition))
            e = bad + 1
        return out

    def _replay(self, bootstrap: str, meta: SubjectNode, identity: str, partition: int, slices: dict[int, Slice],
                upto: int, stall_timeout: float, consumer_extra: dict[str, Any] | None) -> tuple[int, int]:
        final = Tag(identity, upto, slices[upto].end if upto in slices else None)
        segments = [Segment(e, sl) for e, sl in sorted(slices.items()) if not sl.empty]
        records = dropped = 0
        if segments:
            log_start = end_offsets(bootstrap, meta.topic, [partition], earliest=True)[partition]
            check_retention(meta.name, segments[0].epoch, partition, segments[0].slice.start, log_start)
            fc = FetchingConsumer(bootstrap, consumer_extra)  # its wait rises if the broker answers empty
            try:
                batch: list[tuple[bytes, bytes | None]] = []
                for epoch, kept, lost in read_partition(fc, meta.topic, partition, segments, stall_timeout):
                    dropped += lost
                    for m in kept:
                        key = m.key()
                        if key is None:
                            raise UndecodableRecordError(meta.name, epoch, partition, cast(int, m.offset()),
                                                         "a changelog record without a key")
                        batch.append((key, m.value()))
                    records += len(kept)
                    if len(batch) >= _BATCH:  # every record of ``epoch`` is in: the base is as of it
                        self._base_apply_raw(batch, Tag(identity, epoch, slices[epoch].end))
                        batch = []
                self._base_apply_raw(batch, final)
            finally:
                fc.close()
        else:
            self._base_apply((), final)
        return records, dropped

    def _repair(self, ledger: Ledger, bootstrap: str, meta: SubjectNode, owner: str, partition: int,
                consumer_extra: dict[str, Any] | None) -> int:
        """Mark changed the keys of records after the producer's committed position (uncounted attempts)."""
        sink, producer = split_writer(owner)
        node, _ = ledger.read(ProducerNode, ledger.layout.producer(meta.name, sink, producer))
        start = node.next_offsets.get(partition)
        if start is None:
            return 0
        consumer = Consumer(consumer_config(bootstrap, consumer_extra))
        keys: set[bytes] = set()
        try:
            consumer.assign([TopicPartition(meta.topic, partition, start)])
            while True:
                msgs = consumer.consume(10000, timeout=0.05)  # returns at the timeout: the tail never fills 10000
                done = False
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = True
                            continue
                        raise KafkaException(err)
                    raw = m.key()
                    if raw is not None:
                        keys.add(raw)
                if done:
                    break
        finally:
            consumer.close()
        for kb in keys:
            key = kb.decode()
            self._overlay[key] = self._base_get(key)
        return len(keys)


class MemoryStore(StateStore):
    """The in-memory backend: state that fits in memory; restore after a process restart is a full replay."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[str, bytes] = {}

    def _base_get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def _base_items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._data.items()))

    def _base_len(self) -> int:
        return len(self._data)

    def _base_apply(self, changes: Iterable[tuple[str, bytes | None]], tag: Tag) -> None:
        data = self._data
        for key, raw in changes:
            if raw is None:
                data.pop(key, None)
            else:
                data[key] = raw
        self._tag = tag

    def _base_clear(self) -> None:
        self._data = {}


_USER = b"\x01"
"""Prefix of state keys in RocksDB; the tag lives under ``_META``, outside any state key."""
_META = b"\x00tag"


class RocksStore(StateStore):
    """The RocksDB backend (rocksdict): state larger than memory, tagged with its epoch on disk.

    The tag is written in the same RocksDB write batch as the changes it covers, so after a crash at
    any point the directory holds the state of exactly the epoch its tag names."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        from rocksdict import Options, Rdict  # a compiled extension: only loaded when used

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self._options.set_paranoid_checks(True)
        existed = (self.path / "CURRENT").exists()
        if str(self.path.resolve()) in _OPEN:
            raise AlignerError(f"local state {self.path} is already open in this process")
        _held_elsewhere(self.path)  # a store in use is not a damaged one: that is said first
        try:
            self._db: Any = Rdict(str(self.path), options=self._options)
        except Exception as exc:  # rocksdict raises a bare Exception: an existing store that nobody holds
            if existed:           # and that does not open is damaged
                raise StateDamagedError(str(self.path), _first_line(exc)) from None
            raise
        _OPEN.add(str(self.path.resolve()))
        self._count: int | None = None
        try:
            raw = self._db.get(_META)
            if raw is not None:
                doc = json.loads(raw)
                self._tag = Tag(doc["identity"], doc["epoch"], doc.get("end"))
                self._count = doc.get("count")
        except Exception as exc:  # a checksum failure, or a tag that does not parse
            self.close()
            raise StateDamagedError(str(self.path), f"its epoch tag is unreadable ({_first_line(exc)})") from None

    def _scan(self, values: bool) -> Iterator[tuple[bytes, bytes | None]]:
        """Every user key (and value) in order; a checksum failure raises instead of ending the scan early,
        which is what rocksdict's own iterators do."""
        it = self._db.iter()
        try:
            it.seek(_USER)
            while it.valid():
                yield it.key(), (it.value() if values else None)
                it.next()
            it.status()
        except StateDamagedError:
            raise
        except Exception as exc:
            raise StateDamagedError(str(self.path), _first_line(exc)) from None
        finally:
            del it  # an open iterator keeps the database (and its lock) alive past close()

    def verify(self) -> int:
        """Read every key and value through their checksums; returns the number of keys. Runs when a worker
        opens existing state (seconds per million keys): damage is found before a record is processed."""
        n = sum(1 for _ in self._scan(True))
        self._count = n
        return n

    def close(self) -> None:
        super().close()
        if self._db is not None:
            self._db.close()
            self._db = None
            _OPEN.discard(str(self.path.resolve()))

    def _base_get(self, key: str) -> bytes | None:
        return self._db.get(_USER + key.encode())

    def _base_items(self) -> Iterator[tuple[str, bytes]]:
        for k, v in self._scan(True):
            yield k[1:].decode(), cast(bytes, v)

    def _base_len(self) -> int:
        if self._count is None:
            self._count = sum(1 for _ in self._scan(False))
        return self._count

    def _write(self, batch: Any, tag: Tag, count: int | None) -> None:
        doc = {"identity": tag.identity, "epoch": tag.epoch, "end": tag.end, "count": count}
        batch.put(_META, json.dumps(doc).encode())
        self._db.write(batch)
        self._tag, self._count = tag, count

    def _base_apply(self, changes: Iterable[tuple[str, bytes | None]], tag: Tag) -> None:
        from rocksdict import WriteBatch

        items = [(_USER + k.encode(), v) for k, v in changes]
        count = self._count
        if count is not None and items:
            existing = self._db.get([k for k, _ in items])
            for (_, raw), old in zip(items, existing, strict=True):
                count += (raw is not None) - (old is not None)
        batch = WriteBatch(raw_mode=True)
        for k, raw in items:
            if raw is None:
                batch.delete(k)
            else:
                batch.put(k, raw)
        self._write(batch, tag, count)

    def _base_apply_raw(self, records: list[tuple[bytes, bytes | None]], tag: Tag) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for k, raw in records:
            if raw is None:
                delete(_USER + k)
            else:
                put(_USER + k, raw)
        self._write(batch, tag, None if records else self._count)  # recounted lazily when asked

    def _base_clear(self) -> None:
        from rocksdict import Rdict

        self._db.close()
        Rdict.destroy(str(self.path), self._options)
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = Rdict(str(self.path), options=self._options)
        self._tag, self._count = None, 0


_OPEN: set[str] = set()
"""Stores open in this process: RocksDB's file lock is per process, so a second open here is caught first."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _held_elsewhere(path: Path) -> None:
    """Raise when another process holds the store (RocksDB's LOCK file is locked): two workers on one
    directory is a deployment mistake, and the store is not damaged."""
    lock = path / "LOCK"
    if not lock.exists():
        return
    with open(lock, "rb+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AlignerError(f"local state {path} is in use by another process (its LOCK is held): "
                               "each worker needs a state directory of its own") from None
        fcntl.lockf(f, fcntl.LOCK_UN)


def open_store(path: str | Path | None = None) -> StateStore:
    """A RocksDB store in ``path`` (reopened with its tag when it exists, after a checksum scan), or an
    in-memory one. A damaged store is moved aside (``PATH.damaged-TIME``, kept for a post-mortem) and
    a fresh one returned: the caller's restore rebuilds it from the changelog."""
    if path is None:
        return MemoryStore()
    try:
        store = RocksStore(path)
        if store.tag is not None:
            try:
                store.verify()
            except StateDamagedError:
                store.close()
                raise
        return store
    except StateDamagedError as exc:
        aside = Path(path).with_name(f"{Path(path).name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        Path(path).rename(aside)
        log.warning("%s; moved to %s, restoring from the changelog", exc, aside)
        return RocksStore(path)


def restore(ledger: Ledger, bootstrap: str, changelog_subject: str, partition: int, upto_epoch: int | None, *,
            path: str | Path | None = None, repair: bool = False, since: int | None = None) -> StateStore:
    """A store holding the state as of ``upto_epoch`` of a changelog partition (see ``StateStore.restore``)."""
    store = open_store(path)
    try:
        store.restore(ledger, bootstrap, changelog_subject, partition, upto_epoch, since=since, repair=repair)
    except BaseException:
        store.close()
        raise
    return store


def take_keys(ledger: Ledger, bootstrap: str, changelog_subject: str, partition: int, upto_epoch: int,
              since: int | None, into: StateStore, keep: Callable[[str], bool]) -> int:
    """Read one changelog partition exactly as of ``upto_epoch`` and put the keys ``keep`` accepts into
    ``into``'s open epoch (a rescaling hand-over, :func:`aligner.keys.worker_of`); returns how many."""
    part = MemoryStore()
    try:
        part.restore(ledger, bootstrap, changelog_subject, partition, upto_epoch, since=since)
        return into.take(part, keep)
    finally:
        part.close()


def create_changelog(ledger: Ledger, bootstrap: str, name: str, workers: int) -> SubjectNode:
    """Create (or confirm) a job's changelog subject: one partition per worker, a compacted topic."""
    client = admin(bootstrap)  # referenced until the futures resolve: a collected client cancels them
    futures = client.create_topics([NewTopic(name, workers, 1, config=CHANGELOG_CONFIG)], operation_timeout=30)
    for fut in futures.values():
        try:
            fut.result(30)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise
    return create_subject(ledger, bootstrap, name, workers)


__all__ = [
    "CHANGELOG_CONFIG", "MemoryStore", "Restored", "RocksStore", "StateStore", "Tag", "create_changelog",
    "decode_change", "decode_value", "encode_change", "encode_value", "open_store", "restore", "take_keys",
]
