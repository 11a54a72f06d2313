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
    ce = reader.ledger.epochs.committed(subject, epoch)
    out = []
    for r in reader.read(subject, epoch):
        if sink is not None and ce.slices[r.partition].sink != sink:
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
    jobs = ledger.jobs
    o, n = jobs.job(old), jobs.job(new)
    if n.shadow is None:
        return None
    writers, _ = ledger.subjects.writers(n.shadow)
    if len(writers.writers) < n.parallelism:
        return None
    first = max(e.first_epoch for e in writers.writers.values()) + 1
    last = min(ledger.epochs.frontier(n.shadow) or -1, ledger.epochs.frontier(o.output) or -1)
    swap, _ = jobs.swap(old)
    if swap is not None and swap.phase in ("commit", "done"):
        last = min(last, swap.epoch)
    return (first, last) if last >= first else None


def verify_outputs(ledger: Ledger, bootstrap: str, names: list[str], first: int, last: int,
                   by_job: bool, ignore: Sequence[str] = ()) -> dict[str, Any]:
    jobs = ledger.jobs
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

    jobs = ledger.jobs
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


# ---- consumed epochs: did several jobs read identical whole epochs of one subject? ------------------

def _share(jobs: JobLedger, node: JobNode) -> tuple[int, int | None]:
    """The job epochs (of its epoch line) that are this version's own: after the swap that handed it the
    target (S+1 on) and up to a committed swap of itself (S); a version never swapped reads them all."""
    first, last = 0, None
    if node.follows is not None:
        swap, _ = jobs.swap(node.follows)
        first = swap.epoch + 1 if swap is not None and swap.phase in ("commit", "done") else -1
    own, _ = jobs.swap(node.job)
    if own is not None and own.phase in ("commit", "done"):
        last = own.epoch
    return first, last


def _offset_bounds(ledger: Ledger, subject: str, last: int) -> dict[int, list[tuple[int, int, int]]] | None:
    """Per partition the non-empty slices (epoch, start, end) of the subject's committed epochs up to
    ``last``; None when some are no longer retained (gc): then worker offsets are not checked."""
    from aligner.errors import AlignerError

    numbers = ledger.subjects.epoch_numbers(subject)
    if not numbers or last < numbers[0]:
        return {}
    try:
        epochs = ledger.epochs.committed_many(subject, numbers[0], last)
    except AlignerError:
        return None
    out: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for ce in epochs:
        for p, sl in ce.slices.items():
            if not sl.empty:
                out[p].append((ce.epoch, sl.start, sl.end))
    return out


def _on_boundary(slices: dict[int, list[tuple[int, int, int]]], offsets: dict[int, int], nxt: int) -> list[int]:
    """Partitions where a worker's committed position is not between subject epoch ``nxt - 1``'s last
    record and epoch ``nxt``'s first one (it read part of an epoch, or past it)."""
    bad = []
    for p, pos in offsets.items():
        got = slices.get(p, [])
        before = [end for e, _s, end in got if e < nxt]
        after = [start for e, start, _e in got if e >= nxt]
        if (before and pos < max(before)) or (after and pos > min(after)):
            bad.append(p)
    return bad


def job_consumption(ledger: Ledger, job: str, subject: str) -> dict[str, Any]:
    """Which epochs of ``subject`` job ``job`` consumed in its committed aligned job epochs (read from its
    epoch line's job epoch nodes), and whether each of its checkpoints ends on a subject epoch boundary.

    A job epoch counts once the job's output committed it. A worker-run job (runtime, Faust) also has its
    workers' committed positions checked against the subject's epoch offsets, including the last
    checkpoint before its alignment (it must end where the first aligned job epoch starts); a Spark
    query's checkpoint is the job epoch node itself (its offsets are epoch vectors)."""
    from aligner.errors import AlignerError

    jobs = ledger.jobs
    node = jobs.job(job)  # UnknownJobError: one clear line
    if subject not in node.inputs:
        raise AlignerError(f"job {job!r} does not read {subject!r} (it reads {', '.join(node.inputs)})")
    line = jobs.epoch_line(job)
    first_own, last_own = _share(jobs, node)
    out_frontier = ledger.epochs.frontier(node.output)
    numbers = [e for e in jobs.job_epoch_numbers(line)
               if first_own >= 0 and e >= first_own and (last_own is None or e <= last_own)
               and out_frontier is not None and e <= out_frontier]
    consumed, ends, problems = _walk_job_epochs(jobs, line, numbers, subject)
    report: dict[str, Any] = {"job": job, "epoch_line": line, "job_epochs": [numbers[0], numbers[-1]] if numbers
                              else None, "checkpoints": len(numbers), "consumed": _spans(consumed),
                              "first": min(consumed, default=None), "last": max(consumed, default=None),
                              "problems": [*_coverage_summary(consumed, subject), *problems],
                              "aligned_from_boundary": None}
    if jobs.worker_ids(job) and ends:
        _check_worker_positions(ledger, jobs, job, subject, numbers, ends, report)
    return report


