"""The loader against every real trace in ../shared/traces and every broken-file case.

Facts are checked against an independent reading of the same file with the standard
library's json module (a different decoder, no shared code), plus era facts from
../shared/traces/INDEX.md and ../shared/oracles/reference.json.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tb_bottleneck_plugin.trace import loader, text as loader_text, decode_workers as loader_workers, model
from tb_bottleneck_plugin.errors import NotATraceError, TraceError, TruncatedTraceError

from conftest import SHARED, TRACES  # noqa: E402  (the one definition, tests/conftest.py)
import oracle_quirks as quirks  # noqa: E402
ALL_TRACES = sorted(p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))
REFERENCE = json.loads((SHARED / "oracles" / "reference.json").read_text())["traces"]


def rel(path: Path) -> str:
    return path.relative_to(TRACES).as_posix()


@lru_cache(maxsize=None)
def load(path: Path) -> model.TraceData:
    return loader.load_trace(str(path))


@lru_cache(maxsize=None)
def stdlib_facts(path: Path) -> dict:
    """Counts taken with json.load, independently of the loader."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f, strict=False)
    events = data if isinstance(data, list) else data["traceEvents"]
    cats = Counter()
    kernels_per_device = Counter()
    steps = []
    memory = 0
    for e in events:
        if e.get("name") == "[memory]":
            memory += 1
            continue
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        cats[cat] += 1
        if cat == "kernel":
            args = e.get("args", {})
            kernels_per_device[int(args.get("device", e.get("pid")))] += 1
        if cat in ("user_annotation", "operator", "cpu_op") and str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.append(int(e["name"].split("#")[1]))
    return {
        "cats": cats, "kernels_per_device": dict(kernels_per_device), "steps": sorted(steps), "memory": memory,
        "container": "array" if isinstance(data, list) else "object",
        "device_properties": [] if isinstance(data, list) else data.get("deviceProperties", []),
    }


def test_every_shared_trace_has_its_oracle_entry():
    """The corpus and its oracles cannot drift apart: every trace file under
    ../shared/traces has a reference.json entry made from those very bytes, and every
    entry names a file that is there."""
    files = {rel(p) for p in ALL_TRACES}
    assert files == set(quirks.trace_files())
    assert sorted(files - set(REFERENCE)) == [], "traces without a reference.json entry"
    assert sorted(set(REFERENCE) - files) == [], "reference.json entries without a trace"
    for p in ALL_TRACES:
        facts = REFERENCE[rel(p)]["file"]
        assert p.stat().st_size == facts["bytes"], rel(p)
        assert hashlib.sha256(p.read_bytes()).hexdigest() == facts["sha256"], rel(p)


@pytest.mark.parametrize("path", ALL_TRACES, ids=rel)
def test_loads_with_the_facts_of_the_file(path):
    trace = load(path)
    facts = stdlib_facts(path)
    cats = facts["cats"]
    gpu_kinds = np.bincount(trace.gpu.kind, minlength=3)
    assert gpu_kinds[model.GPU_KERNEL] == cats["kernel"]
    assert gpu_kinds[model.GPU_MEMCPY] == cats["gpu_memcpy"] + cats["memcpy"]
    assert gpu_kinds[model.GPU_MEMSET] == cats["gpu_memset"] + cats["memset"]
    assert len(trace.runtime) == cats["cuda_runtime"] + cats["runtime"] + cats["cuda_driver"]
    assert len(trace.memory) == facts["memory"]
    assert len(trace.gpu_annotations) == cats["gpu_user_annotation"] + cats["user"]
    kernels = trace.gpu.kind == model.GPU_KERNEL
    devices, counts = np.unique(trace.gpu.device[kernels], return_counts=True)
    assert dict(zip(devices.tolist(), counts.tolist())) == facts["kernels_per_device"]
    assert trace.meta.container == facts["container"] == REFERENCE[rel(path)]["file"]["container"]
    assert trace.meta.device_properties == facts["device_properties"]
    # Step numbers: the CPU-side ProfilerStep#N spans, as the oracle file lists them.
    names = np.array(trace.strings, dtype=object)[trace.cpu.name]
    steps = sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))
    assert steps == facts["steps"] == sorted(REFERENCE[rel(path)]["file"]["profiler_steps_in_trace"])
    assert np.all(trace.gpu.dur >= 0) and np.all(np.isfinite(trace.cpu.ts))
    assert trace.meta.first_ts < trace.meta.last_ts
    assert not trace.meta.warnings


