"""Ctrl-C on `tb-bottlenecks report` mid-analysis: the terminal sends SIGINT to the whole
process group; the CLI ends with one line and exit code 130 (no KeyboardInterrupt
traceback, from itself or from its analysis children), leaving no child behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TRACES, default_sigint, patience

RESNET = sorted((TRACES / "kineto-tb-samples" / "resnet50_num_workers_0").glob("*.pt.trace.json*"))
pytestmark = pytest.mark.skipif(not RESNET, reason="../shared/traces is not available")


def test_ctrl_c_mid_analysis_is_one_line_and_exit_130(tmp_path):
    psutil = pytest.importorskip("psutil")
    for rank in range(4):  # four resnet50-sized spans: the analysis children are busy for seconds
        run = tmp_path / "logs" / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / f"rank{rank}.{1700000000000 + rank}.pt.trace.json.gz").symlink_to(RESNET[0])
    proc = subprocess.Popen([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(tmp_path / "logs"),
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    try:
        me = psutil.Process(proc.pid)
        deadline = time.time() + patience(30)
        while not me.children():  # the analysis children started: it is mid-analysis
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.05)
        children = me.children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = proc.communicate(timeout=patience(20))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 130, text
    assert text.strip().splitlines() == ["tb-bottlenecks: interrupted"], text
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
