"""Issue 34 item 2: kernels replayed from CUDA graphs (METRICS.md §15 "CUDA graph replays").

A replayed kernel carries the cudaGraphLaunch's correlation id, no shapes. When the trace
records the capture (cudaStreamBeginCapture .. EndCapture: the ops with their shapes, their
launch calls putting kernels in the graph), each replay's i-th kernel is attributed to the op
of the capture's i-th launch: FLOPs counted once per replay. When it does not, the MFU's
n/a reason says the kernels were replayed from CUDA graphs and how to record the capture, and
the compilation card (graph_kernels) and the MFU card do not contradict each other.

Ground truth: hand-built traces whose FLOPs follow from the shapes written here (2·M·N·K per
GEMM, FlopCounterMode's formula), and the real H100 torch.compile(mode="reduce-overhead")
run in demo_logs (its capture happened before the profiler started), whose replayed kernel
count is read from the raw JSON here."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import DEMO_LOGS, TRACES, needs_traces, real_report
from trace_builder import H100, TraceBuilder

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.trace.loader import load_trace

BF16, F16 = "c10::BFloat16", "c10::Half"
M, K, N = 1024, 2048, 4096          # aten::addmm: [M] + [M, K] @ [K, N], bf16
M2, K2, N2 = 512, 1024, 256         # aten::mm: [M2, K2] @ [K2, N2], fp16
GEMM1 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >"
GEMM2 = "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize64x64x32_cublas"
PER_REPLAY = 2 * M * N * K + 2 * M2 * N2 * K2  # 17,179,869,184 + 268,435,456


def _replay(b, ts):
    """One cudaGraphLaunch at ``ts`` replaying the graph's three kernels (400, 50, 100 µs)."""
    corr = b.runtime("cudaGraphLaunch", ts, 20)
    b.kernel(GEMM1, ts + 30, 400, correlation=corr)
    b.kernel(ADD, ts + 440, 50, correlation=corr)
    b.kernel(GEMM2, ts + 500, 100, correlation=corr)


def _graph_trace(capture=True, steps=(1, 2, 3), frames=False, filler=0):
    """Three 2 ms steps, each ending with an eager aten::mul (20 µs kernel). In step 1 the capture (when ``capture``): aten::addmm (bf16), aten::add,
    aten::mm (fp16), each with one launch call that runs nothing (captured), between
    cudaStreamBeginCapture and cudaStreamEndCapture; then the replay cudagraph trees does right
    after recording. Steps 2 and 3: one replay each. ``steps``: the step numbers this file
    records (a later span of one profiler: 2, 3), at their times; the capture is in the first;
    ``frames``: with_stack frames around the capture (model.py(7): forward > Block_0) and
    around each replay (train.py(20): train_step); ``filler``: that many 1 µs aten::empty per step
    (no shapes, no kernel: trace events enough for the cards to be judged)."""
    b = TraceBuilder(props=(H100,))
    for n in steps:
        s = n - 1
        t0 = 10_000 + s * 2000
        b.step(n, t0, 1990)
        if n == steps[0] and capture and frames:
            b.cpu("model.py(7): forward", t0 + 5, 140, cat="python_function")
            b.cpu("nn.Module: Block_0", t0 + 6, 138, cat="python_function")
        if frames:  # the line that replays the graph
            b.cpu("train.py(20): train_step", t0 + 190, 40, cat="python_function")
        for i in range(filler):
            b.cpu("aten::empty", t0 + 1000 + 10 * i, 1)
        if n == steps[0] and capture:
            b.runtime("cudaStreamBeginCapture", t0 + 10, 5)
            b.cpu("aten::addmm", t0 + 20, 40, **{"Input Dims": [[N], [M, K], [K, N], [], []],
                                                  "Input type": [BF16, BF16, BF16, "Scalar", "Scalar"]})
            b.runtime("cudaLaunchKernel", t0 + 30, 5)
            b.cpu("aten::add", t0 + 70, 30, **{"Input Dims": [[M, N], [M, N], []],
                                                "Input type": [BF16, BF16, "Scalar"]})
            b.runtime("cudaLaunchKernel", t0 + 80, 5)
            b.cpu("aten::mm", t0 + 110, 30, **{"Input Dims": [[M2, K2], [K2, N2]], "Input type": [F16, F16]})
            b.runtime("cudaLaunchKernel", t0 + 120, 5)
            b.runtime("cudaStreamEndCapture", t0 + 150, 5)
        _replay(b, t0 + 200)
        # an eager op with shapes after the graph (the loss): record_shapes was on
        b.cpu("aten::mul", t0 + 900, 30, **{"Input Dims": [[M, N], []], "Input type": [BF16, "Scalar"]})
        b.launch("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<mul> >",
                 t0 + 905, t0 + 950, 20, call_dur=5)
    return b


