"""The operator view (METRICS.md "Operator view"): analysis/operators.operator_view,
view_table and the /operators route.

- A hand-built trace where every op's nesting, self time, launched kernels and inputs
  are written in the test, so each expected number is computed here by hand.
- torch-tb-profiler 0.4.3's Operator view (RunProfileData.parse + RunGenerator, run live,
  as ../shared/oracles/README.md calls it) on both resnet50_num_workers_0 spans: calls,
  host self/total and device self/total per op name and per (name, input shape) equal.
- The route through TensorBoard's WSGI routing: schema-valid bodies, step/group
  parameters, 400/404 answers.
"""
from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest

from conftest import TRACES, TraceBuilder, need_torch_tb_profiler
from tb_bottleneck_plugin.analysis import operators, steps
from tb_bottleneck_plugin.trace.loader import load_trace

LINEAR_A = {"Input Dims": [[8, 16], [32, 16], [32]], "Input type": ["float", "float", "float"]}
LINEAR_B = {"Input Dims": [[4, 16], [32, 16], [32]], "Input type": ["float", "float", "float"]}
ADDMM = {"Input Dims": [[32], [8, 16], [16, 32]], "Input type": ["float", "float", "float"]}
TC_KERNEL = "volta_h884gemm_64x64_ldg8_nn"  # a Tensor Core name (tensor_cores.py's list)
SGEMM = "volta_sgemm_128x64_nn"  # not one


