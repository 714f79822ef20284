"""cards.card_verdicts marks a card n/a *because the trace is CPU-only* (na_cause
"cpu_only": the dashboard folds those cards into one line) only where that is the reason:
a report with no GPU device whose card is n/a for a reason of the gpu/occupancy/
tensor_cores sections. Expected sets pinned by hand from what the traces hold: the CPU demo
has 0 kernels (six GPU cards without a number); its allocator slack is n/a for the CPU
allocator's own reason; the V100 demo has GPUs, so its n/a slack (2021-format events) is
not CPU-only; a report that has a GPU device is never CPU-only."""
from __future__ import annotations

import copy

import pytest

from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.judge import cards, verdicts
from conftest import DEMO_LOGS

GPU_CARDS = {"gpu_utilization", "tensor_cores", "occupancy", "short_kernels", "sync", "communication"}


@pytest.fixture(scope="module")
def cpu_report():
    return engine.run_result(str(DEMO_LOGS / "input_bound_nw0"))["report"]


def test_cpu_only_demo_marks_exactly_the_gpu_cards(cpu_report):
    v = cpu_report["verdicts"]
    assert {k for k, x in v.items() if x.get("na_cause") == "cpu_only"} == GPU_CARDS
    assert all(v[k]["severity"] == "na" and v[k]["value"] is None for k in GPU_CARDS)
    assert v["allocator_slack"]["severity"] == "na" and "na_cause" not in v["allocator_slack"]
    assert v["input_bound"]["value"] is not None and "na_cause" not in v["input_bound"]


def test_gpu_trace_has_no_cpu_only_cause():
    rep = engine.run_result(str(DEMO_LOGS / "resnet50_v100_nw0"))["report"]
    assert rep["verdicts"]["allocator_slack"]["severity"] == "na"  # n/a, but not for lack of a GPU
    assert not any("na_cause" in x for x in rep["verdicts"].values())


def test_a_report_with_a_gpu_device_is_never_cpu_only(cpu_report):
    mixed = copy.deepcopy(cpu_report)
    mixed["gpu"] = {"0": {"utilization_pct": None}}  # e.g. a summary mixing CPU and GPU spans
    assert not any("na_cause" in x for x in cards.card_verdicts(mixed).values())
    assert not verdicts.cpu_only(mixed) and verdicts.cpu_only(cpu_report)
