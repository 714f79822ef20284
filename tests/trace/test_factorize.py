"""analysis/factorize.py gives exactly np.unique's answers (values/rows, order, inverse),
on dense keys (no sort), sparse ones (sorted) and mixes, including int64 extremes."""
import numpy as np
import pytest

from tb_bottleneck_plugin.analysis.factorize import unique_columns, unique_inverse, unique_rows


def _column(rng, kind, n):
    if kind == "dense":
        return rng.integers(-1, 5, n)
    if kind == "ids":
        return rng.integers(0, 100_000, n)
    if kind == "sparse":
        return rng.integers(-2**62, 2**62, n)
    return rng.choice(np.array([-1, 0, 2**40, -2**63, 2**63 - 1], np.int64), n)


@pytest.mark.parametrize("seed", range(40))
def test_unique_rows_equals_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    m = int(rng.integers(1, 6))
    kinds = rng.choice(["dense", "ids", "sparse", "extreme"], m)
    key = np.stack([_column(rng, k, n) for k in kinds], 1).astype(np.int64) if n else np.zeros((0, m), np.int64)
    rows, inv = unique_rows(key)
    want_rows, want_inv = np.unique(key, axis=0, return_inverse=True)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(inv, want_inv.reshape(-1))
    for col in key.T:
        for dtype in (np.int8, np.int32, np.int64):
            c = col.astype(dtype)
            values, inv1 = unique_inverse(c)
            want_values, want_inv1 = np.unique(c, return_inverse=True)
            assert values.dtype == want_values.dtype
            np.testing.assert_array_equal(values, want_values)
            np.testing.assert_array_equal(inv1, want_inv1.reshape(-1))


@pytest.mark.parametrize("seed", range(20))
def test_unique_columns_equals_numpy_rows(seed):
    """The key given as separate columns of mixed int dtypes, some constant broadcasts
    (loaded constant columns): np.unique's rows and inverse of the stacked int64 key."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 3000))
    cols = []
    for j in range(int(rng.integers(1, 6))):
        choice = int(rng.integers(0, 3))
        if choice == 0 and n:
            cols.append(np.broadcast_to(np.array([rng.integers(-3, 3)], np.int32), (n,)))
        elif choice == 1:
            cols.append(rng.integers(-1, 50, n).astype(np.int32))
        else:
            cols.append(_column(rng, ["dense", "ids", "sparse", "extreme"][j % 4], n).astype(np.int64))
    key = np.stack(cols, 1).astype(np.int64) if n else np.zeros((0, len(cols)), np.int64)
    rows, inv = unique_columns(*cols)
    want_rows, want_inv = np.unique(key, axis=0, return_inverse=True)
    assert rows.dtype == np.int64 and rows.shape == want_rows.shape
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(inv, want_inv.reshape(-1))


def test_dense_keys_take_no_sort(monkeypatch):
    """Interned ids (0..len(strings)) are ranked with a table: np.unique is not called."""
    calls = []
    original = np.unique
    monkeypatch.setattr(np, "unique", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    key = np.stack([np.arange(10_000) % 7, np.arange(10_000) % 300], 1)
    rows, inv = unique_rows(key)
    assert calls == []
    assert len(rows) == 2100 and inv.max() == 2099
    assert rows[0].tolist() == [0, 0] and rows[-1].tolist() == [6, 299]
