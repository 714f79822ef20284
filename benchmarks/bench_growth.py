#!/usr/bin/env python3
"""How much slower the full report of the 292 MB benchmark trace is than at a baseline commit.

Issue 21 (and the developers' guide): new analyses may slow the 292 MB benchmark report by
at most 10 %. This measures it as bench_load.py's "report" line (`tb-bottlenecks report
FILE --json`, a fresh process, end to end), for this checkout and for a baseline commit
checked out once into a git worktree under ~/.cache/tb_bottlenecks_bench/worktrees.

    python benchmarks/bench_growth.py --json benchmarks/out/growth.json          # ~4 min
    python benchmarks/bench_growth.py --baseline <rev> --pairs 20 --modes default,0

How, and why:
- **Pairs.** Each pair runs both lines back to back (the order alternating), and the
  result is the median of the per-pair ratios. On a shared VM the speed drifts by 20-50 %
  within minutes; two runs seconds apart see the same machine, so their ratio is
  steadier than a ratio of best times (also printed).
- **Bytecode cache.** Both lines compile their modules once into a cache of their own
  (PYTHONPYCACHEPREFIX) and reuse it, as an installed package does. With
  PYTHONDONTWRITEBYTECODE=1 (set on the development machines) every run would recompile
  every module, a cost that grows with the amount of code and that no user pays.
- **Modes.** `default` (decode workers as the loader chooses them) and `0`
  (TB_BOTTLENECKS_DECODE_PROCESSES=0: everything in one process).
- **Where the time goes.** Unless `--no-sections`, it also runs, for each line, fresh
  processes that load the trace in-process and time every analysis section of
  `report.analyze_trace` once (CPU seconds, median over `--section-runs`): the growth
  split by unit.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_load  # noqa: E402  (the trace build and its defaults)
from _common import warm_page_cache, write_results  # noqa: E402

REPO = bench_load.REPO
CACHE = Path.home() / ".cache" / "tb_bottlenecks_bench"
# The last commit before issue 21's analyses (FLOPs/MFU, source attribution, compilation,
# collectives) and the layout change: the corpus issue's end state.
DEFAULT_BASELINE = "d00adfc"
TARGET_RATIO = 1.10

_SECTIONS_CHILD = r"""
import json, sys, time
try:
    from tb_bottleneck_plugin.trace.loader import load_trace
except ImportError:  # before the trace/ package
    from tb_bottleneck_plugin.loader import load_trace
from tb_bottleneck_plugin import report
times = {}
run = report._Sections.run
def timed(self, section, fn, *a, **k):
    t = time.process_time()
    try:
        return run(self, section, fn, *a, **k)
    finally:
        times[section] = times.get(section, 0.0) + time.process_time() - t
report._Sections.run = timed
trace = load_trace(sys.argv[1])
t = time.process_time()
report.analyze_trace(trace)
times["TOTAL analyze_trace"] = time.process_time() - t
print(json.dumps(times))
"""


def _git(*args, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=str(cwd), check=True, capture_output=True, text=True).stdout.strip()


def baseline_tree(rev: str) -> Path:
    """A worktree of ``rev`` (made once; reused while it is at that commit)."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = CACHE / "worktrees" / sha[:12]
    if not (tree / "tb_bottleneck_plugin").is_dir():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=str(REPO), check=False, capture_output=True)
        _git("worktree", "add", "--force", "--detach", str(tree), sha)
    # its optional C extensions built as `pip install -e .` builds them here (they are not in
    # git): without them a baseline with the C scanner would be measured on msgspec alone
    if (tree / "tb_bottleneck_plugin" / "trace" / "_fastscan.c").is_file() and \
            not list((tree / "tb_bottleneck_plugin" / "trace").glob("_fastscan*.so")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=str(tree), check=False,
                       capture_output=True)
    return tree


def child_env(root: Path, mode: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # the line's own package first: a worktree's modules, never this checkout's editable install
    env["PYTHONPATH"] = str(root)
    env["PYTHONPYCACHEPREFIX"] = str(CACHE / "pycache")  # per absolute path: the two lines never share
    if mode == "default":
        env.pop("TB_BOTTLENECKS_DECODE_PROCESSES", None)
    else:
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = mode
    return env


def compile_tree(root: Path) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "tb_bottleneck_plugin")],
                   env=child_env(root, "0"), check=False, capture_output=True)


