"""The Python API (tb_bottleneck_plugin.api, issue 25): the same numbers as the CLI's
``--json`` (one code path: engine.collect / engine.json_report), DataFrames built from them, a
comparison equal to ``diff --json``, and pandas never imported by the tab's or the CLI's
import path."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import DEMO_LOGS, REPO, link_demo_run

pd = pytest.importorskip("pandas")

import tb_bottleneck_plugin as tbb  # noqa: E402

RUNS = ("ddp_straggler_2rank", "input_bound_nw0", "resnet50_v100_nw0")  # a 2-rank run, a 2-span run, one file


def _cli_json(*args):
    done = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A logdir of three demo runs (symlinked), its CLI --json and its API Report."""
    root = tmp_path_factory.mktemp("logs")
    for run in RUNS:
        link_demo_run(root, run, run)
    return _cli_json("report", str(root), "--json", "--jobs", "1"), tbb.analyze(str(root), jobs=1)


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(b):
        return a is None or math.isnan(a)
    if a is None and isinstance(b, float) and math.isnan(b):
        return True
    return a == b


def _headline(entry):
    return entry.get("summary") or entry["workers"][0]["summary"]


def test_to_dict_is_the_cli_json(logdir):
    cli, rep = logdir
    api = json.loads(rep.to_json())
    assert api["runs"] == cli["runs"] and api["errors"] == cli["errors"] == []
    assert rep.runs == list(RUNS)
    for entry in cli["runs"]:
        one = rep.run(entry["run"])
        assert one.report == _headline(entry)
        assert one.cards == _headline(entry)["verdicts"] and one.cards["input_bound"]["severity"]
        assert one.recommendations == _headline(entry)["recommendations"]
    with pytest.raises(ValueError, match="pick one with .run"):
        rep.cards  # noqa: B018 - several runs: no single headline


def test_steps_df_is_the_cli_breakdown_per_step(logdir):
    cli, rep = logdir
    df = rep.steps_df()
    for entry in cli["runs"]:
        want = _headline(entry)["breakdown_per_step"]
        got = df[df["run"] == entry["run"]].reset_index(drop=True)
        assert len(got) == len(want) > 0, entry["run"]
        inp = {r["step"]: r["input_bound_pct"] for r in _headline(entry)["input"]["per_step"]}
        for i, row in enumerate(want):
            for key, value in row.items():
                assert _same(value, got.loc[i, key]), (entry["run"], i, key)
            assert got.loc[i, "input_bound_pct"] == pytest.approx(inp[row["step"]])


def test_kernels_memory_ranks_df_are_the_cli_numbers(logdir):
    cli, rep = logdir
    kernels, memory, ranks = rep.kernels_df(), rep.memory_df(), rep.ranks_df()
    for entry in cli["runs"]:
        head = _headline(entry)
        top = head["occupancy"]["kernels"] if head.get("occupancy") else []
        got = kernels[kernels["run"] == entry["run"]].reset_index(drop=True)
        assert len(got) >= len(top)
        for i, k in enumerate(top):  # the report's top 50 are the kernel table's first rows
            assert (got.loc[i, "name"], got.loc[i, "calls"]) == (k["name"], k["calls"])
            assert got.loc[i, "total_us"] == pytest.approx(k["total_us"])
        mem = memory[memory["run"] == entry["run"]].set_index("device")
        assert set(mem.index) == set(head["memory"])
        for dev, sec in head["memory"].items():
            assert _same(sec["peak_allocated_bytes"], mem.loc[dev, "peak_allocated_bytes"])
        got_ranks = ranks[ranks["run"] == entry["run"]].reset_index(drop=True)
        want_ranks = (entry.get("ranks") or {}).get("ranks") or []
        assert len(got_ranks) == len(want_ranks)
        for i, r in enumerate(want_ranks):
            assert got_ranks.loc[i, "worker"] == r["worker"]
            assert got_ranks.loc[i, "exposed_comm_us"] == pytest.approx(r["exposed_comm_us"])
    assert len(ranks) == 2 and set(kernels["run"]) == {"resnet50_v100_nw0"}  # the CPU demo runs have no kernels


