"""Typed events -> numpy columns, the string table and the recorded inputs (`_Builder`).

Part of the loader (`loader.py` feeds it chunk by chunk; decode workers build a chunk's
columns in their own `_Builder`, merged in file order by `_Builder.merge`). Values that
pass the schema but cannot be right (integers beyond int64, negative sizes) are treated
as absent with a warning; complete events without a usable ts/dur are dropped and
counted. `_Builder.finish` makes the `model.TraceData`.
"""
from __future__ import annotations

import collections
import re
import sys
from itertools import chain, compress, islice
from operator import attrgetter, eq
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import model
from .events import _EMPTY_RAW, _NO_ARGS, Event, _checked_int, _decode_raw

# CPU op names whose recorded input shapes/dtypes the Tensor Core analysis reports
# ("eligible but not using", metrics §5). Matched as substrings of the op name.
SHAPE_OP_MARKERS = (
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "conv", "aten::einsum", "scaled_dot_product", "flash_attention", "efficient_attention",
    "lstm", "gru", "rnn",
    # collective spans (nccl:all_reduce, gloo:broadcast, ...): their input size is the
    # collective's bytes in the rank view (metrics §12)
    "nccl:", "gloo:", "rccl:",
    # the c10d ops that enqueue them (c10d::allreduce_, c10d::_allgather_base_, functional
    # collectives): a gloo: span is matched to its op by tensor size (collectives.c10d_op_of)
    "c10d::", "_c10d_functional::",
)

# any(marker in name.lower()), one C-level search per name (traces with a million distinct names)
_SHAPE_OP_RE = re.compile("|".join(map(re.escape, SHAPE_OP_MARKERS)))


def _last(items, n: int) -> list:
    """The last ``n`` entries of a dict (or dict view) in order, without walking the others."""
    return list(islice(reversed(items), n))[::-1] if n > 0 else []


# c10d point-to-point ops whose "Concrete Inputs" name the peer rank (third argument).
P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")


