"""Collective bandwidth against the link (METRICS.md "Collective bandwidth", issue 24).

Hand-built traces whose bytes, durations and overlaps are chosen so every number can be
checked by hand, then every shared multi-GPU trace against a direct read of its raw JSON."""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import collectives as C
from tb_bottleneck_plugin.analysis.distributed import _DTYPE_BYTES, collective_kind
from tb_bottleneck_plugin.trace.loader import load_trace

from trace_builder import A100, MI300, V100, TraceBuilder

TRACES = Path("/work/shared/traces")
AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
AG = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclKernel_ReduceScatter_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)"
A2A = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
BC = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
RD = "ncclKernel_Reduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "ampere_sgemm_128x64_nn"


def coll(name, in_n, out_n, dtype, n, pg="0", seq=None, ranks_text=None):
    args = {"Collective name": name, "In msg nelems": in_n, "Out msg nelems": out_n, "dtype": dtype,
            "Group size": n, "Process Group Name": pg,
            "Process Group Ranks": ranks_text or json.dumps(list(range(n)))}
    if seq is not None:
        args["Seq"] = seq
    return args


def analyzed(tb, tmp_path, name="t.pt.trace.json", worker=None):
    return report.analyze_trace(tb.load(tmp_path, name), worker=worker)


def row(rows, **match):
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, rows)
    return hits[0]


@pytest.fixture(autouse=True)
def _no_env_link(monkeypatch):
    monkeypatch.delenv(C.ENV_LINK, raising=False)


# ---------------------------------------------------------------- each formula, each kind


def test_every_kind_bytes_algbw_busbw_by_hand(tmp_path):
    """One step [0, 2000) on an 8-GPU A100 node, group of 4 ranks (0-3, this rank 0):
    all_reduce 1e6 float = 4e6 B in 100 us: algbw 40 GB/s, busbw 40 x 2*3/4 = 60 (20 % of 300);
    all_gather In 250k Out 1e6 bf16 = 2e6 B (the full array) in 50 us: 40, bus x 3/4 = 30;
    reduce_scatter In 1e6 Out 250k half = 2e6 B in 100 us: 20, bus 15;
    all_to_all 500k float = 2e6 B in 40 us: 50, bus 37.5;
    broadcast 250k float = 1e6 B in 20 us: 50, bus 50; reduce 250k float in 25 us: 40, bus 40.
    Compute [150, 300) covers the second half of the all_reduce [100, 200): exposed 50 of it."""
    tb = TraceBuilder(props=(A100,) * 8, distributed_info={"backend": "nccl", "rank": 0, "world_size": 4})
    tb.step(1, 0, 2000)
    tb.kernel(AR, 100, 100, **coll("allreduce", 1_000_000, 1_000_000, "Float", 4))
    tb.kernel(GEMM, 150, 150)
    tb.kernel(AG, 400, 50, **coll("_allgather_base", 250_000, 1_000_000, "BFloat16", 4))
    tb.kernel(RS, 500, 100, **coll("_reduce_scatter_base", 1_000_000, 250_000, "Half", 4))
    tb.kernel(A2A, 700, 40, **coll("all_to_all", 500_000, 500_000, "Float", 4))
    tb.kernel(BC, 800, 20, **coll("broadcast", 250_000, 250_000, "Float", 4))
    tb.kernel(RD, 900, 25, **coll("reduce", 250_000, 250_000, "Float", 4))
    res = analyzed(tb, tmp_path)
    sec = res["report"]["collectives"]
    assert sec["calls"] == 6 and sec["calls_with_bytes"] == 6 and sec["time_includes_wait"]
    link = sec["link"]
    assert (link["gbps"], link["bidirectional_gbps"], link["scope"], link["scope_assumed"]) == \
        (300.0, 600.0, "intra_node", False)
    want = {"all_reduce": (4e6, 40, 60), "all_gather": (2e6, 40, 30), "reduce_scatter": (2e6, 20, 15),
            "all_to_all": (2e6, 50, 37.5), "broadcast": (1e6, 50, 50), "reduce": (1e6, 40, 40)}
    for kind, (b, alg, bus) in want.items():
        r = row(sec["kinds"], kind=kind)
        assert r["bytes"] == b and r["bytes_per_call"] == b and r["group_size"] == 4
        assert r["algbw_gbps"] == pytest.approx(alg) and r["busbw_gbps"] == pytest.approx(bus)
        assert r["link_pct"] == pytest.approx(100 * bus / 300)
    assert row(sec["kinds"], kind="all_reduce")["exposed_us"] == pytest.approx(50)
    assert row(sec["kinds"], kind="all_gather")["exposed_us"] == pytest.approx(50)
    # exposed: union of communication (100+50+100+40+20+25 = 335) minus compute overlap 50
    assert sec["comm_us"] == pytest.approx(335) and sec["exposed_us"] == pytest.approx(285)
    assert row(sec["process_groups"], process_group="0")["exposed_us"] == pytest.approx(285)
    g = row(sec["groups"], kind="all_reduce", process_group="0")
    assert g["size_bucket"] == "1-16MiB"
    assert row(sec["groups"], kind="broadcast")["size_bucket"] == "64KiB-1MiB"
    # per step: Σ bus bytes / Σ time over the step
    bus_bytes = 4e6 * 1.5 + 2e6 * .75 + 2e6 * .75 + 2e6 * .75 + 1e6 + 1e6
    assert sec["per_step"][0]["busbw_gbps"] == pytest.approx(bus_bytes / 335 / 1e3)
    # the summary of the span (finish over its partial) is the span's numbers again
    summ = report.combine_results([res])["report"]["collectives"]
    assert row(summ["kinds"], kind="all_reduce")["busbw_gbps"] == pytest.approx(60)
    assert summ["exposed_us"] == pytest.approx(285)


