"""The verdict on top of a report (METRICS.md §19 "Verdict", judge/step_verdict.py) on the
shared H100 pairs: the before-run names the applied fix with the step model's predicted step,
the after-run reads healthy."""
from __future__ import annotations

import pytest

from conftest import needs_traces, real_report
from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.judge.step_verdict import fix_code, step_verdict

BEFORE = {"h100/demo-generator/input_bound_nw0/worker0.1795701581873994120.pt.trace.json.gz":
          ("input_bound", "DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True, "
                          "persistent_workers=True, prefetch_factor=2)"),
          "h100/gpt2_bf16_eager/worker0.1795701567436882984.pt.trace.json.gz": ("low_mfu", "model = torch.compile(model)"),
          "h100/demo-generator/fp32_matmul/worker0.1795701587364811734.pt.trace.json.gz":
          ("tensor_cores_unused", 'with torch.autocast("cuda", dtype=torch.bfloat16):')}
AFTER = ["h100/demo-generator/input_fixed_nw4/worker0.1795701585644916022.pt.trace.json.gz",
         "h100/gpt2_bf16_compiled/worker0.1795701665144883313.pt.trace.json.gz",
         "h100/toy_no_break/worker0.1795701632291492944.pt.trace.json.gz"]


@needs_traces
@pytest.mark.parametrize("rel", sorted(BEFORE))
def test_the_before_run_names_the_fix_and_its_predicted_step(rel):
    rep = real_report(rel)
    v = rep["verdict"]
    first = rep["recommendations"][0]
    rule, code = BEFORE[rel]
    assert v["healthy"] is False and v["sentence"] == first["title"]
    assert v["fix"]["rule"] == first["rule"] == rule and v["fix"]["code"] == code
    assert v["share_pct"] == first["estimated_gain_pct"] >= T.VERDICT_MIN_GAIN_PCT
    assert v["fix"]["predicted_step_ms"] == first["predicted_step_ms"] and not v["fix"]["estimate"]
    cp = v["critical_path"]
    assert cp["host_pct"] + cp["gpu_pct"] == pytest.approx(100.0)


@needs_traces
@pytest.mark.parametrize("rel", AFTER)
def test_the_after_run_reads_healthy(rel):
    rep = real_report(rel)
    v = rep["verdict"]
    assert v["healthy"] is True and v["fix"] is None
    assert v["sentence"].startswith(f"No fix worth {T.VERDICT_MIN_GAIN_PCT:g} % of the step or more found")
    assert f"MFU {rep['flops']['mfu_pct']:.0f} %" in v["sentence"]
    # nothing it sells is worth the threshold
    assert all((r.get("estimated_gain_pct") or 0) < T.VERDICT_MIN_GAIN_PCT for r in rep["recommendations"]
               if r.get("gain_source") != "memory")


def test_without_a_step_model_the_fix_is_labelled_an_estimate():
    rep = {"avg_step_us": 10_000.0, "recommendations": [
        {"rule": "input_bound", "title": "The training loop waits for the DataLoader", "gain_source": "rule",
         "estimated_gain_pct": 40.0, "action": "Load batches in worker processes: DataLoader(ds, num_workers=4)."}]}
    v = step_verdict(rep)
    assert v["fix"]["estimate"] is True and v["fix"]["predicted_step_ms"] == pytest.approx(6.0)
    assert v["fix"]["code"] == "DataLoader(ds, num_workers=4)" and v["critical_path"] is None


def test_fix_code_prefers_a_call():
    assert fix_code('See `TORCH_LOGS="recompiles"`, then `torch.compile(model, dynamic=True)`.') == \
        "torch.compile(model, dynamic=True)"
    assert fix_code("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.") == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert fix_code("nothing to run") is None
