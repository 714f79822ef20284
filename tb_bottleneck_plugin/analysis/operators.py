"""Per-name tables of CPU operators and GPU kernels inside the included steps
(METRICS.md §11), the inputs of the run comparison's operator and kernel diffs.

``operator_table(trace, steps)`` returns sums over all included (stretched) steps, not
per-step values, so that span tables combine by plain addition (``combine_tables``) and
a comparison divides by the step count at the end:

    {"steps": n, "ops": [{name, calls, total_us, self_us, top_level_calls, top_level_us}],
     "kernels": [{name, calls, total_us}], "ops_left_out": k, "kernels_left_out": k}

Raw names are kept; the comparison normalises them (compare.normalise_kernel_name).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, TraceData
from .steps import Steps

# Rows kept per table, largest total time first (a table this long is a long tail
# of one-off names; the comparison marks names beyond it as unknown, not vanished).
MAX_ROWS = 2000


def operator_table(trace: TraceData, steps: Steps) -> dict:
    """CPU operators and GPU kernels per raw name, summed over the included steps."""
    n = steps.count
    out = {"steps": n, "ops": [], "kernels": [], "ops_left_out": 0, "kernels_left_out": 0}
    if n == 0:
        return out
    order = np.argsort(steps.inc_start, kind="stable")
    lo = np.asarray(steps.inc_start, np.float64)[order]
    hi = np.maximum(np.asarray(steps.inc_end, np.float64)[order], lo)
    out["ops"], out["ops_left_out"] = _op_rows(trace, lo, hi)
    out["kernels"], out["kernels_left_out"] = _kernel_rows(trace, lo, hi)
    return out


def _covered_upto(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the (disjoint, sorted) windows [lo, hi] before each time t."""
    cum = np.concatenate([[0.0], np.cumsum(hi - lo)])
    i = np.searchsorted(lo, t, side="right") - 1
    ic = np.maximum(i, 0)
    inside = np.clip(t - lo[ic], 0.0, hi[ic] - lo[ic])
    return np.where(i < 0, 0.0, cum[ic] + inside)


def _overlap(lo, hi, start, end) -> np.ndarray:
    """Each interval's length inside the windows."""
    return np.maximum(_covered_upto(lo, hi, end) - _covered_upto(lo, hi, start), 0.0)


def _starts_inside(lo, hi, t) -> np.ndarray:
    i = np.searchsorted(lo, t, side="right") - 1
    ic = np.maximum(i, 0)
    return (i >= 0) & (t < hi[ic])


def _op_rows(trace: TraceData, lo, hi):
    cpu = trace.cpu
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    rows = np.flatnonzero(((cpu.kind == CPU_OP) | (cpu.kind == CPU_USER_ANNOTATION))
                          & ~np.isin(cpu.name, step_ids))
    if len(rows) == 0:
        return [], 0
    ts = cpu.ts[rows]
    dur = np.maximum(np.nan_to_num(cpu.dur[rows], nan=0.0), 0.0)
    end = ts + dur
    depth, parent = _nesting(cpu.pid[rows], cpu.tid[rows], ts, end)
    ov = _overlap(lo, hi, ts, end)
    # Self time: the op's time in the steps minus its direct children's (cut at its end).
    child = np.flatnonzero(parent >= 0)
    p = parent[child]
    child_ov = _overlap(lo, hi, ts[child], np.minimum(end[child], end[p]))
    self_ov = np.maximum(ov - np.bincount(p, weights=child_ov, minlength=len(rows)), 0.0)
    calls = _starts_inside(lo, hi, ts)
    top = depth == 0
    names, inv = np.unique(cpu.name[rows], return_inverse=True)
    inv = inv.reshape(-1)
    k = len(names)
    table = {
        "calls": np.bincount(inv, weights=calls.astype(np.float64), minlength=k),
        "total_us": np.bincount(inv, weights=ov, minlength=k),
        "self_us": np.bincount(inv, weights=self_ov, minlength=k),
        "top_level_calls": np.bincount(inv, weights=(calls & top).astype(np.float64), minlength=k),
        "top_level_us": np.bincount(inv, weights=np.where(top, ov, 0.0), minlength=k),
    }
    keep = np.flatnonzero((table["calls"] > 0) | (table["total_us"] > 0))
    keep = keep[np.argsort(-table["total_us"][keep], kind="stable")]
    left_out = max(0, len(keep) - MAX_ROWS)
    out = []
    for g in keep[:MAX_ROWS]:
        out.append({"name": trace.strings[int(names[g])], "calls": int(table["calls"][g]),
                    "total_us": float(table["total_us"][g]), "self_us": float(table["self_us"][g]),
                    "top_level_calls": int(table["top_level_calls"][g]),
                    "top_level_us": float(table["top_level_us"][g])})
    return out, left_out


