"""Analysis on a REAL Dask cluster (distributed.LocalCluster, 2 worker processes).

- A logdir of 16 spans (copies and variants of small shared traces) gives the same
  results through `tb-bottlenecks report --dask` and through the service with
  ``dask_scheduler`` as analysed locally.
- A worker killed mid-task (the task kills its own worker process once, via a marker
  file) is retried by the scheduler on a restarted/other worker: the span is ready.
- An unreachable scheduler: one clear line and exit 2 from the CLI; the tab analyses
  locally and says so in the runs listing.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from tb_bottleneck_plugin import cli, report  # noqa: E402
from tb_bottleneck_plugin.serving.engine import Analyzer  # noqa: E402

from conftest import TRACES  # noqa: E402

SMALL = [
    TRACES / "generated-cpu-torch2.13" / "nw0" / "worker0.1795274786665165565.pt.trace.json",
    TRACES / "generated-cpu-torch2.13" / "nw2_gzip" / "worker0.1795274789574029385.pt.trace.json.gz",
    TRACES / "tracelens" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz",
    TRACES / "hta" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
pytestmark = pytest.mark.skipif(not all(p.exists() for p in SMALL), reason="../shared/traces is not available")


def sixteen_spans(root: Path) -> Path:
    """4 runs x 4 ranks; rank r of run k is SMALL[(k + r) % 4] (so every run mixes eras)."""
    for k in range(4):
        for r in range(4):
            src = SMALL[(k + r) % 4]
            gz = ".gz" if src.name.endswith(".gz") else ""
            dst = root / f"run{k}" / f"rank{r}.{1700000000000 + k * 10 + r}.pt.trace.json{gz}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return root


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                     silence_logs=40)
    try:
        yield c
    finally:
        c.close()


def cli_run(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finished_analysis_tasks(cluster) -> int:
    """How many dask_backend._analyze_task tasks the cluster's scheduler has finished so far
    (its accumulated per-prefix state counts; the module's tests share the cluster)."""
    from dask.utils import key_split

    prefix = cluster.scheduler.task_prefixes.get(key_split("_analyze_task-0"))
    return prefix.state_counts["memory"] if prefix is not None else 0


def analysis_children(process) -> list:
    """Live analysis children (children._child_entry) under ``process``. A child that has
    exited but is not reaped yet (a zombie: torch-tb-profiler's TensorBoard plugin, also
    installed by the test extra, starts loader processes of its own) has no command line
    to read; it is skipped, and the scheduler's task count says where the analysis ran."""
    import psutil

    found = []
    for child in process.children(recursive=True):
        try:
            if "_child_entry" in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_cli_on_dask_equals_local(tmp_path, cluster, capsys):
    root = sixteen_spans(tmp_path / "logs")
    code, local, err = cli_run(capsys, "report", str(root), "--json", "--jobs", "1")
    assert code == 0, err
    code, remote, err = cli_run(capsys, "report", str(root), "--json", "--dask", cluster.scheduler_address)
    assert code == 0, err
    assert json.loads(remote) == json.loads(local)
    assert sum(len(w["spans"]) for r in json.loads(remote)["runs"] for w in r["workers"]) == 16
    # the work really ran on the cluster's worker processes
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False) as client:
        assert client.run(lambda: "tb_bottleneck_plugin.report" in sys.modules) == {
            addr: True for addr in client.nthreads()}


def test_service_on_dask_equals_local(tmp_path, cluster):
    root = sixteen_spans(tmp_path / "logs")
    remote = Analyzer(str(root), rescan_seconds=60, dask_scheduler=cluster.scheduler_address)
    local = Analyzer(str(root), rescan_seconds=60, processes=False)
    try:
        assert remote.wait_idle(120) and local.wait_idle(120)
        assert remote._dask is not None and remote.runs_view()["scan"]["notes"] == []
        assert remote.parse_count == 16
        for k in range(4):
            assert remote.result(f"run{k}") == local.result(f"run{k}")
            for r in range(4):
                assert (remote.result(f"run{k}", f"rank{r}")["state"] == "ready")
        assert remote.runs_view()["runs"] == local.runs_view()["runs"]
        # the timeline of a span analysed on the cluster: the worker sent its store too
        from conftest import route_response

        for k in range(4):
            q = {"run": f"run{k}", "worker": "rank0", "px": "900"}
            there, here = route_response(remote, "timeline", **q), route_response(local, "timeline", **q)
            assert there.status_code == here.status_code == 200 and there.get_json() == here.get_json()
            there, here = route_response(remote, "step_trace", **q), route_response(local, "step_trace", **q)
            assert (there.status_code, there.get_json()) == (here.status_code, here.get_json())
        # slots: the cluster's 2 worker threads + 1 kept for another run; no local children
        assert remote._sched.slots == 3 and remote.children is not None and remote.children.started == 0
    finally:
        remote.stop()
        local.stop()


