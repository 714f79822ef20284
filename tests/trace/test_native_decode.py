"""The native chunk decoding (trace/_fastscan.c + trace/native.py, issue 39) builds exactly
what msgspec + `_Builder.add` build: every column, the string table and its ids, recorded
inputs, launches, counters and warnings, on every shared trace (small chunks: many chunks,
so many merges of string tables), in-process and with decode workers. A chunk with anything
unusual is not decoded natively and goes the msgspec way, with today's warnings. The
extension is really used where it is built (it cannot silently always fall back)."""
from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sysconfig

import pytest

from tb_bottleneck_plugin.trace import decode_workers, loader, model, native, text
from tb_bottleneck_plugin.trace.columns import _Builder
from tb_bottleneck_plugin.trace.events import _decode_events

from conftest import REPO, TRACES

SHARED_TRACES = sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*.json*") if p.is_file())
# the largest GPU trace of the 2021 format: many chunks, string tids, call stacks, inputs
RESNET = "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"

needs_extension = pytest.mark.skipif(native._fastscan is None, reason="the C scanner is not built here")


def digest(trace) -> dict:
    """Every part of a loaded trace, as bytes (columns with their dtype) or reprs."""
    out = {"strings": trace.strings}
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        t = getattr(trace, table)
        for f in dataclasses.fields(t):
            col = getattr(t, f.name)
            out[f"{table}.{f.name}"] = (col.dtype.str, col.shape, hashlib.sha1(col.tobytes()).hexdigest())
    for part in ("dims", "types", "peers"):
        out[f"op_inputs.{part}"] = repr(sorted(getattr(trace.op_inputs, part).items()))
    out["kernel_launches"] = repr(list(trace.kernel_launches.items()))
    out["meta"] = repr(dataclasses.asdict(trace.meta))
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    diff = [k for k in a if a[k] != b[k]]
    assert not diff, f"different: {diff}"


def _load(path: str, monkeypatch, native_on: bool, workers: int = 0):
    monkeypatch.setenv("TB_BOTTLENECKS_NATIVE_DECODE", "1" if native_on else "0")
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", str(workers))
    native.stats.update(native=0, fallback=0)
    trace = loader.load_trace(path)
    return digest(trace), dict(native.stats)


@pytest.fixture
def small_chunks(monkeypatch):
    """256 KB chunks (the 35 MB traces: ~140 chunks), one cut per text block."""
    size = 1 << 18
    monkeypatch.setattr(loader, "CHUNK_BYTES", size)
    monkeypatch.setattr(loader, "PARALLEL_CHUNK_BYTES", size)
    monkeypatch.setattr(text, "_OUT_BYTES", min(text._OUT_BYTES, size))
    monkeypatch.setattr(decode_workers, "PARALLEL_MIN_BYTES", 0)


@needs_extension
@pytest.mark.parametrize("rel", SHARED_TRACES)
def test_every_shared_trace_loads_the_same_natively(rel, small_chunks, monkeypatch):
    path = str(TRACES / rel)
    pure, stats = _load(path, monkeypatch, native_on=False)
    assert stats == {"native": 0, "fallback": 0}  # switched off: not even tried
    got, stats = _load(path, monkeypatch, native_on=True)
    assert_same(pure, got)


@needs_extension
def test_with_decode_workers(small_chunks, monkeypatch):
    """Two workers decoding chunks natively (the loading process too): the same tables."""
    path = str(TRACES / "hta/trace_diff/control/control.json.gz")
    pure, _ = _load(path, monkeypatch, native_on=False, workers=2)
    got, stats = _load(path, monkeypatch, native_on=True, workers=2)
    assert_same(pure, got)
    in_process, _ = _load(path, monkeypatch, native_on=True, workers=0)
    assert_same(pure, in_process)


@needs_extension
def test_the_extension_is_really_used(small_chunks, monkeypatch):
    """Every chunk of a real trace decoded natively, none fallen back; switched off, none."""
    _, stats = _load(str(TRACES / RESNET), monkeypatch, native_on=True)
    assert stats["native"] > 100 and stats["fallback"] == 0
    _, stats = _load(str(TRACES / RESNET), monkeypatch, native_on=False)
    assert stats["native"] == 0


