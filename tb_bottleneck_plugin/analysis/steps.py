"""Steps (metrics.md §1): host `ProfilerStep#N` spans, stretched over the GPU work
they launched, with tbp's tail-step exclusion.

``find_steps(trace) -> Steps``. Everything downstream (breakdown, input-bound, GPU
metrics, signals) works on ``Steps.start/end`` of the included steps and on the
steps window ``Steps.window``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, TraceData
from .linking import gpu_runtime_index

# At most 18 digits: N must fit int64 (a name like ProfilerStep#99999999999999999999 is
# not a step; the steps arrays are int64).
_STEP_NAME = re.compile(r"^ProfilerStep#(\d{1,18})$")

REASON_NO_GPU = "trailing step that launched no GPU activity"
REASON_CUT_OFF = ("launched {n} GPU activities, fewer than " + f"{100 * T.STEP_TAIL_MIN_GPU_RATIO:g}%"
                  + " of the {prev} of the step before it (cut off by the end of the profiling window)")

# Number given to the single window of a trace without ProfilerStep (as tbp's '0').
NO_STEP_NUMBER = 0


@dataclass
class Steps:
    """All steps of one trace file, sorted by host start.

    Arrays have one entry per step (included or not):
    - ``numbers``: N of ``ProfilerStep#N`` (``NO_STEP_NUMBER`` for the no-steps window)
    - ``host_start``/``host_end``: the CPU span
    - ``start``/``end``: the stretched step (equal to the host span when not stretched)
    - ``gpu_count``: GPU activities (kernels+memcpy+memset) launched by calls wholly
      inside the host span; ``gpu_end``: end of the last of them (NaN if none)
    - ``included``: bool mask of the steps that count
    - ``cpu_rows``: row in trace.cpu of the step span (-1 for the no-steps window)
    Also ``excluded`` ([{number, reason}]), ``found`` (False: no ProfilerStep, one
    window over the whole trace), ``stretched`` (GPU work was linked to steps),
    ``gpu_step`` (for each trace.gpu row the step index that launched it, -1 if none).
    """

    numbers: np.ndarray
    host_start: np.ndarray
    host_end: np.ndarray
    start: np.ndarray
    end: np.ndarray
    gpu_count: np.ndarray
    gpu_end: np.ndarray
    included: np.ndarray
    cpu_rows: np.ndarray
    excluded: List[Dict] = field(default_factory=list)
    found: bool = True
    stretched: bool = False
    gpu_step: Optional[np.ndarray] = None
    # The ProfilerStep annotation's own end, before clipping to the recorded activity
    # (equal to host_end where nothing was clipped; None: as host_end), and the recorded
    # activity window (first, last) of the trace (METRICS.md §1; NaN when empty).
    annotation_end: Optional[np.ndarray] = None
    activity: Tuple[float, float] = (float("nan"), float("nan"))

    # --- views on the included steps -------------------------------------------
    @property
    def count(self) -> int:
        return int(self.included.sum())

    @property
    def inc_numbers(self) -> np.ndarray:
        return self.numbers[self.included]

    @property
    def inc_start(self) -> np.ndarray:
        return self.start[self.included]

    @property
    def inc_end(self) -> np.ndarray:
        return self.end[self.included]

    @property
    def inc_host_start(self) -> np.ndarray:
        return self.host_start[self.included]

    @property
    def inc_host_end(self) -> np.ndarray:
        return self.host_end[self.included]

    @property
    def durations(self) -> np.ndarray:
        """Stretched durations of the included steps."""
        return self.inc_end - self.inc_start

    @property
    def window(self) -> Tuple[float, float]:
        """Steps window: start of the first included step to end of the last one
        (NaN, NaN when there is none)."""
        if self.count == 0:
            return float("nan"), float("nan")
        return float(self.inc_start.min()), float(self.inc_end.max())

    @property
    def clipped(self) -> List[Dict]:
        """Steps whose annotation outlasted the recorded activity (METRICS.md §1):
        [{number, annotation_us, recorded_us, clipped_us}], included or not."""
        if self.annotation_end is None:
            return []
        cut = self.annotation_end - self.host_end
        return [{"number": int(self.numbers[i]),
                 "annotation_us": float(self.annotation_end[i] - self.host_start[i]),
                 "recorded_us": float(self.host_end[i] - self.host_start[i]),
                 "clipped_us": float(cut[i])} for i in np.flatnonzero(cut > 0)]

    @property
    def clipped_us(self) -> float:
        """Annotation time past the recorded activity, cut off the steps (all steps)."""
        if self.annotation_end is None:
            return 0.0
        return float(np.maximum(self.annotation_end - self.host_end, 0.0).sum())

    @property
    def activity_us(self) -> Optional[float]:
        """Length of the recorded activity window (None when the trace recorded none)."""
        lo, hi = self.activity
        return float(hi - lo) if np.isfinite(lo) and np.isfinite(hi) and hi >= lo else None

    def to_report(self) -> dict:
        """The report's ``steps`` object."""
        return {"count": self.count, "numbers": [int(n) for n in self.inc_numbers],
                "excluded": list(self.excluded), "found": bool(self.found),
                "clipped_us": self.clipped_us, "clipped": self.clipped, "activity_us": self.activity_us}


