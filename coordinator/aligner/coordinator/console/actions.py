"""Actions started from a page: the ``aligner`` command itself, run as the console's identity.

An action is the CLI command a user would type (``align``, ``abort``, ``hotswap``, ``gc``), run as a child
process with the console's settings: the same code path, the same checks, the same one-line errors. Its
progress shows on the pages through the picture (states and phases move as the ledger changes); its outcome
is the command's own answer. One action at a time: a second is refused while one runs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from aligner.models import Ident

Kind = Literal["align", "abort", "hotswap", "gc"]

TIMEOUT = 600.0
"""Seconds an action's command may wait (its ``--timeout``): long, since a page's action has no terminal to
interrupt it; it still ends, and says why."""


class Action(BaseModel):
    """What a page asks for; checked here before any command runs."""

    kind: Kind
    job: Ident | None = None
    old: Ident | None = None
    new: Ident | None = None
    subject: Ident | None = None
    verify_epochs: int | None = Field(default=None, ge=1)
    keep_epochs: int | None = Field(default=None, ge=1)

    def argv(self) -> list[str]:
        """The command's arguments; names go where no option can be read from them (a name may start with -)."""
        if self.kind in ("align", "abort"):
            if self.job is None:
                raise ValueError(f"{self.kind} needs a job")
            return [self.kind, "--timeout", f"{TIMEOUT:g}", "--json", "--", self.job]
        if self.kind == "hotswap":
            if self.old is None or self.new is None or self.subject is None:
                raise ValueError("hotswap needs old, new and subject")
            verify = ["--verify-epochs", str(self.verify_epochs)] if self.verify_epochs else []
            return ["hotswap", f"--old={self.old}", f"--new={self.new}", f"--subject={self.subject}", *verify,
                    "--timeout", f"{TIMEOUT:g}", "--json"]
        keep = ["--keep-epochs", str(self.keep_epochs)] if self.keep_epochs else []
        return ["gc", *keep, "--json"]

    def describe(self) -> str:
        if self.kind == "align":
            return f"align {self.job}: its sources catch up, then every worker starts one job epoch on the same epochs"
        if self.kind == "abort":
            return f"abort the alignment of {self.job}: its sources return to unaligned mode, nothing lost"
        if self.kind == "hotswap":
            verify = f" after comparing {self.verify_epochs} epochs of its shadow" if self.verify_epochs else ""
            return (f"hot-swap {self.old} for {self.new} on {self.subject}{verify}: {self.old} writes up to an epoch "
                    f"S, {self.new} from S+1, exactly once")
        keep = f"at least {self.keep_epochs}" if self.keep_epochs else "the policy's"
        return f"apply retention now: remove epoch records beyond {keep} epochs per subject"


def parse(body: dict[str, Any]) -> Action:
    try:
        return Action.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "action"
        raise ValueError(f"invalid {where}: {first['msg']}") from None


class Runner:
    """Runs one action at a time as ``python -m aligner.coordinator ...`` with the console's settings."""

    def __init__(self, global_args: list[str], report: Callable[[dict[str, Any]], None],
                 env: dict[str, str] | None = None) -> None:
        self.global_args = global_args
        self.report = report
        self.env = env
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self, action: Action) -> dict[str, Any]:
        """Start ``action``; raises ValueError when one is running already or the action is malformed."""
        argv = action.argv()
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                raise ValueError("another action is running; wait for it to finish")
            self._proc = subprocess.Popen([sys.executable, "-m", "aligner.coordinator", *self.global_args, *argv],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
            proc = self._proc
        row = {"kind": action.kind, "what": action.describe(), "command": "aligner " + " ".join(argv),
               "state": "running", "line": "", "started": time.time(), "result": None}
        self.report(dict(row))
        threading.Thread(target=self._finish, args=(proc, row), name="console-action", daemon=True).start()
        return row

    def _finish(self, proc: subprocess.Popen[str], row: dict[str, Any]) -> None:
        stdout, stderr = proc.communicate()
        row["ended"] = time.time()
        if proc.returncode == 0:
            row["state"] = "done"
            try:
                row["result"] = json.loads(stdout) if stdout.strip() else None
            except json.JSONDecodeError:
                row["result"] = stdout.strip()
        else:
            lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
            row["state"], row["line"] = "failed", lines[-1] if lines else f"exit code {proc.returncode}"
        self.report(dict(row))

    def stop(self, grace: float = 3.0) -> None:
        """Stop a running action's command (SIGTERM, then SIGKILL): the console is stopping."""
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)
