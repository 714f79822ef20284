"""The Operator view (METRICS.md §13): per included step and per (op name, recorded
inputs), the calls, total and self CPU time, the GPU time the op launched and its
Tensor Core part; computed once per span (``operator_view``), combined over spans
(``combine_views``), summed for the /operators route (``view_table``) and, by name over
all included steps, for the run comparison's operator diff (``name_totals``, METRICS.md
§11). This is the one definition of per-operator time in the package.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, TraceData
from . import factorize
from .steps import Steps


def _unique_rows(key) -> tuple:
    """``np.unique(key, axis=0, return_inverse=True)`` for an (n, m) integer array
    (factorize.unique_rows: dense keys without a sort). Same rows, same (lexicographic)
    order."""
    return factorize.unique_rows(key)


def _nesting(pid, tid, ts, end, container: Optional[np.ndarray] = None, threads: Optional[np.ndarray] = None,
             want_depth: bool = True, parent_dtype=np.int64):
    """Depth (0 = not inside another op of the set on its thread) and direct parent
    (index, -1 for none) of each interval. Intervals on one thread are assumed to nest
    (as the profiler writes them); an interval starting exactly when another ends is
    not inside it. Zero-length intervals get a depth but are nobody's parent.
    ``container`` (an int64 array of n, filled in place): for each zero-length interval,
    the innermost positive-length one whose [start, end) holds its time (-1 for none),
    meaningful when the set nests (``_laminar``). ``threads``: dense thread ids of the rows
    (``thread_ids``) when the caller has them. ``want_depth=False``: the depth is None (not
    kept: 8 bytes per interval less through the walk). ``parent_dtype``: the parent's (int32
    for the host nesting: 4 bytes per interval less through the walk)."""
    n = len(ts)
    depth = np.zeros(n, np.int64) if want_depth else None
    parent = np.full(n, -1, parent_dtype)
    if threads is None:
        threads = _thread_codes(pid, tid)
    # (temporaries deleted after their last read: on one thread of 10M ops each is 76 MiB)
    n_threads = int(threads.max()) + 1 if n else 0
    for t in range(n_threads):
        if n_threads == 1:  # (one thread: no index of its rows; none when every interval has a length)
            pos_mask = end > ts
            full = None if pos_mask.all() else np.flatnonzero(pos_mask)
            zero = np.flatnonzero(~pos_mask) if full is not None else np.zeros(0, np.int64)
        else:
            idx = np.flatnonzero(threads == t)
            pos_mask = end[idx] > ts[idx]
            full = idx[pos_mask]
            zero = idx[~pos_mask]
            del idx
        del pos_mask
        # Positive-length ops in (start, longest first) order: each op's ancestors are
        # the earlier ones still open at its start.
        o = _start_order(ts, end, None) if full is None else full[_start_order(ts[full], end, full)]
        del full
        ends_sorted = end[o]
        ends_sorted.sort()  # (np.sort(end[o]) without its second copy)
        # d_full = searchsorted(ends_sorted, ts[o]) - ... in blocks: no sorted copy of the starts
        d_full = np.empty(len(o), np.int32 if len(o) < (1 << 31) else np.int64)  # (a depth: 4 bytes per event)
        for a in range(0, len(o), _WALK_BLOCK):  # arange(len(o)) - d_full, block by block, in place
            d = d_full[a:a + _WALK_BLOCK]
            d[:] = np.searchsorted(ends_sorted, ts[o[a:a + _WALK_BLOCK]], side="right")
            np.subtract(np.arange(a, a + len(d)), d, out=d)
        if depth is not None:
            depth[o] = d_full
        if len(zero) and depth is not None:
            depth[zero] = (np.searchsorted(ts[o], ts[zero], side="right")
                           - np.searchsorted(ends_sorted, ts[zero], side="right"))
        del ends_sorted  # (made again below if needed: not held through the parents)
        # Parent: the nearest earlier op one level up: per depth d, each position's nearest
        # smaller position among depth d - 1 (positions ascending in each depth's group of the
        # stable order), in blocks of queries: a block's temporaries, and no (depth, position)
        # int64 codes of every event (this was the host nesting's peak)
        bounds = np.concatenate([[0], np.cumsum(np.bincount(d_full))]) if len(o) else np.zeros(1, np.int64)
        key_order = _level_order(d_full, bounds)
        del d_full
        for d in range(1, len(bounds) - 1):
            prev = key_order[bounds[d - 1]:bounds[d]]
            for a in range(int(bounds[d]), int(bounds[d + 1]), _WALK_BLOCK):
                q = key_order[a:min(a + _WALK_BLOCK, int(bounds[d + 1]))]
                j = np.searchsorted(prev, q, side="left")
                j -= 1
                ok = j >= 0
                parent[o[q[ok]]] = o[prev[j[ok]]]
                del q, j, ok
        del key_order, bounds
        if container is not None and len(zero) and len(o):
            # the last positive interval starting at or before the point, then up while closed
            j = np.searchsorted(ts[o], ts[zero], side="right") - 1
            cand = np.where(j >= 0, o[np.maximum(j, 0)], -1)
            while True:
                closed = cand >= 0
                closed[closed] = end[cand[closed]] <= ts[zero[closed]]
                if not closed.any():
                    break
                cand[closed] = parent[cand[closed]]
            container[zero] = cand
    return depth, parent


def _level_order(level: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``np.argsort(level, kind="stable")`` of non-negative small ints (depths; ``bounds``: the
    cumulative counts of each value from 0), as int32 below 2**31 rows: a counting sort in
    blocks, each block's rows stably ordered and placed after the earlier blocks' rows of each
    value. (A whole argsort's int64 index and its radix buffer were the host nesting's peak,
    16 bytes per event; this is 4.)"""
    n = len(level)
    out = np.empty(n, np.int32 if n < (1 << 31) else np.int64)
    cursor = bounds[:-1].astype(np.int64)  # next free slot of each value
    n_values = len(cursor)
    for a in range(0, n, _WALK_BLOCK):
        part = level[a:a + _WALK_BLOCK]
        ob = _stable_order(part)
        sorted_part = part[ob]
        counts = np.bincount(part, minlength=n_values)
        first = np.cumsum(counts) - counts  # each value's first place in the block's order
        dest = np.arange(len(part), dtype=np.int64)
        dest -= first[sorted_part]
        dest += cursor[sorted_part]
        ob += a
        out[dest] = ob
        cursor += counts
    return out


def _stable_order(small: np.ndarray) -> np.ndarray:
    """``np.argsort(small, kind="stable")`` of non-negative ints such as depths: as int16
    when they fit, which numpy sorts by radix (~7x faster than an int64 merge sort)."""
    if len(small) and 0 <= small.min() and small.max() < (1 << 15):
        return np.argsort(small.astype(np.int16), kind="stable")
    return np.argsort(small, kind="stable")


def _thread_codes(pid, tid) -> np.ndarray:
    """A dense id per distinct (pid, tid) (in order of first appearance): rows come in runs
    of one thread, so only the runs' keys are hashed."""
    n = len(pid)
    if n == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.flatnonzero((pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])) + 1])
    codes: Dict[tuple, int] = {}
    run_code = np.fromiter((codes.setdefault(k, len(codes)) for k in zip(pid[starts].tolist(), tid[starts].tolist())),
                           np.int64, len(starts))
    return np.repeat(run_code, np.diff(np.append(starts, n)))


