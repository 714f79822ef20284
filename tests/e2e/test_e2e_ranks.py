"""End to end: the Ranks panel (static/ranks.js) of a distributed run in a real
`tensorboard --logdir` and a real headless Chromium (Debian's, driven by Playwright).

- ddp_straggler_2rank (rank 1 slow by construction): the panel names rank 1 at the top with
  the route's recommendation title and its cause said once, its peak memory as rank 1's own
  Peak memory card writes it; the stacked bars draw each rank's DataLoader wait as its own
  part, its share of the bar = the rank's input-bound % from its own report route; the rank
  table has two rows whose every cell is the route's number as formatted (the parts as the
  bars draw them); the heatmap
  canvas has painted pixels; clicking a rank row opens that worker's report; headers sort.
- ddp_balanced_2rank: not flagged; the sentence says "waited least in 5 of 6 steps" is a
  step count and quotes both total waits (rank 1 waited more in total), as the table shows.  input_bound_nw0 (one worker): no Ranks panel, no error.
- The ranks route's real answers follow docs/route-schema.json.
- A synthetic 1,024-rank view (the real answer tiled, route intercepted): the render time
  is printed (not asserted: the machine is shared).
Screenshots go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import copy
import json
import shutil
import statistics
import time

import pytest

from conftest import ARTIFACTS, DEMO_LOGS as DEMO, ROUTE_SCHEMA_PATH, http_get, route_validator

STRAGGLER, BALANCED, SINGLE = "ddp_straggler_2rank", "ddp_balanced_2rank", "input_bound_nw0"
PIPELINE = "pipeline_2x2_4rank"
SCHEMA = json.loads(ROUTE_SCHEMA_PATH.read_text())


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory, tensorboard_server):
    """A real TensorBoard (conftest.tensorboard_server) over the two DDP demo runs and one single-worker run."""
    logdir = tmp_path_factory.mktemp("logdir")
    for name in (STRAGGLER, BALANCED, SINGLE, PIPELINE):
        shutil.copytree(DEMO / name, logdir / name)  # copies: symlinks leaving the logdir are skipped
    return tensorboard_server(logdir)


def _ranks(base, run):
    """The ranks route's 200 answer (202 while the spans load), checked against the schema."""
    deadline = time.time() + 120
    while time.time() < deadline:
        status, body = http_get(f"{base}/data/plugin/bottlenecks/ranks?run={run}")
        body = json.loads(body)
        name = SCHEMA["x-routes"]["ranks"][str(status)]
        errors = [f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in route_validator(name).iter_errors(body)]
        assert not errors, (run, status, errors)
        if status == 200:
            return body
        assert status == 202, (run, status, body)
        time.sleep(0.5)
    raise TimeoutError(run)


# ---------------------------------------------------------------- the dashboard's formatting (format.js)

def fmt_pct(v):
    return "n/a" if v is None else f"{v:.1f}%"


def fmt_us(us):
    if us is None:
        return "n/a"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.2f} s"
    if a >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} µs" if a >= 100 or float(us).is_integer() else f"{us:.1f} µs"


def fmt_count(n):
    return "n/a" if n is None else f"{n:,}"


EXPECTED_COLS = [("rank", str), ("worker", str), ("steps", fmt_count), ("avg_step_us", fmt_us),
                 ("bar_compute_pct", fmt_pct), ("bar_overlapped_pct", fmt_pct), ("bar_exposed_comm_pct", fmt_pct),
                 ("bar_input_wait_pct", fmt_pct), ("bar_other_pct", fmt_pct), ("gpu_utilization_pct", fmt_pct), ("mfu_pct", fmt_pct),
                 ("straggler_steps", fmt_count), ("wait_us", fmt_us), ("transfer_us", fmt_us)]


def with_bar_pct(r):
    """The route's row with the table's part columns: each part of bar_us as % of step_us (the
    parts the bars draw, so that the table and the bars say the same)."""
    return dict(r, **{f"bar_{k.replace('_us', '_pct')}": 100 * v / r["step_us"] for k, v in r["bar_us"].items()})