def _peer_of(concrete) -> Optional[int]:
    """The peer rank in a c10d send/recv op's decoded "Concrete Inputs" (["", "", "1", "0"])."""
    if isinstance(concrete, list) and len(concrete) >= 3:
        v = concrete[2]
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            return int(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


# Raw (lower-cased) categories -> what the event is. See trace-format.md §4.
_GPU_KIND = {"kernel": model.GPU_KERNEL, "gpu_memcpy": model.GPU_MEMCPY, "memcpy": model.GPU_MEMCPY,
             "gpu_memset": model.GPU_MEMSET, "memset": model.GPU_MEMSET}
_RUNTIME = {"cuda_runtime": False, "runtime": False, "cuda_driver": True}
_CPU_KIND = {"cpu_op": model.CPU_OP, "operator": model.CPU_OP, None: model.CPU_OP,
             "user_annotation": model.CPU_USER_ANNOTATION,
             "python_function": model.CPU_PYTHON, "python": model.CPU_OP}
_GPU_ANNOTATION = {"gpu_user_annotation", "user"}
_GPU_ROWS = ("kernels", "memcpys", "memsets")  # by GpuTable.kind, for warnings
_NOT_HOST = {"trace", "flow", "overhead"}  # synthetic spans, CUPTI overhead (pid -1)


# np.fromiter over a list of scalars: the same values and errors as np.array(list, dtype),
# without np.array's pass that discovers the list's shape (~20 % of a column's conversion).
def _float_col(values: list) -> np.ndarray:
    try:
        return np.fromiter(values, np.float64, len(values))
    except (TypeError, ValueError):
        return np.array([_to_float(v) for v in values], dtype=np.float64)


def _to_float(v) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return float("nan")
    return float("nan")


def _int_col(values: list, bad: Optional[list] = None) -> np.ndarray:
    """int64 column, -1 where missing. The one-call conversion takes well-formed
    columns; anything else goes value by value, and ``bad`` (if given) collects
    (row, problem) for values that are there but wrong (not for missing ones or for
    strings, which old exporters write: "stream 7", "N/A")."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    try:  # absent values (None) are common: -1 for them, still one call for the rest
        return np.fromiter([-1 if v is None else v for v in values], np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), dtype=np.int64)
        for row, v in enumerate(values):
            x, problem = _checked_int(v)
            out[row] = x
            if problem and bad is not None:
                bad.append((row, problem))
        return out


class _Builder:
    """Accumulates per-chunk column blocks and the string table."""

    def __init__(self, path: str, seed: Optional[Tuple[Dict[str, int], Dict[bytes, int]]] = None):
        """``seed``: (string table, recorded-input ids) of the builder this one's chunk will
        be merged into (`seed`), so that names seen before keep their ids here and are
        looked up in one C-level pass instead of being interned again per chunk."""
        self.path = path
        self.strings: Dict[str, int] = seed[0] if seed else {}
        self._base = len(self.strings)  # ids below this are the seeding builder's own
        self.gpu: List[model.GpuTable] = []
        self.cpu: List[model.CpuTable] = []
        self.runtime: List[model.RuntimeTable] = []
        self.memory: List[model.MemoryTable] = []
        self.annotations: List[model.GpuAnnotationTable] = []
        self.op_inputs = model.OpInputs()
        self.cpu_rows = 0
        self.category_counts: Dict[str, int] = {}
        self.event_count = 0
        self.first_ts = float("inf")
        self.last_ts = float("-inf")
        self.profiler_first_ts = float("inf")  # the `Trace` span(s): the profiler's own window
        self.profiler_last_ts = float("-inf")
        self.dropped_missing_dur = 0
        self.dropped_bad_ts = 0
        self.negative_dur = 0
        # (what rows, JSON field, problem) -> count, for values treated as absent
        self.field_problems: Dict[Tuple[str, str, str], int] = {}
        self.skipped_deep = 0  # events nested beyond msgspec's recursion limit
        self.skipped_not_object = 0  # traceEvents entries that are not objects
        self.replaced_strings = 0  # strings with invalid UTF-8 or a lone surrogate, fixed to U+FFFD
        self._shape_flags = np.zeros(0, np.int8)  # per string id (_shape_op_rows)
        self._decoded_cache: Dict[bytes, Any] = {}  # recorded input text -> its value (_decoded)
        # recorded input text -> its string id (_raw_ids)
        self._raw_id_cache: Dict[bytes, int] = seed[1] if seed else {b"": -1}
        self._raw_base = len(self._raw_id_cache)  # entries below this are the seeding builder's
        # Inductor kernel launches: CPU row -> model.KernelLaunch, one tuple per distinct launch
        self.kernel_launches: Dict[int, model.KernelLaunch] = {}
        self._launch_cache: Dict[tuple, model.KernelLaunch] = {}

    def added_strings(self) -> List[str]:
        """The strings this chunk builder added to its seed's table, in first-seen order."""
        return _last(self.strings, len(self.strings) - self._base)

    def added_raw(self) -> List[Tuple[bytes, int]]:
        """The recorded-input texts (and their string ids) this chunk builder met first."""
        raw = self._raw_id_cache
        return _last(raw.items(), len(raw) - self._raw_base)

    def seed(self) -> Tuple[Dict[str, int], Dict[bytes, int]]:
        """What a chunk builder whose result `merge` takes starts from (see __init__): copies,
        while this builder may grow (the loader's own chunks use decode_workers._decode_detached)."""
        return dict(self.strings), dict(self._raw_id_cache)

    def problem_counts(self) -> tuple:
        """The counters lenient decoding writes, to undo a failed attempt (events._decode_events)."""
        return dict(self.field_problems), self.skipped_deep, self.skipped_not_object

    def restore_problem_counts(self, saved: tuple) -> None:
        self.field_problems, self.skipped_deep, self.skipped_not_object = saved

    def note(self, rows: str, field: str, problem: str, n: int = 1) -> None:
        key = (rows, field, problem)
        self.field_problems[key] = self.field_problems.get(key, 0) + n

    def _noted(self, bad: list, rows: str, field: str, kinds: Optional[np.ndarray]) -> None:
        for row, problem in bad:
            self.note(_GPU_ROWS[kinds[row]] if kinds is not None else rows, field, problem)

    def _ints(self, values: list, rows: str, field: str, kinds=None, min_value=None,
              int32: bool = False) -> np.ndarray:
        """An int column whose wrong values (wrong type, beyond int64/int32, below
        ``min_value``) are -1 (absent) and counted per field."""
        bad: list = []
        col = _int_col(values, bad)
        if min_value is not None or int32:
            low = col < (min_value if min_value is not None else -(1 << 31))
            high = col >= (1 << 31) if int32 else np.zeros(len(col), dtype=np.bool_)
            if low.any() or high.any():
                bad += [(row, "negative" if min_value is not None else "beyond int32")
                        for row in np.flatnonzero(low).tolist()]
                bad += [(row, "beyond int32") for row in np.flatnonzero(high).tolist()]
                col = np.where(low | high, -1, col)
        if bad:
            self._noted(bad, rows, field, kinds)
        return col.astype(np.int32) if int32 else col

    def _floats(self, values: list, rows: str, field: str, kinds=None) -> np.ndarray:
        """A non-negative float column (occupancy figures); a negative value is NaN."""
        col = _float_col(values)
        with np.errstate(invalid="ignore"):
            neg = col < 0
        if neg.any():
            self._noted([(row, "negative") for row in np.flatnonzero(neg).tolist()], rows, field, kinds)
            col = np.where(neg, np.nan, col)
        return col

    def intern(self, names: list) -> np.ndarray:
        table = self.strings
        ids = list(map(table.get, names))  # names seen before: one C-level lookup each
        if None in ids:  # new names (and non-strings, keyed by str()) get ids in first-seen order
            ids = [i if i is not None else table.setdefault(n if isinstance(n, str) else str(n), len(table))
                   for i, n in zip(ids, names)]
        return np.fromiter(ids, np.int32, len(ids))

    def _optional_ids(self, values: list) -> np.ndarray:
        """String ids of optional values (None -> -1; a number, e.g. a process group's name,
        as its text): most columns of this kind are all None (occupancy limiters,
        collective dtypes), found by one C-level count."""
        if values.count(None) == len(values):
            return np.full(len(values), -1, np.int32)
        table = self.strings
        return np.fromiter([-1 if v is None else table.setdefault(v if isinstance(v, str) else str(v), len(table))
                            for v in values], np.int32, len(values))

    @staticmethod
    def _raw_texts(raws: list) -> List[bytes]:
        """Undecoded JSON values as bytes (b"" for an absent one): one join and one split
        (JSON text holds no NUL byte) cost less than bytes() per value."""
        keys = b"\x00".join(raws).split(b"\x00") if raws else []
        return keys if len(keys) == len(raws) else list(map(bytes, raws))

    def _raw_ids(self, keys: List[bytes]) -> np.ndarray:
        """String ids of undecoded JSON values (`_raw_texts`: kept as their text, never
        parsed here); -1 for an absent one. The operator view groups by them (metrics:
        Operator view)."""
        known = self._raw_id_cache  # raw bytes -> id (b"" -> -1): ops repeat a few hundred texts
        ids = list(map(known.get, keys))  # one C-level pass; texts seen before
        if None in ids:  # new texts get string ids in first-seen order
            table = self.strings
            for row, i in enumerate(ids):
                if i is None:
                    key = keys[row]
                    i = known.get(key)
                    if i is None:
                        try:
                            text = str(key, "utf-8")
                        except UnicodeDecodeError:  # raw invalid UTF-8 (msgspec skips it in a Raw value)
                            text = str(key, "utf-8", "replace")
                            self.replaced_strings += 1
                        i = known[key] = table.setdefault(text, len(table))
                    ids[row] = i
        return np.fromiter(ids, np.int32, len(ids))

    def _stack_ids(self, raws: list) -> np.ndarray:
        """``_raw_ids`` of the old per-op ``Call stack`` texts (~1 KB each). One Python line
        launches many ops, so most ops repeat the previous op's stack: one C-level pass of
        equality tests of the undecoded values (memcmp) finds the runs, and only each run's
        first value is copied, hashed and looked up."""
        if not raws:
            return np.zeros(0, np.int32)
        same = np.fromiter(map(eq, raws[1:], raws[:-1]), np.bool_, len(raws) - 1)
        starts = np.flatnonzero(np.concatenate([[True], ~same]))
        keys = list(map(bytes, map(raws.__getitem__, starts.tolist())))  # one copy per run
        run_ids = self._raw_ids(keys)
        return np.repeat(run_ids, np.diff(np.append(starts, len(raws))))

    def _decoded(self, raw):
        """A recorded input value (JSON text), decoded once per distinct text. Ops repeat
        a few hundred shapes tens of thousands of times: one shared (read-only) object per
        text instead of nested lists per call, which the garbage collector would walk."""
        key = raw if type(raw) is bytes else bytes(raw)
        cache = self._decoded_cache
        value = cache.get(key, cache)
        if value is cache:
            value = cache[key] = _decode_raw(key)
        return value

    def add(self, events: List[Event]) -> None:
        self.event_count += len(events)
        # complete ('X') events by raw category, in first-seen order; [memory] events of any ph
        by_cat: Dict[Any, List[Event]] = collections.defaultdict(list)
        memory: List[Event] = []
        for e in events:
            if e.name == "[memory]":
                memory.append(e)
            elif e.ph == "X":
                by_cat[e.cat].append(e)
        gpu: List[Event] = []
        gpu_kind: List[int] = []
        runtime: List[Event] = []
        driver: List[bool] = []
        cpu: List[Event] = []
        cpu_kind: List[int] = []
        cpu_cats: List[Tuple[str, int]] = []  # (category, events): one run per bucket, in cpu's order
        annotations: List[Event] = []
        counts = self.category_counts
        for cat, evs in by_cat.items():
            key = cat if isinstance(cat, str) else ("" if cat is None else str(cat))
            counts[key] = counts.get(key, 0) + len(evs)
            low = cat.lower() if isinstance(cat, str) else None
            if low in _GPU_KIND:
                gpu += evs
                gpu_kind += [_GPU_KIND[low]] * len(evs)
            elif low in _RUNTIME:
                runtime += evs
                driver += [_RUNTIME[low]] * len(evs)
            elif low in _GPU_ANNOTATION or (low is not None and low.startswith("gpu_user")):
                annotations += evs
            elif low in _NOT_HOST:
                if low == "trace":
                    self._profiler_span(evs)
                    continue
            else:
                cpu += evs
                cpu_kind += [_CPU_KIND.get(low, model.CPU_OTHER)] * len(evs)
                cpu_cats.append(("" if cat is None else cat, len(evs)))
        if memory:
            counts["[memory]"] = counts.get("[memory]", 0) + len(memory)
        self._add_gpu(gpu, gpu_kind)
        self._add_runtime(runtime, driver)
        self._add_cpu(cpu, cpu_kind, cpu_cats)
        self._add_memory(memory)
        self._add_annotations(annotations)

    # Shared checks on complete events: drop those without usable ts/dur.
    def _times(self, evs: List[Event]):
        ts = _float_col([e.ts for e in evs])
        dur = _float_col([e.dur for e in evs])
        bad_ts = ~np.isfinite(ts)
        bad_dur = ~np.isfinite(dur)
        keep = None
        if bad_ts.any() or bad_dur.any():
            self.dropped_bad_ts += int(bad_ts.sum())
            self.dropped_missing_dur += int((bad_dur & ~bad_ts).sum())
            keep = ~(bad_ts | bad_dur)
        neg = dur < 0
        if neg.any():
            self.negative_dur += int(neg.sum())
            dur = np.where(neg, 0.0, dur)
        with np.errstate(over="ignore", invalid="ignore"):
            overflow = ~np.isfinite(ts + dur) & np.isfinite(ts) & np.isfinite(dur)
        if overflow.any():  # 1e308 + 1e308: no analysis can use such an end
            self.note("events", "dur", "so large that ts + dur is infinite (event ignored)", int(overflow.sum()))
            keep = ~overflow if keep is None else keep & ~overflow
        return ts, dur, keep

    def _profiler_span(self, evs: List[Event]) -> None:
        """The profiler's own span (`Trace` events): kept as times only, never as events."""
        ts = _float_col([e.ts for e in evs])
        dur = _float_col([e.dur for e in evs])
        ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
        if ok.any():
            self.profiler_first_ts = min(self.profiler_first_ts, float(ts[ok].min()))
            self.profiler_last_ts = max(self.profiler_last_ts, float((ts[ok] + dur[ok]).max()))

    def _span(self, ts: np.ndarray, end: np.ndarray):
        if len(ts):
            self.first_ts = min(self.first_ts, float(ts.min()))
            self.last_ts = max(self.last_ts, float(end.max()))

    def _add_gpu(self, evs: List[Event], kinds: List[int]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        args = [e.args or _NO_ARGS for e in evs]
        kind = np.fromiter(kinds, np.int8, len(kinds))
        device = [a.device for a in args]
        if None in device:
            device = [a.device if a.device is not None else e.pid for a, e in zip(args, evs)]
        stream = [a.stream for a in args]
        if None in stream:
            stream = [a.stream if a.stream is not None else e.tid for a, e in zip(args, evs)]
        ext = [a.external_id if a.external_id is not None else a.external_id_old for a in args]
        dims = {}
        for field in ("grid", "block"):
            bad: list = []
            dims[field] = _dims([getattr(a, field) for a in args], bad)
            self._noted(bad, "", field, kind)
        grid, block = dims["grid"], dims["block"]
        limits = [None if a.occupancy is None else _limiting_factors(a.occupancy) for a in args]
        nelems = [a.msg_in_nelems for a in args]
        table = model.GpuTable(
            kind=kind,
            name=self.intern([e.name for e in evs]),
            ts=ts, dur=dur,
            device=self._ints(device, "", "device", kind, int32=True),
            stream=self._ints(stream, "", "stream", kind),
            correlation=self._ints([a.correlation for a in args], "", "correlation", kind),
            external_id=self._ints(ext, "", "External id", kind),
            grid_x=grid[:, 0], grid_y=grid[:, 1], grid_z=grid[:, 2],
            block_x=block[:, 0], block_y=block[:, 1], block_z=block[:, 2],
            registers_per_thread=self._ints([a.registers for a in args], "", "registers per thread", kind,
                                            min_value=-1),
            shared_memory=self._ints([a.shared_memory for a in args], "", "shared memory", kind, min_value=-1),
            blocks_per_sm=self._floats([a.blocks_per_sm for a in args], "", "blocks per SM", kind),
            warps_per_sm=self._floats([a.warps_per_sm for a in args], "", "warps per SM", kind),
            achieved_occupancy_pct=self._floats([a.occupancy_pct for a in args], "",
                                                "est. achieved occupancy %", kind),
            occupancy_limit=self._optional_ids(limits),
            bytes=self._ints([a.bytes if a.bytes is not None else a.size for a in args], "", "bytes", kind,
                             min_value=-1),
            msg_nelems=self._ints(nelems, "", "In msg nelems", kind, min_value=-1),
            msg_dtype=self._optional_ids([a.msg_dtype for a in args]),
        )
        coll = [i for i, v in enumerate(nelems) if v is not None] if nelems.count(None) != len(nelems) else None
        if coll:  # collective kernels only (few): the rest keep the -1 defaults
            self._add_collective_args(table, [args[i] for i in coll], np.array(coll, np.int64), kind[coll])
        if keep is not None:
            table = table.take(keep)
        self._span(table.ts, table.ts + table.dur)
        self.gpu.append(table)

    def _add_runtime(self, evs: List[Event], driver: List[bool]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        args = [e.args or _NO_ARGS for e in evs]
        rows = "runtime calls"
        table = model.RuntimeTable(
            name=self.intern([e.name for e in evs]),
            pid=self._ints([e.pid for e in evs], rows, "pid"), tid=self._ints([e.tid for e in evs], rows, "tid"),
            ts=ts, dur=dur,
            correlation=self._ints([a.correlation for a in args], rows, "correlation"),
            external_id=self._ints([a.external_id if a.external_id is not None else a.external_id_old
                                    for a in args], rows, "External id"),
            is_driver=np.fromiter(driver, np.bool_, len(driver)),
        )
        if keep is not None:
            table = table.take(keep)
        self._span(table.ts, table.ts + table.dur)
        self.runtime.append(table)

    def _add_cpu(self, evs: List[Event], kinds: List[int], cat_runs: List[Tuple[str, int]]) -> None:
        """``cat_runs``: the events' categories as (category, count) runs (`add` groups them)."""
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        names = self.intern([e.name for e in evs])
        # one id per run, interned in the order the events come (as per event would)
        cats = np.repeat(self.intern([c for c, _ in cat_runs]), [n for _, n in cat_runs])
        args = [e.args or _NO_ARGS for e in evs]
        dims = [a.input_dims for a in args]
        if any(map(len, [a.input_dims_2020 for a in args])):  # traces of 2020: "Input dims"
            dims = [d if len(d) else a.input_dims_2020 for d, a in zip(dims, args)]
        dims = self._raw_texts(dims)
        types = self._raw_texts([a.input_type for a in args])
        stacks = [a.call_stack for a in args]  # old traces only: skip the lookup without any
        # absent: the default Raw itself (list.count tests identity first)
        stacks = (self._stack_ids(stacks) if stacks.count(_EMPTY_RAW) != len(stacks)
                  else np.full(len(evs), -1, np.int32))
        table = model.CpuTable(
            kind=np.fromiter(kinds, np.int8, len(kinds)), category=cats, name=names,
            pid=self._ints([e.pid for e in evs], "CPU events", "pid"),
            tid=self._ints([e.tid for e in evs], "CPU events", "tid"),
            ts=ts, dur=dur,
            external_id=self._ints([a.external_id for a in args], "CPU events", "External id"),
            input_dims=self._raw_ids(dims),
            input_types=self._raw_ids(types),
            call_stack=stacks,
            sequence=self._ints([a.sequence for a in args], "CPU events", "Sequence number"),
        )
        rows = np.arange(len(evs))
        if keep is not None:
            table = table.take(keep)
            rows = rows[keep]
        self._record_inputs(table, rows, lambda at: (list(map(dims.__getitem__, at)), list(map(types.__getitem__, at))),
                            lambda row: args[row].concrete_inputs)
        files = list(map(_KERNEL_FILE, args))  # Inductor launches only (few): one C-level pass
        if files.count(None) != len(files):
            self._add_kernel_launches(args, files, keep)
        self.cpu_rows += len(table)
        self._span(table.ts, table.ts + table.dur)
        self.cpu.append(table)

    def _record_inputs(self, table, rows: np.ndarray, texts_of, concrete) -> None:
        """The recorded inputs of ``table`` (a CPU block after its dropped rows; ``rows``:
        each kept row's index in the block) for the ops SHAPE_OP_MARKERS names:
        ``texts_of(block rows)`` their "Input Dims" and "Input type" texts (two lists of bytes,
        b"" when absent), ``concrete(block row)`` their "Concrete Inputs". Shared with the
        native decoding (native.py)."""
        # Shapes and dtypes only for the few ops the Tensor Core analysis reports: the
        # rows of those names, found per distinct name (not per row).
        picked = self._shape_op_rows(table.name)
        if not len(picked):
            return
        index = (picked + self.cpu_rows).tolist()
        at = rows[picked].tolist()
        dims, types = texts_of(at)
        # each distinct text decoded once (in the order the rows meet them), then the rows
        # that have one (a text is b"" when absent) keyed in one C-level pass per dict
        decoded = self._decoded
        value = {t: decoded(t) for t in dict.fromkeys(chain.from_iterable(zip(dims, types))) if t}.__getitem__
        self.op_inputs.dims.update(zip(compress(index, dims), map(value, compress(dims, dims))))
        self.op_inputs.types.update(zip(compress(index, types), map(value, compress(types, types))))
        p2p_ids = [self.strings[n] for n in P2P_OPS if n in self.strings]
        if p2p_ids:
            for local in np.flatnonzero(np.isin(table.name[picked], p2p_ids)).tolist():
                text = concrete(at[local])
                if len(text):
                    peer = _peer_of(decoded(text))
                    if peer is not None:
                        self.op_inputs.peers[index[local]] = peer

    def _shape_op_rows(self, names: np.ndarray) -> np.ndarray:
        """The rows of ``names`` (string ids) that SHAPE_OP_MARKERS matches; each name
        looked at once per builder (`_shape_flags`: 0 not yet, 1 no, 2 a shape op)."""
        flags = self._shape_flags
        if len(flags) < len(self.strings):
            grown = np.zeros(max(len(self.strings), 2 * len(flags)), np.int8)
            grown[:len(flags)] = flags
            flags = self._shape_flags = grown
        flag = flags[names]
        if not flag.all():  # names met first: only the table's tail from the lowest of them is listed
            unknown = np.unique(names[flag == 0]).tolist()
            low_id = unknown[0]
            tail = _last(self.strings, len(self.strings) - low_id)
            flags[unknown] = [2 if _SHAPE_OP_RE.search(tail[nid - low_id].lower()) else 1 for nid in unknown]
            flag = flags[names]
        return np.flatnonzero(flag == 2)

    def _add_kernel_launches(self, args: list, files: list, keep) -> None:
        """Kernel file/hash/backend of the events (of this block) that carry them, keyed by
        their row in the trace's CPU table; a non-string value was already made absent."""
        local = np.cumsum(keep) - 1 if keep is not None else None
        cache = self._launch_cache
        for row, f in enumerate(files):
            if f is None:
                continue
            if local is not None:
                if not keep[row]:
                    continue
                at = int(local[row])
            else:
                at = row
            a = args[row]
            key = (f or "", a.kernel_hash or "", a.kernel_backend or "")
            launch = cache.get(key)
            if launch is None:
                launch = cache[key] = model.KernelLaunch(*key)
            self.kernel_launches[self.cpu_rows + at] = launch

    def _add_memory(self, evs: List[Event]) -> None:
        if not evs:
            return
        ts = _float_col([e.ts for e in evs])
        keep = np.isfinite(ts)
        args = [e.args or _NO_ARGS for e in evs]
        rows = "[memory] events"
        table = model.MemoryTable(
            ts=ts,
            device_type=self._ints([a.device_type for a in args], rows, "Device Type", int32=True),
            device_id=self._ints([a.device_id for a in args], rows, "Device Id", int32=True),
            bytes=self._ints([a.mem_bytes for a in args], rows, "Bytes"),
            total_allocated=self._ints([a.total_allocated for a in args], rows, "Total Allocated", min_value=-1),
            total_reserved=self._ints([a.total_reserved for a in args], rows, "Total Reserved", min_value=-1),
            addr=self._ints([a.addr for a in args], rows, "Addr"),
            pid=_int_col([e.pid for e in evs]), tid=_int_col([e.tid for e in evs]),
        )
        if not keep.all():
            self.dropped_bad_ts += int((~keep).sum())
            table = table.take(keep)
        self._span(table.ts, table.ts)
        self.memory.append(table)

    def _add_annotations(self, evs: List[Event]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        args = [e.args or _NO_ARGS for e in evs]
        table = model.GpuAnnotationTable(
            name=self.intern([e.name for e in evs]), ts=ts, dur=dur,
            device=self._ints([a.device if a.device is not None else e.pid for a, e in zip(args, evs)],
                              "GPU annotations", "device", int32=True),
            stream=self._ints([a.stream if a.stream is not None else e.tid for a, e in zip(args, evs)],
                              "GPU annotations", "stream"),
        )
        if keep is not None:
            table = table.take(keep)
        self.annotations.append(table)

    def _add_collective_args(self, table, args: list, rows: np.ndarray, kind: np.ndarray) -> None:
        """Out msg nelems, Group size, Collective name, Process Group Name/Ranks and Seq
        of the kernels that carry collective metadata (``rows`` of ``table``)."""
        table.msg_out_nelems[rows] = self._ints([a.msg_out_nelems for a in args], "", "Out msg nelems", kind,
                                                min_value=-1)
        table.group_size[rows] = self._ints([a.group_size for a in args], "", "Group size", kind, min_value=-1)
        table.seq[rows] = self._ints([a.seq for a in args], "", "Seq", kind, min_value=-1)
        table.coll_name[rows] = self._optional_ids([a.coll_name for a in args])
        table.pg_name[rows] = self._optional_ids([a.pg_name for a in args])
        table.pg_ranks[rows] = self._raw_ids(self._raw_texts([a.pg_ranks for a in args]))

    def merge(self, other: "_Builder") -> None:
        """Append a chunk decoded elsewhere (another process, or a chunk builder of this
        one): remap its string ids. The first ``other._base`` strings are this builder's,
        with the same ids (this table only grows); the others are added in the order the
        chunk met them, exactly as if it had been decoded here. A chunk whose first
        ``_base`` ids are another table's (a decode worker's own) carries their ids here as
        ``_base_map``; the chunk's whole map is left on it as ``_base_map`` after the merge."""
        table = self.strings
        base = other._base
        new = other.added_strings()
        new_ids = [table.setdefault(s, len(table)) for s in new]
        base_map = getattr(other, "_base_map", None)
        if base_map is None and new_ids == list(range(base, base + len(new))):  # same ids here (the usual case)
            def ids(col):
                return col

            def optional_ids(col):
                return col

            def raw_id(i):
                return i
        else:
            remap = np.empty(base + len(new), dtype=np.int32)  # C passes, however large the table
            remap[:base] = np.arange(base) if base_map is None else base_map
            remap[base:] = new_ids
            other._base_map = remap
            if not len(remap):
                remap = np.zeros(1, np.int32)  # (no ids to map: only all -1 columns, if any)

            def ids(col):
                return remap[col] if len(col) else col

            def optional_ids(col):  # -1: none
                return np.where(col >= 0, remap[np.maximum(col, 0)], -1).astype(np.int32)

            def raw_id(i):
                return int(remap[i])
        # The recorded-input texts the chunk met first: known here from now on, as if it had been
        # decoded here; one this builder (an earlier chunk) knows already was counted again by the
        # chunk if it had to be repaired (_raw_ids counts a replacement once per distinct text).
        known = self._raw_id_cache
        for key, i in other.added_raw():
            if key in known:
                try:
                    str(key, "utf-8")
                except UnicodeDecodeError:
                    other.replaced_strings -= 1
            else:
                known[key] = raw_id(i)

        for t in other.gpu:
            t.name = ids(t.name)
            t.occupancy_limit = optional_ids(t.occupancy_limit)
            t.msg_dtype = optional_ids(t.msg_dtype)
            t.coll_name, t.pg_name, t.pg_ranks = (optional_ids(t.coll_name), optional_ids(t.pg_name),
                                                  optional_ids(t.pg_ranks))
            self.gpu.append(t)
        for t in other.cpu:
            t.name, t.category = ids(t.name), ids(t.category)
            t.input_dims, t.input_types = optional_ids(t.input_dims), optional_ids(t.input_types)
            t.call_stack = optional_ids(t.call_stack)
            self.cpu.append(t)
        for t in other.runtime:
            t.name = ids(t.name)
            self.runtime.append(t)
        for t in other.annotations:
            t.name = ids(t.name)
            self.annotations.append(t)
        self.memory.extend(other.memory)
        for row, dims in other.op_inputs.dims.items():
            self.op_inputs.dims[self.cpu_rows + row] = dims
        for row, types in other.op_inputs.types.items():
            self.op_inputs.types[self.cpu_rows + row] = types
        for row, peer in other.op_inputs.peers.items():
            self.op_inputs.peers[self.cpu_rows + row] = peer
        for row, launch in other.kernel_launches.items():
            self.kernel_launches[self.cpu_rows + row] = launch
        self.cpu_rows += other.cpu_rows
        for cat, n in other.category_counts.items():
            self.category_counts[cat] = self.category_counts.get(cat, 0) + n
        self.event_count += other.event_count
        self.first_ts = min(self.first_ts, other.first_ts)
        self.last_ts = max(self.last_ts, other.last_ts)
        self.profiler_first_ts = min(self.profiler_first_ts, getattr(other, "profiler_first_ts", float("inf")))
        self.profiler_last_ts = max(self.profiler_last_ts, getattr(other, "profiler_last_ts", float("-inf")))
        self.dropped_missing_dur += other.dropped_missing_dur
        self.dropped_bad_ts += other.dropped_bad_ts
        self.negative_dur += other.negative_dur
        for key, n in other.field_problems.items():
            self.note(*key, n=n)
        self.skipped_deep += other.skipped_deep
        self.skipped_not_object += other.skipped_not_object
        self.replaced_strings += getattr(other, "replaced_strings", 0)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_shape_flags"] = np.zeros(0, np.int8)
        state["_decoded_cache"] = {}
        state["_raw_id_cache"] = {b"": -1}
        state["_launch_cache"] = {}
        return state

    def finish(self, meta: model.TraceMeta) -> model.TraceData:
        meta.category_counts = self.category_counts
        meta.event_count = self.event_count
        if self.first_ts <= self.last_ts:
            meta.first_ts, meta.last_ts = self.first_ts, self.last_ts
        if self.profiler_first_ts <= self.profiler_last_ts:
            meta.profiler_start_ts, meta.profiler_end_ts = self.profiler_first_ts, self.profiler_last_ts
        if self.dropped_missing_dur:
            meta.warnings.append(f"{self.dropped_missing_dur} complete events without a usable 'dur' were ignored")
        if self.dropped_bad_ts:
            meta.warnings.append(f"{self.dropped_bad_ts} events without a usable 'ts' were ignored")
        if self.negative_dur:
            meta.warnings.append(f"{self.negative_dur} events with a negative 'dur' were counted as 0 µs")
        for (rows, field, problem), n in self.field_problems.items():
            meta.warnings.append(f"{n} {rows}: `{field}` {problem}"
                                 + ("" if "ignored" in problem else " (treated as absent)"))
        if self.skipped_deep:
            meta.warnings.append(f"{self.skipped_deep} events nested deeper than {sys.getrecursionlimit()} levels "
                                 "were skipped")
        if self.skipped_not_object:
            meta.warnings.append(f"{self.skipped_not_object} entries of traceEvents are not objects and were skipped")
        if self.replaced_strings:
            n = self.replaced_strings
            meta.warnings.append(f"{n} string{'s' if n != 1 else ''} held invalid UTF-8 or a lone UTF-16 surrogate "
                                 "(replaced by U+FFFD)")
        strings = list(self.strings)
        # the chunks' tables are consumed (this builder is done): one copy of each table at a time
        tables = {}
        for name, table_cls, attr in (("gpu", model.GpuTable, "gpu"), ("cpu", model.CpuTable, "cpu"),
                                      ("runtime", model.RuntimeTable, "runtime"),
                                      ("memory", model.MemoryTable, "memory"),
                                      ("gpu_annotations", model.GpuAnnotationTable, "annotations")):
            tables[name] = table_cls.concat(getattr(self, attr), consume=True)
            setattr(self, attr, [])
        return model.TraceData(meta=meta, strings=strings, **tables,
                               op_inputs=self.op_inputs, kernel_launches=self.kernel_launches)


_NO_DIM = (-1, -1, -1)
_KERNEL_FILE = attrgetter("kernel_file")


def _dims(values: list, bad: Optional[list] = None) -> np.ndarray:
    """(n, 3) int64 grid/block dims; a value that is not a list of 3 integers in int64
    (ROCm's -1 included as "unknown") becomes (-1, -1, -1), noted in ``bad``."""
    # Fast path (every clean trace): each value absent or 3 long, converted as one flat
    # list (a list of lists costs numpy ~4x more); anything else takes the path below.
    fixed = [_NO_DIM if v is None else v for v in values]
    if not fixed or set(map(len, fixed)) == {3}:
        try:
            flat = np.fromiter(chain.from_iterable(fixed), np.int64, 3 * len(fixed))
            if flat.shape == (3 * len(fixed),) and not (flat < -1).any():
                return flat.reshape(len(fixed), 3)
        except (TypeError, ValueError, OverflowError):
            pass
    fixed = []
    for row, v in enumerate(values):
        if v is None:
            fixed.append(_NO_DIM)
        elif len(v) == 3:
            fixed.append(v)
        else:
            fixed.append(_NO_DIM)
            if bad is not None:
                bad.append((row, "not a list of 3 ints"))
    try:
        out = np.array(fixed, dtype=np.int64)
        if out.shape == (len(fixed), 3) and not (out < -1).any():
            return out
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.empty((len(fixed), 3), dtype=np.int64)
    for row, v in enumerate(fixed):
        dims = [_checked_int(x) if not isinstance(x, str) or x.strip().lstrip("-").isdigit() else (-1, "text")
                for x in v]
        if all(p is None and x >= -1 for x, p in dims):
            out[row] = [x for x, _ in dims]
        else:
            out[row] = _NO_DIM
            if bad is not None:
                bad.append((row, "not a list of 3 ints"))
    return out


def _limiting_factors(occ) -> Optional[str]:
    if not occ:
        return None
    lf = occ.get("limitingFactors") or occ.get("limitingFactor")
    return str(lf) if lf else None
