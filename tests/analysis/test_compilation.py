"""Issue 23: torch.compile and CUDA graphs (analysis/compilation.py, METRICS.md §16).

The breaks, recompiles and compiled frames of the shared H100 traces equal what PyTorch itself
said (../shared/oracles/h100_truth.json: torch._dynamo.explain and dynamo counters); the MI300X
compiled trace; hand-built traces for nesting, recompiles and CUDA graph replays (numbers by
hand); and a real CPU torch.compile run with a deliberate `.item()` graph break, compared with
torch._dynamo.explain on the same model."""
from __future__ import annotations

import json

import pytest

from conftest import ORACLES, TRACES
from tb_bottleneck_plugin import report, thresholds as T
from tb_bottleneck_plugin.analysis import compilation as C
from tb_bottleneck_plugin.analysis.linking import gpu_runtime_index
from tb_bottleneck_plugin.analysis.steps import find_steps
from tb_bottleneck_plugin.trace.loader import load_trace
from trace_builder import H100, TraceBuilder

H100_DIR = TRACES / "h100"


def _truth():
    path = ORACLES / "h100_truth.json"
    if not path.exists():
        pytest.skip("../shared/oracles not present")
    return json.loads(path.read_text())["runs"]


def _section(path):
    trace = load_trace(str(path))
    g = gpu_runtime_index(trace)
    na = {}
    return C.compilation(trace, find_steps(trace, g), gpu_runtime=g, not_available=na), na


def _one(run):
    files = sorted((H100_DIR / run).glob("*.pt.trace.json.gz"))
    if not files:
        pytest.skip(f"../shared/traces/h100/{run} not present")
    return files[0]


# ---------------------------------------------------------------------------- fused ops from names


@pytest.mark.parametrize("name, ops", [
    ("triton_poi_fused_add_mul_3", ["add", "mul"]),
    ("triton_red_fused__to_copy_add_native_layer_norm_backward_view_6",
     ["_to_copy", "add", "native_layer_norm_backward", "view"]),
    ("triton_red_fused__to_copy_add_mul_native_layer_norm_native_layer_norm_backward_view_5",
     ["_to_copy", "add", "mul", "native_layer_norm", "native_layer_norm_backward", "view"]),
    ("triton_poi_fused__unsafe_view_mul_silu_2", ["_unsafe_view", "mul", "silu"]),
    ("triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0",
     ["_log_softmax", "_to_copy", "prepare_softmax_online", "view"]),
    ("triton_tem_fused_mm_0", ["mm"]),
    ("triton_poi_fused_myop_add_1", ["myop", "add"]),  # an op we do not list is kept as written
    ("triton_poi_fused_0", ["unknown"]),
    ("triton__0d1d2d3d4d5d", ["unknown"]),  # older Inductor: no op names
    ("ampere_sgemm_128x64_nn", ["unknown"]),
])
def test_fused_ops_from_the_kernel_name(name, ops):
    assert C.fused_ops(name) == ops


def test_kernel_kind():
    assert C.kernel_kind("triton_poi_fused_add_0") == "pointwise"
    assert C.kernel_kind("triton_red_fused_sum_1") == "reduction"
    assert C.kernel_kind("triton_per_fused_sum_4") == "persistent_reduction"
    assert C.kernel_kind("triton_tem_fused_mm_0") == "template"
    assert C.kernel_kind("triton__0d1d2d") == "triton"


# ---------------------------------------------------------------------------- H100 traces vs PyTorch


