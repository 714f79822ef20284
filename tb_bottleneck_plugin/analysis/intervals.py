"""Vectorised interval arithmetic on (starts, ends) numpy arrays, in µs.

Every "Union(X)" of ../shared/docs/metrics.md is `union_length` or `merge` here, so
overlapping events are counted once everywhere in the same way.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

Intervals = Tuple[np.ndarray, np.ndarray]  # (starts, ends), sorted and disjoint after merge()


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Sorted, disjoint intervals covering exactly the union of the inputs.

    Zero-length intervals vanish; touching intervals are joined."""
    given = starts
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    if not keep.all():  # (no copy of the inputs when nothing is dropped: host spans of big traces)
        starts, ends = starts[keep], ends[keep]
    del keep
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    # (NaN rows are gone: starts in trace order are usually sorted, whose stable order is the identity)
    if not (starts[1:] >= starts[:-1]).all():
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        del order
    running_end = np.maximum.accumulate(ends)
    del ends
    # A new merged interval begins where the start is beyond everything before it.
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > running_end[:-1]
    if new.all():  # already disjoint (traces of tiny events): the intervals themselves, no index arrays
        return (starts.copy() if starts is given else starts), running_end
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(starts)) - 1
    return starts[first], running_end[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = merge(starts, ends)
    return float((e - s).sum())


def clip(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> Intervals:
    """Intervals cut to [lo, hi]; the ones outside become empty (and vanish in merge)."""
    s = np.clip(np.asarray(starts, dtype=np.float64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.float64), lo, hi)
    return s, e


def covered_in(merged: Intervals, lo, hi) -> np.ndarray:
    """Length of merged (disjoint, sorted) intervals inside each window [lo[i], hi[i]].

    Vectorised over windows with a prefix sum: O((n + m) log n)."""
    s, e = merged
    lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
    if len(s) == 0:
        return np.zeros(len(lo))
    length = e - s
    cum = np.concatenate([[0.0], np.cumsum(length)])

    def covered_before(t):
        # total covered length in (-inf, t]: the intervals before the last one starting at or
        # before t, plus that one's part up to t (in place: a window array is ~10^5 long)
        j = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        j -= 1
        none = j < 0
        j[none] = 0
        out = t - s[j]
        np.clip(out, 0, length[j], out=out)
        out += cum[j]
        out[none] = 0.0
        return out

    out = covered_before(hi)
    out -= covered_before(lo)
    return np.maximum(out, 0.0, out=out)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two merged interval sets (result merged)."""
    sa, ea = a
    sb, eb = b
    if len(sa) == 0 or len(sb) == 0:
        return np.empty(0), np.empty(0)
    # Every boundary of b cuts a; keep pieces of a that lie inside b.
    cuts = np.unique(np.concatenate([sa, ea, sb, eb]))
    mids = (cuts[:-1] + cuts[1:]) / 2
    keep = _contains(sa, ea, mids)
    keep &= _contains(sb, eb, mids)
    return _kept_runs(cuts, keep)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of merged set a not covered by merged set b (result merged)."""
    sa, ea = a
    sb, eb = b
    if len(sa) == 0 or len(sb) == 0:
        return sa, ea
    cuts = np.unique(np.concatenate([sa, ea, sb, eb]))
    mids = (cuts[:-1] + cuts[1:]) / 2
    keep = _contains(sa, ea, mids)
    keep &= ~_contains(sb, eb, mids)
    return _kept_runs(cuts, keep)


def _kept_runs(cuts: np.ndarray, keep: np.ndarray) -> Intervals:
    """``merge(cuts[:-1][keep], cuts[1:][keep])`` for the pieces between consecutive
    distinct sorted cuts: each run of kept pieces is one interval (touching pieces join;
    a piece of a NaN cut is never kept: its midpoint is in no interval)."""
    first = keep.copy()
    first[1:] &= ~keep[:-1]
    last = keep  # (the caller's own array)
    last[:-1] &= ~keep[1:]
    return cuts[:-1][first], cuts[1:][last]


def _contains(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For merged intervals (s, e): is each point t inside one of them (s <= t < e)?"""
    i = np.searchsorted(s, t, side="right")
    i -= 1
    ok = i >= 0
    i[~ok] = 0
    out = t < e[i]
    out &= ok
    return out
