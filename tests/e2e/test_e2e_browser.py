"""End to end: a real `tensorboard --logdir` over demo_logs (plus a trace whose kernel and
operator are named like HTML, conftest.write_html_names_trace), a real headless Chromium
(Debian's, driven by Playwright), the Bottlenecks tab inside TensorBoard's iframe.

Checks, on each GPU demo run, that every headline card shows the route's number and every
chart draws SVG marks; that "Open view in new tab" opens that view; that a kernel named like
an HTML tag is shown as text; and that the page loads nothing from another origin.
Screenshots go to test-artifacts/ (git-ignored) for a person to look at.
"""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import (ARTIFACTS, DEMO_LOGS as DEMO, XSS_KERNEL as XSS, fmt_verdict_value, http_get, wait_route,
                      write_html_names_trace)

GPU_DEMO_RUNS = ("resnet50_v100_nw0", "resnet50_v100_nw4", "bert_h100_inference")
# Cards whose value the trace cannot give, with the reason the card must show instead:
# the 2021 V100 traces record [memory] events with Bytes only (no Total Reserved), so
# allocator slack is n/a there ("strict in what we show": n/a with a reason, never 0).
NA_CARDS = {("resnet50_v100_nw0", "Fragmentation"), ("resnet50_v100_nw4", "Fragmentation")}
# cards.js CARDS order; "Communication" and "Compilation" are optional cards, left out when their
# value is n/a or 0 (one GPU; an eager run).
CARDS = ("Input-bound", "GPU utilization", "Tensor Cores", "MFU", "Est. achieved occupancy", "Peak memory",
         "Fragmentation", "Synchronisation", "Short kernels")


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory, tensorboard_server):
    """A real TensorBoard (conftest.tensorboard_server) over every demo_logs run plus `xss`."""
    logdir = tmp_path_factory.mktemp("logdir")
    for run in sorted(p for p in DEMO.iterdir() if p.is_dir()):
        shutil.copytree(run, logdir / run.name)  # copies: directory symlinks out of the logdir are skipped
    write_html_names_trace(logdir / "xss" / "worker0.1700000000000.pt.trace.json")
    return tensorboard_server(logdir)


# Per panel (by its title): the number of drawn SVG marks (rect/path/line/polyline/circle
# with a non-zero box) inside it, and the number of kernel table rows.
MARKS_JS = """() => {
  const out = {};
  for (const sec of document.querySelectorAll("section.panel")) {
    const title = (sec.querySelector("h2") || {}).textContent || "";
    let marks = 0;
    for (const el of sec.querySelectorAll("svg rect, svg path, svg line, svg polyline, svg circle")) {
      let box;
      try { box = el.getBBox(); } catch (e) { continue; }
      if ((box.width > 0 || box.height > 0) && getComputedStyle(el).display !== "none") marks++;
    }
    out[title] = {marks, rows: sec.querySelectorAll("table.kernels tbody tr td.kname").length,
                  text: sec.textContent.slice(0, 300)};
  }
  return out;
}"""


def _select_run(frame, run):
    frame.locator("#bn-run").select_option(run)
    frame.locator(".card").first.wait_for(timeout=60_000)


