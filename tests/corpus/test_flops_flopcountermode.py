"""FLOPs per step of the demo runs against PyTorch's own FlopCounterMode (METRICS.md §15).

The demo generator's models are rebuilt here from the settings each trace carries
(`demo_settings`) and one training step runs under `torch.utils.flop_counter.FlopCounterMode`
on the meta device (shapes only, no arithmetic: the count does not depend on the device or
the dtype). The report counts the same step from the recorded shapes of the trace made on an
H100 or H200. Tolerance: exact — both count 2·M·N·K per matmul (and its two backward matmuls) and
nothing else in these models (LayerNorm, GELU, tanh, the loss and the optimizer are not
FLOP ops in either count)."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import DEMO_LOGS

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from tb_bottleneck_demo import generator, ground_truth as gt  # noqa: E402
from tb_bottleneck_plugin import report  # noqa: E402
from tb_bottleneck_plugin.trace.loader import load_trace  # noqa: E402


def _runs(name):
    paths = sorted((DEMO_LOGS / name).glob("*.pt.trace.json.gz"))
    if not paths:
        pytest.skip(f"demo_logs/{name} is missing")
    with gzip.open(paths[0], "rt", encoding="utf-8") as f:
        raw = json.load(f)
    return raw, [report.analyze_trace(load_trace(str(p)))["report"] for p in paths]


def _counted(step) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


@pytest.mark.parametrize("run", ["h100_fp32_matmul", "h100_bf16_autocast"])
def test_precision_pair_flops_per_step_equal_flopcountermode(run):
    raw, reports = _runs(run)
    s = raw["demo_settings"]
    model = generator._make_mlp_stack(torch, s["dim"], s["depth"]).to("meta")
    x = torch.randn(s["batch"], s["seq"], s["dim"], device="meta")
    target = torch.randn(s["batch"], s["seq"], s["dim"], device="meta")

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s["autocast"] == "bfloat16"):
            out = model(x)
        torch.nn.functional.mse_loss(out.float(), target).backward()

    want = _counted(step)
    assert want == 2 * 3 * s["depth"] * 2 * (s["batch"] * s["seq"]) * s["dim"] * 4 * s["dim"]  # by hand
    for rep in reports:
        assert rep["flops"]["flops_per_step"] == want
        assert rep["flops"]["main_precision"] == ("bf16" if s["autocast"] else "fp32")


def test_with_stack_run_flops_per_step_equal_flopcountermode():
    raw, reports = _runs("h200_stack_item_slow_module")
    s = raw["demo_settings"]
    model = gt._make_stack_model(torch, s["slow_reps"]).to("meta")
    x = torch.randn(s["batch"], gt.STACK_IN, device="meta")
    y = torch.randint(0, gt.STACK_CLASSES, (s["batch"],), device="meta")

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()

    want = _counted(step)
    # the slow module alone: its matmuls forward (the truth in the trace) and twice that backward
    slow = raw["demo_truth"]["slow_module"]["matmul_flops_per_call"]
    assert want > 3 * slow
    for rep in reports:
        assert rep["flops"]["flops_per_step"] == want
