"""Streaming, typed decoding of one PyTorch/Kineto trace file into `model.TraceData`.

Why it is built this way:
- Traces reach several GB of JSON. Decoding them whole into dicts costs minutes and
  gigabytes (torch-tb-profiler needs ~1.5 GB for a 300 MB file). Here the decompressed
  text is cut into chunks of whole events, each chunk is decoded with msgspec into
  small typed Structs that name only the fields the analyses use (msgspec skips the
  rest without allocating), turned into numpy columns, and dropped. Peak memory is one
  chunk plus the columns.
- Kineto writes the `traceEvents` array between a header and (before 2025-03) a
  trailer of top-level keys. Both are decoded by wrapping the text so that it is
  valid JSON again: ``header + '"traceEvents":[]}'`` and ``'{"traceEvents":[' + tail``.
- If chunking fails for any reason (an unusual layout, a name containing ``}, {``),
  the file is decoded in one piece, which is always correct, only slower.
- Lenient in what we read, strict in what we keep; bounded in memory and text.

The parts, in the order the data flows (this module drives them and is the public API:
`load_trace`, the errors, the schema structs):
- `loader_text`: file bytes -> bounded UTF-8 text blocks (gunzip in a read-ahead thread,
  encodings, decompression caps).
- this module: container detection (object or bare array), the header, cutting the text
  into chunks of whole events (`_cut_text`, run in the read-ahead thread), the trailer; the
  whole-file fallback and its repairs.
- `loader_events`: JSON text -> typed events (msgspec schema, lenient decoding,
  top-level keys).
- `loader_columns`: typed events -> numpy columns, the string table, recorded inputs,
  warnings (`_Builder`).
- `loader_workers`: the optional decode worker processes for large files.
- `native`: every chunk goes through `native.decode_into`: the optional C scanner
  (`_fastscan.c`) turns a clean chunk into the same columns without an object per event;
  anything unusual goes the `loader_events` + `loader_columns` way.

Every failure becomes a `TraceError` naming the file and the problem.
"""
from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
from typing import List, Optional, Tuple

import msgspec

from . import inductor, model, storage
from ..errors import NotATraceError, TraceError, TruncatedTraceError  # noqa: F401 - re-exported
from .columns import SHAPE_OP_MARKERS, _Builder  # noqa: F401 - re-exported
from .events import (
    Args,
    Event,
    TraceObject,
    _decode_events,
    _decode_object,
    _loose_top_level,
    _meta_from,
    _sanitised_text,
    _top_level_values,
)
from .text import _max_decompressed, _Prefetcher, _text_blocks  # noqa: F401 - _max_decompressed re-exported
from .decode_workers import _ChunkSink
from .native import add_native_tail, decode_into

CHUNK_BYTES = 4 << 20  # decoded text per chunk: big enough to amortise, small for memory (8 MB
# chunks: the same CPU, 12 MB more peak RSS on the 292 MB benchmark; benchmarks/README.md)
# ... with decode workers: every process holds one chunk's events at a time, so smaller
PARALLEL_CHUNK_BYTES = 2 << 20
# No-progress limits: a header (the keys before traceEvents) of MBs, or a single event
# of tens of MB, is not a trace.
_MAX_HEADER_BYTES = 8 << 20
_MAX_EVENT_BYTES = 32 << 20

# Between two events: `}` `,` `{` then a key's opening quote. Inside a JSON string a
# quote is always escaped, so `{"` cannot occur there: the match is a real boundary
# (only an array of objects inside args could fake one; then decoding fails and the
# whole-file path takes over).
_EVENT_BOUNDARY = re.compile(rb'\}\s*,\s*(\{)\s*"')


