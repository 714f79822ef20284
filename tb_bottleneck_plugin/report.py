"""Assembles the one report object (docs/report-schema.md, metrics §10).

`analyze_span` is the single place where a trace file becomes results: load once,
run every analysis once, keep only plain JSON-able results (report, memory curves,
kernel table) and drop the trace. The plugin, the CLI and the disk cache all store and
serve exactly what this returns; `combine_results` builds worker/run summaries from
span results as ratios of sums.
"""
from __future__ import annotations

import logging
import math
import pickle
import posixpath
from typing import Dict, List, Optional

import numpy as np

from . import loader, model, recommendations, storage, verdicts
from .analysis import breakdown, context, gpu, input_bound, memory, occupancy, operators, signals, steps, tensor_cores
from .analysis import distributed  # metrics §12: the rank view's per-span part
from .errors import BottleneckError

SCHEMA_VERSION = 1
MEMORY_CURVE_POINTS = 2000
KERNELS_IN_REPORT = 50  # the full table (top 200) is served by the kernels route

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- one file


def analyze_span(logdir_url: str, run, span, progress=None, timeline: bool = False) -> dict:
    """Load one discovered span and analyse it: {"report", "memory", "kernels"}.
    ``timeline=True`` (the service) also leaves the span's step-timeline store (numpy
    arrays, not JSON) under ``result["timeline_store"]`` (None when it failed)."""
    fs, _ = storage.get_fs(span.url)
    trace = loader.load_trace(span.path, fs=fs, source=span.url, progress=progress)
    snapshot = _find_snapshot(fs, posixpath.dirname(span.path), span.url)
    result = analyze_trace(trace, run=getattr(run, "name", None), worker=_worker_of(run, span),
                           span=span.name, snapshot=snapshot)
    if timeline:
        from .analysis import timeline as _timeline

        result["timeline_store"] = _Sections({}, source=span.url).run("timeline", _timeline.build_store, trace)
    return result


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


