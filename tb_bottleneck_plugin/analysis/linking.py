"""Linking GPU activity to the host calls and CPU ops that launched it (metrics.md
"Launched by"), vectorised.

- A GPU activity (row of ``trace.gpu``) is launched by the runtime/driver call (row of
  ``trace.runtime``) with the same ``correlation``: :func:`gpu_runtime_index`.
- It is launched by CPU op X when that call lies wholly inside X's span on the same
  pid/tid (any enclosing op counts, not only the innermost): :func:`calls_inside`
  gives every (CPU row, runtime row) pair of that relation; :func:`gpu_ops_pairs` joins
  both into (CPU row, GPU row) pairs.

All functions return numpy int64 index arrays; nothing loops per event.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, TraceData
from . import factorize

__all__ = ["gpu_runtime_index", "span_gpu_runtime", "runtime_gpu_rows", "calls_inside", "op_calls",
           "span_op_calls", "gpu_ops_pairs", "innermost_enclosing", "first_per_call"]

Pairs = Tuple[np.ndarray, np.ndarray]


def gpu_runtime_index(trace: TraceData) -> np.ndarray:
    """For each row of ``trace.gpu``, the row of ``trace.runtime`` with the same
    ``correlation`` (int64 array of len(trace.gpu)); -1 when there is none or the
    correlation is missing (-1). If several runtime rows share a correlation the first
    (in table order) wins."""
    gcorr = trace.gpu.correlation
    out = np.full(len(gcorr), -1, dtype=np.int64)
    rcorr = trace.runtime.correlation
    if len(gcorr) == 0 or len(rcorr) == 0:
        return out
    order = np.argsort(rcorr, kind="stable")
    sorted_corr = rcorr[order]
    pos = np.searchsorted(sorted_corr, gcorr, side="left")
    pos_c = np.minimum(pos, len(sorted_corr) - 1)
    hit = (pos < len(sorted_corr)) & (sorted_corr[pos_c] == gcorr) & (gcorr >= 0)
    out[hit] = order[pos_c[hit]]
    return out


def span_gpu_runtime(span) -> np.ndarray:
    """``gpu_runtime_index(span.trace)`` once per span (analysis/units.SpanContext): the
    steps, GPU, Tensor Core, sync, context, operator, rank and timeline analyses of one
    span share it (every function that needs it takes it as ``gpu_runtime``)."""
    return span.once("gpu_runtime", lambda: gpu_runtime_index(span.trace))


def runtime_gpu_rows(trace: TraceData, gpu_runtime: np.ndarray = None) -> Tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`gpu_runtime_index` as a CSR: ``(offsets, gpu_rows)`` where the GPU
    rows launched by runtime row r are ``gpu_rows[offsets[r]:offsets[r+1]]``."""
    if gpu_runtime is None:
        gpu_runtime = gpu_runtime_index(trace)
    n_rt = len(trace.runtime)
    linked = np.flatnonzero(gpu_runtime >= 0)
    order = linked[np.argsort(gpu_runtime[linked], kind="stable")]
    counts = np.bincount(gpu_runtime[linked], minlength=n_rt) if n_rt else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, order.astype(np.int64)


def _thread_ids(*columns):
    """Dense thread ids for (pid, tid) column pairs, consistent between them."""
    return factorize.thread_ids_of(*columns)


def _op_mask(trace: TraceData) -> np.ndarray:
    return (trace.cpu.kind == CPU_OP) | (trace.cpu.kind == CPU_USER_ANNOTATION)


def op_calls(trace: TraceData) -> Pairs:
    """``calls_inside`` over every CPU op and user annotation (ProfilerStep#N included):
    the pairs any set of ops draws its own from (``calls_inside(..., among=)``)."""
    return calls_inside(trace, _op_mask(trace))


def span_op_calls(span) -> Pairs:
    """``op_calls(span.trace)`` once per span (analysis/units.SpanContext): the Operator
    view, Tensor Core eligibility, the sync calls' ops, the timeline's runtime links and the
    rank partial's collectives select their pairs from it."""
    return span.once("op_calls", lambda: op_calls(span.trace))


