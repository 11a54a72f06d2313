"""Executors' footprint (issue 20 item 4): ZooKeeper sessions and requests, and Kafka connections, that the
Spark executors' Python workers open per micro-batch of an aligned passthrough query (local[2]).

Measured from outside, as an operator would: ZooKeeper's ``cons`` four-letter word lists every client
connection with its session id and the requests it sent; ``/proc/net/tcp`` and each process's open sockets
map a connection to the process holding it. The driver is this process; every other descendant holding a
connection is a Python worker: in local mode those run the executors' tasks and also the data source's
driver-side calls (planning, the stream writer, its commit), which PySpark runs in Python workers too.
Kafka connections are counted as new client ports towards the broker, sampled every 0.2 s: a lower bound
(a client that lives less than a sample interval is missed).
The baseline is the micro-batch itself: the goal is no ZooKeeper session per task (at most one per worker
process, reused across batches) and no Kafka client per task.

    python -m experiments.bench_executors --seconds 60 [--spark-workers 2]

With ``--spark-workers N`` the query runs on a standalone cluster (``SparkCluster``): a process is the
executors' when it descends from an executor JVM, so their figures and those of the driver's Python
workers are reported apart.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aligner.connectors.sink import SinkProducer
from aligner.connectors.spark.job import stop_query
from aligner.connectors.spark.lineage import sink_lineage
from aligner.connectors.subjects import create_subject
from aligner.embedded.spark_cluster import SparkCluster, executor_of
from aligner.embedded.stack import EmbeddedStack, wait_for
from aligner.ledger import Ledger
from experiments.common import spark_reads, value, write_results

ROOT = "/bench-executors"
X, Y, SINK = "ex-x", "ex-y", "ex"
PARTITIONS = 2
PING_EVERY = 10.0 / 3
"""kazoo pings an idle session about every third of its 10 s timeout: those requests are not the product's."""


def cons(port: int) -> dict[int, tuple[str, int]]:
    """ZooKeeper's connections: client port -> (session id, requests received)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"cons")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    out: dict[int, tuple[str, int]] = {}
    for line in data.decode(errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("/127.0.0.1:") or "sid=" not in line:
            continue
        client = int(line.split(":", 1)[1].split("[", 1)[0])
        fields = dict(kv.split("=", 1) for kv in line.split("(", 1)[1].rstrip(")").split(",") if "=" in kv)
        out[client] = (fields["sid"], int(fields.get("recved", "0")))
    return out


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def sockets_of(pids: set[int]) -> dict[int, int]:
    """Socket inode -> pid, for the given processes."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out[int(link[8:-1])] = pid
        except OSError:
            continue
    return out


def tcp_connections() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every established loopback TCP connection."""
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if parts[3] != "01":  # ESTABLISHED
            continue
        local, remote = parts[1], parts[2]
        out.append((int(local.split(":")[1], 16), int(remote.split(":")[1], 16), int(parts[9])))
    return out


class Sampler(threading.Thread):
    """Every 0.2 s: which process holds which ZooKeeper and broker connection, and ZooKeeper's counters."""

    def __init__(self, zk_port: int, kafka_port: int, classify: Callable[[int], bool] | None = None) -> None:
        super().__init__(daemon=True, name="footprint-sampler")
        self.classify = classify
        self.in_executors: set[int] = set()
        self.seen: set[int] = set()
        """Processes ``classify`` said run in an executor, decided when first seen (they may end before the run)."""
        self.zk_port, self.kafka_port = zk_port, kafka_port
        self.stop = threading.Event()
        self.me = os.getpid()
        self.zk_conns: dict[int, tuple[int, str, int]] = {}
        """client port -> (pid, session id, requests received at the last sample)."""
        self.kafka: dict[int, int] = {}
        """client port -> pid, for every connection to the broker seen."""

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        pids = _descendants(self.me) | {self.me}
        owners = sockets_of(pids)
        try:
            counters = cons(self.zk_port)
        except OSError:
            return
        for local, remote, inode in tcp_connections():
            pid = owners.get(inode)
            if pid is None:
                continue
            if remote == self.zk_port and local in counters:
                sid, recved = counters[local]
                self.zk_conns[local] = (pid, sid, recved)
            elif remote == self.kafka_port:
                self.kafka.setdefault(local, pid)
            else:
                continue
            if self.classify is not None and pid not in self.seen:
                self.seen.add(pid)
                if self.classify(pid):
                    self.in_executors.add(pid)

    def executors(self, only: set[int] | None = None, invert: bool = False) -> dict[str, Any]:
        """Totals over the worker processes (``only``: over these processes; ``invert``: over the others)."""
        def mine(pid: int) -> bool:
            return pid != self.me and (only is None or (pid in only) != invert)

        zk = [(pid, sid, n) for pid, sid, n in self.zk_conns.values() if mine(pid)]
        kafka = [pid for pid in self.kafka.values() if mine(pid)]
        return {"zk_sessions": len({sid for _, sid, _ in zk}), "zk_processes": len({pid for pid, _, _ in zk}),
                "zk_requests": sum(n for _, _, n in zk), "kafka_connections": len(kafka),
                "worker_processes": len({pid for pid, _, _ in zk} | set(kafka))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds of input")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between X epochs")
    ap.add_argument("--spark-workers", type=int, default=0,
                    help="run on a standalone cluster of N one-core workers (executor JVMs apart from the driver, "
                         "so the executors' figures are theirs alone); 0: local[2]")
    args = ap.parse_args()
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    from aligner.connectors.spark.session import local_session

    with EmbeddedStack() as info, tempfile.TemporaryDirectory() as checkpoint, \
            tempfile.TemporaryDirectory(prefix="aligner-spark-") as work:
        cluster = SparkCluster(Path(work), workers=args.spark_workers) if args.spark_workers else None
        try:
            if cluster is not None:
                cluster.start(300)
            payload = _measure(args, info, checkpoint, cluster, local_session)
        finally:
            if cluster is not None:
                cluster.stop()
    print(f"results: {write_results('bench_executors', payload)}")


