"""Run and worker summaries at many ranks (issue 14): per-step parts are one row per step
number ACROSS the spans (mean, min/max and the worker/span of the max), so a summary grows
with steps, not with spans x steps; the run-level Operator view and kernel names are made
only when a route asks for them (engine.Analyzer.result(views=...), cached).

Every expected number here is computed by hand from the span rows written below."""
from __future__ import annotations

import json
import time

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import units

CATS = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")


def _bd(step, total, kernel, dataloader):
    row = {c: 0.0 for c in CATS}
    row.update(step=step, total_us=float(total), kernel=float(kernel), dataloader=float(dataloader),
               other=float(total - kernel - dataloader))
    return row


def _span(worker, span, steps, excluded, mem):
    """A hand-made span result: steps [(step, total, kernel, dataloader)], allocated bytes per step."""
    bd = [_bd(*s) for s in steps]
    inp = [{"step": s, "input_bound_pct": 100.0 * dl / t, "dataloader_us": float(dl), "step_us": float(t)}
           for s, t, _, dl in steps]
    rep = {"run": "r", "worker": worker, "span": span, "spans": [f"{worker}.{span}.pt.trace.json"],
           "steps": {"count": len(steps), "numbers": [s[0] for s in steps], "excluded": excluded,
                     "found": True, "window_us": float(sum(s[1] for s in steps))},
           "breakdown_per_step": bd, "avg_step_us": sum(s[1] for s in steps) / len(steps),
           "input": {"input_bound_pct": 0.0, "input_transfer_pct": 0.0, "per_step": inp,
                     "evidence": {"slowest_steps": [], "dataloader_iterators": []}},
           "memory": {"cuda:0": {"peak_allocated_bytes": max(mem), "peak_reserved_bytes": 2 * max(mem),
                                 "growth": {"per_step": [{"step": s[0], "ts_us": 1e6 * i, "allocated_bytes": m}
                                                         for i, (s, m) in enumerate(zip(steps, mem))],
                                            "possible_leak": worker == "w1"}}}}
    return {"report": rep, "partials": report.span_partials(rep)}


A = _span("w0", "sA", [(1, 100, 60, 40), (2, 200, 120, 80)], [{"number": 0, "reason": "warm-up"}], [1000, 2000])
B = _span("w1", "sB", [(1, 300, 300, 0), (2, 100, 50, 50), (3, 50, 50, 0)], [{"number": 0, "reason": "warm-up"}],
          [500, 3000, 4000])


def test_breakdown_per_step_is_per_step_across_spans():
    rep = report.combine_results([A, B], run="r")["report"]
    rows = rep["breakdown_per_step"]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["spans"] for r in rows] == [2, 2, 1]
    # means over the spans that have the step
    assert [r["total_us"] for r in rows] == [200.0, 150.0, 50.0]
    assert [r["kernel"] for r in rows] == [180.0, 85.0, 50.0]
    assert [r["dataloader"] for r in rows] == [20.0, 65.0, 0.0]
    assert [(r["min_total_us"], r["max_total_us"]) for r in rows] == [(100, 300), (100, 200), (50, 50)]
    assert [(r["max_worker"], r["max_span"]) for r in rows] == [("w1", "sB"), ("w0", "sA"), ("w1", "sB")]
    # the summary's own numbers are still ratios of sums over all 5 span-steps
    assert rep["avg_step_us"] == 750 / 5
    assert rep["breakdown_pct"]["dataloader"] == pytest.approx(100 * 170 / 750)


