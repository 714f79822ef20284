"""Hostile and odd inputs: one regression test per loader root cause of issue 10.

Each test builds its minimal input here and pins the exact outcome: a trace whose
other events are all still counted, with the exact warning text, or the exact
TraceError class and message. Lenient in what we read: a wrongly typed field costs a
warning, never the file.
"""
from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from tb_bottleneck_plugin.trace import loader, text as loader_text, model
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis.occupancy import device_properties
from tb_bottleneck_plugin.errors import NotATraceError, TraceError, TruncatedTraceError


def kernel(i: int, **fields) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 100 + 10 * i, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": i, "grid": [4, 1, 1], "block": [128, 1, 1]}}
    e.update(fields)
    return e


STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 90, "dur": 200}
N = 10  # kernels in every trace below


def trace_bytes(replace: dict = None, extra: list = (), **top) -> bytes:
    """N kernels and one step; ``replace`` swaps kernel i for another event."""
    events = [(replace or {}).get(i, kernel(i)) for i in range(N)] + [STEP] + list(extra)
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}).encode()


def load(tmp_path, data: bytes, name="w.1.pt.trace.json") -> model.TraceData:
    path = tmp_path / name
    path.write_bytes(data)
    return loader.load_trace(str(path))


def load_error(tmp_path, data: bytes, name="w.1.pt.trace.json"):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        loader.load_trace(str(path))
    assert str(path) in str(err.value)
    return err.value


def kernels(trace) -> int:
    return int((trace.gpu.kind == model.GPU_KERNEL).sum())


def report_of(trace) -> dict:
    result = report.analyze_trace(trace)
    json.dumps(result, allow_nan=False)
    return result["report"]


# --------------------------------------------------------------------------- wrong types


def test_args_as_a_string_is_absent_for_that_event(tmp_path):
    trace = load(tmp_path, trace_bytes({3: kernel(3, args="x")}))
    assert kernels(trace) == N  # the event stays, without its args
    assert trace.meta.warnings == ["1 events: `args` not an object (treated as absent)"]
    row = trace.strings.index("k3")
    k3 = trace.gpu.name == row
    assert trace.gpu.correlation[k3].tolist() == [-1] and trace.gpu.stream[k3].tolist() == [7]  # tid
    assert report_of(trace)["trace"]["warnings"] == trace.meta.warnings


def test_list_as_cat_is_absent_and_the_event_is_a_cpu_op(tmp_path):
    trace = load(tmp_path, trace_bytes({3: kernel(3, cat=["kernel"])}))
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == ["1 events: `cat` not a string (treated as absent)"]
    assert "k3" in [trace.strings[i] for i in trace.cpu.name]  # no category: a CPU op, like a missing cat
    report_of(trace)


def test_name_that_is_not_a_string(tmp_path):
    trace = load(tmp_path, trace_bytes({3: kernel(3, name={"x": 1})}))
    assert kernels(trace) == N
    assert trace.meta.warnings == ["1 events: `name` not a string (treated as absent)"]


@pytest.mark.parametrize("value, problem", [
    (True, "not a number or string (or out of range)"),
    ([1], "not a number or string (or out of range)"),
])
def test_ts_of_the_wrong_type_drops_the_event(tmp_path, value, problem):
    trace = load(tmp_path, trace_bytes({3: kernel(3, ts=value)}))
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == ["1 events without a usable 'ts' were ignored",
                                   f"1 events: `ts` {problem} (treated as absent)"]


def test_entries_that_are_not_objects_are_skipped(tmp_path):
    data = trace_bytes(extra=[5, "x", [1, 2]])
    trace = load(tmp_path, data)
    assert kernels(trace) == N
    assert trace.meta.warnings == ["3 entries of traceEvents are not objects and were skipped"]


def test_top_level_keys_of_the_wrong_type(tmp_path):
    trace = load(tmp_path, trace_bytes(deviceProperties="x", distributedInfo=[1], baseTimeNanoseconds=2 ** 70))
    assert kernels(trace) == N
    assert trace.meta.device_properties == [] and trace.meta.distributed_info is None
    assert trace.meta.base_time_ns is None
    assert trace.meta.warnings == [
        "`deviceProperties` is not a list of objects (entries that are not were ignored)",
        "`distributedInfo` is not an object (ignored)",
        "`baseTimeNanoseconds` is not an int64 (ignored)",
    ]


