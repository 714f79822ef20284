"""Memory at the peak: who holds the bytes (METRICS.md §7 "Memory at the peak"), vectorised.

- ``peak_holders(trace, steps=None, host=None, not_available=None) -> {device key: {...}}``:
  per device with ``Total Allocated`` totals, the live set at the instant of peak allocated
  (over the span and per included step), decomposed by category (from each block's lifetime
  relative to the forward / backward / optimizer phases), by op, by nn.Module and by source
  line, and the modules whose activations hold most (``torch.utils.checkpoint`` candidates).
- Blocks: an allocation (``Bytes`` > 0) is paired with the next free (``Bytes`` < 0) of the
  same device and ``Addr`` in time order; an address allocated again after its free is a new
  block. A free with no allocation before it at its address frees a block resident before
  the window. Anything else (two allocations at one live address, two frees in a row, a free
  of another size than its block, ``Total Allocated`` that does not follow the ``Bytes``, a
  resident level below 0, a missing address, sizes at or beyond 2^53) makes the device n/a
  with the reason: never a wrong breakdown.
- ``UNIT``: section ``memory_peak``.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..trace.model import CPU_OP, CPU_PYTHON, CPU_USER_ANNOTATION, TraceData
from . import factorize
from .context import BACKWARD_RE, OPTIMIZER_RE
from .memory import GPU_DEVICE_TYPES, MAX_BYTES, device_key

NAME = "memory_peak"
CATEGORIES = ("resident_before_window", "activations", "gradients", "optimizer_state",
              "optimizer_temporaries", "other_temporaries")
TOP_HOLDERS = 20  # rows of the holders table (category, op, module, line), most bytes first
TOP_GROUPS = 10  # rows of by_op / by_module / by_line
TOP_CANDIDATES = 5  # checkpointing candidates
NO_OP, NO_MODULE, NO_LINE = "(no op)", "(no module frame)", "(no user frame)"
RESIDENT_WHAT = ("allocated before profiling started (parameters, optimizer state, anything kept from "
                 "earlier): a trace cannot split it further")
NO_TOTALS = "[memory] events carry no Total Allocated (2021 format): the live set cannot be checked"
CPU_RESIDENT = ("CPU [memory] events count from 0 at profiling start: blocks allocated before it "
                "(parameters, optimizer state) are not seen")
# Phases of an allocation (METRICS.md): where it happened decides its category with its lifetime.
FORWARD, BACKWARD, OPTIMIZER, OTHER = 0, 1, 2, 3
PHASE_NAMES = ("forward", "backward", "optimizer", "other")


def _merge(lo: np.ndarray, hi: np.ndarray):
    """Union of intervals [lo, hi) as sorted disjoint arrays."""
    if not len(lo):
        return lo, hi
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    run_hi = np.maximum.accumulate(hi)
    new = np.r_[True, lo[1:] > run_hi[:-1]]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(lo)] - 1
    return lo[starts], run_hi[ends]


def _inside(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the disjoint interval [lo, hi] holding each ts, -1 for none."""
    i = np.searchsorted(lo, ts, side="right") - 1
    ok = (i >= 0) & (ts <= hi[np.maximum(i, 0)]) if len(lo) else np.zeros(len(ts), bool)
    return np.where(ok, i, -1)


def _phase_intervals(trace: TraceData, pattern):
    cpu = trace.cpu
    ids = trace.string_ids(lambda s: pattern.search(s) is not None)
    rows = np.flatnonzero(((cpu.kind == CPU_OP) | (cpu.kind == CPU_USER_ANNOTATION)) & np.isin(cpu.name, ids))
    dur = np.maximum(np.nan_to_num(cpu.dur[rows], nan=0.0), 0.0)
    return _merge(cpu.ts[rows], cpu.ts[rows] + dur)


