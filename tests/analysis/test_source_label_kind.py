"""record_function labels by kind (METRICS.md §17 `kind`, issue 35 item 5): torch.compile's own
labels (Inductor's ``## Call CompiledFxGraph <hash> ##``, the compile passes
``<pass>_data: compile_id=N/M``) are told apart from the program's, so the dashboard lists them
under Compile. Checked on the demo's compiled H100 run with a graph break against the raw JSON."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from conftest import DEMO_LOGS
from tb_bottleneck_plugin import api
from tb_bottleneck_plugin.analysis.source import label_kind

RUN = DEMO_LOGS / "h100_compile_graph_break"


def test_label_kind_by_name():
    assert label_kind("## Call CompiledFxGraph fyrubo3v4fiof4cpp2laie7iqlrve3djxt7trhwnk5rers6nuovl ##") == "compiled_graph"
    assert label_kind("aot_trace_joint_graph_data: compile_id=0/3") == "compile_pass"
    assert label_kind("pass.joint_graph_passes.pass_pattern_0_data: compile_id=1/4") == "compile_pass"
    assert label_kind("CachingAutotuner.benchmark_all_configs_data: kernel_name=triton_poi_fused_mul_0, "
                      "is_backward=False, compile_id=1/3") == "compile_pass"
    assert label_kind("Optimizer.step#SGD.step") == "user"
    assert label_kind("## Call CompiledFxGraph ##") == "user"  # no hash: not Inductor's label
    assert label_kind("my_block compile_id=0/3") == "user"


@pytest.mark.skipif(not RUN.is_dir(), reason="demo run missing")
def test_compiled_graph_calls_of_the_demo_run_counted_from_the_raw_json():
    (path,) = sorted(RUN.glob("*.pt.trace.json.gz"))
    events = json.load(gzip.open(path))["traceEvents"]
    ann = [e for e in events if e.get("cat") == "user_annotation"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ann if e["name"].startswith("ProfilerStep#")]
    inside = [e for e in ann if any(lo <= e["ts"] < hi for lo, hi in steps)]
    fx = re.compile(r"^## Call CompiledFxGraph \S+ ##$")
    want_graph_calls = sum(1 for e in inside if fx.match(e["name"]))
    want_pass_names = {e["name"] for e in inside if "_data: " in e["name"] and "compile_id=" in e["name"]}
    labels = api.analyze(str(RUN), jobs=1).report["source_attribution"]["labels"]
    graph = [r for r in labels if r["kind"] == "compiled_graph"]
    passes = {r["name"] for r in labels if r["kind"] == "compile_pass"}
    assert want_graph_calls > 0 and sum(r["count"] for r in graph) == want_graph_calls
    assert all(fx.match(r["name"]) for r in graph)
    assert passes and passes <= want_pass_names  # the table keeps the top MAX_LABELS by CPU time
    assert all(not fx.match(r["name"]) and "compile_id=" not in r["name"] for r in labels if r["kind"] == "user")
