"""`aligner verify`: compare two jobs' (or subjects') outputs epoch by epoch, as multisets.

Aligned jobs on the same input have identical epochs, so their outputs can be compared epoch by
epoch; with per-key order declared, each key's sequence must match too. A new version that runs in
shadow mode is compared through its shadow subject (what it voided at the target), so a hot-swap
can check that the new version agrees with the old before it commits (``--verify-epochs``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.jobs import JobLedger
from aligner.ledger import Ledger
from aligner.models import JobNode


def _comparable(value: bytes, ignore: Sequence[str]) -> bytes:
    """The value with the intended differences (top-level JSON fields) taken out."""
    if not ignore:
        return value
    try:
        doc = json.loads(value)
    except ValueError:
        return value
    if not isinstance(doc, dict):
        return value
    return json.dumps({k: v for k, v in doc.items() if k not in ignore}, sort_keys=True).encode()


def _epoch_records(reader: EpochReader, subject: str, epoch: int, sink: str | None,
                   ignore: Sequence[str]) -> list[tuple[bytes, bytes]]:
    ce = reader.ledger.committed(subject, epoch)
    out = []
    for r in reader.read(subject, epoch):
        if sink is not None:
            stamp = ce.slices[r.partition].stamp
            if stamp is None or not stamp.startswith(f"{sink}/".encode()):
                continue
        out.append((r.key or b"", _comparable(r.value or b"", ignore)))
    return out


def _source(node: JobNode, other: JobNode | None) -> tuple[str, str | None]:
    """Where a job's output is read for comparison: its shadow subject when it shadows ``other``
    (its output there is voided), else its records at its output."""
    if node.shadow is not None and other is not None and node.follows == other.job:
        return node.shadow, None
    return node.output, node.job


def shadow_span(ledger: Ledger, old: str, new: str) -> tuple[int, int] | None:
    """The epochs both the old version (at the target) and the new one (in its shadow) committed with
    the same input, before any swap hands the target over; None while there is none.

    A new version's first epoch also covers its catch-up from the start of its inputs, so the span
    starts after every one of its workers' first epochs."""
    jobs = JobLedger(ledger)
    o, n = jobs.job(old), jobs.job(new)
    if n.shadow is None:
        return None
    writers, _ = ledger.writers(n.shadow)
    if len(writers.writers) < n.parallelism:
        return None
    first = max(e.first_epoch for e in writers.writers.values()) + 1
    last = min(ledger.frontier(n.shadow) or -1, ledger.frontier(o.output) or -1)
    swap, _ = jobs.swap(old)
    if swap is not None and swap.phase in ("commit", "done"):
        last = min(last, swap.epoch)
    return (first, last) if last >= first else None


def verify_outputs(ledger: Ledger, bootstrap: str, names: list[str], first: int, last: int,
                   by_job: bool, ignore: Sequence[str] = ()) -> dict[str, Any]:
    jobs = JobLedger(ledger)
    sources = []
    per_key = False
    if by_job:
        nodes = [jobs.job(name) for name in names]
        per_key = any(node.per_key_order for node in nodes)
        sources = [_source(nodes[0], nodes[1]), _source(nodes[1], nodes[0])]
    else:
        sources = [(name, None) for name in names]
    report: dict[str, Any] = {"compared": names, "read": [s for s, _ in sources], "first": first, "last": last,
                              "ignored_fields": list(ignore), "first_difference": None, "epochs": 0, "records": 0}
    with EpochReader(ledger, bootstrap) as reader:
        for epoch in range(first, last + 1):
            a, b = (_epoch_records(reader, s, epoch, sink, ignore) for s, sink in sources)
            report["epochs"] += 1
            report["records"] += len(a)
            ca, cb = Counter(a), Counter(b)
            differs = ca != cb
            if not differs and per_key:
                ka, kb = defaultdict(list), defaultdict(list)
                for k, v in a:
                    ka[k].append(v)
                for k, v in b:
                    kb[k].append(v)
                differs = ka != kb
            if differs:
                report["first_difference"] = {"epoch": epoch, "only_first": sum((ca - cb).values()),
                                              "only_second": sum((cb - ca).values())}
                break
    return report


def verify_before_swap(ledger: Ledger, bootstrap: str, old: str, new: str, epochs: int,
                       ignore: Sequence[str] = (), timeout: float | None = None) -> dict[str, Any] | None:
    """Before a hot-swap's first pre-commit: wait until the new version's shadow and the old version
    agree on ``epochs`` epochs, compare the last ``epochs`` of them, and refuse the swap on a
    difference. Returns the report (None when the swap is past its first pre-commit already)."""
    from aligner.coordinator.alignment import Coordinator
    from aligner.errors import HotSwapRefused

    jobs = JobLedger(ledger)
    swap, _ = jobs.swap(old)
    if swap is not None and swap.phase != "aborted":
        return None  # S is chosen: the comparison was made before it
    if jobs.job(new).shadow is None:
        raise HotSwapRefused(f"hot-swap refused: --verify-epochs needs {new} to run in shadow mode "
                             f"(worker --shadow), so its voided output can be compared")
    waiter = Coordinator(ledger).waiter

    def enough() -> bool:
        span = shadow_span(ledger, old, new)
        return span is not None and span[1] - span[0] + 1 >= epochs

    waiter.until(enough, f"{epochs} epochs from both {old} and {new}'s shadow", timeout)
    span = shadow_span(ledger, old, new)
    assert span is not None
    first, last = span[1] - epochs + 1, span[1]
    report = verify_outputs(ledger, bootstrap, [old, new], first, last, by_job=True, ignore=ignore)
    d = report["first_difference"]
    if d is not None:
        raise HotSwapRefused(
            f"hot-swap refused: {new} differs from {old} at epoch {d['epoch']} ({d['only_first']} records only in "
            f"{old}, {d['only_second']} only in {new}'s shadow); nothing was changed. If the difference is intended, "
            f"name the fields that differ with --ignore-field, or swap without --verify-epochs"
        )
    return report
