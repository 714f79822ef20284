"""Collective bandwidth from gloo CPU spans (METRICS.md §18 "CPU runs: gloo", issue 24).

The committed gloo runs against their ground truth, every number recomputed here from a
direct read of the raw JSON (not through the loader or distributed.py): bytes exactly
(``demo_truth`` of collectives_shard_2rank, the DDP bucket's 134,154 fp32 elements),
busbw = Σ bytes x factor / Σ span duration with nccl-tests' factors. Then hand-built traces
for the c10d-op matching (reduce_scatter run as all_reduce, the list form, FIFO order,
missing ops) and the edges (no group size, GPU kernels win, no span in the steps)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from conftest import DEMO_LOGS
from trace_builder import A100, TraceBuilder

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import collectives as C
from tb_bottleneck_plugin.trace.loader import load_trace
from tb_bottleneck_plugin.views import ranks

SHARD = DEMO_LOGS / "collectives_shard_2rank"
DDP = [DEMO_LOGS / "ddp_balanced_2rank", DEMO_LOGS / "ddp_straggler_2rank"]
# nccl-tests doc/PERFORMANCE.md, written out again here (not C.busbw_factor)
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n}
FP32 = 4


@pytest.fixture(autouse=True)
def _no_env_link(monkeypatch):
    monkeypatch.delenv(C.ENV_LINK, raising=False)


def _files(run):
    files = sorted(run.glob("*.pt.trace.json.gz"))
    if not files:
        pytest.skip(f"{run.name} not in demo_logs")
    return files


def _raw(path):
    """(document, gloo spans in start order as (name, ts, dur, numel of the first input),
    ProfilerStep windows) straight from the JSON."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    gloo = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
    gloo = [(e["name"], e["ts"], e["dur"], int(np.prod(e["args"]["Input Dims"][0])))
            for e in gloo if any(a <= e["ts"] < b for a, b in steps)]
    return doc, gloo, steps


def _busbw(rows, n):
    """rows: (kind, bytes, dur_us): Σ bytes x factor / Σ time in GB/s."""
    bus = sum(b * FACTOR[k](n) for k, b, _ in rows)
    return bus / sum(d for _, _, d in rows) / 1e3


def _by_kind(rows):
    out = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


# ---------------------------------------------------------------- the committed gloo runs


