"""Triton kernel names from real Inductor output of the demo generator (issue 23): the H100
compiled pair (demo_logs/h100_compile_static_fixed, h100_compile_graph_break; GatedMLP of
tb_bottleneck_demo/ground_truth.py compiled with Inductor on CUDA). The fused ops read from
each kernel name are ATen ops (checked against torch.ops.aten), and they follow the model:
the fixed run computes its gate in the graph (`torch.where(h.mean() > 0, h * 2, h)`: gt,
mean, where, mul fused with the Linear's addmm and the relu); the broken run leaves the
comparison to Python (`h.mean().item() > 0`): no kernel fuses a `gt`, and the resumed frame's
`h * 2.0` runs as its own `mul` kernel."""
from __future__ import annotations

import pytest

from conftest import DEMO_LOGS

torch = pytest.importorskip("torch")

from tb_bottleneck_plugin import report  # noqa: E402
from tb_bottleneck_plugin.trace.loader import load_trace  # noqa: E402


def _kernels(run):
    paths = sorted((DEMO_LOGS / run).glob("*.pt.trace.json.gz"))
    if not paths:
        pytest.skip(f"demo_logs/{run} is missing")
    return report.analyze_trace(load_trace(str(paths[0])))["report"]["compilation"]["kernels"]


@pytest.mark.parametrize("run", ["h100_compile_static_fixed", "h100_compile_graph_break"])
def test_fused_ops_are_aten_ops(run):
    kernels = _kernels(run)
    assert kernels and all(k["name"].startswith("triton_") for k in kernels)
    for k in kernels:
        assert k["ops"], k["name"]
        for op in k["ops"]:
            assert hasattr(torch.ops.aten, op), (k["name"], op)


def test_the_gate_is_fused_only_where_it_is_in_the_graph():
    fixed = {op for k in _kernels("h100_compile_static_fixed") for op in k["ops"]}
    assert {"addmm", "relu", "mean", "gt", "where", "mul"} <= fixed, fixed
    broken = _kernels("h100_compile_graph_break")
    assert not any("gt" in k["ops"] for k in broken)
    assert any(k["ops"] == ["mul"] and k["kind"] == "pointwise" for k in broken)