def _phases(trace: TraceData, ts: np.ndarray, step_lo: np.ndarray, step_hi: np.ndarray):
    """(phase, phase end) of each allocation time (METRICS.md): optimizer inside an optimizer
    op (its end), backward inside a backward op (the end of the step's last backward op),
    forward before the step's first backward op (that op's start; the step's end when the
    step has none), other elsewhere (its own time: it outlives nothing)."""
    b_lo, b_hi = _phase_intervals(trace, BACKWARD_RE)
    o_lo, o_hi = _phase_intervals(trace, OPTIMIZER_RE)
    phase = np.full(len(ts), OTHER, np.int8)
    end = ts.astype(np.float64).copy()
    step = _inside(ts, step_lo, step_hi) if len(step_lo) else np.full(len(ts), -1)
    # per step: first backward start, last backward end
    first_b = np.full(len(step_lo), np.inf)
    last_b = np.full(len(step_lo), -np.inf)
    if len(b_lo) and len(step_lo):
        bs = _inside(b_lo, step_lo, step_hi)
        ok = bs >= 0
        np.minimum.at(first_b, bs[ok], b_lo[ok])
        np.maximum.at(last_b, bs[ok], b_hi[ok])
    in_o = _inside(ts, o_lo, o_hi)
    in_b = _inside(ts, b_lo, b_hi)
    s = np.maximum(step, 0)
    has_step = step >= 0
    opt = in_o >= 0
    phase[opt] = OPTIMIZER
    end[opt] = o_hi[in_o[opt]]
    bwd = ~opt & (in_b >= 0)
    phase[bwd] = BACKWARD
    step_b_end = np.where(has_step & np.isfinite(last_b[s] if len(last_b) else 0), last_b[s] if len(last_b) else 0,
                          -np.inf)
    end[bwd] = np.maximum(b_hi[in_b[bwd]], step_b_end[bwd])
    fwd = ~opt & ~bwd & has_step
    if len(first_b):
        fwd &= ts < first_b[s]
        end[fwd] = np.where(np.isfinite(first_b[s[fwd]]), first_b[s[fwd]], step_hi[s[fwd]])
    phase[fwd] = FORWARD
    return phase, end


def _host_context(trace: TraceData, host: dict, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray):
    """Per memory event: the innermost host event open at its time on its thread (-1 none)."""
    h_thr, h_ts, h_end, parent = host["thread"], host["ts"], host["end"], host["parent"]
    node = np.full(len(ts), -1, np.int64)
    if not len(h_ts) or not len(ts):
        return node
    # the host threads: operators.thread_ids numbers the distinct (pid, tid) of the host
    # events (cpu rows, then runtime rows) in (pid, tid) order
    cpu, rt = trace.cpu, trace.runtime
    threads = [factorize.unique_rows(np.stack([t.pid, t.tid], axis=1))[0] for t in (cpu, rt) if len(t)]
    threads = factorize.unique_rows(np.concatenate(threads))[0] if threads else np.zeros((0, 2), np.int64)
    code = {(int(p), int(t)): k for k, (p, t) in enumerate(threads.tolist())}
    pairs, inv = factorize.unique_rows(np.stack([pid, tid], axis=1))
    for j, (p, t) in enumerate(pairs.tolist()):
        th = code.get((p, t))
        if th is None or p < 0 or t < 0:
            continue
        q = np.flatnonzero(inv == j)
        on = np.flatnonzero(h_thr == th)
        on = on[np.lexsort((-h_end[on], h_ts[on]))]
        k = np.searchsorted(h_ts[on], ts[q], side="right") - 1
        cand = np.where(k >= 0, on[np.maximum(k, 0)], -1)
        for _ in range(512):  # up to the innermost event still open at the time
            open_ = cand >= 0
            open_[open_] = h_end[cand[open_]] < ts[q[open_]]
            if not open_.any():
                break
            cand[open_] = parent[cand[open_]]
        node[q] = cand
    return node


