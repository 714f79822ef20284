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

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
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
