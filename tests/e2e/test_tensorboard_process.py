"""A REAL `tensorboard` process with the plugin installed through its entry point:
listed in /data/plugins_listing, runs and reports served over HTTP (local and gs://
logdirs), the frontend served as JavaScript, and the entry point import kept light.

Every TensorBoard runs in its own session (process group) and is killed in `finally`
with its children. Each loads every installed plugin but torch-tb-profiler's (conftest.
TENSORBOARD_WITHOUT_TBP: that plugin parses every trace of the logdir in worker processes);
tests/e2e/test_e2e_beside_torch_tb_profiler.py runs ours beside it.
`--bottlenecks_cache_dir` always points into tmp_path: tests never write ~/.cache.
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest

from conftest import TENSORBOARD_WITHOUT_TBP, TRACES  # noqa: E402  (the one definition, tests/conftest.py)
CPU_NW0 = TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json"
CPU_NW2 = TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz"
PREFIX = "/data/plugin/bottlenecks"
START_TIMEOUT = 60.0

pytestmark = pytest.mark.skipif(not CPU_NW0.exists(), reason="../shared/traces is not available")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TB:
    def __init__(self, port: int, process: subprocess.Popen, log: Path):
        self.port, self.process, self.log = port, process, log
        self.start_s: Optional[float] = None
        self.t0 = time.monotonic()

    def get(self, path: str, timeout: float = 10.0) -> Tuple[int, Dict[str, str], bytes]:
        """A raw GET: the path is sent exactly as written (no client-side normalisation)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, path: str, expect: int = 200):
        status, headers, body = self.get(path)
        assert status == expect, (path, status, body[:300])
        return json.loads(body)

    def poll(self, path: str, timeout: float = 60.0) -> dict:
        """GET until it answers 200 (202 while loading)."""
        deadline = time.monotonic() + timeout
        while True:
            status, _, body = self.get(path)
            if status == 200:
                return json.loads(body)
            assert status == 202, (path, status, body[:300])
            assert time.monotonic() < deadline, f"{path} still loading after {timeout} s"
            time.sleep(0.1)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _env(extra: Optional[Dict[str, str]], tmp_path: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")  # belt and braces: nothing in ~/.cache
    env.update(extra or {})
    return env


@contextmanager
def tensorboard(logdir: str, tmp_path: Path, *, cache_dir: Optional[str] = None,
                env: Optional[Dict[str, str]] = None, command=None) -> Iterator[TB]:
    port = _free_port()
    log = tmp_path / f"tensorboard-{port}.log"
    cmd = list(command or TENSORBOARD_WITHOUT_TBP) + [
        "--logdir", logdir, "--port", str(port), "--host", "127.0.0.1"]
    if command is None:
        cmd += ["--bottlenecks_cache_dir", cache_dir or str(tmp_path / "bottlenecks-cache"),
                "--bottlenecks_rescan_seconds", "1"]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=_env(env, tmp_path), cwd=str(tmp_path), start_new_session=True)
    tb = TB(port, process, log)
    tb.t0 = t0
    try:
        deadline = t0 + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise AssertionError(f"tensorboard exited ({process.returncode}):\n{tb.log_text()[-3000:]}")
            try:
                status, _, _ = tb.get("/data/plugins_listing", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"tensorboard did not answer in {START_TIMEOUT} s:\n{tb.log_text()[-3000:]}")
            time.sleep(0.05)
        tb.start_s = time.monotonic() - t0
        yield tb
    finally:
        _kill(process)


