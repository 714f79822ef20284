"""Advice that fits the trace (metrics.md §6, §8, §9): the run's context is detected from
the trace, and each rule fires, stays silent, or words its action according to it.
Real traces for training vs inference, hand-built ones for CUDA graphs, torch.compile,
GPU busy vs idle during syncs, Blackwell occupancy and malformed inputs."""
from __future__ import annotations

from pathlib import Path

import pytest

from tb_bottleneck_plugin.judge import recommendations as R
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin.analysis import context
from conftest import needs_traces, real_report as real, rules_by_id as rules, A100, B200, H100, MI250, MI300, V100, TraceBuilder, occupancy_args

H100_BERT = "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
V100_NW0 = "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
MI300_DDP = "tracelens/mi300/resnet_act_checkpoint.json.gz"
MI250_TRAIN = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"


def analyse(trace):
    return report_mod.analyze_trace(trace)["report"]




def all_text(rep):
    return " ".join(r["title"] + " " + r["action"] for r in rep["recommendations"])


# ------------------------------------------------------------------ training vs inference (real traces)
@needs_traces
def test_h100_bert_is_inference_and_gets_no_training_advice():
    rep = real(H100_BERT)
    assert rep["context"]["mode"] == "inference"
    assert rep["context"]["evidence"]["backward_ops"] == 0 and rep["context"]["evidence"]["optimizer_ops"] == 0
    assert not rep["context"]["distributed"] and not rep["context"]["cuda_graphs"]
    text = all_text(rep)
    for training_api in ("GradScaler", "bucket_cap_mb", "no_sync", "loss.item()"):
        assert training_api not in text
    small = rules(rep)["small_kernels"]  # tiny bert-small launches: launch-bound for real
    assert 'mode="reduce-overhead"' in small["action"] and "torch.inference_mode()" in small["action"]
    assert "communication" not in rules(rep) and "synchronization" not in rules(rep)


@needs_traces
def test_v100_resnet_is_training_and_gets_fp16_with_the_current_gradscaler():
    rep = real(V100_NW0)
    assert rep["context"]["mode"] == "training" and not rep["context"]["distributed"]
    tc = rules(rep)["tensor_cores_unused"]
    assert 'torch.amp.GradScaler("cuda")' in tc["action"]
    assert 'torch.autocast("cuda", dtype=torch.float16)' in tc["action"]
    assert "bfloat16" not in tc["action"] and "torch.cuda.amp" not in all_text(rep)
    assert "communication" not in rules(rep)


@needs_traces
def test_mi300_ddp_training_gets_ddp_advice_and_amd_wording():
    rep = real(MI300_DDP)
    ctx = rep["context"]
    assert ctx["mode"] == "training" and ctx["distributed"] and ctx["world_size"] == 8
    comm = rules(rep)["communication"]
    assert "bucket_cap_mb" in comm["action"] and "no_sync()" in comm["action"]


def test_no_deprecated_amp_api_in_the_rules():
    source = Path(R.__file__).read_text()
    assert "torch.cuda.amp" not in source


# ------------------------------------------------------------------ Tensor Core advice per GPU generation
def tc_report(props, mode="training"):
    return {"device_properties": [props], "context": {"mode": mode},
            "tensor_cores": {"eligible_not_using_pct": 60.0, "tensor_core_pct": 0.0,
                             "top_eligible_not_using": [{"op": "aten::mm", "pct": 60.0}]},
            "breakdown_pct": {"kernel": 50.0}}


