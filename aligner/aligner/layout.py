"""The single place ZooKeeper paths are built, and the declaration of every node the product writes.

:data:`NODES` names each node (its path pattern under the root, who may write it, what it holds); the
path methods of :class:`Layout` build exactly those paths (tests/ledger/test_acl.py checks that they agree), and
the ACL policy (:mod:`aligner.acl_policy`) gives a node the permissions its declaration states.

    {root}/subjects/{subject}                         SubjectNode
    {root}/subjects/{subject}/writers                 WritersNode (partition claims, compare-and-set)
    {root}/subjects/{subject}/retention               first retained epoch (retention's floor, only rises)
    {root}/subjects/{subject}/sinks/{sink}            SinkNode
    {root}/subjects/{subject}/sinks/{sink}/producers/{producer}   ProducerNode
    {root}/subjects/{subject}/sinks/{sink}/spark      a Spark sink's progress (+ /epochs/{bucket}/{epoch}: lineage)
    {root}/subjects/{subject}/epochs/{bucket}/{epoch:010d}     EpochNode (expected writers)
    {root}/subjects/{subject}/epochs/{bucket}/{epoch:010d}/{sink}:{producer}   ContributionNode
    {root}/jobs/{job}                                 JobNode
    {root}/jobs/{job}/epochs/{bucket}/{epoch:010d}    JobEpochNode (aligned job epochs)
    {root}/jobs/{job}/workers/{i}/epochs/{bucket}/{epoch:010d}   WorkerEpochNode (input offsets + state)
    {root}/jobs/{job}/sources/{subject}/command       CommandNode (alignment commands)
    {root}/jobs/{job}/sources/{subject}/consumers/{i} ConsumerNode (alignment state)
    {root}/jobs/{job}/decision                        AlignmentDecision (coordinator)
    {root}/jobs/{job}/swap                            SwapNode (coordinator)
    {root}/spark/queries/{query}/batches/{bucket}/{batch:012d}/{subject}   what a Spark micro-batch read
    {root}/coordinator/election                       leader election of coordinators
    {root}/coordinator/retention                      leader election of retention loops
    {root}/acl                                        the ACL grants (admin only)

Numbered nodes (epochs, job and worker epochs, a Spark sink's epoch records, a query's batch records) sit
in buckets of :data:`BUCKET`: ``{bucket}`` is the first number the bucket holds, written like the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


def writer_id(sink: str, producer: str) -> str:
    return f"{sink}:{producer}"


def split_writer(writer: str) -> tuple[str, str]:
    sink, producer = writer.split(":", 1)
    return sink, producer


def epoch_name(epoch: int) -> str:
    return f"{epoch:010d}"


BUCKET = 10_000
"""Numbered nodes per bucket. A listing is one bucket at most, whatever the uptime or the retention: a day of
0.5 s epochs as one list of children is 172,800 names, a 2.4 MB reply, over the 1 MB Java clients (zkCli,
Curator) accept by default (``jute.maxbuffer``)."""


def bucket_start(n: int) -> int:
    return n - n % BUCKET


def numbered(base: str, n: int, width: int = 10) -> str:
    """The path of number ``n`` under ``base``: ``{base}/{bucket}/{n}``, both ``width`` digits."""
    return f"{base}/{bucket_start(n):0{width}d}/{n:0{width}d}"


@dataclass(frozen=True)
class Node:
    """One kind of node: its path pattern under the root, and who may do what there.

    ``who`` is "subject" or "job" (the identities granted the subject or job its first placeholder
    names), "subjects" or "jobs" (any identity granted some subject or job), or "admin" (nobody else);
    ``perms`` are their permissions, letters of ``rwcd`` (readers' read access is the policy's)."""

    pattern: str
    who: str
    perms: str
    what: str = ""

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.pattern.split("/") if p)


NODES: tuple[Node, ...] = (
    Node("", "admin", "", "the root"),
    Node("acl", "admin", "", "Grants (aligner.acl_policy)"),
    Node("subjects", "subjects", "rc", "a granted sink registers its subjects (a job's changelog)"),
    Node("subjects/{subject}", "subject", "rc", "SubjectNode; made with its children in one multi-op"),
    Node("subjects/{subject}/writers", "subject", "rw", "WritersNode"),
    Node("subjects/{subject}/retention", "subject", "", "retention's floor (aligner.retention): admin only"),
    Node("subjects/{subject}/sinks", "subject", "rc"),
    Node("subjects/{subject}/sinks/{sink}", "subject", "rc", "SinkNode"),
    Node("subjects/{subject}/sinks/{sink}/producers", "subject", "rc"),
    Node("subjects/{subject}/sinks/{sink}/producers/{producer}", "subject", "rw", "ProducerNode"),
    Node("subjects/{subject}/sinks/{sink}/spark", "subject", "rwcd", "a Spark sink's progress"),
    Node("subjects/{subject}/sinks/{sink}/spark/epochs", "subject", "rwcd"),
    Node("subjects/{subject}/sinks/{sink}/spark/epochs/{bucket}", "subject", "rwcd"),
    Node("subjects/{subject}/sinks/{sink}/spark/epochs/{bucket}/{epoch}", "subject", "rwcd",
         "which micro-batch wrote it"),
    Node("subjects/{subject}/epochs", "subject", "rc"),
    Node("subjects/{subject}/epochs/{bucket}", "subject", "rc", "a bucket of BUCKET epochs"),
    Node("subjects/{subject}/epochs/{bucket}/{epoch}", "subject", "rc", "EpochNode"),
    Node("subjects/{subject}/epochs/{bucket}/{epoch}/{writer}", "subject", "r", "ContributionNode: never changes"),
    Node("jobs", "jobs", "rc"),
    Node("jobs/{job}", "job", "rc", "JobNode"),
    Node("jobs/{job}/sources", "job", "rc"),
    Node("jobs/{job}/sources/{subject}", "job", "rc"),
    Node("jobs/{job}/sources/{subject}/command", "job", "r", "CommandNode: the coordinator alone writes it"),
    Node("jobs/{job}/sources/{subject}/consumers", "job", "rc"),
    Node("jobs/{job}/sources/{subject}/consumers/{worker}", "job", "rw", "ConsumerNode"),
    Node("jobs/{job}/decision", "job", "r", "AlignmentDecision (coordinator)"),
    Node("jobs/{job}/swap", "job", "r", "SwapNode (coordinator)"),
    Node("jobs/{job}/epochs", "job", "rc"),
    Node("jobs/{job}/epochs/{bucket}", "job", "rc"),
    Node("jobs/{job}/epochs/{bucket}/{epoch}", "job", "r", "JobEpochNode: create-if-absent, never changes"),
    Node("jobs/{job}/workers", "job", "rc"),
    Node("jobs/{job}/workers/{worker}", "job", "rc"),
    Node("jobs/{job}/workers/{worker}/epochs", "job", "rc"),
    Node("jobs/{job}/workers/{worker}/epochs/{bucket}", "job", "rc"),
    Node("jobs/{job}/workers/{worker}/epochs/{bucket}/{epoch}", "job", "r", "WorkerEpochNode"),
    Node("spark", "jobs", "rc"),
    Node("spark/queries", "jobs", "rc"),
    Node("spark/queries/{query}", "job", "rwcd", "a Spark query's micro-batch records (pruned by retention)"),
    Node("spark/queries/{query}/batches", "job", "rwcd"),
    Node("spark/queries/{query}/batches/{bucket}", "job", "rwcd"),
    Node("spark/queries/{query}/batches/{bucket}/{batch}", "job", "rwcd"),
    Node("spark/queries/{query}/batches/{bucket}/{batch}/{subject}", "job", "rwcd", "what a micro-batch read"),
    Node("coordinator", "admin", ""),
    Node("coordinator/election", "admin", "", "kazoo's Election recipe"),
    Node("coordinator/retention", "admin", "", "kazoo's Election recipe among retention loops"),
)
"""Every node the product writes, parents before children."""

CONTAINERS: tuple[str, ...] = tuple(n.pattern for n in NODES if n.parts and "{" not in n.pattern and n.pattern != "acl")
"""Nodes without placeholders (made once, before any component starts)."""


def _fits(node: Node, parts: tuple[str, ...]) -> bool:
    return len(node.parts) == len(parts) and all(
        p.startswith("{") or p == q for p, q in zip(node.parts, parts, strict=True))


def declared(root: str, path: str) -> tuple[Node, Mapping[str, str]] | None:
    """The declaration of the node at ``path`` and its placeholders' values; for an undeclared node under
    a declared one, the nearest declared ancestor's (None outside the root)."""
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        return None
    parts = tuple(p for p in path[len(root):].split("/") if p)
    for depth in range(len(parts), -1, -1):
        for node in NODES:
            if _fits(node, parts[:depth]):
                return node, {p[1:-1]: q for p, q in zip(node.parts, parts, strict=False) if p.startswith("{")}
    return None