class _Sections:
    """Runs each analysis section so that an exception in one becomes that section's
    `not_available` reason and a `report["errors"]` entry, never a lost report."""

    def __init__(self, not_available: Dict[str, str], source=None):
        self.not_available = not_available
        self.errors: List[dict] = []
        self.failed: Dict[str, str] = {}
        self.source = source

    def run(self, section: str, fn, *args, **kwargs):
        """fn(*args, **kwargs), or None after recording the error."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - isolation is the point: any bug is one section's n/a
            self.fail(section, exc)
            return None

    def fail(self, section: str, exc: BaseException) -> None:
        message = f"internal error in {section}: {type(exc).__name__}: {exc}"
        log.error("%s: %s", self.source or "report", message, exc_info=exc)
        self.failed[section] = message
        self.not_available[section] = message
        self.errors.append({"section": section, "error": message})

    def needs(self, section: str, *requires: str) -> bool:
        """True when every section `section` depends on succeeded; else says why it is n/a."""
        for dep in requires:
            if dep in self.failed:
                self.not_available[section] = f"needs {dep}, which failed ({self.failed[dep]})"
                return False
        return True


def analyze_trace(trace: model.TraceData, *, run=None, worker=None, span=None, snapshot=None) -> dict:
    """Every analysis of one loaded trace, once: {"report", "memory", "kernels"}.

    Each section runs isolated (`_Sections`): an exception in one is that section as
    null plus `not_available[<section>]` and a `report["errors"]` entry; sections that
    need a failed one say so in their own `not_available` entry; the rest is computed."""
    not_available: Dict[str, str] = {}
    sec = _Sections(not_available, source=trace.meta.source)
    rep: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": trace.meta.source,
        "run": run, "worker": worker, "span": span,
        "spans": [trace.meta.source],
    }
    rep.update(sec.run("trace", _trace_header, trace)
               or {"device_names": {}, "device_properties": [], "trace": None})

    found, rep["steps"] = sec.run("steps", _steps_section, trace, not_available) or (None, None)
    part = None
    rep.update({"avg_step_us": None, "breakdown_us": None, "breakdown_pct": None, "breakdown_per_step": []})
    if sec.needs("breakdown", "steps"):
        if found.count:
            done = sec.run("breakdown", _breakdown_section, trace, found)
            if done is not None:
                part, fields = done
                rep.update(fields)
        else:
            not_available["breakdown_pct"] = "no included step"
    rep["input"] = sec.run("input", input_bound.input_bound, trace, found, part) \
        if sec.needs("input", "steps") else None

    rep["gpu"] = None
    if sec.needs("gpu", "steps"):
        done = sec.run("gpu", gpu.gpu_metrics, trace, found)
        if done is not None:
            rep["gpu"], na = done
            not_available.update(na)

    tc = sec.run("tensor_cores", tensor_cores.tensor_core_usage, trace)
    if tc is not None:
        not_available.update({f"tensor_cores.{k}": v for k, v in tc.pop("not_available", {}).items()})
    rep["tensor_cores"] = tc
    if rep["gpu"] is not None:
        if tc is None:
            for g in rep["gpu"].values():
                g["tensor_core_pct"] = None  # the key stays; not_available["tensor_cores"] says why
        for dev, pct in ((tc or {}).get("per_device") or {}).items():
            rep["gpu"].setdefault(dev, {})["tensor_core_pct"] = pct

    rep["occupancy"] = None
    if sec.needs("occupancy", "steps"):
        occ = sec.run("occupancy", occupancy.kernel_occupancy, trace, found.window if found.count else None)
        if occ is not None:
            not_available.update({f"occupancy.{k}": v for k, v in occ.pop("not_available", {}).items()})
            rep["occupancy"] = occ

    curves: dict = {"devices": {}}
    mem = sec.run("memory", _memory_section, trace, found, curves, not_available)
    if mem is None:
        curves["not_available"] = not_available["memory"]
    elif "steps" in sec.failed:
        not_available["memory.growth"] = f"needs steps, which failed ({sec.failed['steps']})"
    if snapshot is not None and mem is not None:
        sec.run("memory_snapshot", _apply_snapshot, mem, snapshot, not_available)
    if mem is not None and not mem:
        reason = memory.memory_not_available_reason(trace) or "no [memory] events"
        not_available["memory"] = reason
        curves["not_available"] = reason
    rep["memory"] = mem

    for name, fn in (("sync", signals.sync_signal), ("communication", signals.communication_signal),
                     ("launch", signals.launch_signal)):
        rep[name] = sec.run(name, fn, trace, found) if sec.needs(name, "steps") else None
    not_available.update({f"launch.{k}": v for k, v in ((rep.get("launch") or {}).pop("not_available", None)
                                                         or {}).items()})
    rep["context"] = sec.run("context", context.detect, trace)
    rep["not_available"] = not_available
    rep["recommendations"] = sec.run("recommendations", recommendations.recommend, rep)
    rep["verdicts"] = sec.run("verdicts", verdicts.card_verdicts, rep)  # card colours (thresholds.py)
    kernels = []
    if rep["occupancy"] is not None:
        kernels = sec.run("kernels", _kernel_table_section, rep["occupancy"])
        if kernels is None:
            kernels = []
            rep["occupancy"]["kernels"] = []
    ops_table = sec.run("operators", operators.operator_table, trace, found) if found is not None else None
    op_view = sec.run("operator_view", operators.operator_view, trace, found) if found is not None else None
    dist_part = sec.run("distributed", distributed.span_partial, trace, found)  # ranks.rank_view input
    rep["errors"] = sec.errors
    rep["not_available_labels"] = not_available_labels(not_available)
    return {"report": _clean(rep), "memory": _clean(curves), "kernels": _clean(kernels),
            "operators": _clean(ops_table),  # compare.py's op and kernel diffs
            "operator_view": op_view,  # the /operators route (METRICS.md: Operator view)
            "distributed": dist_part}


def _trace_header(trace: model.TraceData) -> dict:
    return {"device_names": {str(p.get("id", i)): p.get("name") or "unknown GPU"
                             for i, p in enumerate(trace.meta.device_properties)},
            "device_properties": trace.meta.device_properties,
            "trace": _trace_facts(trace)}


def _steps_section(trace: model.TraceData, not_available: Dict[str, str]):
    found = steps.find_steps(trace)
    out = found.to_report()
    lo, hi = found.window
    out["window_us"] = (hi - lo) if found.count else None
    if not found.found:
        not_available["steps"] = "no steps found (no ProfilerStep#N): the whole trace is analysed as one window"
    return found, out


def _breakdown_section(trace: model.TraceData, found):
    part = breakdown.partition(trace, found.inc_start, found.inc_end)
    return part, breakdown.step_breakdown(trace, found)


def _memory_section(trace: model.TraceData, found, curves: dict, not_available: Dict[str, str]) -> dict:
    """memory_usage plus the curves; not_available is only written once all went well."""
    boundaries = ([(int(n), float(t)) for n, t in zip(found.inc_numbers, found.inc_start)]
                  if found is not None and found.found else [])
    mem = memory.memory_usage(trace, step_boundaries=boundaries, max_points=MEMORY_CURVE_POINTS)
    na: Dict[str, str] = {}
    devices = {}
    for key, entry in mem.items():
        curve = entry.pop("curve", None)
        if curve:
            devices[key] = curve
        for metric, why in entry.pop("not_available", {}).items():
            na[f"memory.{key}.{metric}"] = why
    not_available.update(na)
    curves["devices"].update(devices)
    return mem


def _kernel_table_section(occ: dict) -> List[dict]:
    """The full kernel table (kernels route); the report keeps its top rows."""
    kernels = list(occ.pop("kernels", None) or [])
    occ["kernels"] = kernels[:KERNELS_IN_REPORT]
    return kernels


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


# ---------------------------------------------------------------------------- labels

# Words for the keys of `not_available` (docs/report-schema.md): sections, then metrics.
_SECTION_LABELS = {
    "trace": "Trace facts", "steps": "Steps", "breakdown": "Step time breakdown",
    "breakdown_pct": "Step time breakdown", "input": "Input pipeline", "gpu": "GPU metrics",
    "tensor_cores": "Tensor Cores", "occupancy": "Occupancy", "memory": "Memory",
    "memory_snapshot": "CUDA memory snapshot", "sync": "Host-GPU synchronization",
    "communication": "Communication", "launch": "Kernel launches", "recommendations": "Recommendations",
    "kernels": "Kernel table", "memory_curves": "Memory over time", "operators": "Operator tables", "operator_view": "Operator view",
    "context": "Workload context", "distributed": "Distributed run", "verdicts": "Card verdicts",
}
_METRIC_LABELS = {
    "utilization_pct": "utilization", "est_sm_efficiency_pct": "estimated SM efficiency",
    "est_achieved_occupancy_pct": "estimated achieved occupancy", "tensor_core_pct": "Tensor Core share",
    "eligible_not_using_pct": "kernel time that could use Tensor Cores but does not",
    "precision_split_pct": "kernel time by precision", "per_device": "per device",
    "top_eligible_not_using": "ops that could use Tensor Cores",
    "grid_too_small_pct": "kernel time with a grid too small for the GPU", "short_kernels": "short kernels",
    "kernels": "kernel table", "histogram": "histogram", "weighted_kernel_us": "kernel time",
    "peak_allocated_bytes": "peak allocated", "peak_reserved_bytes": "peak reserved",
    "capacity_bytes": "capacity", "slack_fragmentation_pct": "allocator slack (at the peak)",
    "slack_fragmentation_time_weighted_pct": "allocator slack (time-weighted)",
    "free_block_fragmentation_pct": "free-block fragmentation", "growth": "growth per step (leak check)",
    "input_bound_pct": "input-bound share", "input_transfer_pct": "input transfer share",
    "sync_pct": "share of step time", "comm_pct_of_kernel_time": "share of kernel time",
    "overlap_pct": "overlap with computation", "kernels_per_step": "kernels per step",
    "launch_pct": "share of step time",
}


def _words(key: str) -> str:
    """A key nobody wrote a label for, as words: 'est_foo_pct' -> 'est foo (%)'."""
    text = key.strip("_.")
    for suffix, unit in (("_pct", " (%)"), ("_us", " (µs)"), ("_bytes", " (bytes)")):
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)] + unit
            break
    return " ".join(text.replace("_", " ").replace(".", " ").split()) or "value"


def _device_label(section: str, dev: str) -> str:
    if section == "memory":
        if dev == "cpu":
            return "CPU memory"
        kind, _, num = dev.partition(":")
        if kind == "cuda" and num:
            return f"GPU {_words(num)} memory"
        if kind.startswith("type") and num:
            return f"Device type {_words(kind[4:])} id {_words(num)} memory"
        return f"{_words(dev)} memory"
    return f"GPU {_words(dev)}"


def not_available_label(key: str) -> str:
    """Plain words for a `not_available` key, e.g. 'memory.cpu.slack_fragmentation_time_weighted_pct'
    -> 'CPU memory: allocator slack (time-weighted)'. Unknown keys still read as words
    (no underscores, no dots)."""
    key = str(key)
    if key in _SECTION_LABELS:
        return _SECTION_LABELS[key]
    parts = key.split(".")
    section, rest = parts[0], parts[1:]
    head = _SECTION_LABELS.get(section) or _words(section).capitalize()
    if section in ("gpu", "memory") and len(rest) >= 2:
        head = _device_label(section, rest[0])
        rest = rest[1:]
    if not rest:
        return head
    metric = ".".join(rest)
    words = _METRIC_LABELS.get(metric) or " ".join(_words(r) for r in rest)
    return f"{head}: {words}"


def not_available_labels(not_available: Dict[str, str]) -> Dict[str, str]:
    return {key: not_available_label(key) for key in not_available}


# ---------------------------------------------------------------------------- summaries


def combine_results(results: List[dict], *, run=None, worker=None) -> dict:
    """A worker or run summary from span results: ratios of sums over all included
    steps of all spans (metrics §1), never means of percentages.

    Never raises for data reasons: each combined section runs isolated as in
    `analyze_trace`; a section that failed (is null) in some span is null here too, with
    that span's reason; a value that is not a finite number in some span (None after
    `_clean`) makes the sums it enters unknown (None), not zero."""
    if len(results) == 1:
        return results[0]
    reports = [r.get("report") if isinstance(r.get("report"), dict) else {} for r in results]
    not_available: Dict[str, str] = {k: v for r in reports for k, v in (r.get("not_available") or {}).items()}
    sec = _Sections(not_available, source=f"summary of run {run!r} worker {worker!r}")
    out: dict = {"schema_version": SCHEMA_VERSION, "source": None, "run": run, "worker": worker, "span": None,
                 "spans": [s for r in reports for s in (r.get("spans") or [])]}
    out.update(sec.run("trace", _combine_header, reports)
               or {"device_names": {}, "device_properties": [], "trace": None})
    out["steps"] = sec.run("steps", _combine_steps, reports) if _all_present(reports, "steps", sec) else None
    out.update({"avg_step_us": None, "breakdown_us": None, "breakdown_pct": None, "breakdown_per_step": []})
    if _none_failed(reports, ("steps", "breakdown"), "breakdown", sec):
        out.update(sec.run("breakdown", _combine_breakdown, reports) or {})
    for name, fn in (("input", _combine_input), ("gpu", _combine_gpu), ("tensor_cores", _combine_tensor_cores),
                     ("occupancy", _combine_occupancy), ("memory", _combine_memory)):
        parts = _all_present(reports, name, sec)
        out[name] = sec.run(name, fn, parts, reports) if parts else None
    if out["gpu"] is not None and out["tensor_cores"] is not None:
        for dev, pct in (out["tensor_cores"].get("per_device") or {}).items():
            out["gpu"].setdefault(dev, {})["tensor_core_pct"] = pct
    for name, fn in (("sync", _combine_sync), ("communication", _combine_communication),
                     ("launch", _combine_launch)):
        parts = _all_present(reports, name, sec)
        out[name] = sec.run(name, fn, parts, reports) if parts else None
    _prune_not_available(out, not_available, sec.failed)
    out["not_available"] = not_available
    out["context"] = sec.run("context", context.combine, [r.get("context") for r in reports])
    out["recommendations"] = sec.run("recommendations", recommendations.recommend, out)
    out["verdicts"] = sec.run("verdicts", verdicts.card_verdicts, out)
    curves = sec.run("memory_curves", _combine_curves, results) or {"devices": {}}
    if out["memory"] is None:
        curves["not_available"] = not_available.get("memory")
    kernels = sec.run("kernels", _combine_kernel_rows, [r.get("kernels") or [] for r in results])
    if kernels is None:
        kernels = []
    if out["occupancy"] is not None:
        out["occupancy"]["kernels"] = kernels[:KERNELS_IN_REPORT]
    ops_table = sec.run("operators", operators.combine_tables, [r.get("operators") for r in results])
    op_view = sec.run("operator_view", operators.combine_views, [r.get("operator_view") for r in results])
    out["errors"] = [dict(e, span=r.get("span")) for r in reports for e in (r.get("errors") or [])
                     if isinstance(e, dict)] + sec.errors
    out["not_available_labels"] = not_available_labels(not_available)
    return {"report": _clean(out), "memory": _clean(curves), "kernels": _clean(kernels),
            "operators": ops_table, "operator_view": op_view}


def _all_present(reports: List[dict], section: str, sec: _Sections) -> Optional[list]:
    """The section of every span, or None (and the reason) when some span has none."""
    parts = []
    for r in reports:
        part = r.get(section)
        if not isinstance(part, dict):
            why = (r.get("not_available") or {}).get(section) or f"no {section} section"
            sec.not_available[section] = f"span {r.get('span')}: {why}"
            return None
        parts.append(part)
    return parts


def _none_failed(reports: List[dict], sections, name: str, sec: _Sections) -> bool:
    for r in reports:
        for e in r.get("errors") or []:
            if isinstance(e, dict) and e.get("section") in sections:
                sec.not_available[name] = f"span {r.get('span')}: {e.get('error')}"
                return False
    return True


def _prune_not_available(out: dict, not_available: Dict[str, str], failed: Dict[str, str]) -> None:
    """A span's n/a for a metric that the summary does have (another span had the data)
    is dropped: e.g. 'memory' when only one span recorded [memory] events."""
    for key in list(not_available):
        if key in failed or "." not in key:
            if key == "memory" and out.get("memory"):
                del not_available[key]
            continue
        value, node = out, True
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                node = False
                break
            value = value[part]
        if node and value is not None and not isinstance(value, dict):
            del not_available[key]


def _num(value) -> Optional[float]:
    """A finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _sum(values) -> Optional[float]:
    """Sum of finite numbers; None when one of them is unknown (None, NaN, inf, not a number)."""
    total = 0.0
    for v in values:
        v = _num(v)
        if v is None:
            return None
        total += v
    return total


