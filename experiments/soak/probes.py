"""What a soak sample reads: ZooKeeper's ``mntr``, a directory's size on disk, and process trees from /proc.

The project has no psutil: RSS and CPU come from ``/proc/PID/stat`` as in :mod:`experiments` (ForeignCpu).
A component is measured with its descendants (the Spark driver's JVM is a child of its Python process).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MNTR_KEYS = ("zk_znode_count", "zk_approximate_data_size", "zk_watch_count", "zk_num_alive_connections")
PAGE = os.sysconf("SC_PAGE_SIZE")
HZ = os.sysconf("SC_CLK_TCK")


def mntr(address: str, timeout: float = 5.0) -> dict[str, int] | None:
    """ZooKeeper's ``mntr`` four-letter word (whitelisted by the embedded stack's zoo.cfg); None when it does
    not answer in time (paused or restarting: the nemesis is at work)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall(b"mntr")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    out = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        key, _, value = line.partition("\t")
        if key in MNTR_KEYS and value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out or None


def dir_bytes(path: Path) -> int:
    """Bytes on disk of the files under ``path`` (ZooKeeper's snapshots and transaction logs)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512  # on disk, as du: logs are preallocated
            except OSError:  # a log ZooKeeper purged meanwhile
                continue
    return total


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    ticks: int
    """utime + stime of every thread."""
    rss: int
    """Resident bytes."""


def process_table() -> dict[int, ProcStat]:
    """Every process now: parent, CPU ticks, RSS."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(name)] = ProcStat(int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE)
    return table


def tree(table: Mapping[int, ProcStat], pid: int) -> list[int]:
    """``pid`` and its descendants (empty when it is gone)."""
    if pid not in table:
        return []
    children: dict[int, list[int]] = {}
    for p, st in table.items():
        children.setdefault(st.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, sum(fields[:8])


class CpuMeter:
    """CPU share (100 = one core) of groups of processes between two readings, per pid so that restarts
    (a new pid) count from their start and the dead ones stop counting."""

    def __init__(self) -> None:
        self.ticks = {p: st.ticks for p, st in process_table().items()}
        self.machine = machine_busy_ticks()

    def measure(self, groups: Mapping[str, list[int]], table: Mapping[int, ProcStat],
                seconds: float) -> tuple[dict[str, float], float]:
        """(CPU % per group, busy cores of the whole machine) since the last call."""
        out = {}
        for name, pids in groups.items():
            used = sum(table[p].ticks - self.ticks.get(p, 0) for p in pids if p in table)
            out[name] = round(100.0 * used / HZ / max(seconds, 1e-6), 1)
        self.ticks = {p: st.ticks for p, st in table.items()}
        busy, total = machine_busy_ticks()
        cores = (busy - self.machine[0]) / max(1, total - self.machine[1]) * (os.cpu_count() or 1)
        self.machine = (busy, total)
        return out, round(cores, 2)