def test_toy_graph_break_one_break_per_forward_and_the_recompiles_in_the_steps():
    truth = _truth()["toy_graph_break"]
    sec, na = _section(_one("toy_graph_break"))
    assert sec["has_regions"] and sec["steps"] == 3
    # explain: 2 graphs, 1 break (per forward); the trace: 2 forward graphs, 1 break per step
    assert sec["breaks_per_step"] == truth["explain"]["graph_break_count"] == 1
    assert sec["graphs_per_step"] == truth["explain"]["graph_count"] == 2
    assert sec["nested_per_step"] == 1 and sec["regions_per_step"] == 2 and sec["max_depth"] == 1
    assert [r["breaks"] for r in sec["per_step"]] == [1, 1, 1]
    assert sec["broken_regions"] == [{"id": "0/0", "frame": 0, "count": 3, "nested": 3, "per_step": 1.0}]
    # frame 0 (Toy.forward) once; frame 1 (the resume frame after the .item()) recompiled each step
    frames = {f["frame"]: f["compile_ids"] for f in sec["frames"]}
    assert frames == {0: [0], 1: [4, 5, 6]}
    ids = [(r["id"], r["first_step"], r["steady"], r["compiled_in_step"]) for r in sec["recompile_ids"]]
    assert ids == [("1/4", 2, True, True), ("1/5", 3, True, True), ("1/6", 4, True, True)]
    assert sec["recompiles"] == sec["steady_recompiles"] == 3 and sec["compiles_in_steps"] == 3
    # the run's dynamo counters: the break reason counted twice (explain + the run's frame 0)
    assert sum(truth["dynamo_counters"]["graph_break"].values()) == 2
    # Dynamo + Inductor recompiling in every step: more than half of the step
    assert sec["compile_pct"] > 50
    assert sec["compiled_pct"] == pytest.approx(42.0, abs=1.0)
    assert sec["compiled_pct"] + sec["compile_pct"] + sec["eager_pct"] == pytest.approx(100, abs=0.01)
    assert sec["guard_calls"] == 6 and sec["guard_us"] > 0
    assert sec["compiled_gpu_pct"] > 95  # every kernel but the loss's eager ones
    assert not na


def test_toy_no_break_zero_breaks_no_recompiles():
    truth = _truth()["toy_no_break"]
    sec, na = _section(_one("toy_no_break"))
    assert sec["breaks_per_step"] == truth["explain"]["graph_break_count"] == 0
    assert sec["graphs_per_step"] == truth["explain"]["graph_count"] == 1
    assert truth["dynamo_counters"]["graph_break"] == {}
    assert sec["regions_per_step"] == 1 and sec["nested_regions"] == 0 and sec["max_depth"] == 0
    assert {f["frame"]: f["compile_ids"] for f in sec["frames"]} == {0: [0]}
    assert sec["recompiles"] == sec["steady_recompiles"] == 0 and sec["recompile_ids"] == []
    assert sec["compile_us"] == 0 and sec["compiles_in_steps"] == 0
    assert 60 < sec["compiled_pct"] < 80
    assert not na


def test_gpt2_compiled_frames_breaks_triton_ops_and_share():
    truth = _truth()["gpt2_bf16_compiled"]
    sec, _ = _section(_one("gpt2_bf16_compiled"))
    # five compiled frames (0/0 .. 4/0), none recompiled inside the steps
    assert {f["frame"]: f["compile_ids"] for f in sec["frames"]} == {i: [0] for i in range(5)}
    assert all(f["regions"] == 3 for f in sec["frames"])
    assert sec["recompiles"] == 0
    # two frames break (the two logging.Logger breaks of the dynamo counters), 4 nested regions
    assert sec["breaks_per_step"] == sum(truth["dynamo_counters"]["graph_break"].values()) == 2
    assert sec["nested_per_step"] == 4 and sec["max_depth"] == 2 and sec["graphs_per_step"] == 2
    # frame 0 breaks once (into 1/0), frame 1 once (three resume regions nested in it)
    assert [(b["id"], b["per_step"], b["nested"]) for b in sec["broken_regions"]] == [("0/0", 1, 3), ("1/0", 1, 9)]
    assert 55 < sec["compiled_pct"] < 70
    assert sec["compiled_gpu_pct"] > 90
    # Triton kernels hold 28 % of kernel time, library GEMMs (nvjet/cutlass) 47 %, cuDNN SDPA 17 %
    assert sec["triton_pct"] == pytest.approx(28.3, abs=0.5)
    assert sec["gemm_pct"] == pytest.approx(47.1, abs=0.5)
    assert sec["attention_pct"] == pytest.approx(17.0, abs=0.5)
    assert sec["triton_kernels"] == 43 and len(sec["all_kernels"]) == 43
    top = sec["kernels"][0]
    assert top["name"].startswith("triton_red_fused__log_softmax__log_softmax_backward_data")
    assert {"_log_softmax", "nll_loss_backward", "nll_loss_forward"} <= set(top["ops"])
    by_name = {k["name"]: k for k in sec["kernels"]}
    assert by_name["triton_poi_fused_mm_view_1"]["ops"] == ["mm", "view"]
    assert by_name["triton_poi_fused_mm_view_1"]["kind"] == "pointwise"
    assert sum(k["us"] for k in sec["kernels"]) <= sec["triton_us"] + 1e-6