@pytest.mark.parametrize("props,mode,present,absent", [
    (V100, "training", ['torch.autocast("cuda", dtype=torch.float16)', 'torch.amp.GradScaler("cuda")'],
     ["bfloat16", "torch.cuda.amp"]),
    (V100, "inference", ['torch.autocast("cuda", dtype=torch.float16)', "torch.inference_mode()"],
     ["GradScaler", "bfloat16"]),
    (A100, "training", ['torch.autocast("cuda", dtype=torch.bfloat16)', 'set_float32_matmul_precision("high")'],
     ["GradScaler(", "dtype=torch.float16"]),
    (H100, "inference", ["torch.inference_mode()", "dtype=torch.bfloat16"], ["GradScaler("]),
    (MI250, "training", ['torch.autocast("cuda", dtype=torch.bfloat16)', "ROCm"],
     ["GradScaler(", "allow_tf32", "dtype=torch.float16"]),
    (MI300, "inference", ["dtype=torch.bfloat16", "torch.inference_mode()", "ROCm"], ["GradScaler("]),
])
def test_tensor_core_advice_per_generation(props, mode, present, absent):
    rec = R.rule_tensor_cores(tc_report(props, mode))
    assert rec is not None and rec["severity"] == "high"
    for text in present:
        assert text in rec["action"], text
    for text in absent:
        assert text not in rec["action"], text


# ------------------------------------------------------------------ communication
def comm_report(ctx):
    return {"context": ctx, "communication": {"comm_pct_of_kernel_time": 40.0, "overlap_pct": 10.0, "comm_us": 1e4},
            "breakdown_pct": {"kernel": 50.0}}


def test_communication_advice_needs_distributed_training():
    assert R.rule_communication(comm_report({"mode": "training", "distributed": False})) is None
    ddp = R.rule_communication(comm_report({"mode": "training", "distributed": True}))
    assert "bucket_cap_mb" in ddp["action"] and "no_sync()" in ddp["action"]
    tp = R.rule_communication(comm_report({"mode": "inference", "distributed": True}))
    assert tp is not None and "bucket_cap_mb" not in tp["action"] and "no_sync" not in tp["action"]
    assert "fewer ranks" in tp["action"]


