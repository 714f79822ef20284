"""Process groups in the Ranks view (issue 37, METRICS.md §12 "Process groups" and "The
straggler's cause by difference"): hand-built multi-group runs whose every number is worked
out in the docstrings, the public multi-rank traces counted independently from their raw
JSON, and the demo's straggler pair against its recorded settings."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import distributed
from tb_bottleneck_plugin.analysis import steps as steps_mod
from tb_bottleneck_plugin.trace import discovery, loader
from tb_bottleneck_plugin.views import ranks

from conftest import DEMO_LOGS, TRACES, TraceBuilder  # noqa: E402

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "volta_sgemm_128x64_nn"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
BACKWARD = "autograd::engine::evaluate_function: MmBackward0"
MS = 1000.0  # the fixtures are written in ms so that the sentences' "x.y ms" are exact


def _view(logdir: Path, run_name: str):
    scanned = discovery.scan_logdir(str(logdir))
    run = next(r for r in scanned.runs if r.name == run_name)
    results = {w.name: [report.analyze_span(str(logdir), run, s) for s in w.spans] for w in run.workers}
    return ranks.rank_view(results)


def _ar_args(pg, ranks_, seq, nelems=1024):
    args = {"In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float", "Group size": len(ranks_),
            "Collective name": "allreduce", "Process Group Name": pg,
            "Process Group Ranks": json.dumps(ranks_)}
    if seq is not None:
        args["Seq"] = seq
    return args


GROUPS = {"tp01": [0, 1], "tp23": [2, 3]}


def _rank_trace(rank, ar_ms, loader_ms=5.0, backward_gemm_ms=10.0, seqs=True, drop=(), nelems=None,
                backward_kernels=()):
    """One GPU rank of a 4-rank run with two tensor-parallel groups, tp01 = ranks 0-1 and
    tp23 = ranks 2-3, two steps of 200 ms. In each step: a DataLoader span [0, loader_ms),
    a backward node [10, 60) that launches a GEMM of ``backward_gemm_ms`` at 12, then two
    all-reduces of the rank's group, each ``ar_ms`` long, at 70 and 85 (Seq 2s and 2s+1 in step
    s, when ``seqs``). ``drop``: (step, index) pairs of all-reduces left out. ``backward_kernels``:
    (name, start ms, ms) of more kernels the backward node launches."""
    pg = "tp01" if rank < 2 else "tp23"
    info = {"backend": "nccl", "rank": rank, "world_size": 4, "pg_count": 2,
            "pg_config": [{"pg_name": name, "pg_desc": "TP", "backend_config": "cuda:nccl", "pg_size": 2,
                           "ranks": rs} for name, rs in GROUPS.items()]}
    b = TraceBuilder(distributed_info=info)
    for i, step in enumerate((1, 2)):
        t0 = i * 200 * MS
        b.step(step, t0, 200 * MS)
        b.cpu(LOADER, t0, loader_ms * MS, cat="user_annotation")
        b.cpu(BACKWARD, t0 + 10 * MS, 50 * MS)
        b.launch(GEMM, t0 + 12 * MS, t0 + 12 * MS, backward_gemm_ms * MS)
        for name, start, ms in backward_kernels:
            b.launch(name, t0 + start * MS, t0 + start * MS, ms * MS)
        for k, start in enumerate((70, 85)):
            if (step, k) in drop:
                continue
            n = (nelems or {}).get((step, k), 1024)
            b.launch(AR, t0 + start * MS - 2 * MS, t0 + start * MS, ar_ms * MS,
                     **_ar_args(pg, GROUPS[pg], 2 * step + k if seqs else None, n))
    return b


def _write_run(tmp_path, run="tp4", skip=(), per_rank=None):
    """Ranks 0-3. Rank 1 loads its batch for 40 ms (the others 5 ms): it arrives last at both
    tp01 all-reduces, which last 10 ms on it and 30 ms on rank 0. Rank 2 runs a 50 ms backward
    GEMM (the others 10 ms): it arrives last in tp23, whose all-reduces last 10 ms on it and
    50 ms on rank 3."""
    spec = {0: dict(ar_ms=30.0), 1: dict(ar_ms=10.0, loader_ms=40.0),
            2: dict(ar_ms=10.0, backward_gemm_ms=50.0), 3: dict(ar_ms=50.0)}
    for r, kw in spec.items():
        if r in skip:
            continue
        kw = dict(kw, **(per_rank or {}).get(r, {}))
        _rank_trace(r, **kw).write(tmp_path / run / f"rank{r}.1795000000000000000.pt.trace.json.gz")
    return tmp_path


def _group(view, name):
    return next(g for g in view["process_groups"] if g["name"] == name)


def test_two_groups_with_different_stragglers(tmp_path):
    """tp01: rank 1 is last at 4 of 4 calls; rank 0 waits 30 - 10 = 20 ms per call, 40 ms per
    200 ms step: wait caused 20 %. Cause: DataLoader 40 - 5 = 35 ms more per step (17.5 % of
    the step >= 5 %). tp23: rank 2 last at 4 of 4; rank 3 waits 40 ms per call: 40 %. Cause:
    backward GEMM 50 - 10 = 40 ms more per step; its all-reduces take 20 ms per step against
    rank 3's 100 ms: a compute straggler hidden by the all-reduce."""
    view = _view(_write_run(tmp_path), "tp4")
    assert [g["name"] for g in view["process_groups"]] == ["tp01", "tp23"]
    tp01, tp23 = _group(view, "tp01"), _group(view, "tp23")
    for g, members in ((tp01, [0, 1]), (tp23, [2, 3])):
        assert g["ranks"] == g["ranks_present"] == members and g["missing_ranks"] == []
        assert (g["calls"], g["matched_calls"], g["unmatched_calls"], g["match_by"]) == (8, 8, 0, "seq")
        assert g["label"] == f"TP (ranks {members[0]},{members[1]})" and g["kinds"] == ["all_reduce"]
        assert g["unmatched_seqs"] == []
    s1, s2 = tp01["straggler"], tp23["straggler"]
    assert (s1["rank"], s1["late_calls"], s1["of_calls"], s1["late_pct"], s1["steps"], s1["of_steps"]) == \
        (1, 4, 4, 100.0, 2, 2)
    assert s1["wait_caused_pct"] == pytest.approx(20.0)
    assert (s2["rank"], s2["late_calls"], s2["of_calls"], s2["late_pct"]) == (2, 4, 4, 100.0)
    assert s2["wait_caused_pct"] == pytest.approx(40.0)
    assert s1["sentence"].startswith("TP (ranks 0,1): rank 1 is late in 100% of its all-reduces (4 of 4")
    c1, c2 = s1["cause"], s2["cause"]
    assert c1["activity"] == "dataloader_us" and c1["diff_us"] == pytest.approx(35 * MS)
    assert c1["hidden_compute"] is False
    assert c1["sentence"].startswith("rank 1 spends 35.0 ms more per step in the DataLoader")
    assert c2["activity"] == "compute_backward_us" and c2["diff_us"] == pytest.approx(40 * MS)
    assert c2["hidden_compute"] is True
    assert (c2["comm_us_per_step"], c2["median_others_comm_us_per_step"]) == (20 * MS, 100 * MS)
    assert "compute straggler hidden by the all-reduce" in c2["sentence"]
    # by kernel family: the whole 40 ms is the backward GEMM (volta_sgemm); no other family differs
    assert c2["kernel_family_diff_us_per_step"] == {"compute_gemm_us": 40 * MS, "compute_attention_us": 0.0,
                                                    "compute_triton_us": 0.0, "compute_other_kernels_us": 0.0}
    assert c2["sentence"].endswith("; by kernel family: GEMM kernels +40.0 ms")
    assert "kernel_family_diff_us_per_step" not in c1  # not a compute cause
    # run level: each rank's waits summed over its groups (0: 40 ms, 1: 0, 2: 0, 3: 80 ms per step)
    assert [r["per_step"]["wait_us"] for r in view["ranks"]] == [[40 * MS] * 2, [0.0] * 2, [0.0] * 2,
                                                                [80 * MS] * 2]
    text = ranks.format_ranks_text(view)
    assert "TP (ranks 2,3): rank 2 is late in 100% of its all-reduces" in text
    assert "compute straggler hidden by the all-reduce" in text


