"""Per-rank comm/comp overlap (metrics §12) against Holistic Trace Analysis on the four
multi-GPU traces of ../shared/traces.

Oracle: HTA 0.5.0 (HolisticTraceAnalysis==0.5.0 with pandas 2.3.3; with pandas 3 HTA 0.5.0
fails while parsing), run in a separate virtualenv, not a project dependency:

    python3 -m venv /tmp/htavenv
    /tmp/htavenv/bin/pip install -q HolisticTraceAnalysis==0.5.0 "pandas<3"
    /tmp/htavenv/bin/python benchmarks/hta_overlap_oracle.py

``TraceAnalysis(trace_dir=<dir holding only that file>).get_comm_comp_overlap()`` gave
``comp_comm_overlap_pctg`` = HTA_PCTG below (HTA rounds to 2 decimals).

Definitional differences (read from HTA 0.5.0's source):
- HTA's number has NO iterations: per rank it is |compute ∩ comm| / |comm| over every GPU
  kernel launched (runtime call, by correlation) before the START of the last
  ProfilerStep (``include_last_profiler_step=False``: the last step is dropped; kernels
  launched before the first step are kept). Ours is per stretched step (§1: host span
  stretched to the GPU work it launched), every step included, summed.
- Classification: HTA's communication = GPU events named ``^nccl.*Kernel``, memory =
  ``^Memcpy|^Memset|^dma``, compute = every other GPU event. Ours (§2) agrees on these
  traces (NCCL/RCCL kernels; memcpy/memset neither).
- HTA rounds float (ns-resolution) timestamps: ts up (ceil), end down (floor) — each
  kernel loses up to 2 µs, so dense short kernels leave gaps in merged compute and HTA's
  overlap drops (nccl_data: 14.76 % exact → 14.31 %; resnet MI300: 24.97 % → 22.45 %).
  We keep the fractional µs. Integer-µs traces (control, df_index_resolver) are unaffected.

So the test pins (1) our classification + interval arithmetic in HTA's window with HTA's
rounding to HTA's number (within 0.01 pct point where the kernel sets are identical), and
(2) the numbers our partial actually shows against HTA's with the measured gap explained.
"""
from __future__ import annotations


import numpy as np
import pytest

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import intervals as iv
from tb_bottleneck_plugin.analysis import steps as steps_mod
from tb_bottleneck_plugin.analysis.breakdown import comm_kernel_mask
from tb_bottleneck_plugin.analysis.linking import gpu_runtime_index
from tb_bottleneck_plugin.trace.model import GPU_KERNEL

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)

# HTA 0.5.0 get_comm_comp_overlap()["comp_comm_overlap_pctg"], from benchmarks/hta_overlap_oracle.py.
HTA_PCTG = {
    "hta/nccl_parser_config/nccl_data.json.gz": (0, 14.31),
    "hta/df_index_resolver/df_index_resolver.json.gz": (1, 0.0),
    "hta/trace_diff/control/control.json.gz": (3, 47.03),
    "tracelens/mi300/resnet_act_checkpoint.json.gz": (0, 22.45),
}

_cache: dict = {}


def _load(rel):
    path = TRACES / rel
    if not path.exists():
        pytest.skip(f"shared trace {rel} not present")
    if rel not in _cache:
        _cache[rel] = loader.load_trace(str(path))
    return _cache[rel]


def _hta_window_pct(trace, hta_rounding: bool) -> float:
    """HTA's quantity from OUR classification and interval helpers: kernels launched
    before the last ProfilerStep starts, |compute ∩ comm| / |comm| (whole window)."""
    g = trace.gpu
    kernels = g.kind == GPU_KERNEL
    comm_k = comm_kernel_mask(trace)
    st = steps_mod.find_steps(trace)
    rt = gpu_runtime_index(trace)
    keep = rt >= 0
    keep[keep] = trace.runtime.ts[rt[keep]] < st.host_start.max()
    ts, end = g.ts, g.ts + g.dur
    if hta_rounding:
        ts, end = np.ceil(ts), np.floor(end)
    comp = iv.merge(ts[kernels & ~comm_k & keep], end[kernels & ~comm_k & keep])
    comm = iv.merge(ts[comm_k & keep], end[comm_k & keep])
    both = iv.intersect(comp, comm)
    comm_us = float((comm[1] - comm[0]).sum())
    return 100.0 * float((both[1] - both[0]).sum()) / comm_us


def _partial(trace):
    return report.analyze_trace(trace)["distributed"]


@pytest.mark.parametrize("rel", sorted(HTA_PCTG))
def test_hta_definition_reproduced_with_our_classification(rel):
    """Same window, same rounding: our comm/compute classification and interval
    arithmetic give HTA's number. control, df_index_resolver and nccl_data agree to
    HTA's 2-decimal rounding (0.01 pt). resnet MI300 differs by 0.23 pt (22.22 vs 22.45):
    there HTA keeps 2,238 kernels, we keep 1,492 — the number a stdlib-json count of
    kernels whose cuda_runtime launch (same correlation) starts before ProfilerStep#17
    also gives; 757 of the file's 2,995 kernels have no runtime event at all and HTA's
    correlation join keeps most of them anyway. Tolerance there 0.3 pt."""
    trace = _load(rel)
    rank, hta = HTA_PCTG[rel]
    assert _partial(trace)["rank"] == rank
    tol = 0.3 if rel.startswith("tracelens/mi300") else 0.01
    assert _hta_window_pct(trace, hta_rounding=True) == pytest.approx(hta, abs=tol)