def test_bare_array_with_args_as_a_list(tmp_path):
    events = [kernel(i) for i in range(N)] + [STEP]
    events[3]["args"] = [1, 2]
    trace = load(tmp_path, json.dumps(events).encode())
    assert trace.meta.container == "array" and kernels(trace) == N
    assert trace.meta.warnings == ["1 events: `args` not an object (treated as absent)"]


def test_bad_fields_in_every_chunk_of_a_streamed_file(tmp_path, monkeypatch):
    """The lenient path per chunk: every chunk has a bad event, all others count."""
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 1024)
    n = 400
    events = [kernel(i, args="x") if i % 50 == 0 else kernel(i) for i in range(n)] + [STEP]
    trace = load(tmp_path, json.dumps({"traceEvents": events}).encode())
    assert kernels(trace) == n
    assert trace.meta.warnings == [f"{n // 50} events: `args` not an object (treated as absent)"]


# --------------------------------------------------------------------------- ranges


def test_grid_beyond_int64(tmp_path):
    bad = kernel(3)
    bad["args"]["grid"] = [2 ** 70, 1, 1]
    trace = load(tmp_path, trace_bytes({3: bad}))
    assert kernels(trace) == N
    assert trace.meta.warnings == ["1 kernels: `grid` not a list of 3 ints (treated as absent)"]
    k3 = trace.gpu.name == trace.strings.index("k3")
    assert trace.gpu.grid_x[k3].tolist() == [-1] and trace.gpu.block_x[k3].tolist() == [128]
    report_of(trace)


@pytest.mark.parametrize("grid", [[1, 2], [1, "x", 3], [1, 2, -5], [1.5e30, 1, 1]])
def test_grid_that_is_not_three_ints(tmp_path, grid):
    bad = kernel(3)
    bad["args"]["grid"] = grid
    trace = load(tmp_path, trace_bytes({3: bad}))
    assert kernels(trace) == N
    assert trace.meta.warnings == ["1 kernels: `grid` not a list of 3 ints (treated as absent)"]


def test_correlation_beyond_int64_and_negative_sizes(tmp_path):
    big = kernel(3)
    big["args"]["correlation"] = 2 ** 70
    copy = kernel(4, cat="gpu_memcpy")
    copy["args"]["bytes"] = -5
    regs = kernel(5)
    regs["args"]["registers per thread"] = -7
    trace = load(tmp_path, trace_bytes({3: big, 4: copy, 5: regs}))
    assert len(trace.gpu) == N
    assert trace.meta.warnings == [
        "1 kernels: `correlation` beyond int64 (treated as absent)",
        "1 kernels: `registers per thread` negative (treated as absent)",
        "1 memcpys: `bytes` negative (treated as absent)",
    ]
    assert (trace.gpu.bytes >= -1).all() and (trace.gpu.registers_per_thread >= -1).all()


def test_number_out_of_float_range_and_nan(tmp_path):
    data = trace_bytes().replace(b'"ts": 130', b'"ts": 1e400', 1)
    trace = load(tmp_path, data)
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == ["1 events without a usable 'ts' were ignored",
                                   "1 events: `ts` not a number or string (or out of range) (treated as absent)"]
    # Python's json.dumps writes NaN/Infinity (not JSON): repaired to null
    data = json.dumps({"traceEvents": [kernel(i, dur=float("nan") if i == 2 else 5) for i in range(N)]}).encode()
    trace = load(tmp_path, data)
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == [
        "the file is not strict JSON (bare N/A, NaN or Infinity values or invalid UTF-8); repaired",
        "1 complete events without a usable 'dur' were ignored"]


def test_dur_so_large_that_the_end_overflows(tmp_path):
    trace = load(tmp_path, trace_bytes({3: kernel(3, ts=1e308, dur=1e308)}))
    assert kernels(trace) == N - 1
    assert trace.meta.warnings == ["1 events: `dur` so large that ts + dur is infinite (event ignored)"]


def test_step_number_beyond_int64_is_not_a_step(tmp_path):
    step = dict(STEP, name="ProfilerStep#" + "9" * 30)
    trace = load(tmp_path, trace_bytes(extra=[dict(step, ts=400)]))
    rep = report_of(trace)
    assert rep["steps"]["numbers"] == [3] and not rep.get("errors")


