"""The step model (METRICS.md §19) on hand-built traces with hand-computed critical paths and
what-ifs, and cross-checked with HTA's critical path on the shared H100 traces."""
from __future__ import annotations

import json

import pytest

from conftest import H100, TRACES, TraceBuilder, needs_traces, real_report
from tb_bottleneck_plugin import report as report_mod


def _model(b: TraceBuilder, tmp_path) -> dict:
    return report_mod.analyze_trace(b.load(tmp_path))["report"]["step_model"]


def _row(sm: dict, wid: str) -> dict:
    return next(r for r in sm["what_if"] if r["id"] == wid)


def sync_switch_trace() -> TraceBuilder:
    """Two 1000 µs steps. Each: launch at 10 (5 µs call) of a 600 µs kernel at 20..620;
    `.item()` at 100: a cudaStreamSynchronize 100..625 (waits for the kernel, returns 5 µs
    after it); then the host computes until the step ends at 1000 (375 µs of Python)."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.launch("void big_gemm_kernel<float>", t0 + 10, t0 + 20, 600)
        b.cpu("aten::item", t0 + 95, 535)
        b.runtime("cudaStreamSynchronize", t0 + 100, 525)
    return b


def test_the_model_reproduces_the_steps_and_its_critical_path_adds_up(tmp_path):
    sm = _model(sync_switch_trace(), tmp_path)
    assert sm["steps"] == 2 and sm["syncs"] == 2
    assert sm["step_us"] == pytest.approx(2000.0)
    assert sm["model_us"] == pytest.approx(2000.0) and sm["model_error_pct"] == pytest.approx(0.0)
    cp = sm["critical_path_us"]
    assert sum(cp.values()) == pytest.approx(sm["model_us"])
    # by hand, per step: host 10 µs to the launch, 10 µs launch latency, the 600 µs kernel,
    # the sync's 5 µs return, 375 µs of host compute to the step's end
    assert cp["gpu_gemm"] == pytest.approx(2 * 600.0)
    assert cp["gpu_launch_latency"] == pytest.approx(2 * 10.0)
    assert cp["sync_overhead"] == pytest.approx(2 * 5.0)
    assert cp["host_compute"] == pytest.approx(2 * (10.0 + 375.0))
    # per step the same parts, adding up to each step's modelled time
    for row in sm["per_step"]:
        assert row["model_us"] == pytest.approx(1000.0)
        assert sum(row["critical_path_us"].values()) == pytest.approx(row["model_us"])
        assert row["critical_path_us"]["gpu_gemm"] == pytest.approx(600.0)
        assert row["critical_path_us"]["host_compute"] == pytest.approx(385.0)


def test_removing_the_sync_switches_the_critical_path_from_the_gpu_to_the_host(tmp_path):
    """Without the sync the host does not wait for the kernel: its call costs one launch
    (5 µs) and the host runs on; the kernel (20..620) now overlaps the host's 375 µs of
    Python. Step 1 shrinks by the wait: the host reaches the step end at 10+5+85+5+375 = 480;
    step 2's kernel is ready at 480+10+10 = 500 but queues behind step 1's (ends 620): it runs
    620..1220, while step 2's host ends at 960: the span ends with the GPU at 1220, the GPU
    now sets the step: saving 2000 - 1220 = 780 µs (39 %)."""
    sm = _model(sync_switch_trace(), tmp_path)
    sync = _row(sm, "sync")
    assert sync["saving_us"] == pytest.approx(780.0)
    assert sync["saving_pct"] == pytest.approx(39.0)
    assert sync["predicted_step_ms"] == pytest.approx(0.61)


def input_trace() -> TraceBuilder:
    """Two 1000 µs steps: the DataLoader's __next__ holds the host 0..600, then one launch
    at 600 of a 300 µs kernel and a sync at 610 that waits for it (returns at 910+5)."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, 600, cat="user_annotation")
        b.launch("void big_gemm_kernel<float>", t0 + 600, t0 + 605, 300)
        b.runtime("cudaStreamSynchronize", t0 + 610, 300)
    return b


