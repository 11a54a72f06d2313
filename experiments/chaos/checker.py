"""Read every subject of the chain by epoch and classify anomalies, as Jepsen's queue checker does.

Per hop (``in`` -> ``a`` -> ``b`` and ``a`` -> ``f``), against what the upstream subject really holds:

- **lost**: an upstream record whose result is missing downstream (for ``in``: an acknowledged send);
- **duplicated**: a result present more than once;
- **unexpected**: a result of no upstream record;
- **aborted read**: a record an exact read returned whose stamp is not the attempt ZooKeeper committed
  for its epoch and partition (checked on every record, independently of the reader's fast path);
- **wrong content**: a result that is not the function of its input (value, keyed-state count, the
  source position it names);
- **wrong epoch**: a result in an epoch whose recorded lineage does not contain its input (the writing
  worker's committed source offsets, or the Spark micro-batch's epoch span);
- **non-monotonic**: results of one upstream partition whose epochs go backwards, or a subject
  whose committed ranges do not continue where the previous epoch ended;
- **lineage**: recorded lineage that does not tile its input: an aligned job epoch not ending where
  its covered subject epochs end, job epochs that skip or repeat subject epochs, Spark batches that
  do not read each committed epoch exactly once, or a final position short of the input's end; and, for
  every hop and engine, an output epoch whose lineage as users get it (``aligner lineage``, a consistent
  cut: :mod:`aligner.lineage`) misses an input epoch its records come from, or names an input epoch that
  another output epoch's lineage names too;
- **fencing**: a committed epoch whose slices (range, stamped attempt) at the end differ from what the ledger
  said during the run: two incarnations of a producer committed the same epoch;
- **missing commit**: an epoch the ledger said was committed during the run and that is gone at the end
  (a ZooKeeper rollback). Both from :class:`experiments.chaos.history.History`, when the run kept one.

After ``aligner gc`` (a soak's retention) the oldest epochs and lineage records are gone: ``retained=True``
checks the retained window. Per upstream partition the window starts at the oldest upstream record whose
result is retained downstream (results are monotonic along a partition, so every later one must be there);
records before it, keyed-state counts relative to the window's first, and lineage records gc removed are not
judged. A loss right at a window's start goes unseen: the price of a bounded ledger.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from aligner.connectors.reader import EpochReader
from aligner.epochs import CommittedEpoch
from aligner.errors import AlignerError
from aligner.ledger import Ledger
from aligner.lineage import flatten, subject_epoch_lineage
from aligner.models import WorkerEpochNode
from aligner.stamps import stamp_of
from experiments.chaos.history import History
from experiments.chaos.jobs import KEYS, h
from experiments.common import json_value

CLASSES = ("lost", "duplicated", "unexpected", "aborted_read", "wrong_content", "wrong_epoch", "non_monotonic",
           "lineage", "fencing", "missing_commit")
EXAMPLES = 5


@dataclass(frozen=True)
class Rec:
    epoch: int
    partition: int
    offset: int
    value: dict[str, Any]


class Anomalies:
    """Counts per class and subject, with a few examples each."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
        self.examples: dict[str, list[str]] = defaultdict(list)

    def add(self, cls: str, subject: str, example: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[cls][subject] += n
        if len(self.examples[cls]) < EXAMPLES:
            self.examples[cls].append(f"{subject}: {example}")

    def totals(self) -> dict[str, int]:
        return {c: sum(v.values()) for c, v in self.counts.items()}

    def as_json(self) -> dict[str, Any]:
        return {"totals": self.totals(), "by_subject": {c: dict(v) for c, v in self.counts.items() if v},
                "examples": dict(self.examples)}


class Subject:
    """A subject's committed epochs and every record an exact read returns."""

    def __init__(self, led: Ledger, reader: EpochReader, name: str, anomalies: Anomalies) -> None:
        self.name = name
        numbers, last = led.subjects.epoch_numbers(name), led.epochs.frontier(name)
        self.epochs: list[CommittedEpoch] = led.epochs.committed_many(name, numbers[0],
                                                                      last) if numbers and last is not None \
            else []
        self.by_epoch = {ce.epoch: ce for ce in self.epochs}
        self.records: list[Rec] = []
        if self.epochs:
            for epoch, partition, messages in reader.read_batches(name, self.epochs[0].epoch, self.epochs[-1].epoch):
                stamp = self.by_epoch[epoch].slices[partition].stamp
                for m in messages:
                    h: list[tuple[str, bytes]] | None = m.headers()  # type: ignore[assignment]  # as the stamped producer wrote them
                    offset: int = m.offset()  # type: ignore[assignment]  # a record has one
                    if stamp is not None and stamp_of(h) != stamp:
                        anomalies.add("aborted_read", name, f"epoch {epoch} p{partition}@{offset} stamp "
                                      f"{stamp_of(h)!r}, committed {stamp!r}")
                    self.records.append(Rec(epoch, partition, offset, json_value(m.value())))
        for prev, ce in pairwise(self.epochs):
            for p, sl in ce.slices.items():
                before = prev.slices.get(p)
                # An unstamped epoch starts at its first record, past the commit marker before it: a gap is
                # expected; an overlap would read records twice.
                if before is not None and sl.start < before.end:
                    anomalies.add("non_monotonic", name, f"epoch {ce.epoch} p{p} starts at {sl.start}, "
                                  f"before epoch {prev.epoch} ended at {before.end}")
        # Where each partition stands after each epoch: a partition whose producer finished (the old
        # version after a hot-swap) has no slice in later epochs, and stays where it ended.
        self.ends_after: dict[int, dict[int, int]] = {}
        ends: dict[int, int] = {}
        for ce in self.epochs:
            ends = {**ends, **{p: sl.end for p, sl in ce.slices.items()}}
            self.ends_after[ce.epoch] = ends
        self.ends = ends

    @property
    def last(self) -> int | None:
        return self.epochs[-1].epoch if self.epochs else None


def exactly_once(an: Anomalies, subject: str, got: Counter[int], expected: set[int]) -> None:
    lost = sorted(expected - set(got))
    an.add("lost", subject, f"inputs {lost[:10]}", len(lost))
    dups = {n: c for n, c in got.items() if c > 1}
    an.add("duplicated", subject, f"inputs (copies) {dict(list(dups.items())[:10])}", sum(c - 1 for c in dups.values()))
    unexpected = sorted(set(got) - expected)
    an.add("unexpected", subject, f"inputs {unexpected[:10]}", len(unexpected))


def window(upstream: list[Rec], downstream_ns: Counter[int], number: Callable[[Rec], int]) -> set[int]:
    """The upstream inputs whose results must be retained downstream: per upstream partition, those at or
    after the oldest one with a retained result."""
    lo: dict[int, int] = {}
    for r in upstream:
        if number(r) in downstream_ns:
            lo[r.partition] = min(lo.get(r.partition, r.offset), r.offset)
    return {number(r) for r in upstream if r.partition in lo and r.offset >= lo[r.partition]}


def exactly_once_window(an: Anomalies, subject: str, got: Counter[int], upstream: list[Rec],
                        number: Callable[[Rec], int]) -> None:
    """:func:`exactly_once` on the retained window: results whose input was collected are not judged (but a
    result of an input newer than any upstream one is unexpected), nor inputs before the window."""
    expected = window(upstream, got, number)
    newest = max((number(r) for r in upstream), default=-1)
    inside = Counter({n: c for n, c in got.items() if n in expected or n > newest})
    exactly_once(an, subject, inside, expected)
    dups = {n: c for n, c in got.items() if c > 1 and n not in inside}
    an.add("duplicated", subject, f"inputs (copies) {dict(list(dups.items())[:10])}", sum(c - 1 for c in dups.values()))


def monotonic(an: Anomalies, subject: str, pairs: list[tuple[tuple[int, int], int]]) -> None:
    """``pairs`` of (upstream (partition, offset), downstream epoch): epochs never go back along a partition."""
    last: dict[int, tuple[int, int]] = {}
    for (p, o), epoch in sorted(pairs):
        prev = last.get(p)
        if prev is not None and epoch < prev[1]:
            an.add("non_monotonic", subject, f"upstream p{p}@{o} in epoch {epoch} after p{p}@{prev[0]} in {prev[1]}")
        last[p] = (o, epoch)


def worker_epochs(led: Ledger, job: str, worker: int) -> dict[int, WorkerEpochNode]:
    return led.jobs.worker_epochs(job, worker)


class Positions:
    """Where each worker's input offsets stood after each of its committed epochs (the lineage of unaligned
    and aligned epochs alike)."""

    def __init__(self, led: Ledger, jobs: list[tuple[str, int]], source: str, retained: bool = False) -> None:
        self.source = source
        self.retained = retained
        self.nodes = {(job, w): worker_epochs(led, job, w) for job, w in jobs}

    def window(self, job: str, worker: int, epoch: int, partition: int) -> tuple[int, int] | None:
        """[start, end) of ``partition`` the worker consumed in job epoch ``epoch``."""
        nodes = self.nodes.get((job, worker), {})
        node = nodes.get(epoch)
        if node is None:
            return None
        prev = [e for e in nodes if e < epoch]
        start = nodes[max(prev)].offsets.get(self.source, {}).get(partition, 0) if prev else 0
        return start, node.offsets.get(self.source, {}).get(partition, 0)

    def judged(self, job: str, worker: int, epoch: int) -> bool:
        """Whether the epoch's lineage is there to judge (gc removes old and swapped-out workers' records)."""
        return not self.retained or epoch in self.nodes.get((job, worker), {})

    def tiling(self, an: Anomalies, label: str, upstream: Subject, finals: list[tuple[str, int]], led: Ledger,
               epochs_of: str) -> None:
        """Offsets only advance; aligned epochs end exactly at their covered subject epochs' ends; the
        final writers end at the input's end; the job's aligned epochs cover subject epochs contiguously."""
        for (job, w), nodes in self.nodes.items():
            prev: dict[int, int] = {}
            for e in sorted(nodes):
                node = nodes[e]
                offs = node.offsets.get(self.source, {})
                for p, o in offs.items():
                    if o < prev.get(p, 0):
                        an.add("lineage", label, f"{job}/{w} epoch {e}: p{p} went back to {o} from {prev[p]}")
                span = (node.covered or {}).get(self.source)
                if span is not None and (not self.retained or span.last in upstream.ends_after):
                    ends = upstream.ends_after.get(span.last, {})
                    for p, o in offs.items():
                        want = ends.get(p)
                        if want is None and self.retained:
                            continue  # the partition's end lies in epochs retention removed: not to judge
                        if want != o:
                            an.add("lineage", label, f"{job}/{w} aligned epoch {e} covers {self.source} epochs "
                                   f"{span.first}..{span.last} but stopped p{p} at {o}, not {want}")
                prev = {**prev, **offs}
            if (job, w) in finals and nodes:
                offs = nodes[max(nodes)].offsets.get(self.source, {})
                for p, o in offs.items():
                    if self.retained and p not in upstream.ends:
                        continue  # retention removed every epoch of the partition: its end is not to judge
                    if o != upstream.ends.get(p, 0):
                        an.add("lineage", label, f"{job}/{w} ended p{p} at {o}; {self.source} ends at "
                               f"{upstream.ends.get(p, 0)}")
        contiguous(an, label, led, epochs_of, self.source)


def contiguous(an: Anomalies, label: str, led: Ledger, job: str, source: str) -> None:
    """Consecutive aligned job epochs cover consecutive subject epochs."""
    jobs = led.jobs
    spans = []
    for e in jobs.job_epoch_numbers(job):
        node = jobs.job_epoch(job, e)
        if node is not None and node.covered.get(source) is not None:
            span = node.covered[source]
            assert span is not None
            spans.append((span.first, span.last, e))
    for (_f1, l1, e1), (f2, _l2, e2) in pairwise(spans):
        if e2 == e1 + 1 and f2 != l1 + 1:
            an.add("lineage", label, f"{job} job epoch {e1} covers ..{l1}, epoch {e2} starts at {f2}")


def n_of(r: Rec) -> int:
    """The input number a record carries (``in``, ``a`` and ``b`` records at the top, ``f`` records wrap it)."""
    return int(r.value["n"]) if "n" in r.value else int(r.value["in"]["n"])


def first_of(records: list[Rec]) -> dict[int, Rec]:
    out: dict[int, Rec] = {}
    for r in records:
        out.setdefault(n_of(r), r)
    return out


@dataclass
class Chain:
    """What every hop's check needs: the anomalies, the ledger, the names and whether gc ran."""

    an: Anomalies
    led: Ledger
    names: dict[str, str]
    retained: bool

    def once(self, subject: Subject, upstream: Subject, number: Callable[[Rec], int] = n_of) -> None:
        got = Counter(n_of(r) for r in subject.records)
        if self.retained:
            exactly_once_window(self.an, subject.name, got, upstream.records, number)
        else:
            exactly_once(self.an, subject.name, got, {number(r) for r in upstream.records})


def check_in(ch: Chain, s_in: Subject, produced: dict[str, Any]) -> dict[int, int]:
    """in: every acknowledged send once (from the window's start: the newest of each partition's oldest
    retained input); returns each input's rank among the earlier inputs of its key."""
    got = Counter(n_of(r) for r in s_in.records)
    expected = set(produced["acked"]) | (set(got) & set(range(produced["sent"])))
    if ch.retained:
        oldest: dict[int, int] = {}
        for r in s_in.records:
            oldest[r.partition] = min(oldest.get(r.partition, n_of(r)), n_of(r))
        start = max(oldest.values(), default=0)
        expected = {n for n in expected if n >= start}
        got = Counter({n: c for n, c in got.items() if n >= start or c > 1})
    exactly_once(ch.an, s_in.name, got, expected)
    rank: dict[int, int] = {}
    per_key: Counter[int] = Counter()
    for r in sorted(s_in.records, key=lambda r: (r.partition, r.offset)):
        n = n_of(r)
        if n not in rank:
            rank[n] = per_key[n % KEYS]
            per_key[n % KEYS] += 1
    return rank


def count_bases(ch: Chain, s_a: Subject, rank: dict[int, int]) -> dict[int, int]:
    """Per key, what job A's keyed-state count adds to an input's rank: 0 over the whole history; in a
    retained window, that of the key's oldest result (the inputs before it were collected)."""
    if not ch.retained:
        return {}
    base: dict[int, tuple[int, int]] = {}
    for r in s_a.records:
        n, c = n_of(r), r.value.get("c")
        if n in rank and isinstance(c, int) and (n % KEYS not in base or rank[n] < base[n % KEYS][0]):
            base[n % KEYS] = (rank[n], c - rank[n])
    return {k: b for k, (_r, b) in base.items()}


def check_a(ch: Chain, s_in: Subject, s_a: Subject, rank: dict[int, int], jobs_a: list[str],
            workers_a: list[int] | None = None) -> dict[int, str]:
    """a: job A's versions (``workers_a``: each one's workers, default 2): every input once, right content,
    within its lineage; returns version -> job."""
    an, names = ch.an, ch.names
    job_of = dict(enumerate(jobs_a, start=1))
    workers = dict(enumerate(workers_a or [2] * len(jobs_a), start=1))
    pos_a = Positions(ch.led, [(j, w) for g, j in job_of.items() for w in range(workers[g])], s_in.name,
                      ch.retained)
    ch.once(s_a, s_in)
    in_pos = first_of(s_in.records)
    bases = count_bases(ch, s_a, rank)
    pairs = []
    for r in s_a.records:
        v, n = r.value, n_of(r)
        src = in_pos.get(n)
        if src is None and ch.retained:
            continue  # its input was collected
        c = None if n not in rank else rank[n] + bases.get(n % KEYS, 0)
        want = {"h": h(n), "c": c, "src": [src.partition, src.offset] if src else None}
        have = {"h": v.get("h"), "c": v.get("c"), "src": v.get("src")}
        if want != have or v.get("v") not in job_of or v.get("w") not in range(workers[v["v"]]):
            an.add("wrong_content", s_a.name, f"epoch {r.epoch} p{r.partition}@{r.offset}: {v}, expected {want}")
            continue
        if src is None:
            continue
        job = job_of[v["v"]]
        window = pos_a.window(job, v["w"], r.epoch, src.partition)
        if pos_a.judged(job, v["w"], r.epoch) and (window is None or not window[0] <= src.offset < window[1]):
            an.add("wrong_epoch", s_a.name, f"input {n} (p{src.partition}@{src.offset}) in epoch {r.epoch} "
                   f"written by {job}/{v['w']}, whose epoch consumed {window}")
        pairs.append(((src.partition, src.offset), r.epoch))
    monotonic(an, s_a.name, pairs)
    final = max(g for g, job in job_of.items() if g == 1 or pos_a.nodes.get((job, 0)))
    pos_a.tiling(an, s_a.name, s_in, [(job_of[final], w) for w in range(workers[final])], ch.led, names["A"])
    return job_of


def check_b(ch: Chain, s_a: Subject, s_b: Subject) -> None:
    """b: the Spark query: every a record once; each batch's epoch span tiles a's committed epochs."""
    from aligner.connectors.spark.lineage import sink_lineage, source_batch

    an, a_pos = ch.an, first_of(s_a.records)
    ch.once(s_b, s_a)
    span_of: dict[int, tuple[int, int]] = {}
    for epoch, written in sink_lineage(ch.led, s_b.name, ch.names["B"]).items():
        read = source_batch(ch.led, written.query, written.batch).get(s_a.name) if written.query else None
        if read is not None and epoch in s_b.by_epoch:
            span_of[epoch] = (read.first, read.last)
    covered = sorted(span_of.values())
    read_epochs = [e for first, last in covered for e in range(first, last + 1)]
    committed_a = [ce.epoch for ce in s_a.epochs]
    if ch.retained and read_epochs and committed_a:
        lo = max(read_epochs[0], committed_a[0])
        read_epochs, committed_a = [e for e in read_epochs if e >= lo], [e for e in committed_a if e >= lo]
    if read_epochs != committed_a:
        extra, missing = Counter(read_epochs) - Counter(committed_a), Counter(committed_a) - Counter(read_epochs)
        an.add("lineage", s_b.name, f"batches read epochs of {s_a.name} {dict(extra) or ''} too often, "
               f"{sorted(missing)[:10]} never", max(1, sum(extra.values()) + sum(missing.values())))
    pairs = []
    for r in s_b.records:
        v, n = r.value, n_of(r)
        src = a_pos.get(n)
        if src is None and ch.retained:
            continue  # its input was collected
        want = {"h": h(n), "d": 2 * n, "src": [src.epoch, src.partition, src.offset] if src else None}
        have = {"h": v.get("h"), "d": v.get("d"), "src": [v.get("src_epoch"), v.get("src_partition"),
                                                          v.get("src_offset")]}
        if want != have:
            an.add("wrong_content", s_b.name, f"epoch {r.epoch} p{r.partition}@{r.offset}: {v}, expected {want}")
            continue
        span = span_of.get(r.epoch)
        if span is None and ch.retained:
            continue  # the batch record saying what its epoch read was removed by retention
        if span is None or not span[0] <= v["src_epoch"] <= span[1]:
            an.add("wrong_epoch", s_b.name, f"input {n} of {s_a.name} epoch {v['src_epoch']} in epoch {r.epoch}, "
                   f"whose batch read {span}")
        if src is not None:
            pairs.append(((src.partition, src.offset), r.epoch))
    monotonic(an, s_b.name, pairs)


def check(led: Ledger, kafka: str, produced: dict[str, Any], names: dict[str, str],
          faust: bool = True, jobs_a: list[str] | None = None, retained: bool = False,
          workers_a: list[int] | None = None, history: History | None = None) -> dict[str, Any]:
    """Classify every anomaly of a drained chain; ``names`` maps in/a/b/f/A/A2/F/B to subjects and jobs,
    ``jobs_a`` names job A's versions in order (default A, A2; a record's ``v`` is its version's place);
    ``retained``: gc ran, check the retained window (module docstring)."""
    an = Anomalies()
    with EpochReader(led, kafka) as reader:
        s_in, s_a, s_b, s_f = (Subject(led, reader, names[k], an) for k in ("in", "a", "b", "f"))
    ch = Chain(an, led, names, retained)
    rank = check_in(ch, s_in, produced)
    job_of = check_a(ch, s_in, s_a, rank, jobs_a or [names["A"], names["A2"]], workers_a)
    check_b(ch, s_a, s_b)
    subjects = (s_in, s_a, s_b, s_f) if faust else (s_in, s_a, s_b)
    if faust:
        check_faust(ch, s_a, s_f)
    for out, src in ((s_a, s_in), (s_b, s_a), *([(s_f, s_a)] if faust else [])):
        check_walked_lineage(ch, out, src)
    if history is not None:
        for cls, subject, example in history.judge({s.name: s.epochs for s in (s_in, s_a, s_b, s_f)}, retained):
            an.add(cls, subject, example)
    return {
        "anomalies": an.as_json(),
        "retained_window": retained,
        "records": {s.name: len(s.records) for s in subjects},
        "records_checked": sum(len(s.records) for s in subjects),
        "epochs": {s.name: len(s.epochs) for s in subjects},
        "first_epochs": {s.name: s.epochs[0].epoch if s.epochs else None for s in subjects},
        "produced": {"sent": produced["sent"], "acked": len(produced["acked"]), "failed": len(produced["failed"])},
        "series": series(subjects, first_of(s_in.records)),
        "swap": {f"v{g}_records": sum(1 for r in s_a.records if r.value.get("v") == g) for g in job_of},
    }


def check_walked_lineage(ch: Chain, out: Subject, src: Subject) -> None:
    """lineage, as users get it, for any engine (:func:`lineage_tiling`), on every committed epoch of a hop."""
    src_epoch = {n: r.epoch for n, r in first_of(src.records).items()}
    carried: dict[int, set[int]] = defaultdict(set)
    for r in out.records:
        e = src_epoch.get(n_of(r))
        if e is not None:
            carried[r.epoch].add(e)
    for what, n in lineage_tiling(ch.led, out.name, [ce.epoch for ce in out.epochs], carried, src.name, ch.retained):
        ch.an.add("lineage", out.name, what, n)


def lineage_tiling(led: Ledger, out: str, epochs: Iterable[int], carried: Mapping[int, set[int]], src: str,
                   retained: bool = False) -> list[tuple[str, int]]:
    """What is wrong, and how many epochs of ``src`` it concerns, with the lineage of ``out``'s ``epochs`` as users
    get it (``aligner lineage``, a consistent cut): each aligned epoch's lineage must hold the input epochs its
    records carry (``carried``) and no input epoch may be in two epochs' lineages (they tile the input as the
    records do). An epoch written unaligned (its lineage is input offsets, judged by the hop's own check) is not
    judged, nor, with ``retained``, one whose lineage retention removed."""
    problems: list[tuple[str, int]] = []
    owner: dict[int, int] = {}
    for epoch in epochs:
        try:
            tree = subject_epoch_lineage(led, out, epoch, depth=1)
        except AlignerError as exc:  # retention removed the epoch's lineage meanwhile
            if not retained:
                problems.append((f"epoch {epoch}: no lineage ({exc})", 1))
            continue
        if not tree["producers"] or any(p.get("aligned") is not True for p in tree["producers"]):
            continue
        named = set(flatten(tree).get(src, []))
        missing = carried.get(epoch, set()) - named
        if missing:
            problems.append((f"epoch {epoch} holds results of {src} epochs {epoch_runs(missing)} its lineage does not "
                             f"name (it names {epoch_runs(named)})", len(missing)))
        twice = sorted(e for e in named if e in owner)
        if twice:
            problems.append((f"the lineage of epoch {epoch} names {src} epochs {epoch_runs(twice)}, in the lineage of "
                             f"epochs {epoch_runs(owner[e] for e in twice)} too", len(twice)))
        owner.update(dict.fromkeys(named, epoch))
    return problems


def epoch_runs(epochs: Iterable[int]) -> str:
    """Epoch numbers as runs: "0..42, 45"."""
    out: list[list[int]] = []
    for e in sorted(set(epochs)):
        if out and e == out[-1][1] + 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in out) or "none"