_gc_lock = threading.Lock()
_gc_loads = 0  # loads running now (threads of one process)
_gc_was_enabled = False


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector off while traces load, back as it was after the last.

    A load allocates millions of objects and keeps few: decoded events are untracked
    structs, but each kernel's grid/block lists are tracked, and every 700 of them start
    a collection that walks the young objects, now and then all of them (~0.1 s of a
    292 MB trace's load). The loader makes no reference cycles; refcounting frees what it
    drops, and the collector, back on, sees what little is left."""
    global _gc_loads, _gc_was_enabled
    with _gc_lock:
        if _gc_loads == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_loads += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_loads -= 1
            if _gc_loads == 0 and _gc_was_enabled:
                gc.enable()


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
    what = storage.not_regular(fs, path)  # a FIFO would block the read forever
    if what is not None:
        raise TraceError(source, f"not a regular file ({what})")
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
    with stream, _collector_paused():
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
    sink = _ChunkSink(builder, text_bytes=_raw_size(stream) * (12 if gzipped else 1))  # gzip: >= 12x
    notes: List[str] = []  # from the reading thread: BOM, UTF-16, trailing gzip bytes
    chunk_bytes = min(CHUNK_BYTES, PARALLEL_CHUNK_BYTES) if sink.workers else CHUNK_BYTES
    # The read-ahead thread gunzips and cuts the text (its copies run beside the decoding
    # here); one cut chunk waits in its queue: a chunk decoded, one queued, one being cut.
    parts = _Prefetcher(_cut_text(_text_blocks(stream, source, gzipped, notes, limit), source, chunk_bytes),
                        depth=1)
    try:
        chunk_failed = False
        unstarted = tail = None
        for kind, data, end in parts:
            if kind == "chunk":
                chunk = memoryview(data)[:end]
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
            elif kind == "header":
                if not _decode_header(data, meta, builder):
                    chunk_failed = True
                    break
            elif kind == "array":
                meta.container = "array"
            elif kind == "tail":
                tail = data
            else:  # "unstarted"
                unstarted = data
        if chunk_failed:
            parts.close()
            raise _Fallback()
        if unstarted is not None:
            if not unstarted.strip():
                raise TraceError(source, "empty file")
            if unstarted.lstrip()[:1] == b"{":
                # Small object whose "traceEvents" was never found: decode whole to tell why.
                raise _Fallback(unstarted)
            raise NotATraceError(source, "not JSON (does not start with '{' or '[')")
        # The tail: '[', the remaining events, the closing bracket and trailer keys.
        try:
            sink.drain()  # chunks in order before the tail
            if meta.container == "array":
                decode_into(tail, builder)
            elif not add_native_tail(tail, builder, lambda trailer: _decode_object(
                    b'{"traceEvents":[]' + trailer, builder, meta, source)):
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
        parts.close()
    meta.warnings.extend(notes)
    return _finish(builder, meta, source)


def _cut_text(blocks, source: str, chunk_bytes: int):
    """The text blocks as the loader decodes them (in the read-ahead thread): first
    ("array", None, 0) or ("header", the keys before traceEvents as an object, 0), then
    ("chunk", buffer, end) per chunk of whole events (buffer[:end]: '[', the events, and
    the ']' written over the separator after the last one), then ("tail", '[' + the rest of
    the text, 0); ("unstarted", the text, 0) when the events array was never found."""
    buf = bytearray()
    consumed = 0  # decompressed bytes before buf[0]
    state = "start"  # -> "events" -> (end)
    # Blocks after buf, joined into a new buffer once a chunk's worth is there: one copy
    # of each byte (growing buf block by block copied it again at every reallocation).
    pending: List[bytes] = []
    pending_bytes = 0
    want = chunk_bytes  # buf + pending size at which a chunk is cut
    for block in blocks:
        if state == "events":
            pending.append(block)
            pending_bytes += len(block)
            if len(buf) + pending_bytes < want:
                continue
            buf = bytearray().join([buf, *pending])
            pending.clear()
            pending_bytes = 0
        else:
            buf += block
        if state == "start":
            head = bytes(buf[:64]).lstrip()
            if not head:
                continue
            if head[:1] == b"[":
                yield "array", None, 0
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
                yield "header", bytes(buf[:key]) + b'"traceEvents":[]}', 0
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
                want = len(buf) + chunk_bytes // 4  # look again after some more text
                continue
            want = chunk_bytes
            brace_end, next_start = cut
            # The rest (usually part of one event) moves to a new buffer behind a '[';
            # the chunk is closed with a ']' over the separator after its last '}' and
            # decoded from a view: no copies of the chunk. Decoded msgspec.Raw fields pin
            # the old buffer, so it is never touched again here.
            rest = bytearray(b"[")
            rest += memoryview(buf)[next_start:]
            buf[brace_end] = 0x5D  # ']'
            yield "chunk", buf, brace_end + 1
            consumed += next_start - 1
            buf = rest
    if pending:
        buf = bytearray().join([buf, *pending])
        pending.clear()
    yield ("unstarted" if state == "start" else "tail"), bytes(buf), 0


def _decode_header(header: bytes, meta: model.TraceMeta, builder: _Builder) -> bool:
    """The top-level keys before traceEvents into ``meta``; bad strings in them are
    replaced (counted on ``builder``). False when the header is not valid JSON."""
    warnings = len(meta.warnings)
    try:
        _meta_from(_top_level_values(_loose_top_level(header, meta), meta)[0], meta)
        return True
    except (msgspec.DecodeError, UnicodeDecodeError):
        fixed = _sanitised_text(header)
    del meta.warnings[warnings:]  # the retry says them again
    if fixed is None:
        return False
    try:
        _meta_from(_top_level_values(_loose_top_level(fixed[0], meta), meta)[0], meta)
    except (msgspec.DecodeError, UnicodeDecodeError):
        del meta.warnings[warnings:]
        return False
    builder.replaced_strings += fixed[1]
    return True


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
        fixed, bare_values, replaced = repaired
        meta = model.TraceMeta(source=source)
        builder = _Builder(source)
        try:
            events = decode(fixed)
            if bare_values:
                meta.warnings.append("the file is not strict JSON (bare N/A, NaN or Infinity values or invalid "
                                     "UTF-8); repaired")
            builder.replaced_strings += replaced
        except (msgspec.DecodeError, UnicodeDecodeError):
            _raise_decode_error(source, exc, text)
    builder.add(events)
    meta.warnings.extend(notes)
    return _finish(builder, meta, source)


# Values Python's json.dumps and old exporters write that JSON does not allow.
_BARE_NA = re.compile(rb":\s*N/A\b")
_BARE_NON_FINITE = re.compile(rb"([:\[,]\s*)-?(?:NaN|Infinity)\b")


def _repair(text: bytes) -> Optional[Tuple[bytes, bool, int]]:
    """Fix what old exporters wrote: bare N/A values, bare NaN/Infinity (as null, so
    the field is absent), and bad strings: invalid UTF-8 bytes, lone UTF-16 surrogate
    escapes (U+FFFD). (the text, whether bare values were fixed, how many strings were), or
    None when there is nothing to fix."""
    fixed = _BARE_NA.sub(b': "N/A"', text)
    fixed = _BARE_NON_FINITE.sub(rb"\1null", fixed)
    bare_values = fixed != text
    sanitised = _sanitised_text(fixed)
    if sanitised is not None:
        fixed, replaced = sanitised
    else:
        replaced = 0
    return (fixed, bare_values, replaced) if bare_values or replaced else None


def _finish(builder: _Builder, meta: model.TraceMeta, source: str) -> model.TraceData:
    trace = builder.finish(meta)
    if trace.kernel_launches:  # Inductor launches: their fused ops, when this machine has the code
        trace.kernel_origins = inductor.kernel_origins(trace)
    usable = len(trace.cpu) + len(trace.gpu) + len(trace.runtime) + len(trace.memory)
    if usable == 0:
        if builder.event_count == 0:
            raise NotATraceError(source, "the trace holds no events")
        raise NotATraceError(source, f"none of its {builder.event_count} events is a profiler event "
                                     "(no complete 'X' events with ts and dur, no [memory] events)")
    return trace
