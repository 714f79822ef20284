"""End to end: the "What would each fix buy?" panel (static/what_if.js, report.step_model,
METRICS.md §19) in a real TensorBoard and a real headless Chromium, and in the single-file
HTML report.

- demo_logs/bert_h100_inference (H100, GPU work): the waterfall's rows are "Today" (the server's
  step_ms), then one row per `step_model.what_if` row with a saving, in the server's order, with
  its label, predicted step and saving (the tab's own format.js), then "All fixes" (=
  `all_fixes.predicted_step_ms`); the roofline ceiling apart, as a bound; the critical path's
  parts per step, largest first; the model's error. A row that prices a recommendation that
  fired is a button: a click scrolls to that recommendation and highlights it. Each priced
  recommendation says "predicted step A → B ms (−G%)" from its own server numbers.
- demo_logs/input_bound_nw0 (CPU only): the panel says n/a with the server's reason.
- `tb-bottlenecks report RUN --html FILE`: the offline page draws the same rows.
- No page errors, no dialog, no request outside TensorBoard.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import DEMO_LOGS, REPO, link_demo_run, wait_route

GPU_RUN = "bert_h100_inference"
CPU_RUN = "input_bound_nw0"

ROWS_JS = """() => [...document.querySelectorAll('#bn-what-if .wf-row')].map((r) => ({
    id: r.dataset.id, cls: [...r.classList].filter((c) => c.startsWith('wf-') && c !== 'wf-row'),
    ms: r.dataset.ms === undefined ? null : Number(r.dataset.ms), title: r.getAttribute('title') || '',
    label: r.querySelector('.wf-label').textContent, value: r.querySelector('.wf-value').textContent,
    rule: r.dataset.rule || null, button: !!r.querySelector('button.wf-link'),
    bound: !!r.closest('.wf-bound')}))"""


def _selection(iframe):
    sel = iframe.evaluate("() => ({run: document.querySelector('#bn-run').value,"
                          " worker: document.querySelector('#bn-worker').value,"
                          " span: document.querySelector('#bn-span').value})")
    return {k: v for k, v in sel.items() if v and v != "all"}


def _fmt(frame, calls):
    """format.js's answers in the page itself: [[fn, args...], ...] -> [text, ...]."""
    return frame.evaluate("async (calls) => { const f = await import('./static/format.js');"
                          " return calls.map(([fn, ...args]) => f[fn](...args)); }", calls)


def _expected_rows(sm):
    """(id, label, predicted ms, saving ms) of the waterfall from the server's step_model."""
    n = sm["steps"]
    today = sm["all_fixes"]["step_ms"]
    rows = [("today", "Today", today, None)]
    rows += [(r["id"], r["label"], r["predicted_step_ms"], r["saving_us"] / n / 1000)
             for r in sm["what_if"] if (r["saving_us"] or 0) > 0]
    rows.append(("all_fixes", "All fixes", sm["all_fixes"]["predicted_step_ms"], sm["all_fixes"]["saving_us"] / n / 1000))
    return rows


