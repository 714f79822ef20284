"""End to end: the Step timeline panel in a real TensorBoard and a real headless Chromium.

On the demo's input-bound run (demo_logs/input_bound_nw0, num_workers=0, no GPU) the
timeline of one span draws its slowest step; the shaded "waiting for input" share equals
that step's input-bound % of the report exactly and the span's input-bound card within
1 pp; wheel zoom asks the server for a narrower window, reset brings the whole step back,
and the export link downloads that step as a Chrome trace; in the dark theme the canvas is
drawn in style.css's dark --tl-* colours (read at draw time, redrawn on the theme change).
On a hand-built run whose kernel and op are named like HTML, the names stay text (hover box
textContent, no element, no dialog). On a hand-built HIP run the runtime lane and the legend
say HIP, and the lanes with no event in the step are not drawn (the legend says how many).
"""
from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from conftest import ARTIFACTS, TraceBuilder, http_get, link_demo_run, route_validator, wait_route

RUN = "input_bound"
HTML_RUN = "html_names"
HIP_RUN = "hip_calls"
EVIL = '<img src=x onerror="alert(1)">'
PANEL = "#bn-panel-timeline"
LABEL_W, AXIS_H, LANE_H = 190, 22, 18  # static/timeline.js layout


def _logdir(tmp_path):
    link_demo_run(tmp_path / "logs", RUN)
    b = TraceBuilder()
    for n, off in ((1, 0), (2, 1000)):
        b.step(n, off, 1000)
        b.cpu(EVIL, off + 10, 900)
        b.launch(EVIL, off + 20, kernel_ts=off + 100, kernel_dur=800)
    b.write(tmp_path / "logs" / HTML_RUN / "worker0.1700000000000.pt.trace.json.gz")
    # ROCm-like: hip* calls, no deviceProperties; a second thread busy in step 1 only, and the
    # slowest step (2, the default) has no DataLoader either: two lanes empty in it
    b = TraceBuilder(props=())
    b.step(1, 0, 1000)
    b.cpu("aten::mm", 10, 300)
    b.launch("Cijk_Ailk_Bljk_SB_MT64x64x16_MI16x16x1", 20, kernel_ts=100, kernel_dur=200, call="hipLaunchKernel")
    b.cpu("loader_thread_work", 400, 300, tid=2)
    b.step(2, 1000, 1500)
    b.cpu("aten::mm", 1010, 300)
    b.launch("Cijk_Ailk_Bljk_SB_MT64x64x16_MI16x16x1", 1020, kernel_ts=1100, kernel_dur=900, call="hipLaunchKernel")
    b.runtime("hipDeviceSynchronize", 1400, 700)
    b.write(tmp_path / "logs" / HIP_RUN / "worker0.1700000000001.pt.trace.json.gz")
    return tmp_path / "logs"


def _wait_drawn(iframe, timeout=120_000):
    iframe.wait_for_function(
        "() => { const c = document.querySelector('%s canvas.tl-canvas');"
        " return c && Number(c.dataset.rects) > 0; }" % PANEL, timeout=timeout)


def _canvas_colours(iframe, colours):
    """How many canvas pixels have each of the given #rrggbb colours (alpha 255)."""
    return iframe.evaluate("""(cols) => {
      const c = document.querySelector('%s canvas.tl-canvas');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const want = cols.map((x) => [1, 3, 5].map((i) => parseInt(x.slice(i, i + 2), 16)));
      const n = cols.map(() => 0);
      for (let p = 0; p < d.length; p += 4) {
        if (d[p + 3] !== 255) continue;
        want.forEach((w, k) => { if (d[p] === w[0] && d[p + 1] === w[1] && d[p + 2] === w[2]) n[k]++; });
      }
      return n;
    }""" % PANEL, colours)


