"""A chunk of event JSON straight to columns through the optional C scanner (issue 39).

Part of the loader: `decode_into` is what every chunk goes through (in-process and in
decode workers). The C extension `_fastscan` (built by setup.py when a compiler is there)
reads the chunk into per-field value arrays without a Python object per event; this module
then builds exactly the blocks `_Builder.add` would from the msgspec events: the same
grouping by category, the same string ids in the same first-seen order (interning goes
through the builder's own `intern`/`_raw_ids`/`_optional_ids`, once per distinct text), the
same columns, recorded inputs, launches and counters. The last events of a trace object go
through `add_native_tail` (the events here, the top-level keys after them by msgspec).

Only the clean case is handled here. The scanner answers None for anything unusual in the
text (see _fastscan.c), and this module raises `_NotHandled`, before it changes the builder,
for values whose handling would warn or count a field problem (negative sizes, values beyond
int32, strings in float fields, ...): such a chunk goes the msgspec way (`events.
_decode_events` + `_Builder.add`) unchanged, so lenient decoding and its warnings live in
one place. TB_BOTTLENECKS_NATIVE_DECODE=0 turns this path off.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import List

import numpy as np

from . import model
from .columns import _CPU_KIND, _GPU_ANNOTATION, _GPU_KIND, _NOT_HOST, _RUNTIME
from .events import _checked_int, _decode_events

try:
    from . import _fastscan
except ImportError:  # no compiler at install time: the msgspec way only
    _fastscan = None

# Field order of the scanner's result (EVENT_FIELDS then ARGS_FIELDS in _fastscan.c).
(PH, CAT, NAME, PID, TID, TS, DUR, ARGS,
 DEVICE, STREAM, CORRELATION, EXT, EXT_OLD, REGISTERS, SHARED_MEMORY, BLOCKS_PER_SM, WARPS_PER_SM,
 OCCUPANCY_PCT, BYTES, SIZE, DEVICE_TYPE, DEVICE_ID, MEM_BYTES, TOTAL_ALLOCATED, TOTAL_RESERVED, ADDR,
 IN_NELEMS, OUT_NELEMS, GROUP_SIZE, PG_NAME, SEQ, SEQUENCE,
 DTYPE, COLL_NAME, KERNEL_FILE, KERNEL_HASH, KERNEL_BACKEND,
 PG_RANKS, INPUT_DIMS, INPUT_DIMS_2020, INPUT_TYPE, CONCRETE, CALL_STACK,
 GRID, BLOCK, OCCUPANCY) = range(46)
NF = 46
LAYOUT = 4  # of the result; _fastscan.c says which it writes
# value kinds
K_ABSENT, K_NULL, K_INT, K_FLOAT, K_STR, K_RAW, K_LIST3, K_OBJECT = range(8)
_ONLY_INT, _ONLY_FLOAT, _ONLY_STR = 1 << K_INT, 1 << K_FLOAT, 1 << K_STR  # a `seen` of one kind
_FLOAT_OR_STR = (1 << K_FLOAT) | (1 << K_STR)
if _fastscan is not None and (getattr(_fastscan, "NF", None), getattr(_fastscan, "LAYOUT", None)) != (NF, LAYOUT):
    _fastscan = None  # a build of another version of _fastscan.c: not used

# chunks decoded each way in this process (tests: the scanner is really used)
stats = {"native": 0, "fallback": 0}


def available() -> bool:
    """The scanner is built and not switched off (TB_BOTTLENECKS_NATIVE_DECODE=0)."""
    return _fastscan is not None and os.environ.get("TB_BOTTLENECKS_NATIVE_DECODE", "").strip() != "0"


def decode_into(payload, builder) -> None:
    """The events of one chunk (JSON array text) into ``builder``: natively when the chunk
    is the clean case, else `_decode_events` + `_Builder.add`, as before."""
    if not add_native(payload, builder):
        builder.add(_decode_events(payload, builder))


class _NotHandled(Exception):
    pass


def add_native(payload, builder) -> bool:
    """`builder.add(_decode_events(payload, builder))` without per-event objects; False
    (the builder untouched) when the chunk is not the clean case."""
    if not available():
        return False
    result = _fastscan.scan(payload)
    if result is None:
        stats["fallback"] += 1
        return False
    try:
        chunk = _Chunk(result)
        plan = chunk.plan()
    except _NotHandled:
        stats["fallback"] += 1
        return False
    plan(builder)
    stats["native"] += 1
    return True


def add_native_tail(payload, builder, decode_trailer) -> bool:
    """The rest of a trace object from its last chunk of events on (``[``, events, ``]``,
    then its trailer: more top-level keys and the closing ``}``) as the loader's
    `_decode_object` of the whole + `builder.add` would: the events natively and
    ``decode_trailer(text after the array)`` the keys, in that object's order (keys, then
    events); False (nothing done) when the events are not the clean case or the trailer
    might hold another traceEvents key (as it is or escaped)."""
    if not available():
        return False
    result = _fastscan.scan(payload, True)
    if result is None:
        stats["fallback"] += 1
        return False
    try:
        chunk = _Chunk(result)
        trailer = bytes(payload[chunk.end:])
        if b"traceEvents" in trailer or b"\\u" in trailer:
            raise _NotHandled
        plan = chunk.plan()
    except _NotHandled:
        stats["fallback"] += 1
        return False
    decode_trailer(trailer)
    plan(builder)
    stats["native"] += 1
    return True


def _first_seen(local: np.ndarray, size: int) -> np.ndarray:
    """The distinct ids >= 0 of ``local`` (each < size) in the order they first occur."""
    return np.frombuffer(_fastscan.first_seen(np.ascontiguousarray(local, np.int64), size), np.int64)


def _mapped(local: np.ndarray, order: np.ndarray, ids: np.ndarray, size: int) -> np.ndarray:
    """``local`` (ids < size, -1 absent) through order -> ids; -1 stays -1."""
    lut = np.full(size + 1, -1, np.int32)
    lut[order] = ids
    return lut[local]


class _Chunk:
    def __init__(self, result):
        n, kinds, values, dims, texts, seen, self.end = result
        self.n = n
        self.kinds = np.frombuffer(kinds, np.uint8).reshape(NF, n)  # field-major
        self._values = values  # per field: one int64 per event (-1: absent or null), or b""
        self._dense = {}
        # per field: the kinds its events have, as bits (1 << K_INT: an int in every event)
        self.seen = list(seen)
        self.present = [k & ~1 != 0 for k in self.seen]  # some event has the field
        self.dims = np.frombuffer(dims, np.int64).reshape(n, 6)
        self.texts: List[bytes] = texts
        # ids past the texts: an absent name ("") and a null one (None, interned as "None")
        self.size = len(texts) + 2
        self._strs = {len(texts): "", len(texts) + 1: "None"}
        self._numeric_strings = {}

    def value(self, field: int) -> np.ndarray:
        """The field's int64 values, one per event (-1 where absent or null; read-only)."""
        dense = self._dense.get(field)
        if dense is None:
            dense = self._dense[field] = (np.frombuffer(self._values[field], np.int64) if self.present[field]
                                          else np.full(self.n, -1, np.int64))
        return dense

    def str(self, i: int) -> str:
        """Text ``i`` as a string (valid UTF-8: checked by the scanner)."""
        s = self._strs.get(i)
        if s is None:
            s = self._strs[i] = self.texts[i].decode("utf-8")
        return s

    # ------------------------------------------------------------------ columns
    def str_ids(self, field: int, rows) -> np.ndarray:
        """Text ids of a string/raw field (-1: absent or null): its values, as such a field
        holds nothing else."""
        if not self.present[field]:
            return np.full(len(rows), -1, np.int64)
        return self.value(field)[rows]

    def floats(self, field: int, rows, nonnegative: bool = False) -> np.ndarray:
        """`columns._float_col` of a numeric field (NaN: absent or null)."""
        if not self.present[field]:
            return np.full(len(rows), np.nan)
        seen = self.seen[field]
        v = self.value(field)[rows]
        if seen == _ONLY_FLOAT:
            out = v.view(np.float64)
        elif seen == _ONLY_INT:
            out = v.astype(np.float64)
        else:
            k = self.kinds[field][rows]
            if seen & _ONLY_STR and (k == K_STR).any():
                raise _NotHandled
            out = np.where(k == K_INT, v.astype(np.float64), np.where(k == K_FLOAT, v.view(np.float64), np.nan))
        if nonnegative and (out < 0).any():  # `_Builder._floats` would count them
            raise _NotHandled
        return out

    def ints(self, rows, *fields, min_value=None, int32: bool = False) -> np.ndarray:
        """`_Builder._ints` / `columns._int_col` of the first present of ``fields`` (as the
        builder's ``a.x if a.x is not None else ...``), without anything to count."""
        fields = [f for f in fields if self.present[f]]
        if not fields:
            return np.full(len(rows), -1, np.int32 if int32 else np.int64)
        seen = self.seen[fields[0]]
        out = self.value(fields[0])[rows]  # -1 where absent or null (a copy)
        k = None
        if seen != _ONLY_INT and len(fields) > 1:  # the next field where this one is absent or null
            k = self.kinds[fields[0]][rows]
            for field in fields[1:]:
                none = k <= K_NULL
                if none.any():
                    k = np.where(none, self.kinds[field][rows], k)
                    out = np.where(none, self.value(field)[rows], out)
                    seen |= self.seen[field]
        is_str = None
        if seen & _FLOAT_OR_STR:  # floats or strings in the chunk: in these rows?
            if k is None:
                k = self.kinds[fields[0]][rows]
            if (k == K_FLOAT).any():
                raise _NotHandled
            is_str = k == K_STR
        if is_str is not None and is_str.any():
            v = out
            local = v[is_str]
            texts = _first_seen(local, self.size).tolist()
            numpy_values = [self._numpy_int(t) for t in texts]
            if all(x is not None for x in numpy_values):  # np.fromiter takes the whole column
                mapped = numpy_values
            else:  # value by value (_checked_int)
                mapped = []
                for t in texts:
                    x, problem = _checked_int(self.str(t))
                    if problem:
                        raise _NotHandled
                    mapped.append(x)
            lut = np.zeros(self.size, np.int64)
            lut[texts] = mapped
            out[is_str] = lut[local]
        if min_value is not None and (out < min_value).any():
            raise _NotHandled
        if int32:
            if ((out < -(1 << 31)) | (out >= (1 << 31))).any():
                raise _NotHandled
            return out.astype(np.int32)
        return out

    def _numpy_int(self, t: int):
        """What np.fromiter makes of the string (None: it raises)."""
        cache = self._numeric_strings
        if t not in cache:
            try:
                cache[t] = int(np.fromiter([self.str(t)], np.int64, 1)[0])
            except (TypeError, ValueError, OverflowError):
                cache[t] = None
        return cache[t]

    def times(self, rows):
        """`_Builder._times`: (ts, dur, keep, counters)."""
        ts = self.floats(TS, rows)
        dur = self.floats(DUR, rows)
        with np.errstate(over="ignore", invalid="ignore"):
            finite = np.isfinite(ts + dur).all()
        if finite:  # (every ts and dur finite, no end beyond float64): the usual chunk
            neg = dur < 0
            if neg.any():
                return ts, np.where(neg, 0.0, dur), None, [0, 0, int(neg.sum())]
            return ts, dur, None, [0, 0, 0]
        bad_ts = ~np.isfinite(ts)
        bad_dur = ~np.isfinite(dur)
        keep = None
        counts = [0, 0, 0]  # dropped_bad_ts, dropped_missing_dur, negative_dur
        if bad_ts.any() or bad_dur.any():
            counts[0] = int(bad_ts.sum())
            counts[1] = int((bad_dur & ~bad_ts).sum())
            keep = ~(bad_ts | bad_dur)
        neg = dur < 0
        if neg.any():
            counts[2] = int(neg.sum())
            dur = np.where(neg, 0.0, dur)
        with np.errstate(over="ignore", invalid="ignore"):
            overflow = ~np.isfinite(ts + dur) & np.isfinite(ts) & np.isfinite(dur)
        if overflow.any():  # a field problem the builder notes
            raise _NotHandled
        return ts, dur, keep, counts

    # ------------------------------------------------------------------ the chunk
    def plan(self):
        """Everything that may turn out unusual, computed; returns the function that adds
        the blocks to a builder (interning in `_Builder.add`'s order), which cannot fail."""
        n = self.n
        kinds = self.kinds
        empty, none = len(self.texts), len(self.texts) + 1  # name absent: "", null: None ("None")
        nk = kinds[NAME]
        name = (self.value(NAME) if self.seen[NAME] == _ONLY_STR
                else np.where(nk == K_STR, self.value(NAME), np.where(nk == K_ABSENT, empty, none)))
        # (a string field's value is its text's id, -1 where absent or null: no kinds to look at)
        x_id = self._index(b"X")
        memory_id = self._index(b"[memory]")
        is_x = self.value(PH) == x_id
        if memory_id >= 0:
            is_memory = self.value(NAME) == memory_id
            complete = np.flatnonzero(is_x & ~is_memory)
            memory_rows = np.flatnonzero(is_memory)
        else:
            complete = np.flatnonzero(is_x)
            memory_rows = complete[:0]
        cat = self.str_ids(CAT, complete)

        gpu, gpu_kind, runtime, driver, cpu, cpu_kind, cpu_cats, annotations = [], [], [], [], [], [], [], []
        counts = []  # (category key, events) in first-seen order
        profiler = []
        # buckets in first-seen order, the absent/null category (None) among them (as id `empty`)
        cat = np.where(cat < 0, empty, cat)
        order = _first_seen(cat, self.size)
        for c in order.tolist():
            rows = complete[cat == c] if len(order) > 1 else complete
            value = None if c == empty else self.str(c)
            key = value if value is not None else ""
            counts.append((key, len(rows)))
            low = value.lower() if value is not None else None
            if low in _GPU_KIND:
                gpu.append(rows)
                gpu_kind.append(np.full(len(rows), _GPU_KIND[low], np.int8))
            elif low in _RUNTIME:
                runtime.append(rows)
                driver.append(np.full(len(rows), _RUNTIME[low], np.bool_))
            elif low in _GPU_ANNOTATION or (low is not None and low.startswith("gpu_user")):
                annotations.append(rows)
            elif low in _NOT_HOST:
                if low == "trace":
                    profiler.append(rows)
            else:
                cpu.append(rows)
                cpu_kind.append(np.full(len(rows), _CPU_KIND.get(low, model.CPU_OTHER), np.int8))
                cpu_cats.append(("" if value is None else value, len(rows)))

        def cat_rows(parts):
            return np.concatenate(parts) if parts else np.empty(0, np.int64)

        gpu_step = self._gpu(cat_rows(gpu), cat_rows(gpu_kind).astype(np.int8), name)
        runtime_step = self._runtime(cat_rows(runtime), cat_rows(driver).astype(np.bool_), name)
        cpu_step = self._cpu(cat_rows(cpu), cat_rows(cpu_kind).astype(np.int8), cpu_cats, name)
        memory_step = self._memory(memory_rows)
        annotation_step = self._annotations(cat_rows(annotations), name)
        spans = []
        for rows in profiler:
            ts, dur = self.floats(TS, rows), self.floats(DUR, rows)
            ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
            if ok.any():
                spans.append((float(ts[ok].min()), float((ts[ok] + dur[ok]).max())))

        def apply(builder) -> None:
            builder.event_count += n
            totals = builder.category_counts
            for key, k in counts:
                totals[key] = totals.get(key, 0) + k
            if len(memory_rows):
                totals["[memory]"] = totals.get("[memory]", 0) + len(memory_rows)
            for first, last in spans:
                builder.profiler_first_ts = min(builder.profiler_first_ts, first)
                builder.profiler_last_ts = max(builder.profiler_last_ts, last)
            for step in (gpu_step, runtime_step, cpu_step, memory_step, annotation_step):
                if step is not None:
                    step(builder)

        return apply

    def _index(self, text: bytes) -> int:
        try:
            return self.texts.index(text)
        except ValueError:
            return -2

    # ------------------------------------------------------------------ blocks
    def _names(self, builder, name: np.ndarray, rows) -> np.ndarray:
        """`builder.intern` of the rows' names, each distinct name once in first-seen order."""
        local = name[rows]
        order = _first_seen(local, self.size)
        ids = builder.intern(list(map(self.str, order.tolist())))
        return _mapped(local, order, ids, self.size)

    def _raw_ids(self, builder, local: np.ndarray) -> np.ndarray:
        """`builder._raw_ids` of raw texts (-1 absent), each distinct text once."""
        order = _first_seen(local, self.size)
        if not len(order):
            return np.full(len(local), -1, np.int32)
        ids = builder._raw_ids(list(map(self.texts.__getitem__, order.tolist())))
        return _mapped(local, order, ids, self.size)

    def _optional_ids(self, builder, local: np.ndarray) -> np.ndarray:
        order = _first_seen(local, self.size)
        if not len(order):
            return np.full(len(local), -1, np.int32)
        ids = builder._optional_ids(list(map(self.str, order.tolist())))
        return _mapped(local, order, ids, self.size)

    @staticmethod
    def _counted(builder, counts) -> None:
        builder.dropped_bad_ts += counts[0]
        builder.dropped_missing_dur += counts[1]
        builder.negative_dur += counts[2]

    def _kept(self, builder, table, keep, counts):
        """The table's rows with usable times (`times`), the dropped ones counted on the builder."""
        self._counted(builder, counts)
        return table if keep is None else table.take(keep)

    def _gpu(self, rows, kind, name):
        if not len(rows):
            return None
        ts, dur, keep, counts = self.times(rows)
        if (self.kinds[OCCUPANCY][rows] > K_NULL).any():  # the scanner takes null only
            raise _NotHandled
        dims = self.dims[rows]
        coll = np.flatnonzero(self.kinds[IN_NELEMS][rows] > K_NULL)
        columns = dict(
            kind=kind, ts=ts, dur=dur,
            device=self.ints(rows, DEVICE, PID, int32=True),
            stream=self.ints(rows, STREAM, TID),
            correlation=self.ints(rows, CORRELATION),
            external_id=self.ints(rows, EXT, EXT_OLD),
            grid_x=dims[:, 0], grid_y=dims[:, 1], grid_z=dims[:, 2],
            block_x=dims[:, 3], block_y=dims[:, 4], block_z=dims[:, 5],
            registers_per_thread=self.ints(rows, REGISTERS, min_value=-1),
            shared_memory=self.ints(rows, SHARED_MEMORY, min_value=-1),
            blocks_per_sm=self.floats(BLOCKS_PER_SM, rows, nonnegative=True),
            warps_per_sm=self.floats(WARPS_PER_SM, rows, nonnegative=True),
            achieved_occupancy_pct=self.floats(OCCUPANCY_PCT, rows, nonnegative=True),
            occupancy_limit=np.full(len(rows), -1, np.int32),
            bytes=self.ints(rows, BYTES, SIZE, min_value=-1),
            msg_nelems=self.ints(rows, IN_NELEMS, min_value=-1),
        )
        dtype_local = self.str_ids(DTYPE, rows)
        collective = None
        if len(coll):
            crow = rows[coll]
            pg_kind = self.kinds[PG_NAME][crow]
            if (pg_kind == K_FLOAT).any():
                raise _NotHandled
            pg_name = [None if k <= K_NULL else self.str(v) if k == K_STR else str(v)
                       for k, v in zip(pg_kind.tolist(), self.value(PG_NAME)[crow].tolist())]
            collective = dict(
                msg_out_nelems=self.ints(crow, OUT_NELEMS, min_value=-1),
                group_size=self.ints(crow, GROUP_SIZE, min_value=-1),
                seq=self.ints(crow, SEQ, min_value=-1),
                coll_name=self.str_ids(COLL_NAME, crow), pg_name=pg_name, pg_ranks=self.str_ids(PG_RANKS, crow))

        def step(builder):
            table = model.GpuTable(name=self._names(builder, name, rows),
                                   msg_dtype=self._optional_ids(builder, dtype_local), **columns)
            if collective is not None:
                table.msg_out_nelems[coll] = collective["msg_out_nelems"]
                table.group_size[coll] = collective["group_size"]
                table.seq[coll] = collective["seq"]
                table.coll_name[coll] = self._optional_ids(builder, collective["coll_name"])
                table.pg_name[coll] = builder._optional_ids(collective["pg_name"])
                table.pg_ranks[coll] = self._raw_ids(builder, collective["pg_ranks"])
            table = self._kept(builder, table, keep, counts)
            builder._span(table.ts, table.ts + table.dur)
            builder.gpu.append(table)

        return step

    def _runtime(self, rows, driver, name):
        if not len(rows):
            return None
        ts, dur, keep, counts = self.times(rows)
        columns = dict(
            pid=self.ints(rows, PID), tid=self.ints(rows, TID), ts=ts, dur=dur,
            correlation=self.ints(rows, CORRELATION), external_id=self.ints(rows, EXT, EXT_OLD),
            is_driver=driver)

        def step(builder):
            table = model.RuntimeTable(name=self._names(builder, name, rows), **columns)
            table = self._kept(builder, table, keep, counts)
            builder._span(table.ts, table.ts + table.dur)
            builder.runtime.append(table)

        return step

    def _cpu(self, rows, kind, cat_runs, name):
        if not len(rows):
            return None
        ts, dur, keep, counts = self.times(rows)
        columns = dict(
            kind=kind, pid=self.ints(rows, PID), tid=self.ints(rows, TID), ts=ts, dur=dur,
            external_id=self.ints(rows, EXT), sequence=self.ints(rows, SEQUENCE))
        dims = self.str_ids(INPUT_DIMS, rows)
        dims = np.where(dims >= 0, dims, self.str_ids(INPUT_DIMS_2020, rows))
        types = self.str_ids(INPUT_TYPE, rows)
        stacks = self.str_ids(CALL_STACK, rows)
        concrete = self.str_ids(CONCRETE, rows)
        files = self.str_ids(KERNEL_FILE, rows)
        texts = self.texts + [b""]  # [-1]: absent

        def texts_of(at: list):
            return (list(map(texts.__getitem__, dims[at].tolist())),
                    list(map(texts.__getitem__, types[at].tolist())))

        def concrete_of(row: int) -> bytes:
            return texts[concrete[row]]

        def step(builder):
            names = self._names(builder, name, rows)
            cats = np.repeat(builder.intern([c for c, _ in cat_runs]), [k for _, k in cat_runs])
            call_stack = self._raw_ids(builder, stacks)  # before the inputs, as `_add_cpu` interns
            table = model.CpuTable(category=cats, name=names, input_dims=self._raw_ids(builder, dims),
                                   input_types=self._raw_ids(builder, types), call_stack=call_stack, **columns)
            index = np.arange(len(rows))
            if keep is not None:
                table = table.take(keep)
                index = index[keep]
            builder._record_inputs(table, index, texts_of, concrete_of)
            if (files >= 0).any():
                self._launches(builder, rows, files, keep)
            builder.cpu_rows += len(table)
            builder._span(table.ts, table.ts + table.dur)
            self._counted(builder, counts)
            builder.cpu.append(table)

        return step

    def _launches(self, builder, rows, files, keep) -> None:
        """`_Builder._add_kernel_launches` of the block's Inductor launches."""
        file_list = [None if f < 0 else self.str(f) for f in files.tolist()]
        hashes = self.str_ids(KERNEL_HASH, rows).tolist()
        backends = self.str_ids(KERNEL_BACKEND, rows).tolist()

        class _Args:
            def __getitem__(_, row):
                return SimpleNamespace(kernel_hash=None if hashes[row] < 0 else self.str(hashes[row]),
                                       kernel_backend=None if backends[row] < 0 else self.str(backends[row]))

        builder._add_kernel_launches(_Args(), file_list, keep)

    def _memory(self, rows):
        if not len(rows):
            return None
        ts = self.floats(TS, rows)
        keep = np.isfinite(ts)
        table = model.MemoryTable(
            ts=ts,
            device_type=self.ints(rows, DEVICE_TYPE, int32=True),
            device_id=self.ints(rows, DEVICE_ID, int32=True),
            bytes=self.ints(rows, MEM_BYTES),
            total_allocated=self.ints(rows, TOTAL_ALLOCATED, min_value=-1),
            total_reserved=self.ints(rows, TOTAL_RESERVED, min_value=-1),
            addr=self.ints(rows, ADDR),
            pid=self.ints(rows, PID), tid=self.ints(rows, TID),
        )
        dropped = int((~keep).sum())

        def step(builder):
            t = table
            if not keep.all():
                builder.dropped_bad_ts += dropped
                t = t.take(keep)
            builder._span(t.ts, t.ts)
            builder.memory.append(t)

        return step

    def _annotations(self, rows, name):
        if not len(rows):
            return None
        ts, dur, keep, counts = self.times(rows)
        device = self.ints(rows, DEVICE, PID, int32=True)
        stream = self.ints(rows, STREAM, TID)

        def step(builder):
            table = model.GpuAnnotationTable(name=self._names(builder, name, rows), ts=ts, dur=dur,
                                             device=device, stream=stream)
            builder.annotations.append(self._kept(builder, table, keep, counts))

        return step
