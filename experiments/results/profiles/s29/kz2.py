import time, sys, logging
from kazoo.client import KazooClient
from aligner.coordinator.stack import EmbeddedStack
logging.basicConfig(level=logging.ERROR)
def pcpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0
with EmbeddedStack() as info:
    zk = KazooClient(hosts=info.zk); zk.start()
    zk.ensure_path("/x")
    for k, gap in enumerate((0.03, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.03, 0.1)):
        N = 300 if gap else 3000
        for i in range(100): zk.create(f"/x/w{k}-{i}", b"y" * 300)
        c0 = pcpu(info.zk_pid); t0 = time.perf_counter()
        for i in range(N):
            t = zk.transaction(); t.set_data("/x", b"y" * 300); t.create(f"/x/n-{k}-{i}", b"z" * 300); t.commit()
            if gap: time.sleep(gap)
        el = time.perf_counter() - t0
        print(f"gap {gap}: ZK cpu {1000*(pcpu(info.zk_pid)-c0)/N:.3f} ms/multi; idle ZK cpu over same wall: measuring...")
        c0 = pcpu(info.zk_pid); time.sleep(el); print(f"   ambient {1000*(pcpu(info.zk_pid)-c0)/N:.3f} ms per multi-slot")
    zk.stop(); zk.close()
