"""Run-level rank view (metrics §12) at scale: 256 and 1,024 ranks.

The span partials are copies of one real partial (default: rank 0 of the 2-rank NCCL trace
../shared/traces/hta/nccl_parser_config/nccl_data.json.gz) with per-rank jitter: every
step's four parts are scaled by one factor ~ N(1, 0.05) and every collective's duration
by its own ~ N(1, 0.2), and one rank (the last) gets 30 % more compute, so the view has a
straggler to find. No trace file is written: the rank view reads only the partials (and the
straggler's report), as the service does.

    python benchmarks/bench_ranks.py [--trace PATH] [--ranks 256 1024] [--repeat 5]
        [--group-size 8 | --tp-dp 8] [--dask WORKERS]

Process groups (default: the trace's one group):
- ``--group-size G``: every rank's collectives in one group of G consecutive ranks ("tp<k>").
- ``--tp-dp T``: tensor x data parallel, as large jobs are built: each rank in a TP group of T
  consecutive ranks and a DP group of the ranks with the same rank mod T, both declared in its
  process_groups (pg_config); the broadcasts and every other all-reduce run in the DP group,
  the rest in the TP group, each call with its group's sequence number (so the view matches by
  sequence number). At 1,024 ranks and T = 8: 128 TP groups of 8 and 8 DP groups of 128. The
  last rank computes twice as long (not 30 % more), its TP and DP peers wait for that extra
  compute at their first call with it in each step, and its activity shows it in backward: its
  two groups have a straggler the others wait for (and a cause by difference).

``--dask W``: the span results come through a Dask LocalCluster of W single-threaded worker
processes, as the service gets them with ``--dask``: one `serving.dask_backend._analyze_task`
per rank, whose worker analyses the trace (once per worker process) and returns the rank's
jittered span result; timed from the first submit to the last result back here, then the
rank view over them as without (and checked equal to the view of the results made here).

Prints, per size: rank_view time (min and median of --repeat runs, wall and CPU), the view's
JSON size, the size of one span partial, the rank the view names, and the number of groups.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report

DEFAULT = Path(__file__).resolve().parents[2] / "shared/traces/hta/nccl_parser_config/nccl_data.json.gz"
COMPUTE = ("compute_only_us", "overlapped_us")
# activity keys the slow rank's extra compute shows in (analysis/distributed.ACTIVITY)
SLOW_ACTIVITY = ("compute_backward_us",)


def rank_result(result: dict, r: int, n: int, seed: int = 0, group_size: int = 0, tp: int = 0) -> dict:
    """Rank r's span result out of n: ``result``'s partial with the rank's own jitter
    (a generator seeded by (seed, r), so the same wherever it is made) and groups."""
    rng = np.random.default_rng([seed, r])
    part = copy.deepcopy(result["distributed"])
    part["rank"] = r
    part["world_size"] = n
    slow_rank = n - 1
    slow_factor = 2.0 if tp > 0 else 1.3
    slow = slow_factor if r == slow_rank else 1.0
    kinds = [s["collectives"]["kind"] for s in part["steps"]]
    names = None
    if group_size > 0:
        first = r // group_size * group_size
        name = f"tp{r // group_size}"
        part["process_groups"] = [{"name": name, "desc": "TP", "size": group_size,
                                   "ranks": list(range(first, min(first + group_size, n)))}]
        names = [[name] * len(k) for k in kinds]
    elif tp > 0:
        first = r // tp * tp
        tp_name, dp_name = f"tp{r // tp}", f"dp{r % tp}"
        part["process_groups"] = [
            {"name": tp_name, "desc": f"TP {r // tp}", "size": min(tp, n - first),
             "ranks": list(range(first, min(first + tp, n)))},
            {"name": dp_name, "desc": f"DP {r % tp}", "size": len(range(r % tp, n, tp)),
             "ranks": list(range(r % tp, n, tp))}]
        names = [[dp_name if k != "all_reduce" or i % 2 else tp_name for i, k in enumerate(ks)] for ks in kinds]
    if names is not None:
        count: dict = {}  # calls so far per group: the sequence numbers (the same on every member)
        for s, ns in zip(part["steps"], names):
            s["collectives"]["pg"] = ns
            seqs = []
            for g in ns:
                count[g] = count.get(g, 0) + 1
                seqs.append(count[g])
            s["collectives"]["seq"] = seqs
    # the slow rank's TP or DP group, where this rank shares one with it
    shared = {f"tp{slow_rank // tp}", f"dp{slow_rank % tp}"} & {g["name"] for g in part["process_groups"]} \
        if tp > 0 and r != slow_rank else set()
    for s in part["steps"]:
        f = max(0.5, rng.normal(1.0, 0.05))
        compute = f * sum(s[k] for k in COMPUTE)
        for k in ("compute_only_us", "overlapped_us", "exposed_comm_us", "other_us"):
            s[k] *= f * (slow if k in COMPUTE else 1.0)
        s["step_us"] = s["compute_only_us"] + s["overlapped_us"] + s["exposed_comm_us"] + s["other_us"]
        d = s["collectives"]["dur_us"]
        # the slow rank arrives last: the others' collectives last longer (they wait)
        s["collectives"]["dur_us"] = [x * max(0.2, rng.normal(1.0, 0.2)) * (0.5 if r == slow_rank else 1.0)
                                      for x in d]
        if isinstance(s.get("activity"), dict):
            s["activity"] = {k: v * f for k, v in s["activity"].items()}
            if r == slow_rank:  # its extra compute, in backward
                s["activity"]["compute_backward_us"] = s["activity"].get("compute_backward_us", 0.0) + \
                    (slow - 1.0) * compute
        for g in shared:  # its TP or DP peers wait for that extra compute at their first call with it
            wait = (slow_factor - 1.0) * compute
            s["collectives"]["dur_us"][s["collectives"]["pg"].index(g)] += wait
            s["exposed_comm_us"] += wait
            s["step_us"] += wait
    return {"report": result["report"], "distributed": part}


def jittered(result: dict, n: int, seed: int = 0, group_size: int = 0, tp: int = 0) -> dict:
    """``group_size`` > 0: every rank's collectives run in its own group of that many ranks
    ("tp<r // group_size>", declared in its process_groups), e.g. 128 TP groups of 8 at 1,024.
    ``tp`` > 0: TP groups of ``tp`` ranks and DP groups across them (module docstring)."""
    return {f"rank{r}": [rank_result(result, r, n, seed, group_size, tp)] for r in range(n)}


_TRACE_RESULTS: dict = {}  # a Dask worker's analysed trace, by path (one analysis per process)


def rank_task(trace: str, n: int, group_size: int, tp: int, logdir, run, span) -> dict:
    """The ``analyze_span`` of a Dask worker (dask_backend._analyze_task): rank ``span``'s result."""
    if trace not in _TRACE_RESULTS:
        _TRACE_RESULTS[trace] = report.analyze_trace(loader.load_trace(trace))
    return rank_result(_TRACE_RESULTS[trace], int(span), n, 0, group_size, tp)


