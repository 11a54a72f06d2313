"""Faust jobs on aligned subjects: a Faust app runs exactly-once epoch jobs of the connector library.

Usage (see ``experiments/faust_job.py``)::

    import faust

    import aligner.connectors.faust as aligned

    app = faust.App("tagger", broker="kafka://localhost:9092")   # any Faust app (or aligned.faust_app("tagger"))

    @aligned.job(app, job_id="tagger", inputs=["raw"], output="tagged", interval=0.5)
    def tag(record, state):                        # or: async def tag(record, state): ... yield key, value
        n = state.get("n", 0) + 1
        state.put("n", n)
        yield record.key, record.value

    @aligned.job(app, job_id="totals", inputs=["raw"], output="totals")
    @aligned.batch                                 # once per fetched batch instead of once per record
    def totals(records, state):
        yield None, str(len(records)).encode()

    # faust -A experiments.faust_job worker -l warn      (or app.main() under ``python -m``)

What Faust provides: the worker process and its lifecycle (``faust -A module worker``, signals,
graceful stop, crash handling), logging, the web server and monitoring, and the option to mix
ordinary Faust agents, timers and pages into the same app.

What this library provides: the data path. Faust's own Kafka client (aiokafka) cannot run
transactions against the embedded broker (Tansu rejects aiokafka's transactional InitProducerId),
so Faust's topics, ``exactly_once`` guarantee and changelog-backed tables are *not* used for
aligned data. Each ``@job`` starts, as a Faust service, one :class:`connectors.runtime.JobWorker`
in a thread: it reads committed subject epochs exactly (stamps filtered), calls the job function
per record, writes through the stamped transactional confluent-kafka sink, and commits the output
epoch together with the input offsets, the keyed state snapshot (``state``, a
:class:`connectors.runtime.KeyedState`, replaces Faust tables) and the alignment state in one
ZooKeeper multi-op. A worker killed anywhere restarts from its last committed epoch with the state
of that epoch. The job registers in ZooKeeper like any other job, so the coordinator aligns it
(``aligner align JOB``) and hot-swaps it like any other job: ``job(..., follows="old-job",
output_partitions=(2, 3))`` runs a new version beside the old one (the old one declared with other
partitions of the same output), and ``aligner hotswap --old old-job --new new-job --subject OUT``
swaps them; the old worker's loop ends after the swap epoch, the new one writes from the next.

Restarts are fast on any ``faust.App``: the job starts with the app's own services, not after
Faust's consumer group settled (the job runtime owns its partitions and never uses that group), so
a worker commits its first epoch ~2 s after it starts and resumes ~2-3 s after a SIGKILL. The
group Faust still joins for its internal leader topic gets short session and rebalance timeouts
when the app left them at Faust's defaults (:func:`configure`), so Faust itself is ready in a few
seconds too. On a plain app with Faust's defaults and the job as an ``@app.task`` it took ~30 s to
start and ~113 s to resume (measured on the embedded broker): the first JoinGroup of a fresh group
took ~30 s, and after a SIGKILL the new member waited out the dead member's 60 s session and a
second rebalance before Faust started its tasks.

Stopping: SIGTERM or SIGINT sets the job's stop flag before Faust's own shutdown begins; the open
epoch is aborted (its Kafka transaction too), Faust shuts down, and the process exits 0 within
``stop_grace`` seconds (a watchdog ends it if a client call hangs on an unreachable service). The
next start resumes from the last committed epoch. Input waits have no timeout: an aligned job
whose input is quiet waits as long as it takes. Broker and ZooKeeper failures are retried (also at
start). A job that cannot go on (an unknown subject, or fenced by another incarnation) stops the
worker with one error line and exit code 1.

Security: Faust's own Kafka connection (aiokafka) gets the SASL/TLS settings of ``ALIGNER_KAFKA_CONFIG``
as ``broker_credentials`` (:mod:`aligner.connectors.faust.credentials`), the data path's confluent-kafka
clients take the same file as they are; an app that sets ``broker_credentials`` itself keeps them.

Honest limits: the job function runs in the worker thread (sync functions) or is awaited on the
Faust event loop one record at a time (async generator functions), so async jobs are slower;
``faust`` CLI options cannot carry the worker index, so it comes from ``worker=`` or
``ALIGNER_WORKER``; event lines a job prints to stdout share it with Faust's start-up spinner.
"""

from aligner.extras import require

require("faust", "aligner.connectors.faust")  # one line naming the extra, not a No module named 'faust'

from aligner.connectors.faust.job import AlignedJob, configure, faust_app, job  # noqa: E402
from aligner.connectors.runtime.job_spec import batch  # noqa: E402

__all__ = ["AlignedJob", "batch", "configure", "faust_app", "job"]
