"""End to end, Compare mode: a real `tensorboard --logdir` (the demo pair input_bound_nw0 /
input_fixed_nw4, plus two small traces whose kernel and operator carry HTML-looking names)
and a real headless Chromium (Debian's, driven by Playwright).

Checks that the shareable hash URL opens the comparison; that the Input-bound card shows
the compare route's baseline, candidate and delta (formatted as compare.js formats them)
and is marked "better"; that the step-time waterfall draws SVG marks; that the diff tables
have rows, sort on a header click and filter; that the input_bound recommendation is listed
as resolved; that the Compare toggle inside TensorBoard's iframe reaches the same view;
and that trace names stay text. The route's body is validated against docs/route-schema.json.
Two more servers: the V100 training demo against the H100 inference demo shows the banner
"These runs differ in GPU, mode: not a before/after of one change" above the numbers (one line
per difference), "n/a on one side" said once and "(1 step)"; the top bar's Compare button is
disabled (title says why) on an empty logdir and with one single-trace run, enabled with two runs.
Screenshots go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import json
import shutil
import time

import pytest

from conftest import (ARTIFACTS, DEMO_LOGS as DEMO, ROUTE_SCHEMA_PATH, XSS_KERNEL, XSS_OP, http_get, route_validator,
                      write_html_names_trace)

SCHEMA = json.loads(ROUTE_SCHEMA_PATH.read_text())
BASE_RUN, CAND_RUN = "input_bound_nw0", "input_fixed_nw4"


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory, tensorboard_server):
    """A real TensorBoard (conftest.tensorboard_server) over the demo pair and two HTML-named traces."""
    logdir = tmp_path_factory.mktemp("logdir")
    for run in (BASE_RUN, CAND_RUN):
        shutil.copytree(DEMO / run, logdir / run)
    for run, dur in (("xss_a", 500), ("xss_b", 300)):
        write_html_names_trace(logdir / run / "worker0.1700000000000.pt.trace.json", kernel_dur=dur)
    return tensorboard_server(logdir)


def _compare(base, base_run, cand_run):
    """The compare route's 200 body (after any 202 while the sides load), schema-checked."""
    url = f"{base}/data/plugin/bottlenecks/compare?base_run={base_run}&cand_run={cand_run}"
    deadline = time.time() + 120
    while True:
        status, body = http_get(url)
        if status == 200:
            break
        assert status == 202, status
        route_validator("loading").validate(json.loads(body))
        assert time.time() < deadline, "compare route kept answering 202"
        time.sleep(0.5)
    data = json.loads(body)
    assert SCHEMA["x-routes"]["compare"]["200"] == "compare"
    errors = list(route_validator("compare").iter_errors(data))
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in errors[:8]]
    return data


def _pct(v):  # format.js fmtPct(v, 1)
    return f"{v:.1f}%"


def _pp_delta(v):  # compare.js fmtDelta(v, "%")
    return ("+" if v > 0 else "\u2212" if v < 0 else "\u00b1") + f"{abs(v):.1f} pp"


CARD_JS = """(key) => { const c = document.querySelector(`.cmp-card[data-key="${key}"]`); if (!c) return null;
  return {base: c.querySelector('.cmp-base').textContent, cand: c.querySelector('.cmp-cand').textContent,
          delta: (c.querySelector('.cmp-delta-value') || {}).textContent || '',
          verdict: c.getAttribute('data-verdict'), deltaClass: c.querySelector('.cmp-delta').className}; }"""

VERDICT_CLASS = {"better": "sev-text-ok", "worse": "sev-text-high", "unchanged": "muted", "changed": "muted"}
COLOURED = {"sev-text-ok", "sev-text-high"}
DELTA_CELLS_JS = """(kind) => { const t = document.querySelector(`table.cmp-diff-${kind}`);
  const cols = [...t.querySelectorAll('thead th')].map((th) => th.dataset.col);
  const out = [];
  for (const tr of t.querySelectorAll('tbody tr[data-status]')) {
    const name = tr.querySelector('td.cmp-name').title.split('\\n')[0];
    [...tr.children].forEach((td, i) => { if ((cols[i] || '').startsWith('delta_'))
      out.push([name, cols[i], td.dataset.verdict || null, [...td.classList]]); });
  }
  return out; }"""

