#!/usr/bin/env python3
"""Scaling curve: the whole report on the same trace at 1x, 3x, 10x and 30x.

    python benchmarks/bench_scaling.py [--times 1,3,10,30] [--runs 1] [--json OUT]

Each size is ../shared/bench/scale_trace.py of the resnet50 nw0 span, `--times K --gzip`
(built once and cached under benchmarks/out/, like bench_load.py; 30x is ~975 MB of
JSON). For each size, interleaved, fresh processes (bench_load.run_child): the decode
floor (../shared/bench/decode_floor.py, the reference) and `tb-bottlenecks report FILE
--json` end to end. Printed per size: whole-process time, time per 100 MB of JSON, x
floor, peak RSS of all processes, peak / uncompressed size. Linear time means a flat
s/100 MB column; bounded memory means the peak grows much slower than the file. The
issue-14 bound: the 30x file must finish under 1.5 GB peak.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_load  # noqa: E402
from _common import warm_page_cache, write_results  # noqa: E402

MB = bench_load.MB
LIMIT_30X_MB = 1500.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--times", default="1,3,10,30", help="copies of the source per size (default %(default)s)")
    p.add_argument("--runs", type=int, default=1, help="fresh processes per line and size; best time counts")
    p.add_argument("--lines", default="floor,report", help="bench_load lines to run per size (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", type=Path, metavar="OUT")
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.times.split(",")]
    lines = a.lines.split(",")
    bench_load.DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    traces = {k: bench_load.build_trace(bench_load.DEFAULT_SOURCE, bench_load.DEFAULT_OUT, k, False) for k in sizes}
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average before {bench_load._load(load_before)}", flush=True)
    raw = {k: {m: [] for m in lines} for k in sizes}
    for i in range(a.runs):
        for k in sizes:
            path = traces[k]["path"]
            warm_page_cache(path)
            for mode in lines:
                r = bench_load.run_child(mode, path, bench_load.DEFAULT_OUT, a.timeout)
                if "error" in r:
                    print(f"  {k:>3}x {mode:<7} FAILED: {r['error']}", flush=True)
                    continue
                raw[k][mode].append(r)
                print(f"  {k:>3}x {mode:<7} run {i + 1}: {r['seconds']:7.2f} s, peak {r['tree_rss_bytes'] / MB:6.0f} MB, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    print()
    head = (f"{'size':>5} {'JSON MB':>8} {'line':<7} {'time s':>7} {'s/100MB':>8} {'x floor':>7} {'peak MB':>8} "
            f"{'peak/size':>9}")
    print(head)
    print("-" * len(head))
    for k in sizes:
        size_mb = traces[k]["json_bytes"] / MB
        best = {m: bench_load.summarize(raw[k][m]) for m in lines if raw[k][m]}
        floor = best.get("floor", {}).get("best_s")
        for m, r in best.items():
            row = {"times": k, "json_mb": round(size_mb, 1), "line": m, "best_s": r["best_s"],
                   "runs_s": r["runs_s"], "s_per_100mb": round(100 * r["best_s"] / size_mb, 3),
                   "ratio_to_floor": round(r["best_s"] / floor, 2) if floor else None,
                   "peak_rss_mb": r["peak_rss_mb"], "peak_over_size": round(r["peak_rss_mb"] / size_mb, 2)}
            rows.append(row)
            print(f"{k:>4}x {size_mb:8.1f} {m:<7} {row['best_s']:7.2f} {row['s_per_100mb']:8.3f} "
                  f"{bench_load._fmt(row['ratio_to_floor'], '7.2f')} {row['peak_rss_mb']:8.0f} {row['peak_over_size']:9.2f}")
    targets = []
    big = [r for r in rows if r["line"] == "report" and r["times"] == max(sizes)]
    if big and max(sizes) >= 30:
        v = big[0]["peak_rss_mb"]
        targets.append({"target": f"report on the {max(sizes)}x file under {LIMIT_30X_MB:.0f} MB peak", "value": v,
                        "threshold": LIMIT_30X_MB, "met": v < LIMIT_30X_MB})
    rep = [r for r in rows if r["line"] == "report"]
    if len(rep) >= 2:
        lo, hi = rep[0], rep[-1]
        growth = {"size_x": round(hi["json_mb"] / lo["json_mb"], 1), "time_x": round(hi["best_s"] / lo["best_s"], 1),
                  "peak_x": round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 1)}
        print(f"\n  report from {lo['times']}x to {hi['times']}x: size x{growth['size_x']}, time x{growth['time_x']}, "
              f"peak memory x{growth['peak_x']}")
    else:
        growth = None
    for t in targets:
        print(f"  [{'met   ' if t['met'] else 'MISSED'}] {t['target']}: {t['value']:.0f} MB")
    load_after = os.getloadavg()
    print(f"  load average before {bench_load._load(load_before)}, after {bench_load._load(load_after)}")
    if a.json:
        write_results(a.json, {
            "traces": traces, "runs": a.runs, "load_average_before": load_before, "load_average_after": load_after,
            "rows": rows, "growth": growth, "targets": targets})
    return 0


if __name__ == "__main__":
    sys.exit(main())
