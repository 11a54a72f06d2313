"""Every environment variable the product reads, in one place: the docs' configuration page is rendered from
:data:`VARIABLES`, and a test fails when the code reads an ``ALIGNER_*`` name this list does not hold.

The settings models (:class:`aligner.settings.Settings`, :class:`aligner.retention_policy.RetentionPolicy`)
contribute their fields with their own defaults and descriptions; the variables read elsewhere are listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_settings import BaseSettings

from aligner.retention_policy import RetentionPolicy
from aligner.settings import Settings


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    what: str
    group: str


def _from_model(model: type[BaseSettings], group: str) -> list[Variable]:
    prefix = str(model.model_config.get("env_prefix", ""))
    out = []
    for field, info in model.model_fields.items():
        default = "" if info.default is None else str(info.default)
        if field == "home":
            default = "~/.aligner"
        out.append(Variable(f"{prefix}{field.upper()}", default, info.description or "", group))
    return out


VARIABLES: tuple[Variable, ...] = (
    *_from_model(Settings, "Connection"),
    Variable("ALIGNER_ZK_TLS_CA", "", "CA file (PEM) that signed ZooKeeper's server certificate: TLS to its secure "
             "client port", "Connection"),
    Variable("ALIGNER_ZK_TLS_CERT", "", "Client certificate (PEM) for ZooKeeper TLS; with ALIGNER_ZK_TLS_KEY",
             "Connection"),
    Variable("ALIGNER_ZK_TLS_KEY", "", "Key (PEM) of ALIGNER_ZK_TLS_CERT", "Connection"),
    *_from_model(RetentionPolicy, "Retention"),
    Variable("ALIGNER_WORKER", "0", "A Faust job's worker index when the job runs several workers", "Workers"),
    Variable("ALIGNER_LOG_LEVEL", "ERROR", "Library log lines (kazoo reconnects, ...) the CLI shows on stderr",
             "CLI"),
    Variable("ALIGNER_DEBUG", "", "1: the CLI prints the traceback of an unexpected error", "CLI"),
)
"""Every ``ALIGNER_*`` environment variable, grouped as the configuration page shows them."""


def names() -> set[str]:
    return {v.name for v in VARIABLES}
