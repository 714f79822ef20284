"""Does a large analysis starve the server? Latency of the tab's routes for an
already-analysed run, beside TensorBoard's own routes under the same load: idle, and
while a large trace is analysed, in a real TensorBoard.

    python3 benchmarks/bench_server.py [--big FILE] [--times 9] [--clients 50] [--seconds 10]

A fresh `tensorboard` (localhost, its own disk cache) on a logdir with the run `small` (a
real trace). As soon as it is analysed, N client threads request the tab's routes
(TAB_ROUTES: runs, report, memory, kernels, operators) and TensorBoard's own
(TB_ROUTES) in turn, one connection per request like a browser without keep-alive, for
at most --seconds and --max-requests: the **idle** phase. Then the run `big` (FILE; by
default made once with ../shared/bench/scale_trace.py from the resnet50 nw0 span,
--times 9 ~315 MB of JSON, --times 60 ~2.1 GB) is added and a rescan asked for, and the
same load runs while it is analysed: the **during** phase. Prints p50/p99 per group, the
ratio of the tab's p99 to TensorBoard's, requests/s, whether `big` was still loading
for the whole window, and writes JSON (--out). Modes: `processes` (the default service:
analysis in a child process) and `threads` (TB_BOTTLENECKS_ANALYSIS_PROCESSES=0).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
SMALL = SHARED / "traces" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
BIG_SOURCE = SHARED / "traces" / "kineto-tb-samples" / "resnet50_num_workers_0" / \
    "worker0.1623143089861.pt.trace.json.gz"
PREFIX = "/data/plugin/bottlenecks"

sys.path.insert(0, str(HERE))
from _common import free_port, http_get as _get, stop_group  # noqa: E402


def make_big(dest: Path, times: int) -> Path:
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    print(f"making {dest} (scale_trace.py --times {times}) ...", flush=True)
    subprocess.run([sys.executable, str(SHARED / "bench" / "scale_trace.py"), "--times", str(times),
                    str(BIG_SOURCE), str(tmp)], check=True)
    os.replace(tmp, dest)
    return dest


# The tab's routes a page load and its panels request for an analysed run, and TensorBoard's
# own routes that every TensorBoard page requests: the same clients ask both, so their
# latencies share the load and the ratio shows what the plugin adds.
TAB_ROUTES = [f"{PREFIX}/runs", f"{PREFIX}/report?run=small", f"{PREFIX}/memory?run=small",
              f"{PREFIX}/kernels?run=small", f"{PREFIX}/operators?run=small"]
TB_ROUTES = ["/data/plugins_listing", "/data/runs", "/data/environment"]


def _percentiles(lat) -> dict:
    lat = sorted(lat)

    def pct(p: float) -> float:
        return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else float("nan")

    return {"requests": len(lat), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": round(1000 * lat[-1], 1) if lat else None,
            "mean_ms": round(1000 * statistics.mean(lat), 1) if lat else None}


def measure(port: int, clients: int, seconds: float, max_requests: int, watch=None) -> dict:
    """N client threads, each asking the tab's and TensorBoard's routes in turn, for at most
    ``seconds`` and ``max_requests``; p50/p99 per group and the ratio of the p99s."""
    routes = [(r, "tab") for r in TAB_ROUTES] + [(r, "tensorboard") for r in TB_ROUTES]
    latencies = {"tab": [], "tensorboard": []}
    errors = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    count = [0]

    def client(i: int) -> None:
        n = i
        while time.monotonic() < stop_at:
            with lock:
                if count[0] >= max_requests:
                    return
                count[0] += 1
            path, group = routes[n % len(routes)]
            n += 1
            t0 = time.perf_counter()
            try:
                status, _ = _get(port, path)
                dt = time.perf_counter() - t0
                with lock:
                    if status == 200:
                        latencies[group].append(dt)
                    else:
                        errors.append((path, status))
            except OSError as exc:
                with lock:
                    errors.append((path, type(exc).__name__))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    watcher = threading.Thread(target=watch) if watch else None
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    if watcher:
        watcher.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if watcher:
        watcher.join()
    tab, tb = _percentiles(latencies["tab"]), _percentiles(latencies["tensorboard"])
    total = tab["requests"] + tb["requests"]
    return {"clients": clients, "seconds": round(wall, 2), "req_per_s": round(total / wall, 1),
            "errors": len(errors), "error_examples": errors[:5], "tab": tab, "tensorboard": tb,
            "p99_ratio_tab_to_tensorboard": round(tab["p99_ms"] / tb["p99_ms"], 2) if tb["p99_ms"] else None}


def run_mode(mode: str, big: Path, work: Path, clients: int, seconds: float, max_requests: int) -> dict:
    """One fresh TensorBoard: ``idle`` (the small run analysed, nothing in flight), then
    ``during`` (the big trace added and being analysed)."""
    logdir = work / f"logs-{mode}"
    (logdir / "small").mkdir(parents=True)
    (logdir / "small" / SMALL.name).symlink_to(SMALL)
    port = free_port()
    env = dict(os.environ, TB_BOTTLENECKS_ANALYSIS_PROCESSES="0" if mode == "threads" else "1")
    log = open(work / f"tensorboard-{mode}.log", "wb")
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
                           "--host", "127.0.0.1", "--bottlenecks_cache_dir", str(work / f"cache-{mode}"),
                           "--bottlenecks_rescan_seconds", "600"],
                          stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, _ = _get(port, f"{PREFIX}/report?run=small", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or tb.poll() is not None:
                raise SystemExit(f"{mode}: the small run never became ready (see {log.name})")
            time.sleep(0.2)
        for path in TAB_ROUTES:  # the run-level views are made on first request: not the load's cost
            _get(port, path, timeout=120)
        idle = measure(port, clients, seconds, max_requests)

        (logdir / "big").mkdir()
        (logdir / "big" / ("worker0.1700000000000.pt.trace.json" + (".gz" if big.suffix == ".gz" else ""))
         ).symlink_to(big.resolve())
        _get(port, f"{PREFIX}/runs?rescan=1", timeout=30)
        big_states = []

        def watch_big() -> None:
            stop_at = time.monotonic() + seconds
            while time.monotonic() < stop_at:
                try:
                    status, body = _get(port, f"{PREFIX}/runs", timeout=30)
                    runs = {r["run"]: r["state"] for r in json.loads(body)["runs"]}
                    big_states.append(runs.get("big"))
                except (OSError, ValueError):
                    pass
                time.sleep(0.5)

        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 30:  # until the scan has queued it
            status, body = _get(port, f"{PREFIX}/runs", timeout=30)
            if any(r["run"] == "big" for r in json.loads(body)["runs"]):
                break
            time.sleep(0.2)
        during = measure(port, clients, seconds, max_requests, watch=watch_big)
        during["big_loading_throughout"] = bool(big_states) and all(s == "loading" for s in big_states)
        return {"mode": mode, "idle": idle, "during": during}
    finally:
        stop_group(tb)
        log.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=Path, default=Path(tempfile.gettempdir()) / "tb_bottlenecks_bench" /
                        "resnet50_x9.pt.trace.json")
    parser.add_argument("--times", type=int, default=9, help="scale_trace.py --times when making --big")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per mode (bounded)")
    parser.add_argument("--max-requests", type=int, default=20000, help="bound on requests per mode")
    parser.add_argument("--modes", default="processes", help="processes (the default service), threads (analysis in TensorBoard's process)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    big = make_big(args.big, args.times)
    print(f"big trace: {big} ({big.stat().st_size / 1e6:.0f} MB); small: {SMALL.name}; "
          f"{args.clients} clients, {args.seconds:.0f} s per mode; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} before")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_server-") as tmp:
        for mode in args.modes.split(","):
            r = run_mode(mode, big, Path(tmp), args.clients, args.seconds, args.max_requests)
            r["load_average_1min_after"] = round(os.getloadavg()[0], 1)
            results.append(r)
            for phase in ("idle", "during"):
                m = r[phase]
                print(f"{mode:>9} {phase:>6}: tab p50 {m['tab']['p50_ms']:7.1f} p99 {m['tab']['p99_ms']:7.1f} ms"
                      f" | TensorBoard p50 {m['tensorboard']['p50_ms']:7.1f} p99 {m['tensorboard']['p99_ms']:7.1f} ms"
                      f" | p99 ratio {m['p99_ratio_tab_to_tensorboard']}  {m['req_per_s']:6.1f} req/s"
                      f" ({m['errors']} errors"
                      + (f"; big loading throughout: {m['big_loading_throughout']}" if phase == "during" else "")
                      + ")", flush=True)
            print(f"{'':>9}  load average {r['load_average_1min_after']} after", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
