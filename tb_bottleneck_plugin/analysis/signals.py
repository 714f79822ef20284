"""Other bottleneck signals (metrics.md §8): synchronisation, communication overlap,
launch overhead.

- ``sync_signal(trace, steps) -> {"sync_us", "sync_pct", "top_ops": [{op, sync_us, count}],
  "calls": [{name, us, count}]}``
- ``communication_signal(trace, steps) -> {"comm_us", "overlap_pct", "comm_pct_of_kernel_time",
  "kernel_union_us"}``
- ``launch_signal(trace, steps, not_available=None) -> {"launch_us", "kernels_per_step",
  "launch_pct"}``; reasons go into ``not_available`` under the report's keys
  (``launch.kernels_per_step``; analysis/units.py)

``gpu_runtime`` / ``op_calls`` arguments: linking.gpu_runtime_index(trace) /
linking.op_calls(trace) when the caller has them (the report computes each once per span,
linking.span_gpu_runtime / span_op_calls).

``SYNC_UNIT``, ``COMMUNICATION_UNIT``, ``LAUNCH_UNIT``: the metric units (analysis/units.py).
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional

import numpy as np

from ..trace.model import CPU_OP, GPU_KERNEL, GPU_MEMCPY, TraceData
from . import intervals as iv
from .breakdown import comm_kernel_mask
from .linking import gpu_runtime_index, innermost_enclosing
from .steps import NA_NO_STEPS_FOUND, Steps

# Always-blocking synchronisation calls (CUDA and HIP twins).
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
    "hipMemcpyWithStream",
})
# Synchronous copies: blocking only when the copy they launched is DtoH.
SYNC_MEMCPY_CALLS = frozenset({"cudaMemcpy", "hipMemcpy"})
# Kernel launch calls (runtime and driver API).
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel",
})
TOP_N = 10
NO_CPU_OPS = ("the trace has no CPU operators (a GPU-only export: CPU activity not recorded): "
              "its sync calls cannot be attributed to operators")


def _clipped_to(starts, ends, lo, hi) -> np.ndarray:
    """Per interval, its length inside the union of windows [lo, hi] (sorted, disjoint)."""
    if len(starts) == 0 or len(lo) == 0:
        return np.zeros(len(starts))
    merged = iv.merge(lo, hi)
    return iv.covered_in(merged, starts, ends)


# the last trace's answer (trace and GPU->runtime index held weakly; tables are read-only once
# loaded): the sync, launch, source and step-model analyses of a span each ask for it
_sync_rows_memo: list = [None]


def sync_rows(trace: TraceData, gpu_runtime: Optional[np.ndarray] = None) -> np.ndarray:
    """Runtime rows that block the host (§8)."""
    memo = _sync_rows_memo[0]
    if memo is not None and memo[0]() is trace and memo[1] == len(trace.strings) and \
            (memo[2] is None if gpu_runtime is None else memo[2] is not None and memo[2]() is gpu_runtime):
        return memo[3].copy()
    rows = _sync_rows(trace, gpu_runtime)
    try:
        _sync_rows_memo[0] = (weakref.ref(trace), len(trace.strings),
                              None if gpu_runtime is None else weakref.ref(gpu_runtime), rows.copy())
    except TypeError:  # (an object that takes no weak reference: not remembered)
        pass
    return rows


def _sync_rows(trace: TraceData, gpu_runtime: Optional[np.ndarray] = None) -> np.ndarray:
    rt = trace.runtime
    always = np.isin(rt.name, trace.string_ids(lambda s: s in SYNC_CALLS))
    copy_calls = np.isin(rt.name, trace.string_ids(lambda s: s in SYNC_MEMCPY_CALLS))
    if copy_calls.any() and len(trace.gpu):
        g_rt = gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
        dtoh = (trace.gpu.kind == GPU_MEMCPY) & np.isin(trace.gpu.name, trace.string_ids(lambda s: "DtoH" in s))
        hit = np.zeros(len(rt), bool)
        hit[g_rt[dtoh & (g_rt >= 0)]] = True
        always |= copy_calls & hit
    return np.flatnonzero(always)


def op_names(trace: TraceData, op: np.ndarray) -> np.ndarray:
    """The string id of each CPU row in ``op`` (-1 where ``op`` is -1), safe when the
    trace has no CPU rows at all (a GPU-only export: every ``op`` is -1)."""
    op = np.asarray(op, dtype=np.int64)
    out = np.full(len(op), -1, dtype=np.int64)
    hit = op >= 0
    if hit.any():
        out[hit] = trace.cpu.name[op[hit]]
    return out


def sync_signal(trace: TraceData, steps: Steps, gpu_runtime: Optional[np.ndarray] = None, op_calls=None,
                not_available: Optional[Dict[str, str]] = None) -> dict:
    """Host time in blocking sync calls, clipped to the host spans of the included
    steps; ``sync_pct`` = 100 * sync_us / Σ included (stretched) step time; ``top_ops``:
    the innermost enclosing CPU op of each call (``"(no op)"`` when none), by µs; empty,
    with ``sync.top_ops`` in ``not_available``, when the trace has sync calls but no CPU
    operator at all (a GPU-only export)."""
    rows = sync_rows(trace, gpu_runtime)
    rt = trace.runtime
    total_steps = float(steps.durations.sum()) if steps.count else 0.0
    us = _clipped_to(rt.ts[rows], rt.ts[rows] + rt.dur[rows], steps.inc_host_start, steps.inc_host_end)
    inside = us > 0
    rows, us = rows[inside], us[inside]
    sync_us = float(us.sum())
    calls: List[Dict] = []
    top: List[Dict] = []
    if len(rows):
        names = rt.name[rows]
        for nid in np.unique(names):
            sel = names == nid
            calls.append({"name": trace.strings[nid], "us": float(us[sel].sum()), "count": int(sel.sum())})
        calls.sort(key=lambda d: -d["us"])
        has_ops = bool((trace.cpu.kind == CPU_OP).any())
        if has_ops:
            op = innermost_enclosing(trace, trace.cpu.kind == CPU_OP, rows, among=op_calls)
            op_name = op_names(trace, op)
            for nid in np.unique(op_name):
                sel = op_name == nid
                top.append({"op": trace.strings[nid] if nid >= 0 else "(no op)",
                            "sync_us": float(us[sel].sum()), "count": int(sel.sum())})
            top.sort(key=lambda d: -d["sync_us"])
        elif not_available is not None:
            # a GPU-only export (runtime calls, no CPU operators): nothing to attribute to
            not_available["sync.top_ops"] = NO_CPU_OPS
    gpu_busy = iv.merge(trace.gpu.ts, trace.gpu.ts + trace.gpu.dur) if len(rows) else None
    idle_us, busy_pct = _sync_gpu_idle(trace, rows, steps, gpu_busy)
    refill_us = _sync_refill_idle(trace, rows, steps, gpu_busy)
    return {"sync_us": sync_us, "sync_pct": 100.0 * sync_us / total_steps if total_steps > 0 else None,
            "sync_gpu_idle_us": idle_us,
            "sync_gpu_idle_pct": 100.0 * idle_us / total_steps if total_steps > 0 else None,
            "gpu_busy_during_sync_pct": busy_pct,
            "sync_refill_idle_us": refill_us,
            "sync_refill_idle_pct": 100.0 * refill_us / total_steps if total_steps > 0 else None,
            "sync_cost_pct": 100.0 * (idle_us + refill_us) / total_steps if total_steps > 0 else None,
            "top_ops": top[:TOP_N], "calls": calls}


def _sync_gpu_idle(trace: TraceData, rows: np.ndarray, steps: Steps, busy: iv.Intervals):
    """GPU idle during synchronisation (§8): the sync calls ``rows``, as a union clipped
    to the host spans of the included steps, intersected with the time no GPU activity
    (kernel, memcpy, memset; any device of the file) ran. A sync that waits while the
    GPU is busy does not starve it; one that overlaps GPU idle time does.
    Returns ``(idle_us, gpu_busy_during_sync_pct)``; the share is None without sync time."""
    rt = trace.runtime
    if len(rows) == 0 or steps.count == 0:
        return 0.0, None
    sync_set = iv.intersect(iv.merge(rt.ts[rows], rt.ts[rows] + rt.dur[rows]),
                            iv.merge(steps.inc_host_start, steps.inc_host_end))
    sync_len = float((sync_set[1] - sync_set[0]).sum())
    if sync_len <= 0:
        return 0.0, None
    idle = iv.subtract(sync_set, busy)
    idle_us = float((idle[1] - idle[0]).sum())
    return idle_us, 100.0 * (sync_len - idle_us) / sync_len


def _sync_refill_idle(trace: TraceData, rows: np.ndarray, steps: Steps, busy: iv.Intervals) -> float:
    """GPU idle after synchronisation (§8): a sync returns when the GPU has drained its
    queue, so the GPU then idles until the host launches again. For each sync call that
    ends while no GPU activity runs, the interval from its end to the next GPU activity
    (any device of the file), no longer than the GPU-busy part of the call, clipped to the
    included (stretched) steps; their union in µs. Without the sync the host would have queued that
    work while the GPU was still busy."""
    rt = trace.runtime
    if len(rows) == 0 or steps.count == 0:
        return 0.0
    busy_s, busy_e = busy
    order = np.argsort(rt.ts[rows] + rt.dur[rows], kind="stable")
    starts, ends = rt.ts[rows][order], (rt.ts[rows] + rt.dur[rows])[order]
    # the host's lost lead: the part of the wait the GPU was busy (the idle part of the
    # wait is already sync_gpu_idle_us; together no more than the wait itself)
    lead = iv.covered_in((busy_s, busy_e), starts, ends)
    if len(busy_s):
        # the last busy interval that starts at or before each sync end still runs: no refill gap
        k = np.searchsorted(busy_s, ends, side="right") - 1
        running = (k >= 0) & (busy_e[np.maximum(k, 0)] > ends)
        nxt = np.searchsorted(busy_s, ends, side="left")
        nxt_start = np.where(nxt < len(busy_s), busy_s[np.minimum(nxt, len(busy_s) - 1)], np.inf)
    else:
        running = np.zeros(len(ends), dtype=bool)
        nxt_start = np.full(len(ends), np.inf)
    window = iv.merge(steps.inc_start, steps.inc_end)
    # without the wait the host would have been at most its lost lead ahead: a longer gap
    # (a host-bound run's) is not the sync's
    gap_s = ends[~running]
    gap_e = np.minimum(np.minimum(nxt_start[~running], gap_s + lead[~running]), float(steps.inc_end.max()))
    keep = gap_e > gap_s
    if not keep.any():
        return 0.0
    gaps = iv.intersect(iv.merge(gap_s[keep], gap_e[keep]), window)
    return float((gaps[1] - gaps[0]).sum())


def communication_signal(trace: TraceData, steps: Steps) -> dict:
    """Communication kernels in the steps window: ``comm_us`` = Union(comm kernels),
    ``overlap_pct`` = 100 * |comm ∩ compute kernels| / comm_us (HTA's comm/comp
    overlap; None without communication), ``comm_pct_of_kernel_time`` = 100 *
    comm_us / Union(all kernels)."""
    lo, hi = steps.window
    g = trace.gpu
    if len(g) == 0 or not np.isfinite(lo):
        return {"comm_us": 0.0, "overlap_pct": None, "comm_pct_of_kernel_time": None, "kernel_union_us": 0.0}
    comm = comm_kernel_mask(trace)
    k = g.kind == GPU_KERNEL
    comm_set = iv.merge(*iv.clip(g.ts[comm], g.ts[comm] + g.dur[comm], lo, hi))
    comp_set = iv.merge(*iv.clip(g.ts[k & ~comm], g.ts[k & ~comm] + g.dur[k & ~comm], lo, hi))
    comm_us = float((comm_set[1] - comm_set[0]).sum())
    both = iv.intersect(comm_set, comp_set)
    overlap = float((both[1] - both[0]).sum())
    all_k = float((comp_set[1] - comp_set[0]).sum()) + comm_us - overlap
    return {"comm_us": comm_us, "overlap_pct": 100.0 * overlap / comm_us if comm_us > 0 else None,
            "comm_pct_of_kernel_time": 100.0 * comm_us / all_k if all_k > 0 else None,
            "kernel_union_us": all_k}


def launch_signal(trace: TraceData, steps: Steps, not_available: Optional[Dict[str, str]] = None,
                  gpu_runtime: Optional[np.ndarray] = None) -> dict:
    """CPU time in kernel-launch calls within the included steps (sum of durations
    clipped to the stretched steps), its share of step time, and the mean number of
    kernels launched per included step (None, with its reason in ``not_available`` as
    ``launch.kernels_per_step``, without a found, included step)."""
    if not_available is None:
        not_available = {}
    rt = trace.runtime
    if steps.count == 0:
        not_available["launch.kernels_per_step"] = "no included step"
        return {"launch_us": 0.0, "kernels_per_step": None, "launch_pct": None}
    m = np.isin(rt.name, trace.string_ids(lambda s: s in LAUNCH_CALLS))
    # every call's clipped time once (each call's is its own: the launches' are those rows of it,
    # and the longest runtime call reads all of them)
    clipped = _clipped_to(rt.ts, rt.ts + rt.dur, steps.inc_start, steps.inc_end)
    us = clipped[m]
    launch_us = float(us.sum())
    total = float(steps.durations.sum())
    inc_idx = np.flatnonzero(steps.included)
    if steps.gpu_step is not None and len(trace.gpu):
        k = (trace.gpu.kind == GPU_KERNEL) & np.isin(steps.gpu_step, inc_idx)
        kps = float(k.sum()) / len(inc_idx)
    else:
        kps = 0.0
    out = {"launch_us": launch_us, "kernels_per_step": kps,
           "launch_pct": 100.0 * launch_us / total if total > 0 else None}
    out.update(longest_runtime_call(trace, steps, gpu_runtime=gpu_runtime, clipped=clipped))
    out["longest_runtime_call_step_pct"] = (100.0 * out["longest_runtime_call"]["us"] / total
                                            if out["longest_runtime_call"] and total > 0 else None)
    if not steps.found:
        # One window over the whole trace is not a step: a count "per step" would be
        # the trace's kernel count under another name. It is n/a with the steps' own
        # reason, and the window's count is given as what it is (METRICS.md §1, §8).
        out["kernels_per_step"] = None
        not_available["launch.kernels_per_step"] = NA_NO_STEPS_FOUND
        lo, hi = steps.window
        k = trace.gpu.kind == GPU_KERNEL
        out["kernels_per_window"] = int((k & (trace.gpu.ts >= lo) & (trace.gpu.ts <= hi)).sum())
    return out


def longest_runtime_call(trace: TraceData, steps: Steps, gpu_runtime: Optional[np.ndarray] = None,
                         clipped: Optional[np.ndarray] = None) -> dict:
    """METRICS.md §8 "Longest runtime call": all CUDA/HIP runtime-call time inside the
    included steps (``runtime_us``, durations clipped to the stretched steps), the longest
    single call there that does not wait for the GPU (``longest_runtime_call``: {name, us,
    step}; the synchronising calls of sync_rows are the sync metric's, None without such a
    call) and its share of ``runtime_us`` (``longest_runtime_call_pct``; launch_signal adds
    its share of the included step time, ``longest_runtime_call_step_pct``). One call holding
    most of it is a first-call warm-up outlier (lazy module/code-object loading, cuDNN/MIOpen
    autotuning), not launch overhead (recommendations.rule_warmup_outlier). ``clipped``: each
    call's time inside the included steps when the caller has it (``_clipped_to``)."""
    rt = trace.runtime
    us = _clipped_to(rt.ts, rt.ts + rt.dur, steps.inc_start, steps.inc_end) if clipped is None else clipped
    runtime_us = float(us.sum())
    own = us.copy()
    own[sync_rows(trace, gpu_runtime)] = 0.0
    if not len(us) or runtime_us <= 0 or own.max() <= 0:
        return {"runtime_us": runtime_us, "longest_runtime_call": None, "longest_runtime_call_pct": None}
    i = int(np.argmax(own))
    inside = np.flatnonzero((steps.inc_start <= rt.ts[i]) & (rt.ts[i] < steps.inc_end))
    step = int(steps.inc_numbers[inside[0]]) if len(inside) and steps.found else None
    call = {"name": trace.strings[int(rt.name[i])], "us": float(own[i]), "step": step}
    return {"runtime_us": runtime_us, "longest_runtime_call": call,
            "longest_runtime_call_pct": 100.0 * call["us"] / runtime_us}