def calls_inside(trace: TraceData, cpu_rows=None, among: Optional[Pairs] = None) -> Pairs:
    """Every pair (CPU event row, runtime call row) where the call lies wholly inside the
    CPU event's span on the same pid/tid: ``call.ts >= op.ts`` and
    ``call.ts + call.dur <= op.ts + op.dur``.

    ``cpu_rows``: rows of ``trace.cpu`` to consider (index array or boolean mask; all
    rows when None). Returns ``(cpu_row_of_pair, runtime_row_of_pair)``, two int64 arrays
    of equal length, sorted by CPU row then call start. A call inside nested ops appears
    once per enclosing op. Sort + searchsorted + np.repeat; the only loop is over
    threads. ``among``: ``op_calls(trace)`` when the caller has it; the pairs of
    ``cpu_rows`` are then selected from it (the same arrays: a pair depends only on its op
    and its call), unless ``cpu_rows`` holds a row that is neither an op nor an annotation."""
    cpu, rt = trace.cpu, trace.runtime
    if among is not None:
        rows = np.asarray(cpu_rows) if cpu_rows is not None else np.ones(len(cpu), bool)
        if rows.dtype != bool and (len(rows) < 2 or bool((rows[1:] > rows[:-1]).all())):  # (no int64 diff)
            mask = np.zeros(len(cpu), bool)  # sorted distinct rows: the same pair order
            mask[rows] = True  # (a bool mask, not an int64 bincount of every CPU row)
            rows = mask
        if rows.dtype == bool and len(rows) == len(cpu) and not (rows & ~_op_mask(trace)).any():
            op, call = among
            keep = rows[op]
            if keep.all():  # every pair's op asked for (the sync calls' ops: every CPU op): the
                return op, call  # pairs themselves, read-only as ``among`` is (no copy of each)
            return op[keep], call[keep]
    if cpu_rows is None:
        cpu_rows = np.arange(len(cpu), dtype=np.int64)
    else:
        cpu_rows = np.asarray(cpu_rows)
        if cpu_rows.dtype == bool:
            cpu_rows = np.flatnonzero(cpu_rows)
        cpu_rows = cpu_rows.astype(np.int64)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if len(cpu_rows) == 0 or len(rt) == 0:
        return empty
    # Runtime calls sorted by (thread, ts); each thread's calls are r_*_sorted[bounds[k]:bounds[k + 1]]
    (rt_thr,) = _thread_ids(rt.pid, rt.tid)
    r_order = np.lexsort((rt.ts, rt_thr))
    r_ts_sorted = rt.ts[r_order]
    bounds = np.searchsorted(rt_thr[r_order], np.arange(int(rt_thr.max()) + 2))
    del rt_thr
    key_rows = r_order[bounds[:-1]]  # one call of each runtime thread: its (pid, tid)
    key_pid, key_tid = rt.pid[key_rows], rt.tid[key_rows]
    call_end = rt.ts + rt.dur
    # in blocks of ops (each op's pairs its own, in op order): the per-op temporaries (thread,
    # start, end, bounds, counts: ~70 bytes per op) are a block's, not every op's (on 10M tiny
    # events they were the Tensor Core section's peak, +857 MiB)
    out_op, out_rt = [], []
    for b0 in range(0, len(cpu_rows), _OP_BLOCK):
        rows = cpu_rows[b0:b0 + _OP_BLOCK]
        _pairs_of_block(cpu, rows, key_pid, key_tid, bounds, r_order, r_ts_sorted, call_end, out_op, out_rt)
    if not out_op:
        return empty
    return np.concatenate(out_op), np.concatenate(out_rt)


