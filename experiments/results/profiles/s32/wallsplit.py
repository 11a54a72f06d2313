"""Wall time per phase of the aligned job's step, by wrapping methods (bench_pipeline, small run)."""
import sys, time, functools, collections, atexit, runpy
from aligner.connectors import runtime, sink, stamped, source, job_epochs
T = collections.defaultdict(float); C = collections.Counter()
def wrap(cls, name, label=None):
    f = getattr(cls, name); label = label or f"{cls.__name__}.{name}"
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t; C[label] += 1
    setattr(cls, name, w)
for cls, name in [(runtime.JobWorker, "step"), (runtime.JobWorker, "_drain_until"), (runtime.JobWorker, "_process"),
                  (source.SubjectSource, "poll"), (source.SubjectSource, "load"), (runtime.JobWorker, "_commit"),
                  (sink.SinkProducer, "commit"), (sink.SinkProducer, "begin"), (stamped.StampedProducer, "flush_epoch"),
                  (stamped.StampedProducer, "commit_transaction"), (job_epochs.JobEpochs, "covered"),
                  (runtime.JobWorker, "_report"), (runtime.JobWorker, "_apply_commands"), (source.SubjectSource, "_settle"),
                  (source.SubjectSource, "_resume")]:
    wrap(cls, name)
import experiments.bench_pipeline as bp
orig = bp.aligned_run
def ar(*a, **k):
    T.clear(); C.clear()
    r = orig(*a, **k)
    s = T["JobWorker.step"]
    print(f"-- aligned_run {r['records']} records in {r['seconds_from_start']:.2f}s; per epoch (ms) of {C['JobWorker.step']} steps:", file=sys.stderr)
    for k2, v in sorted(T.items(), key=lambda kv: -kv[1]):
        print(f"   {k2:40s} {1000*v/C['JobWorker.step']:8.2f} ms/epoch  {100*v/s:5.1f}%  calls/epoch {C[k2]/C['JobWorker.step']:.1f}", file=sys.stderr)
    return r
bp.aligned_run = ar
sys.argv = ["bench_pipeline", "--records", sys.argv[1], "--rounds", sys.argv[2], "--peer", "no"]
bp.main()