def step_rows(trace: TraceData) -> Tuple[np.ndarray, np.ndarray]:
    """Rows of trace.cpu that are CPU `ProfilerStep#N` spans and their N.
    gpu_user_annotation copies are not in trace.cpu, so they never count."""
    ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#") and _STEP_NAME.match(s) is not None)
    if len(ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kind_ok = (trace.cpu.kind == CPU_OP) | (trace.cpu.kind == CPU_USER_ANNOTATION)
    rows = np.flatnonzero(np.isin(trace.cpu.name, ids) & kind_ok)
    num_of = {int(i): int(_STEP_NAME.match(trace.strings[i]).group(1)) for i in ids}
    nums = np.array([num_of[int(n)] for n in np.unique(trace.cpu.name[rows])], dtype=np.int64)
    lut = dict(zip(np.unique(trace.cpu.name[rows]).tolist(), nums.tolist()))
    numbers = np.array([lut[n] for n in trace.cpu.name[rows].tolist()], dtype=np.int64) if len(rows) else \
        np.zeros(0, np.int64)
    return rows, numbers


def trace_extent(trace: TraceData) -> Tuple[float, float]:
    """First and last time of every complete event except `Trace`, plus memory
    events (the no-steps window of §1)."""
    lo, hi = trace.meta.first_ts, trace.meta.last_ts
    a = trace.gpu_annotations
    if len(a):
        lo = np.nanmin([lo, float(a.ts.min())])
        hi = np.nanmax([hi, float((a.ts + a.dur).max())])
    return float(lo), float(hi)


def recorded_activity(trace: TraceData, step_rows: np.ndarray) -> Tuple[float, float]:
    """(first, last) time of the activity the profiler recorded, when the file has the
    profiler's own span (the `Trace` event "PyTorch Profiler (0)", in every Kineto trace):
    that span, widened to every CPU op and other host event but the `ProfilerStep#N`
    annotations (``step_rows``), runtime calls, GPU activity and memory events
    (gpu_user_annotation labels do not count: they copy the steps). Without the profiler's
    span (hand-made or converted files) nothing tells a step's end from host time after its
    last recorded op: the window is then the whole trace (steps included), so no step is
    clipped. (NaN, NaN) when nothing was recorded."""
    p_lo, p_hi = trace.meta.profiler_start_ts, trace.meta.profiler_end_ts
    if not (np.isfinite(p_lo) and np.isfinite(p_hi)):
        lo, hi = trace_extent(trace)
        return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else (float("nan"), float("nan"))
    lo, hi = [float(p_lo)], [float(p_hi)]
    cpu = trace.cpu
    if len(cpu):
        keep = np.ones(len(cpu), bool)
        keep[step_rows] = False
        if keep.any():  # (the extremes of the kept rows read in place, not copies of 2 columns)
            lo.append(float(np.min(cpu.ts, where=keep, initial=np.inf)))
            hi.append(float(np.max(cpu.ts + cpu.dur, where=keep, initial=-np.inf)))
    for table in (trace.runtime, trace.gpu):
        if len(table):
            lo.append(float(table.ts.min()))
            hi.append(float((table.ts + table.dur).max()))
    if len(trace.memory):
        lo.append(float(trace.memory.ts.min()))
        hi.append(float(trace.memory.ts.max()))
    return min(lo), max(hi)


def clip_to_recorded(trace: TraceData, step_rows: np.ndarray, host_start: np.ndarray,
                     host_end: np.ndarray, activity_end: float) -> np.ndarray:
    """Host ends of the steps (sorted by host start) clipped to the recorded activity
    (METRICS.md §1): a step whose annotation ends after the recorded activity window
    (``activity_end``) ends at the end of the last CPU event or runtime call that starts
    inside it (never past the annotation), or, with none, at the window's end (never
    before its start). Other steps keep their annotation end, so traces whose steps lie
    inside the profiler's span are unchanged."""
    if not np.isfinite(activity_end):
        return host_end
    outlasts = host_end > activity_end
    if not outlasts.any():
        return host_end
    cpu, rt = trace.cpu, trace.runtime
    keep = np.ones(len(cpu), bool)
    keep[step_rows] = False
    ts = np.concatenate([cpu.ts[keep], rt.ts]).astype(np.float64)
    end = np.concatenate([(cpu.ts + cpu.dur)[keep], rt.ts + rt.dur]).astype(np.float64)
    last = np.full(len(host_start), -np.inf)
    if len(ts):
        j = np.searchsorted(host_start, ts, side="right") - 1
        jj = np.maximum(j, 0)
        inside = (j >= 0) & (ts < host_end[jj])
        np.maximum.at(last, j[inside], np.minimum(end[inside], host_end[j[inside]]))
    target = np.where(np.isfinite(last), last, activity_end)
    out = host_end.copy()
    out[outlasts] = np.maximum(host_start[outlasts], np.minimum(host_end[outlasts], target[outlasts]))
    return out


def runtime_step_index(trace: TraceData, host_start: np.ndarray, host_end: np.ndarray) -> np.ndarray:
    """For each runtime row, the index of the step (in host_start order, which must be
    sorted) whose host span wholly contains the call (any thread), else -1."""
    rt = trace.runtime
    out = np.full(len(rt), -1, dtype=np.int64)
    if len(host_start) == 0 or len(rt) == 0:
        return out
    j = np.searchsorted(host_start, rt.ts, side="right") - 1
    ok = j >= 0
    jj = np.maximum(j, 0)
    ok &= rt.ts + rt.dur <= host_end[jj]
    out[ok] = j[ok]
    return out


def find_steps(trace: TraceData, gpu_runtime: Optional[np.ndarray] = None) -> Steps:
    """Steps of one trace file, following metrics.md §1 exactly.

    - Steps are CPU `ProfilerStep#N` spans only, clipped to the recorded activity: an
      annotation that ends after the recorded activity window (every other event and the
      profiler's own `Trace` span) ends at the end of the last CPU event or runtime call
      that starts inside it (``clip_to_recorded``; ``Steps.clipped`` says how much).
    - When some GPU activity is linked to some step (through a runtime/driver call
      wholly inside the host span, correlation to the GPU row), every step is
      stretched: start = max(previous end, host start), end = max(host end, end of the
      last GPU activity it launched) or max(host end, start) when it launched none.
      The first step's "previous end" is the end of the last GPU activity that no step
      launched and that ended before the first GPU activity the first step launched
      (or its host start).
    - tbp's exclusion (only when stretched and more than one step): trailing steps that
      launched no GPU activity, and the last launching step when it launched fewer
      than 80 % of the GPU activities of the step before it.
    - No ProfilerStep: one window over the whole trace (``found=False``).

    ``gpu_runtime``: linking.gpu_runtime_index(trace) when the caller has it.
    """
    rows, numbers = step_rows(trace)
    n_gpu = len(trace.gpu)
    activity = recorded_activity(trace, rows)
    if len(rows) == 0:
        lo, hi = trace_extent(trace)
        if not np.isfinite(lo):
            lo = hi = 0.0
        one = lambda v: np.array([v], dtype=np.float64)
        return Steps(numbers=np.array([NO_STEP_NUMBER]), host_start=one(lo), host_end=one(hi),
                     start=one(lo), end=one(hi), gpu_count=np.zeros(1, np.int64),
                     gpu_end=one(np.nan), included=np.ones(1, bool), cpu_rows=np.array([-1]),
                     excluded=[], found=False, stretched=False,
                     gpu_step=np.full(n_gpu, -1, np.int64), activity=activity)

    order = np.lexsort((trace.cpu.dur[rows], trace.cpu.ts[rows]))
    rows, numbers = rows[order], numbers[order]
    host_start = trace.cpu.ts[rows].astype(np.float64)
    annotation_end = host_start + trace.cpu.dur[rows]
    # An annotation that outlasts the recorded activity ends with the activity it holds.
    host_end = clip_to_recorded(trace, rows, host_start, annotation_end, activity[1])
    n = len(rows)

    # GPU activity -> runtime call -> step whose host span holds the call.
    rt_step = runtime_step_index(trace, host_start, host_end)
    g_rt = gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
    gpu_step = np.where(g_rt >= 0, rt_step[np.maximum(g_rt, 0)], -1) if n_gpu and len(rt_step) \
        else np.full(n_gpu, -1, np.int64)
    linked = gpu_step >= 0
    g_end = trace.gpu.ts + trace.gpu.dur
    gpu_count = np.bincount(gpu_step[linked], minlength=n).astype(np.int64)
    gpu_min = np.full(n, np.inf)
    gpu_max = np.full(n, -np.inf)
    np.minimum.at(gpu_min, gpu_step[linked], trace.gpu.ts[linked])
    np.maximum.at(gpu_max, gpu_step[linked], g_end[linked])
    gpu_end = np.where(gpu_count > 0, gpu_max, np.nan)

    stretched = bool(linked.any())
    start, end = host_start.copy(), host_end.copy()
    if stretched:
        prev = host_start[0]
        if gpu_count[0] > 0:
            cand = ~linked & (g_end < gpu_min[0])
            if cand.any():
                prev = max(prev, float(g_end[cand].max()))
        for i in range(n):  # loop over steps only
            s = max(prev, host_start[i])
            if gpu_count[i] == 0:
                e = max(host_end[i], s)
            else:
                e = max(host_end[i], gpu_max[i])
                if e < s:
                    e = s
            start[i], end[i] = s, e
            prev = e

    included = np.ones(n, bool)
    excluded: List[Dict] = []
    if stretched and n > 1:
        launching = np.flatnonzero(gpu_count > 0)
        i = int(launching[-1])
        keep = i + 1
        if i > 0 and gpu_count[i - 1] * T.STEP_TAIL_MIN_GPU_RATIO > gpu_count[i]:
            keep = i
            excluded.append({"number": int(numbers[i]),
                             "reason": REASON_CUT_OFF.format(n=int(gpu_count[i]), prev=int(gpu_count[i - 1]))})
        for k in range(i + 1, n):
            excluded.append({"number": int(numbers[k]), "reason": REASON_NO_GPU})
        included[keep:] = False
        excluded.sort(key=lambda d: d["number"])

    return Steps(numbers=numbers, host_start=host_start, host_end=host_end, start=start, end=end,
                 gpu_count=gpu_count, gpu_end=gpu_end, included=included, cpu_rows=rows,
                 excluded=excluded, found=True, stretched=stretched, gpu_step=gpu_step,
                 annotation_end=annotation_end, activity=activity)


# ---------------------------------------------------------------- metric unit (analysis/units.py)

NA_NO_STEPS_FOUND = "no steps found (no ProfilerStep#N): the whole trace is analysed as one window"


def _ms(us: float) -> str:
    return f"{us / 1e6:.1f} s" if us >= 1e6 else f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} µs"