def _kill(process: subprocess.Popen) -> None:
    """Stop the TensorBoard we started and its children (its own process group)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)
    try:  # children left in the group (multiprocessing workers of other plugins)
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _logdir(root: Path) -> Path:
    for run, src in (("nw0", CPU_NW0), ("nw2_gzip", CPU_NW2)):
        (root / run).mkdir(parents=True)
        (root / run / src.name).symlink_to(src)
    return root


def _check_listing(tb: TB) -> dict:
    listing = tb.json("/data/plugins_listing")
    assert "bottlenecks" in listing, f"not listed; log:\n{tb.log_text()[-3000:]}"
    entry = listing["bottlenecks"]
    assert entry["tab_name"] == "Bottlenecks" and entry["enabled"] is True
    # es_module_path "/index.js" -> an IFRAME plugin whose module is the index.js route
    assert entry["loading_mechanism"] == {"type": "IFRAME", "module_path": f"{PREFIX}/index.js"}
    assert "Failed to load plugin" not in tb.log_text()
    return entry


# ---------------------------------------------------------------------------- local


def test_real_tensorboard_serves_the_tab(tmp_path):
    logdir = _logdir(tmp_path / "logs")
    cache = tmp_path / "cache"
    with tensorboard(str(logdir), tmp_path, cache_dir=str(cache)) as tb:
        print(f"\nTensorBoard with the plugin answered /data/plugins_listing after {tb.start_s:.2f} s")
        _check_listing(tb)
        view = tb.json(f"{PREFIX}/runs")
        assert view["logdir"] == str(logdir)
        rep = tb.poll(f"{PREFIX}/report?run=nw0")
        print(f"first report ready {time.monotonic() - tb.t0:.2f} s after launching TensorBoard (no cache)")
        assert rep["run"] == "nw0" and rep["worker"] == "worker0" and rep["span"] == "1795274786665165565"
        assert rep["steps"]["count"] > 0
        tb.poll(f"{PREFIX}/report?run=nw2_gzip")
        view = tb.json(f"{PREFIX}/runs")
        assert [r["run"] for r in view["runs"]] == ["nw0", "nw2_gzip"]
        assert all(r["state"] == "ready" for r in view["runs"])
        assert tb.json(f"{PREFIX}/kernels?run=nw0")["kernels"] == []  # CPU-only
        assert "devices" in tb.json(f"{PREFIX}/memory?run=nw0")

        status, headers, body = tb.get(f"{PREFIX}/index.js")
        assert status == 200 and headers["content-type"].split(";")[0] == "text/javascript"
        assert headers["x-content-type-options"] == "nosniff" and b"render" in body
        status, headers, _ = tb.get(f"{PREFIX}/static/style.css")
        assert status == 200 and headers["content-type"].split(";")[0] == "text/css"
        for bad in ("static/../plugin.py", "static/..%2f..%2fsetup.py", "static/%2e%2e/plugin.py",
                    "static//etc/passwd", "static/..%5cplugin.py"):
            status, _, body = tb.get(f"{PREFIX}/{bad}")
            assert status == 404 and b"import" not in body and b"root:" not in body, bad
        assert tb.json(f"{PREFIX}/report?run=../../etc", expect=404)["error"]
        assert tb.json(f"{PREFIX}/report", expect=400)["error"]

        # a live logdir: a new run appears on the next scan (--bottlenecks_rescan_seconds 1)
        (logdir / "late").mkdir()
        (logdir / "late" / CPU_NW2.name).symlink_to(CPU_NW2)
        deadline = time.monotonic() + 20
        while "late" not in [r["run"] for r in tb.json(f"{PREFIX}/runs")["runs"]]:
            assert time.monotonic() < deadline, "the new run was not picked up"
            time.sleep(0.1)
        tb.poll(f"{PREFIX}/report?run=late")
    assert len(list(cache.glob("*.json"))) == 3
    assert not (tmp_path / "xdg-cache" / "tb_bottleneck_plugin").exists()

    # a restart: every report comes from the disk cache, ready at the first answer
    with tensorboard(str(logdir), tmp_path, cache_dir=str(cache)) as tb:
        t0 = time.monotonic()
        deadline = t0 + 20
        while True:
            view = tb.json(f"{PREFIX}/runs")
            if view["scan"]["scanned_at"] is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert all(r["state"] == "ready" for r in view["runs"]) and len(view["runs"]) == 3
        status, _, _ = tb.get(f"{PREFIX}/report?run=nw0")
        print(f"restart with the disk cache: started in {tb.start_s:.2f} s, all runs ready "
              f"{time.monotonic() - t0:.2f} s after the first runs request")
        assert status == 200


# ---------------------------------------------------------------------------- no orphans


def _big_trace(path: Path, times: int) -> Path:
    """CPU_NW0's events repeated ``times`` times: seconds of decode and analysis, built
    in well under a second (a text join, not a re-encode per copy)."""
    obj = json.loads(CPU_NW0.read_text())
    events = json.dumps(obj.pop("traceEvents"))[1:-1]
    head = json.dumps(obj)[1:-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write("{" + head + ', "traceEvents": [')
        for i in range(times):
            f.write(events if i == 0 else "," + events)
        f.write("]}")
    return path


def _proc_table() -> Dict[int, Tuple[int, int, str]]:
    """{pid: (ppid, pgid, state)} from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def _descendants(root: int) -> Dict[int, Tuple[int, int, str]]:
    table = _proc_table()
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, info in table.items():
            if info[0] == parent and pid not in found:
                found[pid] = info
                todo.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(tb_pid: int) -> Dict[int, Tuple[int, int, str]]:
    """The processes this project started under TensorBoard: the analysis children and
    everything below them (the loader's decode pool, its forkserver and resource
    tracker). Other plugins' processes are left out: torch-tb-profiler, when installed,
    starts multiprocessing workers of its own, which outlive a SIGKILLed TensorBoard."""
    out: Dict[int, Tuple[int, int, str]] = {}
    for pid, info in _descendants(tb_pid).items():
        if info[0] == tb_pid and "tb_bottleneck_plugin.serving.children import _child_entry" in _cmdline(pid):
            out[pid] = info
            out.update(_descendants(pid))
    return out