# ------------------------------------------------------------------ CUDA graphs
def graph_trace(replayed=True):
    """Two steps of 1000 µs; each launches one CUDA graph (a 10 µs cudaGraphLaunch) whose
    replay runs 4 kernels of 150 µs back to back, as CUPTI reports them: the graph's
    kernels carry the correlation id of the cudaGraphLaunch."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.cpu("aten::copy_", t0 + 10, 20)
        corr = b.runtime("cudaGraphLaunch", t0 + 50, 10)
        if replayed:
            for i in range(4):
                b.kernel(f"void graph_kernel_{i}<float>", t0 + 100 + 150 * i, 150, correlation=corr,
                         **occupancy_args(50, 2.0, grid=(264, 1, 1)))
    return b


def test_cuda_graph_kernels_count_in_utilization(tmp_path):
    rep = analyse(graph_trace().load(tmp_path))
    ctx = rep["context"]
    assert ctx["cuda_graphs"] and ctx["evidence"]["graph_launches"] == 2 and ctx["evidence"]["graph_kernels"] == 8
    assert ctx["mode"] == "inference" and not ctx["torch_compile"]
    # 600 µs of kernels per 1000 µs step
    assert rep["gpu"]["0"]["utilization_pct"] == pytest.approx(60.0)


def test_cuda_graph_run_is_not_told_to_use_cuda_graphs():
    rep = {"context": {"mode": "inference", "cuda_graphs": True, "torch_compile": True},
           "occupancy": {"short_kernels": {"count": 500, "time_pct": 60.0, "threshold_us": 10}},
           "gpu": {"0": {"utilization_pct": 90.0}}, "input": {"input_bound_pct": 0.0}}
    rec = R.rule_small_kernels(rep)
    assert rec is not None and "already uses torch.compile and CUDA graphs" in rec["action"]
    assert "capture static parts" not in rec["action"] and "model = torch.compile(model)" not in rec["action"]
    rep["context"]["torch_compile"] = False
    assert "already replays CUDA graphs" in R.rule_small_kernels(rep)["action"]


def test_cuda_graph_capture_window_is_not_reported_as_an_idle_gpu(tmp_path):
    """A capture trace: inside the steps the host captures a graph (launches run no
    kernel); the only kernels ran before the first step (warm-up). Utilization in the
    steps is n/a with a reason, not "0 %", and no rule calls the GPU idle."""
    b = TraceBuilder([H100])
    b.launch("void warmup_kernel<float>", 0, 10, 200)
    for n, t0 in ((1, 1000), (2, 2000)):
        b.step(n, t0, 1000)
        b.runtime("cudaStreamBeginCapture", t0 + 10, 5)
        for i in range(20):
            b.runtime("cudaLaunchKernel", t0 + 20 + 40 * i, 5)  # captured: no kernel runs
        b.runtime("cudaStreamEndCapture", t0 + 900, 5)
        b.runtime("cudaGraphInstantiate", t0 + 910, 50)
    rep = analyse(b.load(tmp_path))
    assert rep["context"]["cuda_graph_capture"] and not rep["context"]["cuda_graphs"]
    assert rep["gpu"]["0"]["utilization_pct"] is None
    assert "steps window" in rep["not_available"]["gpu.0.utilization_pct"]
    small = rules(rep).get("small_kernels")
    assert small is None or "gpu_utilization_pct" not in small["numbers"]


# ------------------------------------------------------------------ torch.compile / Triton
def test_triton_kernels_mean_torch_compile_and_no_advice_to_compile(tmp_path):
    b = TraceBuilder([A100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.cpu("Torch-Compiled Region: 0/0", t0 + 5, 900, cat="user_annotation")
        b.cpu("CompiledFunction", t0 + 10, 880)
        for i in range(40):  # 40 short Triton kernels of 5 µs, launched through the driver API
            b.launch(f"triton_poi_fused_add_{i}", t0 + 20 + 20 * i, t0 + 30 + 20 * i, 5, call="cuLaunchKernel",
                     **occupancy_args(50, 2.0, grid=(216, 1, 1)))
    rep = analyse(b.load(tmp_path))
    ctx = rep["context"]
    assert ctx["torch_compile"] and ctx["evidence"]["triton_kernels"] == 80 and ctx["evidence"]["compiled_regions"] == 4
    small = rules(rep)["small_kernels"]  # 80 kernels of 5 µs: all short, GPU 20 % busy
    assert "already uses torch.compile" in small["action"] and 'mode="reduce-overhead"' in small["action"]
    assert "model = torch.compile(model)" not in small["action"]


# ------------------------------------------------------------------ synchronisation: GPU busy vs idle
def sync_trace(kernel_us):
    """One step per 1000 µs; aten::item blocks in cudaStreamSynchronize 100..600 (50 % of
    the step); the GPU runs one kernel from 50 to 50 + kernel_us."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.launch("void big_gemm_kernel<float>", t0 + 10, t0 + 50, kernel_us, **occupancy_args(50, 2.0))
        b.cpu("aten::item", t0 + 90, 520)
        b.runtime("cudaStreamSynchronize", t0 + 100, 500)
    return b


def test_sync_while_gpu_busy_is_not_a_bottleneck(tmp_path):
    rep = analyse(sync_trace(kernel_us=900).load(tmp_path))  # kernel covers the whole sync
    sync = rep["sync"]
    assert sync["sync_pct"] == pytest.approx(50.0)
    assert sync["gpu_busy_during_sync_pct"] == pytest.approx(100.0)
    assert sync["sync_gpu_idle_pct"] == pytest.approx(0.0)
    assert "synchronization" not in rules(rep)


