"""`tb-bottlenecks demo`: real torch training loops whose traces tell the input story.

One quick CPU demo is generated per test module (about 10 s on an idle 2-core machine)
and every check reads those traces. Robustness on a loaded CI machine comes from the
demo, not from loose thresholds here: it sizes its augmentation pipeline to the model
step time it measures, so ``num_workers=0`` spends about 40% of each step loading data
(2x the 20% asserted), and the worker run profiles only after the workers have filled
their prefetch queues (typically under 1%, asserted < 5%).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from tb_bottleneck_demo import generator as demo

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE_FILE = re.compile(r"^worker0\.\d{19}\.pt\.trace\.json\.gz$")
STEP_PREFIX = "ProfilerStep#"
DATALOADER_PREFIX = "enumerate(DataLoader)#"


def input_bound_share(trace: dict) -> float:
    """Fraction of profiled step time spent in the DataLoader (a ratio of sums).

    Steps are the ``ProfilerStep#N`` spans (category ``user_annotation``). DataLoader time
    is the part of each ``enumerate(DataLoader)#<IterClass>.__next__`` span that lies
    inside a step. Returns sum(DataLoader time in steps) / sum(step durations).
    """
    annotations = [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "user_annotation"
    ]

    def interval(event: dict) -> tuple:
        start = float(event["ts"])
        return start, start + float(event["dur"])

    steps = [interval(e) for e in annotations if e["name"].startswith(STEP_PREFIX)]
    loads = [
        interval(e)
        for e in annotations
        if e["name"].startswith(DATALOADER_PREFIX) and e["name"].endswith(".__next__")
    ]
    if not steps:
        raise ValueError("the trace has no ProfilerStep#N spans")
    step_time = sum(end - start for start, end in steps)
    load_time = sum(
        max(0.0, min(step_end, load_end) - max(step_start, load_start))
        for step_start, step_end in steps
        for load_start, load_end in loads
    )
    return load_time / step_time


def _load(path: str) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def demo_logdir(tmp_path_factory):
    pytest.importorskip(
        "torch", reason='the demo needs torch: pip install "tb_bottleneck_plugin[demo]"'
    )
    # The pair is a timing experiment on the CPU: 4 DataLoader workers hide loading only
    # when the cores are not busy with something else (the suite's own TensorBoards, Dask
    # workers and analysis children winding down before this module runs), and the
    # num_workers=0 run's share follows the model step time the demo measured before it
    # (starved by 3 busy loops at nice 0, it once came out 15.4%, not >= 20%). A pair
    # where either side missed is re-measured once, on a fresh pair; the tests below
    # keep their thresholds and fail if the second pair shows the same.
    for attempt in range(2):
        outdir = tmp_path_factory.mktemp("demo_logs")
        runs = demo.generate(str(outdir), quick=True, device="cpu")
        (bound,) = _trace_files(os.path.join(str(outdir), "input_bound_nw0"))
        (fixed,) = _trace_files(os.path.join(str(outdir), "input_fixed_nw4"))
        if input_bound_share(_load(bound)) >= 0.20 and input_bound_share(_load(fixed)) < 0.05:
            break
    return str(outdir), runs


def _trace_files(run_dir: str) -> list:
    return sorted(os.path.join(run_dir, f) for f in os.listdir(run_dir) if TRACE_FILE.match(f))


def test_generate_returns_the_cpu_pair(demo_logdir):
    outdir, runs = demo_logdir
    assert runs == [os.path.join(outdir, "input_bound_nw0"), os.path.join(outdir, "input_fixed_nw4")]
    for run_dir in runs:
        names = os.listdir(run_dir)
        # quick mode: one profiling cycle, so one trace file ("span") per run
        assert [n for n in names if TRACE_FILE.match(n)] == names and len(names) == 1, names
        assert os.path.getsize(os.path.join(run_dir, names[0])) < 2 * 1024 * 1024


@pytest.mark.parametrize(
    "run, iterator_class",
    [
        ("input_bound_nw0", "_SingleProcessDataLoaderIter"),
        ("input_fixed_nw4", "_MultiProcessingDataLoaderIter"),
    ],
)
def test_trace_has_steps_and_dataloader_spans(demo_logdir, run, iterator_class):
    outdir, _ = demo_logdir
    (path,) = _trace_files(os.path.join(outdir, run))
    trace = _load(path)
    names = {e.get("name") for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    steps = sorted(n for n in names if n.startswith(STEP_PREFIX))
    # schedule(wait=1, warmup=1, active=2): the file holds steps 2 and 3
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    assert f"{DATALOADER_PREFIX}{iterator_class}.__next__" in names
    assert trace["demo_run"] == run
    assert trace["demo_settings"]["num_workers"] == (0 if run == "input_bound_nw0" else 4)
    assert trace["profile_memory"] == 1 and trace["record_shapes"] == 1


def test_input_bound_story(demo_logdir):
    outdir, _ = demo_logdir
    (bound,) = _trace_files(os.path.join(outdir, "input_bound_nw0"))
    (fixed,) = _trace_files(os.path.join(outdir, "input_fixed_nw4"))
    bound_share = input_bound_share(_load(bound))
    fixed_share = input_bound_share(_load(fixed))
    assert bound_share >= 0.20, f"num_workers=0 should be input-bound, got {bound_share:.1%}"
    assert fixed_share < 0.05, f"4 workers should hide data loading, got {fixed_share:.1%}"


def test_input_bound_share_is_a_ratio_of_sums():
    def span(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    trace = {
        "traceEvents": [
            span("ProfilerStep#2", 0, 100),
            span(loader, 10, 50),
            span("ProfilerStep#3", 100, 300),
            span(loader, 390, 30),  # only 10 of 30 us inside the step
            span(loader, 500, 40),  # outside every step
            {"ph": "X", "cat": "gpu_user_annotation", "name": loader, "ts": 120, "dur": 80},
        ]
    }
    assert input_bound_share(trace) == pytest.approx((50 + 10) / (100 + 300))


def test_demo_module_imports_without_torch_and_says_how_to_install(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # make `import torch` fail\n"
        "import tb_bottleneck_demo.generator as demo\n"
        "try:\n"
        f"    demo.generate({str(tmp_path)!r}, quick=True)\n"
        "except demo.MissingTorchError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(0)\n"
        "sys.exit('no MissingTorchError')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "tb_bottleneck_plugin[demo]"' in done.stdout
    assert not os.listdir(tmp_path)


def test_cli_demo_without_torch_is_one_line_with_the_install_command(tmp_path):
    """`tb-bottlenecks demo` imports the generator only when asked; without torch it exits 1
    with one line on stderr naming the extra (no traceback) and writes nothing."""
    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # make `import torch` fail\n"
        "from tb_bottleneck_plugin import cli\n"
        f"sys.exit(cli.main(['demo', {str(tmp_path / 'logs')!r}, '--quick']))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tb-bottlenecks demo: error:"), done.stderr
    assert 'pip install "tb_bottleneck_plugin[demo]"' in lines[0]
    assert not (tmp_path / "logs").exists() or not os.listdir(tmp_path / "logs")


def test_main_reports_a_missing_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert demo.main([str(tmp_path / "logs"), "--device", "cuda"]) == 1
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_the_project_analysis_tells_the_demo_story(demo_logdir):
    """The real report (what the tab shows) agrees with the independent helper above:
    the input-bound run is flagged with the DataLoader fix first, its twin is not."""
    from tb_bottleneck_plugin.trace import discovery
    from tb_bottleneck_plugin import report

    outdir, _ = demo_logdir
    logdir = discovery.scan_logdir(outdir)
    reports = {run.name: report.analyze_span(logdir.url, run, span)["report"] for run, _, span in logdir.spans()}
    bound, fixed = reports["input_bound_nw0"], reports["input_fixed_nw4"]
    (bound_file,) = _trace_files(os.path.join(outdir, "input_bound_nw0"))
    assert bound["input"]["input_bound_pct"] == pytest.approx(100 * input_bound_share(_load(bound_file)), abs=0.5)
    assert bound["input"]["verdict"] == "highly input-bound"
    assert bound["recommendations"][0]["rule"] == "input_bound"
    assert "num_workers" in bound["recommendations"][0]["action"]
    assert fixed["input"]["verdict"] == "not input-bound"
    assert "input_bound" not in [r["rule"] for r in fixed["recommendations"]]