def test_formulas_and_link_table():
    assert C.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert C.busbw_factor("all_gather", 8) == C.busbw_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert C.busbw_factor("all_to_all", 2) == 0.5 and C.busbw_factor("broadcast", 8) == 1.0
    assert C.busbw_factor("reduce", 8) == 1.0 and C.busbw_factor("barrier", 8) is None
    assert C.busbw_factor("all_reduce", None) is None
    # all-gather without Out: In x n; reduce-scatter without Out: In is the full array
    assert C.message_bytes("all_gather", 10, -1, 4, 8) == 320.0
    assert C.message_bytes("reduce_scatter", 80, -1, 2, 8) == 160.0
    assert C.message_bytes("all_reduce", 10, 10, None, 8) is None
    table = {"Tesla V100-SXM2-32GB": 150, "NVIDIA A100-SXM4-80GB": 300, "NVIDIA H100 80GB HBM3": 450,
             "NVIDIA H200": 450, "NVIDIA B200": 900, "AMD Instinct MI300X": 448, "AMD Instinct MI250X": 400,
             "NVIDIA H100 PCIe": 64, "NVIDIA A100-PCIE-40GB": 32}
    for name, per_dir in table.items():
        link = C.link_peak(name, False, env="")
        assert link["gbps"] == per_dir, name
        assert link["bidirectional_gbps"] == 2 * per_dir
    assert C.link_peak("NVIDIA H100 80GB HBM3", True, env="")["gbps"] == 50  # NDR 400 Gb/s
    assert C.link_peak("NVIDIA A100-SXM4-80GB", True, env="")["gbps"] == 25  # HDR 200 Gb/s
    unknown = C.link_peak("NVIDIA A100-SXM4-80GB", None, env="")
    assert unknown["scope"] == "intra_node" and unknown["scope_assumed"]
    assert C.link_peak("Mystery GPU", False, env="")["gbps"] is None
    user = C.link_peak("NVIDIA A100-SXM4-80GB", True, env="123.5")
    assert user["gbps"] == 123.5 and user["override"] and "BOTTLENECKS_LINK_GBPS" in user["source"]
    assert C.size_bucket(64 << 10) == "64KiB-1MiB" and C.size_bucket(None) == "unknown"


