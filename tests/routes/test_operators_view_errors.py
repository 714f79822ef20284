"""When the Operator view cannot be made, the operators route's 422 names the failing
part instead of "see the report's errors" with the error only in the log (brief polish3c
item 3): an injected exception in the run-level combine (report.combine_views ->
operators.combine_views) and in one span's own operator_view section. The 422 body is the
route schema's analysis_error; the other routes of the same run stay 200."""
from __future__ import annotations

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import operators

from conftest import route_validator
from test_plugin_routes import Harness, make_plugin
from trace_builder import write_trace


def _boom(*args, **kwargs):
    raise RuntimeError("boom in the injected part")


def _run(tmp_path, workers):
    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    for i in range(workers):
        write_trace(run / f"w{i}.1700000000000.pt.trace.json", [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 30 + i, "pid": 1, "tid": 1}])
    return tmp_path / "logs"


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")  # analyses in this process: the patch applies
    made = []

    def make(logdir):
        h = Harness(make_plugin(logdir, analyze_span=report.analyze_span))
        made.append(h)
        assert h.plugin.analyzer.wait_idle(60)
        return h

    yield make
    for h in made:
        h.plugin.analyzer.stop()


def test_run_level_combine_failure_is_named_in_the_422(tmp_path, monkeypatch, harness):
    h = harness(_run(tmp_path, 2))
    assert h.json("report", run="run")["errors"] == []  # the summary itself is fine
    monkeypatch.setattr(operators, "combine_views", _boom)
    body = h.json("operators", expect=422, run="run")
    route_validator("analysis_error").validate(body)
    assert body["state"] == "error"
    assert body["error"] == ("the operator view could not be computed for this selection: internal error in "
                             "operator_view: RuntimeError: boom in the injected part")
    assert body["errors"] == [{"file": None, "section": "operator_view",
                               "error": "internal error in operator_view: RuntimeError: boom in the injected part"}]
    assert "see the report's errors" not in body["error"]
    # one worker's own operators are still there (its span result holds its view)
    rows = h.json("operators", run="run", worker="w0")["rows"]
    assert [r["name"] for r in rows] == ["aten::mm"]


def test_one_span_whose_operator_view_failed_names_it(tmp_path, monkeypatch, harness):
    monkeypatch.setattr(operators, "operator_view", _boom)
    h = harness(_run(tmp_path, 1))
    rep = h.json("report", run="run")
    assert [e["section"] for e in rep["errors"]] == ["operator_view"]
    body = h.json("operators", expect=422, run="run")
    route_validator("analysis_error").validate(body)
    assert body["error"].startswith("the operator view could not be computed for this selection: internal error "
                                    "in operator_view: RuntimeError: boom in the injected part")
    assert [e["section"] for e in body["errors"]] == ["operator_view"]
