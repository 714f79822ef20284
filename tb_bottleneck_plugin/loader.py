"""Streaming, typed decoding of one PyTorch/Kineto trace file into `model.TraceData`.

Why it is built this way:
- Traces reach several GB of JSON. Decoding them whole into dicts costs minutes and
  gigabytes (torch-tb-profiler needs ~1.5 GB for a 300 MB file). Here the decompressed
  text is cut into chunks of whole events, each chunk is decoded with msgspec into
  small typed Structs that name only the fields the analyses use (msgspec skips the
  rest without allocating), turned into numpy columns, and dropped. Peak memory is one
  chunk plus the columns.
- Decompression runs in a background thread (zlib releases the GIL), so it overlaps
  with decoding on the second core.
- Kineto writes the `traceEvents` array between a header and (before 2025-03) a
  trailer of top-level keys. Both are decoded by wrapping the text so that it is
  valid JSON again: ``header + '"traceEvents":[]}'`` and ``'{"traceEvents":[' + tail``.
- If chunking fails for any reason (an unusual layout, a name containing ``}, {``),
  the file is decoded in one piece, which is always correct, only slower.

Every failure becomes a `TraceError` naming the file and the problem.
"""
from __future__ import annotations

import collections
import os
import queue
import re
import threading
import zlib
from typing import Any, Dict, Iterator, List, Optional, Union

import msgspec
import numpy as np

from . import model
from .errors import NotATraceError, TraceError, TruncatedTraceError

CHUNK_BYTES = 8 << 20  # decoded text per chunk: big enough to amortise, small for memory
_READ_BYTES = 256 << 10  # compressed bytes per read (~4 MB of text; the prefetch queue holds 4)

# CPU op names whose recorded input shapes/dtypes the Tensor Core analysis reports
# ("eligible but not using", metrics §5). Matched as substrings of the op name.
SHAPE_OP_MARKERS = (
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "conv", "aten::einsum", "scaled_dot_product", "flash_attention", "efficient_attention",
    "lstm", "gru", "rnn",
    # collective spans (nccl:all_reduce, gloo:broadcast, ...): their input size is the
    # collective's bytes in the rank view (metrics §12)
    "nccl:", "gloo:", "rccl:",
)

Num = Union[int, float, str, None]


_EMPTY_RAW = msgspec.Raw()


class Args(msgspec.Struct, omit_defaults=True):
    """The event args the analyses read. Unknown keys are skipped by the decoder."""

    device: Num = None
    stream: Num = None
    correlation: Num = None
    external_id: Num = msgspec.field(default=None, name="External id")
    external_id_old: Num = msgspec.field(default=None, name="external id")
    registers: Num = msgspec.field(default=None, name="registers per thread")
    shared_memory: Num = msgspec.field(default=None, name="shared memory")
    grid: Optional[List[Any]] = None
    block: Optional[List[Any]] = None
    blocks_per_sm: Num = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Num = msgspec.field(default=None, name="warps per SM")
    occupancy_pct: Num = msgspec.field(default=None, name="est. achieved occupancy %")
    occupancy: Optional[Dict[str, Any]] = None  # nested 2026 object with limitingFactors
    bytes: Num = None  # memcpy/memset size
    size: Num = None  # ROCm runtime args
    device_type: Num = msgspec.field(default=None, name="Device Type")
    device_id: Num = msgspec.field(default=None, name="Device Id")
    mem_bytes: Num = msgspec.field(default=None, name="Bytes")
    total_allocated: Num = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Num = msgspec.field(default=None, name="Total Reserved")
    addr: Num = msgspec.field(default=None, name="Addr")
    # Raw: left undecoded (a view, no objects) unless the op is one SHAPE_OP_MARKERS names.
    input_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    input_dims_2020: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")


_NO_ARGS = Args()


class Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Num = None
    dur: Num = None
    args: Optional[Args] = None


