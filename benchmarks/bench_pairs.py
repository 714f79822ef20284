"""Interleaved runs of the decode floor and `tb-bottlenecks report --json` from two source
trees (issue 39's before/after of the decode workers).

    python benchmarks/bench_pairs.py --tree before=DIR --tree after=DIR [--modes 1,2] [--rounds 6]

Each round runs, for every mode (TB_BOTTLENECKS_DECODE_PROCESSES value, or "default"), the
floor (`../shared/bench/decode_floor.py`) and the report of every tree in fresh processes, the
order of the trees alternating round by round. Per run: wall s, CPU s (user+sys of the process
and its reaped children, from wait4), peak RSS of the largest process (wait4's ru_maxrss) and
the 1-minute load average before it. Prints medians and the per-round ratios to the floor;
``--json OUT`` keeps every run. A tree is a checkout directory (its package is imported first
through PYTHONPATH, never this checkout's editable install).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOOR = REPO.parent / "shared" / "bench" / "decode_floor.py"
TRACE = REPO / "benchmarks/out/resnet50_num_workers_0_x9/worker0.1623143089861.pt.trace.json.gz"


def run(cmd, env, cwd) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed ({proc.returncode}): {err[-800:]}")
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_mib": round(usage.ru_maxrss / 1024, 1), "load": load}


def env_for(tree: Path, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    if mode == "default":
        env.pop("TB_BOTTLENECKS_DECODE_PROCESSES", None)
    else:
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = mode
    return env


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR (twice or more)")
    ap.add_argument("--modes", default="1")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    trees = [(n, Path(d).resolve()) for n, d in (t.split("=", 1) for t in a.tree)]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    runs: dict = {"floor": []}
    for mode in modes:
        for name, _ in trees:
            runs[f"{name} n={mode}"] = []
    for i in range(a.rounds):
        runs["floor"].append(run([sys.executable, str(FLOOR), str(a.trace)], dict(os.environ), str(REPO)))
        for mode in modes:
            for name, tree in (trees if i % 2 == 0 else trees[::-1]):
                cmd = [sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(a.trace), "--json"]
                runs[f"{name} n={mode}"].append(run(cmd, env_for(tree, mode), "/tmp"))
        print(f"round {i + 1}/{a.rounds}: " + "  ".join(f"{k} {v[-1]['wall_s']:.2f}/{v[-1]['cpu_s']:.2f}"
                                                        for k, v in runs.items()), flush=True)
    floor = runs["floor"]
    print(f"\n{'line':22s} {'wall s':>7s} {'cpu s':>6s} {'peak MiB':>9s} {'x floor wall':>13s} {'x floor cpu':>12s}"
          f"  (medians; ratios per round; load {min(r['load'] for v in runs.values() for r in v):.1f}-"
          f"{max(r['load'] for v in runs.values() for r in v):.1f})")
    summary = {}
    for line, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "cpu_s", "peak_mib")}
        med["x_floor_wall"] = statistics.median(r["wall_s"] / f["wall_s"] for r, f in zip(rows, floor))
        med["x_floor_cpu"] = statistics.median(r["cpu_s"] / f["cpu_s"] for r, f in zip(rows, floor))
        summary[line] = med
        print(f"{line:22s} {med['wall_s']:7.2f} {med['cpu_s']:6.2f} {med['peak_mib']:9.1f} "
              f"{med['x_floor_wall']:13.2f} {med['x_floor_cpu']:12.2f}")
    if a.json:
        a.json.write_text(json.dumps({"trees": {n: str(d) for n, d in trees}, "trace": str(a.trace),
                                      "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