PANEL_JS = """() => {
  const sec = document.querySelector('#bn-ranks');
  if (!sec) return null;
  let marks = 0;
  for (const el of sec.querySelectorAll('.ranks-bars svg rect')) {
    const b = el.getBBox();
    if (b.width > 0 && b.height > 0) marks++;
  }
  // per bar: the height of each drawn part (data-key), for the shares of the step
  const bars = [...sec.querySelectorAll('.ranks-bars svg g.bar')].map(g => Object.fromEntries(
    [...g.querySelectorAll('rect.seg')].map(r => [r.getAttribute('data-key'), r.getBBox().height])));
  const legend = Object.fromEntries([...sec.querySelectorAll('.legend .legend-item')].map(
    el => [el.getAttribute('data-key'), el.textContent]));
  const cv = sec.querySelector('canvas.heatmap');
  let painted = 0;
  if (cv) {
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) painted++;
  }
  const first = sec.querySelector('.panel-body > .ranks-rec');
  return {
    top: first ? {cls: first.className, title: (first.querySelector('.rec-title') || {}).textContent,
                  text: first.textContent} : null,
    marks, painted, bars, legend,
    waitHead: (sec.querySelector('table.rank-table thead th[data-key=wait_us]') || {}).textContent,
    cells: cv ? Number(cv.getAttribute('data-cells')) : 0,
    rows: [...sec.querySelectorAll('table.rank-table tbody tr')].map(tr => [...tr.children].map(td => td.textContent)),
    heads: [...sec.querySelectorAll('table.rank-table thead th')].map(th => th.getAttribute('data-key')),
    colls: [...sec.querySelectorAll('table.collectives-table tbody tr')].map(tr => [...tr.children].map(td => td.textContent)),
    groups: [...sec.querySelectorAll('table.groups-table tbody tr')].map(tr => [...tr.children].map(td => td.textContent)),
    groupNotes: [...sec.querySelectorAll('p.group-straggler, p.group-cause')].map(p => p.textContent),
  };
}"""


def _open(browser_page, base):
    """A watched page (conftest.Watched: dialogs, page errors, foreign requests) on the tab, 1280 x 1500."""
    w = browser_page(base, viewport=(1280, 1500))
    return w, w.page, w.open_tab()


def _iframe(page):
    return next(f for f in page.frames if "plugin" in f.url)


