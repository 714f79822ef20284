"""Kernel occupancy (metrics.md §6), vectorised.

``est. achieved occupancy %`` is what Kineto computed at trace time with the CUDA
occupancy calculator (``cudaOccMaxActiveBlocksPerMultiprocessor``) for each launch:
``round(100 * min(theoretical active blocks per SM, blocks per SM) * threads per block
/ maxThreadsPerMultiprocessor)``. It is a *theoretical* figure for the launch
configuration, not a hardware measurement (the UI must say so).

Public API
----------
- ``kernel_occupancy(trace, window=None, top_n=200, not_available=None)`` -> dict with keys
  ``est_achieved_occupancy_pct``, ``per_device``, ``histogram``, ``grid_too_small_pct``,
  ``short_kernels``, ``kernels``, ``weighted_kernel_us``, ``kernel_names`` (per-name totals,
  ``kernel_name_totals``); reasons go into ``not_available`` under the report's keys
  (``occupancy.<metric>``; analysis/units.py).
- ``UNIT``: the metric unit (analysis/units.py); ``combine_kernel_rows`` merges kernel
  tables of several spans.

The occupancy calculator itself (cuda_occupancy.h's rules) is in analysis/occupancy_calculator.py.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import GPU_KERNEL, TraceData
from . import factorize
from .accelerators import no_gpu_reason
from .occupancy_calculator import calculator_estimate, calculator_properties, occupancy_calculator, prop_int

SHORT_KERNEL_US = T.SHORT_KERNEL_US  # metrics §6 "short kernels"
HISTOGRAM_EDGES = (0.0, 10.0, 25.0, 50.0, 75.0, 100.0)  # last bucket closed: [75,100]
# Names in Kineto's nested occupancy object -> ours.
_KINETO_FACTORS = {"WARPS": "warps", "REGS": "registers", "REGISTERS": "registers", "SMEM": "shared_memory",
                   "SHARED_MEMORY": "shared_memory", "BLOCKS": "blocks", "BARRIERS": "barriers"}


# occupancy_source of a kernel's shown est. achieved occupancy (metrics §6).
SOURCE_NONE, SOURCE_KINETO, SOURCE_CALCULATOR = 0, 1, 2
SOURCE_NAMES = {SOURCE_NONE: None, SOURCE_KINETO: "kineto", SOURCE_CALCULATOR: "calculator"}
# Kineto writes a whole percent: a true estimate below this rounds to its 0.
KINETO_ROUNDS_TO_ZERO_PCT = 0.5


def device_properties(trace: TraceData) -> Dict[int, dict]:
    """deviceProperties by device id; entries whose ``id`` is not an integer use their
    position (never raises on a malformed entry)."""
    out: Dict[int, dict] = {}
    for i, p in enumerate(trace.meta.device_properties or []):
        if not isinstance(p, dict):
            continue
        pid = p.get("id", i)
        if isinstance(pid, bool) or not isinstance(pid, (int, np.integer)) or not -(1 << 31) <= pid < (1 << 31):
            pid = i
        out.setdefault(int(pid), p)
    return out


def shown_occupancy(trace: TraceData, kineto_only: bool = False) -> Tuple[np.ndarray, np.ndarray, Dict[int, str]]:
    """The est. achieved occupancy % the plugin shows per row of ``trace.gpu``
    (metrics §6): Kineto's value where Kineto computed one; the calculator's
    (``calculator_estimate``) where Kineto's is missing or negative, or is 0 although
    the calculator's estimate is >= ``KINETO_ROUNDS_TO_ZERO_PCT`` (Kineto called the
    calculator with the default 48 KB per-block shared memory, so a kernel that opted in
    to more got 0 resident blocks; a kernel that ran had at least one).

    Returns ``(pct, source, reasons)``: pct NaN where unknown (and for non-kernels);
    source SOURCE_*; reasons: device id -> why the calculator could not run there.
    ``kineto_only``: Kineto's values alone (torch-tb-profiler's view)."""
    g = trace.gpu
    kin = g.achieved_occupancy_pct
    is_k = g.kind == GPU_KERNEL
    has_kin = is_k & np.isfinite(kin) & (kin >= 0)
    pct = np.where(has_kin, kin, np.nan)
    source = np.where(has_kin, SOURCE_KINETO, SOURCE_NONE).astype(np.int8)
    reasons: Dict[int, str] = {}
    if kineto_only:
        return pct, source, reasons
    # Artefacts (issue 20 item 7; kernel_occupancy names them in not_available): a share above
    # 100 % is no occupancy, and a 0 % on a kernel without launch parameters (no block size)
    # is Kineto's default, not a value: both unknown unless the calculator answers below.
    bad = occupancy_artefacts(trace)
    has_kin &= ~(bad["over_100"] | bad["zero_no_launch"])
    pct = np.where(has_kin, kin, np.nan)
    source = np.where(has_kin, SOURCE_KINETO, SOURCE_NONE).astype(np.int8)
    want = is_k & (~has_kin | (kin == 0))
    if not want.any() or _is_rocm(trace):
        return pct, source, reasons
    props_by_id = device_properties(trace)
    threads = _threads(g)
    grid_blocks = np.where((g.grid_x > 0) & (g.grid_y > 0) & (g.grid_z > 0),
                           np.clip(g.grid_x, 0, 1 << 31).astype(np.float64) * np.clip(g.grid_y, 0, 1 << 31)
                           * np.clip(g.grid_z, 0, 1 << 31), np.nan)
    for d in np.unique(g.device[want]):
        rows = np.flatnonzero(want & (g.device == d))
        props = props_by_id.get(int(d))
        p, reason = calculator_properties(props)
        if p is None:
            reasons[int(d)] = reason
            continue
        est = calculator_estimate(props, threads[rows], g.registers_per_thread[rows], g.shared_memory[rows],
                                  blocks_per_sm(g)[rows], grid_blocks[rows])
        kr = kin[rows]
        use = np.isfinite(est) & (~has_kin[rows] | ((kr == 0) & (est >= KINETO_ROUNDS_TO_ZERO_PCT)))
        pct[rows[use]] = est[use]
        source[rows[use]] = SOURCE_CALCULATOR
    return pct, source, reasons


LARGE_SHARED_MEMORY_BYTES = 48 * 1024  # the per-block default Kineto's calculator assumes


def occupancy_artefacts(trace: TraceData) -> Dict[str, np.ndarray]:
    """Kernel rows whose Kineto occupancy is an artefact: ``over_100`` (above 100 %),
    ``zero_no_launch`` (0 % on a kernel without a block size: nothing was computed),
    ``zero_large_smem`` (0 % on a kernel using more than 48 KiB of shared memory: what
    Kineto writes for every kernel that opted in to more, metrics.md §6)."""
    g = trace.gpu
    kin = g.achieved_occupancy_pct
    is_k = (g.kind == GPU_KERNEL) & np.isfinite(kin)
    zero = is_k & (kin == 0)
    threads = _threads(g)
    return {"over_100": is_k & (kin > 100.0), "zero_no_launch": zero & (threads <= 0),
            "zero_large_smem": zero & (threads > 0) & (g.shared_memory > LARGE_SHARED_MEMORY_BYTES)}


def _artefact_notes(trace: TraceData, source: np.ndarray, calc_reasons: Dict[int, str],
                    not_available: Dict[str, str]) -> None:
    """The occupancy artefacts a trace holds, in ``not_available`` (one key each): said, not
    shown as numbers (METRICS.md §6)."""
    bad = occupancy_artefacts(trace)
    n = int(bad["over_100"].sum())
    if n:
        not_available["occupancy.kineto_over_100"] = (
            f"{n:,} kernel launch(es) carry an est. achieved occupancy above 100 % (e.g. "
            f"{float(trace.gpu.achieved_occupancy_pct[bad['over_100']][0]):g} %), not a share: n/a unless the "
            "occupancy calculator recomputed them")
    n = int((bad["zero_no_launch"] & (source != SOURCE_CALCULATOR)).sum())
    if n:
        not_available["occupancy.kineto_zero_without_launch"] = (
            f"{n:,} kernel launch(es) without launch parameters (no block size) carry 0 % occupancy: "
            "Kineto's default, not a value: n/a, not 0")
    # kept where the calculator could not run (where it ran and also found ~0, the 0 is real)
    no_calc = np.isin(trace.gpu.device, np.array(sorted(calc_reasons), dtype=np.int64))
    kept = bad["zero_large_smem"] & (source == SOURCE_KINETO) & no_calc
    n = int(kept.sum())
    if n:
        why = ("the trace has no deviceProperties" if not device_properties(trace)
               else "; ".join(sorted(set(calc_reasons.values()))))
        not_available["occupancy.kineto_zero_large_shared_memory"] = (
            f"{n:,} kernel launch(es) using more than 48 KiB of shared memory read Kineto's 0 %, which it writes "
            f"for every kernel that opted in to more; the occupancy calculator cannot check them ({why}), so "
            "their 0 % is kept")


def blocks_per_sm(g) -> np.ndarray:
    """Kineto's ``blocks per SM`` per GPU row; where it is missing (2021 traces carry only
    ``warps per SM`` = blocks per SM × threads per block / 32, trace-format §6) it is derived
    back as warps per SM × 32 / threads per block; NaN where neither is known. Read-only:
    remembered on the table (the GPU and occupancy units ask five times; tables are read-only
    once loaded), as long as it holds the same blocks-per-SM column."""
    memo = getattr(g, "__dict__", {}).get("_blocks_per_sm")
    if memo is not None and memo[0] is g.blocks_per_sm and len(memo[1]) == len(g.blocks_per_sm):
        return memo[1]
    out = _blocks_per_sm(g)
    if hasattr(g, "__dict__"):
        g.__dict__["_blocks_per_sm"] = (g.blocks_per_sm, out)
    return out


def _blocks_per_sm(g) -> np.ndarray:
    b = np.asarray(g.blocks_per_sm, dtype=np.float64)
    warps = np.asarray(getattr(g, "warps_per_sm", np.full(len(b), np.nan)), dtype=np.float64)
    missing = ~np.isfinite(b) & np.isfinite(warps) & (warps > 0)
    if not missing.any():
        return b
    threads = _threads(g).astype(np.float64)
    derived = np.where(threads > 0, warps * 32.0 / np.where(threads > 0, threads, 1.0), np.nan)
    return np.where(missing, derived, b)


def _threads(g) -> np.ndarray:
    """Threads per block per GPU row; -1 where the block dims are not all positive."""
    ok = (g.block_x > 0) & (g.block_y > 0) & (g.block_z > 0)
    bx, by, bz = (np.clip(a, 0, 1 << 20) for a in (g.block_x, g.block_y, g.block_z))
    t = bx * by * bz
    return np.where(ok & (t <= 1 << 20), t, -1)


def clipped_weights(ts: np.ndarray, dur: np.ndarray, window: Optional[Tuple[float, float]]) -> np.ndarray:
    """Each interval's length inside the window (its full length when window is None)."""
    if window is None or not np.all(np.isfinite(window)):
        return dur.astype(np.float64)
    lo, hi = window
    return np.maximum(np.minimum(ts + dur, hi) - np.maximum(ts, lo), 0.0)


