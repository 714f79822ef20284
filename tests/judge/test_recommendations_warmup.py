"""Severities and advice that fit (helper sev3b, trust findings):

- a first-call warm-up outlier in the profiled steps (MI250 hta amd_trace: one 6.5 ms
  hipLaunchKernel in a 9.3 ms step, Runtime 72 %) gets "profile after warm-up", not
  launch-overhead advice; genuine many-small-kernel traces keep theirs (METRICS.md §8
  "Longest runtime call", §9 warmup_outlier);
- values the rules do not judge are "none" (uncoloured, "not judged"), never a green "ok";
- the host-bound advice has its own rule id, host_bound;
- the occupancy card on ROCm says ROCm, not "(old trace or ROCm)".
Numbers pinned to the raw trace JSON (read here with json, not through the loader) or to
hand-built traces whose truth is set by construction."""
from __future__ import annotations

import gzip
import json

import pytest

from tb_bottleneck_plugin.judge import recommendations as R
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin import thresholds as T
from conftest import needs_traces, real_report as real, rules_by_id as rules, H100, TRACES, TraceBuilder, occupancy_args

MI250_TRAIN = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
MI300_DDP = "tracelens/mi300/resnet_act_checkpoint.json.gz"
H100_BERT = "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
V100_NW0 = "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
V100_2020 = "kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz"




def analyse(trace):
    return report_mod.analyze_trace(trace)["report"]


# ------------------------------------------------------------------ warm-up outlier, real MI250 trace
@needs_traces
def test_mi250_first_call_is_a_warmup_outlier_not_launch_overhead():
    raw = json.load(gzip.open(TRACES / MI250_TRAIN))["traceEvents"]
    step1 = [e for e in raw if e.get("name") == "ProfilerStep#1" and e.get("cat") == "user_annotation"]
    assert len(step1) == 1
    lo, hi = step1[0]["ts"], step1[0]["ts"] + step1[0]["dur"]
    calls = [e for e in raw if e.get("cat") == "cuda_runtime"]
    inside = sum(max(0.0, min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) for e in calls)
    longest = max(calls, key=lambda e: e["dur"])
    assert longest["name"] == "hipLaunchKernel" and lo <= longest["ts"] < hi

    rep = real(MI250_TRAIN)
    launch = rep["launch"]
    assert launch["longest_runtime_call"]["name"] == "hipLaunchKernel"
    assert launch["longest_runtime_call"]["step"] == 1
    assert launch["longest_runtime_call"]["us"] == pytest.approx(longest["dur"], abs=0.01)  # 6543.1 µs
    assert launch["runtime_us"] == pytest.approx(inside, abs=0.01)  # 6736.8 µs
    assert launch["longest_runtime_call_pct"] == pytest.approx(100 * longest["dur"] / inside, abs=0.01)  # 97.1 %
    assert launch["longest_runtime_call_step_pct"] == pytest.approx(100 * longest["dur"] / step1[0]["dur"],
                                                                    abs=0.01)  # 70.4 %

    got = rules(rep)
    assert "small_kernels" not in got and "host_bound" not in got
    rec = got["warmup_outlier"]
    assert "schedule(wait=1, warmup=1, active=3)" in rec["action"] and "prof.step()" in rec["action"]
    assert "torch.compile" not in rec["action"] and "hipLaunchKernel" in rec["title"]
    assert "warm-up" in rec["title"] and rec["title"].startswith("One hipLaunchKernel call takes 70 %")
    assert rec["evidence"][0].startswith("hipLaunchKernel: 6.5 ms in step 1, 97 % of the 6.7 ms")
    # the cards the silenced rule would colour are not judged (uncoloured), not green
    for card in ("gpu_utilization", "short_kernels"):
        v = rep["verdicts"][card]
        assert v["value"] is not None and v["severity"] == "none", (card, v)
        assert "not judged" in v["verdict"] and "warm-up" in v["verdict"], (card, v)
        assert v["thresholds"]["WARMUP_CALL_RUNTIME_PCT"] == T.WARMUP_CALL_RUNTIME_PCT


@needs_traces
@pytest.mark.parametrize("rel", [H100_BERT])
def test_genuine_launch_overhead_keeps_launch_advice(rel):
    """bert-small on H100: 60 kernels per step, 83 % of kernel time in kernels < 10 µs, the
    longest runtime call a 15 µs cuLaunchKernel (4 % of runtime time): launch-bound for real."""
    rep = real(rel)
    assert rep["launch"]["longest_runtime_call_pct"] < T.WARMUP_CALL_RUNTIME_PCT
    got = rules(rep)
    assert "warmup_outlier" not in got
    assert got["small_kernels"]["title"] == "Many small or low-occupancy kernels: the GPU is launch- or latency-bound"
    assert 'mode="reduce-overhead"' in got["small_kernels"]["action"]
    assert rep["verdicts"]["short_kernels"]["severity"] == "medium"


@needs_traces
def test_a_long_sync_call_is_not_a_warmup_outlier():
    """MI300 DDP: hipDeviceSynchronize holds 91 % of the runtime time of its steps; a call
    that waits for the GPU is the sync metric's, not a warm-up: the longest *other* call is
    a ~19 µs hipLaunchKernel."""
    launch = real(MI300_DDP)["launch"]
    assert launch["longest_runtime_call"]["name"] != "hipDeviceSynchronize"
    assert launch["longest_runtime_call"]["us"] < 100
    assert "warmup_outlier" not in rules(real(MI300_DDP))