class TraceObject(msgspec.Struct):
    """Top-level keys of a trace object (header and trailer around traceEvents)."""

    traceEvents: Optional[List[Event]] = None
    schemaVersion: Any = None
    deviceProperties: Optional[List[Dict[str, Any]]] = None
    distributedInfo: Optional[Dict[str, Any]] = None
    baseTimeNanoseconds: Num = None
    displayTimeUnit: Any = None
    traceName: Any = None
    profile_memory: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_EVENTS_DECODER = msgspec.json.Decoder(List[Event])
_OBJECT_DECODER = msgspec.json.Decoder(TraceObject)

# Raw (lower-cased) categories -> what the event is. See trace-format.md §4.
_GPU_KIND = {"kernel": model.GPU_KERNEL, "gpu_memcpy": model.GPU_MEMCPY, "memcpy": model.GPU_MEMCPY,
             "gpu_memset": model.GPU_MEMSET, "memset": model.GPU_MEMSET}
_RUNTIME = {"cuda_runtime": False, "runtime": False, "cuda_driver": True}
_CPU_KIND = {"cpu_op": model.CPU_OP, "operator": model.CPU_OP, None: model.CPU_OP,
             "user_annotation": model.CPU_USER_ANNOTATION,
             "python_function": model.CPU_PYTHON, "python": model.CPU_OP}
_GPU_ANNOTATION = {"gpu_user_annotation", "user"}
_NOT_HOST = {"trace", "flow", "overhead"}  # synthetic spans, CUPTI overhead (pid -1)

# Between two events: `}` `,` `{` then a key's opening quote. Inside a JSON string a
# quote is always escaped, so `{"` cannot occur there: the match is a real boundary
# (only an array of objects inside args could fake one; then decoding fails and the
# whole-file path takes over).
_EVENT_BOUNDARY = re.compile(rb'\}\s*,\s*(\{)\s*"')
_STREAM_NUM = re.compile(r"-?\d+")


# --------------------------------------------------------------------------- reading


def _decompressed_blocks(stream, path: str, gzipped: bool) -> Iterator[bytes]:
    """Yield the file's text in blocks, gunzipping on the fly (multi-member aware)."""
    if not gzipped:
        while True:
            block = stream.read(_READ_BYTES * 16)
            if not block:
                return
            yield block
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    fresh = True  # the current gzip member has not consumed any input yet
    while True:
        raw = stream.read(_READ_BYTES)
        if not raw:
            break
        while raw:
            try:
                out = inflater.decompress(raw)
            except zlib.error as exc:
                raise TraceError(path, f"not a valid gzip file ({exc})") from None
            fresh = False
            if out:
                yield out
            if inflater.eof:  # a member ended; another may follow (concatenated gzip)
                raw = inflater.unused_data.lstrip(b"\x00")
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                fresh = True
            else:
                raw = b""
    if not fresh and not inflater.eof:
        raise TruncatedTraceError(path, "gzip stream ends early (file truncated or still being written)")


class _Prefetcher:
    """Runs a block iterator in a background thread, a few blocks ahead."""

    _END = object()

    def __init__(self, blocks: Iterator[bytes], depth: int = 4):
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(blocks,), daemon=True,
                                        name="tb-bottlenecks-gunzip")
        self._thread.start()

    def _run(self, blocks):
        try:
            for block in blocks:
                if self._stop.is_set():
                    return
                self._queue.put(block)
            self._queue.put(self._END)
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._queue.put(exc)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self):
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break


# --------------------------------------------------------------------------- columns


def _float_col(values: list) -> np.ndarray:
    try:
        return np.array(values, dtype=np.float64)
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


def _int_col(values: list) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_to_int(v) for v in values], dtype=np.int64)


def _to_int(v) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 63) else -1
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9e18 else -1
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s, 16) if s.lower().startswith("0x") else int(s)
        except ValueError:
            m = _STREAM_NUM.search(s)  # "stream 7", "stream 7 annotations"
            return int(m.group()) if m else -1
    return -1


