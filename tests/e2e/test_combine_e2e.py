"""End to end: a run summary's step-time chart in a real TensorBoard and a real headless
Chromium has one bar per step NUMBER across the ranks (not ranks x steps), and a bar's
tooltip says how many spans it averages and names the slowest rank, and the input panel's
slowest steps name their rank (issue 14: run-level views at 1,000 ranks). demo_logs/ddp_straggler_2rank: two ranks with the same steps."""
from __future__ import annotations

import json
import os

import pytest

from conftest import DEMO_LOGS, http_get

RUN = "ddp_straggler_2rank"
PANEL = "section.panel:has(h2:text-is('Step-time breakdown'))"


@pytest.fixture(scope="module")
def base(tmp_path_factory, tensorboard_server):
    src = DEMO_LOGS / RUN
    if not src.is_dir():
        pytest.skip(f"demo_logs/{RUN} is missing")
    logdir = tmp_path_factory.mktemp("combine_e2e") / "logs"
    (logdir / RUN).mkdir(parents=True)
    for f in src.iterdir():
        if ".pt.trace.json" in f.name:
            os.symlink(f, logdir / RUN / f.name)
    return tensorboard_server(logdir)


def test_run_summary_chart_has_one_bar_per_step_across_ranks(base, browser_page):
    w = browser_page(base)
    frame = w.open_tab()
    iframe = w.plugin_frame()
    iframe.wait_for_function("(r) => [...document.querySelectorAll('#bn-run option')].some((o) => o.value === r)",
                             arg=RUN, timeout=240_000)
    frame.locator("#bn-run").select_option(RUN)
    iframe.wait_for_function("() => [...document.querySelectorAll('#bn-worker option')].some((o) => o.value === 'all')",
                             timeout=120_000)
    frame.locator("#bn-worker").select_option("all")
    chart = iframe.locator(f"{PANEL} svg.chart")
    chart.wait_for(timeout=240_000)
    # the run summary the page drew, fetched again from its own request
    url = next(u for u in reversed(w.requests) if "/report?" in u and "worker=" not in u.split("?", 1)[1])
    status, raw = http_get(url)
    rep = json.loads(raw)
    assert status == 200 and len(rep["spans"]) == 2
    rows = rep["breakdown_per_step"]
    steps = sorted({n for n in rep["steps"]["numbers"]})
    assert [r["step"] for r in rows] == steps and all(r["spans"] == 2 for r in rows)
    assert chart.get_attribute("aria-label") == f"Stacked bar chart, {len(steps)} bars"
    assert "the mean over the trace files that ran it" in iframe.locator(PANEL).inner_text()
    # a bar's tooltip: the step, how many spans, the slowest rank by name
    iframe.locator(f"{PANEL} svg.chart g.bar rect.seg").first.hover()
    tip = iframe.locator(".bn-tooltip .tip-title")
    tip.wait_for(timeout=10_000)
    text = tip.inner_text()
    first = rows[0]
    assert text.startswith(f"Step {first['step']}: mean of 2 spans"), text
    assert f"worker {first['max_worker']}, span {first['max_span']}" in text, text
    assert first["max_worker"] in ("rank0", "rank1")
    # the input panel's slowest steps of a summary name their rank
    slow = rep["input"]["evidence"]["slowest_steps"]
    cells = iframe.locator("section.panel:has(h2:text-is('Input pipeline')) tbody tr td:first-child").all_inner_texts()
    assert cells == [f"#{r['step']} · worker {r['worker']}" for r in slow] and slow
    w.check_clean()