MARKS_JS = """(sel) => { let n = 0; for (const el of document.querySelectorAll(sel + ' svg rect')) {
  const b = el.getBBox(); if (b.width > 0 && b.height > 0) n++; } return n; }"""


def test_shared_link_shows_the_demo_comparison(tensorboard, browser_page):
    base = tensorboard
    cmp = _compare(base, BASE_RUN, CAND_RUN)
    ib = next(m for m in cmp["metrics"] if m["key"] == "input_bound_pct")
    assert ib["better"] == "lower" and ib["verdict"] == "better" and ib["delta"] < 0
    ARTIFACTS.mkdir(exist_ok=True)
    w = browser_page(base, viewport=(1280, 900))
    page = w.page
    page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#compare=1&base={BASE_RUN}&cand={CAND_RUN}",
              wait_until="domcontentloaded")
    page.locator(".cmp-card").first.wait_for(timeout=60_000)
    page.wait_for_function("() => document.querySelector('.cmp-waterfall svg')", timeout=20_000)
    assert page.locator("#bn-cmp-base-run").input_value() == BASE_RUN
    assert page.locator("#bn-cmp-cand-run").input_value() == CAND_RUN
    # the same CPU training setup on both sides: one change, no setup banner
    assert cmp["setup_differences"] == [] and page.locator("#bn-cmp-setup-warning").count() == 0

    card = page.evaluate(CARD_JS, "input_bound_pct")
    assert card["base"] == _pct(ib["base"]) and card["cand"] == _pct(ib["cand"]), (card, ib)
    assert card["delta"] == _pp_delta(ib["delta"]), (card, ib)
    assert card["verdict"] == "better" and "sev-text-ok" in card["deltaClass"], card
    # every card is coloured by the server's verdict, not by the sign of its change: peak CPU
    # memory grows by 2 MiB (1.8 %, inside the 3 % noise band) and stays uncoloured
    for m in cmp["metrics"]:
        if m["base"] is None and m["cand"] is None:
            continue
        cls = page.evaluate(CARD_JS, m["key"])["deltaClass"].split()
        want = VERDICT_CLASS.get(m["verdict"], "muted")
        assert want in cls and not (COLOURED - {want}) & set(cls), (m, cls)
    mem = next(m for m in cmp["metrics"] if m["key"] == "peak_cpu_allocated_bytes")
    assert mem["delta"] > 0 and mem["verdict"] == "unchanged", mem
    # the side-by-side verdict cards are the single-run cards (cards.js renderCards with two
    # reports): one row per side, each card coloured by that side's own report.verdicts
    page.wait_for_function("() => document.querySelectorAll('#bn-cmp-cards .cards-row').length === 2", timeout=60_000)
    rows = page.evaluate("""() => [...document.querySelectorAll('#bn-cmp-cards .cards-row')].map(r =>
        Object.fromEntries([...r.querySelectorAll('.card[data-card]')].map(c => [c.getAttribute('data-card'),
          [...c.classList].filter(k => k.startsWith('sev-'))])))""")
    for run, row in zip((BASE_RUN, CAND_RUN), rows):
        status, body = http_get(f"{base}/data/plugin/bottlenecks/report?run={run}")
        assert status == 200
        verdicts = json.loads(body)["verdicts"]
        assert row and set(row) <= set(verdicts), (run, row)
        for card, cls in row.items():
            assert cls == [f"sev-{verdicts[card]['severity']}"], (run, card, cls, verdicts[card])
    assert rows[0]["input_bound"] == ["sev-high"] and rows[1]["input_bound"] == ["sev-ok"], rows
    # the headline line: step time and its largest cause
    head = page.locator(".cmp-headline").text_content()
    assert cmp["step_time"]["largest_change"] == "dataloader" and "largest change: DataLoader" in head, head

    # waterfall: baseline, the categories that moved, candidate -> one bar each
    moved = [c for c in cmp["step_time"]["categories"] if c["delta_us"] != 0]
    assert page.evaluate(MARKS_JS, ".cmp-waterfall") >= len(moved) + 2
    assert page.locator(".cmp-waterfall rect.cmp-wf-dataloader").count() == 1

    # operator diff: rows, sorted by size of the change; the DataLoader row first
    ops = page.locator("table.cmp-diff-ops tbody tr")
    assert ops.count() == min(len(cmp["ops"]["rows"]), 200) > 5
    assert ops.first.locator("td.cmp-name").text_content().startswith("enumerate(DataLoader)#<iterator>.__next__")
    # each delta cell carries the class of the row's verdict for that field (the route's words)
    by_name = {r["name"]: r for r in cmp["ops"]["rows"]}
    cells = page.evaluate(DELTA_CELLS_JS, "ops")
    assert len(cells) > 10
    seen = set()
    for name, col, verdict, classes in cells:
        want = by_name[name]["verdicts"][col[len("delta_"):]]
        assert verdict == want, (name, col, verdict, want)
        assert set(classes) & (COLOURED | {"muted"}) == {VERDICT_CLASS[want]}, (name, col, classes, want)
        seen.add(want)
    assert {"better", "worse", "unchanged"} <= seen, seen
    # click a header: sorted by that column (names ascending)
    page.locator("table.cmp-diff-ops th[data-col=name]").click()
    names = page.eval_on_selector_all("table.cmp-diff-ops tbody td.cmp-name", "els => els.map(e => e.firstChild.textContent)")
    assert names == sorted(names, key=lambda s: s.lower()) or names[0] <= names[-1], names[:5]
    # filter
    page.locator("#bn-cmp-ops input.filter").fill("convolution_backward")
    assert ops.count() >= 1 and all("convolution_backward" in t for t in
                                    page.eval_on_selector_all("table.cmp-diff-ops tbody td.cmp-name",
                                                              "els => els.map(e => e.textContent)"))
    # kernels: CPU-only pair, the panel says so rather than showing an empty table
    assert "CPU-only" in page.locator("#bn-cmp-kernels").text_content()

    # recommendations: input_bound resolved
    # one worker with two spans: a single span of each side can be picked
    page.locator("#bn-cmp-base-span").select_option(index=1)
    page.wait_for_function("() => /base_span=/.test(location.hash) && document.querySelector('.cmp-card')", timeout=60_000)
    assert "base_worker=" in page.url, page.url
    base_line = page.locator(".cmp-summary .panel-body > div").first.text_content()
    assert base_line.startswith("Baseline: ") and "in 2 spans" not in base_line, base_line
    page.locator("#bn-cmp-base-span").select_option(index=0)
    page.wait_for_function("() => !/base_span=/.test(location.hash) && document.querySelector('.cmp-rec')", timeout=60_000)
    rec = page.locator('.cmp-rec[data-rule="input_bound"]')
    assert rec.get_attribute("data-status") == "resolved"
    assert "resolved" in rec.locator(".badge").text_content()
    page.screenshot(path=str(ARTIFACTS / "bottlenecks_compare_demo.png"), full_page=True)
    page.close()
    w.check_clean()