def _nesting(pid, tid, ts, end):
    """Depth (0 = not inside another op of the set on its thread) and direct parent
    (index, -1 for none) of each interval. Intervals on one thread are assumed to nest
    (as the profiler writes them); an interval starting exactly when another ends is
    not inside it. Zero-length intervals get a depth but are nobody's parent."""
    n = len(ts)
    depth = np.zeros(n, np.int64)
    parent = np.full(n, -1, np.int64)
    threads = np.unique(np.stack([pid, tid], 1), axis=0, return_inverse=True)[1].reshape(-1)
    for t in np.unique(threads):
        idx = np.flatnonzero(threads == t)
        pos_mask = end[idx] > ts[idx]
        full = idx[pos_mask]
        zero = idx[~pos_mask]
        # Positive-length ops in (start, longest first) order: each op's ancestors are
        # the earlier ones still open at its start.
        o = full[np.lexsort((-end[full], ts[full]))]
        ends_sorted = np.sort(end[o])
        d_full = np.arange(len(o)) - np.searchsorted(ends_sorted, ts[o], side="right")
        depth[o] = d_full
        if len(zero):
            starts_sorted = np.sort(ts[o])
            depth[zero] = (np.searchsorted(starts_sorted, ts[zero], side="right")
                           - np.searchsorted(ends_sorted, ts[zero], side="right"))
        # Parent: the nearest earlier op one level up (sort by (depth, position)).
        pos = np.arange(len(o))
        key_order = np.lexsort((pos, d_full))
        kd, kp = d_full[key_order], pos[key_order]
        has = d_full > 0
        if has.any():
            want = d_full[has] - 1
            j = _last_before(kd, kp, want, pos[has], np.searchsorted(kd, want, side="left"))
            ok = j >= 0
            parent[o[has][ok]] = o[kp[j[ok]]]
    return depth, parent


def _last_before(kd, kp, want_depth, want_pos, depth_start) -> np.ndarray:
    """Index into (kd, kp) of the entry with depth ``want_depth`` and the largest
    position below ``want_pos``; -1 if none. Entries are sorted by (depth, position),
    so one search over depth * big + position finds it; ``depth_start`` is where each
    wanted depth's run begins."""
    big = int(kp.max()) + 1 if len(kp) else 1
    j = np.searchsorted(kd * big + kp, want_depth * big + want_pos, side="left") - 1
    return np.where(j >= depth_start, j, -1)


def _kernel_rows(trace: TraceData, lo, hi):
    gpu = trace.gpu
    rows = np.flatnonzero(gpu.kind == GPU_KERNEL)
    if len(rows) == 0:
        return [], 0
    ts = gpu.ts[rows]
    end = ts + np.maximum(np.nan_to_num(gpu.dur[rows], nan=0.0), 0.0)
    ov = _overlap(lo, hi, ts, end)
    calls = _starts_inside(lo, hi, ts)
    names, inv = np.unique(gpu.name[rows], return_inverse=True)
    inv = inv.reshape(-1)
    k = len(names)
    n_calls = np.bincount(inv, weights=calls.astype(np.float64), minlength=k)
    total = np.bincount(inv, weights=ov, minlength=k)
    keep = np.flatnonzero((n_calls > 0) | (total > 0))
    keep = keep[np.argsort(-total[keep], kind="stable")]
    left_out = max(0, len(keep) - MAX_ROWS)
    return [{"name": trace.strings[int(names[g])], "calls": int(n_calls[g]), "total_us": float(total[g])}
            for g in keep[:MAX_ROWS]], left_out


def combine_tables(tables: List[dict]) -> dict:
    """A worker/run table from span tables: sums per name, steps added up."""
    if not tables or any(not t for t in tables):
        return None  # a span without a table (older cache entry): no table rather than a partial one
    out = {"steps": sum(t.get("steps") or 0 for t in tables), "ops": [], "kernels": [],
           "ops_left_out": sum(t.get("ops_left_out") or 0 for t in tables),
           "kernels_left_out": sum(t.get("kernels_left_out") or 0 for t in tables)}
    for key in ("ops", "kernels"):
        merged: Dict[str, dict] = {}
        for t in tables:
            for row in t.get(key) or []:
                m = merged.get(row["name"])
                if m is None:
                    merged[row["name"]] = dict(row)
                else:
                    for field_name, value in row.items():
                        if field_name != "name":
                            m[field_name] = (m.get(field_name) or 0) + (value or 0)
        out[key] = sorted(merged.values(), key=lambda r: -r["total_us"])
    return out
