"""`aligner exporter`: the ledger's view of a deployment as Prometheus metrics, on a real ZooKeeper."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from aligner.coordinator.exporter import LedgerCollector
from aligner.ledger import Ledger
from aligner.models import ConsumerNode, JobNode, Range, SubjectNode, SwapNode
from tests.helpers import wait_for

STOP_WITHIN = 5.0


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def _commit_marker_epochs(ledger: Ledger, subject: str, n: int) -> None:
    lease = ledger.claims.claim(subject, "m", "0", [0], lambda: {0: 0})
    for _ in range(n):
        epoch = lease.next_epoch
        ledger.commits.ensure_epoch(subject, epoch)
        lease = ledger.commits.commit(lease, epoch, None, {0: Range(start=epoch, end=epoch + 1)})


def _deployment(ledger: Ledger, subject: str) -> None:
    """A subject with epochs 0..2 committed, a job that consumed epoch 0 only, and a pre-committed swap."""
    for name in (subject, f"{subject}-out"):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=1))
    _commit_marker_epochs(ledger, subject, 3)
    jobs = ledger.jobs
    jobs.register(JobNode(job="j", inputs=(subject,), output=f"{subject}-out", parallelism=1))
    jobs.report("j", subject, 0, ConsumerNode(job_epoch=0, subject_epoch=0))
    jobs.write_swap(SwapNode(old="j", new="j2", target=f"{subject}-out", epoch=7, phase="precommit"), -1)


def test_collector_exports_lag_state_and_swap_phase(ledger: Ledger, subject_name: str) -> None:
    _deployment(ledger, subject_name)
    collector = LedgerCollector(ledger)
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    assert _samples(generate_latest(registry).decode())[_key("aligner_exporter_up")] == 0  # nothing read yet
    collector.refresh()
    got = _samples(generate_latest(registry).decode())
    job = {"job": "j", "subject": subject_name}
    swap = {"old": "j", "new": "j2", "target": f"{subject_name}-out"}
    assert got[_key("aligner_exporter_up")] == 1
    assert got[_key("aligner_subject_last_epoch", subject=subject_name)] == 2
    assert got[_key("aligner_job_lag_epochs", **job)] == 2
    assert got[_key("aligner_job_lag_seconds", **job)] >= 0
    assert got[_key("aligner_job_alignment_state", **job, aligner_job_alignment_state="unaligned")] == 1
    assert got[_key("aligner_job_alignment_state", **job, aligner_job_alignment_state="aligned")] == 0
    assert got[_key("aligner_swap_phase", **swap, aligner_swap_phase="precommit")] == 1
    assert got[_key("aligner_swap_epoch", **swap)] == 7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exporter_command_serves_metrics_and_stops_on_sigterm(spawn, stack, root, ledger, subject_name) -> None:
    _deployment(ledger, subject_name)
    port = _free_port()
    exporter = spawn.worker("aligner.coordinator", "--zk", stack.zk, "--root", root, "exporter", "--port", str(port),
                            "--interval", "0.5")

    def scrape() -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return _samples(r.read().decode())
        except OSError:
            return None

    wait_for(lambda: (s := scrape()) is not None and s.get(_key("aligner_exporter_up")) == 1, 60,
             "the exporter to serve a snapshot")
    lease = ledger.claims.claim(subject_name, "m", "0", [0], lambda: {0: 0})
    ledger.commits.ensure_epoch(subject_name, 3)
    ledger.commits.commit(lease, 3, None, {0: Range(start=3, end=4)})
    wait_for(lambda: (scrape() or {}).get(_key("aligner_subject_last_epoch", subject=subject_name)) == 3, 60,
             "the exporter to see epoch 3")
    exporter.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert exporter.proc.wait(STOP_WITHIN + 5) == 0, exporter.stderr
    assert time.monotonic() - started < STOP_WITHIN


def test_dashboard_uses_only_metrics_that_exist(ledger: Ledger, subject_name: str) -> None:
    """The Grafana dashboard in deploy/ queries metric names this project exports (none renamed away)."""
    import json
    import re
    from pathlib import Path

    from prometheus_client import REGISTRY, CollectorRegistry

    import aligner.metrics  # noqa: F401  (registers the per-process metrics)

    _deployment(ledger, subject_name)
    collector = LedgerCollector(ledger)
    collector.refresh()
    registry = CollectorRegistry()
    registry.register(collector)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    exported = {family.name + suffix for reg in (registry, REGISTRY) for family in reg.collect()
                for suffix in suffixes.get(family.type, ("",))}
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy/grafana/aligner-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\baligner_[a-z_]+", target["expr"])}
    assert used and used <= exported, sorted(used - exported)
