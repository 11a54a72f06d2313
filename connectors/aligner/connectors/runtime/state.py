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

The parts, one module each (this module names what their users import): :mod:`.state_overlay` (the store's
API and the open epoch's overlay), :mod:`.state_stores` (the memory and RocksDB bases), :mod:`.state_restore`
(the exact replay, over the ledger's :class:`aligner.recipes.changelogs.ChangelogReads`), :mod:`.state_codec`
(the record format) and :mod:`.state_tag`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from aligner.connectors.kafka import admin
from aligner.connectors.runtime.state_codec import decode_change, decode_value, encode_change, encode_value
from aligner.connectors.runtime.state_overlay import StateStore
from aligner.connectors.runtime.state_restore import Restored
from aligner.connectors.runtime.state_stores import MemoryStore, RocksStore
from aligner.connectors.runtime.state_tag import Tag
from aligner.connectors.subjects import create_subject
from aligner.errors import StateDamagedError
from aligner.ledger import Ledger
from aligner.models import SubjectNode

CHANGELOG_CONFIG: dict[str, str] = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(24 * 3600 * 1000),
}
"""Topic settings of a changelog: compacted, and never cleaned within a day of a write, so a restarted
worker has time to supersede stray records (see the module docstring)."""

log = logging.getLogger(__name__)


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
