"""Issue 34: FLOPs of ops whose kernels ran (item 3), nothing physically impossible on the
roofline (item 9), each precision against its own roof (item 1). METRICS.md §15.

Ground truth: hand-built traces (tests/trace_builder.py) whose numbers follow from the
shapes and kernel times written here and the peaks of analysis/peaks.py; the shared H100
traces (toy_graph_break and toy_no_break are the same model: the same FLOPs per step;
GPT-2 against FlopCounterMode in ../shared/oracles/h100_truth.json); no share above
100 % on any shared trace."""
from __future__ import annotations

import json
import os

import pytest

from conftest import ORACLES, TRACES, needs_traces, real_report
from test_flops import _shared_traces  # the same trace list as the peak checks there
from trace_builder import H100, TraceBuilder

from tb_bottleneck_plugin import report, thresholds as T
from tb_bottleneck_plugin.analysis import flops, peaks, units
from tb_bottleneck_plugin.judge import cards

BF16, F32, E4M3 = "c10::BFloat16", "float", "c10::Float8_e4m3fn"
H100_SXM = peaks.match(H100["name"])


def _op(b, name, ts, dur, dims, types, kernel=None, kdur=0, kernel_ts=None):
    """A CPU op with recorded shapes; with ``kernel``, one launch inside it."""
    b.cpu(name, ts, dur, **{"Input Dims": dims, "Input type": types})
    if kernel:
        b.launch(kernel, ts + 1, kernel_ts if kernel_ts is not None else ts + 2, kdur, call_dur=1)


def _report(tmp_path, b, name="t.pt.trace.json"):
    return report.analyze_trace(b.load(tmp_path, name))["report"]


def _na_never_beside_a_number(rep):
    """Every flops n/a key names a null (issue 20: n/a beside a number contradicts)."""
    for key in rep["not_available"]:
        value = rep
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        assert not isinstance(value, (int, float)) or isinstance(value, bool), (key, value)


# ---------------------------------------------------------------- item 3: ops that launched nothing


def _compiling_trace(props=(H100,), linked=True):
    """Three 5 ms steps; in each an aten::linear -> aten::addmm (4096³, bf16) that launched a
    1 ms GEMM kernel and an aten::add that launched a 50 µs kernel; in step 2 the same
    linear/addmm and add again, traced while compiling (shapes, no kernel)."""
    m = 4096
    b = TraceBuilder(props=props)
    for s in range(3):
        t0 = 10_000 + s * 5000
        b.step(s + 1, t0, 4990)
        b.cpu("aten::linear", t0 + 10, 1000, **{"Input Dims": [[m, m], [m, m], [m]], "Input type": [BF16] * 3})
        _op(b, "aten::addmm", t0 + 20, 900, [[m], [m, m], [m, m], [], []], [BF16] * 3 + ["Scalar", "Scalar"],
            kernel="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas" if linked else None, kdur=1000)
        _op(b, "aten::add", t0 + 1100, 100, [[m, m], [m, m], []], [BF16, BF16, "Scalar"],
            kernel="vectorized_elementwise_kernel<add>" if linked else None, kdur=50)
        if not linked:  # kernels without a correlation id: nothing links them to an op
            b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", t0 + 22, 1000)
            b.kernel("vectorized_elementwise_kernel<add>", t0 + 1102, 50)
        if s == 1:  # Dynamo/AOTAutograd tracing the graph again: the ops run on fake tensors
            b.cpu("Torch-Compiled Region: 1/4", t0 + 1500, 3000, cat="user_annotation")
            b.cpu("aten::linear", t0 + 1600, 500, **{"Input Dims": [[m, m], [m, m], [m]], "Input type": [BF16] * 3})
            _op(b, "aten::addmm", t0 + 1610, 400, [[m], [m, m], [m, m], [], []], [BF16] * 3 + ["Scalar", "Scalar"])
            _op(b, "aten::add", t0 + 2200, 100, [[m, m], [m, m], []], [BF16, BF16, "Scalar"])
    return b


def test_ops_that_launched_no_kernel_add_no_flops(tmp_path):
    m = 4096
    sec = _report(tmp_path, _compiling_trace())["flops"]
    per_call = 2 * m ** 3
    # before issue 34: 4 × per_call (the traced addmm counted too): step 2 = 2 × the others
    assert sec["flops"] == 3 * per_call
    assert [r["flops"] for r in sec["per_step"]] == [per_call] * 3
    assert sec["counted_calls"] == 3
    assert sec["unlaunched_calls"] == 1 and sec["unlaunched_flops"] == per_call
    # the traced aten::add moved no bytes either: only the three that ran
    assert sec["by_class"]["elementwise"]["bytes"] == 3 * 3 * m * m * 2
    assert sec["by_class"]["elementwise"]["calls"] == 3
    assert sec["uncounted_calls"] == {}


