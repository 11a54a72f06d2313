"""A worker's keyed state as two layers: the committed base (a backend's) and the open epoch's overlay.

The overlay holds the keys changed since the last committed epoch, so an aborted epoch costs nothing to
undo (``rollback`` drops it) and a committed one is applied to the base with its tag in one atomic write
(``mark_committed``). The backends (:mod:`aligner.connectors.runtime.state_stores`) implement the base;
restore (:mod:`aligner.connectors.runtime.state_restore`) rebuilds it from the changelog.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

from aligner.connectors.runtime.state_codec import encode_change, encode_value
from aligner.connectors.runtime.state_restore import Restored, restore_into
from aligner.connectors.runtime.state_tag import Tag
from aligner.errors import AlignerError
from aligner.ledger import Ledger


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

    def mark_changed(self, keys: Iterable[str]) -> None:
        """``keys`` count as changed in the open epoch with their committed values (an effect of 0 on ``len``):
        the next changelog epoch writes a record of each that supersedes any stray one (restore's repair)."""
        for key in keys:
            self._overlay[key] = self._base_get(key)

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

    def reset(self, tag: Tag) -> None:
        """Empty the base and tag it (a restore that replays from the writer's start or from a state base)."""
        self._base_clear()
        self._base_apply((), tag)

    # ---- restore ----
    def restore(self, ledger: Ledger, bootstrap: str, subject: str, partition: int, upto_epoch: int | None, *,
                since: int | None = None, repair: bool = False, stall_timeout: float = 30.0,
                consumer_extra: dict[str, Any] | None = None) -> Restored:
        """Make the store the state as of changelog epoch ``upto_epoch`` of ``partition`` (None: empty); see
        :func:`aligner.connectors.runtime.state_restore.restore_into`."""
        return restore_into(self, ledger, bootstrap, subject, partition, upto_epoch, since=since, repair=repair,
                            stall_timeout=stall_timeout, consumer_extra=consumer_extra)
