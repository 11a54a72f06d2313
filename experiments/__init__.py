"""The demo (``demo``), the thesis's experiments (``suite``, on the hotness chain of ``chain``) and
benchmarks against raw baselines (``bench_*``), each run as ``python -m experiments.<name>`` on its
own embedded stack."""

from __future__ import annotations

import contextlib
import os
import time


def _busy_ticks() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3, the state, is index 0); empty once
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # gone, or gone while being read (an empty file)
        return []


def _process_ticks(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0  # utime + stime, all threads


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has used so far, all its threads (0 once it is gone)."""
    return _process_ticks(pid) / os.sysconf("SC_CLK_TCK")


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Keep every thread of process ``pid`` on ``cpus`` (threads it starts later inherit it).

    ``sched_setaffinity`` on a pid moves only its main thread; a JVM's or librdkafka's threads are
    each a task of their own.
    """
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(int(task), cpus)


class ForeignCpu:
    """How many cores processes other than ours (this one, ZooKeeper, Tansu) kept busy meanwhile.

    The machines have two cores; a benchmark sharing them with a test suite gives noisy ratios, and
    this number says so in the results instead of leaving it to guesswork.
    """

    def __init__(self, *pids: int) -> None:
        self.pids = (os.getpid(), *pids)
        self.ours = sum(_process_ticks(p) for p in self.pids)
        self.busy = _busy_ticks()
        self.t0 = time.monotonic()

    def cores(self) -> float:
        hz = os.sysconf("SC_CLK_TCK")
        ours = sum(_process_ticks(p) for p in self.pids) - self.ours
        foreign = max(0, _busy_ticks() - self.busy - ours)
        return foreign / hz / max(1e-9, time.monotonic() - self.t0)
