"""Committed epochs as readers see them: whether an epoch committed, its fixed slices, pipelined spans."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError

from aligner.epochs import CommittedEpoch, assemble, missing_writers
from aligner.errors import AlignerError, EpochCollectedError, EpochNotCommittedError, MalformedNodeError
from aligner.models import ContributionNode, EpochNode, WritersNode, parse
from aligner.recipes.store import Store
from aligner.recipes.subjects import SubjectRecipes

log = logging.getLogger(__name__)

_PIPELINE_EPOCHS = 500
"""Epochs whose reads ``committed_many`` keeps in flight at once."""


def _when_all(requests: Sequence[Any], then: Callable[[], None]) -> None:
    """Call ``then`` once every kazoo async request has its answer (in kazoo's callback thread)."""
    left = [len(requests)]
    lock = threading.Lock()

    def one(_done: Any) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        then()

    for request in requests:
        request.rawlink(one)


def _prefetch_skipped(subject: str, epoch: int, exc: Exception) -> None:
    """A prefetch is a guess: what stops it is left for the reader's own read to meet and raise."""
    if isinstance(exc, NoNodeError):
        return  # not committed yet (or collected): the usual case of a worker ahead of its input
    log.debug("prefetch of %s epoch %d skipped: %s: %s", subject, epoch, type(exc).__name__, exc)


class EpochReads:
    """Reads of epoch nodes; committed epochs are cached (they never change)."""

    def __init__(self, store: Store, subjects: SubjectRecipes) -> None:
        self.store = store
        self.subjects = subjects

    def epoch_node(self, subject: str, epoch: int) -> EpochNode:
        try:
            return self.store.read(EpochNode, self.store.layout.epoch(subject, epoch))[0]
        except NoNodeError:
            raise self._missing(subject, epoch) from None

    def _missing(self, subject: str, epoch: int) -> AlignerError:
        self.subjects.subject(subject)
        floor = self.subjects.first_retained(subject)
        if epoch < floor:
            return EpochCollectedError(subject, epoch, floor)
        return EpochNotCommittedError(subject, epoch, "no such epoch")

    def is_committed(self, subject: str, epoch: int) -> bool:
        if self.store.cached(subject, epoch) is not None:
            return True
        node = self.epoch_node(subject, epoch)
        children = set(self.store._children(self.store.layout.epoch(subject, epoch)))
        return bool(node.writers) and not missing_writers(node, children)

    def committed(self, subject: str, epoch: int) -> CommittedEpoch:
        """The fixed slices of a committed epoch; cached, since a committed epoch never changes."""
        hit = self.store.cached(subject, epoch)
        if hit is not None:
            return hit
        node = self.epoch_node(subject, epoch)
        path = self.store.layout.epoch(subject, epoch)
        return self._assemble(subject, epoch, node, set(self.store._children(path)) & set(node.writers))

    def committed_if(self, subject: str, epoch: int) -> CommittedEpoch | None:
        """``committed`` of an epoch that is committed, None for one that is not (yet); one read of the epoch
        node and its children instead of ``is_committed`` and then ``committed`` reading both twice.
        EpochNotCommittedError when the epoch node does not exist."""
        hit = self.store.cached(subject, epoch)
        if hit is not None:
            return hit
        node = self.epoch_node(subject, epoch)
        children = set(self.store._children(self.store.layout.epoch(subject, epoch)))
        if not node.writers or missing_writers(node, children):
            return None
        return self._assemble(subject, epoch, node, children & set(node.writers))

    def _assemble(self, subject: str, epoch: int, node: EpochNode, present: set[str]) -> CommittedEpoch:
        """The committed epoch from its node and its present writers' contributions (read pipelined)."""
        path = self.store.layout.epoch(subject, epoch)
        self.store._trip("read")
        pending = {w: self.store.zk.get_async(f"{path}/{w}") for w in sorted(present)}
        contributions = {w: parse(ContributionNode, f"{path}/{w}", a.get()[0]) for w, a in pending.items()}
        result = assemble(subject, node, contributions)
        self.store.cache(subject, epoch, result)
        return result

    def prefetch_committed(self, subject: str, epoch: int) -> None:
        """Read a committed epoch into the cache in the background, without waiting: a worker asks for the
        epoch it reads next while it processes this one, so its next epoch starts with no read. An epoch
        not committed yet, a lost connection or a malformed node leaves the cache as it was (logged): the next
        ``committed_if`` reads then, and raises what it meets."""
        kazoo = self.store.zk.kazoo
        if self.store.cached(subject, epoch) is not None or not kazoo.connected:
            return
        path = self.store.layout.epoch(subject, epoch)
        self.store._trip("read")
        head = (kazoo.get_async(path), kazoo.get_children_async(path))
        _when_all(head, lambda: self._prefetch_contributions(subject, epoch, path, *head))

    def _prefetch_contributions(self, subject: str, epoch: int, path: str, node_req: Any, children_req: Any) -> None:
        try:  # kazoo's callback thread: only async requests from here on
            node = parse(EpochNode, path, node_req.get_nowait()[0])
            present = set(children_req.get_nowait())
        except (KazooException, AlignerError) as exc:
            _prefetch_skipped(subject, epoch, exc)
            return
        if not node.writers or missing_writers(node, present):
            return
        self.store._trip("read")
        pending = {w: self.store.zk.kazoo.get_async(f"{path}/{w}") for w in node.writers}

        def assembled() -> None:
            try:
                contributions = {w: parse(ContributionNode, f"{path}/{w}", req.get_nowait()[0])
                                 for w, req in pending.items()}
                self.store.cache(subject, epoch, assemble(subject, node, contributions))
            except (KazooException, AlignerError) as exc:
                _prefetch_skipped(subject, epoch, exc)

        _when_all(tuple(pending.values()), assembled)

    def committed_many(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        """``committed`` for every epoch of [first, last], in order, with the reads pipelined.

        Two pipelined waves per chunk of epochs (epoch nodes with their children, then the
        contributions) instead of three round trips per epoch. Raises what ``committed`` raises for
        the first epoch of the span that is not committed (or malformed).
        """
        out: list[CommittedEpoch] = []
        for lo in range(first, last + 1, _PIPELINE_EPOCHS):
            out.extend(self._committed_chunk(subject, lo, min(last, lo + _PIPELINE_EPOCHS - 1)))
        return out

    def _committed_chunk(self, subject: str, first: int, last: int) -> list[CommittedEpoch]:
        lay = self.store.layout
        hits = {e: self.store.cached(subject, e) for e in range(first, last + 1)}
        todo = [e for e, hit in hits.items() if hit is None]
        heads: dict[int, tuple[Any, Any]] = {}
        if todo:
            self.store._trip("read")
            heads = {e: (self.store.zk.get_async(lay.epoch(subject, e)),
                         self.store.zk.get_children_async(lay.epoch(subject, e)))
                     for e in todo}
        nodes: dict[int, EpochNode | BaseException] = {}
        pending: dict[int, dict[str, Any]] = {}
        for e, (node_req, children_req) in heads.items():
            path = lay.epoch(subject, e)
            try:
                node = parse(EpochNode, path, node_req.get()[0])
                children = children_req.get()
            except NoNodeError:
                nodes[e] = NoNodeError()
                continue
            except MalformedNodeError as exc:
                nodes[e] = exc
                continue
            nodes[e] = node
            present = set(children) & set(node.writers)
            pending[e] = {w: f"{path}/{w}" for w in sorted(present)}
        if any(pending.values()):
            self.store._trip("read")
            pending = {e: {w: (p, self.store.zk.get_async(p)) for w, p in ws.items()} for e, ws in pending.items()}
        out: list[CommittedEpoch] = []
        for e in range(first, last + 1):
            hit = hits[e]
            if hit is not None:
                out.append(hit)
                continue
            head = nodes[e]
            if isinstance(head, NoNodeError):
                self.subjects.subject(subject)  # raises UnknownSubjectError when that is the cause
                raise self._missing(subject, e)
            if isinstance(head, BaseException):
                raise head
            contributions = {w: parse(ContributionNode, p, req.get()[0]) for w, (p, req) in pending[e].items()}
            result = assemble(subject, head, contributions)
            self.store.cache(subject, e, result)
            out.append(result)
        return out

    def epoch_time(self, subject: str, epoch: int) -> int | None:
        """When the epoch's node was last written (ZooKeeper's mtime, ms since the epoch): the time
        retention ages it by, with no field of its own; None when it is gone."""
        self.store._trip("read")
        stat = self.store.zk.exists(self.store.layout.epoch(subject, epoch))
        return None if stat is None else int(stat.mtime)

    def frontier(self, subject: str, numbers: Sequence[int] | None = None) -> int | None:
        """The last committed epoch (every earlier one is committed too: producers commit in order).

        ``numbers``: the subject's epoch numbers in order, when the caller listed them already; a day's
        ledger is a listing of 10^5 names, so a caller that needs the count too lists once, not twice."""
        for bucket in (self.subjects.epochs_from_last(subject) if numbers is None else [numbers]):
            for epoch in reversed(bucket):
                if self.is_committed(subject, epoch):
                    return epoch
        return None

    def finished(self, subject: str) -> int | None:
        """The last epoch of a subject whose every producer has finished, else None."""
        return self._finished_of(subject, self.subjects.writers(subject)[0])

    def finished_watched(self, subject: str) -> int | None:
        """``finished`` from the subject's writers node as a DataWatch keeps it (one per subject and session,
        re-armed by kazoo after outages): for a worker that asks every epoch, no read per epoch. Falls back
        to ``finished`` (which names the problem) while the node is absent or malformed."""
        with self.store._lock:
            known = subject in self.store._writers_seen
            doc = self.store._writers_seen.get(subject)
        if not known:
            path = self.store.layout.writers(subject)

            def changed(data: bytes | None, _stat: Any) -> None:
                try:
                    seen = parse(WritersNode, path, data) if data else None
                except MalformedNodeError:
                    seen = None
                with self.store._lock:
                    self.store._writers_seen[subject] = seen

            self.store._trip("read")
            with contextlib.suppress(Exception):  # unreachable now: the read below waits or names why
                self.store.zk.DataWatch(path, changed)  # calls ``changed`` now with the node as it is
            with self.store._lock:
                doc = self.store._writers_seen.get(subject)
        return self.finished(subject) if doc is None else self._finished_of(subject, doc)

    def _finished_of(self, subject: str, doc: WritersNode) -> int | None:
        if not doc.writers or any(e.finished_after is None for e in doc.writers.values()):
            return None
        last = max(e.finished_after for e in doc.writers.values() if e.finished_after is not None)
        return last if last < 0 or self.is_committed(subject, last) else None