def _node_labels(trace: TraceData, host: dict):
    """Per host node: nearest enclosing CPU op, nn.Module frame and user frame (-1 none),
    and the names' string ids."""
    from .operators import _nearest
    from .source import is_user_frame

    cpu, S = trace.cpu, trace.strings
    nr = len(host["ts"]) - len(cpu)
    kind = np.concatenate([cpu.kind, np.full(nr, -1, np.int8)])
    name = np.concatenate([cpu.name, np.full(nr, -1, np.int32)])
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    is_op = (kind == CPU_OP) & ~np.isin(name, step_ids)
    is_py = kind == CPU_PYTHON
    py_names = np.unique(name[is_py]) if is_py.any() else np.zeros(0, np.int32)
    mod_ids = [n for n in py_names.tolist() if S[n].startswith("nn.Module: ")]
    user_ids = [n for n in py_names.tolist() if is_user_frame(S[n])]
    is_mod = is_py & np.isin(name, mod_ids)
    is_user = is_py & np.isin(name, user_ids)
    parent = host["parent"]
    # autograd: a backward op's "Sequence number" is that of the forward op that made its node
    seq = np.concatenate([cpu.sequence, np.full(nr, -1, np.int64)])
    near_seq = _nearest(parent, seq >= 0)
    bwd_ids = trace.string_ids(lambda s: BACKWARD_RE.search(s) is not None)
    fwd = np.flatnonzero((seq >= 0) & ~np.isin(name, bwd_ids))
    fwd = fwd[np.lexsort((host["ts"][fwd], seq[fwd]))]  # by sequence number, then time
    return (name, _nearest(parent, is_op), is_mod, _nearest(parent, is_mod), _nearest(parent, is_user),
            seq, near_seq, fwd)


def _forward_node(node: np.ndarray, ts: np.ndarray, host: dict, seq, near_seq, fwd) -> np.ndarray:
    """For events inside a backward op: the forward op (host node) whose autograd node it
    runs, the latest one with its sequence number before the event; -1 for none."""
    out = np.full(len(node), -1, np.int64)
    ok = node >= 0
    s_node = np.where(ok, near_seq[np.maximum(node, 0)], -1)
    ok &= s_node >= 0
    if not ok.any() or not len(fwd):
        return out
    s = seq[s_node[ok]]
    fseq = seq[fwd]
    hi = np.searchsorted(fseq, s, side="right") - 1  # the latest forward op of that number
    hit = (hi >= 0) & (fseq[np.maximum(hi, 0)] == s)
    cand = fwd[np.maximum(hi, 0)]
    hit &= host["ts"][cand] <= ts[ok]
    idx = np.flatnonzero(ok)
    out[idx[hit]] = cand[hit]
    return out


def _top(keys: np.ndarray, size: np.ndarray, limit: int, label) -> List[dict]:
    if not len(keys):
        return []
    uniq, inv = np.unique(keys, return_inverse=True)
    b = np.bincount(inv, weights=size.astype(np.float64), minlength=len(uniq))
    n = np.bincount(inv, minlength=len(uniq))
    order = np.argsort(-b, kind="stable")[:limit]
    return [dict(label(uniq[i]), bytes=int(b[i]), blocks=int(n[i])) for i in order.tolist()]


def _text(S, sid: int, none: str) -> str:
    return S[sid] if sid >= 0 else none


def _module_label(text: str) -> str:
    return text[len("nn.Module: "):] if text.startswith("nn.Module: ") else text


def _check(b, ta, addr):
    """The device's events in time order: the reason they cannot be decomposed, or None."""
    if (ta < 0).any():
        return NO_TOTALS
    if (np.abs(b) >= MAX_BYTES).any() or (ta >= MAX_BYTES).any():
        return "a [memory] event's Bytes or Total Allocated is at or beyond 2^53 (a corrupt counter)"
    if ((b != 0) & (addr < 0)).any():
        return f"{int(((b != 0) & (addr < 0)).sum())} [memory] event(s) carry no Addr: blocks cannot be paired"
    base = int(ta[0]) - int(b[0])
    run = base + np.cumsum(b)
    bad = run != ta
    if bad.any():
        return (f"Total Allocated does not follow the events' Bytes in {int(bad.sum())} of {len(b)} [memory] "
                "event(s) (events missing, reordered or corrupt)")
    if base < 0:
        return f"allocated memory before the first event would be {base} bytes (negative)"
    return None


