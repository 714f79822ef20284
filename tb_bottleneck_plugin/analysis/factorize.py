"""Grouping keys without sorting where the keys are small integers.

The analyses group rows by integer keys (interned name ids, devices, streams, steps,
launch dimensions) and used ``np.unique(..., return_inverse=True)``, which sorts (an
argsort of every row, a large share of the report's CPU on big traces).
Most of these keys are dense: interned ids run 0..len(strings), devices and steps are
few. A column whose values span at most a few times its length is ranked with a
presence table and a cumulative sum (O(n + span), no sort); the columns' ranks are
combined by mixed radix (which keeps lexicographic order), and only a combined code that
is too sparse for a table is sorted, once.

The results are exactly ``np.unique``'s: the same unique values/rows in the same
(ascending, lexicographic) order and the same inverse.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

_DENSE_MIN = 1 << 16  # a table of this many entries is always cheap
_DENSE_FACTOR = 4  # ... and one of up to 4x the number of rows
_CODE_LIMIT = 1 << 62
_BLOCK = 1 << 18  # rows per block of the int64 temporaries (2 MiB)


def _dense_ok(span: int, n: int) -> bool:
    return span <= max(_DENSE_MIN, _DENSE_FACTOR * n)


def _rank_dense(code: np.ndarray, span: int, in_place: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values of ``code``, inverse) for 0 <= code < span. ``in_place``: the
    inverse written over ``code`` (an int64 array of the caller's own), block by block."""
    present = np.zeros(span, np.bool_)
    present[code] = True
    values = np.flatnonzero(present)
    rank = np.cumsum(present, dtype=np.int64)
    rank -= 1
    if not in_place:
        return values, rank[code]
    del present
    for a in range(0, len(code), _BLOCK):
        code[a:a + _BLOCK] = rank[code[a:a + _BLOCK]]
    return values, code


def unique_inverse(col) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(col, return_inverse=True)`` for a 1-D integer array, with a 1-D
    inverse (int64); values keep ``col``'s dtype."""
    col = np.asarray(col)
    n = len(col)
    if n == 0 or col.dtype.kind not in "iub":
        values, inv = np.unique(col, return_inverse=True)
        return values, inv.reshape(-1).astype(np.int64, copy=False)
    lo, hi = int(col.min()), int(col.max())
    span = hi - lo + 1
    if not _dense_ok(span, n):
        values, inv = np.unique(col, return_inverse=True)
        return values, inv.reshape(-1).astype(np.int64, copy=False)
    # (indices of any integer dtype as they are: no int64 copy of an int32 column of ids)
    if not lo and col.dtype.kind in "iu":
        values, inv = _rank_dense(col, span)
        return values.astype(col.dtype, copy=False), inv
    # col - lo block by block (no int64 copy of the column beside its inverse: a peak of the
    # Operator view on 10M ops)
    present = np.zeros(span, np.bool_)
    for a in range(0, n, _BLOCK):
        present[np.subtract(col[a:a + _BLOCK], lo, dtype=np.int64)] = True
    values = np.flatnonzero(present)
    rank = np.cumsum(present, dtype=np.int64)
    rank -= 1
    del present
    inv = np.empty(n, np.int64)
    for a in range(0, n, _BLOCK):
        inv[a:a + _BLOCK] = rank[np.subtract(col[a:a + _BLOCK], lo, dtype=np.int64)]
    return (values + lo).astype(col.dtype, copy=False), inv


def _rank_table(col):
    """``(lo, rank)`` with ``unique_inverse(col)[1] == rank[col - lo]`` for an integer column
    dense enough for a table (unique_inverse's dense case), else None."""
    if col.dtype.kind not in "iub":
        return None
    lo, hi = int(col.min()), int(col.max())
    if not _dense_ok(hi - lo + 1, len(col)):
        return None
    present = np.zeros(hi - lo + 1, np.bool_)
    for a in range(0, len(col), _BLOCK):
        present[np.subtract(col[a:a + _BLOCK], lo, dtype=np.int64)] = True
    rank = np.cumsum(present, dtype=np.int64)
    rank -= 1
    return lo, rank


def unique_values(col) -> np.ndarray:
    """``np.unique(col)`` for a 1-D integer array (the same values, dtype and order): a
    presence table when the values are dense, no sort."""
    col = np.asarray(col)
    n = len(col)
    if n == 0 or col.dtype.kind not in "iu":
        return np.unique(col)
    lo, hi = int(col.min()), int(col.max())
    if not _dense_ok(hi - lo + 1, n):
        return np.unique(col)
    present = np.zeros(hi - lo + 1, np.bool_)
    present[np.subtract(col, lo, dtype=np.int64) if lo else col] = True
    values = np.flatnonzero(present)
    if lo:
        values += lo
    return values.astype(col.dtype, copy=False)


