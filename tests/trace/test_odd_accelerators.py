"""Other accelerators and odd kernel formats (issue 20 item 7; METRICS.md "Other
accelerators" and §6): hand-built traces modelled on ../shared/docs/trace-format.md (§3 the
MTIA_* categories, §6 `warps per SM`, the nested `occupancy` object, the 48 KiB artefact).
Every expected number is written below by hand; the report says n/a with a reason instead of
a wrong number, and the contradiction checker finds nothing."""
from __future__ import annotations

import pytest

from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin.views.text_report import format_report

from conftest import TRACES, needs_traces
from test_contradictions import contradictions
from trace_builder import H100, V100, TraceBuilder, occupancy_args

T0 = 1_000_000


def _report(b: TraceBuilder, tmp_path) -> dict:
    return report_mod.analyze_trace(b.load(tmp_path))["report"]


def mtia_trace() -> TraceBuilder:
    """Three steps of host ops, each with 60 MTIA command-processor events and 20 MTIA runtime
    calls (Kineto categories mtia_ccp_events / mtia_runtime), no CUDA activity, no
    deviceProperties."""
    b = TraceBuilder(props=())
    for s in range(3):
        start = T0 + s * 1000
        b.step(s + 1, start, 1000)
        for k in range(20):
            b.cpu("aten::mm", start + 10 + k * 45, 30)
            b.events.append({"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunchKernel", "pid": 1, "tid": 1,
                             "ts": start + 12 + k * 45, "dur": 5, "args": {"correlation": s * 100 + k}})
            for j in range(3):
                b.events.append({"ph": "X", "cat": "mtia_ccp_events", "name": f"ccp_job_{j}", "pid": 100, "tid": 7,
                                 "ts": start + 20 + k * 45 + j * 10, "dur": 8, "args": {"correlation": s * 100 + k}})
    return b


def test_mtia_trace_is_named_not_cpu_only(tmp_path):
    rep = _report(mtia_trace(), tmp_path)
    acc = rep["trace"]["accelerators"]
    assert acc == {"MTIA": {"events": 3 * 20 * 4, "categories": {"mtia_ccp_events": 180, "mtia_runtime": 60}}}
    gpu_na = rep["not_available"]["gpu"]
    assert "MTIA" in gpu_na and "180" in gpu_na and "CPU-only" not in gpu_na, gpu_na
    assert "MTIA" in rep["not_available"]["occupancy.est_achieved_occupancy_pct"]
    assert "MTIA" in rep["not_available"]["copies"]
    # every GPU reason names the accelerator, none says CPU-only
    gpu_reasons = {k: v for k, v in rep["not_available"].items()
                   if k.split(".")[0] in ("gpu", "occupancy", "tensor_cores", "flops", "copies")}
    assert not [k for k, v in gpu_reasons.items() if "CPU-only" in v], gpu_reasons
    assert "MTIA" in rep["not_available"]["tensor_cores.tensor_core_pct"]
    text = format_report(rep)
    assert "CPU-only trace" not in text and "MTIA (240 events: mtia_ccp_events 180, mtia_runtime 60)" in text, text
    assert not rep["gpu"] and rep["errors"] == []
    assert contradictions(rep) == []


def _warps_trace() -> TraceBuilder:
    """2021 format: kernels carry `warps per SM` (= blocks per SM × threads per block / 32) and
    no `blocks per SM` nor occupancy. One 1000 µs step: kernel A [100, 300) with 256-thread
    blocks at 4 warps per SM (0.5 blocks per SM), kernel B [400, 500) at 16 warps per SM (2
    blocks per SM, counted as 1)."""
    b = TraceBuilder(props=(V100,))
    b.step(1, T0, 1000)
    b.cpu("aten::mm", T0 + 10, 50)
    ca = b.runtime("cudaLaunchKernel", T0 + 12, 5)
    cb = b.runtime("cudaLaunchKernel", T0 + 20, 5)
    for name, ts, dur, warps, corr in (("gemm_a", 100, 200, 4, ca), ("gemm_b", 400, 100, 16, cb)):
        b.kernel(name, T0 + ts, dur, correlation=corr, grid=[40, 1, 1], block=[256, 1, 1],
                 **{"registers per thread": 32, "shared memory": 0, "warps per SM": warps})
    return b