# --------------------------------------------------------------------------- nesting


def test_deeply_nested_event_is_skipped(tmp_path):
    deep = b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    data = trace_bytes().replace(b'"traceEvents": [', b'"traceEvents": [' + deep + b", ", 1)
    trace = load(tmp_path, data)
    assert kernels(trace) == N and len(trace.cpu) == 1
    assert trace.meta.warnings == [f"1 events nested deeper than {sys.getrecursionlimit()} levels were skipped"]


def test_deeply_nested_event_in_a_streamed_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 1024)
    events = [kernel(i) for i in range(200)]
    text = json.dumps({"traceEvents": events}).encode()
    deep = b'{"args": {"x": ' + b"[" * 3000 + b"]" * 3000 + b"}}, "
    text = text.replace(b'{"ph": "X", "cat": "kernel", "name": "k100"', deep + b'{"ph": "X", "cat": "kernel", '
                         b'"name": "k100"', 1)
    trace = load(tmp_path, text)
    assert kernels(trace) == 200
    assert trace.meta.warnings == [f"1 events nested deeper than {sys.getrecursionlimit()} levels were skipped"]


@pytest.mark.parametrize("where", ["header", "trailer"])
def test_deep_nesting_outside_the_events_drops_that_key(tmp_path, where):
    deep = b'"meta": ' + b"[" * 5000 + b"]" * 5000
    data = trace_bytes(deviceProperties=[{"id": 0, "name": "GPU"}])
    if where == "header":
        data = b"{" + deep + b", " + data[1:]
    else:
        data = data[:-1] + b", " + deep + b"}"
    trace = load(tmp_path, data)
    assert kernels(trace) == N and trace.meta.device_properties == [{"id": 0, "name": "GPU"}]
    assert trace.meta.warnings == [f'top-level key "meta" nested deeper than {sys.getrecursionlimit()} levels '
                                   "(ignored)"]


def test_deep_nesting_in_a_trace_that_is_only_deep(tmp_path):
    err = load_error(tmp_path, b"[" * 5000 + b"]" * 5000)
    assert type(err) is NotATraceError and err.problem == "the trace holds no events"


# --------------------------------------------------------------------------- encodings, gzip


def test_utf8_bom_is_accepted(tmp_path):
    trace = load(tmp_path, b"\xef\xbb\xbf" + trace_bytes())
    assert kernels(trace) == N and trace.meta.warnings == []
    trace = load(tmp_path, gzip.compress(b"\xef\xbb\xbf" + trace_bytes()), name="w.2.pt.trace.json.gz")
    assert kernels(trace) == N and trace.meta.warnings == []


@pytest.mark.parametrize("codec, name", [("utf-16", "UTF-16-LE"), ("utf-16-be", "UTF-16-BE"),
                                         ("utf-32", "UTF-32-LE")])
def test_utf16_and_utf32_are_decoded(tmp_path, codec, name):
    trace = load(tmp_path, trace_bytes().decode().encode(codec))
    assert kernels(trace) == N
    assert trace.meta.warnings == [f"the file is {name} text, not UTF-8: decoded"]


def test_invalid_utf16_is_a_clear_error(tmp_path):
    err = load_error(tmp_path, "{".encode("utf-16") + b"\x00\xd8\x00\xd8")  # lone surrogates
    assert type(err) is TraceError and err.problem.startswith("not valid text (")


def test_trailing_garbage_after_the_gzip_member(tmp_path):
    data = gzip.compress(trace_bytes()) + b"this is not gzip" * 100
    trace = load(tmp_path, data, name="w.1.pt.trace.json.gz")
    assert kernels(trace) == N
    assert trace.meta.warnings == ["bytes after the end of the gzip stream (not another gzip member) were ignored"]
    # zero padding (some copiers) is ignored silently, a second member is read
    trace = load(tmp_path, gzip.compress(trace_bytes()) + b"\x00" * 100, name="w.2.pt.trace.json.gz")
    assert trace.meta.warnings == []


def test_truncated_second_member_is_still_truncated(tmp_path):
    data = trace_bytes()
    two = gzip.compress(data[:100]) + gzip.compress(data[100:])
    path = tmp_path / "w.1.pt.trace.json.gz"
    path.write_bytes(two[:-20])
    with pytest.raises(TruncatedTraceError):
        loader.load_trace(str(path))


