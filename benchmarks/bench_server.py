"""Does a large analysis starve the server? Latency of the tab's routes for an
already-analysed run while a large trace is analysed, in a real TensorBoard.

    python3 benchmarks/bench_server.py [--big FILE] [--clients 50] [--seconds 10]

For each mode, a fresh `tensorboard` (localhost, its own disk cache) on a logdir with
two runs: `small` (a real trace, analysed first) and `big` (FILE; by default made once
with ../shared/bench/scale_trace.py from the resnet50 nw0 span, --times 9, ~315 MB of
JSON). As soon as `small` is ready, N client threads request its report, memory and
kernels routes in turn (one connection per request, like a browser without keep-alive)
for at most --seconds and --max-requests in total, while `big` is being analysed.
Modes: `threads` (TB_BOTTLENECKS_ANALYSIS_PROCESSES=0: analysis in TensorBoard's own
process, the old behaviour) and `processes` (the default: a child process).
Prints p50/p99/max latency and requests/s per mode, whether `big` was still loading for
the whole window, and writes JSON (--out).
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


def run_mode(mode: str, big: Path, work: Path, clients: int, seconds: float, max_requests: int) -> dict:
    logdir = work / f"logs-{mode}"
    (logdir / "small").mkdir(parents=True)
    (logdir / "big").mkdir(parents=True)
    (logdir / "small" / SMALL.name).symlink_to(SMALL)
    (logdir / "big" / "worker0.1700000000000.pt.trace.json").symlink_to(big.resolve())
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
        routes = [f"{PREFIX}/report?run=small", f"{PREFIX}/memory?run=small", f"{PREFIX}/kernels?run=small"]
        latencies, errors = [], []
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
                path = routes[n % len(routes)]
                n += 1
                t0 = time.perf_counter()
                try:
                    status, _ = _get(port, path)
                    dt = time.perf_counter() - t0
                    with lock:
                        (latencies if status == 200 else errors).append(dt if status == 200 else status)
                except OSError as exc:
                    with lock:
                        errors.append(type(exc).__name__)

        big_states = []

        def watch_big() -> None:
            while time.monotonic() < stop_at:
                try:
                    status, body = _get(port, f"{PREFIX}/runs", timeout=30)
                    runs = {r["run"]: r["state"] for r in json.loads(body)["runs"]}
                    big_states.append(runs.get("big"))
                except (OSError, ValueError):
                    pass
                time.sleep(0.5)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        watcher = threading.Thread(target=watch_big)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        watcher.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        watcher.join()
        lat = sorted(latencies)

        def pct(p: float) -> float:
            return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else float("nan")

        return {"mode": mode, "clients": clients, "requests": len(lat), "errors": len(errors),
                "seconds": round(wall, 2), "req_per_s": round(len(lat) / wall, 1),
                "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": round(1000 * lat[-1], 1) if lat else None,
                "mean_ms": round(1000 * statistics.mean(lat), 1) if lat else None,
                "big_loading_throughout": bool(big_states) and all(s == "loading" for s in big_states)}
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
    parser.add_argument("--modes", default="threads,processes")
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
            print(f"{mode:>9}: p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']} ms  "
                  f"{r['req_per_s']:6.1f} req/s  ({r['requests']} ok, {r['errors']} errors, "
                  f"big loading throughout: {r['big_loading_throughout']}; load average "
                  f"{r['load_average_1min_after']})", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