def test_input_wait_removed_gives_back_exactly_the_wait(tmp_path):
    sm = _model(input_trace(), tmp_path)
    assert sm["model_us"] == pytest.approx(2000.0)
    assert sm["critical_path_us"]["input_wait"] == pytest.approx(1200.0)
    inp = _row(sm, "input")
    assert inp["saving_us"] == pytest.approx(1200.0) and inp["saving_pct"] == pytest.approx(60.0)
    assert inp["rules"] == ["input_bound"]


def test_fp32_gemm_on_tensor_cores_is_scaled_by_the_peak_ratio(tmp_path):
    """Without recorded shapes the kernel's precision is unknown to the FLOPs section: the
    bf16 what-if then changes nothing (no fp32 kernel it can name), and says so by its
    absence; with the tc speedup recorded in the assumptions."""
    sm = _model(input_trace(), tmp_path)
    assert "bf16" not in [r["id"] for r in sm["what_if"]]
    assert sm["assumptions"]["tc_speedup"]["fp32"] > 1


def fusion_trace() -> TraceBuilder:
    """One 1000 µs step of eager elementwise work: 10 launches (5 µs calls, 45 µs of host
    between them) of 10 µs elementwise kernels, then a GEMM, a sync waiting for it."""
    b = TraceBuilder([H100])
    b.step(1, 0, 1000)
    t = 0
    for k in range(10):
        t += 50
        b.launch("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >", t, t + 5, 10)
    b.launch("void big_gemm_kernel<float>", 560, 565, 100)
    b.runtime("cudaStreamSynchronize", 570, 100)
    return b


def test_cuda_graphs_and_fusion_what_ifs_on_a_launch_bound_step(tmp_path):
    sm = _model(fusion_trace(), tmp_path)
    assert sm["model_us"] == pytest.approx(1000.0)
    # CUDA graphs by hand: the first launch becomes one graph launch (50..70), the other ten
    # launches and the host compute between them cost nothing (all at 70); the kernels follow
    # at the replay gap: k0 51.5..61.5, k1..k9 71.5..161.5, the GEMM 161.5..261.5; the sync
    # (at 75) returns at 266.5, the host computes its 330 µs: the step ends at 596.5
    graphs = _row(sm, "cuda_graphs")
    assert graphs["saving_us"] == pytest.approx(1000.0 - 596.5)
    # torch.compile by hand: the ten elementwise kernels are one chain -> one 10 µs kernel
    # (55..65); their nine other launches vanish with the host time before them; the GEMM's
    # launch keeps the compiled cost per launch (STEP_MODEL_COMPILED_HOST_US = 33.2 µs of its
    # 55 µs gap + 5 µs call): it starts at 83.2, its kernel runs 88.2..188.2, the sync returns
    # at 193.2, the step ends at 523.2
    from tb_bottleneck_plugin import thresholds as T

    assert T.STEP_MODEL_COMPILED_HOST_US == pytest.approx(33.2)
    fused = _row(sm, "torch_compile")
    assert fused["saving_us"] == pytest.approx(1000.0 - 523.2)
    assert fused["changed"] == 9


def test_what_ifs_never_lengthen_the_step_and_all_fixes_beat_each(tmp_path):
    for b in (sync_switch_trace(), input_trace(), fusion_trace()):
        sm = _model(b, tmp_path)
        best = max([r["saving_us"] for r in sm["what_if"] if r["id"] != "warmup"] + [0.0])
        assert all(r["saving_us"] >= 0 for r in sm["what_if"])
        assert sm["all_fixes"]["saving_us"] >= best - 1e-6


# ---------------------------------------------------------------- HTA's critical path

def _hta() -> dict:
    return json.loads((TRACES.parent / "oracles" / "hta_critical_path.json").read_text())["traces"]