def test_groups_df_names_each_group_straggler_and_cause(logdir):
    """groups_df: one row per process group of the multi-worker runs, the CLI's --json
    ranks.process_groups (issue 37): the demo straggler's group names rank 1 and the DataLoader."""
    cli, rep = logdir
    groups = rep.groups_df()
    want = [(entry["run"], g) for entry in cli["runs"] for g in (entry.get("ranks") or {}).get("process_groups") or []]
    assert len(groups) == len(want) > 0
    for i, (run, g) in enumerate(want):
        row = groups.iloc[i]
        assert (row["run"], row["group"], row["calls"]) == (run, g["name"], g["calls"])
        st = g["straggler"] or {}
        assert _same(st.get("rank"), row["straggler_rank"])
        assert _same((st.get("cause") or {}).get("sentence"), row["cause"])
    slow = groups[groups["run"] == "ddp_straggler_2rank"].iloc[0]
    assert slow["straggler_rank"] == 1 and slow["cause_activity"] == "dataloader_us"
    assert slow["cause"].startswith("rank 1 spends 1")


def test_pipeline_df_is_the_pipeline_section(tmp_path):
    """pipeline_df: one row per stage of the 4-rank pipeline demo, the Ranks view's numbers."""
    from tb_bottleneck_plugin.views import ranks

    link_demo_run(tmp_path, "pipeline_2x2_4rank", "pipeline_2x2_4rank")
    rep = tbb.analyze(str(tmp_path), jobs=1)
    df = rep.pipeline_df()
    entry = rep.run("pipeline_2x2_4rank")._run_reports()[0][2]
    pp = entry["ranks"]["pipeline"]
    assert list(df["stage"]) == [s["stage"] for s in pp["per_stage"]] == [0, 1]
    assert list(df["bubble_pct"]) == pytest.approx([s["bubble_pct"] for s in pp["per_stage"]])
    assert set(df["schedule"]) == {"GPipe"} and set(df["stages"]) == {2} and set(df["microbatches"]) == {4}
    assert "pipeline: 2 stages x 2 replica(s)" in ranks.format_ranks_text(entry["ranks"])


def test_operators_df_is_the_operator_view(logdir):
    from tb_bottleneck_plugin.analysis import operators

    _, rep = logdir
    one = rep.run("resnet50_v100_nw0")
    df = one.operators_df()
    view = one._result(one._one_run())["operator_view"]
    rows = operators.view_table(view, None, "op")["rows"]
    assert list(df["name"]) == [r["name"] for r in rows] and len(rows) > 10
    assert df["self_us"].tolist() == pytest.approx([r["self_us"] for r in rows])
    assert len(one.operators_df("op_shape")) >= len(df)


def test_a_single_file_is_the_cli_report_object():
    path = next((DEMO_LOGS / "bert_h100_inference").glob("*.pt.trace.json.gz"))
    cli = _cli_json("report", str(path), "--json")
    rep = tbb.analyze(str(path))
    assert rep.to_dict() == cli and rep.report == cli and rep.single_file
    html = rep._repr_html_()
    for cid, v in cli["verdicts"].items():
        assert f"data-card='{cid}'" in html and f"data-severity='{v['severity']}'" in html
    assert len(rep.memory_timeline_df()) > 0


def test_peak_tflops_reaches_the_analysis_and_is_restored(monkeypatch):
    from tb_bottleneck_plugin.analysis import peaks

    monkeypatch.delenv(peaks.ENV_PEAK, raising=False)
    path = next((DEMO_LOGS / "bert_h100_inference").glob("*.pt.trace.json.gz"))
    rep = tbb.analyze(str(path), peak_tflops={"bf16": 500, "hbm": 2000}, jobs=1)
    assert rep.report["flops"]["peak"]["source"].startswith("user-given")
    assert peaks.ENV_PEAK not in __import__("os").environ


def test_compare_is_diff_json():
    base, cand = str(DEMO_LOGS / "input_bound_nw0"), str(DEMO_LOGS / "input_fixed_nw4")
    cli = _cli_json("diff", base, cand, "--json")
    from tb_bottleneck_plugin.api import compare  # the documented spelling (README "In a notebook")

    got = compare(base, cand)
    assert got.to_dict() == cli
    # the package-level alias: the package's own `compare` is the compare.py module
    assert tbb.compare_runs is compare and "compare_runs" in dir(tbb)
    df = got.metrics_df()
    assert list(df["key"]) == [m["key"] for m in cli["metrics"]]
    assert df.set_index("key").loc["input_bound_pct", "verdict"] == "better"


def test_nothing_to_analyse_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no PyTorch profiler trace files"):
        tbb.analyze(str(tmp_path))