def test_compare_toggle_inside_tensorboard_and_names_stay_text(tensorboard, browser_page):
    base = tensorboard
    cmp = _compare(base, "xss_a", "xss_b")
    # the kernel is matched by its normalised name (template-like <...> collapsed), the raw name kept
    krow = next(r for r in cmp["kernels"]["rows"] if XSS_KERNEL in r["raw_names"])
    assert krow["status"] == "changed" and krow["delta_total_us_per_step"] == pytest.approx(-200)
    w = browser_page(base)
    page = w.page
    frame = w.open_tab()
    frame.locator("#bn-compare-toggle").wait_for(timeout=60_000)
    frame.locator("#bn-compare-toggle").click()
    frame.locator("#bn-cmp-base-run").select_option("xss_a")
    frame.locator("#bn-cmp-cand-run").select_option("xss_b")
    iframe = next(f for f in page.frames if "plugin" in f.url)
    iframe.wait_for_function("() => document.querySelector('table.cmp-diff-kernels tbody td.cmp-name')", timeout=60_000)
    assert "compare=1" in iframe.url and "base=xss_a" in iframe.url and "cand=xss_b" in iframe.url, iframe.url
    kname = iframe.eval_on_selector("table.cmp-diff-kernels tbody td.cmp-name", "e => [e.textContent, e.title]")
    assert XSS_KERNEL in kname[0] + kname[1], kname
    assert iframe.evaluate("(name) => [...document.querySelectorAll('table.cmp-diff-ops td.cmp-name')]"
                           ".some(e => e.textContent.includes(name))", XSS_OP)
    assert iframe.evaluate("document.querySelectorAll('img[src=\"x\"], #injected').length") == 0
    # the kernel's change per step as the route says (fmtUs: -200 µs)
    delta = iframe.eval_on_selector("table.cmp-diff-kernels tbody tr td.num:nth-of-type(5)", "e => e.textContent")
    assert delta == "\u2212200 µs", delta
    page.screenshot(path=str(ARTIFACTS / "bottlenecks_compare_xss.png"), full_page=True)
    # back to a single run
    frame.locator("#bn-compare-toggle").click()
    frame.locator("#bn-run").wait_for(state="visible", timeout=20_000)
    page.close()
    w.check_clean()


