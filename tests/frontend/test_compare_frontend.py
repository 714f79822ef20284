"""Compare mode's colours come from the server's verdicts, checked on the RECORDED answers
(tests/fixtures/route_responses.json, recorded from the real compare route by
record_route_fixtures.py) replayed by the mock server into a real headless Chromium.

Every headline card, step-time category and diff-table delta cell must carry the class of
its verdict word (better -> sev-text-ok, worse -> sev-text-high, unchanged/changed -> muted),
whatever the sign of the change: the recorded GPU pair has a higher-is-better metric that
fell (worse, negative delta) and changes inside the noise band (unchanged, non-zero delta),
so colouring by sign fails here. The setup banner is drawn exactly for the recorded pair whose
setups differ (V100 training vs H100 inference), one line per difference; and the top bar's
Compare button availability (compare.js compareAvailability) is checked on run lists.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = json.loads((FIXTURES / "route_responses.json").read_text())["responses"]
PAIRS = sorted(k for k in RECORDED if k.startswith("compare?"))
CLASS = {"better": "sev-text-ok", "worse": "sev-text-high", "unchanged": "muted", "changed": "muted"}
COLOURS = {"sev-text-ok", "sev-text-high"}

DOM_JS = """() => {
  const cls = (el) => el ? [...el.classList] : null;
  const cards = [...document.querySelectorAll('.cmp-card')].map((c) => ({key: c.dataset.key,
    verdict: c.dataset.verdict, direction: c.dataset.direction, cls: cls(c.querySelector('.cmp-delta'))}));
  const cats = [...document.querySelectorAll('table.cmp-cats td.cmp-cat-delta')].map((td) => ({
    verdict: td.dataset.verdict, cls: cls(td)}));
  const tables = {};
  for (const kind of ['kernels', 'ops']) {
    const t = document.querySelector(`table.cmp-diff-${kind}`);
    if (!t) continue;
    const cols = [...t.querySelectorAll('thead th')].map((th) => th.dataset.col);
    tables[kind] = [...t.querySelectorAll('tbody tr[data-status]')].map((tr) => ({
      name: tr.querySelector('td.cmp-name').title.split('\\n')[0],
      cells: [...tr.children].map((td, i) => ({col: cols[i], verdict: td.dataset.verdict || null, cls: cls(td)}))}));
  }
  return {cards, cats, tables, headline: document.querySelector('.cmp-headline-delta')
    ? {verdict: document.querySelector('.cmp-headline-delta').dataset.verdict,
       cls: cls(document.querySelector('.cmp-headline-delta'))} : null};
}"""


@pytest.fixture(scope="module")
def mock(frontend_mock):
    return frontend_mock


def _colour(classes):
    return {c for c in classes if c in COLOURS} or ({"muted"} if "muted" in classes else set())


def test_recorded_pairs_hold_verdicts_that_differ_from_the_sign():
    """The fixture can catch sign-colouring: a worse change with a negative delta, a better one
    with a positive delta, and an unchanged non-zero change (numbers of the real route)."""
    assert len(PAIRS) >= 2
    metrics = [m for k in PAIRS for m in RECORDED[k]["body"]["metrics"]]
    assert any(m["verdict"] == "worse" and m["delta"] < 0 and m["direction"] == "higher_is_better" for m in metrics)
    assert any(m["verdict"] == "better" and m["delta"] > 0 for m in metrics)
    assert any(m["verdict"] == "unchanged" and m["delta"] for m in metrics)
    rows = [r for k in PAIRS for t in ("kernels", "ops") if RECORDED[k]["body"][t] for r in RECORDED[k]["body"][t]["rows"]]
    assert any(v == "unchanged" and r["delta_" + f] for r in rows for f, v in r["verdicts"].items())
    assert any(v == "changed" for r in rows for v in r["verdicts"].values())  # a neutral count


@pytest.mark.parametrize("key", PAIRS)
def test_compare_view_colours_every_change_by_its_recorded_verdict(key, mock, browser_page):
    entry = RECORDED[key]
    assert entry["status"] == 200
    cmp = entry["body"]
    q = dict(p.split("=", 1) for p in key.split("?", 1)[1].split("&"))
    w = browser_page(mock, viewport=(1400, 1000))
    page = w.page
    page.goto(f"{mock}/data/plugin_entry.html?name=bottlenecks#compare=1&base={q['base_run']}&cand={q['cand_run']}",
              wait_until="domcontentloaded")
    page.locator(".cmp-card").first.wait_for(timeout=60_000)
    dom = page.evaluate(DOM_JS)

    shown = [m for m in cmp["metrics"] if m["base"] is not None or m["cand"] is not None]
    assert [c["key"] for c in dom["cards"]] == [m["key"] for m in shown]
    for card, m in zip(dom["cards"], shown):
        assert card["verdict"] == m["verdict"] and card["direction"] == m["direction"], (card, m)
        want = {CLASS[m["verdict"]]} if m["verdict"] in CLASS else {"muted"}
        assert _colour(card["cls"]) == want, (card, m)

    # the setup banner: present exactly when the server lists setup differences, one line each
    items = page.eval_on_selector_all("#bn-cmp-setup-warning li", "els => els.map(e => e.textContent)")
    assert items == [f"{d['label']}: {d['base']} \u2192 {d['cand']}" for d in cmp["setup_differences"]], items
    assert page.locator("#bn-cmp-setup-warning").count() == (1 if cmp["setup_differences"] else 0)

    st = cmp["step_time"]
    assert dom["headline"]["verdict"] == st["verdict"]
    assert _colour(dom["headline"]["cls"]) == ({CLASS[st["verdict"]]} - {"muted"})
    moved = [c for c in st["categories"] if c["delta_us"] != 0 or c["base_us"] or c["cand_us"]]
    assert [c["verdict"] for c in dom["cats"]] == [c["verdict"] for c in moved]
    for cell, c in zip(dom["cats"], moved):
        assert _colour(cell["cls"]) == {CLASS[c["verdict"]]}, (cell, c)

    checked = 0
    for kind, rows in dom["tables"].items():
        by_name = {r["name"]: r for r in cmp[kind]["rows"]}
        for tr in rows:
            want_row = by_name[tr["name"]]
            for cell in tr["cells"]:
                if not (cell["col"] or "").startswith("delta_"):
                    assert cell["verdict"] is None and not _colour(cell["cls"]) - {"muted"}, (kind, tr["name"], cell)
                    continue
                verdict = want_row["verdicts"][cell["col"][len("delta_"):]]
                assert cell["verdict"] == verdict, (kind, tr["name"], cell)
                assert _colour(cell["cls"]) == ({CLASS[verdict]} if verdict in CLASS else set()), \
                    (kind, tr["name"], cell, verdict)
                checked += 1
    assert checked > 10
    w.check_clean()


AVAILABILITY_JS = """async (payloads) => {
  // the module index.js itself imports (the entry page's base is the plugin's route prefix)
  const {compareAvailability} = await import(new URL('./static/compare.js', document.baseURI).href);
  return payloads.map((p) => compareAvailability(p));
}"""


def test_compare_button_availability(mock, browser_page):
    """compareAvailability (compare.js): enabled with two comparable things (two runs, or one
    run with two spans or workers), else disabled with a title that says why."""
    w = browser_page(mock)
    page = w.page
    page.goto(f"{mock}/data/plugin_entry.html?name=bottlenecks", wait_until="domcontentloaded")
    page.locator("#bn-compare-toggle").wait_for(timeout=60_000)
    span = lambda s: {"span": s}  # noqa: E731
    run = lambda name, *workers: {"run": name, "workers": [{"worker": w, "spans": [span(x) for x in spans]}  # noqa: E731
                                                           for w, spans in workers]}
    got = page.evaluate(AVAILABILITY_JS, [
        None, {"runs": []},
        {"runs": [run("a", ("w0", ["1"]))]},
        {"runs": [run("a", ("w0", ["1", "2"]))]},
        {"runs": [run("a", ("w0", ["1"]), ("w1", ["1"]))]},
        {"runs": [run("a", ("w0", ["1"])), {"run": "b", "state": "loading"}]},
    ])
    assert [g["enabled"] for g in got] == [False, False, False, True, True, True], got
    assert got[0]["title"] == got[1]["title"] == "Compare needs two runs: this logdir has none yet"
    assert "one run with one trace" in got[2]["title"]
    assert got[3]["title"] == "Compare two runs (baseline vs candidate)"
