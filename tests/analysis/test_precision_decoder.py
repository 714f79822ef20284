"""Issue 34 item 6: Tensor Cores on today's kernels (METRICS.md §5, §15).

- ROCm AOTriton flash attention (`attn_fwd`, MFMA through Triton's tl.dot) is a matrix-core
  kernel: not "eligible but not using", so no bf16 autocast advice for a run already on bf16.
- One precision decoder (analysis/precision.py) for the Tensor Core card and the FLOPs
  section: cuBLASLt `nvjet_*` kernels name no dtype, so their precision is the recorded dtype
  of the op that launched them, on both.

Ground truth: hand-built traces whose shares follow from the kernel times written here; the
raw JSON of the shared MI300X trace read with `json` (each kernel's launching op and its
`Input type`); the FLOPs section's own per-kernel precision on every shared trace."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from conftest import TRACES, needs_traces, real_report
from test_flops import _shared_traces
from trace_builder import H100, MI300, TraceBuilder

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import flops, linking, precision, steps as S, tensor_cores as tc
from tb_bottleneck_plugin.judge import recommendations
from tb_bottleneck_plugin.trace.loader import load_trace

BF16, E4M3 = "c10::BFloat16", "c10::Float8_e4m3fn"
NVJET_FP8 = "nvjet_sm90_ootst_128x256_128x4_2x1_v_bz_coopA_TNT"
NVJET_BF16 = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
TRITON_MI300 = "tracelens/torch_compile_triton/trace.json.gz"


def _fp8_bf16_trace(tmp_path):
    """One 2 ms step on an H100: aten::_scaled_mm (fp8 e4m3, 4096³) launching a 1000 µs nvjet kernel,
    aten::mm (bf16, 4096³) a 500 µs one, aten::add (bf16) a 100 µs elementwise kernel."""
    m = 4096
    b = TraceBuilder(props=(H100,))
    b.step(1, 1000, 2000)
    b.cpu("aten::_scaled_mm", 1010, 50, **{"Input Dims": [[m, m], [m, m], [], [], [], []],
                                            "Input type": [E4M3, E4M3, "float", "float", "", ""]})
    b.launch(NVJET_FP8, 1020, 1100, 1000, call_dur=5)
    b.cpu("aten::mm", 1100, 50, **{"Input Dims": [[m, m], [m, m]], "Input type": [BF16, BF16]})
    b.launch(NVJET_BF16, 1110, 2100, 500, call_dur=5)
    b.cpu("aten::add", 1200, 50, **{"Input Dims": [[m, m], [m, m], []], "Input type": [BF16, BF16, "Scalar"]})
    b.launch("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
             1210, 2600, 100, call_dur=5)
    return report.analyze_trace(b.load(tmp_path))["report"]


def test_nvjet_precision_from_the_launching_op(tmp_path):
    rep = _fp8_bf16_trace(tmp_path)
    split = rep["tensor_cores"]["precision_split_pct"]
    # before issue 34: unknown 93.75 % (both nvjet kernels), bf16 6.25 % (the add kernel's name)
    assert split["fp8"] == pytest.approx(100 * 1000 / 1600)
    assert split["bf16"] == pytest.approx(100 * (500 + 100) / 1600)  # the add's kernel name says BFloat16
    assert split["unknown"] == pytest.approx(0.0)
    assert rep["tensor_cores"]["tensor_core_pct"] == pytest.approx(100 * 1500 / 1600)
    # the FLOPs section says the same of the same kernels
    kernels = {k["name"]: k for k in rep["flops"]["kernels"]}
    assert kernels[NVJET_FP8]["precision"] == "fp8" and kernels[NVJET_BF16]["precision"] == "bf16"
    assert rep["flops"]["by_precision"]["fp8"]["flops"] == 2 * 4096 ** 3


def test_aotriton_attention_uses_matrix_cores(tmp_path):
    """MI300X: aten::_flash_attention_forward (bf16, [4, 1024, 16, 64]) launching AOTriton's attn_fwd
    (800 µs) and a 200 µs Tensile bf16 GEMM under aten::mm: all matrix-core time, nothing eligible
    left out, no advice to use bf16."""
    b = TraceBuilder(props=(MI300,))
    b.step(1, 1000, 2000)
    q = [4, 1024, 16, 64]
    b.cpu("aten::_flash_attention_forward", 1010, 50, **{"Input Dims": [q, q, q, [], [], [], [], []],
                                                          "Input type": [BF16] * 3 + [""] * 5})
    b.launch("attn_fwd", 1020, 1100, 800, call="hipExtModuleLaunchKernel", call_dur=5)
    b.cpu("aten::mm", 1100, 50, **{"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": [BF16, BF16]})
    b.launch("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN", 1110, 2000, 200,
             call="hipExtModuleLaunchKernel", call_dur=5)
    rep = report.analyze_trace(b.load(tmp_path))["report"]
    t = rep["tensor_cores"]
    # before issue 34: tensor_core_pct 20 %, eligible_not_using_pct 80 % and a bf16 autocast advice
    assert t["tensor_core_pct"] == pytest.approx(100.0) and t["eligible_not_using_pct"] == pytest.approx(0.0)
    assert t["precision_split_pct"]["bf16"] == pytest.approx(100.0)
    assert not [r for r in rep["recommendations"] if r["rule"] == "tensor_cores_unused"]


def _raw_bf16_share(path):
    """100 x kernel time launched directly by an op whose first recorded tensor is bf16 / all kernel
    time, from the raw events (innermost cpu_op around each kernel's launch call)."""
    ev = json.load(gzip.open(path))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    total = bf16 = 0.0
    for k in ev:
        if k.get("cat") != "kernel":
            continue
        total += k["dur"]
        c = calls.get(k["args"].get("correlation"))
        around = [o for o in ops if c is not None and o["tid"] == c["tid"] and o["ts"] <= c["ts"]
                  and o["ts"] + o["dur"] >= c["ts"] + c["dur"]]
        if around:
            inner = min(around, key=lambda o: o["dur"])
            types = [t for t in inner["args"].get("Input type", []) if t and t != "Scalar"]
            if types and types[0] == BF16 and not k["name"].startswith("triton_"):
                bf16 += k["dur"]
    return 100 * bf16 / total


@needs_traces
def test_mi300x_compiled_run_on_bf16_gets_no_bf16_advice():
    rep = real_report(TRITON_MI300)
    t = rep["tensor_cores"]
    # before issue 34: 64.0 % matrix cores, 29.4 % eligible-not-using (attn_fwd), precision unknown 100 %
    assert t["eligible_not_using_pct"] == pytest.approx(0.0)
    assert t["precision_split_pct"]["bf16"] == pytest.approx(_raw_bf16_share(TRACES / TRITON_MI300), rel=1e-9)
    assert t["precision_split_pct"]["bf16"] > 90
    assert not [r for r in rep["recommendations"] if r["rule"] == "tensor_cores_unused"]
    assert rep["verdicts"]["tensor_cores"]["severity"] == "ok"


@needs_traces
@pytest.mark.parametrize("rel", _shared_traces())
def test_one_decoder_for_tensor_cores_and_flops(rel):
    """Every kernel the FLOPs section gives a precision has the same one on the Tensor Core side."""
    trace = load_trace(str(TRACES / rel))
    found = S.find_steps(trace)
    per_kernel: dict = {}
    flops.flops_report(trace, found, {}, per_kernel=per_kernel)
    codes = per_kernel.get("precision_code")
    if codes is None or not (codes >= 0).any():
        pytest.skip("no kernel launched by a counted op")
    rt = linking.gpu_runtime_index(trace)
    is_k = trace.gpu.kind == tc.GPU_KERNEL
    prec_name = np.array([tc.PRECISIONS.index(precision.precision_of_name(s)) for s in trace.strings], np.int8)
    mine = tc._kernel_precisions(trace, prec_name, rt, is_k)
    has = np.flatnonzero(codes >= 0)
    theirs = np.array(per_kernel["precisions"], dtype=object)[codes[has]]
    ours = np.array(tc.PRECISIONS, dtype=object)[mine[has]]
    known = np.isin(theirs, tc.PRECISIONS[:-1])
    assert known.any()
    assert (ours[known] == theirs[known]).mean() == 1.0, \
        sorted({(trace.strings[int(trace.gpu.name[r])][:60], a, b) for r, a, b in
                zip(has[known], ours[known], theirs[known]) if a != b})[:5]


def test_no_autocast_advice_for_ops_already_in_bf16(tmp_path):
    """MI300X, three 1 ms steps: aten::miopen_convolution (bf16 inputs) launching a 600 µs kernel
    no pattern calls MFMA, and a 100 µs elementwise kernel: 86 % of kernel time eligible but not
    using matrix cores. The advice says the ops already run bf16, never to autocast to bf16."""
    b = TraceBuilder(props=(MI300,))
    for s in range(3):
        t0 = 10_000 + s * 1000
        b.step(s + 1, t0, 990)
        b.cpu("aten::miopen_convolution", t0 + 10, 50, **{
            "Input Dims": [[32, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], []],
            "Input type": [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Int"]})
        b.launch("naive_conv_fwd_nchw_bf16", t0 + 20, t0 + 100, 600, call="hipExtModuleLaunchKernel", call_dur=5)
        b.cpu("aten::relu", t0 + 70, 20, **{"Input Dims": [[32, 64, 56, 56]], "Input type": [BF16]})
        b.launch("elementwise_kernel_relu", t0 + 75, t0 + 750, 100, call="hipLaunchKernel", call_dur=5)
    rep = report.analyze_trace(b.load(tmp_path))["report"]
    assert rep["tensor_cores"]["eligible_not_using_pct"] == pytest.approx(100 * 600 / 700)
    # the rule itself (the report holds too few events to judge: no advice at all there)
    rec = recommendations.rule_tensor_cores(rep)
    # before: "Use the matrix cores: run matmuls and convolutions in bf16 with torch.autocast(...)"
    assert "torch.autocast" not in rec["action"] and "already run in bf16" in rec["action"]
    rep["tensor_cores"]["top_eligible_not_using"][0]["input_types"] = ["float", "float"]
    assert "torch.autocast" in recommendations.rule_tensor_cores(rep)["action"]  # an fp32 run still gets it