def _warmup_trace(first_call_us):
    """Three 1000 µs steps (3 kernels of 5 µs launched by 5 µs calls each) and, in step 1,
    one more cudaLaunchKernel of ``first_call_us`` µs (its kernel 5 µs). (Three steps: the
    last one launched 3 of step 1's 4 kernels and is kept, METRICS §1 tail rule.)"""
    b = TraceBuilder([H100])
    for n, t0 in ((1, 0), (2, 1000), (3, 2000)):
        b.step(n, t0, 1000)
        for i in range(3):
            b.launch("void tiny_kernel<float>", t0 + 10 + 20 * i, t0 + 20 + 20 * i, 5, **occupancy_args(50, 2.0))
    b.launch("void first_kernel<float>", 100, 100 + first_call_us + 5, 5, call_dur=first_call_us,
             **occupancy_args(50, 2.0))
    return b


@pytest.mark.parametrize("first_us,fires", [(900, True), (20, False)])
def test_warmup_rule_on_a_hand_built_trace(tmp_path, monkeypatch, first_us, fires):
    """Runtime time of the steps: 9 calls x 5 µs + first_us; the first call's share of it
    and of the 3000 µs of steps decide (900 µs: 95 % and 30 %; 20 µs: 31 % and 0.7 %).
    (The trace is a few dozen events: the too-little-data guard, tests/judge/test_contradictions.py,
    is set aside to test the rule itself.)"""
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    monkeypatch.setattr(T, "MIN_KERNELS_TO_JUDGE", 0)
    rep = analyse(_warmup_trace(first_us).load(tmp_path))
    launch = rep["launch"]
    assert rep["steps"]["count"] == 3
    assert launch["runtime_us"] == pytest.approx(45 + first_us)
    assert launch["longest_runtime_call"] == {"name": "cudaLaunchKernel", "us": pytest.approx(first_us), "step": 1}
    assert launch["longest_runtime_call_pct"] == pytest.approx(100 * first_us / (45 + first_us))
    assert launch["longest_runtime_call_step_pct"] == pytest.approx(100 * first_us / 3000)
    got = rules(rep)
    assert ("warmup_outlier" in got) is fires
    if fires:
        assert "small_kernels" not in got and "host_bound" not in got
        assert got["warmup_outlier"]["numbers"]["longest_runtime_call_us"] == pytest.approx(first_us)
    else:
        assert "small_kernels" in got  # 100 % of kernel time in 5 µs kernels: launch advice stays


@pytest.mark.parametrize("share,of_step,fires", [
    (T.WARMUP_CALL_RUNTIME_PCT, T.WARMUP_CALL_STEP_PCT, True),
    (T.WARMUP_CALL_RUNTIME_PCT - 0.01, 90.0, False),
    (99.0, T.WARMUP_CALL_STEP_PCT - 0.01, False),
    (None, 90.0, False),
])
def test_warmup_thresholds(share, of_step, fires):
    rep = {"launch": {"longest_runtime_call": {"name": "cudaLaunchKernel", "us": 5000.0, "step": 3},
                      "longest_runtime_call_pct": share, "longest_runtime_call_step_pct": of_step,
                      "runtime_us": 6000.0, "launch_pct": 60.0},
           "occupancy": {"short_kernels": {"count": 10, "time_pct": 90.0}}, "gpu": {"0": {"utilization_pct": 5.0}}}
    assert (R.rule_warmup_outlier(rep) is not None) is fires
    assert (R.rule_small_kernels(rep) is None) is fires


# ------------------------------------------------------------------ host_bound rule id
def test_gpu_idle_alone_is_host_bound_and_colours_the_gpu_card():
    from tb_bottleneck_plugin.judge.cards import CARD_FUNCTIONS

    rep = {"gpu": {"0": {"utilization_pct": 30.0}}, "input": {"input_bound_pct": 0.0},
           "breakdown_pct": {"cpu_exec": 60.0}, "context": {"mode": "training"},
           "occupancy": {"short_kernels": {"count": 3, "time_pct": 1.0, "threshold_us": 10}}}
    rep["recommendations"] = R.recommend(rep)
    assert [r["rule"] for r in rep["recommendations"]] == ["host_bound"]
    card = CARD_FUNCTIONS["gpu_utilization"](rep)
    assert card["rule"] == "host_bound" and card["severity"] == "medium"


# ------------------------------------------------------------------ not judged: uncoloured
@needs_traces
@pytest.mark.parametrize("rel", [V100_NW0, V100_2020])
def test_gpu_utilization_of_an_input_bound_run_is_not_judged(rel):
    """V100 resnet50 num_workers=0 (55.5 % busy; the 2020 one 47.6 %): input-bound, so the
    utilization rules do not read the number; the card was green 'GPU busy 56 %'."""
    rep = real(rel)
    assert rep["input"]["input_bound_pct"] >= T.INPUT_BOUND_MODERATE_PCT
    v = rep["verdicts"]["gpu_utilization"]
    assert v["severity"] == "none" and "not judged" in v["verdict"] and "input" in v["verdict"], v


@needs_traces
def test_slack_under_the_reserve_floor_is_not_judged():
    rep = real(H100_BERT)
    v = rep["verdicts"]["allocator_slack"]
    assert rep["memory"][v["device"]]["peak_reserved_bytes"] < T.SLACK_MIN_RESERVED_BYTES
    assert v["value"] is not None and v["severity"] == "none" and "not judged" in v["verdict"], v


# ------------------------------------------------------------------ ROCm occupancy reason
@needs_traces
@pytest.mark.parametrize("rel", [MI250_TRAIN, MI300_DDP])
def test_rocm_occupancy_card_says_rocm(rel):
    v = real(rel)["verdicts"]["occupancy"]
    assert v["severity"] == "na" and "ROCm kernels carry no" in v["verdict"] and "old trace or ROCm" not in v["verdict"]
