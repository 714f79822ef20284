"""Issue 34 item 5, "context and labels" (analysis/context.py, METRICS.md §9 Context; the
synchronization rule in judge/recommendations.py).

- CUDA-graph trees copy a replayed graph's static inputs with ``aten::_foreach_copy_`` before
  every replay, in inference as in training: that op alone (no backward op, no
  ``Optimizer.step``, no other ``_foreach_`` math) is not an optimizer, so such a run is
  inference, and its advice is worded for inference.
- A capture-only trace (CUDA graphs captured, never replayed: vLLM's ``_capture_cudagraphs``
  with ``hipDeviceSynchronize`` between captures) gets no synchronisation advice: its GPU idles
  during the syncs because the captured launches run nothing, as every other card there says
  ("not judged: CUDA graphs captured, not replayed").
Traces written with tests/trace_builder.py; every number by hand.
"""
from __future__ import annotations

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import context
from tb_bottleneck_plugin.judge import recommendations as R
from trace_builder import H100, MI300, TraceBuilder, occupancy_args

TRAINING_WORDS = ("GradScaler", "loss", "log metrics every N steps", "training", "no_sync", "bucket_cap_mb")


def analyse(b, tmp_path, name="t.pt.trace.json"):
    return report.analyze_trace(b.load(tmp_path, name))["report"]


def rules(rep):
    return {r["rule"]: r for r in rep["recommendations"]}


def replay_trace(steps=24, foreach=(), backward=False, sync_us=0):
    """Steps of 1000 µs of a cudagraph-trees inference loop: the input copy
    ``aten::_foreach_copy_`` [10, 40) (one copy kernel), a ``cudaGraphLaunch`` [50, 60) whose
    replay runs 4 kernels of 50 µs [100, 300), then (``sync_us``) ``aten::item`` waiting in
    ``cudaStreamSynchronize`` from 320 while the GPU idles. ``foreach``: more ops per step
    (e.g. ``aten::_foreach_add_``); ``backward``: one autograd op per step."""
    b = TraceBuilder([H100])
    for n in range(steps):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.cpu("aten::_foreach_copy_", t0 + 10, 30)
        b.launch("void at::native::multi_tensor_apply_kernel<CopyFunctor>", t0 + 15, t0 + 20, 5,
                 **occupancy_args(50, 2.0))
        corr = b.runtime("cudaGraphLaunch", t0 + 50, 10)
        for i in range(4):
            b.kernel(f"triton_poi_fused_add_{i}", t0 + 100 + 50 * i, 50, correlation=corr,
                     **occupancy_args(50, 2.0, grid=(264, 1, 1)))
        for i, name in enumerate(foreach):
            b.cpu(name, t0 + 700 + 20 * i, 10)
        if backward:
            b.cpu("autograd::engine::evaluate_function: AddmmBackward0", t0 + 800, 20)
        if sync_us:
            b.cpu("aten::item", t0 + 310, sync_us + 20)
            b.cpu("aten::_local_scalar_dense", t0 + 312, sync_us + 15)
            b.runtime("cudaStreamSynchronize", t0 + 320, sync_us)
    return b


# ---------------------------------------------------------------------------- the label


def test_foreach_copy_alone_is_inference(tmp_path):
    rep = analyse(replay_trace(), tmp_path)
    ctx = rep["context"]
    assert ctx["mode"] == "inference" and ctx["cuda_graphs"]
    ev = ctx["evidence"]
    assert ev["foreach_copy_ops"] == 24 and ev["optimizer_ops"] == 0 and ev["backward_ops"] == 0
    assert ev["graph_launches"] == 24 and ev["graph_kernels"] == 96


@pytest.mark.parametrize("extra, backward", [
    (("aten::_foreach_add_",), False),
    (("aten::_foreach_mul_", "aten::_foreach_addcmul_"), False),
    (("Optimizer.step#AdamW.step",), False),
    (("aten::_fused_adamw_",), False),
    ((), True),
])
def test_foreach_copy_with_optimizer_math_or_backward_is_training(tmp_path, extra, backward):
    ctx = analyse(replay_trace(steps=3, foreach=extra, backward=backward), tmp_path)["context"]
    assert ctx["mode"] == "training"
    assert ctx["evidence"]["foreach_copy_ops"] == 3
    assert ctx["evidence"]["optimizer_ops"] == 3 * len(extra)


@pytest.mark.parametrize("name, optimizer", [
    ("aten::_foreach_copy_", False), ("aten::_foreach_copy", False),
    ("aten::_foreach_add_", True), ("aten::_foreach_lerp_", True), ("aten::_foreach_sqrt", True),
    ("aten::_foreach_zero_", True), ("aten::_foreach_copy_back", True),
    ("aten::_fused_adam_", True), ("aten::_fused_sgd_", True),
    ("Optimizer.step#SGD.step", True), ("Optimizer.zero_grad#SGD.zero_grad", True), ("optimizer.step", True),
    ("aten::copy_", False),
])
def test_optimizer_pattern(name, optimizer):
    assert bool(context.OPTIMIZER_RE.search(name)) is optimizer


def test_summaries_add_the_copy_evidence():
    merged = context.combine([{"mode": "inference", "evidence": {"foreach_copy_ops": 4}},
                              {"mode": "inference", "evidence": {"foreach_copy_ops": 6}}])
    assert merged["mode"] == "inference" and merged["evidence"]["foreach_copy_ops"] == 10


