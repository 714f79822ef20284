"""Every route of the Bottlenecks plugin, through TensorBoard's own WSGI routing
(`application.TensorBoardWSGI`) and werkzeug's test client, in the style of
tensorboard/examples/plugins/example_raw_scalars/test.py.

Logdirs are built in tmp_path from symlinks to the small real CPU traces in
../shared/traces (never copied into the repository).
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest
from werkzeug import wrappers

from tb_bottleneck_plugin.trace import discovery
from tb_bottleneck_plugin import plugin as plugin_module, report
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.plugin import BottlenecksPlugin
from tb_bottleneck_plugin.serving.engine import Analyzer

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
CPU_NW0 = TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json"
CPU_NW2 = TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz"
AMD = TRACES / "hta" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
PREFIX = "/data/plugin/bottlenecks"

pytestmark = pytest.mark.skipif(not CPU_NW0.exists(), reason="../shared/traces is not available")


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def in_process_analysis(monkeypatch):
    """Route tests analyse in this process's threads (a child interpreter per plugin
    costs seconds); the child-process mode has its own tests (test_service_processes.py)."""
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")


def link(dst: Path, src: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return dst


@pytest.fixture
def logdir(tmp_path) -> Path:
    """cpu: worker0 with two spans (nw0 .json + nw2 .json.gz); amd: a renamed Kineto
    trace (worker = file stem); broken: a truncated gzip and a JSON that is no trace."""
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    link(root / "cpu" / CPU_NW2.name, CPU_NW2)
    link(root / "amd" / AMD.name, AMD)
    broken = root / "broken"
    broken.mkdir(parents=True)
    data = CPU_NW2.read_bytes()
    (broken / "worker0.1700000000001.pt.trace.json.gz").write_bytes(data[: len(data) // 2])
    (broken / "worker1.1700000000002.pt.trace.json").write_text('{"foo": 1}')
    return root


class Harness:
    def __init__(self, plugin: BottlenecksPlugin):
        self.plugin = plugin
        self.app = application.TensorBoardWSGI([plugin])
        self.client = wtest.Client(self.app, wrappers.Response)

    def get(self, route: str, **query):
        return self.client.get(f"{PREFIX}/{route}", query_string=query or None)

    def json(self, route: str, expect: int = 200, **query):
        resp = self.get(route, **query)
        assert resp.status_code == expect, (resp.status_code, resp.get_data()[:500])
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        return json.loads(resp.get_data())


def make_plugin(logdir, analyze_span=None, **flags) -> BottlenecksPlugin:
    ns = argparse.Namespace(bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=60.0, logdir_spec="")
    for key, value in flags.items():
        setattr(ns, key, value)
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(logdir) if logdir else "", flags=ns))
    if analyze_span is not None and plugin.analyzer is not None:
        plugin.analyzer.stop()
        plugin.analyzer = Analyzer(str(logdir), analyze_span=analyze_span, rescan_seconds=60.0)
    return plugin


@pytest.fixture
def harnesses():
    made = []

    def make(logdir, analyze_span=None, **flags) -> Harness:
        h = Harness(make_plugin(logdir, analyze_span, **flags))
        made.append(h)
        return h

    yield make
    for h in made:
        if h.plugin.analyzer is not None:
            h.plugin.analyzer.stop()


@pytest.fixture
def ready(harnesses, logdir) -> Harness:
    h = harnesses(logdir)
    assert h.plugin.analyzer.wait_idle(30)
    return h


def roundtrip(value):
    return json.loads(json.dumps(value))


def relative(value, logdir: Path):
    """What the browser gets: every path relative to the logdir (JSON text replace)."""
    return json.loads(json.dumps(value).replace(json.dumps(str(logdir) + "/")[1:-1], ""))


def expected_results(logdir: Path):
    """{(run, worker, span): analyze_span result} computed directly, not via the plugin,
    with paths relative to the logdir as the routes send them."""
    found = discovery.scan_logdir(str(logdir))
    out = {}
    for run, worker, span in found.spans():
        try:
            out[(run.name, worker.name, span.name)] = relative(report.analyze_span(found.url, run, span), logdir)
        except Exception as exc:  # the broken run
            out[(run.name, worker.name, span.name)] = exc
    return found, out


# ---------------------------------------------------------------------------- static files


def test_metadata_and_listing(ready):
    meta = ready.plugin.frontend_metadata()
    assert meta.es_module_path == "/index.js" and meta.tab_name == "Bottlenecks"
    assert meta.es_module_path in ready.plugin.get_plugin_apps()
    listing = json.loads(ready.client.get("/data/plugins_listing").get_data())
    entry = listing["bottlenecks"]
    assert entry["enabled"] is True and entry["tab_name"] == "Bottlenecks"
    assert entry["loading_mechanism"] == {"type": "IFRAME", "module_path": f"{PREFIX}/index.js"}


def test_index_and_static_files(ready):
    folder = plugin_module._frontend_dir()
    assert folder is not None and (folder / "index.js").is_file()
    resp = ready.get("index.js")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].split(";")[0] == "text/javascript"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.get_data() == (folder / "index.js").read_bytes()
    assert b"render" in resp.get_data()  # the ES module exports render()
    files = sorted(p for p in folder.iterdir() if p.suffix in (".js", ".css"))
    assert any(p.suffix == ".css" for p in files)
    for path in files:
        resp = ready.get(f"static/{path.name}")
        assert resp.status_code == 200, path.name
        want = "text/javascript" if path.suffix == ".js" else "text/css"
        assert resp.headers["Content-Type"].split(";")[0] == want
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.get_data() == path.read_bytes()


TRAVERSALS = [
    "static/../plugin.py",
    "static/../../setup.py",
    "static/..%2fplugin.py",
    "static/..%2f..%2fsetup.py",
    "static/%2e%2e/plugin.py",
    "static/%2e%2e%2f%2e%2e%2fsetup.py",
    "static/.%2e/.%2e/setup.py",
    "static//etc/passwd",
    "static/%2Fetc%2Fpasswd",
    "static//work/main/setup.py",
    "static/..\\plugin.py",
    "static/..%5c..%5csetup.py",
    "static/C:%5cWindows%5cwin.ini",
    "static/.hidden.js",
    "static/index.js%00.css",
    "static/sub/index.js",
    "static/x/static/index.js",
    "static/plugin.py",
    "static/nonexistent.js",
    "static/" + "../" * 8 + "etc/passwd",
]


@pytest.mark.parametrize("route", TRAVERSALS)
def test_static_traversal_is_refused(ready, route):
    resp = ready.client.get(f"{PREFIX}/{route}")
    assert resp.status_code == 404
    body = resp.get_data()
    for leak in (b"import ", b"def ", b"root:", b"setup(", b"[fonts]"):
        assert leak not in body
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


# ---------------------------------------------------------------------------- runs


def test_runs_lists_runs_with_states(ready, logdir):
    view = ready.json("runs")
    assert view["logdir"] == str(logdir)
    assert view["scan"]["state"] == "ok" and view["scan"]["error"] is None and view["scan"]["scanned_at"]
    runs = {r["run"]: r for r in view["runs"]}
    assert list(runs) == ["amd", "broken", "cpu"]
    cpu = runs["cpu"]
    assert cpu["state"] == "ready" and cpu["progress"] == 1.0 and cpu["error"] is None
    assert [w["worker"] for w in cpu["workers"]] == ["worker0"]
    spans = cpu["workers"][0]["spans"]
    assert [s["span"] for s in spans] == ["1795274786665165565", "1795274789574029385"]
    assert [s["timestamp"] for s in spans] == [1795274786665165565, 1795274789574029385]
    assert all(s["state"] == "ready" for s in spans)
    assert [s["file"] for s in spans] == ["cpu/" + CPU_NW0.name, "cpu/" + CPU_NW2.name]  # relative
    assert str(logdir) not in json.dumps(view["runs"])
    amd = runs["amd"]
    assert amd["workers"][0]["worker"] == "mi250_minitoy_train_ROCm6_2_kineto"
    assert amd["workers"][0]["spans"][0]["span"] == AMD.name
    broken = runs["broken"]
    assert broken["state"] == "error"
    assert "worker0.1700000000001.pt.trace.json.gz" in broken["error"]
    states = {s["file"].rsplit("/", 1)[1]: s for w in broken["workers"] for s in w["spans"]}
    assert states["worker0.1700000000001.pt.trace.json.gz"]["retry"] is True  # truncated: retried
    assert states["worker1.1700000000002.pt.trace.json"]["retry"] is False  # not a trace: final


def test_runs_rescan_parameter_triggers_a_background_scan(ready, logdir):
    before = ready.plugin.analyzer.scan_count
    link(logdir / "late" / CPU_NW0.name, CPU_NW0)
    assert ready.json("runs", rescan="1")["runs"]  # answers at once from the current state
    deadline = time.monotonic() + 10
    while ready.plugin.analyzer.scan_count == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.plugin.analyzer.wait_idle(30)
    assert "late" in [r["run"] for r in ready.json("runs")["runs"]]


# ---------------------------------------------------------------------------- report


def test_report_per_span_equals_analyze_span(ready, logdir):
    _, expected = expected_results(logdir)
    checked = 0
    for (run, worker, span), result in expected.items():
        if isinstance(result, Exception):
            continue
        body = ready.json("report", run=run, worker=worker, span=span)
        assert body == roundtrip(result["report"]), (run, worker, span)
        assert body["run"] == run and body["worker"] == worker and body["span"] == span
        checked += 1
    assert checked == 3


def test_worker_and_run_summaries(ready, logdir):
    found, expected = expected_results(logdir)
    spans = [expected[("cpu", "worker0", s.name)] for s in found.runs[2].workers[0].spans]
    want = roundtrip(report.combine_results(spans, run="cpu", worker="worker0")["report"])
    assert ready.json("report", run="cpu", worker="worker0") == want
    assert ready.json("report", run="cpu", worker="worker0", span="all") == want
    run_summary = ready.json("report", run="cpu")
    assert run_summary["steps"] == want["steps"] and run_summary["breakdown_pct"] == want["breakdown_pct"]
    assert run_summary["worker"] is None and run_summary["span"] is None
    assert len(run_summary["spans"]) == 2
    # a span name without worker selects that span
    one = ready.json("report", run="cpu", span="1795274786665165565")
    assert one == roundtrip(expected[("cpu", "worker0", "1795274786665165565")]["report"])


def test_memory_and_kernels_routes(ready, logdir):
    _, expected = expected_results(logdir)
    for (run, worker, span), result in expected.items():
        if isinstance(result, Exception):
            continue
        memory = ready.json("memory", run=run, worker=worker, span=span)
        assert memory == roundtrip(result["memory"])
        assert "devices" in memory
        kernels = ready.json("kernels", run=run, worker=worker, span=span)
        assert kernels == {"kernels": roundtrip(result["kernels"])}
    # CPU traces: no GPU memory curve but a reason; the AMD trace has kernels
    amd = expected[("amd", "mi250_minitoy_train_ROCm6_2_kineto", AMD.name)]
    assert amd["kernels"], "the AMD trace has kernels"
    summary = ready.json("kernels", run="cpu")
    assert isinstance(summary["kernels"], list)
    assert "devices" in ready.json("memory", run="cpu", worker="worker0")


@pytest.mark.parametrize("route", ["report", "memory", "kernels"])
@pytest.mark.parametrize("query", [
    {"run": "nope"},
    {"run": "cpu", "worker": "nope"},
    {"run": "cpu", "worker": "worker0", "span": "123"},
    {"run": "../../etc"},
    {"run": "/etc/passwd"},
    {"run": "cpu/../amd"},
    {"run": "cpu", "worker": "../worker0"},
    {"run": "cpu", "worker": "worker0", "span": "../../../setup.py"},
    {"run": "cpu", "worker": "worker0", "span": CPU_NW0.name},
    {"run": str(Path("/work/shared/traces/generated-cpu-torch2.13/nw0"))},
])
def test_unknown_or_path_like_names_are_404(ready, route, query):
    body = ready.json(route, expect=404, **query)
    assert set(body) == {"error"} and "unknown" in body["error"]
    assert "not among the runs found" in body["error"]


@pytest.mark.parametrize("route", ["report", "memory", "kernels"])
def test_missing_run_is_400(ready, route):
    body = ready.json(route, expect=400)
    assert body == {"error": "missing query parameter 'run'"}
    assert ready.json(route, expect=400, worker="worker0")["error"]


def test_broken_traces_are_422_and_other_runs_stay_fine(ready, logdir):
    truncated = ready.json("report", expect=422, run="broken", worker="worker0")
    assert truncated["state"] == "error"
    assert "worker0.1700000000001.pt.trace.json.gz" in truncated["error"]
    assert "gzip stream ends early" in truncated["error"]
    not_a_trace = ready.json("report", expect=422, run="broken", worker="worker1")
    assert "worker1.1700000000002.pt.trace.json" in not_a_trace["error"]
    assert "not a PyTorch profiler trace" in not_a_trace["error"]
    both = ready.json("report", expect=422, run="broken")
    assert [e["file"] for e in both["errors"]] == ["broken/worker0.1700000000001.pt.trace.json.gz",
                                                   "broken/worker1.1700000000002.pt.trace.json"]
    assert str(logdir) not in json.dumps(both)  # no server path in the messages either
    assert ready.json("memory", expect=422, run="broken", worker="worker0")["state"] == "error"
    assert ready.json("kernels", expect=422, run="broken", worker="worker1")["state"] == "error"
    # the others are unaffected
    assert ready.json("report", run="cpu")["run"] == "cpu"
    assert ready.json("report", run="amd")["run"] == "amd"


def test_report_for_a_run_with_one_broken_span_lists_file_errors(harnesses, logdir):
    data = CPU_NW0.read_bytes()
    (logdir / "cpu" / "worker0.1795274799999999999.pt.trace.json").write_bytes(data[: len(data) // 3])
    h = harnesses(logdir)
    assert h.plugin.analyzer.wait_idle(30)
    body = h.json("report", run="cpu", worker="worker0")
    assert len(body["spans"]) == 2  # the two good spans
    assert [e["file"].rsplit("/", 1)[1] for e in body["file_errors"]] == ["worker0.1795274799999999999.pt.trace.json"]
    assert "JSON ends early" in body["file_errors"][0]["error"]


# ---------------------------------------------------------------------------- loading


class BlockingAnalyze:
    """analyze_span stand-in: reports progress 0.5, then waits for `release`."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls = []
        self._lock = threading.Lock()

    def __call__(self, logdir_url, run, span, progress=None):
        with self._lock:
            self.calls.append(span.url)
        if progress is not None:
            progress(0.5)
        self.started.set()
        assert self.release.wait(30), "test never released the stub"
        return report.analyze_span(logdir_url, run, span, progress=progress)