def _is_rocm(trace: TraceData) -> bool:
    props = trace.meta.device_properties
    return any(isinstance(p, dict) and (prop_int(p, "warpSize") == 64 or "maxSharedMemoryPerMultiProcessor" in p
                                        or "AMD" in str(p.get("name", ""))) for p in props or [])


is_rocm = _is_rocm  # public: analysis/devices.py names ROCm devices by it


NA_OUT_OF_RANGE = "the kernels' durations add up beyond the float range (absurd 'dur' values)"


def _not_available_reason(trace: TraceData, has_kernels: bool, calc_reasons: Optional[Dict[int, str]] = None) -> str:
    if not has_kernels:  # another accelerator's trace (MTIA, XPU) is named as such
        return no_gpu_reason(trace, "no GPU kernels in the trace (CPU-only)")
    if _is_rocm(trace):
        return "trace has no occupancy fields (ROCm kernels carry no registers, shared memory or occupancy)"
    k = trace.gpu.kind == GPU_KERNEL
    if not np.isfinite(blocks_per_sm(trace.gpu)[k]).any():
        return "trace has no occupancy fields (kernels have no 'blocks per SM'/'est. achieved occupancy %': 2020 format)"
    if not np.isfinite(trace.gpu.achieved_occupancy_pct[k]).any():  # 'warps per SM' only (2020/2021)
        return ("kernels carry no 'est. achieved occupancy %' (2020 format)" + (
            "; the occupancy calculator cannot run: " + "; ".join(f"device {d}: {r}" for d, r in sorted(calc_reasons.items()))
            if calc_reasons else ""))
    if calc_reasons:
        return "; ".join(f"device {d}: {r}" for d, r in sorted(calc_reasons.items()))
    return "no kernel with 'est. achieved occupancy %' inside the steps window"


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> Optional[float]:
    """Σ v·w / Σ w (None when Σ w is not positive). Absurd weights (a kernel `dur` of 1e308
    µs) overflow the products: then the same mean over the weights divided by their
    largest, never a numpy warning or an infinite value; None when even that is not finite."""
    with np.errstate(over="ignore", invalid="ignore"):
        tot = float(weights.sum())
        if not tot > 0:
            return None
        mean = float((values * weights).sum() / tot)
        if np.isfinite(mean) and np.isfinite(tot):
            return mean
        scale = float(weights.max())
        if not (np.isfinite(scale) and scale > 0):
            return None
        scaled = weights / scale
        mean = float((values * scaled).sum() / scaled.sum())
    return mean if np.isfinite(mean) else None


