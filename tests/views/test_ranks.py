"""The rank view (metrics §12) on hand-built 2- and 3-rank runs: every interval below is
chosen by hand, and every number of the view is asserted against the value worked out
by hand in the comments. The traces go through the real path: files on disk ->
discovery -> report.analyze_span (span partial) -> ranks.rank_view.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from tb_bottleneck_plugin.trace import discovery, loader
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import distributed
from tb_bottleneck_plugin.analysis import steps as steps_mod

from conftest import TRACES, write_trace  # noqa: E402  (the one definition, tests/conftest.py)


def _x(name, ts, dur, cat="cpu_op", tid=1, args=None, pid=100):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _kernel(name, ts, dur):
    return _x(name, ts, dur, cat="kernel", pid=0, tid=7, args={"device": 0, "stream": 7})


def _write(run_dir: Path, worker: str, events, rank=None):
    """``<worker>.<ts>.pt.trace.json.gz`` in ``run_dir``, with distributedInfo when ``rank`` is given."""
    return write_trace(run_dir / f"{worker}.1795000000000000000.pt.trace.json.gz", events,
                       distributed_info=None if rank is None else {"backend": "gloo", "rank": rank, "world_size": 3})


def _view(logdir: Path, run_name: str):
    scanned = discovery.scan_logdir(str(logdir))
    run = next(r for r in scanned.runs if r.name == run_name)
    results = {w.name: [report.analyze_span(str(logdir), run, s) for s in w.spans] for w in run.workers}
    return ranks.rank_view(results), results


def _steps(offset):
    return [_x("ProfilerStep#1", offset + 0, 100, cat="user_annotation"),
            _x("ProfilerStep#2", offset + 100, 100, cat="user_annotation")]


@pytest.fixture()
def gpu_2rank(tmp_path):
    """Two GPU ranks without distributedInfo (ranks by worker order). Rank 1's clock is
    1 s ahead: only durations may be compared across files.

    rank 0, step 1 [0,100): compute [10,50), all_reduce [40,70) (30 us)
        compute only 30, overlapped 10, exposed 20, other 40
    rank 0, step 2 [100,200): compute [100,130), all_reduce [130,150) (20), all_gather [160,170) (10)
        compute only 30, overlapped 0, exposed 30, other 40
    rank 1, step 1: compute [0,60), all_reduce [60,70) (10)      -> 60, 0, 10, 30
    rank 1, step 2: compute [100,150), all_reduce [150,190) (40), all_gather [190,195) (5)
                                                                  -> 50, 0, 45, 5
    """
    run = tmp_path / "gpu2"
    ar, ag = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "ncclDevKernel_AllGather_RING_LL(x)"
    ev0 = _steps(0) + [_kernel("volta_sgemm_128x64_nn", 10, 40), _kernel(ar, 40, 30),
                       _kernel("volta_sgemm_128x64_nn", 100, 30), _kernel(ar, 130, 20), _kernel(ag, 160, 10)]
    off = 1_000_000
    ev1 = _steps(off) + [_kernel("volta_sgemm_128x64_nn", off + 0, 60), _kernel(ar, off + 60, 10),
                         _kernel("volta_sgemm_128x64_nn", off + 100, 50), _kernel(ar, off + 150, 40),
                         _kernel(ag, off + 190, 5)]
    _write(run, "node-a_rank0", ev0)
    _write(run, "node-b_rank1", ev1)
    return tmp_path


def test_two_gpu_ranks_every_number(gpu_2rank):
    view, _ = _view(gpu_2rank, "gpu2")
    assert view["available"] and view["rank_count"] == 2
    r0, r1 = view["ranks"]
    assert (r0["rank"], r0["worker"], r0["rank_source"]) == (0, "node-a_rank0", "worker_order")
    assert (r1["rank"], r1["worker"]) == (1, "node-b_rank1")
    assert "ranks.rank" not in view["not_available"]
    # splits summed over both steps
    assert (r0["step_us"], r0["compute_only_us"], r0["overlapped_us"], r0["exposed_comm_us"], r0["other_us"]) \
        == (200, 60, 10, 50, 80)
    assert (r1["step_us"], r1["compute_only_us"], r1["overlapped_us"], r1["exposed_comm_us"], r1["other_us"]) \
        == (200, 110, 0, 55, 35)
    assert r0["compute_only_pct"] == 30 and r0["overlapped_pct"] == 5 and r0["exposed_comm_pct"] == 25 \
        and r0["other_pct"] == 40
    assert r0["avg_step_us"] == 100 and r0["compute_us_per_step"] == 35 and r1["compute_us_per_step"] == 55
    # step 1: all_reduce 30 vs 10 -> transfer 10, waits 20 / 0 (straggler rank 1)
    # step 2: all_reduce 20 vs 40 -> transfer 20, waits 0 / 20; all_gather 10 vs 5 -> transfer 5,
    #         waits 5 / 0; step waits 5 / 20 (straggler rank 0)
    assert r0["per_step"] == {"steps": [1, 2], "step_us": [100, 100], "wait_us": [20, 5]}
    assert r1["per_step"] == {"steps": [1, 2], "step_us": [100, 100], "wait_us": [0, 20]}
    assert (r0["wait_us"], r0["transfer_us"], r0["comm_us"]) == (25, 35, 60)
    assert (r1["wait_us"], r1["transfer_us"], r1["comm_us"]) == (20, 35, 55)
    assert (r0["straggler_steps"], r1["straggler_steps"]) == (1, 1)
    assert view["steps"] == [1, 2]
    assert view["collectives"] == [
        {"kind": "all_reduce", "calls": 4, "matched_calls": 4, "unmatched_calls": 0, "bytes": None,
         "bytes_known_calls": 0, "total_us": 100, "transfer_us": 60, "wait_us": 40},
        {"kind": "all_gather", "calls": 2, "matched_calls": 2, "unmatched_calls": 0, "bytes": None,
         "bytes_known_calls": 0, "total_us": 15, "transfer_us": 10, "wait_us": 5}]
    # tie 1:1 -> the lowest rank; 50 % share < 60 %: the straggler rule does not fire.
    # wait caused: median of step 1 (rank 1 was the straggler: 0) and step 2 (rank 1 waited
    # 20 of a 100 us step: 20 %) = 10 %
    assert view["straggler"] == {"rank": 0, "worker": "node-a_rank0", "steps": 1, "of_steps": 2,
                                 "share_pct": 50.0, "wait_caused_pct": 10.0}
    # compute per step 35 and 55: mean 45, imbalance 100 * 10 / 45
    assert view["imbalance_pct"] == pytest.approx(100 * 10 / 45, abs=1e-9)
    rec = view["recommendation"]
    assert view["flagged"] and rec["rule"] == "straggler" and rec["severity"] == "medium"
    assert rec["rank"] == 1 and rec["worker"] == "node-b_rank1"
    assert rec["title"].startswith("Load imbalance 22.2%: rank 1 (worker node-b_rank1) computes 0.06 ms")
    assert rec["estimated_gain_pct"] == pytest.approx(100 * 10 / 55)
    for r in view["ranks"]:
        assert r["input_bound_pct"] == 0.0
        assert r["gpu_utilization_pct"] is not None


@pytest.fixture()
def cpu_3rank(tmp_path):
    """Three CPU-only gloo ranks; worker names sort differently from their distributedInfo
    ranks. Main thread tid 1 computes (aten::mm), gloo's thread tid 2 runs the collective;
    every gloo:all_reduce records 1000 floats (4000 bytes).

    step 5 [0,100):
      rank 0: mm [0,30); gloo [30,90) (60)          -> compute only 30, overlapped 0, exposed 60, other 10
      rank 1: mm [0,60); gloo [60,90) (30)          -> 60, 0, 30, 10
      rank 2: mm [0,80); autograd op [80,95) enclosing c10d::allreduce_ [82,90) on tid 1;
              gloo [85,95) (10) on tid 2. compute = [0,82) + [90,95) (the enclosing op is
              not computing while its own c10d op runs); comm = [82,95)
                                                    -> 82, 5, 8, 5
      transfer 10; waits 50, 20, 0: straggler rank 2
    step 6 [100,200):
      rank 0: mm [100,150); gloo [150,170) (20)    -> 50, 0, 20, 30
      rank 1: mm [100,140); gloo [140,170) (30)    -> 40, 0, 30, 30
      rank 2: mm [100,160); gloo [160,170) (10)    -> 60, 0, 10, 30
      transfer 10; waits 10, 20, 0: straggler rank 2
    """
    run = tmp_path / "cpu3"
    sizes = {"Input Dims": [[1000]], "Input type": ["float"]}

    def gloo(ts, dur):
        return _x("gloo:all_reduce", ts, dur, cat="user_annotation", tid=2, args=sizes)

    steps = [_x("ProfilerStep#5", 0, 100, cat="user_annotation"),
             _x("ProfilerStep#6", 100, 100, cat="user_annotation")]
    _write(run, "zeta", steps + [_x("aten::mm", 0, 30), gloo(30, 60), _x("aten::mm", 100, 50), gloo(150, 20)],
           rank=0)
    _write(run, "alpha", steps + [_x("aten::mm", 0, 60), gloo(60, 30), _x("aten::mm", 100, 40), gloo(140, 30)],
           rank=1)
    _write(run, "beta", steps + [
        _x("aten::mm", 0, 80), _x("autograd::engine::evaluate_function: AccumulateGrad", 80, 15),
        _x("c10d::allreduce_", 82, 8), gloo(85, 10), _x("aten::mm", 100, 60), gloo(160, 10)], rank=2)
    return tmp_path


def test_three_cpu_ranks_every_number(cpu_3rank):
    view, _ = _view(cpu_3rank, "cpu3")
    assert view["backend"] == "gloo" and view["world_size"] == 3
    rows = view["ranks"]
    assert [(r["rank"], r["worker"], r["rank_source"]) for r in rows] == [
        (0, "zeta", "distributed_info"), (1, "alpha", "distributed_info"), (2, "beta", "distributed_info")]
    split = [(r["compute_only_us"], r["overlapped_us"], r["exposed_comm_us"], r["other_us"]) for r in rows]
    assert split == [(80, 0, 80, 40), (100, 0, 60, 40), (142, 5, 18, 35)]
    for r in rows:
        assert r["compute_only_us"] + r["overlapped_us"] + r["exposed_comm_us"] + r["other_us"] == r["step_us"] == 200
    assert [r["per_step"]["wait_us"] for r in rows] == [[50, 10], [20, 20], [0, 0]]
    assert [(r["wait_us"], r["transfer_us"], r["comm_us"], r["straggler_steps"]) for r in rows] == [
        (60, 20, 80, 0), (40, 20, 60, 0), (0, 20, 20, 2)]
    assert [r["compute_us_per_step"] for r in rows] == [40, 50, 73.5]
    assert view["collectives"] == [
        {"kind": "all_reduce", "calls": 6, "matched_calls": 6, "unmatched_calls": 0, "bytes": 24000.0,
         "bytes_known_calls": 6, "total_us": 160, "transfer_us": 60, "wait_us": 100}]
    # wait caused by rank 2: step 5 mean of others (50+20)/2 = 35 of 100 us, step 6
    # (10+20)/2 = 15 of 100 us: median of 35 % and 15 % = 25 %
    assert view["straggler"] == {"rank": 2, "worker": "beta", "steps": 2, "of_steps": 2, "share_pct": 100.0,
                                 "wait_caused_pct": 25.0}
    # compute per step 40, 50, 73.5: mean 54.5
    assert view["imbalance_pct"] == pytest.approx(100 * (73.5 - 54.5) / 54.5, abs=1e-9)
    rec = view["recommendation"]
    assert view["flagged"] and rec["severity"] == "high"  # wait caused 25 % >= 20 %
    assert (rec["rank"], rec["worker"]) == (2, "beta")
    assert rec["title"] == ("rank 2 (worker beta) holds the others back: straggler in 2 of 2 steps; "
                            "the other ranks wait 25.0% of a typical step for it")
    assert rec["estimated_gain_pct"] == 25.0
    assert rec["cause"] is None and "no bottleneck above threshold" in rec["action"]
    text = ranks.format_ranks_text(view)
    assert "rank 2 (worker beta) holds the others back" in text
    assert "all_reduce: 6 calls" in text


def test_duplicate_ranks_fall_back_to_worker_order(tmp_path):
    steps = [_x("ProfilerStep#1", 0, 100, cat="user_annotation")]
    body = [_x("aten::mm", 0, 50), _x("gloo:all_reduce", 50, 10, cat="user_annotation", tid=2)]
    _write(tmp_path / "dup", "b", steps + body, rank=0)
    _write(tmp_path / "dup", "a", steps + body, rank=0)
    view, _ = _view(tmp_path, "dup")
    assert [(r["rank"], r["worker"], r["rank_source"]) for r in view["ranks"]] == [
        (0, "a", "worker_order"), (1, "b", "worker_order")]
    assert "ranks.rank" in view["not_available"]
    # equal durations: no wait, no straggler, no imbalance, nothing flagged
    assert view["straggler"] is None and "ranks.straggler" in view["not_available"]
    assert view["imbalance_pct"] == 0.0 and not view["flagged"] and view["recommendation"] is None


def test_no_communication_and_no_steps(tmp_path):
    _write(tmp_path / "nocomm", "r0", [_x("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                       _x("aten::mm", 0, 40)])
    _write(tmp_path / "nocomm", "r1", [_x("aten::mm", 0, 40)])  # no ProfilerStep: one window, no step
    view, _ = _view(tmp_path, "nocomm")
    assert view["available"]
    assert view["not_available"]["ranks.wait_us"] == ranks.NO_COMMUNICATION
    assert all(r["wait_us"] is None and r["transfer_us"] is None for r in view["ranks"])
    assert view["collectives"] == [] and view["straggler"] is None
    # r1 has the no-steps window (one step numbered 0): both ranks still have a step each
    assert [r["steps"] for r in view["ranks"]] == [1, 1]


def test_partial_without_steps_is_not_available():
    part = {"version": 1, "rank": None, "steps": [], "not_available": "no included step"}
    view = ranks.rank_view({"a": [{"report": {}, "distributed": part}],
                            "b": [{"report": {}, "distributed": part}]})
    assert view["not_available"]["ranks.a"] == ranks.NO_STEPS
    assert view["ranks"][0]["avg_step_us"] is None and view["imbalance_pct"] is None
    assert "ranks.imbalance_pct" in view["not_available"]
    old = ranks.rank_view({"a": [{"report": {}}], "b": [{"report": {}}]})  # cached before §12
    assert old["not_available"]["ranks.a"] == ranks.NO_PARTIAL


def test_single_worker_real_trace_is_not_available(tmp_path):
    trace = TRACES / "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json"
    scanned = discovery.scan_logdir(str(trace.parent))
    run = scanned.runs[0]
    results = {w.name: [report.analyze_span(str(trace.parent), run, s) for s in w.spans] for w in run.workers}
    assert len(results) == 1
    part = next(iter(results.values()))[0]["distributed"]
    assert part["rank"] is None and part["device"] == "cpu" and part["comm_source"] is None
    view = ranks.rank_view(results)
    assert not view["available"] and view["ranks"] == []
    assert view["not_available"] == {"ranks": ranks.SINGLE_WORKER}
    assert ranks.format_ranks_text(view) == f"ranks: n/a ({ranks.SINGLE_WORKER})"


@pytest.mark.parametrize("name,kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)", "reduce_scatter"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "send_recv"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", "broadcast"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "other"),
    ("gloo:all_reduce", "all_reduce"), ("nccl:all_to_all", "all_to_all"), ("nccl:_all_gather_base", "all_gather"),
    ("c10d::allreduce_", "all_reduce"), ("nccl:reduce", "reduce"), ("gloo:barrier", "barrier"),
])
def test_collective_kind(name, kind):
    assert distributed.collective_kind(name) == kind


def test_partial_is_small_plain_json(cpu_3rank):
    _, results = _view(cpu_3rank, "cpu3")
    part = results["beta"][0]["distributed"]
    text = json.dumps(part, allow_nan=False)  # plain JSON: no numpy, no NaN
    assert len(text) < 4096 and json.loads(text) == part
    assert not any(isinstance(v, float) and math.isnan(v) for v in part["steps"][0]["collectives"]["dur_us"])


def _union(intervals):
    """Plain-Python union of (start, end) pairs: sorted sweep, independent of analysis/intervals."""
    out = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length_in(union, lo, hi):
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in union)


@pytest.mark.parametrize("path,rank,overlap_pct", [
    ("hta/nccl_parser_config/nccl_data.json.gz", 0, 15.61),
    ("tracelens/mi300/resnet_act_checkpoint.json.gz", 0, 25.25),
])
def test_overlap_on_real_multi_gpu_traces(path, rank, overlap_pct):
    """Per-rank overlap on real NCCL/RCCL traces, checked against a plain-json sweep:
    communication = kernels named nccl/rccl, compute = the other kernels; overlapped =
    |comm ∩ compute| and exposed = |comm| - overlapped inside each of our step windows
    (the windows themselves are pinned to tbp elsewhere). HTA's get_comm_comp_overlap is
    overlapped / (overlapped + exposed) per iteration, averaged over iterations, over the
    host ProfilerStep spans without the last step; ours is the ratio of sums over the
    stretched included steps, so the two agree only where those windows and weights agree
    (the oracle has no HTA overlap number to compare with)."""
    full = TRACES / path
    with gzip.open(full, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
               if e.get("ph") == "X" and e.get("cat") == "kernel"]
    is_comm = [("nccl" in n.lower() or "rccl" in n.lower()) for _, _, n in kernels]
    comm = _union([(s, e) for (s, e, _), c in zip(kernels, is_comm) if c])
    comp = _union([(s, e) for (s, e, _), c in zip(kernels, is_comm) if not c])
    both = _union([(max(a, c), min(b, d)) for a, b in comm for c, d in comp if max(a, c) < min(b, d)])

    scanned = discovery.scan_logdir(str(full.parent))
    run = scanned.runs[0]
    span = next(s for w in run.workers for s in w.spans if s.path.endswith(full.name))
    result = report.analyze_span(str(full.parent), run, span)
    part = result["distributed"]
    assert part["rank"] == rank and part["device"] == "gpu" and part["comm_source"] == "kernels"
    found = steps_mod.find_steps(loader.load_trace(str(full)))
    window = {int(n): (float(a), float(b)) for n, a, b in zip(found.inc_numbers, found.inc_start, found.inc_end)}
    per_step = result["report"]["breakdown_per_step"]
    assert [s["step"] for s in part["steps"]] == [s["step"] for s in per_step]
    ov = ex = 0.0
    for s in part["steps"]:
        lo, hi = window[s["step"]]
        assert s["overlapped_us"] == pytest.approx(_length_in(both, lo, hi), abs=0.01)  # 10 ns: float64 at epoch-sized ts
        assert s["exposed_comm_us"] == pytest.approx(_length_in(comm, lo, hi) - _length_in(both, lo, hi), abs=0.01)  # 10 ns: float64 at epoch-sized ts
        ov += s["overlapped_us"]
        ex += s["exposed_comm_us"]
    assert 100 * ov / (ov + ex) == pytest.approx(overlap_pct, abs=0.01)
    # every collective has a kind: on ROCm (ncclDevKernel_Generic) it comes from the
    # enclosing nccl:all_reduce / nccl:broadcast CPU span
    kinds = [k for s in part["steps"] for k in s["collectives"]["kind"]]
    assert kinds and set(kinds) <= {"all_reduce", "broadcast"}
    # the report's communication overlap (§8, one window over all steps) says the same here
    assert result["report"]["communication"]["overlap_pct"] == pytest.approx(overlap_pct, abs=0.01)


def test_mfu_per_rank_is_the_ratio_of_sums_of_the_rank_spans():
    """Two 'ranks' made of the H100 FP32 matmul demo run's two spans: rank 0 has one span
    (its MFU is the span's own flops.mfu_pct), rank 1 both (Σ ideal_us / Σ step_us, not the
    mean of the two percentages); a rank without FLOPs (CPU input demo) gives None."""
    import math

    from conftest import DEMO_LOGS

    run_dir = DEMO_LOGS / "h100_fp32_matmul"
    res = [report.analyze_trace(loader.load_trace(str(p)), span=p.name)
           for p in sorted(run_dir.glob("*.pt.trace.json.gz"))]
    view = ranks.rank_view({"rank0": res[:1], "rank1": res})
    rows = {r["worker"]: r for r in view["ranks"]}
    f0, f1 = res[0]["report"]["flops"], res[1]["report"]["flops"]
    assert rows["rank0"]["mfu_pct"] == pytest.approx(f0["mfu_pct"])
    assert rows["rank0"]["tflops"] == pytest.approx(f0["tflops"])
    want = 100 * (f0["ideal_us"] + f1["ideal_us"]) / (f0["step_us"] + f1["step_us"])
    assert rows["rank1"]["mfu_pct"] == pytest.approx(want) and 60 < want < 80  # fp32 GEMMs at ~69 % of the fp32 peak
    cpu = [report.analyze_trace(loader.load_trace(str(p)))
           for p in sorted((DEMO_LOGS / "input_bound_nw0").glob("*.pt.trace.json.gz"))]
    view = ranks.rank_view({"a": cpu[:1], "b": cpu[1:]})
    assert all(r["mfu_pct"] is None and r["tflops"] is None for r in view["ranks"])
    assert not any(isinstance(r["mfu_pct"], float) and math.isnan(r["mfu_pct"]) for r in view["ranks"])
