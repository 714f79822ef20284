"""Occupancy (metrics.md §6): the calculator against hand-computed cases, Kineto's own
'est. achieved occupancy %' reproduced on real V100 kernels, and the weighted metrics."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from tb_bottleneck_plugin.analysis import occupancy as occ
from tb_bottleneck_plugin.analysis import occupancy_calculator as calc
from tb_bottleneck_plugin.trace.loader import load_trace

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
V100 = {"id": 0, "computeMajor": 7, "computeMinor": 0, "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 98304, "numSms": 80,
        "sharedMemPerBlockOptin": 98304}
A100 = {"id": 0, "computeMajor": 8, "computeMinor": 0, "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 167936, "numSms": 108,
        "sharedMemPerBlockOptin": 166912}


def calc1(props, threads, regs, smem):
    r = calc.occupancy_calculator(props, [threads], [regs], [smem])
    return {k: v[0] for k, v in r.items()}


def test_v100_register_limited():
    # 256 threads = 8 warps; 64 regs * 32 = 2048 per warp; 16384 regs per sub-partition
    # -> 8 warps each, 32 per SM -> 4 blocks = 32 warps of 64 = 50 %.
    r = calc1(V100, 256, 64, 0)
    assert r["blocks_by_registers"] == 4 and r["blocks_by_warps"] == 8
    assert r["active_blocks"] == 4 and r["limiting_factor"] == "registers"
    assert r["theoretical_occupancy_pct"] == pytest.approx(50.0)


def test_v100_shared_memory_limited():
    # 40 KB per block: 98304 // 40960 = 2 blocks of 4 warps = 8 / 64 warps = 12.5 %
    r = calc1(V100, 128, 32, 40960)
    assert r["blocks_by_shared_memory"] == 2 and r["blocks_by_registers"] == 16
    assert r["limiting_factor"] == "shared_memory"
    assert r["theoretical_occupancy_pct"] == pytest.approx(12.5)


def test_a100_reserves_1kb_per_block():
    # (32768 + 1024) rounded to 128 = 33792; 167936 // 33792 = 4 (5 without the reserve)
    r = calc1(A100, 128, 32, 32768)
    assert r["blocks_by_shared_memory"] == 4


def test_warps_and_block_limits():
    r = calc1(V100, 1024, 16, 0)
    assert r["blocks_by_warps"] == 2 and r["limiting_factor"] == "warps"
    assert r["theoretical_occupancy_pct"] == pytest.approx(100.0)
    r = calc1(V100, 32, 16, 0)  # 1-warp blocks: 32 resident blocks on sm70
    assert r["limiting_factor"] == "blocks" and r["active_blocks"] == 32
    turing = dict(V100, computeMinor=5, maxThreadsPerMultiprocessor=1024)
    assert calc1(turing, 32, 16, 0)["active_blocks"] == 16
    assert calc.max_blocks_per_sm(8, 6) == 16 and calc.max_blocks_per_sm(8, 9) == 24
    assert calc.max_blocks_per_sm(9, 0) == 32


def test_register_edge_cases():
    assert calc1(V100, 256, 0, 0)["limiting_factor"] == "warps"  # 0 regs: no register limit
    assert calc1(V100, 1024, 255, 0)["active_blocks"] == 0  # needs more than regsPerBlock
    # register allocation granularity: 33 regs -> 1056 -> 1280 per warp
    r = calc1(V100, 128, 33, 0)
    assert r["blocks_by_registers"] == (16384 // 1280) * 4 // 4


def test_kineto_per_block_smem_limit():
    # > 48 KB: the kernel opted in (it ran), but Kineto's call uses the default limit -> 0
    assert calc1(A100, 128, 100, 98304)["active_blocks"] == 1
    assert calc.kineto_estimate(A100, [128], [100], [98304], [0.73])[0] == 0


@lru_cache(maxsize=None)
def load(rel):
    return load_trace(str(TRACES / rel))


RESNET = "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def test_reproduces_kineto_est_achieved_occupancy_on_v100_resnet50():
    tr = load(RESNET)
    g = tr.gpu
    k = (g.kind == 0) & np.isfinite(g.achieved_occupancy_pct) & np.isfinite(g.blocks_per_sm)
    assert k.sum() > 8000
    props = occ.device_properties(tr)[0]
    threads = g.block_x * g.block_y * g.block_z
    est = calc.kineto_estimate(props, threads[k], g.registers_per_thread[k], g.shared_memory[k],
                              g.blocks_per_sm[k])
    agreement = float(np.mean(est == g.achieved_occupancy_pct[k]))
    # measured: 8772 of 8772 kernels (100 %)
    assert agreement >= 0.999


def _x(name, ts, dur, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": dict({"device": 0, "stream": 7}, **args)}


def occ_args(pct, bps, **kw):
    return dict({"grid": [80, 1, 1], "block": [256, 1, 1], "registers per thread": 64, "shared memory": 0,
                 "blocks per SM": bps, "est. achieved occupancy %": pct}, **kw)


def small_trace(tmp_path, extra=()):
    ev = [
        _x("a", 0, 100, **occ_args(50, 1.0)),
        _x("b", 100, 100, **occ_args(5, 0.5)),
        _x("c", 300, 4, **occ_args(80, 2.0)),  # short
        _x("c", 306, 4, **occ_args(80, 2.0)),  # short, gap 2 us
        _x("d", 1000, 100, **occ_args(-1, "inf")),  # negative: skipped; "inf" not numeric
    ] + list(extra)
    p = tmp_path / "o.pt.trace.json"
    p.write_text(json.dumps({"deviceProperties": [V100], "traceEvents": ev}))
    return load_trace(str(p))


def test_weighted_metrics_and_window(tmp_path):
    tr = small_trace(tmp_path)
    # Kineto's values alone (tbp's view): d's -1 is skipped. (50*100 + 5*100 + 80*8) / 208
    r = occ.kernel_occupancy(tr, kineto_only=True)
    assert r["est_achieved_occupancy_pct"] == pytest.approx((5000 + 500 + 640) / 208)
    assert r["per_device"] == {"0": pytest.approx((5000 + 500 + 640) / 208)}
    hist = {h["bucket"]: h["pct"] for h in r["histogram"]}
    assert hist == pytest.approx({"[0,10)": 100 * 100 / 208, "[10,25)": 0, "[25,50)": 0,
                                  "[50,75)": 100 * 100 / 208, "[75,100]": 100 * 8 / 208})
    # Shown values: Kineto's -1 means it computed none, so d gets the calculator's:
    # 4 resident blocks (registers), blocks per SM = 80 blocks / 80 SMs ("inf" is not a
    # number) -> 100 * min(4, 1) * 256 / 2048 = 12.5 %.
    r = occ.kernel_occupancy(tr)
    assert r["est_achieved_occupancy_pct"] == pytest.approx((5000 + 500 + 640 + 1250) / 308)
    hist = {h["bucket"]: h["pct"] for h in r["histogram"]}
    assert hist == pytest.approx({"[0,10)": 100 * 100 / 308, "[10,25)": 100 * 100 / 308, "[25,50)": 0,
                                  "[50,75)": 100 * 100 / 308, "[75,100]": 100 * 8 / 308})
    rows = {k["name"]: k for k in r["kernels"]}
    assert rows["d"]["occupancy_source"] == "calculator" and rows["a"]["occupancy_source"] == "kineto"
    assert rows["d"]["est_achieved_occupancy_pct"] == pytest.approx(12.5)
    assert r["calculator_kernel_time_pct"] == pytest.approx(100 * 100 / 308)
    assert r["grid_too_small_pct"] == pytest.approx(100 * 100 / 208)
    sk = r["short_kernels"]
    assert sk["count"] == 2 and sk["mean_gap_us"] == pytest.approx(2.0)
    assert sk["time_pct"] == pytest.approx(100 * 8 / 308)
    # window [50, 150]: a weighs 50, b weighs 50, the rest 0
    r = occ.kernel_occupancy(tr, window=(50.0, 150.0))
    assert r["est_achieved_occupancy_pct"] == pytest.approx(27.5)
    assert r["weighted_kernel_us"] == pytest.approx(100.0)


def test_kernel_table_limiting_factor(tmp_path):
    nested = _x("e", 2000, 10, **occ_args(50, 1.0, occupancy={"activeBlocksPerMultiprocessor": 4,
                                                              "limitingFactors": "REGS"}))
    r = occ.kernel_occupancy(small_trace(tmp_path, [nested]))
    rows = {k["name"]: k for k in r["kernels"]}
    a = rows["a"]
    assert a["limiting_factor"] == "registers" and a["limiting_factor_source"] == "calculator"
    assert a["theoretical_blocks_per_sm"] == 4 and a["theoretical_occupancy_pct"] == pytest.approx(50.0)
    assert a["calls"] == 1 and a["grid"] == [80, 1, 1] and a["block"] == [256, 1, 1]
    assert rows["c"]["calls"] == 2 and rows["c"]["mean_us"] == pytest.approx(4.0)
    assert rows["e"]["limiting_factor"] == "registers" and rows["e"]["limiting_factor_source"] == "trace"
    assert sum(k["time_pct"] for k in r["kernels"]) == pytest.approx(100.0)


@pytest.mark.parametrize("rel,reason", [
    ("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "ROCm"),
    ("kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz", "2020"),
    ("generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json", "CPU-only"),
])
def test_not_available(rel, reason):
    na = {}
    r = occ.kernel_occupancy(load(rel), not_available=na)
    assert r["est_achieved_occupancy_pct"] is None and "not_available" not in r
    assert reason in na["occupancy.est_achieved_occupancy_pct"]  # the report's key (analysis/units.py)
