"""What the console shows: one picture of the chain, read from the ledger in one pass and shared by every
viewer. Every field is something an operator asks when a chain does not move: who reads what, how far
behind, aligned or not, where a swap stands and who holds it up."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from aligner.coordinator.alignment import Coordinator
from aligner.errors import AlignerError
from aligner.ledger import Ledger
from aligner.lineage import query_statuses
from aligner.models import JobNode, SwapNode, now_ms

RATE_WINDOW = 20
"""Epochs the epochs-per-minute figure of a subject spans (the newest ones)."""
LAG_WARN_SECONDS = 60.0
"""A job whose oldest unread input epoch is older than this is named among the warnings."""
SWAP_WARN_SECONDS = 60.0
"""A hot-swap that has stood in one phase this long is named among the warnings, with who holds it up."""


class WriterView(BaseModel):
    writer: str
    partitions: tuple[int, ...]
    first_epoch: int
    finished_after: int | None = None


class SubjectView(BaseModel):
    name: str
    topic: str
    partitions: int
    frontier: int | None = None
    last_commit_age: float | None = None
    """Seconds since the newest epoch committed."""
    epochs_per_minute: float | None = None
    first_retained: int = 0
    epochs_held: int = 0
    writers: list[WriterView] = []


class SourceView(BaseModel):
    subject: str
    state: str
    mode: str
    subject_epoch: int | None = None
    job_epoch: int | None = None
    consumers: int = 0
    lag_epochs: int = 0
    lag_seconds: float = 0.0
    waiting_seconds: float | None = None


class ProducerView(BaseModel):
    producer: str
    partitions: tuple[int, ...]
    incarnation: int
    committed_epoch: int | None = None
    owner: str = ""


class JobView(BaseModel):
    job: str
    engine: str
    version: str
    inputs: tuple[str, ...]
    output: str
    parallelism: int
    mode: str
    follows: str | None = None
    decision: str | None = None
    swapped_to: str | None = None
    sources: list[SourceView] = []
    producers: list[ProducerView] = []


class SwapView(BaseModel):
    old: str
    new: str
    target: str
    epoch: int
    phase: str
    accepted: int | None = None
    updated_at: int
    acks: dict[str, bool] = {}
    """Worker (``job:i``) -> whether it acknowledged S."""
    history: list[tuple[str, int]] = []
    """(phase, epoch ms) as this console saw them, oldest first."""


class GraphNode(BaseModel):
    id: str
    kind: str
    """"subject" or "job"."""
    label: str
    layer: int
    row: int


class Graph(BaseModel):
    nodes: list[GraphNode] = []
    edges: list[tuple[str, str]] = []


class Picture(BaseModel):
    taken_at: int = 0
    subjects: list[SubjectView] = []
    jobs: list[JobView] = []
    swaps: list[SwapView] = []
    queries: list[dict[str, Any]] = []
    warnings: list[str] = []
    graph: Graph = Graph()
    acl: dict[str, Any] = {}
    """ZooKeeper ACLs: ``in_force``, ``mode`` ("policy", "creator-only", "open"), ``admin``, ``line``."""


def take(ledger: Ledger, acl: dict[str, Any] | None = None) -> Picture:
    """One read of the whole chain (every viewer shares it; see :mod:`.hub`)."""
    coordinator = Coordinator(ledger)
    subjects = [_subject(ledger, name) for name in ledger.subjects.subject_names()]
    nodes: list[JobNode] = []
    jobs: list[JobView] = []
    swaps: list[SwapView] = []
    for name in coordinator.jobs.job_names():
        node = coordinator.jobs.job(name)
        nodes.append(node)
        jobs.append(_job(ledger, coordinator, node))
        swap, _ = coordinator.jobs.swap(name)
        if swap is not None:
            swaps.append(_swap(coordinator, swap))
    picture = Picture(taken_at=now_ms(), subjects=subjects, jobs=jobs, swaps=swaps, queries=query_statuses(ledger),
                      graph=graph([s.name for s in subjects], nodes), acl=acl or {})
    picture.warnings = warnings(picture)
    return picture


def _subject(ledger: Ledger, name: str) -> SubjectView:
    subjects = ledger.subjects
    node = subjects.subject(name)
    view = SubjectView(name=name, topic=node.topic, partitions=node.partitions,
                       first_retained=subjects.first_retained(name), epochs_held=subjects.epoch_count(name))
    writers, _ = subjects.writers(name)
    view.writers = [WriterView(writer=w, partitions=e.partitions, first_epoch=e.first_epoch,
                               finished_after=e.finished_after) for w, e in sorted(writers.writers.items())]
    frontier = ledger.epochs.frontier(name)
    if frontier is None:
        return view
    view.frontier = frontier
    last = ledger.epochs.committed(name, frontier).committed_at
    view.last_commit_age = round(max(0.0, (now_ms() - last) / 1000), 1)
    first = max(view.first_retained, frontier - RATE_WINDOW)
    if first < frontier:
        try:
            span_ms = last - ledger.epochs.committed(name, first).committed_at
        except AlignerError:  # retention took it between the two reads: no rate this time
            span_ms = 0
        if span_ms > 0:
            view.epochs_per_minute = round((frontier - first) * 60_000 / span_ms, 1)
    return view


def _job(ledger: Ledger, coordinator: Coordinator, node: JobNode) -> JobView:
    status = coordinator.status(node.job)
    view = JobView(job=node.job, engine=node.engine, version=node.version, inputs=node.inputs, output=node.output,
                   parallelism=node.parallelism, mode=node.mode, follows=node.follows, decision=status["decision"],
                   swapped_to=status["swapped_to"], sources=[SourceView(**row) for row in status["sources"]])
    # No sink yet: the job has not claimed its partitions of the output (not started, or a Spark sink's name).
    subjects = ledger.subjects
    producers = subjects.producers(node.output, node.job) if node.job in subjects.sinks(node.output) else []
    view.producers = [ProducerView(producer=p.producer, partitions=p.partitions, incarnation=p.incarnation,
                                   committed_epoch=p.committed_epoch, owner=p.owner) for p in producers]
    return view


def _swap(coordinator: Coordinator, swap: SwapNode) -> SwapView:
    acks: dict[str, bool] = {}
    if swap.phase == "precommit":
        for name in (swap.old, swap.new):
            try:
                job = coordinator.jobs.job(name)
            except AlignerError:
                continue  # the new version has not registered yet
            consumers = coordinator.jobs.consumers(name, job.inputs[0])
            for w in range(job.parallelism):
                c = consumers.get(w)
                acks[f"{name}:{w}"] = c is not None and c.swap_seen is not None and c.swap_seen[0] == swap.epoch
    return SwapView(old=swap.old, new=swap.new, target=swap.target, epoch=swap.epoch, phase=swap.phase,
                    accepted=swap.accepted, updated_at=swap.updated_at, acks=acks)


def graph(subjects: list[str], jobs: list[JobNode]) -> Graph:
    """Subjects and jobs in layers: a job one right of its furthest input, its output one right of it; the
    versions of a job (``follows``) side by side in one layer."""
    layer: dict[str, int] = {s: 0 for s in subjects}
    edges: list[tuple[str, str]] = []
    for job in jobs:
        edges += [(f"s:{s}", f"j:{job.job}") for s in job.inputs] + [(f"j:{job.job}", f"s:{job.output}")]
    for _ in range(len(subjects) + len(jobs)):  # longest path, bounded: a cycle cannot loop it forever
        moved = False
        for job in jobs:
            at = 1 + max((layer.get(s, 0) for s in job.inputs), default=0)
            if layer.get(f"j:{job.job}") != at:
                layer[f"j:{job.job}"], moved = at, True
            if layer.get(job.output, 0) < at + 1:
                layer[job.output], moved = at + 1, True
        if not moved:
            break
    rows: dict[int, int] = {}
    nodes: list[GraphNode] = []
    ordered = [(f"s:{s}", "subject", s, layer.get(s, 0)) for s in subjects]
    ordered += [(f"j:{j.job}", "job", j.job, layer.get(f"j:{j.job}", 1)) for j in sorted(jobs, key=_version_order)]
    for node_id, kind, label, at in sorted(ordered, key=lambda n: n[3]):
        nodes.append(GraphNode(id=node_id, kind=kind, label=label, layer=at, row=rows.get(at, 0)))
        rows[at] = rows.get(at, 0) + 1
    return Graph(nodes=nodes, edges=edges)


def _version_order(job: JobNode) -> tuple[str, int, str]:
    return (job.follows or job.job, 1 if job.follows else 0, job.job)


def warnings(picture: Picture) -> list[str]:
    """What an operator should look at first, one line each, most specific cause named."""
    out: list[str] = []
    for job in picture.jobs:
        if job.swapped_to is not None:
            continue  # swapped out: it stopped reading on purpose
        for s in job.sources:
            if s.lag_seconds > LAG_WARN_SECONDS:
                out.append(f"job {job.job} is {s.lag_epochs} epochs ({s.lag_seconds:.0f}s) behind {s.subject}")
            if s.consumers < job.parallelism:
                out.append(f"job {job.job}: {s.consumers} of {job.parallelism} workers report on {s.subject}")
    for swap in picture.swaps:
        age = (picture.taken_at - swap.updated_at) / 1000
        if swap.phase in ("precommit", "commit") and age > SWAP_WARN_SECONDS:
            waiting = [w for w, ok in swap.acks.items() if not ok]
            who = f"; not acknowledged by {', '.join(waiting)}" if waiting else ""
            out.append(f"hot-swap {swap.old} -> {swap.new} has stood at {swap.phase} for {age:.0f}s{who}")
    return out
