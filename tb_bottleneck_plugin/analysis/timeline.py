"""Step timeline (METRICS.md "Step timeline"): what ran where inside each step, and
why the GPU sat idle, as a compact columnar store, built here once per span; the
numpy-only level-of-detail queries a request makes are in views/timeline_window.py.

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
from .context import GRAPH_LAUNCH_CALLS, short_kernel_bound
from .factorize import unique_values
from .linking import gpu_runtime_index, innermost_enclosing, span_gpu_runtime, span_op_calls
from .operators import _gather, op_nesting, span_op_nesting
from .signals import op_names, sync_rows
from .steps import find_steps

# 2: CPU lanes from the Operator view's op nesting (operators.op_nesting): an op that starts
# with a zero-length op is no longer put on its parent's lane
# 3: no launch-bound gap on a trace that replays CUDA graphs (context.short_kernel_bound)
STORE_VERSION = 3

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


# ----------------------------------------------------------------------------- build

def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return (pid.astype(np.int64) << 32) ^ (tid.astype(np.int64) & 0xFFFFFFFF)


def _union_in(intervals: iv.Intervals, lo: float, hi: float) -> iv.Intervals:
    """Merged (sorted, disjoint) intervals cut to [lo, hi], by bisection (no full pass).
    Already merged: the intervals that end after ``lo`` and start before ``hi``, clipped,
    keep a positive length and stay apart (what iv.merge of them returns, without it:
    ~0.5 ms a step on the 292 MB benchmark trace)."""
    s, e = intervals
    a = int(np.searchsorted(e, lo, side="right"))
    b = int(np.searchsorted(s, hi, side="left"))
    if b <= a:
        return np.empty(0), np.empty(0)
    if not lo < hi:  # (an empty or NaN window: merge drops what the clip leaves)
        return iv.merge(*iv.clip(s[a:b], e[a:b], lo, hi))
    return iv.clip(s[a:b], e[a:b], lo, hi)


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
    # a trace that replays CUDA/HIP graphs is latency-bound, not launch-bound: no gap of it
    # is shaded launch-bound, as the short-kernel card and rule small_kernels say
    # (context.short_kernel_bound, the one classification; its eager kernels' gaps are "other")
    graph_ids = trace.string_ids(lambda s: s in GRAPH_LAUNCH_CALLS)
    replays = bool(len(graph_ids)) and bool(np.isin(rt.name, graph_ids).any())
    if short_kernel_bound(replays) == "latency":
        short[:] = False
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
    del cpu_rows, nest  # the op nesting's last reader (48 bytes per op, the span's cache): gone
    if span is not None:  # before the lanes' columns below are gathered
        span.release("op_nesting")
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
        del th_inv
        # (a constant column and the -1 links stay broadcasts until the join below)
        parts.append([c.ts[cpu_keep], c.dur[cpu_keep], c.name[cpu_keep], _gather(c.external_id, cpu_keep),
                      np.broadcast_to(np.int64(-1), (len(cpu_keep),)), rid[inv.reshape(-1)]])
        del inv
    del thread, depth, cpu_keep  # (per CPU row: not needed past the CPU lanes)
    dl_rows = np.flatnonzero(dl)
    if len(dl_rows) or main is not None:
        r = row_of(ROW_DATALOADER, 0, 0)
        parts.append([c.ts[dl_rows], c.dur[dl_rows], c.name[dl_rows], c.external_id[dl_rows],
                      np.full(len(dl_rows), -1, np.int64), np.full(len(dl_rows), r, np.int64)])

    # runtime calls, one row per thread; the innermost CPU op holding each
    if len(rt):
        rt_all = np.arange(len(rt))
        op_of_rt = innermost_enclosing(trace, trace.cpu.kind == CPU_OP, rt_all, among=pairs)
        rt_link = op_names(trace, op_of_rt)  # -1 without an enclosing op (or without any CPU row)
        rkeys = _thread_key(rt.pid, rt.tid)
        uniq, inv = np.unique(rkeys, return_inverse=True)
        rid = np.array([row_of(ROW_RUNTIME, u, 0) for u in uniq], np.int64)
        parts.append([rt.ts, rt.dur, rt.name, rt.correlation, rt_link, rid[inv.reshape(-1)]])
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
        parts.append([g.ts, g.dur, g.name, g.correlation, g_link, rid[inv.reshape(-1)]])

    idle_row = [row_of(ROW_IDLE, 0, i) for i in range(len(IDLE_CAUSES))]
    n_rows = len(rows)

    # --- assign events to steps (an event overlapping several steps is in each) -----------
    # (each column's pieces dropped once joined, and no astype copy of a joined column: on
    # 10M-event traces every full-length int64 column is 76 MiB; benchmarks/README.md)
    def joined(k, dtype):  # column k of every part, its pieces dropped once joined
        col = np.concatenate([p[k] for p in parts]).astype(dtype, copy=False)
        for p in parts:
            p[k] = None
        return col

    if parts:
        ts = joined(0, np.float64)
        dur = joined(1, np.float64)
        dur = np.maximum(np.nan_to_num(dur, copy=False), 0.0, out=dur)
        name = joined(2, np.int64)
        corr = joined(3, np.int64)
        link = joined(4, np.int64)
        row = joined(5, np.int64)
        del parts
    else:
        ts = dur = np.zeros(0)
        name = corr = link = row = np.zeros(0, np.int64)
    end = ts + dur
    by_start = np.argsort(ts, kind="stable")
    s_sorted = ts[by_start]
    run_end = np.maximum.accumulate(end[by_start]) if len(ts) else np.zeros(0)
    ev_count, ev_src = [], []
    for i in range(n_steps):  # loop over steps only; bisection, then a mask over the candidates
        lo, hi = lo_all[i], hi_all[i]
        j0 = min(int(np.searchsorted(run_end, lo, side="right")), int(np.searchsorted(s_sorted, lo, side="left")))
        j1 = int(np.searchsorted(s_sorted, hi, side="left"))
        m = by_start[j0:max(j0, j1)]
        m = m[(end[m] > lo) | ((dur[m] == 0) & (ts[m] >= lo))]
        ev_count.append(len(m))
        ev_src.append(m)
    del by_start, s_sorted, run_end, end  # (before the joins below: 4 x 8 bytes per event)
    src = np.concatenate(ev_src) if ev_src else np.zeros(0, np.int64)
    del ev_src
    # each event's step (the concatenation of a np.full(len(m), i) per step)
    stp = np.repeat(np.arange(n_steps, dtype=np.int64), ev_count) if n_steps else np.zeros(0, np.int64)
    del ev_count
    # one column at a time, each dropped once gathered (the peak: one column, not all twice)
    columns = [ts, dur, name, corr, link, row]
    del ts, dur, name, corr, link, row
    for k in range(len(columns)):
        columns[k] = columns[k][src]
    del src
    e_ts, e_dur, e_name, e_corr, e_link, e_row = columns
    del columns

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

    # (step, row) as one key, step * n_rows + row (0 <= row < n_rows): the same order as
    # the pair's, one sort key less
    seg = stp * n_rows + e_row
    del stp
    order = np.lexsort((e_ts, seg))
    e_ts = e_ts[order]
    e_dur = e_dur[order]
    e_row = e_row[order]
    seg = seg[order]
    e_name = e_name[order]
    e_corr = e_corr[order]
    e_link = e_link[order]
    del order
    seg_off = np.searchsorted(seg, np.arange(n_steps * n_rows + 1), side="left").astype(np.int64)

    # local string table: only the names used
    used = unique_values(np.concatenate([e_name[e_name >= 0], e_link[e_link >= 0]]))  # (string ids: no sort)
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
        "ev_ts": e_ts.astype(np.float64, copy=False), "ev_dur": e_dur.astype(np.float64, copy=False),
        "ev_name": np.where(e_name >= 0, remap[np.maximum(e_name, 0)], -1).astype(np.int32),
        "ev_link": np.where(e_link >= 0, remap[np.maximum(e_link, 0)], -1).astype(np.int32),
        "ev_corr": e_corr.astype(np.int64, copy=False), "ev_row": e_row.astype(np.int32),
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