# ---------------------------------------------------------------- metric units (analysis/units.py)


def _steps_us(report: dict):
    """Σ included step time of a span (the input section's per-step rows): the
    denominator of the summaries' sync and launch shares."""
    from .units import total

    return total(s.get("step_us") for s in ((report.get("input") or {}).get("per_step") or []))


def _sync_compute(span) -> dict:
    from .linking import span_gpu_runtime, span_op_calls

    return sync_signal(span.trace, span.found, gpu_runtime=span_gpu_runtime(span), op_calls=span_op_calls(span),
                       not_available=span.not_available)


def _sync_partial(report: dict) -> dict:
    import math

    from .units import num, weighted_pair

    sync = report.get("sync") or {}
    ops, calls = {}, {}
    for op in sync.get("top_ops") or []:
        if isinstance(op, dict):
            ops[str(op.get("op"))] = {"first:op": op.get("op"), "sum:sync_us": op.get("sync_us"),
                                      "sum:count": int(num(op.get("count")) or 0)}
    for c in sync.get("calls") or []:
        if isinstance(c, dict):
            calls[str(c.get("name"))] = {"first:name": c.get("name"), "sum:us": c.get("us"),
                                         "sum:count": int(num(c.get("count")) or 0)}
    refill = sync.get("sync_refill_idle_us")
    return {"sum:sync_us": sync.get("sync_us") or 0.0, "sum:sync_gpu_idle_us": sync.get("sync_gpu_idle_us") or 0.0,
            # a cached report from before the field: unknown, not 0
            "sum:sync_refill_idle_us": refill if refill is not None else math.nan,
            "wmean:gpu_busy_during_sync_pct": weighted_pair(sync.get("gpu_busy_during_sync_pct"), sync.get("sync_us")),
            "keyed:top_ops": ops, "keyed:calls": calls, "sum:steps_us": _steps_us(report)}


