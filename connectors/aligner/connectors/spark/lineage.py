"""Lineage of Spark queries: the engine-free walker lives in :mod:`aligner.lineage`; these are its names
as the Spark adapter (and code written against it) imports them, plus the path helpers of its records.

A streaming read records, per micro-batch, the subject epochs it covered
(:class:`~aligner.lineage_models.SparkSourceBatchNode`); an aligned streaming write records, per
committed epoch, the micro-batch that wrote it (:class:`~aligner.lineage_models.SparkSinkEpochNode`).
"""

from __future__ import annotations

import threading

from aligner.errors import LineageError
from aligner.ledger import Ledger
from aligner.lineage import (
    SOURCE_BATCHES_KEPT,
    SparkLineageLedger,
    cut,
    lineage_epochs,
    query_status,
    query_statuses,
    record_source_batch,
    sink_epoch,
    sink_lineage,
    source_batch,
    spark_epoch_lineage,
    spark_sink_subjects,
)
from aligner.lineage import subject_epoch_lineage as subject_lineage

__all__ = ["SOURCE_BATCHES_KEPT", "LineageError", "cut", "lineage_epochs", "progress_path", "query_batches_path",
           "query_status", "query_statuses", "record_source_batch", "sink_epoch", "sink_epoch_path",
           "sink_epochs_path", "sink_lineage", "source_batch", "source_batch_path", "spark_epoch_lineage",
           "spark_lineage", "spark_sink_subjects", "subject_lineage"]

_RECORDS: dict[int, SparkLineageLedger] = {}
_LOCK = threading.Lock()


def spark_lineage(ledger: Ledger) -> SparkLineageLedger:
    """The Spark lineage records over ``ledger``: built once per ledger and process, and shared."""
    with _LOCK:
        records = _RECORDS.get(id(ledger))
        if records is None or records.ledger is not ledger:
            records = _RECORDS[id(ledger)] = SparkLineageLedger(ledger)
        return records


def progress_path(ledger: Ledger, subject: str, sink: str) -> str:
    return spark_lineage(ledger).progress_path(subject, sink)


def sink_epochs_path(ledger: Ledger, subject: str, sink: str) -> str:
    return spark_lineage(ledger).sink_epochs_path(subject, sink)


def sink_epoch_path(ledger: Ledger, subject: str, sink: str, epoch: int) -> str:
    return spark_lineage(ledger).sink_epoch_path(subject, sink, epoch)


def query_batches_path(ledger: Ledger, query: str) -> str:
    return spark_lineage(ledger).query_batches_path(query)


def source_batch_path(ledger: Ledger, query: str, batch: int, subject: str) -> str:
    return spark_lineage(ledger).source_batch_path(query, batch, subject)
