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
    given, given_end = starts, ends
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
        if (ends[1:] >= ends[:-1]).all():  # in end order (host events as 2021 traces write them)
            return _merge_in_end_order(starts, ends)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        del order
    if (starts[1:] >= ends[:-1]).all():  # none overlaps the one before (kernels of one stream):
        running_end = ends  # the ends ascend (each end > its start): their running maximum
    else:  # (np.maximum.accumulate: ~7 ns per interval, ~25x this test)
        running_end = np.maximum.accumulate(ends)
    del ends
    # A new merged interval begins where the start is beyond everything before it.
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > running_end[:-1]
    if new.all():  # already disjoint (traces of tiny events): the intervals themselves, no index arrays
        return ((starts.copy() if starts is given else starts),
                (running_end.copy() if running_end is given_end else running_end))
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(starts)) - 1
    return starts[first], running_end[last]


def _merge_in_end_order(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """``merge`` of positive-length intervals sorted by end, without sorting the starts: the
    union's pieces end where an end lies before every later start (``ends[i] < min(starts[i +
    1:])``: everything before ends by it, everything after starts beyond it; touching joins),
    and each piece spans from the least start in it (the suffix minimum at its first interval)
    to its last end. The same union, so the same sorted pieces as sorting by start."""
    run_start = np.minimum.accumulate(starts[::-1])[::-1]
    last = np.flatnonzero(ends[:-1] < run_start[1:])
    first = np.concatenate([[0], last + 1])
    last = np.append(last, len(ends) - 1)
    return run_start[first], ends[last]


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
    if _disjoint(sa, ea) and _disjoint(sb, eb):
        return _pieces(sa, ea, sb, eb, inside=True)
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
    if _disjoint(sa, ea) and _disjoint(sb, eb):
        return _pieces(sa, ea, sb, eb, inside=False)
    cuts = np.unique(np.concatenate([sa, ea, sb, eb]))
    mids = (cuts[:-1] + cuts[1:]) / 2
    keep = _contains(sa, ea, mids)
    keep &= ~_contains(sb, eb, mids)
    return _kept_runs(cuts, keep)


def _disjoint(s: np.ndarray, e: np.ndarray) -> bool:
    """Finite, positive-length intervals in start order that do not overlap (they may touch):
    what ``merge`` gives, and the case ``_pieces`` answers exactly."""
    if not (s < e).all() or not np.isfinite(s[0]) or not np.isfinite(e[-1]):
        return False
    return bool((e[:-1] <= s[1:]).all())


def _pieces(sa: np.ndarray, ea: np.ndarray, sb: np.ndarray, eb: np.ndarray, inside: bool) -> Intervals:
    """``intersect`` (inside) or ``subtract`` of two ``_disjoint`` sets, from the b intervals
    that overlap each a interval (two searchsorted of a's bounds into b's, not a sort of every
    bound and a containment test per piece: the sync and input sections cut a hundred step
    windows with every kernel). Each a interval holds the b intervals j0 <= j < j1: its pieces
    inside b are their overlaps, its pieces outside b the gaps between them; touching pieces
    (of touching a intervals) are joined, as ``merge`` does."""
    j0 = np.searchsorted(eb, sa, side="right")  # first b interval ending after a's start
    j1 = np.searchsorted(sb, ea, side="left")  # first b interval starting at or after a's end
    m = j1 - j0
    np.maximum(m, 0, out=m)
    n_gaps = m if inside else m + 1  # overlaps; or gaps (one more than the overlaps)
    total = int(n_gaps.sum())
    if total == 0:
        return np.empty(0), np.empty(0)
    k = np.repeat(np.arange(len(sa)), n_gaps)
    first = np.cumsum(n_gaps)
    first -= n_gaps
    p = np.arange(total) - first[k]  # the piece's place among its a interval's
    j = j0[k] + p
    if inside:  # overlap of a interval k with b interval j
        start = np.maximum(sa[k], sb[j])
        end = np.minimum(ea[k], eb[j])
    else:  # the gap before b interval j (after the last one: up to a's end)
        nb = len(sb)
        start = np.where(p == 0, sa[k], eb[np.maximum(j - 1, 0)])
        end = np.where(p == m[k], ea[k], sb[np.minimum(j, nb - 1)])
        keep = end > start
        if not keep.all():
            start, end = start[keep], end[keep]
        if not len(start):
            return np.empty(0), np.empty(0)
    start, end = _joined(start, end)
    if not all(_integral(x) for x in (sa, ea, sb, eb)):
        start, end = _as_midpoints_do(start, end, (sa, ea, sb, eb))
    return start, end


def _joined(start: np.ndarray, end: np.ndarray) -> Intervals:
    """Sorted disjoint intervals with the touching ones joined."""
    if len(start) > 1:
        touch = start[1:] == end[:-1]
        if touch.any():
            lead = np.flatnonzero(np.concatenate([[True], ~touch]))
            last = np.append(lead[1:], len(start)) - 1
            start, end = start[lead], end[last]
    return start, end


def _integral(x: np.ndarray) -> bool:
    """Whole numbers below 2**52 (µs of integer traces): two distinct ones are more than one
    float step apart, so no midpoint between them rounds onto one of them."""
    return bool((np.floor(x) == x).all()) and (not len(x) or float(np.abs(x).max()) < 2.0 ** 52)


def _as_midpoints_do(start: np.ndarray, end: np.ndarray, bounds) -> Intervals:
    """The exact pieces of ``_pieces`` as the cut-and-midpoint form gives them (kept as it
    was, so that reports do not change): there a piece between two bounds one float step
    apart, y < x, is judged at its midpoint ``(y + x) / 2``, which rounds to x when x's last
    mantissa bit is 0, i.e. it is judged as the piece after x. Where x starts a result
    interval, that piece joins it; where x ends one, it is cut off it."""
    def moved(x):
        y = np.nextafter(x, -np.inf)
        hit = (y + x) / 2 == x
        if hit.any():
            idx = np.flatnonzero(hit)
            is_bound = np.zeros(len(idx), bool)
            for arr in bounds:  # y must itself be a bound (each array sorted)
                j = np.minimum(np.searchsorted(arr, y[idx]), len(arr) - 1)
                is_bound |= arr[j] == y[idx]
            hit[idx[~is_bound]] = False
        return np.where(hit, y, x) if hit.any() else x
    if not len(start):
        return start, end
    start, end = moved(start), moved(end)
    keep = end > start
    if not keep.all():
        start, end = start[keep], end[keep]
    return _joined(start, end)


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
