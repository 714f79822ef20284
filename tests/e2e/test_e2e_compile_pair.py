"""End to end: the Compilation card and the torch.compile advice on the demo's CPU compile pair,
in a real TensorBoard and a real headless Chromium (issue 23).

demo_logs/compile_graph_break (a ``.item()`` graph break, recorded by tb_bottleneck_demo with
``torch._dynamo.explain``'s answer in the trace's top-level ``demo_truth``): the Compilation card
shows as many graph breaks per step as ``explain`` counted per call (one call per step), and the
first recommendation is the ``torch_compile`` rule naming the graph breaks.
demo_logs/compile_static_fixed (the same model without the break): 0 breaks on the card and no
``torch_compile`` advice. No page error, console error of the plugin, dialog or foreign request.
"""
from __future__ import annotations

import gzip
import json
import re

from conftest import DEMO_LOGS, link_demo_run

BROKEN, FIXED = "compile_graph_break", "compile_static_fixed"
CARD = '.card[data-card="compilation"]'
BREAKS_RE = r"^([\d.,]+) graph break\(s\) per step"


def _truth(run):
    f = sorted((DEMO_LOGS / run).glob("*.pt.trace.json.gz"))[0]
    with gzip.open(f, "rt") as fh:
        return json.load(fh)["demo_truth"]


def _wait_card(iframe, run, breaks):
    """The run is selected and its Compilation card shows ``breaks`` graph breaks per step."""
    iframe.wait_for_function(
        """([run, card, re, want]) => document.querySelector('#bn-run').value === run
          && [...document.querySelectorAll(card + ' .card-detail')]
               .some((d) => { const m = d.textContent.match(new RegExp(re)); return m && Number(m[1]) === want; })""",
        arg=[run, CARD, BREAKS_RE, breaks], timeout=120_000)


def _card_breaks(iframe):
    details = iframe.evaluate("(c) => [...document.querySelectorAll(c + ' .card-detail')].map((d) => d.textContent)", CARD)
    found = [re.match(BREAKS_RE, d) for d in details]
    return [float(m.group(1).replace(",", "")) for m in found if m]


def _recs(iframe):
    return iframe.evaluate("""() => [...document.querySelectorAll('ol.recs > li.rec')].map((li) => ({
        rule: (li.querySelector('.rec-rule') || {}).textContent || null,
        title: (li.querySelector('.rec-title') || {}).textContent || null}))""")


def test_compile_pair_card_and_advice(tmp_path, tensorboard_server, browser_page):
    logs = tmp_path / "logs"
    for run in (BROKEN, FIXED):
        link_demo_run(logs, run, demo=run)
    broken_truth, fixed_truth = _truth(BROKEN), _truth(FIXED)
    want_broken = broken_truth["explain"]["graph_break_count"]
    assert want_broken >= 1 and fixed_truth["explain"]["graph_break_count"] == 0
    base = tensorboard_server(logs)
    w = browser_page(base, viewport=(1400, 1000))
    console = []
    w.page.on("console", lambda m: console.append(f"{m.location}: {m.text}")
              if m.type == "error" and "bottlenecks" in str((m.location or {}).get("url", "")) else None)

    # ---- the broken run: breaks per step = explain's count, torch_compile advice first
    frame, iframe = w.open_run(BROKEN, ready=CARD)
    _wait_card(iframe, BROKEN, want_broken)
    assert _card_breaks(iframe) == [want_broken]
    iframe.wait_for_function("() => document.querySelector('ol.recs > li.rec')", timeout=60_000)
    recs = _recs(iframe)
    assert recs[0]["rule"] == "torch_compile", recs
    assert "graph" in recs[0]["title"].lower() and "break" in recs[0]["title"].lower(), recs[0]

    # ---- the fixed run: 0 breaks, no torch_compile advice
    frame.locator("#bn-run").select_option(FIXED)
    _wait_card(iframe, FIXED, 0)
    assert _card_breaks(iframe) == [0]
    iframe.wait_for_function("() => !document.querySelector('ol.recs > li.rec .rec-rule')"
                             " || ![...document.querySelectorAll('.rec-rule')].some((r) => r.textContent === 'torch_compile')",
                             timeout=60_000)
    assert all(r["rule"] != "torch_compile" for r in _recs(iframe)), _recs(iframe)
    w.check_clean()
    assert not console, console