def _measure(args: argparse.Namespace, info: Any, checkpoint: str, cluster: SparkCluster | None,
             local_session: Any) -> dict[str, Any]:
    led = Ledger.connect(info.zk, ROOT)
    for name in (X, Y):
        create_subject(led, info.kafka, name, PARTITIONS, value_format="bytes")
    conf = {"spark.ui.showConsoleProgress": "false"}
    if cluster is not None:  # the executors import this checkout's code
        conf["spark.executorEnv.PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    spark = local_session(cluster.url if cluster is not None else "local[2]", "bench-executors", **conf)
    conn = {"zk": info.zk, "kafka": info.kafka, "root": ROOT}
    query = (spark.readStream.format("aligned").options(**conn, subject=X).load().select("key", "value")
             .writeStream.format("aligned").options(**conn, subject=Y, sinkId=SINK)
             .option("checkpointLocation", checkpoint).start())
    sampler = Sampler(info.port("zookeeper"), info.port("kafka"),
                      classify=(lambda pid: executor_of(pid) is not None) if cluster is not None else None)
    sampler.start()
    n = 0
    with SinkProducer(led, info.kafka, X, "gen", 0, list(range(PARTITIONS))) as p:
        def epoch() -> int:
            nonlocal n
            p.begin()
            for _ in range(20):
                p.send(value(n), partition=n % PARTITIONS)
                n += 1
            return p.commit().epoch

        warm = epoch()  # the JVM, the Python workers and the first batch: not measured
        wait_for(lambda: len(sink_lineage(led, Y, SINK)) >= 1, 600, "the warm-up micro-batch")
        for _ in range(3):
            epoch()
            time.sleep(args.interval)
        wait_for(lambda: len(sink_lineage(led, Y, SINK)) >= 2, 600, "warm micro-batches")
        time.sleep(1.0)
        sampler.sample()
        split = sampler.in_executors if cluster is not None else None
        before, batches_before, t0 = sampler.executors(split), len(sink_lineage(led, Y, SINK)), time.monotonic()
        driver_before = sampler.executors(split, invert=True) if split is not None else None
        last = warm
        while time.monotonic() - t0 < args.seconds:
            last = epoch()
            time.sleep(args.interval)
    wait_for(lambda: any(r.last >= last for reads in spark_reads(led, Y, SINK).values()
                         for r in reads.values()), 300,
             "the query to write the last X epoch")
    sampler.sample()
    split = sampler.in_executors if cluster is not None else None
    after, batches, elapsed = sampler.executors(split), len(sink_lineage(led, Y, SINK)) - batches_before, \
        time.monotonic() - t0
    driver_after = sampler.executors(split, invert=True) if split is not None else None
    sampler.stop.set()
    stop_query(query)
    spark.stop()
    led.close()
    payload = {"master": "local[2]" if cluster is None else f"standalone, {args.spark_workers} one-core workers",
               "seconds": round(elapsed, 1), "micro_batches": batches, "tasks_per_batch": 2 * PARTITIONS,
               **_figures("executor", before, after, batches, elapsed)}
    if driver_before is not None and driver_after is not None:
        payload |= _figures("driver_worker", driver_before, driver_after, batches, elapsed)
    where = "local[2]: the driver's Python workers counted in" if cluster is None else payload["master"]
    print(f"{batches} micro-batches in {elapsed:.0f} s ({payload['tasks_per_batch']} tasks each), {where}")
    for role in ("executor", "driver_worker"):
        if f"{role}_zk_sessions" not in payload:
            continue
        f = {k[len(role) + 1:]: v for k, v in payload.items() if k.startswith(role + "_")}
        print(f"{role}s: {f['zk_sessions']} ZooKeeper sessions in {f['processes_with_zk']} processes "
              f"({f['zk_sessions_opened_while_measured']} opened while measured); "
              f"{f['zk_requests_per_batch_less_pings']} ZooKeeper requests per micro-batch (pings left out); at least "
              f"{f['kafka_connections_opened_per_batch']} Kafka connections opened per micro-batch")
    return payload


def _figures(role: str, before: dict[str, Any], after: dict[str, Any], batches: int, elapsed: float) -> dict[str, Any]:
    requests = after["zk_requests"] - before["zk_requests"]
    pings = after["zk_sessions"] * elapsed / PING_EVERY
    return {
        f"{role}_zk_sessions": after["zk_sessions"], f"{role}_processes_with_zk": after["zk_processes"],
        f"{role}_zk_sessions_opened_while_measured": after["zk_sessions"] - before["zk_sessions"],
        f"{role}_zk_requests_per_batch": round(requests / max(batches, 1), 2),
        f"{role}_zk_requests_per_batch_less_pings": round((requests - pings) / max(batches, 1), 2),
        f"{role}_kafka_connections_opened_per_batch": round(
            (after["kafka_connections"] - before["kafka_connections"]) / max(batches, 1), 2),
        f"{role}_worker_processes": after["worker_processes"],
    }


if __name__ == "__main__":
    main()
