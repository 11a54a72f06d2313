"""Matplotlib figures of the experiments, laid out like the thesis's (chapter 6)."""

from __future__ import annotations

import itertools
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from experiments.analysis import EpochPoint, epoch_series, since_start
from experiments.chain import ChainResult, RunMode

LABEL = {"at_least_once": "at-least-once", "exactly_once": "exactly-once", "aligned": "aligned"}
COLOR = {"at_least_once": "tab:green", "exactly_once": "tab:blue", "aligned": "tab:orange"}


def close(fig: Figure) -> None:
    plt.close(fig)


def _series(ax: Any, pts: list[EpochPoint], title: str) -> None:
    t = [p.t for p in pts]
    ax.plot(t, [p.max_ms for p in pts], ".-", color="tab:red", lw=0.8, ms=3, label="max latency")
    ax.plot(t, [p.avg_ms for p in pts], ".-", color="tab:blue", lw=0.8, ms=3, label="average latency")
    ax.plot(t, [p.checkpoint_ms for p in pts], ":", color="tab:gray", lw=0.8, label="checkpoint latency")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)


def modes(series: dict[RunMode, list[EpochPoint]], interval: float) -> Figure:
    fig = plt.figure(figsize=(13, 7.5))
    grid = fig.add_gridspec(2, len(series))
    top = max((p.checkpoint_ms for pts in series.values() for p in pts), default=1.0) * 1.05
    for i, (mode, pts) in enumerate(series.items()):
        ax = fig.add_subplot(grid[0, i])
        _series(ax, pts, f"{LABEL[mode]}: job 2 per epoch (Fig 6.7)")
        ax.set_ylim(0, top)
        if i == 0:
            ax.legend(fontsize=7)
    ax = fig.add_subplot(grid[1, :])
    data, labels = [], []
    for mode, pts in series.items():
        data += [[p.avg_ms for p in pts], [p.checkpoint_ms for p in pts]]
        labels += [f"{LABEL[mode]}\naverage", f"{LABEL[mode]}\ncheckpoint"]
    ax.boxplot(data, tick_labels=labels)
    ax.axhline(1000 * interval, color="gray", ls="--", lw=0.8, label=f"checkpoint interval {interval}s")
    ax.set_ylabel("ms per epoch")
    ax.set_title("latency at the final operator by processing mode (Fig 6.8)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def interval(results: dict[str, dict[float, dict[str, float]]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, by in results.items():
        ivs = sorted(by)
        axes[0].plot(ivs, [by[i]["median_avg_ms"] for i in ivs], "o-", color=COLOR[mode], label=LABEL[mode])
        axes[1].plot(ivs, [by[i]["median_checkpoint_ms"] for i in ivs], "o-", color=COLOR[mode], label=LABEL[mode])
    every = sorted({i for by in results.values() for i in by})
    for ax, what in zip(axes, ("average latency", "checkpoint latency"), strict=True):
        ax.plot(every, [1000 * i for i in every], "--", color="gray", lw=0.8, label="one interval")
        ax.set_xlabel("checkpoint interval (s)")
        ax.set_ylabel("median over epochs (ms)")
        ax.set_title(f"job 2 {what} by checkpoint interval (Fig 6.9)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _events(ax: Any, run: ChainResult) -> None:
    for name, style in (("align job1 requested", ":"), ("align job2 decided", "--"), ("swap decided", "-.")):
        if name in run.events:
            ax.axvline(since_start(run, name), color="black", ls=style, lw=0.8, label=name)


def transition(runs: dict[int, ChainResult]) -> Figure:
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.5), squeeze=False)
    for ax, (p, run) in zip(axes[0], runs.items(), strict=True):
        _series(ax, epoch_series(run), f"exactly-once -> aligned, parallelism {p} (Fig 6.11)")
        _events(ax, run)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def repeat(out: dict[float, list[dict[str, Any]]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    data, labels = [], []
    for iv, ss in out.items():
        data += [[s["before"]["median_visible_avg_ms"] for s in ss], [s["after"]["median_visible_avg_ms"] for s in ss]]
        labels += [f"{iv}s\nexactly-once", f"{iv}s\naligned"]
    axes[0].boxplot(data, tick_labels=labels)
    axes[0].set_ylabel("median visible latency per run (ms)")
    axes[0].set_title("before and after alignment, per run (Fig 6.12)", fontsize=9)
    axes[1].boxplot([[s["increase_visible_intervals"] for s in ss] for ss in out.values()],
                    tick_labels=[f"{iv}s" for iv in out])
    axes[1].axhline(1.0, color="gray", ls="--", lw=0.8, label="thesis bound: ~1 interval")
    axes[1].axhline(0.5, color="gray", ls=":", lw=0.8, label="thesis average: ~0.5 interval")
    axes[1].axhline(0.0, color="black", lw=0.5)
    axes[1].set_ylabel("increase, in checkpoint intervals")
    axes[1].set_xlabel("checkpoint interval")
    axes[1].set_title("increase of latency after alignment", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def hotswap(run: ChainResult, pts: list[EpochPoint], commit_times: dict[int, float], swap_epoch: int) -> Figure:
    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    _series(axes[0], pts, "job 2 latency while job 1 is hot-swapped v1 -> v2")
    _events(axes[0], run)
    axes[0].legend(fontsize=7)
    epochs = sorted(commit_times)
    t = [commit_times[e] for e in epochs[1:]]
    gaps = [commit_times[e] - commit_times[p] for p, e in itertools.pairwise(epochs)]
    colors = ["tab:red" if e == swap_epoch + 1 else "tab:blue" for e in epochs[1:]]
    axes[1].bar(t, gaps, width=0.25, color=colors)
    axes[1].set_ylabel("s since previous hot-issues epoch")
    axes[1].set_xlabel("seconds into the run")
    axes[1].set_title(f"hot-issues epoch commits (red: S+1 = {swap_epoch + 1}, first epoch of v2)", fontsize=9)
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    return fig


def parallelism(series: dict[RunMode, dict[int, list[EpochPoint]]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, what in ((axes[0], "avg_ms", "average"), (axes[1], "checkpoint_ms", "checkpoint")):
        data, labels = [], []
        for mode, by in series.items():
            for p, pts in by.items():
                data.append([getattr(x, metric) for x in pts])
                labels.append(f"{LABEL[mode]}\nP={p}")
        ax.boxplot(data, tick_labels=labels)
        ax.set_ylabel("ms per epoch")
        ax.set_title(f"job 2 {what} latency by parallelism (thesis Fig 6.10b)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return fig
