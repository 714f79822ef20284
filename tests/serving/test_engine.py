"""serving/engine.py: the Engine's selections equal `report --json` (the CLI's path through the
same engine), results are analysed once per file version, the cache is bounded, and a confined
engine refuses trace files linked from outside its path."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tb_bottleneck_plugin.serving import engine

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_logs"


@pytest.fixture
def logdir(tmp_path):
    if not DEMO.is_dir():
        pytest.skip("demo_logs missing")
    for name in ("h100_input_bound_nw0", "bert_h100_inference"):
        shutil.copytree(DEMO / name, tmp_path / "logs" / name)
    return tmp_path / "logs"


def test_results_equal_the_cli_document_and_are_analysed_once(logdir, monkeypatch):
    doc = engine.Analysis(*engine.collect(str(logdir), jobs=1)).document()
    calls = []
    real = engine.analyze_all
    monkeypatch.setattr(engine, "analyze_all", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    eng = engine.Engine(str(logdir), jobs=1)
    assert [r["run"] for r in eng.runs()] == [e["run"] for e in doc["runs"]]
    rep = engine.json_safe(eng.report("h100_input_bound_nw0", "worker0"))  # the CLI's one-worker summary
    cli_rep = next(e for e in doc["runs"] if e["run"] == "h100_input_bound_nw0")["workers"][0]["summary"]
    assert json.dumps(rep, sort_keys=True) == json.dumps(cli_rep, sort_keys=True)
    assert calls == [2]  # both spans of the run, in one scheduling call
    run_rep = engine.json_safe(eng.report("h100_input_bound_nw0"))  # the run's summary: the same numbers
    assert run_rep["worker"] is None and {**run_rep, "worker": "worker0"} == rep
    eng.findings("h100_input_bound_nw0")
    assert calls == [2]  # cached per file version
    span = next(r for r in eng.runs() if r["run"] == "h100_input_bound_nw0")["workers"][0]["spans"][0]
    assert eng.report("h100_input_bound_nw0", span=span)["span"] == span
    with pytest.raises(engine.EngineError, match="unknown run"):
        eng.result("no_such_run")


def test_the_cache_is_bounded(logdir):
    eng = engine.Engine(str(logdir), jobs=1, max_results=1)
    eng.report("bert_h100_inference")
    eng.report("h100_input_bound_nw0")  # two spans: the selection is kept whole
    assert len(eng._results) == 2
    eng.report("bert_h100_inference")
    assert len(eng._results) == 1


def test_a_confined_engine_refuses_links_out(logdir, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(DEMO / "bert_h100_inference", outside)
    (logdir / "linked").mkdir()
    for f in outside.iterdir():
        os.symlink(f, logdir / "linked" / f.name)
    with pytest.raises(engine.EngineError, match="outside the logdir"):
        engine.Engine(str(logdir), jobs=1, confined=True).result("linked")
    assert engine.Engine(str(logdir), jobs=1).report("linked")["run"] == "linked"  # not confined: read