def test_era_specific_fields():
    v2021 = load(TRACES / "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    k = v2021.gpu.kind == model.GPU_KERNEL
    assert np.isfinite(v2021.gpu.blocks_per_sm[k]).all()  # since 2021-05
    assert (v2021.gpu.achieved_occupancy_pct[k] >= 0).all()
    assert (v2021.gpu.stream[k] == 7).all()  # tid "stream 7" and args.stream agree
    assert (v2021.memory.total_allocated == -1).all()  # 2021 memory events: Bytes only
    assert v2021.meta.device_properties[0]["name"] == "Tesla V100-DGXS-32GB"
    assert (v2021.gpu.external_id[k] > 0).all()  # old lower-case "external id"

    v2020 = load(TRACES / "kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz")
    k = v2020.gpu.kind == model.GPU_KERNEL
    assert np.isnan(v2020.gpu.blocks_per_sm[k]).all()  # no `blocks per SM` in 2020
    assert v2020.meta.device_properties == []
    assert v2020.cpu.tid.dtype == np.int64 and (v2020.cpu.tid == 4093687616).any()  # string tids

    rocm = load(TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert rocm.devices == [2]  # HSA agent index, CPU agents first
    assert np.isnan(rocm.gpu.achieved_occupancy_pct).all()
    assert rocm.meta.base_time_ns is not None

    memory = load(TRACES / "hta/df_index_resolver/df_index_resolver.json.gz")
    cuda = memory.memory.device_type == model.DEVICE_TYPE_CUDA
    tbp_memory = REFERENCE["hta/df_index_resolver/df_index_resolver.json.gz"]["torch_tb_profiler"]["memory"]
    assert memory.memory.total_allocated[cuda].max() == tbp_memory["peak_total_allocated_bytes"]["CUDA:1"]
    assert memory.memory.total_reserved[cuda].max() == tbp_memory["peak_total_reserved_bytes_from_records"]["CUDA:1"]
    assert memory.meta.distributed_info["rank"] == 1

    shapes = load(TRACES / "hta/trace_diff/control/control.json.gz")
    names = [shapes.strings[shapes.cpu.name[row]] for row in shapes.op_inputs.dims]
    assert any("addmm" in n or "mm" in n for n in names)
    row = next(iter(shapes.op_inputs.types))
    assert isinstance(shapes.op_inputs.types[row], list)


def _rows(trace: model.TraceData, table: str) -> list:
    """A table's rows as sorted tuples, names as text: the same events in any order
    (rows are grouped by category within a chunk, so their order follows chunking)."""
    t = getattr(trace, table)
    cols = []
    for f in t.__dataclass_fields__:
        col = getattr(t, f).tolist()
        if f in ("name", "category", "occupancy_limit", "input_dims", "input_types"):
            col = [trace.strings[i] if i >= 0 else None for i in col]
        cols.append([repr(v) for v in col])
    return sorted(zip(*cols))


def test_streaming_equals_whole_file(monkeypatch):
    """Chunked decoding (tiny chunks, many boundaries) gives exactly the whole-file result."""
    path = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
    whole = loader._load_whole(open(path, "rb"), str(path), True, None)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", 8192)  # many blocks, so many chunks
    chunked = loader.load_trace(str(path))
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        assert len(getattr(whole, table)) == len(getattr(chunked, table)) > 0 or table == "gpu_annotations"
        assert _rows(whole, table) == _rows(chunked, table), table
    np.testing.assert_array_equal(whole.memory.ts, chunked.memory.ts)  # memory events keep file order
    assert whole.meta.base_time_ns == chunked.meta.base_time_ns is not None
    assert whole.meta.device_properties == chunked.meta.device_properties


def test_compact_single_line_json_is_chunked(tmp_path, monkeypatch):
    """json.dump output (no newlines, as scale_trace.py and other tools write) streams too."""
    events = [{"ph": "X", "cat": "kernel", "name": "k{lambda()#1}, {x", "pid": 0, "tid": 7, "ts": i * 10,
               "dur": 5, "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(2000)]
    path = tmp_path / "compact.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms",
                                "baseTimeNanoseconds": 123}))
    monkeypatch.setattr(loader, "CHUNK_BYTES", 10_000)
    calls = []
    monkeypatch.setattr(loader, "_load_whole", lambda *a: calls.append(a))
    trace = loader.load_trace(str(path))
    assert not calls, "fell back to whole-file decoding"
    assert len(trace.gpu) == 2000 and trace.meta.base_time_ns == 123
    assert trace.strings[trace.gpu.name[0]] == "k{lambda()#1}, {x"
    assert trace.meta.display_time_unit == "ms"


# ----------------------------------------------------------------------- broken files

GOOD = {"schemaVersion": 1, "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 10},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 105, "dur": 3,
     "args": {"device": 0, "stream": 7, "correlation": 1}},
]}


