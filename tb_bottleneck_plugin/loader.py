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
- Lenient in what we read: a chunk that fails the typed schema (one value of an
  unexpected type, a number out of range, an event nested deeper than msgspec's
  recursion limit) is decoded again event by event, and a bad event field by field:
  the bad field is treated as absent for that event and counted in
  ``meta.warnings``. Values that pass the schema but cannot be right (integers
  beyond int64, negative sizes) are dropped with a warning when the columns are
  built. Well-formed chunks never leave the one-call typed path, so clean traces
  load as fast as before.
- Bounded: decompression yields at most ``_OUT_BYTES`` per zlib call, the text of
  one file is capped (`max_decompressed_bytes`), a long run of whitespace (the
  gzip bomb ``{"traceEvents":[`` + GBs of spaces) and a header or event that never
  ends are rejected within a few MB.

Every failure becomes a `TraceError` naming the file and the problem.
"""
from __future__ import annotations

import codecs
import collections
import logging
import os
import queue
import re
import sys
import threading
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import msgspec
import numpy as np

from . import model
from .errors import NotATraceError, TraceError, TruncatedTraceError

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20  # decoded text per chunk: big enough to amortise, small for memory
# ... with decode workers: every process holds one chunk's events at a time, so smaller
PARALLEL_CHUNK_BYTES = 2 << 20
_READ_BYTES = 256 << 10  # compressed bytes per read
_OUT_BYTES = 1 << 20  # most text one zlib call (or one plain read) may produce: a 1000x bomb stays 1 MB
# Default cap on the decompressed text of one file: max(8 GiB, 40 x its stored size).
# Real traces inflate 12-30x; more is a bomb or a file no analysis could hold anyway.
MAX_DECOMPRESSED_BYTES = 8 << 30
MAX_DECOMPRESSION_RATIO = 40
MAX_DECOMPRESSED_ENV = "TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES"
# No-progress limits: JSON of a trace never holds MBs of whitespace in a row, a header
# (the keys before traceEvents) of MBs, or a single event of tens of MB.
_MAX_WHITESPACE_RUN = 4 << 20
_MAX_HEADER_BYTES = 8 << 20
_MAX_EVENT_BYTES = 32 << 20

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


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    """The event args the analyses read. Unknown keys are skipped by the decoder.

    gc=False (also on Event): decoded structs hold no reference cycles, and untracked
    they are not walked by every collection while a chunk's ~100k of them are alive."""

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
    # Collective metadata copied onto NCCL kernels (2023-10+): elements and their dtype
    # ("Float", "Long", ...); the rank view's collective bytes (metrics §12).
    msg_in_nelems: Num = msgspec.field(default=None, name="In msg nelems")
    msg_dtype: Optional[str] = msgspec.field(default=None, name="dtype")
    # Raw: left undecoded (a view, no objects) unless the op is one SHAPE_OP_MARKERS names.
    input_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    input_dims_2020: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")


_NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One trace event. The types are as strict as the builder needs (a list as `cat`
    would be unhashable there): an event that does not fit goes the lenient way."""

    ph: Optional[str] = None
    cat: Optional[str] = None
    name: Optional[str] = ""
    pid: Num = None
    tid: Num = None
    ts: Num = None
    dur: Num = None
    args: Optional[Args] = None


class TraceObject(msgspec.Struct):
    """Top-level keys of a trace object (header and trailer around traceEvents).

    Only traceEvents is typed: the other keys are read once per file and checked in
    `_meta_from`, so a wrongly typed one costs a warning, not the file."""

    traceEvents: Optional[List[Event]] = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    traceName: Any = None
    profile_memory: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_EVENTS_DECODER = msgspec.json.Decoder(List[Event])
_OBJECT_DECODER = msgspec.json.Decoder(TraceObject)


# The lenient way. Each struct below has the same JSON keys as its strict twin, but
# every field is left undecoded (msgspec.Raw accepts any value), so one bad value
# cannot fail the others; each field is then decoded alone with its strict type.
def _raw_twin(struct, name: str, keep=()):
    return msgspec.defstruct(name, [
        (f.name, f.type if f.name in keep else msgspec.Raw,
         msgspec.field(default=f.default if f.name in keep else _EMPTY_RAW, name=f.encode_name))
        for f in msgspec.structs.fields(struct)])


_LooseEvent = _raw_twin(Event, "_LooseEvent")
_LooseArgs = _raw_twin(Args, "_LooseArgs")
_LooseTraceObject = _raw_twin(TraceObject, "_LooseTraceObject")
_EVENT_DECODER = msgspec.json.Decoder(Event)
_RAW_LIST_DECODER = msgspec.json.Decoder(List[msgspec.Raw])
_LOOSE_EVENT_DECODER = msgspec.json.Decoder(_LooseEvent)
_LOOSE_ARGS_DECODER = msgspec.json.Decoder(_LooseArgs)
_LOOSE_OBJECT_DECODER = msgspec.json.Decoder(_LooseTraceObject)


def _field_decoders(struct) -> List[Tuple[str, str, Any, str]]:
    """(attribute, JSON key, decoder or None for Raw, what a bad value is not)."""
    out = []
    for f in msgspec.structs.fields(struct):
        if f.name == "args" or f.type is msgspec.Raw:
            out.append((f.name, f.encode_name, None, ""))
            continue
        text = str(f.type)
        what = ("not a string" if f.type == Optional[str] else "not a list" if "List" in text
                else "not an object" if "Dict" in text else "not a number or string (or out of range)")
        out.append((f.name, f.encode_name, msgspec.json.Decoder(f.type), what))
    return out


_EVENT_FIELDS = _field_decoders(Event)
_ARGS_FIELDS = _field_decoders(Args)

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

# Between two events: `}` `,` `{` then a key's opening quote. Inside a JSON string a
# quote is always escaped, so `{"` cannot occur there: the match is a real boundary
# (only an array of objects inside args could fake one; then decoding fails and the
# whole-file path takes over).
_EVENT_BOUNDARY = re.compile(rb'\}\s*,\s*(\{)\s*"')
_STREAM_NUM = re.compile(r"-?\d+")


# --------------------------------------------------------------------------- reading


def _decompressed_blocks(stream, path: str, gzipped: bool, notes: List[str]) -> Iterator[bytes]:
    """Yield the file's bytes in blocks of at most ``_OUT_BYTES``, gunzipping on the
    fly (multi-member aware). ``max_length`` bounds every zlib call, so a member that
    inflates 1000x never materialises more than one block. Bytes after a complete
    gzip member that are not another member are ignored with a note (some uploaders
    pad or append), not a rejected file."""
    if not gzipped:
        while True:
            block = stream.read(_OUT_BYTES)
            if not block:
                return
            yield block
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    fresh = True  # the current gzip member has not consumed any input yet
    members = 0  # complete members so far
    while True:
        raw = stream.read(_READ_BYTES)
        if not raw:
            break
        while True:
            try:
                out = inflater.decompress(raw, _OUT_BYTES)
            except zlib.error as exc:
                if members:
                    notes.append("bytes after the end of the gzip stream (not another gzip member) were ignored")
                    return
                raise TraceError(path, f"not a valid gzip file ({exc})") from None
            fresh = False
            if out:
                yield out
            if inflater.eof:  # a member ended; another may follow (concatenated gzip)
                members += 1
                raw = inflater.unused_data.lstrip(b"\x00")
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                fresh = True
                if not raw:
                    break
                continue
            raw = inflater.unconsumed_tail
            if not raw and len(out) < _OUT_BYTES:
                break  # input used up and nothing pending inside zlib
    if not fresh and not inflater.eof:
        raise TruncatedTraceError(path, "gzip stream ends early (file truncated or still being written)")


# Byte-order marks and the NUL pattern of UTF-16/32 text that starts with ASCII.
_BOMS = ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"))


def _sniff_encoding(head: bytes) -> Tuple[Optional[str], int]:
    """(codec of text that is not UTF-8, length of its BOM) from the first 4 bytes."""
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    if len(head) >= 4:
        if head[0] and not head[1] and not head[2] and not head[3]:
            return "utf-32-le", 0
        if not head[0] and not head[1] and not head[2] and head[3]:
            return "utf-32-be", 0
        if head[0] and not head[1]:
            return "utf-16-le", 0
        if not head[0] and head[1]:
            return "utf-16-be", 0
    return None, 0


def _max_decompressed(stored_size: int, limit: Optional[int]) -> int:
    """The cap on one file's text: the argument, else the environment variable, else
    max(8 GiB, 40 x the stored size)."""
    if limit is None:
        try:
            limit = int(os.environ.get(MAX_DECOMPRESSED_ENV, ""))
        except ValueError:
            limit = None
    if limit is None or limit <= 0:
        limit = max(MAX_DECOMPRESSED_BYTES, MAX_DECOMPRESSION_RATIO * stored_size)
    return limit


def _text_blocks(stream, path: str, gzipped: bool, notes: List[str], limit: int) -> Iterator[bytes]:
    """The file's JSON text as UTF-8 blocks, bounded.

    - A UTF-8 BOM is dropped (Windows tools write one; msgspec rejects it). UTF-16/32
      text (PowerShell's `>`) is transcoded to UTF-8, with a note.
    - More than ``limit`` decompressed bytes: rejected while streaming.
    - A run of more than ``_MAX_WHITESPACE_RUN`` whitespace bytes: rejected. This is the
      bomb ``{"traceEvents":[`` + GBs of spaces, which otherwise never yields an event
      and only grows the buffer. The check is O(1) per block unless the block ends
      in whitespace.
    """
    total = 0
    whitespace = 0
    head: Optional[bytes] = b""
    decoder = None
    for block in _decompressed_blocks(stream, path, gzipped, notes):
        total += len(block)
        if total > limit:
            raise TraceError(path, f"more than {limit:,} bytes of text after decompression: refused "
                                   f"(a decompression bomb? the limit is {MAX_DECOMPRESSED_ENV})")
        if head is not None:  # sniff the encoding from the first 4 bytes
            head += block
            if len(head) < 4:
                continue
            block, head = head, None
            if block.startswith(b"\xef\xbb\xbf"):
                block = block[3:]
            else:
                codec, bom = _sniff_encoding(block[:4])
                if codec:
                    decoder = codecs.getincrementaldecoder(codec)()
                    block = block[bom:]
                    notes.append(f"the file is {codec.upper()} text, not UTF-8: decoded")
        if decoder is not None:
            try:
                block = decoder.decode(block).encode("utf-8")
            except UnicodeError as exc:
                raise TraceError(path, f"not valid text ({exc})") from None
        stripped = len(block.rstrip())
        whitespace = whitespace + len(block) if stripped == 0 else len(block) - stripped
        if whitespace > _MAX_WHITESPACE_RUN:
            raise TraceError(path, f"more than {_MAX_WHITESPACE_RUN >> 20} MB of whitespace in a row at byte "
                                   f"{total:,} of the text: not a trace (a decompression bomb?)")
        if block:
            yield block
    if head:  # a file of fewer than 4 bytes
        yield head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    if decoder is not None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeError as exc:
            raise TraceError(path, f"not valid text ({exc})") from None


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


def _int_col(values: list, bad: Optional[list] = None) -> np.ndarray:
    """int64 column, -1 where missing. The one-call conversion takes well-formed
    columns; anything else goes value by value, and ``bad`` (if given) collects
    (row, problem) for values that are there but wrong (not for missing ones or for
    strings, which old exporters write: "stream 7", "N/A")."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    try:  # absent values (None) are common: -1 for them, still one call for the rest
        return np.array([-1 if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), dtype=np.int64)
        for row, v in enumerate(values):
            x, problem = _checked_int(v)
            out[row] = x
            if problem and bad is not None:
                bad.append((row, problem))
        return out


_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63


def _checked_int(v) -> Tuple[int, Optional[str]]:
    """(the value as int64 or -1, what is wrong with it or None)."""
    if v is None:
        return -1, None
    if isinstance(v, bool):
        return -1, "not a number"
    if isinstance(v, int):
        return (v, None) if _INT64_MIN <= v < _INT64_END else (-1, "beyond int64")
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return -1, "not finite"
        return (int(v), None) if abs(v) < 9e18 else (-1, "beyond int64")
    if isinstance(v, str):
        s = v.strip()
        try:
            x = int(s, 16) if s.lower().startswith("0x") else int(s)
        except ValueError:
            m = _STREAM_NUM.search(s)  # "stream 7", "stream 7 annotations"
            if not m:
                return -1, None
            x = int(m.group())
        return (x, None) if _INT64_MIN <= x < _INT64_END else (-1, "beyond int64")
    return -1, "not a number"


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
        # (what rows, JSON field, problem) -> count, for values treated as absent
        self.field_problems: Dict[Tuple[str, str, str], int] = {}
        self.skipped_deep = 0  # events nested beyond msgspec's recursion limit
        self.skipped_not_object = 0  # traceEvents entries that are not objects
        self._shape_name_cache: Dict[int, bool] = {}
        self._decoded_cache: Dict[bytes, Any] = {}  # recorded input text -> its value (_decoded)
        self._raw_id_cache: Dict[bytes, int] = {}  # recorded input text -> its string id (_raw_ids)

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
        return np.array(ids, dtype=np.int32)

    def _raw_ids(self, raws: list) -> np.ndarray:
        """String ids of undecoded JSON values (kept as their text, never parsed here); -1
        for an absent one. The operator view groups by them (metrics: Operator view)."""
        table = self.strings
        known = self._raw_id_cache  # raw bytes -> id: ops repeat a few hundred texts
        out = []
        append = out.append
        for r in raws:
            if not len(r):
                append(-1)
                continue
            key = bytes(r)
            i = known.get(key)
            if i is None:
                i = known[key] = table.setdefault(str(key, "utf-8", "replace"), len(table))
            append(i)
        return np.array(out, dtype=np.int32)

    def _decoded(self, raw):
        """A recorded input value (JSON text), decoded once per distinct text. Ops repeat
        a few hundred shapes tens of thousands of times: one shared (read-only) object per
        text instead of nested lists per call, which every collection walked (on the
        292 MB benchmark trace 269k tracked objects and 17 full collections became 24k
        and 2: load 3.0-3.5 s -> 2.2-2.7 s)."""
        key = bytes(raw)
        cache = self._decoded_cache
        value = cache.get(key, cache)
        if value is cache:
            value = cache[key] = _decode_raw(key)
        return value

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
        with np.errstate(over="ignore", invalid="ignore"):
            overflow = ~np.isfinite(ts + dur) & np.isfinite(ts) & np.isfinite(dur)
        if overflow.any():  # 1e308 + 1e308: no analysis can use such an end
            self.note("events", "dur", "so large that ts + dur is infinite (event ignored)", int(overflow.sum()))
            keep = ~overflow if keep is None else keep & ~overflow
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
        kind = np.array(kinds, dtype=np.int8)
        device = [a.device for a in args]
        if any(d is None for d in device):
            device = [a.device if a.device is not None else e.pid for a, e in zip(args, evs)]
        stream = [a.stream for a in args]
        if any(s is None for s in stream):
            stream = [a.stream if a.stream is not None else e.tid for a, e in zip(args, evs)]
        ext = [a.external_id if a.external_id is not None else a.external_id_old for a in args]
        dims = {}
        for field in ("grid", "block"):
            bad: list = []
            dims[field] = _dims([getattr(a, field) for a in args], bad)
            self._noted(bad, "", field, kind)
        grid, block = dims["grid"], dims["block"]
        limits = [_limiting_factors(a.occupancy) for a in args]
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
            occupancy_limit=np.array([-1 if x is None else self.strings.setdefault(x, len(self.strings))
                                      for x in limits], dtype=np.int32),
            bytes=self._ints([a.bytes if a.bytes is not None else a.size for a in args], "", "bytes", kind,
                             min_value=-1),
            msg_nelems=self._ints([a.msg_in_nelems for a in args], "", "In msg nelems", kind, min_value=-1),
            msg_dtype=np.array([-1 if a.msg_dtype is None else self.strings.setdefault(a.msg_dtype, len(self.strings))
                                for a in args], dtype=np.int32),
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
        rows = "runtime calls"
        table = model.RuntimeTable(
            name=self.intern([e.name for e in evs]),
            pid=self._ints([e.pid for e in evs], rows, "pid"), tid=self._ints([e.tid for e in evs], rows, "tid"),
            ts=ts, dur=dur,
            correlation=self._ints([a.correlation for a in args], rows, "correlation"),
            external_id=self._ints([a.external_id if a.external_id is not None else a.external_id_old
                                    for a in args], rows, "External id"),
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
            pid=self._ints([e.pid for e in evs], "CPU events", "pid"),
            tid=self._ints([e.tid for e in evs], "CPU events", "tid"),
            ts=ts, dur=dur,
            external_id=self._ints([(e.args or _NO_ARGS).external_id for e in evs], "CPU events", "External id"),
            input_dims=self._raw_ids([(a.input_dims if len(a.input_dims) else a.input_dims_2020) if a else _EMPTY_RAW
                                      for a in (e.args for e in evs)]),
            input_types=self._raw_ids([e.args.input_type if e.args else _EMPTY_RAW for e in evs]),
        )
        rows = np.arange(len(evs))
        if keep is not None:
            table = table.take(keep)
            rows = rows[keep]
        # Shapes and dtypes only for the few ops the Tensor Core analysis reports: the
        # rows of those names, found per distinct name (not per row).
        cache = self._shape_name_cache
        strings = None
        ids, inverse = np.unique(table.name, return_inverse=True)
        flags = []
        for nid in ids.tolist():
            wanted = cache.get(nid)
            if wanted is None:
                if strings is None:
                    strings = list(self.strings)
                low = strings[nid].lower()
                wanted = cache[nid] = any(m in low for m in SHAPE_OP_MARKERS)
            flags.append(wanted)
        picked = np.flatnonzero(np.array(flags, dtype=np.bool_)[inverse]) if flags else np.empty(0, np.int64)
        for local, row in zip(picked.tolist(), rows[picked].tolist()):
            a = evs[row].args
            if a is not None:
                raw_dims = a.input_dims if len(a.input_dims) else a.input_dims_2020
                index = self.cpu_rows + local
                if len(raw_dims):
                    self.op_inputs.dims[index] = self._decoded(raw_dims)
                if len(a.input_type):
                    self.op_inputs.types[index] = self._decoded(a.input_type)
        self.cpu_rows += len(table)
        self._span(table.ts, table.ts + table.dur)
        self.cpu.append(table)

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
            t.msg_dtype = np.where(t.msg_dtype >= 0, remap[np.maximum(t.msg_dtype, 0)], -1).astype(np.int32)
            self.gpu.append(t)
        for t in other.cpu:
            t.name, t.category = ids(t.name), ids(t.category)
            for col in ("input_dims", "input_types"):
                v = getattr(t, col)
                setattr(t, col, np.where(v >= 0, remap[np.maximum(v, 0)], -1).astype(np.int32))
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
        for key, n in other.field_problems.items():
            self.note(*key, n=n)
        self.skipped_deep += other.skipped_deep
        self.skipped_not_object += other.skipped_not_object

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_shape_name_cache"] = {}
        state["_decoded_cache"] = {}
        state["_raw_id_cache"] = {}
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
        for (rows, field, problem), n in self.field_problems.items():
            meta.warnings.append(f"{n} {rows}: `{field}` {problem}"
                                 + ("" if "ignored" in problem else " (treated as absent)"))
        if self.skipped_deep:
            meta.warnings.append(f"{self.skipped_deep} events nested deeper than {sys.getrecursionlimit()} levels "
                                 "were skipped")
        if self.skipped_not_object:
            meta.warnings.append(f"{self.skipped_not_object} entries of traceEvents are not objects and were skipped")
        strings = list(self.strings)
        return model.TraceData(
            meta=meta, strings=strings,
            gpu=model.GpuTable.concat(self.gpu), cpu=model.CpuTable.concat(self.cpu),
            runtime=model.RuntimeTable.concat(self.runtime), memory=model.MemoryTable.concat(self.memory),
            gpu_annotations=model.GpuAnnotationTable.concat(self.annotations),
            op_inputs=self.op_inputs,
        )


_NO_DIM = (-1, -1, -1)


def _dims(values: list, bad: Optional[list] = None) -> np.ndarray:
    """(n, 3) int64 grid/block dims; a value that is not a list of 3 integers in int64
    (ROCm's -1 included as "unknown") becomes (-1, -1, -1), noted in ``bad``."""
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


def _decode_raw(raw):
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


# --------------------------------------------------------------------------- lenient decoding


def _decode_events(payload: bytes, builder: _Builder) -> List[Event]:
    """The events of the JSON array text ``payload``: one typed call when the text is
    well-formed (the fast path, every clean chunk), else event by event. A syntax
    error (msgspec.DecodeError) is left to the caller."""
    try:
        return _EVENTS_DECODER.decode(payload)
    except (msgspec.ValidationError, RecursionError):
        pass
    payload = bytes(payload)  # the slow paths below need bytes (a chunk arrives as a view)
    try:
        raws = _RAW_LIST_DECODER.decode(payload)
    except RecursionError:  # even skipping needs depth: split by scanning
        raws, end = _split_array(payload, payload.index(b"["))
        if end is None:
            raise msgspec.DecodeError("unterminated array") from None
    return _events_from_raws(raws, builder)


def _events_from_raws(raws, builder: _Builder) -> List[Event]:
    events = []
    for raw in raws:
        try:
            events.append(_EVENT_DECODER.decode(raw))
            continue
        except msgspec.ValidationError:
            pass
        except RecursionError:
            builder.skipped_deep += 1
            continue
        try:
            event = _sanitised_event(raw, builder)
        except RecursionError:
            builder.skipped_deep += 1
            continue
        if event is not None:
            events.append(event)
    return events


def _sanitised_event(raw, builder: _Builder) -> Optional[Event]:
    """An event that failed the typed decode, field by field: a field whose value has
    the wrong type (or is out of range) is absent, and counted."""
    try:
        loose = _LOOSE_EVENT_DECODER.decode(raw)
    except msgspec.ValidationError:  # not an object: 5, "x", [...]
        builder.skipped_not_object += 1
        return None
    values = _sanitised_fields(loose, _EVENT_FIELDS, builder)
    args_raw = loose.args
    if len(args_raw):
        try:
            loose_args = _LOOSE_ARGS_DECODER.decode(args_raw)
        except msgspec.ValidationError:
            if bytes(args_raw) != b"null":
                builder.note("events", "args", "not an object")
        else:
            values["args"] = Args(**_sanitised_fields(loose_args, _ARGS_FIELDS, builder))
    return Event(**values)


def _sanitised_fields(loose, decoders, builder: _Builder) -> dict:
    values = {}
    for attr, key, decoder, what in decoders:
        raw = getattr(loose, attr)
        if decoder is None:  # Raw field (args is handled by the caller)
            if attr != "args" and len(raw):
                values[attr] = raw
            continue
        if not len(raw):
            continue
        try:
            values[attr] = decoder.decode(raw)
        except msgspec.ValidationError:
            builder.note("events", key, what)
    return values


# A JSON string (escapes included) or one structural character: enough to find the
# elements of an array without decoding them, at any depth.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')


def _split_array(text: bytes, start: int) -> Tuple[List[bytes], Optional[int]]:
    """The elements (as text) of the JSON array whose '[' is at ``text[start]``, and the
    index just after its ']' (None when the array does not end). Used only when an
    element is nested too deeply for msgspec: the scan itself has no depth limit."""
    depth = 0
    begin = start + 1
    items: List[bytes] = []
    for m in _JSON_TOKEN.finditer(text, start):
        c = text[m.start()]
        if c == 0x22:  # a string
            continue
        if c == 0x5B or c == 0x7B:  # [ {
            depth += 1
        elif c == 0x5D or c == 0x7D:  # ] }
            depth -= 1
            if depth == 0:
                last = text[begin:m.start()].strip()
                if last:
                    items.append(last)
                return items, m.end()
        elif depth == 1:  # a comma between elements
            items.append(text[begin:m.start()].strip())
            begin = m.end()
    return items, None


def _loose_top_level(text: bytes, meta: model.TraceMeta):
    """The top-level keys of an object whose events are elsewhere (a header, or the
    object with its traceEvents cut out). A key nested too deeply for msgspec is
    dropped with a warning; the others are kept."""
    try:
        return _LOOSE_OBJECT_DECODER.decode(text)
    except RecursionError:
        pass
    start = text.find(b"{")
    members, end = _split_array(text, start) if start >= 0 else ([], None)
    if end is None:
        raise msgspec.DecodeError("unterminated object")
    kept = []
    for member in members:
        try:
            _LOOSE_OBJECT_DECODER.decode(b"{" + member + b"}")
            kept.append(member)
        except RecursionError:
            name = member.split(b":", 1)[0].strip()[:60].decode("utf-8", "replace")
            meta.warnings.append(f"top-level key {name} nested deeper than {sys.getrecursionlimit()} levels "
                                 "(ignored)")
    return _LOOSE_OBJECT_DECODER.decode(b"{" + b",".join(kept) + b"}")


_RAW_DICT_DECODER = msgspec.json.Decoder(Dict[str, msgspec.Raw])


def _lenient_any(raw, dropped: list):
    """A JSON value as Python objects; numbers msgspec cannot represent (1e400) are
    None (in lists) or left out (in objects), counted in ``dropped[0]``."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.ValidationError:
        pass
    head = bytes(raw[:1]) if isinstance(raw, bytes) else bytes(raw)[:1]
    if head == b"{":
        out = {}
        for k, v in _RAW_DICT_DECODER.decode(raw).items():
            value = _lenient_any(v, dropped)
            if value is not None or bytes(v) == b"null":
                out[k] = value
        return out
    if head == b"[":
        return [_lenient_any(v, dropped) for v in _RAW_LIST_DECODER.decode(raw)]
    dropped[0] += 1
    return None


def _top_level_values(loose, meta: model.TraceMeta):
    """The top-level keys of a loose object decoded one by one: a value msgspec cannot
    hold even as Any (a number beyond float range somewhere inside) is ignored."""
    values = {}
    for f in msgspec.structs.fields(TraceObject):
        raw = getattr(loose, f.name)
        if f.name == "traceEvents" or not len(raw):
            values[f.name] = raw if f.name == "traceEvents" else None
            continue
        dropped = [0]
        values[f.name] = _lenient_any(raw, dropped)
        if dropped[0]:
            meta.warnings.append(f"`{f.encode_name}`: {dropped[0]} values beyond the float range were ignored")
    return TraceObject(**{k: v for k, v in values.items() if k != "traceEvents"}), values["traceEvents"]


def _decode_object(text: bytes, builder: _Builder, meta: model.TraceMeta, source: str) -> Optional[List[Event]]:
    """The events and top-level keys of a trace object, leniently; None when it has
    no traceEvents key."""
    try:
        obj = _OBJECT_DECODER.decode(text)
    except (msgspec.ValidationError, RecursionError):
        pass
    else:
        _meta_from(obj, meta)
        return obj.traceEvents
    raws = None
    try:
        loose = _LOOSE_OBJECT_DECODER.decode(text)
    except RecursionError:
        # Deep nesting somewhere: cut the events array out by scanning, decode the rest.
        key = text.find(b'"traceEvents"')
        bracket = text.find(b"[", key) if key >= 0 else -1
        if bracket < 0:
            raise TraceError(source, f"JSON nested deeper than {sys.getrecursionlimit()} levels") from None
        raws, end = _split_array(text, bracket)
        if end is None:
            raise msgspec.DecodeError("unterminated traceEvents array") from None
        loose = _loose_top_level(text[:key] + b'"traceEvents":[]' + text[end:], meta)
    top, events_raw = _top_level_values(loose, meta)
    _meta_from(top, meta)
    if raws is None:
        if not len(events_raw):
            return None
        events_text = bytes(events_raw)
        if events_text[:1] != b"[":
            raise NotATraceError(source, "JSON but not a PyTorch profiler trace ('traceEvents' is not an array)")
        return _decode_events(events_text, builder)
    return _events_from_raws(raws, builder)


# --------------------------------------------------------------------------- parallel


def _decode_chunk(payload: bytes) -> _Builder:
    """Decode one chunk of whole events into columns (runs in a worker process)."""
    builder = _Builder("")
    builder.add(_decode_events(payload, builder))
    return builder


# Decoding is CPU-bound Python (msgspec holds the GIL), so large files can be decoded by
# worker processes, one chunk each, while this process gunzips, decodes the chunks the
# workers are too busy for, and merges in file order (_ChunkSink). Small files never
# start the pool; how many workers: _decode_workers.
PARALLEL_MIN_CHUNKS = 2  # chunks decoded in-process before the pool is used
PARALLEL_MIN_BYTES = 64 << 20  # estimated text size (gzip inflates traces >= 12x) worth a pool
_MAX_IN_FLIGHT_PER_WORKER = 1  # a worker holds one chunk; meanwhile this process decodes the next
_pool = None
_pool_lock = threading.Lock()


def _decode_workers() -> int:
    """Worker processes that decode chunks of large files beside this process.

    TB_BOTTLENECKS_DECODE_PROCESSES=N decides when set (0: in-process). Otherwise one
    worker when this process may use two or more cores and about one of them is idle
    (1-minute load average below cores - 0.5), else none: on the 292 MB benchmark trace
    (2 cores, benchmarks/README.md "after perf") one worker with 2 MB chunks cut the
    report from 2.69 to 2.30-2.40 s on a quiet machine at about the same peak memory, but
    on a busy one (load 3-10) it saved little and cost ~0.5 s more CPU (pickling, a
    second interpreter). Analyses of many spans at once load every core, so they decode
    in-process."""
    value = os.environ.get("TB_BOTTLENECKS_DECODE_PROCESSES")
    if value is not None and value.strip():
        try:
            return max(0, int(value))
        except ValueError:
            return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
        import multiprocessing

        if multiprocessing.current_process().daemon:  # e.g. a Dask worker: may not have children
            return 0
    except (AttributeError, OSError, ImportError):
        return 0
    return 1 if cores >= 2 and load < cores - 0.5 else 0


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
            if context.get_start_method() == "fork":  # fork them now, before the caller's gunzip thread
                _pool.submit(int).result()
        return _pool


def _drop_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


class _ChunkSink:
    """Sends chunks to the builder: in-process, and (large files) also to the pool.

    With a pool, this thread keeps decoding too: a chunk goes to a worker while the
    workers have fewer than ``_MAX_IN_FLIGHT_PER_WORKER`` chunks each, else it is decoded
    here into a chunk builder of its own. Results are merged in file order (the same
    string ids, rows and warnings as decoding every chunk here). If the pool breaks (a
    worker killed, no multiprocessing here), the chunks are decoded in this process
    instead.
    """

    def __init__(self, builder: _Builder, parallel: bool):
        self.builder = builder
        self.chunks = 0
        self.workers = _decode_workers() if parallel else 0
        # file order: (future, payload) sent to a worker | (None, _Builder) decoded here
        self.pending = collections.deque()
        if self.workers:
            try:
                _get_pool()  # started (workers forked) before any thread of ours
            except Exception:  # noqa: BLE001 - no pool here (e.g. a daemonic process may not fork
                # children: AssertionError): decode in-process, never a failed load
                log.debug("decode workers unavailable; decoding in-process", exc_info=True)
                _drop_pool()
                self.workers = 0

    def add(self, payload) -> None:
        """``payload``: the JSON array text of whole events (bytes or a view, which is not
        kept after this call)."""
        self.chunks += 1
        self._merge_ready()
        if self.workers == 0 or self.chunks <= PARALLEL_MIN_CHUNKS or self._in_flight() >= \
                self.workers * _MAX_IN_FLIGHT_PER_WORKER:
            if not self.pending:  # nothing before it is still out: straight into the builder
                self.builder.add(_decode_events(payload, self.builder))
            else:
                self.pending.append((None, _decode_chunk(payload)))
            return
        payload = bytes(payload)  # sent to a worker and kept for a fallback
        try:
            self.pending.append((_get_pool().submit(_decode_chunk, payload), payload))
        except RuntimeError:  # pool broken or shut down
            self._local_fallback()
            self.builder.add(_decode_events(payload, self.builder))

    def _in_flight(self) -> int:
        return sum(1 for f, _ in self.pending if f is not None)

    def _merge_ready(self) -> None:
        while self.pending and (self.pending[0][0] is None or self.pending[0][0].done()):
            self._merge_oldest()

    def _merge_oldest(self) -> None:
        from concurrent.futures.process import BrokenProcessPool

        future, item = self.pending[0]
        if future is None:
            self.pending.popleft()
            self.builder.merge(item)
            return
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
        for future, item in pending:
            if future is None:
                self.builder.merge(item)
            else:
                self.builder.add(_decode_events(item, self.builder))

    def drain(self) -> None:
        while self.pending:
            self._merge_oldest()

    def cancel(self) -> None:
        for f, _ in self.pending:
            if f is not None:
                f.cancel()
        self.pending.clear()

    def close(self) -> None:
        """Cancel what is left and end the decode workers: their memory (a forked copy
        of this process plus one chunk's events) is not held while the analyses run."""
        self.cancel()
        if self.workers:
            _drop_pool()


# --------------------------------------------------------------------------- driver


def _meta_from(obj, meta: model.TraceMeta) -> None:
    """Top-level keys (a TraceObject or its loose twin), each checked: a wrong type is
    a warning and the key is ignored."""
    if obj.schemaVersion is not None:
        meta.schema_version = obj.schemaVersion if type(obj.schemaVersion) is int else None
    if obj.deviceProperties is not None:
        props = obj.deviceProperties if isinstance(obj.deviceProperties, list) else []
        meta.device_properties = [p for p in props if isinstance(p, dict)]
        if len(meta.device_properties) != len(props) or not isinstance(obj.deviceProperties, list):
            meta.warnings.append("`deviceProperties` is not a list of objects (entries that are not were ignored)")
    if obj.distributedInfo is not None:
        if isinstance(obj.distributedInfo, dict):
            meta.distributed_info = obj.distributedInfo
        else:
            meta.warnings.append("`distributedInfo` is not an object (ignored)")
    if obj.baseTimeNanoseconds is not None:
        base, problem = _checked_int(obj.baseTimeNanoseconds)
        if problem or base == -1:
            meta.warnings.append("`baseTimeNanoseconds` is not an int64 (ignored)")
        else:
            meta.base_time_ns = base
    if isinstance(obj.displayTimeUnit, str):
        meta.display_time_unit = obj.displayTimeUnit
    if isinstance(obj.traceName, str):
        meta.trace_name = obj.traceName
    meta.profile_memory = meta.profile_memory or bool(obj.profile_memory)
    meta.record_shapes = meta.record_shapes or bool(obj.record_shapes)
    meta.with_stack = meta.with_stack or bool(obj.with_stack)


def load_trace(path: str, fs=None, *, source: Optional[str] = None, progress=None,
               max_decompressed_bytes: Optional[int] = None) -> model.TraceData:
    """Load one trace file (local path, or `path` on fsspec filesystem `fs`).

    ``progress(fraction)`` is called now and then with the share (0..1) of the file's
    bytes read so far. ``max_decompressed_bytes`` caps the file's text (default: the
    TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES environment variable, else max(8 GiB, 40 x
    the stored size)). Raises TraceError (or a subclass) naming the file for anything
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
        try:
            if not gzipped:
                magic = stream.read(2)
                stream.seek(0)
                gzipped = magic == b"\x1f\x8b"  # a gzip file without .gz (renamed)
            limit = _max_decompressed(_raw_size(stream), max_decompressed_bytes)
            return _load_stream(stream, source, gzipped, progress, limit)
        except TraceError:
            raise
        except MemoryError:
            raise TraceError(source, "out of memory while loading") from None
        except RecursionError:  # a path not expected to recurse did: still a clear error
            raise TraceError(source, f"JSON nested deeper than {sys.getrecursionlimit()} levels") from None
        except OSError as exc:
            raise TraceError(source, f"read failed: {exc}") from None


def _load_stream(stream, source: str, gzipped: bool, progress, limit: int) -> model.TraceData:
    meta = model.TraceMeta(source=source)
    builder = _Builder(source)
    sink = _ChunkSink(builder, parallel=_raw_size(stream) * (12 if gzipped else 1) >= PARALLEL_MIN_BYTES)
    notes: List[str] = []  # from the reading thread: BOM, UTF-16, trailing gzip bytes
    chunk_bytes = min(CHUNK_BYTES, PARALLEL_CHUNK_BYTES) if sink.workers else CHUNK_BYTES
    blocks = _Prefetcher(_text_blocks(stream, source, gzipped, notes, limit))
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
                    bracket = buf.find(b"[", key) if key >= 0 else -1
                    if bracket < 0:
                        if len(buf) < _MAX_HEADER_BYTES:
                            continue  # header longer than one block: read on
                        if key < 0:
                            raise NotATraceError(source, "JSON object without a 'traceEvents' array in its first "
                                                         f"{_MAX_HEADER_BYTES >> 20} MB")
                        raise NotATraceError(source, "'traceEvents' is not followed by an array within "
                                                     f"{_MAX_HEADER_BYTES >> 20} MB")
                    header = bytes(buf[:key]) + b'"traceEvents":[]}'
                    try:
                        _meta_from(_top_level_values(_loose_top_level(header, meta), meta)[0], meta)
                    except (msgspec.DecodeError, UnicodeDecodeError):
                        chunk_failed = True
                        break
                    start = bracket + 1
                else:
                    raise NotATraceError(source, "not JSON (does not start with '{' or '[')")
                # From here buf always starts with a '[' (this one: the array's own), so a
                # chunk is decoded in place, without copying it (see below).
                consumed += start - 1
                del buf[:start - 1]
                state = "events"
            if state == "events" and len(buf) >= chunk_bytes:
                cut = _last_boundary(buf)
                if cut is None:
                    if len(buf) > _MAX_EVENT_BYTES:  # no progress: not events, or one absurd event
                        raise NotATraceError(source, f"no boundary between events in {_MAX_EVENT_BYTES >> 20} MB "
                                                     f"of text after byte {consumed:,}")
                    continue
                brace_end, next_start = cut
                # The rest (usually part of one event) moves to a new buffer behind a '[';
                # the chunk is closed with a ']' over the separator after its last '}' and
                # decoded from a view: no copies of the 8 MB chunk (was three). Decoded
                # msgspec.Raw fields pin the old buffer, so it is never resized.
                rest = bytearray(b"[")
                rest += memoryview(buf)[next_start:]
                buf[brace_end] = 0x5D  # ']'
                chunk = memoryview(buf)[:brace_end + 1]
                try:
                    sink.add(chunk)
                except (msgspec.DecodeError, UnicodeDecodeError):
                    chunk_failed = True
                    break
                finally:
                    try:
                        chunk.release()
                    except BufferError:  # something still holds a view: the buffer just lives on
                        pass
                consumed += next_start - 1
                buf = rest
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
        # The tail: '[', the remaining events, the closing bracket and trailer keys.
        tail = bytes(buf)
        del buf
        try:
            sink.drain()  # chunks in order before the tail
            if meta.container == "array":
                builder.add(_decode_events(tail, builder))
            else:
                builder.add(_decode_object(b'{"traceEvents":' + tail, builder, meta, source) or [])
        except (msgspec.DecodeError, UnicodeDecodeError):
            # Broken, truncated or unusual text: the whole-file path repairs what it
            # can and otherwise reports the precise problem.
            raise _Fallback() from None
    except _Fallback as fb:
        sink.cancel()
        return _load_whole(stream, source, gzipped, fb.data, limit)
    finally:
        sink.close()
        blocks.close()
    meta.warnings.extend(notes)
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


def _load_whole(stream, source: str, gzipped: bool, data: Optional[bytes],
                limit: Optional[int] = None) -> model.TraceData:
    """Decode the file in one piece: slower, always correct, precise error messages.
    Reads through the same bounded text blocks (cap, whitespace runs) as streaming."""
    notes: List[str] = []
    if data is None:
        stream.seek(0)
        if limit is None:
            limit = _max_decompressed(_raw_size(stream), None)
        data = b"".join(_text_blocks(stream, source, gzipped, notes, limit))
    text = data.lstrip()
    if not text:
        raise TraceError(source, "empty file")
    meta = model.TraceMeta(source=source)
    builder = _Builder(source)

    def decode(payload: bytes):
        if payload[:1] == b"[":
            meta.container = "array"
            return _decode_events(payload, builder)
        events = _decode_object(payload, builder, meta, source)
        if events is None:
            raise NotATraceError(source, "JSON but not a PyTorch profiler trace (no 'traceEvents' array)")
        return events

    try:
        events = decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        repaired = _repair(text)
        if repaired is None:
            _raise_decode_error(source, exc, text)
        meta = model.TraceMeta(source=source)
        builder = _Builder(source)
        try:
            events = decode(repaired)
            meta.warnings.append("the file is not strict JSON (bare N/A, NaN or Infinity values or invalid "
                                 "UTF-8); repaired")
        except (msgspec.DecodeError, UnicodeDecodeError):
            _raise_decode_error(source, exc, text)
    builder.add(events)
    meta.warnings.extend(notes)
    return _finish(builder, meta, source)


# Values Python's json.dumps and old exporters write that JSON does not allow.
_BARE_NA = re.compile(rb":\s*N/A\b")
_BARE_NON_FINITE = re.compile(rb"([:\[,]\s*)-?(?:NaN|Infinity)\b")


def _repair(text: bytes) -> Optional[bytes]:
    """Fix what old exporters wrote: bare N/A values, bare NaN/Infinity (as null, so
    the field is absent) and invalid UTF-8 bytes."""
    fixed = _BARE_NA.sub(b': "N/A"', text)
    fixed = _BARE_NON_FINITE.sub(rb"\1null", fixed)
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
