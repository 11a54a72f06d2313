"""Test harness: one real embedded stack (ZooKeeper + Tansu) per session, isolated state per test, and a
suite that cannot hang.

Set ALIGNER_TEST_BACKEND=docker to run the same tests against Apache Kafka + ZooKeeper through
testcontainers; that path needs a Docker engine and is skipped where there is none.

Why it cannot hang:
- every thread and process a test starts comes from the ``spawn`` fixture (or a ``with`` block), which
  stops it on every path;
- a per-test guard names any thread or child process that outlived its test, stops it and errors the test;
- a session guard does the same for anything left at the end and fails the run;
- pytest-timeout (signal) fails a test that runs too long with every thread's stack; if the test cannot
  even unwind, a faulthandler watchdog dumps all stacks and exits; after the session, the same watchdog
  turns a hang at interpreter exit into exit code 1 with stacks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from aligner.connectors.runtime import JobFunction, JobSpec
from aligner.embedded.stack import EmbeddedStack, StackInfo
from aligner.ledger import Ledger
from tests import guard
from tests.helpers import Worker
from tests.streams import Generator, JobThread

ROOT = Path(__file__).resolve().parent.parent

UNWIND_GRACE = 120.0
"""Seconds a timed-out test gets to unwind before the watchdog dumps every stack and exits."""
EXIT_GRACE = 60.0
"""Seconds pytest may take to exit after the session before the watchdog dumps every stack and exits."""
SETTLE = 5.0
"""Seconds threads and processes that are ending anyway get before they count as leaked."""

T = TypeVar("T")

# ---- watchdog: a hung test or a hung exit becomes a stack dump and exit code 1 ----------------------

_watchdog_file: Any = None


def pytest_configure(config: pytest.Config) -> None:
    global _watchdog_file
    config.addinivalue_line("markers", "stack: needs the embedded stack (ZooKeeper, broker) or other processes; "
                            "`make test-unit` runs the rest (pytest -m 'not stack')")
    # Output capture is suspended now: fd 2 is the real stderr, and stays reachable through this copy
    # while a test's output is captured.
    _watchdog_file = os.fdopen(os.dup(2), "w")


PROCESS_TESTS = ("test_chaos.py::test_short_seeded", "test_faults.py", "test_demo_hotness.py",
                 "test_cli_errors.py::test_a_command_gives_up", "test_stack.py", "test_zk_tls.py",
                 "test_install.py", "test_latency.py", "test_benchmarks.py", "test_faust.py",
                 "test_slow_broker.py", "test_soak.py", "test_upgrades.py", "test_ensemble.py",
                 "test_stack_status_probe.py", "test_chaos.py::test_first_signal")
"""Tests that start processes of their own (a stack, Spark, a Faust worker, a virtualenv) without the ``stack``
fixture: stack tests too."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the ``stack`` fixture (directly or through another fixture) or starts processes of its
    own is a stack test; the rest are pure (``make test-unit``)."""
    for item in items:
        if "stack" in getattr(item, "fixturenames", ()) or item.nodeid.rsplit("/", 1)[-1].startswith(PROCESS_TESTS):
            item.add_marker(pytest.mark.stack)


def _arm(seconds: float) -> None:
    if _watchdog_file is not None:
        faulthandler.dump_traceback_later(seconds, exit=True, file=_watchdog_file)


def _test_timeout(item: pytest.Item) -> float:
    try:
        from pytest_timeout import _get_item_settings

        timeout = _get_item_settings(item).timeout
    except Exception:
        timeout = None
    return float(timeout or 600)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _arm(_test_timeout(item) + UNWIND_GRACE)  # re-armed per phase: pytest cancels it when a test fails
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _arm(_test_timeout(item) + UNWIND_GRACE)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    _arm(_test_timeout(item) + UNWIND_GRACE)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Last thing pytest does: if a non-daemon thread would keep the interpreter from exiting, say so with
    its stack and exit now; otherwise give the exit ``EXIT_GRACE`` seconds before the watchdog does."""
    stuck = [t for t in guard.threads().values() if not t.daemon and t is not threading.main_thread()]
    if stuck and _watchdog_file is not None:
        _watchdog_file.write("\npytest would hang at exit on these threads; exiting:\n")
        _watchdog_file.write("".join(f"  {guard.describe(t)}\n" for t in stuck))
        _watchdog_file.flush()
        faulthandler.dump_traceback(file=_watchdog_file, all_threads=True)
        _watchdog_file.flush()
        os._exit(1)
    _arm(EXIT_GRACE)