def _describe(pids, infos) -> str:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            cmd = "?"
        out.append(f"{pid} (ppid {infos.get(pid, ('?',))[0]} then {_proc_table().get(pid, ('?',))[0]}): {cmd}")
    return "; ".join(out)


def _living(pids) -> list:
    table = _proc_table()
    return [pid for pid in pids if pid in table and table[pid][2] != "Z"]  # zombies are dead


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_no_child_survives_a_killed_tensorboard(tmp_path):
    """SIGKILL TensorBoard while a large trace is being analysed (with the loader's decode
    pool on too): every process it started (analysis children, their decode workers, the
    multiprocessing helpers) is gone within seconds."""
    logdir = tmp_path / "logs"
    _big_trace(logdir / "big" / "worker0.1700000000000.pt.trace.json", 300)  # ~160 MB: loading for a while
    with tensorboard(str(logdir), tmp_path, env={"TB_BOTTLENECKS_DECODE_PROCESSES": "2"}) as tb:
        tb.get(f"{PREFIX}/runs")
        deadline = time.monotonic() + 60
        children: Dict[int, Tuple[int, int, str]] = {}
        while True:  # mid-analysis: the span is loading and the children are there
            children = _ours(tb.process.pid)
            view = tb.json(f"{PREFIX}/runs")
            loading = view["runs"] and view["runs"][0]["state"] == "loading"
            # the analysis child and its 2 decode workers (forked: the child's only other
            # thread is procguard's watcher, so no fork server)
            if loading and len(children) >= 3:
                break
            assert time.monotonic() < deadline, f"never saw the analysis running: {view} {children}"
            time.sleep(0.05)
        time.sleep(0.3)
        children.update(_ours(tb.process.pid))
        names = ", ".join(f"{pid}: {_cmdline(pid)[-60:]}" for pid in sorted(children))
        t_kill = time.monotonic()
        os.kill(tb.process.pid, signal.SIGKILL)
        tb.process.wait(timeout=10)
        tb_gone_s = time.monotonic() - t_kill
        survivors = _living(children)
        while survivors and time.monotonic() - t_kill < 8:
            time.sleep(0.05)
            survivors = _living(children)
        gone_s = time.monotonic() - t_kill
        print(f"\nSIGKILLed TensorBoard mid-analysis with {len(children)} descendants "
              f"({names}); TensorBoard reaped after {tb_gone_s:.2f} s, all gone after {gone_s:.2f} s")
        assert survivors == [], f"still alive {gone_s:.1f} s after the kill: {_describe(survivors, children)}"


# ---------------------------------------------------------------------------- gs://


