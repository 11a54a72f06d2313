"""Human-readable views of what the commands print (``--json`` prints the same data as JSON)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from aligner.coordinator.cli.common import out


def subjects_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="subjects")
    for col in ("subject", "topic", "partitions", "epochs", "last committed", "sinks / producers",
                "partition owners"):
        table.add_column(col)
    for r in rows:
        prods = "; ".join(
            f"{sink}: " + ", ".join(f"{p['producer']}@{p['committed_epoch']} (inc {p['incarnation']})" for p in ps)
            for sink, ps in r["sinks"].items()
        )
        owners = "; ".join(
            f"{o['sink']}: {','.join(map(str, o['partitions']))} "
            + (f"from {o['from_epoch']}" if o["to_epoch"] is None else f"epochs {o['from_epoch']}-{o['to_epoch']}")
            for o in reversed(r["owners"]))
        table.add_row(r["subject"], r["topic"], str(r["partitions"]), str(r["epochs"]),
                      str(r["last_committed"]), prods or "-", owners or "-")
    out.print(table)


def jobs_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="jobs")
    for col in ("job", "version", "source", "mode", "state", "aligned at (k, J)", "lag epochs", "lag s", "waiting s",
                "decision"):
        table.add_column(col)
    for j in rows:
        for s in j["sources"]:
            at = f"({s['subject_epoch']}, {s['job_epoch']})" if s["subject_epoch"] is not None else "-"
            table.add_row(j["job"], j["version"], s["subject"], s["mode"], s["state"], at, str(s["lag_epochs"]),
                          f"{s['lag_seconds']:.2f}",
                          "-" if s["waiting_seconds"] is None else f"{s['waiting_seconds']:.0f}", j["decision"] or "-")
    out.print(table)


def queries_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="spark queries")
    for col in ("query", "last batch", "subject", "read epochs", "behind epochs", "behind s"):
        table.add_column(col)
    for q in rows:
        for subject, r in q["subjects"].items() or {"-": None}.items():
            if r is None:
                table.add_row(q["query"], str(q["batch"]), "-", "-", "-", "-")
                continue
            table.add_row(q["query"], str(q["batch"]), subject, f"{r['first']}..{r['last']}",
                          str(r["behind_epochs"]), f"{r['behind_seconds']:.2f}")
    out.print(table)


def epochs_table(subject: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"epochs of {subject}")
    for col in ("epoch", "state", "writers", "ranges [start, end)"):
        table.add_column(col)
    for r in rows:
        ranges = " ".join(f"{p}:[{s},{e})" for p, (s, e) in r["ranges"].items())
        table.add_row(str(r["epoch"]), "committed" if r["committed"] else "open", ",".join(r["writers"]), ranges)
    out.print(table)


def acl_table(rows: list[tuple[str, list[tuple[str, str]]]]) -> None:
    table = Table("path", "identity", "permissions")
    for p, entries in rows:
        for i, (who, perms) in enumerate(entries or [("-", "-")]):
            table.add_row(p if i == 0 else "", who, perms)
    out.print(table)
