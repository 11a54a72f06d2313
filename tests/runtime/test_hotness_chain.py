"""The hotness chain of the experiments and the demo, on the real stack: aligned live, hot-swapped
under load, every record of both jobs checked, the latency records the experiments plot, and the chain as
``aligner console`` shows it to a page left open in Chromium throughout."""

from __future__ import annotations

from experiments.analysis import before_after, epoch_series
from experiments.chain import JOB1, JOB2, ChainConfig, exactly_once, run_chain
from experiments.workload import HOT_ISSUES, PR_HOTNESS, STREAMS, Workload
from tests.console import by_id, start_console


def test_chain_aligns_and_hot_swaps_under_load_exactly_once(stack, root, spawn, page):
    console = start_console(spawn, stack, root)
    page.goto(console.url)
    page.evaluate("window.__sameDocument = true")
    config = ChainConfig(mode="aligned", interval=0.3, parallelism=2, duration=16.0, align_at=4.0, swap_at=7.5,
                         workload=Workload(comment_rate=150))
    run = run_chain(stack, root, config, "t")
    assert exactly_once(run.check), run.check
    assert run.check["job1_wrong"] == run.check["job2_wrong"] == 0
    assert run.check["job1_out"] > 0 and run.check["job1_v2"] > 0 and run.check["job1_v2"] < run.check["job1_out"]
    assert run.check["job2_out"] == run.check["job2_expected"] > run.sent["pr-comments"]
    assert run.swap_epoch is not None
    when = {k: round(v - run.started, 1) for k, v in run.events.items()}
    # v2's first epoch S+1 commits only after v1's last one, S
    commits = {c["epoch"]: c["committed_at"] for c in run.job_epochs["hot-issues"]}
    assert commits[run.swap_epoch] <= commits[run.swap_epoch + 1], when
    # one latency record per worker and job epoch, in both modes, for every operator
    assert {r.run for r in run.latency} == {"t"}
    modes = {(r.operator, r.mode) for r in run.latency}
    assert {(JOB1, "exactly_once"), (JOB1, "aligned"), (JOB2, "exactly_once"), (JOB2, "aligned"),
            (f"{JOB1}-v2", "aligned")} <= modes, when
    before, after = before_after(run, warmup=0.0)
    assert before and after and all(p.mode == "aligned" for p in after), when
    series = epoch_series(run)
    assert all(p.checkpoint_ms >= p.max_ms >= p.avg_ms > 0 for p in series)

    # The open page drew the whole chain and saw the swap's phases in order, without a reload.
    for name in (*STREAMS, HOT_ISSUES, PR_HOTNESS):
        page.locator(f'#graph [data-id="s:{name}-t"]').wait_for()
    for job in (f"{JOB1}-t", f"{JOB2}-t", f"{JOB1}-t-v2"):
        page.locator(f'#graph [data-id="j:{job}"]').wait_for()
    swap = by_id(page, f"swap-{JOB1}-t")
    swap.locator('.timeline li[data-phase="done"]').wait_for()
    phases = swap.locator(".timeline li").evaluate_all("items => items.map(i => i.dataset.phase)")
    assert phases == ["precommit", "commit", "done"], phases
    assert page.evaluate("window.__sameDocument") is True