DEFAULT_ROOT = "/aligner"
"""The ZooKeeper root of all aligner state when none is given (``ALIGNER_ROOT``, ``--root``, option ``root``)."""


@dataclass(frozen=True)
class Layout:
    root: str = DEFAULT_ROOT

    @property
    def subjects(self) -> str:
        return f"{self.root}/subjects"

    def subject(self, subject: str) -> str:
        return f"{self.subjects}/{subject}"

    def writers(self, subject: str) -> str:
        return f"{self.subject(subject)}/writers"

    def sinks(self, subject: str) -> str:
        return f"{self.subject(subject)}/sinks"

    def sink(self, subject: str, sink: str) -> str:
        return f"{self.sinks(subject)}/{sink}"

    def producers(self, subject: str, sink: str) -> str:
        return f"{self.sink(subject, sink)}/producers"

    def producer(self, subject: str, sink: str, producer: str) -> str:
        return f"{self.producers(subject, sink)}/{producer}"

    def spark_progress(self, subject: str, sink: str) -> str:
        return f"{self.sink(subject, sink)}/spark"

    def spark_sink_epochs(self, subject: str, sink: str) -> str:
        return f"{self.spark_progress(subject, sink)}/epochs"

    def spark_sink_epoch(self, subject: str, sink: str, epoch: int) -> str:
        return numbered(self.spark_sink_epochs(subject, sink), epoch)

    def retention(self, subject: str) -> str:
        return f"{self.subject(subject)}/retention"

    def epochs(self, subject: str) -> str:
        return f"{self.subject(subject)}/epochs"

    def epoch(self, subject: str, epoch: int) -> str:
        return numbered(self.epochs(subject), epoch)

    def contribution(self, subject: str, epoch: int, writer: str) -> str:
        return f"{self.epoch(subject, epoch)}/{writer}"

    # ---- jobs --------------------------------------------------------------------------------

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    def job(self, job: str) -> str:
        return f"{self.jobs}/{job}"

    def job_epochs(self, job: str) -> str:
        return f"{self.job(job)}/epochs"

    def job_epoch(self, job: str, epoch: int) -> str:
        return numbered(self.job_epochs(job), epoch)

    def workers(self, job: str) -> str:
        return f"{self.job(job)}/workers"

    def worker(self, job: str, worker: int) -> str:
        return f"{self.workers(job)}/{worker}"

    def worker_epochs(self, job: str, worker: int) -> str:
        return f"{self.worker(job, worker)}/epochs"

    def worker_epoch(self, job: str, worker: int, epoch: int) -> str:
        return numbered(self.worker_epochs(job, worker), epoch)

    def sources(self, job: str) -> str:
        return f"{self.job(job)}/sources"

    def source(self, job: str, subject: str) -> str:
        return f"{self.sources(job)}/{subject}"

    def command(self, job: str, subject: str) -> str:
        return f"{self.source(job, subject)}/command"

    def consumers(self, job: str, subject: str) -> str:
        return f"{self.source(job, subject)}/consumers"

    def consumer(self, job: str, subject: str, worker: int) -> str:
        return f"{self.consumers(job, subject)}/{worker}"

    def swap(self, old_job: str) -> str:
        return f"{self.job(old_job)}/swap"

    def decision(self, job: str) -> str:
        return f"{self.job(job)}/decision"

    @property
    def coordinator(self) -> str:
        return f"{self.root}/coordinator"

    @property
    def election(self) -> str:
        return f"{self.coordinator}/election"

    @property
    def retention_election(self) -> str:
        return f"{self.coordinator}/retention"

    # ---- Spark queries and the grants ----------------------------------------------------------

    @property
    def spark(self) -> str:
        return f"{self.root}/spark"

    @property
    def spark_queries(self) -> str:
        return f"{self.spark}/queries"

    def spark_query(self, query: str) -> str:
        return f"{self.spark_queries}/{query}"

    def query_batches(self, query: str) -> str:
        return f"{self.spark_query(query)}/batches"

    def query_batch(self, query: str, batch: int) -> str:
        return numbered(self.query_batches(query), batch, width=12)

    def source_batch(self, query: str, batch: int, subject: str) -> str:
        return f"{self.query_batch(query, batch)}/{subject}"

    @property
    def grants(self) -> str:
        return f"{self.root}/acl"

    def declared(self, path: str) -> tuple[Node, Mapping[str, str]] | None:
        """The declaration of the node at ``path`` (see :func:`declared`)."""
        return declared(self.root, path)
