"""The plugin and the CLI on a gs:// logdir, against a real GCS emulator
(fake-gcs-server, see tests/gcs_emulator.py): the same reports as for the local copy,
storage problems shown as a scan error (never raised), new objects picked up live.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest
from werkzeug import wrappers

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.trace import storage
from tb_bottleneck_plugin.plugin import BottlenecksPlugin
from tb_bottleneck_plugin.serving.engine import Analyzer

from conftest import TRACES, patience  # noqa: E402  (the one definition, tests/conftest.py)
RESNET = TRACES / "kineto-tb-samples" / "resnet50_num_workers_0"
CPU_NW0 = TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json"
CPU_NW2 = TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz"
CONTROL = TRACES / "hta" / "trace_diff" / "control" / "control.json.gz"
PREFIX = "/data/plugin/bottlenecks"

pytestmark = pytest.mark.skipif(not RESNET.exists(), reason="../shared/traces is not available")


def link(dst: Path, src: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)


def build_logdir(root: Path) -> Path:
    for f in sorted(RESNET.glob("*.pt.trace.json.gz")):
        link(root / "resnet50_num_workers_0" / f.name, f)
    link(root / "cpu" / "nw0" / CPU_NW0.name, CPU_NW0)
    link(root / "hta" / "control" / CONTROL.name, CONTROL)  # renamed Kineto trace: found by content
    return root


class Harness:
    def __init__(self, logdir: str):
        flags = argparse.Namespace(bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=60.0, logdir_spec="")
        self.plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=logdir, flags=flags))
        self.client = wtest.Client(application.TensorBoardWSGI([self.plugin]), wrappers.Response)

    def json(self, route: str, expect: int = 200, **query):
        resp = self.client.get(f"{PREFIX}/{route}", query_string=query or None)
        assert resp.status_code == expect, (route, query, resp.status_code, resp.get_data()[:300])
        return json.loads(resp.get_data())

    def stop(self):
        if self.plugin.analyzer is not None:
            self.plugin.analyzer.stop()


def normalise(value, replacements):
    """Replace the logdir URLs/paths in every string (source, spans, file URLs)."""
    if isinstance(value, dict):
        return {k: normalise(v, replacements) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, replacements) for v in value]
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
    return value


@pytest.fixture(scope="module")
def both(gcs_emulator, tmp_path_factory):
    """The same logdir, local and uploaded, each with a plugin analysed to the end."""
    local = build_logdir(tmp_path_factory.mktemp("gcs-plugin") / "logs")
    bucket = gcs_emulator.new_bucket("plugin")
    names = gcs_emulator.upload_tree(local, bucket, "exp/logs")
    assert len(names) == 4
    url = f"gs://{bucket}/exp/logs"
    t0 = time.perf_counter()
    remote = Harness(url)
    remote.plugin.analyzer.start()
    local_h = Harness(str(local))
    local_h.plugin.analyzer.start()
    assert remote.plugin.analyzer.wait_idle(120) and local_h.plugin.analyzer.wait_idle(120)
    timings = {"both_ready_s": round(time.perf_counter() - t0, 2)}
    print(f"\nlocal + gs:// plugins ready in {timings['both_ready_s']} s")
    yield {"local": local, "url": url, "bucket": bucket, "remote": remote, "local_h": local_h,
           # the CLI shows full paths, the tab paths relative to the logdir
           "repl": [(url + "/", ""), (str(local) + "/", ""), (url, "<LOGDIR>"), (str(local), "<LOGDIR>")]}
    remote.stop()
    local_h.stop()


def test_gcs_runs_equal_local(both):
    remote, local = both["remote"].json("runs"), both["local_h"].json("runs")
    assert remote["logdir"] == both["url"] and remote["scan"]["state"] == "ok"
    assert [r["run"] for r in remote["runs"]] == ["cpu/nw0", "hta/control", "resnet50_num_workers_0"]
    assert all(r["state"] == "ready" and r["progress"] == 1.0 for r in remote["runs"])
    files = [s["file"] for r in remote["runs"] for w in r["workers"] for s in w["spans"]]
    # paths relative to the logdir, never the bucket's or the server's location
    assert files == ["cpu/nw0/worker0.1795274786665165565.pt.trace.json", "hta/control/control.json.gz",
                     "resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                     "resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz"]
    # default_run: the run whose newest file was written last, by each storage's own modification
    # times (the bucket's are upload times), so it may differ; it is one of the runs either way
    assert remote["default_run"] in [r["run"] for r in remote["runs"]]
    assert local["default_run"] in [r["run"] for r in local["runs"]]
    strip = lambda view: normalise({k: v for k, v in view.items() if k not in ("logdir", "scan", "default_run")},
                                   both["repl"])
    assert strip(remote) == strip(local)


def test_gcs_reports_equal_local(both):
    view = both["local_h"].json("runs")
    checked = 0
    for run in view["runs"]:
        for worker in run["workers"]:
            for span in worker["spans"]:
                q = {"run": run["run"], "worker": worker["worker"], "span": span["span"]}
                for route in ("report", "memory", "kernels"):
                    got = both["remote"].json(route, **q)
                    want = both["local_h"].json(route, **q)
                    assert normalise(got, both["repl"]) == normalise(want, both["repl"]), (route, q)
                rep = both["remote"].json("report", **q)
                assert rep["source"] == span["file"]
                checked += 1
        # worker and run summaries too
        for q in ({"run": run["run"]}, {"run": run["run"], "worker": run["workers"][0]["worker"]}):
            got, want = both["remote"].json("report", **q), both["local_h"].json("report", **q)
            assert normalise(got, both["repl"]) == normalise(want, both["repl"])
    assert checked == 4
    resnet = both["remote"].json("report", run="resnet50_num_workers_0")
    assert len(resnet["spans"]) == 2 and all(s.startswith("resnet50_num_workers_0/") for s in resnet["spans"])
    control = both["remote"].json("report", run="hta/control", worker="control", span="control.json.gz")
    assert control["trace"]["kernels"] > 0


def test_cli_gcs_equals_local(both, capsys):
    t0 = time.perf_counter()
    assert cli.main(["report", both["url"], "--json"]) == 0
    remote_s = time.perf_counter() - t0
    remote = json.loads(capsys.readouterr().out)
    t0 = time.perf_counter()
    assert cli.main(["report", str(both["local"]), "--json"]) == 0
    local_s = time.perf_counter() - t0
    local = json.loads(capsys.readouterr().out)
    print(f"\ntb-bottlenecks report --json: gs:// {remote_s:.2f} s, local {local_s:.2f} s")
    assert remote["logdir"] == both["url"]
    assert normalise(remote, both["repl"]) == normalise(local, both["repl"])
    assert [r["run"] for r in remote["runs"]] == ["cpu/nw0", "hta/control", "resnet50_num_workers_0"]
    # and the CLI says what the tab says
    span_report = both["remote"].json("report", run="cpu/nw0", worker="worker0", span="1795274786665165565")
    cli_span = remote["runs"][0]["workers"][0]["spans"][0]
    assert normalise(cli_span, both["repl"]) == normalise(span_report, both["repl"])


def _scan_error(harness: Harness) -> dict:
    assert harness.plugin.analyzer.wait_idle(60)
    view = harness.json("runs")
    assert view["runs"] == []
    return view["scan"]


def test_missing_bucket_is_a_scan_error(gcs):
    h = Harness("gs://no-such-bucket-for-the-plugin/logs")
    try:
        scan = _scan_error(h)
        assert scan["state"] == "error"
        assert scan["error"].startswith("gs://no-such-bucket-for-the-plugin/logs:") and "not found" in scan["error"]
        assert h.plugin.is_active() is True  # the tab shows the problem
        assert h.json("report", expect=404, run="x")["error"]
    finally:
        h.stop()


def test_permission_error_is_a_scan_error(gcs, monkeypatch):
    from gcsfs.retry import HttpError

    bucket = gcs.new_bucket()
    url = f"gs://{bucket}/logs"
    fs, _ = storage.get_fs(url)

    def forbidden(*args, **kwargs):
        raise HttpError({"code": 403, "message": "anonymous caller does not have storage.objects.list access"})

    monkeypatch.setattr(fs, "find", forbidden)
    h = Harness(url)
    try:
        scan = _scan_error(h)
        assert scan["state"] == "error" and url in scan["error"] and "permission denied" in scan["error"]
    finally:
        h.stop()


def test_missing_gcsfs_shows_the_install_hint(monkeypatch):
    for name in [m for m in sys.modules if m == "gcsfs" or m.startswith("gcsfs.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError
    h = Harness("gs://bucket/logs")
    try:
        scan = _scan_error(h)
        assert scan["state"] == "error"
        assert 'pip install "tb_bottleneck_plugin[gcs]"' in scan["error"] and "gcsfs" in scan["error"]
    finally:
        h.stop()


def test_new_object_is_picked_up_on_the_next_scan(gcs):
    bucket = gcs.new_bucket()
    gcs.upload_file(bucket, f"live/run/{CPU_NW0.name}", CPU_NW0)
    a = Analyzer(f"gs://{bucket}/live", rescan_seconds=0.2)
    try:
        assert a.wait_idle(patience(60))
        assert [r["run"] for r in a.runs_view()["runs"]] == ["run"]
        gcs.upload_file(bucket, f"live/run/{CPU_NW2.name}", CPU_NW2)  # a second span
        gcs.upload_file(bucket, f"live/other/{CPU_NW2.name}", CPU_NW2)  # a new run
        deadline = time.monotonic() + patience(20)  # a hang guard: under load the analyses take longer
        while time.monotonic() < deadline:
            view = a.runs_view()
            runs = {r["run"]: r for r in view["runs"]}
            spans = [s for r in runs.values() for w in r["workers"] for s in w["spans"]]
            if set(runs) == {"other", "run"} and len(runs["run"]["workers"][0]["spans"]) == 2 \
                    and all(s["state"] in ("ready", "error") for s in spans):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the new objects were not picked up: {a.runs_view()}")
        # every span analysed, none failed: a reused analysis process must not answer a new
        # object with "file not found" from a directory listing it cached for an earlier span
        assert all(s["state"] == "ready" for s in spans), spans
        res = a.result("run")
        assert res["state"] == "ready" and len(res["report"]["spans"]) == 2
        # an overwritten object (new generation) is analysed again
        before = a.parse_count
        gcs.upload_file(bucket, f"live/other/{CPU_NW2.name}", CPU_NW2)
        deadline = time.monotonic() + patience(20)
        while a.parse_count == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.parse_count == before + 1
        assert a.wait_idle(patience(30))
    finally:
        a.stop()