def unique_rows(key) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, axis=0, return_inverse=True)`` for an (n, m) integer array: the
    distinct rows in lexicographic order (int64) and each row's index among them (1-D)."""
    key = np.asarray(key, np.int64)
    n = len(key)
    if n == 0:
        return key.copy(), np.zeros(0, np.int64)
    code = np.zeros(n, np.int64)
    size = 1  # the number of distinct values `code` can take
    for j in range(key.shape[1]):
        # (a contiguous copy of one column at a time: the strided column of the row-major key
        # was ~2x slower to rank; the code is updated in place)
        values, inv = unique_inverse(np.ascontiguousarray(key[:, j]))
        u = len(values)
        del values
        if size * u >= _CODE_LIMIT:  # renumber the combined code densely first
            used, code = _ranked(code, size, n)
            size = len(used)
        code *= u
        code += inv
        del inv
        size *= u
    _, code = _ranked(code, size, n)
    first = np.zeros(int(code.max()) + 1, np.int64)
    first[code[::-1]] = np.arange(n - 1, -1, -1)
    return key[first], code


def unique_columns(*columns) -> Tuple[np.ndarray, np.ndarray]:
    """``unique_rows(np.stack(columns, 1))`` for 1-D integer columns of one length, without
    the stacked (n, m) int64 copy: the combined code is built column by column in place, and
    a constant column (``np.broadcast_to``, stride 0: trace/model.constant_column) adds
    nothing to it, so it is never expanded."""
    n = len(columns[0])
    if n == 0:
        return np.zeros((0, len(columns)), np.int64), np.zeros(0, np.int64)
    # the columns from the last: code = inverse * size + code ranks the rows' tails (c_k, ..., c_m)
    # in lexicographic order; a code whose product with the next column would be too sparse
    # for a table is first renumbered densely (by its distinct values, not its span), so the
    # Operator view's (step, name, dims, types) ends in a table, not a sort of every row
    code = None  # (all zeros until the first column that is not constant: that one's inverse)
    size = 1
    for col in reversed(columns):
        col = np.asarray(col)
        if col.strides == (0,):  # one value in every row: code * 1 + 0
            continue
        if code is not None and col.dtype.kind in "iub" and _dense_ok(size, n) and \
                not _dense_ok(size * (int(col.max()) - int(col.min()) + 1), n):
            # (before this column's own table or inverse is made: only the code is held then)
            used, code = _rank_dense(code, size, in_place=True)
            size = len(used)
            del used
        table = _rank_table(col) if code is not None else None
        inv = None
        if table is not None:  # a dense column after the first: its inverse added block by block
            lo, rank = table
            u = int(rank[-1]) + 1 if len(rank) else 0
        else:
            values, inv = unique_inverse(col)
            u = len(values)
            del values
        if code is None:
            code, size = inv, u
            continue
        if size * u >= _CODE_LIMIT:
            used, code = _ranked(code, size, n)
            size = len(used)
        if inv is None:
            for a in range(0, n, _BLOCK):  # (no int64 inverse of every row beside code)
                part = rank[np.subtract(col[a:a + _BLOCK], lo, dtype=np.int64)]
                part *= size
                code[a:a + _BLOCK] += part
            del part
        else:
            inv *= size
            code += inv
            del inv
        size *= u
    if code is None:
        code = np.zeros(n, np.int64)
    _, code = _ranked(code, size, n, in_place=True)  # (code is this function's own)
    first = np.zeros(int(code.max()) + 1, np.int64)
    # first[code[::-1]] = arange(n - 1, -1, -1) (the first row of each code wins), block by block from
    # the end: the same writes in the same order, without an arange of every row
    for a in range((n - 1) // _BLOCK * _BLOCK, -1, -_BLOCK):
        b = min(a + _BLOCK, n)
        first[code[a:b][::-1]] = np.arange(b - 1, a - 1, -1)
    return np.stack([np.asarray(col)[first].astype(np.int64) for col in columns], 1), code


def _ranked(code: np.ndarray, size: int, n: int, in_place: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    if _dense_ok(size, n):
        return _rank_dense(code, size, in_place)
    values, inv = np.unique(code, return_inverse=True)
    return values, inv.reshape(-1)


def thread_ids_of(*columns) -> Tuple[np.ndarray, ...]:
    """Dense thread ids for several (pid, tid) column pairs, consistent between them and
    numbered in (pid, tid) order: for each pair the inverse of
    ``np.unique(np.stack([pid, tid], 1), axis=0, return_inverse=True)`` over all pairs
    together. Rows come in runs of one thread, so only the runs' keys are hashed and the few
    distinct threads ranked: no stacked copy of the columns, no sort of the rows."""
    codes: dict = {}
    runs = []
    for pid, tid in zip(columns[::2], columns[1::2]):
        n = len(pid)
        if n == 0:
            runs.append(None)
            continue
        starts = np.concatenate([[0], np.flatnonzero((pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])) + 1])
        run_code = np.fromiter((codes.setdefault(k, len(codes))
                                for k in zip(pid[starts].tolist(), tid[starts].tolist())), np.int64, len(starts))
        runs.append((run_code, np.diff(np.append(starts, n))))
    keys = list(codes)  # in code order; Python compares the int pairs as np.unique does
    rank = np.empty(len(keys), np.int64)
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    return tuple(np.zeros(0, np.int64) if r is None else np.repeat(rank[r[0]], r[1]) for r in runs)
