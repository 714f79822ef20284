"""Issue 34 item 10, "bad input never costs the trace": absurd durations.

A kernel `dur` of 1e308 µs (finite, so the loader keeps it) overflowed numpy products in
analysis/occupancy.py, analysis/gpu.py and analysis/memory.py's byte·µs sums: RuntimeWarnings
on stderr with exit 0, and infinite values. Now no warning is raised (`-W
error::RuntimeWarning` semantics: warnings.simplefilter("error")), the occupancy means are the
exact weighted means, and what cannot be computed is n/a with its reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import occupancy

from trace_builder import TraceBuilder


def occupancy_args(pct: float) -> dict:
    return {"grid": [80, 1, 1], "block": [256, 1, 1], "registers per thread": 64, "shared memory": 0,
            "blocks per SM": 1.0, "warps per SM": 8.0, "est. achieved occupancy %": pct}


def absurd_trace(tmp_path, durs=(1e308,)):
    """Two steps, kernels of ``durs`` µs at 30 % occupancy and two of 50 µs at 60 %, GPU [memory] events."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.step(2, 1000, 1000)
    for i, dur in enumerate(durs):
        b.launch("big", 10 + i, 100 + i, dur, **occupancy_args(30))
    b.launch("small", 200, 300, 50, **occupancy_args(60))
    b.launch("small", 1200, 1300, 50, **occupancy_args(60))
    for ts, alloc, reserved in [(5, 1 << 30, 2 << 30), (700, 3 << 30, 4 << 30), (1500, 1 << 30, 4 << 30)]:
        b.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                         "ts": ts, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 100,
                                            "Total Allocated": alloc, "Total Reserved": reserved, "Addr": 1}})
    return b


def analysed_strictly(trace) -> dict:
    """analyze_trace with every warning an error (what -W error::RuntimeWarning does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = report.analyze_trace(trace)
    json.dumps(result, allow_nan=False)
    return result["report"]


def test_one_kernel_of_1e308_us_raises_no_warning_and_no_wrong_number(tmp_path):
    rep = analysed_strictly(absurd_trace(tmp_path).load(tmp_path))
    assert rep["errors"] == []
    # (30 x 1e308 + 60 x 100) / (1e308 + 100) is 30: exact, not inf, not None
    assert rep["occupancy"]["est_achieved_occupancy_pct"] == 30.0
    assert rep["occupancy"]["per_device"] == {"0": 30.0}
    assert rep["gpu"]["0"]["est_achieved_occupancy_pct"] == 30.0
    rows = {k["name"]: k for k in rep["occupancy"]["kernels"]}
    assert rows["big"]["est_achieved_occupancy_pct"] == 30.0 and rows["small"]["est_achieved_occupancy_pct"] == 60.0
    assert rows["big"]["time_pct"] == 100.0  # 1e308 of 1e308 + 100 µs (100 x 1e308 overflowed)
    # the byte·µs integral over a trace that ends 1e308 µs later: n/a with the reason
    mem = rep["memory"]["cuda:0"]
    assert mem["slack_fragmentation_time_weighted_pct"] is None and mem["reserved_byte_us"] is None
    assert "beyond the float range" in rep["not_available"]["memory.cuda:0.slack_fragmentation_time_weighted_pct"]
    assert mem["slack_fragmentation_pct"] == 25.0  # the peaks are still known


def test_several_kernels_of_1e308_us(tmp_path):
    """Their sum overflows: still no warning; the sum is unknown with a reason, the mean exact."""
    rep = analysed_strictly(absurd_trace(tmp_path, durs=(1e308, 1.5e308, 1e308)).load(tmp_path))
    occ = rep["occupancy"]
    assert occ["est_achieved_occupancy_pct"] == pytest.approx(30.0)
    assert rep["gpu"]["0"]["est_achieved_occupancy_pct"] == pytest.approx(30.0)
    assert occ["weighted_kernel_us"] is None
    assert "beyond the float range" in rep["not_available"]["occupancy.weighted_kernel_us"]


def test_weighted_mean_and_share():
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert occupancy.weighted_mean(np.array([30.0, 60.0]), np.array([1e308, 100.0])) == 30.0
        assert occupancy.weighted_mean(np.array([30.0, 60.0]), np.array([1.7e308, 1.7e308])) == 45.0
        assert occupancy.weighted_mean(np.array([30.0, 60.0]), np.array([1.0, 3.0])) == 52.5
        assert occupancy.weighted_mean(np.array([30.0]), np.array([0.0])) is None
        assert occupancy.share_pct(1e308, 1e308) == 100.0 and occupancy.share_pct(1.0, 4.0) == 25.0


def test_cli_with_runtime_warnings_as_errors(tmp_path):
    """The probe's check: `python -W error::RuntimeWarning -m tb_bottleneck_plugin.cli report`
    on the trace: exit 0, no section lost, nothing about overflow on stderr."""
    path = absurd_trace(tmp_path).write(tmp_path / "w.1.pt.trace.json")
    env = dict(os.environ, PYTHONWARNINGS="error::RuntimeWarning")
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "tb_bottleneck_plugin.cli",
                           "report", str(path), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "overflow" not in done.stderr and "RuntimeWarning" not in done.stderr
    rep = json.loads(done.stdout)
    rep = rep.get("report", rep)
    assert rep["errors"] == [] and rep["occupancy"]["est_achieved_occupancy_pct"] == 30.0