def _check_waterfall(shown, sm, fmt):
    want = _expected_rows(sm)
    fixes = [r for r in shown if not r["bound"]]
    assert [(r["id"], r["label"]) for r in fixes] == [(i, lbl) for i, lbl, _, _ in want], fixes
    for r, (_, _, ms, _) in zip(fixes, want):
        assert r["ms"] == pytest.approx(ms, rel=1e-12), (r, ms)
    assert fixes[0]["cls"] == ["wf-today"] and fixes[-1]["cls"] == ["wf-all"]
    assert fixes[-1]["ms"] == pytest.approx(sm["all_fixes"]["predicted_step_ms"], rel=1e-12)
    # the texts: the tab's own formatter over the server's numbers
    by_id = {r["id"]: r for r in sm["what_if"]}
    texts = fmt([["fmtStepMs", ms] for _, _, ms, _ in want] + [["fmtStepMs", s] for _, _, _, s in want[1:]]
                + [["fmtPct", by_id[i]["saving_pct"]] for i, _, _, _ in want[1:-1]] + [["fmtPct", sm["all_fixes"]["saving_pct"]]])
    k = len(want)
    ms_text, saving_text, pct_text = texts[:k], texts[k:2 * k - 1], texts[2 * k - 1:]
    assert fixes[0]["value"] == ms_text[0]
    for i, r in enumerate(fixes[1:-1], start=1):
        assert r["value"] == f"−{saving_text[i - 1]} (−{pct_text[i - 1]}) → {ms_text[i]}", r
        assert r["title"].startswith(by_id[r["id"]]["assumption"]), r  # the assumption on hover
    assert fixes[-1]["value"] == f"−{saving_text[-1]} (−{pct_text[-1]}) → {ms_text[-1]}", fixes[-1]
    # the ceiling apart, greyed, a bound
    bound = [r for r in shown if r["bound"]]
    if sm.get("ceiling"):
        c = sm["ceiling"]
        assert len(bound) == 1 and bound[0]["id"] == c["id"] and bound[0]["label"] == f"Bound: {c['label']}"
        assert bound[0]["ms"] == pytest.approx(c["predicted_step_ms"], rel=1e-12) and not bound[0]["button"]
        assert "a bound" in bound[0]["value"]
    else:
        assert not bound


def _check_critical_path(frame, sm, fmt):
    n = sm["steps"]
    parts = sorted(((k, v) for k, v in sm["critical_path_us"].items() if v and v > 0), key=lambda kv: -kv[1])
    shown = frame.evaluate("() => [...document.querySelectorAll('#bn-what-if .wf-critical .wf-part')]"
                           ".map((e) => [e.dataset.part, e.textContent])")
    assert [k for k, _ in shown] == [k for k, _ in parts] and parts
    for (k, text), ms in zip(shown, fmt([["fmtStepMs", v / n / 1000] for _, v in parts])):
        assert text.endswith(" " + ms), (k, text, ms)
    line = frame.evaluate("() => document.querySelector('#bn-what-if .wf-critical').textContent")
    assert line.startswith("critical path:") and line.endswith("per step")
    err = frame.evaluate("() => document.querySelector('#bn-what-if .wf-error').textContent")
    assert err == f"model reproduces the measured step within {fmt([['fmtPct', abs(sm['model_error_pct'])]])[0]}"


def _element_before(frame):
    """The id of the element with an id right above the what-if panel in the page (issue 35: the
    verdict; the section bar, which has one too, is left out)."""
    return frame.evaluate("() => { const w = document.querySelector('#bn-what-if');"
                          " const all = [...document.querySelectorAll('[id]')].filter((e) => e !== w && !e.contains(w)"
                          " && e.id !== 'bn-section-bar' && (e.compareDocumentPosition(w) & Node.DOCUMENT_POSITION_FOLLOWING));"
                          " return all.length ? all[all.length - 1].id : null; }")


def _check_verdict(frame, rep):
    """The verdict on top says the server's sentence and first fix (judge/step_verdict.py)."""
    v = rep["verdict"]
    text = frame.evaluate("() => document.querySelector('#bn-verdict').textContent")
    assert v["sentence"] in text
    assert frame.evaluate("() => document.querySelector('#bn-verdict').dataset.healthy") == str(v["healthy"]).lower()
    if v["fix"] and v["fix"]["code"]:
        assert frame.evaluate("() => document.querySelector('#bn-verdict .verdict-code').textContent") == v["fix"]["code"]