def test_a_compute_cause_names_the_kernel_families_that_differ(tmp_path):
    """Rank 2's backward runs the same 10 ms GEMM as everyone, plus a 30 ms Triton kernel and a
    4 ms elementwise kernel that the others run for 1 ms each (at 25 and 56 ms). Compute in
    backward: 44 vs 12 ms, 32 ms more per step (16 % of the step); by family Triton +29 ms
    (91 % of 32), other kernels +3 ms (9 %: under STRAGGLER_CAUSE_FAMILY_MIN_PCT, not named), GEMM 0."""
    tri, elem = "triton_poi_fused_add_mul_0", "void at::native::vectorized_elementwise_kernel<4>"
    slow = dict(backward_kernels=((tri, 25.0, 30.0), (elem, 56.0, 4.0)))
    fast = dict(backward_kernels=((tri, 25.0, 1.0), (elem, 56.0, 1.0)))
    view = _view(_write_run(tmp_path, per_rank={0: fast, 1: fast, 2: dict(slow, backward_gemm_ms=10.0),
                                                  3: fast}), "tp4")
    cause = _group(view, "tp23")["straggler"]["cause"]
    assert cause["activity"] == "compute_backward_us" and cause["diff_us"] == pytest.approx(32 * MS)
    fam = cause["kernel_family_diff_us_per_step"]
    assert fam["compute_triton_us"] == pytest.approx(29 * MS)
    assert fam["compute_other_kernels_us"] == pytest.approx(3 * MS)
    assert fam["compute_gemm_us"] == fam["compute_attention_us"] == 0.0
    assert cause["sentence"].endswith("; by kernel family: Triton (torch.compile) kernels +29.0 ms")


