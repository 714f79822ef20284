"""compare/diff/check rows of the rank spread and of the collectives' bus bandwidth
(METRICS.md §11 "Ranks and collectives", issue 20 item 5, issue 24).

Every expected number is recomputed here from a direct read of the raw JSON of the demo's
gloo runs (ProfilerStep#N windows, gloo: spans, DataLoader __next__ spans, Input Dims),
not through the loader, distributed.py or ranks.py:

- straggler gap of a step: per rank its busy time = step time - the time it waited in the
  step's collective for the slowest peer (its gloo span's duration minus the shortest of
  the ranks' durations of the same call); gap = the slowest rank's busy time minus the
  median of the others'; the row is the mean over the steps;
- input wait per rank = Σ DataLoader __next__ durations in its steps, less what a gloo span
  covers (§2's category order), / its steps;
- busbw = Σ bytes x nccl-tests factor / Σ shortest duration of each call among the ranks.
"""
from __future__ import annotations

import gzip
import json
import statistics

import pytest

from conftest import DEMO_LOGS

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.views import compare, ranks

BALANCED, STRAGGLER = DEMO_LOGS / "ddp_balanced_2rank", DEMO_LOGS / "ddp_straggler_2rank"
SHARD = DEMO_LOGS / "collectives_shard_2rank"
SINGLE = DEMO_LOGS / "input_bound_nw0"
FP32 = 4
# nccl-tests doc/PERFORMANCE.md, written out again (not collectives.busbw_factor)
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n}


def _files(run):
    files = sorted(run.glob("*.pt.trace.json.gz"))
    if len(files) < 1:
        pytest.skip(f"{run.name} not in demo_logs")
    return files


def _exposed(span, events) -> float:
    """A DataLoader span's time not covered by a gloo: span (any thread): Communication
    outranks DataLoader in the step-time categories (METRICS.md §2), so a previous step's
    all-reduce still running on gloo's thread is not input wait (48 µs in two steps of the
    straggler's rank 1). The gloo spans of one rank do not overlap each other."""
    lo, hi = span["ts"], span["ts"] + span["dur"]
    covered = sum(max(0.0, min(hi, e["ts"] + e["dur"]) - max(lo, e["ts"])) for e in events
                  if e["name"].startswith("gloo:"))
    return span["dur"] - covered


