"""The faster forms of shared steps give exactly what the plain numpy forms gave.

- linking.first_per_call == the first pair per call after np.lexsort of all pairs
- operators.thread_ids == np.unique over (pid, tid) rows; operators._nearest == the full
  pointer doubling it replaced
- TraceData.string_ids remembers per predicate, never across different closures or globals,
  and a trace with its memo still pickles
- report._clean (exact types first, list scalars in line) == the isinstance chain it replaced
- intervals.intersect/subtract of merged sets == cutting at every bound, judged at midpoints
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from tb_bottleneck_plugin.analysis import linking, operators
from tb_bottleneck_plugin.trace import model


def _first_by_lexsort(op, call, n_calls, keys):
    out = np.full(n_calls, -1, np.int64)
    if not len(op):
        return out
    order = np.lexsort((*[k[op] for k in keys], call))
    o, c = op[order], call[order]
    first = np.r_[True, c[1:] != c[:-1]]
    out[c[first]] = o[first]
    return out


def test_first_per_call_matches_lexsort():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n_ops, n_calls = int(rng.integers(1, 60)), int(rng.integers(1, 40))
        # pairs as calls_inside gives them: by op, each (op, call) once
        pairs = sorted({(int(rng.integers(0, n_ops)), int(rng.integers(0, n_calls)))
                        for _ in range(int(rng.integers(0, 120)))})
        op = np.array([p[0] for p in pairs], np.int64)
        call = np.array([p[1] for p in pairs], np.int64)
        ts = rng.integers(0, 5, n_ops).astype(float)  # ties on purpose
        ts[rng.random(n_ops) < 0.1] = np.nan
        dur = rng.integers(0, 3, n_ops).astype(float)
        flag = rng.random(n_ops) < 0.5
        for keys in ((), (dur,), (dur, -ts), (-ts, flag)):
            got = linking.first_per_call(op, call, n_calls, keys)
            assert (got == _first_by_lexsort(op, call, n_calls, keys)).all()


def test_thread_ids_match_np_unique():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(0, 300))
        pid = rng.choice([7, 3, 1 << 40, -1], n)
        tid = rng.choice([2, 9, 5], n)
        # runs of one thread, as traces write them
        pid, tid = np.repeat(pid, 3), np.repeat(tid, 3)
        want = np.unique(np.stack([pid, tid], 1), axis=0, return_inverse=True)[1].reshape(-1) if len(pid) \
            else np.zeros(0, np.int64)
        assert (operators.thread_ids(pid, tid) == want).all()


@pytest.mark.parametrize("block", [None, 3])
def test_nearest_matches_full_pointer_doubling(block, monkeypatch):
    """Also with its rounds in blocks of 3 nodes (1M by default): a block reads the jumps an
    earlier block of the round advanced, and the answer is the same."""
    if block:
        monkeypatch.setattr(operators, "_WALK_BLOCK", block)

    def full(parent, prop):
        jump = np.where(prop, np.arange(len(parent)), parent)
        while True:
            ok = jump >= 0
            go = ok.copy()
            go[ok] = ~prop[jump[ok]]
            if not go.any():
                return jump
            jump[go] = jump[jump[go]]

    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([-1 if i == 0 or rng.random() < 0.05 else int(rng.integers(max(0, i - 5), i))
                           for i in range(n)], np.int64)
        prop = rng.random(n) < rng.random()
        assert (operators._nearest(parent, prop) == full(parent, prop)).all()
        strict = np.where(parent >= 0, full(parent, prop)[np.maximum(parent, 0)], -1)
        assert (operators._strict_none(parent, full(parent, prop)) == (strict < 0)).all()


def _trace(strings):
    return model.TraceData(meta=model.TraceMeta(source="t"), strings=strings, gpu=model.GpuTable.empty(),
                           cpu=model.CpuTable.empty(), runtime=model.RuntimeTable.empty(),
                           memory=model.MemoryTable.empty(), gpu_annotations=model.GpuAnnotationTable.empty())


PREFIX = "nccl"


def test_string_ids_memo_keys_on_closure_and_globals():
    global PREFIX
    t = _trace(["ncclKernel", "aten::mm", "gloo:all_reduce", "aten::add"])

    def ids(prefix):
        return t.string_ids(lambda s: s.startswith(prefix)).tolist()

    assert ids("aten::") == [1, 3] and ids("gloo") == [2] and ids("aten::") == [1, 3]
    assert t.string_ids(lambda s: s.startswith(PREFIX)).tolist() == [0]
    PREFIX = "gloo"  # the same code, another global value: asked again, not remembered
    try:
        assert t.string_ids(lambda s: s.startswith(PREFIX)).tolist() == [2]
    finally:
        PREFIX = "nccl"
    got = t.string_ids(lambda s: s.startswith("aten"))
    got[:] = -5  # the caller's copy: the memo is not changed
    assert t.string_ids(lambda s: s.startswith("aten")).tolist() == [1, 3]
    seen = set()  # an unhashable closure value: scanned each time
    assert t.string_ids(lambda s: s in seen or s == "aten::mm").tolist() == [1]
    copy = pickle.loads(pickle.dumps(t))
    assert copy.string_ids(lambda s: s.startswith("aten")).tolist() == [1, 3]


def _clean_by_isinstance(value):
    import math
    if isinstance(value, dict):
        return {str(k): _clean_by_isinstance(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_by_isinstance(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_clean_by_isinstance(v) for v in value.tolist()]
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def test_clean_matches_the_isinstance_chain():
    import enum

    from tb_bottleneck_plugin import report

    class Level(enum.IntEnum):
        HIGH = 2

    class Tag(str, enum.Enum):
        A = "a"

    rng = np.random.default_rng(3)
    scalars = [1.5, -0.0, float("nan"), float("inf"), -float("inf"), 7, True, False, None, "x", Level.HIGH,
               np.float64(2.5), np.float32(np.nan), np.int32(-4), np.int64(9), np.bool_(True), np.uint8(3),
               np.float64(-np.inf), Tag.A]

    def make(depth):
        pick = int(rng.integers(0, 6 if depth < 4 else 1))
        if pick == 0:
            return scalars[int(rng.integers(0, len(scalars)))]
        if pick == 1:
            return [make(depth + 1) for _ in range(int(rng.integers(0, 6)))]
        if pick == 2:
            return tuple(make(depth + 1) for _ in range(int(rng.integers(0, 4))))
        if pick == 3:
            keys = ["k", 1, 2.5, Tag.A, None]
            return {keys[int(rng.integers(0, len(keys)))]: make(depth + 1) for _ in range(int(rng.integers(0, 4)))}
        if pick == 4:
            arrays = [np.array([1.0, np.nan, -0.0, np.inf]), np.arange(4), np.array([True, False]), np.zeros((2, 2))]
            return arrays[int(rng.integers(0, len(arrays)))]
        return [scalars[int(rng.integers(0, len(scalars)))] for _ in range(8)]

    for _ in range(300):
        value = make(0)
        got, want = report._clean(value), _clean_by_isinstance(value)
        # repr: types and -0.0 too (== alone would take 1 == 1.0 == True and 0.0 == -0.0)
        assert repr(got) == repr(want)


def _merge_by_sweep(starts, ends):
    """Union of [s, e) intervals by a plain sorted sweep (zero-length and NaN ones dropped)."""
    pairs = sorted((s, e) for s, e in zip(starts.tolist(), ends.tolist()) if e > s)
    out = []
    for s, e in pairs:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [p[0] for p in out], [p[1] for p in out]


def test_merge_matches_a_sweep_sorted_or_not():
    """intervals.merge skips the sort (and the copy) of inputs already in start order with
    nothing to drop: the same union as a sweep, whether sorted, unsorted, with NaN or
    zero-length intervals."""
    from tb_bottleneck_plugin.analysis import intervals as iv

    rng = np.random.default_rng(7)
    for trial in range(60):
        n = int(rng.integers(0, 300))
        starts = rng.integers(0, 500, n).astype(np.float64)
        ends = starts + rng.integers(0 if trial % 3 else 1, 30, n)
        if trial % 2:
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
        if trial % 5 == 4 and n:
            starts[rng.integers(0, n)] = np.nan
        s, e = iv.merge(starts, ends)
        want_s, want_e = _merge_by_sweep(starts, ends)
        assert s.tolist() == want_s and e.tolist() == want_e


def _cut_and_midpoint(op, a, b):
    """intersect/subtract as they were: every bound a cut, each piece judged at its midpoint."""
    from tb_bottleneck_plugin.analysis import intervals as iv

    (sa, ea), (sb, eb) = a, b
    if len(sa) == 0 or len(sb) == 0:
        return ([], []) if op == "intersect" else (sa.tolist(), ea.tolist())
    cuts = np.unique(np.concatenate([sa, ea, sb, eb]))
    mids = (cuts[:-1] + cuts[1:]) / 2
    in_b = iv._contains(sb, eb, mids)
    keep = iv._contains(sa, ea, mids) & (in_b if op == "intersect" else ~in_b)
    s, e = iv._kept_runs(cuts, keep)
    return s.tolist(), e.tolist()


def test_intersect_subtract_match_the_cut_and_midpoint_form():
    """intervals.intersect/subtract of two merged sets (sorted, disjoint, maybe touching) from
    the b intervals overlapping each a interval give what cutting at every bound and judging
    each piece at its midpoint gave, also where bounds lie one float step apart (there the
    midpoint rounds onto a bound: timestamps near 3.7e12 µs with ns fractions)."""
    from tb_bottleneck_plugin.analysis import intervals as iv

    rng = np.random.default_rng(11)

    def disjoint_set(values):
        v = np.unique(values)
        v = v[:len(v) // 2 * 2]
        s, e = v[0::2].copy(), v[1::2].copy()
        if len(s) > 2:  # some of them touching
            e[:-1] = np.where(rng.random(len(s) - 1) < 0.3, s[1:], e[:-1])
        return s, e

    base = 3743411255749.2134
    ladder = [base]
    for _ in range(80):
        ladder.append(float(np.nextafter(ladder[-1], np.inf)))
    ladder = np.array(ladder)
    for trial in range(3000):
        if trial % 2:
            a = disjoint_set(rng.integers(0, 400, 2 * int(rng.integers(0, 30))).astype(np.float64))
            b = disjoint_set(rng.integers(0, 400, 2 * int(rng.integers(0, 30))).astype(np.float64))
        else:  # one float step apart
            a = disjoint_set(ladder[rng.integers(0, len(ladder), 2 * int(rng.integers(0, 10)))])
            b = disjoint_set(ladder[rng.integers(0, len(ladder), 2 * int(rng.integers(0, 10)))])
        for op in ("intersect", "subtract"):
            s, e = getattr(iv, op)(a, b)
            assert (s.tolist(), e.tolist()) == _cut_and_midpoint(op, a, b)
    # unsorted or overlapping input: the cut form itself (no fast path)
    a = (np.array([0.0, 2.0]), np.array([10.0, 3.0]))
    b = (np.array([1.0]), np.array([5.0]))
    for op in ("intersect", "subtract"):
        s, e = getattr(iv, op)(a, b)
        assert (s.tolist(), e.tolist()) == _cut_and_midpoint(op, a, b)


def test_merge_of_intervals_that_do_not_overlap_skips_the_running_maximum():
    """Intervals in start order none of which overlaps the one before (kernels of one stream):
    merge takes the ends as their running maximum; touching ones still join, and the arrays
    it returns are never the caller's."""
    from tb_bottleneck_plugin.analysis import intervals as iv

    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(1, 200))
        bounds = np.sort(rng.integers(0, 1000, 2 * n)).astype(np.float64)
        starts, ends = bounds[0::2].copy(), bounds[1::2].copy()
        if trial % 2:  # some touching
            ends[:-1] = np.where(rng.random(n - 1) < 0.3, starts[1:], ends[:-1])
        s, e = iv.merge(starts, ends)
        want_s, want_e = _merge_by_sweep(starts, ends)
        assert s.tolist() == want_s and e.tolist() == want_e
        assert not np.shares_memory(s, starts) and not np.shares_memory(e, ends)


