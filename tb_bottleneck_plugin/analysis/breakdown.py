"""Step-time breakdown (metrics.md §2): every instant of a step goes to exactly one
category, the first in priority order whose intervals cover it.

``category_masks(trace)`` selects each category's events; ``partition(trace, lo, hi)``
measures the priority partition of any windows (computed once per span, shared with the
input-bound unit); ``step_breakdown(trace, steps, part)`` gives the report fields
``breakdown_us``, ``breakdown_pct``, ``breakdown_per_step``, ``avg_step_us``.
``UNIT``: the metric unit (analysis/units.py); summaries are ratios of the per-step sums.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, TraceData
from . import intervals as iv
from .steps import Steps

# Priority order of §2 (report names).
CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")

# Communication kernels: a name containing one of these (case-insensitive).
# nccl/rccl cover ncclKernel_*, ncclDevKernel_*, rccl kernels; the rest are custom
# collectives: vLLM custom all-reduce (multimem_all_reduce_kernel, cross_device_reduce_1stage/
# _2stage) and PyTorch symmetric memory (one_shot_all_reduce_kernel, two_shot_all_reduce_kernel).
COMM_KERNEL_SUBSTRINGS = (
    "nccl",
    "rccl",
    "multimem_all_reduce_kernel",
    "cross_device_reduce_",
    "one_shot_all_reduce_kernel",
    "two_shot_all_reduce_kernel",
)
# CPU spans that are communication (tbp's nccl:all_reduce, gloo:broadcast, ...).
COMM_CPU_PREFIXES = ("nccl:", "gloo:", "rccl:")

DATALOADER_PREFIX = "enumerate(DataLoader)#"
DATALOADER_SUFFIX = "__next__"
DATAPIPE_PREFIX = "enumerate(DataPipe)#"


def is_comm_kernel_name(name: str) -> bool:
    low = name.lower()
    return any(s in low for s in COMM_KERNEL_SUBSTRINGS)


def is_dataloader_name(name: str) -> bool:
    return (name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX)) or \
        name.startswith(DATAPIPE_PREFIX)


def comm_kernel_mask(trace: TraceData) -> np.ndarray:
    """Bool mask over trace.gpu: communication kernels."""
    ids = trace.string_ids(is_comm_kernel_name)
    return (trace.gpu.kind == GPU_KERNEL) & np.isin(trace.gpu.name, ids)


def dataloader_mask(trace: TraceData) -> np.ndarray:
    """Bool mask over trace.cpu: DataLoader/DataPipe `__next__` spans."""
    return np.isin(trace.cpu.name, trace.string_ids(is_dataloader_name)) & _host_span_kind(trace)


def _host_span_kind(trace: TraceData) -> np.ndarray:
    return (trace.cpu.kind == CPU_OP) | (trace.cpu.kind == CPU_USER_ANNOTATION)


def category_masks(trace: TraceData) -> Dict[str, tuple]:
    """For each category but `other`: ("gpu"|"cpu"|"runtime"|"mixed", masks).
    Returned as {category: [(table_name, bool mask), ...]}."""
    g, c = trace.gpu, trace.cpu
    comm_k = comm_kernel_mask(trace)
    span = _host_span_kind(trace)
    comm_cpu = np.isin(c.name, trace.string_ids(lambda s: s.startswith(COMM_CPU_PREFIXES))) & span
    dl = dataloader_mask(trace)
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    cpu_exec = span & ~np.isin(c.name, step_ids)
    return {
        "kernel": [("gpu", (g.kind == GPU_KERNEL) & ~comm_k)],
        "memcpy": [("gpu", g.kind == GPU_MEMCPY)],
        "memset": [("gpu", g.kind == GPU_MEMSET)],
        "communication": [("gpu", comm_k), ("cpu", comm_cpu)],
        "runtime": [("runtime", np.ones(len(trace.runtime), bool))],
        "dataloader": [("cpu", dl)],
        "cpu_exec": [("cpu", cpu_exec)],
    }


def _intervals_of(trace: TraceData, parts) -> iv.Intervals:
    starts, ends = [], []
    for table_name, mask in parts:
        t = getattr(trace, table_name)
        starts.append(t.ts[mask])
        end = t.dur[mask]  # ts + dur written over the gathered durations (the same sums: no third array)
        ends.append(np.add(end, starts[-1], out=end) if end.dtype == np.result_type(end, starts[-1])
                    else starts[-1] + end)
    if not starts:
        return np.empty(0), np.empty(0)
    if len(starts) > 1:
        starts, ends = [np.concatenate(starts)], [np.concatenate(ends)]
    return iv.merge(starts.pop(), ends.pop())  # (one part: its arrays, not a copy; none held here)


@dataclass
class Partition:
    """Per-category exclusive time in a set of windows: ``us[cat]`` arrays (one value
    per window), ``total`` the window lengths."""

    us: Dict[str, np.ndarray]
    total: np.ndarray


def cumulative_unions(trace: TraceData) -> Dict[str, iv.Intervals]:
    """{category: C_k}, C_k the merged union of the whole trace's intervals of the
    categories up to and including k (priority order, every category but ``other``).
    Category k's own time is C_k minus C_{k-1} (the step timeline's input wait is
    C_dataloader minus C_runtime)."""
    masks = category_masks(trace)
    out: Dict[str, iv.Intervals] = {}
    cum: iv.Intervals = (np.empty(0), np.empty(0))
    for cat in CATEGORIES[:-1]:
        own = [_intervals_of(trace, masks.pop(cat))]
        cum = out[cat] = union_merged(cum, own)  # (own: dropped there as its arrays are replaced)
    return out


def union_merged(a: iv.Intervals, owned: list) -> iv.Intervals:
    """``iv.merge`` of two merged sets, ``a`` and ``owned[0]`` (the caller's only reference,
    popped here): the same intervals (a union has one merged form). When one set is much
    smaller, without the concatenation and its sort: the intervals of the larger set touching
    the smaller's are found by searchsorted and fused; the rest are kept as they are. A set unchanged by the other is returned itself (a
    category with no own interval shares the arrays of the one before: read-only). On 10M tiny
    events the CPU ops' union (16 bytes per op) was concatenated, sorted and merged beside
    itself: 64 bytes per op at the breakdown's peak, now 32."""
    b = owned.pop()
    if not len(a[0]):
        return b
    if not len(b[0]):
        return a
    if 32 * min(len(a[0]), len(b[0])) > max(len(a[0]), len(b[0])):  # sets of like size: merged together
        # (faster there; the fusing below pays per interval of the smaller set)
        s, e = [np.concatenate([a[0], b[0]])], [np.concatenate([a[1], b[1]])]
        del b
        return iv.merge(s.pop(), e.pop())
    if len(a[0]) > len(b[0]):
        a, b = b, a
    (sa, ea), (sb, eb) = a, b
    del a, b
    # a[i] overlaps or touches b[j] (merge joins touching intervals) for j0[i] <= j < j1[i]
    j0 = np.searchsorted(eb, sa, side="left")
    j1 = np.searchsorted(sb, ea, side="right")
    hit = j1 > j0
    if not hit.any():
        fs, fe = sa, ea
    else:
        fs = np.where(hit, np.minimum(sa, sb[np.minimum(j0, len(sb) - 1)]), sa)
        fe = np.where(hit, np.maximum(ea, eb[np.maximum(j1 - 1, 0)]), ea)
        fs, fe = iv.merge(fs, fe)  # (a's fused intervals: two may share a b interval)
    # the b intervals fused into a's: the ranges [j0, j1), joined
    r0, r1 = j0[hit], j1[hit]
    del j0, j1, hit
    if len(r0):
        r1 = np.maximum.accumulate(r1)
        first = np.flatnonzero(np.r_[True, r0[1:] > r1[:-1]])
        r0, r1 = r0[first], r1[np.r_[first[1:], len(r1)] - 1]
        keep = np.ones(len(sb), bool)
        lengths = r1 - r0
        keep[np.repeat(r0 - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(int(lengths.sum()))] = False
        del lengths, first
    else:
        keep = None
    # (one column at a time: b's starts, when copied, are freed before its ends are gathered)
    kept = sb[keep] if keep is not None else sb
    del sb
    pos = np.searchsorted(kept, fs)
    out_s = np.insert(kept, pos, fs)
    kept = eb[keep] if keep is not None else eb
    del eb, keep
    return out_s, np.insert(kept, pos, fe)


def partition(trace: TraceData, lo: np.ndarray, hi: np.ndarray,
              unions: Optional[Dict[str, iv.Intervals]] = None) -> Partition:
    """Priority partition of windows [lo[i], hi[i]]: Kernel > Memcpy > Memset >
    Communication > Runtime > DataLoader > CPU Exec > Other.

    Vectorised with cumulative coverage: with C_k the union of the first k categories
    (``cumulative_unions``, passed in when already computed), category k owns
    covered_in(C_k) - covered_in(C_{k-1}) in each window."""
    lo = np.atleast_1d(np.asarray(lo, np.float64))
    hi = np.atleast_1d(np.asarray(hi, np.float64))
    if unions is None:
        unions = cumulative_unions(trace)
    out: Dict[str, np.ndarray] = {}
    prev = np.zeros(len(lo))
    for cat in CATEGORIES[:-1]:
        now = iv.covered_in(unions[cat], lo, hi)
        out[cat] = np.maximum(now - prev, 0.0)
        prev = np.maximum(now, prev)
    total = hi - lo
    out["other"] = np.maximum(total - prev, 0.0)
    return Partition(us=out, total=total)


def step_breakdown(trace: TraceData, steps: Steps, part: Optional[Partition] = None) -> dict:
    """Breakdown of the included (stretched) steps.

    Returns ``{"avg_step_us", "breakdown_us": {cat: µs averaged over steps},
    "breakdown_pct": {cat: 100 * µs / avg_step_us}, "breakdown_per_step":
    [{"step", "total_us", <cat>: µs, ...}]}`` with the categories of CATEGORIES.
    With no included step, values are None.
    """
    lo, hi = steps.inc_start, steps.inc_end
    if len(lo) == 0:
        return {"avg_step_us": None, "breakdown_us": {c: None for c in CATEGORIES},
                "breakdown_pct": {c: None for c in CATEGORIES}, "breakdown_per_step": []}
    p = part if part is not None else partition(trace, lo, hi)
    avg = float(p.total.mean())
    us = {c: float(p.us[c].mean()) for c in CATEGORIES}
    pct = {c: (100.0 * us[c] / avg if avg > 0 else 0.0) for c in CATEGORIES}
    per_step: List[dict] = []
    for i, n in enumerate(steps.inc_numbers):
        row = {"step": int(n), "total_us": float(p.total[i])}
        row.update({c: float(p.us[c][i]) for c in CATEGORIES})
        per_step.append(row)
    return {"avg_step_us": avg, "breakdown_us": us, "breakdown_pct": pct, "breakdown_per_step": per_step}


# ---------------------------------------------------------------- metric unit (analysis/units.py)

FIELDS = {"avg_step_us": None, "breakdown_us": None, "breakdown_pct": None, "breakdown_per_step": []}


def span_unions(span) -> Dict[str, iv.Intervals]:
    """The span's ``cumulative_unions``, computed once per span (the partition and the
    step timeline's idle causes both cut them)."""
    return span.once("category_unions", lambda: cumulative_unions(span.trace))


def span_partition(span) -> Partition:
    """The priority partition of the span's included steps, computed once per span."""
    found = span.found
    return span.once("partition", lambda: partition(span.trace, found.inc_start, found.inc_end,
                                                    span_unions(span)))


def _unit_compute(span):
    if not span.found.count:
        span.not_available["breakdown_pct"] = "no included step"
        return None
    section = step_breakdown(span.trace, span.found, span_partition(span))
    if not span.extras.get("timeline"):
        # the unions' only other reader is the step timeline's store: without it, they are done
        # (7 MB on the 292 MB benchmark, held through every later unit otherwise)
        span.release("category_unions")
    return section


def _unit_partial(report: dict) -> dict:
    span, worker = report.get("span"), report.get("worker")
    return {"rows:per_step": [dict(s, span=span, worker=worker) for s in (report.get("breakdown_per_step") or [])
                              if isinstance(s, dict)]}


def _unit_finish(m: dict) -> dict:
    from .units import pct, per_step_across_spans, total

    per_step = m["rows:per_step"]
    n = len(per_step)
    if not n:
        return {"breakdown_us": None, "breakdown_pct": None, "avg_step_us": None, "breakdown_per_step": per_step}
    step_total = total(s.get("total_us") for s in per_step)
    sums = {c: total(s.get(c, 0.0) for s in per_step) for c in CATEGORIES}
    return {"breakdown_us": {c: v / n if v is not None else None for c, v in sums.items()},
            "breakdown_pct": {c: pct(v, step_total) for c, v in sums.items()},
            "avg_step_us": step_total / n if step_total is not None else None,
            # one row per step number across the spans (mean, min/max total, the slowest
            # span's worker): bounded by steps, not spans × steps (METRICS.md §2)
            "breakdown_per_step": per_step_across_spans(per_step, ("total_us",) + CATEGORIES, "total_us")}


def _unit():
    from .units import LOWER, NONE_FAILED, Metric, Unit, path

    metrics = (Metric("avg_step_us", "Avg step time", "us", LOWER, path("avg_step_us"), ("steps", "breakdown_pct"),
                      text=False, order=0),)
    return Unit("breakdown", _unit_compute, _unit_partial, _unit_finish, requires=("steps",), fields=FIELDS,
                group=NONE_FAILED, metrics=metrics)


UNIT = _unit()