def _pct(part, whole) -> Optional[float]:
    return 100.0 * part / whole if part is not None and whole else None


def _combine_header(reports: List[dict]) -> dict:
    facts = [r.get("trace") or {} for r in reports]
    return {
        "device_names": {k: v for r in reports for k, v in (r.get("device_names") or {}).items()},
        "device_properties": next((r.get("device_properties") for r in reports if r.get("device_properties")), []),
        "trace": {**{k: _sum(f.get(k) or 0 for f in facts)
                     for k in ("events", "kernels", "memcpys", "memsets", "runtime_calls", "cpu_events",
                               "memory_events", "duration_us")},
                  "gpu_devices": sorted({d for f in facts for d in (f.get("gpu_devices") or [])}, key=str),
                  "warnings": [w for f in facts for w in (f.get("warnings") or [])]},
    }


def _combine_steps(reports: List[dict]) -> dict:
    st = [r["steps"] for r in reports]
    return {"count": int(_sum(s.get("count") or 0 for s in st) or 0),
            "numbers": [n for s in st for n in (s.get("numbers") or [])],
            "excluded": [e for s in st for e in (s.get("excluded") or [])],
            "found": any(s.get("found") for s in st),
            "window_us": _sum(s.get("window_us") or 0 for s in st)}


def _combine_breakdown(reports: List[dict]) -> dict:
    per_step = [dict(s, span=r.get("span")) for r in reports for s in (r.get("breakdown_per_step") or [])
                if isinstance(s, dict)]
    n = len(per_step)
    if not n:
        return {"breakdown_us": None, "breakdown_pct": None, "avg_step_us": None, "breakdown_per_step": per_step}
    total = _sum(s.get("total_us") for s in per_step)
    sums = {c: _sum(s.get(c, 0.0) for s in per_step) for c in breakdown.CATEGORIES}
    return {"breakdown_us": {c: v / n if v is not None else None for c, v in sums.items()},
            "breakdown_pct": {c: _pct(v, total) for c, v in sums.items()},
            "avg_step_us": total / n if total is not None else None,
            "breakdown_per_step": per_step}


