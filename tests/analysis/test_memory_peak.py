"""Memory at the peak (METRICS.md §7, analysis/memory_peak.py) on hand-made traces whose
live set is counted by hand, hostile [memory] events, and the shared GPT-2 H100 trace."""
from __future__ import annotations

from pathlib import Path

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import memory_peak as mp
from tb_bottleneck_plugin.analysis.operators import host_nesting
from tb_bottleneck_plugin.analysis.steps import find_steps
from tb_bottleneck_plugin.trace.loader import load_trace
from tests.trace_builder import H100, TraceBuilder

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces" / "h100"
GPT2 = SHARED / "gpt2_bf16_eager"


def _training_step(tb: TraceBuilder) -> TraceBuilder:
    """One step: forward 10-50 (a Linear module), backward 60-90 on the autograd thread
    (tid 2), optimizer 100-120; 1000 bytes resident before the first event.

    ts: bytes @ addr -> Total Allocated
      5: -500 @ 9 ->  500  a block allocated before the window is freed
     12: +100 @ 1 ->  600  forward, freed in backward at 70: an activation
     20:  +50 @ 2 ->  650  forward, freed at 30 in forward: a temporary
     65: +200 @ 3 ->  800  backward, freed in the optimizer at 115: a gradient
     66: +300 @ 4 -> 1100  backward, freed at 80 in backward: a temporary   <- the peak
    105: +350 @ 5 -> 1050  optimizer, never freed: optimizer state
    106:  +10 @ 6 -> 1060  optimizer, freed at 107: an optimizer temporary
    Live at the peak: resident 500 + activation 100 + gradient 200 + temporary 300 = 1100."""
    tb.step(1, 0, 130)
    tb.cpu("train.py(3): step", 1, 128, cat="python_function")
    tb.cpu("nn.Module: Linear_0", 10, 40, cat="python_function")
    tb.cpu("aten::mm", 11, 4)
    tb.cpu("aten::gelu", 19, 12)
    tb.cpu("autograd::engine::evaluate_function: MmBackward0", 60, 30, tid=2)
    tb.cpu("aten::mm", 64, 4, tid=2)
    tb.cpu("Optimizer.step#AdamW.step", 100, 20)
    total = 1000
    for ts, nbytes, addr, tid in [(5, -500, 9, 1), (12, 100, 1, 1), (20, 50, 2, 1), (30, -50, 2, 1),
                                  (65, 200, 3, 2), (66, 300, 4, 2), (70, -100, 1, 2), (80, -300, 4, 2),
                                  (105, 350, 5, 1), (106, 10, 6, 1), (107, -10, 6, 1), (115, -200, 3, 1)]:
        total += nbytes
        tb.memory(ts, nbytes, addr, total, tid=tid)
    return tb


def _section(trace, na=None):
    steps = find_steps(trace)
    return mp.peak_holders(trace, steps, host=host_nesting(trace), not_available=na)


def test_live_set_by_category_op_module(tmp_path):
    trace = _training_step(TraceBuilder(props=(H100,))).load(tmp_path)
    na = {}
    sec = _section(trace, na)["cuda:0"]
    assert sec["peak_allocated_bytes"] == 1100 and sec["peak_ts_us"] == 66 and sec["peak_step"] == 1
    assert sec["categories"] == {"resident_before_window": 500, "activations": 100, "gradients": 200,
                                 "optimizer_state": 0, "optimizer_temporaries": 0, "other_temporaries": 300}
    assert sec["live_bytes"] == 1100 and sec["live_blocks"] == 3
    rows = {(h["category"], h["op"], h["module"]): h["bytes"] for h in sec["holders"]}
    assert rows == {("other_temporaries", "aten::mm", mp.NO_MODULE): 300, ("gradients", "aten::mm", mp.NO_MODULE): 200,
                    ("activations", "aten::mm", "Linear_0"): 100}
    assert sec["by_line"][0] == {"line": mp.NO_LINE, "bytes": 500, "blocks": 2}  # the autograd thread: no frames
    assert {"line": "train.py(3): step", "bytes": 100, "blocks": 1} in sec["by_line"]
    assert sec["capacity_bytes"] == H100["totalGlobalMem"] and sec["headroom_bytes"] == H100["totalGlobalMem"] - 1100
    # (capacity - (peak - activations)) / activations
    assert sec["batch_scale_fit_estimate"] == pytest.approx((H100["totalGlobalMem"] - 1000) / 100)
    assert sec["per_step"][0]["categories"] == sec["categories"]
    assert not [k for k in na if k.startswith("memory_peak.cuda:0") and not k.endswith(("by_module",))]


