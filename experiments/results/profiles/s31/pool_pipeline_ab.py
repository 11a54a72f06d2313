"""Pool bench_pipeline A/B runs: every round's ratio of the raw loop's time to the aligned job's, per side."""
import json
import sys

from experiments.common import median_interval
import statistics

sides: dict[str, list[str]] = {}
for arg in sys.argv[1:]:
    side, path = arg.split("=", 1)
    sides.setdefault(side, []).append(path)
for side, paths in sides.items():
    for fn in ("aligned job", "aligned job, batch"):
        rs: list[float] = []
        for p in paths:
            runs = json.load(open(p))["runs"]
            rs += [r["seconds"] / a["seconds"] for r, a in zip(runs["raw"], runs[fn], strict=True)]
        lo, hi = median_interval(rs)
        print(f"{side}: {fn}: per-round ratio to raw pooled over {len(rs)} rounds: median "
              f"{statistics.median(rs):.3f} ({lo:.3f}..{hi:.3f})")