def test_shard_run_bytes_and_busbw_against_demo_truth():
    """collectives_shard_2rank: per step all_gather_into_tensor of two shards (131,584 B and
    8,224 B recorded in the gloo:all_gather span: nccl-tests' size is x 2 = 263,168 / 16,448),
    then reduce_scatter_tensor of the two gradients, which gloo runs as gloo:all_reduce of the
    full input (16,448 / 263,168 B): named reduce_scatter, enqueued by c10d::_reduce_scatter_base_."""
    for path in _files(SHARD):
        doc, gloo, steps = _raw(path)
        truth = doc["demo_truth"]
        n = truth["world_size"]
        per_step = truth["calls_per_step"]
        assert len(steps) == truth["recorded_steps"] == 3
        sec = report.analyze_trace(load_trace(str(path)))["report"]
        na, sec = sec["not_available"], sec["collectives"]
        assert sec is not None and sec["source"] == "cpu_spans"
        assert "collectives" not in na and na["collectives.link_pct"] == C.GLOO_NO_LINK
        assert sec["link"]["gbps"] is None and sec["link"]["backend"] == "gloo"
        assert sec["calls"] == sec["calls_with_bytes"] == len(gloo) == 4 * 3
        cr = sec["call_rows"]
        want_kind = ["all_gather" if c["op"] == "all_gather_into_tensor" else "reduce_scatter" for c in per_step]
        want_bytes = [float(c["nccl_tests_bytes"]) for c in per_step]
        assert cr["kind"] == want_kind * 3
        assert cr["bytes"] == want_bytes * 3  # exact
        assert cr["step"] == [2] * 4 + [3] * 4 + [4] * 4
        assert cr["implemented_as"] == [None, None, "all_reduce", "all_reduce"] * 3
        assert cr["op"] == ["c10d::_allgather_base_"] * 2 + ["c10d::_reduce_scatter_base_"] * 2 + \
            ["c10d::_allgather_base_"] * 2 + ["c10d::_reduce_scatter_base_"] * 2 + \
            ["c10d::_allgather_base_"] * 2 + ["c10d::_reduce_scatter_base_"] * 2
        # the raw spans: what gloo ran and recorded, with the truth's sizes
        for (name, _, _, numel), c in zip(gloo, per_step * 3):
            if c["op"] == "all_gather_into_tensor":
                assert name == "gloo:all_gather" and numel * FP32 == c["input_bytes"]
                assert numel * FP32 * n == c["nccl_tests_bytes"]
            else:
                assert name == "gloo:all_reduce" and numel * FP32 == c["input_bytes"] == c["nccl_tests_bytes"]
        rows = [(k, b, d) for k, b, (_, _, d, _) in zip(want_kind * 3, want_bytes * 3, gloo)]
        assert cr["dur_us"] == pytest.approx([d for _, _, d in rows], rel=1e-6)
        kinds = {r["kind"]: r for r in sec["kinds"]}
        for kind, mine in _by_kind(rows).items():
            k = kinds[kind]
            assert k["calls"] == len(mine) == 6 and k["group_size"] == n
            assert k["bytes"] == sum(b for _, b, _ in mine)
            assert k["time_us"] == pytest.approx(sum(d for _, _, d in mine), rel=1e-6)
            assert k["algbw_gbps"] == pytest.approx(k["bytes"] / k["time_us"] / 1e3, rel=1e-6)
            assert k["busbw_gbps"] == pytest.approx(_busbw(mine, n), rel=1e-6)
            assert k["link_pct"] is None
        assert kinds["reduce_scatter"]["implemented_as"] == "all_reduce"
        assert sec["implemented_as"] == {"reduce_scatter": "all_reduce"}
        assert C.RS_AS_AR in sec["notes"] and C.AR_KEPT not in sec["notes"]
        assert sec["bytes_sources"] == ["cpu_input", "cpu_input_x_group_size"]
        assert sec["process_groups"][0]["busbw_gbps"] == pytest.approx(_busbw(rows, n), rel=1e-6)
        json.dumps(sec, allow_nan=False)


def test_ddp_runs_all_reduce_bytes_and_busbw():
    """DDP (one gradient bucket of 134,154 fp32 = 536,616 B per step, c10d::allreduce_):
    all_reduce, factor 2(n-1)/n = 1 for n = 2, one call per recorded step."""
    for run in DDP:
        for path in _files(run):
            doc, gloo, steps = _raw(path)
            n = doc["distributedInfo"]["world_size"]
            sec = report.analyze_trace(load_trace(str(path)))["report"]["collectives"]
            assert sec["source"] == "cpu_spans" and sec["implemented_as"] == {}
            assert [g[0] for g in gloo] == ["gloo:all_reduce"] * len(steps)
            assert sec["call_rows"]["bytes"] == [134154.0 * FP32] * len(steps)
            assert sec["call_rows"]["op"] == ["c10d::allreduce_"] * len(steps)
            (k,) = sec["kinds"]
            rows = [("all_reduce", g[3] * FP32, g[2]) for g in gloo]
            assert k["kind"] == "all_reduce" and k["bytes"] == 536616.0 * len(steps)
            assert k["busbw_gbps"] == pytest.approx(_busbw(rows, n), rel=1e-6)