def test_demo_generator_compiled_run_summary():
    d = H100_DIR / "demo-generator" / "compiled"
    files = sorted(d.glob("*.pt.trace.json.gz"))
    if len(files) < 2:
        pytest.skip("demo-generator traces not present")
    results = [report.analyze_trace(load_trace(str(f)), run="compiled", worker="worker0", span=str(i))
               for i, f in enumerate(files)]
    spans = [r["report"]["compilation"] for r in results]
    summary = report.combine_results(results, run="compiled", worker="worker0")["report"]
    sec = summary["compilation"]
    # additive: the summary's sums are the spans' sums, its share the ratio of the sums
    assert sec["step_us"] == pytest.approx(sum(s["step_us"] for s in spans))
    assert sec["compiled_us"] == pytest.approx(sum(s["compiled_us"] for s in spans))
    assert sec["compiled_pct"] == pytest.approx(100 * sec["compiled_us"] / sec["step_us"])
    assert sec["breaks"] == 0 and sec["recompiles"] == 0 and sec["compiled_frames"] == 1
    assert sec["triton_kernels"] == len(set().union(*(s["all_kernels"] for s in spans)))
    assert len(sec["per_step"]) == sum(s["steps"] for s in spans)  # distinct step numbers per span
    v = summary["verdicts"]["compilation"]
    assert v["value"] == sec["compiled_pct"] and v["severity"] == "ok"


def test_eager_trace_is_na_with_the_reason():
    rep = report.analyze_trace(load_trace(str(_one("gpt2_bf16_eager"))))["report"]
    assert rep["compilation"] is None
    assert rep["not_available"]["compilation"] == C.NA_NO_MARKERS
    v = rep["verdicts"]["compilation"]
    assert v["severity"] == "na" and v["verdict"] == C.NA_NO_MARKERS


def test_verdicts_of_the_h100_traces():
    def verdict(run):
        return report.analyze_trace(load_trace(str(_one(run))))["report"]["verdicts"]["compilation"]

    v = verdict("toy_graph_break")
    assert v["severity"] == "high" and "1/4, 1/5, 1/6" in v["verdict"]
    assert set(v["thresholds"]) == {"COMPILE_BREAKS_PER_STEP", "COMPILE_RECOMPILES_PER_STEP"}
    v = verdict("gpt2_bf16_compiled")
    assert v["severity"] == "medium" and v["verdict"] == "2 graph breaks per step"
    assert verdict("toy_no_break")["severity"] == "ok"


def test_mi300x_compiled_trace():
    path = TRACES / "tracelens" / "torch_compile_triton" / "trace.json.gz"
    if not path.exists():
        pytest.skip("tracelens trace not present")
    sec, na = _section(path)
    assert sec["has_regions"] and sec["regions"] == 1 and sec["breaks"] == 0 and sec["recompiles"] == 0
    assert {f["frame"]: f["compile_ids"] for f in sec["frames"]} == {0: [0]}
    assert sec["graphs_per_step"] == 1  # one '## Call CompiledFxGraph' (inference: no CompiledFunction)
    ops = {k["name"]: k["ops"] for k in sec["kernels"]}
    assert ops == {
        "triton_poi_fused__unsafe_view_mul_silu_2": ["_unsafe_view", "mul", "silu"],
        "triton_poi_fused__unsafe_view_add_3": ["_unsafe_view", "add"],
        "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1": ["_unsafe_view", "add", "mean", "mul", "pow",
                                                                   "rsqrt"],
        "triton_red_fused_add_mean_mul_pow_rsqrt_0": ["add", "mean", "mul", "pow", "rsqrt"],
    }
    # hipBLASLt Cijk GEMMs beside the Triton kernels and the attention kernel
    assert sec["gemm_pct"] > sec["triton_pct"] > 0 and sec["attention_pct"] > 0
    assert sec["compiled_gpu_pct"] == pytest.approx(100)


def test_cuda_graph_trace_without_regions_is_not_judged():
    path = TRACES / "hta" / "negative_queue_length_values_check" / "rank0.json.gz"
    if not path.exists():
        pytest.skip("hta trace not present")
    rep = report.analyze_trace(load_trace(str(path)))["report"]
    sec = rep["compilation"]
    assert not sec["has_regions"] and sec["breaks_per_step"] is None and sec["recompiles"] is None
    assert rep["not_available"]["compilation.breaks_per_step"] == C.NA_NO_REGIONS
    assert sec["graph_launches"] > 0 and sec["graph_kernels"] > 0 and 0 < sec["graph_gpu_pct"] < 100
    v = rep["verdicts"]["compilation"]
    assert v["severity"] == "none" and v["verdict"].startswith("not judged")