def test_the_extension_is_built_where_a_compiler_is():
    """An install with a C compiler builds the scanner (setup.py: optional=True only for
    machines without one): a broken build must not pass unnoticed as "always fall back"."""
    if not (shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc")):
        pytest.skip("no C compiler on this machine")
    assert native._fastscan is not None, "python3 -m pip install -e . (or setup.py build_ext --inplace) builds it"


# ---------------------------------------------------------------- hand-made chunks
CLEAN_EVENTS = [
    b'{"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": "stream 7", "ts": 10, "dur": 2.5, '
    b'"args": {"device": 0, "stream": 7, "correlation": 5, "External id": 3, "grid": [1, 2, 3], '
    b'"block": [128, 1, 1], "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, '
    b'"warps per SM": 4.0, "est. achieved occupancy %": 12}}',
    b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 9.25, '
    b'"dur": 1, "args": {"correlation": 5, "external id": 3}}',
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 8, "dur": 4, '
    b'"args": {"External id": 3, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"], '
    b'"Sequence number": 7, "unknown": {"nested": [1, "x\\n\\u00e9", null, true]}}}',
    b'{"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": 2, "ts": 8.5, "dur": -1}',
    b'{"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 11, "args": {"Device Type": 1, '
    b'"Device Id": 0, "Bytes": -512, "Total Allocated": 1024, "Total Reserved": 2048, "Addr": 140000000000}}',
    b'{"ph": "X", "cat": "gpu_user_annotation", "name": "step", "pid": 0, "tid": 7, "ts": 7, "dur": 6}',
    b'{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "pid": "Spans", "tid": 0, "ts": 1, "dur": 20}',
    b'{"ph": "X", "name": "no category", "pid": 1, "tid": 2, "ts": 12}',
    b'{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}}',
    b'{"ph": "X", "cat": "python_function", "name": null, "pid": 1, "tid": 2, "ts": 13, "dur": 1, '
    b'"args": {"Call stack": "a.py(1): f;b.py(2): g"}}',
    # a raw field's null is its text "null" (msgspec.Raw), not an absent value
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 2, "ts": 14, "dur": 1, '
    b'"args": {"Input Dims": null, "Input type": 5, "Call stack": ""}}',
]


def _chunk(*extra: bytes) -> bytes:
    return b"[" + b", ".join(CLEAN_EVENTS + list(extra)) + b"]"


def _pure(chunk: bytes):
    builder = _Builder("x")
    try:
        builder.add(_decode_events(chunk, builder))
    except Exception as exc:  # noqa: BLE001 - a syntax error: the same one both ways
        return {"error": repr(exc)}
    return digest(builder.finish(model.TraceMeta(source="x")))


def _via_decode_into(chunk: bytes):
    builder = _Builder("x")
    try:
        native.decode_into(chunk, builder)
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}
    return digest(builder.finish(model.TraceMeta(source="x")))


@needs_extension
def test_a_clean_chunk_is_decoded_natively(monkeypatch):
    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    chunk = _chunk()
    builder = _Builder("x")
    assert native.add_native(chunk, builder)
    got = digest(builder.finish(model.TraceMeta(source="x")))
    pure = _pure(chunk)
    assert_same(pure, got)
    meta = eval(pure["meta"], {"inf": float("inf")})  # noqa: S307 - our own repr of a dict
    assert meta["warnings"]  # the dropped and negative durations, counted the same
    assert meta["category_counts"] == {"kernel": 1, "cuda_runtime": 1, "cpu_op": 2, "Operator": 1,
                                       "gpu_user_annotation": 1, "Trace": 1, "": 1, "python_function": 1,
                                       "[memory]": 1}


# Each: one unusual thing the scanner or the native builder does not take.
FALLBACKS = {
    "escape in a name": b'{"ph": "X", "cat": "cpu_op", "name": "a\\"b", "pid": 1, "tid": 2, "ts": 1, "dur": 1}',
    "escaped key": b'{"ph": "X", "cat": "cpu_op", "n\\u0061me": "x", "pid": 1, "tid": 2, "ts": 1, "dur": 1}',
    "boolean pid": b'{"ph": "X", "cat": "cpu_op", "name": "x", "pid": true, "tid": 2, "ts": 1, "dur": 1}',
    "list ts": b'{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 2, "ts": [1], "dur": 1}',
    "number category": b'{"ph": "X", "cat": 7, "name": "x", "pid": 1, "tid": 2, "ts": 1, "dur": 1}',
    "args not an object": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1, "args": 5}',
    "huge int": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                b'"args": {"correlation": 99999999999999999999}}',
    "float beyond range": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1e400, "dur": 1}',
    "NaN string ts": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "NaN", "dur": 1}',
    "inf string occupancy": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                            b'"args": {"blocks per SM": "inf"}}',
    "float pid": b'{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1.5, "ts": 1, "dur": 1}',
    "negative registers": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                          b'"args": {"registers per thread": -5}}',
    "device beyond int32": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                           b'"args": {"device": 4294967296}}',
    "grid of two": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"grid": [1, 2]}}',
    "occupancy object": b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                        b'"args": {"occupancy": {"limitingFactors": "registers"}}}',
    "invalid UTF-8": b'{"ph": "X", "cat": "cpu_op", "name": "a\xff\xfeb", "ts": 1, "dur": 1}',
    "invalid UTF-8 in a skipped value": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1, '
                                        b'"args": {"other": "\xed\xa0\xbd"}}',
    "lone surrogate in recorded inputs": b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, '
                                         b'"args": {"Input type": ["\\ud83d"]}}',
    "control character (a syntax error)": b'{"ph": "X", "cat": "cpu_op", "name": "a\tb", "ts": 1, "dur": 1}',
    "deep nesting": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1, "args": {"deep": '
                    + b"[" * 2000 + b"]" * 2000 + b"}}",
    "a key twice": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1, "dur": 2}',
    "not an object": b'5',
    "ts + dur infinite": b'{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1e308, "dur": 1e308}',
}


