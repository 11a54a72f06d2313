"""A micro-batch of the aligned sink is planned once: the writer of its tasks plans when it is built and its
pickles carry the plan, the writer of its commit plans only when no commit message carries one. Here on the
writer objects as PySpark's workers build them (the tasks' from a data source made for it, the commit's from the
query's data source unpickled), against real ZooKeeper and no Spark session; tests/spark/test_spark_commit.py
counts the same on real Spark."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from aligner.connectors.subjects import create_subject
from aligner.errors import AlignedOptionError

pytest.importorskip("pyspark")

TARGET = "wp"


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The writers' ZooKeeper sessions (``ledger_for``: one per process and root), closed after the test."""
    from aligner.connectors.spark import common

    made: dict[Any, Any] = {}
    monkeypatch.setattr(common, "_LEDGERS", made)
    yield
    for led in made.values():
        led.close()


@pytest.fixture
def options(stack: Any, root: str, ledger: Any, sessions: None) -> MutableMapping[str, str]:
    """The sink's options as Spark passes them (case-insensitive keys)."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    create_subject(ledger, stack.kafka, TARGET, 2)
    return CaseInsensitiveDict({"zk": stack.zk, "kafka": stack.kafka, "root": root, "subject": TARGET,
                                "sinkId": "once"})


def _tasks_writer(options: MutableMapping[str, str]) -> Any:
    """The writer PySpark pickles to a micro-batch's tasks: built from a data source made for it."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from aligner.connectors.spark.source import AlignedDataSource

    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    return AlignedDataSource(options).streamWriter(schema, False)


def _commits_writer(options: MutableMapping[str, str]) -> Any:
    """The writer that commits the batch: built from the query's data source, unpickled."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from aligner.connectors.spark.source import AlignedDataSource

    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    return pickle.loads(pickle.dumps(AlignedDataSource(options))).streamWriter(schema, False)


def _requests(stack: Any, root: str) -> Any:
    """The requests the writers' ZooKeeper session sends inside a ``with`` block."""
    from aligner.connectors.spark.common import ledger_for
    from tests.spark_faults import zk_requests

    return zk_requests(ledger_for(stack.zk, root))


def test_the_commits_writer_plans_nothing_when_a_task_carried_the_plan(stack: Any, root: str, ledger: Any,
                                                                       options: MutableMapping[str, str]) -> None:
    with _requests(stack, root) as planning:
        tasks_writer = _tasks_writer(options)
    assert planning, "the tasks' writer did not plan when built"
    with _requests(stack, root) as task:
        shipped = pickle.loads(pickle.dumps(tasks_writer))
        message = shipped.write(iter([]))  # a write task without rows
    assert task == [], "the tasks' writer planned again in pickling, or its task asked ZooKeeper"
    assert message.plan == tasks_writer.plan
    with _requests(stack, root) as committing:
        _commits_writer(options).commit([message], 0)
    assert committing == [("Transaction", None)], "the commit's writer read ZooKeeper besides its multi-op"
    assert ledger.epochs.frontier(TARGET) == message.plan.epoch


def test_the_commits_writer_plans_when_no_task_carried_a_plan(stack: Any, root: str, ledger: Any,
                                                              options: MutableMapping[str, str]) -> None:
    with _requests(stack, root) as built:
        committer = _commits_writer(options)
    assert built == []
    with _requests(stack, root) as committing:
        committer.commit([], 0)
    assert len(committing) > 1 and committing[-1] == ("Transaction", None), committing
    assert ledger.epochs.frontier(TARGET) == committer.plan.epoch


def test_a_writer_pickled_unplanned_plans_first(stack: Any, root: str, options: MutableMapping[str, str]) -> None:
    """Whichever writer Spark pickles, no task plans on its own."""
    lazy = _commits_writer(options)
    shipped = pickle.loads(pickle.dumps(lazy))
    with _requests(stack, root) as task:
        message = shipped.write(iter([]))
    assert task == []
    assert shipped.producers == 2 and message.plan == lazy.plan


def test_a_planning_error_fails_the_tasks_writer_when_built(options: MutableMapping[str, str]) -> None:
    """Raised as itself, not from pickling (where PySpark's serializer would turn it into a PicklingError)."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    with pytest.raises(AlignedOptionError, match="producers=5 but subject 'wp' has only 2 partitions"):
        _tasks_writer(CaseInsensitiveDict({**options, "producers": "5"}))