def _combine_input(parts: List[dict], reports=None) -> dict:
    per_step = [s for p in parts for s in (p.get("per_step") or []) if isinstance(s, dict)]
    step_us = _sum(s.get("step_us") for s in per_step)
    dataloader_us = _sum(s.get("dataloader_us") for s in per_step)
    if not per_step or not step_us or step_us <= 0 or dataloader_us is None:
        return {"input_bound_pct": None, "input_transfer_pct": None, "xprof_input_pct": None,
                "verdict": None, "severity": None, "per_step": per_step, "stats": None, "evidence": {}}
    pct = 100.0 * dataloader_us / step_us
    span_us = [_sum(s.get("step_us") for s in (p.get("per_step") or [])) for p in parts]
    transfer = _weighted([(p.get("input_transfer_pct"), w) for p, w in zip(parts, span_us)]) or 0.0
    verdict, severity = input_bound.verdict_for(pct)
    values = np.array([v for v in (_num(s.get("input_bound_pct")) for s in per_step) if v is not None])
    evid = [p.get("evidence") or {} for p in parts]
    slow = sorted((s for e in evid for s in (e.get("slowest_steps") or []) if isinstance(s, dict)),
                  key=lambda s: -(_num(s.get("step_us")) or 0.0))
    iters = sorted({str(i) for e in evid for i in (e.get("dataloader_iterators") or [])})
    return {
        "input_bound_pct": pct, "input_transfer_pct": transfer, "xprof_input_pct": pct + transfer,
        "verdict": verdict, "severity": severity, "per_step": per_step,
        "stats": {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
                  "std": float(values.std())} if len(values) else None,
        "evidence": {"dataloader_iterators": iters,
                     "num_workers_zero": input_bound.SINGLE_PROCESS_ITER in iters,
                     "slowest_steps": slow[:input_bound.SLOWEST_STEPS],
                     "pageable_h2d_copies": int(_sum(e.get("pageable_h2d_copies") or 0 for e in evid) or 0),
                     "pageable_h2d_us": _sum(e.get("pageable_h2d_us") or 0.0 for e in evid)},
    }