def clipped_note(clipped: List[Dict]) -> Optional[str]:
    """The words that tell the user a step was clipped to the recorded activity (§1)."""
    if not clipped:
        return None
    parts = [f"ProfilerStep#{c['number']} lasts {_ms(c['annotation_us'])}, but the profiler recorded activity "
             f"in only its first {_ms(c['recorded_us'])}" for c in clipped[:3]]
    more = f" (and {len(clipped) - 3} more)" if len(clipped) > 3 else ""
    total = sum(c["clipped_us"] for c in clipped)
    return ("; ".join(parts) + more + f": {_ms(total)} of annotation past the recorded activity is left out "
            "of the steps (steps.clipped_us), so step time, utilization and idle are measured on what was recorded")


def _unit_compute(span) -> dict:
    from .linking import span_gpu_runtime

    found = find_steps(span.trace, gpu_runtime=span_gpu_runtime(span))
    out = found.to_report()
    lo, hi = found.window
    out["window_us"] = (hi - lo) if found.count else None
    if not found.found:
        span.not_available["steps"] = NA_NO_STEPS_FOUND
    note = clipped_note(out["clipped"])
    facts = span.report.get("trace")
    if note and isinstance(facts, dict):  # shown with the trace's own warnings (the tab's ⚠ notes)
        facts.setdefault("warnings", []).append(note)
    span.found = found
    return out


