"""Issue 34 item 12 (a): the cards and the step timeline classify short kernels one way.

On the CUDA-graph demo run (`demo_logs/h100_compiled_cuda_graphs`, torch.compile
mode="reduce-overhead" on an H100) the short-kernel card and rule small_kernels said
"latency-bound, not launch-bound" while the step timeline shaded 15 gaps (2.1 ms in the first
span) between its eager short kernels (optimizer, data generation) "launch-bound". Both now
read `context.short_kernel_bound`: a trace that replays CUDA graphs has no launch-bound gap;
an eager run keeps them (`h100_many_small_kernels`: ~1,600 gaps a span, as its card says
"launch-bound")."""
import pytest

from conftest import DEMO_LOGS
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin.analysis import timeline
from tb_bottleneck_plugin.trace.loader import load_trace
from tb_bottleneck_plugin.views import timeline_window

GRAPHS = DEMO_LOGS / "h100_compiled_cuda_graphs"
EAGER = DEMO_LOGS / "h100_many_small_kernels"

pytestmark = pytest.mark.skipif(not GRAPHS.is_dir() or not EAGER.is_dir(), reason="demo_logs H100 runs missing")


def spans(run):
    for f in sorted(run.glob("*.pt.trace.json*")):
        trace = load_trace(str(f))
        rep = report_mod.analyze_trace(trace)["report"]
        store = timeline.build_store(trace)
        launch_us = [timeline_window.window(store, s["step"])["idle_us"].get("launch", 0.0)
                     for s in timeline_window.steps_list(store)]
        yield f.name, rep, launch_us


def launch_words(rep) -> list:
    words = [rep["verdicts"]["short_kernels"]["verdict"]]
    words += [r["title"] for r in rep["recommendations"] if r["rule"] in ("small_kernels", "host_bound")]
    return words


def test_cuda_graph_run_is_latency_bound_on_the_cards_and_the_timeline():
    for name, rep, launch_us in spans(GRAPHS):
        assert rep["context"]["cuda_graphs"], name
        card = rep["verdicts"]["short_kernels"]
        assert card["verdict"] == "short kernels: latency-bound (replayed from CUDA graphs)", card
        small = next(r for r in rep["recommendations"] if r["rule"] == "small_kernels")
        assert small["title"].endswith("latency-bound, not launch-bound"), small["title"]
        # the timeline: no step shades a gap launch-bound (before: 2.1 ms of 15 gaps in span 1)
        assert launch_us and all(us == 0.0 for us in launch_us), (name, launch_us)


def test_eager_run_is_launch_bound_on_the_cards_and_the_timeline():
    for name, rep, launch_us in spans(EAGER):
        assert not rep["context"]["cuda_graphs"], name
        assert rep["verdicts"]["short_kernels"]["verdict"] == "short kernels: launch-bound"
        assert all(us > 0 for us in launch_us), (name, launch_us)


def test_every_demo_span_that_replays_graphs_has_no_launch_bound_gap():
    """Every demo run, by its report's context: replays -> no launch-bound gap and no words
    that call it launch-bound."""
    import re

    launch_bound = re.compile(r"(?<!not )\blaunch-(?:bound|\s+or\s+latency-bound)")
    found = 0
    for run in sorted(d for d in DEMO_LOGS.iterdir() if d.is_dir()):
        for f in sorted(run.glob("**/*.pt.trace.json*")):
            trace = load_trace(str(f))
            rep = report_mod.analyze_trace(trace)["report"]
            if not rep["context"]["cuda_graphs"]:
                continue
            found += 1
            assert not any(launch_bound.search(w) for w in launch_words(rep)), (f, launch_words(rep))
            store = timeline.build_store(trace)
            for s in timeline_window.steps_list(store):
                assert timeline_window.window(store, s["step"])["idle_us"].get("launch", 0.0) == 0.0, (f, s)
    assert found >= 2  # the two spans of h100_compiled_cuda_graphs