def _combine_gpu(parts: List[dict], reports: List[dict]) -> dict:
    out = {}
    for dev in sorted({d for p in parts for d in p}):
        entries = [(p[dev], (r.get("steps") or {}).get("window_us") or 0)
                   for p, r in zip(parts, reports) if isinstance(p.get(dev), dict)]
        merged: dict = {}
        # Utilization and SM efficiency are shares of each span's steps window.
        for key in ("utilization_pct", "est_sm_efficiency_pct"):
            merged[key] = _weighted([(e.get(key), w) for e, w in entries])
        # Occupancy is weighted by clipped kernel time (kernel_us approximates the weight's union).
        merged["est_achieved_occupancy_pct"] = _weighted([(e.get("est_achieved_occupancy_pct"), e.get("kernel_us"))
                                                          for e, _ in entries])
        merged["kernel_us"] = _sum(e.get("kernel_us") or 0.0 for e, _ in entries)
        idles = [e["idle"] for e, _ in entries if isinstance(e.get("idle"), dict)]
        if idles:
            idle = {k: _sum(i.get(k) or 0.0 for i in idles) for k in ("span_us", "idle_us", "host_wait_us",
                                                                       "kernel_wait_us", "other_us")}
            idle["idle_pct"] = _pct(idle["idle_us"], idle["span_us"])
            idle["view"] = idles[0].get("view")
            merged["idle"] = idle
        out[dev] = merged
    return out


