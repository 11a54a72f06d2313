"""Faust's own Kafka connection (aiokafka) secured from the same ``ALIGNER_KAFKA_CONFIG`` as every other client.

The aligned data path of a Faust job goes through confluent-kafka clients, which take the client
properties as they are (:func:`aligner.connectors.kafka.client_properties`). Faust's own producer,
consumer and admin client (its leader topic, agents, tables, ``faust send``) are aiokafka clients,
configured by one ``broker_credentials`` object instead. :func:`broker_credentials` translates the
same parsed properties (librdkafka names, ``sasl.jaas.config`` already turned into
``sasl.username``/``sasl.password``) into that object, so a worker reaches a SASL/TLS cluster on both
paths with one file. Settings aiokafka cannot take (a PKCS#12 keystore, inline PEM certificates,
OAUTHBEARER without a token provider) are refused with what to set instead.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from aligner.connectors.kafka import client_properties
from aligner.errors import KafkaConfigError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""SASL mechanisms with a username and password (faust.SASLCredentials)."""

_FAUST_REFUSES = {
    "ssl.keystore.location": "Faust's client (aiokafka) reads PEM: set ssl.certificate.location and "
                             "ssl.key.location",
    "ssl.certificate.pem": "Faust's client (aiokafka) reads certificates from files: set ssl.certificate.location",
    "ssl.key.pem": "Faust's client (aiokafka) reads keys from files: set ssl.key.location",
}


def _source() -> str:
    return os.environ.get("ALIGNER_KAFKA_CONFIG") or "client.properties"


def _flag(props: Mapping[str, str], key: str, default: bool) -> bool:
    value = props.get(key, "").strip().lower()
    return default if not value else value in ("true", "1", "yes")


def ssl_context(props: Mapping[str, str], source: str | None = None) -> ssl.SSLContext:
    """The TLS context librdkafka would use for these properties: the CA (``ssl.ca.location`` file or
    directory, or ``ssl.ca.pem``), a client certificate and key, host name checks unless
    ``ssl.endpoint.identification.algorithm=none``, verification unless turned off."""
    where = source or _source()
    for key, instead in _FAUST_REFUSES.items():
        if props.get(key):
            raise KafkaConfigError(f"{where}: {key}: {instead}")
    ca = props.get("ssl.ca.location") or None
    try:
        ctx = ssl.create_default_context(cafile=ca if ca and not os.path.isdir(ca) else None,
                                         capath=ca if ca and os.path.isdir(ca) else None,
                                         cadata=props.get("ssl.ca.pem") or None)
        cert, cert_key = props.get("ssl.certificate.location"), props.get("ssl.key.location")
        if bool(cert) != bool(cert_key):
            raise KafkaConfigError(f"{where}: ssl.certificate.location and ssl.key.location go together")
        if cert and cert_key:
            ctx.load_cert_chain(cert, cert_key, password=props.get("ssl.key.password") or None)
        if props.get("ssl.cipher.suites"):
            ctx.set_ciphers(props["ssl.cipher.suites"])
    except (OSError, ssl.SSLError) as exc:
        detail = getattr(exc, "reason", None) or exc.strerror or exc
        raise KafkaConfigError(f"{where}: the TLS settings are not usable for Faust's client: {detail}") from None
    ctx.check_hostname = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower() == "https"
    if not _flag(props, "enable.ssl.certificate.verification", True):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def broker_credentials(props: Mapping[str, str] | None = None) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for the Kafka client properties (default: ``ALIGNER_KAFKA_CONFIG``,
    parsed by :func:`aligner.connectors.kafka.client_properties`); None for a plaintext connection."""
    props = client_properties() if props is None else props
    where = _source()
    protocol = (props.get("security.protocol") or "PLAINTEXT").strip().upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise KafkaConfigError(f"{where}: security.protocol={protocol} is not one of PLAINTEXT, SSL, "
                               "SASL_PLAINTEXT, SASL_SSL")
    context = ssl_context(props, where) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return SSLCredentials(context)
    # librdkafka (and Java) default to GSSAPI; librdkafka also spells the key sasl.mechanisms.
    mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI").strip().upper()
    if mechanism == "GSSAPI":
        return GSSAPICredentials(kerberos_service_name=props.get("sasl.kerberos.service.name") or "kafka",
                                 ssl_context=context)
    if mechanism not in SASL_MECHANISMS:
        raise KafkaConfigError(f"{where}: sasl.mechanism={mechanism} cannot be configured for Faust's client from a "
                               f"properties file (use one of {', '.join(SASL_MECHANISMS)} or GSSAPI)")
    user, password = props.get("sasl.username"), props.get("sasl.password")
    if not user or not password:
        raise KafkaConfigError(f"{where}: SASL {mechanism} needs sasl.username and sasl.password "
                               "(or sasl.jaas.config with username=\"...\" password=\"...\")")
    return SASLCredentials(username=user, password=password, ssl_context=context, mechanism=mechanism)
