"""End to end: the "Memory at the peak" panel (static/memory_peak_view.js, METRICS.md §7) in a
real TensorBoard and a real headless Chromium, on the shared GPT-2 H100 trace (profile_memory,
with_stack): the stacked bar's segments are the /report route's categories (shares of their
sum, which is the peak), the holders table its holders with module and line, the candidates
named; the memory curve marks the peak. No page or console errors, no request outside
TensorBoard."""
from __future__ import annotations

import os

import pytest

from conftest import TRACES, wait_route

GPT2 = TRACES / "h100" / "gpt2_bf16_eager" / "worker0.1795701567436882984.pt.trace.json.gz"

PANEL_JS = """() => {
  const p = document.querySelector('#bn-panel-memory_peak');
  return p && {
    devices: [...p.querySelectorAll('.mem-peak-device')].map((d) => d.dataset.device),
    segments: [...p.querySelectorAll('.split-seg')].map((s) => [s.dataset.category, parseFloat(s.style.width)]),
    rows: [...p.querySelectorAll('table.mem-holders tbody tr')].map((r) => [...r.children].map((c) => c.textContent)),
    text: p.innerText};
}"""


@pytest.mark.skipif(not GPT2.exists(), reason="needs ../shared/traces/h100")
def test_memory_peak_panel_in_the_tab(tmp_path, tensorboard_server, browser_page):
    run = tmp_path / "logs" / "gpt2"
    run.mkdir(parents=True)
    os.symlink(GPT2, run / GPT2.name)
    base = tensorboard_server(tmp_path / "logs")
    w = browser_page(base, viewport=(1280, 900))
    _, iframe = w.open_run("gpt2", ready=".card[data-card] .card-value")
    # the panel lives in the Memory section of the section bar (judge/layout.py), built when opened
    iframe.wait_for_function("() => document.querySelector('#bn-section-bar [data-section=memory]')", timeout=120_000)
    if iframe.evaluate("() => { const s = document.querySelector('#bn-section-memory'); return !s || s.hidden; }"):
        iframe.click("#bn-section-bar [data-section=memory]")
    iframe.wait_for_function("() => document.querySelector('#bn-panel-memory_peak .mem-peak-device')", timeout=120_000)
    got = iframe.evaluate(PANEL_JS)
    rep = wait_route(base, "report", run="gpt2")
    sec = rep["memory_peak"]["cuda:0"]
    assert got["devices"] == ["cuda:0"]
    cats = {k: v for k, v in sec["categories"].items() if v}
    assert sum(cats.values()) == sec["peak_allocated_bytes"]
    assert [c for c, _ in got["segments"]] == list(cats)
    for c, width in got["segments"]:
        assert width == pytest.approx(100 * cats[c] / sec["peak_allocated_bytes"], abs=0.01)
    assert [r[1:4] for r in got["rows"]] == [[h["op"], h["module"], h["line"]] for h in sec["holders"]]
    assert all(c["module"] in got["text"] for c in sec["checkpoint_candidates"])
    iframe.wait_for_function("() => document.querySelector('.mem-device .chart-marker[data-marker=\"peak\"]')",
                             timeout=60_000)
    w.check_clean()
