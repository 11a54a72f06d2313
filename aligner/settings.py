"""Connection settings shared by the CLI, connectors and tests."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where ZooKeeper and Kafka are; read from flags or ``ALIGNER_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="ALIGNER_", extra="ignore")

    zk: str = Field("127.0.0.1:2181", description="ZooKeeper connect string")
    kafka: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    root: str = Field("/aligner", description="ZooKeeper root path of all aligner state")
    home: Path = Field(Path.home() / ".aligner", description="Where the embedded stack keeps its state")

    @field_validator("root")
    @classmethod
    def _absolute_znode_path(cls, root: str) -> str:
        """A root that is not an absolute znode path would fail deep inside kazoo; refuse it here."""
        parts = root.split("/")
        if not root.startswith("/") or root == "/" or root.endswith("/") or "" in parts[1:]:
            raise ValueError(f"root must be an absolute ZooKeeper path like /aligner, not {root!r}")
        return root
