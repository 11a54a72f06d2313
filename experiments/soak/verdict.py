"""The soak's figures (growth, slopes, CPU) and its verdict: a stall, an anomaly, or growth after the first
retention window fails it, with one line saying why."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

GROWTH_LIMIT = 0.10
"""Flat within 10 % after the first retention window (issue 23's acceptance)."""
EDGE = 3
"""Least samples whose median stands for the start and the end of the measured span (one sample is noise)."""
EDGE_SHARE = 8
"""...and at least an eighth of the span at each end: a component the nemesis kills restarts small and
takes minutes to fill its heap again (a JVM), so over a long soak a few samples at an edge can all be dips."""

Sample = dict[str, Any]
Getter = Callable[[Sample], float | None]


def mntr_key(key: str) -> Getter:
    return lambda s: (s["mntr"] or {}).get(key)


def rss_of(group: str) -> Getter:
    return lambda s: s["rss"].get(group)


WORKER = re.compile(r"^(?P<job>[A-Za-z_]+)\d*-\d+$")
"""A job worker's process group, ``{job}{version}-{worker}`` (``A-0``, ``A12-3``)."""


def role(group: str) -> str:
    """What a process group does: every version's workers of one job share a role."""
    m = WORKER.match(group)
    return f"{m['job']} worker" if m else group


def components_rss(s: Sample) -> float:
    """The chain's components held to the bound, one process per role (a job's workers averaged): a swap
    that rescales changes how many workers run, not what each keeps, so a plain sum grows with parallelism."""
    by_role: dict[str, list[float]] = {}
    for group, rss in s["rss"].items():
        if group not in ("zookeeper", *NOT_HELD_TO_IT):
            by_role.setdefault(role(group), []).append(float(rss))
    return sum(statistics.mean(v) for v in by_role.values())


GROWTH_CHECKED: dict[str, Getter] = {
    "znodes": mntr_key("zk_znode_count"), "zk_data_bytes": mntr_key("zk_approximate_data_size"),
    "zookeeper_rss": rss_of("zookeeper"), "components_rss": components_rss,
}
REPORTED: dict[str, Getter] = {**GROWTH_CHECKED, "broker_rss": rss_of("broker"),
                               "zk_watches": mntr_key("zk_watch_count"), "zk_dir_bytes": lambda s: s["zk_dir_bytes"]}
RSS_SLOPE_LIMIT = 1.0
"""MB per 10 minutes a process may grow after the window (issue 23's acceptance), on its longest-lived run."""
RSS_MIN_SPAN = 600.0
"""Seconds a process must have lived after the window for its RSS slope to be judged: a component the
nemesis kills every few minutes has only short runs, whose slope is its start-up, not a leak."""
PROCESS_WARMUP = 300.0
"""Seconds of a process's own life before its RSS slope counts (its warm-up, as the soak's window is the
chain's)."""
NOT_HELD_TO_IT = {
    "broker": "the embedded broker (Tansu 0.6, memory storage) keeps every record it was sent and refuses "
              "DeleteRecords: its RSS follows the data written, which a Kafka broker bounds with retention.ms",
    "soak": "the soak itself keeps every sample it takes",
    "producer": "the chaos run's outside producer keeps every acknowledged number, to check the output against",
}
"""Process groups measured and plotted but not held to the growth bounds, and why."""


def points(samples: list[Sample], get: Getter, after: float = 0.0) -> list[tuple[float, float]]:
    out = []
    for s in samples:
        v = get(s)
        if s["t"] >= after and v is not None:
            out.append((float(s["t"]), float(v)))
    return out


def incarnation(samples: list[Sample], group: str, after: float) -> list[tuple[float, float]]:
    """RSS points of the longest-lived process of ``group`` after ``after`` and after its own warm-up
    (a restart starts from scratch: a slope across it, or over a process's first minutes while its caches
    and the interpreter's arenas fill, says nothing about a leak)."""
    runs: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        pid = s.get("pids", {}).get(group)
        if pid is not None and group in s["rss"]:
            runs.setdefault(pid, []).append((float(s["t"]), float(s["rss"][group])))
    warm = [[p for p in pts if p[0] >= max(after, pts[0][0] + PROCESS_WARMUP)] for pts in runs.values()]
    return max(warm, key=len, default=[])


def per_minute(pts: list[tuple[float, float]]) -> float | None:
    """Least-squares slope per minute; None with fewer than 3 points."""
    if len(pts) < 3 or len({t for t, _ in pts}) < 2:
        return None
    slope, _ = statistics.linear_regression([t for t, _ in pts], [v for _, v in pts])
    return slope * 60.0


def growth(pts: list[tuple[float, float]]) -> dict[str, float] | None:
    """Median of the first and of the last samples (EDGE_SHARE) and the relative change; None without 2 x EDGE
    points."""
    if len(pts) < 2 * EDGE:
        return None
    edge = max(EDGE, len(pts) // EDGE_SHARE)
    first = statistics.median(v for _, v in pts[:edge])
    last = statistics.median(v for _, v in pts[-edge:])
    return {"from": first, "to": last, "change": (last - first) / first if first else 0.0}


FLOORS = re.compile(r"floors (.+)$")
"""The part of a retention pass's line naming the subjects whose floor it raised: ``floors a<51, in<8``."""


def floored(gcs: list[dict[str, Any]], until: float = float("inf")) -> set[str]:
    """Subjects whose floor some successful retention pass up to ``until`` raised."""
    out: set[str] = set()
    for g in gcs:
        if g["at"] <= until and g["rc"] == 0 and (m := FLOORS.search((g.get("line") or "").strip())):
            out |= {part.split("<", 1)[0].strip() for part in m.group(1).split(",")}
    return out


def retention_window(window: float, gcs: list[dict[str, Any]], subjects: list[str]) -> float | None:
    """Seconds into the soak from which growth is judged: ``window``, or later, the first retention pass by
    which every subject had its floor raised at least once. Before that, a subject still fills up the epochs
    the policy keeps at least (1,000 by default: 33 minutes for a subject with an epoch every 2 s), and its
    growth is the policy's, not a leak. None while some subject never had a floor (growth not measurable)."""
    for g in [{"at": 0.0}, *gcs]:
        if floored(gcs, g["at"]) >= set(subjects):
            return max(window, float(g["at"]))
    return None


def figures(samples: list[Sample], window: float, growth_from: float | None = None,
            never_held: list[str] | None = None) -> dict[str, Any]:
    """Slopes over the whole soak and after the window (warm-up), growth after ``growth_from`` (default: the
    window; see :func:`retention_window`), CPU of every process group. ``never_held``: subjects retention
    never floored, so that growth is not judged at all."""
    start = window if growth_from is None else growth_from
    out: dict[str, Any] = {"window_s": window, "growth_from_s": None if never_held else start,
                           "retention_never_held": never_held or [], "slope_per_min": {},
                           "slope_per_min_after_window": {}, "growth": {}}
    for name, get in REPORTED.items():
        out["slope_per_min"][name] = per_minute(points(samples, get))
        out["slope_per_min_after_window"][name] = per_minute(points(samples, get, window))
        out["growth"][name] = None if never_held else growth(points(samples, get, start))
    groups = sorted({g for s in samples for g in s["rss"]})
    runs = {g: incarnation(samples, g, window) for g in groups}
    out["rss_span_s_after_window"] = {g: (pts[-1][0] - pts[0][0]) if pts else 0.0 for g, pts in runs.items()}
    out["rss_mb_per_10min_after_window"] = {
        g: None if out["rss_span_s_after_window"][g] < RSS_MIN_SPAN or (m := per_minute(pts)) is None
        else round(m * 10 / 2**20, 2)
        for g, pts in runs.items()}
    out["cpu_percent_mean"] = {g: round(statistics.fmean(v), 1) for g in groups
                               if (v := [s["cpu"][g] for s in samples[1:] if g in s["cpu"]])}
    out["cpu_percent_max"] = {g: max(v) for g in groups if (v := [s["cpu"][g] for s in samples[1:] if g in s["cpu"]])}
    times = [s["status_s"] for s in samples if s["status_s"] is not None]
    out["status_s"] = {"median": statistics.median(times), "max": max(times)} if times else None
    return out


def verdict(stalls: list[dict[str, Any]], result: dict[str, Any] | None, observations: int,
            fig: dict[str, Any], check_growth: bool, gcs: list[dict[str, Any]] | None = None) -> list[str]:
    """Why the soak failed, most important first (empty: it passed)."""
    reasons = [f"stall: {s['why']}" for s in stalls[:1]]
    failed = [g for g in gcs or [] if g["rc"] != 0]
    if failed:  # retention that stops working is growth to come
        why = (failed[0].get("stderr") or failed[0].get("line") or "").strip().splitlines()
        reasons.append(f"retention failed {len(failed)} of {len(gcs or [])} runs (first at {failed[0]['at']:.0f}s: "
                       f"{why[-1] if why else 'exit ' + str(failed[0]['rc'])})")
    if result is not None and result.get("error"):
        reasons.append(f"the run broke: {result['error']}")
    elif result is not None and result.get("check") is not None:
        totals = result["check"]["anomalies"]["totals"]
        if sum(totals.values()):
            reasons.append(f"anomalies: { {k: v for k, v in totals.items() if v} }")
    if observations:
        reasons.append(f"{observations} components exited unasked (see the JSON's observations)")
    if check_growth and fig.get("retention_never_held"):
        reasons.append("growth not measured: retention never raised the floor of "
                       + ", ".join(fig["retention_never_held"]) + " (each still held fewer epochs than it keeps)")
    elif check_growth:
        for name in GROWTH_CHECKED:
            g = fig["growth"].get(name)
            if g is None:
                reasons.append(f"growth not measured: fewer than {2 * EDGE} samples of {name} after "
                               f"{fig.get('growth_from_s', fig['window_s']):.0f}s")
            elif g["change"] > GROWTH_LIMIT:
                reasons.append(f"growth after the first retention window: {name} {g['change']:+.0%} "
                               f"({g['from']:,.0f} -> {g['to']:,.0f})")
        steep = {g: m for g, m in fig.get("rss_mb_per_10min_after_window", {}).items()
                 if g not in NOT_HELD_TO_IT and m is not None and m > RSS_SLOPE_LIMIT}
        if steep:
            reasons.append(f"RSS grows over {RSS_SLOPE_LIMIT:g} MB per 10 min after the window: "
                           + ", ".join(f"{g} {m:+.2f}" for g, m in sorted(steep.items())))
    return reasons
