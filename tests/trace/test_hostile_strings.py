"""Issue 34 item 10, "bad input never costs the trace": one bad string.

Raw invalid UTF-8 (bytes ED A0 BD: a UTF-16 surrogate encoded as UTF-8) and lone UTF-16
surrogate escapes ("a\\ud83d", which Python's json reads) used to lose the whole file
("internal error: UnicodeDecodeError", "invalid JSON", "JSON ends early"). Now the string
is replaced (U+FFFD), the trace's warnings say so, and every event is still there. The
loader's fast path is unchanged: the sanitising decode runs only where msgspec raised.
"""
from __future__ import annotations

import json
import warnings

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.trace import decode_workers, loader, model, text as loader_text
from tb_bottleneck_plugin.errors import TraceError, TruncatedTraceError

N = 10  # kernels in every trace
BAD_UTF8 = b"\xed\xa0\xbd"
LONE = b"\\ud83d"  # as the JSON text writes it
ONE = "1 string held invalid UTF-8 or a lone UTF-16 surrogate (replaced by U+FFFD)"


def kernel(i: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 100 + 10 * i, "dur": 5,
            "args": {"device": 0, "stream": 7, "correlation": i, "grid": [4, 1, 1], "block": [128, 1, 1]}}


def mm(i: int = 0) -> dict:
    """A CPU op whose recorded inputs are decoded (aten::mm is a shape op)."""
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 95 + i, "dur": 10,
            "args": {"Input Dims": "DIMS", "Input type": "TYPES", "External id": 1}}


STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 90, "dur": 200}


def trace_bytes(events=None, **top) -> bytes:
    events = [kernel(i) for i in range(N)] + [STEP, mm()] if events is None else events
    return json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()


def with_inputs(data: bytes, dims: bytes = b'[[2, 3], [3, 4]]', types: bytes = b'["float", "float"]') -> bytes:
    return data.replace(b'"DIMS"', dims).replace(b'"TYPES"', types)


def load(tmp_path, data: bytes, name="w.1.pt.trace.json") -> model.TraceData:
    path = tmp_path / name
    path.write_bytes(data)
    return loader.load_trace(str(path))


def analysed(trace) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = report.analyze_trace(trace)
    json.dumps(result, allow_nan=False)
    rep = result["report"]
    assert rep["errors"] == []
    return rep


def kernels(trace) -> int:
    return int((trace.gpu.kind == model.GPU_KERNEL).sum())


CASES = {
    # where, the bytes in place of a clean value
    "Input Dims, invalid UTF-8": lambda d: with_inputs(d, dims=b'[[2, 3], "' + BAD_UTF8 + b'"]'),
    "Input type, invalid UTF-8": lambda d: with_inputs(d, types=b'["float' + BAD_UTF8 + b'"]'),
    "name, invalid UTF-8": lambda d: with_inputs(d).replace(b'"k3"', b'"k3' + BAD_UTF8 + b'"'),
    "name, lone surrogate": lambda d: with_inputs(d).replace(b'"k3"', b'"a' + LONE + b'"'),
    "name, lone low surrogate": lambda d: with_inputs(d).replace(b'"k3"', b'"a\\udc00b"'),
    "Input Dims, lone surrogate": lambda d: with_inputs(d, dims=b'[[2, 3], "a' + LONE + b'"]'),
    "Input type, lone surrogate": lambda d: with_inputs(d, types=b'["a' + LONE + b'"]'),
    "cat, lone surrogate": lambda d: with_inputs(d).replace(b'"cat": "cpu_op"', b'"cat": "cpu' + LONE + b'op"'),
    "traceName (header), lone surrogate": lambda d: with_inputs(d).replace(
        b'"schemaVersion": 1', b'"schemaVersion": 1, "traceName": "x' + LONE + b'"'),
    "deviceProperties (header), invalid UTF-8": lambda d: with_inputs(d).replace(
        b'"schemaVersion": 1', b'"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "G' + BAD_UTF8 + b'"}]'),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_bad_string_is_replaced_and_warned(tmp_path, case):
    data = CASES[case](trace_bytes())
    if LONE in data:
        json.loads(data)  # Python's json reads it: so must we
    trace = load(tmp_path, data)
    assert kernels(trace) == N and len(trace.cpu) == 2  # every event is still there
    assert trace.meta.warnings == [ONE]
    rep = analysed(trace)
    assert rep["trace"]["warnings"] == [ONE]
    assert any("\ufffd" in s for s in trace.strings) or "\ufffd" in json.dumps(
        [trace.meta.trace_name, trace.meta.device_properties, dict(trace.op_inputs.dims),
         dict(trace.op_inputs.types)], ensure_ascii=False)


def test_the_replaced_inputs_are_decoded(tmp_path):
    trace = load(tmp_path, CASES["Input Dims, invalid UTF-8"](trace_bytes()))
    (dims,) = trace.op_inputs.dims.values()
    assert dims == [[2, 3], "\ufffd\ufffd\ufffd"]  # Python's "replace": one U+FFFD per bad byte here
    trace = load(tmp_path, CASES["Input type, lone surrogate"](trace_bytes()))
    (types,) = trace.op_inputs.types.values()
    assert types == ["a\ufffd"]


def test_pairs_and_escaped_backslashes_are_not_touched(tmp_path):
    data = with_inputs(trace_bytes()).replace(b'"k3"', b'"\\ud83d\\ude00 \\\\ud83d"').replace(b'"k4"', b'"a\\ud83d"')
    trace = load(tmp_path, data)
    assert trace.meta.warnings == [ONE]  # k4 only
    assert "\U0001F600 \\ud83d" in trace.strings and "a\ufffd" in trace.strings


def test_several_bad_strings_are_counted(tmp_path):
    data = with_inputs(trace_bytes())
    for i in (1, 2, 3):
        data = data.replace(f'"k{i}"'.encode(), f'"k{i}'.encode() + (LONE if i % 2 else BAD_UTF8) + b'"')
    trace = load(tmp_path, data)
    assert kernels(trace) == N
    assert trace.meta.warnings == ["3 strings held invalid UTF-8 or a lone UTF-16 surrogate (replaced by U+FFFD)"]


def streamed(monkeypatch):
    """Chunks of 2 KB, and no whole-file decode: a bad string is fixed in its chunk."""
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 1024)

    def whole(*args, **kwargs):
        raise AssertionError("fell back to decoding the whole file")

    monkeypatch.setattr(loader, "_load_whole", whole)