def _sync_finish(m: dict) -> dict:
    import math

    from .units import num, pct, wmean

    steps_us = m["sum:steps_us"]
    refill = num(m["sum:sync_refill_idle_us"])
    ops = [{"op": o["first:op"], "sync_us": o["sum:sync_us"], "count": int(o["sum:count"] or 0)}
           for o in m["keyed:top_ops"].values()]
    calls = [{"name": c["first:name"], "us": c["sum:us"], "count": int(c["sum:count"] or 0)}
             for c in m["keyed:calls"].values()]
    return {"sync_us": m["sum:sync_us"], "sync_pct": pct(m["sum:sync_us"], steps_us),
            "sync_gpu_idle_us": m["sum:sync_gpu_idle_us"], "sync_gpu_idle_pct": pct(m["sum:sync_gpu_idle_us"], steps_us),
            "gpu_busy_during_sync_pct": wmean(m["wmean:gpu_busy_during_sync_pct"]),
            "sync_refill_idle_us": refill,
            "sync_refill_idle_pct": pct(refill, steps_us),
            "sync_cost_pct": pct(m["sum:sync_gpu_idle_us"] + refill if refill is not None else None, steps_us),
            "top_ops": sorted(ops, key=lambda o: -(o["sync_us"] or math.inf))[:TOP_N],
            "calls": sorted(calls, key=lambda c: -(c["us"] or math.inf))}


