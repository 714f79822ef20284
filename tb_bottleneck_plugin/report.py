"""Assembles the one report object (docs/report-schema.md, metrics §10).

`analyze_span` is the single place where a trace file becomes results: load once,
run every analysis once, keep only plain JSON-able results (report, memory curves,
kernel table) and drop the trace. The plugin, the CLI and the disk cache all store and
serve exactly what this returns; `combine_results` builds worker/run summaries from
span results as ratios of sums.
"""
from __future__ import annotations

import math
import pickle
import posixpath
from typing import Dict, List, Optional

import numpy as np

from . import loader, model, recommendations, storage
from .analysis import breakdown, gpu, input_bound, memory, occupancy, operators, signals, steps, tensor_cores
from .errors import BottleneckError

SCHEMA_VERSION = 1
MEMORY_CURVE_POINTS = 2000
KERNELS_IN_REPORT = 50  # the full table (top 200) is served by the kernels route


# ---------------------------------------------------------------------------- one file


def analyze_span(logdir_url: str, run, span, progress=None) -> dict:
    """Load one discovered span and analyse it: {"report", "memory", "kernels"}."""
    fs, _ = storage.get_fs(span.url)
    trace = loader.load_trace(span.path, fs=fs, source=span.url, progress=progress)
    snapshot = _find_snapshot(fs, posixpath.dirname(span.path), span.url)
    return analyze_trace(trace, run=getattr(run, "name", None), worker=_worker_of(run, span),
                         span=span.name, snapshot=snapshot)


def _worker_of(run, span) -> Optional[str]:
    for w in getattr(run, "workers", []):
        if any(s.url == span.url for s in w.spans):
            return w.name
    return None


def _find_snapshot(fs, run_dir: str, source: str) -> Optional[dict]:
    """A CUDA memory snapshot pickle in the run directory, if one is there."""
    try:
        names = [p for p in fs.ls(run_dir, detail=False)
                 if any(_matches(posixpath.basename(p), pat) for pat in memory.MEMORY_SNAPSHOT_PATTERNS)]
    except (OSError, BottleneckError):
        return None
    for path in sorted(names):
        try:
            with fs.open(path, "rb") as f:
                return {"path": path, "fragmentation": memory.memory_snapshot_fragmentation(f)}
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError) as exc:
            return {"path": path, "error": f"{path}: not a readable CUDA memory snapshot ({exc})"}
    return None


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatch(name, pattern)


def analyze_trace(trace: model.TraceData, *, run=None, worker=None, span=None, snapshot=None) -> dict:
    """Every analysis of one loaded trace, once: {"report", "memory", "kernels"}."""
    not_available: Dict[str, str] = {}
    found = steps.find_steps(trace)
    part = None
    rep: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": trace.meta.source,
        "run": run, "worker": worker, "span": span,
        "spans": [trace.meta.source],
        "device_names": {str(p.get("id", i)): p.get("name") or "unknown GPU"
                         for i, p in enumerate(trace.meta.device_properties)},
        "device_properties": trace.meta.device_properties,
        "trace": _trace_facts(trace),
    }
    rep["steps"] = found.to_report()
    lo, hi = found.window
    rep["steps"]["window_us"] = (hi - lo) if found.count else None
    if not found.found:
        not_available["steps"] = "no steps found (no ProfilerStep#N): the whole trace is analysed as one window"
    if found.count:
        part = breakdown.partition(trace, found.inc_start, found.inc_end)
        rep.update(breakdown.step_breakdown(trace, found))
    else:
        rep.update({"avg_step_us": None, "breakdown_us": None, "breakdown_pct": None, "breakdown_per_step": []})
        not_available["breakdown_pct"] = "no included step"
    rep["input"] = input_bound.input_bound(trace, found, part)

    gpu_part, na = gpu.gpu_metrics(trace, found)
    rep["gpu"] = gpu_part
    not_available.update(na)

    tc = tensor_cores.tensor_core_usage(trace)
    not_available.update({f"tensor_cores.{k}": v for k, v in tc.pop("not_available", {}).items()})
    rep["tensor_cores"] = tc
    for dev, pct in (tc.get("per_device") or {}).items():
        rep["gpu"].setdefault(dev, {})["tensor_core_pct"] = pct

    occ = occupancy.kernel_occupancy(trace, found.window if found.count else None)
    not_available.update({f"occupancy.{k}": v for k, v in occ.pop("not_available", {}).items()})
    rep["occupancy"] = occ

    boundaries = [(int(n), float(t)) for n, t in zip(found.inc_numbers, found.inc_start)] if found.found else []
    mem = memory.memory_usage(trace, step_boundaries=boundaries, max_points=MEMORY_CURVE_POINTS)
    curves = {"devices": {}}
    for key, entry in mem.items():
        curve = entry.pop("curve", None)
        if curve:
            curves["devices"][key] = curve
        for metric, why in entry.pop("not_available", {}).items():
            not_available[f"memory.{key}.{metric}"] = why
    if snapshot is not None:
        _apply_snapshot(mem, snapshot, not_available)
    if not mem:
        reason = memory.memory_not_available_reason(trace) or "no [memory] events"
        not_available["memory"] = reason
        curves["not_available"] = reason
    rep["memory"] = mem

    rep["sync"] = signals.sync_signal(trace, found)
    rep["communication"] = signals.communication_signal(trace, found)
    rep["launch"] = signals.launch_signal(trace, found)
    rep["not_available"] = not_available
    rep["recommendations"] = recommendations.recommend(rep)
    kernels = rep["occupancy"].pop("kernels", [])
    rep["occupancy"]["kernels"] = kernels[:KERNELS_IN_REPORT]
    return {"report": _clean(rep), "memory": _clean(curves), "kernels": _clean(kernels),
            "operators": _clean(operators.operator_table(trace, found))}  # compare.py's op and kernel diffs


