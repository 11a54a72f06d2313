"""What a runtime job is: its spec (inputs, output, parallelism, mode, state, hot-swap role) and its function."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aligner.connectors.runtime.state import StateStore
from aligner.connectors.source import Records, SourceRecord
from aligner.models import Engine, JobNode, Mode

KeyedState = StateStore
"""A job's keyed state: JSON values by string key (see :mod:`aligner.connectors.runtime.state`)."""

StateKind = Literal["memory", "rocksdb", "none"]

Emitted = Iterable[tuple[bytes | None, bytes]]
"""What a job function returns: the (key, value) records to emit, in order."""

RecordFunction = Callable[[SourceRecord, KeyedState], Emitted]
"""A job called once per input record, given the keyed state."""

BatchFunction = Callable[[Records, KeyedState], Emitted]
"""A job called once per fetched batch of input records (marked with :func:`batch`)."""

JobFunction = RecordFunction | BatchFunction
"""A job: a record function, or a batch function marked with :func:`batch`."""

_BATCH = "__aligner_batch__"

F = TypeVar("F", bound=Callable[..., Any])


def batch(fn: F) -> F:
    """Mark a job function as taking a batch: ``fn(records, state)`` gets every record of one fetch (a
    :class:`Records`, a sequence of :class:`SourceRecord`, all in the same open job epoch, in the order a record
    function would see them) and returns the records to emit, once per batch instead of once per record. For
    work that is cheaper in bulk: a columnar library (``pandas.Series(records.values)``), one lookup for many
    keys, fewer Python calls per record. Its columns (``values``, ``keys``, ``offsets``, ``timestamps``,
    ``pairs()``) are read from the Kafka messages without a record object each: a function that needs only
    them skips the records' cost. Exactly-once and state are as for a record function: the batch's outputs
    and state changes commit with the job epoch it belongs to."""
    setattr(fn, _BATCH, True)
    return fn


def takes_batch(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` was marked with :func:`batch`."""
    return bool(getattr(fn, _BATCH, False))


@dataclass(frozen=True)
class JobSpec:
    job: str
    inputs: tuple[str, ...]
    output: str
    parallelism: int = 1
    version: str = "1"
    interval: float = 1.0
    """Own checkpoint interval of unaligned epochs, in seconds."""
    mode: Mode = "exactly_once"
    epochs_per_checkpoint: int = 1
    """Aligned mode: subject epochs per job epoch (thesis 8.2.5 variable intervals)."""
    deterministic: bool = True
    per_key_order: bool = False
    follows: str | None = None
    """Run as the new version of this (aligned) job: same epochs, output voided until a hot-swap."""
    output_partitions: tuple[int, ...] | None = None
    """The output partitions this job's producers share (default: all); a new version beside an old
    one writes other partitions of the same target."""
    state: StateKind = "memory"
    """Where keyed state lives between epochs: in memory, in RocksDB under ``state_dir`` (state larger
    than memory; a restart on the same disk replays only the changelog's tail), or nowhere (a
    stateless job writes no changelog)."""
    state_dir: str | None = None
    """RocksDB stores go to ``state_dir/{job}-{worker}`` (state "rocksdb" only)."""
    state_snapshot_every: int = 1000
    """Every N job epochs a worker writes its whole state into the changelog (its *state base*): a restore
    replays from the latest base, and retention collects the changelog's epochs below every worker's
    base. Costs one write of the whole state per N epochs."""
    inherit_state: bool = False
    """A new version (``follows``) starts from the old version's keyed state and input positions as of
    the epoch before its first, instead of rebuilding its state from the start of its inputs: for a
    change of logic that keeps the state's format. The new version may run another parallelism: each worker
    takes over the keys of its partitions (:mod:`aligner.keys`)."""

    engine: Engine = "runtime"
    """What runs the job, recorded for operators (the Faust adapter says "faust")."""
    shadow: bool = False
    """A new version (``follows``) writes what it voids to its private subject ``{job}.shadow``, epoch
    for epoch, so it can be compared with the old version before the swap (``aligner verify``)."""

    @property
    def shadow_subject(self) -> str | None:
        return f"{self.job}.shadow" if self.shadow else None

    @property
    def changelog(self) -> str | None:
        """The subject that holds this job's keyed state, one partition per worker."""
        return None if self.state == "none" else f"{self.job}.state"

    def node(self) -> JobNode:
        return JobNode(job=self.job, version=self.version, inputs=self.inputs, output=self.output,
                       parallelism=self.parallelism, deterministic=self.deterministic,
                       per_key_order=self.per_key_order, mode=self.mode, follows=self.follows,
                       output_partitions=self.output_partitions, shadow=self.shadow_subject, engine=self.engine)