def test_sync_while_gpu_idles_is_high(tmp_path, monkeypatch):
    from tb_bottleneck_plugin import thresholds as T

    # 12 events: the too-little-data guard (tests/judge/test_contradictions.py) set aside to test the rule
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    rep = analyse(sync_trace(kernel_us=150).load(tmp_path))  # kernel 50..200: busy 100 of the 500 µs sync
    sync = rep["sync"]
    assert sync["gpu_busy_during_sync_pct"] == pytest.approx(20.0)
    assert sync["sync_gpu_idle_us"] == pytest.approx(800.0)  # 400 µs per step
    assert sync["sync_gpu_idle_pct"] == pytest.approx(40.0)
    # after each sync (ends at 600) the GPU idles until the next step's kernel (1050), but
    # the host lost only the 100 µs the GPU was busy in the wait: 100 µs per step
    assert sync["sync_refill_idle_us"] == pytest.approx(200.0)
    # together exactly the wait: removing it would shorten each 1000 µs step by 500 µs
    assert sync["sync_cost_pct"] == pytest.approx(50.0)
    rec = rules(rep)["synchronization"]
    # priced by the step model (METRICS §19): without the sync the 500 µs call costs one launch
    # (the trace's 5 µs), the host runs on: each 1000 µs step is 495 µs shorter
    assert rec["severity"] == "high" and rec["estimated_gain_pct"] == pytest.approx(49.5)
    assert rec["what_if"] == "sync" and rec["predicted_step_ms"] == pytest.approx(0.505)
    assert rec["numbers"]["sync_gpu_idle_pct"] == pytest.approx(40.0)
    assert "aten::item" in rec["evidence"][0]


def test_a_sync_that_drains_a_busy_gpu_costs_the_refill(tmp_path, monkeypatch):
    """The GPU is busy through the whole wait (no idle during it), but the host, blocked,
    launches the next step's kernel only 300 µs after the sync returns: that gap is the
    sync's cost, not 0."""
    from tb_bottleneck_plugin import thresholds as T

    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        # the kernel runs 50..600 (the sync 100..600 waits for it), the next launch at 900
        b.launch("void big_gemm_kernel<float>", t0 + 10, t0 + 50, 550, **occupancy_args(50, 2.0))
        b.cpu("aten::item", t0 + 90, 520)
        b.runtime("cudaStreamSynchronize", t0 + 100, 500)
    sync = analyse(b.load(tmp_path))["sync"]
    assert sync["gpu_busy_during_sync_pct"] == pytest.approx(100.0)
    assert sync["sync_gpu_idle_us"] == pytest.approx(0.0)
    # step 1: 600 → the next kernel at 1050 (450, under the 500 µs lost lead); step 2: 1600
    # → the end of the steps at 2000 (400)
    assert sync["sync_refill_idle_us"] == pytest.approx(850.0)
    assert sync["sync_cost_pct"] == pytest.approx(42.5)


def test_sync_rule_threshold_on_the_gpu_idle_it_causes():
    from tb_bottleneck_plugin import thresholds as T

    base = {"sync_pct": 40.0, "gpu_busy_during_sync_pct": 99.0, "top_ops": []}
    assert R.rule_sync({"sync": dict(base, sync_cost_pct=T.SYNC_PCT - 0.1)}) is None
    assert R.rule_sync({"sync": dict(base, sync_cost_pct=T.SYNC_PCT)})["severity"] == "medium"
    assert R.rule_sync({"sync": dict(base, sync_cost_pct=T.SYNC_HIGH_PCT)})["severity"] == "high"
    # a report from before sync_cost_pct: the idle during the wait
    assert R.rule_sync({"sync": dict(base, sync_gpu_idle_pct=T.SYNC_PCT)})["estimated_gain_pct"] == T.SYNC_PCT


# ------------------------------------------------------------------ occupancy on Hopper / Blackwell
def test_blackwell_kineto_zero_takes_the_calculator_value(tmp_path):
    """A B200 block-scaled GEMM: 384 threads, 80 registers, 100 KB shared memory (opted
    in above 48 KB, so Kineto's calculator call gave 0). Calculator: registers 2560 per
    warp -> 6 warps per sub-partition = 24 per SM = 2 blocks of 12 warps; shared memory
    233472 // (102400 + 1024) = 2 blocks -> 2 resident blocks; blocks per SM 4 ->
    100 * min(2, 4) * 384 / 2048 = 37.5 %."""
    b = TraceBuilder([B200])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.launch("bmm_MxE4m3_MxE4m3_E4m3_Fp32_t128x256x128_cga1x1x1", t0 + 10, t0 + 50, 800,
                 **occupancy_args(0, 4.0, grid=(592, 1, 1), block=(384, 1, 1), regs=80, smem=102400))
    rep = analyse(b.load(tmp_path))
    occ = rep["occupancy"]
    (row,) = occ["kernels"]
    assert row["occupancy_source"] == "calculator" and row["est_achieved_occupancy_pct"] == pytest.approx(37.5)
    assert occ["est_achieved_occupancy_pct"] == pytest.approx(37.5)
    assert rep["gpu"]["0"]["est_achieved_occupancy_pct"] == pytest.approx(37.5)
    assert {h["bucket"]: h["pct"] for h in occ["histogram"]}["[25,50)"] == pytest.approx(100.0)
    assert "small_kernels" not in rules(rep)


