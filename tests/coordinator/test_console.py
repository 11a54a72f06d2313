"""`aligner console` in a real browser (Debian's Chromium driven by Playwright), on the embedded stack: the chain
as a graph, a hot-swap seen live, lineage by clicks, an alignment started from the page, actions refused to an
identity that is not the admin, a ZooKeeper restart ridden out, and one reader for any number of viewers."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from typing import Any

from aligner.acl import AclLedger
from aligner.connectors.runtime import JobSpec
from aligner.connectors.subjects import create_subject
from aligner.coordinator.hotswap import HotSwap
from aligner.embedded.stack import ZOOKEEPER, EmbeddedStack
from aligner.ledger import Ledger
from aligner.lineage import flatten, subject_epoch_lineage
from aligner.models import JobNode, SubjectNode
from aligner.settings import parse_zk_auth
from experiments.browser import post_json
from tests.console import Console, by_id, start_console
from tests.helpers import wait_for
from tests.jobs import tag_v1
from tests.swaps import finish, following, start_versions

LIVE = 180.0
"""Liveness bound (seconds) on waits for progress: generous, for a busy machine; never a speed check."""
STOP_WITHIN = 5.0
ADMIN = "digest:console-admin:secret"
OTHER = "digest:console-viewer:secret"


def test_the_chain_and_a_hotswap_started_from_the_cli_show_live(stack, ledger, root, subject_name, spawn, page):
    raw = subject_name
    consoles: list[Console] = []

    def open_page() -> None:
        """v1 runs, not aligned yet: the page shows the chain, and will show what follows without a reload."""
        consoles.append(start_console(spawn, stack, root))
        page.goto(consoles[0].url)
        page.evaluate("window.__sameDocument = true")
        for node in (f"s:{raw}", f"j:{raw}-v1", f"s:{raw}-t"):
            page.locator(f'#graph [data-id="{node}"]').wait_for()
        assert page.locator("#graph path.edge").count() == 2

    def aligned_shown(_target: str) -> None:
        by_id(page, f"job-{raw}-v1").locator("[data-field=state]").filter(has_text=re.compile(r"^aligned")).wait_for()

    target, more, gen, old, new, v1, v2 = start_versions(stack, ledger, spawn, raw, before_align=open_page,
                                                         before_v2=aligned_shown)
    console = consoles[0]
    page.locator(f'#graph [data-id="j:{new.job}"]').wait_for()
    swapper = HotSwap(ledger)
    following(swapper, new)
    cli = spawn.worker("aligner.coordinator", "--zk", stack.zk, "--kafka", stack.kafka, "--root", root, "hotswap",
                       "--old", old.job, "--new", new.job, "--subject", target, "--timeout", str(LIVE), "--json")
    by_id(page, f"swap-{old.job}").locator('.timeline li[data-phase="done"]').wait_for()
    phases = by_id(page, f"swap-{old.job}").locator(".timeline li").evaluate_all(
        "items => items.map(i => i.dataset.phase)")
    assert phases == ["precommit", "commit", "done"], "the page missed or reordered the swap's phases"
    assert cli.proc.wait(LIVE) == 0, cli.stderr
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"

    # Lineage by clicks: the target's newest epoch, then one of its inputs.
    swap, _ = swapper.jobs.swap(old.job)
    assert swap is not None and swap.phase == "done"
    wait_for(lambda: (ledger.epochs.frontier(target) or 0) > swap.epoch, LIVE, "v2 output")
    _lineage_by_clicks(page, ledger, raw, target)

    # Actions are off unless asked for: no buttons, and the API refuses with one line.
    assert page.locator("button[data-action]:visible").count() == 0
    status, body = post_json(console.url + "/api/actions", {"kind": "align", "job": old.job})
    assert status == 403 and "--allow-actions" in body["error"]
    finish(more, gen, v1, v2)


def _lineage_by_clicks(page: Any, ledger: Ledger, raw: str, target: str) -> None:
    """The target's newest epoch shows the ledger's cut of ``raw``; a click on one of its epochs opens that."""
    by_id(page, f"subject-{target}").locator("button.link").click()
    tree = page.locator("[data-testid=lineage-tree]")
    tree.wait_for()
    epoch = int(page.locator("#lineage-epoch").input_value())
    expected = flatten(subject_epoch_lineage(ledger, target, epoch))
    links = tree.locator(f'button.lineage-link[data-subject="{raw}"]')
    # One link per input epoch under each producer of the epoch (the old and the new version may both have
    # written it): the epochs named are the ledger's cut.
    shown = sorted({int(e) for e in links.evaluate_all("items => items.map(i => i.dataset.epoch)")})
    assert shown == expected[raw] and shown, f"page shows {shown}, the ledger says {expected}"
    links.first.click()
    page.locator("#lineage p").filter(has_text=f"{raw} epoch {shown[0]}").wait_for()


def test_an_alignment_started_from_the_page_completes(stack, ledger, root, subject_name, spawn, page):
    raw, out = subject_name, f"{subject_name}-out"
    create_subject(ledger, stack.kafka, raw, 2)
    create_subject(ledger, stack.kafka, out, 2)
    more = threading.Event()
    gen = spawn.generator(raw, epochs=5000, pace=0.04, until=more)
    spec = JobSpec(job=f"{raw}-a", inputs=(raw,), output=out, interval=0.2)
    job = spawn.job(spec, tag_v1)
    console = start_console(spawn, stack, root, "--allow-actions")
    page.goto(console.url)
    row = by_id(page, f"job-{spec.job}")
    row.locator("button[data-action=align]").click()
    dialog = page.locator("#confirm")
    dialog.filter(has_text=f"align {spec.job}").wait_for()
    page.locator("#confirm-ok").click()
    page.locator('#action [data-state="done"]').wait_for()
    row.locator("[data-field=state]").filter(has_text=re.compile(r"^aligned")).wait_for()
    decision, _ = ledger.jobs.decision(spec.job)
    assert decision is not None and decision.phase == "aligned"
    more.set()
    gen.finished()
    job.join()


def test_actions_are_refused_to_an_identity_that_is_not_the_admin(stack, root, spawn, page):
    admin = Ledger.connect(stack.zk, root, auth=ADMIN)
    try:
        for s in ("in-a", "in-b"):
            admin.subjects.register_subject(SubjectNode(name=s, topic=s, partitions=2))
        admin.jobs.register(JobNode(job="job-a", inputs=("in-b",), output="in-a", parallelism=1))
        AclLedger(admin).grant(parse_zk_auth(ADMIN), OTHER.removeprefix("digest:"), subjects=["in-a"], jobs=["job-a"])
    finally:
        admin.close()
    console = start_console(spawn, stack, root, "--allow-actions", env={"ALIGNER_ZK_AUTH": OTHER})
    page.goto(console.url)
    by_id(page, "job-job-a").locator("button[data-action=align]").click()
    refused = page.locator("#confirm-refused")
    refused.filter(has_text="actions need the admin identity").wait_for()
    assert page.locator("#confirm-ok").is_disabled()
    status, body = post_json(console.url + "/api/actions", {"kind": "align", "job": "job-a"})
    assert status == 403 and "console-viewer" in body["error"] and "\n" not in body["error"]


def test_the_page_rides_out_a_zookeeper_restart(spawn, page):
    own = EmbeddedStack()
    info = own.start()
    try:
        root = "/console-restart"
        with Ledger.connect(info.zk, root) as led:
            led.subjects.register_subject(SubjectNode(name="before", topic="before", partitions=1))
        console = start_console(spawn, info, root)
        page.goto(console.url)
        by_id(page, "subject-before").wait_for()
        pid = own.pid(ZOOKEEPER)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        page.locator("#zk-status").filter(has_text="ZooKeeper unreachable since").wait_for()
        assert by_id(page, "subject-before").is_visible(), "the last picture went away in the outage"
        own.restart(ZOOKEEPER)
        with Ledger.connect(info.zk, root) as led:
            led.subjects.register_subject(SubjectNode(name="after", topic="after", partitions=1))
        by_id(page, "subject-after").wait_for()
        page.locator("#zk-status").filter(has_text="ZooKeeper connected").wait_for()
    finally:
        own.stop()


def test_twenty_viewers_cost_zookeeper_what_one_does(stack, ledger, root, subject_name, spawn, browser):
    """The same ZooKeeper requests per picture with 1 and with 20 open pages (each also asking for the JSON):
    pages read the shared picture, never ZooKeeper. Counts, not timings."""
    for name in (subject_name, f"{subject_name}-2"):
        ledger.subjects.register_subject(SubjectNode(name=name, topic=name, partitions=2))
    console = start_console(spawn, stack, root)

    def per_picture(viewers: int) -> float:
        context = browser.new_context()
        try:
            for _ in range(viewers):
                context.new_page().goto(console.url)
            first = next_picture(console.state()["pictures"])  # measured from a picture's end to another's
            last = next_picture(first["pictures"] + 3)
            for _ in range(viewers * 5):
                urllib.request.urlopen(console.url + "/api/state", timeout=5).read()
            last = next_picture(last["pictures"])
            return ((last["zookeeper"]["requests"] - first["zookeeper"]["requests"])
                    / (last["pictures"] - first["pictures"]))
        finally:
            context.close()

    def next_picture(after: int) -> dict[str, Any]:
        """The state published with the first picture past ``after`` (its request count is that picture's end)."""
        seen: list[dict[str, Any]] = [console.state()]

        def past() -> bool:
            seen[0] = console.state()
            return bool(seen[0]["pictures"] > after)

        wait_for(past, LIVE, "the next picture")
        return seen[0]

    one, twenty = per_picture(1), per_picture(20)
    # The same reads per picture, give or take a cache refresh falling in one window: twenty viewers reading
    # ZooKeeper themselves would cost twenty times as much.
    assert one > 0 and abs(twenty - one) <= 0.05 * one + 1, f"requests per picture: {one} with 1 page, {twenty} with 20"


def test_console_says_a_port_in_use_and_stops_on_sigterm_with_pages_open(stack, root, spawn, page):
    console = start_console(spawn, stack, root)
    port = console.url.rsplit(":", 1)[1]
    taken = spawn.worker("aligner.coordinator", "--zk", stack.zk, "--root", root, "console", "--port", port)
    assert taken.proc.wait(60) == 1
    lines = [ln for ln in taken.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "Traceback" not in taken.stderr, taken.stderr
    page.goto(console.url)
    page.locator("#zk-status").filter(has_text="ZooKeeper connected").wait_for()
    console.worker.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert console.worker.proc.wait(STOP_WITHIN + 5) == 0, console.worker.stderr
    assert time.monotonic() - started < STOP_WITHIN
