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
from .analysis import breakdown, gpu, input_bound, memory, occupancy, signals, steps, tensor_cores
from .errors import BottleneckError

SCHEMA_VERSION = 1
MEMORY_CURVE_POINTS = 2000


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
                 if any(_matches(posixpath.basename(p), pat) for pat in memory.SNAPSHOT_PATTERNS)]
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
    rep.update(steps.steps_section(found))
    rep.update(breakdown.breakdown_section(trace, found))
    rep["input"] = input_bound.input_section(trace, found, rep)
    gpu_part = gpu.gpu_section(trace, found)
    rep["gpu"] = gpu_part["gpu"]
    not_available.update(gpu_part.get("not_available", {}))
    tc = tensor_cores.tensor_core_section(trace)
    rep["tensor_cores"] = tc["tensor_cores"]
    not_available.update(tc.get("not_available", {}))
    for dev, pct in (rep["tensor_cores"].get("per_device") or {}).items():
        rep["gpu"].setdefault(dev, {})["tensor_core_pct"] = pct
    occ = occupancy.occupancy_section(trace, found.window)
    rep["occupancy"] = occ["occupancy"]
    not_available.update(occ.get("not_available", {}))
    mem = memory.memory_section(trace, step_starts=found.step_starts(), snapshot=snapshot)
    rep["memory"] = mem["memory"]
    not_available.update(mem.get("not_available", {}))
    sig = signals.signals_section(trace, found)
    rep.update({k: sig[k] for k in ("sync", "communication", "launch") if k in sig})
    not_available.update(sig.get("not_available", {}))
    not_available.update(found.not_available())
    rep["not_available"] = not_available
    rep["recommendations"] = recommendations.recommend(rep)
    return {"report": _clean(rep), "memory": _clean(mem.get("curves", {"devices": {}})),
            "kernels": _clean(rep["occupancy"].get("kernels", []))}


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
    """A worker or run summary from span results: ratios of sums over all included steps."""
    if len(results) == 1:
        return results[0]
    reports = [r["report"] for r in results]
    out: dict = {
        "schema_version": SCHEMA_VERSION, "source": None, "run": run, "worker": worker, "span": None,
        "spans": [s for r in reports for s in r.get("spans", [])],
        "device_names": {k: v for r in reports for k, v in (r.get("device_names") or {}).items()},
        "device_properties": reports[0].get("device_properties", []),
        "trace": {"events": sum(r["trace"]["events"] for r in reports),
                  "warnings": [w for r in reports for w in r["trace"].get("warnings", [])]},
    }
    # Steps and breakdown: sums over every included step of every span.
    per_step = [dict(s, span=r.get("span")) for r in reports for s in r.get("breakdown_per_step", [])]
    out["steps"] = {"count": sum(r["steps"]["count"] for r in reports),
                    "numbers": [n for r in reports for n in r["steps"]["numbers"]],
                    "excluded": [e for r in reports for e in r["steps"]["excluded"]],
                    "found": any(r["steps"].get("found") for r in reports),
                    "window_us": sum(r["steps"].get("window_us") or 0 for r in reports)}
    cats = list(reports[0]["breakdown_us"])
    total = sum(s["total_us"] for s in per_step)
    n = max(1, len(per_step))
    out["breakdown_us"] = {c: sum(s.get(c, 0.0) for s in per_step) / n for c in cats}
    out["breakdown_pct"] = {c: (100.0 * sum(s.get(c, 0.0) for s in per_step) / total if total else None)
                            for c in cats}
    out["breakdown_per_step"] = per_step
    out["avg_step_us"] = total / n if per_step else None
    step_weights = [(r["avg_step_us"] or 0) * r["steps"]["count"] for r in reports]
    out["input"] = input_bound.combine_input([r["input"] for r in reports], step_weights,
                                             [r.get("breakdown_per_step", []) for r in reports])
    # GPU: per device, weighted by each span's steps window.
    out["gpu"] = {}
    for dev in sorted({d for r in reports for d in r.get("gpu", {})}):
        entries = [(r["gpu"][dev], r["steps"].get("window_us") or 0) for r in reports if dev in r.get("gpu", {})]
        merged = {}
        for key in ("utilization_pct", "est_sm_efficiency_pct", "est_achieved_occupancy_pct", "tensor_core_pct"):
            merged[key] = _weighted([(e.get(key), w) for e, w in entries])
        out["gpu"][dev] = merged
    out["tensor_cores"] = tensor_cores.combine_tensor_cores([r["tensor_cores"] for r in reports])
    out["occupancy"] = occupancy.combine_occupancy([r["occupancy"] for r in reports])
    out["memory"] = memory.combine_memory([r["memory"] for r in reports])
    out["sync"] = signals.combine_sync([r.get("sync") or {} for r in reports], step_weights)
    out["communication"] = signals.combine_communication([r.get("communication") or {} for r in reports])
    out["launch"] = signals.combine_launch([r.get("launch") or {} for r in reports], step_weights)
    out["not_available"] = {k: v for r in reports for k, v in (r.get("not_available") or {}).items()}
    out["recommendations"] = recommendations.recommend(out)
    curves = {"devices": {}}
    for r in results:
        for dev, c in (r.get("memory") or {}).get("devices", {}).items():
            d = curves["devices"].setdefault(dev, {k: [] for k in c})
            for k, v in c.items():
                if isinstance(v, list):
                    d.setdefault(k, []).extend(v)
    return {"report": _clean(out), "memory": curves, "kernels": out["occupancy"].get("kernels", [])}


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
