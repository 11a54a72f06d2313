"""Example Faust job on aligned subjects: tag every input record with its origin, count per key.

Run a real Faust worker (connection settings from ``aligner stack env``)::

    eval "$(aligner stack env)"
    FAUST_JOB_INPUT=raw FAUST_JOB_OUTPUT=tagged python -m experiments.faust_job worker -l warn --without-web
    # equivalently: faust -A experiments.faust_job worker -l warn --web-port 6067

Environment:
    FAUST_JOB_ID        job id (default ``faust-tagger``); the Faust app id is ``aligned-<job id>-<worker>``
    FAUST_JOB_INPUT     input subject(s), comma separated (required)
    FAUST_JOB_OUTPUT    output subject (required)
    FAUST_JOB_VERSION   ``1`` or ``2`` (2 marks its output ``"v": 2``; for hot-swap demos)
    FAUST_JOB_INTERVAL  own checkpoint interval in seconds before alignment (default 1.0)
    FAUST_JOB_PARALLELISM  workers of the job (default 1); start one process per ALIGNER_WORKER index
    FAUST_JOB_FOLLOWS   run as the new version of this job (hot-swap): follow its aligned epochs, void output
                        until ``aligner hotswap --old FOLLOWS --new FAUST_JOB_ID`` commits the swap
    FAUST_JOB_OUTPUT_PARTITIONS  comma-separated output partitions this job writes (default: its share of
                        all; a new version takes the old version's over at its swap)
    FAUST_JOB_INHERIT_STATE  ``1``: with FAUST_JOB_FOLLOWS, start from the old version's keyed state
    FAUST_JOB_FUNCTION  ``module:function``: run this job function instead of ``tag`` (e.g. the chaos
                        checker's ``experiments.chaos.jobs:job_a``)
    FAUST_JOB_ASYNC     ``1``: the same function as an ``async def`` generator (agent style)
    FAUST_JOB_BATCH     ``1``: the same function as a batch function (``@aligned.batch``: once per fetch)
    FAUST_JOB_PLAIN     ``1``: on a plain ``faust.App`` (Faust's defaults) instead of ``aligned.faust_app()``
    FAUST_JOB_PAUSE     ``EPOCH:POINT`` park the worker at a commit point (crash tests), e.g.
                        ``3:after_kafka_commit``; it prints ``paused EPOCH POINT`` and waits to be killed
    ALIGNER_WORKER      worker index (default 0; each worker process is its own Faust app)
    ALIGNER_ZK, ALIGNER_KAFKA, ALIGNER_ROOT, ALIGNER_HOME  connection settings, Faust datadir under home

The worker prints one line per event to stdout: ``open ...``, ``committed E aligned=...``,
``finished ... last=E`` (input finished, or for the old version of a hot-swap: E is the swap epoch S).
Each starts a new line (blank lines between are Faust's start-up spinner finishing its own).
SIGTERM or SIGINT stops the worker within a few seconds with exit code 0; the next start resumes from
the last committed epoch. The same job on a plain ``faust.App`` is ``tests/workers/faust_plain.py``.

Hot-swap v1 -> v2 of this job (two Faust workers writing one target)::

    FAUST_JOB_ID=tagger-v1 FAUST_JOB_OUTPUT_PARTITIONS=0,1 ... python -m experiments.faust_job worker --without-web
    aligner align tagger-v1
    FAUST_JOB_ID=tagger-v2 FAUST_JOB_VERSION=2 FAUST_JOB_FOLLOWS=tagger-v1 FAUST_JOB_OUTPUT_PARTITIONS=2,3 ... \
        python -m experiments.faust_job worker --without-web
    aligner hotswap --old tagger-v1 --new tagger-v2 --subject tagged

Each output value is ``{"in": input value, "src": [subject, partition, offset, epoch], "seen": n, "v": version}``
where ``seen`` counts inputs per key in the job's keyed state (restored from the last committed epoch).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator

import faust

import aligner.connectors.faust as aligned
from aligner.connectors.runtime import KeyedState
from aligner.connectors.runtime.worker import load_function
from aligner.connectors.source import Records, SourceRecord
from aligner.settings import Settings

JOB_ID = os.environ.get("FAUST_JOB_ID", "faust-tagger")
INPUTS = [s for s in os.environ.get("FAUST_JOB_INPUT", "raw").split(",") if s]
OUTPUT = os.environ.get("FAUST_JOB_OUTPUT", "tagged")
VERSION = os.environ.get("FAUST_JOB_VERSION", "1")
INTERVAL = float(os.environ.get("FAUST_JOB_INTERVAL", "1.0"))
PARALLELISM = int(os.environ.get("FAUST_JOB_PARALLELISM", "1"))
PAUSE = os.environ.get("FAUST_JOB_PAUSE", "")
FOLLOWS = os.environ.get("FAUST_JOB_FOLLOWS") or None
OUTPUT_PARTITIONS = tuple(int(p) for p in os.environ.get("FAUST_JOB_OUTPUT_PARTITIONS", "").split(",") if p.strip()) \
    or None


def say(line: str) -> None:
    # The faust CLI redirects sys.stdout into its log; event lines go to the real stdout, in one write that
    # starts a new line: Faust's start-up spinner leaves unterminated escape codes there until it is ready.
    out = sys.__stdout__
    assert out is not None
    out.write(f"\n{line}\n")
    out.flush()


def tag(record: SourceRecord, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    key = record.key.decode() if record.key else str(record.partition)
    seen = state.get(key, 0) + 1
    state.put(key, seen)
    out = {"in": json.loads(record.value or b"null"), "src": [record.subject, record.partition, record.offset,
                                                              record.epoch], "seen": seen, "v": int(VERSION)}
    yield record.key, json.dumps(out).encode()


@aligned.batch
def tag_batch(records: Records, state: KeyedState) -> Iterator[tuple[bytes | None, bytes]]:
    """``tag`` as a batch function, called once per fetch; each result also says how many records its call
    got (``n``)."""
    for record in records:
        for key, value in tag(record, state):
            yield key, json.dumps({**json.loads(value), "n": len(records)}).encode()


async def tag_async(record: SourceRecord, state: KeyedState):
    for kv in tag(record, state):
        yield kv


def pause_at(spec: str):
    """A fault hook parking the job worker thread at ``POINT`` of epoch ``EPOCH``."""
    if not spec:
        return None
    epoch_s, point = spec.split(":")
    epoch = int(epoch_s)

    def fault(at: str) -> None:
        w = job.worker
        assert w is not None and w.io.sink is not None, "a fault point is reached by a started worker"
        # Before the ZooKeeper commit the lease still points at the open epoch.
        current = w.io.sink.next_epoch if at in ("before_kafka_commit", "after_kafka_commit") else \
            w.io.sink.next_epoch - 1
        if at == point and current == epoch:
            say(f"paused {epoch} {point}")
            threading.Event().wait()

    return fault


APP_ID = f"aligned-{JOB_ID}-{os.environ.get('ALIGNER_WORKER', '0')}"
if os.environ.get("FAUST_JOB_PLAIN") == "1":
    # A plain faust.App, as a user would build it (Faust's defaults; the data directory only kept out of cwd).
    _env = Settings()
    (_env.home / "faust").mkdir(parents=True, exist_ok=True)
    app = faust.App(APP_ID, broker=",".join(f"kafka://{h}" for h in _env.kafka.split(",")),
                    datadir=str(_env.home / "faust" / APP_ID))
else:
    app = aligned.faust_app(APP_ID)
FUNCTION = load_function(os.environ["FAUST_JOB_FUNCTION"]) if os.environ.get("FAUST_JOB_FUNCTION") else \
    tag_async if os.environ.get("FAUST_JOB_ASYNC") == "1" else tag_batch if os.environ.get("FAUST_JOB_BATCH") == "1" \
    else tag
job = aligned.job(app, job_id=JOB_ID, inputs=INPUTS, output=OUTPUT, version=VERSION, interval=INTERVAL,
                  parallelism=PARALLELISM, follows=FOLLOWS, output_partitions=OUTPUT_PARTITIONS,
                  inherit_state=os.environ.get("FAUST_JOB_INHERIT_STATE") == "1", fault=pause_at(PAUSE),
                  report=say)(FUNCTION)


if __name__ == "__main__":
    app.main()