def test_replays_attributed_to_the_capture_time_ops(tmp_path):
    rep = report.analyze_trace(_graph_trace().load(tmp_path))["report"]
    sec = rep["flops"]
    # before issue 34: 0 FLOPs, MFU n/a "no GEMM, convolution or attention with shapes"
    assert sec["flops"] == 3 * PER_REPLAY
    assert [r["flops"] for r in sec["per_step"]] == [PER_REPLAY] * 3
    assert sec["by_precision"]["bf16"]["flops"] == 3 * 2 * M * N * K
    assert sec["by_precision"]["fp16"]["flops"] == 3 * 2 * M2 * N2 * K2
    kernels = {k["name"]: k for k in sec["kernels"]}
    assert kernels[GEMM1]["class"] == "gemm" and kernels[GEMM1]["precision"] == "bf16"
    assert kernels[GEMM1]["flops"] == 3 * 2 * M * N * K and kernels[GEMM1]["count"] == 3
    assert kernels[GEMM2]["precision"] == "fp16" and kernels[GEMM2]["flops"] == 3 * 2 * M2 * N2 * K2
    assert kernels[ADD]["class"] == "elementwise" and kernels[ADD]["flops"] == 0
    assert sec["by_class"]["gemm"]["kernel_us"] == 3 * (400 + 100)
    assert sec["flop_kernel_us"] == 3 * (400 + 100)
    # the capture-time ops ran nothing themselves: not "unlaunched", not counted on their own
    assert sec["unlaunched_calls"] == 0 and sec["counted_calls"] == 3 * 2
    assert sec["by_class"]["elementwise"]["calls"] == 3 + 3  # the replayed add (3x) and the eager mul
    gr = dict(sec["graph_replays"])
    caps, unmatched = gr.pop("recorded_captures"), gr.pop("unmatched")
    assert gr == {"kernels": 9, "kernel_us": 3 * 550.0, "attributed": 9,
                  "attributed_kernel_us": 3 * 550.0, "captures": 1, "step_kernel_us": 3 * (550.0 + 20)}
    # what a worker summary pairs with another span's replays: the capture, each op once
    assert unmatched == [] and len(caps) == 1 and caps[0]["kernels"] == 3
    ops = [caps[0]["ops"][i] for i in caps[0]["kernel_op"]]  # in launch order
    assert [(o["flops"], o["precision"], o["class"], o["counted"]) for o in ops] == [
        (2 * M * N * K, "bf16", "gemm", True), (0.0, None, "elementwise", False),
        (2 * M2 * N2 * K2, "fp16", "gemm", True)]
    assert ops[1]["bytes"] == 3 * M * N * 2  # aten::add: two bf16 inputs and the output
    assert "flops.graph_replays" not in rep["not_available"]
    assert rep["flops"]["mfu_pct"] is not None


def test_replay_of_another_graph_is_not_attributed(tmp_path):
    """A replay whose kernel count differs from every recorded capture stays unattributed."""
    b = _graph_trace()
    corr = b.runtime("cudaGraphLaunch", 15_000, 20)  # step 3: a two-kernel graph never captured here
    b.kernel(GEMM1, 15_900, 30, correlation=corr)
    b.kernel(ADD, 15_940, 10, correlation=corr)
    rep = report.analyze_trace(b.load(tmp_path))["report"]
    sec = rep["flops"]
    assert sec["flops"] == 3 * PER_REPLAY
    assert sec["graph_replays"]["kernels"] == 11 and sec["graph_replays"]["attributed"] == 9
    why = rep["not_available"]["flops.graph_replays"]
    assert why.startswith("FLOPs and MFU are partial: 2 kernels replayed from CUDA graphs")
    assert "no capture recorded in this trace matches them" in why


