"""Faust's own Kafka connection gets the SASL/TLS settings of ALIGNER_KAFKA_CONFIG.

The mapping is pure (properties file -> faust credentials -> aiokafka's keyword arguments); one test
starts a Faust producer with a harmless file against the embedded broker.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import cast

import faust
import pytest
from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from aligner.connectors.faust import configure, faust_app
from aligner.connectors.faust.credentials import broker_credentials
from aligner.embedded.stack import TlsFiles, make_tls
from aligner.errors import KafkaConfigError


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a client certificate (PEM), made by the embedded stack's throwaway PKI."""
    return make_tls(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def kafka_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Write a client.properties file and point ALIGNER_KAFKA_CONFIG at it."""

    def write(text: str) -> Path:
        path = tmp_path / f"client-{uuid.uuid4().hex[:6]}.properties"
        path.write_text(text)
        monkeypatch.setenv("ALIGNER_KAFKA_CONFIG", str(path))
        return path

    monkeypatch.delenv("ALIGNER_KAFKA_CONFIG", raising=False)
    monkeypatch.setenv("ALIGNER_HOME", str(tmp_path / "home"))
    return write


def test_no_file_or_plaintext_means_no_credentials(kafka_config: Callable[[str], Path]) -> None:
    assert broker_credentials() is None
    kafka_config("client.id=tagger\nsecurity.protocol=PLAINTEXT\n")
    assert broker_credentials() is None


def test_sasl_plain_from_a_jaas_config(kafka_config: Callable[[str], Path]) -> None:
    kafka_config("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                 'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n'
                 '    username="alice" password="s3cret";\n')
    creds = broker_credentials()
    assert isinstance(creds, SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username, creds.password) == \
        ("SASL_PLAINTEXT", "PLAIN", "alice", "s3cret")
    assert creds.ssl_context is None
    assert credentials_to_aiokafka_auth(creds) == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice",
        "sasl_plain_password": "s3cret", "ssl_context": None}


def test_sasl_ssl_scram_with_a_ca(kafka_config: Callable[[str], Path], pki: TlsFiles) -> None:
    kafka_config(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=bob\n"
                 f"sasl.password=pw\nssl.ca.location={pki.ca}\n")
    creds = broker_credentials()
    assert isinstance(creds, SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username) == ("SASL_SSL", "SCRAM-SHA-512", "bob")
    ctx = creds.ssl_context
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    # typeshed types each field of a certificate as one union; "subject" is RDNs of (name, value) pairs
    subjects = [cast("tuple[tuple[tuple[str, str], ...], ...]", c["subject"]) for c in ctx.get_ca_certs()]
    assert [dict(s[0])["commonName"] for s in subjects] == ["aligner embedded stack CA"]
    auth = credentials_to_aiokafka_auth(creds)
    assert auth["security_protocol"] == "SASL_SSL" and auth["ssl_context"] is ctx


def test_ssl_with_a_client_certificate(kafka_config: Callable[[str], Path], pki: TlsFiles) -> None:
    kafka_config(f"security.protocol=SSL\nssl.ca.location={pki.ca}\nssl.certificate.location={pki.client_cert}\n"
                 f"ssl.key.location={pki.client_key}\nssl.endpoint.identification.algorithm=none\n")
    creds = broker_credentials()
    assert isinstance(creds, SSLCredentials) and creds.protocol.value == "SSL"
    assert not creds.context.check_hostname and creds.context.verify_mode == ssl.CERT_REQUIRED
    assert credentials_to_aiokafka_auth(creds) == {"security_protocol": "SSL", "ssl_context": creds.context}


def test_gssapi_is_the_default_sasl_mechanism(kafka_config: Callable[[str], Path]) -> None:
    kafka_config("security.protocol=SASL_PLAINTEXT\nsasl.kerberos.service.name=kafka-prod\n")
    creds = broker_credentials()
    assert isinstance(creds, GSSAPICredentials) and creds.kerberos_service_name == "kafka-prod"


@pytest.mark.parametrize(("text", "message"), [
    ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n", "OAUTHBEARER cannot be configured"),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=a\n", "needs sasl.username and"),
    ("security.protocol=SSL\nssl.key.pem=-----BEGIN\n", "ssl.key.pem: Faust.s client"),
    ("security.protocol=SSL\nssl.ca.location=/nonexistent/ca.pem\n", "TLS settings are not usable"),
    ("security.protocol=TLS\n", "security.protocol=TLS is not one of"),
])
def test_settings_faust_cannot_take_are_one_clear_error(kafka_config: Callable[[str], Path], text: str,
                                                        message: str) -> None:
    path = kafka_config(text)
    with pytest.raises(KafkaConfigError, match=message) as err:
        broker_credentials()
    assert str(path) in str(err.value)


def test_apps_get_the_credentials_unless_they_set_their_own(kafka_config: Callable[[str], Path]) -> None:
    kafka_config("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=u\nsasl.password=p\n")
    adapter = faust_app(f"creds-{uuid.uuid4().hex[:6]}", kafka="127.0.0.1:1")
    assert isinstance(adapter.conf.broker_credentials, SASLCredentials)
    assert adapter.conf.broker_credentials.mechanism.value == "SCRAM-SHA-256"
    plain = configure(faust.App(f"plain-{uuid.uuid4().hex[:6]}", broker="kafka://127.0.0.1:1"))
    assert isinstance(plain.conf.broker_credentials, SASLCredentials)
    own = SASLCredentials(username="mine", password="x")
    explicit = configure(faust.App(f"own-{uuid.uuid4().hex[:6]}", broker="kafka://127.0.0.1:1",
                                   broker_credentials=own))
    assert explicit.conf.broker_credentials is own


def test_faust_producer_with_a_harmless_file_starts_and_sends(stack, kafka_config: Callable[[str], Path]) -> None:
    kafka_config("# nothing secret here\nclient.id=aligner-faust-test\nsecurity.protocol=PLAINTEXT\n")
    app = faust_app(f"harmless-{uuid.uuid4().hex[:6]}", kafka=stack.kafka)
    assert app.conf.broker_credentials is None
    topic = f"faust-creds-{uuid.uuid4().hex[:6]}"

    async def send() -> int:
        producer = app.producer
        await producer.start()
        try:
            meta = await asyncio.wait_for(producer.send_and_wait(topic, b"k", b"v", partition=None, timestamp=None,
                                                                 headers=None), 30)
            return meta.offset
        finally:
            await producer.stop()

    assert asyncio.run(send()) == 0
