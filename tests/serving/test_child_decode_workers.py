"""An analysis child decodes a large file with a decode worker of its own only while it is the
only analysis of its pool (the tab opening one big trace: both cores load it), never beside
another child (children already run one per core). Real child processes on a real ~100 MB
trace; the worker is seen as the child's own child process in /proc, and the report is the
same either way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tb_bottleneck_plugin.serving import children, engine

SHARED = Path(__file__).resolve().parents[3] / "shared"
SOURCE = SHARED / "traces/kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux /proc and two cores")


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """A run holding one ~97 MB JSON trace (3 copies of a real resnet50 trace): above the
    loader's size for a decode worker (decode_workers.PARALLEL_MIN_BYTES)."""
    run = tmp_path_factory.mktemp("big") / "run"
    run.mkdir()
    dest = run / "worker0.1.pt.trace.json"
    subprocess.run([sys.executable, str(SHARED / "bench/scale_trace.py"), str(SOURCE), str(dest), "--times", "3"],
                   check=True, capture_output=True)
    assert dest.stat().st_size > 80 << 20
    logdir = engine.discover(str(run.parent))
    (r,) = logdir.runs
    (w,) = r.workers
    (span,) = w.spans
    return logdir.url, r, span


def _forks_of(pid: int) -> set:
    """The process's children that are forks of it (a decode worker runs the child's own
    command line; procguard's `ldconfig -p`, run by ctypes, does not once it is exec'd)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return set()
    forks = set()
    for kid in kids:
        try:
            if Path(f"/proc/{kid}/cmdline").read_bytes() == own:
                forks.add(kid)
        except OSError:
            pass
    return forks


def _analyze_watching(pool: children.ChildPool, job: tuple):
    """(outcome, whether the analysing child had a child process of its own meanwhile)."""
    before = set(pool.pids())
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("outcome", pool.analyze(*job)))
    thread.start()
    polls: dict = {}  # fork pid -> polls it was seen in
    while thread.is_alive():
        for pid in set(pool.pids()) - before:
            for fork in _forks_of(pid):
                polls[fork] = polls.get(fork, 0) + 1
        time.sleep(0.005)
    thread.join()
    # A worker lives for the whole load; a fork caught before its exec (ldconfig) for a poll
    return box["outcome"], any(n >= 3 for n in polls.values())


def test_a_lone_child_decodes_with_a_worker_and_a_child_beside_another_does_not(big_run, monkeypatch):
    monkeypatch.delenv("TB_BOTTLENECKS_DECODE_PROCESSES", raising=False)
    # an idle machine with cores to spare, as the loader's rule wants (decode_workers._decode_workers)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    pool = children.ChildPool(max_idle=0, nice=0)
    try:
        alone, alone_had_worker = _analyze_watching(pool, big_run)
        other = pool._take()  # another analysis of the pool is running
        try:
            beside, beside_had_worker = _analyze_watching(pool, big_run)
        finally:
            pool._give_back(other, reuse=False)
    finally:
        pool.close()
    assert alone[0] == "ok" and beside[0] == "ok", (alone[0], beside[0])
    assert alone_had_worker
    assert not beside_had_worker
    # the same report, decoded with or without the worker
    assert json.dumps(alone[1]["report"], sort_keys=True) == json.dumps(beside[1]["report"], sort_keys=True)


def test_a_number_the_user_set_holds_beside_another_child(big_run, monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    pool = children.ChildPool(max_idle=0, nice=0)
    try:
        other = pool._take()
        try:
            outcome, had_worker = _analyze_watching(pool, big_run)
        finally:
            pool._give_back(other, reuse=False)
    finally:
        pool.close()
    assert outcome[0] == "ok"
    assert had_worker