def test_report_is_202_with_progress_while_loading(harnesses, tmp_path):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    stub = BlockingAnalyze()
    h = harnesses(root, analyze_span=stub)
    h.json("runs")  # starts the analyzer
    assert stub.started.wait(10)
    for route in ("report", "memory", "kernels"):
        body = h.json(route, expect=202, run="cpu")
        assert body == {"state": "loading", "progress": 0.5}
    view = h.json("runs")
    assert view["runs"][0]["state"] == "loading" and view["runs"][0]["progress"] == 0.5
    assert view["runs"][0]["workers"][0]["spans"][0]["state"] == "loading"
    stub.release.set()
    assert h.plugin.analyzer.wait_idle(30)
    assert h.json("report", run="cpu")["run"] == "cpu"
    assert len(stub.calls) == 1


# ---------------------------------------------------------------------------- is_active


def test_is_active_is_instant_and_never_touches_storage(harnesses, logdir, tmp_path, monkeypatch):
    calls = []
    real_scan = discovery.scan_logdir
    main = threading.get_ident()

    listing_may_finish = threading.Event()

    def slow_scan(path, **kwargs):
        calls.append(threading.get_ident())
        assert listing_may_finish.wait(10)  # a slow bucket
        return real_scan(path, **kwargs)

    monkeypatch.setattr(discovery, "scan_logdir", slow_scan)
    storage_calls = []
    from tb_bottleneck_plugin.trace import storage

    real_get_fs = storage.get_fs

    def spy_get_fs(*args, **kwargs):
        storage_calls.append(threading.get_ident())
        return real_get_fs(*args, **kwargs)

    monkeypatch.setattr(storage, "get_fs", spy_get_fs)
    h = harnesses(logdir)
    # The listing stays blocked (up to 10 s) until listing_may_finish is set, so any call that
    # returns well under that did not wait for it; single calls may be descheduled for a
    # moment on a busy machine, so "instant" is judged on the median of 51 calls.
    durations = []
    for _ in range(51):
        t0 = time.perf_counter()
        assert h.plugin.is_active() is True  # before the first scan: a logdir counts as active
        durations.append(time.perf_counter() - t0)
    assert max(durations) < 2.0  # nothing waited for the blocked listing
    assert sorted(durations)[25] < 0.02  # and a call is instant
    # before the first listing a run name cannot be checked yet: "loading", not 404
    assert h.json("report", expect=202, run="cpu") == {"state": "loading", "progress": 0.0, "scan": "pending"}
    assert h.json("runs")["scan"]["scanned_at"] is None
    assert main not in calls and main not in storage_calls  # never on the request thread
    listing_may_finish.set()
    assert h.plugin.analyzer.wait_idle(30)
    assert calls and all(c != main for c in calls)
    assert h.plugin.is_active() is True

    empty = tmp_path / "empty"
    empty.mkdir()
    # hold this listing too: an empty folder lists in microseconds, and a scan that ended
    # before the first is_active() would make "not scanned yet" a race (failed once in CI)
    listing_may_finish.clear()
    e = harnesses(empty)
    assert e.plugin.is_active() is True  # not scanned yet
    listing_may_finish.set()
    assert e.plugin.analyzer.wait_idle(30)
    assert e.plugin.is_active() is False
    listing = json.loads(e.client.get("/data/plugins_listing").get_data())
    assert listing["bottlenecks"]["enabled"] is False
    assert main not in storage_calls


