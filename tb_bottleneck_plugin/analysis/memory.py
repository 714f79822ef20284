"""Memory and fragmentation (metrics.md §7), vectorised.

Public API
----------
- ``device_key(device_type, device_id) -> str``: "cpu", "cuda:N" (CUDA and HIP), else
  "type<T>:<N>".
- ``memory_usage(trace, step_boundaries=None, max_points=2000) -> {device_key: {...}}``
  with, per device: ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``capacity_bytes``,
  ``slack_fragmentation_pct``, ``slack_fragmentation_time_weighted_pct``,
  ``free_block_fragmentation_pct`` (always None here: it needs a snapshot, see below),
  ``allocated_is_relative``, ``events``, ``curve`` ({``ts_us``, ``allocated_bytes``,
  ``reserved_bytes``}) and ``growth`` ({``per_step``: [{``step``, ``ts_us``,
  ``allocated_bytes``}], ``possible_leak``, ``rises``, ``growth_bytes``}); reasons go into
  ``memory_usage(..., not_available=na)`` under the report's keys
  (``memory.<device key>.<metric>``; analysis/units.py). An empty dict when the trace
  has no ``[memory]`` events (see ``memory_not_available_reason``).
- ``memory_not_available_reason(trace) -> str | None``.
- ``memory_snapshot_fragmentation(fileobj_or_bytes) -> {device_key: pct}`` for a CUDA
  memory snapshot (``torch.cuda.memory._dump_snapshot``), unpickled by trace/snapshot.py
  (bounded in size, memory and time) and walked here within bounds (MAX_SNAPSHOT_BLOCKS,
  no repeated references, counts checked); anything unusable raises ``SnapshotError``
  with the reason (the snapshot metric is n/a, the trace's report stands);
  ``MEMORY_SNAPSHOT_PATTERNS`` names the files looked for in a run directory (discovery
  lives elsewhere).

Definitions:
- Each event's ``Total Allocated``/``Total Reserved`` hold until the next event of the
  same device; the last until the end of the trace (``meta.last_ts``).
- 2021 traces carry only signed ``Bytes``: allocated is rebuilt as a running sum from 0 at
  the first event of the device (growth above the level at profiling start:
  ``allocated_is_relative: true``), and reserved is not available.
- Slack fragmentation (GPU only: Device Type 1 or 6) = 100 * (peak reserved - peak
  allocated) / peak reserved, and 100 * ∫(reserved - allocated) dt / ∫reserved dt. It is
  the caching allocator's unused reservation, *not* XProf's fragmentation.
- Capacity = ``deviceProperties[Device Id].totalGlobalMem`` for GPU devices: ``Device Id`` is
  PyTorch's index, the ordinal ``deviceProperties`` enumerates on CUDA and ROCm alike (it is
  the kernels' device ids that ROCm numbers differently; metrics.md "Per device"); on ROCm an
  id without an entry takes the capacity every entry shares (``devices.memory_properties``).

``UNIT``: the metric unit (analysis/units.py). Its span result also fills the memory
curves (``span.extras["memory"]``, the memory route) and applies a CUDA memory snapshot
found by discovery (``apply_snapshot``).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import DEVICE_TYPE_CUDA, DEVICE_TYPE_HIP, TraceData
from ..trace.snapshot import MAX_SNAPSHOT_BYTES, SnapshotError, reduce_snapshot  # noqa: F401 - re-exported
from . import devices, factorize
from .occupancy_calculator import prop_int

GPU_DEVICE_TYPES = (DEVICE_TYPE_CUDA, DEVICE_TYPE_HIP)

# CUDA memory snapshots looked for in a run directory: what
# ``torch.cuda.memory._dump_snapshot(filename)`` writes (its default file name is
# "dump_snapshot.pickle"; the PyTorch docs and tutorials use "*.memory_snapshot.pickle"
# / "memory_snapshot.pickle").
MEMORY_SNAPSHOT_PATTERNS = ("*.memory_snapshot.pickle", "memory_snapshot.pickle",
                            "*memory_snapshot*.pickle", "dump_snapshot.pickle")

# A byte count at or beyond 2^53 (8 PiB) is no device's memory, and float64 (the maths
# below) no longer holds it exactly: such a value (2^63-1 written by an uninitialised or
# corrupt counter) is unknown, and the metrics made from it are n/a with OUT_OF_RANGE.
MAX_BYTES = 1 << 53
OUT_OF_RANGE = ("{field} out of range in {count} [memory] event(s) (e.g. {example}, at or beyond 2^53 bytes: "
                "not a memory size; an uninitialised or corrupt counter)")


def _byte_series(values: np.ndarray, field: str, signed: bool = False) -> Tuple[np.ndarray, Optional[str]]:
    """``values`` (int64 bytes) as float64 with the out-of-range ones NaN, and the reason
    when there are any (None otherwise). ``signed``: ``Bytes`` deltas, out of range below
    -MAX_BYTES too."""
    values = np.asarray(values, dtype=np.int64)
    bad = values >= MAX_BYTES
    if signed:
        bad |= values <= -MAX_BYTES
    out = values.astype(np.float64)
    if not bad.any():
        return out, None
    out[bad] = np.nan
    return out, OUT_OF_RANGE.format(field=field, count=int(bad.sum()), example=int(values[bad][0]))


def _int_list(values: np.ndarray) -> List[Optional[int]]:
    """A byte series as JSON integers; None where it is unknown (NaN, out of range):
    no cast of a NaN or an out-of-range float to int64 (it wraps, and numpy warns)."""
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values) & (np.abs(values) < MAX_BYTES)
    if ok.all():
        return values.astype(np.int64).tolist()
    return [int(v) if k else None for v, k in zip(values.tolist(), ok.tolist())]


device_key = devices.memory_key  # "cpu", "cuda:N" (CUDA and HIP), "type<T>:<N>"


def slack_pct(peak_reserved, peak_allocated) -> Optional[float]:
    """Allocator slack at the peak (§7): 100 * (peak reserved - peak allocated) / peak
    reserved; None unless both are known and something was reserved. Spans and
    summaries (the peaks of a group are the maxima of its spans' peaks) both use it."""
    if peak_reserved is None or peak_allocated is None or not peak_reserved > 0:
        return None
    return 100.0 * (peak_reserved - peak_allocated) / peak_reserved


def slack_time_weighted_pct(slack_byte_us, reserved_byte_us) -> Optional[float]:
    """Time-weighted allocator slack: 100 * ∫(reserved - allocated) dt / ∫reserved dt."""
    if slack_byte_us is None or reserved_byte_us is None or not reserved_byte_us > 0:
        return None
    return 100.0 * slack_byte_us / reserved_byte_us


def memory_not_available_reason(trace: TraceData) -> Optional[str]:
    if len(trace.memory) == 0:
        return "trace has no [memory] events (profile_memory=False)"
    return None


def _downsample(ts: np.ndarray, series: Sequence[np.ndarray], max_points: int) -> np.ndarray:
    """Indices of at most ~max_points points of a step curve that keep, in each time
    bucket, the first point and the min and max of every series (peaks preserved)."""
    n = len(ts)
    if n <= max_points:
        return np.arange(n)
    per_bucket = 1 + 2 * len(series)
    nb = max(1, max_points // per_bucket)
    span = ts[-1] - ts[0]
    if span <= 0:
        bucket = np.minimum(np.arange(n) * nb // n, nb - 1)
    else:
        bucket = np.minimum(((ts - ts[0]) / span * nb).astype(np.int64), nb - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    keep = [starts, [n - 1]]
    # buckets in runs (times in order): each bucket's extremes by reductions over its run
    runs = bool((bucket[1:] >= bucket[:-1]).all())
    for s in series:
        if runs and not (s.dtype.kind == "f" and np.isnan(s).any()):
            keep += _run_extremes(s, starts)
            continue
        # argmax / argmin per bucket: sort by (bucket, value) and take last / first.
        order = np.lexsort((s, bucket))
        b_sorted = bucket[order]
        last = np.r_[b_sorted[1:] != b_sorted[:-1], True]
        first = np.r_[True, b_sorted[1:] != b_sorted[:-1]]
        keep += [order[last], order[first]]
    return np.unique(np.concatenate([np.asarray(k, dtype=np.int64) for k in keep]))


def _run_extremes(s: np.ndarray, starts: np.ndarray) -> list:
    """Per run of ``s`` (runs start at ``starts``): the last index of its maximum and the
    first index of its minimum, as the last / first of the run after a stable sort by
    value (``_downsample``'s lexsort) picks them; ``s`` without NaN."""
    n = len(s)
    run = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    pos = np.arange(n)
    at_max = s == np.maximum.reduceat(s, starts)[run]
    last_max = np.maximum.reduceat(np.where(at_max, pos, -1), starts)
    del at_max
    at_min = s == np.minimum.reduceat(s, starts)[run]
    first_min = np.minimum.reduceat(np.where(at_min, pos, n), starts)
    return [last_max, first_min]


def _value_at(ts: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Step-function value at each time in ``at`` (the last event at or before it);
    NaN before the first event."""
    i = np.searchsorted(ts, at, side="right") - 1
    out = np.full(len(at), np.nan)
    ok = i >= 0
    out[ok] = values[i[ok]]
    return out


def _growth(ts, allocated, step_boundaries, relative: bool) -> Dict:
    if not step_boundaries:
        return {"per_step": [], "possible_leak": False, "rises": 0, "growth_bytes": None}
    nums = np.array([int(n) for n, _ in step_boundaries])
    at = np.array([float(t) for _, t in step_boundaries])
    order = np.argsort(at, kind="stable")
    nums, at = nums[order], at[order]
    vals = _value_at(ts, allocated, at)
    if relative and len(ts):
        vals = np.where(at < ts[0], 0.0, vals)  # running sum starts at 0 (a NaN later stays unknown)
    per_step = [{"step": int(n), "ts_us": float(t), "allocated_bytes": (None if np.isnan(v) else int(v))}
                for n, t, v in zip(nums, at, vals)]
    known = vals[~np.isnan(vals)]
    rises = 0
    if len(known) >= 2:
        up = np.diff(known) > 0
        # longest run of consecutive rises
        runs = np.diff(np.flatnonzero(np.r_[True, ~up, True])) - 1
        rises = int(runs.max()) if len(runs) else 0
    growth = float(known[-1] - known[0]) if len(known) >= 2 else None
    leak = bool(rises >= T.MEMORY_LEAK_MIN_RISES and growth is not None
                and growth >= T.MEMORY_LEAK_MIN_GROWTH_BYTES and len(known) - 1 == rises)
    return {"per_step": per_step, "possible_leak": leak, "rises": rises,
            "growth_bytes": None if growth is None else int(growth)}


def memory_usage(trace: TraceData, step_boundaries: Optional[Iterable[Tuple[int, float]]] = None,
                 max_points: int = 2000, not_available: Optional[Dict[str, str]] = None) -> Dict[str, Dict]:
    """§7 per device key. ``step_boundaries``: [(step number, step start ts µs)] of the
    included steps, for the growth check. A metric that has no answer is None, its reason
    in ``not_available`` as ``memory.<device key>.<metric>``."""
    na = {} if not_available is None else not_available
    mem = trace.memory
    out: Dict[str, Dict] = {}
    if len(mem) == 0:
        return out
    steps = list(step_boundaries) if step_boundaries is not None else []
    end_ts = trace.meta.last_ts
    dev_pairs = np.stack([mem.device_type.astype(np.int64), mem.device_id.astype(np.int64)], axis=1)
    uniq, inv = factorize.unique_rows(dev_pairs)
    for j, (dtype, did) in enumerate(uniq.tolist()):
        rows = np.flatnonzero(inv == j)
        rows = rows[np.argsort(mem.ts[rows], kind="stable")]
        ts = mem.ts[rows]
        key = device_key(dtype, did)
        is_gpu = dtype in GPU_DEVICE_TYPES
        p = f"memory.{key}."  # this device's not_available keys
        tot_alloc = mem.total_allocated[rows]
        has_totals = bool((tot_alloc >= 0).all())
        bad_alloc = bad_res = None  # why allocated / reserved hold unknown (out-of-range) values
        if has_totals:
            allocated, bad_alloc = _byte_series(tot_alloc, "Total Allocated")
            raw_res = mem.total_reserved[rows]
            reserved = None
            if (raw_res < 0).any():
                na[p + "peak_reserved_bytes"] = "[memory] events carry no Total Reserved"
            elif not is_gpu and not raw_res.any() and tot_alloc.any():
                # PyTorch's CPU allocator has no cache: it writes Total Reserved 0 next to
                # real allocations, so "peak reserved 0 B" would be a wrong number.
                na[p + "peak_reserved_bytes"] = ("the CPU allocator does not report reserved memory "
                                             "(Total Reserved is 0 in every CPU [memory] event)")
            else:
                reserved, bad_res = _byte_series(raw_res, "Total Reserved")
            relative = False
        else:
            # a running sum: unknown (NaN) from the first out-of-range Bytes on
            deltas, bad_alloc = _byte_series(mem.bytes[rows], "Bytes", signed=True)
            allocated = np.cumsum(deltas)
            reserved = None
            relative = True
            na[p + "peak_reserved_bytes"] = ("2021-format [memory] events carry only signed Bytes: reserved memory "
                                         "is not available")
        # durations each value holds: until the next event, the last until the trace end
        t_end = end_ts if np.isfinite(end_ts) and end_ts >= ts[-1] else ts[-1]
        hold = np.diff(np.r_[ts, t_end])
        peak_alloc = float(allocated.max()) if bad_alloc is None else None
        peak_res = float(reserved.max()) if reserved is not None and bad_res is None else None
        if bad_alloc is not None:
            na[p + "peak_allocated_bytes"] = bad_alloc
        if bad_res is not None:
            na[p + "peak_reserved_bytes"] = bad_res
        capacity = None
        if is_gpu:
            # Device Id is PyTorch's index, the ordinal deviceProperties enumerates (CUDA and
            # HIP alike; analysis/devices.py), whatever id the kernels carry
            entry, why = devices.memory_properties(trace, dtype, did)
            capacity = prop_int(entry, "totalGlobalMem") if entry is not None else None
            if capacity is None:
                na[p + "capacity_bytes"] = (why if entry is None
                                        else "deviceProperties 'totalGlobalMem' of this device is not a valid size")
        else:
            na[p + "capacity_bytes"] = "traces do not record the host's memory size"
        slack = slack_tw = None
        res_int = slack_int = None  # byte·µs integrals, kept so summaries are ratios of sums
        if not is_gpu:
            reason = "CPU [memory] events mix allocators: allocator slack is defined for GPU devices only"
            na[p + "slack_fragmentation_pct"] = reason
            na[p + "slack_fragmentation_time_weighted_pct"] = reason
        elif reserved is None or bad_res is not None or bad_alloc is not None:
            reason = na[p + "peak_reserved_bytes"] if reserved is None or bad_res is not None else bad_alloc
            na[p + "slack_fragmentation_pct"] = reason
            na[p + "slack_fragmentation_time_weighted_pct"] = reason
        else:
            slack = slack_pct(peak_res, peak_alloc)
            with np.errstate(over="ignore", invalid="ignore"):  # absurd durations: checked below
                res_int = float((reserved * hold).sum())
                slack_int = float(((reserved - allocated) * hold).sum())
            if np.isfinite(res_int) and np.isfinite(slack_int):
                slack_tw = slack_time_weighted_pct(slack_int, res_int)
            else:  # an event or the trace end at an absurd time (a `dur` of 1e308 µs): no integral
                res_int = slack_int = None
                na[p + "slack_fragmentation_time_weighted_pct"] = (
                    "the byte·µs integral is beyond the float range (an absurd timestamp or 'dur' in the trace)")
        na[p + "free_block_fragmentation_pct"] = ("needs a CUDA memory snapshot (torch.cuda.memory._dump_snapshot) "
                                              "in the run directory" if is_gpu else "GPU devices only")
        idx = _downsample(ts, [allocated] + ([reserved] if reserved is not None else []), max_points)
        curve = {"ts_us": ts[idx].tolist(), "allocated_bytes": _int_list(allocated[idx]),
                 "reserved_bytes": _int_list(reserved[idx]) if reserved is not None else None}
        out[key] = {
            "device_type": int(dtype), "device_id": int(did),
            "peak_allocated_bytes": int(peak_alloc) if peak_alloc is not None else None,
            "peak_reserved_bytes": int(peak_res) if peak_res is not None else None,
            "capacity_bytes": capacity,
            "slack_fragmentation_pct": slack,
            "slack_fragmentation_time_weighted_pct": slack_tw,
            "free_block_fragmentation_pct": None,
            "allocated_is_relative": relative,
            "reserved_byte_us": res_int, "slack_byte_us": slack_int,
            "events": int(len(rows)),
            "curve": curve,
            "growth": _growth(ts, allocated, steps, relative),
        }
    return out


# Bounds on the snapshot walk (issue 34: bad input never costs the trace; reading itself is
# bounded in trace/snapshot.py). Every list element of a pickle costs at least one byte of
# it unless the pickle repeats one reference (`[s] * 30000`), so the blocks visited are at
# most the pickle's size and MAX_SNAPSHOT_BLOCKS; a repeated reference is refused.
MAX_SNAPSHOT_BLOCKS = 10_000_000
# A device index in a snapshot: torch's CUDA ordinal (a handful; 2^16 is no machine).
MAX_SNAPSHOT_DEVICE = 1 << 16


def _snapshot_int(value: Any, what: str, limit: int) -> int:
    """A count in a snapshot (a block size, a device index): an int (or an integral
    float) in [0, limit), else SnapshotError naming it."""
    if type(value) is float and math.isfinite(value) and value == int(value):
        value = int(value)
    if type(value) is not int or not 0 <= value < limit:
        raise SnapshotError(f"{what} {value!r:.40} is not an integer in [0, {limit})")
    return value


def _segments_of(snap: Any, size: Optional[int]) -> List[Tuple[dict, list]]:
    """The snapshot's segments as (segment, its blocks), checked before any block is
    visited: lists, no repeated reference, and a bounded number of blocks."""
    segments = snap.get("segments") if isinstance(snap, dict) else snap
    if not isinstance(segments, list):
        raise SnapshotError("no list of 'segments' (not what torch.cuda.memory._snapshot() returns)")
    segments_seen, blocks_seen, total = set(), set(), 0
    pairs = []
    for seg in segments:
        if not isinstance(seg, dict):
            continue
        if id(seg) in segments_seen:
            raise SnapshotError("the same segment is listed more than once (a repeated reference, not a snapshot)")
        segments_seen.add(id(seg))
        blocks = seg.get("blocks")
        if blocks is None:
            blocks = []
        elif not isinstance(blocks, list):
            raise SnapshotError("a segment's 'blocks' is not a list")
        elif blocks:
            if id(blocks) in blocks_seen:
                raise SnapshotError("two segments share one list of blocks (a repeated reference, not a snapshot)")
            blocks_seen.add(id(blocks))
        total += len(blocks)
        pairs.append((seg, blocks))
    limit = MAX_SNAPSHOT_BLOCKS if size is None else min(MAX_SNAPSHOT_BLOCKS, size)
    if total > limit:
        raise SnapshotError(f"{total:,} blocks in {len(segments):,} segments"
                            + (f" of a {size:,}-byte pickle" if size is not None else "")
                            + f": more than {limit:,} (repeated references or not a snapshot); not read")
    return pairs


def _fragmentation(pairs: List[Tuple[dict, list]]) -> Dict[str, float]:
    largest: Dict[str, int] = {}
    total: Dict[str, int] = {}
    for seg, blocks in pairs:
        key = device_key(DEVICE_TYPE_CUDA, _snapshot_int(seg.get("device", 0), "segment device", MAX_SNAPSHOT_DEVICE))
        blocks = [b for b in blocks if isinstance(b, dict)]
        if len(set(map(id, blocks))) != len(blocks):
            raise SnapshotError("a segment lists the same block more than once (a repeated reference, not a snapshot)")
        sizes = [_snapshot_int(b.get("size", 0), "block size", MAX_BYTES) for b in blocks
                 if b.get("state") == "inactive"]
        total[key] = total.get(key, 0) + sum(sizes)
        largest[key] = max([largest.get(key, 0)] + sizes)
    return {k: (100.0 * (1.0 - largest[k] / total[k]) if total[k] > 0 else 0.0) for k in total}


def snapshot_fragmentation(snap: Any, pickle_size: Optional[int] = None) -> Dict[str, float]:
    """Free-block fragmentation per device of an unpickled snapshot (see
    `memory_snapshot_fragmentation`); ``pickle_size`` bounds the blocks visited. Raises
    SnapshotError for anything unusable."""
    return _fragmentation(_segments_of(snap, pickle_size))


SNAPSHOT_HOLDERS = 10  # largest allocated blocks kept per device (METRICS.md §7 "Memory at the peak")
SNAPSHOT_FRAMES = 8  # frames kept per block, the user's first


def _frame_text(frame: Any) -> Optional[str]:
    """A snapshot frame ({filename, line, name}) as ``file(line): name``; None if malformed."""
    if not isinstance(frame, dict):
        return None
    path, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
    if not isinstance(path, str) or type(line) is not int:
        return None
    return f"{path[-300:]}({line}): {str(name)[:120]}"


def _snapshot_holders(pairs: List[Tuple[dict, list]]) -> Dict[str, dict]:
    """Per device: reserved (all blocks of its segments), allocated (``active_allocated``)
    and free (``inactive``) bytes, and the SNAPSHOT_HOLDERS largest allocated blocks with
    their allocation frames (the user's frames first, then the rest, SNAPSHOT_FRAMES)."""
    import heapq

    from .source import is_user_frame

    out: Dict[str, dict] = {}
    tops: Dict[str, list] = {}
    order = 0
    for seg, blocks in pairs:
        key = device_key(DEVICE_TYPE_CUDA, _snapshot_int(seg.get("device", 0), "segment device", MAX_SNAPSHOT_DEVICE))
        d = out.setdefault(key, {"reserved_bytes": 0, "allocated_bytes": 0, "free_bytes": 0, "blocks": 0})
        top = tops.setdefault(key, [])
        for b in blocks:
            if not isinstance(b, dict):
                continue
            size = _snapshot_int(b.get("size", 0), "block size", MAX_BYTES)
            d["reserved_bytes"] += size
            if b.get("state") == "inactive":
                d["free_bytes"] += size
            elif b.get("state") == "active_allocated":
                d["allocated_bytes"] += size
                d["blocks"] += 1
                order += 1
                item = (size, -order, b)
                if len(top) < SNAPSHOT_HOLDERS:
                    heapq.heappush(top, item)
                elif item > top[0]:
                    heapq.heapreplace(top, item)
    for key, top in tops.items():
        rows = []
        for size, _, b in sorted(top, reverse=True):
            frames = b.get("frames") if isinstance(b.get("frames"), list) else []
            texts = [t for t in map(_frame_text, frames[:10_000]) if t is not None]
            user = [t for t in texts if is_user_frame(t)]
            rows.append({"bytes": size, "frames": (user + [t for t in texts if t not in user])[:SNAPSHOT_FRAMES]})
        out[key]["largest_blocks"] = rows
    return out


def snapshot_summary(snap: Any, pickle_size: Optional[int] = None) -> dict:
    """What a snapshot tells (see `memory_snapshot_summary`): ``fragmentation`` per device
    (as `snapshot_fragmentation`) and ``holders`` per device (`_snapshot_holders`)."""
    pairs = _segments_of(snap, pickle_size)
    return {"fragmentation": _fragmentation(pairs), "holders": _snapshot_holders(pairs)}


def memory_snapshot_summary(src) -> dict:
    """`snapshot_summary` of a CUDA memory snapshot, read as `memory_snapshot_fragmentation`
    reads it (bounded; the same errors)."""
    return reduce_snapshot(src, snapshot_summary)


def memory_snapshot_fragmentation(src) -> Dict[str, float]:
    """Free-block fragmentation per device from a CUDA memory snapshot:
    ``100 * (1 - largest free block / total free)`` over the blocks in state
    ``inactive`` of all reserved segments (0.0 when a device has no free block).
    ``src``: the pickle's bytes, a binary file object, or the already-loaded dict.

    Bounded (trace/snapshot.py: size, memory and time of the unpickling; here at most
    min(MAX_SNAPSHOT_BLOCKS, the pickle's size) blocks visited). Raises
    pickle.UnpicklingError (a pickle that names a class) or SnapshotError (a ValueError)
    with the reason for anything else unusable: corrupt pickles, absurd counts, sizes or
    devices, repeated references; OSError when the file cannot be read."""
    return reduce_snapshot(src, snapshot_fragmentation)


# ---------------------------------------------------------------- metric unit (analysis/units.py)

MEMORY_CURVE_POINTS = 2000


def apply_snapshot(mem: dict, snapshot: dict, not_available: Dict[str, str]) -> None:
    """Free-block fragmentation from a snapshot ({"path", "fragmentation"} or {"path", "error"})."""
    if "error" in snapshot:
        not_available["memory.free_block_fragmentation_pct"] = snapshot["error"]
        for key in mem:  # there is a snapshot, but not a usable one: say why, per device too
            na_key = f"memory.{key}.free_block_fragmentation_pct"
            if not_available.get(na_key, "").startswith("needs a CUDA memory snapshot"):
                not_available[na_key] = snapshot["error"]
        return
    for key, pct in snapshot["fragmentation"].items():
        entry = mem.setdefault(key, {})
        entry["free_block_fragmentation_pct"] = pct
        entry["free_block_fragmentation_source"] = snapshot["path"]
        not_available.pop(f"memory.{key}.free_block_fragmentation_pct", None)


def _unit_compute(span) -> dict:
    """memory_usage plus the curves; not_available is only written once all went well."""
    trace, found, not_available = span.trace, span.found, span.not_available
    boundaries = ([(int(n), float(t)) for n, t in zip(found.inc_numbers, found.inc_start)]
                  if found is not None and found.found else [])
    na: Dict[str, str] = {}
    mem = memory_usage(trace, step_boundaries=boundaries, max_points=MEMORY_CURVE_POINTS, not_available=na)
    devices = {}
    for key, entry in mem.items():
        curve = entry.pop("curve", None)
        if curve:
            devices[key] = curve
    not_available.update(na)
    span.extras["memory"]["devices"].update(devices)
    failed = span.sections.failed if span.sections is not None else {}
    if "steps" in failed:
        not_available["memory.growth"] = f"needs steps, which failed ({failed['steps']})"
    if span.snapshot is not None:
        span.sections.run("memory_snapshot", apply_snapshot, mem, span.snapshot, not_available)
    if not mem:
        reason = memory_not_available_reason(trace) or "no [memory] events"
        not_available["memory"] = reason
        span.extras["memory"]["not_available"] = reason
    return mem


def _unit_partial(report: dict) -> dict:
    devices = {}
    span, worker = report.get("span"), report.get("worker")
    for key, e in (report.get("memory") or {}).items():
        if not isinstance(e, dict):
            continue
        growth = e.get("growth") or {}
        devices[str(key)] = {
            "first:entry": {k: v for k, v in e.items() if k != "growth"},
            "max:peak_allocated_bytes": e.get("peak_allocated_bytes"),
            "max:peak_reserved_bytes": e.get("peak_reserved_bytes"),
            "any:allocated_is_relative": bool(e.get("allocated_is_relative")),
            "sum:events": e.get("events") or 0,
            "all:slack_known": e.get("slack_fragmentation_pct") is not None,
            "sum:reserved_byte_us": e.get("reserved_byte_us"), "sum:slack_byte_us": e.get("slack_byte_us"),
            "rows:growth": [dict(g, span=span, worker=worker) for g in (growth.get("per_step") or [])
                            if isinstance(g, dict)],
            "any:possible_leak": bool(growth.get("possible_leak")),
        }
    return {"keyed:devices": devices}


def _unit_finish(m: dict) -> dict:
    from .units import per_step_across_spans

    out = {}
    for key in sorted(m["keyed:devices"]):
        d = m["keyed:devices"][key]
        # A peak is the maximum of the spans' peaks only when every span knows its own; the
        # peaks of the union of the spans' samples are the maxima of their peaks, so slack
        # at the peak stays exact; the time-weighted one is a ratio of integrals.
        peak_alloc, peak_res = d["max:peak_allocated_bytes"], d["max:peak_reserved_bytes"]
        merged = dict(d["first:entry"])
        merged.update(peak_allocated_bytes=int(peak_alloc) if peak_alloc is not None else None,
                      peak_reserved_bytes=int(peak_res) if peak_res is not None else None,
                      allocated_is_relative=d["any:allocated_is_relative"], events=int(d["sum:events"] or 0))
        merged["slack_fragmentation_pct"] = slack_pct(peak_res, peak_alloc) if d["all:slack_known"] else None
        res_int, slack_int = d["sum:reserved_byte_us"], d["sum:slack_byte_us"]
        merged["slack_fragmentation_time_weighted_pct"] = slack_time_weighted_pct(slack_int, res_int)
        merged["reserved_byte_us"], merged["slack_byte_us"] = res_int or None, slack_int
        # per step number across the spans: mean allocated bytes, min/max and the worker/span
        # of the max (each span's clock is its own: no ts_us); bounded by steps (METRICS.md §5)
        merged["growth"] = {"per_step": per_step_across_spans(d["rows:growth"], ("allocated_bytes",),
                                                              "allocated_bytes"),
                            "possible_leak": d["any:possible_leak"]}
        out[key] = merged
    return out


def _unit():
    from .units import LOWER, Card, Metric, Unit

    no_gpu = "no GPU device with this value in the memory section"
    metrics = (
        Metric("peak_gpu_allocated_bytes", "Peak GPU memory allocated", "bytes", LOWER,
               memory_max("peak_allocated_bytes", gpu=True), ("memory",), na_default=no_gpu,
               card=Card("peak_memory", "Peak memory", "Peak memory allocated by tensors.", order=60),
               text=False, order=140),
        Metric("peak_gpu_reserved_bytes", "Peak GPU memory reserved", "bytes", LOWER,
               memory_max("peak_reserved_bytes", gpu=True), ("memory",), na_default=no_gpu, text=False, order=150),
        Metric("allocator_slack_pct", "Allocator slack (worst GPU)", "%", LOWER,
               memory_max("slack_fragmentation_pct", gpu=True), ("memory",), na_default=no_gpu,
               card=Card("allocator_slack", "Fragmentation", "Reserved by the caching allocator but unused at the peak.",
                         order=70),
               text=False, order=160),
        Metric("peak_cpu_allocated_bytes", "Peak CPU memory allocated", "bytes", LOWER,
               memory_max("peak_allocated_bytes", gpu=False), ("memory",), na_default="no CPU [memory] events",
               text=False, order=170),
    )
    return Unit("memory", _unit_compute, _unit_partial, _unit_finish, metrics=metrics)


def memory_max(key: str, gpu: bool):
    """A headline getter: the largest ``memory[dev][key]`` over the GPU devices (``gpu``) or
    the CPU (None when none has it)."""
    def get(rep):
        values = [m.get(key) for dev, m in (rep.get("memory") or {}).items()
                  if (dev != "cpu") == gpu and m.get(key) is not None]
        return max(values) if values else None
    return get


UNIT = _unit()