def test_real_tensorboard_on_a_gcs_logdir(gcs, tmp_path):
    bucket = gcs.new_bucket("tb")
    gcs.upload_tree(_logdir(tmp_path / "logs"), bucket, "exp")
    env = {"STORAGE_EMULATOR_HOST": gcs.url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    with tensorboard(f"gs://{bucket}/exp", tmp_path, env=env) as tb:
        print(f"\nTensorBoard on gs:// answered after {tb.start_s:.2f} s")
        _check_listing(tb)
        deadline = time.monotonic() + 30
        while True:
            view = tb.json(f"{PREFIX}/runs")
            if view["scan"]["scanned_at"] is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert view["scan"]["state"] == "ok", view["scan"]
        assert view["logdir"] == f"gs://{bucket}/exp"
        assert [r["run"] for r in view["runs"]] == ["nw0", "nw2_gzip"]
        files = [s["file"] for r in view["runs"] for w in r["workers"] for s in w["spans"]]
        assert files == [f"nw0/{CPU_NW0.name}", f"nw2_gzip/{CPU_NW2.name}"]  # relative to the logdir
        rep = tb.poll(f"{PREFIX}/report?run=nw2_gzip&worker=worker0&span=1795274789574029385")
        assert rep["source"] == f"nw2_gzip/{CPU_NW2.name}"


# ---------------------------------------------------------------------------- start-up cost


def _run_python(code: str, tmp_path: Path) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path), env=_env(None, tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_entry_point_import_is_light(tmp_path):
    found = json.loads(_run_python("""
        import json, sys, time
        t0 = time.perf_counter()
        import tb_bottleneck_plugin.plugin_loader as pl
        seconds = time.perf_counter() - t0
        heavy = sorted(m for m in ("numpy", "msgspec", "fsspec", "gcsfs", "aiohttp", "tb_bottleneck_plugin.serving.engine",
                                   "tb_bottleneck_plugin.report", "tb_bottleneck_plugin.trace.loader") if m in sys.modules)
        import argparse
        parser = argparse.ArgumentParser()
        pl.BottlenecksLoader().define_flags(parser)
        flags = parser.parse_args([])
        pl.BottlenecksLoader().fix_flags(flags)
        bad = parser.parse_args(["--bottlenecks_rescan_seconds", "0"])
        try:
            pl.BottlenecksLoader().fix_flags(bad)
            rejected = False
        except Exception as exc:
            rejected = type(exc).__name__ == "FlagsError"
        from importlib import metadata
        eps = [e.value for e in metadata.entry_points(group="tensorboard_plugins") if e.name == "bottlenecks"]
        print(json.dumps({"heavy": heavy, "seconds": seconds, "rejected": rejected, "eps": eps,
                          "defaults": [flags.bottlenecks_cache_dir, flags.bottlenecks_rescan_seconds]}))
    """, tmp_path))
    assert found["heavy"] == []
    assert found["rejected"] is True
    assert found["eps"] == ["tb_bottleneck_plugin.plugin_loader:BottlenecksLoader"]
    assert found["defaults"] == [None, 30.0]
    print(f"\nimport tb_bottleneck_plugin.plugin_loader: {found['seconds'] * 1000:.1f} ms, no heavy module")


def test_tensorboard_start_time_with_and_without_the_plugin(tmp_path):
    """What the plugin adds to TensorBoard's start: its load() (heavy imports, no
    storage access) measured inside a process that already imported TensorBoard's own
    plugins, and the wall-clock start of a real TensorBoard with and without it.

    On a busy machine wall-clock times measure the scheduler as much as the plugin (CI
    once saw load() take 4.1 s of wall clock while 3 busy loops held the 2 cores), so:
    load()'s bound is on the CPU time of the thread that runs it (the work it adds to
    TensorBoard's start, whatever the load), and the two wall-clock experiments (the first
    is_active(), the start pair) are re-run, each up to 3 times on fresh processes, until
    one run meets its bound; every bound is unchanged."""
    measure = """
        import argparse, json, sys, time
        from tensorboard import default
        from tensorboard.plugins import base_plugin
        default.get_static_plugins()  # TensorBoard's own imports first
        from tb_bottleneck_plugin.plugin_loader import BottlenecksLoader
        ctx = base_plugin.TBContext(logdir="gs://not-touched/at-load", flags=argparse.Namespace(
            bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=30.0, logdir_spec=""))
        t0, c0 = time.perf_counter(), time.thread_time()
        plugin = BottlenecksLoader().load(ctx)
        load_s, load_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        t0 = time.perf_counter()
        active = plugin.is_active()
        active_s = time.perf_counter() - t0
        print(json.dumps({"load_s": load_s, "load_cpu_s": load_cpu_s, "active_s": active_s, "active": active,
                          "gcsfs": "gcsfs" in sys.modules}))
    """
    for attempt in range(3):
        cost = json.loads(_run_python(measure, tmp_path))
        print(f"\nplugin load() inside TensorBoard: {cost['load_cpu_s'] * 1000:.0f} ms CPU "
              f"({cost['load_s'] * 1000:.0f} ms wall); first is_active(): {cost['active_s'] * 1000:.1f} ms")
        assert cost["load_cpu_s"] < 2.0 and cost["active"] is True
        if cost["active_s"] < 0.05:
            break
    assert cost["active_s"] < 0.05

    logdir = _logdir(tmp_path / "logs")
    runner = tmp_path / "tb_without_bottlenecks.py"
    runner.write_text(textwrap.dedent("""
        from importlib import metadata
        from absl import app
        from tensorboard import default, main_lib, program
        if __name__ == "__main__":
            main_lib.global_init()
            dynamic = [e.load() for e in metadata.entry_points(group="tensorboard_plugins")
                       if e.name != "bottlenecks" and e.module.split(".")[0] != "torch_tb_profiler"]
            tb = program.TensorBoard(plugins=default.get_static_plugins() + dynamic)
            app.run(tb.main, flags_parser=tb.configure)
    """))
    for attempt in range(3):
        with tensorboard(str(logdir), tmp_path, command=[sys.executable, str(runner)]) as tb:
            without = tb.start_s
            assert "bottlenecks" not in tb.json("/data/plugins_listing")
        with tensorboard(str(logdir), tmp_path) as tb:
            with_plugin = tb.start_s
            _check_listing(tb)
        print(f"TensorBoard start (first /data/plugins_listing answer): without the plugin {without:.2f} s, "
              f"with it {with_plugin:.2f} s")
        if with_plugin < without + 5.0:
            break
    assert with_plugin < without + 5.0  # generous: wall-clock start times are noisy
