"""The console under test: started through ``spawn`` (stopped on every path) and waited for until it holds a
picture; elements found by id (names may hold dots, which a CSS ``#id`` would read as a class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aligner.embedded.stack import StackInfo
from experiments.browser import free_port, get_json
from tests.helpers import Worker, wait_for

LIVE = 180.0
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""


@dataclass
class Console:
    url: str
    worker: Worker

    def state(self) -> dict[str, Any]:
        state = get_json(self.url + "/api/state")
        assert state is not None, f"the console does not answer: {self.worker.stderr}"
        return state


def start_console(spawn: Any, info: StackInfo, root: str, *extra: str, env: dict[str, str] | None = None) -> Console:
    port = free_port()
    worker = spawn.worker("aligner.coordinator", "--zk", info.zk, "--kafka", info.kafka, "--root", root, "console",
                          "--port", str(port), "--refresh", "0.2", "--interval", "1", *extra, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: (s := get_json(url + "/api/state")) is not None and s["picture"] is not None, LIVE,
                 "the console's first picture")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; the console said: {worker.stderr}; state: {get_json(url + '/api/state')}") from None
    return Console(url, worker)


def by_id(page: Any, element_id: str) -> Any:
    """An element by id: names may hold dots, which a CSS ``#id`` would read as a class."""
    return page.locator(f'[id="{element_id}"]')