def through_dask(trace: str, n: int, workers: int, group_size: int, tp: int):
    """Every rank's span result through a LocalCluster: (results by worker name, seconds)."""
    # the workers import this file by name (their analyze_span is its rank_task)
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p])
    sys.path.insert(0, here)
    import bench_ranks  # noqa: F401 - this file as a module the workers can import
    from distributed import Client, LocalCluster
    from tb_bottleneck_plugin.serving import dask_backend

    task = functools.partial(bench_ranks.rank_task, trace, n, group_size, tp)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        # each worker analyses the trace once before the clock starts (the service's workers
        # would analyse one trace per rank: see bench_scaling.py for that cost)
        client.run(lambda: bench_ranks.rank_task(trace, 2, 0, 0, None, None, 0) and None)
        t0 = time.perf_counter()
        futures = [client.submit(dask_backend._analyze_task, task, "", "bench", r, pure=False) for r in range(n)]
        outcomes = client.gather(futures)
        seconds = time.perf_counter() - t0
    bad = [o for o in outcomes if o[0] != "ok"]
    if bad:
        raise SystemExit(f"{len(bad)} Dask task(s) failed: {bad[0]}")
    return {f"rank{r}": [o[1]] for r, o in enumerate(outcomes)}, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    groups = ap.add_mutually_exclusive_group()
    groups.add_argument("--group-size", type=int, default=0,
                        help="put each rank's collectives in a process group of this many ranks (default: one group)")
    groups.add_argument("--tp-dp", type=int, default=0, metavar="TP",
                        help="TP groups of TP consecutive ranks and DP groups across them (module docstring)")
    ap.add_argument("--dask", type=int, default=0, metavar="WORKERS",
                    help="make the span results on a Dask LocalCluster of this many worker processes")
    args = ap.parse_args()
    trace = loader.load_trace(args.trace)
    result = report.analyze_trace(trace)
    part_bytes = len(json.dumps(result["distributed"]))
    n_coll = sum(len(s["collectives"]["kind"]) for s in result["distributed"]["steps"])
    print(f"partial of {Path(args.trace).name}: {len(result['distributed']['steps'])} steps, "
          f"{n_coll} collectives, {part_bytes / 1024:.1f} KB of JSON")
    for n in args.ranks:
        runs = jittered(result, n, group_size=args.group_size, tp=args.tp_dp)
        how = ""
        if args.dask:
            local = json.dumps(ranks.rank_view(runs))
            runs, seconds = through_dask(args.trace, n, args.dask, args.group_size, args.tp_dp)
            same = json.dumps(ranks.rank_view(runs)) == local
            how = f" [through Dask, {args.dask} workers: results back in {seconds:.2f} s; " \
                  f"view {'the same as' if same else 'DIFFERENT from'} the local one]"
        walls, cpus = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            view = ranks.rank_view(runs)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        body = json.dumps(view)
        t0 = time.perf_counter()
        text = ranks.format_ranks_text(view)
        t_text = time.perf_counter() - t0
        rec = view["recommendation"]
        print(f"{n:5d} ranks: rank_view min {min(walls) * 1000:.1f} ms, median {statistics.median(walls) * 1000:.1f} ms "
              f"(CPU min {min(cpus) * 1000:.1f}, median {statistics.median(cpus) * 1000:.1f} ms); "
              f"view JSON {len(body) / 1024:.0f} KB; text {t_text * 1000:.1f} ms ({len(text.splitlines())} lines); "
              f"named rank {rec['rank'] if rec else None}, imbalance {view['imbalance_pct']:.1f}%; "
              f"{len(view.get('process_groups') or [])} process groups{how}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