_wmean = weighted_mean


def share_pct(part: float, whole: float) -> float:
    """100 · part / whole (Python floats), computed as always; where 100 · part overflows
    (absurd durations: part near 1.8e308 µs) as 100 · (part / whole) instead. Not finite
    when part or whole is not (the report shows it as unknown)."""
    value = 100.0 * part / whole
    if not math.isfinite(value) and math.isfinite(part) and math.isfinite(whole):
        value = 100.0 * (part / whole)
    return value


def kernel_occupancy(trace: TraceData, window: Optional[Tuple[float, float]] = None,
                     top_n: int = 200, kineto_only: bool = False, shown=None,
                     not_available: Optional[Dict[str, str]] = None) -> Dict:
    """§6 over all devices, kernels weighted by their duration clipped to ``window``
    (the steps window; None = whole trace). The occupancy per kernel is
    ``shown_occupancy`` (``kineto_only``: Kineto's values alone, torch-tb-profiler's
    view; ``shown``: ``shown_occupancy``'s result when the caller already has it). A value
    that has no answer is None (or empty), its reason in ``not_available`` as
    ``occupancy.<metric>``.

    Absurd durations (several kernels of 1e308 µs) overflow sums of µs to inf: no numpy
    warning; such a sum is not finite, so the report shows it as unknown (report._clean),
    and a share of it is 0 (a finite part of more than 1.8e308 µs) or unknown, never wrong;
    the mean occupancy is exact (`weighted_mean`)."""
    if not_available is None:
        not_available = {}
    with np.errstate(over="ignore", invalid="ignore"):
        return _kernel_occupancy(trace, window, top_n, kineto_only, shown, not_available)