@pytest.mark.parametrize("rel", sorted(HTA_PCTG))
def test_partial_overlap_vs_hta(rel):
    """What the rank view shows: per step overlapped / (overlapped + exposed comm) from the
    span partial, averaged over steps, and the ratio of sums; both over the steps HTA
    covers (all but the last) and over all included steps.

    Measured (ours exact-µs, all-but-last steps, ratio of sums / mean of steps; HTA):
    nccl_data 14.76 / 14.77 vs 14.31 (gap = HTA's ns rounding, 0.46 pt);
    df_index_resolver 0 / 0 vs 0 (no compute runs during its all_reduces);
    control 47.03 / 46.12 vs 47.03 (mean of per-step ratios weighs the steps equally);
    resnet MI300 24.97 / 24.97 vs 22.45 (gap = HTA's ns rounding, 2.75 pt, on the short
    ROCm kernels, and its extra unlinked kernels, 0.23 pt). With the last step included
    (what the rank view sums): 15.61, 0, 46.24, 25.25.
    Tolerance: 1 pt on integer-µs traces (stretched steps vs launch-time window) plus the
    measured rounding gap |exact − rounded| of the trace's HTA-window number + 0.5 pt."""
    trace = _load(rel)
    _, hta = HTA_PCTG[rel]
    steps = _partial(trace)["steps"]
    assert len(steps) >= 3
    covered = steps[:-1]  # HTA drops the last ProfilerStep
    ov = np.array([s["overlapped_us"] for s in covered])
    ex = np.array([s["exposed_comm_us"] for s in covered])
    assert (ov + ex > 0).all()
    per_step_mean = float(np.mean(100 * ov / (ov + ex)))
    ratio_of_sums = 100 * float(ov.sum() / (ov.sum() + ex.sum()))
    rounding_gap = abs(_hta_window_pct(trace, False) - _hta_window_pct(trace, True))
    tol = 1.0 + rounding_gap + (0.5 if rounding_gap else 0.0)
    assert ratio_of_sums == pytest.approx(hta, abs=tol)
    assert per_step_mean == pytest.approx(hta, abs=tol)
    # Including the last step (what the view sums) stays within a few points.
    ov_all = sum(s["overlapped_us"] for s in steps)
    ex_all = sum(s["exposed_comm_us"] for s in steps)
    assert 100 * ov_all / (ov_all + ex_all) == pytest.approx(hta, abs=tol + 2.0)


def test_all_reduce_bytes_from_kernel_collective_metadata():
    """Collective bytes from the kernels' own metadata (2023-10+ `In msg nelems` x size of
    `dtype`): nccl_data's all_reduce bytes per step equal an independent stdlib-json count
    over the file (kernels launched in each ProfilerStep host span, by correlation)."""
    import gzip
    import json

    rel = "hta/nccl_parser_config/nccl_data.json.gz"
    trace = _load(rel)
    with gzip.open(TRACES / rel, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    size = {"Float": 4, "Long": 8}
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    expected = {n: [] for _, _, n in steps}
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        a = e["args"]
        if a.get("Collective name") != "allreduce":
            continue
        t = launch_ts[a["correlation"]]
        n = next(n for lo, hi, n in steps if lo <= t < hi)
        expected[n].append(float(a["In msg nelems"] * size[a["dtype"]]))
    got = {s["step"]: [b for k, b in zip(s["collectives"]["kind"], s["collectives"]["bytes"]) if k == "all_reduce"]
           for s in _partial(trace)["steps"]}
    assert got == expected
    assert sum(map(len, expected.values())) == 15 and all(expected.values())


def test_wrongly_typed_collective_metadata_is_absent_not_fatal(tmp_path):
    """Lenient reading: a numeric `dtype` or a text `In msg nelems` leaves that kernel's
    metadata absent (bytes null) and is counted in the trace's warnings; a good kernel
    in the same file keeps its bytes (4 x 1000)."""
    import json

    def kern(ts, args):
        return {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(x)", "pid": 0,
                "tid": 7, "ts": ts, "dur": 10, "args": dict({"device": 0, "stream": 7}, **args)}
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              kern(10, {"In msg nelems": 1000, "dtype": "Float"}),
              kern(30, {"In msg nelems": 1000, "dtype": 5}),
              kern(50, {"In msg nelems": "abc", "dtype": "Float"})]
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    trace = loader.load_trace(str(path))
    assert trace.gpu.msg_nelems.tolist() == [1000, 1000, -1]
    assert [trace.strings[i] if i >= 0 else None for i in trace.gpu.msg_dtype.tolist()] == ["Float", None, "Float"]
    assert any("`dtype` not a string" in w for w in trace.meta.warnings)
    (step,) = _partial(trace)["steps"]
    assert step["collectives"]["bytes"] == [4000.0, None, None]