def test_timeline_panel(tmp_path, tensorboard_server, browser_page):
    base = tensorboard_server(_logdir(tmp_path))
    w = browser_page(base, viewport=(1400, 1000))
    frame = w.open_tab()
    frame.locator("#bn-run").select_option(RUN)
    iframe = w.plugin_frame()
    iframe.wait_for_function("() => [...document.querySelectorAll('#bn-span option')].length > 2", timeout=120_000)
    spans = iframe.evaluate("() => [...document.querySelectorAll('#bn-span option')].map((o) => o.value)"
                            ".filter((v) => v && v !== 'all')")
    worker = iframe.evaluate("() => document.querySelector('#bn-worker').value")
    iframe.select_option("#bn-span", spans[0])
    sel = {"run": RUN, "span": spans[0]}
    if worker and worker != "all":
        sel["worker"] = worker
    _wait_drawn(iframe)

    # the route's answer for this selection: schema, default = the slowest included step
    body = wait_route(base, "timeline", px=900, **sel)
    assert not list(route_validator("timeline").iter_errors(body))
    report = wait_route(base, "report", **sel)
    per = {p["step"]: p for p in report["input"]["per_step"]}
    assert body["step"] == max(per, key=lambda n: per[n]["step_us"])
    assert iframe.evaluate("() => document.querySelector('%s select.tl-step').value" % PANEL) == str(body["step"])

    # the shaded input wait: the report's per-step input-bound % exactly, the card within 1 pp
    legend = iframe.evaluate("""() => { const e = document.querySelector('%s [data-cause=input_wait]');
      return {pct: Number(e.dataset.pct), drawn: Number(e.dataset.drawnPct), text: e.textContent}; }""" % PANEL)
    assert legend["pct"] == pytest.approx(per[body["step"]]["input_bound_pct"], abs=1e-9)
    assert legend["drawn"] == pytest.approx(legend["pct"], abs=1e-6)  # what the drawn rectangles add up to
    assert "waiting for input" in legend["text"]
    card_text = iframe.evaluate("() => document.querySelector('[data-card=input_bound] .card-value').textContent")
    card = float(re.search(r"[\d.]+", card_text).group(0))
    assert card == pytest.approx(report["input"]["input_bound_pct"], abs=0.05)
    assert abs(legend["pct"] - card) < 1.0, (legend, card_text)
    shown = float(re.search(r"([\d.]+)\s*%", legend["text"]).group(1))
    assert abs(shown - card) < 1.0

    # drawn: DataLoader lane busy, and the same time shaded as waiting for input (the light
    # theme's --tl-dataloader / --tl-input-wait of style.css)
    dl, wait = _canvas_colours(iframe, ["#f28e2b", "#e15759"])
    assert dl > 500 and wait > 500, (dl, wait)
    ARTIFACTS.mkdir(exist_ok=True)
    iframe.locator(PANEL).screenshot(path=str(ARTIFACTS / "timeline_input_bound.png"))

    # the dark theme: the canvas is redrawn in style.css's dark --tl-* values, none of the light ones
    dark = iframe.evaluate("""() => { document.documentElement.setAttribute('data-theme', 'dark');
      const css = getComputedStyle(document.documentElement);
      return ['--tl-dataloader', '--tl-input-wait', '--tl-input-wait-ink'].map((n) => css.getPropertyValue(n).trim()); }""")
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in dark) and dark[:2] != ["#f28e2b", "#e15759"], dark
    iframe.wait_for_function("(c) => JSON.parse(document.querySelector('%s canvas.tl-canvas').dataset.causeText)"
                             ".shade.input_wait === c" % PANEL, arg=dark[1], timeout=30_000)
    ct = json.loads(iframe.evaluate("() => document.querySelector('%s canvas.tl-canvas').dataset.causeText" % PANEL))
    assert ct["color"]["input_wait"] == dark[2]
    dl_d, wait_d, dl_l, wait_l = _canvas_colours(iframe, dark[:2] + ["#f28e2b", "#e15759"])
    assert dl_d > 500 and wait_d > 500 and dl_l == 0 and wait_l == 0, (dl_d, wait_d, dl_l, wait_l)
    swatch = iframe.evaluate("() => getComputedStyle(document.querySelector('%s [data-cause=input_wait] span'))"
                             ".backgroundColor" % PANEL)
    assert swatch == "rgb(%d, %d, %d)" % tuple(int(dark[1][i:i + 2], 16) for i in (1, 3, 5))
    iframe.locator(PANEL).screenshot(path=str(ARTIFACTS / "timeline_input_bound_dark.png"))
    iframe.evaluate("() => document.documentElement.setAttribute('data-theme', 'light')")
    iframe.wait_for_function("() => JSON.parse(document.querySelector('%s canvas.tl-canvas').dataset.causeText)"
                             ".shade.input_wait === '#e15759'" % PANEL, timeout=30_000)

    # the theme follows TensorBoard's own dark mode (index.js sets data-theme from the host's
    # body.dark-mode; style.css has one dark palette, under data-theme="dark")
    w.page.evaluate("() => document.body.classList.add('dark-mode')")
    iframe.wait_for_function("() => document.documentElement.getAttribute('data-theme') === 'dark'", timeout=30_000)
    iframe.wait_for_function("(c) => JSON.parse(document.querySelector('%s canvas.tl-canvas').dataset.causeText)"
                             ".shade.input_wait === c" % PANEL, arg=dark[1], timeout=30_000)
    w.page.evaluate("() => document.body.classList.remove('dark-mode')")
    iframe.wait_for_function("() => JSON.parse(document.querySelector('%s canvas.tl-canvas').dataset.causeText)"
                             ".shade.input_wait === '#e15759'" % PANEL, timeout=30_000)

    # wheel zoom asks the server for a narrower window; reset brings the whole step back
    iframe.locator(f"{PANEL} canvas.tl-canvas").scroll_into_view_if_needed()
    box = iframe.locator(f"{PANEL} canvas.tl-canvas").bounding_box()
    before = len([u for u in w.requests if "/timeline?" in u])
    full = iframe.evaluate("() => document.querySelector('%s canvas.tl-canvas').dataset.window" % PANEL)
    w.page.mouse.move(box["x"] + LABEL_W + (box["width"] - LABEL_W) / 2, box["y"] + AXIS_H + 5)
    for _ in range(3):
        w.page.mouse.wheel(0, -300)
    iframe.wait_for_function("(full) => document.querySelector('%s canvas.tl-canvas').dataset.window !== full"
                             % PANEL, arg=full, timeout=30_000)
    deadline_ok = False
    for _ in range(50):
        zoomed = [u for u in w.requests if "/timeline?" in u][before:]
        if zoomed:
            deadline_ok = True
            break
        w.page.wait_for_timeout(100)
    assert deadline_ok, "no timeline request after zooming"
    q = urllib.parse.parse_qs(urllib.parse.urlparse(zoomed[-1]).query)
    t0, t1 = float(q["t0"][0]), float(q["t1"][0])
    assert 0 <= t0 < t1 and t1 - t0 < body["step_us"] * 0.5
    iframe.click(f"{PANEL} button.tl-reset")
    iframe.wait_for_function("(full) => document.querySelector('%s canvas.tl-canvas').dataset.window === full"
                             % PANEL, arg=full, timeout=30_000)

    # the export link downloads that step as a Chrome trace
    href = iframe.evaluate("() => document.querySelector('%s a.tl-export').getAttribute('href')" % PANEL)
    assert href.startswith("./step_trace?") and f"step={body['step']}" in href
    status, raw = http_get(f"{base}/data/plugin/bottlenecks/{href[2:]}")
    assert status == 200
    doc = json.loads(raw)
    assert not list(route_validator("step_trace").iter_errors(doc))
    assert doc["otherData"]["step"] == body["step"]

    # a kernel and an op named like HTML stay text
    frame.locator("#bn-run").select_option(HTML_RUN)
    _wait_drawn(iframe)
    hb = wait_route(base, "timeline", run=HTML_RUN, px=900)
    rows = [lane for lane in hb["lanes"] if lane["kind"] != "idle"]
    gpu_row = next(i for i, lane in enumerate(rows) if lane["kind"] == "gpu")
    iframe.locator(f"{PANEL} canvas.tl-canvas").scroll_into_view_if_needed()
    box = iframe.locator(f"{PANEL} canvas.tl-canvas").bounding_box()
    w.page.mouse.move(box["x"] + LABEL_W + (box["width"] - LABEL_W) / 2,
                      box["y"] + AXIS_H + gpu_row * LANE_H + LANE_H / 2)
    iframe.wait_for_function("() => { const t = document.querySelector('%s .tl-tip');"
                             " return t && t.style.display === 'block'; }" % PANEL, timeout=30_000)
    tip = iframe.evaluate("() => document.querySelector('%s .tl-tip').textContent" % PANEL)
    assert tip.splitlines()[0] == EVIL and f"launched by CPU op: {EVIL}" in tip
    assert iframe.evaluate("() => document.querySelectorAll('img').length") == 0
    assert iframe.evaluate("() => document.querySelector('%s .tl-tip').children.length" % PANEL) == 0
    iframe.locator(PANEL).screenshot(path=str(ARTIFACTS / "timeline_html_names.png"))

    # a HIP run: the runtime lane and the legend say HIP; the lanes empty in the step are not drawn
    frame.locator("#bn-run").select_option(HIP_RUN)
    iframe.wait_for_function("() => { const c = document.querySelector('%s canvas.tl-canvas');"
                             " return c && c.dataset.layout && c.dataset.layout.includes('HIP runtime'); }" % PANEL,
                             timeout=120_000)
    hip = wait_route(base, "timeline", run=HIP_RUN, px=900)
    assert not list(route_validator("timeline").iter_errors(hip))
    assert hip["step"] == 2 and hip["runtime_api"] == "HIP" and hip["hidden_lanes"] == 2
    layout = json.loads(iframe.evaluate("() => document.querySelector('%s canvas.tl-canvas').dataset.layout" % PANEL))
    assert [r["label"] for r in layout["rows"]] == ["CPU main thread", "HIP runtime (thread 1)", "GPU 0 · stream 7", "idle"]
    assert all(r["rects"] > 0 for r in layout["rows"])  # no empty lane drawn
    kinds = iframe.evaluate("() => [...document.querySelectorAll('%s .tl-kind')].map((e) => e.textContent)" % PANEL)
    assert "HIP runtime call" in kinds and not any("CUDA" in k for k in kinds), kinds
    note = iframe.evaluate("() => { const e = document.querySelector('%s .tl-hidden');"
                           " return e && [e.dataset.hidden, e.textContent]; }" % PANEL)
    assert note and note[0] == "2" and note[1].startswith("2 lanes have no event in this step"), note
    # step 1: thread 2 is busy there, its lane is drawn; the DataLoader (none in the trace) is not
    iframe.select_option(f"{PANEL} select.tl-step", "1")
    iframe.wait_for_function("() => { const c = document.querySelector('%s canvas.tl-canvas');"
                             " return c && c.dataset.step === '1' && document.querySelector('%s .tl-hidden'); }"
                             % (PANEL, PANEL), timeout=60_000)
    layout = json.loads(iframe.evaluate("() => document.querySelector('%s canvas.tl-canvas').dataset.layout" % PANEL))
    assert "CPU thread 2" in [r["label"] for r in layout["rows"]] and "DataLoader" not in [r["label"] for r in layout["rows"]]
    assert iframe.evaluate("() => document.querySelector('%s .tl-hidden').dataset.hidden" % PANEL) == "1"
    iframe.locator(PANEL).screenshot(path=str(ARTIFACTS / "timeline_hip.png"))
    w.check_clean()
