"""Memory and fragmentation (metrics.md §7) on hand-made traces and snapshots."""
from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

from tb_bottleneck_plugin.analysis import memory as mem
from tb_bottleneck_plugin.trace.loader import load_trace

GIB = 1 << 30


def _m(ts, dtype, did, nbytes, alloc=None, reserved=None):
    args = {"Device Type": dtype, "Device Id": did, "Bytes": nbytes}
    if alloc is not None:
        args.update({"Total Allocated": alloc, "Total Reserved": reserved, "Addr": 1})
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
            "ts": ts, "args": args}


def _span(ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def write(tmp_path, events, props=()):
    p = tmp_path / "m.pt.trace.json"
    p.write_text(json.dumps({"deviceProperties": list(props), "traceEvents": events}))
    return load_trace(str(p))


def test_peaks_capacity_and_slack(tmp_path):
    ev = [
        _m(0, 1, 0, GIB, GIB, 2 * GIB),
        _m(10, 1, 0, GIB, 2 * GIB, 4 * GIB),
        _m(30, 1, 0, -GIB, GIB, 4 * GIB),
        _m(5, 0, -1, 100, 100, 0),
        _span(0, 40),  # trace ends at 40
    ]
    tr = write(tmp_path, ev, [{"id": 0, "totalGlobalMem": 32 * GIB}])
    na = {}
    r = mem.memory_usage(tr, not_available=na)
    assert set(r) == {"cpu", "cuda:0"}
    g = r["cuda:0"]
    assert g["peak_allocated_bytes"] == 2 * GIB and g["peak_reserved_bytes"] == 4 * GIB
    assert g["capacity_bytes"] == 32 * GIB and g["allocated_is_relative"] is False
    assert g["slack_fragmentation_pct"] == pytest.approx(50.0)
    # ∫(res-alloc) = 1*10 + 2*20 + 3*10 = 80 GiB·us; ∫res = 2*10 + 4*20 + 4*10 = 140
    assert g["slack_fragmentation_time_weighted_pct"] == pytest.approx(100 * 80 / 140)
    assert g["free_block_fragmentation_pct"] is None and "snapshot" in na["memory.cuda:0.free_block_fragmentation_pct"]
    c = r["cpu"]
    assert c["peak_allocated_bytes"] == 100 and c["slack_fragmentation_pct"] is None
    assert "GPU devices only" in na["memory.cpu.slack_fragmentation_pct"]
    # the report's one convention (analysis/units.py): full keys in the dict passed in, none in the section
    assert all(k.startswith(("memory.cpu.", "memory.cuda:0.")) for k in na)
    assert "not_available" not in g and "not_available" not in c
    assert mem.memory_usage(tr) == r  # without a dict to fill, the same section


def test_hip_device_is_cuda_key_with_its_capacity(tmp_path):
    """HIP's Device Id is PyTorch's index, the ordinal deviceProperties enumerates (issue 20
    item 2: a graph capture's peak is judged against it); only the kernels' ids differ on ROCm."""
    tr = write(tmp_path, [_m(0, 6, 0, 512, 512, 2048), _span(0, 10)], [{"id": 0, "totalGlobalMem": 64 * GIB}])
    na = {}
    r = mem.memory_usage(tr, not_available=na)
    assert list(r) == ["cuda:0"]
    assert r["cuda:0"]["capacity_bytes"] == 64 * GIB and "memory.cuda:0.capacity_bytes" not in na
    assert r["cuda:0"]["slack_fragmentation_pct"] == pytest.approx(75.0)


def test_2021_format_relative_allocated(tmp_path):
    ev = [_m(0, 1, 0, 100), _m(1, 1, 0, 300), _m(2, 1, 0, -100), _m(3, 1, 0, 50), _span(0, 5)]
    na = {}
    r = mem.memory_usage(write(tmp_path, ev), not_available=na)["cuda:0"]
    assert r["allocated_is_relative"] is True
    assert r["peak_allocated_bytes"] == 400
    assert r["peak_reserved_bytes"] is None and "reserved" in na["memory.cuda:0.peak_reserved_bytes"]
    assert r["slack_fragmentation_pct"] is None
    assert r["curve"]["allocated_bytes"] == [100, 400, 300, 350]


def test_growth_and_possible_leak(tmp_path):
    ev = [_m(t, 1, 0, 1, (t // 10 + 1) * 8 * (1 << 20), GIB) for t in range(0, 60, 5)] + [_span(0, 60)]
    tr = write(tmp_path, ev)
    steps = [(n, 10.0 * (n - 1) + 1) for n in range(1, 6)]
    g = mem.memory_usage(tr, steps)["cuda:0"]["growth"]
    assert [s["step"] for s in g["per_step"]] == [1, 2, 3, 4, 5]
    assert [s["allocated_bytes"] >> 20 for s in g["per_step"]] == [8, 16, 24, 32, 40]
    assert g["rises"] == 4 and g["possible_leak"] is True
    flat = [_m(t, 1, 0, 1, 8 << 20, GIB) for t in range(0, 60, 5)] + [_span(0, 60)]
    g = mem.memory_usage(write(tmp_path, flat), steps)["cuda:0"]["growth"]
    assert g["possible_leak"] is False and g["rises"] == 0
    # two rises only: below MEMORY_LEAK_MIN_RISES
    g = mem.memory_usage(tr, steps[:3])["cuda:0"]["growth"]
    assert g["rises"] == 2 and g["possible_leak"] is False


def test_downsample_keeps_peaks():
    rng = np.random.default_rng(0)
    ts = np.arange(200_000, dtype=float)
    alloc = rng.integers(0, 1000, len(ts)).astype(float)
    alloc[123_457] = 10_000
    alloc[7] = -5
    res = alloc + 10
    idx = mem._downsample(ts, [alloc, res], 2000)
    assert len(idx) <= 2000 + 2
    assert alloc[idx].max() == 10_000 and alloc[idx].min() == -5
    assert idx[0] == 0 and idx[-1] == len(ts) - 1 and np.all(np.diff(idx) > 0)


def snapshot():
    # The structure torch.cuda.memory._snapshot() returns (PyTorch docs, "Understanding
    # CUDA Memory Usage"): segments with their blocks; device_traces alongside.
    def seg(device, address, blocks):
        return {"device": device, "address": address, "total_size": sum(b["size"] for b in blocks),
                "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"].startswith("active")),
                "requested_size": 0, "stream": 0, "segment_type": "large",
                "blocks": [dict(b, address=address + i) for i, b in enumerate(blocks)]}

    return {
        "segments": [
            seg(0, 0x7f0000000000, [{"size": 4 << 20, "state": "active_allocated"},
                                    {"size": 6 << 20, "state": "inactive"},
                                    {"size": 2 << 20, "state": "active_pending_free"}]),
            seg(0, 0x7f0010000000, [{"size": 2 << 20, "state": "inactive"},
                                    {"size": 2 << 20, "state": "inactive"}]),
            seg(1, 0x7f0020000000, [{"size": 8 << 20, "state": "active_allocated"}]),
        ],
        "device_traces": [[{"action": "alloc", "addr": 0x7f0000000000, "size": 4 << 20, "stream": 0,
                            "frames": []}], []],
    }


def test_snapshot_fragmentation_from_file(tmp_path):
    p = tmp_path / "rank0.memory_snapshot.pickle"
    with open(p, "wb") as f:
        pickle.dump(snapshot(), f)
    with open(p, "rb") as f:
        r = mem.memory_snapshot_fragmentation(f)
    # device 0: free 6+2+2 = 10 MiB, largest 6 -> 40 %; device 1: no free block
    assert r == {"cuda:0": pytest.approx(40.0), "cuda:1": 0.0}
    assert mem.memory_snapshot_fragmentation(p.read_bytes()) == r
    assert any(p.match(pat) for pat in mem.MEMORY_SNAPSHOT_PATTERNS)


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_snapshot_refuses_objects():
    with pytest.raises(pickle.UnpicklingError):
        mem.memory_snapshot_fragmentation(pickle.dumps({"segments": [Evil()]}))


def test_no_memory_events(tmp_path):
    tr = write(tmp_path, [_span(0, 1)])
    assert mem.memory_usage(tr) == {}
    assert "profile_memory" in mem.memory_not_available_reason(tr)
