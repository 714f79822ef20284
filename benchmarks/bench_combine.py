"""Run-level views of many spans: ``report.combine_results`` (worker/run summaries) and
``ranks.rank_view`` (the /ranks route) over 64 ... 1,000 span results.

The span results are copies of one real span result (default: the resnet50 span
../shared/traces/kineto-tb-samples/resnet50_num_workers_0, analysed once with
``report.analyze_trace``), deep-copied (each result its own objects, as the service holds
them) with small perturbations so that the merges have real work: every time of span i
is scaled by (1 + i/10_000) in its partials, kernel table, kernel names and operator view.
No trace is loaded again.

    python benchmarks/bench_combine.py [--spans 64 1000] [--repeat 3] [--memory] [--profile N]

Prints, per size: combine_results time (min/median; and split: the summary alone with
``views=False``, what the service computes first, and ``combine_views``, the Operator view
and kernel names made only when a route asks), the summary's JSON size, the rank view
time at that many ranks (one span per worker), and with ``--memory`` the peak of Python
allocations (tracemalloc) during one combine. ``--profile N`` prints a cProfile of one
combine of N spans. ``--json PATH`` writes the numbers.
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import json
import math
import os
import pickle
import pstats
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tb_bottleneck_plugin.trace import loader  # noqa: E402
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT.parent / "shared/traces/kineto-tb-samples/resnet50_num_workers_0/"
           "worker0.1623143089861.pt.trace.json.gz")
SEED_CACHE = ROOT / "benchmarks/out/combine_seed.pkl"


def seed_result(trace_path: str) -> dict:
    """One real span result (cached in benchmarks/out so repeated runs skip the load)."""
    key = f"{trace_path}:{os.path.getmtime(trace_path)}"
    if SEED_CACHE.exists():
        with open(SEED_CACHE, "rb") as f:
            cached = pickle.load(f)
        if cached.get("key") == key:
            return cached["result"]
    trace = loader.load_trace(trace_path)
    result = report.analyze_trace(trace, run="bench", worker="worker0", span="span0")
    SEED_CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(SEED_CACHE, "wb") as f:
        pickle.dump({"key": key, "result": result}, f)
    return result


def _scale(value, f, timey=False):
    """Floats under a time-like key (at any depth: partials nest them per unit) times f."""
    if isinstance(value, dict):
        return {k: _scale(v, f, timey or _timey(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_scale(v, f, timey) for v in value]
    if isinstance(value, float) and timey:
        return value * f
    return value


def _timey(key) -> bool:
    key = str(key)
    return key.endswith("_us") or key.startswith(("sum:", "rows:")) or key in ("rows",) or "_us" in key


def copies(seed: dict, n: int) -> list:
    """n span results: deep copies of ``seed``, span i's times scaled by 1 + i/10_000."""
    out = []
    for i in range(n):
        r = copy.deepcopy(seed)
        f = 1.0 + i / 10_000
        r["report"]["span"] = f"span{i}"
        r["report"]["worker"] = f"worker{i}"
        r["report"]["spans"] = [f"mem://bench/worker{i}.pt.trace.json"]
        r["kernels"] = _scale(r.get("kernels"), f)
        if isinstance(r.get("kernel_names"), dict):
            r["kernel_names"] = {**r["kernel_names"], "rows": _scale(r["kernel_names"]["rows"], f)}
        view = r.get("operator_view")
        if isinstance(view, dict):
            view["rows"] = {k: ([x * f if isinstance(x, float) else x for x in v] if k.endswith("_us") else v)
                            for k, v in view["rows"].items()}
        # partials from the renamed report (they tag per-step rows with worker/span), then scaled
        r["partials"] = _scale(report.span_partials(r["report"]), f)
        out.append(r)
    return out


CPU_TIMES: dict = {}  # the process CPU seconds of the last timed() call's runs (less load-dependent)


def timed(fn, repeat: int):
    times, cpu = [], []
    value = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        value = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU_TIMES["last"] = cpu
    return value, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--spans", type=int, nargs="+", default=[64, 1000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also the tracemalloc peak of one combine")
    ap.add_argument("--profile", type=int, default=0, help="cProfile one combine of N spans")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    seed = seed_result(args.trace)
    print(f"seed: {Path(args.trace).name}: result {len(json.dumps(seed, default=str)) / 1e6:.2f} MB of JSON; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    if args.profile:
        results = copies(seed, args.profile)
        prof = cProfile.Profile()
        prof.enable()
        report.combine_results(results, run="bench")
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return 0
    for n in args.spans:
        results = copies(seed, n)
        combined, times = timed(lambda: report.combine_results(results, run="bench"), args.repeat)
        cpu = CPU_TIMES["last"]
        # what the service computes for a summary (the report, memory, kernels routes) and,
        # only when the operators route or compare asks, the run-level views (a checkout
        # before 0e1215d has no views=False: the full combine is all it has)
        stimes = vtimes = scpu = vcpu = [math.nan]
        if hasattr(report, "combine_views"):
            _, stimes = timed(lambda: report.combine_results(results, run="bench", views=False), args.repeat)
            scpu = CPU_TIMES["last"]
            _, vtimes = timed(lambda: report.combine_views(results), args.repeat)
            vcpu = CPU_TIMES["last"]
        summary_kb = len(json.dumps(combined["report"])) / 1024
        by_worker = {f"worker{i}": [r] for i, r in enumerate(results)}
        view, rtimes = timed(lambda: ranks.rank_view(by_worker), args.repeat)
        row = {"spans": n, "combine_s_min": min(times), "combine_s_median": statistics.median(times),
               "combine_cpu_s_min": min(cpu), "summary_only_s_min": min(stimes), "views_s_min": min(vtimes),
               "summary_only_cpu_s_min": min(scpu), "views_cpu_s_min": min(vcpu),
               "summary_kb": round(summary_kb, 1), "rank_view_s_min": min(rtimes),
               "rank_view_s_median": statistics.median(rtimes), "load_avg": os.getloadavg()[0]}
        if args.memory:
            tracemalloc.start()
            report.combine_results(results, run="bench")
            row["combine_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        rows.append(row)
        print(f"{n:5d} spans: combine_results min {row['combine_s_min']:.3f} s, median {row['combine_s_median']:.3f} s, "
              f"CPU min {row['combine_cpu_s_min']:.3f} s (summary alone, views=False: {row['summary_only_s_min']:.3f} s, "
              f"CPU {row['summary_only_cpu_s_min']:.3f} s; combine_views: {row['views_s_min']:.3f} s, "
              f"CPU {row['views_cpu_s_min']:.3f} s); summary {summary_kb:.0f} KB; "
              f"rank_view min {row['rank_view_s_min']:.3f} s"
              + (f"; combine peak (tracemalloc) {row['combine_peak_mb']:.1f} MB" if args.memory else "")
              + f"; load average {row['load_avg']:.1f}", flush=True)
        del results, by_worker
    if args.json:
        Path(args.json).write_text(json.dumps({"trace": args.trace, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
