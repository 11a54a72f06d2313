"""Faust jobs on aligned subjects: a Faust app runs exactly-once epoch jobs of the connector library.

Usage (see ``experiments/faust_job.py``)::

    import connectors.faust as aligned

    app = aligned.faust_app("tagger")              # a plain faust.App with settings that suit this broker

    @aligned.job(app, job_id="tagger", inputs=["raw"], output="tagged", interval=0.5)
    def tag(record, state):                        # or: async def tag(record, state): ... yield key, value
        n = state.get("n", 0) + 1
        state.put("n", n)
        yield record.key, record.value

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

Honest limits: the job function runs in the worker thread (sync functions) or is awaited on the
Faust event loop one record at a time (async generator functions), so async jobs are slower;
Faust's consumer still joins a consumer group for its internal leader topic (harmless, short
session timeouts in :func:`faust_app` keep restarts fast); ``faust`` CLI options cannot carry the
worker index, so it comes from ``worker=`` or ``ALIGNER_WORKER``.
"""

from connectors.faust.job import AlignedJob, faust_app, job

__all__ = ["AlignedJob", "faust_app", "job"]
