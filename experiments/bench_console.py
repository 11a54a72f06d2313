"""``aligner console`` on a big ledger: first paint, and what viewers cost ZooKeeper.

The ledger: ``--subjects`` subjects (100) holding ``--epochs`` committed epochs between them (172,800: a day of
half-second epochs), built with pipelined multi-ops as :mod:`experiments.bench_status` builds them; ``--jobs`` jobs
(50), job i reading subject i and writing subject ``subjects/2 + i``, each with a consumer report; a writer thread
commits one more epoch of the first subject every 0.5 s, so watches fire as on a live chain.

Measured, with the console (``--refresh 1 --interval 5``) as a child process:

- picture: seconds the console's reader takes for one picture of the whole ledger, and its ZooKeeper requests
  per picture (its own count, ``/api/state``);
- first paint: a fresh page in headless Chromium (Debian's, through Playwright), from navigation until every
  subject and job is drawn in the graph; median of ``--rounds``;
- viewers: over ``--window`` seconds with 1 page open and with 20 pages open (arms interleaved per round), the
  console's ZooKeeper requests per picture (its own count) and per second, and the packets per second the server
  received (``mntr``'s ``zk_packets_received``: the writer thread's and the console's together). Requests per
  picture with 20 pages over those with 1 is what extra viewers cost (1.00: nothing); per second, the rate also
  moves with how many pictures fit in a window on a loaded machine.

    .venv/bin/python -m experiments.bench_console [--subjects 100] [--jobs 50] [--epochs 172800] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from rich.console import Console

from aligner.embedded.stack import EmbeddedStack, wait_for
from aligner.ledger import Ledger
from aligner.models import ConsumerNode, JobNode, Range, SubjectNode
from experiments.bench_status import build_ledger
from experiments.browser import chromium, free_port, get_json
from experiments.common import write_results

console = Console()
ROOT = "/bench-console"


def zk_packets(port: int) -> int:
    """``zk_packets_received`` of the server (four-letter word ``mntr``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"mntr")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        name, _, value = line.partition("\t")
        if name == "zk_packets_received":
            return int(value)
    raise RuntimeError("no zk_packets_received in mntr")


def build(led: Ledger, subjects: int, jobs: int, epochs: int) -> list[str]:
    names = [f"s{i:03d}" for i in range(subjects)]
    per = max(1, epochs // subjects)
    for name in names:
        led.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=2))
        build_ledger(led, name, per, writers=1, partitions=2)
    registry = led.jobs
    half = subjects // 2
    for j in range(min(jobs, half)):
        job = f"job{j:03d}"
        registry.register(JobNode(job=job, inputs=(names[j],), output=names[half + j], parallelism=1))
        registry.report(job, names[j], 0, ConsumerNode(job_epoch=per - 2, subject_epoch=per - 2))
    return names


def writer(led: Ledger, subject: str, stop: threading.Event) -> None:
    """One epoch of ``subject`` every 0.5 s, through the commit path (the watches' trigger)."""
    lease = led.claims.claim(subject, "live", "0", [0, 1], lambda: {0: 0, 1: 0})
    offset = 0
    while not stop.wait(0.5):
        epoch = lease.next_epoch
        led.commits.ensure_epoch(subject, epoch)
        ranges = {p: Range(start=offset, end=offset + 1) for p in (0, 1)}
        lease = led.commits.commit(lease, epoch, None, ranges)
        offset += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subjects", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=172_800)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=30.0)
    args = ap.parse_args(argv)
    stop = threading.Event()
    with EmbeddedStack() as info:
        led = Ledger.connect(info.zk, ROOT)
        t0 = time.perf_counter()
        names = build(led, args.subjects, args.jobs, args.epochs)
        console.print(f"ledger: {args.subjects} subjects, {args.jobs} jobs, {args.epochs:,} epochs in "
                      f"{time.perf_counter() - t0:.0f}s")
        live = threading.Thread(target=writer, args=(led, names[0], stop), daemon=True)
        live.start()
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "aligner.coordinator", "--zk", info.zk, "--kafka", info.kafka,
                                 "--root", ROOT, "console", "--port", str(port), "--refresh", "1", "--interval", "5"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            started = time.perf_counter()
            wait_for(lambda: (s := get_json(url + "/api/state")) is not None and s["pictures"] >= 1, 600,
                     "the console's first picture")
            first_picture = time.perf_counter() - started
            report = measure(url, info.port("zookeeper"), args, len(names) + min(args.jobs, len(names) // 2))
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            led.close()
    show(first_picture, report)
    result = {"args": vars(args), "first_picture_s": first_picture, **report}
    console.print(f"wrote {write_results('bench_console', result)}")
    return 0


def measure(url: str, zk_port: int, args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    paints: list[float] = []
    rates: dict[int, list[float]] = {1: [], 20: []}
    per_picture: dict[int, list[float]] = {1: [], 20: []}
    console_rates: dict[int, list[float]] = {1: [], 20: []}
    with chromium() as browser:
        for _ in range(args.rounds):
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_function(f"document.querySelectorAll('#graph .node').length >= {nodes}", timeout=60_000)
            paints.append(time.perf_counter() - t0)
            context.close()
            for viewers in (1, 20):
                context = browser.new_context()
                for _ in range(viewers):
                    context.new_page().goto(url)
                time.sleep(2.0)  # the pages' first requests are not what an open page costs
                before, first, t = zk_packets(zk_port), get_json(url + "/api/state"), time.perf_counter()
                time.sleep(args.window)  # a measured window, not a wait for a condition
                last, seconds = get_json(url + "/api/state"), time.perf_counter() - t
                rates[viewers].append((zk_packets(zk_port) - before) / seconds)
                requests = last["zookeeper"]["requests"] - first["zookeeper"]["requests"]
                if last["pictures"] > first["pictures"]:  # a window with no picture says nothing per picture
                    per_picture[viewers].append(requests / (last["pictures"] - first["pictures"]))
                console_rates[viewers].append(requests / seconds)
                context.close()
    return {"paints": paints, "rates": rates, "per_picture": per_picture, "console_rates": console_rates}


def show(first_picture: float, r: dict[str, Any]) -> None:
    paint = statistics.median(r["paints"])
    med = {k: {v: statistics.median(r[k][v]) if r[k][v] else float("nan") for v in (1, 20)}
           for k in ("rates", "per_picture", "console_rates")}
    ratios = [b / a for a, b in zip(r["per_picture"][1], r["per_picture"][20], strict=False) if a]
    console.print(f"first picture {first_picture:.2f}s (the reader's first pass over the ledger)")
    rounds = ", ".join(f"{p:.2f}" for p in r["paints"])
    console.print(f"first paint, every node drawn: median {paint:.2f}s (rounds {rounds})")
    for v in (1, 20):
        console.print(f"{v:2d} page(s): {med['per_picture'][v]:.0f} console requests per picture, "
                      f"{med['console_rates'][v]:.0f} console requests/s, {med['rates'][v]:.0f} server packets/s")
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a (no picture in a window: raise --window)"
    console.print(f"requests per picture, 20 pages / 1 page: {ratio} (rounds {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    os.environ.setdefault("ALIGNER_LOG_LEVEL", "ERROR")
    raise SystemExit(main())
