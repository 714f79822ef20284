"""TensorBoard with the Bottlenecks tab ends promptly on SIGTERM and on Ctrl-C, busy or idle,
and leaves no analysis process behind.

Seen by a user: after serving ~19 runs, SIGTERM or Ctrl-C took 5-20 s to end TensorBoard.
The cause was the analysis threads (a ThreadPoolExecutor, each thread waiting on an
analysis child): concurrent.futures joins its threads at interpreter exit, so the exit
waited for every analysis in flight to finish. Now those threads are daemon threads and
the Analyzer is stopped at exit (children killed and reaped; engine._stop_analyzers).

Every check runs a real ``tensorboard --logdir`` (every plugin but torch-tb-profiler's,
conftest.TENSORBOARD_WITHOUT_TBP) on symlinks to real traces from ../shared/traces, its
own session so that Ctrl-C is a SIGINT to the whole process group as from a terminal:

- busy: signalled while analyses are in flight (resnet50-sized spans, one child per slot):
  exits within EXIT_BOUND_S; the spans that were loading got no report in the disk cache
  (the exit did not wait for their analyses: the old code wrote one for each, and that
  part holds whatever the machine's load); no traceback on stderr (children ignore
  SIGINT: before, every child printed a KeyboardInterrupt traceback into the terminal).
- idle: every span analysed (idle children kept for reuse): exits within EXIT_BOUND_S.
- both: every process TensorBoard had started (psutil, recursive, taken just before the
  signal: analysis children, the idle ones too) is gone shortly after it exits.

- in process: `Analyzer.stop()` with analyses in flight returns in < 2 s, its children
  are reaped (not even zombies), nothing starts after it, its waiting threads are daemon.

Wall clock on a shared 2-core machine is noisy: a check whose only failure is the time
bound is run again on a fresh TensorBoard, up to ATTEMPTS times (as in
tests/e2e/test_tensorboard_process.py); the survivors and disk-cache checks never retry.
Measured (load 11-15 on 2 cores, before -> after this fix): busy SIGTERM 3.0-3.8 s ->
0.37-0.48 s; busy Ctrl-C 1.1-1.8 s (children killed by their own KeyboardInterrupt, 3
tracebacks) -> 0.5-1.5 s (none); idle 0.43-0.47 s -> 0.68-0.78 s (noise); a 4x resnet50
trace (140 MB JSON, scale_trace.py) busy SIGTERM 3.8-5.3 s -> 0.37 s; on a Dask
LocalCluster busy SIGTERM 0.8-0.9 s after.
"""
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import SHARED, TENSORBOARD_WITHOUT_TBP, default_sigint, free_port

psutil = pytest.importorskip("psutil")