def _comm_compute(span) -> dict:
    return communication_signal(span.trace, span.found)


def _comm_partial(report: dict) -> dict:
    from .units import num, weighted_pair

    c = report.get("communication") or {}
    union = c.get("kernel_union_us")
    if union is None and num(c.get("comm_pct_of_kernel_time")):  # a report from before kernel_union_us
        union = (num(c.get("comm_us")) or 0.0) * 100.0 / c["comm_pct_of_kernel_time"]
    return {"sum:comm_us": c.get("comm_us") or 0.0, "wmean:overlap_pct": weighted_pair(c.get("overlap_pct"), c.get("comm_us")),
            "sum:kernel_union_us": union or 0.0}


def _comm_finish(m: dict) -> dict:
    from .units import pct, wmean

    return {"comm_us": m["sum:comm_us"], "overlap_pct": wmean(m["wmean:overlap_pct"]),
            "comm_pct_of_kernel_time": pct(m["sum:comm_us"], m["sum:kernel_union_us"]),
            "kernel_union_us": m["sum:kernel_union_us"]}


def _launch_compute(span) -> dict:
    from .linking import span_gpu_runtime

    return launch_signal(span.trace, span.found, not_available=span.not_available, gpu_runtime=span_gpu_runtime(span))


def _launch_partial(report: dict) -> dict:
    from .units import weighted_pair

    launch = report.get("launch") or {}
    return {"sum:launch_us": launch.get("launch_us") or 0.0,
            "wmean:kernels_per_step": weighted_pair(launch.get("kernels_per_step"), (report.get("steps") or {}).get("count")),
            "sum:steps_us": _steps_us(report),
            "sum:runtime_us": launch.get("runtime_us") or 0.0,
            "rows:longest_runtime_call": [dict(launch["longest_runtime_call"], span=report.get("span"),
                                               worker=report.get("worker"))]
            if isinstance(launch.get("longest_runtime_call"), dict) else []}


