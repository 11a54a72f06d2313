"""Kafka client settings: ALIGNER_KAFKA_CONFIG / --kafka-config reach every client.

The embedded broker (Tansu 0.6) speaks SASL/SCRAM when started with ``--authentication``, but with
its memory storage no user can be created (``tansu user create`` must itself authenticate), so a SASL
round trip cannot be run here (the docker-compose SASL_SSL variant covers it). These tests show instead
that the file's settings reach every kind of client the product builds: a harmless file works end to
end, and a setting librdkafka refuses (or a wrong security.protocol) fails each client kind, and the
CLI with one clear line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from aligner.connectors.kafka import admin, admin_config, consumer_config, producer_config
from aligner.connectors.marker import EpochMarker
from aligner.connectors.reader import EpochReader
from aligner.connectors.sink import SinkProducer
from aligner.connectors.source import SubjectSource, source_settings
from aligner.connectors.subjects import create_subject
from aligner.embedded.stack import StackInfo
from aligner.errors import KafkaConfigError
from aligner.ledger import Ledger
from aligner.models import SubjectNode
from aligner.settings import kafka_properties, librdkafka_properties, parse_properties
from tests.conftest import run_cli

# ---- parsing ------------------------------------------------------------------------------------------


def test_java_properties_syntax() -> None:
    text = (
        "# a comment\n! another\n\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism : SCRAM-SHA-512\n"
        "client.id aligner-prod\n"
        "ssl.ca.location=/etc/kafka/\\\n    ca.pem\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="svc" password="p=w:d";\n'
        "key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
    )
    props = librdkafka_properties(parse_properties(text))
    assert props == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "client.id": "aligner-prod",
                     "ssl.ca.location": "/etc/kafka/ca.pem", "sasl.username": "svc", "sasl.password": "p=w:d"}


@pytest.mark.parametrize(("text", "match"), [
    ("ssl.truststore.location=/x.jks\n", "ssl.ca.location"),
    ("sasl.jaas.config=com.example.Kerberos required;\n", "sasl.username"),
    ("a=b\\\n", "backslash"),
])
def test_unusable_properties_are_refused_clearly(text: str, match: str) -> None:
    with pytest.raises(KafkaConfigError, match=match):
        librdkafka_properties(parse_properties(text))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


@pytest.fixture
def kafka_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """ALIGNER_KAFKA_CONFIG pointing at a file the test writes."""
    path = _write(tmp_path, "")
    monkeypatch.setenv("ALIGNER_KAFKA_CONFIG", str(path))
    yield path


def test_every_config_builder_merges_the_file(kafka_config: Path) -> None:
    kafka_config.write_text("client.id=aligner-test\nsocket.keepalive.enable=true\n"
                            "bootstrap.servers=elsewhere:9092\nisolation.level=read_uncommitted\n")
    for conf in (admin_config("b:1"), producer_config("b:1", "t"), consumer_config("b:1")):
        assert conf["client.id"] == "aligner-test" and conf["socket.keepalive.enable"] == "true"
        assert conf["bootstrap.servers"] == "b:1"  # the product's own settings win
    assert consumer_config("b:1")["isolation.level"] == "read_committed"
    assert kafka_properties() == {"client.id": "aligner-test", "socket.keepalive.enable": "true",
                                  "bootstrap.servers": "elsewhere:9092", "isolation.level": "read_uncommitted"}


def test_every_client_reconnects_within_a_second_unless_the_file_says_otherwise(kafka_config: Path) -> None:
    """librdkafka's 10 s reconnect backoff kept a job from reading for 44 s after a 10 s broker pause."""
    builders = (lambda: admin_config("b:1"), lambda: producer_config("b:1", "t"), lambda: consumer_config("b:1"))
    assert [build()["reconnect.backoff.max.ms"] for build in builders] == [1000, 1000, 1000]
    kafka_config.write_text("reconnect.backoff.max.ms=5000\n")
    assert [build()["reconnect.backoff.max.ms"] for build in builders] == ["5000", "5000", "5000"]


def test_a_source_prefetches_as_readers_do_unless_the_file_says_otherwise(kafka_config: Path) -> None:
    """librdkafka counts queued.min.messages over the consumer's one queue: a source at 20,000 let one partition's
    records fetched past its bound keep the others from being fetched, and an aligned job waited at each epoch."""
    for mode in ("exactly_once", "at_least_once"):
        settings = consumer_config("b:1", source_settings(mode))
        assert settings["queued.min.messages"] == consumer_config("b:1")["queued.min.messages"] == 200000
    kafka_config.write_text("queued.min.messages=50000\n")
    assert consumer_config("b:1", source_settings("exactly_once"))["queued.min.messages"] == "50000"


def test_missing_file_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGNER_KAFKA_CONFIG", str(tmp_path / "nope.properties"))
    with pytest.raises(KafkaConfigError, match=r"nope\.properties"):
        producer_config("b:1", "t")


# ---- every client kind, on the embedded broker ----------------------------------------------------------