# ---------------------------------------------------------------------------- setups that differ


def test_runs_on_different_gpus_and_modes_get_a_banner(tmp_path, tensorboard_server, browser_page):
    """The V100 ResNet-50 training demo against the H100 BERT inference demo: the view says
    these are not a before/after of one change; a number n/a on one side says so once; the
    one-step side reads "(1 step)"."""
    v100, h100 = "resnet50_v100_nw0", "bert_h100_inference"
    for run in (v100, h100):
        shutil.copytree(DEMO / run, tmp_path / run)
    base = tensorboard_server(tmp_path)
    cmp = _compare(base, v100, h100)
    # what the traces record: deviceProperties name each GPU; backward ops only in the V100 one
    assert [(d["label"], d["base"], d["cand"]) for d in cmp["setup_differences"]] == [
        ("GPU", "Tesla V100-DGXS-32GB", "NVIDIA H100 80GB HBM3"), ("mode", "training", "inference")]
    assert cmp["cand"]["steps"] == 1
    w = browser_page(base, viewport=(1280, 900))
    page = w.page
    page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#compare=1&base={v100}&cand={h100}",
              wait_until="domcontentloaded")
    page.locator(".cmp-card").first.wait_for(timeout=120_000)
    banner = page.locator("#bn-cmp-setup-warning")
    assert banner.locator("strong").text_content() == \
        "These runs differ in GPU, mode: not a before/after of one change."
    items = banner.locator("li").all_text_contents()
    assert items == ["GPU: Tesla V100-DGXS-32GB \u2192 NVIDIA H100 80GB HBM3", "mode: training \u2192 inference"], items
    assert "mixes the effects" in banner.text_content()
    # above the numbers it qualifies
    top = page.evaluate("""() => [document.querySelector('#bn-cmp-setup-warning').getBoundingClientRect().top,
        document.querySelector('#bn-cmp-metrics').getBoundingClientRect().top]""")
    assert top[0] < top[1], top
    cand_line = page.locator(".cmp-summary .panel-body > div").nth(2).text_content()
    assert cand_line.startswith("Candidate: bert_h100_inference") and cand_line.endswith(" (1 step)"), cand_line
    # peak GPU reserved: the H100 trace records it, the V100 one does not
    m = next(m for m in cmp["metrics"] if m["key"] == "peak_gpu_reserved_bytes")
    assert m["verdict"] == "n/a" and (m["base"] is None) != (m["cand"] is None), m
    verdict = page.locator('.cmp-card[data-key="peak_gpu_reserved_bytes"] .cmp-delta').text_content()
    assert verdict == "n/a on one side", verdict
    texts = page.eval_on_selector_all(".cmp-card .cmp-delta", "els => els.map(e => e.textContent)")
    assert not [t for t in texts if t.count("n/a") > 1], texts
    page.screenshot(path=str(ARTIFACTS / "bottlenecks_compare_setups.png"), full_page=True)
    w.check_clean()


# ---------------------------------------------------------------------------- the Compare button


BUTTON_JS = """() => { const b = document.querySelector('#bn-compare-toggle'); return b && [b.disabled, b.title]; }"""