def _launch_finish(m: dict) -> dict:
    from .units import num, pct, wmean

    calls = [c for c in m.get("rows:longest_runtime_call") or [] if num(c.get("us")) is not None]
    longest = max(calls, key=lambda c: c["us"]) if calls else None  # the first span's on a tie
    runtime_us = m.get("sum:runtime_us")
    return {"launch_us": m["sum:launch_us"], "kernels_per_step": wmean(m["wmean:kernels_per_step"]),
            "launch_pct": pct(m["sum:launch_us"], m["sum:steps_us"]),
            "runtime_us": runtime_us, "longest_runtime_call": longest,
            "longest_runtime_call_pct": pct(longest["us"], runtime_us) if longest else None,
            "longest_runtime_call_step_pct": pct(longest["us"], m["sum:steps_us"]) if longest else None}


def _units():
    from .units import LOWER, Card, Metric, Unit, path

    sync = (Metric("sync_pct", "Synchronisation", "%", LOWER, path("sync", "sync_pct"), ("steps",),
                   card=Card("sync", "Synchronisation",
                             "GPU idle caused by synchronisation calls (while the host waits, and after "
                             "until it launches again), share of step time.",
                             field=("sync", "sync_cost_pct"), order=80),
                   text=False, order=180),)
    communication = (Metric("comm_pct_of_kernel_time", "Communication share", "%", LOWER,
                            path("communication", "comm_pct_of_kernel_time"), (),
                            card=Card("communication", "Communication",
                                      "Share of kernel time in collective (communication) kernels.",
                                      field=("communication", "comm_pct_of_kernel_time"), optional=True, order=90),
                            text=False, order=250),)
    launch = (Metric("launch_pct", "Kernel launch time", "%", LOWER, path("launch", "launch_pct"), ("steps",),
                     text=False, order=190),
              Metric("kernels_per_step", "Kernels per step", "", None, path("launch", "kernels_per_step"), ("steps",),
                     text=False, order=200))
    return (Unit("sync", _sync_compute, _sync_partial, _sync_finish, requires=("steps",), metrics=sync),
            Unit("communication", _comm_compute, _comm_partial, _comm_finish, requires=("steps",),
                 metrics=communication),
            Unit("launch", _launch_compute, _launch_partial, _launch_finish, requires=("steps",), metrics=launch))


SYNC_UNIT, COMMUNICATION_UNIT, LAUNCH_UNIT = _units()