def _kernel_occupancy(trace: TraceData, window, top_n: int, kineto_only: bool, shown,
                      not_available: Dict[str, str]) -> Dict:
    gpu = trace.gpu
    krows = np.flatnonzero(gpu.kind == GPU_KERNEL)
    out: Dict = {"est_achieved_occupancy_pct": None, "per_device": {}, "histogram": [],
                 "grid_too_small_pct": None, "short_kernels": None, "kernels": [],
                 "weighted_kernel_us": 0.0, "kernel_names": {"rows": [], "left_out": 0}}
    if len(krows) == 0:
        reason = _not_available_reason(trace, False)
        for metric in ("est_achieved_occupancy_pct", "grid_too_small_pct", "short_kernels", "kernels"):
            not_available[f"occupancy.{metric}"] = reason
        return out
    w_all = clipped_weights(gpu.ts[krows], gpu.dur[krows], window)
    sel = w_all > 0
    krows, w = krows[sel], w_all[sel]
    out["weighted_kernel_us"] = float(w.sum())
    if not np.isfinite(out["weighted_kernel_us"]):  # absurd durations (several of 1e308 µs)
        out["weighted_kernel_us"] = None
        not_available["occupancy.weighted_kernel_us"] = NA_OUT_OF_RANGE
    shown, source, calc_reasons = shown if shown is not None else shown_occupancy(trace, kineto_only)
    if not kineto_only:
        _artefact_notes(trace, source, calc_reasons, not_available)
    occ = shown[krows]
    src = source[krows]
    dev = gpu.device[krows]

    # Achieved occupancy: weighted mean over kernels with a shown value.
    has_occ = np.isfinite(occ) & (occ >= 0)
    if has_occ.any():
        out["calculator_kernel_time_pct"] = share_pct(float(w[src == SOURCE_CALCULATOR].sum()), float(w[has_occ].sum()))
    if has_occ.any():
        out["est_achieved_occupancy_pct"] = _wmean(occ[has_occ], w[has_occ])
        for d in np.unique(dev[has_occ]):
            m = has_occ & (dev == d)
            out["per_device"][str(int(d))] = _wmean(occ[m], w[m])
        tot = float(w[has_occ].sum())
        idx = np.clip(np.searchsorted(HISTOGRAM_EDGES, occ[has_occ], side="right") - 1, 0,
                      len(HISTOGRAM_EDGES) - 2)
        hist = np.bincount(idx, weights=w[has_occ], minlength=len(HISTOGRAM_EDGES) - 1)
        for i in range(len(HISTOGRAM_EDGES) - 1):
            lo, hi = HISTOGRAM_EDGES[i], HISTOGRAM_EDGES[i + 1]
            label = f"[{lo:g},{hi:g}]" if i == len(HISTOGRAM_EDGES) - 2 else f"[{lo:g},{hi:g})"
            out["histogram"].append({"bucket": label, "lo": lo, "hi": hi,
                                     "pct": share_pct(float(hist[i]), tot) if tot > 0 else 0.0,
                                     "us": float(hist[i])})
    else:
        reason = _not_available_reason(trace, True, calc_reasons)
        not_available["occupancy.est_achieved_occupancy_pct"] = reason
        not_available["occupancy.histogram"] = reason

    # Grid too small: numeric (finite) blocks per SM < 1.
    bps = blocks_per_sm(gpu)[krows]
    numeric = np.isfinite(bps)
    if numeric.any():
        out["grid_too_small_pct"] = share_pct(float(w[numeric & (bps < 1)].sum()), float(w[numeric].sum()))
    else:
        not_available["occupancy.grid_too_small_pct"] = _not_available_reason(trace, True)

    out["short_kernels"] = _short_kernels(trace, krows, w)
    out["kernels"] = _kernel_table(trace, krows, w, top_n, occ, src)
    out["kernel_names"] = kernel_name_totals(trace, krows, w)
    return out


