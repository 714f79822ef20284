"""An unreadable cache entry means "analyse again" (issue 20, item 14): a corrupt or lost
``.timeline.npz`` beside a ready span makes the timeline and step-trace routes queue the
span for a new analysis (202 loading, then 200 with the store back) instead of answering
422 until TensorBoard restarts; a span whose analysis left no store says why (422, the
real cause, not a guess about Dask)."""
from __future__ import annotations

import argparse
import json
import time

import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest
from werkzeug import wrappers

from tb_bottleneck_plugin.serving import timeline_store
from tb_bottleneck_plugin.plugin import BottlenecksPlugin

from trace_builder import TraceBuilder

PREFIX = "/data/plugin/bottlenecks"


@pytest.fixture(autouse=True)
def in_process_analysis(monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")


def _logdir(root):
    b = TraceBuilder()
    for n in range(3):
        t0 = 1000 + n * 1000
        b.step(n, t0, 900)
        b.cpu("aten::mm", t0 + 50, 300)
        b.launch("volta_sgemm", t0 + 60, t0 + 100, 400)
    b.write(root / "run" / "worker0.1700000000000.pt.trace.json")
    return root


class H:
    def __init__(self, logdir, cache):
        ns = argparse.Namespace(bottlenecks_cache_dir=str(cache), bottlenecks_rescan_seconds=60.0, logdir_spec="")
        self.plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(logdir), flags=ns))
        self.client = wtest.Client(application.TensorBoardWSGI([self.plugin]), wrappers.Response)

    def get(self, route, **q):
        r = self.client.get(f"{PREFIX}/{route}", query_string=q)
        return r.status_code, r.get_data()

    def until_ready(self, route, timeout=60.0, **q):
        """Polls like the dashboard: the statuses seen, then the 200 body."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, body = self.get(route, **q)
            seen.append(code)
            if code != 202:
                return seen, code, body
            time.sleep(0.05)
        raise AssertionError(f"{route} still loading after {timeout} s: {seen[-5:]}")


def _corrupt(cache, how):
    files = list(cache.glob("*" + timeline_store.SUFFIX))
    assert len(files) == 1, files
    if how == "garbage":
        files[0].write_bytes(b"PK\x03\x04 not really a zip")
    elif how == "truncated":
        files[0].write_bytes(files[0].read_bytes()[:100])
    else:
        files[0].unlink()  # evicted (the disk bound, another TensorBoard sharing the cache)
    return files[0]


@pytest.mark.parametrize("how", ["garbage", "truncated", "evicted"])
@pytest.mark.parametrize("route", ["timeline", "step_trace"])
def test_a_lost_store_is_rebuilt_without_a_restart(tmp_path, how, route):
    logdir, cache = _logdir(tmp_path / "logs"), tmp_path / "cache"
    first = H(logdir, cache)  # writes the report and its store to the cache
    assert first.plugin.analyzer.wait_idle(60)
    first.plugin.analyzer.stop()
    h = H(logdir, cache)  # a restart served from the cache: the store is read from disk on request
    try:
        analyzer = h.plugin.analyzer
        assert analyzer.wait_idle(60) and analyzer.parse_count == 0 and analyzer.cache_hits == 1
        path = _corrupt(cache, how)
        seen, code, body = h.until_ready(route, run="run")
        assert code == 200, (code, body[:300])
        assert seen[0] == 202 and 422 not in seen  # "analysing again", never "not available"
        assert analyzer.parse_count == 1  # analysed once more, not once per request
        assert path.is_file()  # the rebuilt store is on disk again
        if how != "evicted":
            assert analyzer.timelines.discarded == 1
        # the report was not lost on the way
        code, rep = h.get("report", run="run")
        assert code == 200 and json.loads(rep)["input"]["per_step"]
        # and the next request reads the rebuilt store: no third analysis
        assert h.get(route, run="run")[0] == 200 and analyzer.parse_count == 1
    finally:
        h.plugin.analyzer.stop()


def test_a_corrupt_report_entry_is_analysed_again(tmp_path):
    logdir, cache = _logdir(tmp_path / "logs"), tmp_path / "cache"
    first = H(logdir, cache)
    assert first.plugin.analyzer.wait_idle(60)
    first.plugin.analyzer.stop()
    (entry,) = [p for p in cache.glob("*.json")]
    entry.write_text("{\"version\": ")
    h = H(logdir, cache)
    try:
        assert h.plugin.analyzer.wait_idle(60)
        assert h.plugin.analyzer.parse_count == 1 and h.plugin.analyzer.cache_hits == 0
        assert h.get("timeline", run="run")[0] == 200
        assert json.loads(entry.read_text())["result"]["report"]
    finally:
        h.plugin.analyzer.stop()


def test_no_store_says_why_not_dask(tmp_path, monkeypatch):
    """An analysis that left no store (building it failed) answers 422 with that cause,
    and is not re-queued forever."""
    from tb_bottleneck_plugin.analysis import timeline as tl

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(tl, "build_store", broken)
    h = H(_logdir(tmp_path / "logs"), tmp_path / "cache")
    try:
        analyzer = h.plugin.analyzer
        assert analyzer.wait_idle(60)
        for route in ("timeline", "step_trace"):
            code, body = h.get(route, run="run")
            assert code == 422, (code, body[:300])
            err = json.loads(body)["error"]
            assert "Dask" not in err and "building the step timeline failed" in err
        assert analyzer.parse_count == 1
        assert h.get("report", run="run")[0] == 200
    finally:
        h.plugin.analyzer.stop()


def test_missing_store_reasons():
    assert timeline_store.missing_store_reason({"report": {}}) == timeline_store.NO_STORE_RETURNED
    assert timeline_store.missing_store_reason({"timeline_store": None}) == timeline_store.NO_STORE_BUILT
    assert timeline_store.missing_store_reason({"timeline_store": {"version": 1}}) is None