def test_straggler_pair_in_the_ranks_panel(tensorboard, browser_page):
    base = tensorboard
    view = _ranks(base, STRAGGLER)
    balanced = _ranks(base, BALANCED)
    single = _ranks(base, SINGLE)
    assert view["flagged"] and view["recommendation"]["rank"] == 1  # the injected straggler
    assert not balanced["flagged"] and not single["available"]
    ARTIFACTS.mkdir(exist_ok=True)
    w, page, frame = _open(browser_page, base)
    frame.locator("#bn-run").select_option(STRAGGLER)
    iframe = _iframe(page)
    iframe.wait_for_function("() => document.querySelector('#bn-ranks canvas.heatmap') && "
                             "document.querySelector('#bn-ranks .ranks-bars svg')", timeout=60_000)
    got = iframe.evaluate(PANEL_JS)
    # rank 1 named at the top, with its cause
    rec = view["recommendation"]
    assert got["top"]["title"] == rec["title"] and "rank 1" in got["top"]["title"], got["top"]
    assert "sev-" + rec["severity"] in got["top"]["cls"]
    # the rank's own top finding said once (the action quotes it; no second line repeating it)
    assert rec["cause"] and got["top"]["text"].count(rec["cause"]["title"]) == 1, got["top"]["text"]
    assert got["top"]["text"].count(rec["cause"]["action"]) == 1
    assert rec["action"] in got["top"]["text"]
    # bars: each rank's DataLoader wait drawn as its own part, its share of the drawn bar = the
    # rank's input-bound % from its own report (report route, not the ranks route); rank 1 waits
    # ~95 % on its DataLoader and is not drawn as computing
    assert got["legend"]["input_wait_us"] == "input wait (DataLoader)"
    assert got["legend"]["compute_us"].startswith("CPU ops only"), got["legend"]
    for r, bar in zip(view["ranks"], got["bars"]):
        status, body = http_get(f"{base}/data/plugin/bottlenecks/report?run={STRAGGLER}&worker={r['worker']}")
        assert status == 200
        own = json.loads(body)["input"]["input_bound_pct"]
        share = 100 * bar["input_wait_us"] / sum(bar.values())
        assert share == pytest.approx(own, abs=1.5), (r["worker"], share, own, bar)
    assert 100 * got["bars"][1].get("compute_us", 0) / sum(got["bars"][1].values()) < 5, got["bars"][1]
    # bars: 2 ranks x up to 4 parts drawn (rank 0's overlapped part is tiny but drawn)
    assert got["marks"] >= 2 * 3, got["marks"]
    # heatmap: every (rank, step) cell painted
    assert got["cells"] == sum(len(r["per_step"]["step_us"]) for r in view["ranks"]) == 12
    assert got["painted"] > 1000, got["painted"]
    # the table: 2 rows, every cell the route's number as formatted
    assert got["heads"] == [k for k, _ in EXPECTED_COLS]
    expected = [[f(with_bar_pct(r)[k]) for k, f in EXPECTED_COLS] for r in view["ranks"]]
    # rank 1's DataLoader wait is in the Input wait column, not in Compute only (was 96.7 %)
    assert float(got["rows"][1][7].rstrip("%")) > 90 > 5 > float(got["rows"][1][4].rstrip("%")), got["rows"][1]
    assert got["rows"] == expected, (got["rows"], expected)
    assert got["colls"] == [[c["kind"], fmt_count(c["calls"]), fmt_count(c["matched_calls"]),
                             f"{c['bytes'] / 2**20:.2f} MiB", fmt_us(c["total_us"]), fmt_us(c["transfer_us"]),
                             fmt_us(c["wait_us"])] for c in view["collectives"]]
    # process groups (issue 37): the group's row, its straggler and the cause by difference as the
    # route says them: rank 1 spends about 150 ms more per step in the DataLoader (demo_settings)
    (g,) = view["process_groups"]
    assert got["groups"] == [[g["label"], ", ".join(g["kinds"]), fmt_count(g["calls"]), fmt_count(g["matched_calls"]),
                              fmt_count(g["unmatched_calls"]), g["match_by"]]], got["groups"]
    assert got["groupNotes"] == [g["straggler"]["sentence"], "Why: " + g["straggler"]["cause"]["sentence"]]
    assert "in the DataLoader" in got["groupNotes"][1] and "rank 1 spends 1" in got["groupNotes"][1]
    assert view["straggler_cause"]["activity"] == "dataloader_us"
    assert iframe.evaluate("() => [...document.querySelectorAll('#bn-ranks tr.rank-row.straggler')]"
                           ".map(tr => tr.dataset.worker)") == [rec["worker"]]
    page.screenshot(path=str(ARTIFACTS / f"ranks_{STRAGGLER}.png"), full_page=True)

    # "Cards per rank": each rank's own cards (cards.js renderCards with one report per rank),
    # the flagged rank first, every card coloured by that rank's report.verdicts
    iframe.click("#bn-ranks-cards > summary")
    iframe.wait_for_function("() => document.querySelectorAll('#bn-ranks-cards .cards-row').length === 2", timeout=60_000)
    card_rows = iframe.evaluate("""() => [...document.querySelectorAll('#bn-ranks-cards .cards-row')].map(r => [
        r.querySelector('.cards-row-label').textContent,
        Object.fromEntries([...r.querySelectorAll('.card[data-card]')].map(c => [c.getAttribute('data-card'),
          [...c.classList].filter(k => k.startsWith('sev-'))]))])""")
    assert card_rows[0][0] == f"{rec['worker']} (flagged)", card_rows
    for label, cards in card_rows:
        worker = label.split(" ")[0]
        status, body = http_get(f"{base}/data/plugin/bottlenecks/report?run={STRAGGLER}&worker={worker}")
        assert status == 200
        verdicts = json.loads(body)["verdicts"]
        assert cards and set(cards) <= set(verdicts), (worker, cards)
        assert all(cls == [f"sev-{verdicts[k]['severity']}"] for k, cls in cards.items()), (worker, cards, verdicts)
    # the recommendation's peak memory is written as rank 1's own Peak memory card writes it
    peak_card = iframe.evaluate("""() => { const r = [...document.querySelectorAll('#bn-ranks-cards .cards-row')]
        .find(r => r.querySelector('.cards-row-label').textContent.startsWith('rank1'));
        const c = r && r.querySelector('.card[data-card=peak_memory] .card-value, .card[data-card=memory] .card-value');
        return c ? c.textContent : null; }""")
    assert peak_card and f"peak memory {peak_card} on CPU" in got["top"]["text"], (peak_card, got["top"]["text"])

    # the heatmap's other colour: wait in collectives (rank 1 never waits: 0 on its row)
    iframe.click("#bn-ranks button.heat-metric[data-metric=wait]")
    assert iframe.evaluate("() => document.querySelector('#bn-ranks button.heat-metric[data-metric=wait]')"
                           ".getAttribute('aria-pressed')") == "true"
    assert iframe.evaluate("() => document.querySelector('#bn-ranks canvas.heatmap').getAttribute('aria-label')"
                           ".startsWith('Heatmap of wait')")
    assert iframe.evaluate(PANEL_JS)["cells"] == 12

    # sorting: Avg step descending puts the slower-stepping rank first; again: ascending
    by_step = sorted(view["ranks"], key=lambda r: -r["avg_step_us"])
    iframe.click("#bn-ranks th[data-key=avg_step_us]")
    assert [r[0] for r in iframe.evaluate(PANEL_JS)["rows"]] == [str(r["rank"]) for r in by_step]
    iframe.click("#bn-ranks th[data-key=avg_step_us]")
    assert [r[0] for r in iframe.evaluate(PANEL_JS)["rows"]] == [str(r["rank"]) for r in by_step[::-1]]

    # clicking a rank row opens that worker's report (worker in the selector and the URL hash)
    iframe.click("#bn-ranks tr.rank-row[data-worker=rank1]")
    iframe.wait_for_function("() => document.querySelector('#bn-worker').value === 'rank1' && "
                             "location.hash.includes('worker=rank1')", timeout=30_000)
    iframe.wait_for_function("() => document.querySelector('#bn-ranks tr.rank-row.selected[data-worker=rank1]')",
                             timeout=60_000)

    # the balanced twin: panel shown, nothing flagged
    frame.locator("#bn-run").select_option(BALANCED)
    iframe.wait_for_function("() => document.querySelector('#bn-ranks canvas.heatmap') && "
                             "!document.querySelector('#bn-ranks .ranks-rec.sev-high, #bn-ranks .ranks-rec.sev-medium')"
                             " && document.querySelector('#bn-run').value === '%s'" % BALANCED, timeout=60_000)
    got = iframe.evaluate(PANEL_JS)
    assert "sev-ok" in got["top"]["cls"] and got["top"]["title"].startswith("No rank holds the others back"), got["top"]
    assert "(worker rank" not in got["top"]["text"], got["top"]  # no recommendation naming a rank
    # "waited least in N of M steps" is a count of steps; the table's Wait is a total: the words
    # say which is which and quote the totals the table shows (rank 1 waited least in 5 of 6
    # steps but waited more in total)
    bst = balanced["straggler"]
    b0, b1 = balanced["ranks"]
    assert (bst["rank"], bst["steps"], bst["of_steps"]) == (1, 5, 6) and b1["wait_us"] > b0["wait_us"]
    assert f"Counted step by step, rank 1 waited least in 5 of 6 steps" in got["top"]["text"], got["top"]["text"]
    assert (f"Summed over all steps it waited {fmt_us(b1['wait_us'])} in total, more than rank 0 "
            f"({fmt_us(b0['wait_us'])})") in got["top"]["text"], got["top"]["text"]
    wait_col = [k for k, _ in EXPECTED_COLS].index("wait_us")
    assert [row[wait_col] for row in got["rows"]] == [fmt_us(b0["wait_us"]), fmt_us(b1["wait_us"])]
    assert got["waitHead"].startswith("Wait (total)"), got["waitHead"]
    assert len(got["rows"]) == 2
    assert iframe.evaluate("() => document.querySelectorAll('#bn-ranks tr.rank-row.straggler').length") == 0
    page.screenshot(path=str(ARTIFACTS / f"ranks_{BALANCED}.png"), full_page=True)

    # one worker: no Ranks panel and no error
    frame.locator("#bn-run").select_option(SINGLE)
    frame.locator(".card").first.wait_for(timeout=60_000)
    time.sleep(1.0)  # a late panel would have had time to appear
    assert iframe.evaluate("() => !document.querySelector('#bn-ranks, #bn-ranks-slot')")
    assert iframe.evaluate("() => !document.querySelector('.banner-warn, .banner-error')")
    page.close()
    w.check_clean()


