"""What the oracle tools of ../shared/oracles/reference.json do differently from the
contract (../shared/docs/metrics.md), encoded once, as rules over a trace's entry.

Every oracle test reads torch-tb-profiler (tbp, last source) and HTA 0.5.0 through
these functions, so a trace added to ../shared/traces is checked by the same rules
without a per-trace list. The quirks are those ../shared/oracles/README.md documents:

- tbp takes the GPU-side ``ProfilerStep#N`` annotations (``gpu_user_annotation``, 2025+
  Kineto and ROCm) as extra steps: on the H100 traces ``['2', '2', '3']``, steps of 0 µs
  that lower its mean step time; on the MI300 trace ``15, 16, 15, 17``. Our steps are
  the CPU spans only (metrics §1 deliberate difference).
- tbp ignores ``cuda_driver`` calls (``cuLaunchKernel`` of Inductor's Triton kernels):
  it does not stretch a step over the GPU work they launched, and their time is CpuOp,
  not Runtime (metrics §2 deliberate difference).
- tbp builds a step-less trace's one step from CPU ops only; ours runs from the first
  to the last event, GPU events included (metrics §1).
- tbp counts a kernel as Communication only through an External id of a CPU op named
  ``nccl:...``; we count NCCL/RCCL kernels by name (metrics §2).
- A tool that failed on a file records ``ok: false`` with its error; tests that
  compare with that tool skip the file with that error as the reason.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import List, Optional

import numpy as np
import pytest

from conftest import ORACLES, TRACES

COMM_NAME_MARKERS = ("nccl", "rccl")


@lru_cache(maxsize=None)
def reference() -> dict:
    return json.loads((ORACLES / "reference.json").read_text())["traces"]


def trace_files() -> List[str]:
    """Every trace file under ../shared/traces, relative to it (the corpus)."""
    return sorted(p.relative_to(TRACES).as_posix() for p in TRACES.rglob("*")
                  if p.is_file() and p.name.endswith((".json", ".json.gz")))


def entry(rel: str) -> dict:
    return reference()[rel]


def tool_failure(rel: str, tool: str) -> Optional[str]:
    """The error a tool recorded on this file (``tool``: ``torch_tb_profiler`` or
    ``hta``), or None when it ran."""
    e = entry(rel)[tool]
    if e.get("ok"):
        return None
    return f"{tool} failed on this file: {e.get('error', 'no error recorded')}"


def skip_if_tool_failed(rel: str, tool: str) -> None:
    reason = tool_failure(rel, tool)
    if reason:
        pytest.skip(reason)


def with_tool(tool: str) -> List[str]:
    """The corpus files the tool ran on."""
    return [rel for rel in trace_files() if tool_failure(rel, tool) is None]


def has_gpu_side_step_annotations(rel: str) -> bool:
    return bool(entry(rel)["file"].get("gpu_user_annotation_profiler_steps"))


def tbp_cpu_steps(rel: str) -> List[str]:
    """tbp's kept steps with the GPU-side ``ProfilerStep#N`` copies taken out: each N
    once, in tbp's order. Equal to tbp's list where the file has no such copies."""
    names = entry(rel)["torch_tb_profiler"]["steps"]["names"]
    if not has_gpu_side_step_annotations(rel):
        return list(names)
    seen, out = set(), []
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def tbp_total_step_us(rel: str) -> float:
    """tbp's summed step time: its mean times the steps it counted. The GPU-side copies
    are steps of 0 µs, so this sum is the CPU steps' sum either way."""
    t = entry(rel)["torch_tb_profiler"]
    return t["avg_step_time_us"] * len(t["steps"]["names"])


def tbp_per_cpu_step_us(rel: str) -> List[dict]:
    """tbp's per-step breakdown without the 0 µs GPU-side copies."""
    steps = entry(rel)["torch_tb_profiler"]["per_step_us"]
    if not has_gpu_side_step_annotations(rel):
        return steps
    seen, out = set(), []
    for s in steps:
        if s["step"] in seen:
            assert s["total"] == 0, (rel, s)  # a copy holds no time
            continue
        seen.add(s["step"])
        out.append(s)
    return out


def is_stepless(rel: str) -> bool:
    return not entry(rel)["file"].get("profiler_steps_in_trace")


def driver_launches(trace) -> int:
    """GPU activities launched through ``cuda_driver`` calls (tbp does not see them)."""
    rt = trace.runtime
    if not len(rt):
        return 0
    driver_corr = set(rt.correlation[rt.is_driver].tolist()) - {-1, 0}
    if not driver_corr:
        return 0
    return int(np.isin(trace.gpu.correlation, list(driver_corr)).sum())


def has_comm_kernels(trace) -> bool:
    names = np.array(trace.strings, dtype=object)[np.unique(trace.gpu.name)] if len(trace.gpu) else []
    return any(m in str(n).lower() for n in names for m in COMM_NAME_MARKERS)


def step_time_like_tbp(rel: str, trace) -> Optional[str]:
    """Why our step time legitimately differs from tbp's on this file (a deliberate
    difference of metrics §1/§2), or None where it must equal tbp's."""
    if is_stepless(rel):
        return "no ProfilerStep: our window covers every event, tbp's CPU ops only (metrics §1)"
    if driver_launches(trace):
        return "cuda_driver launches: tbp does not stretch steps over their GPU work (metrics §2)"
    return None


def stepless_window_us(rel: str) -> float:
    """metrics §1's one window of a trace without ProfilerStep, read with the standard
    library (independently of the loader): first to last complete event, the synthetic
    ``Trace`` span left out, ``[memory]`` instants included."""
    import gzip
    path = TRACES / rel
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f, strict=False)
    events = data if isinstance(data, list) else data["traceEvents"]
    lo, hi = float("inf"), float("-inf")
    for e in events:
        if e.get("name") == "[memory]" or (e.get("ph") == "X" and e.get("cat") != "Trace"):
            ts = float(e["ts"])
            lo, hi = min(lo, ts), max(hi, ts + float(e.get("dur", 0) or 0))
    return hi - lo


GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


@lru_cache(maxsize=None)
def hta_extra_stream_event_us(rel: str) -> float:
    """HTA counts as a "GPU event" every event whose args carry ``stream``: besides
    kernels and copies, e.g. the ``cpu_op`` that launches an Inductor Triton kernel.
    The summed duration of those other events (read with the standard library) bounds
    how much less idle HTA can see than our kernels/memcpy/memset view."""
    import gzip
    path = TRACES / rel
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f, strict=False)
    events = data if isinstance(data, list) else data["traceEvents"]
    return float(sum(float(e.get("dur", 0) or 0) for e in events
                     if e.get("ph") == "X" and isinstance(e.get("args"), dict) and "stream" in e["args"]
                     and str(e.get("cat", "")).lower() not in GPU_CATEGORIES))
