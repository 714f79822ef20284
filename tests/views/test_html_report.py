"""The single-file HTML report (`report/diff/check --html FILE`, html_report.py, issue 25):
opened from disk in a real headless Chromium with every request routed (anything but the
file itself fails the test), its cards equal to the JSON report's verdicts, no console
error, and trace strings named like HTML shown as text."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_LOGS, REPO, XSS_KERNEL, XSS_OP, fmt_verdict_value, write_html_names_trace
from tb_bottleneck_plugin.views import html_report

CARDS_JS = """() => [...document.querySelectorAll('.card[data-card]')].map(c => ({
    id: c.getAttribute('data-card'), cls: [...c.classList].filter(k => k.startsWith('sev-')),
    value: c.querySelector('.card-value').textContent,
    verdict: (c.querySelector('.card-verdict') || {}).textContent || ''}))"""


def _cli(*args, ok=(0,)):
    done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode in ok, done.stderr[-2000:]
    return done




def _markup(text: str) -> str:
    """The page without the bodies of its <script> and <style> elements."""
    return re.sub(r"(<(script|style)[^>]*>).*?(</\2>)", r"\1\3", text, flags=re.S)


class Offline:
    """A page that may load only ``file://`` URLs: every other request is aborted and recorded."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.foreign, self.console, self.errors, self.dialogs = [], [], [], []
        self.page.route("**/*", self._route)
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def _route(self, route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.foreign.append(route.request.url)
            route.abort()

    def open(self, path: Path, ready=".card[data-card]"):
        self.page.goto(path.resolve().as_uri())
        self.page.locator(ready).first.wait_for(timeout=60_000)
        return self.page

    def check_clean(self):
        assert not self.foreign, self.foreign
        assert not self.errors, self.errors
        assert not self.console, self.console
        assert not self.dialogs, self.dialogs


@pytest.fixture
def offline(chromium):
    pages = []

    def make():
        p = Offline(chromium)
        pages.append(p)
        return p

    yield make
    for p in pages:
        p.page.close()


def test_report_html_opens_offline_with_the_json_reports_cards(tmp_path, offline):
    run = DEMO_LOGS / "resnet50_v100_nw0"
    out = tmp_path / "report.html"
    _cli("report", str(run), "--html", str(out))
    rep = json.loads(_cli("report", str(next(run.glob("*.gz"))), "--json").stdout)
    text = out.read_text(encoding="utf-8")
    size = len(text.encode())
    assert size < 1_000_000, size  # 0.79 MB: 0.59 MB data (0.33 MB operator tables), code and CSS
    # the size README's "Share a report" states, and its GitHub Actions example keeps a failed gate's page
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"For `demo_logs/resnet50_v100_nw0` it is ([\d.]+) MB", readme)
    assert stated and abs(float(stated.group(1)) * 1e6 - size) < 50_000, (stated and stated.group(0), size)
    share = readme.split("## Share a report", 1)[1].split("\n## ", 1)[0]
    for words in ("--html report.html", "if: failure()", "uses: actions/upload-artifact@v4", "path: report.html"):
        assert words in share, words
    # one file: no element that loads anything (the modules' own text aside, whose only URL is the
    # SVG namespace name), and the CSP forbids any fetch
    markup = _markup(text)
    assert "<link" not in markup and " src=" not in markup and "//" not in markup, markup
    assert "default-src 'none'" in markup
    data = html_report.read_page_data(text)
    assert data["views"][0]["report"]["verdicts"] == rep["verdicts"]
    w = offline()
    page = w.open(out)
    page.locator("table.operators tbody tr").first.wait_for(timeout=30_000)
    cards = page.evaluate(CARDS_JS)
    hidden = set(rep["verdicts"]) - {c["id"] for c in cards}  # cards.js `optional` cards at null/0
    assert len(cards) >= 8 and all(rep["verdicts"][i]["value"] in (None, 0) for i in hidden), hidden
    for c in cards:
        v = rep["verdicts"][c["id"]]
        assert c["cls"] == [f"sev-{v['severity']}"], c
        assert c["verdict"] == v["verdict"], c
        if v["unit"] in ("pct", "bytes"):
            assert c["value"] == fmt_verdict_value(v), c
    body = page.inner_text("body")
    assert rep["recommendations"][0]["title"] in body
    for panel in ("Step-time breakdown", "Kernels", "Operators", "Recommendations"):
        assert panel in body, panel
    assert page.locator(".kernel-body table tbody tr").count() >= 20
    assert page.locator("table.operators tbody tr").count() >= 20
    w.check_clean()