def _apply_snapshot(mem: dict, snapshot: dict, not_available: Dict[str, str]) -> None:
    if "error" in snapshot:
        not_available["memory.free_block_fragmentation_pct"] = snapshot["error"]
        return
    for key, pct in snapshot["fragmentation"].items():
        entry = mem.setdefault(key, {})
        entry["free_block_fragmentation_pct"] = pct
        entry["free_block_fragmentation_source"] = snapshot["path"]
        not_available.pop(f"memory.{key}.free_block_fragmentation_pct", None)


def _trace_facts(trace: model.TraceData) -> dict:
    m = trace.meta
    return {
        "events": m.event_count,
        "categories": m.category_counts,
        "first_ts_us": m.first_ts, "last_ts_us": m.last_ts,
        "duration_us": (m.last_ts - m.first_ts) if m.first_ts == m.first_ts else None,
        "container": m.container,
        "base_time_ns": m.base_time_ns,
        "distributed_info": m.distributed_info,
        "kernels": int((trace.gpu.kind == model.GPU_KERNEL).sum()),
        "memcpys": int((trace.gpu.kind == model.GPU_MEMCPY).sum()),
        "memsets": int((trace.gpu.kind == model.GPU_MEMSET).sum()),
        "runtime_calls": len(trace.runtime),
        "cpu_events": len(trace.cpu),
        "memory_events": len(trace.memory),
        "gpu_devices": trace.devices,
        "warnings": list(m.warnings),
    }


