"""The console's web application: the page, its assets, a JSON API and a stream of changes.

Routes: ``/`` the page; ``/api/state`` the shared state (the picture, ZooKeeper's reachability, the last
action) as JSON for scripts; ``/api/events`` the same state pushed as server-sent events at every change;
``/api/lineage/{subject}/{epoch}`` what an epoch derives from (a committed epoch's lineage never changes, so
each is read from ZooKeeper once and kept); ``/api/actions`` (POST) an action, when the console allows them.
No request reads ZooKeeper for the picture: the hub's one reader does (see :mod:`.hub`)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from cachetools import LRUCache
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from aligner.coordinator.console import actions
from aligner.coordinator.console.hub import Hub
from aligner.errors import AlignerError

log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9._-]{1,120}")
"""A subject's name (``aligner.models.Ident``): anything else names no node."""
STATIC = resources.files("aligner.coordinator.console") / "static"
KEEPALIVE = 15
"""Seconds between comments on an idle event stream, so proxies keep it open."""


class Guard:
    """Whether actions are allowed from the pages, and why not when they are not."""

    def __init__(self, allowed: bool, identity: str | None) -> None:
        self.allowed = allowed
        self.identity = identity
        """The user of the console's ZooKeeper identity (``ALIGNER_ZK_AUTH``), if any."""

    def refusal(self, hub: Hub) -> str | None:
        if not self.allowed:
            return "actions are off: start the console with --allow-actions to align, abort, swap and collect here"
        if hub.picture is None:
            return "not connected to ZooKeeper yet: actions wait for the console's first picture of the ledger"
        acl = hub.picture.acl
        if acl.get("mode") != "policy":
            return None  # open, or creator-only (no grant yet, so no admin): ZooKeeper itself refuses what it must
        who = f"as {self.identity!r}" if self.identity else "without an identity"
        if acl.get("admin") is None:
            return (f"actions need the admin identity (ZooKeeper ACLs are in force and only the admin may read "
                    f"who that is); this console connects {who}")
        if self.identity != acl["admin"]:
            return (f"actions need the admin identity {acl['admin']!r} (ZooKeeper ACLs are in force); this "
                    f"console connects {who}")
        return None


def same_origin(request: Request) -> bool:
    """A POST from the console's own page, not from another site open in the same browser (cross-site request
    forgery): browsers send ``Sec-Fetch-Site`` or ``Origin`` with it, and a JSON body needs a CORS preflight this
    server never grants."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return False
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


class Console:
    """The routes of one console: each reads the hub's shared state, never ZooKeeper for the picture."""

    def __init__(self, hub: Hub, runner: actions.Runner, guard: Guard, stop: threading.Event) -> None:
        self.hub = hub
        self.runner = runner
        self.guard = guard
        self.stop = stop
        self.lineages: LRUCache[tuple[str, int], dict[str, Any]] = LRUCache(maxsize=1024)
        self.lock = threading.Lock()
        """Guards :attr:`lineages`: lineage reads run in the thread pool."""

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.page),
            Route("/api/state", self.state),
            Route("/api/events", self.events),
            Route("/api/lineage/{subject}/{epoch:int}", self.lineage),
            Route("/api/actions", self.act, methods=["POST"]),
            Route("/api/actions/describe", self.describe, methods=["POST"]),
            Route("/api/settings", self.settings),
            Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
        ]

    async def page(self, _request: Request) -> Response:
        return FileResponse(str(STATIC / "index.html"))

    async def state(self, _request: Request) -> Response:
        return Response(self.hub.state_json(), media_type="application/json")

    async def events(self, _request: Request) -> Response:
        return EventSourceResponse(self._stream(), ping=KEEPALIVE)

    async def _stream(self) -> AsyncIterator[dict[str, str]]:
        """The state at every change the hub announces; the one-second wait notices the console stopping."""
        hub = self.hub
        changed = hub.listen()
        try:
            sent = -1
            while not self.stop.is_set():
                if hub.version != sent:
                    sent = hub.version
                    yield {"event": "state", "data": hub.state_json()}
                try:
                    await asyncio.wait_for(changed.wait(), timeout=1.0)
                except TimeoutError:
                    continue
                changed.clear()
        finally:
            hub.unlisten(changed)

    async def lineage(self, request: Request) -> Response:
        subject = request.path_params["subject"]
        epoch = request.path_params["epoch"]
        if not NAME.fullmatch(subject):
            return JSONResponse({"error": f"{subject!r} is not a subject name"}, status_code=404)
        key = (subject, epoch)
        with self.lock:
            cached = self.lineages.get(key)
        if cached is None:
            if not self.hub.connected:  # a read would wait for ZooKeeper, holding a server thread
                return JSONResponse({"error": "ZooKeeper is unreachable: lineage is read once it is back"},
                                    status_code=503)
            try:
                cached = await run_in_threadpool(_lineage, self.hub, subject, epoch)
            except AlignerError as exc:
                return JSONResponse({"error": str(exc)}, status_code=404)
            except Exception as exc:  # one request's failure, said in one line on the page; the log has the rest
                log.exception("console: lineage of %s epoch %d", subject, epoch)
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=500)
            with self.lock:
                self.lineages[key] = cached
        return JSONResponse(cached)

    async def act(self, request: Request) -> Response:
        if not same_origin(request):
            return JSONResponse({"error": "actions are taken from the console's own page (a JSON POST from its "
                                          "origin)"}, status_code=403)
        refused = self.guard.refusal(self.hub)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        try:
            body = await request.json()
            action = actions.parse(body if isinstance(body, dict) else {})
            row = self.runner.start(action)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(row, status_code=202)

    async def describe(self, request: Request) -> Response:
        """What an action would do, for the page's confirmation, or why it cannot run."""
        try:
            action = actions.parse(await request.json())
            action.argv()
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"what": action.describe(), "refused": self.guard.refusal(self.hub)})

    async def settings(self, _request: Request) -> Response:
        return JSONResponse({"actions": self.guard.allowed, "refused": self.guard.refusal(self.hub)})


def create_app(hub: Hub, runner: actions.Runner, guard: Guard, stop: threading.Event) -> Starlette:
    return Starlette(routes=Console(hub, runner, guard, stop).routes())


def _lineage(hub: Hub, subject: str, epoch: int) -> dict[str, Any]:
    from aligner.lineage import flatten, subject_epoch_lineage

    assert hub.ledger is not None
    tree = subject_epoch_lineage(hub.ledger, subject, epoch)
    return {"lineage": tree, "cut": flatten(tree)}
