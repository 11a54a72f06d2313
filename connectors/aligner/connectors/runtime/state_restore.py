"""Restore: a store made the state as of one epoch of a changelog partition, by an exact read of the changelog.

Only the contribution of the producer that owns the worker's partition counts (other workers may still be
writing that epoch), and within its ranges only the committed attempt's records (stamps); the ledger side is
:class:`aligner.recipes.changelogs.ChangelogReads`. A local base tagged with this writer's epoch (and range
end) is kept and only the epochs after it are replayed; any other tag means a full replay into an empty store.
``repair`` marks changed the keys of records after the last counted range (see :mod:`.state`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from aligner.connectors.kafka import FetchingConsumer, consumer_config, end_offsets
from aligner.connectors.reader import Segment, read_partition
from aligner.connectors.runtime.state_tag import Tag
from aligner.epochs import Slice, check_retention
from aligner.errors import AlignerError, EpochNotCommittedError, UndecodableRecordError
from aligner.ledger import Ledger
from aligner.models import SubjectNode
from aligner.recipes.changelogs import ChangelogReads

_BATCH = 20_000
"""Records per write batch while restoring; the tag advances with each batch."""


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


class Restorable(Protocol):
    """What restore needs of a store (:class:`aligner.connectors.runtime.state_overlay.StateStore`)."""

    @property
    def tag(self) -> Tag | None: ...

    def rollback(self) -> None: ...

    def reset(self, tag: Tag) -> None: ...

    def mark_changed(self, keys: Iterable[str]) -> None: ...

    def _base_apply(self, changes: Iterable[tuple[str, bytes | None]], tag: Tag) -> None: ...

    def _base_apply_raw(self, records: list[tuple[bytes, bytes | None]], tag: Tag) -> None: ...


def restore_into(store: Restorable, ledger: Ledger, bootstrap: str, subject: str, partition: int,
                 upto_epoch: int | None, *, since: int | None = None, repair: bool = False,
                 stall_timeout: float = 30.0, consumer_extra: dict[str, Any] | None = None) -> Restored:
    """Make ``store`` the state as of changelog epoch ``upto_epoch`` of ``partition`` (None: empty).

    Reads exactly the committed attempt's records of the partition's producer, from the epoch after
    the local tag when the tag is this writer's and not newer than ``upto_epoch``, else from its
    first epoch (or ``since``, an epoch that holds the partition's whole state: the worker's state
    base, below which retention may have collected) into an empty store. ``repair`` (a worker
    restoring its own last committed epoch to write on): keys of records after the last counted
    range are marked changed, see :mod:`aligner.connectors.runtime.state`.
    """
    began = time.monotonic()
    store.rollback()
    meta = ledger.subjects.subject(subject)
    if not 0 <= partition < meta.partitions:
        raise AlignerError(f"changelog {subject!r} has partitions 0..{meta.partitions - 1}, not {partition}")
    writers, _ = ledger.subjects.writers(subject)
    owner = writers.owner_of(partition)
    if owner is None:
        if upto_epoch is not None:
            raise EpochNotCommittedError(subject, upto_epoch, f"no producer writes partition {partition}")
        store.reset(Tag(f"{ledger.layout.subject(subject)}|-|{partition}", None))
        return Restored(None, None, None, 0, 0, 0, time.monotonic() - began)
    entry = writers.writers[owner]
    identity = f"{ledger.layout.subject(subject)}|{owner}|{entry.first_epoch}|{partition}"
    reads = ChangelogReads(ledger, ledger.epochs)
    start, checkpoint = _resume_point(store, reads, subject, owner, partition, identity, entry.first_epoch,
                                      upto_epoch, since)
    first, records, dropped = None, 0, 0
    if upto_epoch is None or upto_epoch < start:
        if upto_epoch is not None and store.tag is not None and store.tag.epoch != upto_epoch:
            store._base_apply((), Tag(identity, upto_epoch, None))  # the producer wrote nothing before
    else:
        slices = reads.slices(subject, owner, entry.writes, partition, start, upto_epoch)
        first = start
        records, dropped = _replay(store, bootstrap, meta, identity, partition, slices, upto_epoch,
                                   stall_timeout, consumer_extra)
    strays = _repair(store, reads, bootstrap, meta, owner, partition, consumer_extra) if repair else 0
    return Restored(first, upto_epoch, checkpoint, records, dropped, strays, time.monotonic() - began)


def _resume_point(store: Restorable, reads: ChangelogReads, subject: str, owner: str, partition: int,
                  identity: str, first_epoch: int, upto_epoch: int | None,
                  since: int | None) -> tuple[int, int | None]:
    """(first epoch to replay, the tag's epoch the replay starts after or None); a store whose base cannot be
    kept is emptied here and tagged with ``identity``."""
    tag = store.tag
    based = since is not None and since > first_epoch
    start = since if based and since is not None else first_epoch
    if not (tag is not None and tag.identity == identity and upto_epoch is not None
            and (tag.epoch is None or tag.epoch <= upto_epoch)):
        store.reset(Tag(identity, None))
        return start, None
    if tag.epoch is not None and tag.epoch >= start:
        if tag.end is None or reads.end_at(subject, owner, partition, tag.epoch) == tag.end:
            return tag.epoch + 1, tag.epoch
        store.reset(Tag(identity, None))
        return start, None
    if based:  # a local store older than the base: the base's whole state replaces it
        store.reset(Tag(identity, None))
        return start, None
    return start, tag.epoch


def _replay(store: Restorable, bootstrap: str, meta: SubjectNode, identity: str, partition: int,
            slices: dict[int, Slice], upto: int, stall_timeout: float,
            consumer_extra: dict[str, Any] | None) -> tuple[int, int]:
    final = Tag(identity, upto, slices[upto].end if upto in slices else None)
    segments = [Segment(e, sl) for e, sl in sorted(slices.items()) if not sl.empty]
    records = dropped = 0
    if not segments:
        store._base_apply((), final)
        return records, dropped
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
                store._base_apply_raw(batch, Tag(identity, epoch, slices[epoch].end))
                batch = []
        store._base_apply_raw(batch, final)
    finally:
        fc.close()
    return records, dropped


def _repair(store: Restorable, reads: ChangelogReads, bootstrap: str, meta: SubjectNode, owner: str,
            partition: int, consumer_extra: dict[str, Any] | None) -> int:
    """Mark changed the keys of records after the producer's committed position (uncounted attempts)."""
    start = reads.committed_position(meta.name, owner, partition)
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
    store.mark_changed(kb.decode() for kb in keys)
    return len(keys)
