"""End to end (real TensorBoard + headless Chromium): on a CPU-only run the GPU-only cards
that are n/a because the trace has no GPU activity are ONE line ("GPU cards: n/a — CPU-only
trace (no GPU kernels): ..."), not a card each, in the run's cards and in the Ranks panel's
"Cards per rank"; the grouping is the server's (report.verdicts[id].na_cause == "cpu_only",
verdicts.GPU_SECTIONS), the dashboard only follows it. A GPU run is unchanged: every card.

Expected sets are pinned independently of na_cause: the CPU demos hold 0 kernels (their CLI
text: "0 kernels, 0 memcpys"), so GPU utilization, Tensor Cores, occupancy, short kernels,
sync and communication have no number; allocator slack is n/a for its own reason (the CPU
allocator mixes allocators) and keeps its card; input-bound and peak memory have numbers."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import DEMO_LOGS as DEMO, http_get, wait_route
from tb_bottleneck_plugin.views import headline

CPU_RUN, DDP_RUN, GPU_RUN = "input_bound_nw0", "ddp_straggler_2rank", "bert_h100_inference"
GPU_CARDS = {"gpu_utilization", "tensor_cores", "occupancy", "short_kernels", "sync", "communication"}
# cards.js `optional`: no card when n/a or 0 (communication, compilation, d2d_copies, ...)
OPTIONAL = {c["id"] for c in headline.card_list() if c["optional"]}
CARDS_JS = """(root) => { const el = root ? document.querySelector(root) : document;
  return [...el.querySelectorAll('.cards')].map(row => ({
    cards: [...row.querySelectorAll('.card[data-card]')].map(c => c.getAttribute('data-card')),
    folded: [...row.querySelectorAll('.cards-folded')].map(p => ({ids: p.getAttribute('data-folded'),
      text: p.textContent, title: p.getAttribute('title')}))})); }"""


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory, tensorboard_server):
    logdir = tmp_path_factory.mktemp("logdir")
    for name in (CPU_RUN, DDP_RUN, GPU_RUN):
        shutil.copytree(DEMO / name, logdir / name)
    return tensorboard_server(logdir)


def _report(base, run, worker=None):
    q = f"run={run}" + (f"&worker={worker}" if worker else "")
    wait_route(base, "report", run=run, **({"worker": worker} if worker else {}))
    status, body = http_get(f"{base}/data/plugin/bottlenecks/report?{q}", timeout=60)
    assert status == 200, (run, worker, status)
    return json.loads(body)


def _open(browser_page, base, run):
    wait_route(base, "report", run=run)
    w = browser_page(base, viewport=(1280, 1500))
    w.page.goto(f"{base}/data/plugin_entry.html?name=bottlenecks#run={run}", wait_until="domcontentloaded")
    w.page.locator(".card[data-card]").first.wait_for(timeout=60_000)
    return w


def _check_folded_row(row, verdicts, where):
    assert len(row["folded"]) == 1, (where, row)
    line = row["folded"][0]
    assert set(line["ids"].split()) == GPU_CARDS, (where, line)
    assert line["text"].startswith("GPU cards: n/a — CPU-only trace (no GPU kernels): "), (where, line)
    # each folded card's own reason (the server's words) is on hover
    for cid in GPU_CARDS:
        assert verdicts[cid]["value"] is None and verdicts[cid]["na_cause"] == "cpu_only", (where, cid)
        assert verdicts[cid]["verdict"] in line["title"], (where, cid, line["title"])
    assert not GPU_CARDS & set(row["cards"]), (where, row)
    # the rest stay cards: allocator slack is n/a for another reason (no na_cause), input/peak memory have numbers
    assert {"input_bound", "peak_memory", "allocator_slack"} <= set(row["cards"]), (where, row)
    assert verdicts["allocator_slack"]["severity"] == "na" and "na_cause" not in verdicts["allocator_slack"]


def test_cpu_only_run_folds_the_gpu_cards_into_one_line(tensorboard, browser_page):
    base = tensorboard
    rep = _report(base, CPU_RUN)
    assert rep["gpu"] in ({}, None) and "gpu" in rep["not_available"]  # the server says CPU-only
    w = _open(browser_page, base, CPU_RUN)
    rows = w.page.evaluate(CARDS_JS, None)
    assert len(rows) == 1, rows
    _check_folded_row(rows[0], rep["verdicts"], CPU_RUN)
    # the banner (and the GPU panels) still say why (views.js)
    assert w.page.locator("text=CPU-only trace: no GPU metrics.").count() >= 1
    w.check_clean()


def test_gpu_run_shows_every_card(tensorboard, browser_page):
    base = tensorboard
    rep = _report(base, GPU_RUN)
    assert not any(v.get("na_cause") for v in rep["verdicts"].values())
    w = _open(browser_page, base, GPU_RUN)
    rows = w.page.evaluate(CARDS_JS, None)
    assert len(rows) == 1 and rows[0]["folded"] == [], rows
    optional_absent = {k for k, v in rep["verdicts"].items() if k in OPTIONAL and v["value"] in (None, 0)}
    assert set(rows[0]["cards"]) == set(rep["verdicts"]) - optional_absent, rows
    assert GPU_CARDS - optional_absent <= set(rows[0]["cards"])
    w.check_clean()


def test_cards_per_rank_fold_the_gpu_cards_of_each_rank(tensorboard, browser_page):
    base = tensorboard
    w = _open(browser_page, base, DDP_RUN)
    page = w.page
    page.locator("#bn-ranks-cards > summary").wait_for(timeout=120_000)
    page.click("#bn-ranks-cards > summary")
    page.wait_for_function("() => document.querySelectorAll('#bn-ranks-cards .cards-row').length === 2", timeout=60_000)
    labels = page.evaluate("() => [...document.querySelectorAll('#bn-ranks-cards .cards-row-label')]"
                           ".map(l => l.textContent.split(' ')[0])")
    rows = page.evaluate(CARDS_JS, "#bn-ranks-cards")
    assert sorted(labels) == ["rank0", "rank1"] and len(rows) == 2, (labels, rows)
    for worker, row in zip(labels, rows):
        _check_folded_row(row, _report(base, DDP_RUN, worker)["verdicts"], worker)
    # one line per rank instead of six n/a cards per rank: the n/a cards left are those n/a for
    # another reason (allocator slack: no reserved memory on CPU; MFU: no peak for a CPU)
    left = sum(1 for worker in labels for k, v in _report(base, DDP_RUN, worker)["verdicts"].items()
               if v["severity"] == "na" and not v.get("na_cause") and k not in OPTIONAL)
    assert left == 4
    assert page.evaluate("() => document.querySelectorAll('#bn-ranks-cards .card.sev-na').length") == left
    w.check_clean()
