"""Many spans at once: a 64-rank logdir (copies of one real trace), end to end.

    python3 benchmarks/bench_many_spans.py [--ranks 64] [--source FILE] [--jobs 1,2]
                                           [--dask-workers 1,2] [--out results.json]

Measures, each in a fresh process (wall time, and the peak of the summed RSS of every
process this benchmark started, sampled every 50 ms with psutil):

- **cli**: ``tb-bottlenecks report LOGDIR --json --jobs N`` (N child processes, the
  scheduler's memory budget left at its default) until it exits;
- **tab**: a real TensorBoard (``--logdir LOGDIR --bottlenecks_analysis_jobs N
  --bottlenecks_cache_dir none``; its built-in plugins and ours, no other installed
  plugin) from its start until the runs route lists every rank as ready (and the time
  from its first answer), polled every 0.2 s;
- **dask**: ``tb-bottlenecks report LOGDIR --json --dask ADDRESS`` against an already
  running ``distributed.LocalCluster(n_workers=W, threads_per_worker=1)`` (its start is
  not timed); only with --dask-workers.

The source defaults to the resnet50 nw0 span (../shared/traces/kineto-tb-samples, 1.2 MB
gzip / 35 MB JSON); the copies are ``run/rank<i>.<ts>.pt.trace.json.gz``. Prints one
line per measurement, the speed-ups against the first N, and writes JSON (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared"
SOURCE = SHARED / "traces" / "kineto-tb-samples" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
PREFIX = "/data/plugin/bottlenecks"

sys.path.insert(0, str(HERE))
from _common import free_port, http_get  # noqa: E402


class PeakRss:
    """Peak of the summed RSS of this process's descendants (psutil), sampled in a thread."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            import psutil
        except ImportError:
            self.peak = None
            return
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def make_logdir(root: Path, source: Path, ranks: int) -> Path:
    suffix = ".gz" if source.name.endswith(".gz") else ""
    (root / "run").mkdir(parents=True, exist_ok=True)
    for i in range(ranks):
        dst = root / "run" / f"rank{i:04d}.{1700000000000 + i}.pt.trace.json{suffix}"
        if not dst.exists():
            shutil.copyfile(source, dst)
    return root


def _cli(logdir: Path, *args: str) -> dict:
    cmd = [sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(logdir), "--json", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    with PeakRss() as peak:
        out = subprocess.run(cmd, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.decode()[-2000:]}")
    body = json.loads(out.stdout)
    spans = sum(len(w["spans"]) for r in body["runs"] for w in r["workers"])
    return {"wall_s": round(wall, 2), "peak_rss_mb": peak.peak and round(peak.peak / 2**20), "spans": spans}


def _runs(port: int):
    return http_get(port, f"{PREFIX}/runs", timeout=10)


# TensorBoard with its built-in plugins and ours only: other installed plugins (entry
# points) stay out. torch-tb-profiler, installed for the tests, would otherwise parse
# every rank of the logdir itself, in one spawned process per file (64 x ~210 MB here).
_TB_ONLY_OURS = (
    "import sys\n"
    "from tensorboard import default, program\n"
    "plugins = [p for p in default.get_plugins() if p.__module__.startswith(('tensorboard.', 'tb_bottleneck_plugin.'))]\n"
    "tb = program.TensorBoard(plugins=plugins)\n"
    "tb.configure(argv=[None] + sys.argv[1:])\n"
    "sys.exit(tb.main())\n")


def _tab(logdir: Path, jobs: int, work: Path, ranks: int, timeout: float, nice=None) -> dict:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    if nice is not None:
        env["TB_BOTTLENECKS_ANALYSIS_NICE"] = str(nice)
    log = open(work / f"tensorboard-jobs{jobs}.log", "wb")
    t0 = time.perf_counter()
    with PeakRss() as peak:
        tb = subprocess.Popen([sys.executable, "-c", _TB_ONLY_OURS, "--logdir", str(logdir), "--port", str(port),
                               "--host", "127.0.0.1", "--bottlenecks_cache_dir", "none",
                               "--bottlenecks_rescan_seconds", "600", "--bottlenecks_analysis_jobs", str(jobs)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        first = None
        try:
            while True:
                if time.perf_counter() - t0 > timeout or tb.poll() is not None:
                    raise SystemExit(f"tab jobs={jobs}: not every rank became ready (see {log.name})")
                try:
                    status, body = _runs(port)
                except OSError:
                    status, body = None, b""
                if status == 200:
                    first = first or time.perf_counter()
                    spans = [s for r in json.loads(body)["runs"] for w in r["workers"] for s in w["spans"]]
                    if len(spans) == ranks and all(s["state"] == "ready" for s in spans):
                        break
                time.sleep(0.2)
            done = time.perf_counter()
        finally:
            tb.terminate()
            try:
                tb.wait(10)
            except subprocess.TimeoutExpired:
                tb.kill()
                tb.wait()
            log.close()
    return {"wall_s": round(done - t0, 2), "from_first_answer_s": round(done - first, 2),
            "peak_rss_mb": peak.peak and round(peak.peak / 2**20), "spans": ranks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--jobs", default="1,2", help="comma-separated process counts (CLI and tab)")
    ap.add_argument("--dask-workers", default="", help="comma-separated LocalCluster sizes, e.g. 1,2")
    ap.add_argument("--skip", default="", help="comma-separated modes to skip: cli, tab")
    ap.add_argument("--work", type=Path, default=None, help="where the logdir is built (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--nice", type=int, default=None,
                    help="the tab's analysis children at this nice level (default: the service's, 10); "
                    "on a machine busy with other work, niced children get a small share of the CPU")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.source.exists():
        print(f"bench_many_spans: {args.source} not found", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-many-spans-"))
    logdir = make_logdir(work / "logs", args.source, args.ranks)
    jobs = [int(j) for j in args.jobs.split(",") if j]
    skip = set(filter(None, args.skip.split(",")))
    results = {"source": str(args.source), "ranks": args.ranks, "cpus": os.cpu_count(), "nice": args.nice,
               "source_bytes": args.source.stat().st_size, "cli": {}, "tab": {}, "dask": {}}

    def show(kind, n, r):
        base = next(iter(results[kind].values()))
        speedup = base["wall_s"] / r["wall_s"] if r["wall_s"] else float("nan")
        extra = f", {r['from_first_answer_s']:.1f} s after the first answer" if "from_first_answer_s" in r else ""
        print(f"{kind:5s} {n:>2}: {r['wall_s']:7.1f} s for {r['spans']} spans{extra} "
              f"({r['wall_s'] / max(1, r['spans']):.2f} s/span, x{speedup:.2f} vs first), "
              f"peak RSS of all processes {r['peak_rss_mb']} MB, load avg {os.getloadavg()[0]:.1f}", flush=True)

    for n in jobs:
        if "cli" not in skip:
            results["cli"][n] = _cli(logdir, "--jobs", str(n))
            show("cli", n, results["cli"][n])
        if "tab" not in skip:
            results["tab"][n] = _tab(logdir, n, work, args.ranks, args.timeout, args.nice)
            show("tab", n, results["tab"][n])
    for w in [int(x) for x in args.dask_workers.split(",") if x]:
        from distributed import LocalCluster

        with LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=40) as cluster:
            _cli(logdir, "--dask", cluster.scheduler_address)  # warm-up: worker imports
            results["dask"][w] = _cli(logdir, "--dask", cluster.scheduler_address)
        show("dask", w, results["dask"][w])
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