def test_without_linked_kernels_every_op_counts_as_before(tmp_path):
    """A CPU-only trace, and a GPU trace whose kernels carry no correlation id: no kernel to
    check an op against, so the ops with shapes count as they did."""
    m = 4096
    sec = _report(tmp_path, _compiling_trace(linked=False), "u.pt.trace.json")["flops"]
    assert sec["flops"] == 4 * 2 * m ** 3 and sec["unlaunched_calls"] == 0
    b = TraceBuilder(props=())
    b.step(1, 1000, 2000)
    b.cpu("aten::mm", 1100, 500, **{"Input Dims": [[100, 200], [200, 300]], "Input type": [F32, F32]})
    b.cpu("aten::mm", 1700, 500, **{"Input Dims": [[100, 200], [200, 300]], "Input type": [F32, F32]})
    sec = _report(tmp_path, b, "c.pt.trace.json")["flops"]
    assert sec["flops"] == 2 * 2 * 100 * 200 * 300 and sec["unlaunched_calls"] == 0


TRUTH = ORACLES / "h100_truth.json"


def _h100(run):
    d = TRACES / "h100" / run
    return real_report(f"h100/{run}/{next(iter(os.listdir(d)))}")


@needs_traces
def test_toy_graph_break_counts_the_flops_of_toy_no_break():
    """The same four MLP blocks; the break run recompiles inside the profiled steps (compile
    ids 1/4-1/6): its traced ops carry shapes but launch nothing. Before: 1.9241e12 FLOPs per
    step against 1.6493e12 (+16.7 %)."""
    brk, ok = _h100("toy_graph_break")["flops"], _h100("toy_no_break")["flops"]
    assert brk["flops_per_step"] == pytest.approx(ok["flops_per_step"], rel=0.01)
    assert brk["flops_per_step"] == ok["flops_per_step"] == pytest.approx(1.6493e12, rel=1e-4)
    for row in brk["per_step"]:
        assert row["flops"] == pytest.approx(ok["flops_per_step"], rel=0.01)
    assert brk["unlaunched_calls"] > 0 and ok["unlaunched_calls"] == 0


@needs_traces
@pytest.mark.parametrize("run,rel", [("gpt2_bf16_eager", 0.0), ("gpt2_bf16_compiled", 1e-4)])
def test_gpt2_still_equals_flop_counter_mode(run, rel):
    """Eager exactly; compiled +0.004 % (Inductor pads the vocabulary to 50,264)."""
    truth = json.loads(TRUTH.read_text())["runs"][run]["flops_per_step_fwd_bwd"]
    sec = _h100(run)["flops"]
    assert sec["unlaunched_calls"] == 0
    for row in sec["per_step"]:
        assert row["flops"] == pytest.approx(truth, rel=rel, abs=0)


# ---------------------------------------------------------------- item 9: nothing physically impossible


def _impossible_trace():
    """One 5 ms step on an H100 SXM (3,350 GB/s, bf16 989.4 TFLOP/s): an aten::add of two
    4096² bf16 tensors (3 × 4096² × 2 B = 100.7 MB with its output) whose kernel lasts 10 µs
    (10,066 GB/s: 300 % of the bandwidth), and an aten::mm 8192³ bf16 (1.0995e12 FLOPs) whose
    kernel lasts 500 µs (2,199 TFLOP/s: above the peak)."""
    b = TraceBuilder(props=(H100,))
    b.step(1, 10_000, 5000)
    _op(b, "aten::add", 10_100, 100, [[4096, 4096], [4096, 4096], []], [BF16, BF16, "Scalar"],
        kernel="vectorized_elementwise_kernel<add>", kdur=10)
    _op(b, "aten::mm", 10_300, 700, [[8192, 8192], [8192, 8192]], [BF16, BF16],
        kernel="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cublas", kdur=500)
    return b


