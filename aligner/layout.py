"""The single place ZooKeeper paths are built.

    {root}/subjects/{subject}                         SubjectNode
    {root}/subjects/{subject}/writers                 WritersNode (partition claims, compare-and-set)
    {root}/subjects/{subject}/sinks/{sink}            SinkNode
    {root}/subjects/{subject}/sinks/{sink}/producers/{producer}   ProducerNode
    {root}/subjects/{subject}/epochs/{epoch:010d}     EpochNode (expected writers)
    {root}/subjects/{subject}/epochs/{epoch:010d}/{sink}:{producer}   ContributionNode
"""

from __future__ import annotations

from dataclasses import dataclass


def writer_id(sink: str, producer: str) -> str:
    return f"{sink}:{producer}"


def split_writer(writer: str) -> tuple[str, str]:
    sink, producer = writer.split(":", 1)
    return sink, producer


def epoch_name(epoch: int) -> str:
    return f"{epoch:010d}"


@dataclass(frozen=True)
class Layout:
    root: str = "/aligner"

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

    def epochs(self, subject: str) -> str:
        return f"{self.subject(subject)}/epochs"

    def epoch(self, subject: str, epoch: int) -> str:
        return f"{self.epochs(subject)}/{epoch_name(epoch)}"

    def contribution(self, subject: str, epoch: int, writer: str) -> str:
        return f"{self.epoch(subject, epoch)}/{writer}"
