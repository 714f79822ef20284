"""Issue 34 item 11: compare and gate runs on one scale. `diff` of the demo's H100 fp32 and bf16
runs printed "MFU 69.47 % -> 29.33 % ... worse" for a 6x faster step, and `check --min
mfu_pct=30` passed the slow fp32 run: each side's MFU was against its own precision's peak.
Now compare's and the gate's `mfu_pct` is against the GPU's dense bf16/fp16 Tensor Core peak
for both runs (METRICS.md §11, §15), the per-precision MFU a detail row (`mfu_own_peak_pct`,
no better direction).

The expected values are computed here from the raw trace JSON (gunzip + json): the FLOPs per
step from the model the generator built (`demo_settings`: depth blocks of Linear dim→4·dim and
4·dim→dim over batch·seq tokens; forward + backward = 3 × the forward's 2·M·N·K per Linear),
the step time from the ProfilerStep#N events, the peak from NVIDIA's H100 SXM datasheet
(1,979 bf16 TFLOP/s with sparsity, 989.4 dense)."""
import gzip
import json

import pytest

from conftest import DEMO_LOGS
from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.analysis import collectives, peaks
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.views import compare

FP32 = DEMO_LOGS / "h100_fp32_matmul"
BF16 = DEMO_LOGS / "h100_bf16_autocast"
H100_SXM_BF16_DENSE_TFLOPS = 989.4  # NVIDIA H100 SXM datasheet: 1,979 with sparsity, halved

pytestmark = pytest.mark.skipif(not FP32.is_dir() or not BF16.is_dir(), reason="demo_logs H100 runs missing")


@pytest.fixture(autouse=True)
def _no_peak(monkeypatch):
    for name in (peaks.ENV_PEAK, collectives.ENV_LINK):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def raw_tflops(run) -> float:
    """FLOPs per step over the mean step time of a demo run, from its raw JSON (TFLOP/s)."""
    flops = step_us = 0.0
    for f in sorted(run.glob("*.pt.trace.json.gz")):
        doc = json.load(gzip.open(f))
        s = doc["demo_settings"]
        tokens, d = s["batch"] * s["seq"], s["dim"]
        per_step = s["depth"] * 3 * 2 * (2 * tokens * d * 4 * d)  # 2 Linears a block, fwd + 2x bwd
        steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        flops += per_step * len(steps)
        step_us += sum(float(e["dur"]) for e in steps)
    return flops / step_us / 1e6


def test_mfu_against_one_peak_equals_the_raw_count():
    want = {run: 100 * raw_tflops(run) / H100_SXM_BF16_DENSE_TFLOPS for run in (FP32, BF16)}
    assert 4.5 < want[FP32] < 5.0 and 29 < want[BF16] < 30  # the fp32 run is 6x slower
    for run in (FP32, BF16):
        flops = engine.run_result(str(run))["report"]["flops"]
        assert flops["bf16_peak_tflops"] == pytest.approx(H100_SXM_BF16_DENSE_TFLOPS, abs=0.1)
        assert flops["mfu_bf16_peak_pct"] == pytest.approx(want[run], rel=0.01)
        assert flops["tflops"] == pytest.approx(raw_tflops(run), rel=0.01)
    # the per-precision MFU stays as it was: the fp32 run at 69 % of the fp32 peak (67 TFLOP/s)
    fp32 = engine.run_result(str(FP32))["report"]["flops"]
    assert fp32["mfu_pct"] == pytest.approx(100 * raw_tflops(FP32) / 67.0, rel=0.01)


def test_diff_says_better_on_one_peak(capsys):
    cmp = compare.compare(engine.run_result(str(FP32)), engine.run_result(str(BF16)))
    rows = {m["key"]: m for m in cmp["metrics"]}
    one, own = rows["mfu_pct"], rows["mfu_own_peak_pct"]
    assert one["verdict"] == "better" and one["better"] == "higher"
    assert one["base"] == pytest.approx(100 * raw_tflops(FP32) / H100_SXM_BF16_DENSE_TFLOPS, rel=0.01)
    assert one["cand"] == pytest.approx(100 * raw_tflops(BF16) / H100_SXM_BF16_DENSE_TFLOPS, rel=0.01)
    assert one["label"] == "MFU of the dense bf16/fp16 peak (H100 SXM, 989 TFLOP/s)"  # the label names the peak
    # the detail: each side against its own precision's peak, no better direction
    assert own["better"] is None and own["verdict"] == "changed" and own["base"] > 60 > own["cand"]
    assert rows["tflops"]["verdict"] == "better"
    assert cli.main(["diff", str(FP32), str(BF16)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "MFU of the dense bf16/fp16 peak" in x)
    assert line.rstrip().endswith("better") and "4.70%" in line and "29.33%" in line, line


def test_check_fails_the_fp32_run_on_mfu(capsys):
    assert cli.main(["check", str(FP32), "--min", "mfu_pct=30"]) == 1  # before: passed at 69.47
    out = capsys.readouterr().out
    assert out.startswith("FAIL mfu_pct = 4.7") and "< min 30" in out, out
    assert cli.main(["check", str(BF16), "--min", "mfu_pct=20"]) == 0
    capsys.readouterr()
    # the per-precision figure can still be gated by its own name
    assert cli.main(["check", str(FP32), "--min", "mfu_own_peak_pct=60"]) == 0