def _blocks(b, addr):
    """Pair the events (time order) into blocks: (alloc index, free index or n, pre-window
    free indices) or a reason string."""
    n = len(b)
    live = np.flatnonzero(b != 0)
    o = live[np.lexsort((live, addr[live]))]
    same = np.r_[False, addr[o[1:]] == addr[o[:-1]]]
    prev = np.where(same, np.r_[-1, o[:-1]], -1)
    is_free = b[o] < 0
    prev_alloc = (prev >= 0) & (b[np.maximum(prev, 0)] > 0)
    twice = ~is_free & prev_alloc
    if twice.any():
        return (f"{int(twice.sum())} allocation(s) at an address whose block was never freed "
                "(a reused address while live: events missing or corrupt)")
    double = is_free & (prev >= 0) & ~prev_alloc
    if double.any():
        return f"{int(double.sum())} free(s) of an address already freed (events missing or corrupt)"
    matched = is_free & prev_alloc
    wrong = matched & (b[o] != -b[np.maximum(prev, 0)])
    if wrong.any():
        return f"{int(wrong.sum())} free(s) of a size other than the block's allocation"
    free_of = np.full(n, n, np.int64)
    free_of[prev[matched]] = o[matched]
    allocs = np.flatnonzero(b > 0)
    pre = o[is_free & (prev < 0)]
    return allocs, free_of[allocs], np.sort(pre)


def _decompose(at: int, ts, b, allocs, frees, pre, base, cat):
    """Bytes per category of the live set at event index ``at`` (after it): blocks
    allocated at or before it and not freed by then, and the resident remainder."""
    live = (allocs <= at) & (frees > at)
    resident = base + int(b[pre[pre <= at]].sum())  # pre-window frees are negative
    sizes = b[allocs[live]]
    out = {c: 0 for c in CATEGORIES}
    out["resident_before_window"] = resident
    per = np.bincount(cat[live], weights=sizes.astype(np.float64), minlength=len(CATEGORIES))
    for i, c in enumerate(CATEGORIES[1:], start=1):
        out[c] = int(per[i])
    return out, live, resident


def _categories_at(points: np.ndarray, b, allocs, frees, pre, base: int, cat) -> np.ndarray:
    """Bytes per category (columns in CATEGORIES order) of the live set after each event index
    in ``points`` (ascending), as `_decompose` counts it, by prefix sums over the blocks'
    allocations and frees in event order: O((blocks + points) log blocks), no pass per point."""
    out = np.zeros((len(points), len(CATEGORIES)), np.int64)

    def upto(pos, values):  # Σ values at positions <= each point (pos ascending)
        if not len(pos):
            return 0
        k = np.searchsorted(pos, points, side="right")
        return np.where(k > 0, np.cumsum(values)[np.maximum(k - 1, 0)], 0)

    out[:, 0] = base + upto(pre, b[pre])  # pre-window frees are negative
    sizes = b[allocs]
    for c in range(1, len(CATEGORIES)):
        m = cat == c
        f = frees[m]
        fo = np.argsort(f, kind="stable")
        out[:, c] = upto(allocs[m], sizes[m]) - upto(f[fo], sizes[m][fo])  # a never-freed block's index is n
    return out


def _categories(phase, phase_end, free_ts):
    """Category index per block (CATEGORIES): a block that outlives the phase it was
    allocated in is an activation (forward), gradient (backward) or optimizer state;
    one freed within it a temporary."""
    cat = np.full(len(phase), CATEGORIES.index("other_temporaries"), np.int64)
    outlives = free_ts > phase_end
    cat[(phase == FORWARD) & outlives] = CATEGORIES.index("activations")
    cat[(phase == BACKWARD) & outlives] = CATEGORIES.index("gradients")
    cat[(phase == OPTIMIZER) & outlives] = CATEGORIES.index("optimizer_state")
    cat[(phase == OPTIMIZER) & ~outlives] = CATEGORIES.index("optimizer_temporaries")
    return cat


