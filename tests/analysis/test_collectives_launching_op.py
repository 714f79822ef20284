"""Issue 34 item 8: a communication kernel without collective metadata takes its kind and
size from the ops that launched it (METRICS.md "Collective bandwidth"): NCCL runs
all_to_all (and, on the shared 16-rank A100 trace, every collective) as `SendRecv` kernels,
while `c10d::alltoall_base_(output, input)` and `nccl:all_to_all` carry the sizes.

Ground truth: the raw JSON of the shared trace read with `json` here (correlation id ->
launch call -> the c10d op and nccl: span around it on the same thread), and a hand-built
trace whose bytes and bandwidths follow from the shapes and durations written below."""
from __future__ import annotations

import collections
import gzip
import json

import pytest

from conftest import TRACES, needs_traces, real_report
from trace_builder import A100, TraceBuilder

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import collectives as C

A2A = "hta/negative_queue_length_values_check/rank0.json.gz"
# the c10d ops of that trace and the collective each asks for (read off the op names)
C10D_KIND = {"c10d::alltoall_base_": "all_to_all", "c10d::_reduce_scatter_base_": "reduce_scatter",
             "c10d::_allgather_base_": "all_gather", "c10d::allreduce_": "all_reduce"}
FLOAT = 4
ELEMENT = {"float": 4, "long": 8, "int": 4}  # the dtypes the trace's collectives use


def _numel(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def _raw_calls(path):
    """(kind, bytes) per NCCL kernel launched inside a c10d op, from the raw events:
    nccl-tests' size: all_to_all the input (c10d::alltoall_base_'s second tensor), all_gather and
    reduce_scatter the full array (the larger of output and input), all_reduce the nccl: span's input.
    Also the number of NCCL kernels without a launch call in the trace."""
    doc = json.load(gzip.open(path))
    ev = doc["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
    host = collections.defaultdict(list)
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            host[(e["pid"], e["tid"])].append(e)
    out, orphans = collections.Counter(), 0
    for k in ev:
        if k.get("cat") != "kernel" or not k["name"].startswith("ncclKernel"):
            continue
        call = launch.get(k["args"].get("correlation"))
        if call is None:
            orphans += 1
            continue
        around = [e for e in host[(call["pid"], call["tid"])]
                  if e["ts"] <= call["ts"] and e["ts"] + e["dur"] >= call["ts"] + call["dur"]]
        op = next(e for e in around if e["name"] in C10D_KIND)
        span = next(e for e in around if e["name"].startswith("nccl:"))
        kind = C10D_KIND[op["name"]]
        dims = [d for d in op["args"]["Input Dims"] if d]
        size = ELEMENT[span["args"]["Input type"][0]]
        if kind == "all_to_all":
            nbytes = _numel(dims[1]) * size
        elif kind in ("all_gather", "reduce_scatter"):
            nbytes = max(_numel(d) for d in dims) * size
        else:
            nbytes = _numel(span["args"]["Input Dims"][0]) * size
        out[(kind, float(nbytes))] += 1
    return out, orphans


@needs_traces
def test_sendrecv_kernels_take_kind_and_bytes_from_the_c10d_op():
    sec = real_report(A2A)["collectives"]
    raw, orphans = _raw_calls(TRACES / A2A)
    rows = sec["call_rows"]
    got = collections.Counter((k, b) for k, b in zip(rows["kind"], rows["bytes"]) if b is not None)
    # every NCCL kernel of the trace is in the included steps (80 rows)
    assert sec["calls"] == len(rows["kind"]) == sum(raw.values()) + orphans == 80
    # before issue 34: 80 rows "send_recv", bytes null for all of them
    assert got == raw and sum(got.values()) == 75
    # the kernels no launch call links to stay what their name says, size unknown
    assert sum(1 for k, b in zip(rows["kind"], rows["bytes"]) if b is None and k == "send_recv") == orphans == 5
    # the example: c10d::alltoall_base_ Input Dims [[2883584], [3145728]] float: the input, 12,582,912 B
    assert any(k == "all_to_all" and b == 3145728 * FLOAT for k, b in zip(rows["kind"], rows["bytes"]))
    assert set(sec["bytes_sources"]) == {"cpu_input", "launching_op"}


@needs_traces
def test_group_size_from_the_c10d_op_and_bus_bandwidth():
    sec = real_report(A2A)["collectives"]
    kinds = {r["kind"]: r for r in sec["kinds"]}
    # _reduce_scatter_base_(output [8192, 384], input [65536, 384]): a group of 8; all_to_all: world size 16
    assert kinds["reduce_scatter"]["group_size"] == 8 and kinds["all_gather"]["group_size"] == 8
    assert kinds["all_to_all"]["group_size"] == 16
    for kind, factor in (("all_to_all", 15 / 16), ("reduce_scatter", 7 / 8), ("all_gather", 7 / 8)):
        r = kinds[kind]
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor, rel=1e-12)
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["bytes_time_us"] / 1e3, rel=1e-12)