# ---------------------------------------------------------------------------- the sync rule's wording


def test_sync_advice_on_a_replayed_inference_run_is_worded_for_inference(tmp_path):
    """The GPU idles in every 1000 µs step while the host waits 400 µs in
    cudaStreamSynchronize (the replay ended at 300, the wait starts at 320): the rule fires,
    with inference wording (no loss, no "log metrics every N steps")."""
    rep = analyse(replay_trace(sync_us=400), tmp_path)
    assert rep["context"]["mode"] == "inference" and not R.capture_only(rep)
    assert rep["sync"]["sync_gpu_idle_pct"] == pytest.approx(40.0)
    rec = rules(rep)["synchronization"]
    assert rec["severity"] in ("medium", "high")
    assert "inference loop" in rec["action"] and "once per batch" in rec["action"]
    text = rec["title"] + " " + rec["action"]
    for words in TRAINING_WORDS:
        assert words not in text, words
    assert rec["title"].startswith("Host-device synchronisation leaves the GPU idle 40 % of the step")


def test_sync_advice_on_a_training_run_keeps_the_training_wording(tmp_path):
    rep = analyse(replay_trace(sync_us=400, foreach=("aten::_foreach_add_",)), tmp_path)
    assert rep["context"]["mode"] == "training"
    rec = rules(rep)["synchronization"]
    assert "log metrics every N steps" in rec["action"] and "inference loop" not in rec["action"]


# ---------------------------------------------------------------------------- capture-only traces


def capture_trace(steps=3, syncs=4, sync_us=150):
    """vLLM's CUDA-graph capture on an MI300X (ROCm names): warm-up kernels before the steps,
    then in each 1000 µs step ``_capture_cudagraphs`` [5, 995): ``syncs`` batch sizes, each
    ``hipStreamBeginCapture``, 12 captured ``hipLaunchKernel`` (no kernel runs), end, instantiate
    and a ``hipDeviceSynchronize`` of ``sync_us`` µs; no ``hipGraphLaunch``: nothing replayed,
    and no backward or optimizer op (inference)."""
    b = TraceBuilder([MI300])
    for i in range(12):  # eager warm-up before the steps: real kernels, 2 µs each
        b.cpu("aten::add", 10 + 40 * i, 20)
        b.launch("void at::native::vectorized_elementwise_kernel<4>", 12 + 40 * i, 20 + 40 * i, 2,
                 call="hipLaunchKernel")
    for n in range(steps):
        t0 = 1000 + n * 1000
        b.step(n + 1, t0, 1000)
        b.cpu("_capture_cudagraphs", t0 + 5, 990, cat="user_annotation")
        width = 990 // syncs
        for s in range(syncs):
            t = t0 + 10 + s * width
            b.runtime("hipStreamBeginCapture", t, 2)
            for k in range(12):
                b.cpu("aten::mm", t + 4 + 3 * k, 2)
                b.runtime("hipLaunchKernel", t + 4 + 3 * k, 1)
            b.runtime("hipStreamEndCapture", t + 45, 2)
            b.runtime("hipGraphInstantiate", t + 48, 5)
            b.runtime("hipDeviceSynchronize", t + 55, sync_us)
    return b


def test_capture_only_inference_gets_no_sync_advice(tmp_path):
    rep = analyse(capture_trace(), tmp_path)
    ctx = rep["context"]
    assert ctx["mode"] == "inference" and ctx["cuda_graph_capture"] and not ctx["cuda_graphs"]
    assert R.capture_only(rep)
    # the host waits 4 x 150 µs of each 1000 µs step on a GPU that runs nothing: before
    # issue 34 a HIGH "synchronisation" recommendation with the training loop's wording
    assert rep["sync"]["sync_pct"] == pytest.approx(60.0)
    assert R.sync_cost_pct(rep["sync"]) >= 40.0
    assert "synchronization" not in rules(rep)
    assert R.rule_sync(rep) is None
    # the cards that read the idle GPU are not judged, and say why (utilization: no kernel ran
    # in the steps, "for CUDA graphs, graph replays ..."; short kernels: captured, not replayed)
    assert rep["verdicts"]["gpu_utilization"]["severity"] in ("none", "na")
    assert rep["verdicts"]["short_kernels"]["severity"] == "none"
    assert rep["verdicts"]["short_kernels"]["verdict"].endswith(
        "not judged: CUDA graphs captured, not replayed, in this trace")
    # nothing coloured high, nothing worded for a training loop
    for rec in rep["recommendations"]:
        assert rec["severity"] != "high", rec
        for words in TRAINING_WORDS:
            assert words not in rec["title"] + " " + rec["action"], (rec["rule"], words)


def test_the_same_syncs_with_replays_are_judged(tmp_path):
    """Once the graphs replay (kernels with the hipGraphLaunch's correlation), the trace is no
    longer capture-only and the same waits on an idle GPU fire the rule, in inference words."""
    b = capture_trace()
    for n in range(3):
        t0 = 1000 + n * 1000
        corr = b.runtime("hipGraphLaunch", t0 + 980, 5)
        for i in range(4):
            b.kernel("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32", t0 + 982 + i, 1, correlation=corr)
    rep = analyse(b, tmp_path)
    assert rep["context"]["cuda_graphs"] and not R.capture_only(rep)
    rec = rules(rep)["synchronization"]
    assert "inference loop" in rec["action"]