KERNEL_NAMES_MAX = 5000  # names kept per span, largest time first (left_out counts the rest)


def kernel_name_totals(trace: TraceData, krows: np.ndarray, w: np.ndarray) -> Dict:
    """The kernel table's calls and times per kernel name alone (all devices and launch
    configurations pooled, the same clipped weights ``w``), for every name: the run
    comparison's kernel rows (METRICS §11), which the table's top 200 could not give.
    ``{"rows": [{name, calls, total_us}], "left_out": k}``; the result keeps it beside
    the table (report.py pops it out of the occupancy section)."""
    names, inv = factorize.unique_inverse(trace.gpu.name[krows])
    calls = np.bincount(inv, minlength=len(names))
    total = np.bincount(inv, weights=w, minlength=len(names))
    order = np.argsort(-total, kind="stable")
    return {"rows": [{"name": trace.strings[int(names[i])], "calls": int(calls[i]), "total_us": float(total[i])}
                     for i in order[:KERNEL_NAMES_MAX]],
            "left_out": max(0, len(order) - KERNEL_NAMES_MAX)}


def combine_kernel_names(parts: List[Optional[Dict]]) -> Optional[Dict]:
    """Spans' kernel_name_totals summed per name (None when a span has none: an older
    result; a total unknown in some span stays unknown). Per row only a dict lookup; the
    sums are numpy's, added in span and row order (the same numbers as row after row)."""
    if not parts or any(not isinstance(p, dict) for p in parts):
        return None
    rows, _ = _sum_by_first_seen((r["name"], r, int(r.get("calls") or 0), r.get("total_us"))
                                 for p in parts for r in p.get("rows") or [])
    key = np.array([-(r["total_us"] if r["total_us"] is not None else np.inf) for r in rows], np.float64)
    return {"rows": [rows[i] for i in np.argsort(key, kind="stable").tolist()],
            "left_out": sum(int(p.get("left_out") or 0) for p in parts)}


def _sum_by_first_seen(entries) -> Tuple[List[dict], np.ndarray]:
    """Rows grouped by key, in the order the keys are first seen: each group's first row
    (a copy) and, where a key stands more than once, its "calls" and "total_us" replaced
    by the group's sums (a total unknown in some entry stays unknown: None). ``entries``
    yields (key, row, calls, total_us). Per entry only a dict lookup; the sums are numpy's
    ``np.add.at``, added in entry order (the same numbers as row after row). Returns the
    rows and, per row, whether it was summed."""
    ids: Dict = {}
    first: List[dict] = []
    gid: List[int] = []
    calls: List[int] = []
    totals: List[float] = []
    for key, row, c, t in entries:
        g = ids.get(key)
        if g is None:
            g = ids[key] = len(first)
            first.append(row)
        gid.append(g)
        calls.append(c)
        totals.append(_finite_or_nan(t))
    g_arr = np.asarray(gid, np.int64)
    summed = np.bincount(g_arr, minlength=len(first)) > 1
    call_sum = np.zeros(len(first), np.int64)
    np.add.at(call_sum, g_arr, np.asarray(calls, np.int64))
    total_sum = np.zeros(len(first), np.float64)
    np.add.at(total_sum, g_arr, np.asarray(totals, np.float64))
    rows = []
    for i, r in enumerate(first):
        row = dict(r)
        if summed[i]:
            row["calls"] = int(call_sum[i])
            t = float(total_sum[i])
            row["total_us"] = t if t - t == 0 else None
        rows.append(row)
    return rows, summed


def _finite_or_nan(value) -> float:
    """A finite number as a float; anything else (None, a bool, text, NaN, inf) NaN, so
    that a sum it enters is unknown (units.total's rule)."""
    if type(value) is float or type(value) is int:
        return float(value) if value - value == 0 else np.nan
    from .units import num

    v = num(value)
    return np.nan if v is None else v