def _pairs_of_block(cpu, cpu_rows, key_pid, key_tid, bounds, r_order, r_ts_sorted, call_end, out_op, out_rt):
    """calls_inside's pairs of the ops ``cpu_rows`` appended to out_op/out_rt (in op order).
    ``key_pid/key_tid``: the runtime threads' (pid, tid) by thread id; thread k's calls are
    ``r_order[bounds[k]:bounds[k + 1]]``, sorted by start (``r_ts_sorted``)."""
    op_thr, key_thr = factorize.thread_ids_of(cpu.pid[cpu_rows], cpu.tid[cpu_rows], key_pid, key_tid)
    to_rt = np.full(int(max(op_thr.max(), key_thr.max())) + 1, -1, np.int64)
    to_rt[key_thr] = np.arange(len(key_thr))  # the ops' thread ids -> the runtime's (-1: no calls)
    op_thr = to_rt[op_thr]
    op_ts = cpu.ts[cpu_rows]
    op_end = op_ts + cpu.dur[cpu_rows]
    lo = np.zeros(len(cpu_rows), np.int64)
    hi = np.zeros(len(cpu_rows), np.int64)
    for t in np.flatnonzero(np.bincount(op_thr + 1)[1:]):  # the runtime threads with ops here
        a, b = bounds[t], bounds[t + 1]
        sel = op_thr == t
        seg = r_ts_sorted[a:b]
        lo[sel] = a + np.searchsorted(seg, op_ts[sel], side="left")
        hi[sel] = a + np.searchsorted(seg, op_end[sel], side="right")
    del op_thr, op_ts
    counts = np.maximum(hi - lo, 0)
    del hi
    total = int(counts.sum())
    if total == 0:
        return
    # the pairs in blocks of ops of about _PAIR_BLOCK candidate pairs: the temporaries are one
    # block's, not the whole set's (on the 292 MB benchmark the candidates would be ~30 MB)
    cum = np.cumsum(counts)
    cut = np.searchsorted(cum, np.arange(_PAIR_BLOCK, total, _PAIR_BLOCK), side="left") + 1
    edges = np.unique(np.concatenate([[0], cut, [len(counts)]]))
    for i0, i1 in zip(edges[:-1].tolist(), edges[1:].tolist()):
        c = counts[i0:i1]
        n_pairs = int(c.sum())
        if n_pairs == 0:
            continue
        first = cum[i0:i1] - c  # index of each op's first pair among all pairs
        pos = np.repeat(lo[i0:i1] - (first - first[0]), c)
        pos += np.arange(n_pairs)
        pair_rt = r_order[pos]
        pair_op = np.repeat(np.arange(i0, i1), c)
        ok = call_end[pair_rt] <= op_end[pair_op]
        out_op.append(cpu_rows[pair_op[ok]])
        out_rt.append(pair_rt[ok].astype(np.int64, copy=False))


_PAIR_BLOCK = 1 << 18
_OP_BLOCK = 1 << 18


