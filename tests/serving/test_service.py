"""engine.Analyzer: live logdirs, the disk cache and scheduling under concurrency.

Logdirs are built in tmp_path from symlinks to (or copies of) the small real CPU traces
in ../shared/traces. analyze_span stand-ins count and optionally block loads.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.serving.engine import Analyzer, DiskCache

from conftest import TRACES, patience  # noqa: E402  (the one definition, tests/conftest.py)
CPU_NW0 = TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json"
CPU_NW2 = TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz"
AMD = TRACES / "hta" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"

pytestmark = pytest.mark.skipif(not CPU_NW0.exists(), reason="../shared/traces is not available")


def link(dst: Path, src: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return dst


def copy(dst: Path, src: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def until(cond: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + patience(timeout)  # a hang guard, scaled to the machine's load
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.02)


class Stub:
    """Counts analyze_span calls per file; blocks files for which `block(url)` is true
    until `release` is set; else delegates to the real report.analyze_span."""

    def __init__(self, block: Optional[Callable[[str], bool]] = None):
        self.block = block or (lambda url: False)
        self.release = threading.Event()
        self.calls: list = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, logdir_url, run, span, progress=None):
        with self._lock:
            self.calls.append(span.url)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.block(span.url):
                if progress is not None:
                    progress(0.25)
                assert self.release.wait(30), "the test never released the stub"
            return report.analyze_span(logdir_url, run, span, progress=progress)
        finally:
            with self._lock:
                self.active -= 1

    def count(self, needle: str) -> int:
        with self._lock:
            return sum(1 for url in self.calls if needle in url)


@pytest.fixture
def analyzers():
    made = []

    def make(logdir, **kwargs) -> Analyzer:
        kwargs.setdefault("rescan_seconds", 60.0)
        a = Analyzer(str(logdir), **kwargs)
        made.append(a)
        return a

    yield make
    for a in made:
        a.stop()


def run_view(a: Analyzer, name: str) -> Optional[dict]:
    return next((r for r in a.runs_view()["runs"] if r["run"] == name), None)


def span_view(a: Analyzer, run: str, filename: str) -> Optional[dict]:
    r = run_view(a, run)
    if r is None:
        return None
    return next((s for w in r["workers"] for s in w["spans"] if s["file"].endswith("/" + filename)), None)


# ---------------------------------------------------------------------------- live logdir


def test_live_logdir(tmp_path, analyzers):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    link(root / "gone" / CPU_NW2.name, CPU_NW2)
    stub = Stub()
    a = analyzers(root, rescan_seconds=0.2, analyze_span=stub)
    assert a.wait_idle(patience(30))
    assert [r["run"] for r in a.runs_view()["runs"]] == ["cpu", "gone"]
    assert a.result("cpu")["report"]["span"] == "1795274786665165565"

    # a new span in an existing run: picked up, the run summary covers both spans
    link(root / "cpu" / CPU_NW2.name, CPU_NW2)
    until(lambda: len(run_view(a, "cpu")["workers"][0]["spans"]) == 2, what="the new span")
    until(lambda: a.result("cpu")["state"] == "ready", what="the run to be ready again")
    summary = a.result("cpu")
    assert len(summary["report"]["spans"]) == 2 and summary["report"]["span"] is None
    assert summary["report"]["steps"]["count"] == sum(
        a.result("cpu", "worker0", s)["report"]["steps"]["count"]
        for s in ("1795274786665165565", "1795274789574029385"))
    # nothing analysed twice: nw0 once (cpu/), nw2 once per place (gone/, cpu/)
    assert stub.count(CPU_NW0.name) == 1 and stub.count(CPU_NW2.name) == 2

    # a new worker
    link(root / "cpu" / "worker1.1795274786665165565.pt.trace.json", CPU_NW0)
    until(lambda: [w["worker"] for w in run_view(a, "cpu")["workers"]] == ["worker0", "worker1"], what="worker1")
    until(lambda: a.result("cpu", "worker1")["state"] == "ready", what="worker1 ready")
    assert len(a.result("cpu")["report"]["spans"]) == 3

    # a temporary file of the profiler is never listed
    (root / "cpu" / "worker2.1795274786665165566.pt.trace.json.tmp").write_bytes(CPU_NW0.read_bytes())
    assert a.wait_scan(patience(10))
    assert [w["worker"] for w in run_view(a, "cpu")["workers"]] == ["worker0", "worker1"]
    assert not any(".tmp" in url for url in stub.calls)

    # a deleted run directory disappears
    shutil.rmtree(root / "gone")
    until(lambda: run_view(a, "gone") is None, what="the deleted run to disappear")
    with pytest.raises(KeyError):
        a.result("gone")
    assert not any("/gone/" in url for url in a._spans)
    # each file was analysed exactly once
    assert sorted(stub.calls) == sorted(set(stub.calls))


def test_truncated_file_is_retried_not_broken_for_ever(tmp_path, analyzers):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    stub = Stub()
    a = analyzers(root, rescan_seconds=0.1, analyze_span=stub)
    assert a.wait_idle(patience(30))
    data = CPU_NW0.read_bytes()
    partial = root / "cpu" / "worker0.1795274799000000000.pt.trace.json"
    partial.write_bytes(data[: len(data) // 2])  # first half: a profiler still writing
    until(lambda: (span_view(a, "cpu", partial.name) or {}).get("state") == "error", what="the truncated error")
    view = span_view(a, "cpu", partial.name)
    assert view["retry"] is True and "ends early" in view["error"] and partial.name in view["error"]
    # the run still serves its good span, with the problem listed
    res = a.result("cpu")
    assert res["state"] == "ready" and [e["file"] for e in res["errors"]] == ["cpu/" + partial.name]
    # unchanged: retried a bounded number of times, not on every scan for ever
    for _ in range(engine.SAME_FILE_RETRIES + 3):
        assert a.wait_scan(patience(10))
    assert a.wait_idle(patience(10))
    assert stub.count(partial.name) == 1 + engine.SAME_FILE_RETRIES
    # the writer finishes: the changed file is analysed again and becomes ready
    partial.write_bytes(data)
    until(lambda: (span_view(a, "cpu", partial.name) or {}).get("state") == "ready", what="the completed file")
    assert span_view(a, "cpu", partial.name)["retry"] is False
    assert a.result("cpu", "worker0", "1795274799000000000")["state"] == "ready"
    assert a.result("cpu")["errors"] == []
    assert stub.count(partial.name) == 2 + engine.SAME_FILE_RETRIES


def test_not_a_trace_is_not_retried(tmp_path, analyzers):
    root = tmp_path / "logs"
    (root / "bad").mkdir(parents=True)
    (root / "bad" / "worker0.1.pt.trace.json").write_text('{"foo": 1}')
    stub = Stub()
    a = analyzers(root, rescan_seconds=0.1, analyze_span=stub)
    assert a.wait_idle(patience(30))
    for _ in range(3):
        assert a.wait_scan(patience(10))
    assert a.wait_idle(patience(10))
    assert stub.count("worker0.1.pt") == 1
    res = a.result("bad")
    assert res["state"] == "error" and "not a PyTorch profiler trace" in res["error"]
    assert res["errors"][0]["retry"] is False


def test_missing_logdir_then_created(tmp_path, analyzers):
    root = tmp_path / "later"
    a = analyzers(root, rescan_seconds=0.1)
    assert a.wait_idle(patience(30))
    view = a.runs_view()
    assert view["scan"]["state"] == "error" and str(root) in view["scan"]["error"] and view["runs"] == []
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    until(lambda: a.runs_view()["scan"]["state"] == "ok" and run_view(a, "cpu") is not None, what="the new logdir")
    assert a.wait_idle(patience(30))
    assert a.result("cpu")["state"] == "ready"


# ---------------------------------------------------------------------------- disk cache


def _cached_logdir(tmp_path) -> Path:
    root = tmp_path / "logs"
    copy(root / "cpu" / CPU_NW0.name, CPU_NW0)
    copy(root / "cpu" / CPU_NW2.name, CPU_NW2)
    copy(root / "amd" / AMD.name, AMD)
    return root


def _results(a: Analyzer) -> dict:
    out = {}
    for r in a.runs_view()["runs"]:
        for w in r["workers"]:
            for s in w["spans"]:
                res = a.result(r["run"], w["worker"], s["span"])
                assert res["state"] == "ready"
                out[s["file"]] = {k: res[k] for k in ("report", "memory", "kernels")}
    return out


def test_disk_cache_survives_a_restart(tmp_path, analyzers):
    root = _cached_logdir(tmp_path)
    cache = tmp_path / "cache"
    first = analyzers(root, cache_dir=cache)
    assert first.wait_idle(patience(30))
    assert first.parse_count == 3 and first.cache_hits == 0
    fresh = _results(first)
    first.stop()
    assert len(list(cache.glob("*.json"))) == 3

    # a NEW Analyzer: everything from the cache, ready from the first listing
    t0 = time.perf_counter()
    second = analyzers(root, cache_dir=cache)
    second.start()
    until(lambda: second.runs_view()["scan"]["scanned_at"] is not None, what="the first scan")
    elapsed = time.perf_counter() - t0
    assert all(r["state"] == "ready" for r in second.runs_view()["runs"])  # no loading phase
    assert second.parse_count == 0 and second.cache_hits == 3
    assert _results(second) == json.loads(json.dumps(fresh))
    assert elapsed < patience(5)  # seconds on a free core, not a loading phase (the states above)
    second.stop()

    # a rewritten file (new size/mtime) invalidates its entry only
    target = root / "cpu" / CPU_NW0.name
    target.write_bytes(CPU_NW0.read_bytes())
    st = target.stat()
    os.utime(target, (st.st_atime, st.st_mtime + 10))
    third = analyzers(root, cache_dir=cache)
    assert third.wait_idle(patience(30))
    assert third.parse_count == 1 and third.cache_hits == 2
    third.stop()


def test_analysis_version_bump_invalidates_the_cache(tmp_path, analyzers, monkeypatch):
    root = _cached_logdir(tmp_path)
    cache = tmp_path / "cache"
    a = analyzers(root, cache_dir=cache)
    assert a.wait_idle(patience(30)) and a.parse_count == 3
    a.stop()
    from tb_bottleneck_plugin.serving import cache as cache_mod

    monkeypatch.setattr(cache_mod, "ANALYSIS_VERSION", cache_mod.ANALYSIS_VERSION + ".test-bump")
    b = analyzers(root, cache_dir=cache)
    assert b.wait_idle(patience(30))
    assert b.parse_count == 3 and b.cache_hits == 0


def test_a_code_change_invalidates_the_cache_without_a_version_bump(tmp_path, analyzers, monkeypatch):
    """Cached results carry numbers, verdict words and advice: results written by other code
    (an upgrade, a local edit) are not served even when ANALYSIS_VERSION stayed the same."""
    from tb_bottleneck_plugin.serving import cache as cache_mod

    root = _cached_logdir(tmp_path)
    cache = tmp_path / "cache"
    a = analyzers(root, cache_dir=cache)
    assert a.wait_idle(patience(30)) and a.parse_count == 3
    a.stop()
    same = analyzers(root, cache_dir=cache)
    assert same.wait_idle(patience(30)) and same.parse_count == 0 and same.cache_hits == 3
    same.stop()
    monkeypatch.setattr(cache_mod, "_code_digest", "other-code")
    b = analyzers(root, cache_dir=cache)
    assert b.wait_idle(patience(30))
    assert b.parse_count == 3 and b.cache_hits == 0


def test_code_digest_follows_the_python_source_only(tmp_path, monkeypatch):
    import shutil

    from tb_bottleneck_plugin.serving import cache as cache_mod

    copy = tmp_path / "pkg"
    shutil.copytree(cache_mod._PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_mod, "_PACKAGE_DIR", copy)

    def digest():
        monkeypatch.setattr(cache_mod, "_code_digest", None)
        return cache_mod.code_digest()

    first = digest()
    assert digest() == first
    (copy / "static" / "cards.js").write_text("// the dashboard renders what routes send\n")
    assert digest() == first
    rec = copy / "judge" / "recommendations.py"
    rec.write_text(rec.read_text().replace("the host does not keep it busy", "the host keeps it idle"))
    assert digest() != first


def entry(blob: str = "", i: int = 0) -> dict:
    """The smallest value with the shape of a span result (DiskCache validates it)."""
    return {"report": {"schema_version": report.SCHEMA_VERSION, "blob": blob, "i": i},
            "memory": {}, "kernels": []}


def test_disk_cache_is_bounded(tmp_path, analyzers):
    cache = DiskCache(tmp_path / "c", max_bytes=2500)
    for i in range(5):
        cache.put(f"k{i}", entry("x" * 1000, i))
        time.sleep(0.01)  # distinct mtimes
    names = sorted(p.stem for p in (tmp_path / "c").glob("*.json"))
    assert names == ["k3", "k4"]
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*.json")) <= 2500
    assert cache.get("k0") is None and cache.get("k4")["report"]["i"] == 4
    # reading an entry makes it recent: it outlives older ones
    time.sleep(0.01)
    cache.get("k3")
    time.sleep(0.01)
    cache.put("k5", entry("x" * 1000, 5))
    assert sorted(p.stem for p in (tmp_path / "c").glob("*.json")) == ["k3", "k5"]
    # one entry larger than the bound is still kept (the newest), the rest evicted
    cache.put("big", entry("x" * 5000))
    assert sorted(p.stem for p in (tmp_path / "c").glob("*.json")) == ["big"]
    assert not list((tmp_path / "c").glob("*.tmp*"))

    # through an Analyzer: a small bound keeps only the newest results
    root = _cached_logdir(tmp_path)
    a = analyzers(root, cache_dir=tmp_path / "small", cache_max_bytes=1)
    assert a.wait_idle(patience(30)) and a.parse_count == 3
    assert len(list((tmp_path / "small").glob("*.json"))) == 1


def test_unwritable_cache_does_not_break_analysis(tmp_path, analyzers):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    a = analyzers(root, cache_dir=blocker / "cache")
    assert a.wait_idle(patience(30))
    assert a.result("cpu")["state"] == "ready"


# ---------------------------------------------------------------------------- concurrency


def test_concurrent_requests_do_not_start_a_second_load(tmp_path, analyzers):
    root = tmp_path / "logs"
    link(root / "cpu" / CPU_NW0.name, CPU_NW0)
    stub = Stub(block=lambda url: True)
    a = analyzers(root, rescan_seconds=0.05, analyze_span=stub)
    a.start()
    until(lambda: len(stub.calls) == 1, what="the load to start")
    answers, errors = [], []

    def hammer():
        try:
            for _ in range(50):
                answers.append(a.result("cpu")["state"])
                a.runs_view()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for _ in range(3):
        assert a.wait_scan(patience(10))  # rescans while loading do not queue it again
    for t in threads:
        t.join()
    assert not errors
    assert set(answers) == {"loading"}
    assert a.result("cpu")["progress"] == 0.25
    assert len(stub.calls) == 1
    stub.release.set()
    assert a.wait_idle(patience(30))
    assert a.result("cpu")["state"] == "ready"
    assert len(stub.calls) == 1 and a.parse_count == 1


def test_a_huge_run_does_not_block_the_others(tmp_path, analyzers):
    root = tmp_path / "logs"
    for i in range(6):  # "huge" sorts first: it would take every worker with FIFO scheduling
        link(root / "huge" / f"worker0.{1700000000000 + i}.pt.trace.json", CPU_NW0)
    link(root / "small" / CPU_NW2.name, CPU_NW2)
    stub = Stub(block=lambda url: "/huge/" in url)
    a = analyzers(root, max_workers=2, rescan_seconds=0.1, analyze_span=stub)
    a.start()
    until(lambda: (run_view(a, "small") or {}).get("state") == "ready", timeout=20, what="the small run")
    assert run_view(a, "huge")["state"] == "loading"
    assert stub.count("/huge/") == 1  # one worker for the huge run, one kept for the others
    # a run that appears while the huge one still loads is analysed at once too
    link(root / "late" / CPU_NW0.name, CPU_NW0)
    until(lambda: (run_view(a, "late") or {}).get("state") == "ready", timeout=20, what="the late run")
    assert run_view(a, "huge")["state"] == "loading"
    stub.release.set()
    assert a.wait_idle(patience(30))
    assert run_view(a, "huge")["state"] == "ready"
    assert stub.count("/huge/") == 6 and len(a.result("huge")["report"]["spans"]) == 6
    assert stub.max_active <= 2


def test_the_run_asked_for_goes_first(tmp_path, analyzers):
    root = tmp_path / "logs"
    link(root / "a" / CPU_NW0.name, CPU_NW0)
    for name in ("b", "c", "d"):
        link(root / name / CPU_NW2.name, CPU_NW2)
    stub = Stub(block=lambda url: "/a/" in url)
    a = analyzers(root, max_workers=1, analyze_span=stub)
    a.start()
    until(lambda: len(stub.calls) == 1, what="the first load")
    assert "/a/" in stub.calls[0]
    assert a.result("d")["state"] == "loading"  # the tab opens run d
    stub.release.set()
    assert a.wait_idle(patience(30))
    order = [url.split("/")[-2] for url in stub.calls]
    assert order == ["a", "d", "b", "c"]


def test_stop_is_safe_while_loading(tmp_path, analyzers):
    root = tmp_path / "logs"
    for i in range(3):
        link(root / f"r{i}" / CPU_NW0.name, CPU_NW0)
    stub = Stub(block=lambda url: True)
    a = analyzers(root, max_workers=2, rescan_seconds=0.05, analyze_span=stub)
    a.start()
    until(lambda: len(stub.calls) == 2, what="two loads")
    a.stop()
    stub.release.set()
    time.sleep(0.3)
    assert len(stub.calls) == 2  # nothing new starts after stop()
    assert a._thread is not None
    a._thread.join(5)
    assert not a._thread.is_alive()
