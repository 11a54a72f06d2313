"""What users read stays a user's document: the README is short and carries no work log, every file path the
README and the docs cite exists, every environment variable the code reads is documented, the docs site builds
strictly (broken links and missing references fail), and the repository carries no run outputs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aligner.variables import names as documented_variables

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("aligner", "connectors", "coordinator")
README_LINES = 400

WORK_LOG = {
    "a numbered work period": re.compile(r"\b(session|sessions|work period) \d+", re.I),
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
    "an evidence path": re.compile(r"experiments/results/\w"),
    "a commit id": re.compile(r"(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
}
"""What makes a line a work-log entry rather than documentation."""

CITED = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.*-]+)+/?)`")
"""A file path cited in backticks: at least one slash, no spaces (``tests/platform/test_docs.py``, ``deploy/``)."""
NOT_PATHS = re.compile(r"^(https?:|/|~|\.\./|[a-z]+://)|\{|<|\*|:")
"""Cited names that are not repository paths: URLs, absolute or home paths, ZooKeeper patterns, globs."""
GENERATED = ("experiments/results", "site", ".venv")
"""Folders the tools make (ignored by git): cited as where output goes."""


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_LINES, f"README.md has {len(lines)} lines; keep it under {README_LINES}"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_work_log_in_what_users_read(doc: Path) -> None:
    found = [f"{doc.relative_to(ROOT)}:{n}: {what}: {line.strip()[:120]}"
             for n, line in enumerate(doc.read_text().splitlines(), 1)
             for what, pattern in WORK_LOG.items() if pattern.search(line)]
    assert not found, "work-log entries (they belong in commit messages and CHANGELOG.md):\n" + "\n".join(found)


def test_every_cited_path_exists() -> None:
    missing = []
    for doc in [*documents(), ROOT / "mkdocs.yml"]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for path in CITED.findall(line):
                if NOT_PATHS.search(path) or path.rstrip("/").startswith(GENERATED):
                    continue
                if not (ROOT / path.split("/")[0]).exists() and "." not in path.rsplit("/", 1)[-1]:
                    continue  # not in the repository's tree and no file name: an image or package name
                if not (ROOT / path).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: `{path}`")
    assert not missing, "cited paths that do not exist (write them from the repository root):\n" + "\n".join(missing)


def test_docs_never_point_outside_the_repository() -> None:
    outside = [f"{doc.relative_to(ROOT)}:{n}" for doc in documents()
               for n, line in enumerate(doc.read_text().splitlines(), 1)
               if "../shared" in line or "PLATFORM.md" in line or "BRIEF.md" in line]
    assert not outside, f"references to files that do not ship with the product: {outside}"


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    read = set()
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            read |= {m for m in re.findall(r"ALIGNER_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    prefixes = {"ALIGNER_RETENTION", "ALIGNER_ZK_TLS"}  # ALIGNER_RETENTION_* as a family, in messages
    undocumented = sorted(read - documented_variables() - prefixes)
    assert not undocumented, f"read by the code, missing from aligner.variables.VARIABLES: {undocumented}"


def test_no_run_outputs_are_tracked() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "experiments/results"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not tracked, f"run outputs are tracked (history is not an evidence store): {tracked[:5]}"


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    for page in ("reference/cli/index.html", "reference/api/index.html", "reference/configuration/index.html",
                 "reference/zookeeper-layout/index.html"):
        html = (tmp_path / "site" / page).read_text()
        assert "aligner" in html and len(html) > 10_000, f"{page} rendered nearly empty"
    assert "aligner hotswap" in (tmp_path / "site/reference/cli/index.html").read_text()
    assert "ALIGNER_ZK_AUTH" in (tmp_path / "site/reference/configuration/index.html").read_text()
