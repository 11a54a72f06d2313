"""Connection settings shared by the CLI, connectors and tests.

The security settings (``ALIGNER_ZK_AUTH``, ``ALIGNER_KAFKA_CONFIG``, ``ALIGNER_ZK_TLS_*``) are read from
the environment by the client builders themselves (:func:`zk_security`, :func:`kafka_properties`), so
every process the product starts (CLI, runtime workers, the marker, Spark executors, Faust workers)
gets them through its inherited environment, without plumbing through every constructor.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aligner.errors import AlignerError, KafkaConfigError
from aligner.layout import DEFAULT_ROOT

_USER = re.compile(r"^[A-Za-z0-9._-]{1,120}$")


@dataclass(frozen=True)
class ZkAuth:
    """A ZooKeeper identity: ``digest:USER:PASSWORD`` (ZooKeeper's built-in digest scheme)."""

    scheme: str
    user: str
    password: str

    @property
    def credential(self) -> str:
        """What kazoo's ``auth_data`` takes."""
        return f"{self.user}:{self.password}"

    def __str__(self) -> str:  # never the password
        return f"{self.scheme} user {self.user!r}"


def parse_zk_auth(text: str) -> ZkAuth:
    """``digest:USER:PASSWORD`` -> ZkAuth; ValueError names what is wrong (never echoing the password)."""
    scheme, _, rest = text.partition(":")
    if scheme != "digest":
        raise ValueError("ZooKeeper auth must look like digest:USER:PASSWORD "
                         f"(scheme {scheme!r} is not supported; ZooKeeper's digest scheme is)")
    user, sep, password = rest.partition(":")
    if not sep or not password:
        raise ValueError("ZooKeeper auth must look like digest:USER:PASSWORD (no password given)")
    if not _USER.match(user):
        raise ValueError(f"ZooKeeper user {user!r} is not valid: use 1-120 of A-Z a-z 0-9 . _ -")
    return ZkAuth(scheme, user, password)


class Settings(BaseSettings):
    """Where ZooKeeper and Kafka are; read from flags or ``ALIGNER_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="ALIGNER_", extra="ignore")

    zk: str = Field("127.0.0.1:2181", description="ZooKeeper connect string")
    kafka: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    root: str = Field(DEFAULT_ROOT, description="ZooKeeper root path of all aligner state")
    home: Path = Field(Path.home() / ".aligner", description="Where the embedded stack keeps its state")
    zk_auth: str | None = Field(None, description="ZooKeeper identity, digest:USER:PASSWORD (checked by "
                                "zk_security, which never echoes it)")
    kafka_config: Path | None = Field(None, description="Kafka client.properties file (SASL, TLS, ...)")
    zookeeper_jar: Path | None = Field(None, description="ZooKeeper server jar the embedded stack runs "
                                       "(default: Debian's /usr/share/java/zookeeper.jar)")

    @field_validator("root")
    @classmethod
    def _absolute_znode_path(cls, root: str) -> str:
        """A root that is not an absolute znode path would fail deep inside kazoo; refuse it here."""
        parts = root.split("/")
        if not root.startswith("/") or root == "/" or root.endswith("/") or "" in parts[1:]:
            raise ValueError(f"root must be an absolute ZooKeeper path like /aligner, not {root!r}")
        return root


# ---- ZooKeeper security ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ZkTls:
    """TLS to ZooKeeper's secure client port: the CA that signed the server certificate, and
    optionally a client certificate and key (PEM files; ZooKeeper requires one unless its
    ``ssl.clientAuth`` is ``none``). The server certificate must name the host of the connect string
    (as ZooKeeper's own Java client checks by default)."""

    ca: str
    certfile: str | None = None
    keyfile: str | None = None

    def kazoo_options(self) -> dict[str, object]:
        # kazoo checks the chain by default but not the host name; a certificate any CA-signed party
        # holds would then do, so the host name is checked too.
        return {"use_ssl": True, "ca": self.ca, "certfile": self.certfile, "keyfile": self.keyfile,
                "verify_certs": True, "check_hostname": True}

    def context(self) -> ssl.SSLContext:
        """The client TLS context kazoo builds from :meth:`kazoo_options` (for probes and health checks)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.certfile and self.keyfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx


_TLS_ENV = (("ca", "ALIGNER_ZK_TLS_CA"), ("certfile", "ALIGNER_ZK_TLS_CERT"), ("keyfile", "ALIGNER_ZK_TLS_KEY"))


def zk_tls() -> ZkTls | None:
    """``ALIGNER_ZK_TLS_CA`` (+ ``_CERT`` and ``_KEY`` together), checked here: kazoo reads the files in
    its connection thread, where a missing file would only show as a session that never comes."""
    files = {name: os.environ.get(var) or None for name, var in _TLS_ENV}
    given = [var for name, var in _TLS_ENV if files[name]]
    if not given:
        return None
    if files["ca"] is None:
        raise AlignerError(f"{', '.join(given)} given without ALIGNER_ZK_TLS_CA (the CA file that signed "
                           "ZooKeeper's certificate)")
    if (files["certfile"] is None) != (files["keyfile"] is None):
        raise AlignerError("ALIGNER_ZK_TLS_CERT and ALIGNER_ZK_TLS_KEY go together (a client certificate and its key)")
    for name, var in _TLS_ENV:
        path = files[name]
        if path is not None and not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not readable"
            raise AlignerError(f"{var}: cannot read {path} ({why})")
    tls = ZkTls(files["ca"], files["certfile"], files["keyfile"])
    try:
        tls.context()
    except (ssl.SSLError, OSError) as exc:
        raise AlignerError(f"ZooKeeper TLS files are not usable PEM (ALIGNER_ZK_TLS_CA/_CERT/_KEY): "
                           f"{getattr(exc, 'reason', None) or exc}") from None
    return tls


@dataclass(frozen=True)
class ZkSecurity:
    auth: ZkAuth | None
    tls: ZkTls | None

    def kazoo_options(self) -> dict[str, object]:
        """KazooClient keyword arguments: nothing at all when neither auth nor TLS is configured."""
        opts: dict[str, object] = {}
        if self.auth is not None:
            opts["auth_data"] = [(self.auth.scheme, self.auth.credential)]
        if self.tls is not None:
            opts.update(self.tls.kazoo_options())
        return opts


def zk_security(auth: str | None = None) -> ZkSecurity:
    """The ZooKeeper identity and TLS settings: ``auth`` when given ('' means none), else
    ``ALIGNER_ZK_AUTH``; TLS from ``ALIGNER_ZK_TLS_CA`` (+ ``_CERT``, ``_KEY``)."""
    text = os.environ.get("ALIGNER_ZK_AUTH", "") if auth is None else auth
    tls = zk_tls()
    try:
        return ZkSecurity(parse_zk_auth(text) if text else None, tls)
    except ValueError as exc:
        raise AlignerError(f"ALIGNER_ZK_AUTH: {exc}") from None


# ---- Kafka client properties -----------------------------------------------------------------------

JAVA_ONLY = {
    "ssl.truststore.location": "librdkafka reads PEM: convert the truststore and set ssl.ca.location",
    "ssl.truststore.password": "librdkafka reads PEM: convert the truststore and set ssl.ca.location",
    "ssl.truststore.type": "librdkafka reads PEM: set ssl.ca.location",
    "sasl.login.callback.handler.class": "a Java class; librdkafka cannot load it",
    "sasl.client.callback.handler.class": "a Java class; librdkafka cannot load it",
}
"""Java client properties librdkafka does not take, with what to use instead."""

IGNORED = ("key.serializer", "value.serializer", "key.deserializer", "value.deserializer")
"""Java client properties that make no sense here and are skipped (the product serializes itself)."""

_JAAS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_properties(text: str, source: str = "client.properties") -> dict[str, str]:
    """Java ``.properties`` syntax: ``key=value``, ``key: value`` or ``key value`` lines, ``#``/``!``
    comments, a trailing backslash continues a line."""
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip() if not logical else raw.strip()
        if not logical and (not line or line.startswith(("#", "!"))):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: continued on the next line
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"^((?:[^\s=:\\]|\\.)+)\s*[=:\s]\s*(.*)$", logical) or re.match(r"^((?:[^\s=:\\]|\\.)+)$", logical)
        if m is None:
            raise KafkaConfigError(f"{source}: cannot read the line {logical[:60]!r}: use key=value")
        key = m.group(1).replace("\\", "")
        props[key] = (m.group(2) if m.lastindex and m.lastindex > 1 else "").strip()
        logical = ""
    if logical:
        raise KafkaConfigError(f"{source}: the last line ends with a backslash (continued, but nothing follows)")
    return props


def librdkafka_properties(props: dict[str, str], source: str = "client.properties") -> dict[str, str]:
    """Java client properties -> librdkafka's: ``sasl.jaas.config`` (PLAIN/SCRAM) becomes
    ``sasl.username``/``sasl.password``; serializers are skipped; Java-only settings are refused
    with what to set instead (librdkafka would fail with a less helpful message at the first client)."""
    out: dict[str, str] = {}
    for key, value in props.items():
        if key in IGNORED:
            continue
        if key in JAVA_ONLY:
            raise KafkaConfigError(f"{source}: {key} is a Java client setting: {JAVA_ONLY[key]}")
        if key == "sasl.jaas.config":
            fields = dict(_JAAS.findall(value))
            if "username" not in fields or "password" not in fields:
                raise KafkaConfigError(f"{source}: sasl.jaas.config needs username=\"...\" password=\"...\" "
                                       "(PLAIN or SCRAM), or set sasl.username and sasl.password")
            out.setdefault("sasl.username", fields["username"])
            out.setdefault("sasl.password", fields["password"])
            continue
        out[key] = value
    return out


_cache: dict[tuple[str, float], dict[str, str]] = {}


def kafka_properties(path: str | Path | None = None) -> dict[str, str]:
    """The Kafka client settings of ``path``, else of ``ALIGNER_KAFKA_CONFIG`` ({} when neither is set),
    in librdkafka's names. Re-read when the file changes."""
    where = str(path) if path is not None else os.environ.get("ALIGNER_KAFKA_CONFIG", "")
    if not where:
        return {}
    try:
        mtime = os.stat(where).st_mtime
        key = (where, mtime)
        if key not in _cache:
            text = Path(where).read_text()
            _cache.clear()
            _cache[key] = librdkafka_properties(parse_properties(text, where), where)
    except OSError as exc:
        raise KafkaConfigError(f"cannot read the Kafka client config {where} (ALIGNER_KAFKA_CONFIG): "
                               f"{exc.strerror or exc}") from None
    return dict(_cache[key])