@needs_extension
@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_unusual_chunks_go_the_msgspec_way(case, monkeypatch):
    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    chunk = _chunk(FALLBACKS[case])
    builder = _Builder("x")
    before = digest(builder.finish(model.TraceMeta(source="x")))
    builder = _Builder("x")
    assert not native.add_native(chunk, builder)
    assert_same(before, digest(builder.finish(model.TraceMeta(source="x"))))  # left untouched
    assert_same(_pure(chunk), _via_decode_into(chunk))


@needs_extension
def test_the_unusual_cases_still_warn(monkeypatch):
    """The fallback keeps the lenient decoding's warnings (a sample of the cases above)."""
    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    for case, words in (("negative registers", "registers per thread` negative"),
                        ("boolean pid", "`pid`"), ("invalid UTF-8", "invalid UTF-8")):
        builder = _Builder("x")
        native.decode_into(_chunk(FALLBACKS[case]), builder)
        warnings = builder.finish(model.TraceMeta(source="x")).meta.warnings
        assert any(words in w for w in warnings), (case, warnings)


@needs_extension
@pytest.mark.parametrize("chunk", [b"[]", b" [ ] ", b"[{}]", b'[{"args": null, "name": null}, {"args": {}}]'])
def test_empty_chunks_and_events(chunk, monkeypatch):
    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    assert native.add_native(chunk, _Builder("x"))
    assert_same(_pure(chunk), _via_decode_into(chunk))


@needs_extension
def test_a_syntax_error_raises_as_before(monkeypatch):
    import msgspec

    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    for chunk in (_chunk() + b"x", _chunk()[:-1], b"[{" + b'"a": 1,}]'):
        with pytest.raises(msgspec.DecodeError):
            native.decode_into(chunk, _Builder("x"))


@needs_extension
def test_floats_are_correctly_rounded(monkeypatch):
    """Numbers from the fast path and from strtod equal msgspec's (and Python's) parse."""
    import random

    import msgspec
    import numpy as np

    rng = random.Random(39)
    texts = ["0.1", "1e22", "1e23", "9007199254740993.0", "1623142623460016.5", "0.30000000000000004",
             "1712150898473530.250", "123456789012345678901234567890e-10", "2.2250738585072014e-308",
             "4.9406564584124654e-324", "-0.0", "1E5", "0.000000000000000000000001234"]
    texts += [repr(rng.uniform(-1e6, 1e17)) for _ in range(300)]
    texts += [f"{rng.randrange(10**12, 10**19)}.{rng.randrange(10**6):06d}" for _ in range(300)]
    texts += [f"{rng.randrange(1, 10**17)}e{rng.randrange(-40, 40)}" for _ in range(300)]
    for t in texts:
        chunk = b'[{"ph": "X", "cat": "cpu_op", "name": "x", "ts": ' + t.encode() + b', "dur": 1}]'
        result = native._fastscan.scan(chunk)
        if result is None:  # under-/overflow: the msgspec way
            continue
        n, kinds, values = result[:3]
        assert kinds[native.TS] == native.K_FLOAT  # one event: field f's kind at f
        got = np.frombuffer(values[native.TS], np.float64)[0]
        want = msgspec.json.decode(t.encode())
        assert got == want and np.signbit(got) == np.signbit(want) and float(t) == want, t


