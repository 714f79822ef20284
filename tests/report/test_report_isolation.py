"""An exception inside one analysis costs that section only (issue 10 item 2): the
section is null with an "internal error in <section>" reason and a `report.errors`
entry, every other section equals the normal report. The same for worker/run
summaries (`combine_results`), which never raise for data reasons."""
from __future__ import annotations

import json
import logging

import pytest

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin.judge import recommendations
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import (breakdown, context, distributed, gpu, input_bound, memory, occupancy,
                                           operators, signals, steps, tensor_cores, units_trace)

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
# A GPU trace with memory events, kernels, steps and recommendations; small enough to analyse often.
H100 = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
RESNET0 = TRACES / "kineto-tb-samples/resnet50_num_workers_0"

BREAKDOWN_FIELDS = ("avg_step_us", "breakdown_us", "breakdown_pct", "breakdown_per_step")
# section -> (module, attribute) to break, and the report fields that section owns
SECTIONS = {
    "trace": (units_trace, "trace_facts", ("trace", "device_names", "device_labels", "device_properties")),
    "breakdown": (breakdown, "step_breakdown", BREAKDOWN_FIELDS),
    "input": (input_bound, "input_bound", ("input",)),
    "gpu": (gpu, "gpu_metrics", ("gpu",)),
    "tensor_cores": (tensor_cores, "tensor_core_usage", ("tensor_cores",)),
    "occupancy": (occupancy, "kernel_occupancy", ("occupancy",)),
    "memory": (memory, "memory_usage", ("memory",)),
    "memory_snapshot": (memory, "apply_snapshot", ()),
    "sync": (signals, "sync_signal", ("sync",)),
    "communication": (signals, "communication_signal", ("communication",)),
    "launch": (signals, "launch_signal", ("launch",)),
    "recommendations": (recommendations, "recommend", ("recommendations",)),
    "kernels": (report, "_kernel_table_section", ()),
    "operator_view": (operators, "operator_view", ()),
    "context": (context, "detect", ("context",)),
    "distributed": (distributed, "span_partial", ()),
}
# not_available keys a section writes besides its own name
NA_PREFIX = {"gpu": "gpu.", "tensor_cores": "tensor_cores.", "occupancy": "occupancy.", "memory": "memory."}
# fields derived from the report's own bookkeeping, compared separately
# (the verdict on top is made from the recommendations and the step: derived, like the cards)
# judged from every section (the layout: which cards are shown, folded or not applicable, §21)
BOOKKEEPING = {"not_available", "not_available_labels", "errors", "recommendations", "verdicts", "verdict", "layout"}
# A snapshot result as _find_snapshot gives it, so the snapshot step runs too.
SNAPSHOT = {"path": "run/snapshot.pickle", "fragmentation": {"cuda:0": 12.5}}


@pytest.fixture(scope="module")
def trace():
    return loader.load_trace(str(H100))


@pytest.fixture(scope="module")
def normal(trace):
    return report.analyze_trace(trace, run="r", worker="w", span="1", snapshot=SNAPSHOT)


def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def _break(monkeypatch, section):
    module, attr, _ = SECTIONS[section]
    monkeypatch.setattr(module, attr, _boom)


def test_the_normal_report_has_no_errors(normal):
    rep = normal["report"]
    assert rep["errors"] == []
    assert rep["memory"]["cuda:0"]["free_block_fragmentation_pct"] == 12.5  # the snapshot step ran
    assert rep["occupancy"]["kernels"] and normal["kernels"] and rep["recommendations"]
    assert rep["gpu"]["0"]["utilization_pct"] is not None and rep["input"]["per_step"]


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_one_failing_section_costs_only_that_section(monkeypatch, caplog, trace, normal, section):
    _break(monkeypatch, section)
    with caplog.at_level(logging.ERROR, logger="tb_bottleneck_plugin.report"):
        result = report.analyze_trace(trace, run="r", worker="w", span="1", snapshot=SNAPSHOT)
    json.dumps(result, allow_nan=False)
    rep, ref = result["report"], normal["report"]
    message = f"internal error in {section}: RuntimeError: boom"
    assert rep["errors"] == [{"section": section, "error": message}]
    assert rep["not_available"][section] == message
    assert rep["not_available_labels"][section] and "_" not in rep["not_available_labels"][section]
    # the traceback goes to the log, not to the report
    logged = [r for r in caplog.records if message in r.getMessage()]
    assert logged and logged[0].exc_info is not None

    owned = SECTIONS[section][2]
    for field in owned:
        assert rep[field] in (None, [], {}), field
    for field in set(ref) - set(owned) - BOOKKEEPING:
        expected, got = ref[field], rep[field]
        if section == "tensor_cores" and field == "gpu":  # the per-device TC share comes from tensor_cores
            assert all(g["tensor_core_pct"] is None for g in got.values())
            expected = {d: {k: v for k, v in g.items() if k != "tensor_core_pct"} for d, g in expected.items()}
            got = {d: {k: v for k, v in g.items() if k != "tensor_core_pct"} for d, g in got.items()}
        if section == "memory_snapshot" and field == "memory":
            expected = json.loads(json.dumps(expected))
            for entry in expected.values():
                entry.pop("free_block_fragmentation_pct"), entry.pop("free_block_fragmentation_source", None)
            got = {d: {k: v for k, v in e.items() if k not in ("free_block_fragmentation_pct",
                                                              "free_block_fragmentation_source")}
                   for d, e in got.items()}
        if section == "kernels" and field == "occupancy":
            assert got["kernels"] == []
            expected, got = dict(expected, kernels=[]), got
        assert got == expected, field
    # every other n/a reason is kept
    prefix = NA_PREFIX.get(section, f"{section}.")
    for key, why in ref["not_available"].items():
        if key != section and not key.startswith(prefix) and not (section == "memory_snapshot"
                                                                  and key.startswith("memory.")):
            assert rep["not_available"].get(key) == why, key
    # advice comes only from what was computed: never a rule the normal report did not fire
    # (a rule reading several sections may fire with fewer reasons)
    if rep["recommendations"] is not None:
        assert {r["rule"] for r in rep["recommendations"]} <= {r["rule"] for r in ref["recommendations"]}
    for extra in ("operator_view", "distributed"):  # parts of the span result beside the report
        assert result.get(extra) is None if section == extra else result.get(extra) == normal.get(extra)
    if section == "occupancy" or section == "kernels":
        assert result["kernels"] == []
    else:
        assert result["kernels"] == normal["kernels"]
    if section == "memory":
        assert result["memory"]["devices"] == {} and result["memory"]["not_available"] == message
    else:
        assert result["memory"] == normal["memory"]


