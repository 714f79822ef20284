"""End to end: the first screen of every demo run (issue 35) in a real TensorBoard and a real
headless Chromium at 1366x768, one TensorBoard and one browser page for all runs.

For each run of demo_logs, on its default view (the selection the tab opens, the default sections):
- without scrolling, the plugin frame's first viewport holds the server's headline sentence
  (report.verdict.sentence), and, unless the run reads healthy, the first fix (its code) and
  its predicted (or estimated) step time, as format.js writes the server's numbers;
- the page is at most 2.5 viewports tall (2.5 x 768 px);
- no card contradicts the headline: every card that warns is on the page (not folded into a
  group's line, not in "Not applicable"), a card of the fix's own rule warns on the page, and the
  "Not applicable" line lists exactly the server's not-applicable cards, none of them shown.
Then: with no address, the tab opens the server's default_run, which is the run whose newest
trace file was written last (os.stat, counted here); a section opened by a click is in the
address (router.js `open`) and open again after a reload.
"""
from __future__ import annotations

import os
import time

import pytest

from conftest import DEMO_LOGS, wait_route

VIEWPORT = (1366, 768)
MAX_VIEWPORTS = 2.5
RUNS = sorted(p.name for p in DEMO_LOGS.iterdir() if p.is_dir()) if DEMO_LOGS.is_dir() else []

SCREEN_JS = """() => {
  const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, text: e.textContent}; };
  const na = document.querySelector('.cards-na');
  return {scrollY: window.scrollY, inner: window.innerHeight, height: document.documentElement.scrollHeight,
    sentence: box('#bn-verdict .verdict-sentence'), fix: box('#bn-verdict .verdict-fix'),
    code: box('#bn-verdict .verdict-code'), after: box('#bn-verdict .verdict-after'),
    cards: [...document.querySelectorAll('[data-card]')].map((e) => [e.dataset.card, e.dataset.severity]),
    na: na ? na.dataset.notApplicable.split(' ') : [],
    open: [...document.querySelectorAll('.bn-section:not([hidden])')].map((e) => e.dataset.section)};
}"""


def _selection(frame):
    sel = frame.evaluate("() => ({run: document.querySelector('#bn-run').value,"
                         " worker: document.querySelector('#bn-worker').value,"
                         " span: document.querySelector('#bn-span').value})")
    return {k: v for k, v in sel.items() if v and v != "all"}


def _newest_run():
    """The run whose newest trace file was modified last, from the file system itself."""
    def newest(run):
        return max(os.stat(os.path.join(d, f)).st_mtime for d, _, fs in os.walk(DEMO_LOGS / run)
                   for f in fs if ".pt.trace.json" in f)
    return max(RUNS, key=newest)


def _check_screen(frame, run, rep):
    s = frame.evaluate(SCREEN_JS)
    v = rep["verdict"]
    assert s["scrollY"] == 0, (run, s["scrollY"])
    # the headline, in the first viewport
    assert s["sentence"] and v["sentence"] in s["sentence"]["text"], (run, s["sentence"], v["sentence"])
    assert s["sentence"]["bottom"] <= s["inner"], (run, s["sentence"], s["inner"])
    if v["healthy"]:
        assert s["fix"] is None, run
    else:
        fix = v["fix"]
        assert s["fix"] and s["fix"]["bottom"] <= s["inner"], (run, s["fix"])
        if fix["code"]:
            assert s["code"]["text"] == fix["code"], (run, s["code"], fix["code"])
        want = frame.evaluate("async ([a, b]) => (await import('./static/format.js')).fmtStepMsChange(a, b)",
                              [fix["step_ms"], fix["predicted_step_ms"]])
        assert s["after"] and want in s["after"]["text"] and s["after"]["bottom"] <= s["inner"], (run, s["after"], want)
        assert ("estimated" if fix["estimate"] else "predicted") in s["after"]["text"], (run, s["after"])
    # at most 2.5 viewports of the browser window
    assert s["height"] <= MAX_VIEWPORTS * VIEWPORT[1], (run, s["height"], s["open"])
    # no card contradicts the headline
    verdicts, layout = rep["verdicts"], rep["layout"]
    shown = dict(s["cards"])
    for cid, x in verdicts.items():
        if x["severity"] in ("high", "medium", "low"):
            assert shown.get(cid) == x["severity"], (run, cid, x["severity"], shown.get(cid))
    own = [c for c, x in verdicts.items() if not v["healthy"] and x.get("rule") == v["fix"]["rule"]]
    if own:  # the headline's rule: one of its cards warns, on the page
        assert any(shown.get(c) in ("high", "medium", "low") for c in own), (run, v["fix"]["rule"], own, shown)
    na = [x["id"] for x in layout["not_applicable"]]
    assert sorted(s["na"] if na else []) == sorted(na), (run, s["na"], na)
    assert not set(na) & set(shown), (run, set(na) & set(shown))
    # the sections open by default are the server's
    assert s["open"] == [x["id"] for x in layout["sections"] if x["open"]], (run, s["open"])
    return s


