"""FLOP columns of the Operator view (METRICS.md "Operator view: FLOPs"): the per-op FLOPs sum
to PyTorch's own FlopCounterMode count, and one op's TFLOP/s, % of peak and bound equal a hand
computation from the raw trace (shapes, correlation-linked kernels) and the H100 datasheet."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import DEMO_LOGS, ORACLES, TRACES
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import operators
from tb_bottleneck_plugin.trace.loader import load_trace

# NVIDIA H100 SXM5 datasheet: dense BF16 Tensor Core 989.4 TFLOP/s (1,979 with sparsity), HBM3 3.35 TB/s
H100_BF16_TFLOPS, H100_HBM_GBPS = 989.4, 3350.0


def _first(folder):
    paths = sorted(folder.glob("*.pt.trace.json*"))
    if not paths:
        pytest.skip(f"{folder} is missing")
    return paths[0]


def test_gpt2_eager_per_op_flops_sum_to_flopcountermode():
    path = _first(TRACES / "h100" / "gpt2_bf16_eager")
    truth = json.loads((ORACLES / "h100_truth.json").read_text())["runs"]["gpt2_bf16_eager"]
    want_per_step = truth["flops_per_step_fwd_bwd"]  # FlopCounterMode, recorded with the trace
    res = report.analyze_trace(load_trace(str(path)))
    fl = res["report"]["flops"]
    table = operators.view_table(res["operator_view"], None, "op")
    assert "flops" not in table["not_available"]
    assert table["rows_left_out"] == 0
    per_op = sum(r["flops"] for r in table["rows"] if r["flops"] is not None)
    assert per_op == pytest.approx(fl["flops_per_step"] * fl["steps"], rel=1e-12)
    assert per_op / fl["steps"] == pytest.approx(want_per_step, rel=0.01)
    # each step alone sums to that step's count too
    for s in res["operator_view"]["steps"]:
        t = operators.view_table(res["operator_view"], s, "op_shape")
        want = next(p["flops"] for p in fl["per_step"] if p["step"] == s)
        assert sum(r["flops"] or 0 for r in t["rows"]) == pytest.approx(want, rel=1e-12)
    # an op whose FLOPs sit on the op inside it says so; elementwise ops have bytes only
    rows = {r["name"]: r for r in table["rows"]}
    assert rows["aten::linear"]["flops"] is None and rows["aten::linear"]["flops_na"] == operators.NA_FLOPS_INNER
    assert rows["aten::add"]["flops"] is None and rows["aten::add"]["flop_bytes"] > 0
    assert rows["aten::add"]["bound"] == "memory"


def _hand_mm(path, steps):
    """aten::mm of the included steps from the raw JSON: FLOPs 2·M·K·N and bytes (a, b and
    the output × dtype size) from Input Dims / Input type, and the µs of the kernels launched
    by the runtime calls inside each call (correlation id)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        ev = json.load(f)["traceEvents"]
    windows = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in ev
               if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")
               and int(e["name"].split("#")[1]) in steps]
    mms = [e for e in ev if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"
           and any(lo <= e["ts"] < hi for _, lo, hi in windows)]
    calls = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    kernel_us = {}
    for k in ev:
        if k.get("cat") == "kernel":
            c = k["args"]["correlation"]
            kernel_us[c] = kernel_us.get(c, 0.0) + k["dur"]
    size = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4}
    flops = bytes_ = kus = 0.0
    for m in mms:
        (mm_, kk), (_, nn) = m["args"]["Input Dims"]
        ta, tb = m["args"]["Input type"]
        flops += 2 * mm_ * kk * nn
        bytes_ += mm_ * kk * size[ta] + kk * nn * size[tb] + mm_ * nn * size[ta]
        for c in calls:
            if c["tid"] == m["tid"] and m["ts"] <= c["ts"] <= m["ts"] + m["dur"]:
                kus += kernel_us.get(c["args"].get("correlation"), 0.0)
    return len(mms), flops, bytes_, kus


def test_one_ops_tflops_pct_of_peak_and_bound_by_hand():
    path = _first(DEMO_LOGS / "h100_bf16_autocast")
    res = report.analyze_trace(load_trace(str(path)))
    view = res["operator_view"]
    table = operators.view_table(view, None, "op")
    assert table["peak_gpu"] == "H100 SXM"
    row = next(r for r in table["rows"] if r["name"] == "aten::mm")
    n, flops, bytes_, kus = _hand_mm(path, set(view["steps"]))
    assert row["calls"] == n > 0
    assert row["flops"] == flops
    assert row["flop_bytes"] == bytes_
    assert row["tflops"] == pytest.approx(flops / kus / 1e6, rel=1e-6)
    assert row["pct_of_peak"] == pytest.approx(100 * flops / (H100_BF16_TFLOPS * 1e12) / (kus * 1e-6), rel=1e-6)
    ridge = H100_BF16_TFLOPS * 1e12 / (H100_HBM_GBPS * 1e9)  # FLOPs per byte where the roofs meet
    assert row["bound"] == ("compute" if flops / bytes_ >= ridge else "memory")
    assert row["tflops"] <= H100_BF16_TFLOPS


def test_a_trace_without_shapes_says_why_the_flop_columns_are_na():
    path = _first(TRACES / "hta" / "ns_resolution_trace")  # HTA's sample: recorded without shapes
    res = report.analyze_trace(load_trace(str(path)))
    table = operators.view_table(res["operator_view"], None, "op")
    assert table["not_available"]["flops"] == operators.NA_FLOPS_NO_SHAPES
    assert all(r["flops"] is None and r["flops_na"] == operators.NA_FLOPS_NO_SHAPES for r in table["rows"])


def test_spans_combined_keep_the_flop_sums():
    paths = sorted((DEMO_LOGS / "h100_bf16_autocast").glob("*.pt.trace.json*"))
    if len(paths) < 2:
        pytest.skip("needs the two spans of demo_logs/h100_bf16_autocast")
    results = [report.analyze_trace(load_trace(str(p))) for p in paths]
    combined = operators.view_table(operators.combine_views([r["operator_view"] for r in results]), None, "op")
    total = sum(r["report"]["flops"]["flops"] for r in results)
    assert sum(r["flops"] or 0 for r in combined["rows"]) == pytest.approx(total, rel=1e-12)
    mm = next(r for r in combined["rows"] if r["name"] == "aten::mm")
    assert mm["bound"] == "compute" and 0 < mm["pct_of_peak"] <= 100
