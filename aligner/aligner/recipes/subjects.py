"""Subjects: registration, their writers document, sinks and producers, epoch numbers and retention floor."""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.exceptions import NodeExistsError, NoNodeError

from aligner.errors import MalformedNodeError, SubjectConflictError, UnknownSubjectError
from aligner.models import ProducerNode, SubjectNode, WritersNode
from aligner.ops import Create, raise_failure
from aligner.recipes.store import Store


class SubjectRecipes:
    """Read and register subjects."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register_subject(self, node: SubjectNode) -> SubjectNode:
        """Create a subject, or return the existing one when it has the same shape."""
        lay = self.store.layout
        self.store.zk.ensure_path(lay.subjects)
        results = self.store.multi(
            Create(lay.subject(node.name), node.dump()),
            Create(lay.writers(node.name), WritersNode().dump()),
            Create(lay.sinks(node.name)),
            Create(lay.epochs(node.name)),
        )
        if isinstance(results[0], NodeExistsError):
            existing = self.subject(node.name)
            if not existing.same_shape(node):
                raise SubjectConflictError(
                    f"subject {node.name!r} already exists with topic {existing.topic!r}, "
                    f"{existing.partitions} partitions and {len(existing.fields)} fields; refusing to change it"
                )
            return existing
        raise_failure(results)
        return node

    def subject(self, name: str) -> SubjectNode:
        try:
            return self.store.read(SubjectNode, self.store.layout.subject(name))[0]
        except NoNodeError:
            raise UnknownSubjectError(name) from None

    def subject_names(self) -> list[str]:
        try:
            return sorted(self.store._children(self.store.layout.subjects))
        except NoNodeError:
            return []

    def writers(self, subject: str) -> tuple[WritersNode, int]:
        path = self.store.layout.writers(subject)
        return self.store.read_registered(lambda: self.store.read(WritersNode, path), lambda: self.subject(subject),
                                    lambda: MalformedNodeError(path, "missing writers node"))

    def sinks(self, subject: str) -> list[str]:
        try:
            return sorted(self.store._children(self.store.layout.sinks(subject)))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def producers(self, subject: str, sink: str) -> list[ProducerNode]:
        lay = self.store.layout
        return [self.store.read(ProducerNode, lay.producer(subject, sink, p))[0]
                for p in sorted(self.store._children(lay.producers(subject, sink)))]

    def epoch_numbers(self, subject: str, since: int | None = None) -> list[int]:
        """The subject's epoch numbers in order (with ``since``: at least those from ``since`` on)."""
        try:
            return self.store.numbers(self.store.layout.epochs(subject), since)
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def epochs_from_last(self, subject: str) -> Iterable[list[int]]:
        """The subject's epoch numbers a bucket at a time, the newest first (see ``Store.numbers_from_last``)."""
        try:
            return self.store.numbers_from_last(self.store.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def epoch_count(self, subject: str) -> int:
        """Epochs the subject holds in ZooKeeper (retention keeps it bounded), without listing them."""
        try:
            return self.store.count(self.store.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def first_epoch(self, subject: str) -> int | None:
        """The subject's first epoch held in ZooKeeper (None: none yet); one bucket listed, not all."""
        try:
            return self.store.first_number(self.store.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def _last_epoch(self, subject: str) -> int:
        return next((numbers[-1] for numbers in self.epochs_from_last(subject) if numbers), -1)

    def first_retained(self, subject: str) -> int:
        """The subject's first retained epoch, retention's floor (0 when nothing was collected)."""
        try:
            raw, _ = self.store.zk.get(self.store.layout.retention(subject))
        except NoNodeError:
            return 0
        try:
            return int(raw)
        except ValueError:
            raise MalformedNodeError(self.store.layout.retention(subject),
                                     f"not an epoch number: {raw[:40]!r}") from None

    def _ensure(self, path: str, data: bytes, parent: str | None = None) -> None:
        try:
            self.store.zk.create(path, data)
        except NodeExistsError:
            pass
        except NoNodeError:
            if parent is None:
                raise
            raise MalformedNodeError(parent, "missing") from None
