"""Issue 24, loader side: the c10d ops keep their recorded shapes (trace/columns.py
SHAPE_OP_MARKERS), so a gloo: span is matched to the c10d op that enqueued it by tensor size
where the trace recorded it (collectives.c10d_op_of; order otherwise); and a coalesced
collective's bytes are all its tensors (distributed._bytes_of, nccl-tests' size).

Checked against the raw JSON (json.load, not the loader) of the demo's gloo runs, whose
numbers stay those of their ``demo_truth`` (tests/analysis/test_collectives_gloo.py), and on hand-built
traces with sizes computed by hand."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from conftest import DEMO_LOGS
from trace_builder import A100, TraceBuilder

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import collectives as C
from tb_bottleneck_plugin.analysis import distributed as D
from tb_bottleneck_plugin.analysis.steps import find_steps
from tb_bottleneck_plugin.trace.loader import load_trace

RUNS = ["collectives_shard_2rank", "ddp_balanced_2rank", "ddp_straggler_2rank"]


def _files():
    out = [p for run in RUNS for p in sorted((DEMO_LOGS / run).glob("*.pt.trace.json.gz"))]
    if not out:
        pytest.skip("the demo's gloo runs are not in demo_logs")
    return out


def _numels(dims):
    """Element counts of every tensor in a raw 'Input Dims' value (TensorLists included)."""
    if isinstance(dims, list) and dims and all(isinstance(x, int) for x in dims):
        return {int(np.prod(dims))}
    out = set()
    for v in dims if isinstance(dims, list) else []:
        out |= _numels(v)
    return out


@pytest.mark.parametrize("path", _files(), ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_c10d_ops_keep_their_shapes_and_each_span_takes_an_op_of_its_size(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    want = {(e["name"], e["ts"]): e["args"]["Input Dims"] for e in raw
            if e["name"].startswith("c10d::") and "Input Dims" in (e.get("args") or {})}
    assert want
    trace = load_trace(str(path))
    names = [trace.strings[i] for i in trace.cpu.name.tolist()]
    kept = {(names[r], float(trace.cpu.ts[r])): trace.op_inputs.dims.get(r)
            for r in range(len(names)) if names[r].startswith("c10d::")}
    assert kept == {k: v for k, v in want.items()}
    # every gloo: span in the steps is matched to an op holding a tensor of its input's size
    sec = report.analyze_trace(trace)["report"]["collectives"]
    rows = C.gloo_spans(trace)
    rows = rows[np.argsort(trace.cpu.ts[rows], kind="stable")]
    ops = C.c10d_op_of(trace, rows, [D.collective_kind(names[r]) for r in rows], 2)
    assert (ops >= 0).all()
    for r, o in zip(rows.tolist(), ops.tolist()):
        span_dims = want_span = trace.op_inputs.dims[r][0]
        assert int(np.prod(span_dims)) in _numels(want[(names[o], float(trace.cpu.ts[o]))]), (names[r], want_span)
    assert all(op is not None for op in sec["call_rows"]["op"])


F = {"Input type": ["float"]}


def _gloo_trace(world=2):
    info = {"backend": "gloo", "rank": 0, "world_size": world,
            "pg_config": [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]}
    tb = TraceBuilder(props=(), distributed_info=info)
    tb.step(1, 0, 10_000)
    return tb


def test_sizes_recorded_in_the_file_reorder_the_matching(tmp_path):
    """allreduce_ (500 floats) then _reduce_scatter_base_ (output 500, input 1,000) are
    enqueued; gloo runs the reduce-scatter's all_reduce (1,000) first. With the shapes in the
    file, the first span is the reduce-scatter: 4,000 B, (n-1)/n = 1/2; the second the
    all_reduce: 2,000 B, 2(n-1)/n = 1. Without them, order alone pairs them the other way."""
    def build(shapes: bool):
        tb = _gloo_trace()
        ar = {"Input Dims": [[[500]], [], []], "Input type": ["TensorList", "", "Scalar"]} if shapes else {}
        rs = {"Input Dims": [[500], [1000], []], "Input type": ["float", "float", ""]} if shapes else {}
        tb.cpu("c10d::allreduce_", 100, 10, **ar)
        tb.cpu("c10d::_reduce_scatter_base_", 120, 10, **rs)
        tb.cpu("gloo:all_reduce", 200, 10, cat="user_annotation", tid=2, **F, **{"Input Dims": [[1000]]})
        tb.cpu("gloo:all_reduce", 300, 10, cat="user_annotation", tid=3, **F, **{"Input Dims": [[500]]})
        return report.analyze_trace(tb.load(tmp_path, f"s{int(shapes)}.pt.trace.json"))["report"]["collectives"]

    cr = build(True)["call_rows"]
    assert cr["op"] == ["c10d::_reduce_scatter_base_", "c10d::allreduce_"]
    assert cr["kind"] == ["reduce_scatter", "all_reduce"] and cr["bytes"] == [4000.0, 2000.0]
    assert cr["bus_factor"] == [0.5, 1.0]
    cr = build(False)["call_rows"]
    assert cr["op"] == ["c10d::allreduce_", "c10d::_reduce_scatter_base_"]


# ---------------------------------------------------------------- coalesced collectives

# three tensors of a coalesced all-reduce: 1,000 + 2,000 x 3 + 50 floats
COALESCED = {"Input Dims": [[1000], [2000, 3], [50]], "Input type": ["float", "float", "float"]}
COALESCED_BYTES = (1000 + 2000 * 3 + 50) * 4  # 28,200 B


def _nccl_trace(tmp_path, span_name, args, name="t.pt.trace.json"):
    tb = TraceBuilder(props=(A100,), distributed_info={"backend": "nccl", "rank": 0, "world_size": 2})
    tb.step(1, 0, 1000)
    tb.cpu(span_name, 100, 50, **args)
    tb.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 110, 200, 100)
    return tb.load(tmp_path, name)


def test_a_coalesced_all_reduce_counts_all_its_tensors(tmp_path):
    trace = _nccl_trace(tmp_path, "nccl:all_reduce_coalesced", COALESCED)
    part = D.span_partial(trace, find_steps(trace))
    colls = part["steps"][0]["collectives"]
    assert {k: colls[k] for k in ("kind", "dur_us", "bytes")} == {"kind": ["all_reduce"], "dur_us": [100.0],
                                                                  "bytes": [COALESCED_BYTES]}
    assert colls["pg"] == [None] and colls["seq"] == [None]  # no process group name, no Seq on the kernel
    sec = report.analyze_trace(trace)["report"]["collectives"]
    assert sec["call_rows"]["bytes"] == [COALESCED_BYTES]
    # a plain all_reduce span still counts its (one) input: the first tensor
    trace = _nccl_trace(tmp_path, "nccl:all_reduce", COALESCED, "p.pt.trace.json")
    assert D.span_partial(trace, find_steps(trace))["steps"][0]["collectives"]["bytes"] == [4000.0]


def test_a_tensor_list_argument_sums_its_tensors_and_needs_their_dtype(tmp_path):
    """One argument holding three tensors: their sum when the dtype is known; the
    'TensorList' type names none, so the size is unknown (null), never the first tensor's."""
    listed = {"Input Dims": [[[1000], [2000, 3], [50]]], "Input type": ["float"]}
    trace = _nccl_trace(tmp_path, "nccl:all_reduce", listed)
    assert D.span_partial(trace, find_steps(trace))["steps"][0]["collectives"]["bytes"] == [COALESCED_BYTES]
    untyped = {"Input Dims": [[[1000], [2000, 3], [50]]], "Input type": ["TensorList"]}
    trace = _nccl_trace(tmp_path, "nccl:all_reduce", untyped, "u.pt.trace.json")
    assert D.span_partial(trace, find_steps(trace))["steps"][0]["collectives"]["bytes"] == [None]