# ---- leak guards ------------------------------------------------------------------------------------

_session_start: guard.Snapshot | None = None
_fixture_owned = guard.Snapshot({}, {})
"""Threads and processes started by session- and module-scoped fixtures: theirs to stop, not a test's."""
_blamed: dict[int, str] = {}
"""Threads a test leaked that could not be stopped, by identity: the test that leaked them."""


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session_start
    _session_start = guard.Snapshot.take()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    if fixturedef.scope == "function":
        return (yield)
    before = guard.Snapshot.take()
    try:
        return (yield)
    finally:
        started_t, started_p = before.new_since()
        _fixture_owned.absorb(guard.Snapshot({id(t): t for t in started_t}, {p.key: p for p in started_p}))


@pytest.fixture(autouse=True)
def _leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Errors a test that leaves a thread or child process running after its fixtures are torn down
    (after naming and stopping it), so one test's leak neither hangs nor disturbs the rest of the run."""
    before = guard.Snapshot.take()
    yield
    leaked_t, leaked_p = before.settle(_fixture_owned, SETTLE, skip=guard.long_lived)
    if leaked_t or leaked_p:
        lines = guard.stop_all(leaked_t, leaked_p)
        _blamed.update({id(t): request.node.nodeid for t in leaked_t if t.is_alive()})
        pytest.fail(f"{request.node.nodeid} leaked (now stopped):\n  " + "\n  ".join(lines), pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """After every fixture is torn down and the summary printed: anything still running leaked. Name it,
    stop it and fail the run."""
    _arm(EXIT_GRACE + 300)  # the session's fixtures are torn down in here (with -x or ^C too)
    result = yield
    if _session_start is None:
        return result
    leaked_t, leaked_p = _session_start.settle(None, SETTLE)
    if leaked_t or leaked_p:
        blame = [f"thread {t.name!r} was leaked by {_blamed[id(t)]}" for t in leaked_t if id(t) in _blamed]
        lines = guard.stop_all(leaked_t, leaked_p) + blame
        out = _watchdog_file or sys.stderr
        out.write("\n=== LEAKED at the end of the session (stopped; the run fails) ===\n")
        out.write("".join(f"  {line}\n" for line in lines))
        out.flush()
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


# ---- the stack and per-test state -------------------------------------------------------------------


def _docker_stack() -> Iterator[StackInfo]:  # pragma: no cover - needs Docker
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("ALIGNER_TEST_BACKEND=docker but no Docker engine is reachable")
    tc = pytest.importorskip("testcontainers.kafka")
    zk_mod = pytest.importorskip("testcontainers.core.container")
    with zk_mod.DockerContainer("zookeeper:3.8").with_exposed_ports(2181) as zk, \
            tc.KafkaContainer("confluentinc/cp-kafka:7.7.0") as kafka:
        host = zk.get_container_host_ip()
        yield StackInfo(zk=f"{host}:{zk.get_exposed_port(2181)}", kafka=kafka.get_bootstrap_server(),
                        workdir="", zk_pid=0, kafka_pid=0)


@pytest.fixture(scope="session")
def stack() -> Iterator[StackInfo]:
    if os.environ.get("ALIGNER_TEST_BACKEND") == "docker":
        yield from _docker_stack()
        return
    before = guard.descendants()
    embedded = EmbeddedStack()
    try:
        yield embedded.start()
    finally:
        embedded.stop()
        # Whatever the stack started (ZooKeeper, Tansu, anything restarted by a test) is reaped here.
        left = [p for k, p in guard.descendants().items()
                if k not in before and ("ZooKeeperServerMain" in p.cmdline or "tansu" in p.cmdline)]
        guard.kill(left)
        assert not left, f"stack processes outlived the stack (now killed): {[str(p) for p in left]}"


@pytest.fixture(scope="session", autouse=True)
def _spark_gateway() -> Iterator[None]:
    """Stops the Spark driver JVM that PySpark starts at the first session and keeps for the whole
    process: it is a child of pytest and would otherwise only die at exit."""
    yield
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    with contextlib.suppress(Exception):
        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()  # the JVM exits when its stdin closes
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            guard.kill([p for p in guard.descendants().values() if p.pid == proc.pid])
            proc.wait(10)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture
def root() -> str:
    """A private ZooKeeper root per test, so tests never see each other's subjects."""
    return f"/aligner-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def ledger(stack: StackInfo, root: str) -> Iterator[Ledger]:
    led = Ledger.connect(stack.zk, root)
    yield led
    led.close()


@pytest.fixture
def subject_name() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(stack: StackInfo, root: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ALIGNER_ZK": stack.zk, "ALIGNER_KAFKA": stack.kafka, "ALIGNER_ROOT": root,
            "ALIGNER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}


def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aligner.coordinator", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


class _StopsQuery:
    def __init__(self, query: Any) -> None:
        self.query = query

    def close(self) -> None:
        if self.query.isActive:
            self.query.stop()


class Spawn:
    """The threads and processes of one test. Everything started through it is stopped at teardown, in
    reverse order, on every path (passed, failed, timed out), before the per-test leak guard looks."""

    def __init__(self, stack: StackInfo, root: str) -> None:
        self.stack = stack
        self.root = root
        self._owned: list[Any] = []

    def __call__(self, owner: T) -> T:
        """Own anything with a ``close()``: it is closed at teardown."""
        self._owned.append(owner)
        return owner

    def generator(self, subject: str, epochs: int, **kw: Any) -> Generator:
        """A started :class:`Generator` writing to ``subject``."""
        return self(Generator(self.stack, self.root, subject, epochs, **kw)).start()

    def job(self, spec: JobSpec, fn: JobFunction, worker: int = 0) -> JobThread:
        """A started :class:`JobThread` running worker ``worker`` of ``spec``."""
        return self(JobThread(self.stack, self.root, spec, fn, worker))

    def worker(self, module: str, *args: str, env: dict[str, str] | None = None) -> Worker:
        """A started :class:`Worker` process running ``python -m module args``."""
        return self(Worker(module, *args, env=env))

    def query(self, query: Any) -> Any:
        """A started Spark ``StreamingQuery``: stopped at teardown if it still runs (a failed wait for it
        would otherwise leave it reading the stack until the module's session stops)."""
        self(_StopsQuery(query))
        return query

    def close(self) -> None:
        errors: list[str] = []
        while self._owned:
            owner = self._owned.pop()
            try:
                owner.close()
            except Exception as exc:
                errors.append(f"{owner!r:.120}: {exc}")
        assert not errors, "could not stop: " + "; ".join(errors)


@pytest.fixture
def spawn(stack: StackInfo, root: str) -> Iterator[Spawn]:
    """Start threads and processes through this; they are stopped whatever the test did."""
    owned = Spawn(stack, root)
    try:
        yield owned
    finally:
        owned.close()


# ---- a real browser (the console's tests) ----------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's, through Playwright), one per module."""
    from experiments.browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page at 1280x800, closed with its context on every path."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(180_000)
    try:
        yield page
    finally:
        context.close()