def test_gpu_demo_runs_show_every_number_and_draw_every_chart(tensorboard, browser_page):
    """demo_logs' GPU runs in a real TensorBoard: every headline card has a number and every
    chart section has drawn SVG marks (the check that would have caught the ts_ms bug: the
    memory chart drew nothing while the Peak memory card read 2.60 GiB)."""
    base = tensorboard
    reports = {run: wait_route(base, "report", run=run) for run in GPU_DEMO_RUNS}
    ARTIFACTS.mkdir(exist_ok=True)
    w = browser_page(base)
    page = w.page
    frame = w.open_tab()
    for run in GPU_DEMO_RUNS:
        report = reports[run]
        _select_run(frame, run)
        iframe = next(f for f in page.frames if "plugin" in f.url)
        # Wait for the async parts: the memory chart and the kernel table.
        iframe.wait_for_function("() => document.querySelector('.memory-body svg') && "
                                 "document.querySelector('table.kernels tbody td.kname')", timeout=60_000)
        cards = iframe.evaluate("""() => [...document.querySelectorAll('.card')].map(c => ({
            label: c.querySelector('.card-label').firstChild.textContent,
            value: c.querySelector('.card-value').textContent,
            verdict: (c.querySelector('.card-verdict') || {}).textContent || ''}))""")
        assert [c["label"] for c in cards] == list(CARDS), cards
        for c in cards:
            if (run, c["label"]) in NA_CARDS:
                assert c["value"] == "n/a" and len(c["verdict"]) > 10, (run, c)
            else:
                assert c["value"] != "n/a" and any(ch.isdigit() for ch in c["value"]), (run, c)
        # Values are the route's numbers, with their unit.
        by_label = {c["label"]: c for c in cards}
        assert by_label["Input-bound"]["value"] == f"{report['input']['input_bound_pct']:.1f}%"
        assert by_label["GPU utilization"]["value"] == f"{report['gpu']['0']['utilization_pct']:.1f}%"
        assert by_label["Tensor Cores"]["value"] == f"{report['tensor_cores']['tensor_core_pct']:.1f}%"
        assert by_label["MFU"]["value"] == f"{report['flops']['mfu_pct']:.1f}%"
        assert by_label["MFU"]["verdict"] == report["verdicts"]["mfu"]["verdict"]
        assert by_label["Peak memory"]["value"] == _fmt_bytes(report["memory"]["cuda:0"]["peak_allocated_bytes"])
        marks = iframe.evaluate(MARKS_JS)
        for title in ("Memory over time", "Step-time breakdown", "Occupancy"):
            assert marks[title]["marks"] >= 3, (run, title, marks[title])
        assert marks["Kernels"]["rows"] >= 5, (run, marks["Kernels"])
        # The memory curves span the trace (ms since its start), not one point at 0.
        xs = iframe.evaluate("""() => [...document.querySelectorAll('.memory-body svg path')]
            .map(p => p.getBBox().width).sort((a, b) => b - a)[0]""")
        assert xs > 100, (run, xs)
        # Span label "span 1 · HH:MM:SS", the full id on hover.
        span_opt = iframe.evaluate("() => { const o = document.querySelector('#bn-span option:checked');"
                                   " return [o.textContent, o.title]; }")
        assert span_opt[0].startswith("span 1 · ") and report["span"] in span_opt[1], span_opt
        page.screenshot(path=str(ARTIFACTS / f"bottlenecks_{run}.png"), full_page=True)
    # Words, not keys, in the "Not available" list; CPU reserved memory never shown as 0 B.
    na_text = iframe.evaluate("() => (document.querySelector('.na-list') || {}).textContent || ''")
    assert "memory.cpu." not in na_text and "_pct" not in na_text, na_text
    # one line per cause (issue 20 item 10): as many items as distinct reasons in the report
    causes = iframe.evaluate("() => [...document.querySelectorAll('.na-list > li')].map((li) => li.dataset.keys.split(' '))")
    assert sorted(k for keys in causes for k in keys) == sorted(report["not_available"]), causes
    assert len(causes) == len(set(report["not_available"].values())), causes
    assert "peak reserved 0 B" not in iframe.evaluate("() => document.body.textContent")
    page.close()
    w.check_clean()


def test_open_view_in_new_tab_link(tensorboard, browser_page, chromium):
    """The share link is an absolute URL of the plugin's own page with the view in the hash:
    opened on its own it answers 200 and shows that view (it used to 404 under <base>)."""
    base = tensorboard
    wait_route(base, "report", run="resnet50_v100_nw4")
    w = browser_page(base)
    page = w.page
    frame = w.open_tab()
    _select_run(frame, "resnet50_v100_nw4")
    href = frame.locator("a.share").get_attribute("href")
    assert href.startswith(base + "/data/plugin_entry.html?name=bottlenecks#"), href
    assert "run=resnet50_v100_nw4" in href
    tab = chromium.new_page(viewport={"width": 1280, "height": 800})
    tab.on("pageerror", lambda e: w.errors.append(str(e)))
    resp = tab.goto(href, wait_until="domcontentloaded")
    assert resp.status == 200
    tab.locator(".card").first.wait_for(timeout=60_000)
    assert tab.locator("#bn-run").input_value() == "resnet50_v100_nw4"
    assert tab.url.startswith(base + "/data/plugin_entry.html")
    tab.close()
    page.close()
    w.check_clean()


def test_trace_strings_stay_text(tensorboard, browser_page):
    """A kernel named like an HTML tag is shown as text; nothing from another origin loads."""
    base = tensorboard
    wait_route(base, "report", run="xss")
    ARTIFACTS.mkdir(exist_ok=True)
    w = browser_page(base)
    page = w.page
    frame = w.open_tab()
    _select_run(frame, "xss")
    iframe = next(f for f in page.frames if "plugin" in f.url)
    # The kernel table shows the name as text (long names may sit in a title too).
    iframe.wait_for_function(
        "(name) => [...document.querySelectorAll('td, [title]')].some("
        "e => e.textContent.includes(name) || (e.getAttribute('title') || '').includes(name))",
        arg=XSS, timeout=60_000)
    # ... and as text only: no <img src=x> (kernel) or #injected (operator) element exists and no alert fired.
    assert iframe.evaluate("document.querySelectorAll('img[src=\"x\"], #injected').length") == 0
    page.screenshot(path=str(ARTIFACTS / "bottlenecks_xss_kernel.png"), full_page=True)
    page.close()
    w.check_clean()