def test_compare_button_needs_two_comparable_things(tmp_path, tensorboard_server, browser_page):
    """Empty logdir: disabled, the title says why. One run with one trace: still disabled.
    A second run: enabled, and it opens compare mode."""
    base = tensorboard_server(tmp_path)
    w = browser_page(base)
    page = w.page
    page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks", wait_until="domcontentloaded")
    page.wait_for_function("() => { const b = document.querySelector('#bn-compare-toggle');"
                           " return b && b.title.includes('has none'); }", timeout=60_000)
    disabled, title = page.evaluate(BUTTON_JS)
    assert disabled and title == "Compare needs two runs: this logdir has none yet", title
    page.locator("#bn-compare-toggle").click(force=True)  # a click does nothing
    assert "compare=1" not in page.url

    one = tmp_path / "one"
    one.mkdir()
    first = sorted((DEMO / CAND_RUN).glob("*.json*"))[0]
    shutil.copy(first, one / first.name)
    page.locator("button", has_text="Refresh").click()
    page.wait_for_function("() => document.querySelector('#bn-compare-toggle').title.includes('one run')",
                           timeout=60_000)
    disabled, title = page.evaluate(BUTTON_JS)
    assert disabled and "one run with one trace" in title, title

    shutil.copytree(DEMO / CAND_RUN, tmp_path / "two")
    page.locator("button", has_text="Refresh").click()
    page.wait_for_function("() => !document.querySelector('#bn-compare-toggle').disabled", timeout=60_000)
    assert page.evaluate(BUTTON_JS) == [False, "Compare two runs (baseline vs candidate)"]
    page.locator("#bn-compare-toggle").click()
    page.locator(".cmp-card").first.wait_for(timeout=120_000)
    assert "compare=1" in page.url
    w.check_clean()


def test_compile_panel_shows_the_server_compilation_part(tmp_path, tensorboard_server, browser_page):
    """The shared H100 GPT-2 pair, eager vs torch.compile: the compare view's torch.compile panel
    shows the route's kernel families (coloured by its verdicts), the launches per step and the
    Triton kernels with the eager ops they fused, names as text."""
    from conftest import TRACES

    logs = tmp_path / "logs"
    for run in ("gpt2_bf16_eager", "gpt2_bf16_compiled"):
        (logs / run).mkdir(parents=True)
        for f in (TRACES / "h100" / run).glob("*.pt.trace.json.gz"):
            (logs / run / f.name).symlink_to(f)
    base = tensorboard_server(logs)
    cmp = _compare(base, "gpt2_bf16_eager", "gpt2_bf16_compiled")
    part = cmp["compilation"]
    assert part["base_compiled"] is False and part["cand_compiled"] is True
    w = browser_page(base, viewport=(1280, 900))
    page = w.page
    page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#compare=1&base=gpt2_bf16_eager&cand=gpt2_bf16_compiled",
              wait_until="domcontentloaded")
    page.wait_for_function("() => document.querySelector('#bn-cmp-compilation table.cmp-fused')", timeout=120_000)
    sides = page.evaluate("() => document.querySelector('#bn-cmp-compilation .cmp-compile-sides').textContent")
    assert sides == "Baseline eager, candidate compiled."
    launch = page.evaluate("() => document.querySelector('#bn-cmp-compilation .cmp-compile-launch').textContent")
    assert launch.startswith(f"Kernels per step {part['launch']['base_kernels_per_step']:,.0f} → "
                             f"{part['launch']['cand_kernels_per_step']:,.0f}")
    fams = page.evaluate("""() => [...document.querySelectorAll('#bn-cmp-compilation table.cmp-families tbody tr')]
        .map((tr) => [tr.dataset.family, tr.children[3].dataset.verdict || null, [...tr.children[3].classList]])""")
    assert [f[0] for f in fams] == [f["family"] for f in part["families"]]
    for (family, verdict, cls), f in zip(fams, part["families"]):
        assert verdict == f["verdict"] and VERDICT_CLASS.get(f["verdict"], "muted") in cls, (family, cls, f)
    rows = page.evaluate("""() => [...document.querySelectorAll('#bn-cmp-compilation table.cmp-fused tbody tr')]
        .map((tr) => [tr.children[0].title, tr.children[1].textContent])""")
    want = part["fused"]["rows"][:len(rows)]
    assert rows and [r[0] for r in rows] == [r["name"] for r in want]
    assert [r[1] for r in rows] == [", ".join(o["op"] for o in r["ops"]) for r in want]
    assert not w.errors and not w.dialogs, (w.errors, w.dialogs)
    assert all(u.startswith(base) for u in w.requests), [u for u in w.requests if not u.startswith(base)]
