"""The error mapper: every failure of a command becomes one line on stderr and an exit code.

Chosen by the exception's type, never by its text: 2 for usage errors, 1 for the rest (an adapter
without its extra, an unreachable service, malformed ZooKeeper data, ...).
"""

from __future__ import annotations

from pydantic import ValidationError
from typer._click import exceptions as click_errors  # typer vendors click: its exceptions are these

from aligner.coordinator.cli.common import validation_text
from aligner.coordinator.cli.connect import state, unreachable
from aligner.embedded import stack as stack_mod
from aligner.errors import AlignerError


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception, chosen by its type."""
    if isinstance(exc, click_errors.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else "aligner"
        return f"usage error: {exc.format_message()} (see `{where} --help`)", exc.exit_code
    if isinstance(exc, click_errors.ClickException):
        return f"error: {exc.format_message()}", exc.exit_code
    if isinstance(exc, (AlignerError, ImportError)):  # an adapter without its extra names the one to install
        return f"error: {exc}", 1
    service = _service_error(exc)
    if service is not None:
        return f"error: {service}", 1
    if isinstance(exc, TimeoutError):
        zk, kafka_at = _addresses()
        return f"error: timed out: {exc or f'no answer from ZooKeeper at {zk} or Kafka at {kafka_at}'}", 1
    if isinstance(exc, ValidationError):
        return f"error: {validation_text(exc)}", 1
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"error: {exc.strerror or exc}{where}", 1
    return f"internal error: {type(exc).__name__}: {exc} (ALIGNER_DEBUG=1 shows the traceback)", 1


def _addresses() -> tuple[str, str]:
    s = getattr(state, "settings", None)
    return (s.zk, s.kafka) if s is not None else ("?", "?")


def _service_error(exc: BaseException) -> str | None:
    """A ZooKeeper or Kafka client failure as one sentence naming the address (None: not one)."""
    from confluent_kafka import KafkaError, KafkaException
    from kazoo import exceptions as zk_errors
    from kazoo.handlers.threading import KazooTimeoutError

    zk, kafka_at = _addresses()
    zk_lost = (zk_errors.ConnectionLoss, zk_errors.ConnectionClosedError, zk_errors.SessionExpiredError,
               zk_errors.OperationTimeoutError)
    if isinstance(exc, KazooTimeoutError):
        return str(unreachable(stack_mod.ZOOKEEPER, zk, "no answer in time"))
    if isinstance(exc, zk_lost):
        return str(unreachable(stack_mod.ZOOKEEPER, zk, f"connection lost ({type(exc).__name__})"))
    if isinstance(exc, (zk_errors.NoAuthError, zk_errors.AuthFailedError)):
        return f"ZooKeeper at {zk} refused access ({type(exc).__name__}): check ALIGNER_ZK_AUTH"
    if isinstance(exc, zk_errors.NoNodeError):
        return "a ZooKeeper node vanished while it was read (removed by `aligner gc` or another command?)"
    if isinstance(exc, zk_errors.KazooException):
        return f"ZooKeeper at {zk} failed: {type(exc).__name__} {exc}"
    if isinstance(exc, KafkaException):
        from aligner.connectors.kafka import UNREACHABLE

        kerr = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        text = kerr.str() if kerr is not None else str(exc)
        if kerr is not None and kerr.code() in UNREACHABLE:
            return str(unreachable(stack_mod.KAFKA, kafka_at, text))
        return f"Kafka at {kafka_at} failed: {text}"
    return None