def hand_trace(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("aten::linear", 10, 200, **LINEAR_A)
    b.cpu("aten::addmm", 20, 150, **ADDMM)
    b.launch(SGEMM, 30, kernel_ts=100, kernel_dur=50, call_dur=10)
    b.launch(TC_KERNEL, 50, kernel_ts=160, kernel_dur=30, call_dur=10)
    b.cpu("aten::linear", 300, 100, **LINEAR_B)
    b.cpu("aten::addmm", 310, 80)
    b.cpu("aten::div", 500, 50)  # aten::div whose only child is aten::div: one call
    b.cpu("aten::div", 510, 20)
    b.cpu("my_region", 600, 100, cat="user_annotation")  # record_function
    b.cpu("aten::relu", 610, 30)
    b.launch("relu_kernel", 615, kernel_ts=700, kernel_dur=10, call_dur=5)
    b.step(2, 1000, 500)
    b.cpu("aten::linear", 1010, 100, **LINEAR_A)
    b.launch(SGEMM, 1020, kernel_ts=1050, kernel_dur=40, call_dur=10)
    b.launch("relu_kernel", 1470, kernel_ts=1475, kernel_dur=5, call_dur=5)  # in the step, no op
    b.launch("relu_kernel", 1480, kernel_ts=1485, kernel_dur=5, call_dur=5)  # (3 launches: not a cut-off tail)
    b.cpu("aten::zeros", 2000, 10)  # after the last step: in no step
    return b.load(tmp_path)


def by_name(table):
    return {r["name"]: r for r in table["rows"]}


def test_hand_built_per_step(tmp_path):
    trace = hand_trace(tmp_path)
    view = operators.operator_view(trace, steps.find_steps(trace))
    assert view["steps"] == [1, 2] and view["record_shapes"] is True
    s1 = by_name(operators.view_table(view, 1, "op"))
    assert set(s1) == {"aten::linear", "aten::addmm", "aten::div", "my_region", "aten::relu"}
    lin = s1["aten::linear"]
    # total 200 + 100; self: 200 - child 150, 100 - child 80; GPU: the two kernels its
    # child addmm launched (50 + 30), 30 of them Tensor Core
    assert (lin["calls"], lin["total_us"], lin["self_us"], lin["gpu_us"], lin["gpu_self_us"]) == (2, 300, 70, 80, 0)
    assert lin["tc_pct"] == pytest.approx(100 * 30 / 80)
    addmm = s1["aten::addmm"]
    # self: 150 minus its two 10 µs launch calls, plus 80
    assert (addmm["calls"], addmm["total_us"], addmm["self_us"], addmm["gpu_us"], addmm["gpu_self_us"]) == \
        (2, 230, 210, 80, 80)
    div = s1["aten::div"]
    assert (div["calls"], div["total_us"], div["self_us"], div["gpu_us"], div["tc_pct"]) == (1, 50, 50, 0, None)
    region = s1["my_region"]
    assert (region["calls"], region["total_us"], region["self_us"], region["gpu_us"]) == (1, 100, 70, 10)
    assert region["tc_pct"] == 0
    relu = s1["aten::relu"]
    assert (relu["self_us"], relu["gpu_us"], relu["gpu_self_us"]) == (25, 10, 10)
    # inputs of each op, largest total CPU time first
    assert lin["top_inputs"] == [
        {"dims": json.dumps(LINEAR_A["Input Dims"]), "types": json.dumps(LINEAR_A["Input type"]),
         "calls": 1, "total_us": 200},
        {"dims": json.dumps(LINEAR_B["Input Dims"]), "types": json.dumps(LINEAR_B["Input type"]),
         "calls": 1, "total_us": 100}]
    assert div["top_inputs"] == [{"dims": None, "types": None, "calls": 1, "total_us": 50}]

    s2 = by_name(operators.view_table(view, 2, "op"))
    assert set(s2) == {"aten::linear"}  # aten::zeros is after every step
    assert (s2["aten::linear"]["calls"], s2["aten::linear"]["self_us"], s2["aten::linear"]["gpu_us"]) == (1, 90, 40)


def test_hand_built_all_steps_and_group_by_shape(tmp_path):
    trace = hand_trace(tmp_path)
    view = operators.operator_view(trace, steps.find_steps(trace))
    every = by_name(operators.view_table(view, None, "op"))
    lin = every["aten::linear"]
    assert (lin["calls"], lin["total_us"], lin["self_us"], lin["gpu_us"]) == (3, 400, 160, 120)
    assert lin["tc_pct"] == pytest.approx(100 * 30 / 120)
    assert lin["top_inputs"][0] == {"dims": json.dumps(LINEAR_A["Input Dims"]),
                                    "types": json.dumps(LINEAR_A["Input type"]), "calls": 2, "total_us": 300}
    table = operators.view_table(view, None, "op_shape")
    assert table["group"] == "op_shape" and table["step"] == "all"
    rows = {(r["name"], r["dims"]): r for r in table["rows"]}
    a = rows[("aten::linear", json.dumps(LINEAR_A["Input Dims"]))]
    b = rows[("aten::linear", json.dumps(LINEAR_B["Input Dims"]))]
    assert (a["calls"], a["total_us"], a["self_us"], a["gpu_us"]) == (2, 300, 140, 120)
    assert (b["calls"], b["total_us"], b["self_us"], b["gpu_us"], b["tc_pct"]) == (1, 100, 20, 0, None)
    assert a["types"] == json.dumps(LINEAR_A["Input type"])
    assert rows[("aten::addmm", None)]["calls"] == 1  # the second addmm recorded no inputs
    # default order: largest self CPU time first
    selfs = [r["self_us"] for r in table["rows"]]
    assert selfs == sorted(selfs, reverse=True)
    # combining two spans adds up, with no per-step rows
    both = operators.combine_views([view, view])
    assert both["steps"] == []
    lin2 = by_name(operators.view_table(both, None, "op"))["aten::linear"]
    assert (lin2["calls"], lin2["total_us"], lin2["self_us"], lin2["gpu_us"]) == (6, 800, 320, 240)
    with pytest.raises(KeyError):
        operators.view_table(both, 1, "op")
    assert operators.combine_views([view, None]) is None


def test_no_shapes_recorded_and_no_steps(tmp_path):
    b = TraceBuilder()
    b.cpu("aten::mm", 0, 100)
    b.launch(SGEMM, 10, kernel_ts=20, kernel_dur=30)
    trace = b.load(tmp_path)
    view = operators.operator_view(trace, steps.find_steps(trace))  # no ProfilerStep: one window
    assert view["steps"] == [steps.NO_STEP_NUMBER] and view["record_shapes"] is False
    row = by_name(operators.view_table(view, None, "op"))["aten::mm"]
    assert (row["calls"], row["total_us"], row["self_us"], row["gpu_us"], row["tc_pct"]) == (1, 100, 95, 30, 0)
    assert "top_inputs" not in row
    assert table_na(view) == {"flops": operators.NA_FLOPS_NO_SHAPES}  # the GPU columns are there
    assert row["flops"] is None and row["flops_na"] == operators.NA_FLOPS_NO_SHAPES


def table_na(view):
    return operators.view_table(view, None, "op")["not_available"]


def test_cpu_only_trace_gpu_columns_are_na(tmp_path):
    b = TraceBuilder(props=())
    b.step(1, 0, 100)
    b.cpu("aten::mm", 10, 50)
    trace = b.load(tmp_path)
    view = operators.operator_view(trace, steps.find_steps(trace))
    assert view["has_gpu"] is False
    row = by_name(operators.view_table(view, None, "op"))["aten::mm"]
    assert (row["calls"], row["self_us"], row["gpu_us"], row["gpu_self_us"], row["tc_pct"]) == (1, 50, None, None, None)
    assert "CPU-only" in table_na(view)["gpu"]
    assert operators.combine_views([view, view])["has_gpu"] is False


# ---------------------------------------------------------------------------- torch-tb-profiler

RESNET = sorted((TRACES / "kineto-tb-samples" / "resnet50_num_workers_0").glob("*.pt.trace.json.gz"))


def _whole_trace():
    """One window over the whole trace, as torch-tb-profiler's Operator view counts."""
    one = np.ones(1)
    return steps.Steps(numbers=np.array([0]), host_start=-np.inf * one, host_end=np.inf * one,
                       start=-np.inf * one, end=np.inf * one, gpu_count=np.zeros(1, np.int64),
                       gpu_end=np.nan * one, included=np.ones(1, bool), cpu_rows=-one.astype(np.int64),
                       found=False)


def _tbp_tables(path):
    need_torch_tb_profiler()  # the [oracle] extra: present in CI
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    with tempfile.TemporaryDirectory() as cache:
        data = RunProfileData.parse("worker0", "span", str(path), cache)
        data = data[0] if isinstance(data, tuple) else data
        run = RunGenerator("worker0", "span", data).generate_run_profile()
    return run.operation_table_by_name["data"], run.operation_table_by_name_input["data"]


@pytest.mark.skipif(not RESNET, reason="../shared/traces is not available")
@pytest.mark.parametrize("path", RESNET, ids=lambda p: p.name[:24])
def test_equals_torch_tb_profiler_operator_view(path):
    by_name_tbp, by_input_tbp = _tbp_tables(path)
    trace = load_trace(str(path))
    view = operators.operator_view(trace, _whole_trace())
    ours = by_name(operators.view_table(view, None, "op"))
    # tbp leaves out DataLoader, Optimizer.* and DDP forward spans (they are record_function
    # regions; ours lists them) and rounds to whole µs
    assert len(by_name_tbp) > 50
    for row in by_name_tbp:
        mine = ours[row["name"]]
        got = (mine["calls"], round(mine["self_us"]), round(mine["total_us"]),
               round(mine["gpu_self_us"]), round(mine["gpu_us"]))
        want = (row["calls"], row["host_self_duration"], row["host_total_duration"],
                row["device_self_duration"], row["device_total_duration"])
        assert got == want, row["name"]
    # the run comparison's op rows (operators.name_totals, METRICS §11) are the same sums
    totals = {r["name"]: r for r in operators.name_totals(view)}
    for row in by_name_tbp:
        t = totals[row["name"]]
        assert (t["calls"], round(t["self_us"]), round(t["total_us"])) == \
            (row["calls"], row["host_self_duration"], row["host_total_duration"]), row["name"]
    extra = set(ours) - {r["name"] for r in by_name_tbp}
    assert extra == {"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "Optimizer.step#SGD.step",
                     "Optimizer.zero_grad#SGD.zero_grad"}
    # tbp groups by name and dims only; ours by name, dims and dtypes (fp32 and bf16 calls of
    # one shape are different rows): add ours up over the dtypes
    shaped = {}
    for r in operators.view_table(view, None, "op_shape")["rows"]:
        acc = shaped.setdefault((r["name"], r["dims"]), [0, 0.0, 0.0, 0.0])
        for i, f in enumerate(("calls", "self_us", "total_us", "gpu_us")):
            acc[i] += r[f]
    assert len(by_input_tbp) > 400
    for row in by_input_tbp:
        mine = shaped[(row["name"], row["input_shape"])]  # tbp's str(list) is the trace's JSON text here
        assert (mine[0], round(mine[1]), round(mine[2]), round(mine[3])) == \
            (row["calls"], row["host_self_duration"], row["host_total_duration"],
             row["device_total_duration"]), row
    # the included steps hold a subset of the whole trace's calls
    per_steps = by_name(operators.view_table(operators.operator_view(trace, steps.find_steps(trace)), None, "op"))
    assert 0 < per_steps["aten::conv2d"]["calls"] <= ours["aten::conv2d"]["calls"]


def test_absurd_durations_are_na_not_inf(tmp_path):
    """Kernels of 1.7e308 µs add up to inf: the view says n/a (None), stays strict JSON,
    and the other numbers of the op stay exact."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("aten::mm", 10, 100)
    b.launch(SGEMM, 20, kernel_ts=30, kernel_dur=1.7e308)
    b.launch(SGEMM, 40, kernel_ts=50, kernel_dur=1.7e308)
    trace = b.load(tmp_path)
    view = operators.operator_view(trace, steps.find_steps(trace))
    json.dumps(view, allow_nan=False)
    for table in (operators.view_table(view, None, "op"), operators.view_table(operators.combine_views([view, view]))):
        json.dumps(table, allow_nan=False)
        row = by_name(table)["aten::mm"]
        assert row["gpu_us"] is None and row["tc_pct"] is None
        assert row["self_us"] in (90, 180) and row["calls"] in (1, 2)


# ---------------------------------------------------------------------------- the route


def test_route_through_tensorboard(tmp_path):
    """operators?... through TensorBoard's WSGI app: 200 per step and group (schema-valid,
    each query its own body), 400 bad group/step, 404 step not included / unknown run."""
    import sys

    from conftest import REPO, route_validator

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import record_route_fixtures as rec

    logs = tmp_path / "logs"
    b = TraceBuilder()
    for step, t0 in ((1, 0), (2, 1000), (3, 2000)):
        b.step(step, t0, 900)
        b.cpu("aten::linear", t0 + 10, 200 + step, **LINEAR_A)
        b.launch(TC_KERNEL, t0 + 20, kernel_ts=t0 + 100, kernel_dur=50)
    b.write(logs / "run" / "worker0.1700000000000.pt.trace.json")
    h = rec.harness(logs)
    try:
        validate = route_validator("operators")
        q = {"run": "run", "worker": "worker0", "span": "1700000000000"}
        status, every = rec.get(h, "operators", **q)
        assert status == 200 and not list(validate.iter_errors(every))
        assert every["steps"] == [1, 2, 3] and every["step"] == "all"  # three steps of 1 launch each
        assert every["rows"][0]["calls"] == 3 and every["rows"][0]["total_us"] == 606
        status, one = rec.get(h, "operators", step="2", group="op_shape", **q)
        assert status == 200 and not list(validate.iter_errors(one))
        assert (one["step"], one["group"], one["rows"][0]["total_us"], one["rows"][0]["tc_pct"]) == (2, "op_shape", 202, 100)
        assert one["rows"][0]["dims"] == json.dumps(LINEAR_A["Input Dims"])
        assert rec.get(h, "operators", step="3", **q)[1]["rows"][0]["total_us"] == 203  # not the cached step 2
        for params, code in (({"group": "x"}, 400), ({"group": "callstack"}, 400), ({"step": "one"}, 400),
                             ({"step": "-1"}, 400), ({"step": "x" * 40}, 400), ({"step": "9" * 20}, 400),
                             ({"step": "9"}, 404)):
            status, body = rec.get(h, "operators", **params, **q)
            assert status == code and isinstance(body["error"], str), params
        assert rec.get(h, "operators", run="nope")[0] == 404
        assert rec.get(h, "operators")[0] == 400
        status, summary = rec.get(h, "operators", run="run")  # a one-span run keeps its steps
        assert status == 200 and summary["steps"] == [1, 2, 3]
    finally:
        h.stop()


def test_round3_list_equals_pythons_round_bit_for_bit():
    """The Operator view's vectorised rounding (operators.round3_list) against Python's own
    round(v, 3) on half-way decimals, large and tiny values, negatives and non-finite ones."""
    import warnings

    rng = np.random.default_rng(7)
    values = np.concatenate([rng.random(50_000) * 1e6, rng.random(50_000) * 10,
                             (np.arange(20_000) + 0.5) / 1000, np.arange(20_000) + 0.0005,
                             [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e15, 2.675, 0.0005, 1.0005, -1.2345]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning text leaks
        got = operators.round3_list(values)
    want = [round(v, 3) if v - v == 0 else None for v in values.tolist()]
    assert got == want
    assert [str(x) for x in got[-6:]] == [str(x) for x in want[-6:]]  # -0.0 stays -0.0


def test_finite_list_equals_the_per_value_test():
    """operators.finite_list (the Operator view's unrounded FLOP columns) against the
    per-value form it replaced: NaN and inf become None, every other value (-0.0 too) is kept."""
    rng = np.random.default_rng(11)
    for values in (rng.random(10_000) * 1e12, np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, 1.5]),
                   np.zeros(0)):
        got = operators.finite_list(values)
        want = [v if v - v == 0 else None for v in values.tolist()]
        assert got == want
        assert [str(x) for x in got] == [str(x) for x in want]
