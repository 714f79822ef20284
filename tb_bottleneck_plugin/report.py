"""Assembles the one report object (docs/report-schema.md, metrics §10).

`analyze_span` is the single place where a trace file becomes results: load once, run
every metric unit of analysis/registry.py once (each isolated: a failing unit is that
section's n/a), keep only plain JSON-able results (report, memory curves, kernel table,
each unit's additive partial) and drop the trace. The plugin, the CLI and the disk cache
all store and serve exactly what this returns; `combine_results` builds worker/run
summaries as each unit's finish over the merged partials of the spans. Terminal text is
text_report.py's; file access is discovery's and storage's.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import posixpath
import threading
from typing import Dict, List, Optional

import numpy as np

from .trace import decode_workers, discovery, heap, loader, model, storage
from .judge import cards, layout, recommendations, step_verdict
from .analysis import devices, memory, occupancy, operators, registry, units
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
    storage.forget_listing(fs, span.path)  # a reused analysis process may hold a stale listing
    trace = loader.load_trace(span.path, fs=fs, source=span.url, progress=progress)
    snapshot = _find_snapshot(fs, posixpath.dirname(span.path))
    return analyze_trace(trace, run=getattr(run, "name", None), worker=_worker_of(run, span),
                         span=span.name, snapshot=snapshot, timeline=timeline)


def _worker_of(run, span) -> Optional[str]:
    for w in getattr(run, "workers", []):
        if any(s.url == span.url for s in w.spans):
            return w.name
    return None


def _find_snapshot(fs, run_dir: str) -> Optional[dict]:
    """A CUDA memory snapshot in the run directory (found by discovery, read through
    storage), as analysis.memory.apply_snapshot takes it; None when there is none."""
    for path in discovery.files_matching(fs, run_dir, memory.MEMORY_SNAPSHOT_PATTERNS):
        try:
            with storage.open_binary(fs, path) as f:
                summary = memory.memory_snapshot_summary(f)  # fragmentation, and the holders for memory_peak
                return {"path": path, "fragmentation": summary["fragmentation"], "holders": summary["holders"]}
        except (OSError, BottleneckError, pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError) as exc:
            return {"path": path, "error": f"{path}: not a readable CUDA memory snapshot ({exc})"}
    return None


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
            # absurd times (a duration of 1e308) overflow to inf, which the sections show as n/a:
            # never a numpy warning on stderr
            with np.errstate(over="ignore", invalid="ignore"):
                return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - isolation is the point: any bug is one section's n/a
            self.fail(section, exc)
            return None
        finally:  # the section's temporaries' heap pages back to the system before the next (trace/heap.py)
            heap.release_free_memory()

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


def analyze_trace(trace: model.TraceData, *, run=None, worker=None, span=None, snapshot=None,
                  timeline: bool = False) -> dict:
    """Every analysis of one loaded trace, once: {"report", "memory", "kernels", ...,
    "partials"}.

    The metric units of analysis/registry.py run in order, each isolated (`_Sections`):
    an exception in one is that section as null plus `not_available[<section>]` and a
    `report["errors"]` entry; units that need a failed one say so in their own
    `not_available` entry; the rest is computed. `partials` holds each unit's additive
    sufficient statistics, from which combine_results builds worker and run summaries."""
    not_available: Dict[str, str] = {}
    sec = _Sections(not_available, source=trace.meta.source)
    rep: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": trace.meta.source,
        "run": run, "worker": worker, "span": span,
        "spans": [trace.meta.source],
    }
    ctx = units.SpanContext(trace=trace, report=rep, not_available=not_available, snapshot=snapshot,
                            sections=sec, extras={"memory": {"devices": {}}, "timeline": timeline})
    lanes = _unit_lanes(trace)
    late: Dict[str, tuple] = {}  # the span result's parts beside the report, when made in the lanes
    if lanes is None:
        _run_units(registry.UNITS, ctx, sec)
    else:
        before, lane_units, after = lanes
        _run_units(before, ctx, sec)
        late = _run_lanes(lane_units, ctx, sec, late=[
            (0, "operator_view", lambda lane_ctx, lane_sec: _operator_view_and_store(lane_ctx, lane_sec, timeline)),
            (1, "distributed", lambda lane_ctx, lane_sec: lane_sec.run(
                "distributed", distributed.span_partial, trace, lane_ctx.found, span=lane_ctx))])
        _run_units(after, ctx, sec)
    for join in registry.JOINS:
        join(rep)
    curves = ctx.extras["memory"]
    if rep["memory"] is None:
        curves["not_available"] = not_available.get("memory")
    found = ctx.found
    rep["not_available"] = not_available
    rep["recommendations"] = sec.run("recommendations", recommendations.recommend, rep)
    rep["verdicts"] = sec.run("verdicts", cards.card_verdicts, rep)  # card colours (thresholds.py)
    rep["verdict"] = sec.run("verdict", step_verdict.step_verdict, rep)  # the one sentence on top (§19)
    rep["layout"] = sec.run("layout", layout.report_layout, rep)  # card groups, sections (§21)
    kernels = []
    if rep["occupancy"] is not None:
        kernels = sec.run("kernels", _kernel_table_section, rep["occupancy"])
        if kernels is None:
            kernels = []
            rep["occupancy"]["kernels"] = []
    # the operator view and the rank partial reuse the span's op nesting and GPU->runtime index (ctx)
    if late:  # made in the lanes: their n/a entries and errors here, as if made now
        op_view, store = _take_late(late["operator_view"], ctx, sec)
        dist_part = _take_late(late["distributed"], ctx, sec)
    else:
        op_view, store = _operator_view_and_store(ctx, sec, timeline)
        dist_part = sec.run("distributed", distributed.span_partial, trace, found, span=ctx)  # ranks.rank_view input
    rep["errors"] = sec.errors
    rep["not_available_labels"] = not_available_labels(not_available, rep)
    out_report = _clean(rep)
    out = {} if not timeline else {"timeline_store": store}
    return {**out, "report": out_report, "memory": _clean(curves), "kernels": _clean(kernels),
            "operator_view": op_view,  # the /operators route and compare's op diff (METRICS.md §13)
            "kernel_names": _clean(ctx.extras.get("kernel_names")),  # compare's kernel diff (METRICS.md §11)
            "distributed": dist_part,
            "partials": _clean(span_partials(out_report))}


def _operator_view_and_store(ctx: units.SpanContext, sec: _Sections, timeline: bool):
    """(the Operator view, the step-timeline store or None), then the op nesting released."""
    trace, found = ctx.trace, ctx.found
    op_view = sec.run("operator_view", operators.operator_view, trace, found, span=ctx) if found is not None else None
    store = None
    if timeline:  # the step-timeline store, from the same per-span context (steps, unions); before
        # the rank partial, which does not read the op nesting the store releases (48 bytes per op)
        from .analysis import timeline as _timeline

        store = _Sections({}, source=trace.meta.source).run("timeline", _timeline.build_store, trace, span=ctx)
    ctx.release("op_nesting")  # (its last readers, the Operator view and the store, have run)
    return op_view, store


def _run_units(unit_list, ctx: units.SpanContext, sec: _Sections) -> None:
    """The units one after another, each isolated (`_Sections.run`), into ``ctx.report``."""
    rep = ctx.report
    for unit in unit_list:
        rep.update(unit.defaults())
        if not sec.needs(unit.name, *unit.requires):
            continue
        value = sec.run(unit.name, unit.compute, ctx)
        if value is not None:
            rep.update(value) if unit.fields is not None else rep.__setitem__(unit.name, value)


ANALYSIS_THREADS_ENV = "TB_BOTTLENECKS_ANALYSIS_THREADS"  # "0": the units one after another
# Two lanes hold two units' temporaries at once: ~17 bytes more per host event at the peak
# (10M tiny CPU events: 1,017 -> 1,188 MiB; the 292 MB benchmark trace, 0.32M host events:
# +8-18 MB). Above this many host events (~50 MB more) the units run one after another,
# so that the peak of a trace of many small events stays what the scheduler reserves.
LANES_MAX_HOST_EVENTS = 3_000_000


def _unit_lanes(trace: model.TraceData):
    """(units before, [(unit, lane)] of the units that run in two lanes, units after), or
    None to run them one after another: one usable core, TB_BOTTLENECKS_ANALYSIS_THREADS=0,
    more than LANES_MAX_HOST_EVENTS host events, or a registry whose units between `steps`
    and `step_model` are not all in a lane."""
    if os.environ.get(ANALYSIS_THREADS_ENV, "").strip() == "0" or decode_workers.usable_cores() < 2:
        return None
    if len(trace.cpu) + len(trace.runtime) > LANES_MAX_HOST_EVENTS:
        return None
    names = [u.name for u in registry.UNITS]
    if "steps" not in names or "step_model" not in names:
        return None
    first, last = names.index("steps") + 1, names.index("step_model")
    lane_of = {n: 0 for n in registry.NESTING_LANE}
    lane_of.update((n, 1) for n in registry.OTHER_LANE)
    middle = registry.UNITS[first:last]
    if not middle or any(u.name not in lane_of for u in middle):
        return None
    return registry.UNITS[:first], [(u, lane_of[u.name]) for u in middle], registry.UNITS[last:]


def _run_lanes(lane_units, ctx: units.SpanContext, sec: _Sections, late=()) -> Dict[str, tuple]:
    """`_run_units` of ``lane_units`` ([(unit, lane 0 or 1)], registry order), lane 1 in a
    thread at the same time as lane 0, each lane's ``late`` tasks ([(lane, name,
    fn(lane_ctx, lane_sec))]) after its units. Each unit and task writes its
    `not_available` entries and errors into copies of its own: the units' are taken here
    in registry order, so the report is the one running them one after another gives;
    the tasks' are returned ({name: (value, own entries, own sections, entries before)})
    for `_take_late` where the report made them before."""
    before = dict(ctx.not_available)
    done: Dict[str, tuple] = {}

    def own():
        own_na = dict(before)
        own_sec = _Sections(own_na, source=sec.source)
        own_sec.failed = dict(sec.failed)
        return own_na, own_sec, dataclasses.replace(ctx, not_available=own_na, sections=own_sec)

    def run_lane(lane: int) -> None:
        for unit, in_lane in lane_units:
            if in_lane != lane:
                continue
            own_na, own_sec, unit_ctx = own()
            value = None
            if own_sec.needs(unit.name, *unit.requires):
                value = own_sec.run(unit.name, unit.compute, unit_ctx)
            done[unit.name] = (value, own_na, own_sec, before)
        for in_lane, name, fn in late:
            if in_lane == lane:
                own_na, own_sec, task_ctx = own()
                done[name] = (fn(task_ctx, own_sec), own_na, own_sec, before)

    _side_by_side(lambda: run_lane(0), lambda: run_lane(1))
    rep = ctx.report
    for unit, _ in lane_units:
        value = _take_late(done[unit.name], ctx, sec)
        rep.update(unit.defaults())
        if value is not None:
            rep.update(value) if unit.fields is not None else rep.__setitem__(unit.name, value)
    return {name: done[name] for _, name, _ in late}


def _take_late(made: tuple, ctx: units.SpanContext, sec: _Sections):
    """The value of a unit or task run on copies (`_run_lanes`), its `not_available` entries
    and errors now taken into ``ctx``'s and ``sec``'s."""
    value, own_na, own_sec, before = made
    shared_na = ctx.not_available
    for key in [k for k in before if k not in own_na]:  # (a unit may drop an entry)
        shared_na.pop(key, None)
    for key, reason in own_na.items():
        if before.get(key, None) is not reason:
            shared_na[key] = reason
    for key, message in own_sec.failed.items():
        if key not in sec.failed:
            sec.failed[key] = message
    sec.errors.extend(own_sec.errors)
    return value


def _side_by_side(here, beside):
    """(here(), beside()), beside() in a thread of its own meanwhile (`_unit_lanes` checked the
    cores). Exceptions are raised here."""
    out: list = []

    def run_beside():
        try:
            out.append(("ok", beside()))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            out.append(("error", exc))

    thread = threading.Thread(target=run_beside, name="tb-bottlenecks-analysis", daemon=True)
    thread.start()
    try:
        first = here()
    finally:
        thread.join()
    kind, second = out[0]
    if kind == "error":
        raise second
    return first, second


def span_partials(rep: dict) -> Dict[str, Optional[dict]]:
    """Each unit's partial of one span report (None for a unit whose section is missing
    or whose partial cannot be made; combine_results then recomputes or says why)."""
    out: Dict[str, Optional[dict]] = {}
    for unit in registry.UNITS:
        try:
            out[unit.name] = unit.partial(rep) if _present(rep, unit) else None
        except Exception:  # noqa: BLE001 - combine_results reports it, isolated, if it matters
            log.debug("partial of %s failed", unit.name, exc_info=True)
            out[unit.name] = None
    return out


def _present(rep: dict, unit) -> bool:
    return unit.fields is not None or isinstance(rep.get(unit.name), dict)


def _kernel_table_section(occ: dict) -> List[dict]:
    """The full kernel table (kernels route); the report keeps its top rows."""
    kernels = list(occ.pop("kernels", None) or [])
    occ["kernels"] = kernels[:KERNELS_IN_REPORT]
    return kernels


def _clean(value):
    """numpy scalars -> Python, NaN/inf -> None: plain JSON everywhere."""
    # exact types first, and the scalars of a list in line: a report holds ~10^5 values
    t = type(value)
    if t is float:
        return value if value - value == 0 else None
    if t is dict:
        return {k if type(k) is str else str(k): _clean(v) for k, v in value.items()}
    if t is list or t is tuple or t is np.ndarray:
        out = []
        for v in (value.tolist() if t is np.ndarray else value):
            tv = type(v)
            if tv is float:
                out.append(v if v - v == 0 else None)
            elif tv is int or tv is str or v is None:
                out.append(v)
            else:
                out.append(_clean(v))
        return out
    if t is int or t is str or value is None:
        return value
    # subclasses (a namedtuple, an OrderedDict, an array subclass) as their base type
    if isinstance(value, dict):
        return _clean(dict(value))
    if isinstance(value, (list, tuple)):
        return _clean(list(value))
    if isinstance(value, np.ndarray):
        return _clean(np.asarray(value))
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
    "kernels": "Kernel table", "kernel_names": "Kernel times by name", "memory_curves": "Memory over time", "operator_view": "Operator view",
    "context": "Workload context", "distributed": "Distributed run", "verdicts": "Card verdicts",
    "memory_peak": "Memory at the peak",
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


def not_available_label(key: str, report: Optional[dict] = None) -> str:
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
        head = devices.label(rest[0], report) + (" memory" if section == "memory" else "")
        rest = rest[1:]
    elif section == "memory_peak" and rest:  # memory_peak.<device>[.<metric>]
        head = devices.label(rest[0], report) + " memory at the peak"
        rest = rest[1:]
    if not rest:
        return head
    metric = ".".join(rest)
    words = _METRIC_LABELS.get(metric) or " ".join(_words(r) for r in rest)
    return f"{head}: {words}"


def not_available_labels(not_available: Dict[str, str], report: Optional[dict] = None) -> Dict[str, str]:
    """``report``: its ``device_labels`` name the devices (analysis/devices.py)."""
    return {key: not_available_label(key, report) for key in not_available}


# ---------------------------------------------------------------------------- summaries


def combine_results(results: List[dict], *, run=None, worker=None, views: bool = True) -> dict:
    """A worker or run summary from span results: each unit's partials merged
    (analysis/units.merge: sums, maxima, rows) and finished as ratios of sums over all
    included steps of all spans (metrics §1), never means of percentages. Per-step parts
    are one row per step number across the spans (units.per_step_across_spans): the
    summary grows with steps, not with spans × steps; a span's own rows are its report.

    ``views=False`` leaves out the run-level Operator view and kernel names (the heavy
    part at many spans, read only by the operators route and compare): `combine_views`
    computes them when asked for (the service caches them beside the summary).

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
    for unit in registry.UNITS:
        out.update(unit.defaults())
        if not _group_has(unit, reports, sec):
            continue
        value = sec.run(unit.name, _finish, unit, results, reports)
        if value is not None:
            out.update(value) if unit.fields is not None else out.__setitem__(unit.name, value)
    for join in registry.JOINS:
        if out.get("tensor_cores") is not None:  # a summary without the Tensor Core section adds nothing
            join(out)
    _prune_not_available(out, not_available, sec.failed)
    for unit in registry.UNITS:  # reasons a summary answers itself (units.Unit.summary_not_available)
        if unit.summary_not_available is not None and isinstance(out.get(unit.name), dict):
            sec.run(unit.name, unit.summary_not_available, out, not_available)
    out["not_available"] = not_available
    out["recommendations"] = sec.run("recommendations", recommendations.recommend, out)
    out["verdicts"] = sec.run("verdicts", cards.card_verdicts, out)
    out["verdict"] = sec.run("verdict", step_verdict.step_verdict, out)
    out["layout"] = sec.run("layout", layout.report_layout, out)
    # Memory curves are per span (the memory route of a summary offers its spans).
    curves = {"devices": {}, "not_available": "memory curves are shown per span: pick one of the summary's spans"}
    kernels = sec.run("kernels", occupancy.combine_kernel_rows, [r.get("kernels") or [] for r in results])
    if kernels is None:
        kernels = []
    if out["occupancy"] is not None:
        out["occupancy"]["kernels"] = kernels[:KERNELS_IN_REPORT]
    extra = _combine_views(results, sec) if views else {}
    out["errors"] = [dict(e, span=r.get("span")) for r in reports for e in (r.get("errors") or [])
                     if isinstance(e, dict)] + sec.errors
    out["not_available_labels"] = not_available_labels(not_available, out)
    return {"report": _clean(out), "memory": curves, "kernels": _clean(kernels), **extra}