def test_no_bandwidth_above_the_memory_and_no_rate_above_the_peak(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)  # a tiny trace: the card's words, not the guard's
    monkeypatch.setattr(T, "MIN_KERNELS_TO_JUDGE", 0)
    rep = _report(tmp_path, _impossible_trace())
    sec, na = rep["flops"], rep["not_available"]
    assert H100_SXM.hbm_gbps == 3350.0 and H100_SXM.tflops["bf16"] == 989.4
    ew = sec["by_class"]["elementwise"]
    assert ew["bytes"] == 3 * 4096 * 4096 * 2 and ew["kernel_us"] == 10
    # before: achieved_gbps 10,066 and roofline_pct 300.5 (of 3,350 GB/s)
    assert ew["achieved_gbps"] is None and ew["roofline_pct"] is None
    assert ew["bound"] == "memory"  # no FLOPs: memory-bound whatever the bytes
    assert "10,066 GB/s" in na["flops.by_class.elementwise.roofline_pct"]
    assert "3,350 GB/s" in na["flops.by_class.elementwise.achieved_gbps"]
    gemm = sec["by_class"]["gemm"]
    assert gemm["flops"] == 2 * 8192 ** 3
    # before: 2,199 TFLOP/s, 222 % of the roofline
    assert gemm["achieved_tflops"] is None and gemm["roofline_pct"] is None
    assert gemm["bound"] == "compute"  # the intensity still says so
    assert "2,199.0 TFLOP/s" in na["flops.by_class.gemm.achieved_tflops"]
    assert "989.4 TFLOP/s" in na["flops.by_class.gemm.achieved_tflops"]
    assert sec["by_precision"]["bf16"]["achieved_tflops"] is None
    assert sec["by_precision"]["bf16"]["pct_of_peak"] is None
    assert "flops.by_precision.bf16.pct_of_peak" in na
    by_name = {k["name"]: k for k in sec["kernels"]}
    add = by_name["vectorized_elementwise_kernel<add>"]
    assert add["roofline_pct"] is None and add["achieved_gbps"] is None
    mm = by_name["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cublas"]
    assert mm["achieved_tflops"] is None and mm["pct_of_peak"] is None and mm["roofline_pct"] is None
    assert "vectorized_elementwise_kernel<add>" in na["flops.kernels.roofline_pct"]
    assert "sm90_xmma_gemm" in na["flops.kernels.achieved_tflops"]
    _na_never_beside_a_number(rep)
    # the MFU is over the step time (22 % of the peak): a number, judged
    assert sec["mfu_pct"] == pytest.approx(100 * 2 * 8192 ** 3 / (H100_SXM.tflops["bf16"] * 1e12) / 5000e-6)
    assert rep["verdicts"]["mfu"]["value"] == sec["mfu_pct"]


def test_a_summary_of_impossible_spans_stays_null(tmp_path):
    a = report.analyze_trace(_impossible_trace().load(tmp_path, "a.pt.trace.json"))
    b = report.analyze_trace(_impossible_trace().load(tmp_path, "b.pt.trace.json"))
    both = report.combine_results([a, b], run="r", worker="w")["report"]
    ew = both["flops"]["by_class"]["elementwise"]
    assert ew["roofline_pct"] is None and ew["achieved_gbps"] is None
    assert "flops.by_class.elementwise.roofline_pct" in both["not_available"]
    _na_never_beside_a_number(both)


@needs_traces
@pytest.mark.parametrize("rel", _shared_traces())
def test_no_share_above_100_pct_on_a_shared_trace(rel):
    rep = real_report(rel)
    sec = rep["flops"]
    if not sec:
        return
    peak = sec["peak"] or {}
    hbm, tf = peak.get("hbm_gbps"), peak.get("tflops") or {}
    rows = [(f"class {c}", v) for c, v in sec["by_class"].items()]
    rows += [(f"class {c} {p}", r) for c, v in sec["by_class"].items() for p, r in (v.get("by_precision") or {}).items()]
    rows += [(f"kernel {k['name']}", k) for k in sec["kernels"]]
    for where, r in rows:
        assert r.get("roofline_pct") is None or r["roofline_pct"] <= 100, (rel, where, r["roofline_pct"])
        assert r.get("pct_of_peak") is None or r["pct_of_peak"] <= 100, (rel, where)
        if hbm and r.get("achieved_gbps") is not None:
            assert r["achieved_gbps"] <= hbm, (rel, where, r["achieved_gbps"])
        if r.get("achieved_tflops") and r.get("peak_tflops"):
            assert r["achieved_tflops"] <= r["peak_tflops"], (rel, where)
    for p, v in sec["by_precision"].items():
        assert v["pct_of_peak"] is None or v["pct_of_peak"] <= 100, (rel, p)
    _na_never_beside_a_number(rep)