# GPU-bound steps, where HTA's path and ours both run through the GPU kernels (METRICS §19)
AGREE = ("h100/demo-generator/input_bound_nw0", "h100/demo-generator/input_fixed_nw4", "h100/gpt2_bf16_eager",
         "h100/gpt2_bf16_compiled")


@needs_traces
@pytest.mark.parametrize("prefix", AGREE)
def test_gpu_time_on_the_critical_path_equals_htas_where_the_definitions_agree(prefix):
    (rel, hta), = [(k, v) for k, v in _hta().items() if k.startswith(prefix + "/")]
    steps = [s for s in hta["steps"].values() if s.get("critical_path_us")]
    hta_gpu = sum(s["bound_by_us"]["gpu_compute_bound"] for s in steps) / len(steps)
    sm = real_report(rel)["step_model"]
    cp = sm["critical_path_us"]
    ours = sum(v for k, v in cp.items() if k.startswith("gpu_") and k not in ("gpu_launch_latency",
                                                                             "gpu_communication")) / sm["steps"]
    assert ours == pytest.approx(hta_gpu, rel=0.03), (rel, ours, hta_gpu)
    assert sorted(int(k) for k in hta["steps"]) == [p["step"] for p in sm["per_step"]]


@needs_traces
def test_where_hta_weighs_host_gaps_as_zero_our_path_is_the_whole_step():
    """input_bound_nw0: HTA's path covers the model work only (~72 ms of a 316 ms step: the
    DataLoader span is a user_annotation, weighed 0); ours is the step, the wait on it."""
    rel, hta = next((k, v) for k, v in _hta().items() if "input_bound_nw0" in k)
    steps = [s for s in hta["steps"].values() if s.get("critical_path_us")]
    sm = real_report(rel)["step_model"]
    n = sm["steps"]
    assert sum(s["critical_path_us"] for s in steps) / len(steps) < 0.3 * sm["step_us"] / n
    assert sum(sm["critical_path_us"].values()) == pytest.approx(sm["model_us"], rel=1e-6)
    assert sm["critical_path_us"]["input_wait"] / n > 200_000


# ---------------------------------------------------------------- one fixture per what-if

def _memcpy(b: TraceBuilder, name: str, call: str, call_ts: float, call_dur: float, ts: float, dur: float,
            stream: int = 7):
    corr = b.runtime(call, call_ts, call_dur)
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                     "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": 1 << 20}})


def pageable_trace() -> TraceBuilder:
    """Per 1000 µs step: a pageable H2D copy whose call blocks the host 10..310 (the copy runs
    20..300); a 200 µs kernel launched at 320 (runs 330..530); a sync at 340 that waits for
    it (returns at 535); the host then computes until the step ends."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        _memcpy(b, "Memcpy HtoD (Pageable -> Device)", "cudaMemcpyAsync", t0 + 10, 300, t0 + 20, 280)
        b.launch("void big_gemm_kernel<float>", t0 + 320, t0 + 330, 200)
        b.runtime("cudaStreamSynchronize", t0 + 340, 195)
    return b


def test_pinned_copies_free_the_host_and_the_stream(tmp_path):
    """pinned_h2d by hand: the copy's call costs one launch (5 µs: 10..15), the copy leaves the
    step (prefetched on the copy engine); the host launches at 25 (the 10 µs gap kept), the kernel runs 35..235, the
    sync (at 45) returns at 240, the host computes its 465 µs: the next step starts at 705
    instead of 1000. Both steps: 2 x 295 µs."""
    sm = _model(pageable_trace(), tmp_path)
    assert sm["model_us"] == pytest.approx(2000.0)
    row = _row(sm, "pinned_h2d")
    assert row["saving_us"] == pytest.approx(590.0)
    assert row["rules"] == ["pageable_h2d"]


def test_device_copies_removed_on_a_gpu_bound_step(tmp_path):
    """d2d by hand: per 1000 µs step a 400 µs kernel (20..420) then a 300 µs device copy on the
    same stream (420..720), a sync at 30 that waits for both (returns at 725), host compute to
    the step's end (275 µs). Without the copy the sync returns at 425: 300 µs per step."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.launch("void big_gemm_kernel<float>", t0 + 10, t0 + 20, 400)
        _memcpy(b, "Memcpy DtoD (Device -> Device)", "cudaMemcpyAsync", t0 + 20, 5, t0 + 420, 300)
        b.runtime("cudaStreamSynchronize", t0 + 30, 695)
    sm = _model(b, tmp_path)
    assert sm["model_us"] == pytest.approx(2000.0)
    assert sm["critical_path_us"]["gpu_d2d"] == pytest.approx(600.0)
    assert _row(sm, "d2d")["saving_us"] == pytest.approx(600.0)


