"""The PNG timeline of a run: faults as bands, committed epochs and end-to-end latency per subject."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "kill-worker": "tab:red", "kill-coordinator": "tab:purple", "kill-marker": "tab:brown", "kill-spark": "tab:orange",
    "kill-faust": "tab:pink", "pause-zk": "tab:olive", "pause-broker": "tab:cyan", "restart-zk": "tab:green",
    "expire-session": "tab:gray", "op": "black",
}


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    started = report["started"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True, height_ratios=(3, 2))
    seen: set[str] = set()
    for ev in report["events"]:
        kind = ev["kind"]
        if kind not in COLORS:
            continue
        width = max(ev["duration"], 0.4)
        label = None if kind in seen else kind
        seen.add(kind)
        for ax in (top, bottom):
            if kind == "op":
                ax.axvline(ev["at"], color="black", lw=0.8, ls="--", label=label if ax is top else None)
            else:
                ax.axvspan(ev["at"], ev["at"] + width, color=COLORS[kind], alpha=0.25,
                           label=label if ax is top else None)
        if kind == "op":
            top.annotate(ev["target"], (ev["at"], 1.0), xycoords=("data", "axes fraction"), rotation=90,
                         fontsize=7, va="top", ha="right")
    for subject, s in report["check"]["series"].items():
        if s["commits"]:
            xs, ys = zip(*((t - started, e) for t, e in s["commits"]), strict=True)
            top.step(xs, ys, where="post", label=f"{subject} epochs")
        if s["latency"] and subject != "in":  # the input's own latency is zero by definition
            xs, ys = zip(*((t - started, max(lat, 1e-3)) for t, lat in s["latency"]), strict=True)
            bottom.plot(xs, ys, ".", ms=3, label=subject)
    top.set_ylabel("committed epoch")
    bottom.set_ylabel("latency from input epoch (s)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds since start")
    totals = report["check"]["anomalies"]["totals"]
    top.set_title(f"chaos run seed {report['seed']}: {report['faults_total']} faults, "
                  f"{report['check']['records_checked']:,} records checked, {sum(totals.values())} anomalies")
    top.legend(fontsize=7, ncol=4, loc="upper left")
    bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
