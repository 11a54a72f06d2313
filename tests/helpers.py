"""Process helpers for tests: start workers, wait on their output lines, never sleep-and-hope."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """A Python module run as a child process whose stdout lines can be awaited."""

    def __init__(self, module: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=ROOT,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_line(self, predicate, timeout: float = 60.0) -> str:
        """The first new stdout line satisfying ``predicate``; fails with the worker's stderr."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"worker {self.args} printed no matching line in {timeout}s: {self.lines[-5:]}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(10)
                raise AssertionError(f"worker exited {self.proc.returncode}: {''.join(self._stderr)[-3000:]}")
            self.lines.append(line)
            if predicate(line):
                return line

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def finish(self, timeout: float = 120.0) -> None:
        self.wait_line(lambda line: line == "done", timeout)
        assert self.proc.wait(timeout) == 0, "".join(self._stderr)[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def raw_records(bootstrap: str, topic: str, partitions: int) -> list:
    """Everything the broker shows a read_committed consumer, stamps ignored (leaked attempts too)."""
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka import consumer_config

    c = Consumer(consumer_config(bootstrap))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    while len(eof) < partitions:
        for m in c.consume(10000, timeout=1):
            if m.error():
                eof.add(m.partition())
            else:
                out.append(m)
    c.close()
    return out


def raw_count(bootstrap: str, topic: str, partitions: int) -> int:
    return len(raw_records(bootstrap, topic, partitions))