@pytest.mark.parametrize("container", ["object", "array"])
def test_bad_strings_in_many_chunks_are_fixed_per_chunk(tmp_path, monkeypatch, container):
    streamed(monkeypatch)
    n = 400
    events = [kernel(i) for i in range(n)] + [STEP] + [mm(i) for i in range(40)]
    text = json.dumps(events if container == "array" else {"schemaVersion": 1, "traceEvents": events}).encode()
    text = with_inputs(text, dims=b'[[2], "' + BAD_UTF8 + b'"]')  # one distinct text: one string
    for i in range(0, n, 50):  # a bad name in every few chunks
        text = text.replace(f'"k{i}"'.encode(), f'"k{i}'.encode() + (LONE if i % 100 else BAD_UTF8) + b'"')
    trace = load(tmp_path, text)
    assert kernels(trace) == n and len(trace.cpu) == 41
    assert trace.meta.warnings == [f"{n // 50 + 1} strings held invalid UTF-8 or a lone UTF-16 surrogate "
                                   "(replaced by U+FFFD)"]


def test_bad_string_with_a_wrongly_typed_field_in_the_same_chunk(tmp_path, monkeypatch):
    """The lenient path's counts are not doubled by the sanitised retry."""
    streamed(monkeypatch)
    events = [kernel(i) for i in range(200)] + [STEP]
    events[5]["args"] = "x"
    text = json.dumps({"traceEvents": events}).encode().replace(b'"k7"', b'"k7' + LONE + b'"')
    trace = load(tmp_path, text)
    assert kernels(trace) == 200
    assert trace.meta.warnings == ["1 events: `args` not an object (treated as absent)", ONE]


def test_bad_header_string_is_fixed_without_the_whole_file_path(tmp_path, monkeypatch):
    streamed(monkeypatch)
    data = CASES["traceName (header), lone surrogate"](trace_bytes([kernel(i) for i in range(300)] + [STEP, mm()]))
    trace = load(tmp_path, data)
    assert trace.meta.trace_name == "x\ufffd" and trace.meta.warnings == [ONE]


def test_bad_strings_with_decode_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(loader, "PARALLEL_CHUNK_BYTES", 4096)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 1024)
    monkeypatch.setattr(decode_workers, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    sent = []
    close = decode_workers._ChunkSink.close

    def counted_close(sink):
        sent.append(sink.sent)
        close(sink)

    monkeypatch.setattr(decode_workers._ChunkSink, "close", counted_close)
    n = 2000
    text = json.dumps({"traceEvents": [kernel(i) for i in range(n)] + [STEP]}).encode()
    for i in range(0, n, 100):
        text = text.replace(f'"k{i}"'.encode(), f'"k{i}'.encode() + (LONE if i % 200 else BAD_UTF8) + b'"')
    trace = load(tmp_path, text)
    assert kernels(trace) == n and sent and sent[0] > 0  # chunks were decoded by the worker
    assert trace.meta.warnings == [f"{n // 100} strings held invalid UTF-8 or a lone UTF-16 surrogate "
                                   "(replaced by U+FFFD)"]


def test_other_broken_json_still_fails_as_before(tmp_path):
    data = with_inputs(trace_bytes()).replace(b'"k3"', b'"a' + LONE + b'"')
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(data[:-40])  # truncated, with a lone surrogate before the cut
    with pytest.raises(TruncatedTraceError):
        loader.load_trace(str(path))
    path.write_bytes(data.replace(b'"ts": 140', b'"ts": 140,,'))  # a syntax error beside it
    with pytest.raises(TraceError, match="invalid JSON"):
        loader.load_trace(str(path))


def test_bare_nan_and_a_bad_string_in_the_whole_file_path(tmp_path):
    data = with_inputs(trace_bytes()).replace(b'"dur": 5', b'"dur": NaN', 1).replace(b'"k3"', b'"a' + LONE + b'"')
    trace = load(tmp_path, data)
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == [
        "the file is not strict JSON (bare N/A, NaN or Infinity values or invalid UTF-8); repaired",
        "1 complete events without a usable 'dur' were ignored", ONE]