def _snapshot_entry(key: str, holders: Optional[dict], reserved: np.ndarray, capacity, na: Dict[str, str]):
    """The snapshot's view of a device (largest allocated blocks and their stacks, free space
    in its segments), or None with the reason when the snapshot cannot be this run's: no
    such device, or it reserves less than the trace's last [memory] event did (the caching
    allocator keeps what it reserved unless emptied) or more than the device holds."""
    if holders is None:
        return None
    h = holders.get(key)
    if not isinstance(h, dict):
        na[f"{NAME}.{key}.snapshot"] = "the CUDA memory snapshot has no segment on this device (a snapshot of another run?)"
        return None
    last = [int(v) for v in reserved[::-1][:1].tolist() if v >= 0]
    if last and h["reserved_bytes"] < last[0]:
        na[f"{NAME}.{key}.snapshot"] = (
            f"the CUDA memory snapshot reserves {h['reserved_bytes']:,} B, less than the {last[0]:,} B the trace's last "
            "[memory] event reserved: a snapshot of another run (or taken after torch.cuda.empty_cache())")
        return None
    if capacity and h["reserved_bytes"] > capacity:
        na[f"{NAME}.{key}.snapshot"] = (f"the CUDA memory snapshot reserves {h['reserved_bytes']:,} B, more than the "
                                        f"device's {capacity:,} B: not a snapshot of this device")
        return None
    return {k: h[k] for k in ("reserved_bytes", "allocated_bytes", "free_bytes", "blocks", "largest_blocks") if k in h}


