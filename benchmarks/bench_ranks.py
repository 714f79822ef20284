"""Run-level rank view (metrics §12) at scale: 256 and 1,024 ranks.

The span partials are copies of one real partial (default: rank 0 of the 2-rank NCCL trace
../shared/traces/hta/nccl_parser_config/nccl_data.json.gz) with per-rank jitter: every
step's four parts are scaled by one factor ~ N(1, 0.05) and every collective's duration
by its own ~ N(1, 0.2), and one rank (the last) gets 30 % more compute, so the view has a
straggler to find. No trace file is written: the rank view reads only the partials (and the
straggler's report), as the service does.

    python benchmarks/bench_ranks.py [--trace PATH] [--ranks 256 1024] [--repeat 5] [--group-size 8]

Prints, per size: rank_view time (min and median of --repeat runs), the view's JSON size,
the size of one span partial, and the rank the view names.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import numpy as np

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report

DEFAULT = Path(__file__).resolve().parents[2] / "shared/traces/hta/nccl_parser_config/nccl_data.json.gz"


def jittered(result: dict, n: int, seed: int = 0, group_size: int = 0) -> dict:
    """``group_size`` > 0: every rank's collectives run in its own group of that many ranks
    ("tp<r // group_size>", declared in its process_groups), e.g. 128 TP groups of 8 at 1,024."""
    rng = np.random.default_rng(seed)
    out = {}
    base = result["distributed"]
    for r in range(n):
        part = copy.deepcopy(base)
        part["rank"] = r
        part["world_size"] = n
        if group_size > 0:
            first = r // group_size * group_size
            name = f"tp{r // group_size}"
            part["process_groups"] = [{"name": name, "desc": "TP", "size": group_size,
                                       "ranks": list(range(first, min(first + group_size, n)))}]
            for s in part["steps"]:
                s["collectives"]["pg"] = [name] * len(s["collectives"]["kind"])
        slow = 1.3 if r == n - 1 else 1.0
        for s in part["steps"]:
            f = max(0.5, rng.normal(1.0, 0.05))
            for k in ("compute_only_us", "overlapped_us", "exposed_comm_us", "other_us"):
                s[k] *= f * (slow if k in ("compute_only_us", "overlapped_us") else 1.0)
            s["step_us"] = s["compute_only_us"] + s["overlapped_us"] + s["exposed_comm_us"] + s["other_us"]
            d = s["collectives"]["dur_us"]
            # the slow rank arrives last: the others' collectives last longer (they wait)
            s["collectives"]["dur_us"] = [x * max(0.2, rng.normal(1.0, 0.2)) * (0.5 if r == n - 1 else 1.0)
                                          for x in d]
        out[f"rank{r}"] = [{"report": result["report"], "distributed": part}]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--group-size", type=int, default=0,
                    help="put each rank's collectives in a process group of this many ranks (default: one group)")
    args = ap.parse_args()
    trace = loader.load_trace(args.trace)
    result = report.analyze_trace(trace)
    part_bytes = len(json.dumps(result["distributed"]))
    n_coll = sum(len(s["collectives"]["kind"]) for s in result["distributed"]["steps"])
    print(f"partial of {Path(args.trace).name}: {len(result['distributed']['steps'])} steps, "
          f"{n_coll} collectives, {part_bytes / 1024:.1f} KB of JSON")
    for n in args.ranks:
        runs = jittered(result, n, group_size=args.group_size)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            view = ranks.rank_view(runs)
            times.append(time.perf_counter() - t0)
        body = json.dumps(view)
        t0 = time.perf_counter()
        text = ranks.format_ranks_text(view)
        t_text = time.perf_counter() - t0
        print(f"{n:5d} ranks: rank_view min {min(times) * 1000:.1f} ms, median {statistics.median(times) * 1000:.1f} ms; "
              f"view JSON {len(body) / 1024:.0f} KB; text {t_text * 1000:.1f} ms ({len(text.splitlines())} lines); "
              f"named rank {view['recommendation']['rank'] if view['recommendation'] else None}, "
              f"imbalance {view['imbalance_pct']:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