class _Builder:
    """Accumulates per-chunk column blocks and the string table."""

    def __init__(self, path: str):
        self.path = path
        self.strings: Dict[str, int] = {}
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
        self.dropped_missing_dur = 0
        self.dropped_bad_ts = 0
        self.negative_dur = 0
        self._shape_name_cache: Dict[int, bool] = {}

    def intern(self, names: list) -> np.ndarray:
        table = self.strings
        return np.array([table.setdefault(n if isinstance(n, str) else str(n), len(table)) for n in names],
                        dtype=np.int32)

    def add(self, events: List[Event]) -> None:
        self.event_count += len(events)
        by_cat: Dict[Any, List[Event]] = {}
        memory: List[Event] = []
        for e in events:
            if e.ph == "X":
                if e.name == "[memory]":
                    memory.append(e)
                else:
                    lst = by_cat.get(e.cat)
                    if lst is None:
                        by_cat[e.cat] = [e]
                    else:
                        lst.append(e)
            elif e.name == "[memory]":
                memory.append(e)
        gpu: List[Event] = []
        gpu_kind: List[int] = []
        runtime: List[Event] = []
        driver: List[bool] = []
        cpu: List[Event] = []
        cpu_kind: List[int] = []
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
                    continue
            else:
                cpu += evs
                cpu_kind += [_CPU_KIND.get(low, model.CPU_OTHER)] * len(evs)
        if memory:
            counts["[memory]"] = counts.get("[memory]", 0) + len(memory)
        self._add_gpu(gpu, gpu_kind)
        self._add_runtime(runtime, driver)
        self._add_cpu(cpu, cpu_kind)
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
        return ts, dur, keep

    def _span(self, ts: np.ndarray, end: np.ndarray):
        if len(ts):
            self.first_ts = min(self.first_ts, float(ts.min()))
            self.last_ts = max(self.last_ts, float(end.max()))

    def _add_gpu(self, evs: List[Event], kinds: List[int]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        args = [e.args or _NO_ARGS for e in evs]
        device = [a.device for a in args]
        if any(d is None for d in device):
            device = [a.device if a.device is not None else e.pid for a, e in zip(args, evs)]
        stream = [a.stream for a in args]
        if any(s is None for s in stream):
            stream = [a.stream if a.stream is not None else e.tid for a, e in zip(args, evs)]
        ext = [a.external_id if a.external_id is not None else a.external_id_old for a in args]
        grid = _dims([a.grid for a in args])
        block = _dims([a.block for a in args])
        limits = [_limiting_factors(a.occupancy) for a in args]
        table = model.GpuTable(
            kind=np.array(kinds, dtype=np.int8),
            name=self.intern([e.name for e in evs]),
            ts=ts, dur=dur,
            device=_int_col(device).astype(np.int32),
            stream=_int_col(stream),
            correlation=_int_col([a.correlation for a in args]),
            external_id=_int_col(ext),
            grid_x=grid[:, 0], grid_y=grid[:, 1], grid_z=grid[:, 2],
            block_x=block[:, 0], block_y=block[:, 1], block_z=block[:, 2],
            registers_per_thread=_int_col([a.registers for a in args]),
            shared_memory=_int_col([a.shared_memory for a in args]),
            blocks_per_sm=_float_col([a.blocks_per_sm for a in args]),
            warps_per_sm=_float_col([a.warps_per_sm for a in args]),
            achieved_occupancy_pct=_float_col([a.occupancy_pct for a in args]),
            occupancy_limit=np.array([-1 if x is None else self.strings.setdefault(x, len(self.strings))
                                      for x in limits], dtype=np.int32),
            bytes=_int_col([a.bytes if a.bytes is not None else a.size for a in args]),
        )
        if keep is not None:
            table = table.take(keep)
        self._span(table.ts, table.ts + table.dur)
        self.gpu.append(table)

    def _add_runtime(self, evs: List[Event], driver: List[bool]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        args = [e.args or _NO_ARGS for e in evs]
        table = model.RuntimeTable(
            name=self.intern([e.name for e in evs]),
            pid=_int_col([e.pid for e in evs]), tid=_int_col([e.tid for e in evs]),
            ts=ts, dur=dur,
            correlation=_int_col([a.correlation for a in args]),
            external_id=_int_col([a.external_id if a.external_id is not None else a.external_id_old
                                  for a in args]),
            is_driver=np.array(driver, dtype=np.bool_),
        )
        if keep is not None:
            table = table.take(keep)
        self._span(table.ts, table.ts + table.dur)
        self.runtime.append(table)

    def _add_cpu(self, evs: List[Event], kinds: List[int]) -> None:
        if not evs:
            return
        ts, dur, keep = self._times(evs)
        names = self.intern([e.name for e in evs])
        cats = self.intern([e.cat if e.cat is not None else "" for e in evs])
        table = model.CpuTable(
            kind=np.array(kinds, dtype=np.int8), category=cats, name=names,
            pid=_int_col([e.pid for e in evs]), tid=_int_col([e.tid for e in evs]),
            ts=ts, dur=dur,
            external_id=_int_col([(e.args or _NO_ARGS).external_id for e in evs]),
        )
        rows = np.arange(len(evs))
        if keep is not None:
            table = table.take(keep)
            rows = rows[keep]
        # Shapes and dtypes only for the few ops the Tensor Core analysis reports.
        cache = self._shape_name_cache
        strings = None
        for local, row in enumerate(rows):
            nid = int(table.name[local])
            wanted = cache.get(nid)
            if wanted is None:
                if strings is None:
                    strings = list(self.strings)
                low = strings[nid].lower()
                wanted = cache[nid] = any(m in low for m in SHAPE_OP_MARKERS)
            if wanted:
                a = evs[row].args
                if a is not None:
                    raw_dims = a.input_dims if len(a.input_dims) else a.input_dims_2020
                    index = self.cpu_rows + local
                    if len(raw_dims):
                        self.op_inputs.dims[index] = _decode_raw(raw_dims)
                    if len(a.input_type):
                        self.op_inputs.types[index] = _decode_raw(a.input_type)
        self.cpu_rows += len(table)
        self._span(table.ts, table.ts + table.dur)
        self.cpu.append(table)

    def _add_memory(self, evs: List[Event]) -> None:
        if not evs:
            return
        ts = _float_col([e.ts for e in evs])
        keep = np.isfinite(ts)
        args = [e.args or _NO_ARGS for e in evs]
        table = model.MemoryTable(
            ts=ts,
            device_type=_int_col([a.device_type for a in args]).astype(np.int32),
            device_id=_int_col([a.device_id for a in args]).astype(np.int32),
            bytes=_int_col([a.mem_bytes for a in args]),
            total_allocated=_int_col([a.total_allocated for a in args]),
            total_reserved=_int_col([a.total_reserved for a in args]),
            addr=_int_col([a.addr for a in args]),
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
            device=_int_col([a.device if a.device is not None else e.pid
                             for a, e in zip(args, evs)]).astype(np.int32),
            stream=_int_col([a.stream if a.stream is not None else e.tid for a, e in zip(args, evs)]),
        )
        if keep is not None:
            table = table.take(keep)
        self.annotations.append(table)

    def merge(self, other: "_Builder") -> None:
        """Append a chunk decoded elsewhere (another process): remap its string ids."""
        table = self.strings
        remap = np.array([table.setdefault(s, len(table)) for s in other.strings] or [0], dtype=np.int32)

        def ids(col):
            return remap[col] if len(col) else col

        for t in other.gpu:
            t.name = ids(t.name)
            t.occupancy_limit = np.where(t.occupancy_limit >= 0, remap[np.maximum(t.occupancy_limit, 0)], -1) \
                .astype(np.int32)
            self.gpu.append(t)
        for t in other.cpu:
            t.name, t.category = ids(t.name), ids(t.category)
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
        self.cpu_rows += other.cpu_rows
        for cat, n in other.category_counts.items():
            self.category_counts[cat] = self.category_counts.get(cat, 0) + n
        self.event_count += other.event_count
        self.first_ts = min(self.first_ts, other.first_ts)
        self.last_ts = max(self.last_ts, other.last_ts)
        self.dropped_missing_dur += other.dropped_missing_dur
        self.dropped_bad_ts += other.dropped_bad_ts
        self.negative_dur += other.negative_dur

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_shape_name_cache"] = {}
        return state

    def finish(self, meta: model.TraceMeta) -> model.TraceData:
        meta.category_counts = self.category_counts
        meta.event_count = self.event_count
        if self.first_ts <= self.last_ts:
            meta.first_ts, meta.last_ts = self.first_ts, self.last_ts
        if self.dropped_missing_dur:
            meta.warnings.append(f"{self.dropped_missing_dur} complete events without a usable 'dur' were ignored")
        if self.dropped_bad_ts:
            meta.warnings.append(f"{self.dropped_bad_ts} events without a usable 'ts' were ignored")
        if self.negative_dur:
            meta.warnings.append(f"{self.negative_dur} events with a negative 'dur' were counted as 0 µs")
        strings = list(self.strings)
        return model.TraceData(
            meta=meta, strings=strings,
            gpu=model.GpuTable.concat(self.gpu), cpu=model.CpuTable.concat(self.cpu),
            runtime=model.RuntimeTable.concat(self.runtime), memory=model.MemoryTable.concat(self.memory),
            gpu_annotations=model.GpuAnnotationTable.concat(self.annotations),
            op_inputs=self.op_inputs,
        )


_NO_DIM = (-1, -1, -1)


def _dims(values: list) -> np.ndarray:
    fixed = [v if (v is not None and len(v) == 3) else _NO_DIM for v in values]
    try:
        return np.array(fixed, dtype=np.int64).reshape(len(fixed), 3)
    except (TypeError, ValueError):
        return np.array([[_to_int(x) for x in v] for v in fixed], dtype=np.int64).reshape(len(fixed), 3)


def _limiting_factors(occ) -> Optional[str]:
    if not occ:
        return None
    lf = occ.get("limitingFactors") or occ.get("limitingFactor")
    return str(lf) if lf else None


def _decode_raw(raw):
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


# --------------------------------------------------------------------------- parallel


def _decode_chunk(payload: bytes) -> _Builder:
    """Decode one chunk of whole events into columns (runs in a worker process)."""
    builder = _Builder("")
    builder.add(_EVENTS_DECODER.decode(payload))
    return builder


# Decoding is CPU-bound Python (msgspec holds the GIL), so large files are decoded by
# worker processes, one chunk each, while this process gunzips and merges. Small files
# never start the pool. Opt-in: TB_BOTTLENECKS_DECODE_PROCESSES=N (see _decode_workers).
PARALLEL_MIN_CHUNKS = 2  # chunks decoded in-process before the pool is used
PARALLEL_MIN_BYTES = 64 << 20  # estimated text size (gzip inflates traces >= 12x) worth a pool
_MAX_IN_FLIGHT_PER_WORKER = 2
_pool = None
_pool_lock = threading.Lock()


def _decode_workers() -> int:
    """Worker processes for decoding large files: 0 (in-process) unless
    TB_BOTTLENECKS_DECODE_PROCESSES asks for some. Measured on a 325 MB trace, 2 cores
    (benchmarks/README.md): 2 workers load in 2.0 s instead of 2.9 s but the process tree
    peaks at ~680 MB instead of ~230 MB, above the file size, so it is opt-in."""
    try:
        return max(0, int(os.environ.get("TB_BOTTLENECKS_DECODE_PROCESSES", "0")))
    except ValueError:
        return 0


def _get_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # fork is cheap but unsafe once threads run (TensorBoard's server): then use
            # a fork server, which forks from a clean single-threaded process.
            if threading.active_count() == 1:
                context = multiprocessing.get_context("fork")
            else:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload([__name__])
            from . import procguard

            # the workers exit when this process dies, SIGKILL included (no orphans)
            _pool = ProcessPoolExecutor(max_workers=_decode_workers(), mp_context=context,
                                        initializer=procguard.die_with_parent, initargs=(os.getpid(),))
            import atexit

            atexit.register(_drop_pool)  # shut the workers down before the interpreter tears down
        return _pool


def _drop_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


class _ChunkSink:
    """Sends chunks to the builder: in-process first, then (large files) to the pool.

    Results are merged in file order. If the pool breaks (a worker killed, no
    multiprocessing here), the chunks are decoded in this process instead.
    """

    def __init__(self, builder: _Builder, parallel: bool):
        self.builder = builder
        self.chunks = 0
        self.workers = _decode_workers() if parallel else 0
        self.pending = collections.deque()  # (future, payload)
        if self.workers:
            try:
                _get_pool()  # started before any thread of ours, so fork stays safe
            except (OSError, ValueError, ImportError):
                self.workers = 0

    def add(self, payload: bytes) -> None:
        self.chunks += 1
        if self.workers == 0 or self.chunks <= PARALLEL_MIN_CHUNKS:
            self.builder.add(_EVENTS_DECODER.decode(payload))
            return
        try:
            self.pending.append((_get_pool().submit(_decode_chunk, payload), payload))
        except RuntimeError:  # pool broken or shut down
            self._local_fallback()
            self.builder.add(_EVENTS_DECODER.decode(payload))
            return
        while len(self.pending) >= self.workers * _MAX_IN_FLIGHT_PER_WORKER:
            self._merge_oldest()

    def _merge_oldest(self) -> None:
        from concurrent.futures.process import BrokenProcessPool

        future, payload = self.pending[0]
        try:
            result = future.result()
        except BrokenProcessPool:
            self._local_fallback()
            return
        self.pending.popleft()
        self.builder.merge(result)

    def _local_fallback(self) -> None:
        _drop_pool()
        self.workers = 0
        pending, self.pending = self.pending, collections.deque()
        for _, payload in pending:
            self.builder.add(_EVENTS_DECODER.decode(payload))

    def drain(self) -> None:
        while self.pending:
            self._merge_oldest()

    def cancel(self) -> None:
        for f, _ in self.pending:
            f.cancel()
        self.pending.clear()


# --------------------------------------------------------------------------- driver


def _meta_from(obj: TraceObject, meta: model.TraceMeta) -> None:
    if obj.schemaVersion is not None:
        meta.schema_version = obj.schemaVersion if isinstance(obj.schemaVersion, int) else None
    if obj.deviceProperties is not None:
        meta.device_properties = [p for p in obj.deviceProperties if isinstance(p, dict)]
    if obj.distributedInfo is not None:
        meta.distributed_info = obj.distributedInfo
    if obj.baseTimeNanoseconds is not None:
        meta.base_time_ns = _to_int(obj.baseTimeNanoseconds)
    if isinstance(obj.displayTimeUnit, str):
        meta.display_time_unit = obj.displayTimeUnit
    if isinstance(obj.traceName, str):
        meta.trace_name = obj.traceName
    meta.profile_memory = meta.profile_memory or bool(obj.profile_memory)
    meta.record_shapes = meta.record_shapes or bool(obj.record_shapes)
    meta.with_stack = meta.with_stack or bool(obj.with_stack)


def load_trace(path: str, fs=None, *, source: Optional[str] = None, progress=None) -> model.TraceData:
    """Load one trace file (local path, or `path` on fsspec filesystem `fs`).

    ``progress(fraction)`` is called now and then with the share (0..1) of the file's
    bytes read so far. Raises TraceError (or a subclass) naming the file for anything
    unusable.
    """
    source = source or str(path)
    gzipped = str(path).endswith(".gz")
    try:
        stream = fs.open(path, "rb") if fs is not None else open(path, "rb")
    except FileNotFoundError:
        raise TraceError(source, "file not found") from None
    except PermissionError:
        raise TraceError(source, "permission denied") from None
    except OSError as exc:
        raise TraceError(source, f"cannot open: {exc}") from None
    if progress is not None:
        stream = _CountingReader(stream, progress)
    with stream:
        if not gzipped:
            magic = stream.read(2)
            stream.seek(0)
            gzipped = magic == b"\x1f\x8b"  # a gzip file without .gz (renamed)
        try:
            return _load_stream(stream, source, gzipped, progress)
        except TraceError:
            raise
        except MemoryError:
            raise TraceError(source, "out of memory while loading") from None
        except OSError as exc:
            raise TraceError(source, f"read failed: {exc}") from None


def _load_stream(stream, source: str, gzipped: bool, progress) -> model.TraceData:
    meta = model.TraceMeta(source=source)
    builder = _Builder(source)
    sink = _ChunkSink(builder, parallel=_raw_size(stream) * (12 if gzipped else 1) >= PARALLEL_MIN_BYTES)
    blocks = _Prefetcher(_decompressed_blocks(stream, source, gzipped))
    buf = bytearray()
    consumed = 0  # decompressed bytes before buf[0]
    state = "start"  # -> "events" -> (end)
    try:
        chunk_failed = False
        for block in blocks:
            buf += block
            if state == "start":
                head = bytes(buf[:64]).lstrip()
                if not head:
                    continue
                if head[:1] == b"[":
                    meta.container = "array"
                    start = buf.index(b"[") + 1
                elif head[:1] == b"{":
                    key = buf.find(b'"traceEvents"')
                    if key < 0:
                        if len(buf) < (64 << 20):
                            continue  # header longer than one block: read on
                        raise NotATraceError(source, "JSON object without a 'traceEvents' array in its first 64 MB")
                    bracket = buf.find(b"[", key)
                    if bracket < 0:
                        continue
                    header = bytes(buf[:key]) + b'"traceEvents":[]}'
                    try:
                        _meta_from(_OBJECT_DECODER.decode(header), meta)
                    except (msgspec.DecodeError, UnicodeDecodeError):
                        chunk_failed = True
                        break
                    start = bracket + 1
                else:
                    raise NotATraceError(source, "not JSON (does not start with '{' or '[')")
                consumed += start
                del buf[:start]
                state = "events"
            if state == "events" and len(buf) >= CHUNK_BYTES:
                cut = _last_boundary(buf)
                if cut is None:
                    continue
                brace_end, next_start = cut
                try:
                    sink.add(b"[" + bytes(buf[:brace_end]) + b"]")
                except (msgspec.DecodeError, UnicodeDecodeError):
                    chunk_failed = True
                    break
                consumed += next_start
                del buf[:next_start]
        if chunk_failed:
            blocks.close()
            raise _Fallback()
        if state == "start":
            if not bytes(buf).strip():
                raise TraceError(source, "empty file")
            if bytes(buf).lstrip()[:1] == b"{":
                # Small object whose "traceEvents" was never found: decode whole to tell why.
                raise _Fallback(bytes(buf))
            raise NotATraceError(source, "not JSON (does not start with '{' or '[')")
        # The tail: the remaining events plus the closing bracket and trailer keys.
        tail = bytes(buf)
        del buf
        try:
            sink.drain()  # chunks in order before the tail
            if meta.container == "array":
                builder.add(_EVENTS_DECODER.decode(b"[" + tail))
            else:
                obj = _OBJECT_DECODER.decode(b'{"traceEvents":[' + tail)
                _meta_from(obj, meta)
                builder.add(obj.traceEvents or [])
        except (msgspec.DecodeError, UnicodeDecodeError):
            # Broken, truncated or unusual text: the whole-file path repairs what it
            # can and otherwise reports the precise problem.
            raise _Fallback() from None
    except _Fallback as fb:
        sink.cancel()
        return _load_whole(stream, source, gzipped, fb.data)
    finally:
        sink.cancel()
        blocks.close()
    return _finish(builder, meta, source)


def _raw_size(stream) -> int:
    try:
        pos = stream.tell()
        size = stream.seek(0, 2)
        stream.seek(pos)
        return size or 0
    except (OSError, AttributeError, ValueError):
        return 0


class _CountingReader:
    """Reports the share of the raw (possibly compressed) file read so far."""

    def __init__(self, stream, progress):
        self._stream = stream
        self._progress = progress
        self._done = 0
        try:
            pos = stream.tell()
            self._size = stream.seek(0, 2) or 0
            stream.seek(pos)
        except (OSError, AttributeError, ValueError):
            self._size = 0

    def read(self, n=-1):
        data = self._stream.read(n)
        self._done += len(data)
        if self._size:
            self._progress(min(1.0, self._done / self._size))
        return data

    def seek(self, *args):
        pos = self._stream.seek(*args)
        self._done = pos
        return pos

    def tell(self):
        return self._stream.tell()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stream.close()


class _Fallback(Exception):
    def __init__(self, data: Optional[bytes] = None):
        self.data = data


def _last_boundary(buf: bytearray):
    """(end of the last complete event's '}', start of the next event) or None."""
    window = 1 << 16
    lo = max(0, len(buf) - window)
    while True:
        last = None
        for last in _EVENT_BOUNDARY.finditer(buf, lo):
            pass
        if last is not None:
            return last.start() + 1, last.start(1)
        if lo == 0:
            return None
        lo = max(0, lo - window * 16)


def _raise_decode_error(source: str, exc: Exception, text: bytes):
    msg = str(exc)
    stripped = text.rstrip()
    if "truncated" in msg.lower() or not stripped.endswith((b"}", b"]")):
        raise TruncatedTraceError(source, "JSON ends early (file truncated or still being written)") from None
    if isinstance(exc, msgspec.ValidationError):
        raise NotATraceError(source, f"JSON but not a PyTorch profiler trace: {msg}") from None
    raise TraceError(source, f"invalid JSON: {msg}") from None


def _load_whole(stream, source: str, gzipped: bool, data: Optional[bytes]) -> model.TraceData:
    """Decode the file in one piece: slower, always correct, precise error messages."""
    if data is None:
        stream.seek(0)
        data = b"".join(_decompressed_blocks(stream, source, gzipped))
    text = data.lstrip()
    if not text:
        raise TraceError(source, "empty file")
    meta = model.TraceMeta(source=source)
    builder = _Builder(source)

    def decode(payload: bytes):
        if payload[:1] == b"[":
            meta.container = "array"
            return _EVENTS_DECODER.decode(payload)
        obj = _OBJECT_DECODER.decode(payload)
        if obj.traceEvents is None:
            raise NotATraceError(source, "JSON but not a PyTorch profiler trace (no 'traceEvents' array)")
        _meta_from(obj, meta)
        return obj.traceEvents

    try:
        events = decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        repaired = _repair(text)
        if repaired is None:
            _raise_decode_error(source, exc, text)
        try:
            events = decode(repaired)
            meta.warnings.append("the file is not strict JSON (bare N/A values or invalid UTF-8); repaired")
        except (msgspec.DecodeError, UnicodeDecodeError):
            _raise_decode_error(source, exc, text)
    builder.add(events)
    return _finish(builder, meta, source)


def _repair(text: bytes) -> Optional[bytes]:
    """Fix what old exporters wrote: bare N/A values and invalid UTF-8 bytes."""
    fixed = re.sub(rb":\s*N/A\b", b': "N/A"', text)
    try:
        fixed.decode("utf-8")
    except UnicodeDecodeError:
        fixed = fixed.decode("utf-8", errors="replace").encode("utf-8")
    return fixed if fixed != text else None


def _finish(builder: _Builder, meta: model.TraceMeta, source: str) -> model.TraceData:
    trace = builder.finish(meta)
    usable = len(trace.cpu) + len(trace.gpu) + len(trace.runtime) + len(trace.memory)
    if usable == 0:
        if builder.event_count == 0:
            raise NotATraceError(source, "the trace holds no events")
        raise NotATraceError(source, f"none of its {builder.event_count} events is a profiler event "
                                     "(no complete 'X' events with ts and dur, no [memory] events)")
    return trace