def _combine_tensor_cores(parts: List[dict], reports=None) -> dict:
    kernel_us = _sum(p.get("kernel_us", 0.0) for p in parts)
    if kernel_us is not None and kernel_us <= 0:
        return dict(parts[0])
    tc_us = _sum(p.get("tensor_core_us") or 0.0 for p in parts)
    enu_us = _sum(p.get("eligible_not_using_us") or 0.0 for p in parts)
    ops: Dict[str, dict] = {}
    for p in parts:
        for op in p.get("top_eligible_not_using") or []:
            o = ops.setdefault(op.get("op"), dict(op, kernel_us=0.0, calls=0))
            o["kernel_us"] = _sum([o["kernel_us"], op.get("kernel_us") or 0.0])
            o["calls"] += int(_num(op.get("calls")) or 0)
    for o in ops.values():
        o["pct"] = _pct(o["kernel_us"], kernel_us)
    split = {}
    for key in (parts[0].get("precision_split_pct") or {}):
        split[key] = _weighted([((p.get("precision_split_pct") or {}).get(key), p.get("kernel_us")) for p in parts])
    per_device = {}
    for dev in {d for p in parts for d in (p.get("per_device") or {})}:
        per_device[dev] = _weighted([(p["per_device"].get(dev), p.get("kernel_us")) for p in parts
                                     if dev in (p.get("per_device") or {})])
    return {"tensor_core_pct": _pct(tc_us, kernel_us), "per_device": per_device,
            "eligible_not_using_pct": _pct(enu_us, kernel_us),
            "top_eligible_not_using": sorted(ops.values(), key=lambda o: -(o["kernel_us"] or math.inf))[:10],
            "precision_split_pct": split, "kernel_us": kernel_us, "tensor_core_us": tc_us,
            "eligible_not_using_us": enu_us}