def test_shard_run_ranks_view_shortest_rank():
    """The Ranks view matches each call across the two ranks by its order in the step (gloo
    spans carry no Seq): transfer = the shorter of the two ranks' span durations."""
    files = _files(SHARD)
    results, raws = {}, []
    for path in files:
        worker = path.name.split(".")[0]
        results[worker] = [report.analyze_trace(load_trace(str(path)), worker=worker)]
        raws.append(_raw(path))
    cb = ranks.rank_view(results)["collective_bandwidth"]
    assert cb["available"] and cb["match_by"] == "order"
    assert (cb["calls"], cb["matched_calls"], cb["unmatched_calls"], cb["incomplete_calls"]) == (12, 12, 0, 0)
    assert cb["link"]["gbps"] is None and cb["link"]["backend"] == "gloo"
    truth = raws[0][0]["demo_truth"]
    n = truth["world_size"]
    kinds = ["all_gather" if c["op"] == "all_gather_into_tensor" else "reduce_scatter"
             for c in truth["calls_per_step"]] * 3
    nbytes = [float(c["nccl_tests_bytes"]) for c in truth["calls_per_step"]] * 3
    shortest = [min(a[2], b[2]) for a, b in zip(raws[0][1], raws[1][1])]
    for g in cb["groups"]:
        mine = [(k, b, d) for k, b, d in zip(kinds, nbytes, shortest)
                if k == g["kind"] and C.size_bucket(b) == g["size_bucket"]]
        assert g["calls"] == g["matched_calls"] == len(mine) == 3
        assert g["bytes_per_call"] == mine[0][1]
        assert g["transfer_us"] == pytest.approx(sum(d for _, _, d in mine), rel=1e-6)
        assert g["busbw_gbps"] == pytest.approx(_busbw(mine, n), rel=1e-6)
        assert g["link_pct"] is None


def test_summary_keeps_source_and_implemented_as():
    files = _files(SHARD)
    res = [report.analyze_trace(load_trace(str(p)), worker=p.name.split(".")[0]) for p in files]
    summ = report.combine_results(res)["report"]
    sec = summ["collectives"]
    assert sec["source"] == "cpu_spans" and sec["implemented_as"] == {"reduce_scatter": "all_reduce"}
    kinds = {k["kind"]: k for k in sec["kinds"]}
    assert kinds["reduce_scatter"]["implemented_as"] == "all_reduce" and "implemented_as" not in kinds["all_gather"]
    assert kinds["all_gather"]["bytes"] == 2 * 3 * (263168 + 16448)
    assert summ["not_available"]["collectives.link_pct"] == C.GLOO_NO_LINK


# ---------------------------------------------------------------- hand-built: matching and edges

F = {"Input type": ["float"]}


def _dims(*shape):
    return dict(F, **{"Input Dims": [list(shape)]})


def _gloo_trace(world=2, pg_config=True):
    info = {"backend": "gloo", "rank": 0, "world_size": world}
    if pg_config:
        info["pg_config"] = [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]
    tb = TraceBuilder(props=(), distributed_info=info)
    tb.step(1, 0, 10_000)
    return tb


def _section(tb, tmp_path, name="g.pt.trace.json"):
    rep = report.analyze_trace(tb.load(tmp_path, name))["report"]
    return rep["collectives"], rep["not_available"]


def test_fifo_matching_by_hand(tmp_path):
    """Main thread (tid 1) enqueues allreduce_, _reduce_scatter_base_, allreduce_ before any
    gloo span runs (worker tids 2, 3): spans match in first-in first-out order, so only the
    second all_reduce span (1,000 floats = 4,000 B, 100 us) is a reduce_scatter:
    algbw 0.04 GB/s, busbw x (n-1)/n = 3/4 -> 0.03 (n = 4). The others: 2,000 B in 50 us,
    busbw 0.04 x 2*3/4 = 0.06."""
    tb = _gloo_trace(world=4)
    tb.cpu("c10d::allreduce_", 100, 10)
    tb.cpu("c10d::_reduce_scatter_base_", 120, 10)
    tb.cpu("c10d::allreduce_", 140, 10)
    tb.cpu("gloo:all_reduce", 200, 50, cat="user_annotation", tid=2, **_dims(500))
    tb.cpu("gloo:all_reduce", 300, 100, cat="user_annotation", tid=3, **_dims(1000))
    tb.cpu("gloo:all_reduce", 500, 50, cat="user_annotation", tid=2, **_dims(500))
    sec, na = _section(tb, tmp_path)
    cr = sec["call_rows"]
    assert cr["kind"] == ["all_reduce", "reduce_scatter", "all_reduce"]
    assert cr["implemented_as"] == [None, "all_reduce", None]
    assert cr["bytes"] == [2000.0, 4000.0, 2000.0] and cr["bus_factor"] == [1.5, 0.75, 1.5]
    kinds = {k["kind"]: k for k in sec["kinds"]}
    assert kinds["reduce_scatter"]["algbw_gbps"] == pytest.approx(0.04)
    assert kinds["reduce_scatter"]["busbw_gbps"] == pytest.approx(0.03)
    assert kinds["all_reduce"]["busbw_gbps"] == pytest.approx(0.06)
    assert sec["link"]["gbps"] is None and na["collectives.link_pct"] == C.GLOO_NO_LINK
    # no compute anywhere: every span is exposed
    assert sec["comm_us"] == pytest.approx(200) and sec["exposed_us"] == pytest.approx(200)


