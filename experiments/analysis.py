"""From a chain run's per-operator epoch records to the series and numbers the experiments report."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from experiments.chain import JOB2, ChainResult


@dataclass(frozen=True)
class EpochPoint:
    """One epoch of an operator, all its workers together."""

    epoch: int
    t: float
    """Seconds since the run started, at the commit."""
    mode: str
    count: int
    avg_ms: float
    max_ms: float
    checkpoint_ms: float
    visible_avg_ms: float

    def latency(self, metric: str) -> float:
        return float(getattr(self, metric))


def epoch_series(run: ChainResult, operator: str = JOB2, after: float | None = None,
                 before: float | None = None) -> list[EpochPoint]:
    """Per-epoch latency of ``operator`` between ``after`` and ``before`` (seconds into the run)."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for r in run.operator(operator):
        t = r.committed_at - run.started
        if r.count and (after is None or t >= after) and (before is None or t <= before):
            groups[r.epoch].append(r)
    points = []
    for epoch, rs in sorted(groups.items()):
        n = sum(r.count for r in rs)
        points.append(EpochPoint(
            epoch=epoch, t=max(r.committed_at for r in rs) - run.started, mode=rs[0].mode, count=n,
            avg_ms=sum(r.avg_ms * r.count for r in rs) / n, max_ms=max(r.max_ms for r in rs),
            checkpoint_ms=max(r.checkpoint_ms for r in rs),
            visible_avg_ms=sum(r.visible_avg_ms * r.count for r in rs) / n,
        ))
    return points


def since_start(run: ChainResult, event: str) -> float:
    return run.events[event] - run.started


def steady(run: ChainResult, warmup: float) -> list[EpochPoint]:
    """The measured part of a run: after warm-up (or after alignment) and before the input ends."""
    after = warmup
    if "align job2 decided" in run.events:
        after = since_start(run, "align job2 decided") + 2 * run.config.interval
    return epoch_series(run, after=after, before=run.input_end)


def before_after(run: ChainResult, warmup: float) -> tuple[list[EpochPoint], list[EpochPoint]]:
    """Epochs of the exactly-once part and of the aligned part of a transition run."""
    requested = since_start(run, "align job1 requested")
    decided = since_start(run, "align job2 decided")
    before = [p for p in epoch_series(run, after=warmup, before=requested) if p.mode != "aligned"]
    after = [p for p in epoch_series(run, after=decided + 2 * run.config.interval, before=run.input_end)
             if p.mode == "aligned"]
    return before, after


def median(points: list[EpochPoint], metric: str) -> float:
    return statistics.median(p.latency(metric) for p in points) if points else float("nan")


def summary(points: list[EpochPoint]) -> dict[str, float]:
    """Medians over epochs, and the spread (stdev) of the per-epoch average: the stability measure."""
    vals = [p.avg_ms for p in points]
    return {"epochs": len(points), "median_avg_ms": median(points, "avg_ms"),
            "median_max_ms": median(points, "max_ms"), "median_checkpoint_ms": median(points, "checkpoint_ms"),
            "median_visible_avg_ms": median(points, "visible_avg_ms"),
            "stdev_avg_ms": statistics.stdev(vals) if len(vals) > 1 else 0.0}


def points_json(points: list[EpochPoint]) -> list[dict[str, Any]]:
    return [asdict(p) for p in points]
