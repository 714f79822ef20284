"""The single-file HTML report shows what the live tab shows (issue 25): for
demo_logs/resnet50_v100_nw0, `tb-bottlenecks report RUN --html FILE` opened from disk in
Chromium (offline) and the same run in a real TensorBoard's Bottlenecks tab give the same
cards (ids, colours, verdict words, values) and the same recommendations in the same order."""
from __future__ import annotations

import subprocess
import sys

from conftest import DEMO_LOGS, REPO, link_demo_run

RUN = "resnet50_v100_nw0"
CARDS_JS = """() => [...document.querySelectorAll('.card[data-card]')].map(c => ({
    id: c.getAttribute('data-card'), cls: [...c.classList].filter(k => k.startsWith('sev-')),
    value: c.querySelector('.card-value').textContent,
    verdict: (c.querySelector('.card-verdict') || {}).textContent || ''}))"""
RECS_JS = """() => [...document.querySelectorAll('ol.recs > li.rec')].map((li) =>
    [(li.querySelector('.rec-title') || {}).textContent || '', [...li.classList].filter(k => k.startsWith('sev-'))])"""


def test_html_report_and_tab_show_the_same_cards_and_advice(tmp_path, tensorboard_server, browser_page):
    logs = tmp_path / "logs"
    link_demo_run(logs, RUN, RUN)
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(DEMO_LOGS / RUN),
                           "--html", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]

    base = tensorboard_server(logs)
    w = browser_page(base, viewport=(1280, 900))
    _, iframe = w.open_run(RUN, ready=".card[data-card] .card-value")
    iframe.wait_for_function("() => document.querySelector('ol.recs > li.rec')", timeout=120_000)
    tab_cards, tab_recs = iframe.evaluate(CARDS_JS), iframe.evaluate(RECS_JS)

    offline = browser_page(base, viewport=(1280, 900))
    page = offline.page
    page.goto(out.as_uri())
    page.wait_for_function("() => document.querySelector('ol.recs > li.rec')", timeout=60_000)
    html_cards, html_recs = page.evaluate(CARDS_JS), page.evaluate(RECS_JS)

    assert len(tab_cards) >= 8 and len(tab_recs) >= 1
    assert html_cards == tab_cards
    assert html_recs == tab_recs
    assert offline.requests and all(u.startswith("file://") for u in offline.requests), offline.requests  # offline
    w.check_clean()
    assert not offline.errors and not offline.dialogs, (offline.errors, offline.dialogs)