def _raw(path) -> tuple:
    """(doc, {step: {"step_us", "gloo": [(name, dur, numel)], "dl_us"}}) from the JSON."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for e in ev:
        if not e["name"].startswith("ProfilerStep#"):
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        inside = [x for x in ev if a <= x["ts"] < b]
        gloo = sorted((x for x in inside if x["name"].startswith("gloo:")), key=lambda x: x["ts"])
        numel = []
        for x in gloo:
            n = 1
            for d in x["args"]["Input Dims"][0]:
                n *= d
            numel.append(n)
        out[int(e["name"].split("#")[1])] = {
            "step_us": e["dur"], "gloo": [(x["name"], x["dur"], n) for x, n in zip(gloo, numel)],
            "dl_us": sum(_exposed(x, ev) for x in inside if x["name"].startswith("enumerate(DataLoader)")
                         and x["name"].endswith("__next__"))}
    return doc, out


def _expected(run) -> dict:
    """The run's rows, by hand from the raw traces of its two ranks (rank order = file order
    here: rank0.*, rank1.*)."""
    raws = [_raw(p) for p in _files(run)]
    assert [d["distributedInfo"]["rank"] for d, _ in raws] == [0, 1]
    steps = [s for s in raws[0][1] if all(s in r for _, r in raws)]
    gaps = []
    for s in steps:
        per = [r[s] for _, r in raws]
        # the same call on both ranks, by order in the step (gloo spans carry no Seq)
        shortest = [min(p["gloo"][i][1] for p in per) for i in range(min(len(p["gloo"]) for p in per))]
        busy = [p["step_us"] - sum(g[1] - m for g, m in zip(p["gloo"], shortest)) for p in per]
        slow = max(range(len(busy)), key=lambda i: busy[i])
        gaps.append(busy[slow] - statistics.median([b for i, b in enumerate(busy) if i != slow]))
    return {"steps": steps, "gap_us": sum(gaps) / len(gaps),
            "input_wait": [sum(r[s]["dl_us"] for s in steps) / len(steps) for _, r in raws], "raws": raws}


def _busbw(raws, kinds_of=None) -> dict:
    """{kind: GB/s}: Σ bytes x factor / Σ shortest duration among the ranks, per kind."""
    n = raws[0][0]["distributedInfo"]["world_size"]
    bus, time = {}, {}
    for s in raws[0][1]:
        calls = [r[s]["gloo"] for _, r in raws]
        for i, call in enumerate(calls[0]):
            kind = kinds_of[i % len(kinds_of)] if kinds_of else call[0].split(":", 1)[1]
            numel = max(c[i][2] for c in calls)
            nbytes = numel * FP32 * (n if kind == "all_gather" else 1)  # gloo records the shard
            bus[kind] = bus.get(kind, 0.0) + nbytes * FACTOR[kind](n)
            time[kind] = time.get(kind, 0.0) + min(c[i][1] for c in calls)
    return {k: bus[k] / time[k] / 1e3 for k in bus}


@pytest.fixture(scope="module")
def ddp_pair():
    return engine.run_result(str(BALANCED)), engine.run_result(str(STRAGGLER))


def _row(cmp, key):
    return next(m for m in cmp["metrics"] if m["key"] == key)


def test_straggler_run_rows_are_worse_and_equal_the_ranks_view(ddp_pair):
    base, cand = ddp_pair
    cmp = compare.compare(base, cand)
    b_exp, c_exp = _expected(BALANCED), _expected(STRAGGLER)
    assert len(b_exp["steps"]) == len(c_exp["steps"]) == 6 >= T.MIN_STEPS_TO_COMPARE
    gap = _row(cmp, "straggler_gap_us")
    assert gap["group"] == "ranks" and gap["unit"] == "us" and gap["direction"] == "lower_is_better"
    assert gap["base"] == pytest.approx(b_exp["gap_us"], abs=0.01)
    assert gap["cand"] == pytest.approx(c_exp["gap_us"], abs=0.01)
    assert gap["verdict"] == "worse" and gap["cand"] > 100_000  # rank 1 loads 300 ms, rank 0 150 ms
    # the same numbers as the Ranks view (the route's body) of each run
    assert gap["base"] == base["ranks"]["straggler_gap"]["mean_us"]
    assert gap["cand"] == cand["ranks"]["straggler_gap"]["mean_us"]
    imb = _row(cmp, "load_imbalance_pct")
    assert (imb["base"], imb["cand"]) == (base["ranks"]["imbalance_pct"], cand["ranks"]["imbalance_pct"])
    assert imb["verdict"] == "worse" and imb["cand"] >= T.LOAD_IMBALANCE_PCT > imb["base"]
    for rank in (0, 1):
        row = _row(cmp, f"input_wait_us_per_step.rank{rank}")
        assert row["base"] == pytest.approx(b_exp["input_wait"][rank], rel=1e-6)
        assert row["cand"] == pytest.approx(c_exp["input_wait"][rank], rel=1e-6)
    assert _row(cmp, "input_wait_us_per_step.rank1")["verdict"] == "worse"  # 150 -> 300 ms per step
    # no n/a for these rows on either side
    assert not [k for k in cmp["not_available"] if "straggler" in k or "imbalance" in k or ".rank" in k]
    text = compare.format_text(cmp)
    assert "Straggler gap per step" in text and "Load imbalance" in text


def test_busbw_rows_against_a_hand_computation(ddp_pair):
    base, cand = ddp_pair
    cmp = compare.compare(base, cand)
    row = _row(cmp, "busbw_gbps.all_reduce")
    want_b = _busbw(_expected(BALANCED)["raws"])["all_reduce"]
    want_c = _busbw(_expected(STRAGGLER)["raws"])["all_reduce"]
    assert row["source"] == "shortest_rank" and row["direction"] == "higher_is_better" and row["unit"] == "GB/s"
    assert row["base"] == pytest.approx(want_b, rel=1e-6) and row["cand"] == pytest.approx(want_c, rel=1e-6)
    assert row["verdict"] == "worse"
    # the shard run: all_gather and reduce_scatter (gloo runs the latter as all_reduce of the
    # full input), bytes per call from demo_truth
    shard = engine.run_result(str(SHARD))
    raws = _expected(SHARD)["raws"]
    truth = raws[0][0]["demo_truth"]["calls_per_step"]
    kinds = ["all_gather" if c["op"] == "all_gather_into_tensor" else "reduce_scatter" for c in truth]
    for (_, steps) in raws:
        for s in steps.values():  # the recorded input x n (all_gather) = demo_truth's nccl-tests bytes
            assert [g[2] * FP32 * (2 if k == "all_gather" else 1) for g, k in zip(s["gloo"], kinds)] == \
                [c["nccl_tests_bytes"] for c in truth]
    want = _busbw(raws, kinds)
    rows = {m["key"]: m for m in compare.compare(base, shard)["metrics"] if m.get("group") == "collectives"}
    assert set(rows) == {"busbw_gbps.all_reduce", "busbw_gbps.all_gather", "busbw_gbps.reduce_scatter"}
    for kind in ("all_gather", "reduce_scatter"):
        assert rows[f"busbw_gbps.{kind}"]["cand"] == pytest.approx(want[kind], rel=1e-6)
        assert rows[f"busbw_gbps.{kind}"]["base"] is None and rows[f"busbw_gbps.{kind}"]["verdict"] == "n/a"
    assert rows["busbw_gbps.all_reduce"]["base"] == pytest.approx(want_b, rel=1e-6)  # still the shortest rank's
    na = compare.compare(base, shard)["not_available"]
    assert na["metrics.busbw_gbps.all_gather.base"] == "no all_gather call in the included steps"


def test_single_worker_runs_get_no_rank_rows_and_no_noise():
    one, other = engine.run_result(str(SINGLE)), engine.run_result(str(DEMO_LOGS / "input_fixed_nw4"))
    if "ranks" in one:
        pytest.skip("input_bound_nw0 has several workers")
    cmp = compare.compare(one, other)
    assert not [m for m in cmp["metrics"] if m.get("group")]
    assert not [k for k in cmp["not_available"] if "straggler" in k or "busbw" in k]


def test_one_side_a_single_worker_says_why(ddp_pair):
    one = engine.run_result(str(SINGLE))
    cmp = compare.compare(one, ddp_pair[1])
    gap = _row(cmp, "straggler_gap_us")
    assert gap["base"] is None and gap["verdict"] == "n/a"
    assert cmp["not_available"]["metrics.straggler_gap_us.base"] == compare.SINGLE_SIDE
    # a run without collectives: its busbw is n/a with the report's own reason
    why = cmp["not_available"]["metrics.busbw_gbps.all_reduce.base"]
    assert why == one["report"]["not_available"]["collectives"]


def test_min_steps_to_compare_is_respected(ddp_pair, monkeypatch):
    """Fewer steps than MIN_STEPS_TO_COMPARE in a rank: the gap and the imbalance are n/a
    ("too little data"), never a verdict."""
    base, cand = ddp_pair
    monkeypatch.setattr(T, "MIN_STEPS_TO_COMPARE", 7)  # the runs have 6 steps per rank
    by = {}
    for run in (BALANCED, STRAGGLER):
        from tb_bottleneck_plugin import report
        from tb_bottleneck_plugin.trace import discovery

        ld = discovery.discover_path(str(run))
        r = ld.runs[0]
        by[run] = ranks.rank_view({w.name: [report.analyze_span(ld.url, r, s) for s in w.spans] for w in r.workers})
    cmp = compare.compare(dict(base, ranks=by[BALANCED]), dict(cand, ranks=by[STRAGGLER]))
    for key in ("straggler_gap_us", "load_imbalance_pct"):
        row = _row(cmp, key)
        assert row["base"] is None and row["cand"] is None and row["verdict"] == "n/a"
        assert "too little data" in cmp["not_available"][f"metrics.{key}.cand"]
    assert by[STRAGGLER]["straggler_gap"]["per_step"]  # the steps are still listed


def test_gate_bounds_on_rank_rows(capsys):
    code = cli.main(["check", str(STRAGGLER), "--max", "straggler_gap_us=50000"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("FAIL straggler_gap_us = ")
    code = cli.main(["check", str(BALANCED), "--max", "straggler_gap_us=50000", "--max", "load_imbalance_pct=10",
                     "--min", "busbw_gbps.all_reduce=0.1"])
    assert code == 0, capsys.readouterr().out
    capsys.readouterr()
    code = cli.main(["check", str(STRAGGLER), "--baseline", str(BALANCED),
                     "--max-regression", "input_wait_us_per_step.rank1=10%"])
    out = capsys.readouterr().out
    assert code == 1 and "input_wait_us_per_step.rank1 regressed by" in out
    code = cli.main(["check", str(SINGLE), "--max", "straggler_gap_us=1"])
    out = capsys.readouterr().out
    assert code == 1 and compare.SINGLE_SIDE in out  # n/a violates its bound, with the reason
    assert cli.main(["check", str(SINGLE), "--max", "straggler_gap=1"]) == 2  # unknown name


def test_compare_route_has_the_rank_rows(tmp_path):
    import shutil

    from conftest import route_response
    from tb_bottleneck_plugin.serving.engine import Analyzer

    for run in (BALANCED, STRAGGLER):
        shutil.copytree(run, tmp_path / run.name)
    a = Analyzer(str(tmp_path), cache_dir=str(tmp_path / ".cache"), rescan_seconds=60.0)
    try:
        a.start()
        assert a.wait_scan(60) and a.wait_idle(120)
        resp = route_response(a, "compare", base_run=BALANCED.name, cand_run=STRAGGLER.name)
        assert resp.status_code == 200
        rows = {m["key"]: m for m in resp.get_json()["metrics"]}
        view = route_response(a, "ranks", run=STRAGGLER.name).get_json()
        assert rows["straggler_gap_us"]["cand"] == pytest.approx(view["straggler_gap"]["mean_us"])
        assert rows["load_imbalance_pct"]["cand"] == pytest.approx(view["imbalance_pct"])
        assert rows["straggler_gap_us"]["verdict"] == rows["busbw_gbps.all_reduce"]["verdict"] == "worse"
        # a worker picked: no run-level rows
        resp = route_response(a, "compare", base_run=BALANCED.name, base_worker="rank0",
                              cand_run=STRAGGLER.name, cand_worker="rank0")
        assert "straggler_gap_us" not in {m["key"] for m in resp.get_json()["metrics"]}
    finally:
        a.stop()