TRACES = SHARED / "traces"
BUSY_TRACES = [  # resnet50-sized: seconds of analysis each here
    TRACES / "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    TRACES / "kineto-tb-samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    TRACES / "hta/df_index_resolver/df_index_resolver.json.gz",
    TRACES / "hta/trace_diff/control/control.json.gz",
]
IDLE_TRACES = [  # small: all analysed in seconds
    TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    TRACES / "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json",
    TRACES / "generated-cpu-torch2.13/nw2_gzip/worker0.1795274789574029385.pt.trace.json.gz",
    TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
EXIT_BOUND_S = 2.0  # the "within ~2 s"; a fresh TensorBoard ends in ~0.4 s here
SURVIVOR_GRACE_S = 3.0  # time allowed after the exit for a child to be gone
ATTEMPTS = 3
SIGNALS = {"SIGTERM": (signal.SIGTERM, False), "ctrl-c": (signal.SIGINT, True)}


def _logdir(root: Path, traces, copies: int) -> Path:
    logs = root / "logs"
    for c in range(copies):
        for i, trace in enumerate(traces):
            if not trace.exists():
                pytest.skip(f"{trace} is missing")
            run = logs / f"run{c}_{i}"
            run.mkdir(parents=True)
            os.symlink(trace, run / trace.name)
    return logs


def _spans(base: str) -> list:
    with urllib.request.urlopen(base + "/data/plugin/bottlenecks/runs", timeout=10) as r:
        body = json.loads(r.read())
    return [s for run in body["runs"] for w in run["workers"] for s in w["spans"]]


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _alive(procs) -> list:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _signal_tensorboard(logs: Path, cache: Path, sig: int, group: bool, ready, timeout=240) -> dict:
    """Start TensorBoard on ``logs`` (disk cache in ``cache``), wait until ``ready(spans)``,
    signal it; what happened. Everything it started is killed at the end whatever happens."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [*TENSORBOARD_WITHOUT_TBP, "--logdir", str(logs), "--host", "127.0.0.1", "--port", str(port),
             "--bottlenecks_cache_dir", str(cache)],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            preexec_fn=default_sigint)
        tb = psutil.Process(proc.pid)
        kids = []
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    spans = _spans(base)
                    if spans and ready(spans):
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    pytest.fail("TensorBoard never reached the state to signal it in: "
                                + err.read()[-3000:].decode(errors="replace"))
                time.sleep(0.2)
            kids = tb.children(recursive=True)
            cmdlines = {p.pid: _cmdline(p) for p in kids}
            t0 = time.monotonic()
            if group:
                os.killpg(proc.pid, sig)  # Ctrl-C in a terminal: the whole foreground group
            else:
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            exit_s = time.monotonic() - t0
            t1 = time.monotonic()
            while _alive(kids) and time.monotonic() - t1 < SURVIVOR_GRACE_S:
                time.sleep(0.05)
            survivors = [(p.pid, " ".join(cmdlines[p.pid])[:120]) for p in _alive(kids)]
            err.seek(0)
            stderr = err.read().decode(errors="replace")
            return {"exit_s": exit_s, "returncode": proc.returncode, "spans": spans, "children": len(kids),
                    "analysis_children": sum("_child_entry" in " ".join(c) for c in cmdlines.values()),
                    "survivors": survivors, "stderr": stderr,
                    "reports": len(list(cache.glob("*.json")))}
        finally:
            for p in [tb, *kids]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            proc.wait(timeout=10)


def _busy(spans) -> bool:
    """At least two spans in flight, past the start of their analysis."""
    loading = [s for s in spans if s["state"] == "loading"]
    return len(loading) >= 2 and any(s["progress"] > 0.02 for s in loading)


def _idle(spans) -> bool:
    return all(s["state"] in ("ready", "error") for s in spans)


def _analysis_children(result) -> None:
    assert result["analysis_children"] >= 1, "no analysis child to check: the test did not test anything"


@pytest.mark.parametrize("how", list(SIGNALS))
def test_busy_tensorboard_exits_promptly_and_kills_its_analyses(tmp_path, how):
    sig, group = SIGNALS[how]
    logs = _logdir(tmp_path, BUSY_TRACES, copies=2)
    times = []
    for attempt in range(ATTEMPTS):
        cache = tmp_path / f"cache{attempt}"
        r = _signal_tensorboard(logs, cache, sig, group, _busy)
        _analysis_children(r)
        assert r["survivors"] == [], f"processes left after TensorBoard exited: {r['survivors']}"
        assert r["returncode"] is not None, "TensorBoard did not exit within 60 s"
        assert "Traceback" not in r["stderr"], r["stderr"][-3000:]
        ready = sum(s["state"] == "ready" for s in r["spans"])
        loading = sum(s["state"] == "loading" for s in r["spans"])
        # the exit did not wait for the analyses in flight (the old code finished and cached
        # each one first); one may end in the milliseconds between the poll and the signal
        assert r["reports"] < ready + loading, (r["reports"], ready, loading)
        times.append(round(r["exit_s"], 2))
        if r["exit_s"] <= EXIT_BOUND_S:
            break
    assert min(times) <= EXIT_BOUND_S, f"busy TensorBoard took {times} s to exit after {how}"


@pytest.mark.parametrize("how", list(SIGNALS))
def test_idle_tensorboard_exits_promptly(tmp_path, how):
    sig, group = SIGNALS[how]
    logs = _logdir(tmp_path, IDLE_TRACES, copies=3)
    times = []
    for attempt in range(ATTEMPTS):
        r = _signal_tensorboard(logs, tmp_path / f"cache{attempt}", sig, group, _idle)
        _analysis_children(r)
        assert r["survivors"] == [], f"processes left after TensorBoard exited: {r['survivors']}"
        assert r["returncode"] is not None, "TensorBoard did not exit within 60 s"
        assert sum(s["state"] == "ready" for s in r["spans"]) == len(IDLE_TRACES) * 3
        assert r["reports"] == len(IDLE_TRACES) * 3
        assert "Traceback" not in r["stderr"], r["stderr"][-3000:]
        times.append(round(r["exit_s"], 2))
        if r["exit_s"] <= EXIT_BOUND_S:
            break
    assert min(times) <= EXIT_BOUND_S, f"idle TensorBoard took {times} s to exit after {how}"


def test_analyzer_stop_kills_and_reaps_busy_children_at_once(tmp_path):
    """`Analyzer.stop()` (what TensorBoard's exit calls) while analyses are in flight:
    returns within a second or so, every analysis child is gone (reaped, not a zombie of
    ours), nothing is started after it, and the threads that waited on the children are
    daemon threads (a non-daemon one is joined by the interpreter's exit)."""
    from tb_bottleneck_plugin.serving.engine import Analyzer

    logs = _logdir(tmp_path, BUSY_TRACES, copies=1)
    a = Analyzer(str(logs), rescan_seconds=600, max_workers=3, processes=True)
    a.start()
    deadline = time.monotonic() + 120
    while True:
        states = [st for st in a._spans.values()]
        if sum(st.state == "loading" for st in states) >= 2 and any(st.progress > 0.02 for st in states):
            break
        assert time.monotonic() < deadline, "no two analyses in flight within 120 s"
        time.sleep(0.05)
    pids = a.children.pids()
    assert len(pids) >= 2
    threads = a._pool.threads()
    assert threads and all(t.daemon for t in threads)
    loading = [url for url, st in a._spans.items() if st.state == "loading"]
    t0 = time.monotonic()
    a.stop()
    took = time.monotonic() - t0
    left = [pid for pid in pids if psutil.pid_exists(pid)]  # reaped: not even a zombie
    assert left == [], f"analysis children left after stop(): {left} of {pids}"
    assert took < 2.0, f"stop() took {took:.2f} s"
    started = a.children.started
    time.sleep(1.0)
    assert a.children.started == started, "an analysis child was started after stop()"
    assert not any(a._spans[url].state == "ready" for url in loading), "an analysis in flight was waited for"
