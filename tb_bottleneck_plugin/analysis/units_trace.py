"""The trace header unit (docs/report-schema.md: ``device_names``, ``device_properties``,
``trace``): facts about the file, counted once; a summary adds the counts."""
from __future__ import annotations

from ..trace import model
from . import devices
from .accelerators import other_accelerators
from .occupancy import device_properties, is_rocm
from .units import ALWAYS, Unit

FIELDS = {"device_names": {}, "device_labels": {}, "device_properties": [], "trace": None}
PROFILER_OPTIONS = ("record_shapes", "profile_memory", "with_stack")
COUNTS = ("events", "kernels", "memcpys", "memsets", "runtime_calls", "cpu_events", "memory_events", "duration_us")


def trace_facts(trace: model.TraceData) -> dict:
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
        # the profiler's options Kineto wrote into the file: each adds host time per op
        "profiler_options": [o for o in PROFILER_OPTIONS if getattr(m, o)],
        # non-CUDA/ROCm accelerators' events (MTIA, XPU, ...): counted and named, not analysed
        "accelerators": other_accelerators(trace),
    }


def _compute(span) -> dict:
    trace = span.trace
    # keyed by the trace's device id, as the gpu section: the deviceProperties ids (CUDA; on
    # ROCm they are not the kernels' ids) and every device that ran GPU activity, named one
    # way (analysis/devices.py)
    labels = devices.device_labels(trace)
    names = {} if is_rocm(trace) else {str(d): devices.UNKNOWN_GPU if not str(p.get("name") or "").strip()
                                       else str(p["name"]).strip() for d, p in device_properties(trace).items()}
    names.update({str(d): labels[str(d)]["name"] for d in trace.devices})
    return {"device_names": names, "device_labels": labels,
            "device_properties": trace.meta.device_properties,
            "trace": trace_facts(trace)}


def _partial(report: dict) -> dict:
    facts = report.get("trace") or {}
    out = {f"sum:{k}": facts.get(k) or 0 for k in COUNTS}
    out.update({"rows:device_names": list((report.get("device_names") or {}).items()),
                "rows:device_labels": list((report.get("device_labels") or {}).items()),
                "rows:device_properties": [report["device_properties"]] if report.get("device_properties") else [],
                "rows:gpu_devices": list(facts.get("gpu_devices") or []),
                "rows:warnings": list(facts.get("warnings") or []),
                "rows:profiler_options": list(facts.get("profiler_options") or []),
                "rows:accelerators": [facts["accelerators"]] if facts.get("accelerators") else []})
    return out


def _finish(m: dict) -> dict:
    return {"device_names": dict(m["rows:device_names"]), "device_labels": dict(m["rows:device_labels"]),
            "device_properties": m["rows:device_properties"][0] if m["rows:device_properties"] else [],
            "trace": {**{k: m[f"sum:{k}"] for k in COUNTS},
                      "gpu_devices": sorted(set(m["rows:gpu_devices"]), key=str),
                      "warnings": m["rows:warnings"],
                      "profiler_options": [o for o in PROFILER_OPTIONS if o in m["rows:profiler_options"]],
                      "accelerators": _merge_accelerators(m["rows:accelerators"])}}


def _merge_accelerators(rows) -> dict:
    out: dict = {}
    for acc in rows:
        for name, a in (acc or {}).items():
            e = out.setdefault(name, {"events": 0, "categories": {}})
            e["events"] += int(a.get("events") or 0)
            for c, n in (a.get("categories") or {}).items():
                e["categories"][c] = e["categories"].get(c, 0) + int(n or 0)
    return out


UNIT = Unit("trace", _compute, _partial, _finish, fields=FIELDS, group=ALWAYS)
