"""The columnar in-memory model of one trace file.

`loader.load_trace()` turns a Kineto/PyTorch-profiler Chrome trace of any era into a
`TraceData`: one numpy array per field and per event kind, with names interned into a
string table. No per-event Python objects survive loading, so a trace of several
hundred MB costs tens of MB here.

Conventions (see ../shared/docs/trace-format.md for the eras):
- Times are float64 microseconds exactly as written in the file (absolute epoch µs in
  old traces, relative to ``meta.base_time_ns`` in new ones). Only differences matter.
- Missing integers are -1, missing floats are NaN.
- ``name`` columns are int32 indices into ``TraceData.strings``.
- pid/tid are normalised to integers ("stream 7" -> 7, "25738" -> 25738); other
  non-numeric pids/tids ("Spans", "Traces") become -1.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from . import heap

# GpuTable.kind
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2

# CpuTable.kind. Old traces (<= torch 1.11) file user annotations (ProfilerStep#N,
# DataLoader spans) under "Operator", so analyses must match those by *name*.
CPU_OP, CPU_USER_ANNOTATION, CPU_PYTHON, CPU_OTHER = 0, 1, 2, 3

# MemoryTable.device_type follows c10::DeviceType.
DEVICE_TYPE_CPU, DEVICE_TYPE_CUDA, DEVICE_TYPE_HIP = 0, 1, 6


class _Table:
    """A bag of equally long numpy columns (a tiny dataframe without pandas)."""

    def __len__(self) -> int:
        first = fields(self)[0]
        return len(getattr(self, first.name))

    def take(self, index) -> "_Table":
        """Rows selected by a boolean mask or an index array, as a new table."""
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @classmethod
    def empty(cls) -> "_Table":
        return cls(**{f.name: np.empty(0, dtype=f.metadata.get("dtype", np.float64)) for f in fields(cls)})

    @classmethod
    def concat(cls, parts: List["_Table"], consume: bool = False) -> "_Table":
        """One table of ``parts`` in order. ``consume``: the parts are not read again (the
        loader's chunks), so each column's pieces are dropped as soon as it is joined: the
        peak is the table plus one column, not twice the table (the pieces' heap pages
        handed back to the system, `heap`). A consumed column with one value in every row
        (`constant_column`) becomes a read-only broadcast of it."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1 and not consume:
            return parts[0]
        rows = sum(len(p) for p in parts)
        columns = {}
        for f in fields(cls):
            pieces = [getattr(p, f.name) for p in parts]
            value = constant_column(pieces) if consume and rows >= CONSTANT_MIN_ROWS else None
            if value is not None:
                columns[f.name] = np.broadcast_to(value, (rows,) + value.shape[1:])
            else:
                columns[f.name] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            del pieces
            if consume:
                for p in parts:
                    setattr(p, f.name, None)
                heap.release_free_memory()
        return cls(**columns)


# A loaded column that holds one value in every row (events without pid/tid, kernels without
# collective fields, ops without recorded inputs: 12 of 41 MiB of columns on the 292 MB
# benchmark trace, 467 of 655 MiB on 10M tiny events) is kept as a read-only broadcast of that
# value: the same dtype, length and values without memory per row. The analyses never write
# into loaded columns (checked on every shared trace with all columns read-only).
CONSTANT_MIN_ROWS = 4096


def constant_column(pieces: List[np.ndarray]) -> Optional[np.ndarray]:
    """The first row of ``pieces`` (1-D arrays of one dtype, in order; a 1-row array) when
    every row of every piece equals it bit for bit (NaN and -0.0 exactly), else None."""
    value = None
    first = None
    for a in pieces:
        if a.ndim != 1 or a.dtype.itemsize not in (1, 2, 4, 8) or a.dtype.kind not in "biuf":
            return None
        if not len(a):
            continue
        bits = a.view(f"u{a.dtype.itemsize}")
        if first is None:
            first, value = bits[0], a[:1].copy()
        if bits[-1] != first or not (bits == first).all():
            return None
    return value


def _col(dtype):
    return field(metadata={"dtype": dtype})


@dataclass
class GpuTable(_Table):
    """GPU activity: kernels, memcpys and memsets (never gpu_user_annotation)."""

    kind: np.ndarray = _col(np.int8)  # GPU_KERNEL / GPU_MEMCPY / GPU_MEMSET
    name: np.ndarray = _col(np.int32)
    ts: np.ndarray = _col(np.float64)
    dur: np.ndarray = _col(np.float64)
    device: np.ndarray = _col(np.int32)  # args.device, else pid
    stream: np.ndarray = _col(np.int64)  # args.stream, else tid
    correlation: np.ndarray = _col(np.int64)
    external_id: np.ndarray = _col(np.int64)  # "External id" (or old "external id")
    grid_x: np.ndarray = _col(np.int64)
    grid_y: np.ndarray = _col(np.int64)
    grid_z: np.ndarray = _col(np.int64)
    block_x: np.ndarray = _col(np.int64)
    block_y: np.ndarray = _col(np.int64)
    block_z: np.ndarray = _col(np.int64)
    registers_per_thread: np.ndarray = _col(np.int64)
    shared_memory: np.ndarray = _col(np.int64)  # bytes, static + dynamic
    blocks_per_sm: np.ndarray = _col(np.float64)  # NaN when missing; "inf" -> inf
    warps_per_sm: np.ndarray = _col(np.float64)
    achieved_occupancy_pct: np.ndarray = _col(np.float64)  # "est. achieved occupancy %"
    # Nested 2026 `occupancy` object: index into strings of its limitingFactors, -1 if none.
    occupancy_limit: np.ndarray = _col(np.int32)
    bytes: np.ndarray = _col(np.int64)  # memcpy/memset size
    msg_nelems: np.ndarray = _col(np.int64)  # collective kernels: "In msg nelems", -1 if none
    msg_dtype: np.ndarray = _col(np.int32)  # its "dtype", index into strings, -1 if none
    # More collective metadata (kernels with "In msg nelems" only; -1 where absent; the
    # string ones are indices into strings). Optional in the constructor (-1 columns).
    msg_out_nelems: np.ndarray = field(default=None, metadata={"dtype": np.int64})  # "Out msg nelems"
    group_size: np.ndarray = field(default=None, metadata={"dtype": np.int64})  # "Group size"
    coll_name: np.ndarray = field(default=None, metadata={"dtype": np.int32})  # "Collective name"
    pg_name: np.ndarray = field(default=None, metadata={"dtype": np.int32})  # "Process Group Name"
    pg_ranks: np.ndarray = field(default=None, metadata={"dtype": np.int32})  # "Process Group Ranks" (JSON text)
    seq: np.ndarray = field(default=None, metadata={"dtype": np.int64})  # "Seq"

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is None:
                setattr(self, f.name, np.full(len(self.ts), -1, f.metadata["dtype"]))


@dataclass
class CpuTable(_Table):
    """Host-side complete events: cpu ops, user annotations, python frames, others.

    Runtime/driver calls are in RuntimeTable, not here; the synthetic `Trace` span and
    `gpu_user_annotation` copies are not host events and are not kept here either.
    """

    kind: np.ndarray = _col(np.int8)  # CPU_OP / CPU_USER_ANNOTATION / CPU_PYTHON / CPU_OTHER
    category: np.ndarray = _col(np.int32)  # index into strings of the raw `cat`
    name: np.ndarray = _col(np.int32)
    pid: np.ndarray = _col(np.int64)
    tid: np.ndarray = _col(np.int64)
    ts: np.ndarray = _col(np.float64)
    dur: np.ndarray = _col(np.float64)
    external_id: np.ndarray = _col(np.int64)
    # Recorded inputs (record_shapes=True): index into strings of the raw JSON text of
    # args "Input Dims" (or 2020 "Input dims") and "Input type"; -1 when absent (also
    # when a table is built without them).
    input_dims: np.ndarray = field(default=None, metadata={"dtype": np.int32})
    input_types: np.ndarray = field(default=None, metadata={"dtype": np.int32})
    # Source attribution (METRICS.md §17): index into strings of the raw JSON text of the
    # old-style args "Call stack" (innermost frame first, ";"-separated), and args
    # "Sequence number" (autograd: a backward op's equals its forward op's); -1 when absent.
    call_stack: np.ndarray = field(default=None, metadata={"dtype": np.int32})
    sequence: np.ndarray = field(default=None, metadata={"dtype": np.int64})

    def __post_init__(self):
        for name in ("input_dims", "input_types", "call_stack"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(len(self.ts), -1, np.int32))
        if self.sequence is None:
            self.sequence = np.full(len(self.ts), -1, np.int64)


@dataclass
class RuntimeTable(_Table):
    """cuda_runtime / cuda_driver calls (HIP calls too; old category `Runtime`)."""

    name: np.ndarray = _col(np.int32)
    pid: np.ndarray = _col(np.int64)
    tid: np.ndarray = _col(np.int64)
    ts: np.ndarray = _col(np.float64)
    dur: np.ndarray = _col(np.float64)
    correlation: np.ndarray = _col(np.int64)
    external_id: np.ndarray = _col(np.int64)
    is_driver: np.ndarray = _col(np.bool_)


@dataclass
class MemoryTable(_Table):
    """`[memory]` events (instant `i` or, with use_python_export, `X`)."""

    ts: np.ndarray = _col(np.float64)
    device_type: np.ndarray = _col(np.int32)
    device_id: np.ndarray = _col(np.int32)
    bytes: np.ndarray = _col(np.int64)  # signed: negative for a free
    total_allocated: np.ndarray = _col(np.int64)  # -1 when absent (2021 format)
    total_reserved: np.ndarray = _col(np.int64)
    addr: np.ndarray = _col(np.int64)
    # The thread that allocated or freed (the op running there is the event's op; METRICS.md
    # §7 "Memory at the peak"); -1 where absent or not an integer. Optional in the constructor.
    pid: np.ndarray = field(default=None, metadata={"dtype": np.int64})
    tid: np.ndarray = field(default=None, metadata={"dtype": np.int64})

    def __post_init__(self):
        for name in ("pid", "tid"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(len(self.ts), -1, np.int64))


@dataclass
class GpuAnnotationTable(_Table):
    """gpu_user_annotation ranges: labels on a GPU stream, never GPU activity."""

    name: np.ndarray = _col(np.int32)
    ts: np.ndarray = _col(np.float64)
    dur: np.ndarray = _col(np.float64)
    device: np.ndarray = _col(np.int32)
    stream: np.ndarray = _col(np.int64)


@dataclass
class OpInputs:
    """Recorded shapes/dtypes of the few ops the Tensor Core analysis needs.

    Kept only for CPU ops whose names are matmul/conv/attention/RNN-like (see
    loader.SHAPE_OPS), keyed by row index into TraceData.cpu.
    """

    dims: Dict[int, Any] = field(default_factory=dict)
    types: Dict[int, Any] = field(default_factory=dict)
    # c10d point-to-point ops (c10d::send, c10d::recv_, ...): the peer rank, the third of
    # their "Concrete Inputs" (dst of a send, src of a recv; group-local rank)
    peers: Dict[int, int] = field(default_factory=dict)


class KernelLaunch(NamedTuple):
    """An Inductor kernel launch's args (the cpu_op named after the kernel, torch >= 2.5):
    ``file`` as the trace wrote it (a path on the machine that recorded it: never shown,
    only its basename), ``hash`` (Inductor's content hash, the file's stem), ``backend``
    ("triton"); "" when absent. One shared tuple per distinct launch (interned)."""

    file: str
    hash: str
    backend: str


class KernelOrigin(NamedTuple):
    """What Inductor's generated code says a kernel fused: the ``Original ATen: [...]`` and
    ``Source Nodes: [...]`` comment lines above its definition in the wrapper (output code)
    that names the kernel file in its ``# kernel path:`` line, read from the local disk by
    the loader when that file is there (trace/inductor.py)."""

    aten: Tuple[str, ...]  # as written: "aten.add", "prims.iota", ...
    source_nodes: Tuple[str, ...]


@dataclass
class TraceMeta:
    source: str
    container: str = "object"  # "object" or "array" (2020 bare array)
    schema_version: Optional[int] = None
    device_properties: List[dict] = field(default_factory=list)
    distributed_info: Optional[dict] = None
    base_time_ns: Optional[int] = None
    display_time_unit: Optional[str] = None
    trace_name: Optional[str] = None
    profile_memory: bool = False
    record_shapes: bool = False
    with_stack: bool = False
    # Raw `cat` value -> number of events, for the CLI summary and diagnostics.
    category_counts: Dict[str, int] = field(default_factory=dict)
    event_count: int = 0
    # Time span of all complete events except `Trace`, plus memory events.
    first_ts: float = float("nan")
    last_ts: float = float("nan")
    # The profiler's own span (the `Trace` event "PyTorch Profiler (0)"): the window the
    # profiler recorded; NaN when the file has none (METRICS.md §1: steps are clipped to it).
    profiler_start_ts: float = float("nan")
    profiler_end_ts: float = float("nan")
    warnings: List[str] = field(default_factory=list)


def _predicate_key(predicate):
    """A hashable identity of what a predicate computes, or None when it has none."""
    code = getattr(predicate, "__code__", None)
    if code is None:
        return None
    glob = getattr(predicate, "__globals__", {})
    try:
        key = (code, tuple(c.cell_contents for c in predicate.__closure__ or ()), predicate.__defaults__,
               tuple((n, glob[n]) for n in code.co_names if n in glob))  # the globals it reads, as they are now
        hash(key)
    except (TypeError, ValueError):  # an unhashable value or an empty closure cell: not remembered
        return None
    return key


@dataclass
class TraceData:
    meta: TraceMeta
    strings: List[str]
    gpu: GpuTable
    cpu: CpuTable
    runtime: RuntimeTable
    memory: MemoryTable
    gpu_annotations: GpuAnnotationTable
    op_inputs: OpInputs = field(default_factory=OpInputs)
    # Inductor kernel launches: CPU row -> its KernelLaunch (only rows whose event had
    # kernel_file/kernel_hash/kernel_backend args); kernel file basename -> KernelOrigin for
    # the kernel files found on this machine (trace/inductor.py).
    kernel_launches: Dict[int, KernelLaunch] = field(default_factory=dict)
    kernel_origins: Dict[str, KernelOrigin] = field(default_factory=dict)

    def string_ids(self, predicate) -> np.ndarray:
        """Ids of interned strings for which ``predicate(str)`` is true (vectorised use:
        ``np.isin(table.name, trace.string_ids(lambda s: s.startswith("nccl")))``).

        Remembered per predicate (its code and the values of its closure, defaults and the
        globals it names): the analyses ask the same questions of the same table many times,
        and the table holds long texts (call stacks, recorded inputs)."""
        key = _predicate_key(predicate)
        if key is None:
            return self._scan_strings(predicate)
        cache = self.__dict__.setdefault("_string_ids", {})
        hit = cache.get(key)
        if hit is None or hit[0] != len(self.strings):
            hit = cache[key] = (len(self.strings), self._scan_strings(predicate))
        return hit[1].copy()

    def __getstate__(self):
        """Pickled without the memos of ``string_ids``, ``devices`` and the Tensor Core name mask (code objects in
        their keys do not pickle; they are rebuilt on use)."""
        state = dict(self.__dict__)
        state.pop("_string_ids", None)
        state.pop("_devices", None)
        state.pop("_tc_name_mask", None)
        return state

    def _scan_strings(self, predicate) -> np.ndarray:
        return np.fromiter((i for i, s in enumerate(self.strings) if predicate(s)), dtype=np.int32)

    @property
    def devices(self) -> List[int]:
        """GPU device ids that ran any GPU activity, sorted. Computed once per device
        column (the analyses ask for it many times; tables are read-only once loaded)."""
        col = self.gpu.device
        cached = self.__dict__.get("_devices")
        if cached is None or cached[0] is not col or cached[1] != len(col):
            cached = self.__dict__["_devices"] = (col, len(col), sorted(int(d) for d in np.unique(col)))
        return list(cached[2])