def test_harmless_settings_work_end_to_end(stack: StackInfo, ledger: Ledger, subject_name: str,
                                           kafka_config: Path) -> None:
    """client.id and friends on every client: a sink commits epochs, the reader reads them back."""
    kafka_config.write_text("client.id=aligner-e2e\nsocket.keepalive.enable=true\nsecurity.protocol=PLAINTEXT\n")
    create_subject(ledger, stack.kafka, subject_name, 1)  # an admin client creates the topic
    with SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]) as sink:
        epoch = sink.begin()
        sink.send(b'{"n": 1}', partition=0)
        sink.commit()
    with EpochReader(ledger, stack.kafka) as reader:
        assert [r.value for r in reader.read(subject_name, epoch)] == [b'{"n": 1}']


def test_refused_setting_reaches_every_client_kind(stack: StackInfo, ledger: Ledger, subject_name: str,
                                                   kafka_config: Path) -> None:
    """A value librdkafka refuses makes every client the product builds fail at construction: proof that
    the file reaches producers, consumers, admin clients, sinks, sources, readers and the marker."""
    ledger.subjects.register_subject(SubjectNode(name=subject_name, topic=subject_name, partitions=1))
    kafka_config.write_text("socket.timeout.ms=not-a-number\n")
    builders = {
        "admin": lambda: admin(stack.kafka),
        "producer": lambda: Producer(producer_config(stack.kafka, "t")),
        "consumer": lambda: Consumer(consumer_config(stack.kafka)),
        "sink": lambda: SinkProducer(ledger, stack.kafka, subject_name, "k", 0, [0]).open(),
        "source": lambda: SubjectSource(ledger, stack.kafka, {subject_name: [0]}),
        "reader": lambda: EpochReader(ledger, stack.kafka),
        "marker": lambda: EpochMarker(ledger, stack.kafka, subject_name).open(),
    }
    for kind, build in builders.items():
        with pytest.raises(KafkaException, match=r"socket\.timeout\.ms"):
            build()
            pytest.fail(f"{kind} did not take the client properties")


def test_cli_kafka_config(stack: StackInfo, cli_env: dict[str, str], tmp_path: Path, subject_name: str) -> None:
    good = _write(tmp_path, "client.id=aligner-cli\n")
    ok = run_cli(cli_env, "--kafka-config", str(good), "subjects", "create", subject_name, "--partitions", "1")
    assert ok.returncode == 0, ok.stderr

    wrong = tmp_path / "ssl.properties"
    wrong.write_text("security.protocol=SSL\n")  # the embedded broker speaks plaintext
    failed = run_cli(cli_env, "--kafka-config", str(wrong), "subjects", "create", f"{subject_name}-2")
    assert failed.returncode == 1
    assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert stack.kafka in failed.stderr

    missing = run_cli(cli_env, "--kafka-config", str(tmp_path / "none.properties"), "subjects", "list")
    assert missing.returncode == 1 and "none.properties" in missing.stderr and "Traceback" not in missing.stderr
    env = {**cli_env, "ALIGNER_KAFKA_CONFIG": str(wrong)}  # the environment works the same
    assert run_cli(env, "subjects", "create", f"{subject_name}-3").returncode == 1


def test_a_new_consumer_takes_over_a_bounded_part_of_the_learned_wait(monkeypatch) -> None:
    """A consumer moving to another partition waits out the fetch it sent before: inheriting a 30 s wait,
    every epoch a reader reads took 30 s. New consumers start at most at INHERITED_WAIT_MS."""
    from aligner.connectors import kafka as kafka_module

    monkeypatch.setitem(kafka_module._learned, "127.0.0.1:1", kafka_module.MAX_FETCH_WAIT_MS)
    fc = kafka_module.FetchingConsumer("127.0.0.1:1")
    try:
        assert fc.wait_ms == kafka_module.INHERITED_WAIT_MS
    finally:
        fc.close()


def test_offset_lookups_answer_latest_stable_and_earliest_through_a_consumer(stack: StackInfo,
                                                                            subject_name: str) -> None:
    """end_offsets asks a consumer's ListOffsets (AdminClient.list_offsets crashed processes): the end, the
    last stable offset that stops short of an open transaction, the log start."""
    from aligner.connectors.kafka import end_offsets, ensure_topic

    topic = f"{subject_name}-offsets"
    ensure_topic(stack.kafka, topic, 2)
    p = Producer(producer_config(stack.kafka, f"{topic}-t"))
    p.init_transactions()
    p.begin_transaction()
    for _ in range(5):
        p.produce(topic, b"c", partition=0)
    p.commit_transaction()  # offsets 0-4 and the commit marker at 5
    assert end_offsets(stack.kafka, topic, [0, 1]) == {0: 6, 1: 0}
    assert end_offsets(stack.kafka, topic, [0, 1], committed_only=False) == {0: 6, 1: 0}
    p.begin_transaction()
    p.produce(topic, b"open", partition=0)  # offset 6, its transaction left open
    p.flush()
    try:
        assert end_offsets(stack.kafka, topic, [0], committed_only=False) == {0: 7}
        # Stable: Kafka answers 6, where the open transaction starts; the embedded broker answers 0.
        assert end_offsets(stack.kafka, topic, [0])[0] in (0, 6)
        assert end_offsets(stack.kafka, topic, [0, 1], earliest=True) == {0: 0, 1: 0}
    finally:
        p.abort_transaction()