def _walk_job_epochs(jobs: JobLedger, line: str, numbers: list[int], subject: str
                     ) -> tuple[list[int], list[tuple[int, int]], list[str]]:
    """(epochs of ``subject`` consumed, in order; (job epoch, next subject epoch) per checkpoint; problems of
    job epochs that do not follow each other on the subject's epoch boundaries)."""
    problems: list[str] = []
    consumed: list[int] = []
    ends: list[tuple[int, int]] = []
    previous: int | None = None
    last_epoch: int | None = None
    for e in numbers:
        je = jobs.job_epoch(line, e)
        if je is None:
            continue
        if last_epoch is not None and e != last_epoch + 1:
            problems.append(f"job epochs {last_epoch + 1}..{e - 1} have no node (checkpoints off the subject's epochs)")
        span, nxt = je.covered.get(subject), je.next.get(subject)
        if nxt is None:
            problems.append(f"job epoch {e} records no next epoch of {subject}")
            continue
        if span is not None:
            if previous is not None and span.first != previous:
                problems.append(f"job epoch {e} starts at epoch {span.first} of {subject}, job epoch {last_epoch} "
                                f"ended before epoch {previous}")
            if nxt != span.last + 1:
                problems.append(f"job epoch {e} covers {span.first}..{span.last} but ends before {nxt}")
            consumed.extend(range(span.first, span.last + 1))
        elif previous is not None and nxt != previous:
            problems.append(f"job epoch {e} covers nothing of {subject} but moves its end from {previous} to {nxt}")
        ends.append((e, nxt))
        previous, last_epoch = nxt, e
    return consumed, ends, problems


def _coverage_summary(consumed: list[int], subject: str) -> list[str]:
    """Epochs consumed more than once and epochs skipped, as problems (first in the report)."""
    summary: list[str] = []
    twice = sorted(e for e, n in Counter(consumed).items() if n > 1)
    if twice:
        summary.append(f"epochs {span_text(_spans(twice))} of {subject} consumed more than once")
    if consumed:
        gaps = sorted(set(range(min(consumed), max(consumed) + 1)) - set(consumed))
        if gaps:
            summary.append(f"epochs {span_text(_spans(gaps))} of {subject} skipped")
    return summary


def _check_worker_positions(ledger: Ledger, jobs: JobLedger, job: str, subject: str, numbers: list[int],
                            ends: list[tuple[int, int]], report: dict[str, Any]) -> None:
    """A worker-run job: each worker's committed positions on the subject's epoch boundaries, the last
    checkpoint before the alignment included (problems and ``aligned_from_boundary`` go to ``report``)."""
    slices = _offset_bounds(ledger, subject, max(n for _e, n in ends))
    checks = list(ends)
    before = numbers[0] - 1 if numbers else -1
    if before >= 0 and report["first"] is not None:  # the last checkpoint before the alignment
        checks.insert(0, (before, report["first"]))
    report["aligned_from_boundary"] = True if before >= 0 else None
    for e, nxt in checks:
        for w in jobs.worker_ids(job):
            committed = jobs.worker_epoch_or_none(job, w, e)
            if committed is None:
                continue
            loaded = committed.load_from.get(subject)
            bad = [] if slices is None else _on_boundary(slices, committed.offsets.get(subject, {}), nxt)
            if loaded != nxt or bad:
                where = f"partitions {bad}" if bad else f"next epoch {loaded}"
                report["problems"].append(f"worker {w}'s checkpoint of job epoch {e} is not on the boundary before "
                                          f"epoch {nxt} of {subject} ({where})")
                if e == before:
                    report["aligned_from_boundary"] = False


def _spans(epochs: Sequence[int]) -> list[list[int]]:
    """Sorted epochs as inclusive runs [[a, b], ...]."""
    runs: list[list[int]] = []
    for e in sorted(set(epochs)):
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return runs


def span_text(spans: Sequence[Sequence[int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans) or "none"


def verify_consumed(ledger: Ledger, subject: str, names: Sequence[str]) -> dict[str, Any]:
    """Did the jobs consume identical whole epochs of ``subject``? Each job's committed aligned job epochs
    give the subject epochs it consumed (:func:`job_consumption`); within the span every job covers (from
    the latest first epoch, a job aligned later read the earlier ones before its alignment, up to the
    smallest frontier) each epoch must be consumed by every job exactly once, with every checkpoint on an
    epoch boundary. ``identical`` counts the epochs of that span; ``differences`` says what is not so."""
    from aligner.errors import AlignerError

    ledger.subjects.subject(subject)  # UnknownSubjectError
    if len(set(names)) < 2:
        raise AlignerError("give at least two different jobs to compare")
    per = [job_consumption(ledger, name, subject) for name in names]
    differences = [f"{r['job']}: {p}" for r in per for p in r["problems"]]
    for r in per:
        if r["first"] is None:
            differences.append(f"{r['job']}: no committed aligned job epoch read {subject} yet")
    report: dict[str, Any] = {"subject": subject, "jobs": per, "first": None, "last": None, "identical": 0,
                              "differences": differences}
    if any(r["first"] is None for r in per):
        return report
    first, last = max(r["first"] for r in per), min(r["last"] for r in per)
    report["first"], report["last"] = first, last
    if last < first:
        differences.append(f"the jobs share no consumed epoch of {subject}: "
                           + "; ".join(f"{r['job']} {span_text(r['consumed'])}" for r in per))
        return report
    window = set(range(first, last + 1))
    for r in per:
        got = {e for a, b in r["consumed"] for e in range(a, b + 1)} & window
        if got != window:
            differences.append(f"{r['job']} did not consume epochs {span_text(_spans(sorted(window - got)))} of "
                               f"{subject} that {', '.join(x['job'] for x in per if x is not r)} consumed")
    if not differences:
        report["identical"] = len(window)
    return report
