"""The distributed demo (2 real gloo ranks on CPU under torch.profiler): the rank view
finds the rank made slow by construction, with the imbalance the construction implies,
and does not flag the balanced twin.

Construction (demo.py): each rank's DataLoader sleeps L_r per batch inside
``enumerate(DataLoader)#...__next__``; in the straggler run L = (40, 100) ms, in the
balanced run (40, 40) ms. Both ranks run the same model on the same batch size.

Derivation of the expected numbers. On a CPU-only trace a rank's compute (compute only +
overlapped) per step is its own work c_r plus its data loading L_r + d_r, where d_r >= 0
is the sleep's overshoot (at most D_MS on a loaded machine). So
    compute_1 - compute_0 = (L_1 - L_0) + (c_1 - c_0) + (d_1 - d_0).
|c_1 - c_0| <= c_0 as long as neither rank's own (identical) work takes more than twice
the other's, with c_0 = compute_0 - L_0 measured on rank 0, and |d_1 - d_0| <= D_MS. With eps = c_0 + D_MS the difference lies
in [dL - eps, dL + eps], and imbalance = 100 * (Delta / 2) / (compute_0 + Delta / 2) for two
ranks is increasing in Delta, which gives the interval asserted below. Rank 0 arrives at
each all-reduce about dL earlier than rank 1, so its typical (median) wait per step lies
in the same [dL - eps, dL + eps].
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
from pathlib import Path

import pytest

from tb_bottleneck_demo import generator as demo
from tb_bottleneck_plugin.trace import discovery
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin import thresholds as T

REPO = Path(__file__).resolve().parents[2]
D_MS = 5.0  # bound on time.sleep's overshoot per batch on a loaded machine

pytest.importorskip("torch")


def _view(logdir: Path, name: str):
    scanned = discovery.scan_logdir(str(logdir))
    run = next(r for r in scanned.runs if r.name == name)
    results = {w.name: [report.analyze_span(str(logdir), run, s) for s in w.spans] for w in run.workers}
    return ranks.rank_view(results), results


@pytest.fixture(scope="module", params=["generated", "committed"])
def pair(request, tmp_path_factory):
    """The quick pair generated now, and the pair committed in demo_logs/."""
    if request.param == "generated":
        for _ in range(2):
            out = tmp_path_factory.mktemp("ddp")
            runs = demo.generate_distributed(str(out), quick=True)
            assert [os.path.basename(r) for r in runs] == list(demo.DDP_PAIR)
            if _straggler_construction_held(out):
                break
            # A timing experiment on a shared 2-core machine: when the ranks did not reach
            # the all-reduce the constructed dL apart (measured from the raw events below),
            # it is run once more on fresh processes; the bounds asserted stay as derived.
        return out
    return REPO / "demo_logs"


def _straggler_construction_held(logdir: Path) -> bool:
    """The injected ground truth, measured on the raw trace events (not through the
    plugin): the median over steps of rank 1's arrival at its all-reduce (the first
    `c10d::allreduce_` of each ProfilerStep, both ranks on this machine's clock) minus
    rank 0's lies within dL +- eps, eps as derived in the module docstring."""
    run = logdir / demo.DDP_PAIR[0]
    arrivals = []
    for rank in (0, 1):
        [path] = run.glob(f"rank{rank}.*.pt.trace.json*")
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                       if str(e.get("name", "")).startswith("ProfilerStep#"))
        reduces = sorted(e["ts"] for e in events if e.get("name") == "c10d::allreduce_")
        arrivals.append({name: next((t for t in reduces if t0 <= t <= t1), None) for t0, t1, name in steps})
    load = demo.ddp_load_ms(straggler=True)
    view, _ = _view(logdir, demo.DDP_PAIR[0])
    eps = (view["ranks"][0]["compute_us_per_step"] / 1000 - load[0]) + D_MS
    gaps = [(arrivals[1][n] - arrivals[0][n]) / 1000 for n in arrivals[0]
            if arrivals[0][n] is not None and arrivals[1].get(n) is not None]
    return bool(gaps) and abs(statistics.median(gaps) - (load[1] - load[0])) <= eps


def _imbalance(delta_ms: float, compute0_ms: float) -> float:
    return 100.0 * (delta_ms / 2) / (compute0_ms + delta_ms / 2)