def synthetic_view(view: dict, n: int) -> dict:
    """The real straggler answer tiled to n ranks (deterministic per-rank jitter of the step
    times; the last rank slow), the shape the route answers for an n-rank run."""
    out = copy.deepcopy(view)
    base_rows = view["ranks"]
    rows = []
    for i in range(n):
        r = copy.deepcopy(base_rows[i % len(base_rows)])
        f = 1.0 + 0.05 * (((i * 7919) % 101) / 100.0 - 0.5) + (0.3 if i == n - 1 else 0.0)
        r.update(rank=i, worker=f"rank{i}", straggler_steps=6 if i == n - 1 else 0)
        for k in ("step_us", "avg_step_us", "compute_only_us"):
            r[k] = r[k] * f
        r["per_step"]["step_us"] = [v * f for v in r["per_step"]["step_us"]]
        rows.append(r)
    out.update(ranks=rows, rank_count=n, world_size=n)
    out["straggler"] = dict(view["straggler"], rank=n - 1, worker=f"rank{n - 1}")
    out["recommendation"] = dict(view["recommendation"], rank=n - 1, worker=f"rank{n - 1}",
                                 title=view["recommendation"]["title"].replace("rank 1 (worker rank1)",
                                                                               f"rank {n - 1} (worker rank{n - 1})"))
    return out