@pytest.mark.skipif(not RUNS, reason="demo_logs missing")
def test_first_screen_of_every_demo_run(tensorboard_server, browser_page):
    base = tensorboard_server(DEMO_LOGS)
    runs_body = wait_route(base, "runs")
    deadline = time.time() + 120
    # the first scan runs in the background: the runs route answers at once, "pending" or
    # "scanning" with no runs yet, and the dashboard polls it again (static/index.js), as here
    while runs_body["scan"]["state"] in ("pending", "scanning") and time.time() < deadline:
        time.sleep(0.2)
        runs_body = wait_route(base, "runs")
    assert runs_body["default_run"] == _newest_run()
    for run in RUNS:  # analysed before the page asks (the first screen, not the loading state)
        wait_route(base, "report", timeout=900, run=run)
    w = browser_page(base, viewport=VIEWPORT, all_sections=False)
    w.open_tab()
    frame = w.plugin_frame()
    # no address: the run written last
    frame.wait_for_function("(r) => document.querySelector('#bn-run').value === r && document.querySelector('#bn-verdict')",
                            arg=runs_body["default_run"], timeout=120_000)
    heights = {}
    for run in RUNS:
        frame.evaluate("(r) => { const s = document.querySelector('#bn-run'); s.value = r;"
                       " s.dispatchEvent(new Event('change')); }", run)
        frame.wait_for_function("(r) => document.querySelector('#bn-run').value === r && document.querySelector('#bn-verdict')"
                                " && !document.querySelector('.state-loading')", arg=run, timeout=120_000)
        frame.evaluate("() => new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)))")
        rep = wait_route(base, "report", **_selection(frame))
        heights[run] = _check_screen(frame, run, rep)["height"]
    print("default page heights (px):", heights)
    # a section opened by a click is in the address, and open again after a reload
    run = "h100_fp32_matmul" if "h100_fp32_matmul" in RUNS else RUNS[0]
    frame.evaluate("(r) => { const s = document.querySelector('#bn-run'); s.value = r; s.dispatchEvent(new Event('change')); }", run)
    frame.wait_for_function("(r) => document.querySelector('#bn-run').value === r && document.querySelector('#bn-section-bar')",
                            arg=run, timeout=120_000)
    frame.click("#bn-section-bar [data-section=memory]")
    frame.wait_for_function("() => /open=[^&]*memory/.test(decodeURIComponent(location.hash))")
    assert frame.evaluate("() => !document.querySelector('#bn-section-memory').hidden")
    frame.evaluate("() => location.reload()")
    w.page.wait_for_timeout(500)
    frame = w.plugin_frame()
    frame.wait_for_function("(r) => document.querySelector('#bn-run') && document.querySelector('#bn-run').value === r"
                            " && document.querySelector('#bn-section-memory') && !document.querySelector('#bn-section-memory').hidden",
                            arg=run, timeout=120_000)
    w.check_clean()
