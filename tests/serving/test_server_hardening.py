"""Hostile logdirs, caches and requests (issue 10): a symlink to /, forged or broken disk
cache entries, other HTTP methods, absurd names, analyses and summaries that raise, and
analysis children that die. Each case builds its minimal input here.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest
from werkzeug import wrappers

from tb_bottleneck_plugin.serving import cache, children
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.plugin import BottlenecksPlugin
from tb_bottleneck_plugin.serving.engine import Analyzer, DiskCache

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
CPU_NW0 = TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json"
CPU_NW2 = TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz"
PREFIX = "/data/plugin/bottlenecks"
ROUTES = ["index.js", "static/index.js", "runs", "report", "memory", "kernels", "compare", "ranks"]

pytestmark = pytest.mark.skipif(not CPU_NW0.exists(), reason="../shared/traces is not available")


def link(dst: Path, src: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return dst


def until(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what or cond}"
        time.sleep(0.02)


class Harness:
    def __init__(self, logdir: Path, analyze_span=None, **flags):
        ns = argparse.Namespace(bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=60.0, logdir_spec="",
                                **flags)
        self.plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(logdir), flags=ns))
        if analyze_span is not None:
            self.plugin.analyzer.stop()
            self.plugin.analyzer = Analyzer(str(logdir), analyze_span=analyze_span, rescan_seconds=60.0)
        self.client = wtest.Client(application.TensorBoardWSGI([self.plugin]), wrappers.Response)

    def open(self, route: str, method: str = "GET", **query):
        return self.client.open(f"{PREFIX}/{route}", method=method, query_string=query or None)

    def json(self, route: str, expect: int = 200, **query):
        resp = self.open(route, **query)
        assert resp.status_code == expect, (route, query, resp.status_code, resp.get_data()[:300])
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        return json.loads(resp.get_data())


@pytest.fixture
def harnesses(monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")  # child processes: own tests below
    made = []

    def make(*args, **kwargs) -> Harness:
        h = Harness(*args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.plugin.analyzer.stop()


@pytest.fixture
def logdir(tmp_path) -> Path:
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    link(root / "cpu" / CPU_NW2.name, CPU_NW2)
    link(root / "other" / CPU_NW0.name, CPU_NW0)
    return root


# ---------------------------------------------------------------------------- filesystem


def test_symlink_to_root_is_skipped_with_a_note(harnesses, logdir):
    (logdir / "runs").mkdir()
    (logdir / "runs" / "link").symlink_to("/")
    h = harnesses(logdir)
    t0 = time.perf_counter()
    assert h.plugin.analyzer.wait_scan(30)
    assert time.perf_counter() - t0 < 5  # the machine was not walked (it took 29 s)
    view = h.json("runs")
    assert [r["run"] for r in view["runs"]] == ["cpu", "other"]  # no foreign runs
    assert view["scan"]["notes"] == ["skipped symlink runs/link -> / (points outside the logdir; "
                                     "--bottlenecks_follow_symlinks follows it)"]


def test_no_server_path_reaches_the_browser(harnesses, logdir):
    data = CPU_NW0.read_bytes()
    (logdir / "cpu" / "worker0.1795274799999999999.pt.trace.json").write_bytes(data[: len(data) // 3])
    h = harnesses(logdir)
    assert h.plugin.analyzer.wait_idle(60)
    bodies = [h.json("runs"), h.json("report", run="cpu"), h.json("report", run="other"),
              h.json("memory", run="cpu"), h.json("kernels", run="cpu"),
              h.json("report", expect=422, run="cpu", worker="worker0", span="1795274799999999999"),
              h.json("ranks", run="cpu"), h.json("operators", run="cpu"),
              h.json("compare", base_run="cpu", cand_run="other"),
              h.open("timeline", run="cpu", worker="worker0", span="1795274799999999999").get_json(),
              h.open("step_trace", run="cpu", worker="worker0", span="1795274799999999999").get_json()]
    # the logdir itself is shown as given on the command line (TensorBoard's own
    # /data/environment sends it too); nothing else names a server path
    assert bodies[0].pop("logdir") == str(logdir)
    text = json.dumps(bodies)
    assert str(logdir) not in text and str(logdir.parent) not in text
    assert "JSON ends early" in bodies[6]["file_errors"][0]["error"]  # /ranks names the broken file too
    rep = bodies[1]
    assert rep["spans"] == ["cpu/" + CPU_NW0.name, "cpu/" + CPU_NW2.name]
    assert rep["file_errors"][0]["file"] == "cpu/worker0.1795274799999999999.pt.trace.json"
    assert rep["file_errors"][0]["error"].startswith("cpu/worker0.1795274799999999999.pt.trace.json: ")
    # the CLI's path (report.analyze_span) keeps full paths
    found = h.plugin.analyzer.lookup("other")
    full = report.analyze_span(str(logdir), found.run, found.items[0][1])
    assert full["report"]["source"] == str(logdir / "other" / CPU_NW0.name)


# ---------------------------------------------------------------------------- disk cache


def _one_span_logdir(tmp_path) -> Path:
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW2.name, CPU_NW2)
    return root


@pytest.mark.parametrize("content", [
    b"[]", b"{}", b"\x00\xff garbage \x8b", b'{"version": "0.0", "key": "K", "result": R}',
    b'{"version": V, "key": "forged", "result": R}', b'{"version": V, "key": "K", "result": {"report": {}}}',
    b"TRUNCATED",
], ids=["list", "empty-dict", "garbage", "wrong-version", "wrong-key", "wrong-shape", "truncated"])
def test_invalid_cache_entries_are_discarded_and_reanalysed(tmp_path, content, monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")
    root = _one_span_logdir(tmp_path)
    cache_dir = tmp_path / "cache"
    first = Analyzer(str(root), cache_dir=cache_dir, rescan_seconds=60)
    try:
        assert first.wait_idle(30) and first.parse_count == 1
        good = first.result("cpu")
    finally:
        first.stop()
    [entry_path] = list(cache_dir.glob("*.json"))
    valid = entry_path.read_bytes()
    key = entry_path.stem
    result_json = json.dumps(json.loads(valid)["result"]).encode()
    if content == b"TRUNCATED":
        content = valid[: len(valid) // 2]
    content = (content.replace(b'"K"', json.dumps(key).encode()).replace(b"R", result_json)
               .replace(b"V", json.dumps(cache.current_version()).encode()))
    entry_path.write_bytes(content)

    second = Analyzer(str(root), cache_dir=cache_dir, rescan_seconds=60)
    try:
        assert second.wait_idle(30)
        assert second.cache_hits == 0 and second.parse_count == 1  # analysed again
        assert second._cache.discarded == 1
        assert second.result("cpu") == good  # never the forged or broken value
        assert json.loads(entry_path.read_bytes())["key"] == key  # replaced by a valid entry
    finally:
        second.stop()
    third = Analyzer(str(root), cache_dir=cache_dir, rescan_seconds=60)
    try:
        assert third.wait_idle(30) and third.cache_hits == 1 and third.parse_count == 0
    finally:
        third.stop()


def test_stale_tmp_files_are_removed_at_start(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    stale = cache_dir / "abc.json.tmp123.456"
    fresh = cache_dir / "def.json.tmp789.1"
    stale.write_text('{"partial')
    fresh.write_text('{"being written')
    old = time.time() - DiskCache.STALE_TMP_SECONDS - 5
    os.utime(stale, (old, old))
    DiskCache(cache_dir)
    assert not stale.exists() and fresh.exists()  # another process may be writing the fresh one


# ---------------------------------------------------------------------------- HTTP


@pytest.fixture
def ready(harnesses, logdir) -> Harness:
    h = harnesses(logdir)
    assert h.plugin.analyzer.wait_idle(60)
    return h


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"])
def test_only_get_and_head(ready, method):
    for route in ROUTES:
        resp = ready.open(route, method=method, run="cpu")
        assert resp.status_code == 405, (route, method, resp.status_code)
        assert resp.headers["Allow"] == "GET, HEAD"
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "not allowed" in json.loads(resp.get_data())["error"]


def test_head_answers_without_a_body(ready):
    for route in ("runs", "index.js"):
        resp = ready.open(route, method="HEAD")
        assert resp.status_code == 200 and resp.get_data() == b""
    resp = ready.open("report", method="HEAD", run="cpu")
    assert resp.status_code == 200 and resp.get_data() == b""


@pytest.mark.parametrize("query", [
    {"run": "r" * 256}, {"run": "x" * 5000}, {"run": "cpu", "worker": "w" * 256},
    {"run": "cpu", "span": "s" * 256}, {"run": "cpu", "worker": "worker0", "span": "9" * 300},
    {"run": "cpu\x00"}, {"run": "a/" * 3000},
])
@pytest.mark.parametrize("route", ["report", "memory", "kernels"])
def test_absurd_names_are_404(ready, route, query):
    assert "error" in ready.json(route, expect=404, **query)


@pytest.mark.parametrize("name", ["a" * 256 + ".js", "b" * 300 + ".css", "c" * 5000 + ".js", "x" * 255])
def test_long_static_names_are_404_not_500(ready, name):
    assert ready.json(f"static/{name}", expect=404) == {"error": "no such file"}


def test_every_error_answer_is_json_with_nosniff(ready):
    cases = [("report", 400, {}), ("report", 404, {"run": "nope"}), ("static/../x.js", 404, {}),
             ("static/nope.js", 404, {})]
    for route, code, query in cases:
        body = ready.json(route, expect=code, **query)
        assert isinstance(body["error"], str) and body["error"]


# ---------------------------------------------------------------------------- no 500 for data reasons


def test_a_failing_analysis_is_422_and_other_runs_answer(harnesses, logdir):
    def analyze(logdir_url, run, span, progress=None):
        if run.name == "cpu":
            raise ZeroDivisionError("float division by zero")
        return report.analyze_span(logdir_url, run, span, progress=progress)

    h = harnesses(logdir, analyze_span=analyze)
    assert h.plugin.analyzer.wait_idle(60)
    for route in ("report", "memory", "kernels"):
        body = h.json(route, expect=422, run="cpu")
        assert "internal error" in body["error"] and "ZeroDivisionError" in body["error"]
        assert str(logdir) not in json.dumps(body)
        assert h.json(route, run="other")  # unaffected
    assert h.json("runs")["runs"][0]["state"] == "error"


def test_a_failing_summary_is_422_and_other_runs_answer(ready, monkeypatch):
    calls = []

    def broken_combine(results, **kwargs):
        calls.append(1)
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(report, "combine_results", broken_combine)
    for route in ("report", "memory", "kernels"):
        body = ready.json(route, expect=422, run="cpu")
        assert body["state"] == "error" and "OverflowError" in body["error"] and "combining" in body["error"]
        # one span, or a run of one span: no summary needed, still served
        assert ready.json(route, run="cpu", worker="worker0", span="1795274786665165565")
        assert ready.json(route, run="other")
    assert len(calls) == 1  # the failure is kept, not recomputed per request


@pytest.mark.parametrize("route,code", [("runs", 503), ("report", 422)])
def test_an_unexpected_exception_in_a_route_is_not_500(ready, monkeypatch, route, code):
    def boom(*args, **kwargs):
        raise RuntimeError(f"bug near {ready.plugin.analyzer.logdir}/cpu")

    monkeypatch.setattr(ready.plugin.analyzer, "runs_view", boom)
    monkeypatch.setattr(ready.plugin.analyzer, "result", boom)
    body = ready.json(route, expect=code, run="cpu")
    assert "RuntimeError" in body["error"]
    assert ready.plugin.analyzer.logdir not in body["error"]  # relative: "bug near cpu"


# ---------------------------------------------------------------------------- analysis children


def test_child_process_results_equal_in_process(tmp_path, logdir):
    procs = Analyzer(str(logdir), rescan_seconds=60, processes=True, max_workers=2)
    threads = Analyzer(str(logdir), rescan_seconds=60, processes=False)
    try:
        assert procs.wait_idle(120) and threads.wait_idle(120)
        for run in ("cpu", "other"):
            assert procs.result(run) == threads.result(run)
        assert procs.children.started <= 2  # children are reused, not one per span
        assert procs.runs_view()["runs"] == threads.runs_view()["runs"]
    finally:
        procs.stop()
        threads.stop()


def test_a_killed_child_is_an_error_then_retried(tmp_path, monkeypatch):
    """A child killed mid-analysis (OOM killer, an operator) makes the span an error
    with a clear message, never a span loading for ever; a later scan retries it."""
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    a = Analyzer(str(root), rescan_seconds=60, processes=True)
    try:
        original = children._Child.__init__
        pids = []

        def spawn_and_kill(self):
            original(self)
            pids.append(self.pid)
            os.kill(self.pid, signal.SIGKILL)  # dies before it could answer

        monkeypatch.setattr(children._Child, "__init__", spawn_and_kill)
        a.start()
        until(lambda: a.runs_view()["runs"] and a.runs_view()["runs"][0]["state"] == "error", what="error")
        span = a.runs_view()["runs"][0]["workers"][0]["spans"][0]
        assert span["retry"] is True
        assert "analysis process was killed by SIGKILL" in span["error"] and "tried again" in span["error"]
        assert span["error"].startswith("cpu/" + CPU_NW0.name)
        monkeypatch.setattr(children._Child, "__init__", original)
        assert a.wait_scan(30)  # the retry
        until(lambda: a.runs_view()["runs"][0]["state"] == "ready", what="the retried span")
        assert a.result("cpu")["state"] == "ready"
        assert pids and all(not _alive(pid) for pid in pids)
    finally:
        a.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes (reaped by its parent later)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_kills_busy_children(tmp_path):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    a = Analyzer(str(root), rescan_seconds=60, processes=True)
    a.start()
    until(lambda: a.children.pids(), what="a child")
    pids = a.children.pids()
    a.stop()
    until(lambda: not any(_alive(p) for p in pids), timeout=10, what="children gone")


# ---------------------------------------------------------------------------- encoded bodies


def test_encoded_bodies_equal_fresh_ones_and_follow_changes(harnesses, tmp_path):
    root = tmp_path / "logs"
    target = root / "cpu" / CPU_NW0.name
    target.parent.mkdir(parents=True)
    target.write_bytes(CPU_NW0.read_bytes())
    h = harnesses(root)
    assert h.plugin.analyzer.wait_idle(60)
    plain = h.json("report", run="cpu")
    zipped = h.client.get(f"{PREFIX}/report", query_string={"run": "cpu"}, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    import gzip as _gzip
    assert json.loads(_gzip.decompress(zipped.get_data())) == plain
    assert h.json("report", run="cpu") == plain  # served again from the encoded copy
    # the file is replaced by another trace: the next answer is the new report
    target.unlink()
    target.write_bytes(CPU_NW2.read_bytes())
    assert h.plugin.analyzer.wait_scan(30) and h.plugin.analyzer.wait_idle(60)
    fresh = h.json("report", run="cpu")
    assert fresh != plain and fresh["trace"]["events"] != plain["trace"]["events"]


def test_children_end_at_interpreter_exit(tmp_path):
    """A process that exits without stopping its Analyzer (no stop(), no shutdown) leaves
    no analysis child behind."""
    import subprocess
    import sys

    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    code = (
        "import sys, time\n"
        "from tb_bottleneck_plugin.serving.engine import Analyzer\n"
        f"a = Analyzer({str(root)!r}, rescan_seconds=60, processes=True)\n"
        "a.start()\n"
        "deadline = time.monotonic() + 60\n"
        "while not a.children.pids() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(' '.join(map(str, a.children.pids())), flush=True)\n"
        "sys.exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    assert pids
    until(lambda: not any(_alive(p) for p in pids), timeout=5, what="children gone after exit")
