"""The deletes of retention (``aligner gc`` and the coordinator's retention loop): the only place that
removes ledger state, and only what a policy chose.

The policy (:mod:`aligner.retention_policy`: how long to keep, which epochs a consumer still needs) is
the caller's; this module knows where the records live and removes them in a safe order: a subject's
retention floor is written before any epoch below it is deleted, so a reader that meets a collected
epoch gets a clear out-of-retention error instead of a missing node. Deletes are batched: subtrees
are listed with pipelined reads and removed children-first in multi-ops of a few hundred deletes,
many in flight at once (one session applies them in order), so 100k nodes are not 100k round trips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping

from kazoo.exceptions import NoNodeError, NotEmptyError

from aligner.layout import split_writer
from aligner.ledger import Ledger
from aligner.lineage_models import SparkSourceBatchNode
from aligner.models import WritersNode, parse
from aligner.ops import Delete, first_failure

_OPS_PER_MULTI = 500
"""Deletes per multi-op (well under ZooKeeper's 1 MB request limit with these paths)."""
_IN_FLIGHT = 4000
"""Requests (listings or multi-ops) sent before their replies are awaited."""


class Retention:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.jobs = ledger.jobs

    # ---- subjects -----------------------------------------------------------------------------

    def collect_subject(self, subject: str, floor: int, epochs: list[int]) -> int:
        """Record ``floor`` as the subject's first retained epoch, then delete ``epochs`` (all below it)
        and the Spark sinks' lineage records of epochs below it; returns how many records went."""
        self.write_floor(subject, floor)
        lay = self.ledger.layout
        deleted = self.delete([lay.epoch(subject, e) for e in epochs if e < floor], depth=1)
        return deleted + self.delete(self.spark_sink_garbage(subject, floor), depth=0)

    def write_floor(self, subject: str, floor: int) -> None:
        """The subject's first retained epoch; never lowered (a reader told "collected" stays told)."""
        path = self.ledger.layout.retention(subject)

        def rise(raw: bytes | None) -> bytes | None:
            return None if raw is not None and raw.isdigit() and int(raw) >= floor else str(floor).encode()

        self.ledger.zk.update(path, rise)

    def spark_sink_garbage(self, subject: str, floor: int) -> list[str]:
        """Lineage records of the subject's Spark sinks for epochs below ``floor`` (their epochs are gone)."""
        lay = self.ledger.layout
        out: list[str] = []
        for sink in self.ledger.subjects.sinks(subject):
            with contextlib.suppress(NoNodeError):
                numbers = self.ledger.numbers(lay.spark_sink_epochs(subject, sink))
                out += [lay.spark_sink_epoch(subject, sink, n) for n in numbers if n < floor]
        return out

    def dead_writers(self, subject: str, floor: int, sinks: Collection[str]) -> list[str]:
        """The writers of ``sinks`` (sinks that never write again: swapped-out jobs) that finished before
        ``floor``: no epoch they wrote is retained. Another finished writer stays, which a restart of it
        re-opens."""
        doc, _ = self.ledger.subjects.writers(subject)
        return [w for w, e in doc.writers.items()
                if split_writer(w)[0] in sinks and e.finished_after is not None and e.finished_after < floor]

    def dead_producers(self, subject: str, floor: int, sinks: Collection[str]) -> list[str]:
        """The producer nodes of :meth:`dead_writers` that still exist."""
        lay = self.ledger.layout
        paths = [lay.producer(subject, *split_writer(w)) for w in self.dead_writers(subject, floor, sinks)]
        return [p for p in paths if self.ledger.zk.exists(p) is not None]

    def forget_writers(self, subject: str, floor: int, sinks: Collection[str]) -> int:
        """Remove :meth:`dead_writers` from the writers document, after their nodes: a target that serves
        version after version keeps one entry per producer of the versions it retains, not of every
        version it ever had. Returns how many entries went."""
        gone = set(self.dead_writers(subject, floor, sinks))
        if not gone:
            return 0

        def without(doc: WritersNode | None) -> WritersNode | None:
            if doc is None or not gone & set(doc.writers):
                return None
            return WritersNode(writers={w: e for w, e in doc.writers.items() if w not in gone})

        self.ledger.update(WritersNode, self.ledger.layout.writers(subject), without)
        return len(gone)

    # ---- Spark queries ------------------------------------------------------------------------

    def query_batch_garbage(self, floors: Mapping[str, int]) -> list[str]:
        """Micro-batch records of every Spark query whose every read epoch is below its subject's floor
        (``floors``; a subject not named there is gone), oldest first, never a query's last batch (its
        restart re-plans from it). A batch that read a retained epoch stops the walk: later ones did too."""
        lay, zk = self.ledger.layout, self.ledger.zk
        out: list[str] = []
        try:
            queries = zk.get_children(lay.spark_queries)
        except NoNodeError:
            return []
        for query in queries:
            with contextlib.suppress(NoNodeError):
                batches = self.ledger.numbers(lay.query_batches(query))
                out += self._old_batches(query, batches[:-1], floors)
        return out

    def _old_batches(self, query: str, batches: list[int], floors: Mapping[str, int]) -> list[str]:
        lay, zk = self.ledger.layout, self.ledger.zk
        out: list[str] = []
        for lo in range(0, len(batches), _OPS_PER_MULTI):
            chunk = [lay.query_batch(query, b) for b in batches[lo:lo + _OPS_PER_MULTI]]
            listed = [(p, zk.get_children_async(p)) for p in chunk]
            reads = [(p, [(f"{p}/{n}", zk.get_async(f"{p}/{n}")) for n in _names(req)]) for p, req in listed]
            for path, records in reads:
                for rpath, req in records:
                    with contextlib.suppress(NoNodeError):
                        node = parse(SparkSourceBatchNode, rpath, req.get()[0])
                        if node.last >= floors.get(node.subject, node.last + 1):
                            return out
                out.append(path)
        return out

    # ---- jobs ---------------------------------------------------------------------------------

    def job_garbage(self, job: str, keep: int, swapped_out: bool, keep_from: int | None = None,
                    workers: bool = True) -> list[str]:
        """The records of ``job`` past retention: its job epochs below ``keep_from`` (None: any) except
        its last ``keep`` and, per worker, all but its last ``keep`` epoch records (none with ``workers``
        False: a new version may still inherit the state as of any of them); a job swapped out also
        loses its worker, source and decision state (its job epochs stay for lineage: the new version
        follows them)."""
        lay = self.ledger.layout
        numbers = self.jobs.job_epoch_numbers(job)
        old = numbers[:-keep] if len(numbers) > keep else []
        victims = [lay.job_epoch(job, e) for e in old if keep_from is None or e < keep_from]
        if swapped_out:
            return victims + [p for p in (lay.workers(job), lay.sources(job), lay.decision(job))
                              if self.ledger.zk.exists(p) is not None]
        for w in self.jobs.worker_ids(job) if workers else ():
            epochs = self.jobs.worker_epoch_numbers(job, w)
            victims += [lay.worker_epoch(job, w, e) for e in epochs[:-keep]]
        return victims

    # ---- the deletes --------------------------------------------------------------------------

    def delete(self, paths: list[str], depth: int | None = None) -> int:
        """Delete each node with its children (``depth``: how many levels they go down, None: any);
        returns how many of ``paths`` existed (others removed them meanwhile)."""
        trees = self._trees(paths, depth)
        groups: list[list[str]] = [[]]
        for top in paths:
            if trees.get(top) is None:
                continue
            if len(groups[-1]) >= _OPS_PER_MULTI:
                groups.append([])
            groups[-1].append(top)
        deleted = 0
        for lo in range(0, len(groups), max(1, _IN_FLIGHT // _OPS_PER_MULTI)):
            wave = [g for g in groups[lo:lo + _IN_FLIGHT // _OPS_PER_MULTI] if g]
            sent = [(g, self.ledger.multi_async(*[Delete(p) for t in g for p in _post_order(t, trees)])) for g in wave]
            for group, req in sent:
                if first_failure(req.get()) is None:
                    deleted += len(group)
                else:  # a node gone or a child added meanwhile: one by one, recursively
                    deleted += sum(self._delete_one(p) for p in group)
        self._drop_emptied_buckets(paths)
        return deleted

    def _drop_emptied_buckets(self, paths: list[str]) -> None:
        """Delete the buckets (aligner.layout.BUCKET) that deleting ``paths`` emptied, except the newest of
        each folder: numbers are written in order, so no later write goes to an older bucket, and the newest
        one stays for the writes to come."""
        lay, zk = self.ledger.layout, self.ledger.zk
        emptied: dict[str, set[str]] = {}
        for bucket in {p.rsplit("/", 1)[0] for p in paths}:
            found = lay.declared(bucket)
            if found is not None and found[0].parts[-1:] == ("{bucket}",):
                base, name = bucket.rsplit("/", 1)
                emptied.setdefault(base, set()).add(name)
        for base, names in emptied.items():
            try:
                newest = self.ledger.buckets(base)[-1][1]
            except (NoNodeError, IndexError):
                continue
            for name in sorted(names - {newest}):
                with contextlib.suppress(NoNodeError, NotEmptyError):
                    zk.delete(f"{base}/{name}")

    def _delete_one(self, path: str) -> int:
        """1 if ``path`` existed and is gone with its children (kazoo's recursive delete says nothing of a
        node that was not there, so existence is asked first)."""
        if self.ledger.zk.exists(path) is None:
            return 0
        try:
            self.ledger.zk.delete(path, recursive=True)
            return 1
        except NoNodeError:
            return 0

    def _trees(self, paths: list[str], depth: int | None) -> dict[str, list[str] | None]:
        """Children of every node in the subtrees of ``paths`` (None: the node is gone), listed level by
        level with pipelined reads; nodes at ``depth`` are taken as leaves."""
        kids: dict[str, list[str] | None] = {}
        level, d = list(paths), 0
        while level:
            if depth is not None and d >= depth:
                kids.update((p, []) for p in level)  # leaves; existence is checked by the multi-op itself
                break
            nxt: list[str] = []
            for lo in range(0, len(level), _IN_FLIGHT):
                sent = [(p, self.ledger.zk.get_children_async(p)) for p in level[lo:lo + _IN_FLIGHT]]
                for p, req in sent:
                    try:
                        kids[p] = [f"{p}/{n}" for n in req.get()]
                    except NoNodeError:
                        kids[p] = None
                        continue
                    nxt += kids[p] or []
            level, d = nxt, d + 1
        return kids


def _names(req: object) -> list[str]:
    try:
        return list(req.get())  # type: ignore[attr-defined]
    except NoNodeError:
        return []


def _post_order(top: str, kids: Mapping[str, list[str] | None]) -> list[str]:
    """``top``'s subtree, children before their parent (the order a multi-op can delete it in)."""
    out: list[str] = []
    stack: list[tuple[str, bool]] = [(top, False)]
    while stack:
        path, expanded = stack.pop()
        if expanded:
            out.append(path)
            continue
        stack.append((path, True))
        stack.extend((c, False) for c in kids.get(path) or [])
    return out