def run_report(root: Path, path: str, mode: str, timeout: float) -> dict:
    """One `report --json` in a fresh process: wall and CPU seconds (its tree, via wait4)."""
    env = child_env(root, mode)
    cmd = [sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", path, "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(CACHE), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{root}: report failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def run_sections(root: Path, path: str, timeout: float) -> dict:
    out = subprocess.run([sys.executable, "-c", _SECTIONS_CHILD, path], cwd=str(CACHE), env=child_env(root, "0"),
                         capture_output=True, text=True, timeout=timeout, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(lines: dict, path: str, modes: list, pairs: int, timeout: float) -> dict:
    out = {}
    for mode in modes:
        runs = {name: [] for name in lines}
        for i in range(pairs):
            order = list(lines.items()) if i % 2 == 0 else list(reversed(lines.items()))
            for name, root in order:
                runs[name].append(run_report(root, path, mode, timeout))
            print(f"  {mode} pair {i + 1}/{pairs}: " + "  ".join(
                f"{n} {runs[n][-1]['wall_s']:.2f} s" for n in lines), flush=True)
        now, base = runs["now"], runs["baseline"]
        ratios = {k: [a[k] / b[k] for a, b in zip(now, base)] for k in ("wall_s", "cpu_s")}
        out[mode] = {
            "runs": runs,
            "median_ratio": {k: statistics.median(v) for k, v in ratios.items()},
            "best_ratio": {k: min(a[k] for a in now) / min(b[k] for b in base) for k in ("wall_s", "cpu_s")},
            "median_s": {n: {k: statistics.median(r[k] for r in runs[n]) for k in ("wall_s", "cpu_s")} for n in lines},
            "best_s": {n: {k: min(r[k] for r in runs[n]) for k in ("wall_s", "cpu_s")} for n in lines},
        }
    return out


def sections(lines: dict, path: str, runs: int, timeout: float) -> dict:
    got = {name: [] for name in lines}
    for i in range(runs):
        for name, root in (lines.items() if i % 2 == 0 else reversed(lines.items())):
            got[name].append(run_sections(root, path, timeout))
    med = {}
    for name, rows in got.items():
        keys = set().union(*rows)
        med[name] = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
    return med


def print_report(res: dict, sec: dict, baseline: str, head: str) -> None:
    print(f"\nreport of the 292 MB trace: this checkout ({head}) / baseline ({baseline})")
    print(f"{'mode':9s} {'baseline wall':>13s} {'now wall':>9s} {'median ratio wall':>18s} {'cpu':>6s} "
          f"{'best-time ratio wall':>21s} {'cpu':>6s}")
    for mode, r in res.items():
        print(f"{mode:9s} {r['median_s']['baseline']['wall_s']:13.2f} {r['median_s']['now']['wall_s']:9.2f} "
              f"{r['median_ratio']['wall_s']:18.3f} {r['median_ratio']['cpu_s']:6.3f} "
              f"{r['best_ratio']['wall_s']:21.3f} {r['best_ratio']['cpu_s']:6.3f}")
    for mode, r in res.items():
        ok = r["median_ratio"]["wall_s"] <= TARGET_RATIO
        print(f"target ({mode}): median ratio <= {TARGET_RATIO:.2f}: {'met' if ok else 'MISSED'} "
              f"({r['median_ratio']['wall_s']:.3f})")
    if sec:
        now, base = sec["now"], sec["baseline"]
        print("\nanalysis sections, CPU s (in-process decode, median of fresh processes):")
        rows = sorted(set(now) | set(base), key=lambda k: -abs(now.get(k, 0.0) - base.get(k, 0.0)))
        for k in rows:
            a, b = now.get(k, 0.0), base.get(k, 0.0)
            if max(a, b) >= 0.005:
                print(f"  {k:24s} baseline {b:6.3f}  now {a:6.3f}  {a - b:+.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="commit to compare with (default %(default)s)")
    p.add_argument("--pairs", type=int, default=12, help="pairs of runs per mode (default %(default)s)")
    p.add_argument("--modes", default="default,0",
                   help="comma-separated: default and/or a TB_BOTTLENECKS_DECODE_PROCESSES value (default %(default)s)")
    p.add_argument("--no-sections", action="store_true", help="skip the per-section split")
    p.add_argument("--section-runs", type=int, default=4, help="fresh processes per line for the split")
    p.add_argument("--times", type=int, default=bench_load.DEFAULT_TIMES)
    p.add_argument("--source", type=Path, default=bench_load.DEFAULT_SOURCE)
    p.add_argument("--out-dir", type=Path, default=bench_load.DEFAULT_OUT)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the numbers as JSON to OUT")
    a = p.parse_args(argv)

    trace = bench_load.build_trace(a.source, a.out_dir, a.times, False)
    path = trace["path"]
    warm_page_cache(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    lines = {"now": REPO, "baseline": baseline_tree(a.baseline)}
    head = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        head += "+changes"
    for root in lines.values():
        compile_tree(root)
        run_report(root, path, "0", a.timeout)  # warm-up: caches, page cache, bytecode
    load_before = os.getloadavg()
    res = measure(lines, path, [m.strip() for m in a.modes.split(",") if m.strip()], a.pairs, a.timeout)
    sec = {} if a.no_sections else sections(lines, path, a.section_runs, a.timeout)
    load_after = os.getloadavg()
    print_report(res, sec, a.baseline, head)
    print(f"\nload average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    if a.json:
        write_results(a.json, {"trace": trace, "baseline": a.baseline, "now": head, "pairs": a.pairs,
                               "target_ratio": TARGET_RATIO, "load_before": load_before, "load_after": load_after,
                               "modes": res, "sections_cpu_s": sec})
    return 0


if __name__ == "__main__":
    sys.exit(main())