# --------------------------------------------------------------------------- bounds


def test_decompressed_size_cap(tmp_path, monkeypatch):
    data = gzip.compress(trace_bytes())
    path = tmp_path / "w.1.pt.trace.json.gz"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        loader.load_trace(str(path), max_decompressed_bytes=100)
    assert err.value.problem == ("more than 100 bytes of text after decompression: refused (a decompression "
                                 "bomb? the limit is TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES)")
    monkeypatch.setenv("TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES", "100")
    with pytest.raises(TraceError):
        loader.load_trace(str(path))
    assert kernels(loader.load_trace(str(path), max_decompressed_bytes=1 << 20)) == N
    monkeypatch.delenv("TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES")
    assert loader._max_decompressed(1 << 30, None) == 40 << 30  # 40x the stored size
    assert loader._max_decompressed(1000, None) == 8 << 30


def test_header_that_never_ends(tmp_path):
    err = load_error(tmp_path, b'{"a": "' + b"x" * (9 << 20))
    assert type(err) is NotATraceError
    assert err.problem == "JSON object without a 'traceEvents' array in its first 8 MB"


def test_event_that_never_ends(tmp_path):
    err = load_error(tmp_path, b'{"traceEvents": [{"name": "' + b"x" * (40 << 20))
    assert type(err) is NotATraceError
    assert err.problem.startswith("no boundary between events in 32 MB of text after byte ")


def test_whitespace_in_plain_text(tmp_path):
    err = load_error(tmp_path, b'{"traceEvents": [' + b" " * (5 << 20) + b"]}")
    assert type(err) is TraceError
    assert err.problem.startswith("more than 4 MB of whitespace in a row at byte ")


