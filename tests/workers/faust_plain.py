"""A Faust worker on a plain ``faust.App`` (only its broker given, Faust's defaults otherwise) running one
aligned job, as a user would write it: ``python -m tests.workers.faust_plain worker -l warn --without-web``.

Environment: ``ALIGNER_ZK``, ``ALIGNER_KAFKA``, ``ALIGNER_ROOT``, ``FAUST_JOB_ID``, ``FAUST_JOB_INPUT``,
``FAUST_JOB_OUTPUT``, ``FAUST_JOB_INTERVAL`` and ``FAUST_DATADIR`` (Faust's data directory, which would
otherwise be created in the working directory; it plays no part in the job). Each output value is
``{"in": input value, "src": [subject, partition, offset, epoch], "seen": n}``; event lines (``open``,
``committed``, ``finished``) go to stdout.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import faust

import aligner.connectors.faust as aligned
from aligner.connectors.runtime import KeyedState
from aligner.connectors.source import SourceRecord

JOB_ID = os.environ["FAUST_JOB_ID"]

app = faust.App(f"plain-{JOB_ID}", broker=f"kafka://{os.environ['ALIGNER_KAFKA']}",
                datadir=os.environ.get("FAUST_DATADIR", f"plain-{JOB_ID}-data"))


def say(line: str) -> None:
    # The faust CLI redirects sys.stdout into its log; event lines go to the real stdout, in one write that
    # starts a new line: Faust's start-up spinner leaves unterminated escape codes there until it is ready.
    out = sys.__stdout__
    assert out is not None
    out.write(f"\n{line}\n")
    out.flush()


@aligned.job(app, job_id=JOB_ID, inputs=[os.environ["FAUST_JOB_INPUT"]], output=os.environ["FAUST_JOB_OUTPUT"],
             interval=float(os.environ.get("FAUST_JOB_INTERVAL", "0.3")), report=say)
def tag(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    key = record.key.decode() if record.key else str(record.partition)
    seen = state.get(key, 0) + 1
    state.put(key, seen)
    yield record.key, json.dumps({"in": json.loads(record.value or b"null"), "seen": seen,
                                  "src": [record.subject, record.partition, record.offset, record.epoch]}).encode()


if __name__ == "__main__":
    app.main()
