"""The changelog's record format: JSON state values, state keys as record keys, deletes as tombstones."""

from __future__ import annotations

import json
from typing import Any


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
