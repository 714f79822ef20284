"""A trace file that vanishes between the scan that listed it and its analysis (log rotation,
a run being deleted or rewritten, a bucket listing that lags): the live Analyzer analyses it
again after a back-off, a bounded number of times, then shows an error naming the file; a
file gone for good leaves the list at the next scan. Real files are renamed or removed
under a live Analyzer; the analysis is the real one (report.analyze_span, or the real
analysis child processes)."""
from __future__ import annotations

import functools
import os
import threading
import time

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.serving import children, engine
from tb_bottleneck_plugin.serving.engine import Analyzer

from conftest import DEMO_LOGS

SRC = sorted((DEMO_LOGS / "input_fixed_nw4").glob("*.pt.trace.json.gz"))


@pytest.fixture
def logdir(tmp_path):
    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    for src in SRC[:2]:
        (run / src.name).write_bytes(src.read_bytes())
    return tmp_path / "logs"


def _span_state(a, name):
    with a._lock:
        return next((st for url, st in a._spans.items() if url.endswith(name)), None)


def _wait(pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _file_views(a):
    return {s["file"]: s for r in a.runs_view()["runs"] for w in r["workers"] for s in w["spans"]}


def _analyzer(logdir, on_first_call, monkeypatch, backoff=0.2):
    """An Analyzer whose in-process analysis calls on_first_call(path) once for the first
    file, right before analysing it (the file vanishes after the scan listed it)."""
    monkeypatch.setattr(engine, "MISSING_FILE_BACKOFF_S", backoff)
    calls = []
    target = sorted((logdir / "run").iterdir())[0]

    def analyze(url, run, span, progress=None):
        calls.append(span.url)
        if span.url.endswith(target.name) and calls.count(span.url) == 1:
            on_first_call(target)
        return report.analyze_span(url, run, span, progress=progress, timeline=True)

    a = Analyzer(str(logdir), analyze_span=analyze, rescan_seconds=3600.0)
    return a, calls, target


def test_a_renamed_file_that_comes_back_is_analysed_on_retry(logdir, monkeypatch):
    """Renamed away before its analysis opens it, back 0.05 s later (a rotation; the first
    retry comes 0.5 s after the failed analysis): ready after one retry, never an error."""
    back = []

    def rotate(path):
        aside = path.with_name(path.name + ".rotating")
        os.rename(path, aside)
        t = threading.Timer(0.05, lambda: (os.rename(aside, path), back.append(True)))
        t.start()

    a, calls, target = _analyzer(logdir, rotate, monkeypatch, backoff=0.5)
    try:
        assert a.wait_idle(120)
        st = _span_state(a, target.name)
        assert back and st.state == "ready" and st.error is None, (st.state, st.error)
        assert st.missing == 1  # one analysis found no file, the retry after the back-off read it
        assert calls.count(str(target)) == 2 and len(calls) == 3
        assert a.result("run")["state"] == "ready"
        assert all(s["state"] == "ready" for s in _file_views(a).values())
    finally:
        a.stop()


def test_a_file_gone_for_good_errors_after_bounded_retries_then_leaves_the_list(logdir, monkeypatch):
    a, calls, target = _analyzer(logdir, os.remove, monkeypatch, backoff=0.05)
    try:
        started = time.monotonic()
        assert a.wait_idle(120)
        st = _span_state(a, target.name)
        # 1 analysis + MISSING_FILE_RETRIES retries, after back-offs of 0.05, 0.1, 0.2 s
        assert calls.count(str(target)) == engine.MISSING_FILE_RETRIES + 1 == 4
        assert time.monotonic() - started >= 0.05 + 0.1 + 0.2
        assert st.state == "error" and st.missing == 4 and not st.retry
        view = _file_views(a)[f"run/{target.name}"]
        assert view["state"] == "error"
        assert view["error"].startswith(f"run/{target.name}: file not found") and "tried 4 times" in view["error"]
        # the other span is fine; the run shows the error of the vanished file, naming it
        assert sum(1 for s in _file_views(a).values() if s["state"] == "ready") == 1
        res = a.result("run")
        assert res["state"] == "ready" and [e["file"] for e in res["errors"]] == [f"run/{target.name}"]
        # the next scan no longer lists the file: the span is dropped, no stale error
        assert a.wait_scan(60) and a.wait_idle(60)
        views = _file_views(a)
        assert list(views) == [f"run/{sorted((logdir / 'run').iterdir())[0].name}"]
        assert views[next(iter(views))]["state"] == "ready"
        assert not a.result("run").get("errors")
        assert calls.count(str(target)) == 4  # not analysed again
    finally:
        a.stop()


def test_a_file_dropped_by_a_scan_during_its_back_off_is_not_retried(logdir, monkeypatch):
    a, calls, target = _analyzer(logdir, os.remove, monkeypatch, backoff=2.0)
    try:
        a.start()
        assert _wait(lambda: getattr(_span_state(a, target.name), "missing", 0) == 1)
        assert _span_state(a, target.name).state == "queued"  # waiting for its retry, no error shown
        assert a.wait_scan(60)  # the scan no longer lists it
        assert a.wait_idle(60)
        time.sleep(2.5)  # past the back-off: the timer finds the span gone
        assert calls.count(str(target)) == 1
        assert list(_file_views(a)) == [f"run/{sorted((logdir / 'run').iterdir())[0].name}"]
    finally:
        a.stop()


def test_a_broken_file_that_is_there_is_not_retried(tmp_path, monkeypatch):
    """Only a missing file is retried: a file that is there but unreadable errors at once."""
    monkeypatch.setattr(engine, "MISSING_FILE_BACKOFF_S", 0.05)
    run = tmp_path / "logs" / "run"
    run.mkdir(parents=True)
    (run / "worker0.1700000000000.pt.trace.json").write_text('{"schemaVersion": 1, "traceEvents": [')
    calls = []

    def analyze(url, run_, span, progress=None):
        calls.append(span.url)
        return report.analyze_span(url, run_, span, progress=progress, timeline=True)

    a = Analyzer(str(tmp_path / "logs"), analyze_span=analyze, rescan_seconds=3600.0)
    try:
        assert a.wait_idle(60)
        st = _span_state(a, "worker0.1700000000000.pt.trace.json")
        assert st.state == "error" and st.missing == 0 and len(calls) == 1
        assert "file not found" not in st.error
    finally:
        a.stop()


@pytest.mark.skipif(not children.processes_supported(), reason="analysis children need POSIX")
def test_vanished_file_with_real_analysis_children(logdir, monkeypatch):
    """The same with the default analysis child processes: the child reports the missing
    file as an error, the parent sees the file is gone and retries it after the back-off."""
    monkeypatch.setattr(engine, "MISSING_FILE_BACKOFF_S", 0.5)
    target = sorted((logdir / "run").iterdir())[0]
    aside = target.with_name(target.name + ".rotating")
    original = children.ChildPool.analyze
    seen = []

    @functools.wraps(original)
    def analyze(self, logdir_, run, span, progress=None):
        seen.append(span.url)
        if span.url == str(target) and seen.count(span.url) == 1:
            os.rename(target, aside)
            try:
                return original(self, logdir_, run, span, progress)
            finally:  # back 0.1 s after the child answered (the retry comes 0.5 s after)
                threading.Timer(0.1, os.rename, args=(aside, target)).start()
        return original(self, logdir_, run, span, progress)

    monkeypatch.setattr(children.ChildPool, "analyze", analyze)
    a = Analyzer(str(logdir), rescan_seconds=3600.0, processes=True)
    try:
        assert a.processes and a.wait_idle(180)
        st = _span_state(a, target.name)
        assert st.state == "ready" and st.missing == 1, (st.state, st.error)
        assert seen.count(str(target)) == 2
    finally:
        a.stop()


def test_a_bucket_object_deleted_after_the_listing_is_retried(gcs, monkeypatch):
    """On gs:// (the fake-gcs-server emulator, through gcsfs): an object listed by the scan
    and deleted before its analysis opens it (a rewrite, or a listing that lags), uploaded
    again 0.05 s later: ready after a retry. Deleted for good: the error names the object,
    and the next scan drops the span."""
    import urllib.parse

    src = SRC[0]
    bucket = gcs.new_bucket()
    name = f"live/run/{src.name}"
    gcs.upload_file(bucket, name, src)
    gcs.upload_file(bucket, f"live/run/{SRC[1].name}", SRC[1])
    obj = f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
    calls, mode = [], {"back": True}

    def analyze(url, run, span, progress=None):
        calls.append(span.url)
        if span.url.endswith(src.name) and calls.count(span.url) == 1:
            gcs._request("DELETE", obj)
            if mode["back"]:
                threading.Timer(0.05, gcs.upload_file, args=(bucket, name, src)).start()
        return report.analyze_span(url, run, span, progress=progress, timeline=True)

    monkeypatch.setattr(engine, "MISSING_FILE_BACKOFF_S", 0.5)
    a = Analyzer(f"gs://{bucket}/live", analyze_span=analyze, rescan_seconds=3600.0)
    try:
        assert a.wait_idle(120)
        st = _span_state(a, src.name)
        assert st.state == "ready" and st.missing == 1, (st.state, st.error)
        assert calls.count(f"gs://{bucket}/{name}") == 2
    finally:
        a.stop()

    # gone for good
    calls.clear()
    mode["back"] = False
    monkeypatch.setattr(engine, "MISSING_FILE_BACKOFF_S", 0.05)
    a = Analyzer(f"gs://{bucket}/live", analyze_span=analyze, rescan_seconds=3600.0)
    try:
        assert a.wait_idle(120)
        view = _file_views(a)[f"run/{src.name}"]
        assert view["state"] == "error" and view["error"].startswith(f"run/{src.name}: file not found"), view
        assert calls.count(f"gs://{bucket}/{name}") == engine.MISSING_FILE_RETRIES + 1
        assert a.wait_scan(60) and a.wait_idle(60)
        assert list(_file_views(a)) == [f"run/{SRC[1].name}"]
    finally:
        a.stop()