def test_warps_per_sm_gives_sm_efficiency(tmp_path):
    rep = _report(_warps_trace(), tmp_path)
    g = rep["gpu"]["0"]
    # by hand: 200 µs × 0.5 + 100 µs × min(1, 2) = 200 µs of 1000 µs
    assert g["est_sm_efficiency_pct"] == pytest.approx(20.0)
    assert "gpu.0.est_sm_efficiency_pct" not in rep["not_available"]
    rows = {k["name"]: k for k in rep["occupancy"]["kernels"]}
    assert rows["gemm_a"]["blocks_per_sm"] == pytest.approx(0.5) and rows["gemm_b"]["blocks_per_sm"] == pytest.approx(2.0)
    assert rep["occupancy"]["grid_too_small_pct"] == pytest.approx(100.0 * 200 / 300)  # A's 200 µs of 300


def _occ_kernel(b, name, ts, dur, corr, **args):
    b.kernel(name, T0 + ts, dur, correlation=corr, **args)


def _artefact_trace(props) -> TraceBuilder:
    """One 1000 µs step, four kernels of 100 µs: a normal one at 50 %, one at 150 % (no share),
    one with no grid/block at 0 % (nothing computed), one using 64 KiB of shared memory at
    Kineto's 0 % (the 48 KiB artefact)."""
    b = TraceBuilder(props=props)
    b.step(1, T0, 1000)
    b.cpu("aten::mm", T0 + 5, 30)
    c = [b.runtime("cudaLaunchKernel", T0 + 6 + i, 1) for i in range(4)]
    _occ_kernel(b, "ok_kernel", 100, 100, c[0], **occupancy_args(50, 2.0))
    _occ_kernel(b, "over_kernel", 300, 100, c[1], **occupancy_args(150, 2.0))
    _occ_kernel(b, "nolaunch_kernel", 500, 100, c[2], **{"est. achieved occupancy %": 0, "blocks per SM": 1.0})
    _occ_kernel(b, "smem_kernel", 700, 100, c[3], **occupancy_args(0, 2.0, regs=32, smem=64 * 1024))
    return b


def test_occupancy_artefacts_without_device_properties(tmp_path):
    """No deviceProperties: the calculator cannot run. 150 % and the launch-less 0 % are n/a
    (said in not_available); the 64 KiB kernel's 0 % is kept (no way to check it) and said so.
    Mean by hand: (50 × 100 + 0 × 100) / 200 = 25 %."""
    rep = _report(_artefact_trace(()), tmp_path)
    occ = rep["occupancy"]
    assert occ["est_achieved_occupancy_pct"] == pytest.approx(25.0)
    rows = {k["name"]: k for k in occ["kernels"]}
    assert rows["over_kernel"]["est_achieved_occupancy_pct"] is None
    assert rows["nolaunch_kernel"]["est_achieved_occupancy_pct"] is None
    assert rows["smem_kernel"]["est_achieved_occupancy_pct"] == 0
    na = rep["not_available"]
    assert "1 kernel launch(es) carry an est. achieved occupancy above 100 % (e.g. 150 %)" in na["occupancy.kineto_over_100"]
    assert "without launch parameters" in na["occupancy.kineto_zero_without_launch"]
    assert "no deviceProperties" in na["occupancy.kineto_zero_large_shared_memory"]
    assert all(v <= 100 for v in (occ["est_achieved_occupancy_pct"], rep["gpu"]["0"]["est_achieved_occupancy_pct"]))