def test_env_override_and_inter_node(tmp_path, monkeypatch):
    """A group of 16 ranks on an 8-GPU node spans nodes: the node's InfiniBand HDR NICs, one
    per GPU (25 GB/s per direction each, 8 x 25 = 200 under the A100's NVLink 300); one GPU in
    deviceProperties: one NIC. BOTTLENECKS_LINK_GBPS overrides it."""
    tb = TraceBuilder(props=(A100,) * 8, distributed_info={"backend": "nccl", "rank": 0, "world_size": 16})
    tb.step(1, 0, 1000)
    tb.kernel(AR, 100, 100, **coll("allreduce", 250_000, 250_000, "Float", 16))  # 1e6 B: 10 GB/s, bus 18.75
    sec = analyzed(tb, tmp_path)["report"]["collectives"]
    assert sec["link"]["scope"] == "inter_node" and sec["link"]["gbps"] == 200
    assert sec["link"]["nics"] == 8 and sec["link"]["per_nic_gbps"] == 25
    assert sec["kinds"][0]["link_pct"] == pytest.approx(100 * 18.75 / 200)
    one = TraceBuilder(props=(A100,), distributed_info={"backend": "nccl", "rank": 0, "world_size": 16})
    one.step(1, 0, 1000)
    one.kernel(AR, 100, 100, **coll("allreduce", 250_000, 250_000, "Float", 16))
    sec1 = analyzed(one, tmp_path, "one.pt.trace.json")["report"]["collectives"]
    assert sec1["link"]["gbps"] == 25 and sec1["kinds"][0]["link_pct"] == pytest.approx(75)
    monkeypatch.setenv(C.ENV_LINK, "37.5")
    sec = analyzed(tb, tmp_path, "u.pt.trace.json")["report"]["collectives"]
    assert sec["link"]["override"] and sec["kinds"][0]["link_pct"] == pytest.approx(50)


def test_no_args_is_not_available_with_reason(tmp_path):
    tb = TraceBuilder(props=(V100,))
    tb.step(1, 0, 1000)
    tb.kernel(AR, 100, 100)
    res = analyzed(tb, tmp_path)
    sec, na = res["report"]["collectives"], res["report"]["not_available"]
    assert sec["calls"] == 1 and sec["calls_with_bytes"] == 0
    assert sec["kinds"][0]["busbw_gbps"] is None and sec["kinds"][0]["bytes"] is None
    assert "In msg nelems" in na["collectives.bytes"]
    assert sec["exposed_us"] == pytest.approx(100)
    tb2 = TraceBuilder(props=(V100,))
    tb2.step(1, 0, 1000)
    tb2.kernel(GEMM, 100, 100)
    res = analyzed(tb2, tmp_path, "n.pt.trace.json")
    assert res["report"]["collectives"] is None
    assert res["report"]["not_available"]["collectives"] == C.NO_COMM


# ---------------------------------------------------------------- run level: shortest among ranks


def _rank_trace(rank, durs, world=3, seqs=None, pg="0", offset=0.0, n=None, names=None):
    """A rank's trace: step 1 [0, 1000) (+ offset: other clocks), all_reduces of 1e6 float
    (4e6 B) at 100, 300, 500, ... with the given durations."""
    tb = TraceBuilder(props=(A100,) * 8, distributed_info={"backend": "nccl", "rank": rank, "world_size": world})
    tb.step(1, offset, 1000)
    for i, d in enumerate(durs):
        seq = None if seqs is None else seqs[i]
        name = AR if names is None else names[i]
        kind = "allreduce" if name == AR else "broadcast"
        tb.kernel(name, offset + 100 + 200 * i, d, **coll(kind, 1_000_000, 1_000_000, "Float", n or world,
                                                          pg=pg, seq=seq))
    return tb


def _run(tmp_path, builders):
    results = {}
    for r, tb in enumerate(builders):
        d = tmp_path / f"r{r}"
        d.mkdir(parents=True)
        results[f"rank{r}"] = [report.analyze_trace(tb.load(d), worker=f"rank{r}")]
    return ranks.rank_view(results)


def test_ranks_shortest_duration_matched_by_seq(tmp_path):
    """Three ranks, two all_reduces (Seq 1, 2) of 4e6 B, group of 3 (factor 2*2/3):
    call 1 durations 100, 80, 120 -> transfer 80; call 2: 50, 60, 40 -> 40 (rank 1 lists its
    calls in the other order by time: Seq, not position, matches them).
    Σ bytes 8e6 / Σ transfer 120 us = 66.67 GB/s, busbw x 4/3 = 88.9."""
    view = _run(tmp_path, [_rank_trace(0, [100, 50], seqs=[1, 2]),
                           _rank_trace(1, [60, 80], seqs=[2, 1], offset=5e6),
                           _rank_trace(2, [120, 40], seqs=[1, 2])])
    cb = view["collective_bandwidth"]
    assert cb["available"] and cb["match_by"] == "seq"
    assert (cb["calls"], cb["matched_calls"], cb["unmatched_calls"], cb["incomplete_calls"]) == (2, 2, 0, 0)
    g = row(cb["groups"], kind="all_reduce")
    assert g["transfer_us"] == pytest.approx(120) and g["bytes"] == 8e6
    assert g["algbw_gbps"] == pytest.approx(8e6 / 120 / 1e3)
    assert g["busbw_gbps"] == pytest.approx(8e6 / 120 / 1e3 * 4 / 3)
    assert g["link_pct"] == pytest.approx(100 * g["busbw_gbps"] / 300)
    # per rank: its own kernel time (waiting included): rank 2 waited 160 us for 8e6 B
    assert row(cb["ranks"], rank=2)["busbw_gbps"] == pytest.approx(8e6 * 4 / 3 / 160 / 1e3)
    # the span numbers of rank 0 include the wait: 8e6 B in 150 us
    text = ranks.format_ranks_text(view)
    assert "rank" in text