def thread_ids(pid, tid) -> np.ndarray:
    """A dense id per distinct (pid, tid), numbered in (pid, tid) order (as
    ``np.unique(np.stack([pid, tid], 1), axis=0, return_inverse=True)``), without a sort
    of the rows: only the few distinct threads are ranked."""
    codes = _thread_codes(pid, tid)
    if not len(codes):
        return codes
    first = np.full(int(codes.max()) + 1, len(codes), np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    rank = np.empty(len(first), np.int64)
    rank[np.lexsort((tid[first], pid[first]))] = np.arange(len(first))
    return rank[codes]


def _start_order(ts, end, rows) -> np.ndarray:
    """``np.lexsort((-end[rows], ts))`` (``ts`` the starts of ``rows``): by start, then longest
    first, then position. A stable sort of the starts (nearly sorted in a trace); only runs of
    equal starts are sorted again. (No sorted copy of the starts, no ``end[rows]``: the host
    nesting's peak, 16 bytes per event.) ``rows`` None: every row, ``ts`` being all of them."""
    o = np.argsort(ts, kind="stable")
    last = len(o) - 1  # tie: the k with ts[o[k + 1]] == ts[o[k]], in blocks of k
    tie = np.concatenate([np.flatnonzero(ts[o[a + 1:min(a + _WALK_BLOCK, last) + 1]]
                                         == ts[o[a:min(a + _WALK_BLOCK, last)]]) + a
                          for a in range(0, max(last, 0), _WALK_BLOCK)] or [np.zeros(0, np.int64)])
    if len(tie):
        m = np.zeros(len(o), bool)
        m[tie] = True
        m[tie + 1] = True
        i = np.flatnonzero(m)
        oi = o[i]
        o[i] = oi[np.lexsort((i, -end[oi if rows is None else rows[oi]], ts[oi]))]
    return o


def _nearest(parent: np.ndarray, prop: np.ndarray) -> np.ndarray:
    """For each node, the nearest ancestor-or-self with ``prop`` (-1 when none), by
    pointer doubling: O(n log depth), no per-node loop."""
    n = len(parent)
    jump = np.arange(n, dtype=np.result_type(parent, np.int64))  # = where(prop, arange(n), parent), in place
    np.copyto(jump, parent, where=~prop)
    # only the nodes still pointing at an ancestor without ``prop`` take part in a round. In
    # blocks of nodes: a jump always points at an ancestor with no ``prop`` node strictly
    # between, so a block may read the jumps an earlier block of the round advanced; the end
    # (each jump at -1 or a ``prop`` node) is the same, and the temporaries are a block's
    def still_open(a):
        a = a[jump[a] >= 0]
        return a[~prop[jump[a]]]

    act = np.concatenate([still_open(np.arange(i0, min(i0 + _WALK_BLOCK, n))) for i0 in range(0, n, _WALK_BLOCK)]
                         or [np.zeros(0, np.int64)])
    while len(act):
        parts = []
        for i0 in range(0, len(act), _WALK_BLOCK):
            a = act[i0:i0 + _WALK_BLOCK]
            jump[a] = jump[jump[a]]
            parts.append(still_open(a))
        act = np.concatenate(parts)
        del parts
    return jump


def _strict(parent: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """Nearest strict ancestor from the ancestor-or-self ``nearest``
    (``where(parent >= 0, nearest[max(parent, 0)], -1)``, one temporary less)."""
    out = nearest[np.maximum(parent, 0)]
    out[parent < 0] = -1
    return out


def _strict_none(parent: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """``_strict(parent, nearest) < 0`` (no strict ancestor with the property), in blocks:
    no per-node int64 temporaries."""
    out = np.empty(len(parent), bool)
    for i0 in range(0, len(parent), _WALK_BLOCK):
        out[i0:i0 + _WALK_BLOCK] = _strict(parent[i0:i0 + _WALK_BLOCK], nearest) < 0
    return out


def _laminar(ts, end, parent) -> bool:
    """Whether the positive-length intervals of a ``_nesting`` result nest exactly (any two
    on a thread disjoint or one inside the other): each one inside some other is inside its
    parent. Then every subset's ``_nesting`` is this one's restricted to the subset.
    (A positive-length interval is inside some other, depth > 0, exactly when it has a
    parent: its depth rises by at most one from the one before it in start order, so a
    depth-(d - 1) interval comes earlier. In blocks: a block's temporaries.)"""
    for a in range(0, len(ts), _WALK_BLOCK):
        par = parent[a:a + _WALK_BLOCK]
        e = end[a:a + _WALK_BLOCK]
        chk = (e > ts[a:a + _WALK_BLOCK]) & (par >= 0)
        if not (e[chk] <= end[par[chk]]).all():
            return False
    return True


# --------------------------------------------------------------------------- operator view
#
# The Operator view (METRICS.md "Operator view"): per included step and per (op name,
# recorded inputs), the calls, total and self CPU time, the GPU time the op launched
# (itself and through its descendants, through the correlation id) and the Tensor Core
# part of that GPU time, and how many of the calls are top-level (not inside another op
# of the set on their thread). Computed once per span; the /operators route and the
# comparison only sum rows.

# (step, name, inputs) rows kept per span, largest total CPU time first; the inputs of
# rows beyond are merged into "other inputs" (OTHER_INPUTS) of their (step, name).
MAX_VIEW_ROWS = 20000
OTHER_INPUTS = -2
# the FLOP columns (METRICS.md "Operator view: FLOPs"; flops.OP_FIELDS, summed like the times)
FLOP_FIELDS = ("flops", "flop_bytes", "flop_kernel_us", "peak_us", "hbm_us", "flop_calls", "byte_calls",
               "inner_calls")
VIEW_FIELDS = ("calls", "total_us", "self_us", "gpu_us", "gpu_self_us", "tc_us", "top_calls") + FLOP_FIELDS
_COUNT_FIELDS = ("calls", "top_calls", "flop_calls", "byte_calls", "inner_calls")
_EXACT_FIELDS = ("flops", "flop_bytes", "peak_us", "hbm_us")  # not rounded to 3 decimals (µs of one tiny op)


def finite_list(values: np.ndarray) -> list:
    """``[v if v - v == 0 else None for v in values]`` (NaN/inf -> None) without a Python
    test per value: one ``tolist`` and a fix-up of the few non-finite rows."""
    v = np.asarray(values, dtype=np.float64)
    out = v.tolist()
    bad = ~np.isfinite(v)
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            out[i] = None
    return out


def round3_list(values: np.ndarray) -> list:
    """``[round(v, 3) for v in values]`` (None for NaN/inf), vectorised and equal to Python's
    ``round`` bit for bit: ``rint(v * 1000) / 1000`` is the double nearest the decimal
    (IEEE division is correctly rounded) except where ``v * 1000`` lies within rounding error
    of a half, and those few values take Python's own ``round``."""
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf rows become None below
        scaled = v * 1000.0
        out = np.rint(scaled) / 1000.0
        near_half = finite & (np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6)
        near_half |= finite & (np.abs(scaled) >= 2.0 ** 52)  # no fraction bits left: let Python decide
    values_list = out.tolist()
    for i in np.flatnonzero(near_half).tolist():
        values_list[i] = round(float(v[i]), 3)
    if not finite.all():
        for i in np.flatnonzero(~finite).tolist():
            values_list[i] = None
    return values_list


def host_nesting(trace: TraceData) -> Dict[str, np.ndarray]:
    """The nesting of every host event of one trace per thread: trace.cpu rows (every kind,
    ProfilerStep#N included), then trace.runtime rows. ``thread`` (``thread_ids``, int32),
    ``thread_pid`` (the pid of each thread id), ``ts``, ``dur`` (NaN/negative as 0), ``end``, ``parent``
    (see ``_nesting``; its depth is not kept), ``container`` (zero-length events: the innermost positive-length
    event holding their time; int32 below 2**31 events) and ``laminar`` (``_laminar``). Source attribution walks it; ``op_nesting`` is derived from it
    when it nests exactly, so one nesting is computed per trace. Read-only."""
    cpu, rt = trace.cpu, trace.runtime
    pid = np.concatenate([cpu.pid, rt.pid])
    tid = np.concatenate([cpu.tid, rt.tid])
    thread = thread_ids(pid, tid)
    n = len(thread)
    # each thread's pid (not the pid/tid columns: 2 x 8 bytes per host event kept for this)
    thread_pid = np.zeros(int(thread.max()) + 1 if n else 0, np.int64)
    thread_pid[thread] = pid
    del pid, tid  # (not held through the nesting below)
    thread = thread.astype(np.int32)  # (ids < number of threads: 4 bytes per host event held, not 8)
    ts = np.concatenate([cpu.ts, rt.ts])
    end = _host_dur(cpu, rt)  # ts + dur, in place (dur made again after the walk: 8 bytes per host event
    end = np.add(ts, end, out=end) if end.dtype == np.result_type(ts, end) else ts + end  # less at its peak)
    if (end > ts).all():  # no zero-length event: no container to find (a read-only -1 per event, no memory)
        container = np.broadcast_to(np.int64(-1), (n,))
    else:
        container = np.full(n, -1, np.int64)
    if n:
        # (the depth is read by no one; parent indices in 4 bytes per host event below 2**31 events)
        _, parent = _nesting(None, None, ts, end, container if container.strides != (0,) else None, threads=thread,
                             want_depth=False, parent_dtype=np.int32 if n < (1 << 31) else np.int64)
    else:
        parent = np.zeros(0, np.int32)
    laminar = _laminar(ts, end, parent)
    dur = _host_dur(cpu, rt)
    return {"thread": thread, "thread_pid": thread_pid, "ts": ts, "dur": dur, "end": end,
            "parent": parent, "container": container, "laminar": laminar}


def _host_dur(cpu, rt) -> np.ndarray:
    """The host events' durations (cpu rows, then runtime rows), NaN/negative as 0."""
    dur = np.concatenate([cpu.dur, rt.dur])
    return np.maximum(np.nan_to_num(dur, nan=0.0, copy=False), 0.0, out=dur)


def span_host_nesting(span) -> Dict[str, np.ndarray]:
    """``host_nesting(span.trace)`` once per span (analysis/units.SpanContext)."""
    return span.once("host_nesting", lambda: host_nesting(span.trace))


def _op_rows(trace: TraceData) -> np.ndarray:
    cpu = trace.cpu
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    return np.flatnonzero(((cpu.kind == CPU_OP) | (cpu.kind == CPU_USER_ANNOTATION))
                          & ~np.isin(cpu.name, step_ids))


def _subset_nesting(host: Dict[str, np.ndarray], rows: np.ndarray, consume: bool = False):
    """``_nesting`` of the host events ``rows`` (ascending) from an exactly nesting host
    nesting: the parent is the nearest strict ancestor among ``rows``, the depth the number of
    such ancestors (a zero-length event: of its container and the container's ancestors).
    ``consume``: ``host`` is the caller's own dict, whose ``end`` and ``parent`` are dropped
    here once read (op_nesting's consume_host). Both results int64."""
    h_par = host["parent"]
    n = len(rows)
    zero = np.flatnonzero((host["end"] <= host["ts"])[rows])  # (a mask gathered: not two time columns)
    if consume:
        del host["end"]  # (8 bytes per host event: not held through the walk below)
    # (host indices as int32 below 2**31 events: 4 bytes per host event and per op, not 8)
    idx = np.int32 if len(h_par) < (1 << 31) else np.int64
    local = np.full(len(h_par), -1, idx)
    for a in range(0, n, _WALK_BLOCK):  # local[rows] = arange(n), without an arange of every op
        local[rows[a:a + _WALK_BLOCK]] = np.arange(a, min(a + _WALK_BLOCK, n), dtype=idx)

    def up_to_member(node):  # nearest ancestor-or-self among rows (host index), walking up
        # (``node``: a fresh array of the caller's, walked in place; in blocks, each node's walk
        # being its own: the index temporaries are a block's, not 4 x 8 bytes per event)
        for i0 in range(0, len(node), _WALK_BLOCK):
            part = node[i0:i0 + _WALK_BLOCK]
            go = np.flatnonzero(part >= 0)
            go = go[local[part[go]] < 0]
            while len(go):
                part[go] = h_par[part[go]]
                go = go[part[go] >= 0]
                go = go[local[part[go]] < 0]
        return node

    up = up_to_member(h_par[rows].astype(idx, copy=False))
    cont = host["container"][rows[zero]] if len(zero) else None
    if len(zero):
        cont = up_to_member(cont.astype(idx, copy=False))
    if consume:
        del host["parent"], host["container"]
    del h_par
    # parent = where(up >= 0, local[max(up, 0)], -1), in place
    outside = up < 0
    np.maximum(up, 0, out=up)
    parent = local[up]
    del up
    parent[outside] = -1
    del outside
    if not len(zero):
        del local  # (read again only for zero-length members)
    # depth: list ranking along the member parents (log2(depth) rounds)
    depth = (parent >= 0).astype(np.int64)
    go = np.flatnonzero(depth)
    nxt = parent.copy() if len(go) else None  # (no copy when no member is inside another)
    while len(go):
        depth[go] += depth[nxt[go]]
        nxt[go] = nxt[nxt[go]]
        go = go[nxt[go] >= 0]
    del nxt, go
    if len(zero):
        depth[zero] = np.where(cont >= 0, depth[local[np.maximum(cont, 0)]] + 1, 0)
    return depth, parent.astype(np.int64, copy=False)


def _gather_in_place(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]`` (rows ascending, distinct) written over ``a``'s own first ``len(rows)``
    slots, in blocks, and returned as that prefix: no second array of the rows. Block by
    block the reads (rows[i] >= i) lie at or past the block being written. A copy when
    fewer than half the rows are kept (the prefix would hold the whole buffer)."""
    k = len(rows)
    if 2 * k < len(a):
        return a[rows]
    for i0 in range(0, k, _WALK_BLOCK):
        i1 = min(i0 + _WALK_BLOCK, k)
        a[i0:i1] = a[rows[i0:i1]]
    return a[:k]


_WALK_BLOCK = 1 << 18  # (int64 temporaries of 2 MiB per block)


def op_nesting(trace: TraceData, host: Optional[Dict[str, np.ndarray]] = None, *,
               consume_host: bool = False) -> Dict[str, np.ndarray]:
    """The CPU op nesting of one trace, the one computation of it (the Operator view and
    the step timeline's lanes use it): every CPU op / user annotation except
    ProfilerStep#N, ``rows`` (into trace.cpu), ``ts``, ``dur`` (NaN/negative as 0),
    ``depth`` (0 = inside no other op of the set on its thread) and ``parent``
    (index into ``rows`` of the direct parent, -1 for none); see ``_nesting``. Read-only.
    ``host``: ``host_nesting(trace)``, from which it is derived when that nests exactly
    (the same arrays as nesting the ops alone). ``consume_host``: the caller drops ``host``
    after this call and nothing else holds it; its ts/dur buffers (trace.cpu's rows
    first, the same values as made here) are then reused for the ops' own, in place.
    (No ``end``: read by none of its users, and 8 bytes per op held from source attribution
    to the timeline store, the Operator view's peak.)"""
    cpu = trace.cpu
    rows = _op_rows(trace)
    derived = bool(len(rows)) and host is not None and host["laminar"]
    if derived:  # before the times below: its temporaries are gone when they are made (peak)
        depth, parent = _subset_nesting(host, rows, consume=consume_host)
        if consume_host:  # (24 bytes per host event not allocated again: source attribution's peak)
            ts, dur = (_gather_in_place(host[k], rows) for k in ("ts", "dur"))
            return {"rows": rows, "ts": ts, "dur": dur, "depth": depth, "parent": parent}
    ts = cpu.ts[rows]
    dur = cpu.dur[rows]  # (a fresh array: NaN/negative fixed in place)
    dur = np.maximum(np.nan_to_num(dur, nan=0.0, copy=False), 0.0, out=dur)
    if not len(rows):
        depth, parent = (np.zeros(0, np.int64),) * 2
    elif not derived:
        depth, parent = _nesting(cpu.pid[rows], cpu.tid[rows], ts, ts + dur)
    return {"rows": rows, "ts": ts, "dur": dur, "depth": depth, "parent": parent}


def span_op_nesting(span) -> Dict[str, np.ndarray]:
    """``op_nesting`` once per span (analysis/units.SpanContext), from the span's host
    nesting (``span_host_nesting``, which source attribution uses too)."""
    return span.once("op_nesting", lambda: op_nesting(span.trace, span_host_nesting(span)))


def _op_instances(trace: TraceData, nesting: Optional[Dict[str, np.ndarray]] = None,
                  gpu_runtime: Optional[np.ndarray] = None, op_calls=None,
                  flop_per_op: Optional[dict] = None, own: bool = False):
    """Every CPU op / user annotation except ProfilerStep#N, with its nesting and times.

    Returns a dict of arrays over those rows: ``rows`` (into trace.cpu), ``total``,
    ``self`` (duration minus direct child ops minus runtime calls made directly), ``gpu``
    (GPU activities launched by the op or any descendant), ``gpu_self`` (launched by its
    own runtime calls), ``tc`` (Tensor Core kernels among ``gpu``): these three as (None, column)
    or sparse (kept op positions ascending, values; 0 elsewhere: ``_per_op_sums``). ``nesting``:
    ``op_nesting(trace)``, ``gpu_runtime``: linking.gpu_runtime_index(trace), ``op_calls``:
    linking.op_calls(trace), when the caller has them. ``flop_per_op``: the flops unit's
    sparse per-op columns (flops._per_op; an op merged into its parent adds to the parent's),
    returned as ``flop_rows`` (kept rows) and each field's values there. ``own``: ``nesting`` is the
    caller's own dict (no cache holds it): emptied here, so that each array goes with its last
    reader."""
    cpu = trace.cpu
    nest = op_nesting(trace) if nesting is None else nesting
    rows, ts, dur = nest["rows"], nest["ts"], nest["dur"]
    depth, parent = nest["depth"], nest["parent"]
    if own or nesting is None:  # the dict is this call's: each array lives only as long as its readers
        nest.clear()
    del nest
    n = len(rows)
    alias = _merged_into(parent, cpu.name[rows], cpu.kind[rows])  # (None, and merged None: no op merged)
    merged = None if alias is None else alias != np.arange(n)
    if merged is not None:
        parent = np.where(parent >= 0, alias[np.maximum(parent, 0)], -1)
    child = np.flatnonzero(parent >= 0)
    if merged is not None:
        child = child[~merged[child]]
    child_parent = parent[child]
    del parent  # (8 bytes per op, gone before the self times are made when the dict was this call's)
    # (the children's sums subtracted only where there are children: no zero bincount of every op)
    self_t = dur - np.bincount(child_parent, weights=dur[child], minlength=n) if len(child) else dur.copy()
    del child_parent, child
    # the launched GPU times are sparse: (op index, value) of the ops that have any, ascending
    # (24 bytes per op less than dense columns on traces where few ops launch)
    empty = (np.zeros(0, np.int64), np.zeros(0))
    gpu = gpu_self = tc = empty
    if n and len(trace.runtime):
        gpu, gpu_self, tc, rt_self = _launched_times(trace, rows, depth, alias, merged, gpu_runtime, op_calls)
        if rt_self[0] is None:
            self_t -= rt_self[1]
        else:
            self_t[rt_self[0]] -= rt_self[1]  # (dur - children - 0.0 elsewhere: the same values)
        del rt_self
    self_t = np.maximum(self_t, 0.0, out=self_t)
    kept_pos = None
    if merged is None:  # no op merged (the usual case on traces of tiny ops): the arrays as they are,
        # read-only from here (the nesting's are the span's cache), no copy of each
        keep = slice(None)
    else:
        keep = ~merged
        kept_pos = np.cumsum(keep) - 1
    out = {"rows": rows[keep], "ts": ts[keep], "total": dur[keep], "self": self_t[keep], "depth": depth[keep]}
    for f, (at, v) in (("gpu", gpu), ("gpu_self", gpu_self), ("tc", tc)):  # (sparse at: kept ops only)
        out[f] = (None, v[keep]) if at is None else (at if kept_pos is None else kept_pos[at], v)
    del self_t, gpu, gpu_self, tc
    if flop_per_op and flop_per_op.get("fields"):
        # sparse (flops._per_op): a merged op's numbers go to the op it is merged into, summed
        # in row order (the order a bincount over every row would add them); ``flop_rows``:
        # the kept row each sum belongs to, ascending
        index = flop_per_op["index"]
        targets, at = np.unique(index if alias is None else alias[index], return_inverse=True)
        out["flop_rows"] = targets.astype(np.int64) if kept_pos is None else kept_pos[targets]
        for f, v in flop_per_op["fields"].items():
            out[f] = np.bincount(at.reshape(-1), weights=v, minlength=len(targets))
    return out


def _launched_times(trace: TraceData, rows, depth, alias, merged, gpu_runtime, op_calls):
    """Per op of ``rows``: the GPU time it launched (itself and through its descendants),
    the part its own runtime calls launched, the Tensor Core part, and the time of the
    runtime calls it made directly (subtracted from its self time). Apart from
    ``_op_instances`` so that its temporaries are gone before the view is built."""
    from . import linking, tensor_cores

    cpu = trace.cpu
    n = len(rows)
    empty = (np.zeros(0, np.int64), np.zeros(0))
    gpu = gpu_self = tc = empty
    local = np.full(len(cpu), -1, np.int32 if n < (1 << 31) else np.int64)  # (an op index: 4 bytes per row)
    for a in range(0, n, _WALK_BLOCK):  # local[rows] = arange(n), without an arange of every op
        local[rows[a:a + _WALK_BLOCK]] = np.arange(a, min(a + _WALK_BLOCK, n), dtype=local.dtype)
    op, call = linking.calls_inside(trace, rows, among=op_calls)
    op = local[op].astype(np.int64)
    del local
    # the innermost op around each call (the deepest of its enclosing ops; a merged
    # op's calls belong to the op it was merged into)
    if 4 * len(op) < n:  # few ops hold calls (traces of tiny ops): ranked among those ops (their
        # order kept), not with a negated depth of every op (8 bytes per op)
        present = np.zeros(n, bool)
        present[op] = True
        with_calls = np.flatnonzero(present)
        del present
        best = linking.first_per_call(np.searchsorted(with_calls, op), call, len(trace.runtime),
                                      (-depth[with_calls],))
        hit = best >= 0
        best[hit] = with_calls[best[hit]]
        del with_calls, hit
    else:
        best = linking.first_per_call(op, call, len(trace.runtime), (-depth,))
    inner_call = np.flatnonzero(best >= 0)
    inner_op = best[inner_call] if alias is None else alias[best[inner_call]]
    del best
    if merged is not None:
        op, call = op[~merged[op]], call[~merged[op]]
    rt_dur = np.maximum(np.nan_to_num(trace.runtime.dur, nan=0.0), 0.0)
    inner_sum = _per_op_sums(inner_op, n)
    rt_self = inner_sum(rt_dur[inner_call])
    gpu_rt = linking.gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
    linked = np.flatnonzero(gpu_rt >= 0)
    if len(linked) and len(call):
        g_dur = np.maximum(np.nan_to_num(trace.gpu.dur, nan=0.0), 0.0)
        tc_mask = tensor_cores.tensor_core_kernel_mask(trace)
        per_call = np.bincount(gpu_rt[linked], weights=g_dur[linked], minlength=len(trace.runtime))
        per_call_tc = np.bincount(gpu_rt[linked], weights=np.where(tc_mask[linked], g_dur[linked], 0.0),
                                  minlength=len(trace.runtime))
        op_sum = _per_op_sums(op, n)
        gpu = op_sum(per_call[call])
        tc = op_sum(per_call_tc[call])
        gpu_self = inner_sum(per_call[inner_call])
    return gpu, gpu_self, tc, rt_self


def _per_op_sums(op: np.ndarray, n: int):
    """``weights -> np.bincount(op, weights, minlength=n)`` as (None, that dense column) when
    ``op`` names many ops, else sparse: (the distinct ops ascending, their sums). The sparse
    bincount adds each op's weights in the same order: the same values, 0.0 elsewhere (traces of
    tiny ops, where few ops launch: 8 bytes per op less for each column)."""
    if 4 * len(op) >= n:
        return lambda w: (None, np.bincount(op, weights=w, minlength=n))
    present = np.zeros(n, bool)
    present[op] = True
    at = np.flatnonzero(present)
    del present
    local = np.searchsorted(at, op)
    return lambda w: (at, np.bincount(local, weights=w, minlength=len(at)))


def _gather(col: np.ndarray, rows) -> np.ndarray:
    """``col[rows]``, kept a broadcast when ``col`` is a constant column (stride 0)."""
    if col.strides == (0,) and len(col):
        return np.broadcast_to(col[:1], (len(col[rows]) if isinstance(rows, slice) else len(rows),))
    return col[rows]


def _merged_into(parent, name, kind) -> np.ndarray:
    """For each op, the op it is merged into (itself when not merged): an op that is the
    only child of an op of the same name (both CPU ops, not annotations) is one call of
    that op, as torch.profiler's EventList._remove_dup_nodes and torch-tb-profiler count
    it (``aten::div`` calling ``aten::div``). Chains merge into their outermost op.
    None when no op is merged (no arange of every op)."""
    n = len(parent)
    has = np.flatnonzero(parent >= 0)
    if len(has) == 0:
        return None
    n_children = np.bincount(parent[has], minlength=n)
    p = parent[has]
    dup = has[(n_children[p] == 1) & (name[has] == name[p]) & (kind[has] == CPU_OP) & (kind[p] == CPU_OP)]
    if len(dup) == 0:
        return None
    alias = np.arange(n)
    alias[dup] = parent[dup]
    for _ in range(64):  # chains: follow to the outermost op
        nxt = alias[alias]
        if np.array_equal(nxt, alias):
            break
        alias = nxt
    return alias


def operator_view(trace: TraceData, steps: Steps, span=None) -> dict:
    """The span's operator view: one row per (included step, op name, recorded inputs).

    An op instance belongs to the included step whose host span (ProfilerStep#N on the
    CPU) contains its start, on any thread; ops outside every included step are left out.
    Columnar, with names and inputs as indices into the ``names`` / ``inputs`` lists::

        {"steps": [N...], "names": [str], "inputs": [[dims_text, types_text]],
         "record_shapes": bool, "rows": {"step", "name", "input", *VIEW_FIELDS: [..]},
         "rows_merged": k, "has_gpu": bool}

    ``has_gpu`` is False for a trace without any GPU activity: its GPU columns are n/a, not 0.
    ``span``: the report's per-span context (analysis/units.SpanContext), whose op nesting,
    GPU→runtime index and op/call pairs are reused.
    """
    out = {"steps": [], "names": [], "inputs": [], "record_shapes": False,
           "rows": {k: [] for k in ("step", "name", "input") + VIEW_FIELDS}, "rows_merged": 0,
           "has_gpu": bool(len(trace.gpu)), "flops_counted": False, "peak_gpu": None, "peak_na": None}
    if steps.count == 0:
        return out
    out["steps"] = [int(x) for x in steps.inc_numbers]
    if span is not None:
        from .linking import span_gpu_runtime, span_op_calls

        per_op = span.once("flops_per_op", dict)  # filled by the flops unit when it counted
        nest, own = span_op_nesting(span), False
        if not span.extras.get("timeline"):
            # the op nesting's last reader on the report path (the timeline store reads it after this
            # view otherwise): released now, its arrays dropped here once read (Operator view's peak)
            span.release("op_nesting")
            nest, own = dict(nest), True
        inst = _op_instances(trace, nest, span_gpu_runtime(span), span_op_calls(span), flop_per_op=per_op, own=own)
        del nest
        if per_op.get("fields") is not None:
            out.update(flops_counted=True, peak_gpu=per_op.get("peak_gpu"), peak_na=per_op.get("peak_na"))
    else:
        inst = _op_instances(trace)
    rows = inst.pop("rows")  # (popped: each per-op array is dropped after its last read below)
    n_rows = len(rows)
    if len(rows) == 0:
        return out
    h_lo = np.asarray(steps.inc_host_start, np.float64)
    h_hi = np.asarray(steps.inc_host_end, np.float64)
    if not steps.found:  # one window over the whole trace
        h_lo, h_hi = np.array([-np.inf]), np.array([np.inf])
    order = np.argsort(h_lo, kind="stable")
    lo, hi = h_lo[order], h_hi[order]
    ts = inst.pop("ts")
    # each op's step (a step index: 4 bytes per op, not 8; the key's values come back as int64 from
    # unique_columns) and whether it lies inside it, in blocks of ops: no int64 index of every op
    step_col = np.empty(n_rows, np.int32)
    inside = np.empty(n_rows, bool)
    order32 = order.astype(np.int32)
    for a in range(0, n_rows, _WALK_BLOCK):
        t = ts[a:a + _WALK_BLOCK]
        jc = np.searchsorted(lo, t, side="right")
        jc -= 1
        ok = jc >= 0
        np.maximum(jc, 0, out=jc)
        ok &= t < hi[jc]
        inside[a:a + _WALK_BLOCK] = ok
        step_col[a:a + _WALK_BLOCK] = order32[jc]
    del ts, t, jc, ok
    keep = np.flatnonzero(inside)
    del inside
    # the (step, name, dims, types) key written in place, and each temporary dropped once
    # read: this view runs last, on top of every cached column of the span (peak memory)
    cpu = trace.cpu
    if len(keep) == len(rows):  # every op inside an included step (the usual case): no gathers
        keep = slice(None)
    else:
        step_col = step_col[keep]
    kept_rows = rows[keep]
    # the key's columns side by side (factorize.unique_columns: no (n, 4) int64 copy; a
    # constant column, e.g. no recorded inputs, stays a broadcast)
    dims_col, types_col = (_gather(c, kept_rows) for c in (cpu.input_dims, cpu.input_types))
    out["record_shapes"] = bool((dims_col >= 0).any())
    if len(step_col) == 0:
        return out
    name_col = cpu.name[kept_rows]
    del rows, kept_rows
    uniq, inv = factorize.unique_columns(step_col, name_col, dims_col, types_col)
    del step_col, name_col, dims_col, types_col
    k = len(uniq)
    sums = {"calls": np.bincount(inv, minlength=k).astype(np.float64),
            "top_calls": np.bincount(inv, weights=(inst["depth"][keep] == 0).astype(np.float64), minlength=k)}
    for field_name, src in (("total_us", "total"), ("self_us", "self")):
        sums[field_name] = np.bincount(inv, weights=inst[src][keep], minlength=k)
    if not isinstance(keep, slice):
        group_of = np.full(n_rows, -1, np.int64)
        group_of[keep] = inv
    for field_name, src in (("gpu_us", "gpu"), ("gpu_self_us", "gpu_self"), ("tc_us", "tc")):
        at, v = inst[src]  # sparse, ascending: the same sums as a bincount of the dense column
        if at is None:
            sums[field_name] = np.bincount(inv, weights=v[keep], minlength=k)
            continue
        g = inv[at] if isinstance(keep, slice) else group_of[at]
        sums[field_name] = np.bincount(g[g >= 0], weights=v[g >= 0], minlength=k)
    # the FLOP columns are sparse (the few rows that count anything), summed in the same order
    if "flop_rows" not in inst:
        flop_group = np.zeros(0, np.int64)
    elif isinstance(keep, slice):  # every op kept: its group is its inverse (no per-op copy of it)
        flop_group = inv[inst["flop_rows"]]
    else:
        flop_group = group_of[inst["flop_rows"]]
    group_of = None
    in_view = flop_group >= 0
    for f in FLOP_FIELDS:
        sums[f] = (np.bincount(flop_group[in_view], weights=inst[f][in_view], minlength=k) if f in inst
                   else np.zeros(k))
    del inst, inv, keep
    # inputs: one id per distinct (dims, types) pair
    pairs, input_idx = _unique_rows(uniq[:, 2:])
    input_idx = input_idx.reshape(-1)
    has_input = (pairs[:, 0] >= 0) | (pairs[:, 1] >= 0)
    input_idx = np.where(has_input[input_idx], input_idx, -1)
    merged = 0
    if k > MAX_VIEW_ROWS:
        # keep the largest rows' inputs; merge the others per (step, name)
        rank = np.argsort(-sums["total_us"], kind="stable")
        small = np.zeros(k, bool)
        small[rank[MAX_VIEW_ROWS // 2:]] = True
        input_idx = np.where(small & (input_idx >= 0), OTHER_INPUTS, input_idx)
        key2 = np.stack([uniq[:, 0], uniq[:, 1], input_idx], 1)
        uniq2, inv2 = _unique_rows(key2)
        inv2 = inv2.reshape(-1)
        merged = k - len(uniq2)
        sums = {f: np.bincount(inv2, weights=v, minlength=len(uniq2)) for f, v in sums.items()}
        uniq = np.concatenate([uniq2[:, :2], np.zeros((len(uniq2), 2), np.int64)], 1)
        input_idx = uniq2[:, 2]
    # compact name table
    name_ids, name_idx = factorize.unique_inverse(uniq[:, 1])
    strings = trace.strings

    def text(i):
        return strings[int(i)] if i >= 0 else None

    out["names"] = [strings[int(i)] for i in name_ids]
    out["inputs"] = [[text(d), text(t)] for d, t in pairs]
    out["rows"] = {"step": uniq[:, 0].astype(int).tolist(), "name": name_idx.reshape(-1).astype(int).tolist(),
                   "input": np.asarray(input_idx).astype(int).tolist(),
                   **{f: sums[f].astype(int).tolist() for f in _COUNT_FIELDS}}
    for f in VIEW_FIELDS:
        if f in _EXACT_FIELDS:
            out["rows"][f] = finite_list(sums[f])
        elif f not in _COUNT_FIELDS:
            out["rows"][f] = round3_list(sums[f])
    out["rows_merged"] = int(merged)
    return out


ROUTE_ROWS = 2000  # rows one /operators answer carries (largest self CPU time first)
TOP_INPUTS = 3  # recorded inputs listed per op in the by-name grouping


def view_table(view: dict, step=None, group: str = "op") -> dict:
    """The table the /operators route answers: the span (or combined) view summed over
    one step (``step`` = its number) or all included steps (None), grouped by op name
    (``group="op"``, with each op's top recorded inputs) or by op name and recorded
    inputs (``"op_shape"``). Raises KeyError for a step the view does not hold."""
    view = view or {}
    steps_list = list(view.get("steps") or [])
    rows = view.get("rows") or {}
    names = view.get("names") or []
    inputs = view.get("inputs") or []
    n = len(rows.get("name") or [])
    sel = np.ones(n, bool)
    if step is not None:
        if step not in steps_list:
            raise KeyError(step)
        sel = np.asarray(rows.get("step"), np.int64) == steps_list.index(step) if n else sel
    cols = {f: np.array([np.nan if v is None else v for v in rows.get(f) or [0] * n], np.float64)[sel]
            for f in VIEW_FIELDS}
    name_col = np.asarray(rows.get("name") or [], np.int64)[sel]
    input_col = np.asarray(rows.get("input") or [], np.int64)[sel]
    by_shape = group == "op_shape"
    key = np.stack([name_col, input_col if by_shape else np.zeros_like(input_col)], 1)
    out = {"steps": steps_list, "step": "all" if step is None else step, "group": "op_shape" if by_shape else "op",
           "record_shapes": bool(view.get("record_shapes")), "rows": [], "rows_left_out": 0,
           "inputs_merged": bool(view.get("rows_merged")), "not_available": {}}
    has_gpu = view.get("has_gpu", True)
    if not has_gpu:
        out["not_available"]["gpu"] = "no GPU activity in this selection (CPU-only trace)"
    if len(key) == 0:
        return out
    uniq, inv = _unique_rows(key)
    inv = inv.reshape(-1)
    k = len(uniq)
    sums = {f: np.bincount(inv, weights=cols[f], minlength=k) for f in VIEW_FIELDS}
    order = np.argsort(-sums["self_us"], kind="stable")
    out["rows_left_out"] = max(0, k - ROUTE_ROWS)
    order = order[:ROUTE_ROWS]
    top_inputs = {}
    if not by_shape and out["record_shapes"]:
        # per op: its recorded inputs by total CPU time
        pair = np.stack([name_col, input_col], 1)
        pu, pinv = _unique_rows(pair)
        pinv = pinv.reshape(-1)
        p_total = np.bincount(pinv, weights=cols["total_us"], minlength=len(pu))
        p_calls = np.bincount(pinv, weights=cols["calls"], minlength=len(pu))
        for i in np.lexsort((-p_total, pu[:, 0])):
            lst = top_inputs.setdefault(int(pu[i, 0]), [])
            if len(lst) < TOP_INPUTS:
                lst.append(_input_entry(inputs, int(pu[i, 1]), calls=int(p_calls[i]),
                                        total_us=_us(p_total[i])))
    counted = bool(view.get("flops_counted"))
    if not counted:
        out["not_available"]["flops"] = NA_FLOPS_NO_SHAPES if not out["record_shapes"] else NA_FLOPS_FAILED
    elif view.get("peak_na"):
        out["not_available"]["pct_of_peak"] = view["peak_na"]
    out["peak_gpu"] = view.get("peak_gpu")
    for g in order:
        gpu = float(sums["gpu_us"][g])
        tc_pct = 100.0 * float(sums["tc_us"][g]) / gpu if gpu > 0 else None
        row = {"name": names[int(uniq[g, 0])], "calls": int(sums["calls"][g]),
               "total_us": _us(sums["total_us"][g]), "self_us": _us(sums["self_us"][g]),
               "gpu_us": _us(gpu), "gpu_self_us": _us(sums["gpu_self_us"][g]), "tc_pct": _us(tc_pct)}
        row.update(flop_columns({f: float(sums[f][g]) for f in FLOP_FIELDS}, counted, out["not_available"]))
        if not has_gpu:
            row.update(gpu_us=None, gpu_self_us=None, tc_pct=None)
        if by_shape:
            row.update(_input_entry(inputs, int(uniq[g, 1])))
        elif out["record_shapes"]:
            row["top_inputs"] = top_inputs.get(int(uniq[g, 0]), [])
        out["rows"].append(row)
    return out


NA_FLOPS_NO_SHAPES = "no recorded shapes (profile with record_shapes=True): FLOPs cannot be counted"
NA_FLOPS_FAILED = "FLOPs were not counted for this selection (see the report's errors)"
NA_FLOPS_BYTES_ONLY = "no FLOP formula (elementwise, normalisation, softmax, copy): bytes only"
NA_FLOPS_INNER = "its FLOPs are counted on the op inside it (each FLOP once)"
NA_FLOPS_NONE = "no FLOP formula or no usable shapes (annotations, ops whose shapes do not fit a formula)"
NA_NO_KERNEL = "launched no GPU kernel"
NA_NO_PEAK = "no peak for this op's precision on this GPU"


def _finite(v) -> Optional[float]:
    return float(v) if v is not None and np.isfinite(v) else None


def flop_columns(s: Dict[str, float], counted: bool, view_na: Dict[str, str]) -> dict:
    """One Operator view row's FLOP columns from its FLOP_FIELDS sums (METRICS.md "Operator
    view: FLOPs"): ``flops`` (its own counted FLOPs), ``flop_bytes``, ``tflops`` (FLOPs / the
    µs of the kernels it launched), ``pct_of_peak`` (100 × Σ FLOPs/peak of each call's
    precision / kernel µs), ``bound`` ("compute" when FLOPs at peak take at least as long as
    its bytes at the HBM bandwidth, i.e. intensity >= ridge point; else "memory") and
    ``flops_na`` / ``peak_na``: why a column is null."""
    out = {"flops": None, "flop_bytes": None, "tflops": None, "pct_of_peak": None, "bound": None,
           "flops_na": None, "peak_na": None}
    if not counted:
        out["flops_na"] = view_na.get("flops")
        return out
    n_flop, n_byte = s["flop_calls"], s["byte_calls"]
    flops, kus = _finite(s["flops"]), _finite(s["flop_kernel_us"])
    if n_flop or n_byte:
        out["flop_bytes"] = _finite(s["flop_bytes"])
    if n_flop:
        out["flops"] = flops
    else:
        out["flops_na"] = NA_FLOPS_BYTES_ONLY if n_byte else NA_FLOPS_INNER if s["inner_calls"] else NA_FLOPS_NONE
    if not (n_flop or n_byte):
        return out
    if not kus:  # nothing ran on the GPU: no rate, no bound
        out["peak_na"] = NA_NO_KERNEL
        return out
    if n_flop and flops is not None:
        out["tflops"] = flops / kus / 1e6
    peak_us, hbm_us = _finite(s["peak_us"]), _finite(s["hbm_us"])
    if view_na.get("pct_of_peak"):
        out["peak_na"] = out["peak_na"] or view_na["pct_of_peak"]
    elif peak_us is None:
        out["peak_na"] = out["peak_na"] or NA_NO_PEAK
    else:
        if n_flop and flops:
            out["pct_of_peak"] = 100.0 * peak_us / kus
        if hbm_us is not None and (peak_us or hbm_us):
            out["bound"] = "compute" if peak_us >= hbm_us else "memory"
    return out


def _us(v) -> Optional[float]:
    """A time (or share) for JSON: rounded to 3 decimals; None (n/a) when it is not a
    finite number (a sum that overflowed on absurd durations, a missing value)."""
    if v is None:
        return None
    v = float(v)
    return round(v, 3) if np.isfinite(v) else None


def _input_entry(inputs: list, idx: int, **extra) -> dict:
    """{dims, types} texts of an inputs index (None when not recorded; "other" for the
    inputs merged away in a very long table)."""
    if idx == OTHER_INPUTS:
        return dict(extra, dims="other", types="other")
    if 0 <= idx < len(inputs):
        dims, types = inputs[idx]
        return dict(extra, dims=dims, types=types)
    return dict(extra, dims=None, types=None)


def combine_views(views: List[dict]) -> Optional[dict]:
    """A worker/run view from span views: all steps together (step numbers of different
    files are not the same steps, so a view of several spans has no per-step rows:
    ``steps`` is empty and only step=all can be asked; a single span's view is kept as
    it is). None when a span has no view.

    Rows are summed per (op name, recorded inputs) in span order, then row order (the
    keys in the order they are first seen): each span's columns become numpy arrays at
    once, its local name/input indices are mapped to the combined ones through a table
    (Python work per distinct name, not per row), and the rows of up to ``COMBINE_CHUNK``
    rows at a time are added in order with ``np.add.at`` (the same sums, in the same
    order, as adding row after row), so memory stays bounded at 1,000 spans."""
    if not views or any(not isinstance(v, dict) for v in views):
        return None
    if len(views) == 1:
        return views[0]  # one span: its steps stay selectable
    acc = _ViewSums()
    record = has_gpu = False
    merged = 0
    for v in views:
        record = record or bool(v.get("record_shapes"))
        has_gpu = has_gpu or bool(v.get("has_gpu", True))
        merged += int(v.get("rows_merged") or 0)
        acc.add(v)
    acc.flush()
    keys = acc.keys
    # FLOP columns: counted in every span, or n/a (a span without them would make a smaller sum)
    counted = all(v.get("flops_counted") for v in views)
    gpus = {v.get("peak_gpu") for v in views}
    peak_na = next((v.get("peak_na") for v in views if v.get("peak_na")), None)
    out = {"steps": [], "names": list(acc.names), "inputs": [list(k) for k in acc.inputs], "record_shapes": record,
           "has_gpu": has_gpu, "flops_counted": counted, "peak_gpu": gpus.pop() if len(gpus) == 1 else None,
           "peak_na": peak_na,
           "rows": {"step": [0] * len(keys), "name": [k[0] for k in keys], "input": [k[1] for k in keys]},
           "rows_merged": merged}
    for j, f in enumerate(VIEW_FIELDS):
        col = acc.sums[j, :len(keys)]
        out["rows"][f] = [int(x) for x in col.tolist()] if f in _COUNT_FIELDS \
            else finite_list(col) if f in _EXACT_FIELDS \
            else round3_list(col)  # _us of each
    return out


COMBINE_CHUNK = 1 << 16  # rows added per np.add.at pass in combine_views (≈ 5 MB of columns)


class _ViewSums:
    """combine_views' accumulator: combined name/input/key tables (first-seen order) and
    one row of VIEW_FIELDS sums per key."""

    def __init__(self):
        self.names: Dict[str, int] = {}
        self.inputs: Dict[tuple, int] = {}
        self.key_ids: Dict[tuple, int] = {}
        self.keys: List[tuple] = []
        self.sums = np.zeros((len(VIEW_FIELDS), 0), np.float64)  # one row per field
        self._pending: List[tuple] = []
        self._pending_rows = 0

    @staticmethod
    def _first_seen(col: np.ndarray, size: int) -> np.ndarray:
        """The distinct values of ``col`` (indices below ``size``) in the order of their
        first row."""
        n = len(col)
        first = np.full(size, n, np.int64)
        first[col[::-1]] = np.arange(n - 1, -1, -1)  # the last write wins: the first row
        present = np.flatnonzero(first < n)
        return present[np.argsort(first[present], kind="stable")]

    def add(self, v: dict) -> None:
        rows = v.get("rows") or {}
        v_names, v_inputs = v.get("names") or [], v.get("inputs") or []
        name_col = np.asarray(rows.get("name") or [], np.int64)
        n = len(name_col)
        if n == 0:
            return
        input_col = np.asarray(rows.get("input") or [], np.int64)
        name_map = np.full(len(v_names), -1, np.int64)
        for i in self._first_seen(name_col, len(v_names)).tolist():  # ids given in the order rows name them
            name_map[i] = self.names.setdefault(v_names[i], len(self.names))
        has = input_col >= 0
        inp = input_col.copy()
        if has.any():
            input_map = np.full(len(v_inputs), -1, np.int64)
            for i in self._first_seen(input_col[has], len(v_inputs)).tolist():
                input_map[i] = self.inputs.setdefault(tuple(v_inputs[i]), len(self.inputs))
            inp[has] = input_map[input_col[has]]
        # a field an older view lacks: 0; a null time: NaN (unknown in the sum)
        vals = np.empty((len(VIEW_FIELDS), n), np.float64)
        for j, f in enumerate(VIEW_FIELDS):
            col = rows.get(f)
            vals[j] = np.array(col, np.float64) if col else 0.0
        self._pending.append((name_map[name_col], inp, vals))
        self._pending_rows += n
        if self._pending_rows >= COMBINE_CHUNK:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        name = np.concatenate([p[0] for p in self._pending])
        inp = np.concatenate([p[1] for p in self._pending])
        vals = np.concatenate([p[2] for p in self._pending], 1)
        self._pending, self._pending_rows = [], 0
        uniq, inv = factorize.unique_rows(np.stack([name, inp], 1))
        first = np.zeros(len(uniq), np.int64)
        first[inv[::-1]] = np.arange(len(inv) - 1, -1, -1)
        gid = np.empty(len(uniq), np.int64)
        for u in np.argsort(first, kind="stable").tolist():  # new keys in the order rows name them
            key = (int(uniq[u, 0]), int(uniq[u, 1]))
            k = self.key_ids.get(key)
            if k is None:
                k = self.key_ids[key] = len(self.keys)
                self.keys.append(key)
            gid[u] = k
        have = self.sums.shape[1]
        if len(self.keys) > have:
            grown = np.zeros((len(VIEW_FIELDS), max(len(self.keys), 2 * have)), np.float64)
            grown[:, :have] = self.sums
            self.sums = grown
        row_gid = gid[inv]
        for j in range(len(VIEW_FIELDS)):
            np.add.at(self.sums[j], row_gid, vals[j])  # in row order, onto the sums so far


NAME_TOTAL_FIELDS = ("calls", "top_calls", "total_us", "self_us")


def name_totals(view: Optional[dict]) -> Optional[List[dict]]:
    """The view summed per op name over all its rows (every included step, every recorded
    input): ``[{name, calls, top_calls, total_us, self_us}]``, the rows the run comparison's
    operator diff is made of (METRICS.md §11). None without a view; a time that is not
    known (null) in some row is None in its name's sum, not a smaller number."""
    if not isinstance(view, dict):
        return None
    rows = view.get("rows") or {}
    names = view.get("names") or []
    name_col = np.asarray(rows.get("name") or [], np.int64)
    n, k = len(name_col), len(names)
    sums = {f: np.bincount(name_col, minlength=k,
                           weights=np.array([np.nan if v is None else v for v in rows.get(f) or [0] * n], np.float64))
            for f in NAME_TOTAL_FIELDS}
    present = np.bincount(name_col, minlength=k) > 0
    return [{"name": names[i], "calls": int(sums["calls"][i]), "top_calls": int(sums["top_calls"][i]),
             "total_us": _us(sums["total_us"][i]), "self_us": _us(sums["self_us"][i])}
            for i in np.flatnonzero(present)]