def check_faust(ch: Chain, s_a: Subject, s_f: Subject) -> None:
    """f, the Faust job: every a record once, wrapped unchanged, within its worker's lineage."""
    an, names, a_pos = ch.an, ch.names, first_of(s_a.records)
    pos_f = Positions(ch.led, [(names["F"], 0)], s_a.name, ch.retained)
    ch.once(s_f, s_a)
    pairs = []
    for r in s_f.records:
        v, n = r.value, n_of(r)
        src = a_pos.get(n)
        if src is None and ch.retained:
            continue  # its input was collected
        want = {"in": src.value if src else None, "src": [s_a.name, src.partition, src.offset, src.epoch]
                if src else None}
        if {"in": v.get("in"), "src": v.get("src")} != want:
            an.add("wrong_content", s_f.name, f"epoch {r.epoch} p{r.partition}@{r.offset}: {v}, expected {want}")
            continue
        assert src is not None
        window = pos_f.window(names["F"], 0, r.epoch, src.partition)
        if pos_f.judged(names["F"], 0, r.epoch) and (window is None or not window[0] <= src.offset < window[1]):
            an.add("wrong_epoch", s_f.name, f"input {n} ({s_a.name} p{src.partition}@{src.offset}) in epoch "
                   f"{r.epoch}, whose worker epoch consumed {window}")
        pairs.append(((src.partition, src.offset), r.epoch))
    monotonic(an, s_f.name, pairs)
    pos_f.tiling(an, s_f.name, s_a, [(names["F"], 0)], ch.led, names["F"])


def series(subjects: tuple[Subject, ...], in_pos: dict[int, Rec]) -> dict[str, Any]:
    """Per subject: (commit time, epoch) of every committed epoch, and the end-to-end latency of each
    epoch with records: its commit time minus the commit of the ``in`` epoch holding its newest input."""
    s_in = subjects[0]
    out: dict[str, Any] = {}
    for s in subjects:
        newest: dict[int, int] = {}
        for r in s.records:
            v = r.value
            n = int(v["n"]) if "n" in v else int(v["in"]["n"])
            newest[r.epoch] = max(newest.get(r.epoch, -1), n)
        latency = []
        for e, n in sorted(newest.items()):
            src = in_pos.get(n)
            if src is not None and src.epoch in s_in.by_epoch:
                latency.append((s.by_epoch[e].committed_at / 1000,
                                (s.by_epoch[e].committed_at - s_in.by_epoch[src.epoch].committed_at) / 1000))
        out[s.name] = {"commits": [(ce.committed_at / 1000, ce.epoch) for ce in s.epochs], "latency": latency}
    return out
