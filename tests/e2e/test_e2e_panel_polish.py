"""End to end, at a 1280 px wide window in a real TensorBoard + headless Chromium: the H100
BERT inference demo (TraceLens' H100 trace) whose panels had text cut off.

- Operators: "Top input shapes" are long ("[[1, 141, 512], ...] [\"c10::BFloat16\", ...]");
  the table fits its scroll box (nothing cut at the box's edge), a cut entry ends in an
  ellipsis (text-overflow) and its title holds the full text.
- Kernel table: "Limited by" ("registers+shared_memory") wraps inside its cell; the table
  fits its box.
- Memory: the folded CPU (host) memory chart's <details> summary carries the peak
  ("CPU (host) memory · peak 16 B", the report's memory.cpu.peak_allocated_bytes).
"""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ARTIFACTS, DEMO_LOGS as DEMO, http_get

RUN = "bert_h100_inference"


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory, tensorboard_server):
    logdir = tmp_path_factory.mktemp("logdir")
    shutil.copytree(DEMO / RUN, logdir / RUN)
    return tensorboard_server(logdir)


FIT_JS = """(sel) => { const t = document.querySelector(sel); const box = t.closest('.table-scroll');
  return {table: Math.round(t.getBoundingClientRect().width), box: box.clientWidth, scroll: box.scrollWidth}; }"""


def test_text_is_not_cut_at_1280px(tensorboard, browser_page):
    base = tensorboard
    w = browser_page(base, viewport=(1280, 900))
    page = w.page
    page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#run={RUN}", wait_until="domcontentloaded")
    page.locator("table.kernels tbody tr").first.wait_for(timeout=120_000)
    page.locator("table.operators tbody tr").first.wait_for(timeout=120_000)

    # operators: the table fits its box; each cut input entry shows an ellipsis and has the full text
    fit = page.evaluate(FIT_JS, "table.operators")
    assert fit["scroll"] <= fit["box"] and fit["table"] <= fit["box"], fit
    entries = page.eval_on_selector_all("td.op-inputs > div", """els => els.map(d => ({
        cut: d.scrollWidth > d.clientWidth, overflow: getComputedStyle(d).textOverflow,
        text: d.textContent, title: d.title, right: d.getBoundingClientRect().right,
        boxRight: d.closest('.table-scroll').getBoundingClientRect().right}))""")
    cut = [e for e in entries if e["cut"]]
    assert len(cut) >= 5, entries[:3]  # BERT's addmm/linear inputs are long: some are cut
    for e in cut:
        assert e["overflow"] == "ellipsis", e
        shown = e["text"].split(" ", 1)[1]  # after the "×17 " call count
        assert e["title"].rsplit("\n", 1)[0] == shown, e  # the full text, then "N calls, T CPU"
    assert all(e["right"] <= e["boxRight"] + 0.5 for e in entries), [e for e in entries if e["right"] > e["boxRight"]][:2]
    assert any("c10::BFloat16" in e["title"] for e in cut)

    # kernel table: fits; "registers+shared_memory" wraps after "+" inside its cell
    fit = page.evaluate(FIT_JS, "table.kernels")
    assert fit["scroll"] <= fit["box"] and fit["table"] <= fit["box"], fit
    # ... with the roofline columns of the report's top kernels (flops.kernels, joined by name)
    heads = page.eval_on_selector_all("table.kernels thead th", "els => els.map(e => e.textContent)")
    assert any(x.startswith("TFLOP/s") for x in heads) and any(x.startswith("Bound") for x in heads), heads
    bounds = page.eval_on_selector_all("table.kernels tbody td", "els => els.map(e => e.textContent)")
    assert "compute" in bounds or "memory" in bounds, bounds[:20]
    lim = page.eval_on_selector_all("td.lim", """els => els.map(td => ({text: td.textContent,
        over: td.scrollWidth > td.clientWidth, right: td.getBoundingClientRect().right,
        boxRight: td.closest('.table-scroll').getBoundingClientRect().right}))""")
    both = [x for x in lim if x["text"] == "registers+shared_memory"]
    assert both, [x["text"] for x in lim]
    for x in lim:
        assert not x["over"] and x["right"] <= x["boxRight"] + 0.5, x

    # memory: the folded CPU chart's summary carries its peak (the report's number)
    status, body = http_get(f"{base}/data/plugin/bottlenecks/report?run={RUN}")
    assert status == 200
    peak = json.loads(body)["memory"]["cpu"]["peak_allocated_bytes"]
    assert peak == 16  # the trace's CPU [memory] events: 16 B at most
    summaries = page.eval_on_selector_all("details.mem-more > summary", "els => els.map(e => e.textContent)")
    assert summaries == ["CPU (host) memory \u00b7 peak 16 B"], summaries
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "bottlenecks_panels_1280.png"), full_page=True)
    w.check_clean()