@needs_traces
def test_the_a100_rank_trace_elementwise_share_is_physical():
    """HTA's DDP rank (A100 SXM 80GB, 2,039 GB/s): its elementwise class read 862.6 % of the
    bandwidth (17,588 GB/s) from the bytes of ops that launched nothing (views, ops on the
    host); one vectorized_elementwise_kernel still reads 2,285 GB/s (cached inputs): n/a."""
    rep = real_report("hta/negative_queue_length_values_check/rank0.json.gz")
    ew = rep["flops"]["by_class"]["elementwise"]
    assert ew["roofline_pct"] == pytest.approx(9.07, abs=0.01)
    assert ew["achieved_gbps"] == pytest.approx(184.9, abs=0.1)
    assert "2,039 GB/s" in rep["not_available"]["flops.kernels.roofline_pct"]


# ---------------------------------------------------------------- item 1: each precision against its own roof


F8, FB = 2 * 8192 ** 3, 2 * 4096 ** 3  # FLOPs of the fp8 and the bf16 GEMM
T8, TB = 1000.0, 400.0  # their kernels' µs
STEP = 5000.0
FP8_KERNEL = "sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x256x128_warpgroupsize2x1x1_cublas"
BF16_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"


def _fp8_bf16_trace(steps=1):
    """On an H100 SXM per step (5 ms): aten::_scaled_mm (8192³, e4m3, per-tensor scales; the
    kernel 1000 µs) and aten::mm (4096³, bf16; 400 µs)."""
    b = TraceBuilder(props=(H100,))
    for s in range(steps):
        t0 = 10_000 + s * STEP
        b.step(s + 1, t0, STEP)
        _op(b, "aten::_scaled_mm", t0 + 100, 200, [[8192, 8192], [8192, 8192], [], []], [E4M3, E4M3, F32, F32],
            kernel=FP8_KERNEL, kdur=T8, kernel_ts=t0 + 150)
        _op(b, "aten::mm", t0 + 400, 200, [[4096, 4096], [4096, 4096]], [BF16, BF16],
            kernel=BF16_KERNEL, kdur=TB, kernel_ts=t0 + 1200)
    return b