# ---------------------------------------------------------------------------- hand-built traces


def _region(b, name, ts, dur, tid=1):
    return b.cpu(name, ts, dur, tid=tid)


def test_nested_regions_breaks_recompiles_graph_replays(tmp_path):
    """Two steps of 1000 µs. Step 1: region 0/0 [100, 600) holds a forward graph, the resume
    region 1/0 [300, 500) (a break) which holds 2/0 [350, 450) (a second break in the resume
    frame); a compile span [20, 80) before it; one guard lookup of 10 µs; a backward graph
    [700, 800) on thread 2; a Triton kernel launched in 0/0, a GEMM launched in 1/0, a
    kernel launched eagerly. Step 2: region 0/1 (a recompile, first seen in step 2, no compile
    span there) and a CUDA graph replay of three kernels launched outside any region."""
    b = TraceBuilder(props=(H100,))
    b.step(1, 0, 1000)
    b.cpu("dynamo", 20, 60)
    b.cpu("TorchDynamo Cache Lookup", 85, 10)
    _region(b, "Torch-Compiled Region: 0/0", 100, 500)
    b.cpu("CompiledFunction", 110, 100)
    b.cpu("## Call CompiledFxGraph fabc ##", 115, 90, cat="user_annotation")
    b.launch("triton_poi_fused_add_mul_0", 120, 150, 40, call="cuLaunchKernel")
    _region(b, "Torch-Compiled Region: 1/0", 300, 200)
    b.cpu("## Call CompiledFxGraph fdef ##", 310, 30, cat="user_annotation")
    b.launch("nvjet_sm90_tst_128x128_TNN", 320, 330, 60)
    _region(b, "Torch-Compiled Region: 2/0", 350, 100)
    b.launch("vectorized_elementwise_kernel", 650, 660, 20)  # eager, outside regions
    b.cpu("CompiledFunctionBackward", 700, 100, tid=2)
    b.step(2, 1000, 1000)
    _region(b, "Torch-Compiled Region: 0/1", 1100, 200)
    b.runtime("cudaGraphLaunch", 1400, 10)
    corr = b._corr
    b.kernel("triton_red_fused_sum_1", 1450, 50, correlation=corr)
    b.kernel("sm90_xmma_gemm_bf16", 1500, 100, correlation=corr)
    b.kernel("void at::native::fill_kernel", 1600, 10, correlation=corr)
    trace = b.load(tmp_path)
    g = gpu_runtime_index(trace)
    sec = C.compilation(trace, find_steps(trace, g), gpu_runtime=g)
    s1, s2 = sec["per_step"]
    assert (s1["regions"], s1["nested_regions"], s1["breaks"], s1["graphs"]) == (3, 2, 2, 2)
    assert (s2["regions"], s2["nested_regions"], s2["breaks"], s2["graphs"]) == (1, 0, 0, 0)
    assert sec["breaks_per_step"] == 1 and sec["max_depth"] == 2
    # compiled CPU time: [100, 600) ∪ [700, 800) = 600 µs, then 200 µs; compile 60 µs
    assert s1["compiled_us"] == 600 and s2["compiled_us"] == 200 and s1["compile_us"] == 60
    assert s1["eager_us"] == 1000 - 600 - 60
    assert sec["compiled_pct"] == pytest.approx(100 * 800 / 2000)
    assert s1["guard_us"] == 10 and s1["guard_calls"] == 1
    # GPU: 40 (Triton, compiled) + 60 (GEMM, compiled) + 20 (eager) in step 1; 160 replayed in step 2
    assert s1["kernel_us"] == 120 and s1["compiled_gpu_us"] == 100
    assert s2["graph_launches"] == 1 and s2["graph_kernels"] == 3 and s2["graph_gpu_us"] == 160
    assert sec["graph_gpu_pct"] == pytest.approx(100 * 160 / 280)
    assert sec["triton_us"] == 90 and sec["gemm_us"] == 160
    assert {k["name"]: (k["count"], k["graph_count"], k["ops"]) for k in sec["kernels"]} == {
        "triton_poi_fused_add_mul_0": (1, 0, ["add", "mul"]), "triton_red_fused_sum_1": (1, 1, ["sum"])}
    # 0/1: a recompile first seen after the first step (steady), though compiled elsewhere
    assert sec["recompile_ids"] == [{"id": "0/1", "frame": 0, "compile": 1, "first_step": 2, "regions": 1,
                                     "compiled_in_step": False, "steady": True}]
    assert {f["frame"]: f["compile_ids"] for f in sec["frames"]} == {0: [0, 1], 1: [0], 2: [0]}