def test_input_and_memory_per_step_across_spans():
    rep = report.combine_results([A, B], run="r")["report"]
    inp = rep["input"]
    assert [(r["step"], r["spans"]) for r in inp["per_step"]] == [(1, 2), (2, 2), (3, 1)]
    assert [r["dataloader_us"] for r in inp["per_step"]] == [20.0, 65.0, 0.0]
    assert [r["step_us"] for r in inp["per_step"]] == [200.0, 150.0, 50.0]
    # the step's input-bound % is Σ DataLoader / Σ step time of the spans at that step
    assert [r["input_bound_pct"] for r in inp["per_step"]] == pytest.approx([10.0, 100 * 130 / 300, 0.0])
    assert [(r["min_input_bound_pct"], r["max_input_bound_pct"], r["max_worker"]) for r in inp["per_step"]] == \
        [(0.0, 40.0, "w0"), (40.0, 50.0, "w1"), (0.0, 0.0, "w1")]
    assert inp["input_bound_pct"] == pytest.approx(100 * 170 / 750)
    # stats stay over every span-step (40, 40, 0, 50, 0)
    assert inp["stats"]["mean"] == pytest.approx(26.0) and (inp["stats"]["min"], inp["stats"]["max"]) == (0.0, 50.0)
    growth = rep["memory"]["cuda:0"]["growth"]
    assert growth["possible_leak"] is True
    assert [(g["step"], g["spans"], g["allocated_bytes"], g["min_allocated_bytes"], g["max_allocated_bytes"],
             g["max_worker"]) for g in growth["per_step"]] == \
        [(1, 2, 750.0, 500, 1000, "w0"), (2, 2, 2500.0, 2000, 3000, "w1"), (3, 1, 4000.0, 4000, 4000, "w1")]
    assert all("ts_us" not in g for g in growth["per_step"])  # each span's clock is its own
    steps = rep["steps"]
    assert steps["count"] == 5 and steps["numbers"] == [1, 2, 3]
    assert steps["excluded"] == [{"number": 0, "reason": "warm-up", "spans": 2}]


def test_single_span_result_is_unchanged():
    assert report.combine_results([A]) is A
    assert A["report"]["breakdown_per_step"][0] == _bd(1, 100, 60, 40)


def test_unknown_value_makes_the_step_mean_unknown_not_zero():
    bad = _span("w2", "sC", [(1, 100, 60, 40)], [], [10])
    bad["partials"]["breakdown"]["rows:per_step"][0]["kernel"] = None
    rows = report.combine_results([A, bad])["report"]["breakdown_per_step"]
    assert rows[0]["step"] == 1 and rows[0]["kernel"] is None and rows[0]["total_us"] == 100.0
    assert rows[1]["kernel"] == 120.0  # step 2 has only A


def _copies(n):
    out = []
    for i in range(n):
        out.append(_span(f"w{i}", f"s{i}", [(s, 100 + s + i % 7, 60, 10 + i % 5) for s in range(1, 11)],
                         [{"number": 0, "reason": "warm-up"}], [1000 + s for s in range(10)]))
    return out


def test_summary_size_is_bounded_by_steps_not_spans():
    def size_without_span_lists(n):
        rep = dict(report.combine_results(_copies(n), run="r", views=False)["report"])
        assert len(rep["breakdown_per_step"]) == len(rep["input"]["per_step"]) == 10
        assert len(rep["memory"]["cuda:0"]["growth"]["per_step"]) == 10 and rep["steps"]["numbers"] == \
            list(range(1, 11)) and rep["steps"]["excluded"][0]["spans"] == n
        assert len(rep["spans"]) == n  # one name per trace file: the only part that grows with spans
        rep.pop("spans")
        return len(json.dumps(rep))

    small, large = size_without_span_lists(10), size_without_span_lists(600)
    assert large - small < 600, (small, large)  # a few digits more ("spans": 600), not 60x the rows


def test_per_step_across_spans_ties_and_missing():
    rows = [{"step": 2, "x": 1.0, "worker": "a", "span": "1"}, {"step": 2, "x": 1.0, "worker": "b", "span": "2"},
            {"step": None, "x": 5.0}, {"step": 1, "x": None, "worker": "c", "span": "3"}]
    out = units.per_step_across_spans(rows, ("x",), "x")
    assert out == [{"step": 1, "spans": 1, "x": None, "min_x": None, "max_x": None, "max_worker": None,
                    "max_span": None},
                   {"step": 2, "spans": 2, "x": 1.0, "min_x": 1.0, "max_x": 1.0, "max_worker": "a", "max_span": "1"}]


# ---------------------------------------------------------------------------- lazy run-level views


def test_combine_without_views_then_combine_views_equals_combine_with_views(tmp_path):
    from tb_bottleneck_plugin.trace import loader

    from trace_builder import write_trace

    results = []
    for i in range(3):
        path = write_trace(tmp_path / f"w{i}.pt.trace.json", [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 30 + i, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 50, "dur": 5, "pid": 1, "tid": 1}])
        results.append(report.analyze_trace(loader.load_trace(str(path)), run="r", worker=f"w{i}", span="s"))
    full = report.combine_results(results, run="r")
    lean = report.combine_results(results, run="r", views=False)
    assert "operator_view" not in lean and "kernel_names" not in lean
    assert lean["report"] == full["report"] and lean["kernels"] == full["kernels"]
    views = report.combine_views(results)
    assert views == {"operator_view": full["operator_view"], "kernel_names": full["kernel_names"], "view_errors": []}
    names = {r["name"]: r for r in report.operators.name_totals(views["operator_view"])}
    assert names["aten::mm"]["total_us"] == 30 + 31 + 32 and names["aten::mm"]["calls"] == 3
    assert report.combine_views(results[:1]) == {"operator_view": results[0]["operator_view"],
                                                 "kernel_names": results[0]["kernel_names"], "view_errors": []}


