"""The backends of a store's committed base: in memory, or RocksDB (rocksdict) for state larger than memory.

The RocksDB base survives a restart on the same disk, tagged with its epoch in the same write batch as the
changes it covers; a store that does not open or whose checksums fail is damaged (:class:`StateDamagedError`),
one held by another process is a deployment mistake, said first.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from aligner.connectors.runtime.state_overlay import StateStore
from aligner.connectors.runtime.state_tag import Tag
from aligner.errors import AlignerError, StateDamagedError


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
        except Exception as exc:  # rocksdict's checksum failure is a bare Exception, a tag that does not parse
            # a ValueError or KeyError: either way the store is damaged, and said so (never silently reused)
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
        except Exception as exc:  # rocksdict's iterator reports corruption as a bare Exception: raised as damage
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