def test_ranks_mismatched_seq_and_missing_rank(tmp_path):
    """Seq 7 on ranks 0 and 2, Seq 8 on rank 1 only: Seq 7 is matched on 2 of 3 ranks
    (incomplete, transfer = min(90, 70) = 70), Seq 8 is unmatched (one rank: left out)."""
    view = _run(tmp_path, [_rank_trace(0, [90], seqs=[7]), _rank_trace(1, [50], seqs=[8]),
                           _rank_trace(2, [70], seqs=[7])])
    cb = view["collective_bandwidth"]
    assert (cb["calls"], cb["matched_calls"], cb["unmatched_calls"], cb["incomplete_calls"]) == (2, 1, 1, 1)
    g = row(cb["groups"], kind="all_reduce")
    assert g["transfer_us"] == pytest.approx(70) and g["bytes"] == 4e6 and g["incomplete_calls"] == 1
    # a rank missing altogether: group of 4, two traces -> every call incomplete
    view = _run(tmp_path / "m", [_rank_trace(0, [30, 30], n=4, world=4), _rank_trace(1, [20, 40], n=4, world=4)])
    cb = view["collective_bandwidth"]
    assert cb["match_by"] == "order" and cb["incomplete_calls"] == 2
    assert row(cb["groups"], kind="all_reduce")["transfer_us"] == pytest.approx(50)


def test_ranks_order_matching_and_kind_mismatch(tmp_path):
    """No Seq: matched by position in the step; the second call is an all_reduce on rank 0
    and a broadcast on rank 1: unmatched, its durations stay out of the bandwidth."""
    view = _run(tmp_path, [_rank_trace(0, [100, 10], world=2, names=[AR, AR]),
                           _rank_trace(1, [60, 10], world=2, names=[AR, BC])])
    cb = view["collective_bandwidth"]
    assert cb["match_by"] == "order" and (cb["matched_calls"], cb["unmatched_calls"]) == (1, 1)
    g = row(cb["groups"], kind="all_reduce")
    assert g["transfer_us"] == pytest.approx(60) and g["busbw_gbps"] == pytest.approx(4e6 / 60 / 1e3 * 1.0)


def test_ranks_without_args(tmp_path):
    tbs = []
    for r in range(2):
        tb = TraceBuilder(props=(V100,) * 2, distributed_info={"backend": "nccl", "rank": r, "world_size": 2})
        tb.step(1, 0, 1000)
        tb.kernel(AR, 100, 100 + 10 * r)
        tbs.append(tb)
    view = _run(tmp_path, tbs)
    cb = view["collective_bandwidth"]
    assert cb["matched_calls"] == 1
    g = cb["groups"][0]
    assert g["bytes"] is None and g["busbw_gbps"] is None and g["size_bucket"] == "unknown"


