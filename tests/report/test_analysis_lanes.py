"""The metric units in two lanes (report.analyze_trace, issue 39): the same span result,
byte for byte and key for key, as running them one after another, on every shared trace
and with failing units; the lane units really run in a second thread; one after another
where they must."""
from __future__ import annotations

import dataclasses
import json
import pickle
import sys
import threading
from pathlib import Path

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import registry, units
from tb_bottleneck_plugin.trace import decode_workers, loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)

SHARED_TRACES = sorted(p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _serialised(result: dict) -> str:
    """The whole span result as text, key order included (json keeps insertion order)."""
    return json.dumps({k: v for k, v in result.items() if k != "timeline_store"}, default=repr)


def _analyse(trace, monkeypatch, lanes: bool, **kwargs) -> dict:
    with monkeypatch.context() as m:
        m.setenv(report.ANALYSIS_THREADS_ENV, "1" if lanes else "0")
        m.setattr(decode_workers, "usable_cores", lambda: 2)
        return report.analyze_trace(trace, run="r", worker="w", span="1", **kwargs)


def test_the_shared_traces_are_found():
    assert len(SHARED_TRACES) >= 30


@pytest.mark.parametrize("path", SHARED_TRACES, ids=lambda p: str(p.relative_to(TRACES)))
def test_two_lanes_give_the_report_of_one_after_another(path, monkeypatch):
    trace = loader.load_trace(str(path))
    assert report._unit_lanes(trace) is not None or len(trace.cpu) + len(trace.runtime) > report.LANES_MAX_HOST_EVENTS
    serial = _analyse(trace, monkeypatch, lanes=False)
    laned = _analyse(trace, monkeypatch, lanes=True)
    assert _serialised(laned) == _serialised(serial)


def _with_units(monkeypatch, replace):
    monkeypatch.setattr(registry, "UNITS", [replace(u) for u in registry.UNITS])


@pytest.fixture(scope="module")
def gpu_trace():
    path = next(p for p in SHARED_TRACES if "h100" in str(p) and "gpt2" in str(p))
    return loader.load_trace(str(path))


@pytest.mark.parametrize("failing", [("flops", "tensor_cores"), ("source_attribution",), ("memory", "context")])
def test_failing_lane_units_are_reported_as_one_after_another(monkeypatch, gpu_trace, failing):
    def boom(ctx):
        ctx.not_available[f"{ctx.sections.source}-before-boom"] = "written, then the unit failed"
        raise RuntimeError("boom")

    _with_units(monkeypatch, lambda u: dataclasses.replace(u, compute=boom) if u.name in failing else u)
    serial = _analyse(gpu_trace, monkeypatch, lanes=False)
    laned = _analyse(gpu_trace, monkeypatch, lanes=True)
    assert [e["section"] for e in laned["report"]["errors"]] == [u.name for u in registry.UNITS if u.name in failing]
    assert _serialised(laned) == _serialised(serial)


@pytest.mark.parametrize("failing", ["operator_view", "distributed"])
def test_failing_parts_beside_the_report_are_reported_as_one_after_another(monkeypatch, gpu_trace, failing):
    from tb_bottleneck_plugin.analysis import distributed, operators

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(*((operators, "operator_view") if failing == "operator_view" else (distributed, "span_partial")),
                        boom)
    serial = _analyse(gpu_trace, monkeypatch, lanes=False)
    laned = _analyse(gpu_trace, monkeypatch, lanes=True)
    assert [e["section"] for e in laned["report"]["errors"]] == [failing] and laned[failing] is None
    assert _serialised(laned) == _serialised(serial)


@pytest.mark.parametrize("name", ["gpt2", "compiled", "nw0"])
def test_the_tabs_timeline_store_is_the_same_in_lanes(monkeypatch, name):
    path = next(p for p in SHARED_TRACES if name in str(p))
    trace = loader.load_trace(str(path))
    serial = _analyse(trace, monkeypatch, lanes=False, timeline=True)
    laned = _analyse(trace, monkeypatch, lanes=True, timeline=True)
    assert laned["timeline_store"] is not None
    assert pickle.dumps(laned["timeline_store"]) == pickle.dumps(serial["timeline_store"])
    assert _serialised(laned) == _serialised(serial)


def _recording(threads: dict):
    def replace(unit):
        def compute(ctx, _inner=unit.compute, _name=unit.name):
            threads[_name] = threading.current_thread().name
            return _inner(ctx)
        return dataclasses.replace(unit, compute=compute)
    return replace


def test_the_other_lane_runs_in_a_thread_beside_the_nesting_lane(monkeypatch, gpu_trace):
    threads: dict = {}
    _with_units(monkeypatch, _recording(threads))
    _analyse(gpu_trace, monkeypatch, lanes=True)
    main = threading.current_thread().name
    assert {threads[n] for n in registry.NESTING_LANE} == {main}
    assert {threads[n] for n in registry.OTHER_LANE} == {"tb-bottlenecks-analysis"}
    assert threads["steps"] == threads["step_model"] == main


@pytest.mark.parametrize("why", ["one core", "switched off", "many host events", "a unit in no lane"])
def test_one_after_another_where_the_lanes_do_not_apply(monkeypatch, gpu_trace, why):
    threads: dict = {}
    _with_units(monkeypatch, _recording(threads))
    if why == "a unit in no lane":
        toy = dataclasses.replace(registry.by_name("copies"), name="toy_unit", compute=lambda ctx: None)
        at = [u.name for u in registry.UNITS].index("context")
        monkeypatch.setattr(registry, "UNITS", registry.UNITS[:at] + [toy] + registry.UNITS[at:])
    if why == "many host events":
        monkeypatch.setattr(report, "LANES_MAX_HOST_EVENTS", 10)
    with monkeypatch.context() as m:
        m.setenv(report.ANALYSIS_THREADS_ENV, "0" if why == "switched off" else "1")
        m.setattr(decode_workers, "usable_cores", lambda: 1 if why == "one core" else 2)
        assert report._unit_lanes(gpu_trace) is None
        report.analyze_trace(gpu_trace)
    assert set(threads.values()) == {threading.current_thread().name}


def test_once_computes_a_value_once_when_two_threads_ask(gpu_trace):
    ctx = units.SpanContext(trace=gpu_trace, report={}, not_available={})
    calls, started = [], threading.Event()

    def slow():
        calls.append(1)
        started.set()
        threading.Event().wait(0.2)
        return object()

    got = []
    other = threading.Thread(target=lambda: got.append(ctx.once("key", slow)))
    other.start()
    started.wait(5)
    mine = ctx.once("key", slow)
    other.join()
    assert calls == [1] and got == [mine]
