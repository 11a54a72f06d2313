"""Pool bench_sink runs: every round's ratio of the raw + stamp loop's time to each sink writer's, over all
the runs given, with the median and a bootstrap 95 % interval of the median (10,000 resamples).

    PYTHONPATH=. python experiments/results/profiles/s30/pool.py RUN.json [RUN.json ...]

A round's writers ran back to back on the same stack, so a round's ratio cancels the machine's drift
across a run; pooling rounds across runs gives the median a width one run's five rounds cannot."""

from __future__ import annotations

import json
import statistics
import sys

from experiments.common import median_interval

WRITERS = ("sink", "sink, pipelined commits", "sink, send_many")


def main(paths: list[str]) -> None:
    ratios: dict[str, list[float]] = {w: [] for w in WRITERS}
    of_runs: dict[str, list[float]] = {w: [] for w in WRITERS}
    for path in paths:
        run = json.load(open(path))
        stamped = run["seconds"]["raw + stamp header"]
        for w in WRITERS:
            ratios[w] += [s / t for s, t in zip(stamped, run["seconds"][w], strict=True)]
            of_runs[w].append(run["ratio_vs_raw_stamp"][w])
    print(f"{len(paths)} runs, {len(ratios[WRITERS[0]])} rounds")
    for w in WRITERS:
        lo, hi = median_interval(ratios[w])
        above = sum(r >= 0.95 for r in ratios[w])
        print(f"{w}: per-round ratio to raw + stamp, median {statistics.median(ratios[w]):.3f} "
              f"(95 % interval {lo:.3f}..{hi:.3f}; {above} of {len(ratios[w])} rounds >= 0.95); "
              f"runs' ratio of medians: median {statistics.median(of_runs[w]):.3f}, "
              f"{min(of_runs[w]):.2f}..{max(of_runs[w]):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