def test_prefiltered_regexes_answer_as_their_regexes():
    """context.BACKWARD_RE / TRITON_RE test a plain substring or prefix before the regex:
    the same match (or None) as the regex itself, on every string of the shared traces' kind
    and on strings made to sit at the edges of the tests."""
    from tb_bottleneck_plugin.analysis import context

    texts = ["autograd::engine::evaluate_function: ConvolutionBackward0", "ConvolutionBackward0",
             "aten::convolution_backward", "aten::_foreach_add_", "aten::backward", "aten::_backward",
             "xaten::x_backward", "autograd::engine", "Backwar", "backward", "aten::", "",
             "triton_poi_fused_add_0", "triton_", "my_triton_red_fused", "my_triton_x", "Triton_red_",
             "void at::native::vectorized_elementwise_kernel<4, at::native::BUnaryFunctor<float>>",
             "x" * 2000 + "Backward", "x" * 2000 + "triton_per_"]
    for pattern in (context.BACKWARD_RE, context.TRITON_RE):
        for s in texts:
            got, want = pattern.search(s), pattern.regex.search(s)
            assert (got is None) == (want is None)
            assert got is None or got.span() == want.span()


def test_ordered_by_keys_matches_lexsort():
    """linking.ordered_by_keys (a stable sort of the primary key, then only its runs of ties by
    the other keys) == np.lexsort, with ties, NaN and -0.0 in the keys."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(0, 400))
        ks = [rng.integers(0, 4 if trial % 2 else 50, n).astype(np.float64) for _ in range(int(rng.integers(1, 4)))]
        for k in ks:
            if n and trial % 3 == 0:
                k[rng.integers(0, n, 3)] = np.nan
            if n and trial % 5 == 0:
                k[rng.integers(0, n, 3)] = -0.0
        assert linking.ordered_by_keys(ks).tolist() == np.lexsort(ks).tolist()


def test_innermost_rows_matches_the_four_key_lexsort():
    """tensor_cores._innermost_rows orders by start then thread without np.lexsort of four keys:
    the same rows as with it, on ops of several threads with equal starts and lengths."""
    from types import SimpleNamespace

    from tb_bottleneck_plugin.analysis import tensor_cores

    rng = np.random.default_rng(9)
    for trial in range(100):
        n = int(rng.integers(1, 300))
        cpu = SimpleNamespace(ts=rng.integers(0, 60, n).astype(np.float64), dur=rng.integers(0, 20, n).astype(np.float64),
                              pid=rng.integers(1, 3, n), tid=rng.integers(5, 8, n))
        trace = SimpleNamespace(cpu=cpu)
        rows = np.flatnonzero(rng.random(n) < 0.7)
        ts, end = cpu.ts[rows], cpu.ts[rows] + cpu.dur[rows]
        order = np.lexsort((ts - end, ts, cpu.tid[rows], cpu.pid[rows]))
        r, ts, end = rows[order], ts[order], end[order]
        same = (cpu.pid[r][1:] == cpu.pid[r][:-1]) & (cpu.tid[r][1:] == cpu.tid[r][:-1])
        holds = np.zeros(len(r), bool)
        holds[:-1] = same & (ts[1:] < end[:-1])
        assert tensor_cores._innermost_rows(trace, rows).tolist() == np.sort(r[~holds]).tolist()


def test_merge_in_end_order_matches_a_sweep():
    """intervals.merge of intervals in end order but not in start order (host events as 2021
    traces write them: nested ones first) takes the union without sorting the starts: the same
    pieces as the sweep, with zero-length, touching and NaN intervals among them."""
    from tb_bottleneck_plugin.analysis import intervals as iv

    rng = np.random.default_rng(13)
    for trial in range(300):
        n = int(rng.integers(1, 300))
        starts = rng.integers(0, 500, n).astype(np.float64)
        ends = starts + rng.integers(0 if trial % 3 else 1, 30, n)
        order = np.argsort(ends, kind="stable")
        starts, ends = starts[order], ends[order]
        if trial % 5 == 4:
            starts[rng.integers(0, n)] = np.nan
        s, e = iv.merge(starts, ends)
        want_s, want_e = _merge_by_sweep(starts, ends)
        assert s.tolist() == want_s and e.tolist() == want_e