def test_run_table_cost_at_1024_ranks():
    """1,024 ranks x 200 calls (Seq-matched): the run-level table stays well under a second."""
    rng = np.random.default_rng(0)
    n_calls, n_ranks = 200, 1024
    kinds = (["all_reduce"] * 150 + ["all_gather"] * 50)
    rows = []
    for r in range(n_ranks):
        rows.append({"kind": kinds, "process_group": ["0"] * n_calls, "seq": list(range(n_calls)),
                     "step": [1 + i // 20 for i in range(n_calls)], "bytes": [4e6] * n_calls,
                     "dur_us": (50 + rng.random(n_calls) * 50).tolist(), "group_size": [n_ranks] * n_calls,
                     "bus_factor": [1.99] * n_calls, "exposed_us": [0.0] * n_calls})
    link = C.link_peak("NVIDIA H100 80GB HBM3", True, env="")
    t0 = time.perf_counter()
    table = C.run_table(rows, list(range(n_ranks)), link)
    took = time.perf_counter() - t0
    assert table["matched_calls"] == n_calls and table["incomplete_calls"] == 0
    assert took < 3.0, took
    print(f"run_table 1024 ranks x {n_calls} calls: {took * 1000:.0f} ms")


# ---------------------------------------------------------------- shared multi-GPU traces

SHARED = ["hta/negative_queue_length_values_check/rank0.json.gz", "hta/nccl_parser_config/nccl_data.json.gz",
          "hta/df_index_resolver/df_index_resolver.json.gz", "hta/trace_diff/control/control.json.gz",
          "tracelens/mi300/resnet_act_checkpoint.json.gz"]


# bytes from the launching ops (no kernel metadata) on a 2-node group: the link is the node's NICs
MULTI_RAIL = ("hta/negative_queue_length_values_check/rank0.json.gz",)


def _raw_kernels_with_args(path):
    doc = json.load(gzip.open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    out = {}
    for e in events:
        a = e.get("args") or {}
        if e.get("cat") == "kernel" and "In msg nelems" in a:
            kind = collective_kind(a.get("Collective name") or "") or "other"
            if kind == "other":
                kind = collective_kind(e["name"])
            size = _DTYPE_BYTES[a["dtype"].lower()]
            nel = a["In msg nelems"]
            if kind in ("all_gather", "reduce_scatter"):
                nel = max(nel, a.get("Out msg nelems", -1))
            out[round(float(e["ts"]), 3)] = (kind, float(nel * size))
    return out


@pytest.mark.parametrize("name", SHARED)
def test_shared_traces_bytes_and_busbw_within_link(name):
    path = TRACES / name
    if not path.exists():
        pytest.skip("shared trace missing")
    trace = load_trace(str(path))
    res = report.analyze_trace(trace)
    rep = res["report"]
    sec = rep["collectives"]
    assert sec is not None and sec["calls"] > 0
    raw = _raw_kernels_with_args(path)
    from tb_bottleneck_plugin.analysis.steps import find_steps  # noqa: F401 (the report's steps)
    t = C.call_table(trace, _steps_of(trace))
    seen = 0
    for ts, b, src in zip(trace.gpu.ts[_rows_of(trace, t)].tolist(), t["bytes"].tolist(), t["bytes_source"]):
        key = round(ts, 3)
        if key in raw:
            assert src == "kernel_args" and b == raw[key][1], (name, ts)
            seen += 1
    # the rest: sizes from the launching ops (issue 34 item 8; pinned in test_collectives_launching_op.py)
    assert seen == sec["calls_with_bytes"] - sum(1 for s in t["bytes_source"] if s and s != "kernel_args")
    if not raw:
        assert sec["calls_with_bytes"] == 0 or "kernel_args" not in sec["bytes_sources"]
    if sec["calls_with_bytes"] == 0:
        assert "In msg nelems" in rep["not_available"]["collectives.bytes"]
        assert all(k["busbw_gbps"] is None for k in sec["kinds"])
    peak = sec["link"]["gbps"]
    assert peak, sec["link"]
    for r in sec["groups"] + sec["kinds"]:
        if r["busbw_gbps"] is None:
            continue
        assert r["busbw_gbps"] <= peak * 1.05, (name, r)
        assert r["link_pct"] == pytest.approx(100 * r["busbw_gbps"] / peak), r
    if name in MULTI_RAIL:
        # 16 ranks on two 8-GPU nodes: the link is the node's 8 HDR NICs, 8 x 25 GB/s per direction
        # (NCCL spreads the channels over every rail), under the A100's 300 GB/s NVLink
        assert sec["link"]["scope"] == "inter_node" and sec["link"]["nics"] == 8
        assert peak == pytest.approx(200.0)
    json.dumps(sec, allow_nan=False)


def _steps_of(trace):
    from tb_bottleneck_plugin.analysis import steps as S
    return S.find_steps(trace)


def _rows_of(trace, t):
    """kernel rows of call_table (the comm kernels in included steps, in start order)."""
    from tb_bottleneck_plugin.analysis.breakdown import comm_kernel_mask
    st = _steps_of(trace)
    rows = np.flatnonzero(comm_kernel_mask(trace))
    i = np.searchsorted(st.inc_start, trace.gpu.ts[rows], side="right") - 1
    ok = (i >= 0) & (trace.gpu.ts[rows] < st.inc_end[np.maximum(i, 0)])
    rows = rows[ok]
    rows = rows[np.argsort(trace.gpu.ts[rows], kind="stable")]
    assert len(rows) == len(t["dur_us"])
    return rows