def _clean(value):
    """numpy scalars -> Python, NaN/inf -> None: plain JSON everywhere."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_clean(v) for v in value.tolist()]
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


# ---------------------------------------------------------------------------- summaries


def combine_results(results: List[dict], *, run=None, worker=None) -> dict:
    """A worker or run summary from span results: ratios of sums over all included
    steps of all spans (metrics §1), never means of percentages."""
    if len(results) == 1:
        return results[0]
    reports = [r["report"] for r in results]
    out: dict = {
        "schema_version": SCHEMA_VERSION, "source": None, "run": run, "worker": worker, "span": None,
        "spans": [s for r in reports for s in r.get("spans", [])],
        "device_names": {k: v for r in reports for k, v in (r.get("device_names") or {}).items()},
        "device_properties": reports[0].get("device_properties", []),
        "trace": {**{k: sum(r["trace"].get(k) or 0 for r in reports)
                     for k in ("events", "kernels", "memcpys", "memsets", "runtime_calls", "cpu_events",
                               "memory_events", "duration_us")},
                  "gpu_devices": sorted({d for r in reports for d in r["trace"].get("gpu_devices", [])}),
                  "warnings": [w for r in reports for w in r["trace"].get("warnings", [])]},
    }
    per_step = [dict(s, span=r.get("span")) for r in reports for s in r.get("breakdown_per_step") or []]
    out["steps"] = {"count": sum(r["steps"]["count"] for r in reports),
                    "numbers": [n for r in reports for n in r["steps"]["numbers"]],
                    "excluded": [e for r in reports for e in r["steps"]["excluded"]],
                    "found": any(r["steps"].get("found") for r in reports),
                    "window_us": sum(r["steps"].get("window_us") or 0 for r in reports)}
    total = sum(s["total_us"] for s in per_step)
    n = len(per_step)
    if n:
        out["breakdown_us"] = {c: sum(s.get(c, 0.0) for s in per_step) / n for c in breakdown.CATEGORIES}
        out["breakdown_pct"] = {c: 100.0 * sum(s.get(c, 0.0) for s in per_step) / total if total else None
                                for c in breakdown.CATEGORIES}
        out["avg_step_us"] = total / n
    else:
        out["breakdown_us"] = out["breakdown_pct"] = out["avg_step_us"] = None
    out["breakdown_per_step"] = per_step
    out["input"] = _combine_input([r["input"] for r in reports])
    out["gpu"] = _combine_gpu(reports)
    out["tensor_cores"] = _combine_tensor_cores([r["tensor_cores"] for r in reports])
    for dev, pct in (out["tensor_cores"].get("per_device") or {}).items():
        out["gpu"].setdefault(dev, {})["tensor_core_pct"] = pct
    out["occupancy"] = _combine_occupancy([r["occupancy"] for r in reports])
    out["memory"] = _combine_memory([r["memory"] for r in reports])
    step_us = [sum(s["step_us"] for s in (r["input"].get("per_step") or [])) for r in reports]
    out["sync"] = _combine_sync([r.get("sync") or {} for r in reports], step_us)
    comms = [r.get("communication") or {} for r in reports]
    comm_us = sum(c.get("comm_us") or 0.0 for c in comms)
    kernel_union = sum((c.get("comm_us") or 0.0) * 100.0 / c["comm_pct_of_kernel_time"]
                       for c in comms if c.get("comm_pct_of_kernel_time"))
    out["communication"] = {
        "comm_us": comm_us,
        "overlap_pct": _weighted([(c.get("overlap_pct"), c.get("comm_us")) for c in comms]),
        "comm_pct_of_kernel_time": 100.0 * comm_us / kernel_union if kernel_union else None}
    launches = [r.get("launch") or {} for r in reports]
    launch_us = sum(l.get("launch_us") or 0.0 for l in launches)
    out["launch"] = {
        "launch_us": launch_us,
        "kernels_per_step": _weighted([(l.get("kernels_per_step"), r["steps"]["count"])
                                       for l, r in zip(launches, reports)]),
        "launch_pct": 100.0 * launch_us / sum(step_us) if sum(step_us) else None}
    out["not_available"] = {k: v for r in reports for k, v in (r.get("not_available") or {}).items()}
    out["recommendations"] = recommendations.recommend(out)
    curves: dict = {"devices": {}}
    for r in results:
        for dev, c in (r.get("memory") or {}).get("devices", {}).items():
            d = curves["devices"].setdefault(dev, {})
            for k, v in c.items():
                if isinstance(v, list):
                    d.setdefault(k, []).extend(v)
                elif k not in d:
                    d[k] = v
    kernels = _combine_kernel_rows([r.get("kernels") or [] for r in results])
    out["occupancy"]["kernels"] = kernels[:KERNELS_IN_REPORT]
    return {"report": _clean(out), "memory": curves, "kernels": kernels,
            "operators": operators.combine_tables([r.get("operators") for r in results])}


def _combine_input(parts: List[dict]) -> dict:
    per_step = [s for p in parts for s in (p.get("per_step") or [])]
    step_us = sum(s["step_us"] for s in per_step)
    if not per_step or step_us <= 0:
        return {"input_bound_pct": None, "input_transfer_pct": None, "xprof_input_pct": None,
                "verdict": None, "severity": None, "per_step": per_step, "stats": None, "evidence": {}}
    pct = 100.0 * sum(s["dataloader_us"] for s in per_step) / step_us
    span_us = [sum(s["step_us"] for s in (p.get("per_step") or [])) for p in parts]
    transfer = _weighted([(p.get("input_transfer_pct"), w) for p, w in zip(parts, span_us)]) or 0.0
    verdict, severity = input_bound.verdict_for(pct)
    values = np.array([s["input_bound_pct"] for s in per_step])
    evid = [p.get("evidence") or {} for p in parts]
    slow = sorted((s for e in evid for s in e.get("slowest_steps", [])), key=lambda s: -s["step_us"])
    iters = sorted({i for e in evid for i in e.get("dataloader_iterators", [])})
    return {
        "input_bound_pct": pct, "input_transfer_pct": transfer, "xprof_input_pct": pct + transfer,
        "verdict": verdict, "severity": severity, "per_step": per_step,
        "stats": {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
                  "std": float(values.std())},
        "evidence": {"dataloader_iterators": iters,
                     "num_workers_zero": input_bound.SINGLE_PROCESS_ITER in iters,
                     "slowest_steps": slow[:input_bound.SLOWEST_STEPS],
                     "pageable_h2d_copies": sum(e.get("pageable_h2d_copies", 0) for e in evid),
                     "pageable_h2d_us": sum(e.get("pageable_h2d_us", 0.0) for e in evid)},
    }


def _combine_gpu(reports: List[dict]) -> dict:
    out = {}
    for dev in sorted({d for r in reports for d in (r.get("gpu") or {})}):
        entries = [(r["gpu"][dev], r["steps"].get("window_us") or 0) for r in reports if dev in (r.get("gpu") or {})]
        merged: dict = {}
        # Utilization and SM efficiency are shares of each span's steps window.
        for key in ("utilization_pct", "est_sm_efficiency_pct"):
            merged[key] = _weighted([(e.get(key), w) for e, w in entries])
        # Occupancy is weighted by clipped kernel time (kernel_us approximates the weight's union).
        merged["est_achieved_occupancy_pct"] = _weighted([(e.get("est_achieved_occupancy_pct"), e.get("kernel_us"))
                                                          for e, _ in entries])
        merged["kernel_us"] = sum(e.get("kernel_us") or 0.0 for e, _ in entries)
        idles = [e["idle"] for e, _ in entries if e.get("idle")]
        if idles:
            idle = {k: sum(i.get(k) or 0.0 for i in idles) for k in ("span_us", "idle_us", "host_wait_us",
                                                                      "kernel_wait_us", "other_us")}
            idle["idle_pct"] = 100.0 * idle["idle_us"] / idle["span_us"] if idle["span_us"] else None
            idle["view"] = idles[0].get("view")
            merged["idle"] = idle
        out[dev] = merged
    return out


def _combine_tensor_cores(parts: List[dict]) -> dict:
    kernel_us = sum(p.get("kernel_us") or 0.0 for p in parts)
    if kernel_us <= 0:
        return dict(parts[0])
    tc_us = sum(p.get("tensor_core_us") or 0.0 for p in parts)
    enu_us = sum(p.get("eligible_not_using_us") or 0.0 for p in parts)
    ops: Dict[str, dict] = {}
    for p in parts:
        for op in p.get("top_eligible_not_using") or []:
            o = ops.setdefault(op["op"], dict(op, kernel_us=0.0, calls=0))
            o["kernel_us"] += op.get("kernel_us") or 0.0
            o["calls"] += op.get("calls") or 0
    for o in ops.values():
        o["pct"] = 100.0 * o["kernel_us"] / kernel_us
    split = {}
    for key in (parts[0].get("precision_split_pct") or {}):
        split[key] = _weighted([((p.get("precision_split_pct") or {}).get(key), p.get("kernel_us")) for p in parts])
    per_device = {}
    for dev in {d for p in parts for d in (p.get("per_device") or {})}:
        per_device[dev] = _weighted([(p["per_device"].get(dev), p.get("kernel_us")) for p in parts
                                     if dev in (p.get("per_device") or {})])
    return {"tensor_core_pct": 100.0 * tc_us / kernel_us, "per_device": per_device,
            "eligible_not_using_pct": 100.0 * enu_us / kernel_us,
            "top_eligible_not_using": sorted(ops.values(), key=lambda o: -o["kernel_us"])[:10],
            "precision_split_pct": split, "kernel_us": kernel_us, "tensor_core_us": tc_us,
            "eligible_not_using_us": enu_us}


def _combine_occupancy(parts: List[dict]) -> dict:
    weights = [p.get("weighted_kernel_us") or 0.0 for p in parts]
    out = {"est_achieved_occupancy_pct": _weighted([(p.get("est_achieved_occupancy_pct"), w)
                                                    for p, w in zip(parts, weights)]),
           "grid_too_small_pct": _weighted([(p.get("grid_too_small_pct"), w) for p, w in zip(parts, weights)]),
           "weighted_kernel_us": sum(weights)}
    per_device = {}
    for dev in {d for p in parts for d in (p.get("per_device") or {})}:
        per_device[dev] = _weighted([(p["per_device"].get(dev), w) for p, w in zip(parts, weights)
                                     if dev in (p.get("per_device") or {})])
    out["per_device"] = per_device
    buckets: Dict[str, dict] = {}
    for p in parts:
        for b in p.get("histogram") or []:
            e = buckets.setdefault(b["bucket"], dict(b, us=0.0))
            e["us"] += b.get("us") or 0.0
    hist_total = sum(b["us"] for b in buckets.values())
    out["histogram"] = [dict(b, pct=100.0 * b["us"] / hist_total if hist_total else 0.0)
                        for b in sorted(buckets.values(), key=lambda b: b["lo"])]
    shorts = [p.get("short_kernels") for p in parts if p.get("short_kernels")]
    if shorts:
        out["short_kernels"] = {
            "threshold_us": shorts[0].get("threshold_us"),
            "count": sum(s.get("count") or 0 for s in shorts),
            "time_pct": _weighted([(p["short_kernels"].get("time_pct"), w) for p, w in zip(parts, weights)
                                   if p.get("short_kernels")]),
            "mean_gap_us": _weighted([(s.get("mean_gap_us"), s.get("gap_count")) for s in shorts]),
            "gap_count": sum(s.get("gap_count") or 0 for s in shorts)}
    else:
        out["short_kernels"] = None
    return out


def _combine_kernel_rows(tables: List[List[dict]]) -> List[dict]:
    rows: Dict[tuple, dict] = {}
    for table in tables:
        for k in table:
            key = (k["name"], k.get("device"), tuple(k.get("grid") or ()), tuple(k.get("block") or ()),
                   k.get("registers_per_thread"), k.get("shared_memory_bytes"))
            row = rows.get(key)
            if row is None:
                rows[key] = dict(k)
            else:
                row["calls"] += k["calls"]
                row["total_us"] += k["total_us"]
                row["mean_us"] = row["total_us"] / row["calls"] if row["calls"] else None
    total = sum(r["total_us"] for r in rows.values())
    for r in rows.values():
        r["time_pct"] = 100.0 * r["total_us"] / total if total else None
    return sorted(rows.values(), key=lambda r: -r["total_us"])


def _combine_memory(parts: List[dict]) -> dict:
    out = {}
    for key in {k for p in parts for k in p}:
        entries = [p[key] for p in parts if key in p]
        peak_alloc = max((e.get("peak_allocated_bytes") for e in entries if e.get("peak_allocated_bytes") is not None),
                         default=None)
        peak_res = max((e.get("peak_reserved_bytes") for e in entries if e.get("peak_reserved_bytes") is not None),
                       default=None)
        merged = dict(entries[0])
        merged.update(peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_res)
        # The peaks of the union of the spans' samples are the maxima of their peaks,
        # so slack at the peak stays exact; the time-weighted one is a ratio of integrals.
        if entries[0].get("slack_fragmentation_pct") is not None and peak_res:
            merged["slack_fragmentation_pct"] = 100.0 * (peak_res - peak_alloc) / peak_res
        res_int = sum(e.get("reserved_byte_us") or 0.0 for e in entries)
        slack_int = sum(e.get("slack_byte_us") or 0.0 for e in entries)
        merged["slack_fragmentation_time_weighted_pct"] = 100.0 * slack_int / res_int if res_int else None
        merged["reserved_byte_us"], merged["slack_byte_us"] = res_int or None, slack_int or None
        per_step = [s for e in entries for s in ((e.get("growth") or {}).get("per_step") or [])]
        merged["growth"] = {"per_step": per_step,
                            "possible_leak": any((e.get("growth") or {}).get("possible_leak") for e in entries)}
        out[key] = merged
    return out


def _combine_sync(parts: List[dict], step_us: List[float]) -> dict:
    sync_us = sum(p.get("sync_us") or 0.0 for p in parts)
    ops: Dict[str, dict] = {}
    for p in parts:
        for op in p.get("top_ops") or []:
            o = ops.setdefault(op["op"], {"op": op["op"], "sync_us": 0.0, "count": 0})
            o["sync_us"] += op["sync_us"]
            o["count"] += op["count"]
    calls: Dict[str, dict] = {}
    for p in parts:
        for c in p.get("calls") or []:
            e = calls.setdefault(c["name"], {"name": c["name"], "us": 0.0, "count": 0})
            e["us"] += c["us"]
            e["count"] += c["count"]
    total = sum(step_us)
    return {"sync_us": sync_us, "sync_pct": 100.0 * sync_us / total if total else None,
            "top_ops": sorted(ops.values(), key=lambda o: -o["sync_us"])[:10],
            "calls": sorted(calls.values(), key=lambda c: -c["us"])}


def _weighted(pairs) -> Optional[float]:
    pairs = [(v, w) for v, w in pairs if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


# ---------------------------------------------------------------------------- text


def format_text(rep: dict, indent: str = "") -> str:
    """The report for a terminal: what was found, the headline numbers, the advice."""
    t = rep.get("trace", {})
    lines = [f"{indent}{rep.get('source')}"]
    if rep.get("worker"):
        lines.append(f"{indent}  worker {rep['worker']}, span {rep.get('span')}")
    dur = t.get("duration_us")
    lines.append(f"{indent}  {t.get('events', 0):,} events: {t.get('kernels', 0):,} kernels, "
                 f"{t.get('memcpys', 0):,} memcpy, {t.get('memsets', 0):,} memset, "
                 f"{t.get('runtime_calls', 0):,} runtime calls, {t.get('cpu_events', 0):,} CPU events, "
                 f"{t.get('memory_events', 0):,} memory events"
                 + (f"; {dur / 1000:.1f} ms of trace" if dur else ""))
    devices = t.get("gpu_devices") or []
    names = rep.get("device_names") or {}
    if devices:
        lines.append(f"{indent}  GPU devices: " + ", ".join(
            f"{d}" + (f" ({names[str(d)]})" if str(d) in names else "") for d in devices))
    else:
        lines.append(f"{indent}  CPU-only trace: no GPU activity")
    st = rep.get("steps", {})
    if st.get("found"):
        lines.append(f"{indent}  steps {st.get('numbers')}" + (
            "; excluded " + ", ".join(f"{e['number']} ({e['reason']})" for e in st.get("excluded", []))
            if st.get("excluded") else ""))
    else:
        lines.append(f"{indent}  no steps found (no ProfilerStep#N): the whole trace is one window")
    if rep.get("avg_step_us"):
        lines.append(f"{indent}  average step {rep['avg_step_us'] / 1000:.2f} ms: " + ", ".join(
            f"{k} {v:.1f}%" for k, v in (rep.get("breakdown_pct") or {}).items() if v))
    inp = rep.get("input") or {}
    if inp.get("input_bound_pct") is not None:
        lines.append(f"{indent}  input-bound {inp['input_bound_pct']:.2f}% ({inp.get('verdict')})")
    for dev, g in (rep.get("gpu") or {}).items():
        parts = [f"{label} {g[key]:.2f}%" for key, label in (
            ("utilization_pct", "utilization"), ("est_sm_efficiency_pct", "est. SM efficiency"),
            ("est_achieved_occupancy_pct", "est. occupancy"), ("tensor_core_pct", "Tensor Cores"))
            if g.get(key) is not None]
        lines.append(f"{indent}  GPU {dev}: " + ", ".join(parts))
    for dev, m in (rep.get("memory") or {}).items():
        peak = m.get("peak_allocated_bytes")
        text = f"{indent}  memory {dev}: peak allocated {peak / 2**20:.1f} MiB" if peak is not None else \
            f"{indent}  memory {dev}:"
        if m.get("peak_reserved_bytes") is not None:
            text += f", peak reserved {m['peak_reserved_bytes'] / 2**20:.1f} MiB"
        if m.get("slack_fragmentation_pct") is not None:
            text += f", allocator slack {m['slack_fragmentation_pct']:.1f}%"
        lines.append(text)
    for rec in rep.get("recommendations", []):
        lines.append(f"{indent}  [{rec['severity']}] {rec['title']}")
        lines.append(f"{indent}      -> {rec['action']}")
    for key, why in (rep.get("not_available") or {}).items():
        lines.append(f"{indent}  n/a {key}: {why}")
    return "\n".join(lines)