def test_missing_rank_file(tmp_path):
    """Rank 3's trace is missing: tp23 has one rank present, nothing to match; it is said."""
    view = _view(_write_run(tmp_path, skip=(3,)), "tp4")
    tp23 = _group(view, "tp23")
    assert tp23["missing_ranks"] == [3] and tp23["ranks_present"] == [2]
    assert (tp23["calls"], tp23["matched_calls"], tp23["unmatched_calls"]) == (4, 0, 4)
    assert tp23["straggler"] is None
    assert "rank(s) 3" in view["not_available"]["ranks.process_groups.tp23"]
    assert _group(view, "tp01")["straggler"]["rank"] == 1  # the other group is unaffected


def test_unmatched_sequence_numbers(tmp_path):
    """Rank 1 lacks the second all-reduce of step 1 (Seq 3): rank 0's call with Seq 3 is
    unmatched; every other number still matches (by sequence number, not by position)."""
    view = _view(_write_run(tmp_path, per_rank={1: {"drop": ((1, 1),)}}), "tp4")
    tp01 = _group(view, "tp01")
    assert (tp01["calls"], tp01["matched_calls"], tp01["unmatched_calls"]) == (7, 6, 1)
    assert tp01["unmatched_seqs"] == [3] and tp01["match_by"] == "seq"
    assert tp01["straggler"]["late_calls"] == 3 and tp01["straggler"]["of_calls"] == 3