def test_the_tab_and_the_cli_never_import_pandas_and_the_api_says_which_extra():
    code = ("import sys\n"
            "import tb_bottleneck_plugin.plugin_loader, tb_bottleneck_plugin.plugin, tb_bottleneck_plugin.cli\n"
            "import tb_bottleneck_plugin.api, tb_bottleneck_plugin.views.html_report\n"
            "assert 'pandas' not in sys.modules, 'pandas imported'\n"
            "sys.modules['pandas'] = None\n"  # as if not installed
            "import tb_bottleneck_plugin as t\n"
            f"r = t.analyze({str(next((DEMO_LOGS / 'bert_h100_inference').glob('*.gz')))!r}, jobs=1)\n"
            "assert r.cards\n"
            "try:\n    r.steps_df()\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'pip install "tb_bottleneck_plugin[notebook]"' in done.stdout


def _rows_equal(df, rows, drop=("run",)):
    """The frame's records (NaN as None) equal the JSON rows, dict-valued fields left out."""
    got = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items() if k not in drop}
           for r in df.to_dict("records")]
    want = [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) >= set(w)
        for k, v in w.items():
            gv = g[k]
            if isinstance(v, list):
                assert list(gv) == v, k
            else:
                assert _same(gv, v) or gv == v, (k, gv, v)


def test_source_modules_labels_flops_df_are_the_cli_tables():
    """On the H200 with_stack demo run (source lines, modules, labels) and the H100 FP32
    matmul run (FLOPs per op class): each DataFrame holds the CLI JSON's rows, and a trace
    without stacks gives empty source frames (its not_available says why)."""
    stack = next((DEMO_LOGS / "h200_stack_item_slow_module").glob("*.pt.trace.json.gz"))
    cli = _cli_json("report", str(stack), "--json")
    rep = tbb.analyze(str(stack))
    sa = cli["source_attribution"]
    assert sa["lines"] and sa["modules"]
    _rows_equal(rep.source_lines_df(), sa["lines"])
    _rows_equal(rep.modules_df(), sa["modules"])
    _rows_equal(rep.labels_df(), sa["labels"])
    assert rep.modules_df()["class"].iloc[0] == sa["modules"][0]["class"]

    fp32 = sorted((DEMO_LOGS / "h100_fp32_matmul").glob("*.pt.trace.json.gz"))[0]
    cli = _cli_json("report", str(fp32), "--json")
    rep = tbb.analyze(str(fp32))
    by_class = cli["flops"]["by_class"]
    df = rep.flops_df()
    assert list(df["op_class"]) == list(by_class)
    _rows_equal(df.drop(columns=["op_class"]), list(by_class.values()))
    assert rep.source_lines_df().empty and "source_attribution.lines" in cli["not_available"]
    assert rep.collectives_df().empty


def test_what_if_df_and_the_notebook_view_are_the_cli_step_model():
    """Report.what_if_df() holds the CLI JSON's step-model rows (METRICS.md §19), then the
    all-fixes row and the ceiling; `report --what-if --json` prints the same sections; the
    notebook view shows the server's verdict and what-if rows first."""
    fp32 = sorted((DEMO_LOGS / "h100_fp32_matmul").glob("*.pt.trace.json.gz"))[0]
    cli = _cli_json("report", str(fp32), "--json")
    sm = cli["step_model"]
    rep = tbb.analyze(str(fp32))
    df = rep.what_if_df()
    ids = [r["id"] for r in sm["what_if"]] + ["all_fixes"] * bool(sm["all_fixes"]["ids"]) + ["roofline"] * bool(sm["ceiling"])
    assert list(df["id"]) == ids
    first = df.iloc[0]
    assert first["saving_pct"] == pytest.approx(sm["what_if"][0]["saving_pct"])
    assert first["predicted_step_ms"] == pytest.approx(sm["what_if"][0]["predicted_step_ms"])
    cut = _cli_json("report", str(fp32), "--json", "--what-if")
    assert cut["step_model"] == sm
    assert [r["what_if"] for r in cut["recommendations"]] == [r.get("what_if") for r in cli["recommendations"]]
    page = rep._repr_html_()
    assert "tbb-verdict" in page and page.index("tbb-verdict") < page.index("tbb-card")
    assert "What would each fix buy?" in page


def test_what_if_text_prints_each_fix_and_all_fixes():
    fp32 = sorted((DEMO_LOGS / "h100_fp32_matmul").glob("*.pt.trace.json.gz"))[0]
    out = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(fp32), "--what-if"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    cli = _cli_json("report", str(fp32), "--json")
    sm = cli["step_model"]
    assert "What would each fix buy?" in out
    for r in sm["what_if"]:
        assert f"-> {r['predicted_step_ms']:.2f} ms" in out, r["id"]
    if sm["all_fixes"]["ids"]:
        assert f"-> {sm['all_fixes']['predicted_step_ms']:.2f} ms" in out