def test_service_makes_run_views_only_when_asked_and_once(tmp_path, monkeypatch):
    from tb_bottleneck_plugin.serving.engine import Analyzer

    from trace_builder import write_trace

    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    for i in range(3):
        write_trace(run / f"w{i}.1700000000000.pt.trace.json", [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 30, "pid": 1, "tid": 1}])
    calls = []
    real = report.combine_views
    monkeypatch.setattr(report, "combine_views", lambda results: calls.append(len(results)) or real(results))
    a = Analyzer(str(tmp_path / "logs"), analyze_span=report.analyze_span, rescan_seconds=60.0)
    try:
        a.start()
        deadline = time.time() + 60
        while True:
            res = a.result("run", views=False) if a.activity()[1] is not None else {"state": "loading"}
            if res["state"] == "ready" or time.time() > deadline:
                break
            time.sleep(0.05)
        assert res["state"] == "ready" and len(res["report"]["spans"]) == 3
        assert "operator_view" not in res and calls == []
        with_views = a.result("run")
        again = a.result("run")
        assert calls == [3]  # made once, then kept with the summary
        assert with_views["operator_view"] is again["operator_view"]
        assert {r["name"]: r["calls"] for r in report.operators.name_totals(with_views["operator_view"])} == \
            {"aten::mm": 3}
        assert a.result("run", worker="w0")["operator_view"]["rows"]  # one span: its own view, nothing combined
        assert calls == [3]
    finally:
        a.stop()


def test_leak_rule_of_a_summary_with_an_unknown_step_value():
    """A summary's memory growth row whose mean is unknown (one span's bytes unknown) does not
    break the memory_growth recommendation; it cites the known steps."""
    c = _span("w1", "sC", [(1, 100, 60, 40), (2, 100, 60, 40)], [], [10, 20])
    c["partials"]["memory"]["keyed:devices"]["cuda:0"]["rows:growth"][0]["allocated_bytes"] = None
    rep = report.combine_results([B, c])["report"]
    rows = rep["memory"]["cuda:0"]["growth"]["per_step"]
    assert rows[0]["allocated_bytes"] is None and rows[1]["allocated_bytes"] == (3000 + 20) / 2
    assert rep["errors"] == []
    leak = next(r for r in rep["recommendations"] if r["rule"] == "memory_growth")
    assert leak["evidence"] == ["step 2: 0 MiB", "step 3: 0 MiB"]


def test_kernel_rows_group_by_configuration_values():
    """occupancy.combine_kernel_rows keys a row by its configuration's values (grid/block lists
    as tuples; an unhashable value by its text): same configuration summed, others apart."""
    from tb_bottleneck_plugin.analysis import occupancy

    def row(grid, calls, us, regs=32):
        return {"name": "k", "device": 0, "grid": grid, "block": [128, 1, 1], "registers_per_thread": regs,
                "shared_memory_bytes": 0, "calls": calls, "total_us": us}

    rows = occupancy.combine_kernel_rows([[row([80, 1, 1], 2, 10.0), row([40, 1, 1], 1, 4.0)],
                                          [row([80, 1, 1], 3, 20.0), row({"x": 1}, 1, 1.0)],
                                          [row({"x": 1}, 2, 2.0), row([80, 1, 1], 1, 5.0, regs=64)]])
    got = sorted((str(r["grid"]), r["registers_per_thread"], r["calls"], r["total_us"]) for r in rows)
    assert got == [("[40, 1, 1]", 32, 1, 4.0), ("[80, 1, 1]", 32, 5, 30.0), ("[80, 1, 1]", 64, 1, 5.0),
                   ("{'x': 1}", 32, 3, 3.0)]
    assert rows[0]["total_us"] == 30.0 and rows[0]["mean_us"] == 6.0 and rows[0]["grid"] == [80, 1, 1]