def gpu_ops_pairs(trace: TraceData, cpu_rows=None, gpu_runtime: np.ndarray = None
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """Every pair (CPU event row, GPU activity row) where the op launched the activity
    (through a runtime call wholly inside it, any enclosing op). Returns
    ``(cpu_row_of_pair, gpu_row_of_pair)``."""
    if gpu_runtime is None:
        gpu_runtime = gpu_runtime_index(trace)
    op, call = calls_inside(trace, cpu_rows)
    offsets, gpu_rows = runtime_gpu_rows(trace, gpu_runtime)
    if len(op) == 0 or len(gpu_rows) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = offsets[call + 1] - offsets[call]
    total = int(counts.sum())
    pair_op = np.repeat(op, counts)
    starts = np.repeat(offsets[call] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return pair_op, gpu_rows[starts + np.arange(total)]


def _key_order(ops: np.ndarray, keys) -> np.ndarray:
    """``np.lexsort((ops, *[k[ops] for k in keys]))`` for ascending ``ops``. One key of small
    integers (a nesting depth): a stable sort of it as int16, which numpy sorts by radix
    (ties keep the ascending ops), ~7x faster than the lexsort."""
    if len(keys) == 1:
        k = np.asarray(keys[0])[ops]
        if k.dtype.kind in "iu" and len(k):
            lo, hi = int(k.min()), int(k.max())
            if hi - lo < (1 << 15):
                return np.argsort((k - lo).astype(np.int16), kind="stable")
        return np.argsort(k, kind="stable")
    ks = [np.asarray(k)[ops] for k in keys]
    if ks[-1].dtype.kind == "f":  # a float primary key (times): few ties
        return ordered_by_keys(ks)
    return np.lexsort((ops, *ks))


def ordered_by_keys(ks) -> np.ndarray:
    """``np.lexsort(ks)`` (the last key primary, then position) for a primary key with few ties
    (a start time): a stable sort of the primary (runs of start order sort fast), then only the
    runs of equal primary values (NaN ones too, which lexsort puts last, together) by the other
    keys: 3-5x faster than the lexsort of every key."""
    prim = ks[-1]
    o = np.argsort(prim, kind="stable")
    p = prim[o]
    tie = p[1:] == p[:-1]
    if p.dtype.kind == "f":
        tie |= np.isnan(p[1:]) & np.isnan(p[:-1])
    if tie.any():
        m = np.zeros(len(o), bool)
        m[:-1] |= tie
        m[1:] |= tie
        i = np.flatnonzero(m)
        oi = o[i]
        run = np.cumsum(np.concatenate([[True], ~tie]))[i]  # each run of ties apart
        o[i] = oi[np.lexsort((oi, *[k[oi] for k in ks[:-1]], run))]
    return o


def first_per_call(pair_op: np.ndarray, pair_call: np.ndarray, n_calls: int, keys=()) -> np.ndarray:
    """For each call 0..n_calls-1, the op among its pairs that sorts first by ``keys``
    (arrays indexed by op, in np.lexsort's order: the last is the primary key), then by op
    index; -1 for a call without pairs. The first pair per call after
    ``np.lexsort((*[k[pair_op] for k in keys], pair_call))`` when each call's pairs come in
    increasing op order (``calls_inside``'s order), without sorting the pairs (a lexsort of
    ~10^5 pairs was 10-30 ms per use on the 292 MB benchmark trace): the distinct ops are
    ranked once and each call keeps its best rank (``np.minimum.at``)."""
    out = np.full(n_calls, -1, np.int64)
    if not len(pair_op):
        return out
    pair_op = np.asarray(pair_op, np.int64)
    n_ops = int(pair_op.max()) + 1
    present = np.zeros(n_ops, bool)
    present[pair_op] = True
    ops = np.flatnonzero(present)
    ranked = ops[_key_order(ops, keys)] if keys else ops
    rank = np.empty(n_ops, np.int64)
    rank[ranked] = np.arange(len(ranked))
    best = np.full(n_calls, len(ranked), np.int64)
    np.minimum.at(best, np.asarray(pair_call, np.int64), rank[pair_op])
    hit = best < len(ranked)
    out[hit] = ranked[best[hit]]
    return out


def innermost_enclosing(trace: TraceData, cpu_rows, runtime_rows, among: Optional[Pairs] = None) -> np.ndarray:
    """For each runtime row in ``runtime_rows``, the innermost (shortest) CPU row among
    ``cpu_rows`` that wholly contains it on the same pid/tid; -1 when none. ``among``:
    ``op_calls(trace)`` when the caller has it (``calls_inside``)."""
    runtime_rows = np.asarray(runtime_rows, dtype=np.int64)
    out = np.full(len(runtime_rows), -1, dtype=np.int64)
    op, call = calls_inside(trace, cpu_rows, among)
    if len(op) == 0 or len(runtime_rows) == 0:
        return out
    # np.isin(call, runtime_rows) as a table over the runtime rows (a hash-free lookup)
    n_rt = len(trace.runtime)
    wanted = np.zeros(n_rt, bool)
    wanted[runtime_rows[(runtime_rows >= 0) & (runtime_rows < n_rt)]] = True
    want = wanted[call]
    del wanted
    op, call = op[want], call[want]
    if len(op) == 0:
        return out
    # shortest enclosing op per call (then the first in CPU row order)
    best = first_per_call(op, call, len(trace.runtime), (trace.cpu.dur,))
    return best[runtime_rows]