def test_what_if_panel(tmp_path, tensorboard_server, browser_page):
    logs = tmp_path / "logs"
    link_demo_run(logs, GPU_RUN, GPU_RUN)
    link_demo_run(logs, CPU_RUN, CPU_RUN)
    base = tensorboard_server(logs)
    w = browser_page(base, viewport=(1280, 800))
    frame, iframe = w.open_run(GPU_RUN, ready="#bn-what-if .wf-row", timeout=120_000)
    rep = wait_route(base, "report", timeout=120, **_selection(iframe))
    sm = rep["step_model"]
    assert sm and sm["what_if"], rep.get("not_available")
    fmt = lambda calls: _fmt(iframe, calls)  # noqa: E731

    assert _element_before(iframe) == "bn-verdict"
    _check_verdict(iframe, rep)
    shown = iframe.evaluate(ROWS_JS)
    _check_waterfall(shown, sm, fmt)
    _check_critical_path(iframe, sm, fmt)

    # each priced recommendation: "predicted step A → B ms (−G%)" from its own numbers
    recs = rep["recommendations"]
    priced = [r for r in recs if r.get("predicted_step_ms") is not None and r.get("step_ms") is not None]
    lines = iframe.evaluate("() => [...document.querySelectorAll('ol.recs > li.rec')].map((li) =>"
                            " [li.dataset.rule, (li.querySelector('.rec-predicted') || {}).textContent || null])")
    assert [r for r, _ in lines] == [r["rule"] for r in recs]
    for r in priced:
        change, pct = fmt([["fmtStepMsChange", r["step_ms"], r["predicted_step_ms"]], ["fmtPct", r["estimated_gain_pct"]]])
        assert dict(lines)[r["rule"]] == f"predicted step {change} (−{pct})", (r, lines)

    # rows that price a fired recommendation are buttons to it; the others are plain labels
    fired = {r["rule"] for r in recs}
    by_what_if = {r["what_if"]: r["rule"] for r in recs if r.get("what_if")}
    for r in [x for x in shown if x["id"] in {y["id"] for y in sm["what_if"]}]:
        row = next(y for y in sm["what_if"] if y["id"] == r["id"])
        rules = [row["rule"]] if row.get("rule") else list(row.get("rules") or [])
        want = by_what_if.get(r["id"]) or next((x["rule"] for x in recs if x["rule"] in rules), None)
        assert r["rule"] == want and r["button"] == (want is not None), (r, want)
        assert want is None or want in fired
    linked = [r for r in shown if r["button"]]
    if priced:  # a what-if priced a recommendation that fired: its row links to it
        assert any(r["rule"] == p["rule"] for r in linked for p in priced), (linked, priced)
    for r in linked:
        iframe.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")  # away from the panel
        iframe.click(f"#bn-what-if .wf-row[data-id='{r['id']}'] button.wf-link")
        iframe.wait_for_function(
            "(rule) => { const li = [...document.querySelectorAll('li.rec.rec-highlight')];"
            " if (li.length !== 1 || li[0].dataset.rule !== rule) return false;"
            " const b = li[0].getBoundingClientRect(); return b.top >= 0 && b.bottom <= window.innerHeight"
            " && document.activeElement === li[0]; }", arg=r["rule"], timeout=10_000)

    # ---- the standalone HTML report draws the same rows (views.js renderReport there too)
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(DEMO_LOGS / GPU_RUN),
                           "--html", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    offline = browser_page(base, viewport=(1280, 800))
    offline.page.goto(out.as_uri())
    offline.page.wait_for_function("() => document.querySelector('#bn-what-if .wf-row')", timeout=30_000)
    assert offline.page.evaluate(ROWS_JS) == shown
    assert not offline.errors and not offline.dialogs, (offline.errors, offline.dialogs)

    # ---- a CPU-only run: n/a with the server's reason
    frame.locator("#bn-run").select_option(CPU_RUN)
    iframe.wait_for_function("(r) => document.querySelector('#bn-run').value === r"
                             " && document.querySelector('#bn-what-if .wf-na')", arg=CPU_RUN, timeout=120_000)
    cpu = wait_route(base, "report", timeout=120, **_selection(iframe))
    assert cpu["step_model"] is None and cpu["not_available"]["step_model"]
    text = iframe.evaluate("() => document.querySelector('#bn-what-if .panel-body').textContent")
    assert text == f"n/a: {cpu['not_available']['step_model']}"
    assert not iframe.evaluate("() => document.querySelector('#bn-what-if .wf-row')")

    w.check_clean()
