"""``python -m experiments.chaos.skew CLOCK MODULE ARGS...``: run ``MODULE`` as ``python -m`` would, its wall
clock skewed by the seconds written in the file ``CLOCK`` (re-read every 0.2 s; absent or empty: no skew).

The chaos checker's clock faults: the machine's clock is shared and must not be touched, and libfaketime
(Debian's 0.9.10) breaks CPython 3.11's ``time.sleep`` (EINVAL) and monotonic time. Every wall-clock read of
the product is ``time.time()`` or ``time.time_ns()`` (commit times, lag, retention by age, record
timestamps), so replacing both before the product is imported skews what the component believes the time
is; monotonic time (timeouts, sessions) stays true, as it does on a machine whose NTP steps the clock.
"""

from __future__ import annotations

import runpy
import sys
import threading
import time
from pathlib import Path

_offset = [0.0]


def _read(path: Path) -> float:
    try:
        text = path.read_text().strip()
    except OSError:
        return 0.0
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def install(path: Path) -> None:
    """Skew ``time.time``/``time.time_ns`` by the file's seconds from now on."""
    real, real_ns = time.time, time.time_ns
    _offset[0] = _read(path)

    def follow() -> None:
        while True:
            time.sleep(0.2)
            _offset[0] = _read(path)

    threading.Thread(target=follow, daemon=True, name="chaos-clock").start()
    time.time = lambda: real() + _offset[0]
    time.time_ns = lambda: real_ns() + int(_offset[0] * 1e9)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m experiments.chaos.skew CLOCK MODULE [ARGS...]")
    install(Path(sys.argv[1]))
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