RENDER_JS = """async (view) => {
  const m = await import(new URL('./static/ranks.js', document.baseURI).href);
  const t0 = performance.now();
  const host = document.createElement('div');
  host.style.width = '1200px';
  document.body.appendChild(host);
  host.appendChild(m.renderRanksPanel(view, {onPick: () => {}}));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const cv = host.querySelector('canvas.heatmap');
  const ms = performance.now() - t0;
  const out = {ms, rows: cv ? Number(cv.dataset.rows) : 0, cells: cv ? Number(cv.dataset.cells) : 0,
               bars: host.querySelectorAll('.ranks-bars svg g.bar').length,
               tableRows: host.querySelectorAll('table.rank-table tbody tr').length,
               elements: host.querySelectorAll('*').length};
  host.remove();
  return out;
}"""


def test_pipeline_stages_in_the_ranks_panel(tensorboard, browser_page):
    """pipeline_2x2_4rank: the Ranks panel's "Pipeline stages" section shows the route's stages,
    bubbles, the theoretical bubble beside the measured one and the priced advice (issue 37)."""
    base = tensorboard
    view = _ranks(base, PIPELINE)
    pp = view["pipeline"]
    assert pp["available"] and pp["pipelines"] == [[0, 1], [2, 3]]
    w, page, frame = _open(browser_page, base)
    frame.locator("#bn-run").select_option(PIPELINE)
    iframe = _iframe(page)
    iframe.wait_for_function("() => document.querySelector('#bn-ranks table.stages-table')", timeout=60_000)
    got = iframe.evaluate("""() => ({
      rows: [...document.querySelectorAll('#bn-ranks table.stages-table tbody tr')].map(
        tr => [...tr.children].map(td => td.textContent)),
      head: (document.querySelector('#bn-ranks p.pipeline-head') || {}).textContent,
      advice: [...document.querySelectorAll('#bn-ranks p.pipeline-advice')].map(p => p.textContent)})""")
    assert [r[:2] for r in got["rows"]] == [[str(s["stage"]), ", ".join(map(str, s["ranks"]))] for s in pp["per_stage"]]
    assert [r[3] for r in got["rows"]] == [fmt_pct(s["bubble_pct"]) for s in pp["per_stage"]]
    assert "2 stages × 2 replica(s)" in got["head"] and "schedule GPipe" in got["head"]
    assert f"theoretical (p−1)/(m+p−1) = {fmt_pct(pp['theoretical_bubble_pct'])}" in got["head"]
    assert len(got["advice"]) == len(pp["advice"]) and got["advice"][0].startswith(pp["advice"][0]["title"])
    page.screenshot(path=str(ARTIFACTS / f"ranks_{PIPELINE}.png"), full_page=True)
    w.check_clean()