def _short_kernels(trace: TraceData, krows: np.ndarray, w: np.ndarray) -> Dict:
    gpu = trace.gpu
    dur = gpu.dur[krows]
    short = dur < SHORT_KERNEL_US
    # Gaps between consecutive kernels on a stream where both are short.
    order = np.lexsort((gpu.ts[krows], gpu.stream[krows], gpu.device[krows]))
    r = krows[order]
    s = short[order]
    same = (gpu.device[r][1:] == gpu.device[r][:-1]) & (gpu.stream[r][1:] == gpu.stream[r][:-1])
    both = same & s[1:] & s[:-1]
    gaps = np.maximum(gpu.ts[r][1:] - (gpu.ts[r][:-1] + gpu.dur[r][:-1]), 0.0)[both]
    total = float(w.sum())
    return {"threshold_us": SHORT_KERNEL_US, "count": int(short.sum()),
            "time_pct": share_pct(float(w[short].sum()), total) if total > 0 else 0.0,
            "mean_gap_us": float(gaps.mean()) if len(gaps) else None,
            "gap_count": int(len(gaps))}


def _kernel_table(trace: TraceData, krows: np.ndarray, w: np.ndarray, top_n: int,
                  occ: np.ndarray, src: np.ndarray) -> List[Dict]:
    """Kernels grouped by (device, name, grid, block, registers, shared memory); ``occ``
    and ``src`` are the shown occupancy and its source for each of ``krows``."""
    gpu = trace.gpu
    # (the columns as they are, not an (n, 10) stack: each is ranked contiguous)
    uniq, inv = factorize.unique_columns(gpu.device[krows].astype(np.int64), gpu.name[krows].astype(np.int64),
                                         gpu.grid_x[krows], gpu.grid_y[krows], gpu.grid_z[krows],
                                         gpu.block_x[krows], gpu.block_y[krows], gpu.block_z[krows],
                                         gpu.registers_per_thread[krows], gpu.shared_memory[krows])
    n = len(uniq)
    calls = np.bincount(inv, minlength=n)
    total = np.bincount(inv, weights=w, minlength=n)
    has = np.isfinite(occ) & (occ >= 0)
    calc_w = np.bincount(inv, weights=np.where(has & (src == SOURCE_CALCULATOR), w, 0.0), minlength=n)
    # per group Σ occ·w / Σ w; weights scaled by the largest when absurd durations (1e308 µs)
    # overflow the products (the same ratios, never a numpy warning or an infinite mean)
    with np.errstate(over="ignore", invalid="ignore"):
        occ_w = np.bincount(inv, weights=np.where(has, occ * w, 0.0), minlength=n)
        occ_den = np.bincount(inv, weights=np.where(has, w, 0.0), minlength=n)
        if len(w) and not (np.isfinite(occ_w).all() and np.isfinite(occ_den).all()):
            ws = w / float(w.max())
            occ_w = np.bincount(inv, weights=np.where(has, occ * ws, 0.0), minlength=n)
            occ_den = np.bincount(inv, weights=np.where(has, ws, 0.0), minlength=n)
    bps = blocks_per_sm(gpu)[krows]
    bps_ok = np.isfinite(bps)
    bps_sum = np.bincount(inv, weights=np.where(bps_ok, bps, 0.0), minlength=n)
    bps_cnt = np.bincount(inv, weights=bps_ok.astype(np.float64), minlength=n)
    lim_id = np.full(n, -1, dtype=np.int64)
    lim_id[inv] = gpu.occupancy_limit[krows]  # any call's nested object (same config)

    top = np.argsort(-total, kind="stable")[:top_n]
    uq = uniq[top]
    block_ok = (uq[:, 5] > 0) & (uq[:, 6] > 0) & (uq[:, 7] > 0)
    grid_ok = (uq[:, 2] > 0) & (uq[:, 3] > 0) & (uq[:, 4] > 0)
    threads = np.where(block_ok, np.clip(uq[:, 5], 0, 1 << 20) * np.clip(uq[:, 6], 0, 1 << 20)
                       * np.clip(uq[:, 7], 0, 1 << 20), -1)
    # Calculator per device (vectorised over the groups of that device).
    theo_blocks = np.full(len(top), -1, dtype=np.int64)
    theo_pct = np.full(len(top), np.nan)
    limiting = np.full(len(top), None, dtype=object)
    props_by_id = device_properties(trace)
    cuda_props = not _is_rocm(trace)
    valid = (threads > 0) & (threads <= 1 << 20) & (uq[:, 8] >= 0) & (uq[:, 9] >= 0)
    for d in np.unique(uq[:, 0]):
        props = props_by_id.get(int(d)) if cuda_props else None
        m = (uq[:, 0] == d) & valid
        if calculator_properties(props)[0] is None or not m.any():
            continue
        calc = occupancy_calculator(props, threads[m], uq[m, 8], uq[m, 9])
        theo_blocks[m] = calc["active_blocks"]
        theo_pct[m] = calc["theoretical_occupancy_pct"]
        limiting[m] = calc["limiting_factor"]
    grand = float(w.sum())
    from .tensor_cores import tensor_core_name_mask
    tc_names = tensor_core_name_mask(trace)
    rows = []
    for j, g in enumerate(top):
        k = uq[j]
        lim_source = "calculator" if limiting[j] is not None else None
        lim = limiting[j]
        # the trace's nested `occupancy` object, unless Kineto's calculator put 0 blocks on an
        # SM (its 0 % recomputed by ours: calc_w > 0) -- then its factor is the same artefact
        # ("shared_memory" at the 48 KiB default) and the calculator's factor stands
        if lim_id[g] >= 0 and not (calc_w[g] > 0 and limiting[j] is not None):
            raw = trace.strings[int(lim_id[g])]
            lim = "+".join(_KINETO_FACTORS.get(x.strip().upper(), x.strip().lower())
                           for x in raw.replace(",", "|").split("|") if x.strip())
            lim_source = "trace"
        rows.append({
            "name": trace.strings[int(k[1])], "device": int(k[0]), "calls": int(calls[g]),
            "total_us": float(total[g]), "mean_us": float(total[g] / calls[g]),
            "time_pct": share_pct(float(total[g]), grand) if grand > 0 else 0.0,
            # ROCm writes -1 for dims it does not know: no grid/block then, not [-1,-1,-1].
            "grid": [int(x) for x in k[2:5]] if grid_ok[j] else None,
            "block": [int(x) for x in k[5:8]] if block_ok[j] else None,
            "registers_per_thread": int(k[8]) if k[8] >= 0 else None,
            "shared_memory_bytes": int(k[9]) if k[9] >= 0 else None,
            "blocks_per_sm": float(bps_sum[g] / bps_cnt[g]) if bps_cnt[g] > 0 else None,
            "est_achieved_occupancy_pct": float(occ_w[g] / occ_den[g]) if occ_den[g] > 0 else None,
            # The config is the same for every call of a group, so one source per group;
            # "calculator" when any call needed the calculator (Kineto's value was 0 or missing).
            "occupancy_source": (("calculator" if calc_w[g] > 0 else "kineto") if occ_den[g] > 0 else None),
            "theoretical_blocks_per_sm": int(theo_blocks[j]) if theo_blocks[j] >= 0 else None,
            "theoretical_occupancy_pct": float(theo_pct[j]) if np.isfinite(theo_pct[j]) else None,
            "limiting_factor": lim, "limiting_factor_source": lim_source,
            "tensor_core": bool(tc_names[int(k[1])]),
        })
    return rows


