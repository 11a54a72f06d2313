"""Connections of one command: effective settings, the embedded stack's hints, ZooKeeper and Kafka probes.

Settings come from flags, then ``ALIGNER_*`` (pydantic-settings), then a running ``aligner stack up``.
An unreachable service is one clear error naming its address and, for a component of the embedded
stack, how to bring it back.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from aligner.coordinator.cli.common import usage, validation_text
from aligner.embedded import stack as stack_mod
from aligner.errors import AlignerError, StackError, UnreachableError
from aligner.settings import Settings

if TYPE_CHECKING:
    from aligner.ledger import Ledger

# The ledger, its models and the Kafka and ZooKeeper clients are imported where they are used, so
# that a usage error is reported without loading them (the CLI starts in about half the time).

ZK_CONNECT_TIMEOUT = 8.0
"""Seconds to wait for a first ZooKeeper session before a command gives up (the address is named), at the
least: a command that rides out a longer outage waits that long for its first session too."""
ZK_OUTAGE_LIMIT = 12.0
"""Seconds a one-shot command rides out a lost ZooKeeper connection before it gives up (commands that
wait, like align, ride out as long as their --timeout; the marker rides out any outage)."""
KAFKA_CONNECT_TIMEOUT = 8.0
"""Seconds to wait for the first Kafka metadata answer before a command gives up."""


class CommandConnection:
    """The connection settings one CLI command runs with, and where they came from (flags, environment or the
    embedded stack): not the alignment :class:`aligner.alignment.State`."""

    settings: Settings
    explicit: frozenset[str] = frozenset()
    """Connection settings given by flag or environment; the others may come from the embedded stack."""
    resolved = False
    embedded: stack_mod.StackInfo | None = None
    """The detached stack whose addresses this command uses, if any."""


state = CommandConnection()


def configure(zk: str | None, kafka: str | None, root: str | None, zk_auth: str | None,
              kafka_config: str | None) -> None:
    """The root options of every command (flags win over the environment)."""
    security_options(zk_auth, kafka_config)
    overrides: dict[str, Any] = {k: v for k, v in {"zk": zk, "kafka": kafka, "root": root}.items() if v}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        usage(validation_text(exc))
    state.settings = settings
    state.explicit = frozenset(settings.model_fields_set & {"zk", "kafka"})
    state.resolved = False
    state.embedded = None


def security_options(zk_auth: str | None, kafka_config: str | None) -> None:
    """--zk-auth and --kafka-config are exported to the environment: every ZooKeeper session and Kafka
    client (here and in processes this command starts) reads them there, as it reads ALIGNER_*."""
    from aligner.settings import kafka_properties, parse_zk_auth

    if zk_auth is not None:
        try:
            parse_zk_auth(zk_auth)
        except ValueError as exc:
            usage(f"--zk-auth: {exc}")
        os.environ["ALIGNER_ZK_AUTH"] = zk_auth
    if kafka_config is not None:
        kafka_properties(kafka_config)  # a missing or unusable file is one clear error now
        os.environ["ALIGNER_KAFKA_CONFIG"] = os.path.abspath(kafka_config)


def settings() -> Settings:
    """The effective settings: ZooKeeper and Kafka not given by flag or environment come from the
    embedded stack's state file when there is one, even when its components are down (a command
    then fails naming the address and how to restart it, instead of trying a default address)."""
    if not state.resolved:
        state.resolved = True
        if "zk" not in state.explicit:
            info = stack_mod.read_stack(state.settings.home)
            if info is not None:
                state.embedded = info
                update = {"zk": info.zk} if "kafka" in state.explicit else {"zk": info.zk, "kafka": info.kafka}
                state.settings = state.settings.model_copy(update=update)
                for name, path in info.env().items():  # a TLS stack's client files, unless set already
                    if name.startswith("ALIGNER_ZK_TLS_"):
                        os.environ.setdefault(name, path)
    return state.settings


def stack_hint(name: str, address: str) -> str:
    """How to fix an unreachable service that is a component of the embedded stack ('' otherwise)."""
    info = state.embedded
    if info is None:
        with suppress(StackError):
            info = stack_mod.read_stack(state.settings.home)
    if info is None or info.address(name) != address:
        return ""
    comp = stack_mod.component(info, name)
    label = f"the embedded stack's {comp.label} (pid {comp.pid})"
    if comp.state == "down" and name == stack_mod.KAFKA:
        return f"{label} is down (it kept topics in memory: they are gone): `aligner stack up` restarts it " \
               f"on the same port"
    if comp.state == "down":
        return f"{label} is down: `aligner stack up` restarts it on the same port and data dir"
    if comp.state == "paused":
        return f"{label} is paused (SIGSTOP): `kill -CONT {comp.pid}` resumes it"
    return f"{label} is {comp.state}; see `aligner stack status` and {comp.log}"


def unreachable(name: str, address: str, detail: str) -> UnreachableError:
    service = "ZooKeeper" if name == stack_mod.ZOOKEEPER else "Kafka"
    return UnreachableError(service, address, detail, stack_hint(name, address))


def probe_zookeeper(address: str) -> None:
    """Fail at once when every ZooKeeper server refuses the connection (kazoo would retry for its timeout)."""
    try:
        from kazoo.hosts import collect_hosts

        hosts, _chroot = collect_hosts(address)
    except ValueError as exc:
        raise AlignerError(f"invalid ZooKeeper address {address!r}: {exc}") from None
    failure: OSError | None = None
    for host, port in hosts:
        try:
            with socket.create_connection((host, port), timeout=3.0):
                return
        except OSError as exc:
            failure = exc
    if failure is not None:
        detail = ("unknown host" if isinstance(failure, socket.gaierror) else
                  "no answer to a TCP connect" if isinstance(failure, TimeoutError) else
                  (failure.strerror or type(failure).__name__).lower())
        raise unreachable(stack_mod.ZOOKEEPER, address, detail)


@contextmanager
def ledger(outage_limit: float | None = ZK_OUTAGE_LIMIT, stop: threading.Event | None = None) -> Iterator[Ledger]:
    """A ledger session for one command; an unreachable ZooKeeper is one clear error naming its address.

    A connection lost for ``outage_limit`` seconds ends the command with that error (see
    :class:`aligner.session.OutageLimit`); None rides out outages of any length, the first
    connection included, until ``stop`` is set (long-running components: the marker)."""
    from kazoo.handlers.threading import KazooTimeoutError

    from aligner.ledger import Ledger
    from aligner.session import OutageLimit

    s = settings()
    if outage_limit is None:
        led = Ledger.connect(s.zk, s.root, timeout=None, stop=stop)  # waits for ZooKeeper as long as it takes
    else:
        probe_zookeeper(s.zk)  # nothing listening fails at once; a server that answers may refuse sessions a while
        first = max(ZK_CONNECT_TIMEOUT, outage_limit)  # e.g. an ensemble electing a leader as the command starts
        try:
            led = Ledger.connect(s.zk, s.root, timeout=first)
        except KazooTimeoutError:
            raise unreachable(stack_mod.ZOOKEEPER, s.zk, f"no session within {first:.0f}s") from None
    bound = OutageLimit(led, outage_limit) if outage_limit is not None else None
    try:
        yield led
    except AlignerError:
        if bound is not None and bound.gave_up.is_set():
            raise unreachable(stack_mod.ZOOKEEPER, s.zk,
                              f"the connection was lost for more than {outage_limit:.0f}s") from None
        raise
    finally:
        if bound is not None:
            bound.close()  # closing the session reports LOST; that is no outage
        with suppress(Exception):  # the command's outcome is decided: a failing close changes nothing it did
            led.close()


def kafka() -> str:
    """The Kafka bootstrap servers, checked to answer: an unreachable broker fails fast and clearly."""
    from aligner.connectors.kafka import check_reachable

    bootstrap = settings().kafka
    try:
        check_reachable(bootstrap, KAFKA_CONNECT_TIMEOUT)
    except UnreachableError as exc:
        raise unreachable(stack_mod.KAFKA, bootstrap, exc.detail) from None
    return bootstrap


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: long-running commands stop within seconds, exit code 0."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