def test_compile_time_in_the_steps_removed(tmp_path):
    """graph_breaks by hand: a compiled region (a Triton kernel makes the run compiled) whose
    first 400 µs per step are Dynamo compiling; the host's other time and the GPU's are
    unchanged, so the step loses exactly the compile time: 2 x 400 µs."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.cpu("Torch-Compiled Region: 0/0", t0 + 5, 900)
        b.cpu("dynamo", t0 + 10, 400)
        b.launch("triton_poi_fused_add_0", t0 + 420, t0 + 430, 100)
        b.runtime("cudaStreamSynchronize", t0 + 440, 95)
    sm = _model(b, tmp_path)
    assert sm["model_us"] == pytest.approx(2000.0)
    assert sm["critical_path_us"]["compile"] == pytest.approx(800.0)
    row = _row(sm, "graph_breaks")
    assert row["saving_us"] == pytest.approx(800.0) and row["rules"] == ["torch_compile"]


def test_overlapped_collective_no_longer_holds_the_compute_kernel(tmp_path):
    """overlap_comm by hand: per 1000 µs step an NCCL all-reduce on stream 20 (100..600) holds
    a compute kernel launched at 50 on stream 7 until 600 (it runs 600..700); a
    cudaStreamSynchronize at 60 waits for the compute stream (it returns at 705: the stream
    whose work ended just before it, METRICS §19). Overlapped, the kernel starts at its launch
    + the queued launch latency (10 µs): 60..160, the sync returns at 165 and the host's 295 µs
    end the step at 460; step 2 the same from 460 (host end 920), but its all-reduce (launched
    at 470, ready at 560) queues behind step 1's on their stream and runs 600..1100: the span
    ends with it at 1100, 900 µs earlier than the 2000 µs recorded."""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000)):
        b.step(n, t0, 1000)
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 10, t0 + 100, 500, stream=20)
        b.launch("void big_gemm_kernel<float>", t0 + 50, t0 + 600, 100)
        b.runtime("cudaStreamSynchronize", t0 + 60, 645)
    sm = _model(b, tmp_path)
    assert sm["model_us"] == pytest.approx(2000.0)
    row = _row(sm, "overlap_comm")
    assert row["saving_us"] == pytest.approx(900.0)
    assert row["rules"] == ["communication", "ddp_buckets", "fsdp_prefetch"]


SCHEDULE_TRACES = ("hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_diff/control/control.json.gz",
                   "h100/gpt2_bf16_eager/worker0.1795701567436882984.pt.trace.json.gz")


@needs_traces
@pytest.mark.parametrize("rel", SCHEDULE_TRACES)
def test_the_what_ifs_scalar_total_is_the_schedules_bit_for_bit(rel):
    """The what-ifs' total (step_model._simulated_total: a scalar recurrence over the syncs)
    against the full list schedule (simulate) on real graphs: the graph's own values and
    random changes of host gaps, GPU durations, syncs, removed nodes and streams give the same
    float; a negative step falls back to the schedule."""
    import numpy as np

    from tb_bottleneck_plugin.analysis import step_model as sm
    from tb_bottleneck_plugin.analysis.linking import gpu_runtime_index
    from tb_bottleneck_plugin.analysis.steps import find_steps
    from tb_bottleneck_plugin.trace import loader

    trace = loader.load_trace(str(TRACES / rel))
    gr = sm.build_graph(trace, find_steps(trace), gpu_runtime_index(trace))
    assert gr is not None and (gr.kind == sm.H_SYNC).any()
    rng = np.random.default_rng(7)
    cases = [sm._changes(gr)]
    for i in range(6):
        ch = sm._changes(gr)
        ch.own("gap", "busy", "g_dur", "g_lat")  # (the graph's own arrays until then)
        ch["gap"] *= rng.uniform(0.0, 2.0, len(ch["gap"]))
        ch["busy"] *= rng.uniform(0.0, 2.0, len(ch["busy"]))
        ch["g_dur"] *= rng.uniform(0.0, 2.0, len(ch["g_dur"]))
        ch["is_sync"] = ch["is_sync"] & (rng.random(len(ch["is_sync"])) < 0.7)
        ch["g_lat"][rng.random(len(ch["g_lat"])) < 0.05] = -np.inf
        if i % 2:  # some work moved to a stream of its own (as the comm what-if does)
            ch["g_stream"] = np.where(rng.random(len(gr.g_stream)) < 0.3, gr.g_stream.max() + 1, gr.g_stream)
        cases.append(ch)
    for ch in cases:
        fast = sm._simulated_total(gr, **ch)
        assert fast is not None
        assert fast == sm.simulate(gr, **ch).total_us
    neg = sm._changes(gr)
    neg.own("g_dur")
    neg["g_dur"][0] = -(neg["g_gap"][0] + 1.0)
    assert sm._simulated_total(gr, **neg) is None
    assert sm._total(gr, neg) == sm.simulate(gr, **neg).total_us


@needs_traces
@pytest.mark.parametrize("rel", SCHEDULE_TRACES)
def test_what_ifs_never_write_the_graphs_own_arrays(rel):
    """Each what-if starts from the graph's own arrays (step_model._Changes) and copies the ones
    it changes before writing them: with the graph's arrays read-only every what-if (and all of
    them one after another, as the all-fixes row applies them) still runs, and a saved state
    (``shared``) keeps its values while the next fix changes the arrays it shares."""
    import numpy as np

    from tb_bottleneck_plugin.analysis import step_model as sm
    from tb_bottleneck_plugin.analysis.linking import gpu_runtime_index
    from tb_bottleneck_plugin.analysis.steps import find_steps
    from tb_bottleneck_plugin.trace import loader

    trace = loader.load_trace(str(TRACES / rel))
    gr = sm.build_graph(trace, find_steps(trace), gpu_runtime_index(trace))
    for name in ("gap", "busy", "g_lat", "g_gap", "g_dur", "g_stream"):
        getattr(gr, name).flags.writeable = False
    fixes = [lambda ch: sm._apply_input(gr, ch), lambda ch: sm._apply_pinned(gr, ch),
             lambda ch: sm._apply_sync(gr, ch), lambda ch: sm._apply_cuda_graphs(gr, ch, 2.0),
             lambda ch: sm._apply_fusion(gr, ch, 3.0), lambda ch: sm._apply_bf16(gr, ch, {"fp32": 4.0}),
             lambda ch: sm._apply_compile_breaks(gr, ch, 3.0), lambda ch: sm._apply_comm(gr, ch),
             lambda ch: sm._apply_d2d(gr, ch)]
    for fix in fixes:
        fix(sm._changes(gr))
    ch = sm._changes(gr)
    for fix in fixes:
        before = ch.shared()
        kept = {k: v.copy() for k, v in before.items()}
        fix(ch)
        for k, v in kept.items():
            assert np.array_equal(before[k], v, equal_nan=True)