@needs_extension
def test_fuzzed_traces_load_the_same_natively(tmp_path, monkeypatch):
    """Mutated real traces (benchmarks/fuzz.py: wrong types, extreme numbers, bad bytes, deep
    nesting, ...) in 4 KB chunks: the same tables or the same error both ways. (A run of 3000
    found a raw field's null kept as absent, now fixed.)"""
    import importlib.util
    import random

    spec = importlib.util.spec_from_file_location("tb_bottleneck_fuzz", REPO / "benchmarks" / "fuzz.py")
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    files = [TRACES / f for f in ("generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json",
                                  "hta/nccl_parser_config/nccl_data.json.gz", RESNET,
                                  "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")]
    seeds = [fuzz.cut_down(f, 300) for f in files]
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1 << 12)
    monkeypatch.setattr(loader, "PARALLEL_CHUNK_BYTES", 1 << 12)
    monkeypatch.setattr(text, "_OUT_BYTES", 1 << 12)
    rng = random.Random(20261128)
    used = {"native": 0, "fallback": 0}
    for i in range(150):
        data, gzipped, labels = fuzz.mutate(seeds[i % len(seeds)], rng)
        path = tmp_path / f"t{i}.json{'.gz' if gzipped else ''}"
        path.write_bytes(data)
        results = []
        for on in (False, True):
            try:
                results.append(_load(str(path), monkeypatch, native_on=on)[0])
            except Exception as exc:  # noqa: BLE001 - the same typed error both ways
                results.append(repr(exc))
            if on:
                used = {k: used[k] + native.stats[k] for k in used}
        assert results[0] == results[1], (i, labels)
    assert used["native"] > 1000 and used["fallback"] > 100, used  # both ways taken


@needs_extension
def test_the_scanner_never_reads_past_the_chunk():
    """Every prefix of a chunk, and mutated ones, scanned with the chunk's end against an
    unreadable page: a read past the end (a missed bounds check, a 16-byte SSE2 load)
    would crash the process. (Also run under AddressSanitizer while developing.)"""
    import ctypes
    import mmap
    import random

    page = mmap.PAGESIZE
    size = 16 * page
    region = mmap.mmap(-1, size + page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start_of = ctypes.c_char.from_buffer(region)
    if libc.mprotect(ctypes.addressof(start_of) + size, page, 0) != 0:
        pytest.skip("mprotect is not available here")
    view = memoryview(region)

    def scan_at_end(data: bytes):
        view[size - len(data):size] = data
        return native._fastscan.scan(view[size - len(data):size])

    clean = _chunk()
    assert scan_at_end(clean) is not None
    for chunk in (clean, _chunk(*list(FALLBACKS.values())[:8])):
        for k in range(len(chunk) + 1):
            scan_at_end(chunk[:k])
    rng = random.Random(39)
    for _ in range(5000):
        b = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.choice(b'"\\{}[],:0123456789.eE+-nulltrfas \x00\x7f\x80\xc3\xe2\xf0\xff')
        scan_at_end(bytes(b[:rng.randrange(len(b) + 1)]))


_TAIL_EVENTS = (b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10, "dur": 5, '
                b'"args": {"External id": 3, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}}, '
                b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12.5, "dur": 1, '
                b'"args": {"device": 0, "stream": 7, "correlation": 9, "grid": [1, 2, 3], "block": [4, 1, 1]}}]')
TRAILERS = {
    "none": b"}",
    "keys": b', "deviceProperties": [{"id": 0, "name": "A100"}, {"id": 1, "name": "B"}], '
            b'"traceName": "t.json", "displayTimeUnit": "ms"}\n',
    "the key again": b', "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "b", "ts": 1, "dur": 1}]}',
    "the key escaped": b', "trace\\u0045vents": [{"ph": "X", "cat": "cpu_op", "name": "b", "ts": 1, "dur": 1}]}',
    "bad utf-8": b', "traceName": "a\xff\xfeb"}',
    "a wrong type": b', "deviceProperties": 5, "distributedInfo": [1]}',
    "broken": b', "traceName": }',
    "text after": b'} {"more": 1}',
}


@needs_extension
@pytest.mark.parametrize("case", sorted(TRAILERS))
def test_the_last_events_and_the_trailer(case, tmp_path, monkeypatch):
    """The tail of a trace object (its last events, then more top-level keys): the events
    natively, the keys by msgspec; the same tables, meta and warnings (or the same error) as
    the msgspec way, and the msgspec way whenever the trailer might hold traceEvents again."""
    path = tmp_path / "t.json"
    path.write_bytes(b'{"schemaVersion": 1, "traceEvents": ' + _TAIL_EVENTS + TRAILERS[case])
    results, stats = [], None
    for on in (False, True):
        try:
            got, stats = _load(str(path), monkeypatch, native_on=on)
            results.append(got)
        except Exception as exc:  # noqa: BLE001 - the same typed error both ways
            results.append(repr(exc))
    assert results[0] == results[1]
    if case in ("none", "keys", "bad utf-8", "a wrong type"):
        assert isinstance(results[1], dict) and stats == {"native": 1, "fallback": 0}
    if case in ("the key again", "the key escaped"):
        assert stats["fallback"] >= 1