def write(tmp_path, name, payload: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(payload)
    return str(path)


def good_bytes() -> bytes:
    return json.dumps(GOOD, indent=2).encode()


def test_truncated_gzip(tmp_path):
    data = gzip.compress(good_bytes())
    path = write(tmp_path, "w.1.pt.trace.json.gz", data[: len(data) // 2])
    with pytest.raises(TruncatedTraceError) as err:
        loader.load_trace(path)
    assert path in str(err.value) and "gzip" in str(err.value)


def test_not_gzip_despite_name(tmp_path):
    path = write(tmp_path, "w.1.pt.trace.json.gz", b"\x1f\x8b\x08garbage-garbage-garbage")
    with pytest.raises(TraceError) as err:
        loader.load_trace(path)
    assert path in str(err.value)


def test_truncated_json(tmp_path):
    data = good_bytes()
    path = write(tmp_path, "w.1.pt.trace.json", data[: int(len(data) * 0.7)])
    with pytest.raises(TruncatedTraceError) as err:
        loader.load_trace(path)
    assert path in str(err.value) and "ends early" in str(err.value)


def test_truncated_large_json_in_streaming_path(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1000)
    big = dict(GOOD, traceEvents=GOOD["traceEvents"] * 200)
    data = json.dumps(big, indent=2).encode()
    path = write(tmp_path, "w.1.pt.trace.json", data[: len(data) - 300])
    with pytest.raises(TruncatedTraceError):
        loader.load_trace(path)


def test_invalid_json(tmp_path):
    data = good_bytes().replace(b'"aten::mm",', b'"aten::mm" oops,')
    path = write(tmp_path, "w.1.pt.trace.json", data)
    with pytest.raises(TraceError) as err:
        loader.load_trace(path)
    assert not isinstance(err.value, TruncatedTraceError)
    assert path in str(err.value) and "invalid JSON" in str(err.value) and "byte" in str(err.value)


@pytest.mark.parametrize("payload", [b'{"a": 1}', b'[1, 2, 3]', b'{"traceEvents": [{"foo": 1}]}', b'"text"'],
                         ids=["object", "numbers", "no-profiler-events", "string"])
def test_json_that_is_not_a_trace(tmp_path, payload):
    path = write(tmp_path, "other.json", payload)
    with pytest.raises(NotATraceError) as err:
        loader.load_trace(path)
    assert path in str(err.value)


@pytest.mark.parametrize("payload", [b"", b"   \n"], ids=["zero-bytes", "whitespace"])
def test_empty_file(tmp_path, payload):
    path = write(tmp_path, "w.1.pt.trace.json", payload)
    with pytest.raises(TraceError, match="empty file"):
        loader.load_trace(path)


def test_empty_gzip(tmp_path):
    path = write(tmp_path, "w.1.pt.trace.json.gz", gzip.compress(b""))
    with pytest.raises(TraceError, match="empty file"):
        loader.load_trace(path)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="file not found"):
        loader.load_trace(str(tmp_path / "nope.pt.trace.json"))


def test_impossible_values_load_with_warnings(tmp_path):
    events = GOOD["traceEvents"] + [
        {"ph": "X", "cat": "kernel", "name": "neg", "pid": 0, "tid": 7, "ts": 110, "dur": -5,
         "args": {"device": 0, "blocks per SM": "inf"}},
        {"ph": "X", "cat": "cpu_op", "name": "nodur", "pid": 1, "tid": 1, "ts": 120},
        {"ph": "X", "cat": "cpu_op", "name": "badts", "pid": 1, "tid": 1, "ts": "inf", "dur": 3},
    ]
    path = write(tmp_path, "w.1.pt.trace.json", json.dumps(dict(GOOD, traceEvents=events)).encode())
    trace = loader.load_trace(path)
    assert len(trace.cpu) == 1 and len(trace.gpu) == 2
    neg = trace.strings.index("neg")
    row = int(np.flatnonzero(trace.gpu.name == neg)[0])
    assert trace.gpu.dur[row] == 0 and np.isinf(trace.gpu.blocks_per_sm[row])
    text = " ".join(trace.meta.warnings)
    assert "negative 'dur'" in text and "without a usable 'dur'" in text and "without a usable 'ts'" in text


def test_bare_na_and_bad_utf8_are_repaired(tmp_path):
    text = good_bytes().replace(b'"dur": 3,', b'"dur": 3, "args2": N/A,').replace(b"gemm", b"ge\xffmm")
    path = write(tmp_path, "w.1.pt.trace.json", text)
    trace = loader.load_trace(path)
    assert len(trace.gpu) == 1 and any("repaired" in w for w in trace.meta.warnings)


def test_gzip_without_gz_suffix_and_concatenated_members(tmp_path):
    half = len(good_bytes()) // 2
    data = gzip.compress(good_bytes()[:half]) + gzip.compress(good_bytes()[half:])
    path = write(tmp_path, "renamed.json", data)
    trace = loader.load_trace(path)
    assert len(trace.gpu) == 1 and len(trace.cpu) == 1


def _named(trace, table, field):
    values = getattr(getattr(trace, table), field)
    if field in ("name", "category", "occupancy_limit", "msg_dtype"):
        return np.array([trace.strings[i] if i >= 0 else None for i in values], dtype=object)
    return values


@pytest.mark.parametrize("name", ["hta/trace_diff/control/control.json.gz",
                                  "hta/nccl_parser_config/nccl_data.json.gz"])  # kernels with a `dtype`
def test_parallel_decoding_equals_in_process(monkeypatch, name):
    """Chunks decoded by worker processes and merged give the in-process result."""
    path = str(TRACES / name)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "0")
    local = loader.load_trace(path)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")
    monkeypatch.setattr(loader_workers, "PARALLEL_MIN_BYTES", 0)
    merges = []
    original = loader._Builder.merge
    monkeypatch.setattr(loader._Builder, "merge", lambda self, other: (merges.append(1), original(self, other)))
    parallel = loader.load_trace(path)
    assert len(merges) >= 5, "worker processes decoded most of the file in 1 MB chunks"
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        for f in getattr(local, table).__dataclass_fields__:
            a, b = _named(local, table, f), _named(parallel, table, f)
            np.testing.assert_array_equal(a, b, err_msg=f"{table}.{f}")
    assert local.op_inputs.dims == parallel.op_inputs.dims
    assert local.op_inputs.types == parallel.op_inputs.types
    assert local.meta.category_counts == parallel.meta.category_counts


def test_collector_is_off_during_a_load_and_back_after(tmp_path):
    """The cyclic garbage collector is paused while a trace loads (loader._collector_paused)
    and comes back as it was: on after a load, a failed load, and the last of two loads
    in threads; still off when the caller had turned it off."""
    import gc
    import threading

    good = ALL_TRACES[0]
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text("{not json")
    seen = []
    original = loader._load_stream

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    assert gc.isenabled()
    try:
        loader._load_stream = spy
        loader.load_trace(str(good))
        assert seen == [False] and gc.isenabled()
        with pytest.raises(TraceError):
            loader.load_trace(str(bad))
        assert gc.isenabled()
        # two loads at once: the first to finish leaves it off for the other
        gate, inside = threading.Event(), threading.Event()

        def held(*args, **kwargs):
            inside.set()
            gate.wait(30)
            return original(*args, **kwargs)

        loader._load_stream = held
        slow = threading.Thread(target=loader.load_trace, args=(str(good),))
        slow.start()
        assert inside.wait(30)
        loader._load_stream = spy
        seen.clear()
        loader.load_trace(str(good))
        assert seen == [False] and not gc.isenabled()
        gate.set()
        slow.join(60)
        assert gc.isenabled()
        gc.disable()
        try:
            loader.load_trace(str(good))
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        loader._load_stream = original
        gc.enable()
