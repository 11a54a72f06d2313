"""A streaming query's checkpoint made startable again after its driver was killed mid-write.

Spark writes each entry of a checkpoint's offset and commit logs to a hidden temporary file
(``.0.<uuid>.tmp``) and renames it into place; a driver killed between the two leaves the temporary file.
Spark never reads one, but since SPARK-53103 a query whose offset log has no entry yet refuses to start
while the log's directory holds anything: a driver killed while writing its first batch's offsets could
never be restarted from that checkpoint (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``; met by the chaos
run). Removing the leftovers loses nothing: they hold no committed entry.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)

LOGS = ("offsets", "commits")
"""The checkpoint's write-ahead logs whose entries Spark writes through temporary files."""


def unfinished(name: str) -> bool:
    """Whether a file of a checkpoint log is a leftover temporary file (with its Hadoop checksum file)."""
    return name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc"))


def clear_unfinished_writes(checkpoint: str, spark: Any = None) -> list[str]:
    """Remove the leftover temporary files of a checkpoint's offset and commit logs; returns what was removed.
    Call it before ``start()``, never beside a running query of the same checkpoint. With ``spark`` (a classic
    session) the path is resolved as Spark resolves ``checkpointLocation``, through its Hadoop FileSystem (any
    scheme: ``hdfs:``, ``s3a:``, a bare path on the default file system); without one, local paths and
    ``file:`` URIs are cleared directly and others are left as they are."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        return _clear_hadoop(jvm, spark._jsc.hadoopConfiguration(), checkpoint)
    url = urlparse(checkpoint)
    if url.scheme in ("", "file"):
        return _clear_local(Path(url.path if url.scheme else checkpoint))
    log.warning("checkpoint %s: its leftover temporary files are not checked (no Spark session to reach it)",
                checkpoint)
    return []


def _clear_local(root: Path) -> list[str]:
    removed = []
    for name in LOGS:
        folder = root / name
        if folder.is_dir():
            for f in sorted(folder.iterdir()):
                if f.is_file() and unfinished(f.name):
                    f.unlink(missing_ok=True)
                    removed.append(str(f))
    _said(removed)
    return removed


def _clear_hadoop(jvm: Any, conf: Any, checkpoint: str) -> list[str]:
    removed = []
    for name in LOGS:
        folder = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{name}")
        fs = folder.getFileSystem(conf)
        if not fs.exists(folder):
            continue
        for status in fs.listStatus(folder):
            path = status.getPath()
            if status.isFile() and unfinished(path.getName()):
                fs.delete(path, False)
                removed.append(path.toString())
    _said(removed)
    return removed


def _said(removed: list[str]) -> None:
    if removed:
        log.warning("removed %d unfinished checkpoint write(s) a killed driver left: %s", len(removed),
                    ", ".join(removed))
