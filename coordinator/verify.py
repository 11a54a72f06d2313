"""`aligner verify`: compare two jobs' (or subjects') outputs epoch by epoch, as multisets.

Aligned jobs on the same input have identical epochs, so their outputs can be compared epoch by
epoch; with per-key order declared, each key's sequence must match too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.jobs import JobLedger
from aligner.ledger import Ledger


def _epoch_records(reader: EpochReader, subject: str, epoch: int, sink: str | None) -> list[tuple[bytes, bytes]]:
    ce = reader.ledger.committed(subject, epoch)
    out = []
    for r in reader.read(subject, epoch):
        if sink is not None:
            stamp = ce.slices[r.partition].stamp
            if stamp is None or not stamp.startswith(f"{sink}/".encode()):
                continue
        out.append((r.key or b"", r.value or b""))
    return out


def verify_outputs(ledger: Ledger, bootstrap: str, names: list[str], first: int, last: int,
                   by_job: bool) -> dict[str, Any]:
    jobs = JobLedger(ledger)
    sources = []
    per_key = False
    for name in names:
        if by_job:
            node = jobs.job(name)
            per_key = per_key or node.per_key_order
            sources.append((node.output, name))
        else:
            sources.append((name, None))
    report: dict[str, Any] = {"compared": names, "first": first, "last": last, "first_difference": None,
                              "epochs": 0, "records": 0}
    with EpochReader(ledger, bootstrap) as reader:
        for epoch in range(first, last + 1):
            a, b = (_epoch_records(reader, s, epoch, sink) for s, sink in sources)
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
