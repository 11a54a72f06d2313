"""A Prometheus exporter for a whole deployment, read from the ledger (`aligner exporter`).

Workers and markers export what only they know (commit latency, ZooKeeper round trips, seconds
waiting for input) on their own ``--metrics-port``; this process exports what the ledger knows
about everyone: subject frontiers, each job's lag and alignment state, hot-swap phases and Spark
queries. A background loop refreshes a snapshot every few seconds, so a scrape never waits on
ZooKeeper and an outage shows as a stale snapshot (``aligner_exporter_up`` 0), not a hung scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import KazooException
from prometheus_client.core import GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from aligner.alignment import State
from aligner.coordinator.alignment import Coordinator
from aligner.errors import AlignerError
from aligner.ledger import Ledger
from aligner.lineage import query_statuses
from aligner.models import now_ms
from aligner.swap import Phase

log = logging.getLogger(__name__)

STATES = [s.value for s in State]
PHASES = [p.value for p in Phase]


@dataclass
class Snapshot:
    """What the ledger said at ``taken`` (monotonic seconds)."""

    taken: float
    subjects: dict[str, tuple[int | None, float | None]] = field(default_factory=dict)
    """Subject: (last committed epoch, seconds since it committed)."""
    retained: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Subject: (first retained epoch, epoch records held): what retention keeps bounded."""
    sources: list[dict[str, Any]] = field(default_factory=list)
    """One row per (job, input subject), as ``aligner status`` shows it."""
    swaps: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)


def take(ledger: Ledger) -> Snapshot:
    snap = Snapshot(taken=time.monotonic())
    for subject in ledger.subjects.subject_names():
        last = ledger.epochs.frontier(subject)  # the newest bucket's listing; the count from the buckets' stats
        age = None if last is None else max(0.0, (now_ms() - ledger.epochs.committed(subject,
                                                                                     last).committed_at) / 1000)
        snap.subjects[subject] = (last, age)
        snap.retained[subject] = (ledger.subjects.first_retained(subject), ledger.subjects.epoch_count(subject))
    coordinator = Coordinator(ledger)
    for job in coordinator.jobs.job_names():
        for row in coordinator.status(job)["sources"]:
            snap.sources.append({"job": job, **row})
        swap, _ = coordinator.jobs.swap(job)
        if swap is not None:
            snap.swaps.append(swap.model_dump())
    snap.queries = query_statuses(ledger)
    return snap


class LedgerCollector(Collector):
    """Serves the last snapshot; the refresh loop (:meth:`run`) keeps it current."""

    def __init__(self, ledger: Ledger, interval: float = 5.0) -> None:
        self.ledger = ledger
        self.interval = interval
        self.snapshot: Snapshot | None = None
        self.up = False

    def refresh(self) -> None:
        try:
            self.snapshot, self.up = take(self.ledger), True
        except Exception as exc:  # an outage or a malformed node: keep serving the last snapshot, marked stale
            if self.up:  # anything unexpected is logged with its traceback: a scrape never hides a bug
                log.warning("exporter: the ledger could not be read (%s); serving the last snapshot", exc,
                            exc_info=not isinstance(exc, (AlignerError, KazooException)))
            self.up = False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.refresh()
            stop.wait(self.interval)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("aligner_exporter_up", "1 if the last ledger read succeeded")
        up.add_metric([], 1.0 if self.up else 0.0)
        yield up
        snap = self.snapshot
        if snap is None:
            return
        age = GaugeMetricFamily("aligner_exporter_snapshot_age_seconds", "Seconds since the snapshot was taken")
        age.add_metric([], time.monotonic() - snap.taken)
        yield age
        yield from _subjects(snap)
        yield from _sources(snap)
        yield from _swaps(snap)
        yield from _queries(snap)


def _subjects(snap: Snapshot) -> Iterator[Metric]:
    last = GaugeMetricFamily("aligner_subject_last_epoch", "Last committed epoch of a subject", labels=["subject"])
    age = GaugeMetricFamily("aligner_subject_last_commit_age_seconds",
                            "Seconds since a subject's last epoch committed", labels=["subject"])
    first = GaugeMetricFamily("aligner_subject_first_retained_epoch",
                              "A subject's first retained epoch (retention's floor)", labels=["subject"])
    held = GaugeMetricFamily("aligner_subject_retained_epochs", "Epoch records a subject holds in ZooKeeper",
                             labels=["subject"])
    for subject, (epoch, seconds) in snap.subjects.items():
        if epoch is not None and seconds is not None:
            last.add_metric([subject], epoch)
            age.add_metric([subject], seconds)
    for subject, (floor, count) in snap.retained.items():
        first.add_metric([subject], floor)
        held.add_metric([subject], count)
    yield from (last, age, first, held)


def _sources(snap: Snapshot) -> Iterator[Metric]:
    labels = ["job", "subject"]
    lag = GaugeMetricFamily("aligner_job_lag_epochs", "Committed input epochs a job has not consumed", labels=labels)
    lag_s = GaugeMetricFamily("aligner_job_lag_seconds", "Age of the oldest input epoch a job has not consumed",
                              labels=labels)
    waiting = GaugeMetricFamily("aligner_job_waiting_seconds",
                                "Seconds a job has been idle waiting for its next input epoch (0 when reading)",
                                labels=labels)
    state = StateSetMetricFamily("aligner_job_alignment_state", "Alignment state of a job's input", labels=labels)
    for r in snap.sources:
        key = [r["job"], r["subject"]]
        lag.add_metric(key, r["lag_epochs"])
        lag_s.add_metric(key, r["lag_seconds"])
        waiting.add_metric(key, r["waiting_seconds"] or 0.0)
        state.add_metric(key, {s: s == r["state"] for s in STATES})
    yield from (lag, lag_s, waiting, state)


def _swaps(snap: Snapshot) -> Iterator[Metric]:
    labels = ["old", "new", "target"]
    phase = StateSetMetricFamily("aligner_swap_phase", "Phase of a hot-swap", labels=labels)
    epoch = GaugeMetricFamily("aligner_swap_epoch", "Swap epoch S of a hot-swap", labels=labels)
    for s in snap.swaps:
        key = [s["old"], s["new"], s["target"]]
        phase.add_metric(key, {p: p == s["phase"] for p in PHASES})
        epoch.add_metric(key, s["epoch"])
    yield phase
    yield epoch


def _queries(snap: Snapshot) -> Iterator[Metric]:
    batch = GaugeMetricFamily("aligner_spark_query_last_batch", "Last micro-batch of a Spark query", labels=["query"])
    labels = ["query", "subject"]
    behind = GaugeMetricFamily("aligner_spark_query_behind_epochs",
                               "Committed epochs of an input past a Spark query's last batch", labels=labels)
    behind_s = GaugeMetricFamily("aligner_spark_query_behind_seconds",
                                 "Age of the oldest input epoch a Spark query has not read", labels=labels)
    for q in snap.queries:
        if q["batch"] is not None:
            batch.add_metric([q["query"]], q["batch"])
        for subject, r in q["subjects"].items():
            behind.add_metric([q["query"], subject], r["behind_epochs"])
            behind_s.add_metric([q["query"], subject], r["behind_seconds"])
    yield from (batch, behind, behind_s)