def test_unmatched_and_list_form_stay_all_reduce(tmp_path):
    """A gloo:all_reduce with no c10d op before it stays all_reduce (and the section says gloo
    could have run a reduce_scatter there); the list form c10d::reduce_scatter_ enqueues one
    all_reduce per rank's chunk (n = 2): both stay all_reduce, counted as such."""
    tb = _gloo_trace(world=2)
    tb.cpu("gloo:all_reduce", 50, 10, cat="user_annotation", tid=2, **_dims(100))
    tb.cpu("c10d::reduce_scatter_", 100, 10)
    tb.cpu("c10d::allreduce_", 130, 10)
    tb.cpu("gloo:all_reduce", 200, 10, cat="user_annotation", tid=2, **_dims(100))
    tb.cpu("gloo:all_reduce", 300, 10, cat="user_annotation", tid=2, **_dims(100))
    tb.cpu("gloo:all_reduce", 400, 20, cat="user_annotation", tid=2, **_dims(300))
    sec, _ = _section(tb, tmp_path)
    cr = sec["call_rows"]
    assert cr["kind"] == ["all_reduce"] * 4 and cr["implemented_as"] == [None] * 4
    assert cr["op"] == [None, "c10d::reduce_scatter_", "c10d::reduce_scatter_", "c10d::allreduce_"]
    assert C.AR_KEPT in sec["notes"] and C.RS_LIST in sec["notes"] and C.RS_AS_AR not in sec["notes"]
    assert sec["implemented_as"] == {}


def test_functional_collective_enqueues_too(tmp_path):
    """torch.distributed's functional collectives (_c10d_functional::reduce_scatter_tensor)
    enqueue gloo work as the c10d ops do: the full-input all_reduce is a reduce_scatter."""
    tb = _gloo_trace(world=2)
    tb.cpu("_c10d_functional::reduce_scatter_tensor", 100, 10)
    tb.cpu("_c10d_functional::wait_tensor", 115, 5)
    tb.cpu("gloo:all_reduce", 200, 10, cat="user_annotation", tid=2, **_dims(64))
    sec, _ = _section(tb, tmp_path)
    cr = sec["call_rows"]
    assert cr["kind"] == ["reduce_scatter"] and cr["implemented_as"] == ["all_reduce"]
    assert cr["op"] == ["_c10d_functional::reduce_scatter_tensor"] and cr["bytes"] == [256.0]


def test_all_gather_needs_the_group_size(tmp_path):
    """all_gather bytes are the local input x n: unknown without pg_config or world_size,
    with the reason; broadcast's bytes are its input either way."""
    tb = TraceBuilder(props=())
    tb.step(1, 0, 1000)
    tb.cpu("gloo:all_gather", 100, 10, cat="user_annotation", tid=2, **_dims(256))
    sec, na = _section(tb, tmp_path)
    assert sec["calls"] == 1 and sec["calls_with_bytes"] == 0 and sec["kinds"][0]["busbw_gbps"] is None
    assert na["collectives.bytes"] == C.NO_CPU_BYTES
    tb.cpu("gloo:broadcast", 200, 10, cat="user_annotation", tid=2, **_dims(256))
    sec, na = _section(tb, tmp_path, "b.pt.trace.json")
    assert sec["calls_with_bytes"] == 1 and "collectives.bytes" not in na
    b = {k["kind"]: k for k in sec["kinds"]}["broadcast"]
    assert b["bytes"] == 1024.0 and b["group_size"] is None and b["busbw_gbps"] is None