def occupancy_without(occ_section: dict, names) -> Optional[float]:
    """Time-weighted est. achieved occupancy (%) of the kernel table's rows (the top
    launch configurations by time) whose kernel name is not in ``names``; None when no
    such row has an occupancy."""
    num = den = 0.0
    for row in (occ_section or {}).get("kernels") or []:
        v, t = row.get("est_achieved_occupancy_pct"), row.get("total_us")
        if row.get("name") in names or not isinstance(v, (int, float)) or not isinstance(t, (int, float)):
            continue
        num += v * t
        den += t
    return num / den if den > 0 else None


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def span_shown_occupancy(span):
    """``shown_occupancy(trace)`` once per span (the GPU and occupancy units share it)."""
    return span.once("shown_occupancy", lambda: shown_occupancy(span.trace))


def _unit_compute(span) -> dict:
    found = span.found
    occ = kernel_occupancy(span.trace, found.window if found.count else None, shown=span_shown_occupancy(span),
                           not_available=span.not_available)
    span.extras["kernel_names"] = occ.pop("kernel_names")  # beside the report, not in it (report.py)
    return occ


def _unit_partial(report: dict) -> dict:
    from .units import num, total, weighted_pair

    occ = report.get("occupancy") or {}
    w = num(occ.get("weighted_kernel_us")) or 0.0
    out = {"sum:weighted_kernel_us": w,
           "wmean:est_achieved_occupancy_pct": weighted_pair(occ.get("est_achieved_occupancy_pct"), w),
           "wmean:grid_too_small_pct": weighted_pair(occ.get("grid_too_small_pct"), w),
           "keyed:per_device": {str(d): {"wmean:pct": weighted_pair(v, w)} for d, v in (occ.get("per_device") or {}).items()},
           "keyed:histogram": {}}
    for b in occ.get("histogram") or []:
        if isinstance(b, dict):
            out["keyed:histogram"].setdefault(str(b.get("bucket")), {"first:row": b, "sum:us": 0.0})
            h = out["keyed:histogram"][str(b.get("bucket"))]
            h["sum:us"] = total([h["sum:us"], num(b.get("us")) or 0.0])
    short = occ.get("short_kernels")
    if isinstance(short, dict):
        out.update({"first:short.threshold_us": short.get("threshold_us"), "sum:short.count": short.get("count") or 0,
                    "wmean:short.time_pct": weighted_pair(short.get("time_pct"), w),
                    "wmean:short.mean_gap_us": weighted_pair(short.get("mean_gap_us"), short.get("gap_count")),
                    "sum:short.gap_count": short.get("gap_count") or 0})
    return out


