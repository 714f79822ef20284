"""Memory at the peak (METRICS.md §7, issue 36) against the demo run whose model, optimizer and
batch are known to the byte: ``memory_peak_adamw`` (tb_bottleneck_demo/ground_truth.py), made
now on the CPU. Its ``demo_truth`` was measured in the generating process from the tensors
themselves (parameters, AdamW's exp_avg/exp_avg_sq and step counters, gradients, the
activations autograd saved through ``saved_tensors_hooks``) and, for the peak of the second
recorded step (backward of ``blocks[1].linear``), the live set by hand from those sizes."""
from __future__ import annotations

import gzip
import json

import pytest

torch = pytest.importorskip("torch")

from tb_bottleneck_demo import ground_truth as gt  # noqa: E402
from tb_bottleneck_plugin import report  # noqa: E402
from tb_bottleneck_plugin.trace.loader import load_trace  # noqa: E402


_MAKE = """
import sys, torch
from tb_bottleneck_demo import ground_truth as gt
torch.set_num_threads(1)
print(gt.run_memory_peak(torch, sys.argv[1]))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # made in a fresh interpreter: the profiler's CPU memory counter is process-wide, so tensors
    # other tests left alive would be a (real) resident level here
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _MAKE, str(tmp_path_factory.mktemp("memory_peak"))],
                         capture_output=True, text=True, timeout=600, check=True)
    run_dir = out.stdout.strip().splitlines()[-1]
    (path,) = gt._files(run_dir)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        truth = json.load(f)["demo_truth"]
    return truth, report.analyze_trace(load_trace(path))["report"]


def test_truth_is_consistent(run):
    truth, _ = run
    # AdamW keeps two moments per parameter; the saved activations are the hand count
    assert truth["adamw_state_bytes"] == 2 * truth["parameter_bytes"]
    assert truth["gradient_bytes"] == truth["parameter_bytes"]
    assert truth["saved_activation_bytes"] == truth["activation_bytes_by_hand"]


def test_categories_at_the_peak_match_the_truth(run):
    truth, rep = run
    sec = rep["memory_peak"]["cpu"]
    cats, want = sec["categories"], truth["at_peak"]
    for name in ("activations", "gradients", "optimizer_state", "other_temporaries"):
        assert cats[name] == pytest.approx(want[name], rel=0.02), name
    assert cats["optimizer_temporaries"] == 0
    # the CPU profiler counts from 0 at profiling start: resident is unknown, not 0
    assert cats["resident_before_window"] is None
    assert "not seen" in rep["not_available"]["memory_peak.cpu.resident_before_window"]
    assert sec["live_bytes"] == sec["peak_allocated_bytes"] == rep["memory"]["cpu"]["peak_allocated_bytes"]
    assert sec["peak_step"] == max(rep["steps"]["numbers"])


def test_holders_name_the_module_and_line(run):
    truth, rep = run
    sec = rep["memory_peak"]["cpu"]
    act = [h for h in sec["holders"] if h["category"] == "activations" and h["module"] == "Block_0"]
    assert act and act[0]["bytes"] == truth["block_activation_bytes"]
    assert act[0]["line"].startswith("tb_bottleneck_demo/ground_truth.py(") and act[0]["line"].endswith("forward")
    assert sec["checkpoint_candidates"][0]["module"] == "Block_0"
    assert sec["checkpoint_candidates"][0]["activation_bytes"] == truth["block_activation_bytes"]
    # the first recorded step's peak is in the optimizer's first step(): AdamW's state is made there
    first = sec["per_step"][0]["categories"]
    assert first["optimizer_state"] == truth["at_peak"]["optimizer_state"]
    assert first["gradients"] == truth["gradient_bytes"]


def test_gradients_at_the_peak_name_their_layers(run):
    """Backward allocations take the module of the forward op whose autograd node made them
    (its Sequence number): at the peak the gradients are those of blocks[1].linear (the
    profiler's Linear_1: H x H + H floats) and the head (Linear_2: 8 x H + 8)."""
    truth, rep = run
    grads = {}
    for h in rep["memory_peak"]["cpu"]["holders"]:
        if h["category"] == "gradients":
            grads[h["module"]] = grads.get(h["module"], 0) + h["bytes"]
    hidden, out = gt.MEM_HIDDEN, gt.MEM_OUT
    assert grads == {"Linear_1": 4 * (hidden * hidden + hidden), "Linear_2": 4 * (out * hidden + out)}
    assert sum(grads.values()) == truth["at_peak"]["gradients"]