def test_occupancy_artefacts_with_device_properties(tmp_path):
    """With a V100's deviceProperties the calculator recomputes the 64 KiB kernel (opt-in
    limit 96 KiB: 1 block of 256 threads per SM = 8 warps of 64 = 12.5 %, grid 80 blocks on
    80 SMs) and the 150 %; the launch-less 0 % stays n/a."""
    rep = _report(_artefact_trace((V100,)), tmp_path)
    rows = {k["name"]: k for k in rep["occupancy"]["kernels"]}
    assert rows["smem_kernel"]["occupancy_source"] == "calculator"
    assert rows["smem_kernel"]["est_achieved_occupancy_pct"] == pytest.approx(12.5)
    assert rows["nolaunch_kernel"]["est_achieved_occupancy_pct"] is None
    assert "occupancy.kineto_zero_large_shared_memory" not in rep["not_available"]
    assert 0 < rows["over_kernel"]["est_achieved_occupancy_pct"] <= 100


def test_nested_occupancy_factor_is_the_calculators_when_kineto_said_zero(tmp_path):
    """Kineto's newest nested `occupancy` object on a kernel with 50 KiB of shared memory names
    "SMEM" (its calculator used the 48 KiB default: 0 active blocks). On an H100 (228 KiB per
    SM) ours places 4 blocks by shared memory, 4 by registers (16 × 1024 threads) and 2 by
    threads (2048 / 1024): threads limit it, and that factor stands. A kernel whose Kineto
    value is real keeps the trace's factor."""
    b = TraceBuilder(props=(H100,))
    b.step(1, T0, 1000)
    b.cpu("aten::mm", T0 + 5, 30)
    c1, c2 = b.runtime("cudaLaunchKernel", T0 + 6, 1), b.runtime("cudaLaunchKernel", T0 + 8, 1)
    nested = {"activeBlocksPerMultiprocessor": 0, "limitingFactors": "SMEM"}
    _occ_kernel(b, "smem_kernel", 100, 100, c1, occupancy=nested,
                **occupancy_args(0, 2.0, grid=(264, 1, 1), block=(1024, 1, 1), regs=16, smem=50 * 1024))
    _occ_kernel(b, "reg_kernel", 300, 100, c2, occupancy={"activeBlocksPerMultiprocessor": 4,
                                                          "limitingFactors": "REGS"}, **occupancy_args(50, 2.0))
    rep = _report(b, tmp_path)
    rows = {k["name"]: k for k in rep["occupancy"]["kernels"]}
    smem = rows["smem_kernel"]
    assert smem["occupancy_source"] == "calculator" and smem["theoretical_blocks_per_sm"] == 2
    assert smem["limiting_factor_source"] == "calculator" and "shared_memory" not in smem["limiting_factor"], smem
    assert rows["reg_kernel"]["limiting_factor_source"] == "trace" and rows["reg_kernel"]["limiting_factor"] == "registers"


@needs_traces
def test_warps_per_sm_derivation_matches_kinetos_blocks_per_sm():
    """On a 2021 trace that carries both fields (8,772 kernels), blocks per SM derived from
    `warps per SM` alone equals the `blocks per SM` Kineto wrote, for every kernel."""
    import numpy as np

    from tb_bottleneck_plugin.analysis.occupancy import blocks_per_sm
    from tb_bottleneck_plugin.trace.loader import load_trace

    trace = load_trace(str(TRACES / "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"))
    g = trace.gpu
    known = np.isfinite(g.blocks_per_sm) & np.isfinite(g.warps_per_sm) & (g.block_x > 0)
    assert known.sum() > 8000
    original = g.blocks_per_sm.copy()
    g.blocks_per_sm = np.full(len(g), np.nan)
    derived = blocks_per_sm(g)
    g.blocks_per_sm = original
    np.testing.assert_allclose(derived[known], original[known], rtol=1e-6)


@needs_traces
def test_shared_2020_trace_gets_sm_efficiency_from_warps():
    """The 2020 bare-array trace has `warps per SM` and no `blocks per SM`: SM efficiency is a
    number now (was n/a), at most its GPU utilization."""
    from tb_bottleneck_plugin.trace.loader import load_trace

    rep = report_mod.analyze_trace(load_trace(str(
        TRACES / "kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz")))["report"]
    g = rep["gpu"]["0"]
    assert g["est_sm_efficiency_pct"] is not None and 0 < g["est_sm_efficiency_pct"] <= g["utilization_pct"]
    assert contradictions(rep) == []