@needs_traces
def test_h100_gemm_with_kineto_zero_shows_the_calculator_value():
    rep = real(H100_BERT)
    rows = [k for k in rep["occupancy"]["kernels"] if "s16816gemm_bf16_256x128" in k["name"]]
    assert rows and rows[0]["occupancy_source"] == "calculator"
    assert rows[0]["est_achieved_occupancy_pct"] == pytest.approx(12.5)  # 1 block of 256 threads / 2048
    assert all(k["occupancy_source"] in ("kineto", "calculator") for k in rep["occupancy"]["kernels"])
    # the card uses the same per-kernel values (Kineto alone: 4.08, tbp's number)
    assert rep["gpu"]["0"]["est_achieved_occupancy_pct"] == pytest.approx(6.58, abs=0.01)


# ------------------------------------------------------------------ n/a instead of misleading zeros
@needs_traces
def test_rocm_kernel_rows_have_no_fake_grid():
    rep = real(MI250_TRAIN)
    rows = rep["occupancy"]["kernels"]
    assert rows and all(r["grid"] is None and r["block"] is None for r in rows)
    assert all(r["occupancy_source"] is None for r in rows)
    assert rep["context"]["mode"] == "training"


def test_kernels_per_step_is_na_without_profiler_step(tmp_path):
    b = TraceBuilder([H100])
    b.cpu("aten::mm", 0, 100)
    b.launch("void some_kernel<float>", 10, 20, 50)
    rep = analyse(b.load(tmp_path))
    assert rep["launch"]["kernels_per_step"] is None
    assert "no steps found" in rep["not_available"]["launch.kernels_per_step"]


# ------------------------------------------------------------------ malformed inputs (issue 10)
def test_every_kernel_with_zero_duration(tmp_path):
    b = TraceBuilder([V100])
    b.step(1, 0, 100)
    b.cpu("aten::mm", 5, 50)
    for i in range(3):
        b.launch("volta_sgemm_128x64_nn", 10 + 10 * i, 60 + i, 0, **occupancy_args(50, 1.0))
    rep = analyse(b.load(tmp_path))
    assert rep["errors"] == []
    assert rep["tensor_cores"]["tensor_core_pct"] is None
    assert "0 µs" in rep["not_available"]["tensor_cores.tensor_core_pct"]


@pytest.mark.parametrize("bad", [
    {"regsPerBlock": "-"}, {"warpSize": 1e30}, {"warpSize": 0}, {"maxThreadsPerMultiprocessor": -2048},
    {"regsPerMultiprocessor": None}, {"computeMajor": "9"}, {"sharedMemPerMultiprocessor": float("nan")},
    {"id": "-"}, {"warpSize": True},
])
def test_malformed_device_properties_never_raise(tmp_path, bad):
    props = dict(H100, **bad)
    b = TraceBuilder([props])
    b.step(1, 0, 1000)
    b.launch("void k<float>", 10, 50, 500, **occupancy_args(0, 2.0, smem=65536))  # Kineto 0: calculator needed
    b.launch("void k2<float>", 20, 600, 100)  # no occupancy fields at all
    rep = analyse(b.load(tmp_path))
    assert rep["errors"] == []
    occ = rep["occupancy"]
    if "regsPerBlock" in bad or "id" in bad:
        # optional: regsPerBlock falls back to the SM's register file; a bad id to the position
        assert occ["kernels"][0]["occupancy_source"] == "calculator"
    else:
        assert occ["kernels"][0]["theoretical_occupancy_pct"] is None
        k = {r["name"]: r for r in occ["kernels"]}["void k<float>"]
        assert k["occupancy_source"] == "kineto" and k["est_achieved_occupancy_pct"] == 0.0