# format.js fmtBytes, mirrored on the server for the straggler advice (ranks._bytes_words):
# the drawn card must read exactly what the server writes.
from tb_bottleneck_plugin.views.ranks import _bytes_words as _fmt_bytes  # noqa: E402
from tb_bottleneck_plugin.views import headline  # noqa: E402




# cards.js `optional`: left out when the value is null or 0 (the server's card list says which)
OPTIONAL_CARDS = {c["id"] for c in headline.card_list() if c["optional"]}
CARD_STATE_JS = """() => [...document.querySelectorAll('.card[data-card]')].map(c => ({
    id: c.getAttribute('data-card'), cls: [...c.classList].filter(k => k.startsWith('sev-')),
    value: c.querySelector('.card-value').textContent,
    verdict: (c.querySelector('.card-verdict') || {}).textContent || '',
    title: c.getAttribute('title') || ''}))"""


def test_every_card_colour_is_the_servers_verdict(tensorboard, browser_page):
    """Issue 11 item 2: on every demo_logs run (and the xss run) in a real TensorBoard, every
    card's colour class is `sev-<report.verdicts[id].severity>` of the real report route for the
    selection on screen, its number and words are the verdict's, and the thresholds named in its
    hover text are thresholds.py's constants with thresholds.py's values. The frontend decides
    nothing: a card coloured by any other rule fails here."""
    from tb_bottleneck_plugin import thresholds as T

    base = tensorboard
    runs = sorted(p.name for p in DEMO.iterdir() if p.is_dir()) + ["xss"]
    seen = {}
    w = browser_page(base)
    page = w.page
    for run in runs:
        wait_route(base, "report", run=run)
        page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#run={run}", wait_until="domcontentloaded")
        page.locator(".card[data-card]").first.wait_for(timeout=60_000)
        assert page.locator("#bn-run").input_value() == run
        worker, span = page.locator("#bn-worker").input_value(), page.locator("#bn-span").input_value()
        q = f"run={run}" + (f"&worker={worker}" if worker and worker != "all" else "") + \
            (f"&span={span}" if span and span != "all" else "")
        status, body = http_get(f"{base}/data/plugin/bottlenecks/report?{q}", timeout=60)
        assert status == 200, (q, status)
        verdicts = json.loads(body)["verdicts"]
        cards = page.evaluate(CARD_STATE_JS)
        shown = {c["id"] for c in cards}
        # cards the server marks n/a for a CPU-only trace (na_cause) are one folded line (cards.js)
        folded = set(" ".join(page.evaluate("() => [...document.querySelectorAll('.cards-folded')]"
                                            ".map(p => p.getAttribute('data-folded'))")).split())
        assert folded == {i for i, v in verdicts.items() if v.get("na_cause") == "cpu_only"}, (run, folded)
        hidden = set(verdicts) - shown - folded
        assert hidden <= OPTIONAL_CARDS and all(verdicts[i]["value"] in (None, 0) for i in hidden), (run, hidden)
        assert shown <= set(verdicts), (run, shown - set(verdicts))
        for c in cards:
            v = verdicts[c["id"]]
            assert c["cls"] == [f"sev-{v['severity']}"], (run, c, v)
            assert c["value"] == fmt_verdict_value(v), (run, c, v)
            assert c["verdict"] == v["verdict"], (run, c, v)
            named = dict(kv.split(" = ") for kv in c["title"].split("Thresholds (thresholds.py): ", 1)[1]
                         .split("\n", 1)[0].split(" · "))
            assert set(named) == set(v["thresholds"]) and named, (run, c["id"], named)
            for name, text in named.items():
                assert float(text) == getattr(T, name) == v["thresholds"][name], (run, name, text)
            seen.setdefault(v["severity"], set()).add((run, c["id"]))
        if run == "input_bound_nw0":
            page.screenshot(path=str(ARTIFACTS / "bottlenecks_cards_input_bound_nw0.png"), full_page=False)
    # A verdict the dashboard has no descriptor for (a new metric) still gets its card, coloured
    # and worded by the server: adding a metric needs no frontend change.
    toy = page.evaluate("""async () => { const m = await import('./static/cards.js');
      const row = m.cardRow({verdicts: {toy_metric: {value: 12.34, unit: 'pct', severity: 'medium',
        verdict: 'toy words', thresholds: {}, rule: null}}});
      return [...row.querySelectorAll('.card[data-card=toy_metric]')].map(c => [c.className,
        c.querySelector('.card-label').textContent, c.querySelector('.card-value').textContent,
        c.querySelector('.card-verdict').textContent]); }""")
    assert toy == [["card sev-medium", "Toy metric", "12.3%", "toy words"]], toy
    # The demo runs exercise several colours (the check above is not vacuous).
    assert {"high", "ok", "na"} <= set(seen), {k: len(x) for k, x in seen.items()}
    assert ("resnet50_v100_nw0", "input_bound") in seen["high"] and ("input_fixed_nw4", "input_bound") in seen["ok"]
    page.close()
    w.check_clean()