def test_optimizer_state_and_reused_address(tmp_path):
    """After the peak moves into the optimizer, its state and temporaries are named; an
    address allocated again after its free is a new block."""
    tb = TraceBuilder(props=(H100,))
    tb.step(1, 0, 130)
    tb.cpu("autograd::engine::evaluate_function: MmBackward0", 60, 30)
    tb.cpu("Optimizer.step#AdamW.step", 100, 20)
    total = 0
    for ts, nbytes, addr in [(65, 200, 3), (105, 400, 3 + 100), (106, 1000, 6), (107, -1000, 6),
                             (108, 700, 6), (109, -700, 6), (115, -200, 3)]:
        total += nbytes
        tb.memory(ts, nbytes, addr, total)
    sec = _section(tb.load(tmp_path))["cuda:0"]
    assert sec["peak_allocated_bytes"] == 1600 and sec["peak_ts_us"] == 106
    assert sec["categories"]["gradients"] == 200 and sec["categories"]["optimizer_state"] == 400
    assert sec["categories"]["optimizer_temporaries"] == 1000 and sec["categories"]["resident_before_window"] == 0


HOSTILE = {
    # name: (events as (ts, bytes, addr, total), words in the reason)
    "allocated twice while live": ([(1, 100, 1, 100), (2, 100, 1, 200)], "never freed"),
    "double free": ([(1, 100, 1, 300), (2, -100, 1, 200), (3, -100, 1, 100)], "already freed"),
    "size mismatch": ([(1, 100, 1, 100), (2, -60, 1, 40)], "size other than"),
    "totals do not follow": ([(1, 100, 1, 100), (2, 100, 2, 500)], "does not follow"),
    "absurd size": ([(1, 1 << 60, 1, 1 << 60)], "2^53"),
    "negative total": ([(1, 100, 1, 100), (2, -150, 7, -50)], "Total Allocated"),
    "unmatched frees beyond resident": ([(1, 100, 1, 100), (2, -50, 7, 50)], "unmatched frees"),
    "no address": ([(1, 100, -1, 100)], "Addr"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_events_are_na_with_a_reason(tmp_path, name):
    events, words = HOSTILE[name]
    tb = TraceBuilder(props=(H100,))
    tb.step(1, 0, 10)
    for ts, nbytes, addr, total in events:
        tb.memory(ts, nbytes, addr, total)
    trace = tb.load(tmp_path)
    na = {}
    sec = _section(trace, na)
    assert "cuda:0" not in sec  # no breakdown at all rather than a wrong one
    reason = na.get("memory_peak.cuda:0")
    assert reason and words in reason
    rep = report.analyze_trace(trace)["report"]
    assert rep["memory_peak"] is None and rep["not_available"].get("memory_peak.cuda:0")
    assert not rep.get("errors")


def test_no_memory_events(tmp_path):
    tb = TraceBuilder()
    tb.step(1, 0, 10)
    rep = report.analyze_trace(tb.load(tmp_path))["report"]
    assert rep["memory_peak"] is None and "profile_memory" in rep["not_available"]["memory_peak"]


@pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/traces/h100")
def test_gpt2_h100_activations_lead_and_live_set_sums_to_peak():
    """GPT-2 (81,912,576 parameters, AdamW, bf16 autocast, batch 8 x 1024, profile_memory):
    activations are the largest category at the peak; the live set sums to the peak allocated
    (within 0.1 %: exactly) and to the memory section's peak, counted independently here from
    the raw events' Total Allocated."""
    import gzip
    import json

    path = next(GPT2.glob("*.pt.trace.json.gz"))
    raw = json.load(gzip.open(path))["traceEvents"]
    raw_peak = max(e["args"]["Total Allocated"] for e in raw
                   if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    rep = report.analyze_trace(load_trace(str(path)))["report"]
    sec = rep["memory_peak"]["cuda:0"]
    cats = sec["categories"]
    assert sec["peak_allocated_bytes"] == raw_peak == rep["memory"]["cuda:0"]["peak_allocated_bytes"]
    assert abs(sum(cats.values()) - raw_peak) <= 0.001 * raw_peak
    assert max(cats, key=cats.get) == "activations"
    # the resident level holds at least the fp32 parameters and AdamW's two moments
    assert cats["resident_before_window"] >= 3 * 4 * 81_912_576
    # the six transformer blocks are the checkpointing candidates
    assert {c["module"].rsplit("_", 1)[0] for c in sec["checkpoint_candidates"]} == {"GPT2Block"}
    assert any(h["op"] == "aten::_log_softmax" and h["category"] == "activations" for h in sec["holders"])


def _peak_report(pct: float, cands=True) -> dict:
    cap = 80 << 30
    peak = int(cap * pct / 100)
    act = peak // 2
    entry = {"peak_allocated_bytes": peak, "capacity_bytes": cap, "peak_pct_of_capacity": pct,
             "categories": {"resident_before_window": peak - act, "activations": act, "gradients": 0,
                            "optimizer_state": 0, "optimizer_temporaries": 0, "other_temporaries": 0},
             "checkpoint_candidates": ([{"module": "Block_0", "activation_bytes": act // 4, "pct_of_activations": 25.0},
                                        {"module": "Block_1", "activation_bytes": act // 4, "pct_of_activations": 25.0}]
                                       if cands else [])}
    return {"memory_peak": {"cuda:0": entry}, "device_labels": {"cuda:0": "GPU 0"}}


def test_memory_peak_advice_only_near_capacity_priced_in_bytes():
    from tb_bottleneck_plugin import thresholds as T
    from tb_bottleneck_plugin.judge import recommendations as R

    assert R.rule_memory_peak(_peak_report(T.MEMORY_PEAK_PCT - 0.1)) is None
    rec = R.rule_memory_peak(_peak_report(T.MEMORY_PEAK_PCT))
    assert rec["severity"] == "medium" and rec["device"] == "cuda:0"
    act = _peak_report(T.MEMORY_PEAK_PCT)["memory_peak"]["cuda:0"]["categories"]["activations"]
    assert rec["frees_bytes"] == 2 * (act // 4) == rec["numbers"]["frees_bytes"]
    assert "torch.utils.checkpoint.checkpoint" in rec["action"] and "Block_0, Block_1" in rec["action"]
    assert R.price(rec, {})["gain_source"] == "memory"
    assert R.rule_memory_peak(_peak_report(T.MEMORY_PEAK_HIGH_PCT))["severity"] == "high"
    bare = R.rule_memory_peak(_peak_report(90.0, cands=False))
    assert bare["frees_bytes"] is None and "with_stack=True" in bare["action"]
    # the GPT-2 H100 run uses 11 % of its 79 GiB: no advice


@pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/traces/h100")
def test_api_holders_frame_and_cli_text():
    pytest.importorskip("pandas")
    import tb_bottleneck_plugin as tbb
    from tb_bottleneck_plugin.views.text_report import format_report

    rep = tbb.analyze(str(GPT2))
    df = rep.memory_holders_df()
    gpu = df[df.device == "cuda:0"]
    sec = rep.report["memory_peak"]["cuda:0"]
    assert list(gpu.bytes) == [h["bytes"] for h in sec["holders"]]
    assert gpu.iloc[0].op == "aten::_log_softmax" and gpu.iloc[0].peak_allocated_bytes == sec["peak_allocated_bytes"]
    text = format_report(rep.report)
    assert "memory at the peak GPU 0" in text and "activation-checkpointing candidates: GPT2Block_" in text
    assert "memory at the peak CPU" not in text  # the host's bytes beside a GPU's are left out


@pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/traces/h100")
def test_gpt2_candidates_carry_their_recompute_cost():
    """A candidate's recompute cost is its forward GPU time per step: the module tree's
    gpu_fwd_us (§17) over the 3 recorded steps, and that share of the mean step."""
    path = next(GPT2.glob("*.pt.trace.json.gz"))
    rep = report.analyze_trace(load_trace(str(path)))["report"]
    mods = {m["module"]: m for m in rep["source_attribution"]["modules"]}
    assert rep["steps"]["count"] == 3
    for c in rep["memory_peak"]["cuda:0"]["checkpoint_candidates"]:
        assert c["recompute_gpu_us_per_step"] == pytest.approx(mods[c["module"]]["gpu_fwd_us"] / 3)
        assert c["recompute_step_pct"] == pytest.approx(100 * c["recompute_gpu_us_per_step"] / rep["avg_step_us"])
        assert 0 < c["recompute_step_pct"] < 10  # one transformer block's forward: a few % of the step


def test_same_address_on_two_devices_is_two_blocks(tmp_path):
    """Pairing is per device: address 1 live on GPU 0 and GPU 1 at once is no reuse."""
    tb = TraceBuilder(props=(H100, dict(H100, id=1)))
    tb.step(1, 0, 100)
    tb.memory(10, 100, 1, 100, device=0).memory(11, 300, 1, 300, device=1)
    tb.memory(20, -100, 1, 0, device=0).memory(21, -300, 1, 0, device=1)
    na = {}
    sec = _section(tb.load(tmp_path), na)
    assert sec["cuda:0"]["peak_allocated_bytes"] == 100 and sec["cuda:1"]["peak_allocated_bytes"] == 300
    # freed at 21, inside a step without backward whose forward lasts to the step's end: a temporary
    assert sec["cuda:1"]["categories"]["other_temporaries"] == 300
    assert not any(k in na for k in ("memory_peak.cuda:0", "memory_peak.cuda:1"))


def test_summary_keeps_the_largest_span_peak(tmp_path):
    results = []
    for i, size in enumerate((400, 900)):
        tb = TraceBuilder(props=(H100,))
        tb.step(1, 0, 100)
        tb.memory(10, size, 1, size).memory(20, -size, 1, 0)
        results.append(report.analyze_trace(tb.load(tmp_path, f"s{i}.pt.trace.json"), worker="w", span=f"s{i}"))
    summary = report.combine_results(results, run="r", worker="w")["report"]
    sec = summary["memory_peak"]["cuda:0"]
    assert sec["peak_allocated_bytes"] == 900 and sec["span"] == "s1" and sec["per_step"] == []


def _snapshot(reserved_free: int):
    """torch.cuda.memory._snapshot()'s structure: one segment on device 0 with two allocated
    blocks (their allocation frames, innermost first) and a free one of ``reserved_free``."""
    frames = [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
              {"filename": "train.py", "line": 42, "name": "step"}]
    blocks = [{"size": 600, "state": "active_allocated", "frames": frames},
              {"size": 200, "state": "active_allocated", "frames": frames[1:]},
              {"size": reserved_free, "state": "inactive"}]
    return {"segments": [{"device": 0, "address": 1 << 40, "total_size": sum(b["size"] for b in blocks),
                          "blocks": blocks}], "device_traces": [[]]}


@pytest.mark.parametrize("free, ok", [(1200, True), (100, False)])
def test_snapshot_blocks_with_stacks_or_na_for_another_run(tmp_path, free, ok):
    """The run directory's snapshot adds its largest blocks with their frames (the user's
    first) and its free space; one that reserves less than the trace's last [memory] event
    (2000 B here) cannot be this run's: n/a with the reason, the breakdown stands."""
    import pickle

    tb = TraceBuilder(props=(H100,))
    tb.step(1, 0, 100)
    tb.memory(10, 800, 1, 800, reserved=2000).memory(20, -800, 1, 0, reserved=2000)
    run = tmp_path / "run"
    tb.write(run / "worker0.1700000000000.pt.trace.json")
    (run / "memory_snapshot.pickle").write_bytes(pickle.dumps(_snapshot(free)))
    import tb_bottleneck_plugin as tbb

    rep = tbb.analyze(str(run), jobs=1).report
    sec = rep["memory_peak"]["cuda:0"]
    assert sec["peak_allocated_bytes"] == 800
    if ok:
        snap = sec["snapshot"]
        assert (snap["reserved_bytes"], snap["allocated_bytes"], snap["free_bytes"]) == (2000, 800, 1200)
        assert [b["bytes"] for b in snap["largest_blocks"]] == [600, 200]
        assert snap["largest_blocks"][0]["frames"][0] == "train.py(42): step"  # the user's frame first
    else:
        assert "snapshot" not in sec
        assert "another run" in rep["not_available"]["memory_peak.cuda:0.snapshot"]


@pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/traces/h100")
def test_live_set_sums_to_total_allocated_at_every_instant():
    """At any event, the live set by category (prefix sums, as per step) sums to that event's
    Total Allocated read from the trace, and equals the direct count of live blocks."""
    import numpy as np

    mem = load_trace(str(next(GPT2.glob("*.pt.trace.json.gz")))).memory
    rows = np.flatnonzero(mem.device_type == 1)
    rows = rows[np.argsort(mem.ts[rows], kind="stable")]
    b, ta, addr, ts = mem.bytes[rows], mem.total_allocated[rows], mem.addr[rows], mem.ts[rows]
    allocs, frees, pre = mp._blocks(b, addr)
    base = int(ta[0]) - int(b[0])
    cat = np.arange(len(allocs)) % (len(mp.CATEGORIES) - 1) + 1  # any labelling: the sums must hold
    points = np.arange(0, len(b), 7)
    fast = mp._categories_at(points, b, allocs, frees, pre, base, cat)
    assert (fast.sum(axis=1) == ta[points]).all()
    for at in points[:: max(1, len(points) // 25)].tolist():
        slow, _, _ = mp._decompose(at, ts, b, allocs, frees, pre, base, cat)
        assert fast[points.tolist().index(at)].tolist() == [slow[c] for c in mp.CATEGORIES]