def test_straggler_found_with_expected_imbalance(pair):
    view, _ = _view(pair, demo.DDP_PAIR[0])
    load = demo.ddp_load_ms(straggler=True)
    d_l = load[1] - load[0]
    r0, r1 = view["ranks"]
    assert (r0["rank"], r0["worker"], r0["rank_source"]) == (0, "rank0", "distributed_info")
    assert (r1["rank"], r1["worker"]) == (1, "rank1")
    assert view["backend"] == "gloo" and view["world_size"] == 2
    assert view["straggler"]["rank"] == demo.DDP_SLOW_RANK
    assert view["straggler"]["share_pct"] >= T.STRAGGLER_STEP_SHARE_PCT
    compute0 = r0["compute_us_per_step"] / 1000
    eps = (compute0 - load[0]) + D_MS
    assert compute0 >= load[0]  # the loading sleep is inside rank 0's compute
    lo, hi = _imbalance(d_l - eps, compute0), _imbalance(d_l + eps, compute0)
    assert lo <= view["imbalance_pct"] <= hi, (lo, view["imbalance_pct"], hi)
    assert d_l - eps <= statistics.median(r0["per_step"]["wait_us"]) / 1000 <= d_l + eps
    rec = view["recommendation"]
    assert view["flagged"] and rec["rank"] == demo.DDP_SLOW_RANK and rec["worker"] == "rank1"
    assert rec["title"].startswith("rank 1 (worker rank1) holds the others back")
    # its own top bottleneck: input-bound (num_workers=0), with the DataLoader action
    assert rec["cause"]["rule"] == "input_bound" and "num_workers" in rec["action"]
    assert "input-bound" in rec["action"]
    assert r1["input_bound_pct"] >= T.INPUT_BOUND_HIGH_PCT
    ar = next(c for c in view["collectives"] if c["kind"] == "all_reduce")
    assert ar["bytes"] is not None and ar["bytes_known_calls"] == ar["calls"]
    assert ar["wait_us"] + ar["transfer_us"] == pytest.approx(ar["total_us"])


def test_balanced_twin_not_flagged(pair):
    view, _ = _view(pair, demo.DDP_PAIR[1])
    assert view["available"] and len(view["ranks"]) == 2
    assert not view["flagged"] and view["recommendation"] is None
    assert view["imbalance_pct"] < T.LOAD_IMBALANCE_PCT


@pytest.mark.parametrize("name", demo.DDP_PAIR)
def test_split_adds_up_on_every_rank_and_step(pair, name):
    view, results = _view(pair, name)
    for w, res in results.items():
        for r in res:
            for s in r["distributed"]["steps"]:
                parts = s["compute_only_us"] + s["overlapped_us"] + s["exposed_comm_us"] + s["other_us"]
                assert parts == pytest.approx(s["step_us"], rel=1e-9, abs=1e-6)
                assert min(s["compute_only_us"], s["overlapped_us"], s["exposed_comm_us"], s["other_us"]) >= 0
    for row in view["ranks"]:
        assert sum(row[k] for k in ranks.SPLIT) == pytest.approx(row["step_us"], rel=1e-9)
        assert sum(row[k.replace("_us", "_pct")] for k in ranks.SPLIT) == pytest.approx(100.0)
        # the same step time as the rank's own report
        own = results[row["worker"]][0]["report"]
        assert row["avg_step_us"] == pytest.approx(own["avg_step_us"])


def test_ranks_route_through_the_analyzer(tmp_path):
    from tb_bottleneck_plugin.serving.engine import Analyzer

    from conftest import route_response

    for name in demo.DDP_PAIR + ("input_bound_nw0",):
        shutil.copytree(REPO / "demo_logs" / name, tmp_path / name)
    a = Analyzer(str(tmp_path), cache_dir=str(tmp_path / ".cache"), rescan_seconds=60.0)
    try:
        a.start()
        assert a.wait_scan(60) and a.wait_idle(120)
        resp = route_response(a, "ranks", run=demo.DDP_PAIR[0])
        body = resp.get_json()
        assert resp.status_code == 200 and body["state"] == "ready" and body["recommendation"]["rank"] == 1
        resp = route_response(a, "ranks", run="input_bound_nw0")
        assert resp.status_code == 200 and resp.get_json()["not_available"] == {"ranks": ranks.SINGLE_WORKER}
        assert route_response(a, "ranks", run="nope").status_code == 404
        assert route_response(a, "ranks").status_code == 400
    finally:
        a.stop()
    assert route_response(None, "ranks", "no logdir given", run="x").status_code == 404
