import time, gc
from typing import NamedTuple
from aligner.connectors.source import SourceRecord
class NT(NamedTuple):
    subject: str; partition: int; offset: int; epoch: int; key: bytes|None; value: bytes|None; timestamp: int
_new=tuple.__new__
class Plain:
    __slots__=("subject","partition","offset","epoch","key","value","timestamp")
N=200_000
xs=list(range(N))
gc.freeze()
def dc(ms): return [SourceRecord("in", 0, m, 1, None, None, 0) for m in ms]
def nt(ms): return [NT("in", 0, m, 1, None, None, 0) for m in ms]
def ntnew(ms): return [_new(NT, ("in", 0, m, 1, None, None, 0)) for m in ms]
def tup(ms): return [("in", 0, m, 1, None, None, 0) for m in ms]
def bench(f):
    best=1e9
    for _ in range(9):
        t=time.perf_counter()
        for i in range(0,N,10000): f(xs[i:i+10000])
        best=min(best,time.perf_counter()-t)
    return 1e6*best/N
for f in (dc,nt,ntnew,tup): print(f.__name__, f"{bench(f):.3f}")
