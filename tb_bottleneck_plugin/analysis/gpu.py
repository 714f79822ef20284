"""Per-device GPU metrics (metrics.md §4 and §6's est. achieved occupancy).

``gpu_metrics(trace, steps, not_available=None) -> per_device``, the report's ``gpu``
object: ``{"<device id>": {utilization_pct, est_sm_efficiency_pct,
est_achieved_occupancy_pct, idle: {...}}}`` (``tensor_core_pct`` is added by the Tensor
Core analysis). Reasons go into ``not_available`` under the report's keys (``gpu``,
``gpu.<dev>.est_sm_efficiency_pct``, ...; analysis/units.py).

Helpers reused elsewhere: ``clipped_kernel_weights``, ``sm_efficiency_integral``,
``hta_gpu_mask``, ``idle_breakdown``. ``UNIT``: the metric unit (analysis/units.py).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import GPU_KERNEL, TraceData
from . import intervals as iv
from .accelerators import no_gpu_reason
from .linking import gpu_runtime_index
from .occupancy import blocks_per_sm, clipped_weights, shown_occupancy, weighted_mean
from .steps import Steps, step_rows

NA_NO_GPU = "CPU-only trace: no GPU activity"
NA_NO_STEPS = "no included step: no steps window"
NA_NO_BLOCKS_PER_SM = "kernels carry no numeric 'blocks per SM' (old trace or ROCm)"
NA_NO_OCCUPANCY = "kernels carry no 'est. achieved occupancy %' (old trace or ROCm)"
NA_NO_KERNELS = "no kernel on this device inside the steps window"
NA_OUT_OF_RANGE = "kernel durations beyond the float range (absurd 'dur' values)"
NA_NO_KERNELS_IN_WINDOW = ("no kernel of this device ran inside the steps window (its kernels lie outside it; "
                           "for CUDA graphs, graph replays may not be linked to the steps)")


def clipped_kernel_weights(trace: TraceData, window: Tuple[float, float]) -> np.ndarray:
    """For each row of trace.gpu: the duration of the kernel clipped to ``window``
    (lo, hi); 0 for non-kernels and for kernels outside the window. The weights of
    est. achieved occupancy (§6), the same as occupancy.clipped_weights."""
    g = trace.gpu
    w = clipped_weights(g.ts, g.dur, window)
    return np.where((g.kind == GPU_KERNEL) & (w > 0), w, 0.0)


def sm_efficiency_integral(starts: np.ndarray, ends: np.ndarray, blocks: np.ndarray) -> float:
    """∫ min(1, Σ blocks of the intervals covering t) dt (µs), by a sweep over sorted
    start/end events with a cumulative sum."""
    keep = ends > starts
    starts, ends, blocks = starts[keep], ends[keep], blocks[keep]
    if len(starts) == 0:
        return 0.0
    t = np.concatenate([starts, ends])
    d = np.concatenate([blocks, -blocks])
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    level = np.cumsum(d)
    # level holds on [t[i], t[i+1]); events at the same time are fine (dt = 0).
    dt = np.diff(t)
    lv = np.clip(level[:-1], 0.0, 1.0)
    return float((lv * dt).sum())


def hta_gpu_mask(trace: TraceData, gpu_runtime: Optional[np.ndarray] = None,
                 step_cpu_rows: Optional[np.ndarray] = None) -> np.ndarray:
    """HTA-compatible selection of trace.gpu rows (HTA 0.5.0 defaults,
    include_last_profiler_step=False): with at least two distinct `ProfilerStep#N`
    names (CPU spans and gpu_user_annotation copies alike), the cut-off is the latest
    start of any event so named; GPU activity is kept only when its launching runtime
    call starts before the cut-off. With fewer names every GPU row is kept.
    ``gpu_runtime``: linking.gpu_runtime_index(trace) when the caller has it;
    ``step_cpu_rows``: the ProfilerStep rows (``Steps.cpu_rows`` of find_steps, in any order)."""
    n = len(trace.gpu)
    rows = step_rows(trace)[0] if step_cpu_rows is None else np.sort(step_cpu_rows[step_cpu_rows >= 0])
    names = set(trace.cpu.name[rows].tolist())
    starts = list(trace.cpu.ts[rows])
    a = trace.gpu_annotations
    if len(a):
        ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
        m = np.isin(a.name, ids)
        names |= set(a.name[m].tolist())
        starts += list(a.ts[m])
    if len({trace.strings[i] for i in names}) < 2:
        return np.ones(n, bool)
    cutoff = max(starts)
    g_rt = gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
    ok = g_rt >= 0
    keep = np.zeros(n, bool)
    keep[ok] = trace.runtime.ts[g_rt[ok]] < cutoff
    return keep


def idle_breakdown(trace: TraceData, mask: np.ndarray, integer_us: bool = False,
                   gpu_runtime: Optional[np.ndarray] = None) -> dict:
    """HTA's temporal idle and idle-time breakdown over the GPU rows in ``mask``.

    span = first start to last end of the selected activity, idle = span − Union;
    per stream, each gap between consecutive activities (sorted by start) is
    host_wait when the next activity's launching call started after the previous one
    ended, else kernel_wait when shorter than thresholds.HTA_KERNEL_WAIT_US, else other.
    ``integer_us``: truncate ts and dur to whole µs first, as HTA does (it matters on
    ns-resolution traces). ``gpu_runtime``: linking.gpu_runtime_index(trace) when the
    caller has it.
    Returns {span_us, idle_us, idle_pct, host_wait_us, kernel_wait_us, other_us}."""
    g = trace.gpu
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return {"span_us": 0.0, "idle_us": 0.0, "idle_pct": None, "host_wait_us": 0.0,
                "kernel_wait_us": 0.0, "other_us": 0.0}
    ts, dur = g.ts[rows], g.dur[rows]
    base = float(ts.min())
    if integer_us:  # HTA: times relative to the first one, truncated to int µs
        ts, dur = np.floor(ts - base), np.floor(dur)
    end = ts + dur
    span = float(end.max() - ts.min())
    idle = span - iv.union_length(ts, end)
    g_rt = (gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime)[rows]
    rt_ts = np.floor(trace.runtime.ts - base) if integer_us else trace.runtime.ts
    launch = np.full(len(rows), -np.inf)
    if len(rt_ts):
        launch = np.where(g_rt >= 0, rt_ts[np.maximum(g_rt, 0)], -np.inf)
    stream = g.stream[rows]
    order = np.lexsort((ts, stream))
    st, s_ts, s_end, s_launch = stream[order], ts[order], end[order], launch[order]
    same = st[1:] == st[:-1]
    prev_end = s_end[:-1][same]
    gap = s_ts[1:][same] - prev_end
    nxt_launch = s_launch[1:][same]
    host = nxt_launch > prev_end
    kwait = ~host & (gap < T.HTA_KERNEL_WAIT_US)
    other = ~host & ~kwait
    gap = np.maximum(gap, 0.0)
    return {"span_us": span, "idle_us": float(idle), "idle_pct": 100.0 * idle / span if span > 0 else None,
            "host_wait_us": float(gap[host].sum()), "kernel_wait_us": float(gap[kwait].sum()),
            "other_us": float(gap[other].sum())}


def gpu_metrics(trace: TraceData, steps: Steps, hta_compatible: bool = True, kineto_only: bool = False,
                shown: Optional[np.ndarray] = None, not_available: Optional[Dict[str, str]] = None,
                gpu_runtime: Optional[np.ndarray] = None) -> Dict[str, dict]:
    """Per-device metrics over the steps window (§4, §6).

    Returns ``{"<dev>": {"utilization_pct", "est_sm_efficiency_pct",
    "est_achieved_occupancy_pct", "kernel_us", "idle": idle_breakdown(...) plus "view":
    "hta"|"all"}}``; a metric that cannot be computed is None and its reason is written
    to ``not_available`` (the report's dict, analysis/units.py) as ``gpu.<dev>.<metric>``
    (``gpu`` when the trace has no GPU activity).
    ``hta_compatible`` selects the GPU rows of the idle breakdown with hta_gpu_mask
    (HTA drops the last step) and truncates times to whole µs as HTA does; otherwise all
    GPU activity counts, at full resolution. The occupancy of each kernel is the one
    shown in the kernel table (occupancy.shown_occupancy; ``kineto_only``: Kineto's
    values alone, torch-tb-profiler's view; ``shown``: that array when the caller already
    has it; ``gpu_runtime``: linking.gpu_runtime_index(trace) when the caller has it)."""
    if not_available is None:
        not_available = {}
    out: Dict[str, dict] = {}
    g = trace.gpu
    if len(g) == 0:
        # another accelerator's trace (MTIA, XPU, ...) is named as such, not "CPU-only"
        not_available["gpu"] = no_gpu_reason(trace, NA_NO_GPU)
        return out
    lo, hi = steps.window
    win = hi - lo if np.isfinite(lo) else 0.0
    weights = clipped_kernel_weights(trace, (lo, hi)) if win > 0 else np.zeros(len(g))
    if gpu_runtime is None:
        gpu_runtime = gpu_runtime_index(trace)
    sel_idle = hta_gpu_mask(trace, gpu_runtime, steps.cpu_rows) if hta_compatible else np.ones(len(g), bool)
    is_k = g.kind == GPU_KERNEL
    if shown is None:
        shown, _, _ = shown_occupancy(trace, kineto_only)
    bps_all = blocks_per_sm(g)
    for dev in trace.devices:
        key = str(dev)
        on = g.device == dev
        k = on & is_k
        m: Dict[str, Optional[float]] = {}
        if win <= 0:
            m.update(utilization_pct=None, est_sm_efficiency_pct=None, est_achieved_occupancy_pct=None)
            for name in ("utilization_pct", "est_sm_efficiency_pct", "est_achieved_occupancy_pct"):
                not_available[f"gpu.{key}.{name}"] = NA_NO_STEPS
        else:
            s, e = iv.clip(g.ts[k], g.ts[k] + g.dur[k], lo, hi)
            m["kernel_us"] = iv.union_length(s, e)
            m["utilization_pct"] = 100.0 * m["kernel_us"] / win
            if m["kernel_us"] <= 0 and k.any():
                # The device ran kernels, but none inside the steps window (e.g. a CUDA-graph
                # capture window, or steps whose GPU work is not linked to them): a 0 % here
                # would read "GPU idle" about a window that is not the workload.
                m["utilization_pct"] = None
                not_available[f"gpu.{key}.utilization_pct"] = NA_NO_KERNELS_IN_WINDOW
            b = bps_all[k]  # warps per SM converted where blocks per SM is missing (2021)
            good = np.isfinite(b) & (b > 0)
            if good.any():
                m["est_sm_efficiency_pct"] = 100.0 * sm_efficiency_integral(s[good], e[good], b[good]) / win
            else:
                m["est_sm_efficiency_pct"] = None
                not_available[f"gpu.{key}.est_sm_efficiency_pct"] = NA_NO_BLOCKS_PER_SM
            occ = shown[k]
            w = weights[k]
            good = np.isfinite(occ) & (occ >= 0)
            with np.errstate(over="ignore"):  # Σ of absurd durations (1e308 µs) is inf, still > 0
                w_total = w[good].sum()
            if not good.any():
                m["est_achieved_occupancy_pct"] = None
                not_available[f"gpu.{key}.est_achieved_occupancy_pct"] = NA_NO_OCCUPANCY
            elif w_total <= 0:
                m["est_achieved_occupancy_pct"] = None
                not_available[f"gpu.{key}.est_achieved_occupancy_pct"] = NA_NO_KERNELS
            else:  # weighted_mean: absurd durations (1e308 µs) never overflow into a warning
                m["est_achieved_occupancy_pct"] = weighted_mean(occ[good], w[good])
                if m["est_achieved_occupancy_pct"] is None:
                    not_available[f"gpu.{key}.est_achieved_occupancy_pct"] = NA_OUT_OF_RANGE
        idle = idle_breakdown(trace, on & sel_idle, integer_us=hta_compatible, gpu_runtime=gpu_runtime)
        idle["view"] = "hta" if hta_compatible else "all"
        m["idle"] = idle
        out[key] = m
    return out


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span) -> dict:
    from .linking import span_gpu_runtime
    from .occupancy import span_shown_occupancy

    return gpu_metrics(span.trace, span.found, shown=span_shown_occupancy(span)[0],
                       not_available=span.not_available, gpu_runtime=span_gpu_runtime(span))


def _unit_partial(report: dict) -> dict:
    from .units import weighted_pair

    window = (report.get("steps") or {}).get("window_us") or 0
    devices = {}
    for dev, e in (report.get("gpu") or {}).items():
        if not isinstance(e, dict):
            continue
        d = {"wmean:utilization_pct": weighted_pair(e.get("utilization_pct"), window),
             "wmean:est_sm_efficiency_pct": weighted_pair(e.get("est_sm_efficiency_pct"), window),
             # occupancy is weighted by clipped kernel time (kernel_us approximates the weight's union)
             "wmean:est_achieved_occupancy_pct": weighted_pair(e.get("est_achieved_occupancy_pct"), e.get("kernel_us")),
             "sum:kernel_us": e.get("kernel_us") or 0.0}
        idle = e.get("idle")
        if isinstance(idle, dict):
            d.update({f"sum:idle.{k}": idle.get(k) or 0.0 for k in IDLE_SUMS})
            d["first:idle.view"] = idle.get("view")
        devices[str(dev)] = d
    return {"keyed:devices": devices}


IDLE_SUMS = ("span_us", "idle_us", "host_wait_us", "kernel_wait_us", "other_us")


def _unit_finish(m: dict) -> dict:
    from .units import pct, wmean

    out = {}
    for dev in sorted(m["keyed:devices"]):
        d = m["keyed:devices"][dev]
        merged = {k: wmean(d[f"wmean:{k}"]) for k in ("utilization_pct", "est_sm_efficiency_pct",
                                                       "est_achieved_occupancy_pct")}
        merged["kernel_us"] = d["sum:kernel_us"]
        if "first:idle.view" in d:
            idle = {k: d[f"sum:idle.{k}"] for k in IDLE_SUMS}
            idle["idle_pct"] = pct(idle["idle_us"], idle["span_us"])
            idle["view"] = d["first:idle.view"]
            merged["idle"] = idle
        out[dev] = merged
    return out


def _unit():
    from .units import HIGHER, Card, Metric, Unit

    metrics = (
        Metric("gpu_utilization_pct", "GPU utilization", "%", HIGHER, gpu_mean("utilization_pct"), ("gpu",),
               na_device_metric="gpu.*.utilization_pct",
               card=Card("gpu_utilization", "GPU utilization", "Share of the steps window with a kernel running.",
                         field=("gpu", "0", "utilization_pct"), order=20),
               text=False, order=40),
        Metric("est_sm_efficiency_pct", "Est. SM efficiency", "%", HIGHER, gpu_mean("est_sm_efficiency_pct"),
               ("gpu",), na_device_metric="gpu.*.est_sm_efficiency_pct", text=False, order=50),
    )
    return Unit("gpu", _unit_compute, _unit_partial, _unit_finish, requires=("steps",), metrics=metrics)


def gpu_mean(key: str):
    """A headline getter: the mean over the report's GPU devices of ``gpu[dev][key]`` (None
    when no device has it)."""
    def get(rep):
        values = [g.get(key) for g in (rep.get("gpu") or {}).values() if g.get(key) is not None]
        return sum(values) / len(values) if values else None
    return get


UNIT = _unit()