def test_fixture_alltoall_as_sendrecv(tmp_path):
    """One 1 ms step on one A100 of a 4-rank group: c10d::alltoall_base_(output [1000, 256],
    input [1024, 256]) float -> record_param_comms -> nccl:all_to_all -> a SendRecv kernel of 100 µs;
    c10d::_allgather_base_(output [4096, 64], input [1024, 64]) -> nccl:_all_gather_base -> one of 50 µs."""
    b = TraceBuilder(props=(A100,), distributed_info={"backend": "nccl", "rank": 0, "world_size": 4})
    b.step(1, 1000, 1000)
    b.cpu("c10d::alltoall_base_", 1100, 100, **{"Input Dims": [[1000, 256], [1024, 256], [], [], [], []],
                                                  "Input type": ["float", "float", "", "", "", "Scalar"]})
    b.cpu("record_param_comms", 1105, 90, **{"Input Dims": [[1024, 256], [], []],
                                               "Input type": ["float", "Scalar", "Scalar"]})
    b.cpu("nccl:all_to_all", 1110, 80, **{"Input Dims": [[1024, 256]], "Input type": ["float"]})
    b.launch("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 1120, 1300, 100)
    b.cpu("c10d::_allgather_base_", 1400, 100, **{"Input Dims": [[4096, 64], [1024, 64], []],
                                                    "Input type": ["float", "float", ""]})
    b.cpu("nccl:_all_gather_base", 1410, 80, **{"Input Dims": [[1024, 64]], "Input type": ["float"]})
    b.launch("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 1420, 1600, 50)
    rep = report.analyze_trace(b.load(tmp_path))["report"]
    sec = rep["collectives"]
    kinds = {r["kind"]: r for r in sec["kinds"]}
    assert set(kinds) == {"all_to_all", "all_gather"}
    a2a = kinds["all_to_all"]
    assert a2a["bytes"] == 1024 * 256 * 4 and a2a["group_size"] == 4
    assert a2a["algbw_gbps"] == pytest.approx(1024 * 256 * 4 / 100e-6 / 1e9)  # 10.49 GB/s
    assert a2a["busbw_gbps"] == pytest.approx(1024 * 256 * 4 / 100e-6 / 1e9 * 3 / 4)
    ag = kinds["all_gather"]
    assert ag["bytes"] == 4096 * 64 * 4 and ag["group_size"] == 4  # the gathered array; 4096 / 1024 ranks
    assert ag["busbw_gbps"] == pytest.approx(4096 * 64 * 4 / 50e-6 / 1e9 * 3 / 4)
    assert sec["bytes_sources"] == ["cpu_input", "launching_op"]
    assert a2a["link_pct"] == pytest.approx(100 * a2a["busbw_gbps"] / sec["link"]["gbps"])
