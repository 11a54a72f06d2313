"""Shares of py-spy raw (collapsed) stacks per benchmark phase.

    .venv/bin/python experiments/results/profiles/analyse.py experiments/results/profiles/sink-wall.txt [phase ...]

A phase is a function that appears in the stack (raw_run, sink_run, aligned_run, ...). For each phase:
samples, then the leaf (self) lines with their source text: a leaf line that calls into C
(confluent_kafka's produce/consume/poll/flush, kazoo's socket) counts its C time there, as py-spy
without --native attributes C time to the calling Python line. Then inclusive shares of project
functions (connectors/aligner/connectors, aligner/aligner).
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")
SEARCH = [ROOT / "connectors/aligner", ROOT / "aligner", ROOT / "coordinator/aligner", ROOT,
          *ROOT.glob(".venv/lib/python3*/site-packages")]


@cache
def source_line(file: str, line: int) -> str:
    for base in SEARCH:
        p = base / file
        if p.is_file():
            try:
                return p.read_text().splitlines()[line - 1].strip()[:90]
            except (IndexError, UnicodeDecodeError):
                return ""
    return ""


def parse(path: str) -> list[tuple[list[str], int]]:
    out = []
    for raw in Path(path).read_text().splitlines():
        stack, _, n = raw.rpartition(" ")
        frames = stack.split(";")
        out.append((frames, int(n)))
    return out


def short(frame: str) -> tuple[str, str, int]:
    m = FRAME.match(frame)
    if not m:
        return frame, "", 0
    return m.group(1), m.group(2), int(m.group(3))


def is_project(file: str) -> bool:
    return file.startswith(("connectors/", "aligner/", "coordinator/")) and "site-packages" not in file


def report(stacks: list[tuple[list[str], int]], phase: str, top: int = 35) -> None:
    sel = [(f, n) for f, n in stacks if any(short(x)[0] == phase for x in f)]
    total = sum(n for _, n in sel)
    print(f"\n=== phase {phase}: {total} samples ({total / 200:.1f} s at 200 Hz)")
    if not total:
        return
    leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    incl_line: Counter[str] = Counter()
    for frames, n in sel:
        i = max(j for j, x in enumerate(frames) if short(x)[0] == phase)
        below = frames[i + 1:]
        name, file, line = short(frames[-1])
        leaf[f"{file}:{line} {name}"] += n
        seen, seen_l = set(), set()
        for x in below:
            nm, fl, ln = short(x)
            key = f"{fl} {nm}"
            if key not in seen:
                incl[key] += n
                seen.add(key)
            kl = f"{fl}:{ln} {nm}"
            if kl not in seen_l:
                incl_line[kl] += n
                seen_l.add(kl)
    print(f"-- leaf lines (self time incl. C calls made from that line), top {top}")
    for k, n in leaf.most_common(top):
        loc, nm = k.split(" ", 1)
        f, _, ln = loc.rpartition(":")
        print(f"{100 * n / total:6.2f}%  {loc:45s} {nm:32s} | {source_line(f, int(ln)) if ln.isdigit() else ''}")
    print("-- inclusive, functions below the phase")
    for k, n in incl.most_common(top):
        if 100 * n / total >= 0.5:
            print(f"{100 * n / total:6.2f}%  {k}")
    print("-- inclusive, project call lines (file:line) >= 0.5%")
    for k, n in incl_line.most_common(200):
        loc, nm = k.split(" ", 1)
        f, _, ln = loc.rpartition(":")
        if is_project(f) and 100 * n / total >= 0.5:
            print(f"{100 * n / total:6.2f}%  {loc:45s} {nm:32s} | {source_line(f, int(ln))}")




# ---- categories ----------------------------------------------------------------------------------

KAFKA_C = re.compile(r"\b(consume|produce|_produce|poll|flush|commit_transaction|begin_transaction|abort_transaction|"
                     r"incremental_assign|incremental_unassign|position|assign|init_transactions|list_topics|"
                     r"get_watermark_offsets|close)\(")


def category(frames: list[str]) -> str:
    names = [short(x) for x in frames]
    if any(f.startswith("kazoo/") or (f == "zk.py") or (f.endswith("/zk.py")) for _, f, _ in names):
        if any(n == "JobWorker._commit" or n == "SinkProducer.commit" for n, _, _ in names):
            return "ZooKeeper: epoch commit (multi-op)"
        if any(n == "SinkProducer.begin" for n, _, _ in names):
            return "ZooKeeper: ensure_epoch_async (begin)"
        return "ZooKeeper: synchronous reads/writes outside the commit"
    if any(n == "Condition.wait" for n, _, _ in names):
        return "waiting (threading wait, not ZooKeeper)"
    name, file, line = names[-1]
    text = source_line(file, line) if line else ""
    if KAFKA_C.search(text) or name == "_Producer.flush":
        m = KAFKA_C.search(text)
        what = "flush" if name == "_Producer.flush" else m.group(1).lstrip("_")
        return f"librdkafka call: {what}"
    if any(n in ("SinkProducer.commit", "JobWorker._commit", "SinkProducer.begin") for n, _, _ in names):
        return "Python per epoch: sink begin/commit"
    if any(n in ("JobEpochs.covered", "JobWorker._report", "SourceAlignment.apply", "JobWorker._apply_commands",
                 "SwapGate.before", "SubjectSource.load", "SubjectSource._watch", "SubjectSource._settle")
           for n, _, _ in names):
        return "Python per epoch/poll: alignment, load, settle, watch"
    if any(n in ("SubjectSource._accept",) for n, _, _ in names):
        return "Python per record: source _accept (stamp check, SourceRecord)"
    if any(n in ("SubjectSource._resume",) for n, _, _ in names):
        return "Python per record: source stash (_resume)"
    if any(n in ("Lane.send",) for n, _, _ in names):
        return "Python per record: sink Lane.send"
    if any(n == "SubjectSource.poll" for n, _, _ in names):
        return "Python per record: source poll loop"
    if any(n in ("JobWorker._process", "identity", "FirstRecord.__init__.<locals>.wrapped") for n, _, _ in names):
        return "Python per record: job function + _process loop"
    if name in ("raw_run", "sink_run") or name.startswith("raw_run."):
        return f"Python per record: benchmark loop ({name})"
    return f"other Python ({name} {file}:{line})"


def categories(stacks: list[tuple[list[str], int]], phase: str) -> None:
    sel = [(f, n) for f, n in stacks if any(short(x)[0] == phase for x in f)]
    total = sum(n for _, n in sel)
    print(f"\n=== categories, phase {phase}: {total} samples")
    c: Counter[str] = Counter()
    for frames, n in sel:
        c[category(frames)] += n
    for k, n in c.most_common(40):
        if 100 * n / total >= 0.3:
            print(f"{100 * n / total:6.2f}%  {k}")


if __name__ == "__main__":
    stacks = parse(sys.argv[1])
    phases = sys.argv[2:] or ["raw_run", "sink_run", "aligned_run"]
    print(f"{sys.argv[1]}: {sum(n for _, n in stacks)} samples in all")
    for ph in phases:
        categories(stacks, ph)
    for ph in phases:
        report(stacks, ph)
