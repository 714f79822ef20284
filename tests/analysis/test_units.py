"""Issue 11: the metric-unit contract (analysis/units.py, analysis/registry.py).

- merge() follows the documented field conventions (hand-computed values);
- a summary made from the stored partials equals one made from the span reports alone;
- the step partition and the shown occupancy are computed once per span;
- a CUDA memory snapshot next to a trace is found by discovery, read through storage
  (report.analyze_span) and applied by the memory unit."""
import pickle
import shutil

import pytest

from conftest import TRACES  # noqa: E402
from tb_bottleneck_plugin.trace import discovery, loader
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import breakdown, occupancy, registry, units

H100 = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
RESNET0 = TRACES / "kineto-tb-samples/resnet50_num_workers_0"


def test_merge_conventions():
    a = {"sum:x": 1.0, "max:p": 5, "any:f": False, "all:k": True, "rows:r": [1], "first:v": "a",
         "wmean:m": units.weighted_pair(10.0, 1.0), "keyed:d": {"g0": {"sum:us": 2.0}}}
    b = {"sum:x": 2.5, "max:p": 7, "any:f": True, "all:k": False, "rows:r": [2, 3], "first:v": "b",
         "wmean:m": units.weighted_pair(40.0, 3.0), "keyed:d": {"g0": {"sum:us": 1.0}, "g1": {"sum:us": 4.0}}}
    m = units.merge([a, b])
    assert m["sum:x"] == 3.5 and m["max:p"] == 7 and m["any:f"] is True and m["all:k"] is False
    assert m["rows:r"] == [1, 2, 3] and m["first:v"] == "a"
    assert units.wmean(m["wmean:m"]) == pytest.approx((10 * 1 + 40 * 3) / 4)
    assert m["keyed:d"] == {"g0": {"sum:us": 3.0}, "g1": {"sum:us": 4.0}}
    assert a["rows:r"] == [1] and a["keyed:d"] == {"g0": {"sum:us": 2.0}}  # inputs untouched
    # an unknown makes a sum or a maximum unknown, not zero; a weight of 0 or an unknown value weighs nothing
    assert units.merge([{"sum:x": 1.0}, {"sum:x": None}])["sum:x"] is None
    assert units.merge([{"max:x": 1.0}, {"max:x": None}])["max:x"] is None
    assert units.weighted_pair(None, 5.0) == [0.0, 0.0] and units.weighted_pair(3.0, 0) == [0.0, 0.0]
    assert units.wmean(units.merge([{"wmean:m": [0.0, 0.0]}])["wmean:m"]) is None


@pytest.fixture(scope="module")
def resnet_spans():
    logdir = discovery.discover_path(str(RESNET0))
    (run,) = logdir.runs
    return [report.analyze_span(logdir.url, run, s) for w in run.workers for s in w.spans]


def test_summary_from_stored_partials_equals_summary_from_reports(resnet_spans):
    assert all(set(r["partials"]) == {u.name for u in registry.UNITS} for r in resnet_spans)
    stored = report.combine_results(resnet_spans, run="r", worker="w")["report"]
    bare = [{k: v for k, v in r.items() if k != "partials"} for r in resnet_spans]
    rebuilt = report.combine_results(bare, run="r", worker="w")["report"]
    assert stored == rebuilt
    # and the input-bound % of the summary is the ratio of the summed per-step µs
    rows = [s for r in resnet_spans for s in r["report"]["input"]["per_step"]]
    assert stored["input"]["input_bound_pct"] == pytest.approx(
        100.0 * sum(s["dataloader_us"] for s in rows) / sum(s["step_us"] for s in rows), rel=1e-12)


def test_partition_and_shown_occupancy_once_per_span(monkeypatch):
    trace = loader.load_trace(str(H100))
    calls = {"partition": 0, "shown": 0}
    real_partition, real_shown = breakdown.partition, occupancy.shown_occupancy

    def partition(*a, **k):
        calls["partition"] += 1
        return real_partition(*a, **k)

    def shown(*a, **k):
        calls["shown"] += 1
        return real_shown(*a, **k)

    monkeypatch.setattr(breakdown, "partition", partition)
    monkeypatch.setattr(occupancy, "shown_occupancy", shown)
    rep = report.analyze_trace(trace)["report"]
    assert rep["errors"] == [] and rep["input"]["input_bound_pct"] is not None and rep["gpu"]["0"]
    assert calls == {"partition": 1, "shown": 1}