def _unit_finish(m: dict) -> dict:
    from .units import num, wmean

    out = {"est_achieved_occupancy_pct": wmean(m["wmean:est_achieved_occupancy_pct"]),
           "grid_too_small_pct": wmean(m["wmean:grid_too_small_pct"]),
           "weighted_kernel_us": m["sum:weighted_kernel_us"],
           "per_device": {d: wmean(v["wmean:pct"]) for d, v in m["keyed:per_device"].items()}}
    buckets = [dict(h["first:row"], us=h["sum:us"]) for h in m["keyed:histogram"].values()]
    hist_total = sum(b["us"] for b in buckets)
    out["histogram"] = [dict(b, pct=100.0 * b["us"] / hist_total if hist_total else 0.0)
                        for b in sorted(buckets, key=lambda b: num(b.get("lo")) or 0.0)]
    if "sum:short.count" in m:
        out["short_kernels"] = {"threshold_us": m["first:short.threshold_us"],
                                "count": int(m["sum:short.count"] or 0),
                                "time_pct": wmean(m["wmean:short.time_pct"]),
                                "mean_gap_us": wmean(m["wmean:short.mean_gap_us"]),
                                "gap_count": int(m["sum:short.gap_count"] or 0)}
    else:
        out["short_kernels"] = None
    return out


def combine_kernel_rows(tables: List[List[Dict]]) -> List[Dict]:
    """One row per kernel configuration over several spans' kernel tables; a total that is
    unknown in some span stays unknown. Per row a key and a dict lookup; the sums are
    numpy's, added in span and row order (the same numbers as row after row)."""
    import math

    from .units import num, pct, total

    def entries():
        for table in tables:
            for k in table:
                if not isinstance(k, dict):
                    continue
                # the configuration's values as the key (grid/block lists as tuples): half the
                # cost of six str() per row, which was most of a 1,000-span summary's kernel merge
                g, b = k.get("grid"), k.get("block")
                key = (k.get("name"), k.get("device"), tuple(g) if type(g) is list else g,
                       tuple(b) if type(b) is list else b, k.get("registers_per_thread"), k.get("shared_memory_bytes"))
                try:
                    hash(key)
                except TypeError:  # a value nobody wrote (a dict, nested lists): its text, as before
                    key = tuple(map(str, key))
                c = k.get("calls")
                yield key, k, int(c) if type(c) is int else int(num(c) or 0), k.get("total_us")

    rows, summed = _sum_by_first_seen(entries())
    for row, s in zip(rows, summed.tolist()):
        if s:
            row["mean_us"] = row["total_us"] / row["calls"] if row["calls"] and row["total_us"] is not None \
                else None
    grand = total(r.get("total_us") for r in rows)
    for r in rows:
        r["time_pct"] = pct(num(r.get("total_us")), grand)
    return sorted(rows, key=lambda r: -(num(r.get("total_us")) if num(r.get("total_us")) is not None
                                        else math.inf))


def _unit():
    from .units import HIGHER, LOWER, Card, Metric, Unit, path

    metrics = (
        Metric("est_achieved_occupancy_pct", "Est. achieved occupancy", "%", HIGHER,
               path("occupancy", "est_achieved_occupancy_pct"), ("occupancy.est_achieved_occupancy_pct",),
               card=Card("occupancy", "Est. achieved occupancy",
                         "Kernel-time-weighted estimate per launch; not a measurement.",
                         field=("occupancy", "est_achieved_occupancy_pct"),
                         sublabel="theoretical, from the occupancy calculator", order=50),
               text=False, order=110),
        Metric("grid_too_small_pct", "Grid too small", "%", LOWER, path("occupancy", "grid_too_small_pct"),
               ("occupancy.grid_too_small_pct",), text=False, order=120),
        Metric("short_kernel_time_pct", "Short kernels", "%", LOWER, path("occupancy", "short_kernels", "time_pct"),
               ("occupancy.short_kernels",),
               card=Card("short_kernels", "Short kernels", "Share of kernel time in very short kernels (launch overhead).",
                         field=("occupancy", "short_kernels", "time_pct"), order=110),
               text=False, order=130),
    )
    return Unit("occupancy", _unit_compute, _unit_partial, _unit_finish, requires=("steps",), metrics=metrics)


UNIT = _unit()