def test_fp8_and_bf16_gemms_each_against_their_own_peak(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    monkeypatch.setattr(T, "MIN_KERNELS_TO_JUDGE", 0)
    rep = _report(tmp_path, _fp8_bf16_trace())
    sec = rep["flops"]
    # the peaks this is computed from (analysis/peaks.py, H100 SXM dense)
    assert H100_SXM.tflops["fp8"] == 1978.9 and H100_SXM.tflops["bf16"] == 989.4
    # by hand: fp8 1.0995e12 FLOPs / 1000 µs = 1,099.5 TFLOP/s = 55.56 % of 1,978.9;
    # bf16 1.3744e11 FLOPs / 400 µs = 343.6 TFLOP/s = 34.73 % of 989.4 (17.36 % of the fp8
    # peak it was judged against before: the class's main precision is fp8)
    fp8_pct, bf16_pct = 55.5618, 34.7286
    assert 100 * F8 / (T8 * 1e-6) / 1978.9e12 == pytest.approx(fp8_pct, abs=1e-3)
    assert 100 * FB / (TB * 1e-6) / 989.4e12 == pytest.approx(bf16_pct, abs=1e-3)
    by_name = {k["name"]: k for k in sec["kernels"]}
    k8, kb = by_name[FP8_KERNEL], by_name[BF16_KERNEL]
    assert k8["precision"] == "fp8" and kb["precision"] == "bf16"
    assert k8["pct_of_peak"] == pytest.approx(fp8_pct, abs=1e-3)
    assert kb["pct_of_peak"] == pytest.approx(bf16_pct, abs=1e-3)
    assert kb["peak_tflops"] == 989.4 and k8["peak_tflops"] == 1978.9
    # both compute-bound (intensity 5,461 and 1,365 FLOP/B; ridges 590.7 and 295.3): % of the roof = % of peak
    assert k8["bound"] == kb["bound"] == "compute"
    assert k8["roofline_pct"] == pytest.approx(fp8_pct, abs=1e-3)
    assert kb["roofline_pct"] == pytest.approx(bf16_pct, abs=1e-3)
    gemm = sec["by_class"]["gemm"]
    assert gemm["precision"] == "fp8"  # the main precision (most FLOPs), still reported
    split = gemm["by_precision"]
    assert set(split) == {"fp8", "bf16"}
    assert split["fp8"]["flops"] == F8 and split["fp8"]["kernel_us"] == T8 and split["fp8"]["calls"] == 1
    assert split["bf16"]["flops"] == FB and split["bf16"]["kernel_us"] == TB and split["bf16"]["kernels"] == 1
    assert split["fp8"]["roofline_pct"] == pytest.approx(fp8_pct, abs=1e-3)
    assert split["bf16"]["roofline_pct"] == pytest.approx(bf16_pct, abs=1e-3)
    assert split["fp8"]["pct_of_peak"] == pytest.approx(fp8_pct, abs=1e-3)
    # the class: the time its work would take at each part's roof over its kernel time:
    # (555.62 µs + 138.91 µs) / 1400 µs = 49.61 % (before: all of it against the fp8 roof,
    # 883.5 TFLOP/s / 1,978.9 = 44.65 %)
    roof_us = F8 / 1978.9e12 * 1e6 + FB / 989.4e12 * 1e6
    assert roof_us == pytest.approx(555.618 + 138.914, abs=1e-2)
    assert gemm["roofline_pct"] == pytest.approx(100 * roof_us / (T8 + TB))
    assert gemm["bound"] == "compute"
    assert gemm["peak_tflops"] == pytest.approx((F8 + FB) / (roof_us * 1e-6) / 1e12)
    assert gemm["attainable_tflops"] == pytest.approx(gemm["peak_tflops"])
    # MFU: each precision's ideal time at its own peak over the step
    assert sec["mfu_split_pct"]["fp8"] == pytest.approx(100 * 555.618 / STEP, abs=1e-3)
    assert sec["mfu_split_pct"]["bf16"] == pytest.approx(100 * 138.914 / STEP, abs=1e-3)
    assert sec["mfu_pct"] == pytest.approx(100 * roof_us / STEP)
    card = rep["verdicts"]["mfu"]
    assert [r["precision"] for r in card["split"]] == ["fp8", "bf16"]
    assert card["split"][0]["mfu_pct"] == pytest.approx(11.112, abs=1e-3)
    assert card["split"][1]["peak_tflops"] == 989.4
    assert card["verdict"].startswith("14 % of H100 SXM peak · fp8 11 % of 1979 + bf16 2.8 % of 989 TFLOP/s")
    _na_never_beside_a_number(rep)


def test_the_precision_split_survives_a_summary(tmp_path):
    a = report.analyze_trace(_fp8_bf16_trace(steps=2).load(tmp_path, "a.pt.trace.json"))
    one = a["report"]["flops"]
    both = flops.UNIT.finish(units.merge([flops.UNIT.partial(a["report"]), flops.UNIT.partial(a["report"])]))
    for p in ("fp8", "bf16"):
        assert both["by_class"]["gemm"]["by_precision"][p]["flops"] == 2 * one["by_class"]["gemm"]["by_precision"][p]["flops"]
        assert both["by_class"]["gemm"]["by_precision"][p]["roofline_pct"] == pytest.approx(
            one["by_class"]["gemm"]["by_precision"][p]["roofline_pct"])
    assert both["by_class"]["gemm"]["roofline_pct"] == pytest.approx(one["by_class"]["gemm"]["roofline_pct"])
    assert {k["name"]: k["precision"] for k in both["kernels"]} == {FP8_KERNEL: "fp8", BF16_KERNEL: "bf16"}
    assert both["unlaunched_calls"] == 0


def test_one_precision_reads_as_before(tmp_path, monkeypatch):
    """A class of one precision: the same formulas and words as before issue 34."""
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    monkeypatch.setattr(T, "MIN_KERNELS_TO_JUDGE", 0)
    b = TraceBuilder(props=(H100,))
    b.step(1, 10_000, STEP)
    _op(b, "aten::mm", 10_400, 200, [[4096, 4096], [4096, 4096]], [BF16, BF16], kernel=BF16_KERNEL, kdur=TB)
    rep = _report(tmp_path, b)
    gemm = rep["flops"]["by_class"]["gemm"]
    assert gemm["attainable_tflops"] == 989.4 and gemm["roofline_pct"] == pytest.approx(34.7286, abs=1e-3)
    assert list(gemm["by_precision"]) == ["bf16"]
    v = rep["verdicts"]["mfu"]
    words = f"{v['value']:.0f} %" if v["value"] >= 9.5 else f"{v['value']:.2g} %"  # "2.8 %", "34 %"
    assert v["verdict"].startswith(f"{words} of H100 SXM bf16 peak · ")
    assert cards.CARD_FUNCTIONS["mfu"](rep)["split"][0]["precision"] == "bf16"
