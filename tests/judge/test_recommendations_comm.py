"""Bucket and prefetch advice (rules ddp_buckets and fsdp_prefetch, METRICS.md §9, issue 24):
given only with evidence (calls per step, bytes per call, exposed communication time from
the collectives section), ranked by the exposed share of the step it could give back.

Hand-made reports with chosen numbers (every expected value worked out in the comments),
then the demo's real runs: the DDP pair (one 524 KiB bucket per step: no bucket advice),
the FSDP-style shard run (all-gather/reduce-scatter exposed: prefetch advice) and a
single-process run (no collectives: neither)."""
from __future__ import annotations

import pytest

from conftest import DEMO_LOGS

from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.judge import recommendations as R

MIB = 2**20


def _report(kinds, steps=4, step_us=100_000.0, **extra):
    """A summary-like report: ``kinds`` = [(kind, calls, bytes per call, exposed µs in total)]."""
    return {"steps": {"count": steps}, "avg_step_us": step_us, "context": {"distributed": True, "mode": "training"},
            "collectives": {"kinds": [{"kind": k, "calls": c, "bytes_calls": c, "bytes": c * b, "exposed_us": e}
                                      for k, c, b, e in kinds]}, **extra}


def _rules(rep):
    return [r["rule"] for r in R.recommend(rep)]


def test_many_small_all_reduces_fire_with_their_numbers():
    # 40 calls over 4 steps = 10 per step (>= 8), 1 MiB each (<= 4 MiB), 40 ms exposed = 10 ms per
    # step of a 100 ms step = 10 % (>= 5 %, < 30 %: medium)
    rec = R.rule_ddp_buckets(_report([("all_reduce", 40, 1 * MIB, 40_000.0)]))
    assert rec["rule"] == "ddp_buckets" and rec["severity"] == "medium"
    assert rec["numbers"] == {"all_reduce_per_step": 10.0, "mean_bytes_per_call": MIB, "exposed_us_per_step": 10_000.0,
                              "exposed_pct": 10.0}
    assert rec["estimated_gain_pct"] == 10.0
    assert "bucket_cap_mb" in rec["action"] and "gradient_as_bucket_view=True" in rec["action"]
    # 35 % exposed: high
    assert R.rule_ddp_buckets(_report([("all_reduce", 40, MIB, 140_000.0)]))["severity"] == "high"


@pytest.mark.parametrize("kinds,why", [
    ([("all_reduce", 4, 25 * MIB, 40_000.0)], "one 25 MiB bucket per step: few and large"),
    ([("all_reduce", 28, MIB, 40_000.0)], "7 calls per step: fewer than 8"),
    ([("all_reduce", 40, 5 * MIB, 40_000.0)], "5 MiB per call: not small"),
    ([("all_reduce", 40, MIB, 16_000.0)], "4 ms per step exposed = 4 %: below 5 %"),
])
def test_no_bucket_advice_without_the_evidence(kinds, why):
    assert R.rule_ddp_buckets(_report(kinds)) is None, why


def test_bucket_advice_needs_a_distributed_training_run():
    rep = _report([("all_reduce", 40, MIB, 40_000.0)])
    rep["context"] = {"distributed": False, "mode": "training"}
    assert R.rule_ddp_buckets(rep) is None
    rep["context"] = {"distributed": True, "mode": "inference"}
    assert R.rule_ddp_buckets(rep) is None
    assert R.rule_ddp_buckets({"steps": {"count": 4}, "avg_step_us": 1e5}) is None  # no collectives section


def test_exposed_fsdp_communication_fires_and_is_ranked_by_its_gain():
    # all_gather 12 ms + reduce_scatter 8 ms exposed per step over 4 steps = 80 ms in total;
    # 20 ms of a 100 ms step = 20 % (medium)
    rep = _report([("all_gather", 16, 2 * MIB, 48_000.0), ("reduce_scatter", 8, 4 * MIB, 32_000.0)])
    rec = R.rule_fsdp_prefetch(rep)
    assert rec["rule"] == "fsdp_prefetch" and rec["severity"] == "medium" and rec["estimated_gain_pct"] == 20.0
    assert rec["numbers"] == {"exposed_us_per_step": 20_000.0, "exposed_pct": 20.0, "calls_per_step": 6.0}
    for name in ("forward_prefetch=True", "BackwardPrefetch.BACKWARD_PRE", "reshard_after_forward",
                 "set_modules_to_forward_prefetch"):
        assert name in rec["action"]
    assert "all_gather 12.00 ms, reduce_scatter 8.00 ms" in rec["evidence"][0]
    # ranked by the time it saves: 20 % before an input-bound share of 12 %, after one of 30 %
    rep["input"] = {"input_bound_pct": 12.0}
    assert _rules(rep)[:2] == ["fsdp_prefetch", "input_bound"]
    rep["input"] = {"input_bound_pct": 30.0}
    assert _rules(rep)[:2] == ["input_bound", "fsdp_prefetch"]
    # overlapped: 2 ms per step exposed = 2 % -> no advice
    assert R.rule_fsdp_prefetch(_report([("all_gather", 16, 2 * MIB, 8_000.0)])) is None
    # DDP-only collectives: no FSDP advice
    assert R.rule_fsdp_prefetch(_report([("all_reduce", 40, MIB, 40_000.0)])) is None


def _run_report(name):
    from tb_bottleneck_plugin.serving import engine

    path = DEMO_LOGS / name
    if not path.is_dir():
        pytest.skip(f"{name} not in demo_logs")
    return engine.run_result(str(path))["report"]


def test_real_runs():
    for name in ("ddp_balanced_2rank", "ddp_straggler_2rank"):
        rep = _run_report(name)
        (ar,) = rep["collectives"]["kinds"]
        assert ar["calls"] / rep["steps"]["count"] == 1 < T.DDP_SMALL_ALLREDUCES_PER_STEP  # one bucket per step
        assert not {"ddp_buckets", "fsdp_prefetch"} & set(_rules_of(rep))
    shard = _run_report("collectives_shard_2rank")
    rec = next(r for r in shard["recommendations"] if r["rule"] == "fsdp_prefetch")
    kinds = {k["kind"]: k for k in shard["collectives"]["kinds"]}
    exposed = (kinds["all_gather"]["exposed_us"] + kinds["reduce_scatter"]["exposed_us"]) / shard["steps"]["count"]
    assert rec["numbers"]["exposed_pct"] == pytest.approx(100 * exposed / shard["avg_step_us"], abs=0.01)
    assert rec["numbers"]["calls_per_step"] == 4.0  # 2 all-gathers + 2 reduce-scatters per step (demo_truth)
    single = _run_report("input_bound_nw0")
    assert single.get("collectives") is None
    assert not {"ddp_buckets", "fsdp_prefetch"} & set(_rules_of(single))


def _rules_of(rep):
    return [r["rule"] for r in rep.get("recommendations") or []]
