"""Issue 11: every number the JSON report, the worker/run summaries, the kernel/memory
results, the rank view and the CLI text show is unchanged on all of ../shared/traces
and demo_logs, against a golden file recorded by the code before the metric-unit
refactor (tests/fixtures/before_after/record.py). New keys (e.g. "verdicts") are
allowed; a removed key or a changed number fails."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("before_after_record",
                                               os.path.join(HERE, "fixtures", "before_after", "record.py"))
rec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rec)

pytestmark = pytest.mark.skipif(not os.path.isdir(rec.LOGDIRS["shared"]), reason="../shared/traces not present")


# Numbers the refactor corrected on purpose, each checked below against its definition.
# The code before the refactor summed a summary's "kernel time" for the communication share
# only over spans whose own share was a non-zero number, so a run whose spans all had 0 µs
# of communication got null instead of 0 %, and a group mixing spans with and without
# communication got a share of the wrong denominator (metrics §8: comm µs / Union of all
# kernels, summed over the spans).
COMM = "/report/communication/comm_pct_of_kernel_time"
CORRECTIONS = {
    "/shared/summaries/kineto-tb-samples/resnet50_num_workers_0|worker0" + COMM: "0 % (was null)",
    "/shared/summaries/kineto-tb-samples/resnet50_num_workers_4|worker0" + COMM: "0 % (was null)",
    "/all_shared_summary" + COMM: "Σ comm µs / Σ kernel-union µs over all 14 spans",
    # ... whereupon the communication rule no longer fires for the all-spans summary (12 % < 15 %)
    "/all_shared_summary/report/recommendations": "no communication recommendation",
}


# Parts of the results removed on purpose (a removed key fails the diff otherwise).
# "operators", the per-name CPU operator and kernel tables of the included steps that only
# compare.py read, defined per-op self time a second way (no runtime-call subtraction, no
# same-name merge, clipped to the stretched steps). The comparison now sums the Operator
# view (METRICS §13, pinned to torch-tb-profiler's live numbers in tests/test_operators.py)
# and the §6 kernel table instead (METRICS §11); test_removed_parts_are_gone checks that.
REMOVED = {"operators": "replaced by operator_view (METRICS §11, §13): one definition of op time"}


def _removed_paths(golden) -> set:
    out = {f"/all_shared_summary/{key}" for key in REMOVED}
    for logdir in ("shared", "demo"):
        for part in ("spans", "summaries"):
            out |= {f"/{logdir}/{part}/{name}/{key}" for name in golden[logdir][part] for key in REMOVED}
    return out


@pytest.fixture(scope="module")
def now():
    return rec.record()


def test_every_number_unchanged_on_all_traces(now):
    golden = rec.load_golden()
    # The golden file covers every trace of the shared set and of demo_logs.
    assert len(golden["shared"]["spans"]) == 14 and len(golden["demo"]["spans"]) == 11
    problems = rec.diff(golden, now, skip=set(CORRECTIONS) | _removed_paths(golden))
    assert not problems, "\n".join(problems)


def test_removed_parts_are_gone_and_compare_reads_the_operator_view(now):
    from tb_bottleneck_plugin import compare, discovery, report
    from tb_bottleneck_plugin.analysis import operators

    golden = rec.load_golden()
    paths = _removed_paths(golden)
    assert len(paths) == 1 + sum(len(golden[d][p]) for d in ("shared", "demo") for p in ("spans", "summaries"))
    assert all(rec.diff(golden, now, skip=set(CORRECTIONS) | paths - {p}) for p in sorted(paths)[:3])
    # what replaced it: a span's compare rows are its Operator view summed per name ÷ steps
    logdir = discovery.discover_path(os.path.join(rec.LOGDIRS["shared"], "kineto-tb-samples",
                                                  "resnet50_num_workers_0"))
    run, _, span = next(iter(logdir.spans()))
    res = report.analyze_span(logdir.url, run, span)
    assert "operators" not in res and res["operator_view"]["steps"]
    n = res["report"]["steps"]["count"]
    named = operators.name_totals(res["operator_view"])
    totals = {compare.normalise_op_name(r["name"]): r for r in named}  # one DataLoader name: no merge
    rows = compare.compare(res, res)["ops"]["rows"]
    assert len(rows) == len(totals) == len(named) > 50
    for r in rows:
        t = totals[r["name"]]
        assert r["base_self_us_per_step"] == pytest.approx(t["self_us"] / n, abs=1e-9)
        assert r["base_calls_per_step"] == t["calls"] / n and r["status"] == "same"


def test_the_corrections_are_real_and_right(now):
    golden = rec.load_golden()
    for path in CORRECTIONS:
        assert rec.diff(golden, now, skip=set(CORRECTIONS) - {path}), f"{path} no longer differs: drop it"

    def comm_share(spans):
        comm = sum(s["report"]["communication"]["comm_us"] for s in spans)
        union = sum(s["report"]["communication"]["kernel_union_us"] for s in spans)
        return 100.0 * comm / union

    for run in ("resnet50_num_workers_0", "resnet50_num_workers_4"):
        spans = [v for k, v in now["shared"]["spans"].items() if k.startswith(f"kineto-tb-samples/{run}|")]
        assert len(spans) == 2 and comm_share(spans) == 0.0
        assert now["shared"]["summaries"][f"kineto-tb-samples/{run}|worker0"]["report"]["communication"][
            "comm_pct_of_kernel_time"] == 0.0
    share = now["all_shared_summary"]["report"]["communication"]["comm_pct_of_kernel_time"]
    assert share == pytest.approx(comm_share(list(now["shared"]["spans"].values())), rel=1e-9)
    assert share < 15.0 and "communication" not in {r["rule"] for r in now["all_shared_summary"]["report"][
        "recommendations"]}
    old = [r["rule"] for r in golden["all_shared_summary"]["report"]["recommendations"]]
    assert [r["rule"] for r in now["all_shared_summary"]["report"]["recommendations"]] == \
        [r for r in old if r != "communication"]


def test_diff_catches_changes():
    """The comparison itself: a changed number, a removed key, a changed text line fail; a new key does not."""
    old = {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl2"}
    assert rec.diff(old, {"a": {"x": 1.0 + 1e-12, "y": [1, 2], "new": 3}, "t": "l1\nl2"}) == []
    assert rec.diff(old, {"a": {"x": 1.001, "y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl3"})
    assert rec.diff(old, {"a": {"x": None, "y": [1, 2]}, "t": "l1\nl2"})