def _unit_partial(report: dict) -> dict:
    st = report.get("steps") or {}
    return {"sum:count": st.get("count") or 0, "rows:numbers": list(st.get("numbers") or []),
            "rows:excluded": list(st.get("excluded") or []), "any:found": bool(st.get("found")),
            "sum:window_us": st.get("window_us") or 0,
            "sum:clipped_us": st.get("clipped_us") or 0, "rows:clipped": list(st.get("clipped") or []),
            "sum:activity_us": st.get("activity_us") or 0}


def _unit_finish(m: dict) -> dict:
    # A group's step numbers and exclusions once per number (ranks share step numbers):
    # bounded by steps, not spans × steps; ``count`` stays the included steps of all spans.
    numbers = sorted({n for n in m["rows:numbers"] if isinstance(n, int) and not isinstance(n, bool)})
    excluded: dict = {}
    for e in m["rows:excluded"]:
        if isinstance(e, dict):
            key = (str(e.get("number")), str(e.get("reason")))
            if key in excluded:
                excluded[key]["spans"] += 1
            else:
                excluded[key] = dict(e, spans=1)
    return {"count": int(m["sum:count"] or 0), "numbers": numbers, "excluded": list(excluded.values()),
            "found": bool(m["any:found"]), "window_us": m["sum:window_us"],
            "clipped_us": m.get("sum:clipped_us") or 0.0, "clipped": list(m.get("rows:clipped") or []),
            "activity_us": m.get("sum:activity_us") or None}


def _unit():
    from .units import Unit

    return Unit("steps", _unit_compute, _unit_partial, _unit_finish)


UNIT = _unit()
