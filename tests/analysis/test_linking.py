"""Issue 11 "one computation each": the per-span pieces that several analyses need are
computed once per span, from the report's per-span context (analysis/units.SpanContext),
and passed, like the step partition (tests/analysis/test_units.py):

- the GPU -> runtime-call index (linking.gpu_runtime_index): steps, GPU metrics (HTA
  mask and idle breakdown per device), Tensor Cores, sync, context, the Operator view,
  the rank partial and the step timeline;
- the CPU op nesting (operators.op_nesting): the Operator view and the timeline's lanes;
- the (CPU op, runtime call) containment pairs (linking.op_calls): the Operator view,
  Tensor Core eligibility, the sync calls' ops, the timeline's links, the rank partial.

Results are the same as each analysis computing its own (compared here on real traces;
every report number is pinned by tests/corpus/test_before_after.py and the oracle tests)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import TRACES, TraceBuilder  # noqa: E402
from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import context, distributed, gpu, linking, operators, signals, tensor_cores
from tb_bottleneck_plugin.analysis import timeline as tl
from tb_bottleneck_plugin.views import timeline_window as tw
from tb_bottleneck_plugin.analysis.steps import find_steps

H100 = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
RESNET0 = sorted((TRACES / "kineto-tb-samples/resnet50_num_workers_0").glob("*.json.gz"))[0]


def _patch_everywhere(monkeypatch, module, name, replacement):
    """Replace module.name in every package module that holds that function (several
    import it by name), so a call from anywhere is seen."""
    real = getattr(module, name)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tb_bottleneck_plugin") and getattr(mod, name, None) is real:
            monkeypatch.setattr(mod, name, replacement)
    return real


def _count(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def counted(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return real(*a, **k)

    _patch_everywhere(monkeypatch, module, name, counted)


@pytest.mark.parametrize("path", [H100, RESNET0], ids=["h100", "resnet50"])
def test_shared_pieces_computed_once_per_span(monkeypatch, path):
    trace = loader.load_trace(str(path))
    assert len(trace.gpu) and len(trace.runtime) and len(trace.cpu)  # every user has work to do
    steps = find_steps(trace)
    alone = {"operator_view": operators.operator_view(trace, steps),
             "distributed": distributed.span_partial(trace, steps),
             "timeline_store": tl.build_store(trace)}
    calls: dict = {}
    _count(monkeypatch, linking, "gpu_runtime_index", calls)
    # the CPU op nesting, once (analysis/source.py runs the same sweep, operators._nesting, over
    # a different set: Python frames and ops together, for the user frame of each op)
    _count(monkeypatch, operators, "op_nesting", calls)
    # the (op, runtime call) pairs: computed (thread ids, sort, search) once, for every op and
    # annotation; the Operator view, Tensor Cores, sync and the timeline select theirs from them
    _count(monkeypatch, linking, "_thread_ids", calls)
    out = report.analyze_trace(trace, timeline=True)
    assert out["report"]["errors"] == [] and out["timeline_store"] is not None
    assert calls == {"gpu_runtime_index": 1, "op_nesting": 1, "_thread_ids": 1}
    # the shared pieces give what each analysis computed on its own (the Operator view's FLOP
    # columns come from the flops unit's per-op counts, shared through the span: not alone)
    def without_flops(view):
        rows = {k: v for k, v in view["rows"].items() if k not in operators.FLOP_FIELDS}
        return {**{k: v for k, v in view.items() if k not in ("flops_counted", "peak_gpu", "peak_na")}, "rows": rows}

    assert without_flops(out["operator_view"]) == without_flops(alone["operator_view"])
    assert out["operator_view"]["flops_counted"] is True
    assert out["distributed"] == alone["distributed"]
    store = out["timeline_store"]
    assert set(store) == set(alone["timeline_store"])
    assert all(np.array_equal(store[k], alone["timeline_store"][k]) for k in store)


def test_passed_index_is_the_one_used(monkeypatch):
    """An analysis given the span's index and pairs does not compute its own, and answers the same."""
    trace = loader.load_trace(str(H100))
    steps = find_steps(trace)

    def each(index=None, pairs=None):
        kw = {} if index is None else {"gpu_runtime": index}
        both = dict(kw, **({} if pairs is None else {"op_calls": pairs}))
        return [find_steps(trace, **kw).to_report(), gpu.gpu_metrics(trace, steps, **kw),
                tensor_cores.tensor_core_usage(trace, **both), signals.sync_signal(trace, steps, **both),
                context.detect(trace, **kw)]

    expected = each()
    index, pairs = linking.gpu_runtime_index(trace), linking.op_calls(trace)
    _patch_everywhere(monkeypatch, linking, "gpu_runtime_index", lambda t: pytest.fail("recomputed"))
    _patch_everywhere(monkeypatch, linking, "_thread_ids", lambda *a: pytest.fail("pairs recomputed"))
    assert each(index, pairs) == expected
    assert expected[1]["0"]["idle"]["span_us"] > 0 and expected[2]["eligible_not_using_us"] >= 0


def test_pairs_selected_from_op_calls_equal_their_own(tmp_path):
    """calls_inside(rows, among=op_calls) gives calls_inside(rows)'s arrays for any sorted set
    of ops/annotations, and computes its own for a set with another kind of row."""
    trace = loader.load_trace(str(RESNET0))
    pairs = linking.op_calls(trace)
    cpu = trace.cpu
    ops = np.flatnonzero(cpu.kind == 0)
    for rows in (ops, ops[::3], cpu.kind == 0, tensor_cores.eligible_op_rows(trace), ops[:0]):
        want, got = linking.calls_inside(trace, rows), linking.calls_inside(trace, rows, among=pairs)
        assert all(np.array_equal(w, g) for w, g in zip(want, got))
    assert len(linking.calls_inside(trace, ops)[0]) > 0
    other = np.flatnonzero(cpu.kind > 1)  # python functions: not in op_calls' set
    if len(other):
        want, got = linking.calls_inside(trace, other), linking.calls_inside(trace, other, among=pairs)
        assert all(np.array_equal(w, g) for w, g in zip(want, got))


def test_timeline_lanes_use_the_operator_nesting(tmp_path):
    """The timeline's CPU lanes come from the Operator view's nesting: an op inside
    another is one lane deeper, also when a zero-length op starts with it (the timeline's
    own depth count put such an op on its parent's lane, overlapping it)."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("outer", 100, 400)
    b.cpu("inner", 200, 100)
    b.cpu("instant", 200, 0)  # zero length, starts with "inner": inside it
    trace = b.load(tmp_path)
    nest = operators.op_nesting(trace)
    name = {trace.strings[trace.cpu.name[r]]: i for i, r in enumerate(nest["rows"])}
    assert nest["depth"][[name["outer"], name["inner"], name["instant"]]].tolist() == [0, 1, 2]
    assert nest["parent"][name["inner"]] == name["outer"]
    w = tw.window(tl.build_store(trace), 1, px=100000)
    lanes = {lane["label"]: [(a, z, w["names"][n]) for a, z, n in zip(lane["t0"], lane["t1"], lane["name"])]
             for lane in w["lanes"] if lane["label"].startswith("CPU")}
    assert lanes == {"CPU main thread": [(100, 500, "outer")],
                     "CPU main thread · depth 1": [(200, 300, "inner")],
                     "CPU main thread · depth 2": [(200, 200, "instant")]}
