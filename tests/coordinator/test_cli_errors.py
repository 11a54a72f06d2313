"""Bad invocations of the `aligner` CLI against the real embedded stack: one line, exit 1 or 2, fast.

Every case runs the CLI as a user would (a subprocess) and checks the exit code, that stderr is
exactly one non-empty line without a traceback, that the line names what is wrong, and that the
command gave up within a bounded time. The state the cases need (subjects with committed,
uncommitted and plain-text epochs, a job, malformed znodes, a claimed partition) is built once
per module, in-process, through the ledger and a raw kazoo client.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kazoo.client import KazooClient

from aligner.connectors.kafka import QUIET
from aligner.connectors.marker import EpochMarker
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import ZOOKEEPER, EmbeddedStack, StackInfo, free_port
from aligner.errors import StoppedError
from aligner.ledger import Ledger
from aligner.models import JobNode, SubjectNode
from aligner.session import OutageLimit
from tests.conftest import ROOT, run_cli

BOUND_S = 15.0
"""Every bad invocation, unreachable services included, must give up within this many seconds."""


@dataclass(frozen=True)
class World:
    env: dict[str, str]
    names: dict[str, str]


def _produce(bootstrap: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for partition, value in values:
        p.produce(topic, value, partition=partition)
    p.flush(30)


@pytest.fixture(scope="module")
def world(stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tag = uuid.uuid4().hex[:8]
    root = f"/aligner-errors-{tag}"
    names = {k: f"{k}-{tag}" for k in ("js", "out", "je", "bad", "cl", "jb", "nt")}
    names["closed"] = str(free_port())  # nothing listens there
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root,
           "ALIGNER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("ALIGNER_DEBUG", None)
    with Ledger.connect(stack.zk, root) as led:
        js = names["js"]
        create_subject(led, stack.kafka, js, 2)
        _produce(stack.kafka, js, [(0, json.dumps({"n": 0}).encode()), (1, json.dumps({"n": 1}).encode())])
        marker = EpochMarker(led, stack.kafka, js).open()
        try:
            marker.mark()  # epoch 0: JSON
            _produce(stack.kafka, js, [(0, b"plain text from an outside producer")])
            marker.mark()  # epoch 1: holds a record that is not JSON
            led.commits.ensure_epoch(js, 2)  # epoch 2: exists, never committed
        finally:
            marker.close()
        create_subject(led, stack.kafka, names["out"], 1)
        led.subjects.register_subject(SubjectNode(name=names["nt"], topic=names["nt"],
                                                  partitions=1))  # no topic: as after
        # an embedded broker's restart (topics in memory) under a kept ZooKeeper
        led.jobs.register(JobNode(job=names["jb"], inputs=(js,), output=names["out"], parallelism=1))
        for subject in ("je", "bad"):
            create_subject(led, stack.kafka, names[subject], 1)
        je = EpochMarker(led, stack.kafka, names["je"]).open()
        try:
            je.mark()
        finally:
            je.close()
        create_subject(led, stack.kafka, names["cl"], 2)
        led.claims.claim(names["cl"], "job-x", "0", [0], lambda: {0: 0})
        raw = KazooClient(hosts=stack.zk)
        raw.start(timeout=15)
        try:
            raw.set(led.layout.subject(names["bad"]), b"{this is not json")
            raw.set(led.layout.epoch(names["je"], 0), b"\x00\x01garbage")
        finally:
            raw.stop()
            raw.close()
    yield World(env, names)


# (id, arguments, exit code, phrase in the one stderr line). Arguments are formatted with the
# world's names: {js} a json subject (epochs 0 committed, 1 with a plain-text record, 2 open),
# {out} the output of job {jb}, {je} a subject whose epoch 0 znode is garbage, {bad} a subject
# whose own znode is garbage, {cl} a subject whose partition 0 a job sink owns, {closed} a port
# nobody listens on.
CASES: list[tuple[str, list[str], int, str]] = [
    # -- usage errors (exit 2) --
    ("read-no-epoch", ["read", "{js}"], 2, "exactly one of --epoch N or --epochs A:B"),
    ("read-epoch-and-epochs", ["read", "{js}", "--epoch", "1", "--epochs", "1:2"], 2, "exactly one of --epoch"),
    ("read-reversed-epochs", ["read", "{js}", "--epochs", "5:2"], 2, "0 <= A <= B"),
    ("read-negative-epoch", ["read", "{js}", "--epoch", "-1"], 2, "greater than or equal to 0"),
    ("read-negative-span", ["read", "{js}", "--epochs", "-1:2"], 2, "0 <= A <= B"),
    ("read-span-not-numbers", ["read", "{js}", "--epochs", "a:b"], 2, "is not N or A:B"),
    ("read-epoch-not-number", ["read", "{js}", "--epoch", "x"], 2, "valid integer"),
    ("read-bad-name", ["read", "bad/name", "--epoch", "0"], 2, "'bad/name' is not a valid name"),
    ("read-unknown-format", ["read", "{js}", "--epoch", "0", "--format", "xml"], 2, "'xml'"),
    ("read-unknown-option", ["read", "{js}", "--epoch", "0", "--bogus"], 2, "No such option: --bogus"),
    ("issue-subjects-create-bad-name", ["subjects", "create", "bad/name"], 2, "'bad/name' is not a valid name"),
    ("subjects-create-zero-partitions", ["subjects", "create", "ok", "--partitions", "0"], 2, "--partitions"),
    ("subjects-create-bad-topic", ["subjects", "create", "ok", "--topic", "no spaces!"], 2,
     "not a valid Kafka topic name"),
    ("subjects-create-unknown-format", ["subjects", "create", "ok", "--format", "xml"], 2, "'xml'"),
    ("markers-zero-interval", ["markers", "{js}", "--interval", "0"], 2, "--interval"),
    ("markers-zero-count", ["markers", "{js}", "--count", "0"], 2, "--count"),
    ("epochs-zero-last", ["epochs", "{js}", "--last", "0"], 2, "--last"),
    ("lineage-neither", ["lineage", "--epoch", "1"], 2, "exactly one of --job or --subject"),
    ("lineage-both", ["lineage", "--job", "{jb}", "--subject", "{js}"], 2, "exactly one of --job or --subject"),
    ("lineage-negative-epoch", ["lineage", "--subject", "{js}", "--epoch", "-3"], 2, "--epoch"),
    ("verify-one-job", ["verify", "--job", "{jb}"], 2, "exactly two --job or two --subject"),
    ("verify-job-and-subject", ["verify", "--job", "{jb}", "--subject", "{js}"], 2, "exactly two --job"),
    ("verify-reversed-epochs", ["verify", "--subject", "{js}", "--subject", "{out}", "--epochs", "3:1"], 2,
     "0 <= A <= B"),
    ("verify-subjects-without-epochs", ["verify", "--subject", "{js}", "--subject", "{out}"], 2,
     "--epochs is needed to compare two subjects"),
    ("hotswap-ignore-without-verify", ["hotswap", "--old", "{jb}", "--new", "v2", "--subject", "{out}",
                                       "--ignore-field", "v"], 2, "--ignore-field needs --verify-epochs"),
    ("hotswap-verify-zero-epochs", ["hotswap", "--old", "{jb}", "--new", "v2", "--subject", "{out}",
                                    "--verify-epochs", "0"], 2, "--verify-epochs"),
    ("hotswap-same-job", ["hotswap", "--old", "{jb}", "--new", "{jb}", "--subject", "{out}"], 2,
     "two different jobs"),
    ("hotswap-abort-with-epoch", ["hotswap", "--old", "{jb}", "--new", "v2", "--subject", "{out}", "--abort",
                                  "--at-epoch", "3"], 2, "--abort takes no --at-epoch"),
    ("hotswap-missing-subject", ["hotswap", "--old", "{jb}", "--new", "v2"], 2, "--subject"),
    ("align-missing-job", ["align"], 2, "Missing argument"),
    ("align-zero-timeout", ["align", "{jb}", "--timeout", "0"], 2, "--timeout"),
    ("align-bad-subject-name", ["align", "{jb}", "--subject", "a/b"], 2, "'a/b' is not a valid name"),
    ("abort-bad-name", ["abort", "x y"], 2, "'x y' is not a valid name"),
    ("gc-keep-zero", ["gc", "--keep-epochs", "0"], 2, "--keep-epochs"),
    ("unknown-command", ["nonsense"], 2, "No such command 'nonsense'"),
    ("stack-unknown-command", ["stack", "sideways"], 2, "No such command 'sideways'"),
    ("root-not-absolute", ["--root", "relative", "status"], 2, "absolute ZooKeeper path"),
    # -- mistakes about state (exit 1) --
    ("read-unknown-subject", ["read", "no-such-subject", "--epoch", "0"], 1, "unknown subject 'no-such-subject'"),
    ("epochs-unknown-subject", ["epochs", "no-such-subject"], 1, "unknown subject 'no-such-subject'"),
    ("markers-unknown-subject", ["markers", "no-such-subject", "--count", "1"], 1, "unknown subject"),
    ("gc-unknown-subject", ["gc", "--subject", "no-such-subject"], 1, "unknown subject"),
    ("read-uncommitted-epoch", ["read", "{js}", "--epoch", "2"], 1, "waiting for producers"),
    ("read-future-epoch", ["read", "{js}", "--epoch", "1000"], 1, "epoch 1000"),
    ("read-span-into-future", ["read", "{js}", "--epochs", "0:50"], 1, "epoch 2 of subject"),
    ("issue-read-plain-text-in-json-subject", ["read", "{js}", "--epoch", "1"], 1,
     "partition 0 offset 1 (epoch 1)"),
    ("read-plain-text-in-span", ["read", "{js}", "--epochs", "0:1", "--json"], 1, "is not JSON"),
    ("issue-lineage-job-epoch-never-existed", ["lineage", "--job", "{jb}", "--epoch", "99"], 1, "no epoch 99"),
    ("lineage-unknown-job", ["lineage", "--job", "no-such-job", "--epoch", "0"], 1, "unknown job 'no-such-job'"),
    ("lineage-subject-epoch-never-existed", ["lineage", "--subject", "{js}", "--epoch", "99"], 1, "no such epoch"),
    ("lineage-subject-uncommitted", ["lineage", "--subject", "{js}", "--epoch", "2"], 1, "not committed"),
    ("align-unknown-job", ["align", "no-such-job", "--timeout", "5"], 1, "unknown job 'no-such-job'"),
    ("align-subject-not-read", ["align", "{jb}", "--subject", "{out}", "--timeout", "5"], 1, "does not read"),
    ("abort-unknown-job", ["abort", "no-such-job", "--timeout", "5"], 1, "unknown job 'no-such-job'"),
    ("hotswap-unknown-jobs", ["hotswap", "--old", "old-x", "--new", "new-x", "--subject", "{out}", "--timeout", "5"],
     1, "unknown job"),
    ("verify-jobs-without-shadow", ["verify", "--job", "{jb}", "--job", "{jb}"], 1, "no epochs to compare"),
    ("verify-unknown-jobs", ["verify", "--job", "a-x", "--job", "b-x"], 1, "unknown job 'a-x'"),
    ("verify-unknown-subject", ["verify", "--subject", "{js}", "--subject", "no-such-subject", "--epochs", "0:0"], 1,
     "unknown subject 'no-such-subject'"),
    ("subjects-create-other-shape", ["subjects", "create", "{js}", "--partitions", "3"], 1, "partitions"),
    ("malformed-subject-znode-read", ["read", "{bad}", "--epoch", "0"], 1, "malformed ZooKeeper data"),
    ("malformed-subject-znode-status", ["status"], 1, "malformed ZooKeeper data"),
    ("malformed-epoch-znode", ["read", "{je}", "--epoch", "0"], 1, "malformed ZooKeeper data"),
    ("partition-claimed-twice", ["markers", "{cl}", "--count", "1"], 1, "partition 0 of subject"),
    ("stack-status-without-stack", ["stack", "status"], 1, "no embedded stack"),
    ("stack-env-without-stack", ["stack", "env"], 1, "no embedded stack"),
    # -- unreachable services and bad addresses (exit 1) --
    ("zookeeper-closed-port", ["--zk", "127.0.0.1:{closed}", "status"], 1, "cannot reach ZooKeeper at 127.0.0.1:"),
    ("zookeeper-closed-port-read", ["--zk", "127.0.0.1:{closed}", "read", "{js}", "--epoch", "0"], 1,
     "cannot reach ZooKeeper at 127.0.0.1:"),
    ("zookeeper-bad-address", ["--zk", "127.0.0.1:port", "status"], 1, "invalid ZooKeeper address"),
    ("issue-kafka-closed-port-read", ["--kafka", "127.0.0.1:{closed}", "read", "{js}", "--epoch", "0"], 1,
     "cannot reach Kafka at 127.0.0.1:"),
    ("kafka-closed-port-create", ["--kafka", "127.0.0.1:{closed}", "subjects", "create", "fresh"], 1,
     "cannot reach Kafka at 127.0.0.1:"),
    ("kafka-closed-port-markers", ["--kafka", "127.0.0.1:{closed}", "markers", "{js}", "--count", "1"], 1,
     "cannot reach Kafka at 127.0.0.1:"),
    ("subject-whose-topic-is-gone", ["markers", "{nt}", "--count", "1"], 1,
     "topic '{nt}' has no partition 0 on the broker"),
    ("kafka-bad-address", ["--kafka", "127.0.0.1:port", "read", "{js}", "--epoch", "0"], 1, "invalid Kafka address"),
]


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-3000:]}"
    return lines[0]


@pytest.mark.parametrize(("args", "code", "phrase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_invocation_is_one_clear_line(world: World, args: list[str], code: int, phrase: str) -> None:
    argv = [a.format(**world.names) for a in args]
    started = time.monotonic()
    r = run_cli(world.env, *argv, timeout=60)
    took = time.monotonic() - started
    line = _one_line(r.stderr)
    assert r.returncode == code, (argv, r.returncode, line)
    assert phrase.format(**world.names) in line, (argv, line)
    assert took < BOUND_S, f"{argv} took {took:.1f}s"


def test_there_are_at_least_forty_cases() -> None:
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_plain_text_in_a_json_subject_reads_with_format_bytes(world: World) -> None:
    """The documented fallback for records an outside producer wrote in another format."""
    r = run_cli(world.env, "read", world.names["js"], "--epoch", "1", "--format", "bytes", "--json")
    assert r.returncode == 0, r.stderr
    values = [rec["value"] for rec in json.loads(r.stdout)["records"]]
    assert "plain text from an outside producer" in values


def test_unreachable_kafka_floods_nothing_and_gives_up_fast(world: World) -> None:
    """The issue's failure: ~640 lines of librdkafka logs over 31 s ending in an empty 'timeout:'."""
    started = time.monotonic()
    r = run_cli(world.env, "--kafka", f"127.0.0.1:{world.names['closed']}", "read", world.names["js"], "--epoch", "0")
    took = time.monotonic() - started
    line = _one_line(r.stderr)
    assert r.returncode == 1 and "%3|" not in r.stderr and line.strip() != "timeout:"
    assert f"cannot reach Kafka at 127.0.0.1:{world.names['closed']}" in line
    assert took < BOUND_S


