"""The soak's PNG: ZooKeeper size, RSS and CPU per process, ``aligner status`` time and frontiers over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MB = 2**20
TOP = 8
"""Process groups drawn in the RSS and CPU panels (the largest; the JSON has all)."""


def _minutes(samples: list[dict[str, Any]]) -> list[float]:
    return [s["t"] / 60 for s in samples]


def _groups(samples: list[dict[str, Any]], key: str) -> list[str]:
    peak: dict[str, float] = {}
    for s in samples:
        for g, v in s[key].items():
            peak[g] = max(peak.get(g, 0.0), v)
    keep = sorted(peak, key=lambda g: -peak[g])[:TOP]
    return sorted(set(keep) | ({"zookeeper", "broker"} & set(peak)))


def _series(samples: list[dict[str, Any]], key: str, group: str, scale: float = 1.0) -> list[float]:
    return [s[key][group] / scale if group in s[key] else float("nan") for s in samples]


def _marks(axes: Any, report: dict[str, Any]) -> None:
    """Stalls (red) and committed hot-swaps (dotted) on every panel."""
    for ax in axes:
        for stall in report["stalls"]:
            ax.axvline(stall["at"] / 60, color="red", lw=1.2)
        for swap in report["swaps"]:
            ax.axvline(swap / 60, color="gray", ls=":", lw=0.8)


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    x = _minutes(samples)
    fig, axes = plt.subplots(3, 2, figsize=(14, 11), sharex=True)
    (zk, disk), (rss, cpu), (status, front) = axes
    zk.plot(x, [(s["mntr"] or {}).get("zk_znode_count", float("nan")) for s in samples], "o-", ms=3, label="znodes")
    zk.set_ylabel("znodes")
    size = zk.twinx()
    size.plot(x, [(s["mntr"] or {}).get("zk_approximate_data_size", float("nan")) / MB for s in samples], "s-",
              ms=3, color="tab:orange", label="approximate data size")
    size.set_ylabel("ZooKeeper data size (MB)")
    zk.legend(loc="upper left", fontsize=8)
    size.legend(loc="lower right", fontsize=8)
    disk.plot(x, [s["zk_dir_bytes"] / MB for s in samples], "o-", ms=3, label="data dir on disk (MB)")
    disk.plot(x, [(s["mntr"] or {}).get("zk_watch_count", float("nan")) / 1000 for s in samples], "s-", ms=3,
              label="watches (thousands)")
    disk.legend(fontsize=8)
    for g in _groups(samples, "rss"):
        rss.plot(x, _series(samples, "rss", g, MB), ".-", ms=3, label=g)
    rss.set_ylabel("RSS (MB)")
    rss.legend(fontsize=7, ncol=2)
    for g in _groups(samples, "cpu"):
        cpu.plot(x[1:], _series(samples[1:], "cpu", g), ".-", ms=3, label=g)
    cpu.plot(x[1:], [s["machine_busy_cores"] * 100 for s in samples[1:]], "k--", lw=0.8, label="whole machine")
    cpu.set_ylabel("CPU (% of one core)")
    cpu.legend(fontsize=7, ncol=2)
    status.plot(x, [s["status_s"] if s["status_s"] is not None else float("nan") for s in samples], "o-", ms=3)
    status.set_ylabel("aligner status --json (s)")
    for subject in sorted({k for _, f in report["frontiers"] for k in f}):
        pts = [(t / 60, f[subject]) for t, f in report["frontiers"] if subject in f]
        front.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=subject)
    front.set_ylabel("frontier (last committed epoch)")
    front.legend(fontsize=8)
    _marks(axes.flat, report)
    for ax in axes[-1]:
        ax.set_xlabel("minutes since start")
    verdict = "passed" if report["passed"] else f"failed ({len(report['verdict'])}): {report['verdict'][0]}"
    fig.suptitle(f"soak seed {report['seed']}, {report['minutes']:g} min: {verdict}"[:150], fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
