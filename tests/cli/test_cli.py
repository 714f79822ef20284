"""`tb-bottlenecks report` on files, runs and logdirs, and its errors (exit codes, one line)."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tb_bottleneck_plugin import cli

from conftest import TRACES, write_trace  # noqa: E402  (the one definition, tests/conftest.py)
RESNET0 = TRACES / "kineto-tb-samples/resnet50_num_workers_0"
CPU_NW0 = TRACES / "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json"


def run_cli(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_for_a_single_file_is_exactly_one_report(capsys):
    code, out, err = run_cli(capsys, "report", str(CPU_NW0), "--json")
    assert code == 0, err
    rep = json.loads(out)  # one object, nothing else on stdout
    assert rep["source"] == str(CPU_NW0) and rep["schema_version"] == 1
    assert rep["steps"]["numbers"] == [2, 3]
    assert rep["input"]["verdict"] == "moderately input-bound"


def test_text_report_of_a_run_directory(capsys):
    code, out, _ = run_cli(capsys, "report", str(RESNET0))
    assert code == 0
    assert "worker0" in out and "steps [5, 6, 7, 8, 9, 10]" in out and "steps [16, 17, 18, 19, 20, 21]" in out
    assert "Tesla V100-DGXS-32GB" in out and "8,772 kernels" in out
    assert "input-bound 33.37% (highly input-bound)" in out
    assert "num_workers=4" in out


def test_json_for_a_logdir_lists_runs_workers_summaries(tmp_path, capsys):
    logdir = tmp_path / "logs"
    shutil.copytree(RESNET0, logdir / "nw0")
    (logdir / "cpu" / "deep").mkdir(parents=True)
    shutil.copy(CPU_NW0, logdir / "cpu" / "deep" / CPU_NW0.name)
    code, out, _ = run_cli(capsys, "report", str(logdir), "--json")
    assert code == 0
    doc = json.loads(out)
    runs = {r["run"]: r for r in doc["runs"]}
    assert set(runs) == {"nw0", "cpu/deep"}
    worker = runs["nw0"]["workers"][0]
    assert worker["worker"] == "worker0" and len(worker["spans"]) == 2
    assert 22.92 < worker["summary"]["input"]["input_bound_pct"] < 33.37
    assert doc["errors"] == []


def test_broken_file_among_good_ones_exits_1_and_names_it(tmp_path, capsys):
    logdir = tmp_path / "logs"
    shutil.copytree(RESNET0, logdir / "nw0")
    broken = logdir / "nw0" / "worker1.1623143089999.pt.trace.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1,')[:40])
    code, out, err = run_cli(capsys, "report", str(logdir))
    assert code == 1
    assert str(broken) in err and "gzip" in err
    assert "input-bound 33.37%" in out  # the other files are still reported


@pytest.mark.parametrize("payload, problem", [
    (b"", "empty file"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2},',
     "ends early"),
    (b'{"not": "a trace"}', "not a PyTorch profiler trace"),
], ids=["empty", "truncated", "not-a-trace"])
def test_bad_single_file_exits_2_with_one_line(tmp_path, capsys, payload, problem):
    path = tmp_path / "w.1.pt.trace.json"
    path.write_bytes(payload)
    code, out, err = run_cli(capsys, "report", str(path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and problem in lines[0]


def test_missing_path_and_empty_dir(tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", str(tmp_path / "nope"))
    assert code == 2 and str(tmp_path / "nope") in err
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "no PyTorch profiler trace files found" in err


def test_console_script_is_installed(tmp_path):
    exe = shutil.which("tb-bottlenecks")
    assert exe, "pip install -e . registers the tb-bottlenecks console script"
    proc = subprocess.run([exe, "report", str(CPU_NW0), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"]["count"] == 2


# ---------------------------------------------------------------- exit codes (issue 10 item 2)

def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_a_failing_section_is_one_stderr_line_and_exit_0(monkeypatch, capsys):
    from tb_bottleneck_plugin.analysis import occupancy

    monkeypatch.setattr(occupancy, "kernel_occupancy", _boom)
    code, out, err = run_cli(capsys, "report", str(CPU_NW0))
    assert code == 0
    assert err.splitlines() == [f"tb-bottlenecks: {CPU_NW0}: internal error in occupancy: RuntimeError: boom"]
    assert "input-bound 15.66% (moderately input-bound)" in out  # the rest of the report is there
    assert "n/a Occupancy: internal error in occupancy: RuntimeError: boom" in out
    code, out, err = run_cli(capsys, "report", str(CPU_NW0), "--json")
    assert code == 0 and json.loads(out)["errors"] == [
        {"section": "occupancy", "error": "internal error in occupancy: RuntimeError: boom"}]


def test_debug_shows_the_section_traceback(monkeypatch, capsys):
    from tb_bottleneck_plugin.analysis import occupancy

    monkeypatch.setattr(occupancy, "kernel_occupancy", _boom)
    code, _, err = run_cli(capsys, "report", str(CPU_NW0), "--debug")
    assert code == 0 and "Traceback" in err and "RuntimeError: boom" in err


def test_unexpected_error_is_one_line_exit_2_and_a_traceback_with_debug(monkeypatch, capsys):
    from tb_bottleneck_plugin.trace import discovery

    monkeypatch.setattr(discovery, "discover_path", _boom)
    code, out, err = run_cli(capsys, "report", str(CPU_NW0))
    assert code == 2 and out == ""
    assert err.splitlines() == ["tb-bottlenecks: internal error: RuntimeError: boom "
                                "(run with --debug for the traceback)"]
    code, _, err = run_cli(capsys, "report", str(CPU_NW0), "--debug")
    assert code == 2 and "Traceback (most recent call last)" in err and "RuntimeError: boom" in err


def test_a_crash_on_one_file_costs_that_file_only(monkeypatch, tmp_path, capsys):
    """Exit 1 when some file gave no report (here: an unexpected exception), 2 when none did."""
    from tb_bottleneck_plugin.trace import loader

    logdir = tmp_path / "logs" / "run"
    logdir.mkdir(parents=True)
    good, bad = logdir / "w.1.pt.trace.json", logdir / "w.2.pt.trace.json"
    shutil.copy(CPU_NW0, good)
    shutil.copy(CPU_NW0, bad)
    real = loader.load_trace

    def flaky(path, *args, **kwargs):
        if str(path).endswith(bad.name):
            raise ValueError("cannot cope")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loader, "load_trace", flaky)
    # --jobs 1: in this process, where the monkeypatch applies (child processes: test_scheduler.py)
    code, out, err = run_cli(capsys, "report", str(tmp_path / "logs"), "--jobs", "1")
    assert code == 1
    assert err.splitlines() == [f"tb-bottlenecks: {bad}: internal error: ValueError: cannot cope "
                                "(run with --debug for the traceback)"]
    assert "input-bound 15.66%" in out
    code, out, err = run_cli(capsys, "report", str(bad))
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "ValueError: cannot cope" in err


# ---------------------------------------------------------------- text (issue 9 items 5, 6)

def _one_kernel_trace(path: Path, with_steps: bool):
    """One kernel of 3 µs in a 5 µs trace, with or without a ProfilerStep."""
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1,
               "dur": 1, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 3,
               "args": {"correlation": 1, "device": 0, "stream": 7}}]
    if with_steps:
        events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                       "ts": 0, "dur": 3})
    return write_trace(path, events)


def test_text_of_a_run_directory_puts_the_run_summary_first(capsys):
    code, out, _ = run_cli(capsys, "report", str(RESNET0))
    assert code == 0
    lines = out.splitlines()
    # headed by the directory's name, never "run ."
    assert lines[0] == "run resnet50_num_workers_0: 1 worker: worker0 (2 spans)"
    summary = out.index("run summary (2 spans)")
    first_span = out.index("worker worker0, span 1623143089861: worker0.1623143089861.pt.trace.json.gz")
    assert summary < first_span < out.index("worker worker0, span 1623143566756")
    # the run summary is the ratio of sums over both spans' 12 steps (22.92 < x < 33.37)
    body = out[summary:first_span]
    assert "steps [5, 6, 7, 8, 9, 10, 16, 17, 18, 19, 20, 21]" in body
    assert "input-bound 28.50% (highly input-bound)" in body
    assert "average step 177.6 ms" in out[first_span:]  # durations with a unit that fits
    assert "1.07 s of trace" in out[first_span:]
    # words, not keys, in the n/a lines; no internal key anywhere in them
    na = [line for line in lines if line.strip().startswith("n/a ")]
    assert _na(na, "GPU 0 memory: peak reserved",
               "2021-format [memory] events carry only signed Bytes: reserved memory is not available")
    assert all("_" not in line.split(":")[0] for line in na)



def _na(lines, label, reason=None):
    """Whether an n/a line (one per cause: ``n/a <label>; <label>: <reason>``) lists ``label``
    (with ``reason`` when given)."""
    for line in lines:
        body = line.strip()
        if not body.startswith("n/a "):
            continue
        listed = body[4:]
        if listed.startswith(label + ";") or listed.startswith(label + ":") or f"; {label};" in listed \
                or f"; {label}:" in listed:
            return reason is None or f": {reason}" in body
    return False


def test_text_of_a_single_file_is_headed_by_its_name(capsys):
    code, out, _ = run_cli(capsys, "report", str(CPU_NW0))
    assert code == 0
    assert out.splitlines()[0] == CPU_NW0.name and "run ." not in out
    assert "average step 216.0 ms" in out
    # CPU [memory] events record no reserved memory: never "peak reserved 0 B"
    memory_line, = [line for line in out.splitlines() if line.startswith("  memory CPU:")]
    assert memory_line == "  memory CPU: peak allocated 2.3 MiB"
    assert _na(out.splitlines(), "CPU memory: allocator slack (time-weighted)")


def test_text_counts_and_tiny_durations(tmp_path, capsys):
    path = _one_kernel_trace(tmp_path / "one.pt.trace.json", with_steps=True)
    code, out, _ = run_cli(capsys, "report", str(path))
    assert code == 0
    assert "1 kernel, 0 memcpys, 0 memsets, 1 runtime call, " in out  # singular where it is one
    assert "; 5 µs of trace" in out and "0.0 ms" not in out
    assert "average step 5 µs" in out and "kernel launches: 1 kernel per step" in out


def test_text_without_profiler_steps_has_no_kernels_per_step(tmp_path, capsys):
    path = _one_kernel_trace(tmp_path / "nostep.pt.trace.json", with_steps=False)
    code, out, _ = run_cli(capsys, "report", str(path))
    assert code == 0
    assert "no steps found" in out and _na(out.splitlines(), "Steps", "no steps found")
    assert not [line for line in out.splitlines() if line.strip().startswith("kernel launches")]
    assert "0 kernels per step" not in out


def test_report_on_a_distributed_run_names_the_straggler_in_text_and_json(capsys):
    """The committed 2-rank gloo demo run whose rank 1 loads data twice as slowly
    (demo.py: 300 vs 150 ms per batch): the CLI shows the ranks table with rank 1 as the
    straggler, after the run summary, and --json carries the same view."""
    import json

    from tb_bottleneck_plugin import cli

    run_dir = str(Path(__file__).resolve().parents[2] / "demo_logs" / "ddp_straggler_2rank")
    assert cli.main(["report", run_dir]) == 0
    text = capsys.readouterr().out
    assert text.index("run summary") < text.index("ranks: 2 ranks") < text.index("worker rank0, span")
    assert "rank 1 (worker rank1) holds the others back" in text
    assert cli.main(["report", run_dir, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)["runs"][0]["ranks"]
    assert view["straggler"]["rank"] == 1 and view["flagged"] is True
    assert [r["rank"] for r in view["ranks"]] == [0, 1]