def test_a_worker_killed_mid_task_is_retried(tmp_path, cluster):
    root = tmp_path / "logs"
    src = SMALL[0]
    (root / "run").mkdir(parents=True)
    shutil.copyfile(src, root / "run" / src.name)
    marker = tmp_path / "killed-once"
    pids = tmp_path / "pids"

    def kill_worker_once(logdir_url, run, span, progress=None):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return report.analyze_span(logdir_url, run, span)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-task

    a = Analyzer(str(root), rescan_seconds=60, dask_scheduler=cluster.scheduler_address,
                 analyze_span=kill_worker_once)
    b = Analyzer(str(root), rescan_seconds=60, processes=False)
    try:
        assert a.wait_idle(120) and b.wait_idle(60)
        assert marker.exists()
        ran_in = pids.read_text().split()
        assert len(ran_in) == 2 and ran_in[0] != ran_in[1]  # killed once, then run by another process
        assert str(os.getpid()) not in ran_in
        assert a.result("run")["state"] == "ready"
        assert a.result("run") == b.result("run")
    finally:
        a.stop()
        b.stop()
    # the cluster recovers its 2 workers (the nanny restarts the killed one)
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)


def test_unreachable_scheduler_cli_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_DASK_TIMEOUT", "2")
    root = sixteen_spans(tmp_path / "logs")
    address = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    code, out, err = cli_run(capsys, "report", str(root), "--dask", address)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"tb-bottlenecks: Dask scheduler {address} is unreachable (")
    assert time.monotonic() - t0 < 30


def test_unreachable_scheduler_tab_falls_back_to_local_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("TB_BOTTLENECKS_DASK_TIMEOUT", "2")
    root = tmp_path / "logs"
    for i, src in enumerate(SMALL[:2]):
        dst = root / "run" / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    address = f"tcp://127.0.0.1:{free_port()}"
    a = Analyzer(str(root), rescan_seconds=60, dask_scheduler=address, processes=False)
    try:
        assert a.wait_idle(60)
        view = a.runs_view()
        assert view["runs"][0]["state"] == "ready"
        [note] = view["scan"]["notes"]
        assert note.startswith(f"Dask scheduler {address} is unreachable (")
        assert note.endswith("analysing on this machine instead")
        assert a._dask is None and a.parse_count == 2
    finally:
        a.stop()


def test_nothing_of_dask_is_imported_without_the_flag(tmp_path):
    """The CLI, the service and the TensorBoard plugin without a Dask address never import dask."""
    root = sixteen_spans(tmp_path / "logs")
    code = (
        "import sys, io, contextlib\n"
        "from tb_bottleneck_plugin import cli, plugin_loader, plugin\n"
        "from tb_bottleneck_plugin.serving.engine import Analyzer\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert cli.main(['report', {str(root)!r}, '--json', '--jobs', '2']) == 0\n"
        f"a = Analyzer({str(root)!r}, rescan_seconds=60)\n"
        "assert a.wait_idle(120)\n"
        "a.stop()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')"
        " or m == 'tb_bottleneck_plugin.serving.dask_backend')\n"
        "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_real_tensorboard_with_the_dask_flag_analyses_on_the_cluster(tmp_path, cluster):
    """`tensorboard --bottlenecks_dask_scheduler ADDRESS`: every span ready, no analysis
    child process under TensorBoard, the report equal to a local analysis."""
    import psutil

    from conftest import start_tensorboard, wait_route

    root = tmp_path / "logs"
    for src in SMALL[:2]:
        dst = root / "run" / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    local = Analyzer(str(root), rescan_seconds=60, processes=False)
    try:
        assert local.wait_idle(60)
        expected = local.result("run", "worker0")
    finally:
        local.stop()
    tasks_before = finished_analysis_tasks(cluster)
    with start_tensorboard(root, ["--bottlenecks_dask_scheduler", cluster.scheduler_address]) as base:
        deadline = time.time() + 120
        while True:
            runs = wait_route(base, "runs")
            spans = [s for r in runs["runs"] for w in r["workers"] for s in w["spans"]]
            if len(spans) == 2 and all(s["state"] == "ready" for s in spans):
                break
            assert time.time() < deadline, runs
            time.sleep(0.3)
        assert runs["scan"]["notes"] == []
        tb = next(p for p in psutil.process_iter(["cmdline"])
                  if "tensorboard.main" in " ".join(p.info["cmdline"] or []) and str(root) in " ".join(p.info["cmdline"]))
        assert analysis_children(tb) == []  # nothing analysed in TensorBoard's machine...
        assert finished_analysis_tasks(cluster) - tasks_before >= 2  # ...but on the cluster
        got = wait_route(base, "report", run="run", worker="worker0")
        assert got["steps"] == expected["report"]["steps"]
        assert got["breakdown_pct"] == expected["report"]["breakdown_pct"]
        assert got["input"] == expected["report"]["input"]
