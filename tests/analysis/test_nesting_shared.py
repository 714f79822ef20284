"""One host-event nesting per trace (operators.host_nesting), shared by source attribution
and the Operator view: the nesting against a brute-force definition, and the op nesting
derived from the host nesting equal to nesting the ops alone, on hand-made interval sets
and on real traces."""
import numpy as np
import pytest

from conftest import DEMO_LOGS, TRACES
from tb_bottleneck_plugin.analysis import operators as op
from tb_bottleneck_plugin.trace import loader


def _brute(pid, tid, ts, end):
    """The definition, O(n^2): positive intervals ordered by (start, longest first, index);
    depth = earlier ones on the thread still open at the start (a zero-length one: positive
    ones with start <= t < end); parent = the innermost (latest) of those, for positive ones."""
    n = len(ts)
    pos = [i for i in range(n) if end[i] > ts[i]]
    rank = {i: r for r, i in enumerate(sorted(pos, key=lambda i: (ts[i], -end[i], i)))}
    depth, parent = np.zeros(n, np.int64), np.full(n, -1, np.int64)
    for i in range(n):
        same = [j for j in pos if j != i and pid[j] == pid[i] and tid[j] == tid[i]]
        if i in rank:
            open_ = [j for j in same if rank[j] < rank[i] and end[j] > ts[i]]
            depth[i] = len(open_)
            if open_:
                parent[i] = max(open_, key=lambda j: rank[j])
        else:
            depth[i] = sum(1 for j in same if ts[j] <= ts[i] < end[j])
    return depth, parent


def _laminar_set(rng, n_threads=3, size=60):
    """Random exactly nesting intervals on a few threads: ties of start, identical twins,
    zero-length events (at starts, ends and inside), rows interleaved across threads."""
    pid, tid, ts, end = [], [], [], []

    def grow(lo, hi, th, level):
        t = lo
        while t < hi and len(ts) < size * (th + 1):
            a = t + rng.integers(0, 3)
            b = min(hi, a + rng.integers(0, 12))
            if a > hi:
                break
            pid.append(7), tid.append(100 + th), ts.append(float(a)), end.append(float(b))
            if rng.random() < 0.15 and b > a:  # an identical twin
                pid.append(7), tid.append(100 + th), ts.append(float(a)), end.append(float(b))
            if b - a > 2 and level < 5:
                grow(a, b, th, level + 1)
            t = b if rng.random() < 0.7 else b + 1
    for th in range(n_threads):
        grow(0, 80, th, 0)
    perm = rng.permutation(len(ts))
    return (np.array(pid)[perm], np.array(tid)[perm], np.array(ts)[perm], np.array(end)[perm])


@pytest.mark.parametrize("block", [None, 7])
@pytest.mark.parametrize("seed", range(8))
def test_nesting_matches_the_definition_and_subsets_derive_exactly(seed, block, monkeypatch):
    if block:  # the parent search and the walks up in many blocks (1M events by default)
        monkeypatch.setattr(op, "_WALK_BLOCK", block)
    rng = np.random.default_rng(seed)
    pid, tid, ts, end = _laminar_set(rng)
    container = np.full(len(ts), -1, np.int64)
    depth, parent = op._nesting(pid, tid, ts, end, container)
    bd, bp = _brute(pid, tid, ts, end)
    assert np.array_equal(depth, bd) and np.array_equal(parent, bp)
    assert op._laminar(ts, end, parent)
    no_depth = np.full(len(ts), -1, np.int64)  # the host nesting's form: the same parents, no depth
    assert op._nesting(pid, tid, ts, end, no_depth, want_depth=False)[0] is None
    assert np.array_equal(op._nesting(pid, tid, ts, end, want_depth=False)[1], bp)
    assert np.array_equal(no_depth, container)
    host = {"parent": parent, "ts": ts, "end": end, "container": container}
    for _ in range(4):
        rows = np.flatnonzero(rng.random(len(ts)) < 0.6)
        d_sub, p_sub = op._subset_nesting(host, rows)
        sd, sp = _brute(pid[rows], tid[rows], ts[rows], end[rows])
        assert np.array_equal(d_sub, sd) and np.array_equal(p_sub, sp)


def test_a_partial_overlap_is_not_laminar_and_the_ops_are_nested_alone():
    # [0, 10) and [5, 15) on one thread overlap without nesting
    pid, tid = np.array([1, 1, 1]), np.array([1, 1, 1])
    ts, end = np.array([0.0, 5.0, 6.0]), np.array([10.0, 15.0, 7.0])
    depth, parent = op._nesting(pid, tid, ts, end)
    assert not op._laminar(ts, end, parent)


@pytest.mark.parametrize("block", [None, 3])
@pytest.mark.parametrize("seed", range(20))
def test_laminar_from_the_parents_equals_the_depth_definition(seed, block, monkeypatch):
    # random sets, most of them overlapping without nesting: a positive-length interval
    # inside some other (depth > 0) is one with a parent, and the test reads only those
    if block:
        monkeypatch.setattr(op, "_WALK_BLOCK", block)
    rng = np.random.default_rng(seed)
    n = 40
    pid, tid = np.ones(n, np.int64), rng.integers(0, 2, n)
    ts = rng.integers(0, 50, n).astype(np.float64)
    end = ts + rng.integers(0, 3 if seed % 2 else 30, n)
    depth, parent = op._nesting(pid, tid, ts, end)
    chk = (end > ts) & (depth > 0)
    by_depth = bool((parent[chk] >= 0).all() and (end[chk] <= end[np.maximum(parent[chk], 0)]).all())
    assert op._laminar(ts, end, parent) == by_depth


_REAL = [TRACES / "h100" / "gpt2_bf16_eager", DEMO_LOGS / "resnet50_v100_nw0",
         DEMO_LOGS / "stack_item_slow_module", DEMO_LOGS / "h100_bf16_autocast"]


@pytest.mark.parametrize("folder", _REAL, ids=lambda p: p.name)
def test_the_op_nesting_from_the_host_nesting_equals_the_ops_nested_alone(folder):
    files = sorted(folder.glob("*.pt.trace.json*"))
    if not files:
        pytest.skip(f"{folder} missing")
    trace = loader.load_trace(str(files[0]))
    host = op.host_nesting(trace)
    shared, alone = op.op_nesting(trace, host), op.op_nesting(trace)
    for k in alone:
        assert np.array_equal(shared[k], alone[k]), k
    assert len(host["parent"]) == len(trace.cpu) + len(trace.runtime)
    if folder.name == "resnet50_v100_nw0":  # exactly nesting: the derivation is what ran
        assert host["laminar"]
    # source attribution's form: the host's time columns reused in place (gathered in blocks)
    for block in (1000, 1 << 20):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(op, "_WALK_BLOCK", block)
            consumed = op.op_nesting(trace, op.host_nesting(trace), consume_host=True)
        for k in alone:
            assert consumed[k].dtype == alone[k].dtype and np.array_equal(consumed[k], alone[k]), k