def test_ranks_panel_render_time_at_1024_ranks(tensorboard, browser_page):
    """1,024 ranks x 6 steps: one canvas (rows grouped), at most 100 bars, 100 table rows
    until "Show all". Prints the render time in the page and through the intercepted route."""
    base = tensorboard
    view = synthetic_view(_ranks(base, STRAGGLER), 1024)
    body = json.dumps(view)
    w, page, frame = _open(browser_page, base)
    iframe = _iframe(page)
    iframe.wait_for_function("() => document.querySelector('.card')", timeout=60_000)
    times = [iframe.evaluate(RENDER_JS, view) for _ in range(5)]
    last = times[-1]
    ms = [t["ms"] for t in times]
    # rows grouped (each shows its slowest rank), every grouped cell painted
    assert last["rows"] < 1024 and last["cells"] == last["rows"] * 6 and last["bars"] <= 100, last
    assert last["tableRows"] == 100 and last["elements"] < 3000, last  # nothing per cell
    # through the dashboard: the ranks route intercepted with the 1,024-rank answer
    page.route("**/ranks?*", lambda route: route.fulfill(status=200, content_type="application/json", body=body))
    t0 = time.perf_counter()
    frame.locator("#bn-run").select_option(STRAGGLER)
    iframe.wait_for_function("() => { const c = document.querySelector('#bn-ranks canvas.heatmap');"
                             " return c && c.dataset.cells === String(Number(c.dataset.rows) * 6); }", timeout=60_000)
    e2e = time.perf_counter() - t0
    got = iframe.evaluate(PANEL_JS)
    assert "rank 1023" in got["top"]["title"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ranks_1024_synthetic.png"), full_page=True)
    print(f"\nRanks panel at 1,024 ranks: render min {min(ms):.0f} ms, median {statistics.median(ms):.0f} ms "
          f"of {len(ms)} (renderRanksPanel + 2 frames, in page); JSON {len(body) / 1024:.0f} KB; "
          f"run select -> heatmap drawn (report + intercepted ranks route) {e2e * 1000:.0f} ms; "
          f"{last['elements']} elements, heatmap {last['rows']} rows")
    page.close()
    w.check_clean()
