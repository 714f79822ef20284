"""GPU idle after synchronisation (METRICS §8 `sync_refill_idle_us`) on the demo's with_stack
run recorded on an H200, against a plain loop over the raw trace events written here."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import DEMO_LOGS

SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"}


def _independent(events):
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    total_steps = sum(e["dur"] for e in steps)
    refill = 0.0
    for e in events:
        if e.get("cat") != "cuda_runtime" or e.get("name") not in SYNC_CALLS:
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        if not any(s < end and t > start for s, t in [(e2["ts"], e2["ts"] + e2["dur"]) for e2 in steps]):
            continue
        if any(s <= end < t for s, t in gpu):
            continue  # the GPU still runs: no gap
        busy_in_wait = sum(max(0.0, min(t, end) - max(s, start)) for s, t in gpu)
        nxt = min([s for s, _ in gpu if s >= end], default=hi)
        gap_end = min(nxt, end + busy_in_wait, hi)
        # only the time inside a step counts (the profiler's own gap between steps does not)
        refill += sum(max(0.0, min(gap_end, s["ts"] + s["dur"]) - max(end, s["ts"])) for s in steps)
    return refill, total_steps


def test_refill_idle_after_item_equals_a_plain_count():
    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.trace.loader import load_trace

    (path,) = (DEMO_LOGS / "h200_stack_item_slow_module").glob("*.pt.trace.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    refill, _ = _independent(raw["traceEvents"])
    rep = report.analyze_trace(load_trace(str(path)))["report"]
    sync = rep["sync"]
    assert refill > 0
    assert sync["sync_refill_idle_us"] == pytest.approx(refill, rel=1e-6)
    assert sync["sync_cost_pct"] == pytest.approx(sync["sync_gpu_idle_pct"] + sync["sync_refill_idle_pct"])
    # the GPU is busy through the wait, yet the sync costs: the rule fires and names the line
    assert sync["gpu_busy_during_sync_pct"] > 90
    rec = next(r for r in rep["recommendations"] if r["rule"] == "synchronization")
    # priced by the step model's sync what-if (§19): the simulated step without the syncs
    row = next(r for r in rep["step_model"]["what_if"] if r["id"] == "sync")
    assert rec["what_if"] == "sync" and rec["estimated_gain_pct"] == pytest.approx(row["saving_pct"], abs=0.01)
    assert rec["estimated_gain_pct"] > 0
    assert rec["evidence"][0].startswith(raw["demo_truth"]["sync"]["frame"])
    # it saves less than the Tensor Core fix, and comes after it
    rules = [r["rule"] for r in rep["recommendations"]]
    assert rules.index("tensor_cores_unused") < rules.index("synchronization")