def test_compute_overlap_and_coalesced_inputs(tmp_path):
    """Compute on the main thread [220, 260) covers 40 of the span [200, 300): exposed 60.
    allreduce_coalesced records one input per tensor: bytes are their sum (10 + 20 floats)."""
    tb = _gloo_trace(world=2)
    tb.cpu("c10d::allreduce_coalesced_", 100, 10)
    tb.cpu("aten::mm", 220, 40)
    tb.cpu("gloo:all_reduce", 200, 100, cat="user_annotation", tid=2,
           **{"Input Dims": [[10], [20]], "Input type": ["float", "float"]})
    sec, _ = _section(tb, tmp_path)
    assert sec["call_rows"]["bytes"] == [120.0]
    assert sec["exposed_us"] == pytest.approx(60) and sec["kinds"][0]["exposed_us"] == pytest.approx(60)


def test_kernels_win_and_spans_outside_steps(tmp_path):
    """With communication kernels the section reads them (source kernels, GPU path as before);
    gloo spans outside every included step: null, with the reason."""
    tb = TraceBuilder(props=(A100,) * 2, distributed_info={"backend": "nccl", "rank": 0, "world_size": 2})
    tb.step(1, 0, 1000)
    tb.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 100, 100,
              **{"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
                 "Group size": 2})
    tb.cpu("gloo:all_reduce", 300, 10, cat="user_annotation", tid=2, **_dims(7))
    sec, _ = _section(tb, tmp_path)
    assert sec["source"] == "kernels" and sec["calls"] == 1 and sec["kinds"][0]["bytes"] == 4000.0
    assert "notes" not in sec and sec["link"]["gbps"] == 300.0
    tb = _gloo_trace()
    tb.cpu("gloo:all_reduce", 20_000, 10, cat="user_annotation", tid=2, **_dims(7))
    sec, na = _section(tb, tmp_path, "o.pt.trace.json")
    assert sec is None and na["collectives"] == C.NO_GLOO_IN_STEPS


def test_matching_checks_sizes_when_the_op_shapes_are_kept(tmp_path):
    """Where the trace kept the c10d op's input shapes, a span only takes an op holding a
    tensor of its size: here the reduce-scatter's span (1,000 elements) runs before the
    all_reduce's (500), against the enqueue order."""
    tb = _gloo_trace()
    tb.cpu("c10d::allreduce_", 100, 10)
    tb.cpu("c10d::_reduce_scatter_base_", 120, 10)
    tb.cpu("gloo:all_reduce", 200, 10, cat="user_annotation", tid=2, **_dims(1000))
    tb.cpu("gloo:all_reduce", 300, 10, cat="user_annotation", tid=3, **_dims(500))
    trace = tb.load(tmp_path)
    names = [trace.strings[i] for i in trace.cpu.name.tolist()]
    ar, rs = names.index("c10d::allreduce_"), names.index("c10d::_reduce_scatter_base_")
    spans = C.gloo_spans(trace)
    spans = spans[np.argsort(trace.cpu.ts[spans])]
    kinds = ["all_reduce", "all_reduce"]
    assert C.c10d_op_of(trace, spans, kinds, 2).tolist() == [ar, rs]  # order alone
    trace.op_inputs.dims[ar] = [[[500]], [], []]  # TensorList, as c10d::allreduce_ records it
    trace.op_inputs.dims[rs] = [[500], [1000], []]  # output, input
    assert C.c10d_op_of(trace, spans, kinds, 2).tolist() == [rs, ar]
