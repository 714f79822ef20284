"""JSON text -> typed events: the msgspec schema of the fields the analyses read, and
lenient decoding.

Part of the loader (`loader.py` drives it, `loader_columns.py` turns the events into
columns). Well-formed text is decoded in one typed call (`_decode_events`). A chunk that
fails the schema (one value of an unexpected type, a number out of range, an event nested
deeper than msgspec's recursion limit) is decoded again event by event, and a bad event
field by field: the bad field is absent for that event and counted on the ``builder``
(a `loader_columns._Builder`: its ``note`` and skip counters). The top-level keys of a
trace object (header and trailer around ``traceEvents``) are checked one by one
(`_meta_from`): a wrongly typed one costs a warning, not the file.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

import msgspec

from . import model
from ..errors import NotATraceError, TraceError

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
    # More of that metadata, for the per-collective bandwidth (analysis/collectives.py,
    # METRICS.md "Collective bandwidth"): read into columns only for kernels that carry "In msg nelems".
    msg_out_nelems: Num = msgspec.field(default=None, name="Out msg nelems")
    group_size: Num = msgspec.field(default=None, name="Group size")
    coll_name: Optional[str] = msgspec.field(default=None, name="Collective name")
    pg_name: Num = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Process Group Ranks")
    seq: Num = msgspec.field(default=None, name="Seq")
    # Raw: left undecoded (a view, no objects) unless the op is one SHAPE_OP_MARKERS names.
    input_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    input_dims_2020: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")
    # record_shapes' scalar arguments; read only for c10d point-to-point ops (their peer rank)
    concrete_inputs: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Concrete Inputs")
    # Source attribution (METRICS.md §17): the old (<= torch 1.x) per-op Python stack, left
    # undecoded like the inputs (a few hundred distinct texts), and the autograd sequence
    # number that ties a backward op to the forward op that made its node.
    call_stack: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Call stack")
    # absent: -1 (what the column holds for "none"), so the column converts in one call
    sequence: Num = msgspec.field(default=-1, name="Sequence number")
    # Inductor's kernel launches (cpu_op named after the kernel, torch >= 2.5): the
    # generated kernel's file, its content hash and the backend ("triton"). Strings only
    # on those events (METRICS.md §16); a value of another type is absent.
    kernel_file: Optional[str] = None
    kernel_hash: Optional[str] = None
    kernel_backend: Optional[str] = None


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

_STREAM_NUM = re.compile(r"-?\d+")


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


def _decode_raw(raw):
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    except UnicodeDecodeError:  # a recorded input's text with invalid UTF-8 (counted where it was interned)
        return _decode_raw(bytes(raw).decode("utf-8", "replace").encode("utf-8"))


# --------------------------------------------------------------------------- bad strings
#
# One bad string must not cost the file (issue 34): raw invalid UTF-8 (b"\xed\xa0\xbd") and
# lone UTF-16 surrogate escapes ("a\ud83d", which Python's json reads) make msgspec raise.
# On that error path only, the text is sanitised (each replaced by U+FFFD, counted in the
# builder's ``replaced_strings``: a warning) and decoded again; clean text never pays.

# A JSON escape: a surrogate pair (kept), a lone surrogate (group 1: replaced) or any other
# escape (kept; an escaped backslash is consumed whole, so the text \\ud83d, a backslash
# and then letters, stays as it is).
_ESCAPE = re.compile(rb'\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}'
                     rb'|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.', re.S)
_SURROGATE_ESCAPE = re.compile(rb'\\u[dD][89a-fA-F][0-9a-fA-F]{2}')
_REPLACEMENT_RUNS = re.compile(rb"(?:\xef\xbf\xbd)+")  # U+FFFD in UTF-8, one or more


def _sanitised_text(text) -> Optional[Tuple[bytes, int]]:
    """(``text`` with every lone UTF-16 surrogate escape and every invalid UTF-8 sequence
    replaced by U+FFFD, how many strings were fixed), or None when there is nothing to fix."""
    data = bytes(text)
    fixed = 0
    if _SURROGATE_ESCAPE.search(data) is not None:
        lone = [0]

        def replace(m):
            if m.group(1) is None:
                return m.group(0)
            lone[0] += 1
            return b"\\ufffd"

        data = _ESCAPE.sub(replace, data)
        fixed += lone[0]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        before = len(_REPLACEMENT_RUNS.findall(data))
        data = data.decode("utf-8", "replace").encode("utf-8")
        fixed += max(1, len(_REPLACEMENT_RUNS.findall(data)) - before)
    return (data, fixed) if fixed else None


# --------------------------------------------------------------------------- lenient decoding


def _decode_events(payload: bytes, builder) -> List[Event]:
    """The events of the JSON array text ``payload``: one typed call when the text is
    well-formed (the fast path, every clean chunk), else event by event. Bad strings
    (invalid UTF-8, lone surrogates) are replaced on the error path (`_sanitised_text`);
    any other syntax error (msgspec.DecodeError) is left to the caller."""
    try:
        return _EVENTS_DECODER.decode(payload)
    except (msgspec.ValidationError, RecursionError):
        pass
    except (msgspec.DecodeError, UnicodeDecodeError):
        fixed = _sanitised_text(payload)
        if fixed is None:
            raise
        return _decode_fixed(fixed, builder)
    saved = builder.problem_counts()
    try:
        return _decode_leniently(payload, builder)
    except (msgspec.DecodeError, UnicodeDecodeError):
        fixed = _sanitised_text(payload)
        if fixed is None:
            raise
        builder.restore_problem_counts(saved)  # counted again on the fixed text
        return _decode_fixed(fixed, builder)


def _decode_fixed(fixed: Tuple[bytes, int], builder) -> List[Event]:
    """The events of a sanitised text; a syntax error now is another problem (raised)."""
    text, count = fixed
    events = _decode_events(text, builder)
    builder.replaced_strings += count
    return events


def _decode_leniently(payload, builder) -> List[Event]:
    """Event by event (`_decode_events` after the typed call failed)."""
    payload = bytes(payload)  # the slow paths below need bytes (a chunk arrives as a view)
    try:
        raws = _RAW_LIST_DECODER.decode(payload)
    except RecursionError:  # even skipping needs depth: split by scanning
        raws, end = _split_array(payload, payload.index(b"["))
        if end is None:
            raise msgspec.DecodeError("unterminated array") from None
    return _events_from_raws(raws, builder)


def _events_from_raws(raws, builder) -> List[Event]:
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


def _sanitised_event(raw, builder) -> Optional[Event]:
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


def _sanitised_fields(loose, decoders, builder) -> dict:
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


def _decode_object(text: bytes, builder, meta: model.TraceMeta, source: str) -> Optional[List[Event]]:
    """The events and top-level keys of a trace object, leniently; None when it has
    no traceEvents key."""
    try:
        obj = _OBJECT_DECODER.decode(text)
    except (msgspec.ValidationError, RecursionError):
        pass
    except (msgspec.DecodeError, UnicodeDecodeError):  # bad strings: replaced (see _sanitised_text)
        fixed = _sanitised_text(text)
        if fixed is None:
            raise
        events = _decode_object(fixed[0], builder, meta, source)
        builder.replaced_strings += fixed[1]
        return events
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
