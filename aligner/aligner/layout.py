"""The single place ZooKeeper paths are built.

    {root}/subjects/{subject}                         SubjectNode
    {root}/subjects/{subject}/writers                 WritersNode (partition claims, compare-and-set)
    {root}/subjects/{subject}/sinks/{sink}            SinkNode
    {root}/subjects/{subject}/sinks/{sink}/producers/{producer}   ProducerNode
    {root}/subjects/{subject}/epochs/{epoch:010d}     EpochNode (expected writers)
    {root}/subjects/{subject}/epochs/{epoch:010d}/{sink}:{producer}   ContributionNode
    {root}/jobs/{job}                                 JobNode
    {root}/jobs/{job}/epochs/{epoch:010d}             JobEpochNode (aligned job epochs)
    {root}/jobs/{job}/workers/{i}/epochs/{epoch:010d} WorkerEpochNode (input offsets + state)
    {root}/jobs/{job}/sources/{subject}/command       CommandNode (alignment commands)
    {root}/jobs/{job}/sources/{subject}/consumers/{i} ConsumerNode (alignment state)
    {root}/jobs/{job}/decision                        AlignmentDecision (coordinator)
    {root}/coordinator/election                       leader election of coordinators
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

    def retention(self, subject: str) -> str:
        return f"{self.subject(subject)}/retention"

    def epochs(self, subject: str) -> str:
        return f"{self.subject(subject)}/epochs"

    def epoch(self, subject: str, epoch: int) -> str:
        return f"{self.epochs(subject)}/{epoch_name(epoch)}"

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
        return f"{self.job_epochs(job)}/{epoch_name(epoch)}"

    def worker_epochs(self, job: str, worker: int) -> str:
        return f"{self.job(job)}/workers/{worker}/epochs"

    def worker_epoch(self, job: str, worker: int, epoch: int) -> str:
        return f"{self.worker_epochs(job, worker)}/{epoch_name(epoch)}"

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
    def election(self) -> str:
        return f"{self.root}/coordinator/election"
