"""Per aligned_run: polls, empty polls, consume time empty vs not, assigns/unassigns, stash sizes."""
import sys, time, functools, collections
from aligner.connectors import source
S = collections.Counter(); T = collections.defaultdict(float)
orig_poll = source.SubjectSource.poll
def poll(self, *a, **k):
    c = self._consumer
    if not getattr(c, "_wrapped", False):
        inner = c
        class W:
            _wrapped = True
            def __getattr__(s, n): return getattr(inner, n)
            def consume(s, num=1, timeout=-1):
                t = time.perf_counter(); b = inner.consume(num, timeout); d = time.perf_counter() - t
                S["consumes"] += 1; S["consumed"] += len(b)
                if not b: S["empty consumes"] += 1; T["empty consume s"] += d
                else: T["consume s"] += d
                return b
        self._consumer = W()
    S["polls"] += 1
    r = orig_poll(self, *a, **k)
    if not r: S["empty polls"] += 1
    return r
source.SubjectSource.poll = poll
for name in ("_assign", "_unassign", "_stop_at_bound"):
    f = getattr(source.SubjectSource, name)
    def w(self, part, _f=f, _n=name):
        if _n != "_stop_at_bound" or not part.paused:
            S[_n + (" (fetching)" if part.fetching else "")] += 1
        if _n == "_unassign" and part.fetching and len(part.stash) >= source.STASH_RECORDS: S["unassign at cap"] += 1
        return _f(self, part)
    setattr(source.SubjectSource, name, w)
import experiments.bench_pipeline as bp
orig = bp.aligned_run
def ar(worker, first, fn, epochs):
    S.clear(); T.clear()
    r = orig(worker, first, fn, epochs)
    print(f"-- {getattr(fn, '__name__', fn)}: {r['records']/r['seconds']:,.0f}/s {dict(S)} {{k: round(v, 3) for k, v in T.items()}}".replace("{k: round(v, 3) for k, v in T.items()}", str({k: round(v, 3) for k, v in T.items()})), file=sys.stderr)
    return r
bp.aligned_run = ar
sys.argv = ["bench_pipeline", "--records", sys.argv[1], "--rounds", sys.argv[2], "--peer", "no"]
bp.main()