def peak_holders(trace: TraceData, steps=None, host: Optional[dict] = None,
                 not_available: Optional[Dict[str, str]] = None, snapshot: Optional[dict] = None) -> Dict[str, dict]:
    """The section (module docstring; METRICS.md §7 "Memory at the peak"). ``steps``:
    analysis.steps.Steps (host windows of the included steps), ``host``:
    operators.host_nesting(trace) when the caller has it, ``snapshot``: the run directory's
    CUDA memory snapshot as report._find_snapshot reads it ({"path", "holders", ...})."""
    na = {} if not_available is None else not_available
    mem, S = trace.memory, trace.strings
    out: Dict[str, dict] = {}
    if not len(mem):
        return out
    if steps is not None and getattr(steps, "found", False) and steps.count:
        s_lo, s_hi, s_num = steps.inc_host_start, steps.inc_host_end, steps.inc_numbers
        so = np.argsort(s_lo, kind="stable")
        s_lo, s_hi, s_num = s_lo[so], s_hi[so], s_num[so]
    else:
        s_lo = s_hi = s_num = np.zeros(0)
    labels = None
    uniq, inv = factorize.unique_rows(np.stack([mem.device_type.astype(np.int64),
                                                mem.device_id.astype(np.int64)], axis=1))
    # devices whose events carry no Total Allocated (2021 traces): n/a before any copy of their rows
    no_totals = np.bincount(inv, weights=mem.total_allocated < 0, minlength=len(uniq)) > 0
    for j, (dtype, did) in enumerate(uniq.tolist()):
        key = device_key(dtype, did)
        if no_totals[j]:
            na[f"{NAME}.{key}"] = NO_TOTALS
            continue
        rows = np.flatnonzero(inv == j)
        rows = rows[np.argsort(mem.ts[rows], kind="stable")]
        ts, b, ta, addr = mem.ts[rows], mem.bytes[rows], mem.total_allocated[rows], mem.addr[rows]
        why = _check(b, ta, addr)
        paired = _blocks(b, addr) if why is None else None
        if isinstance(paired, str):
            why = paired
        if why is not None:
            na[f"{NAME}.{key}"] = why
            continue
        allocs, frees, pre = paired
        n = len(b)
        base = int(ta[0]) - int(b[0])
        if base + int(b[pre].sum()) < 0:
            na[f"{NAME}.{key}"] = ("frees of blocks allocated before the window exceed what was allocated "
                                   "before the first event (unmatched frees)")
            continue
        free_ts = np.where(frees < n, ts[np.minimum(frees, n - 1)], np.inf)
        phase, phase_end = _phases(trace, ts[allocs], s_lo, s_hi)
        cat = _categories(phase, phase_end, free_ts)
        peak_at = int(np.argmax(ta))
        cats, live, resident = _decompose(peak_at, ts, b, allocs, frees, pre, base, cat)
        live_sum = sum(cats.values())
        peak = int(ta[peak_at])
        if live_sum != peak:  # the identity _check proved; kept as the guard against a wrong breakdown
            na[f"{NAME}.{key}"] = f"the live set ({live_sum} B) does not sum to the peak ({peak} B)"
            continue
        if dtype not in GPU_DEVICE_TYPES and base == 0:
            # PyTorch's CPU profiler counts from 0 at profiling start and does not see the
            # blocks allocated before it (their frees carry no size): unknown, not 0
            cats["resident_before_window"] = None
            na[f"{NAME}.{key}.resident_before_window"] = CPU_RESIDENT
        # --- op, module, line of the live blocks --------------------------------------------
        la = allocs[live]
        sizes = b[la]
        lcat = cat[live]
        op_s = mod_s = line_s = np.full(len(la), -1, np.int64)
        mod_chain = None
        if host is not None and len(host["ts"]):
            if labels is None:
                labels = _node_labels(trace, host)
            name, near_op, is_mod, near_mod, near_user, seq, near_seq, fwd = labels
            node = _host_context(trace, host, mem.pid[rows[la]], mem.tid[rows[la]], ts[la])
            got = node >= 0
            nd = np.maximum(node, 0)

            def pick(near, at=nd, ok=got):
                hit = np.where(ok, near[at], -1)
                return np.where(hit >= 0, name[np.maximum(hit, 0)], -1).astype(np.int64)

            op_s, mod_s, line_s = pick(near_op), pick(near_mod), pick(near_user)
            mod_chain = (np.where(got, near_mod[nd], -1), near_mod, host["parent"], name)
            # backward allocations (the autograd thread has no Python frame): the module and
            # line of the forward op whose autograd node allocated them
            lost = (mod_s < 0) | (line_s < 0)
            if lost.any():
                fnode = np.full(len(la), -1, np.int64)
                fnode[lost] = _forward_node(node[lost], ts[la][lost], host, seq, near_seq, fwd)
                ok = fnode >= 0
                fn = np.maximum(fnode, 0)
                mod_s = np.where((mod_s < 0) & ok, pick(near_mod, fn, ok), mod_s)
                line_s = np.where((line_s < 0) & ok, pick(near_user, fn, ok), line_s)
        holders = _holders(lcat, op_s, mod_s, line_s, sizes, S)
        act = lcat == CATEGORIES.index("activations")
        candidates = _candidates(mod_chain, act, sizes, S) if mod_chain is not None else []
        # per included step: its peak (the first event of the largest Total Allocated in its
        # host window; events are in time order, so a window is one slice)
        first = np.searchsorted(ts, s_lo, side="left")
        last = np.searchsorted(ts, s_hi, side="left")
        steps_at = [(k, int(i + np.argmax(ta[i:j]))) for k, (i, j) in enumerate(zip(first.tolist(), last.tolist()))
                    if j > i]
        per_step = []
        if steps_at:
            points = np.array([at for _, at in steps_at], np.int64)
            order = np.argsort(points, kind="stable")
            table = np.empty((len(points), len(CATEGORIES)), np.int64)
            table[order] = _categories_at(points[order], b, allocs, frees, pre, base, cat)
            for (k, at), row in zip(steps_at, table.tolist()):
                c = dict(zip(CATEGORIES, row))
                if cats["resident_before_window"] is None:
                    c["resident_before_window"] = None
                per_step.append({"step": int(s_num[k]), "peak_allocated_bytes": int(ta[at]), "ts_us": float(ts[at]),
                                 "categories": c})
        step_at = _inside(np.array([ts[peak_at]]), s_lo, s_hi)[0] if len(s_lo) else -1
        capacity = None
        if dtype in GPU_DEVICE_TYPES:
            from . import devices
            from .occupancy_calculator import prop_int

            entry, _ = devices.memory_properties(trace, dtype, did)
            capacity = prop_int(entry, "totalGlobalMem") if entry is not None else None
        out[key] = {
            "peak_allocated_bytes": peak, "peak_ts_us": float(ts[peak_at]),
            "peak_step": int(s_num[step_at]) if step_at >= 0 else None,
            "live_bytes": live_sum, "live_blocks": int(live.sum()),
            "categories": cats,
            "resident_note": RESIDENT_WHAT,
            "holders": holders,
            "by_op": _top(op_s, sizes, TOP_GROUPS, lambda s: {"op": _text(S, int(s), NO_OP)}),
            "by_module": _top(mod_s, sizes, TOP_GROUPS,
                              lambda s: {"module": _module_label(_text(S, int(s), NO_MODULE))}),
            "by_line": _top(line_s, sizes, TOP_GROUPS, lambda s: {"line": _text(S, int(s), NO_LINE)}),
            "checkpoint_candidates": candidates,
            "per_step": per_step,
            **fit(peak, cats, capacity),
        }
        if dtype in GPU_DEVICE_TYPES and isinstance(snapshot, dict) and "holders" in snapshot:
            snap = _snapshot_entry(key, snapshot.get("holders"), mem.total_reserved[rows], capacity, na)
            if snap is not None:
                out[key]["snapshot"] = snap
        if not (line_s >= 0).any():
            na[f"{NAME}.{key}.by_line"] = ("the trace has no Python stacks at the allocations: record with "
                                           "torch.profiler.profile(with_stack=True)")
        if not (mod_s >= 0).any():
            na[f"{NAME}.{key}.by_module"] = ("no nn.Module frame encloses the live blocks' allocations: record "
                                             "with torch.profiler.profile(with_stack=True)")
        if capacity is None and dtype in GPU_DEVICE_TYPES:  # (the host's: memory.cpu.capacity_bytes says why)
            na[f"{NAME}.{key}.capacity_bytes"] = "no deviceProperties totalGlobalMem for this device"
    return out