def test_trace_strings_named_like_html_stay_text(tmp_path, offline):
    run = tmp_path / "logs" / "<i>run</i>"
    write_html_names_trace(run / "worker0.1700000000000.pt.trace.json")
    out = tmp_path / "xss.html"
    _cli("report", str(tmp_path / "logs"), "--html", str(out))
    text = out.read_text(encoding="utf-8")
    data_block = text.split('id="bn-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_block and ">" not in data_block and XSS_KERNEL in html_report.read_page_data(text)["views"][0]["kernels"][0]["name"]
    w = offline()
    page = w.open(out)
    page.locator(".kernel-body table tbody tr").first.wait_for(timeout=30_000)
    page.locator("table.operators tbody tr").first.wait_for(timeout=30_000)
    body = page.inner_text("body")
    kernel_text = page.locator(".kernel-body").evaluate(
        "e => e.textContent + ' ' + [...e.querySelectorAll('[title]')].map((x) => x.title).join(' ')")
    assert XSS_KERNEL in kernel_text and XSS_OP in body and "<i>run</i>" in body
    assert page.evaluate("() => document.querySelectorAll('img, #injected, i').length") == 0
    w.check_clean()
    # the notebook view of the same run escapes them too
    import tb_bottleneck_plugin as tbb

    html = tbb.analyze(str(tmp_path / "logs"), jobs=1)._repr_html_()
    assert "<i>run</i>" not in html and "&lt;i&gt;run&lt;/i&gt;" in html


def test_script_end_tags_in_data_cannot_close_the_data_block():
    page = html_report.render(html_report.page_data("report", [{"id": "a", "label": "</script><script>alert(1)</script>",
                                                                 "report": {"run": "<!--"}}], title="<t>"))
    assert page.count("</script>") == 2  # the data block's and the module's own
    assert html_report.read_page_data(page)["views"][0]["label"] == "</script><script>alert(1)</script>"
    assert "<title>&lt;t&gt;</title>" in page


def test_diff_and_check_html(tmp_path, offline):
    base, cand = str(DEMO_LOGS / "input_fixed_nw4"), str(DEMO_LOGS / "input_bound_nw0")
    diff = tmp_path / "diff.html"
    _cli("diff", base, cand, "--html", str(diff))
    cmp = json.loads(_cli("diff", base, cand, "--json").stdout)
    assert html_report.read_page_data(diff.read_text(encoding="utf-8"))["compare"] == cmp
    w = offline()
    page = w.open(diff, ready="#bn-cmp-cards .card[data-card]")
    assert "Headline numbers" in page.inner_text("body")
    # the gate's page is written when it fails (exit 1) ...
    failed = tmp_path / "check.html"
    done = _cli("check", cand, "--max", "input_bound_pct=5", "--baseline", base,
                "--max-regression", "avg_step_us=5%", "--html", str(failed), ok=(1,))
    assert "FAIL input_bound_pct" in done.stdout
    page = w.open(failed, ready="#bn-gate")
    assert page.locator("#bn-gate").get_attribute("data-gate") == "fail"
    assert "FAIL input_bound_pct" in page.locator("#bn-gate").inner_text()
    # ... and when it passes
    passed = tmp_path / "pass.html"
    _cli("check", base, "--max", "input_bound_pct=5", "--html", str(passed))
    page = w.open(passed, ready="#bn-gate")
    assert page.locator("#bn-gate").get_attribute("data-gate") == "pass"
    w.check_clean()


def test_a_file_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    done = _cli("report", str(DEMO_LOGS / "input_bound_nw0"), "--html", str(tmp_path / "no" / "dir" / "r.html"),
                ok=(2,))
    assert done.stderr.strip().splitlines()[-1].startswith("tb-bottlenecks: --html")


def test_report_html_of_a_run_of_several_workers_shows_the_ranks_view(tmp_path, offline):
    """The Ranks panel (ranks.js renderRanksPanel, as in the tab) above the run's summary, from
    the rank view `report --json` puts under the run: the flagged rank, one table row per rank,
    the heatmap and bars drawn, and "Cards per rank" from the embedded per-worker reports."""
    run = DEMO_LOGS / "ddp_straggler_2rank"
    out = tmp_path / "ranks.html"
    _cli("report", str(run), "--html", str(out))
    entry = json.loads(_cli("report", str(run), "--json").stdout)["runs"][0]
    want = entry["ranks"]
    text = out.read_text(encoding="utf-8")
    assert len(text.encode()) < 1_000_000
    view = html_report.read_page_data(text)["views"][0]
    assert view["ranks"]["ranks"] == want["ranks"] and view["ranks"]["recommendation"] == want["recommendation"]
    assert set(view["rank_reports"]) == {w["worker"] for w in entry["workers"]}
    for w in entry["workers"]:
        assert view["rank_reports"][w["worker"]]["verdicts"] == w["summary"]["verdicts"]
    assert want["flagged"] and len(want["ranks"]) == 2
    w = offline()
    page = w.open(out, ready="#bn-ranks tr.rank-row")
    page.wait_for_function("() => document.querySelector('#bn-ranks canvas.heatmap') && "
                           "document.querySelector('#bn-ranks .ranks-bars svg')", timeout=30_000)
    # above the report's own panels, in the same view
    assert page.evaluate("() => { const r = document.querySelector('#bn-ranks'), c = document.querySelector('.card[data-card]');"
                         " return !!(r.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING); }")
    rec = want["recommendation"]
    top = page.locator("#bn-ranks .ranks-rec").first
    assert rec["title"] in top.inner_text() and f"sev-{rec['severity']}" in top.get_attribute("class")
    rows = page.evaluate("() => [...document.querySelectorAll('#bn-ranks tr.rank-row')].map(tr => tr.dataset.worker)")
    assert rows == [r["worker"] for r in want["ranks"]]
    assert page.evaluate("() => [...document.querySelectorAll('#bn-ranks tr.rank-row.straggler')]"
                         ".map(tr => tr.dataset.worker)") == [rec["worker"]]
    page.click("#bn-ranks-cards > summary")
    page.wait_for_function("() => document.querySelectorAll('#bn-ranks-cards .cards-row').length === 2", timeout=30_000)
    labels = page.evaluate("() => [...document.querySelectorAll('#bn-ranks-cards .cards-row-label')].map(e => e.textContent)")
    assert labels[0] == f"{rec['worker']} (flagged)", labels
    w.check_clean()
    # a run of one worker has none
    single = tmp_path / "single.html"
    _cli("report", str(DEMO_LOGS / "input_bound_nw0"), "--html", str(single))
    assert "ranks" not in html_report.read_page_data(single.read_text(encoding="utf-8"))["views"][0]