def combine_views(results: List[dict]) -> dict:
    """{"operator_view", "kernel_names", "view_errors"} of a group of spans (what
    ``combine_results`` leaves out with ``views=False``); each view None when it cannot be
    made (logged, isolated), with its {"section", "error"} entry in ``view_errors`` so that
    the route that asked for it can say why (a single span's failures are in its report's
    errors already)."""
    if len(results) == 1:
        return {**{k: results[0].get(k) for k in ("operator_view", "kernel_names")}, "view_errors": []}
    sec = _Sections({}, source="run-level views")
    return {**_combine_views(results, sec), "view_errors": sec.errors}


def _combine_views(results: List[dict], sec: _Sections) -> dict:
    op_view = sec.run("operator_view", operators.combine_views, [r.get("operator_view") for r in results])
    kernel_names = sec.run("kernel_names", occupancy.combine_kernel_names, [r.get("kernel_names") for r in results])
    return {"operator_view": op_view, "kernel_names": kernel_names}


def _finish(unit, results: List[dict], reports: List[dict]):
    """The unit's section of a group: its finish over the merged partials of the spans
    (a span result without stored partials, e.g. built by hand, gets them from its report)."""
    parts = []
    for res, rep in zip(results, reports):
        part = (res.get("partials") or {}).get(unit.name) if isinstance(res.get("partials"), dict) else None
        parts.append(part if part is not None else unit.partial(rep))
    return unit.finish(units.merge(parts))


def _group_has(unit, reports: List[dict], sec: _Sections) -> bool:
    """Whether a group of spans gets the unit's section (units.Unit.group); if not, its
    not_available entry says which span lacks it and why."""
    if unit.group == units.ALWAYS:
        return True
    if unit.group == units.NONE_FAILED:
        for r in reports:
            for e in r.get("errors") or []:
                if isinstance(e, dict) and e.get("section") in unit.requires + (unit.name,):
                    sec.not_available[unit.name] = f"span {r.get('span')}: {e.get('error')}"
                    return False
        return True
    for r in reports:
        if not isinstance(r.get(unit.name), dict):
            why = (r.get("not_available") or {}).get(unit.name) or f"no {unit.name} section"
            sec.not_available[unit.name] = f"span {r.get('span')}: {why}"
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