def test_failing_steps_leave_dependent_sections_with_their_own_reason(monkeypatch, trace, normal):
    monkeypatch.setattr(steps, "find_steps", _boom)
    rep = report.analyze_trace(trace, run="r", worker="w", span="1")["report"]
    ref = normal["report"]
    message = "internal error in steps: RuntimeError: boom"
    assert rep["errors"] == [{"section": "steps", "error": message}]
    assert rep["steps"] is None and rep["avg_step_us"] is None and rep["breakdown_pct"] is None
    for dependent in ("breakdown", "input", "gpu", "occupancy", "sync", "communication", "launch"):
        assert rep["not_available"][dependent] == f"needs steps, which failed ({message})", dependent
        if dependent != "breakdown":
            assert rep[dependent] is None
    # what does not need steps is still there and unchanged
    assert rep["tensor_cores"] == ref["tensor_cores"] and rep["trace"] == ref["trace"]
    for key, entry in rep["memory"].items():
        assert entry["peak_allocated_bytes"] == ref["memory"][key]["peak_allocated_bytes"]
        assert entry["growth"]["per_step"] == []
    assert rep["not_available"]["memory.growth"].startswith("needs steps")


# ---------------------------------------------------------------- combine_results

def _tiny_trace(tmp_path, name, *, memory_totals=True, kernel_dur=10.0):
    """Two ProfilerSteps, one GEMM-like kernel each, [memory] events with or without totals."""
    events = []
    for i, t in enumerate((0, 100)):
        corr = i + 1
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 1, "tid": 1,
             "ts": t, "dur": 100},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 5, "dur": 50,
             "args": {"External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 10,
             "dur": 5, "args": {"correlation": corr, "External id": corr}},
            {"ph": "X", "cat": "kernel", "name": "sgemm_kernel", "pid": 0, "tid": 7, "ts": t + 20,
             "dur": kernel_dur, "args": {"correlation": corr, "device": 0, "stream": 7, "grid": [1, 1, 1],
                                         "block": [128, 1, 1], "registers per thread": 32, "shared memory": 0,
                                         "blocks per SM": 0.1, "est. achieved occupancy %": 10}},
        ]
        args = {"Device Type": 1, "Device Id": 0, "Bytes": 1000}
        if memory_totals:
            args.update({"Total Allocated": 1000 * (i + 1), "Total Reserved": 4000, "Addr": 1})
        events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                       "ts": t + 6, "args": args})
    path = tmp_path / f"{name}.pt.trace.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 1 << 34}],
                                "traceEvents": events}))
    return report.analyze_trace(loader.load_trace(str(path)), run="r", worker="w", span=name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_combine_span_with_bytes_only_memory_and_span_with_totals(tmp_path):
    """Root cause 7 of issue 10: the curve merge extended None (reserved of a 2021-format span)."""
    totals = _tiny_trace(tmp_path, "totals")
    relative = _tiny_trace(tmp_path, "relative", memory_totals=False)
    assert relative["report"]["memory"]["cuda:0"]["peak_reserved_bytes"] is None
    for order in ([totals, relative], [relative, totals]):
        result = report.combine_results(order, run="r", worker="w")
        json.dumps(result, allow_nan=False)
        rep = result["report"]
        assert rep["errors"] == []
        mem = rep["memory"]["cuda:0"]
        assert mem["peak_allocated_bytes"] == 2000  # max of the spans' peaks (2000 and 1000+1000)
        # reserved is unknown in one span, so neither its peak nor the slack is known for the pair
        assert mem["peak_reserved_bytes"] is None and mem["slack_fragmentation_pct"] is None
        assert mem["slack_fragmentation_time_weighted_pct"] is None and mem["allocated_is_relative"] is True
        assert "memory.cuda:0.peak_reserved_bytes" in rep["not_available"]
        # memory curves are per span: a summary has none (issue 11: they were never requested)
        assert result["memory"]["devices"] == {} and result["memory"]["not_available"]
    both = report.combine_results([totals, _tiny_trace(tmp_path, "totals2")])["report"]["memory"]["cuda:0"]
    assert both["peak_reserved_bytes"] == 4000 and both["slack_fragmentation_pct"] == pytest.approx(50.0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_combine_span_whose_kernel_total_overflows(tmp_path):
    """Root cause 8 of issue 10: a kernel total that overflowed to inf is None after _clean."""
    good = _tiny_trace(tmp_path, "good")
    huge = _tiny_trace(tmp_path, "huge", kernel_dur=1.7e308)
    assert huge["kernels"][0]["total_us"] is None
    for order in ([good, huge], [huge, good]):
        result = report.combine_results(order, run="r", worker="w")
        json.dumps(result, allow_nan=False)
        rep = result["report"]
        assert rep["errors"] == []
        row, = result["kernels"]
        assert row["calls"] == 4 and row["total_us"] is None and row["mean_us"] is None  # unknown, not 20 µs
        assert rep["tensor_cores"]["kernel_us"] is None
        assert rep["steps"]["numbers"] == [1, 2] and rep["steps"]["count"] == 4  # each number once
        assert rep["breakdown_pct"] is not None


def test_combine_reports_whose_sections_failed(monkeypatch, tmp_path):
    good = _tiny_trace(tmp_path, "good")
    monkeypatch.setattr(occupancy, "kernel_occupancy", _boom)
    broken = _tiny_trace(tmp_path, "broken")
    monkeypatch.undo()
    # the same span names (summaries' per-step rows name the worker/span of their maximum)
    reference = report.combine_results([good, _tiny_trace(tmp_path, "broken")])["report"]
    rep = report.combine_results([good, broken], run="r", worker="w")["report"]
    json.dumps(rep, allow_nan=False)
    assert rep["occupancy"] is None
    assert rep["not_available"]["occupancy"] == "span broken: internal error in occupancy: RuntimeError: boom"
    assert rep["errors"] == [{"section": "occupancy", "error": "internal error in occupancy: RuntimeError: boom",
                              "span": "broken"}]
    for field in ("input", "gpu", "tensor_cores", "memory", "sync", "launch", "breakdown_pct", "steps"):
        assert rep[field] == reference[field], field
    assert rep["not_available_labels"]["occupancy"] == "Occupancy"


# What to break in a summary: the unit's finish (over merged partials) or a summary step.
COMBINED = {"occupancy": (occupancy.UNIT, "finish", "input"), "memory": (memory.UNIT, "finish", "occupancy"),
            "input": (input_bound.UNIT, "finish", "memory"), "breakdown": (breakdown.UNIT, "finish", "gpu"),
            "kernels": (occupancy, "combine_kernel_rows", "sync"), "trace": (units_trace.UNIT, "finish", "tensor_cores")}


@pytest.mark.parametrize("name", sorted(COMBINED))
def test_one_failing_combined_section(monkeypatch, tmp_path, name):
    spans = [_tiny_trace(tmp_path, "a"), _tiny_trace(tmp_path, "b")]
    reference = report.combine_results(spans)
    obj, attr, untouched = COMBINED[name]
    monkeypatch.setattr(obj, attr, _boom)
    result = report.combine_results(spans)
    json.dumps(result, allow_nan=False)
    rep = result["report"]
    (error,) = rep["errors"]
    assert error["section"] == name
    assert error["error"].startswith(f"internal error in {error['section']}: RuntimeError: boom")
    assert rep["not_available"][error["section"]] == error["error"]
    assert rep[untouched] == reference["report"][untouched]


def test_combine_results_leaves_its_inputs_alone(tmp_path):
    spans = [_tiny_trace(tmp_path, "a"), _tiny_trace(tmp_path, "b", memory_totals=False)]
    before = json.dumps(spans, sort_keys=True)
    report.combine_results(spans)
    assert json.dumps(spans, sort_keys=True) == before  # span results are cached and served as they are


def test_summary_of_real_spans_is_clean(tmp_path):
    logdir_results = [report.analyze_trace(loader.load_trace(str(p)), span=p.name)
                      for p in sorted(RESNET0.iterdir())]
    rep = report.combine_results(logdir_results, run="resnet0", worker="worker0")["report"]
    assert rep["errors"] == []
    # the 2021-format spans record no reserved memory: the summary says so in words
    assert rep["memory"]["cuda:0"]["peak_reserved_bytes"] is None
    assert rep["not_available_labels"]["memory.cuda:0.peak_reserved_bytes"] == "GPU 0 memory: peak reserved"
    assert set(rep["not_available_labels"]) == set(rep["not_available"])