def _holders(lcat, op_s, mod_s, line_s, sizes, S) -> List[dict]:
    keys = np.stack([lcat, op_s, mod_s, line_s], axis=1)
    if not len(keys):
        return []
    uniq, inv = factorize.unique_rows(keys)
    by = np.bincount(inv, weights=sizes.astype(np.float64), minlength=len(uniq))
    n = np.bincount(inv, minlength=len(uniq))
    order = np.argsort(-by, kind="stable")[:TOP_HOLDERS]
    return [{"category": CATEGORIES[int(uniq[i, 0])], "op": _text(S, int(uniq[i, 1]), NO_OP),
             "module": _module_label(_text(S, int(uniq[i, 2]), NO_MODULE)),
             "line": _text(S, int(uniq[i, 3]), NO_LINE), "bytes": int(by[i]), "blocks": int(n[i])}
            for i in order.tolist()]


def _candidates(mod_chain, act, sizes, S) -> List[dict]:
    """Activation bytes per enclosing nn.Module (every module on the allocation's chain,
    so a block counts for its layer and the layer's parents), without the outermost
    modules (the model: checkpointing all of it saves nothing). A repeated module (a class
    with several instances: the layers of a stack) is what one wraps in checkpoint: when
    there is one, the class holding most over its instances (the outermost repeated level)."""
    first, near_mod, parent, name = mod_chain
    total = float(sizes[act].sum())
    if not total:
        return []
    node, w = first[act], sizes[act].astype(np.float64)
    per: Dict[int, float] = {}
    roots = set()
    for _ in range(256):
        ok = node >= 0
        if not ok.any():
            break
        up = np.full(len(node), -1, np.int64)
        par = parent[node[ok]]
        up[ok] = np.where(par >= 0, near_mod[np.maximum(par, 0)], -1)
        ids = name[node[ok]].astype(np.int64)
        roots.update(np.unique(ids[up[ok] < 0]).tolist())
        u, inv = np.unique(ids, return_inverse=True)
        sums = np.bincount(inv, weights=w[ok])
        for sid, v in zip(u.tolist(), sums.tolist()):
            per[sid] = per.get(sid, 0.0) + v
        node = up
    rows = [(v, sid) for sid, v in per.items() if sid not in roots]
    by_class: Dict[str, list] = {}
    for v, sid in rows:
        by_class.setdefault(_module_label(S[sid]).rsplit("_", 1)[0], []).append((v, sid))
    repeated = [r for r in by_class.values() if len(r) >= 2]
    if repeated:
        rows = max(repeated, key=lambda r: sum(v for v, _ in r))
    rows.sort(key=lambda r: (-r[0], r[1]))
    return [{"module": _module_label(S[sid]), "activation_bytes": int(v), "pct_of_activations": 100.0 * v / total}
            for v, sid in rows[:TOP_CANDIDATES]]