def test_snapshot_beside_the_trace_is_found_and_applied(tmp_path):
    run_dir = tmp_path / "logs" / "bert"
    run_dir.mkdir(parents=True)
    shutil.copy(H100, run_dir / "worker0.1751410836000000000.pt.trace.json.gz")
    # two free blocks on device 0: 100 and 300 bytes -> 100 * (1 - 300 / 400) = 25 %
    snap = {"segments": [{"device": 0, "blocks": [{"state": "inactive", "size": 100},
                                                  {"state": "active_allocated", "size": 999},
                                                  {"state": "inactive", "size": 300}]}]}
    (run_dir / "dump_snapshot.pickle").write_bytes(pickle.dumps(snap))
    logdir = discovery.discover_path(str(tmp_path / "logs"))
    (run,) = logdir.runs
    (span,) = run.workers[0].spans
    mem = report.analyze_span(logdir.url, run, span)["report"]["memory"]["cuda:0"]
    assert mem["free_block_fragmentation_pct"] == pytest.approx(25.0)
    assert mem["free_block_fragmentation_source"].endswith("dump_snapshot.pickle")
    # a pickle that is not a snapshot (refers to a class): its reason, not a crash
    (run_dir / "dump_snapshot.pickle").write_bytes(pickle.dumps(pytest.approx(1.0)))
    rep = report.analyze_span(logdir.url, run, span)["report"]
    assert "not a readable CUDA memory snapshot" in rep["not_available"]["memory.free_block_fragmentation_pct"]
    assert rep["errors"] == []


def test_a_toy_metric_is_one_module_plus_one_registry_line(monkeypatch, resnet_spans):
    """The architecture doc's toy metric: a unit (compute/partial/finish and a card id), its
    registry entry and its card function (judge/cards.py) give a span section, its partial,
    a summary section and a card verdict, with no change to report.py, the summaries or
    verdicts.py."""
    from tb_bottleneck_plugin import thresholds as T
    from tb_bottleneck_plugin.judge import cards, verdicts

    def compute(span):
        rt = span.trace.runtime
        return {"calls": int(len(rt)), "us": float(rt.dur.sum())}

    toy = units.Unit(
        "toy", compute,
        partial=lambda rep: {"sum:calls": rep["toy"]["calls"], "sum:us": rep["toy"]["us"]},
        finish=lambda m: {"calls": int(m["sum:calls"]), "us": m["sum:us"]},
        cards=("toy",))
    monkeypatch.setattr(registry, "UNITS", registry.UNITS + [toy])
    monkeypatch.setitem(cards.CARD_FUNCTIONS, "toy", lambda rep: verdicts.card(
        rep, (rep.get("toy") or {}).get("us"), "us", None, None, ("SYNC_PCT",), ("toy",)))
    logdir = discovery.discover_path(str(RESNET0))
    (run,) = logdir.runs
    spans = [report.analyze_span(logdir.url, run, s) for w in run.workers for s in w.spans]
    for res, old in zip(spans, resnet_spans):
        trace_calls = old["report"]["trace"]["runtime_calls"]
        assert res["report"]["toy"]["calls"] == trace_calls and res["partials"]["toy"]["sum:calls"] == trace_calls
        assert res["report"]["verdicts"]["toy"]["thresholds"] == {"SYNC_PCT": T.SYNC_PCT}
    summary = report.combine_results(spans, run="r", worker="w")["report"]
    assert summary["toy"]["calls"] == sum(s["report"]["toy"]["calls"] for s in spans)
    assert summary["toy"]["us"] == pytest.approx(sum(s["report"]["toy"]["us"] for s in spans))
    assert summary["verdicts"]["toy"]["value"] == summary["toy"]["us"]


def test_every_unit_section_is_in_the_route_schema():
    """A unit's section is part of the backend-frontend contract: a required property of
    docs/route-schema.json's report (tests/routes/test_route_schema.py validates real answers)."""
    import json

    from conftest import ROUTE_SCHEMA_PATH

    schema = json.loads(ROUTE_SCHEMA_PATH.read_text())["$defs"]["report"]
    for unit in registry.UNITS:
        for key in (unit.fields if unit.fields is not None else [unit.name]):
            assert key in schema["properties"] and key in schema["required"], (unit.name, key)
    assert "verdicts" in schema["required"]
