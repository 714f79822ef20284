"""The "Memory at the peak" panel (static/memory_peak_view.js) in the offline HTML report of the
shared GPT-2 H100 trace: it renders the server's numbers (the stacked bar's segments are the
report's categories, the holders table its holders), decides nothing itself."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

GPT2 = REPO.parent / "shared" / "traces" / "h100" / "gpt2_bf16_eager"

PANEL_JS = """() => {
  const p = document.querySelector('#bn-panel-memory_peak');
  if (!p) return null;
  return {
    devices: [...p.querySelectorAll('.mem-peak-device')].map((d) => d.dataset.device),
    segments: [...p.querySelectorAll('.split-seg')].map((s) => [s.dataset.category, parseFloat(s.style.width)]),
    ops: [...p.querySelectorAll('table.mem-holders tbody tr')].map((r) => r.children[1].textContent),
    text: p.innerText,
    steps: [...p.querySelectorAll('table.mem-peak-steps-table tbody tr')].map((r) => r.children[0].textContent),
  };
}"""


@pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/traces/h100")
def test_memory_peak_panel_renders_the_reports_live_set(tmp_path, chromium):
    out = tmp_path / "gpt2.html"
    trace = next(GPT2.glob("*.pt.trace.json.gz"))
    for args in (["report", str(GPT2), "--html", str(out)], ["report", str(trace), "--json"]):
        done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", *args], capture_output=True,
                              text=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stderr[-2000:]
    sec = json.loads(done.stdout)["memory_peak"]["cuda:0"]
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(out.resolve().as_uri())
        page.locator("#bn-panel-memory_peak .mem-peak-device").first.wait_for(timeout=60_000)
        got = page.evaluate(PANEL_JS)
        # the peak's instant is marked on the memory curve of that device
        page.locator(".mem-device .chart-marker").first.wait_for(timeout=30_000)
        markers = page.evaluate("() => [...document.querySelectorAll('.mem-device .chart-marker')]"
                                ".map((g) => g.dataset.marker)")
    finally:
        page.close()
    assert not errors, errors
    assert got["devices"] == ["cuda:0"]  # the host's bytes beside a GPU are left out
    cats = {k: v for k, v in sec["categories"].items() if v}
    total = sum(cats.values())
    assert [c for c, _ in got["segments"]] == list(cats)
    for c, width in got["segments"]:
        assert width == pytest.approx(100 * cats[c] / total, abs=0.01), c
    assert got["ops"] == [h["op"] for h in sec["holders"]]
    for c in sec["checkpoint_candidates"]:
        assert c["module"] in got["text"]
    assert "estimate" in got["text"]
    assert "peak" in markers
    assert got["steps"] == [str(r["step"]) for r in sec["per_step"]] == ["2", "3", "4"]


def test_memory_peak_panel_lists_the_snapshots_blocks(tmp_path, chromium):
    """With a CUDA memory snapshot in the run directory the panel lists its largest blocks
    and their frames, as text (the frames come from the pickle)."""
    import pickle

    from tests.analysis.test_memory_peak import _snapshot
    from tests.trace_builder import H100, TraceBuilder

    tb = TraceBuilder(props=(H100,))
    tb.step(1, 0, 100)
    tb.memory(10, 800, 1, 800, reserved=2000).memory(20, -800, 1, 0, reserved=2000)
    run = tmp_path / "run"
    tb.write(run / "worker0.1700000000000.pt.trace.json")
    (run / "memory_snapshot.pickle").write_bytes(pickle.dumps(_snapshot(1200)))
    out = tmp_path / "snap.html"
    done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(run), "--html", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(out.resolve().as_uri())
        rows = page.locator("#bn-panel-memory_peak table.mem-snapshot-blocks tbody tr")
        rows.first.wait_for(timeout=60_000)
        texts = rows.all_inner_texts()
    finally:
        page.close()
    assert not errors, errors
    assert len(texts) == 2 and texts[0].startswith("600 B") and "train.py(42): step" in texts[0]