def test_a_recompile_seen_from_the_first_step_without_compiling_is_not_steady(tmp_path):
    b = TraceBuilder(props=(H100,))
    for n in (1, 2):
        b.step(n, n * 1000, 1000)
        _region(b, "Torch-Compiled Region: 0/3", n * 1000 + 100, 300)
    trace = b.load(tmp_path)
    sec = C.compilation(trace, find_steps(trace))
    assert sec["recompiles"] == 1 and sec["steady_recompiles"] == 0
    assert C.card_severity(sec) == ("ok", "ok")


def test_card_scale():
    base = {"has_regions": True, "steps": 4, "recompile_ids": [], "steady_recompiles": 0, "breaks_per_step": 0.0}
    assert C.card_severity(base)[0] == "ok"
    assert C.card_severity(dict(base, breaks_per_step=T.COMPILE_BREAKS_PER_STEP))[0] == "medium"
    one = [{"id": "1/2", "steady": True}]
    assert C.card_severity(dict(base, steady_recompiles=1, recompile_ids=one)) == (
        "high", "1 recompile in the profiled steps (1/2)")  # 1 in 4 steps = COMPILE_RECOMPILES_PER_STEP
    assert C.card_severity(dict(base, steps=10, steady_recompiles=1, recompile_ids=one))[0] == "medium"
    assert C.card_severity(dict(base, has_regions=False))[0] == "none"


def test_summary_of_two_ranks_adds_up(tmp_path):
    """Two spans (ranks) of the same compiled frames: sums add, compile ids merge per id."""
    results = []
    for rank, rc in ((0, 1), (1, 2)):
        b = TraceBuilder(props=(H100,))
        b.step(5, 0, 1000)
        _region(b, "Torch-Compiled Region: 0/0", 100, 400)
        _region(b, "Torch-Compiled Region: 1/%d" % rc, 200, 100)
        b.launch("triton_poi_fused_relu_0", 210, 220, 30)
        results.append(report.analyze_trace(b.load(tmp_path, f"r{rank}.pt.trace.json"), run="r", worker=f"w{rank}",
                                            span="s"))
    summary = report.combine_results(results, run="r")["report"]["compilation"]
    assert summary["breaks"] == 2 and summary["regions"] == 4 and summary["steps"] == 2
    assert summary["broken_regions"] == [{"id": "0/0", "frame": 0, "count": 2, "nested": 2, "per_step": 1.0}]
    assert summary["compiled_us"] == 800 and summary["compiled_pct"] == pytest.approx(40)
    assert [r["id"] for r in summary["recompile_ids"]] == ["1/1", "1/2"]
    assert summary["kernels"][0]["count"] == 2 and summary["kernels"][0]["us"] == 60
    (row,) = summary["per_step"]
    assert row["step"] == 5 and row["spans"] == 2 and row["breaks"] == 1


# ---------------------------------------------------------------------------- a real torch.compile run


def test_real_cpu_torch_compile_graph_break_matches_explain(tmp_path):
    """A tiny model with a data-dependent `.item()` branch, compiled on CPU (aot_eager: Dynamo
    and AOTAutograd, no C++ build, seconds), profiled with tensorboard_trace_handler: the
    breaks per step equal torch._dynamo.explain's on the same model, and the same model
    without the branch shows none."""
    torch = pytest.importorskip("torch")
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    class Toy(torch.nn.Module):
        def __init__(self, brk):
            super().__init__()
            self.a, self.b, self.brk = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), brk

        def forward(self, x):
            x = torch.relu(self.a(x)) * 2 + 1
            if self.brk and x.mean().item() > -1e9:
                x = x + 1
            return torch.tanh(self.b(x)).sum()

    def run(brk):
        torch.manual_seed(0)
        model, x = Toy(brk), torch.randn(8, 16)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", dynamic=False)
        for _ in range(2):
            compiled(x).backward()
        out = tmp_path / ("break" if brk else "nobreak")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                     on_trace_ready=tensorboard_trace_handler(str(out), worker_name="worker0")) as prof:
            for _ in range(4):
                compiled(x).backward()
                prof.step()
        (path,) = sorted(out.glob("*.pt.trace.json"))
        rep = report.analyze_trace(load_trace(str(path)))["report"]
        return explained, rep["compilation"]

    explained, sec = run(True)
    assert explained.graph_break_count == 1 and explained.graph_count == 2
    assert sec["steps"] == 3
    assert sec["breaks_per_step"] == explained.graph_break_count
    assert sec["graphs_per_step"] == explained.graph_count
    assert sec["recompiles"] == 0 and sec["compiled_frames"] == 2
    assert 0 < sec["compiled_pct"] < 100 and sec["kernel_us"] is not None
    explained, sec = run(False)
    assert explained.graph_break_count == 0
    assert sec["breaks_per_step"] == 0 and sec["graphs_per_step"] == explained.graph_count == 1
    torch._dynamo.reset()