def test_embedded_stack_state_without_processes_names_the_dead_zookeeper(world: World, tmp_path: Path) -> None:
    """A stack state file whose ZooKeeper is gone: commands use its address and say how to restart it."""
    home = tmp_path / "home"
    home.mkdir()
    closed = int(world.names["closed"])
    (home / "stack.json").write_text(json.dumps({
        "zk": f"127.0.0.1:{closed}", "kafka": f"127.0.0.1:{closed}", "workdir": str(home / "stack"),
        "zk_pid": 0, "kafka_pid": 0}))
    env = {k: v for k, v in world.env.items() if k not in ("ALIGNER_ZK", "ALIGNER_KAFKA")}
    env["ALIGNER_HOME"] = str(home)
    r = run_cli(env, "subjects", "list")
    line = _one_line(r.stderr)
    assert r.returncode == 1
    assert f"cannot reach ZooKeeper at 127.0.0.1:{closed}" in line and "aligner stack up" in line
    assert (home / "stack.json").exists()  # nothing is removed because a component is down




@pytest.fixture
def own_stack() -> Iterator[tuple[EmbeddedStack, StackInfo]]:
    """A stack of this test's own: its ZooKeeper gets paused."""
    own = EmbeddedStack()
    info = own.start()
    try:
        yield own, info
    finally:
        own.stop()


def test_a_command_gives_up_once_zookeeper_is_down_for_its_outage_limit(
        own_stack: tuple[EmbeddedStack, StackInfo]) -> None:
    """A one-shot command stops waiting once ZooKeeper has been unreachable for its outage limit
    (aligner.session.OutageLimit, as the CLI's ledger() uses it); closing the session is no outage."""
    own, info = own_stack
    led = Ledger.connect(info.zk, f"/aligner-outage-{uuid.uuid4().hex[:8]}")
    pid = own.pid(ZOOKEEPER)
    assert pid is not None
    try:
        bound = OutageLimit(led, limit=2.0)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StoppedError):
            led.subjects.subject_names()  # blocks in the ledger's retries until the limit stops it
        assert bound.gave_up.is_set()
        assert time.monotonic() - started < BOUND_S  # the loss is noticed within the session's read timeout
    finally:
        os.kill(pid, signal.SIGCONT)
        led.close()
    led = Ledger.connect(info.zk, "/aligner-outage")
    bound = OutageLimit(led, limit=0.5)
    bound.close()
    led.close()  # reports LOST: no outage, so the limit must not fire
    assert not bound.gave_up.wait(1.0)
