"""Issue 34 item 10, "bad input never costs the trace": CUDA memory snapshots.

A snapshot beside a trace (``memory_snapshot.pickle``, read by trace/snapshot.py through
analysis/memory.py) that is corrupt, absurd, huge, hostile or not a regular file gives
the snapshot metric n/a with the reason, and the trace's report stands: never an
exception, never a hang, never a lost trace.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import threading
import time

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import memory as mem
from tb_bottleneck_plugin.trace import discovery, loader, snapshot, storage

NA_KEY = "memory.free_block_fragmentation_pct"
DEVICE_NA_KEY = "memory.cuda:0.free_block_fragmentation_pct"


def built_snapshot(segments: int = 3, blocks: int = 4) -> dict:
    """What torch.cuda.memory._snapshot() returns (PyTorch "Understanding CUDA Memory
    Usage"): segments with blocks and stack frames, device traces, allocator settings."""
    frames = [{"filename": f"/src/model{i}.py", "line": 10 * i, "name": f"forward{i}"} for i in range(3)]
    segs = []
    for s in range(segments):
        base = 0x7F0000000000 + (s << 28)
        bl = [{"address": base + (i << 20), "size": (i + 1) << 20, "requested_size": (i + 1) << 20,
               "state": "inactive" if i % 2 else "active_allocated", "frames": [dict(f) for f in frames]}
              for i in range(blocks)]
        segs.append({"device": s % 2, "address": base, "total_size": sum(b["size"] for b in bl),
                     "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0,
                     "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                     "frames": [], "blocks": bl})
    traces = [[{"action": "alloc", "addr": 0x7F0000000000, "size": 1 << 20, "stream": 0, "time_us": 1,
                "frames": [dict(f) for f in frames]}], []]
    return {"segments": segs, "device_traces": traces, "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None}}


def write_run(tmp_path, snapshot_bytes=None):
    """A run directory: one small GPU trace with [memory] events (and the snapshot)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10,
               "dur": 5, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
               "args": {"correlation": 1, "device": 0, "stream": 7}},
              {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5,
               "args": {"Device Type": 1, "Device Id": 0, "Bytes": 100, "Total Allocated": 100,
                        "Total Reserved": 400, "Addr": 1}}]
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "w.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    if snapshot_bytes is not None:
        (run / "memory_snapshot.pickle").write_bytes(snapshot_bytes)
    return run


def analyse_run(run) -> dict:
    """What the CLI and the tab compute for the run's one span (trace + snapshot)."""
    logdir = discovery.scan_logdir(str(run))
    (r,) = logdir.runs
    (w,) = r.workers
    (span,) = w.spans
    return report.analyze_span(logdir.url, r, span)["report"]


def assert_trace_stands(rep: dict) -> None:
    json.dumps(rep, allow_nan=False)
    assert rep["errors"] == []
    assert rep["memory"]["cuda:0"]["peak_reserved_bytes"] == 400  # the trace's own numbers are all there
    assert rep["gpu"]["0"]["kernel_us"] == 30


def snapshot_outcome(rep: dict) -> str:
    """"section" (a fragmentation value) or "n/a" (with its reason); anything else fails."""
    value = rep["memory"]["cuda:0"].get("free_block_fragmentation_pct")
    if value is not None:
        assert 0.0 <= value <= 100.0
        return "section"
    reason = rep["not_available"].get(NA_KEY) or rep["not_available"][DEVICE_NA_KEY]
    assert isinstance(reason, str) and reason
    return "n/a"


# ---------------------------------------------------------------------------- the good case stays


def test_a_built_snapshot_gives_its_fragmentation(tmp_path):
    rep = analyse_run(write_run(tmp_path, pickle.dumps(built_snapshot())))
    assert_trace_stands(rep)
    # device 0: segments 0 and 2, free blocks of 2 and 4 MiB each -> 1 - 4/12
    assert rep["memory"]["cuda:0"]["free_block_fragmentation_pct"] == pytest.approx(100 * (1 - 4 / 12))
    assert NA_KEY not in rep["not_available"]


# ---------------------------------------------------------------------------- fuzzing


def test_byte_mutated_snapshots_never_cost_the_trace(tmp_path):
    """300 seeded byte-mutated copies of a built snapshot: each is a fragmentation dict or
    a SnapshotError/UnpicklingError with a reason, and analysed beside a trace each gives a
    snapshot value or a snapshot n/a with the trace's report intact."""
    data = pickle.dumps(built_snapshot(segments=2, blocks=3))
    run = write_run(tmp_path)
    fs, run_dir = storage.get_fs(str(run))
    trace = loader.load_trace(str(run / "w.1.pt.trace.json"))
    rng = random.Random(34)
    outcomes = {"section": 0, "n/a": 0}
    started = time.monotonic()
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            result = mem.memory_snapshot_fragmentation(bytes(mutated))
        except (snapshot.SnapshotError, pickle.UnpicklingError) as exc:
            assert str(exc)
        else:
            assert isinstance(result, dict)
        (run / "memory_snapshot.pickle").write_bytes(bytes(mutated))
        found = report._find_snapshot(fs, run_dir)
        rep = report.analyze_trace(trace, snapshot=found)["report"]
        assert_trace_stands(rep)
        outcomes[snapshot_outcome(rep)] += 1
    assert outcomes["section"] and outcomes["n/a"]  # both ways were taken
    # bounded, not timed: a hang (the repeated-reference walk took hours) fails, a busy CI does not
    assert time.monotonic() - started < 300


def test_a_mutated_snapshot_end_to_end(tmp_path):
    """The CLI/tab path (analyze_span): the corrupt snapshots the probe found first
    (OverflowError, AttributeError, MemoryError) are n/a with their reason."""
    data = pickle.dumps(built_snapshot(segments=1, blocks=2))
    cases = {
        "memo index of 2^28 (4 GiB of memo)": data[:2] + b"]r" + (1 << 28).to_bytes(4, "little") + b".",
        "BYTEARRAY8 of 2^61 bytes": b"\x80\x05\x96" + (1 << 61).to_bytes(8, "little") + b"ab.",
        "APPEND to a dict": b"\x80\x04}\x94K\x01a.",
        "truncated": data[: len(data) // 2],
    }
    for what, bad in cases.items():
        started = time.monotonic()
        rep = analyse_run(write_run(tmp_path, bad))
        assert time.monotonic() - started < 60, what  # bounded (a hang fails), not a timing
        assert_trace_stands(rep)
        assert snapshot_outcome(rep) == "n/a", what
        assert "not a readable CUDA memory snapshot" in rep["not_available"][NA_KEY]
        # the device's own key says the same (not "needs a snapshot": there is one)
        assert rep["not_available"][DEVICE_NA_KEY] == rep["not_available"][NA_KEY]


def test_memo_bomb_is_refused_in_bounded_memory():
    """One corrupt LONG_BINPUT index makes the C unpickler allocate and zero a memo of
    index x 16 bytes: unpickled in a child process with a memory limit, it is refused."""
    bomb = b"\x80\x04]r" + (1 << 28).to_bytes(4, "little") + b"."
    started = time.monotonic()
    with pytest.raises(snapshot.SnapshotError, match="MemoryError"):
        mem.memory_snapshot_fragmentation(bomb)
    assert time.monotonic() - started < 10  # bounded: without the limit it took 14 s and 11 GB


@pytest.mark.parametrize("segment,block,problem", [
    ({"device": float("inf")}, {}, "segment device inf"),
    ({"device": float("nan")}, {}, "segment device nan"),
    ({"device": -1}, {}, "segment device -1"),
    ({"device": 1 << 40}, {}, "segment device 1099511627776"),
    ({"device": "0"}, {}, "segment device '0'"),
    ({}, {"size": float("inf")}, "block size inf"),
    ({}, {"size": -5}, "block size -5"),
    ({}, {"size": 1 << 60}, "block size 1152921504606846976"),
    ({}, {"size": True}, "block size True"),
    ({}, {"size": [1]}, "block size [1]"),
])
def test_absurd_device_or_size_is_na_with_the_reason(tmp_path, segment, block, problem):
    snap = built_snapshot(segments=1, blocks=2)
    snap["segments"][0].update(segment)
    snap["segments"][0]["blocks"][1].update(block)  # block 1 is inactive: its size is read
    with pytest.raises(snapshot.SnapshotError, match="is not an integer in") as err:
        mem.memory_snapshot_fragmentation(pickle.dumps(snap))
    assert problem in str(err.value)
    rep = analyse_run(write_run(tmp_path, pickle.dumps(snap)))
    assert_trace_stands(rep)
    assert problem in rep["not_available"][NA_KEY]


def test_integral_float_sizes_and_devices_are_read():
    snap = built_snapshot(segments=1, blocks=2)
    snap["segments"][0]["device"] = 0.0
    snap["segments"][0]["blocks"][1]["size"] = float(2 << 20)
    assert mem.memory_snapshot_fragmentation(pickle.dumps(snap)) == {"cuda:0": 0.0}


@pytest.mark.parametrize("snap,reason", [
    ({"device_traces": []}, "no list of 'segments'"),
    ({"segments": {"0": {}}}, "no list of 'segments'"),
    ("a string", "no list of 'segments'"),
    ({"segments": [{"device": 0, "blocks": {"size": 1}}]}, "'blocks' is not a list"),
])
def test_snapshot_of_another_shape_is_na_with_the_reason(snap, reason):
    with pytest.raises(snapshot.SnapshotError, match=reason):
        mem.memory_snapshot_fragmentation(pickle.dumps(snap))


# ---------------------------------------------------------------------------- bounded in time and size


def repeated_reference_snapshot(n: int = 30000) -> bytes:
    """The probe's 120 KB pickle of 9 x 10^8 blocks: one segment and one block, repeated."""
    block = {"size": 512, "state": "inactive", "address": 0}
    seg = {"device": 0, "address": 0, "total_size": 512, "blocks": [block] * n}
    return pickle.dumps({"segments": [seg] * n})


def test_repeated_reference_snapshot_finishes_fast_with_a_reason(tmp_path):
    data = repeated_reference_snapshot()
    assert len(data) < 200_000
    started = time.monotonic()
    rep = analyse_run(write_run(tmp_path, data))
    assert time.monotonic() - started < 60  # bounded: the unbounded walk took hours
    assert_trace_stands(rep)
    assert "repeated reference" in rep["not_available"][NA_KEY]


def test_every_kind_of_repeated_reference_is_refused():
    block = {"size": 512, "state": "inactive"}
    blocks = [dict(block) for _ in range(3)]
    shared_list = {"segments": [{"device": 0, "blocks": blocks}, {"device": 0, "blocks": blocks}]}
    same_block = {"segments": [{"device": 0, "blocks": [block, block]}]}
    for snap, reason in ((shared_list, "share one list of blocks"), (same_block, "same block more than once")):
        with pytest.raises(snapshot.SnapshotError, match=reason):
            mem.memory_snapshot_fragmentation(pickle.dumps(snap))


def test_absurd_block_counts_are_refused_before_any_block_is_visited(monkeypatch):
    """Every list element of a pickle costs at least one byte of it: more blocks than bytes
    are repeated references; and never more than MAX_SNAPSHOT_BLOCKS."""
    snap = {"segments": [{"device": 0, "blocks": [{"size": 512, "state": "inactive"} for _ in range(50)]}
                         for _ in range(200)]}
    with pytest.raises(snapshot.SnapshotError,
                       match=r"10,000 blocks in 200 segments of a 5,000-byte pickle: more than 5,000"):
        mem.snapshot_fragmentation(snap, pickle_size=5000)
    assert mem.snapshot_fragmentation(snap) == {"cuda:0": pytest.approx(100 * (1 - 1 / 10_000))}
    monkeypatch.setattr(mem, "MAX_SNAPSHOT_BLOCKS", 1000)
    with pytest.raises(snapshot.SnapshotError, match=r"10,000 blocks .*: more than 1,000"):
        mem.memory_snapshot_fragmentation(pickle.dumps(snap))


def test_size_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "MAX_SNAPSHOT_BYTES", 1000)
    data = pickle.dumps(built_snapshot(segments=5))
    with pytest.raises(snapshot.SnapshotError, match="larger than"):
        mem.memory_snapshot_fragmentation(data)
    rep = analyse_run(write_run(tmp_path, data))  # a file: its size is known before reading
    assert_trace_stands(rep)
    assert "larger than 0 MiB, not read" in rep["not_available"][NA_KEY]


def test_time_limit(monkeypatch):
    """A reduce that never ends is stopped at the deadline (the child is killed)."""
    monkeypatch.setattr(snapshot, "snapshot_seconds", lambda size: 0.5)

    def forever(snap, size):
        while True:
            pass

    started = time.monotonic()
    with pytest.raises(snapshot.SnapshotError, match="took more than"):
        snapshot.reduce_snapshot(pickle.dumps({"segments": []}), forever)
    assert time.monotonic() - started < 60  # the deadline ends it


def test_classes_are_still_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="only plain data"):
        mem.memory_snapshot_fragmentation(pickle.dumps({"segments": [Evil()]}))


# ---------------------------------------------------------------------------- only regular files


def _within(seconds: float, fn):
    """fn() in a daemon thread: its result, or a failure if it blocks longer."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return out["value"]


def test_a_fifo_named_like_a_snapshot_is_na_not_a_hang(tmp_path):
    run = write_run(tmp_path)
    os.mkfifo(run / "memory_snapshot.pickle")
    rep = _within(10, lambda: analyse_run(run))
    assert_trace_stands(rep)
    assert "not a regular file (a FIFO)" in rep["not_available"][NA_KEY]


def test_a_fifo_trace_is_a_trace_error_not_a_hang(tmp_path):
    path = tmp_path / "w.1.pt.trace.json"
    os.mkfifo(path)

    def load():
        with pytest.raises(loader.TraceError, match=r"not a regular file \(a FIFO\)"):
            loader.load_trace(str(path))
        return True

    assert _within(10, load)
    with pytest.raises(Exception, match="not a regular file"):
        storage.open_binary(*storage.get_fs(str(path)))


def test_a_directory_named_like_a_snapshot_is_na(tmp_path):
    run = write_run(tmp_path)
    (run / "memory_snapshot.pickle").mkdir()
    rep = analyse_run(run)
    assert_trace_stands(rep)
    assert "not a regular file (a directory)" in rep["not_available"][NA_KEY]