def test_order_matching_stops_at_a_size_mismatch(tmp_path):
    """Without Seq, by position: in step 1 the first all-reduce of tp01 has 1024 elements on
    rank 0 and 2048 on rank 1 (not the same call): matching of that step stops there, so both of
    its calls are unmatched on both ranks; step 2 matches."""
    view = _view(_write_run(tmp_path, per_rank={0: {"seqs": False}, 1: {"seqs": False, "nelems": {(1, 0): 2048}},
                                          2: {"seqs": False}, 3: {"seqs": False}}), "tp4")
    tp01 = _group(view, "tp01")
    assert tp01["match_by"] == "order"
    assert (tp01["calls"], tp01["matched_calls"], tp01["unmatched_calls"]) == (8, 4, 4)
    assert _group(view, "tp23")["matched_calls"] == 8


def _raw_counts(path):
    """Communication kernels per process group whose start lies in a ProfilerStep window of
    the given step numbers, counted from the raw JSON alone."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    cfg = (doc.get("distributedInfo") or {}).get("pg_config") or []
    default = str(cfg[0]["pg_name"]) if len(cfg) == 1 else "unknown"
    windows = {int(e["name"].split("#")[1]): (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
               for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}
    kernels = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")
               and "nccl" in str(e.get("name", "")).lower()]
    return windows, [(float(e["ts"]), str((e.get("args") or {}).get("Process Group Name", default)))
                     for e in kernels]


PUBLIC = ["hta/nccl_parser_config/nccl_data.json.gz", "tracelens/mi300/resnet_act_checkpoint.json.gz",
          "hta/negative_queue_length_values_check/rank0.json.gz", "hta/trace_diff/control/control.json.gz"]


@pytest.mark.parametrize("rel", PUBLIC)
def test_per_group_counts_equal_the_raw_json(rel, tmp_path):
    """Per process group, the partial's collectives (in its included steps) equal the raw
    JSON's communication kernels of that group whose start lies in those steps' windows
    (stretched windows, as §1 and the partial use them: each step ends where the next
    begins, the last at its own end or its last GPU work)."""
    path = TRACES / rel
    trace = loader.load_trace(str(path))
    found = steps_mod.find_steps(trace)
    part = distributed.span_partial(trace, found)
    ours = {}
    for s in part["steps"]:
        for g in s["collectives"]["pg"]:
            ours[g or "unknown"] = ours.get(g or "unknown", 0) + 1
    windows, kernels = _raw_counts(path)
    lo, hi = found.inc_start.tolist(), found.inc_end.tolist()
    assert [windows[n][0] for n in found.inc_numbers.tolist()] == pytest.approx(lo)
    raw = {}
    for ts, pg in kernels:
        if any(a <= ts < b for a, b in zip(lo, hi)):
            raw[pg] = raw.get(pg, 0) + 1
    assert ours == raw and sum(raw.values()) > 0
    # the run level over two workers of the same file: each group's calls are both ranks'
    run = tmp_path / "pair"
    run.mkdir()
    for w in ("a", "b"):
        os.symlink(path, run / f"{w}.1795000000000000000.pt.trace.json.gz")
    view = _view(tmp_path, "pair")
    assert {g["name"]: g["calls"] for g in view["process_groups"]} == {k: 2 * v for k, v in raw.items()}


def test_demo_straggler_cause_matches_the_demo_settings():
    """ddp_straggler_2rank: rank 1's dataset sleeps 300 ms per batch, rank 0's 150 ms
    (demo_settings.load_ms): the cause is the DataLoader, 150 ms more per step (within 10 %).
    ddp_balanced_2rank (150 ms each): no straggler worth a cause."""
    settings = []
    for f in sorted((DEMO_LOGS / "ddp_straggler_2rank").glob("*.gz")):
        with gzip.open(f, "rt") as fh:
            settings.append(json.load(fh)["demo_settings"]["load_ms"])
    load = settings[0]
    truth_ms = load[1] - load[0]
    view = _view(DEMO_LOGS, "ddp_straggler_2rank")
    cause = view["straggler_cause"]
    assert cause["rank"] == 1 and cause["activity"] == "dataloader_us"
    assert cause["diff_us"] / MS == pytest.approx(truth_ms, rel=0.10)
    assert not cause["hidden_compute"]
    (g,) = view["process_groups"]
    assert g["name"] == "0" and g["label"] == "default_pg (ranks 0,1)" and g["straggler"]["rank"] == 1
    assert g["straggler"]["cause"]["activity"] == "dataloader_us"
    assert view["recommendation"]["action"].startswith("Why it is late: rank 1 spends 1")
    assert view["recommendation"]["difference"]["activity"] == "dataloader_us"
    balanced = _view(DEMO_LOGS, "ddp_balanced_2rank")
    assert balanced["straggler_cause"] is None
    assert all(g["straggler"] is None or g["straggler"]["cause"] is None for g in balanced["process_groups"])


def test_busbw_per_group(tmp_path):
    """collective_bandwidth per process group: each tp group's 4 calls (Seq 2-5) matched over
    its two ranks; transfer = the shorter duration, 10 ms; 1024 floats = 4096 B, factor
    2(n-1)/n = 1 for n = 2: busbw = 4096 B / 10 ms = 4.096e-4 GB/s."""
    view = _view(_write_run(tmp_path), "tp4")
    rows = {g["process_group"]: g for g in view["collective_bandwidth"]["groups"]}
    assert set(rows) == {"tp01", "tp23"}
    for g in rows.values():
        assert (g["calls"], g["matched_calls"], g["group_size"], g["bytes_per_call"]) == (4, 4, 2, 4096.0)
        assert g["transfer_us"] == pytest.approx(4 * 10 * MS)
        assert g["busbw_gbps"] == pytest.approx(4096 / (10 * MS) / 1e3)


def test_run_table_needs_the_same_size_on_every_rank():
    """Two ranks, one group, no Seq: call 0 has 4096 B on both (matched); call 1 has 4096 B on
    rank 0 and 8192 B on rank 1 (not the same call: unmatched)."""
    from tb_bottleneck_plugin.analysis import collectives as C

    def rows(b1, d):
        return {"kind": ["all_reduce"] * 2, "process_group": ["0"] * 2, "seq": [None] * 2, "step": [1, 1],
                "bytes": [4096.0, b1], "dur_us": d, "group_size": [2, 2], "bus_factor": [1.0, 1.0]}

    table = C.run_table([rows(4096.0, [10.0, 20.0]), rows(8192.0, [30.0, 5.0])])
    assert (table["calls"], table["matched_calls"], table["unmatched_calls"]) == (2, 1, 1)
    (g,) = table["groups"]
    assert g["transfer_us"] == 10.0 and g["bytes"] == 4096.0


def test_demo_compute_straggler_is_named_as_hidden_by_the_all_reduce():
    """ddp_compute_straggler_2rank: both ranks load their batch in 150 ms; rank 1's backward
    sleeps backward_ms[1] = 100 ms longer (demo_settings): the cause is backward compute, about
    100 ms more per step (within 10 %), a compute straggler hidden by the all-reduce (rank 1's
    own all-reduce time is the shorter one)."""
    run = DEMO_LOGS / "ddp_compute_straggler_2rank"
    with gzip.open(sorted(run.glob("*.gz"))[0], "rt") as fh:
        settings = json.load(fh)["demo_settings"]
    assert settings["load_ms"][0] == settings["load_ms"][1]
    truth_ms = settings["backward_ms"][1] - settings["backward_ms"][0]
    view = _view(DEMO_LOGS, "ddp_compute_straggler_2rank")
    cause = view["straggler_cause"]
    assert cause["rank"] == 1 and cause["activity"] == "compute_backward_us"
    assert cause["diff_us"] / MS == pytest.approx(truth_ms, rel=0.10)
    assert cause["hidden_compute"] and cause["comm_us_per_step"] < cause["median_others_comm_us_per_step"]
    assert abs(cause["diff_us_per_step"]["dataloader_us"]) < 0.1 * cause["diff_us"]
    rec = view["recommendation"]
    assert rec["difference"]["activity"] == "compute_backward_us"
    assert "compute straggler hidden by the all-reduce" in rec["action"]
    assert "Balance the backward work across ranks" in rec["action"]