def test_no_capture_recorded_says_how_to_record_it(tmp_path):
    rep = report.analyze_trace(_graph_trace(capture=False).load(tmp_path))["report"]
    sec = rep["flops"]
    assert sec["flops"] == 0 and sec["mfu_pct"] is None
    why = rep["not_available"]["flops.mfu_pct"]
    assert "9 kernels replayed from CUDA graphs" in why and "the trace does not record their capture" in why
    assert "start the profiler before the first call that captures" in why
    assert "no GEMM, convolution or attention" not in why


def _raw_replayed(path):
    ev = json.load(gzip.open(path))["traceEvents"]
    launches = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"}
    return [e for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") in launches]


@pytest.mark.skipif(not (DEMO_LOGS / "h100_compiled_cuda_graphs").exists(), reason="demo run missing")
def test_real_reduce_overhead_run_says_cuda_graphs():
    """The H100 torch.compile(mode="reduce-overhead") demo run: its graphs were captured before the
    profiler started, so no replayed kernel can be attributed; the MFU card says so, and does not
    claim there was no GEMM while the compilation card counts the graph kernels."""
    for path in sorted((DEMO_LOGS / "h100_compiled_cuda_graphs").glob("*.pt.trace.json.gz")):
        rep = report.analyze_trace(load_trace(str(path)))["report"]
        raw = _raw_replayed(path)
        gr = rep["flops"]["graph_replays"]
        assert gr["kernels"] == rep["compilation"]["graph_kernels"] == len(raw) == 140  # all in the 2 steps
        assert gr["attributed"] == 0 and gr["captures"] == 0
        assert gr["kernel_us"] == pytest.approx(sum(e["dur"] for e in raw))
        why = rep["not_available"]["flops.mfu_pct"]
        # before issue 34: "no FLOPs counted in the steps (no GEMM, convolution or attention with shapes)"
        assert "140 kernels replayed from CUDA graphs" in why and "record the capture" in why
        assert rep["verdicts"]["mfu"]["verdict"] == why


@needs_traces
def test_real_trace_with_graph_replays_says_the_mfu_is_partial():
    """The 16-rank A100 trace: 70 cudaGraphLaunch replaying 135 kernels (cutlass GEMMs among them),
    no capture in the trace: FLOPs from the eager ops only, said to be partial."""
    rel = "hta/negative_queue_length_values_check/rank0.json.gz"
    rep = real_report(rel)
    gr = rep["flops"]["graph_replays"]
    raw = _raw_replayed(TRACES / rel)
    assert gr["kernels"] == len(raw) == 135 and gr["attributed"] == 0
    assert rep["not_available"]["flops.graph_replays"].startswith(
        "FLOPs and MFU are partial: 135 kernels replayed from CUDA graphs")
    assert "partial: 135 kernels" in rep["verdicts"]["mfu"]["verdict"]


def test_replayed_kernels_take_the_capture_time_source_line_and_module(tmp_path):
    """With with_stack frames around the capture (model.py(7): forward > nn.Module: Block_0 >
    the three ops), the replays' kernel time (3 x 550 µs) goes to that line and module, as an
    eager run's would; before issue 34 it was unattributed (the cudaGraphLaunch has no frame)."""
    from tb_bottleneck_plugin.analysis import source
    from tb_bottleneck_plugin.analysis.steps import find_steps

    b = _graph_trace()
    b.cpu("model.py(7): forward", 10_015, 140, cat="python_function")
    b.cpu("nn.Module: Block_0", 10_016, 138, cat="python_function")
    trace = b.load(tmp_path)
    sec = source.source_view(trace, find_steps(trace), not_available={})
    line = next(r for r in sec["lines"] if r["frame"] == "model.py(7): forward")
    assert line["gpu_us"] == 3 * 550 and line["kernels"] == 9
    mod = next(m for m in sec["modules"] if m["path"] == "Block_0")
    assert mod["gpu_fwd_us"] == 3 * 550


# ---------------------------------------------------------------- the capture in another span

def _worker_spans(tmp_path, worker="w0", other_worker=None):
    """A run directory as torch.profiler with a schedule writes it: one file per active span of
    worker ``worker``: span 1 (step 1) records the capture and its first replay, span 2 (steps 2
    and 3) only replays. ``other_worker``: span 2 is that worker's file instead."""
    run = tmp_path / "run"
    _graph_trace(steps=(1,), frames=True, filler=60).write(run / f"{worker}.1700000000001.pt.trace.json")
    _graph_trace(capture=False, steps=(2, 3), frames=True, filler=60).write(
        run / f"{other_worker or worker}.1700000000002.pt.trace.json")
    return run


def _summaries(path):
    """As `report --json` (serving/engine.json_report) arranges them: per run its workers' span
    reports and summaries, and a run summary over every span when it has several workers."""
    from tb_bottleneck_plugin.trace import discovery

    logdir = discovery.discover_path(str(path))
    doc = {"runs": []}
    for run in logdir.runs:
        entry = {"run": run.name, "workers": []}
        every = []
        for w in run.workers:
            results = [report.analyze_span(logdir.url, run, s) for s in w.spans]
            every += results
            entry["workers"].append({"worker": w.name, "spans": [r["report"] for r in results],
                                     "summary": report.combine_results(results, run=run.name, worker=w.name,
                                                                       views=False)["report"]})
        if len(run.workers) > 1:
            entry["summary"] = report.combine_results(every, run=run.name, views=False)["report"]
        doc["runs"].append(entry)
    return doc


def test_capture_in_another_span_of_the_worker_counts_in_its_summary(tmp_path):
    """Span 2 alone cannot count its 2 replays (no capture in its file: n/a, as before); the
    worker summary pairs them with span 1's capture (same kernel count and names): 3 replays ×
    (2·M·N·K + 2·M2·N2·K2) FLOPs, per step, per precision and class, as the one-file trace."""
    doc = _summaries(_worker_spans(tmp_path))
    (run,) = doc["runs"]
    (worker,) = run["workers"]
    span1, span2 = sorted(worker["spans"], key=lambda r: r["span"])
    assert span1["flops"]["flops"] == PER_REPLAY
    assert span2["flops"]["flops"] == 0 and span2["flops"]["mfu_pct"] is None
    assert "the trace does not record their capture" in span2["not_available"]["flops.mfu_pct"]
    assert span2["flops"]["graph_replays"]["unmatched"][0]["replays"] == [[2, 1], [3, 1]]
    summ = worker["summary"]
    sec = summ["flops"]
    assert sec["flops"] == 3 * PER_REPLAY  # before: PER_REPLAY (span 1's replay only)
    assert [(r["step"], r["flops"]) for r in sec["per_step"]] == [(1, PER_REPLAY), (2, PER_REPLAY), (3, PER_REPLAY)]
    assert sec["by_precision"]["bf16"]["flops"] == 3 * 2 * M * N * K
    assert sec["by_precision"]["fp16"]["flops"] == 3 * 2 * M2 * N2 * K2
    assert sec["by_class"]["gemm"]["kernel_us"] == 3 * (400 + 100)
    assert sec["by_class"]["gemm"]["calls"] == 3 * 2
    assert sec["flop_kernel_us"] == 3 * (400 + 100) and sec["counted_calls"] == 3 * 2
    kernels = {k["name"]: k for k in sec["kernels"]}
    assert kernels[GEMM1]["class"] == "gemm" and kernels[GEMM1]["precision"] == "bf16"
    assert kernels[GEMM1]["flops"] == 3 * 2 * M * N * K and kernels[GEMM1]["count"] == 3
    assert kernels[GEMM2]["flops"] == 3 * 2 * M2 * N2 * K2 and kernels[ADD]["class"] == "elementwise"
    gr = sec["graph_replays"]
    assert (gr["kernels"], gr["attributed"], gr["attributed_other_span"]) == (9, 9, 6)
    assert gr["attributed_kernel_us"] == gr["kernel_us"] == 3 * 550.0
    # the same numbers as one file holding all three steps
    one = report.analyze_trace(_graph_trace().load(tmp_path))["report"]["flops"]
    for key in ("flops", "bytes", "flop_kernel_us", "ideal_us", "mfu_pct", "counted_calls"):
        assert sec[key] == pytest.approx(one[key]), key
    assert {c: v["kernel_us"] for c, v in sec["by_class"].items()} == \
        pytest.approx({c: v["kernel_us"] for c, v in one["by_class"].items()})
    # the replays' GPU time on the capture's source line and module (span 2 alone: unattributed)
    src2 = span2["source_attribution"]
    assert {r["frame"]: r["gpu_us"] for r in src2["lines"]} == {"train.py(20): train_step": 2 * 550}
    assert src2["modules"] is None
    src = summ["source_attribution"]
    line = next(r for r in src["lines"] if r["frame"] == "model.py(7): forward")
    assert line["gpu_us"] == 3 * 550 and line["kernels"] == 9  # before: 550 and 3 (span 1's replay)
    line = next(r for r in src["lines"] if r["frame"] == "train.py(20): train_step")
    assert line["gpu_us"] == 0 and line["kernels"] == 0  # before: 1100 µs, 6 kernels (span 2's replays)
    mod = next(m for m in src["modules"] if m["path"] == "Block_0")
    assert mod["gpu_fwd_us"] == mod["gpu_self_fwd_us"] == 3 * 550
    assert src["unattributed_gpu_us"] == 3 * 20  # the eager aten::mul kernels have no frame
    # the card is no longer n/a or partial, and no reason about the replays is left
    assert "flops.graph_replays" not in summ["not_available"] and "flops.mfu_pct" not in summ["not_available"]
    mfu = summ["verdicts"]["mfu"]
    assert mfu["value"] == pytest.approx(one["mfu_pct"]) and "partial" not in mfu["verdict"]
    # judged (217 trace events): 0.89 % of the peak, below MFU_LOW_PCT; span 2's card: n/a, the reason
    assert mfu["severity"] == "medium" and "bf16" in mfu["verdict"] and "fp16" in mfu["verdict"]
    assert span2["verdicts"]["mfu"]["value"] is None
    assert "6 kernels replayed from CUDA graphs" in span2["verdicts"]["mfu"]["verdict"]


def test_summary_says_how_many_replays_are_left(tmp_path):
    """Span 2 also replays a 2-kernel graph no span captured: the 3-kernel replays are paired, the
    summary's reason counts the 2 left (span 2's own reason counted 8)."""
    run = tmp_path / "run"
    _graph_trace(steps=(1,)).write(run / "w0.1700000000001.pt.trace.json")
    b = _graph_trace(capture=False, steps=(2, 3))
    corr = b.runtime("cudaGraphLaunch", 15_000, 20)  # step 3
    b.kernel(GEMM1, 15_900, 30, correlation=corr)
    b.kernel(ADD, 15_940, 10, correlation=corr)
    b.write(run / "w0.1700000000002.pt.trace.json")
    (worker,) = _summaries(run)["runs"][0]["workers"]
    span2 = next(r for r in worker["spans"] if r["span"] == "1700000000002")
    assert "8 kernels replayed from CUDA graphs" in span2["not_available"]["flops.mfu_pct"]
    summ = worker["summary"]
    assert summ["flops"]["flops"] == 3 * PER_REPLAY
    gr = summ["flops"]["graph_replays"]
    assert (gr["kernels"], gr["attributed"], gr["attributed_other_span"]) == (11, 9, 6)
    why = summ["not_available"]["flops.graph_replays"]
    assert why.startswith("FLOPs and MFU are partial: 2 kernels replayed from CUDA graphs (40 µs")
    assert "no span of their worker records a matching capture" in why
    assert "flops.mfu_pct" not in summ["not_available"]


def test_the_latest_capture_before_the_replays_across_files(tmp_path):
    """Kineto counts each file's times from its baseTimeNanoseconds. Two spans capture a graph of
    the same kernels (span 2 with aten::addmm of 2·M rows), span 3 replays it: the capture that
    ended last before the replay is span 2's, told by the base times (the files' own times are
    equal), so span 3's replay counts 2·(2M)·N·K + 2·M2·N2·K2."""
    from trace_builder import write_trace

    run = tmp_path / "run"
    second = _graph_trace(steps=(1,))
    for e in second.events:
        if e.get("name") == "aten::addmm":
            e["args"]["Input Dims"] = [[N], [2 * M, K], [K, N], [], []]
    for i, (b, base) in enumerate(((_graph_trace(steps=(1,)), 1), (second, 2), (_graph_trace(False, steps=(1,)), 3))):
        write_trace(run / f"w0.170000000000{i + 1}.pt.trace.json", b.events, props=b.props,
                    baseTimeNanoseconds=base * 10 ** 15)
    (worker,) = _summaries(run)["runs"][0]["workers"]
    later = 2 * (2 * M) * N * K + 2 * M2 * N2 * K2
    assert worker["summary"]["flops"]["flops"] == PER_REPLAY + later + later


def test_pairing_leaves_the_span_results_as_they_were(tmp_path):
    """A summary is made again and again from the stored span results (the tab, compare, the
    rank table): pairing must not change them (a second summary adds the replays once)."""
    from tb_bottleneck_plugin.trace import discovery

    logdir = discovery.discover_path(str(_worker_spans(tmp_path)))
    run = logdir.runs[0]
    results = [report.analyze_span(logdir.url, run, s) for s in run.workers[0].spans]
    before = json.dumps([r["partials"] for r in results], sort_keys=True)
    first = report.combine_results(results, run=run.name, worker="w0")["report"]["flops"]
    again = report.combine_results(results, run=run.name, worker="w0")["report"]["flops"]
    assert json.dumps([r["partials"] for r in results], sort_keys=True) == before
    assert first["flops"] == again["flops"] == 3 * PER_REPLAY
    assert [r["flops"] for r in again["per_step"]] == [PER_REPLAY] * 3


def test_replay_with_its_capture_in_another_worker_is_not_paired(tmp_path):
    """Span 2 belongs to worker w1: w0's capture is another process's graph. The run summary (both
    workers) and w1 keep span 2's replays unattributed, with the reason."""
    doc = _summaries(_worker_spans(tmp_path, other_worker="w1"))
    (run,) = doc["runs"]
    w1 = next(w for w in run["workers"] if w["worker"] == "w1")["summary"]
    assert w1["flops"]["flops"] == 0 and "flops.mfu_pct" in w1["not_available"]
    summ = run["summary"]
    assert summ["flops"]["flops"] == PER_REPLAY
    assert summ["flops"]["graph_replays"]["attributed"] == 3
    assert "6 kernels replayed from CUDA graphs" in summ["not_available"]["flops.graph_replays"]
    assert summ["flops"]["graph_replays"]["kernels"] == 9 and not summ["flops"]["graph_replays"].get(
        "attributed_other_span")


def test_replay_of_another_graph_in_another_span_stays_unmatched(tmp_path):
    """Span 2 replays a graph of 3 kernels whose names differ from the capture's first replay
    (another graph of the same size): not paired; the summary says 2 replays are left."""
    run = tmp_path / "run"
    _graph_trace(steps=(1,)).write(run / "w0.1700000000001.pt.trace.json")
    b = _graph_trace(capture=False, steps=(2, 3))
    for e in b.events:
        if e.get("name") == GEMM2:
            e["name"] = "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x64x32_cublas"
    b.write(run / "w0.1700000000002.pt.trace.json")
    summ = _summaries(run)["runs"][0]["workers"][0]["summary"]
    assert summ["flops"]["flops"] == PER_REPLAY
    assert summ["flops"]["graph_replays"]["attributed"] == 3
    assert "6 kernels replayed from CUDA graphs" in summ["not_available"]["flops.graph_replays"]


def test_the_report_route_serves_the_paired_worker_summary(tmp_path, monkeypatch):
    """The tab's report route for the worker (run=run&worker=w0: the summary of its two spans)
    counts span 2's replays; the route for span 2 alone does not."""
    import argparse
    import time

    from tensorboard.backend import application
    from tensorboard.plugins import base_plugin
    from werkzeug import test as wtest
    from werkzeug import wrappers

    from tb_bottleneck_plugin.plugin import BottlenecksPlugin

    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")
    logdir = _worker_spans(tmp_path).parent
    flags = argparse.Namespace(bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=60.0, logdir_spec="")
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(logdir), flags=flags))
    client = wtest.Client(application.TensorBoardWSGI([plugin]), wrappers.Response)

    def get(**query):
        for _ in range(240):  # 202 while the spans load
            resp = client.get("/data/plugin/bottlenecks/report", query_string=query)
            if resp.status_code != 202:
                break
            time.sleep(0.25)
        assert resp.status_code == 200, resp.get_data()[:300]
        return json.loads(resp.get_data())

    try:
        worker = get(run="run", worker="w0")
        span2 = get(run="run", worker="w0", span="1700000000002")
    finally:
        plugin.analyzer.stop()
    assert worker["flops"]["flops"] == 3 * PER_REPLAY and worker["flops"]["graph_replays"]["attributed"] == 9
    assert not [k for k in worker["not_available"] if k.startswith("flops")]
    assert span2["flops"]["flops"] == 0 and "flops.mfu_pct" in span2["not_available"]