def fit(peak: Optional[float], cats: Optional[dict], capacity: Optional[float]) -> dict:
    """Headroom to capacity and the batch scale that would fit if activations grow linearly
    with the batch (an estimate): (capacity − (peak − activations)) / activations."""
    out = {"capacity_bytes": capacity, "headroom_bytes": None, "peak_pct_of_capacity": None,
           "batch_scale_fit_estimate": None}
    if capacity and peak is not None:
        out["headroom_bytes"] = int(capacity - peak)
        out["peak_pct_of_capacity"] = 100.0 * peak / capacity
        act = (cats or {}).get("activations") or 0
        if act > 0:
            out["batch_scale_fit_estimate"] = max(0.0, (capacity - (peak - act)) / act)
    return out


def join_recompute(report: dict) -> None:
    """Each checkpoint candidate's recomputation cost (METRICS.md §7): its forward GPU time
    per step from the module tree (§17, ``source_attribution.modules[].gpu_fwd_us`` over the
    included steps / their count) as ``recompute_gpu_us_per_step`` and as a share of the
    mean step, ``recompute_step_pct``; None where the module tree does not have it. A join
    (registry.JOINS): span and summary alike, after every unit."""
    peaks = report.get(NAME)
    if not isinstance(peaks, dict):
        return
    sa = report.get("source_attribution")
    mods = {m.get("module"): m for m in ((sa or {}).get("modules") or []) if isinstance(m, dict)} \
        if isinstance(sa, dict) else {}
    count = (report.get("steps") or {}).get("count") if isinstance(report.get("steps"), dict) else None
    avg = report.get("avg_step_us")
    for e in peaks.values():
        for c in (e.get("checkpoint_candidates") or []) if isinstance(e, dict) else []:
            if not isinstance(c, dict):
                continue
            fwd = (mods.get(c.get("module")) or {}).get("gpu_fwd_us")
            per = float(fwd) / count if isinstance(fwd, (int, float)) and isinstance(count, int) and count > 0 \
                else None
            c["recompute_gpu_us_per_step"] = per
            c["recompute_step_pct"] = (100.0 * per / avg if per is not None and isinstance(avg, (int, float))
                                       and avg > 0 else None)


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span):
    from .operators import span_host_nesting

    trace = span.trace
    if not len(trace.memory):
        span.not_available[NAME] = "trace has no [memory] events (profile_memory=False)"
        return None
    host = span_host_nesting(span) if len(trace.cpu) else None
    na: Dict[str, str] = {}
    out = peak_holders(trace, span.found, host=host, not_available=na, snapshot=span.snapshot)
    span.not_available.update(na)
    if not out and NAME not in span.not_available:
        span.not_available[NAME] = "no device's [memory] events could be decomposed (see the per-device reasons)"
    return out or None


def _unit_partial(report: dict) -> dict:
    span, worker = report.get("span"), report.get("worker")
    devices = {}
    for key, e in (report.get(NAME) or {}).items():
        if isinstance(e, dict):
            devices[str(key)] = {"rows:peaks": [dict({k: v for k, v in e.items() if k != "per_step"},
                                                     span=span, worker=worker)]}
    return {"keyed:devices": devices}


def _unit_finish(m: dict) -> Optional[dict]:
    """A group's peak is its largest span peak, with that span's live set (the span named)."""
    out = {}
    for key in sorted(m["keyed:devices"]):
        rows = [r for r in m["keyed:devices"][key]["rows:peaks"] if r.get("peak_allocated_bytes") is not None]
        if rows:
            out[key] = dict(max(rows, key=lambda r: r["peak_allocated_bytes"]), per_step=[])
    return out or None


def _unit():
    from .units import NONE_FAILED, Unit

    return Unit(NAME, _unit_compute, _unit_partial, _unit_finish, group=NONE_FAILED)


UNIT = _unit()
