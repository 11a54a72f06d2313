"""Subjects: registration, their writers document, sinks and producers, epoch numbers and retention floor."""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.exceptions import NodeExistsError, NoNodeError

from aligner.errors import MalformedNodeError, SubjectConflictError, UnknownSubjectError
from aligner.models import ProducerNode, SubjectNode, WritersNode
from aligner.ops import Create, raise_failure
from aligner.recipes.store import Store


class SubjectRecipes(Store):
    """Read and register subjects."""

    def register_subject(self, node: SubjectNode) -> SubjectNode:
        """Create a subject, or return the existing one when it has the same shape."""
        lay = self.layout
        self.zk.ensure_path(lay.subjects)
        results = self.multi(
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
            return self.read(SubjectNode, self.layout.subject(name))[0]
        except NoNodeError:
            raise UnknownSubjectError(name) from None

    def subject_names(self) -> list[str]:
        try:
            return sorted(self._children(self.layout.subjects))
        except NoNodeError:
            return []

    def writers(self, subject: str) -> tuple[WritersNode, int]:
        path = self.layout.writers(subject)
        return self.read_registered(lambda: self.read(WritersNode, path), lambda: self.subject(subject),
                                    lambda: MalformedNodeError(path, "missing writers node"))

    def sinks(self, subject: str) -> list[str]:
        try:
            return sorted(self._children(self.layout.sinks(subject)))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def producers(self, subject: str, sink: str) -> list[ProducerNode]:
        lay = self.layout
        return [self.read(ProducerNode, lay.producer(subject, sink, p))[0]
                for p in sorted(self._children(lay.producers(subject, sink)))]

    def epoch_numbers(self, subject: str, since: int | None = None) -> list[int]:
        """The subject's epoch numbers in order (with ``since``: at least those from ``since`` on)."""
        try:
            return self.numbers(self.layout.epochs(subject), since)
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def epochs_from_last(self, subject: str) -> Iterable[list[int]]:
        """The subject's epoch numbers a bucket at a time, the newest first (see ``Store.numbers_from_last``)."""
        try:
            return self.numbers_from_last(self.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def epoch_count(self, subject: str) -> int:
        """Epochs the subject holds in ZooKeeper (retention keeps it bounded), without listing them."""
        try:
            return self.count(self.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def first_epoch(self, subject: str) -> int | None:
        """The subject's first epoch held in ZooKeeper (None: none yet); one bucket listed, not all."""
        try:
            return self.first_number(self.layout.epochs(subject))
        except NoNodeError:
            raise UnknownSubjectError(subject) from None

    def _last_epoch(self, subject: str) -> int:
        return next((numbers[-1] for numbers in self.epochs_from_last(subject) if numbers), -1)

    def first_retained(self, subject: str) -> int:
        """The subject's first retained epoch, retention's floor (0 when nothing was collected)."""
        try:
            raw, _ = self.zk.get(self.layout.retention(subject))
        except NoNodeError:
            return 0
        try:
            return int(raw)
        except ValueError:
            raise MalformedNodeError(self.layout.retention(subject), f"not an epoch number: {raw[:40]!r}") from None

    def _ensure(self, path: str, data: bytes, parent: str | None = None) -> None:
        try:
            self.zk.create(path, data)
        except NodeExistsError:
            pass
        except NoNodeError:
            if parent is None:
                raise
            raise MalformedNodeError(parent, "missing") from None