def test_is_active_for_a_missing_logdir_shows_the_error(harnesses, tmp_path):
    h = harnesses(tmp_path / "does-not-exist")
    assert h.plugin.analyzer.wait_idle(30)
    view = h.json("runs")
    assert view["scan"]["state"] == "error" and "does-not-exist" in view["scan"]["error"]
    assert h.plugin.is_active() is True  # so that the tab can say what is wrong


@pytest.mark.parametrize("flags", [
    {"logdir_spec": "a:/tmp/a,b:/tmp/b"},
    {"logdir_spec": ""},
])
def test_plugin_without_logdir_answers_with_an_error(harnesses, flags):
    h = harnesses(None, **flags)
    assert h.plugin.analyzer is None
    assert h.plugin.is_active() is False
    view = h.json("runs")
    assert view["runs"] == [] and view["scan"]["state"] == "error"
    message = view["scan"]["error"]
    assert ("--logdir_spec is not supported" in message) == bool(flags["logdir_spec"])
    assert "--logdir" in message
    for route in ("report", "memory", "kernels"):
        body = h.json(route, expect=404, run="a")
        assert body == {"error": message}
    assert h.get("index.js").status_code == 200


def test_plugin_with_no_flags_at_all(tmp_path):
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir="", flags=None))
    assert plugin.is_active() is False
    client = wtest.Client(application.TensorBoardWSGI([plugin]), wrappers.Response)
    assert json.loads(client.get(f"{PREFIX}/runs").get_data())["scan"]["error"]


def test_cache_dir_flag(tmp_path, logdir):
    plugin = make_plugin(logdir, bottlenecks_cache_dir=str(tmp_path / "cache"))
    try:
        assert plugin.analyzer._cache is not None
        assert plugin.analyzer._cache.directory == tmp_path / "cache"
    finally:
        plugin.analyzer.stop()
    plugin = make_plugin(logdir, bottlenecks_cache_dir="NONE")
    try:
        assert plugin.analyzer._cache is None
    finally:
        plugin.analyzer.stop()
    plugin = make_plugin(logdir, bottlenecks_rescan_seconds=2.5)
    try:
        assert plugin.analyzer.rescan_seconds == 2.5
    finally:
        plugin.analyzer.stop()
    assert engine.default_cache_dir().name == "tb_bottleneck_plugin"
