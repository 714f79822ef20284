"""Step timeline (METRICS.md "Step timeline"): what ran where inside each step, and
why the GPU sat idle, as a compact columnar store plus a numpy-only level-of-detail
query.

``build_store(trace) -> dict`` runs once per span, in the analysis process, on the
columnar arrays of ``model.TraceData`` (no re-parse). The store is a dict of numpy
arrays (saved as an ``.npz`` next to the span's cached result):

- ``rows``: one row per drawn line: the main CPU thread and other CPU threads (by
  nesting depth), the DataLoader, CUDA runtime calls (per thread), each GPU
  device/stream, and one row per GPU idle cause. ``row_kind`` (ROW_*), ``row_a``,
  ``row_b`` (tid/depth, device/stream, cause index).
- events of every step, sorted by (step, row, start): ``ev_ts``, ``ev_dur``,
  ``ev_name`` (index into the store's own string table), ``ev_row``, ``ev_corr``
  (correlation of runtime calls and GPU activity, External id of CPU ops, -1),
  ``ev_link`` (the innermost CPU op that launched a GPU activity / holds a runtime call,
  string index, -1); offsets ``seg_off`` per (step, row): step i row r is
  ``seg_off[i * n_rows + r] : seg_off[i * n_rows + r + 1]``.
- steps: ``step_number``, ``step_start``/``step_end`` (stretched), ``step_host_start``/
  ``step_host_end``, ``step_included``.
- ``names_blob``/``names_off``: the string table as UTF-8 bytes and offsets (no pickle).
- ``runtime_api``: which runtime the runtime lanes hold (RUNTIME_APIS index): HIP when
  the trace's runtime calls are mostly ``hip*`` (or, with no ``cu*``/``hip*`` call at all,
  when its deviceProperties are AMD's), else CUDA. Stores written before it was added
  get it from their own runtime events' names (``runtime_api``).

A window answer holds only the lanes with at least one event in the step (the idle
lanes, and the GPU lanes when no GPU lane has one, always): ``hidden_lanes`` counts
the others. A lane empty in the zoomed window but not in the step stays (lanes do not
come and go while zooming).

Idle causes (rows of kind ROW_IDLE) use the report's own definitions, in this priority
(every instant of a step in which no kernel runs, on any device, gets exactly one):

1. ``h2d_copy``: Union(memcpy named *HtoD*) minus Union(kernels) (metrics §3 input
   transfer);
2. ``input_wait``: the DataLoader category of the step-time breakdown (metrics §2/§3:
   DataLoader spans minus kernels, memcpy, memset, communication and runtime), so the
   shaded share of a step is that step's input-bound %;
3. ``sync``: blocking synchronisation calls, clipped to the step's host span, minus
   Union(GPU activity) (metrics §8 "GPU idle during sync");
4. ``launch``: gaps between two consecutive short kernels (< SHORT_KERNEL_US) on one
   stream (metrics §6 short kernels), where no kernel runs;
5. ``other``: the rest of the time no kernel runs.

``window(store, step, t0, t1, px, cap)`` answers one request: the rows' events that
overlap [t0, t1] (µs from the step start), with events narrower than the detail
threshold merged into busy blocks that keep their event count and their total busy
time (sum of the clipped durations) exactly, at most ``cap`` rectangles in all.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, GPU_MEMCPY, TraceData
from . import intervals as iv
from .breakdown import cumulative_unions, dataloader_mask
from .context import GRAPH_LAUNCH_CALLS
from .linking import gpu_runtime_index, innermost_enclosing, span_gpu_runtime, span_op_calls
from .operators import op_nesting, span_op_nesting
from .signals import op_names, sync_rows
from .steps import find_steps

# 2: CPU lanes from the Operator view's op nesting (operators.op_nesting): an op that starts
# with a zero-length op is no longer put on its parent's lane
STORE_VERSION = 2

ROW_CPU, ROW_DATALOADER, ROW_RUNTIME, ROW_GPU, ROW_IDLE = 0, 1, 2, 3, 4
ROW_KINDS = ("cpu", "dataloader", "runtime", "gpu", "idle")
RUNTIME_APIS = ("CUDA", "HIP")

# Idle causes, in priority order (index = row_b of the idle rows).
IDLE_CAUSES = ("h2d_copy", "input_wait", "sync", "launch", "other")
IDLE_LABELS = {
    "h2d_copy": "host-to-device copy",
    "input_wait": "waiting for input",
    "sync": "synchronisation",
    "launch": "launch-bound (short kernels)",
    "other": "other",
}

# CPU nesting depths kept per thread (0 = top level under ProfilerStep).
MAX_CPU_DEPTH = 4
DEFAULT_CAP = 4000
# Events in one step_trace export (~180 bytes of JSON each: ~9 MB; a resnet50 step holds
# ~8,700); a trace without ProfilerStep is one window holding every event of the file.
EXPORT_MAX_EVENTS = 50_000


# ----------------------------------------------------------------------------- build

def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return (pid.astype(np.int64) << 32) ^ (tid.astype(np.int64) & 0xFFFFFFFF)


def _union_in(intervals: iv.Intervals, lo: float, hi: float) -> iv.Intervals:
    """Merged (sorted, disjoint) intervals cut to [lo, hi], by bisection (no full pass)."""
    s, e = intervals
    a = int(np.searchsorted(e, lo, side="right"))
    b = int(np.searchsorted(s, hi, side="left"))
    if b <= a:
        return np.empty(0), np.empty(0)
    return iv.merge(*iv.clip(s[a:b], e[a:b], lo, hi))


def idle_causes(trace: TraceData, lo: float, hi: float, host_lo: float, host_hi: float,
                sets: Optional[dict] = None) -> Dict[str, iv.Intervals]:
    """The idle-cause intervals (merged, disjoint) inside one step [lo, hi] (host span
    [host_lo, host_hi] for synchronisation), by cause name; see the module docstring."""
    if sets is None:
        sets = _cause_sets(trace)
    kernels = _union_in(sets["kernels"], lo, hi)
    idle = iv.subtract((np.array([lo]), np.array([hi])), kernels) if hi > lo else (np.empty(0), np.empty(0))
    out: Dict[str, iv.Intervals] = {}
    taken = (np.empty(0), np.empty(0))

    def claim(name, candidate):
        nonlocal taken
        piece = iv.subtract(iv.intersect(candidate, idle), taken)
        out[name] = piece
        taken = iv.merge(np.concatenate([taken[0], piece[0]]), np.concatenate([taken[1], piece[1]]))

    claim("h2d_copy", _union_in(sets["h2d"], lo, hi))
    claim("input_wait", _union_in(sets["input_wait"], lo, hi))
    claim("sync", iv.subtract(_union_in(sets["sync"], max(lo, host_lo), min(hi, host_hi)),
                              _union_in(sets["gpu"], lo, hi)))
    claim("launch", _union_in(sets["launch"], lo, hi))
    claim("other", idle)
    return out


def _cause_sets(trace: TraceData, unions: Optional[dict] = None, gpu_runtime: Optional[np.ndarray] = None) -> dict:
    """Whole-trace merged interval sets the idle causes are cut from; ``unions``: the
    span's breakdown.cumulative_unions, ``gpu_runtime``: linking.gpu_runtime_index, when
    the report already made them."""
    g, rt = trace.gpu, trace.runtime
    k = g.kind == GPU_KERNEL
    h2d = (g.kind == GPU_MEMCPY) & np.isin(g.name, trace.string_ids(lambda s: "HtoD" in s))
    # DataLoader category of §2: the DataLoader spans minus every higher-priority
    # category, i.e. C_dataloader minus C_runtime of the partition's own unions
    if unions is None:
        unions = cumulative_unions(trace)
    input_wait = iv.subtract(unions["dataloader"], unions["runtime"])
    srows = sync_rows(trace, gpu_runtime)
    sync = iv.merge(rt.ts[srows], rt.ts[srows] + rt.dur[srows])
    # gaps between consecutive short kernels on one stream
    kr = np.flatnonzero(k)
    order = kr[np.lexsort((g.ts[kr], g.stream[kr], g.device[kr]))]
    short = g.dur[order] < T.SHORT_KERNEL_US
    # kernels replayed from a CUDA/HIP graph have no launch of their own: gaps between
    # them are not launch-bound (rule small_kernels says latency-bound for such runs)
    graph_ids = trace.string_ids(lambda s: s in GRAPH_LAUNCH_CALLS)
    if len(graph_ids) and len(order):
        is_graph_launch = np.isin(rt.name, graph_ids)
        if is_graph_launch.any():
            g_rt = gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
            replayed = (g_rt >= 0) & is_graph_launch[np.maximum(g_rt, 0)]
            short &= ~replayed[order]
    same = (g.device[order][1:] == g.device[order][:-1]) & (g.stream[order][1:] == g.stream[order][:-1])
    both = same & short[1:] & short[:-1]
    gap_s = (g.ts[order] + g.dur[order])[:-1][both]
    gap_e = g.ts[order][1:][both]
    return {
        "kernels": iv.merge(g.ts[k], g.ts[k] + g.dur[k]),
        "gpu": iv.merge(g.ts, g.ts + g.dur),
        "h2d": iv.merge(g.ts[h2d], g.ts[h2d] + g.dur[h2d]),
        "input_wait": input_wait,
        "sync": sync,
        "launch": iv.merge(gap_s, gap_e),
    }


def _main_thread(trace: TraceData, step_cpu_rows: np.ndarray) -> Optional[int]:
    c = trace.cpu
    if len(step_cpu_rows) and step_cpu_rows[0] >= 0:
        keys = _thread_key(c.pid[step_cpu_rows], c.tid[step_cpu_rows])
        vals, counts = np.unique(keys, return_counts=True)
        return int(vals[np.argmax(counts)])
    span = (c.kind == CPU_OP) | (c.kind == CPU_USER_ANNOTATION)
    if not span.any():
        return None
    keys = _thread_key(c.pid[span], c.tid[span])
    vals, inv = np.unique(keys, return_inverse=True)
    return int(vals[np.argmax(np.bincount(inv.reshape(-1), weights=np.nan_to_num(c.dur[span])))])


def build_store(trace: TraceData, steps=None, span=None) -> Dict[str, np.ndarray]:
    """The timeline store of one span (see the module docstring). ``span``: the report's
    per-span context (analysis/units.SpanContext) after the units ran: its steps, its
    category unions (the step partition's), its GPU→runtime index, its op/call pairs and its
    CPU op nesting (the Operator view's) are reused, not computed again."""
    unions = None
    if span is not None:
        from .breakdown import span_unions

        if steps is None:
            steps = span.found
        unions = span_unions(span)
        nest, g_rt_all, pairs = span_op_nesting(span), span_gpu_runtime(span), span_op_calls(span)
    else:
        nest, g_rt_all, pairs = op_nesting(trace), gpu_runtime_index(trace), None
    if steps is None:
        steps = find_steps(trace)
    c, rt, g = trace.cpu, trace.runtime, trace.gpu
    n_steps = len(steps.numbers)
    lo_all, hi_all = steps.start.astype(np.float64), steps.end.astype(np.float64)

    # --- candidate events of every table: (ts, dur, name, corr, link, row key) -----------
    dl = dataloader_mask(trace)
    cpu_rows = nest["rows"]  # CPU ops and user annotations but ProfilerStep#N
    thread = _thread_key(c.pid, c.tid)
    depth = np.zeros(len(c), np.int64)
    depth[cpu_rows] = nest["depth"]
    main = _main_thread(trace, steps.cpu_rows)

    rows: List[Tuple[int, int, int]] = []  # (kind, a, b)
    row_index: Dict[Tuple[int, int, int], int] = {}

    def row_of(kind, a, b):
        key = (kind, int(a), int(b))
        if key not in row_index:
            row_index[key] = len(rows)
            rows.append(key)
        return row_index[key]

    parts = []  # (ts, dur, name_id(global), corr, link(global name id), row)

    # CPU threads (DataLoader spans go to their own row)
    cpu_keep = cpu_rows[~dl[cpu_rows] & (depth[cpu_rows] < MAX_CPU_DEPTH)]
    if main is not None:
        row_of(ROW_CPU, main, 0)
    if len(cpu_keep):
        # (thread, depth) pairs as one 1-D key (a 2-D np.unique sorts rows: 10x slower)
        th_u, th_inv = np.unique(thread[cpu_keep], return_inverse=True)
        pair, inv = np.unique(th_inv.reshape(-1) * MAX_CPU_DEPTH + depth[cpu_keep], return_inverse=True)
        uniq = np.stack([th_u[pair // MAX_CPU_DEPTH], pair % MAX_CPU_DEPTH], 1)
        # main thread first, then threads by id; depth ascending
        is_main = (uniq[:, 0] == main) if main is not None else np.zeros(len(uniq), bool)
        order = np.lexsort((uniq[:, 1], uniq[:, 0], ~is_main))
        rid = np.empty(len(uniq), np.int64)
        for u in order:
            rid[u] = row_of(ROW_CPU, uniq[u, 0], uniq[u, 1])
        parts.append((c.ts[cpu_keep], c.dur[cpu_keep], c.name[cpu_keep], c.external_id[cpu_keep],
                      np.full(len(cpu_keep), -1, np.int64), rid[inv.reshape(-1)]))
    dl_rows = np.flatnonzero(dl)
    if len(dl_rows) or main is not None:
        r = row_of(ROW_DATALOADER, 0, 0)
        parts.append((c.ts[dl_rows], c.dur[dl_rows], c.name[dl_rows], c.external_id[dl_rows],
                      np.full(len(dl_rows), -1, np.int64), np.full(len(dl_rows), r, np.int64)))

    # runtime calls, one row per thread; the innermost CPU op holding each
    if len(rt):
        rt_all = np.arange(len(rt))
        op_of_rt = innermost_enclosing(trace, trace.cpu.kind == CPU_OP, rt_all, among=pairs)
        rt_link = op_names(trace, op_of_rt)  # -1 without an enclosing op (or without any CPU row)
        rkeys = _thread_key(rt.pid, rt.tid)
        uniq, inv = np.unique(rkeys, return_inverse=True)
        rid = np.array([row_of(ROW_RUNTIME, u, 0) for u in uniq], np.int64)
        parts.append((rt.ts, rt.dur, rt.name, rt.correlation, rt_link, rid[inv.reshape(-1)]))
    else:
        rt_link = np.zeros(0, np.int64)

    # GPU activity, one row per (device, stream); linked through its launch call
    if len(g):
        g_rt = g_rt_all
        g_link = np.where(g_rt >= 0, rt_link[np.maximum(g_rt, 0)] if len(rt_link) else -1, -1).astype(np.int64)
        dev_u, dev_inv = np.unique(g.device.astype(np.int64), return_inverse=True)
        str_u, str_inv = np.unique(g.stream.astype(np.int64), return_inverse=True)
        pair, inv = np.unique(dev_inv.reshape(-1) * len(str_u) + str_inv.reshape(-1), return_inverse=True)
        rid = np.array([row_of(ROW_GPU, dev_u[u // len(str_u)], str_u[u % len(str_u)]) for u in pair.tolist()],
                       np.int64)
        parts.append((g.ts, g.dur, g.name, g.correlation, g_link, rid[inv.reshape(-1)]))

    idle_row = [row_of(ROW_IDLE, 0, i) for i in range(len(IDLE_CAUSES))]
    n_rows = len(rows)

    # --- assign events to steps (an event overlapping several steps is in each) -----------
    if parts:
        ts = np.concatenate([p[0] for p in parts]).astype(np.float64)
        dur = np.maximum(np.nan_to_num(np.concatenate([p[1] for p in parts]).astype(np.float64)), 0.0)
        name = np.concatenate([p[2] for p in parts]).astype(np.int64)
        corr = np.concatenate([p[3] for p in parts]).astype(np.int64)
        link = np.concatenate([p[4] for p in parts]).astype(np.int64)
        row = np.concatenate([p[5] for p in parts]).astype(np.int64)
    else:
        ts = dur = np.zeros(0)
        name = corr = link = row = np.zeros(0, np.int64)
    end = ts + dur
    by_start = np.argsort(ts, kind="stable")
    s_sorted = ts[by_start]
    run_end = np.maximum.accumulate(end[by_start]) if len(ts) else np.zeros(0)
    ev_step, ev_src = [], []
    for i in range(n_steps):  # loop over steps only; bisection, then a mask over the candidates
        lo, hi = lo_all[i], hi_all[i]
        j0 = min(int(np.searchsorted(run_end, lo, side="right")), int(np.searchsorted(s_sorted, lo, side="left")))
        j1 = int(np.searchsorted(s_sorted, hi, side="left"))
        m = by_start[j0:max(j0, j1)]
        m = m[(end[m] > lo) | ((dur[m] == 0) & (ts[m] >= lo))]
        ev_step.append(np.full(len(m), i, np.int64))
        ev_src.append(m)
    src = np.concatenate(ev_src) if ev_src else np.zeros(0, np.int64)
    stp = np.concatenate(ev_step) if ev_step else np.zeros(0, np.int64)
    e_ts, e_dur = ts[src], dur[src]
    e_name, e_corr, e_link, e_row = name[src], corr[src], link[src], row[src]

    # idle causes per step, as events of the idle rows
    sets = _cause_sets(trace, unions, g_rt_all)
    i_ts, i_dur, i_row, i_step = [], [], [], []
    for i in range(n_steps):
        causes = idle_causes(trace, lo_all[i], hi_all[i], steps.host_start[i], steps.host_end[i], sets)
        for k, cname in enumerate(IDLE_CAUSES):
            s, e = causes[cname]
            i_ts.append(s)
            i_dur.append(e - s)
            i_row.append(np.full(len(s), idle_row[k], np.int64))
            i_step.append(np.full(len(s), i, np.int64))
    if i_ts:
        n_idle = sum(len(x) for x in i_ts)
        e_ts = np.concatenate([e_ts] + i_ts)
        e_dur = np.concatenate([e_dur] + i_dur)
        e_row = np.concatenate([e_row] + i_row)
        stp = np.concatenate([stp] + i_step)
        e_name = np.concatenate([e_name, np.full(n_idle, -1, np.int64)])
        e_corr = np.concatenate([e_corr, np.full(n_idle, -1, np.int64)])
        e_link = np.concatenate([e_link, np.full(n_idle, -1, np.int64)])

    order = np.lexsort((e_ts, e_row, stp))
    e_ts, e_dur, e_row, stp = e_ts[order], e_dur[order], e_row[order], stp[order]
    e_name, e_corr, e_link = e_name[order], e_corr[order], e_link[order]
    seg = stp * n_rows + e_row
    seg_off = np.searchsorted(seg, np.arange(n_steps * n_rows + 1), side="left").astype(np.int64)

    # local string table: only the names used
    used = np.unique(np.concatenate([e_name[e_name >= 0], e_link[e_link >= 0]]))
    remap = np.full(len(trace.strings) + 1, -1, np.int64)
    remap[used] = np.arange(len(used))
    names = [trace.strings[i] for i in used.tolist()]
    blob, off = _pack_strings(names)

    rows_arr = np.array(rows, np.int64).reshape(-1, 3)
    rt_api = _runtime_api_of_trace(trace)
    return {
        "version": np.array([STORE_VERSION], np.int64),
        "row_kind": rows_arr[:, 0].astype(np.int8), "row_a": rows_arr[:, 1], "row_b": rows_arr[:, 2],
        "main_thread": np.array([main if main is not None else -1], np.int64),
        "ev_ts": e_ts.astype(np.float64), "ev_dur": e_dur.astype(np.float64),
        "ev_name": np.where(e_name >= 0, remap[np.maximum(e_name, 0)], -1).astype(np.int32),
        "ev_link": np.where(e_link >= 0, remap[np.maximum(e_link, 0)], -1).astype(np.int32),
        "ev_corr": e_corr.astype(np.int64), "ev_row": e_row.astype(np.int32),
        "seg_off": seg_off,
        "step_number": steps.numbers.astype(np.int64),
        "step_start": lo_all, "step_end": hi_all,
        "step_host_start": steps.host_start.astype(np.float64),
        "step_host_end": steps.host_end.astype(np.float64),
        "step_included": steps.included.astype(bool),
        "steps_found": np.array([bool(steps.found)]),
        "names_blob": blob, "names_off": off,
        "runtime_api": np.array([RUNTIME_APIS.index(rt_api)], np.int8),
    }


def _api_of_names(counted) -> Optional[str]:
    """HIP or CUDA by the runtime calls, (name, calls) pairs: more hip* calls than cu*
    (cudaLaunchKernel, cuLaunchKernel) ones is HIP; None when neither occurs."""
    hip = cu = 0
    for n, k in counted:
        if n.startswith("hip"):
            hip += k
        elif n.startswith("cu"):
            cu += k
    if hip == cu == 0:
        return None
    return "HIP" if hip > cu else "CUDA"


def _runtime_api_of_trace(trace: TraceData) -> str:
    rt = trace.runtime
    if len(rt):
        ids, counts = np.unique(rt.name, return_counts=True)
        api = _api_of_names((trace.strings[i], c) for i, c in zip(ids.tolist(), counts.tolist()) if i >= 0)
        if api is not None:
            return api
    from .occupancy import _is_rocm

    return "HIP" if _is_rocm(trace) else "CUDA"


def runtime_api(store) -> str:
    """The runtime the store's runtime lanes hold ("CUDA" or "HIP"; see the module
    docstring); for a store without ``runtime_api``, from its runtime events' names."""
    if "runtime_api" in store:
        return RUNTIME_APIS[int(store["runtime_api"][0])]
    rows = np.flatnonzero(store["row_kind"] == ROW_RUNTIME)
    if not len(rows):
        return "CUDA"
    ids, counts = np.unique(store["ev_name"][np.isin(store["ev_row"], rows)], return_counts=True)
    names = store_names(store)
    return _api_of_names((names[i], c) for i, c in zip(ids.tolist(), counts.tolist()) if i >= 0) or "CUDA"


def _pack_strings(names: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    enc = [n.encode("utf-8", "surrogatepass") for n in names]
    off = np.concatenate([[0], np.cumsum([len(b) for b in enc])]).astype(np.int64)
    blob = np.frombuffer(b"".join(enc), dtype=np.uint8).copy()
    return blob, off


def store_names(store) -> List[str]:
    """The store's string table."""
    blob = bytes(store["names_blob"])
    off = store["names_off"]
    return [blob[off[i]:off[i + 1]].decode("utf-8", "replace") for i in range(len(off) - 1)]


# ----------------------------------------------------------------------------- queries

def step_index(store, number: Optional[int]) -> Optional[int]:
    """Index of step ``number``; None for the default: the slowest included step (the
    slowest step at all when none is included). None when the store has no step."""
    nums = store["step_number"]
    if len(nums) == 0:
        return None
    if number is None:
        dur = store["step_end"] - store["step_start"]
        inc = store["step_included"]
        cand = np.flatnonzero(inc) if inc.any() else np.arange(len(nums))
        return int(cand[np.argmax(dur[cand])])
    hit = np.flatnonzero(nums == number)
    return int(hit[0]) if len(hit) else -1


def steps_list(store) -> List[dict]:
    return [{"step": int(n), "duration_us": float(e - s), "included": bool(inc)}
            for n, s, e, inc in zip(store["step_number"], store["step_start"], store["step_end"],
                                    store["step_included"])]


def row_label(kind: int, a: int, b: int, main: int, api: str = "CUDA") -> Tuple[str, str]:
    """(lane group, label) of a row; ``api``: the runtime's name (runtime_api)."""
    if kind == ROW_CPU:
        tid = a & 0xFFFFFFFF
        who = "CPU main thread" if a == main else f"CPU thread {tid}"
        return ("cpu_main" if a == main else "cpu"), (who if b == 0 else f"{who} · depth {b}")
    if kind == ROW_DATALOADER:
        return "dataloader", "DataLoader"
    if kind == ROW_RUNTIME:
        return "runtime", f"{api} runtime (thread {a & 0xFFFFFFFF})"
    if kind == ROW_GPU:
        return "gpu", f"GPU {a} · stream {b}"
    return "idle", f"GPU idle: {IDLE_LABELS[IDLE_CAUSES[b]]}"


def lod(s: np.ndarray, e: np.ndarray, q: float):
    """Level of detail of one row: events (sorted by start, already clipped to the
    window) narrower than ``q`` µs that follow each other with gaps under ``q`` are
    merged into one block. Returns (group id per event, number of groups); a group of
    one event is that event."""
    n = len(s)
    if n == 0:
        return np.zeros(0, np.int64), 0
    small = (e - s) < q
    prev_end = np.maximum.accumulate(e)
    brk = np.ones(n, bool)
    brk[1:] = ~(small[1:] & small[:-1] & (s[1:] - prev_end[:-1] < q))
    gid = np.cumsum(brk) - 1
    return gid, int(gid[-1]) + 1


def window(store, step: Optional[int] = None, t0: Optional[float] = None, t1: Optional[float] = None,
           px: int = 1200, cap: int = DEFAULT_CAP, rows: Optional[List[int]] = None) -> dict:
    """One level-of-detail answer for step number ``step`` (None: the default step) in
    the window [t0, t1] µs from the step start (default: the whole step), drawn ``px``
    pixels wide: per row, rectangles (events, or merged busy blocks with their count and
    busy time), at most ``cap`` rectangles in all (or one per non-empty row when there
    are more such rows than ``cap``). Only the rows with an event in the step are sent
    (see the module docstring; ``hidden_lanes`` counts the others). Raises KeyError for
    an unknown step."""
    i = step_index(store, step)
    if i is None or i < 0:
        raise KeyError(step)
    px = int(min(max(px, 10), 20000))
    cap = int(max(cap, 1))
    base = float(store["step_start"][i])
    span_us = float(store["step_end"][i] - base)
    w0 = 0.0 if t0 is None or not np.isfinite(t0) else float(t0)
    w1 = span_us if t1 is None or not np.isfinite(t1) else float(t1)
    w0, w1 = max(min(w0, span_us), 0.0), max(min(w1, span_us), 0.0)
    if w1 <= w0:
        w0, w1 = 0.0, span_us
    if w1 <= w0:
        w1 = w0 + 1.0
    n_rows = len(store["row_kind"])
    seg_off = store["seg_off"]
    ts, dur = store["ev_ts"], store["ev_dur"]
    sel_rows = list(range(n_rows) if rows is None else rows)
    # the lanes with an event in the step (idle lanes always; the GPU lanes when none has
    # one, so that the step's GPU idle time has a lane to be shaded on)
    kinds = store["row_kind"]
    in_step = [int(seg_off[i * n_rows + r + 1]) > int(seg_off[i * n_rows + r]) for r in sel_rows]
    gpu_busy = any(h_ for r, h_ in zip(sel_rows, in_step) if int(kinds[r]) == ROW_GPU)
    shown = [r for r, h_ in zip(sel_rows, in_step)
             if h_ or int(kinds[r]) == ROW_IDLE or (int(kinds[r]) == ROW_GPU and not gpu_busy)]
    hidden = len(sel_rows) - len(shown)
    per_row = []
    for r in shown:
        a, b = int(seg_off[i * n_rows + r]), int(seg_off[i * n_rows + r + 1])
        s = ts[a:b] - base
        e = s + dur[a:b]
        if b > a:
            run_end = np.maximum.accumulate(e)
            j0 = int(np.searchsorted(run_end, w0, side="right"))
            j0 = min(j0, int(np.searchsorted(s, w0, side="left")))
            j1 = int(np.searchsorted(s, w1, side="left"))
            idx = np.arange(j0, max(j0, j1))
            ss, ee = s[idx], e[idx]
            keep = (ee > w0) | ((ee == ss) & (ss >= w0))
            idx = idx[keep]
            cs, ce = np.clip(s[idx], w0, w1), np.clip(e[idx], w0, w1)
        else:
            idx = np.zeros(0, np.int64)
            cs = ce = np.zeros(0)
        per_row.append((r, a + idx, cs, ce))

    # one block per non-empty row is the coarsest answer that keeps every row's busy time
    cap = max(cap, sum(1 for _, _, cs, _ in per_row if len(cs)))
    q = (w1 - w0) / px  # one pixel
    while True:
        groups = [lod(cs, ce, q) for _, _, cs, ce in per_row]
        total = sum(n for _, n in groups)
        if total <= cap or q > 2 * (w1 - w0):
            break
        q *= 2.0
    if total > cap:  # every row one block at most (rows are far fewer than the cap)
        groups = [(np.zeros(len(cs), np.int64), 1 if len(cs) else 0) for _, _, cs, _ in per_row]

    main = int(store["main_thread"][0])
    api = runtime_api(store)
    built = []
    for (r, ev, cs, ce), (gid, ng) in zip(per_row, groups):
        if ng:
            first = np.searchsorted(gid, np.arange(ng), side="left")
            cnt = np.bincount(gid, minlength=ng)
            single = cnt == 1
            ev_first = ev[first]
            built.append((r, ng, cs[first], np.maximum.reduceat(ce, first), cnt,
                          np.bincount(gid, weights=ce - cs, minlength=ng),
                          np.where(single, store["ev_name"][ev_first], -1),
                          np.where(single, store["ev_link"][ev_first], -1),
                          np.where(single, store["ev_corr"][ev_first], -1)))
        else:
            built.append((r, 0) + (None,) * 7)
    # the answer's own string table: the names of the single events only
    ids = [x for b in built if b[1] for x in (b[6], b[7])]
    used = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    used = used[used >= 0]
    all_names = store_names(store) if len(used) else []
    out_names = [all_names[k] for k in used.tolist()]

    def local(arr):
        pos = np.searchsorted(used, arr)
        return [None if v < 0 else p_ for v, p_ in zip(arr.tolist(), pos.tolist())]

    lanes = []
    n_rects = 0
    for r, ng, t0s, t1s, cnt, busy, nm, lk, co in built:
        kind, a_, b_ = int(store["row_kind"][r]), int(store["row_a"][r]), int(store["row_b"][r])
        group, label = row_label(kind, a_, b_, main, api)
        lane = {"row": int(r), "kind": ROW_KINDS[kind], "group": group, "label": label,
                "t0": [], "t1": [], "count": [], "busy_us": [], "name": [], "link": [], "corr": []}
        if kind == ROW_IDLE:
            lane["cause"] = IDLE_CAUSES[b_]
        if ng:
            lane["t0"] = np.round(t0s, 3).tolist()
            lane["t1"] = np.round(t1s, 3).tolist()
            lane["count"] = cnt.tolist()
            lane["busy_us"] = busy.tolist()
            lane["name"] = local(nm)
            lane["link"] = local(lk)
            lane["corr"] = [None if v < 0 else v for v in co.tolist()]
            n_rects += ng
        lanes.append(lane)

    idle_us = {}
    for r in range(n_rows):
        if int(store["row_kind"][r]) == ROW_IDLE:
            a, b = int(seg_off[i * n_rows + r]), int(seg_off[i * n_rows + r + 1])
            idle_us[IDLE_CAUSES[int(store["row_b"][r])]] = float(dur[a:b].sum())
    return {
        "step": int(store["step_number"][i]), "included": bool(store["step_included"][i]),
        "step_us": span_us, "t0": w0, "t1": w1, "px": px, "cap": cap,
        "detail_us": q, "rects": n_rects, "names": out_names, "lanes": lanes,
        "hidden_lanes": hidden, "runtime_api": api,
        "idle_us": idle_us,
        "idle_pct": {k: (100.0 * v / span_us if span_us > 0 else None) for k, v in idle_us.items()},
        "steps": steps_list(store),
        "steps_found": bool(store["steps_found"][0]),
        "export": _export_info(store, i),
    }


def _export_info(store, i: int) -> dict:
    """What a step_trace export of the whole step ``i`` holds: its event count, the cap,
    whether it is cut, and the note the UI shows (export_note)."""
    n_rows = len(store["row_kind"])
    events = int(store["seg_off"][(i + 1) * n_rows] - store["seg_off"][i * n_rows])
    cap = EXPORT_MAX_EVENTS
    exported = min(events, cap)
    return {"events": events, "max_events": cap, "truncated": exported < events,
            "note": export_note(store, i, events, exported, cap)}


def export_note(store, i: int, events: int, exported: int, cap: Optional[int] = None) -> Optional[str]:
    """What the user should know about an export of step index ``i``: cut by the cap,
    or a trace without ProfilerStep (the whole trace is one window); None otherwise."""
    cap = EXPORT_MAX_EVENTS if cap is None else cap
    notes = []
    if not bool(store["steps_found"][0]):
        notes.append("this trace has no ProfilerStep#N steps: the whole trace is one window")
    if exported < events:
        notes.append(f"{events} events in the window, more than the export cap of {cap}: "
                     f"only the first {exported} (by start time) are exported; zoom in to export a later part")
    return "; ".join(notes) or None


def chrome_trace(store, step: Optional[int] = None, t0: Optional[float] = None, t1: Optional[float] = None,
                 max_events: Optional[int] = None) -> dict:
    """The events of one step as a Chrome trace (Perfetto, chrome://tracing): the stored
    events of the step (idle causes as their own track), times as in the trace, that
    overlap the window [t0, t1] µs from the step start (default: the whole step), at most
    ``max_events`` (EXPORT_MAX_EVENTS) of them: the earliest-starting ones, the cut said
    in ``otherData`` (``events_total``, ``events_exported``, ``truncated``, ``note``)."""
    i = step_index(store, step)
    if i is None or i < 0:
        raise KeyError(step)
    cap = EXPORT_MAX_EVENTS if max_events is None else max(int(max_events), 1)
    n_rows = len(store["row_kind"])
    a, b = int(store["seg_off"][i * n_rows]), int(store["seg_off"][(i + 1) * n_rows])
    names = store_names(store)
    main = int(store["main_thread"][0])
    api = runtime_api(store)
    pids = {"cpu_main": 1, "cpu": 1, "dataloader": 1, "runtime": 1, "gpu": 2, "idle": 3}
    # columns of the step's events, then one dict per event (no per-event numpy access)
    base = float(store["step_start"][i])
    span_us = float(store["step_end"][i]) - base
    w0 = 0.0 if t0 is None or not np.isfinite(t0) else min(max(float(t0), 0.0), span_us)
    w1 = span_us if t1 is None or not np.isfinite(t1) else min(max(float(t1), 0.0), span_us)
    if w1 <= w0:
        w0, w1 = 0.0, span_us
    sel = np.arange(a, b)
    if w0 > 0.0 or w1 < span_us:  # a zoomed window: the events overlapping it
        s_ = store["ev_ts"][a:b] - base
        e_ = s_ + store["ev_dur"][a:b]
        sel = sel[(s_ < w1) & ((e_ > w0) | ((e_ == s_) & (s_ >= w0)))]
    total = len(sel)
    if total > cap:  # the earliest-starting events (a contiguous stretch of time)
        sel = np.sort(sel[np.argsort(store["ev_ts"][sel], kind="stable")[:cap]])
    row = store["ev_row"][sel].astype(np.int64)
    kinds = store["row_kind"].astype(np.int64)
    # metadata only for the lanes (threads) and processes that carry an exported event
    events, used_pids = [], set()
    for r in np.unique(row).tolist():
        group, label = row_label(int(kinds[r]), int(store["row_a"][r]), int(store["row_b"][r]), main, api)
        used_pids.add(pids[group])
        events.append({"ph": "M", "name": "thread_name", "pid": pids[group], "tid": r, "args": {"name": label}})
    for pid, pname in ((1, "host"), (2, "GPU"), (3, "GPU idle causes")):
        if pid in used_pids:
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
    kind = kinds[row]
    label_of_row = {r: IDLE_LABELS[IDLE_CAUSES[int(store["row_b"][r])]] for r in range(n_rows)
                    if int(kinds[r]) == ROW_IDLE}
    pid_of_row = [pids[row_label(int(kinds[r]), int(store["row_a"][r]), 0, main)[0]] for r in range(n_rows)]
    nm = store["ev_name"][sel]
    lk = store["ev_link"][sel]
    co = np.where(np.isin(kind, (ROW_RUNTIME, ROW_GPU)), store["ev_corr"][sel], -1)
    for r, k, t, d, n, l_, c in zip(row.tolist(), kind.tolist(), store["ev_ts"][sel].tolist(),
                                    store["ev_dur"][sel].tolist(), nm.tolist(), lk.tolist(), co.tolist()):
        name = label_of_row[r] if k == ROW_IDLE else (names[n] if n >= 0 else "?")
        ev = {"ph": "X", "name": name, "cat": ROW_KINDS[k], "pid": pid_of_row[r], "tid": r, "ts": t, "dur": d}
        if c >= 0 or l_ >= 0:
            args = {}
            if c >= 0:
                args["correlation"] = c
            if l_ >= 0:
                args["cpu_op"] = names[l_]
            ev["args"] = args
        events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step": int(store["step_number"][i]),
                          "step_start_us": float(store["step_start"][i]),
                          "step_end_us": float(store["step_end"][i]),
                          "steps_found": bool(store["steps_found"][0]),
                          "window_us": [w0, w1],
                          "events_total": total, "events_exported": len(sel), "max_events": cap,
                          "truncated": len(sel) < total,
                          "note": export_note(store, i, total, len(sel), cap)}}