def _demo_span_report(run):
    from pathlib import Path

    from tb_bottleneck_plugin.trace import discovery

    logdir = Path(__file__).resolve().parents[2] / "demo_logs"
    scanned = discovery.scan_logdir(str(logdir))
    r = next(x for x in scanned.runs if x.name == run)
    return [report.analyze_span(str(logdir), r, s)["report"] for w in r.workers for s in w.spans]


def test_h100_cuda_graph_replays_hold_the_kernels_the_compiled_run_launches():
    """demo_logs/h100_compiled_cuda_graphs: the fusion pair's model under
    torch.compile(mode="reduce-overhead") on an H100 (demo generator, CUDA_GRAPHS_RUN). Training
    with one compiled frame and no break, CUDA graph trees replay one forward and one backward
    graph per step; the kernels replayed must be the Triton kernels that the same model compiled
    without CUDA graphs (h100_compiled, a separate run) launches one by one."""
    for graphs, plain in zip(_demo_span_report("h100_compiled_cuda_graphs"), _demo_span_report("h100_compiled")):
        g, p = graphs["compilation"], plain["compilation"]
        assert g["breaks_per_step"] == 0 and g["recompiles"] == 0
        assert g["graph_launches"] == 2 * g["steps"]  # forward + backward graph per step
        assert p["graph_launches"] == 0 and p["graph_kernels"] == 0
        # every replayed kernel is one of the Triton kernels, the same ones with the same counts
        assert g["graph_kernels"] == sum(k["count"] for k in g["kernels"]) == sum(k["count"] for k in p["kernels"])
        assert {k["name"]: k["count"] for k in g["kernels"]} == {k["name"]: k["count"] for k in p["kernels"]}
        assert all(k["graph_count"] == k["count"] for k in g["kernels"])
        # the advice knows the run already replays graphs: no reduce-overhead, no torch.compile
        text = json.dumps(graphs["recommendations"])
        assert "reduce-overhead" not in text and "model = torch.compile" not in text
        assert "inside CUDA graphs" in graphs["verdicts"]["launch"]["reason"] if "launch" in graphs.get(
            "verdicts", {}) else True


def test_h100_cuda_graph_gaps_are_not_shaded_launch_bound():
    """The timeline's idle cause "launch" (gaps between consecutive short kernels) leaves out
    kernels replayed from CUDA graphs: they have no launch of their own. Checked against the
    graph-replayed kernels found here from the runtime calls (cudaGraphLaunch correlation)."""
    import numpy as np

    from tb_bottleneck_plugin.analysis import timeline
    from tb_bottleneck_plugin.analysis.context import GRAPH_LAUNCH_CALLS
    from tb_bottleneck_plugin.trace.model import GPU_KERNEL

    from pathlib import Path

    run_dir = Path(__file__).resolve().parents[2] / "demo_logs" / "h100_compiled_cuda_graphs"
    path = sorted(run_dir.glob("*.pt.trace.json.gz"))[0]
    trace = load_trace(str(path))
    g, rt = trace.gpu, trace.runtime
    names = np.array([trace.strings[i] for i in rt.name])
    graph_corr = set(rt.correlation[np.isin(names, list(GRAPH_LAUNCH_CALLS))].tolist())
    k = np.flatnonzero(g.kind == GPU_KERNEL)
    k = k[np.argsort(g.ts[k])]
    replayed = np.array([c in graph_corr for c in g.correlation[k]])
    assert replayed.sum() > 100
    # gaps between two consecutive replayed kernels
    both = replayed[1:] & replayed[:-1]
    mids = ((g.ts[k] + g.dur[k])[:-1][both] + g.ts[k][1:][both]) / 2
    ls, le = timeline._cause_sets(trace)["launch"]
    if len(ls) == 0:  # a trace that replays CUDA graphs shades no gap launch-bound (issue 34 item 12)
        return
    inside = (np.searchsorted(ls, mids, side="right") - 1)
    hit = (inside >= 0) & (mids < le[np.maximum(inside, 0)])
    assert not hit.any()
