"""The demo's Faust job: reads job 1's output (hot issues) beside job 2 and counts hot comments per pull request.

A real Faust worker on the adapter's ``faust_app()``, run by ``make demo`` as a subprocess::

    eval "$(aligner stack env)"
    DEMO_FAUST_INPUT=hot-issues DEMO_FAUST_OUTPUT=hot-prs python -m experiments.demo_faust worker -l warn --without-web

Environment: ``DEMO_FAUST_JOB`` (job id, default ``hot-prs``), ``DEMO_FAUST_INPUT``, ``DEMO_FAUST_OUTPUT``,
``DEMO_FAUST_INTERVAL`` (its own checkpoint interval before the coordinator aligns it, default 1.0), plus the
``ALIGNER_*`` connection settings. It starts on its own timer (exactly-once) and is aligned by the coordinator,
so its checkpoints then end on hot-issues epoch boundaries, like job 2's Spark micro-batches.

Each output value is ``{"pr", "hot", "comment", "ts"}``: ``hot`` is the pull request's running count of hot
comments (keyed state restored from the last committed epoch), which must end equal to job 2's ``hot``.
Prints ``open ...``, ``committed E aligned=...`` lines to stdout; SIGTERM stops it within seconds, exit 0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import aligner.connectors.faust as aligned
from aligner.connectors.runtime import KeyedState
from aligner.connectors.source import SourceRecord

JOB_ID = os.environ.get("DEMO_FAUST_JOB", "hot-prs")
INPUT = os.environ.get("DEMO_FAUST_INPUT", "hot-issues")
OUTPUT = os.environ.get("DEMO_FAUST_OUTPUT", "hot-prs")
INTERVAL = float(os.environ.get("DEMO_FAUST_INTERVAL", "1.0"))


def say(line: str) -> None:
    """Event lines on the real stdout, each on a line of its own (Faust redirects sys.stdout to its log)."""
    out = sys.__stdout__
    assert out is not None
    out.write(f"\n{line}\n")
    out.flush()


def hot_per_pr(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    hot = json.loads(record.value or b"{}")
    key = str(hot["pr"])
    n = state.get(key, 0) + 1
    state.put(key, n)
    yield key.encode(), json.dumps({"pr": hot["pr"], "hot": n, "comment": hot["comment"], "ts": hot["ts"]}).encode()


app = aligned.faust_app(f"aligned-{JOB_ID}-0")
job = aligned.job(app, job_id=JOB_ID, inputs=[INPUT], output=OUTPUT, interval=INTERVAL, report=say)(hot_per_pr)


if __name__ == "__main__":
    app.main()