def _combine_occupancy(parts: List[dict], reports=None) -> dict:
    weights = [_num(p.get("weighted_kernel_us")) or 0.0 for p in parts]
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
            e = buckets.setdefault(b.get("bucket"), dict(b, us=0.0))
            e["us"] += _num(b.get("us")) or 0.0
    hist_total = sum(b["us"] for b in buckets.values())
    out["histogram"] = [dict(b, pct=100.0 * b["us"] / hist_total if hist_total else 0.0)
                        for b in sorted(buckets.values(), key=lambda b: _num(b.get("lo")) or 0.0)]
    shorts = [p.get("short_kernels") for p in parts if isinstance(p.get("short_kernels"), dict)]
    if shorts:
        out["short_kernels"] = {
            "threshold_us": shorts[0].get("threshold_us"),
            "count": int(_sum(s.get("count") or 0 for s in shorts) or 0),
            "time_pct": _weighted([(p["short_kernels"].get("time_pct"), w) for p, w in zip(parts, weights)
                                   if isinstance(p.get("short_kernels"), dict)]),
            "mean_gap_us": _weighted([(s.get("mean_gap_us"), s.get("gap_count")) for s in shorts]),
            "gap_count": int(_sum(s.get("gap_count") or 0 for s in shorts) or 0)}
    else:
        out["short_kernels"] = None
    return out


def _combine_kernel_rows(tables: List[List[dict]]) -> List[dict]:
    """One row per kernel configuration; a total that is unknown in some span stays unknown."""
    rows: Dict[tuple, dict] = {}
    for table in tables:
        for k in table:
            if not isinstance(k, dict):
                continue
            key = (str(k.get("name")), str(k.get("device")), str(k.get("grid")), str(k.get("block")),
                   str(k.get("registers_per_thread")), str(k.get("shared_memory_bytes")))
            row = rows.get(key)
            if row is None:
                rows[key] = dict(k)
            else:
                row["calls"] = int(_num(row.get("calls")) or 0) + int(_num(k.get("calls")) or 0)
                row["total_us"] = _sum([row.get("total_us"), k.get("total_us")])
                row["mean_us"] = row["total_us"] / row["calls"] if row["calls"] and row["total_us"] is not None \
                    else None
    total = _sum(r.get("total_us") for r in rows.values())
    for r in rows.values():
        r["time_pct"] = _pct(_num(r.get("total_us")), total)
    return sorted(rows.values(), key=lambda r: -(_num(r.get("total_us")) if _num(r.get("total_us")) is not None
                                                  else math.inf))


def _combine_memory(parts: List[dict], reports=None) -> dict:
    out = {}
    for key in sorted({k for p in parts for k in p}):
        entries = [p[key] for p in parts if isinstance(p.get(key), dict)]
        allocs = [_num(e.get("peak_allocated_bytes")) for e in entries]
        reserves = [_num(e.get("peak_reserved_bytes")) for e in entries]
        # A peak is the maximum of the spans' peaks only when every span knows its own.
        peak_alloc = max(allocs) if None not in allocs else None
        peak_res = max(reserves) if None not in reserves else None
        merged = dict(entries[0])
        merged.update(peak_allocated_bytes=int(peak_alloc) if peak_alloc is not None else None,
                      peak_reserved_bytes=int(peak_res) if peak_res is not None else None,
                      allocated_is_relative=any(e.get("allocated_is_relative") for e in entries),
                      events=int(_sum(e.get("events") or 0 for e in entries) or 0))
        # The peaks of the union of the spans' samples are the maxima of their peaks,
        # so slack at the peak stays exact; the time-weighted one is a ratio of integrals.
        known_slack = all(e.get("slack_fragmentation_pct") is not None for e in entries)
        merged["slack_fragmentation_pct"] = (100.0 * (peak_res - peak_alloc) / peak_res
                                             if known_slack and peak_res and peak_alloc is not None else None)
        res_int = _sum(e.get("reserved_byte_us") for e in entries)
        slack_int = _sum(e.get("slack_byte_us") for e in entries)
        merged["slack_fragmentation_time_weighted_pct"] = _pct(slack_int, res_int)
        merged["reserved_byte_us"], merged["slack_byte_us"] = res_int or None, slack_int
        per_step = [s for e in entries for s in ((e.get("growth") or {}).get("per_step") or [])]
        merged["growth"] = {"per_step": per_step,
                            "possible_leak": any((e.get("growth") or {}).get("possible_leak") for e in entries)}
        out[key] = merged
    return out


