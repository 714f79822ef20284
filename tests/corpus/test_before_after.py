"""Every number the JSON report, the worker/run summaries, the kernel/memory results, the
rank view and the CLI text show is unchanged on all of ../shared/traces and demo_logs,
against a golden file (tests/fixtures/before_after/golden.json.gz, written by
tests/fixtures/before_after/record.py). It guards refactors: new keys are allowed; a
removed key, a changed number or a changed text line fails.

The golden file was re-recorded when the shared corpus grew from 14 to 33 traces, with
the product code of d00adfc (unchanged since the last landed stop), so it covers every
trace. A deliberate change of numbers re-records it in the same commit, which says what
changed and why; the history of the earlier golden file's documented changes (issue 11's
corrections, renamed rules, masked words) ended with that re-recording.
"""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
_spec = importlib.util.spec_from_file_location("before_after_record",
                                               os.path.join(HERE, "fixtures", "before_after", "record.py"))
rec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rec)

pytestmark = pytest.mark.skipif(not os.path.isdir(rec.LOGDIRS["shared"]), reason="../shared/traces not present")

# Summaries' per-step parts: one row per step number across the spans (METRICS.md §1),
# recomputed from the golden SPAN rows by hand in
# test_summary_per_step_rows_are_the_spans_rows_grouped_by_step.
PER_STEP = ("/report/breakdown_per_step", "/report/input/per_step", "/report/steps/numbers",
            "/report/steps/excluded")


def _summary_bases(golden) -> dict:
    """{path of a summary in the golden file: (logdir, prefix of its spans' keys or None = all)}."""
    out = {"/all_shared_summary": ("shared", None)}
    for logdir in ("shared", "demo"):
        for name in golden[logdir]["summaries"]:
            run, worker = name.split("|")
            out[f"/{logdir}/summaries/{name}"] = (logdir, f"{run}|" if worker == "*" else f"{run}|{worker}|")
    return out


def _trace_files(root) -> set:
    return {os.path.join(d, f) for d, _, fs in os.walk(root, followlinks=True) for f in fs
            if f.endswith((".json", ".json.gz"))}


@pytest.fixture(scope="module")
def now():
    return rec.record()


def test_every_number_unchanged_on_all_traces(now):
    golden = rec.load_golden()
    # The golden file covers every trace of the shared set and of demo_logs (a trace added
    # to either without re-recording fails here).
    for logdir in ("shared", "demo"):
        assert len(golden[logdir]["spans"]) == len(now[logdir]["spans"]) == len(_trace_files(rec.LOGDIRS[logdir]))
    problems = rec.diff(golden, now)
    assert not problems, "\n".join(problems)


def test_compare_reads_the_operator_view(now):
    """A span's compare rows are its Operator view summed per name ÷ steps (METRICS §11, §13)."""
    from tb_bottleneck_plugin.views import compare
    from tb_bottleneck_plugin.trace import discovery
    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.analysis import operators

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


def test_diff_catches_changes():
    """The comparison itself: a changed number, a removed key, a changed text line fail; a new key does not."""
    old = {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl2"}
    assert rec.diff(old, {"a": {"x": 1.0 + 1e-12, "y": [1, 2], "new": 3}, "t": "l1\nl2"}) == []
    assert rec.diff(old, {"a": {"x": 1.001, "y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl3"})
    assert rec.diff(old, {"a": {"x": None, "y": [1, 2]}, "t": "l1\nl2"})


def _grouped_by_hand(rows, fields, rank_key):
    """The independent reference: per step number, the mean of each field over the spans that
    have it, min/max of rank_key and the first span holding the max (plain Python)."""
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    for step in sorted(by_step):
        g = by_step[step]
        ref = {"step": step, "spans": len(g)}
        for f in fields:
            vals = [r.get(f) for r in g]
            ref[f] = None if any(v is None for v in vals) else sum(vals) / len(vals)
        known = [r for r in g if r.get(rank_key) is not None]
        top = max(known, key=lambda r: r[rank_key]) if known else None  # max() keeps the first on a tie
        ref[f"min_{rank_key}"] = min(r[rank_key] for r in known) if known else None
        ref[f"max_{rank_key}"] = top[rank_key] if top else None
        ref["max_worker"], ref["max_span"] = (top["worker"], top["span"]) if top else (None, None)
        out.append(ref)
    return out


def _close(got, want):
    assert set(want) <= set(got), (sorted(want), sorted(got))
    for k, v in want.items():
        if isinstance(v, float):
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
        else:
            assert got[k] == v, k


def test_summary_per_step_rows_are_the_spans_rows_grouped_by_step(now):
    """Every changed per-step part of every summary, recomputed from the golden file's SPAN
    reports (recorded by the code before the change) by hand: PER_STEP above."""
    golden = rec.load_golden()
    checked = 0
    for base, (logdir, prefix) in _summary_bases(golden).items():
        spans = [v["report"] for k, v in golden[logdir]["spans"].items() if prefix is None or k.startswith(prefix)]
        summary = now["all_shared_summary"] if base == "/all_shared_summary" else \
            now[logdir]["summaries"][base.split("/", 3)[3]]
        rep = summary["report"]
        assert len(spans) == len(rep["spans"]) > 1

        def tagged(r, rows):
            return [dict(x, worker=r["worker"], span=r["span"]) for x in rows]

        bd = [x for r in spans for x in tagged(r, r["breakdown_per_step"])]
        cats = ("total_us", "kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec",
                "other")
        want = _grouped_by_hand(bd, cats, "total_us")
        assert len(rep["breakdown_per_step"]) == len(want)
        for got, ref in zip(rep["breakdown_per_step"], want):
            _close(got, ref)
        inp = [x for r in spans if isinstance(r.get("input"), dict) for x in tagged(r, r["input"]["per_step"])]
        want = _grouped_by_hand(inp, ("dataloader_us", "step_us"), "input_bound_pct")
        for ref in want:
            ref["input_bound_pct"] = 100.0 * ref["dataloader_us"] / ref["step_us"] if ref["step_us"] else 0.0
        assert len(rep["input"]["per_step"]) == len(want)
        for got, ref in zip(rep["input"]["per_step"], want):
            _close(got, ref)
        for dev, mem in (rep.get("memory") or {}).items():
            rows = [x for r in spans for x in tagged(r, (((r.get("memory") or {}).get(dev) or {}).get("growth")
                                                         or {}).get("per_step") or [])]
            want = _grouped_by_hand(rows, ("allocated_bytes",), "allocated_bytes")
            assert len(mem["growth"]["per_step"]) == len(want)
            for got, ref in zip(mem["growth"]["per_step"], want):
                _close(got, ref)
                checked += 1
        numbers = [n for r in spans for n in r["steps"]["numbers"]]
        assert rep["steps"]["numbers"] == sorted(set(numbers)) and rep["steps"]["count"] == len(numbers)
        excl = {}
        for r in spans:
            for e in r["steps"]["excluded"]:
                excl.setdefault((e["number"], e["reason"]), []).append(e)
        assert [(e["number"], e["reason"], e["spans"]) for e in rep["steps"]["excluded"]] == \
            [(n, why, len(es)) for (n, why), es in excl.items()]
        checked += len(rep["breakdown_per_step"]) + len(rep["input"]["per_step"])
    assert checked > 100
    # several spans share step numbers here: the rows are grouped, not concatenated
    assert all(r["spans"] == 2 for r in now["demo"]["summaries"]["ddp_straggler_2rank|*"]["report"][
        "breakdown_per_step"])
