"""A real browser for the console's tests and benchmark: Debian's Chromium driven by Playwright (``make test``
installs both; Playwright's own browser download is never used)."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
"""Headless, as root, on a machine with no outside network: without the background-networking flags Chromium
keeps trying to reach Google's hosts."""


@contextmanager
def chromium() -> Iterator[Any]:
    """A started headless Chromium (a Playwright ``Browser``), closed with its driver on every path."""
    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium") or CHROMIUM
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    """The JSON at ``url``, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def post_json(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