def _combine_curves(results: List[dict]) -> dict:
    """Memory curves of the spans one after the other; a series some span lacks (reserved
    in a 2021-format span) is null for the device rather than misaligned with ts_us."""
    devices: Dict[str, dict] = {}
    for r in results:
        for dev, c in ((r.get("memory") or {}).get("devices") or {}).items():
            if isinstance(c, dict):
                devices.setdefault(dev, []).append(c)
    out: dict = {"devices": {}}
    for dev, curves in devices.items():
        merged: dict = {}
        for k in {k for c in curves for k in c}:
            series = [c.get(k) for c in curves]
            if all(isinstance(v, list) for v in series):
                merged[k] = [x for v in series for x in v]
            elif any(isinstance(v, list) for v in series):
                merged[k] = None
            else:
                merged[k] = next((v for v in series if v is not None), None)
        out["devices"][dev] = merged
    return out


def _combine_sync(parts: List[dict], reports: List[dict]) -> dict:
    sync_us = _sum(p.get("sync_us") or 0.0 for p in parts)
    ops: Dict[str, dict] = {}
    for p in parts:
        for op in p.get("top_ops") or []:
            o = ops.setdefault(op.get("op"), {"op": op.get("op"), "sync_us": 0.0, "count": 0})
            o["sync_us"] = _sum([o["sync_us"], op.get("sync_us")])
            o["count"] += int(_num(op.get("count")) or 0)
    calls: Dict[str, dict] = {}
    for p in parts:
        for c in p.get("calls") or []:
            e = calls.setdefault(c.get("name"), {"name": c.get("name"), "us": 0.0, "count": 0})
            e["us"] = _sum([e["us"], c.get("us")])
            e["count"] += int(_num(c.get("count")) or 0)
    idle_us = _sum(p.get("sync_gpu_idle_us") or 0.0 for p in parts)
    return {"sync_us": sync_us, "sync_pct": _pct(sync_us, _steps_us(reports)),
            "sync_gpu_idle_us": idle_us, "sync_gpu_idle_pct": _pct(idle_us, _steps_us(reports)),
            "gpu_busy_during_sync_pct": _weighted([(p.get("gpu_busy_during_sync_pct"), p.get("sync_us"))
                                                   for p in parts]),
            "top_ops": sorted(ops.values(), key=lambda o: -(o["sync_us"] or math.inf))[:10],
            "calls": sorted(calls.values(), key=lambda c: -(c["us"] or math.inf))}


def _steps_us(reports: List[dict]) -> Optional[float]:
    """Σ included step time over the spans (from the input section's per-step rows)."""
    return _sum(s.get("step_us") for r in reports for s in ((r.get("input") or {}).get("per_step") or []))


def _combine_communication(parts: List[dict], reports=None) -> dict:
    comm_us = _sum(c.get("comm_us") or 0.0 for c in parts)
    kernel_union = _sum((_num(c.get("comm_us")) or 0.0) * 100.0 / c["comm_pct_of_kernel_time"]
                        for c in parts if _num(c.get("comm_pct_of_kernel_time")))
    return {"comm_us": comm_us,
            "overlap_pct": _weighted([(c.get("overlap_pct"), c.get("comm_us")) for c in parts]),
            "comm_pct_of_kernel_time": _pct(comm_us, kernel_union)}


def _combine_launch(parts: List[dict], reports: List[dict]) -> dict:
    launch_us = _sum(p.get("launch_us") or 0.0 for p in parts)
    return {"launch_us": launch_us,
            "kernels_per_step": _weighted([(p.get("kernels_per_step"), (r.get("steps") or {}).get("count"))
                                           for p, r in zip(parts, reports)]),
            "launch_pct": _pct(launch_us, _steps_us(reports))}


def _weighted(pairs) -> Optional[float]:
    pairs = [(_num(v), _num(w)) for v, w in pairs]
    pairs = [(v, w) for v, w in pairs if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


# ---------------------------------------------------------------------------- text


def format_text(rep: dict, indent: str = "") -> str:
    """The report for a terminal; kept as an alias of `text_report.format_report`."""
    from . import text_report

    return text_report.format_report(rep, indent=indent)