def _crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine (Python's zlib does not expose it): the CRC of A+B from the
    CRCs of A and B and the length of B, by GF(2) matrix squaring."""
    def times(mat, vec):
        s, i = 0, 0
        while vec:
            if vec & 1:
                s ^= mat[i]
            vec >>= 1
            i += 1
        return s

    def square(mat):
        return [times(mat, mat[n]) for n in range(32)]

    odd = [0xEDB88320] + [1 << n for n in range(31)]
    even = square(odd)
    odd = square(even)
    while True:
        even = square(odd)
        if len2 & 1:
            crc1 = times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = square(even)
        if len2 & 1:
            crc1 = times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def whitespace_bomb(path, gib: int = 10) -> int:
    """A valid gzip of ``{"traceEvents":[`` + ``gib`` GiB of spaces, written in a streaming
    way: one 1 MiB block of spaces is compressed once after a full flush (so it needs no
    earlier history) and repeated; the trailer's CRC is combined, not recomputed.
    Returns the file size (~10 MB for 10 GiB)."""
    head = b'{"traceEvents":['
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    spaces = b" " * (1 << 20)
    block = comp.compress(spaces) + comp.flush(zlib.Z_FULL_FLUSH)
    copies = gib << 10
    crc, block_crc = zlib.crc32(head), zlib.crc32(spaces)
    doubled, n = block_crc, len(spaces)  # CRC of the block repeated 2^k times, by doubling
    k = copies
    while k:
        if k & 1:
            crc = _crc32_combine(crc, doubled, n)
        doubled, n = _crc32_combine(doubled, doubled, n), 2 * n
        k >>= 1
    with open(path, "wb") as f:
        f.write(first)
        for _ in range(copies):
            f.write(block)
        f.write(b"\x03\x00")  # a final, empty fixed-Huffman block
        f.write(struct.pack("<II", crc, (len(head) + copies * len(spaces)) & 0xFFFFFFFF))
    return os.path.getsize(path)


def test_whitespace_bomb_helper_writes_valid_gzip(tmp_path):
    """The bomb builder's tricks (a repeated fully-flushed block, a combined CRC) give
    a gzip that the standard library decompresses to exactly the intended text."""
    a, b = b"hello ", b" " * 5000
    assert _crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    path = tmp_path / "small.json.gz"
    whitespace_bomb(path, gib=0)
    assert gzip.decompress(path.read_bytes()) == b'{"traceEvents":['
    mib = 3  # the same construction, 3 MiB of spaces
    head = b'{"traceEvents":['
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(b" " * (1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
    crc = _crc32_combine(zlib.crc32(head), zlib.crc32(b" " * (mib << 20)), mib << 20)
    data = first + block * mib + b"\x03\x00" + struct.pack("<II", crc, len(head) + (mib << 20))
    assert gzip.decompress(data) == head + b" " * (mib << 20)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS from /proc (Linux)")
def test_whitespace_bomb_is_rejected_fast_in_bounded_memory(tmp_path):
    """The 10 MB gzip of 10 GiB of whitespace: rejected in seconds, peak RSS of a fresh
    process <= 100 MB above its baseline (measured there, so nothing else counts)."""
    path = tmp_path / "bomb.pt.trace.json.gz"
    size = whitespace_bomb(path)
    assert 5e6 < size < 20e6
    script = textwrap.dedent(f"""
        import json, time
        from tb_bottleneck_plugin.trace import loader
        from tb_bottleneck_plugin.errors import TraceError
        def status_kb(key):  # this process image only: ru_maxrss would include the
            # forking parent's RSS (Linux keeps the pre-exec peak in ru_maxrss)
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith(key))
        base = status_kb("VmRSS:")
        t = time.perf_counter()
        try:
            loader.load_trace({str(path)!r})
            outcome = "loaded"
        except TraceError as exc:
            outcome = type(exc).__name__ + ": " + exc.problem
        print(json.dumps({{"outcome": outcome, "seconds": time.perf_counter() - t,
                           "added_mb": (status_kb("VmHWM:") - base) / 1024}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    print(result)
    assert result["outcome"].startswith("TraceError: more than 4 MB of whitespace in a row at byte "), result
    assert result["seconds"] < 5, result
    assert result["added_mb"] <= 100, result


def test_whitespace_bomb_after_a_broken_chunk_is_bounded_in_the_whole_file_path(tmp_path):
    """A syntax error early sends the file to the whole-file path; its join is bounded
    by the same checks."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = comp.compress(b'[{"ph": "X", "ts": 1, "dur": 1},, ')
    spaces = b" " * (1 << 20)
    for _ in range(64):
        data += comp.compress(spaces)
    data += comp.flush()
    err = load_error(tmp_path, data, name="w.1.pt.trace.json.gz")
    assert err.problem.startswith("more than 4 MB of whitespace in a row")


def test_clean_trace_has_no_warnings_and_all_events(tmp_path):
    trace = load(tmp_path, trace_bytes())
    assert kernels(trace) == N and len(trace.cpu) == 1 and trace.meta.warnings == []
    assert np.isfinite(trace.gpu.ts).all()


def test_device_properties_with_ids_that_are_not_integers(tmp_path):
    props = [{"id": "gpu0", "name": "A"}, {"id": 1e300 * 1e300, "name": "B"}, {"name": "C"}, {"id": "7", "name": "D"}]
    trace = load(tmp_path, json.dumps({"traceEvents": [kernel(i) for i in range(N)],
                                       "deviceProperties": props}).replace("Infinity", "1e400").encode())
    assert kernels(trace) == N
    assert trace.meta.warnings == ["`deviceProperties`: 1 values beyond the float range were ignored"]
    # The analyses' lookup (occupancy, memory capacity): an id that is not an integer ("gpu0",
    # 1e400 beyond float, the string "7") or is missing stands for the entry's position.
    by_id = device_properties(trace)
    assert {k: p["name"] for k, p in by_id.items()} == {0: "A", 1: "B", 2: "C", 3: "D"}
    report_of(trace)


def test_event_longer_than_several_chunks(tmp_path, monkeypatch):
    """A chunk is cut only at an event boundary: an event many chunks long (a huge args
    text) waits for more blocks, and every event before, inside and after it counts."""
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 512)
    events = [kernel(i) for i in range(300)]
    events[150]["args"]["note"] = "x" * 20_000  # ~10 chunks with no boundary inside
    trace = load(tmp_path, json.dumps({"traceEvents": events + [STEP]}).encode())
    assert kernels(trace) == 300
    assert sorted(trace.gpu.correlation.tolist()) == sorted(e["args"]["correlation"] for e in events)
