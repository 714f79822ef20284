"""The timeline and step_trace routes through TensorBoard's WSGI routing: the stores
the analysis left (no re-parse), 200/202/400/404/422 like the report route, the
default step, zoom, the Chrome-trace download, and the disk cache beside the report."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest
from werkzeug import wrappers

from tb_bottleneck_plugin.plugin import BottlenecksPlugin

from conftest import DEMO_LOGS  # noqa: E402
from test_timeline import HTML_NAME, _step  # the hand-built steps (every interval known)
from trace_builder import TraceBuilder

PREFIX = "/data/plugin/bottlenecks"


@pytest.fixture(autouse=True)
def in_process_analysis(monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")


def _hand_logdir(root):
    b = TraceBuilder()
    _step(b, 1, 0, 1000, 300)
    _step(b, 2, 1000, 800, 100, kernel3=HTML_NAME)
    (root / "hand").mkdir(parents=True)
    (root / "hand" / "worker0.1700000000000.pt.trace.json").write_text(json.dumps(b.to_json()))
    shutil.copytree(DEMO_LOGS / "input_bound_nw0", root / "ib")
    return root


class H:
    def __init__(self, logdir, cache="none"):
        ns = argparse.Namespace(bottlenecks_cache_dir=cache, bottlenecks_rescan_seconds=60.0, logdir_spec="")
        self.plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(logdir), flags=ns))
        self.client = wtest.Client(application.TensorBoardWSGI([self.plugin]), wrappers.Response)

    def get(self, route, expect=200, **q):
        r = self.client.get(f"{PREFIX}/{route}", query_string=q)
        assert r.status_code == expect, (r.status_code, r.get_data()[:400])
        assert r.headers["Content-Type"].startswith("application/json")
        return r, json.loads(r.get_data())


@pytest.fixture
def h(tmp_path):
    made = H(_hand_logdir(tmp_path / "logs"))
    assert made.plugin.analyzer.wait_idle(60)
    yield made
    made.plugin.analyzer.stop()


def test_timeline_route_default_step_zoom_and_errors(h):
    _, body = h.get("timeline", run="hand", px="100000")
    assert body["step"] == 1 and body["step_us"] == 1000 and body["worker"] == "worker0"
    assert body["idle_us"] == {"h2d_copy": 50, "input_wait": 300, "sync": 80, "launch": 10, "other": 450}
    assert body["has_gpu"] is True
    assert [s["step"] for s in body["steps"]] == [1, 2]
    _, z = h.get("timeline", run="hand", step="2", t0="500", t1="600", px="100")
    gpu = [lane for lane in z["lanes"] if lane["kind"] == "gpu"][0]
    assert [z["names"][n] for n in gpu["name"]] == ["conv_k", "short1", HTML_NAME]
    h.get("timeline", 404, run="nope")
    h.get("timeline", 404, run="hand", step="99")
    h.get("timeline", 404, run="hand", worker="x" * 300)
    h.get("timeline", 400)
    h.get("timeline", 400, run="hand", step="two")
    h.get("timeline", 400, run="hand", t0="nan")
    # CPU-only demo run with two spans: the default is the slowest included step of all
    _, ib = h.get("timeline", run="ib")
    assert ib["has_gpu"] is False and ib["step"] == 2
    _, rep = h.get("report", run="ib", span=ib["span"])
    per = {p["step"]: p["input_bound_pct"] for p in rep["input"]["per_step"]}
    assert ib["idle_pct"]["input_wait"] == pytest.approx(per[2], abs=1e-9)
    _, other = h.get("timeline", run="ib", step="7")
    assert other["span"] != ib["span"] and other["step"] == 7


def test_step_trace_download(h):
    r, doc = h.get("step_trace", run="hand", step="2")
    assert r.headers["Content-Disposition"] == 'attachment; filename="hand-worker0-step2.trace.json"'
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all(1000 <= e["ts"] <= e["ts"] + e["dur"] <= 1800 for e in xs)
    assert HTML_NAME in {e["name"] for e in xs}
    r, _ = h.get("step_trace", 404, run="hand", step="5")
    assert "Content-Disposition" not in r.headers
    # the visible window only, named in the file name and otherData
    r, z = h.get("step_trace", run="hand", step="1", t0="500", t1="600")
    assert r.headers["Content-Disposition"] == 'attachment; filename="hand-worker0-step1-500-600us.trace.json"'
    assert z["otherData"]["window_us"] == [500, 600] and not z["otherData"]["truncated"]
    assert {e["name"] for e in z["traceEvents"] if e["ph"] == "X"} >= {"conv_k", "short1", "aten::conv"}
    assert "aten::item" not in {e["name"] for e in z["traceEvents"] if e["ph"] == "X"}
    h.get("step_trace", 400, run="hand", t0="x")


def test_trace_without_steps_export_is_capped_and_named(tmp_path, monkeypatch):
    """A trace without ProfilerStep is one window holding every event: the route says so
    (steps_found, export note) and the export stops at the cap."""
    from tb_bottleneck_plugin.analysis import timeline as tl
    from tb_bottleneck_plugin.views import timeline_window as tw

    monkeypatch.setattr(tw, "EXPORT_MAX_EVENTS", 50)
    b = TraceBuilder()
    for k in range(40):  # 40 x (op, launch call, kernel) = 120 events + idle gaps
        b.cpu("aten::mm", k * 100, 50)
        b.launch(f"k{k}", k * 100 + 5, k * 100 + 20, 30)
    (tmp_path / "logs" / "nostep").mkdir(parents=True)
    (tmp_path / "logs" / "nostep" / "worker0.1700000000000.pt.trace.json").write_text(json.dumps(b.to_json()))
    made = H(tmp_path / "logs")
    try:
        assert made.plugin.analyzer.wait_idle(60)
        _, body = made.get("timeline", run="nostep")
        assert body["steps_found"] is False and body["export"]["truncated"] is True
        assert body["export"]["max_events"] == 50 and body["export"]["events"] > 120
        assert "no ProfilerStep" in body["export"]["note"] and "export cap of 50" in body["export"]["note"]
        r, doc = made.get("step_trace", run="nostep")
        assert r.headers["Content-Disposition"] == 'attachment; filename="nostep-worker0-whole-trace.trace.json"'
        assert len([e for e in doc["traceEvents"] if e["ph"] == "X"]) == 50
        assert doc["otherData"]["truncated"] and doc["otherData"]["events_total"] == body["export"]["events"]
    finally:
        made.plugin.analyzer.stop()


def test_loading_answers_202(tmp_path):
    made = H(_hand_logdir(tmp_path / "logs"))
    try:
        r = made.client.get(f"{PREFIX}/timeline", query_string={"run": "hand"})
        assert r.status_code in (200, 202)
        if r.status_code == 202:
            assert json.loads(r.get_data())["state"] == "loading"
    finally:
        made.plugin.analyzer.stop()


def test_store_on_disk_beside_the_cached_report(tmp_path):
    logdir, cache = _hand_logdir(tmp_path / "logs"), tmp_path / "cache"
    first = H(logdir, cache=str(cache))
    assert first.plugin.analyzer.wait_idle(60)
    _, a = first.get("timeline", run="hand", px="800")
    first.plugin.analyzer.stop()
    assert len(list(cache.glob("*.timeline.npz"))) == 3
    second = H(logdir, cache=str(cache))  # a restart: served from the disk cache, not parsed
    try:
        assert second.plugin.analyzer.wait_idle(60)
        assert second.plugin.analyzer.parse_count == 0 and second.plugin.analyzer.cache_hits == 3
        _, b = second.get("timeline", run="hand", px="800")
        assert a == b and second.plugin.analyzer.timelines.loads == 1
    finally:
        second.plugin.analyzer.stop()
    # a cached report whose store is gone is analysed again (and gets its store back)
    for p in cache.glob("*.timeline.npz"):
        p.unlink()
    third = H(logdir, cache=str(cache))
    try:
        assert third.plugin.analyzer.wait_idle(60)
        assert third.plugin.analyzer.parse_count == 3
        third.get("timeline", run="hand")
    finally:
        third.plugin.analyzer.stop()


def test_store_files_unreadable_old_and_over_budget(tmp_path):
    from tb_bottleneck_plugin.analysis import timeline as tl
    from tb_bottleneck_plugin.views import timeline_window as tw
    from tb_bottleneck_plugin.serving.timeline_store import TimelineStores

    b = TraceBuilder()
    _step(b, 1, 0, 1000, 300)
    store = tl.build_store(b.load(tmp_path))
    key = lambda url, fp: f"{url}-{fp}"  # noqa: E731
    stores = TimelineStores(tmp_path / "c", key, memory_stores=1)
    stores.put("a", "1", store)
    size = (tmp_path / "c" / "a-1.timeline.npz").stat().st_size
    fresh = TimelineStores(tmp_path / "c", key)
    assert tw.window(fresh.get("a", "1"), 1) == tw.window(store, 1) and fresh.loads == 1
    # garbage and an old store version are missing stores, and their files are removed
    (tmp_path / "c" / "g-1.timeline.npz").write_bytes(b"not a zip")
    assert fresh.get("g", "1") is None and not (tmp_path / "c" / "g-1.timeline.npz").exists()
    stores.put("old", "1", dict(store, version=store["version"] + 1))
    assert TimelineStores(tmp_path / "c", key).get("old", "1") is None
    # over the disk budget: the oldest files go, the one just written stays
    small = TimelineStores(tmp_path / "c", key, disk_bytes=int(size * 1.5))
    small.put("b", "1", store)
    assert sorted(p.name for p in (tmp_path / "c").glob("*.timeline.npz")) == ["b-1.timeline.npz"]
    # without a disk, memory keeps every store
    mem = TimelineStores(None, None, memory_stores=1)
    mem.put("x", "1", store)
    mem.put("y", "1", store)
    assert mem.has("x", "1") and mem.get("x", "1") is store


def test_mock_server_replays_the_recorded_timeline(tmp_path):
    """tests/fixtures/frontend_mock_server.py replays the recorded timeline answers (any
    px, a whole-step t0/t1 too), each step of the step selector and the default step's
    export; a zoomed window is not recorded: 404."""
    import urllib.error
    import urllib.request
    from pathlib import Path

    from conftest import load_frontend_mock_server

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    mod = load_frontend_mock_server()
    recorded = json.loads((fixtures / "route_responses.json").read_text())["responses"]
    srv, base = mod.serve_in_thread()

    def get(path):
        try:
            with urllib.request.urlopen(f"{base}{PREFIX}/{path}", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        q = "run=xss&worker=worker0&span=1700000000001"
        want = recorded[f"timeline?{q}"]["body"]
        assert get(f"timeline?{q}&px=777") == (200, want)
        assert HTML_NAME in want["names"]
        assert get(f"timeline?{q}&px=777&t0=0&t1={want['step_us']}") == (200, want)
        assert get(f"timeline?{q}&t0=10&t1=20")[0] == 404
        other = [s["step"] for s in want["steps"] if s["step"] != want["step"]][0]
        status, body = get(f"timeline?{q}&step={other}&px=900")
        assert status == 200 and body["step"] == other == recorded[f"timeline?{q}&step={other}"]["body"]["step"]
        # the panel's download link names the step
        assert get(f"step_trace?{q}&step={want['step']}") == (200, recorded[f"step_trace?{q}&step={want['step']}"]["body"])
        assert get("timeline?run=still_loading&worker=worker0&span=1700000000000")[0] == 202
        assert get("timeline?run=no_such_run")[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()