def test_calculator_rejects_unusable_properties_with_a_reason():
    from tb_bottleneck_plugin.analysis import occupancy_calculator as calc

    values, reason = calc.calculator_properties(dict(V100, warpSize="-"))
    assert values is None and "'warpSize'" in reason
    assert calc.calculator_properties(dict(V100, regsPerBlock=-1))[0]["regs_block"] == 65536
    with pytest.raises(ValueError):
        calc.occupancy_calculator(dict(V100, computeMajor=0), [128], [32], [0])
    assert calc.prop_int({"x": 1e30}, "warpSize") is None and calc.prop_int({"warpSize": 32.0}, "warpSize") == 32


def test_context_combine_for_summaries():
    merged = context.combine([{"mode": "inference", "cuda_graphs": True, "evidence": {"graph_kernels": 3}},
                              {"mode": "training", "distributed": True, "world_size": 4,
                               "evidence": {"graph_kernels": 2}}, None])
    assert merged["mode"] == "training" and merged["cuda_graphs"] and merged["distributed"]
    assert merged["world_size"] == 4 and merged["evidence"]["graph_kernels"] == 5
    assert context.combine([]) is None


@pytest.mark.parametrize("total,expected", [("-", None), (1e30, None), (-5, None), (85018279936, 85018279936)])
def test_memory_capacity_from_malformed_properties(tmp_path, total, expected):
    b = TraceBuilder([dict(H100, id="x" if total == "-" else 0, totalGlobalMem=total)])
    b.step(1, 0, 100)
    b.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                     "ts": 10, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1024, "Addr": 1,
                                        "Total Allocated": 1024, "Total Reserved": 2097152}})
    rep = analyse(b.load(tmp_path))
    assert rep["errors"] == []
    assert rep["memory"]["cuda:0"]["capacity_bytes"] == expected
    if expected is None:
        assert "totalGlobalMem" in rep["not_available"]["memory.cuda:0.capacity_bytes"]


def test_tensor_core_rule_ignores_malformed_property_entries():
    rep = tc_report(V100)
    rep["device_properties"] = ["not a dict", {"computeMajor": True}, V100]
    assert 'torch.amp.GradScaler("cuda")' in R.rule_tensor_cores(rep)["action"]


def test_launch_and_host_advice_names_the_profiler_options_of_the_trace():
    """METRICS.md §9 "The profiler's own cost": the small_kernels action of the H100 launch-bound
    demo run names the options its trace metadata says were on (read here from the raw JSON);
    a run that replays CUDA graphs gets no such note (no launches to inflate)."""
    import gzip
    import json

    from conftest import DEMO_LOGS
    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.trace.loader import load_trace

    path = sorted((DEMO_LOGS / "h100_many_small_kernels").glob("*.pt.trace.json.gz"))[0]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    on = [o for o in ("record_shapes", "profile_memory", "with_stack") if raw.get(o)]
    rep = report.analyze_trace(load_trace(str(path)))["report"]
    assert rep["trace"]["profiler_options"] == on and on
    rec = next(r for r in rep["recommendations"] if r["rule"] == "small_kernels")
    assert "The profiler itself adds host time" in rec["action"]
    assert all(f"`{o}=True`" in rec["action"] for o in on)
    graphs = sorted((DEMO_LOGS / "h100_compiled_cuda_graphs").glob("*.pt.trace.json.gz"))[0]
    rep = report.analyze_trace(load_trace(str(graphs)))["report"]
    assert all("profiler itself" not in r["action"] for r in rep["recommendations"])
