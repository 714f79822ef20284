#!/usr/bin/env python3
"""Load-time and memory benchmark: our loader against the decode floor and torch-tb-profiler.

    python benchmarks/bench_load.py [--runs 3] [--skip-tbp] [--json OUT]

1. Builds (once, then cached under --out-dir) a ~300 MB gzip-compressed trace by
   repeating a real resnet50 Kineto trace K times with ../shared/bench/scale_trace.py.
2. Runs every measurement in a fresh child interpreter (so peak RSS belongs to that
   measurement alone), best wall time of N runs:
     floor         gunzip the whole file (zlib, one thread) + one msgspec.json.decode
                   into the loader's own typed schema (loader.TraceObject); nothing else
     floor-isal    the same with isal's gunzip (information only: a faster gunzip)
     ours          tb_bottleneck_plugin.loader.load_trace(path), as shipped (it may fork
                   decode worker processes for large files)
     ours-1proc    the same with TB_BOTTLENECKS_DECODE_PROCESSES=0 (no worker processes)
     ours+report   load_trace + report.analyze_trace(trace): the whole report, exactly
                   what the CLI and the tab compute for one span
     tbp           torch-tb-profiler 0.4.3: RunProfileData.parse(...) then
                   RunGenerator(...).generate_run_profile(), what its RunLoader runs per file
   Time is the operation only (child's interpreter start and imports excluded); CPU
   time counts the child and its (reaped) worker processes. Memory: "main" is
   ru_maxrss of the child at the end; "imports" is its ru_maxrss just before the
   operation; "peak" is the largest sum of RSS over the child and all its descendants
   (sampled every 20 ms by the parent; never below "main"), "pss" the same as PSS;
   "added" = peak - imports.
3. Prints a table with ratios and the targets, and optionally writes JSON (--json).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
DEFAULT_SOURCE = SHARED / "traces/kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
SCALE_SCRIPT = SHARED / "bench/scale_trace.py"
DEFAULT_OUT = REPO / "benchmarks" / "out"
# 10 copies of the resnet50 span: ~325 MB (310 MiB) of JSON, ~12 MB gzip. scale_trace.py
# re-serialises compactly and widens ids, so one copy is ~32.5 MB (the source is 35 MB).
DEFAULT_TIMES = 10

MB = 1_000_000  # sizes and RSS are reported in decimal MB throughout

TARGET_FLOOR_RATIO = 1.5  # ours within 1.5x of the decode floor
TARGET_TBP_RATIO = 10.0  # tbp / ours >= 10x (stretch)


# --------------------------------------------------------------------------- child side


def _rss_bytes() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024


def _vm_hwm_bytes():
    """This process image's own peak RSS (Linux VmHWM; unlike ru_maxrss it is reset on exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_seconds(who=resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _child(mode: str, path: str, result_path: str, cache_dir: str) -> None:
    """Run one measurement in this (fresh) interpreter and write the numbers as JSON."""
    sys.path.insert(0, str(REPO))
    info: dict = {}
    if mode in ("floor", "floor-isal"):
        from typing import List

        import msgspec

        from tb_bottleneck_plugin import loader

        if mode == "floor-isal":
            from isal import igzip as gunzip
        else:
            gunzip = gzip

        def op():
            with open(path, "rb") as f:
                raw = f.read()
            data = gunzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            del raw
            if data.lstrip()[:1] == b"[":
                events = msgspec.json.decode(data, type=List[loader.Event])
            else:
                events = msgspec.json.decode(data, type=loader.TraceObject).traceEvents or []
            info["events"] = len(events)
            info["uncompressed_bytes"] = len(data)
            return events

    elif mode in ("ours", "ours-1proc", "ours+report"):
        from tb_bottleneck_plugin import loader

        analyze_trace = None
        if mode == "ours+report":
            from tb_bottleneck_plugin.report import analyze_trace

        def op():
            trace = loader.load_trace(path)
            info["events"] = trace.meta.event_count
            info["rows"] = {"cpu": len(trace.cpu), "gpu": len(trace.gpu), "runtime": len(trace.runtime),
                            "memory": len(trace.memory)}
            if analyze_trace is not None:
                result = analyze_trace(trace)  # report + memory curves + kernel table
                info["recommendations"] = len(result["report"].get("recommendations") or [])
            return trace

    elif mode == "tbp":
        import logging

        from torch_tb_profiler import consts
        from torch_tb_profiler.profiler.data import RunProfileData
        from torch_tb_profiler.profiler.run_generator import RunGenerator

        logging.disable(logging.WARNING)  # its per-phase timing logs are noise here
        match = consts.WORKER_PATTERN.match(os.path.basename(path))
        worker = match.group(1) if match else Path(path).stem
        # RunLoader turns the file's span timestamp into its index among the worker's spans.
        span = 1 if match and match.group(2) else None

        def op():
            data = RunProfileData.parse(worker, span, path, cache_dir)
            profile = RunGenerator(worker, span, data).generate_run_profile()
            info["events"] = len(data.events)
            info["views"] = [v.display_name for v in profile.views]
            return profile, data

    else:
        raise SystemExit(f"unknown mode {mode}")

    baseline = _rss_bytes()
    cpu0, cpu0_children = _cpu_seconds(), _cpu_seconds(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    keep = op()  # noqa: F841 (kept alive until the peak is read)
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    peak = _rss_bytes()
    # The loader may decode in worker processes (loader._pool, a ProcessPoolExecutor).
    # Reap them (outside the timing) so that their CPU time shows in RUSAGE_CHILDREN.
    pool = getattr(sys.modules.get("tb_bottleneck_plugin.loader"), "_pool", None)
    if pool is not None and hasattr(pool, "shutdown"):
        info["worker_processes"] = getattr(pool, "_max_workers", None)
        pool.shutdown(wait=True)
    cpu_children = _cpu_seconds(resource.RUSAGE_CHILDREN) - cpu0_children
    Path(result_path).write_text(json.dumps({
        "mode": mode, "seconds": seconds, "cpu_seconds": cpu + cpu_children, "cpu_children_seconds": cpu_children,
        "peak_rss_bytes": peak, "baseline_rss_bytes": baseline, "vm_hwm_bytes": _vm_hwm_bytes(), "info": info,
    }))


# --------------------------------------------------------------------------- parent side


def _gunzipped_size(path: Path) -> int:
    # Small pieces on purpose: on Linux a child's ru_maxrss starts at the parent's RSS
    # (it survives fork/exec), so the parent must stay smaller than any child's imports.
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(64 << 10)
            if not raw:
                break
            while raw:
                total += len(inflater.decompress(raw, 1 << 20))
                if inflater.unconsumed_tail:
                    raw = inflater.unconsumed_tail
                    continue
                if inflater.eof:
                    raw = inflater.unused_data
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                else:
                    raw = b""
    return total


def build_trace(source: Path, out_dir: Path, times: int, rebuild: bool) -> dict:
    """The scaled trace under out_dir, built once; reused while its recorded size matches."""
    # Keep a name the plugins discover (worker0.<span>.pt.trace.json.gz): tbp reads worker/span off it.
    dest = out_dir / f"{source.parent.name}_x{times}" / source.name
    if not source.name.endswith(".pt.trace.json.gz"):
        dest = dest.with_name("worker0.1.pt.trace.json.gz")
    meta_path = dest.parent / "build.json"
    src_stat = source.stat()
    want = {"source": str(source), "source_bytes": src_stat.st_size, "times": times}
    if not rebuild and dest.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            if all(meta.get(k) == v for k, v in want.items()) and meta.get("gzip_bytes") == dest.stat().st_size:
                meta["cached"] = True
                meta["path"] = str(dest)
                return meta
        except (OSError, ValueError):
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    print(f"building {dest} ({times} x {source.name}) ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(SCALE_SCRIPT), str(source), str(tmp), "--times", str(times), "--gzip"],
                   check=True)
    os.replace(tmp, dest)
    meta = dict(want, gzip_bytes=dest.stat().st_size, json_bytes=_gunzipped_size(dest),
                built_at=_dt.datetime.now().isoformat(timespec="seconds"))
    meta_path.write_text(json.dumps(meta, indent=1))
    print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    meta["cached"] = False
    meta["path"] = str(dest)
    return meta


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _tree(pid: int) -> list:
    """pid and all its descendants (Linux /proc; just [pid] elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _tree_memory(pid: int, with_pss: bool):
    """(sum of RSS, sum of PSS or None) over the process tree, in bytes."""
    rss, pss = 0, (0 if with_pss else None)
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                rss += int(f.read().split()[1]) * _PAGE
            if with_pss:
                with open(f"/proc/{p}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            pss += int(line.split()[1]) * 1024
                            break
        except (OSError, ValueError, IndexError):
            pass
    return rss, pss


def run_child(mode: str, path: str, out_dir: Path, timeout: float) -> dict:
    """One fresh child interpreter measuring `mode`. Returns its numbers, or {'error': ...}.

    While it runs, this process samples the memory of the child's whole process tree
    (the loader may fork decode workers, whose memory ru_maxrss of the child omits):
    the sum of RSS every 20 ms (counts pages shared after fork once per process) and
    the sum of PSS every 100 ms (shares them out; the fair total).
    """
    log_path = out_dir / f"child-{mode.replace('+', '_')}.log"
    env = dict(os.environ)
    if mode == "ours-1proc":
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = "0"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, path,
               "--result", str(result_path), "--cache-dir", tmp]
        tree_rss = tree_pss = 0
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, env=env)
            deadline = time.monotonic() + timeout
            tick = 0
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    for p in reversed(_tree(proc.pid)):  # only processes this benchmark started
                        try:
                            os.kill(p, 9)
                        except OSError:
                            pass
                    proc.wait()
                    return {"error": f"timed out after {timeout:.0f} s"}
                rss, pss = _tree_memory(proc.pid, with_pss=tick % 5 == 0)
                tree_rss = max(tree_rss, rss)
                tree_pss = max(tree_pss, pss or 0)
                tick += 1
                time.sleep(0.02)
        if proc.returncode != 0 or not result_path.exists():
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        r = json.loads(result_path.read_text())
        if "peak_rss_bytes" in r:
            # Sampling can miss a short peak of a single process: never report less than ru_maxrss.
            r["tree_rss_bytes"] = max(tree_rss, r["peak_rss_bytes"])
            r["tree_pss_bytes"] = tree_pss or None
        return r


def summarize(results: list) -> dict:
    """Best time of the runs; peak RSS is the max over runs (the conservative number)."""
    best = min(results, key=lambda r: r["seconds"])
    main_peak = max(r["peak_rss_bytes"] for r in results)
    tree_rss = max(r.get("tree_rss_bytes") or r["peak_rss_bytes"] for r in results)
    pss = [r["tree_pss_bytes"] for r in results if r.get("tree_pss_bytes")]
    baseline = max(r["baseline_rss_bytes"] for r in results)
    hwm = [r["vm_hwm_bytes"] for r in results if r.get("vm_hwm_bytes")]
    return {
        "runs_s": [round(r["seconds"], 3) for r in results],
        "best_s": round(best["seconds"], 3),
        "cpu_s_of_best": round(best["cpu_seconds"], 3),  # this process + its reaped workers
        "cpu_workers_s_of_best": round(best.get("cpu_children_seconds", 0.0), 3),
        "peak_rss_mb": round(tree_rss / MB, 1),  # all processes of the measurement, max over runs
        "peak_pss_mb": round(max(pss) / MB, 1) if pss else None,
        "main_ru_maxrss_mb": round(main_peak / MB, 1),  # ru_maxrss at the end of the child
        "imports_rss_mb": round(baseline / MB, 1),  # ru_maxrss just before the operation
        "added_rss_mb": round((tree_rss - baseline) / MB, 1),
        "vm_hwm_mb": round(max(hwm) / MB, 1) if hwm else None,  # cross-check of main_ru_maxrss
        "info": best["info"],
    }


def measure_all(modes: list, path: str, runs: dict, out_dir: Path, timeout: float) -> dict:
    """Round-robin over the lines (floor, ours, tbp, floor, ours, tbp, ...) so that load
    from other processes on the machine hits every line alike; best of each line's runs."""
    raw = {m: [] for m in modes}
    failed = {}
    for i in range(max(runs.values())):
        for mode in modes:
            if i >= runs[mode] or mode in failed:
                continue
            r = run_child(mode, path, out_dir, timeout)
            if "error" in r or "unavailable" in r:
                failed[mode] = r
                if "unavailable" in r:
                    print(f"report: not available yet ({r['unavailable']})", flush=True)
                continue
            raw[mode].append(r)
            print(f"  {mode:<12} run {i + 1}/{runs[mode]}: {r['seconds']:7.2f} s, cpu {r['cpu_seconds']:6.2f} s, "
                  f"peak {r['tree_rss_bytes'] / MB:5.0f} MB (main process {r['peak_rss_bytes'] / MB:5.0f} MB)",
                  flush=True)
    out = {}
    for mode in modes:
        if mode in failed and "unavailable" in failed[mode]:
            continue
        if mode in failed:
            out[mode] = {"error": failed[mode]["error"], "partial_runs_s": [round(r["seconds"], 3) for r in raw[mode]]}
        else:
            out[mode] = summarize(raw[mode])
    return out


LABELS = {
    "floor": "decode floor (zlib gunzip + msgspec typed, 1 thread)",
    "floor-isal": "decode floor, isal gunzip (info only)",
    "ours": "ours: loader.load_trace",
    "ours-1proc": "ours, in-process (DECODE_PROCESSES=0)",
    "ours+report": "ours: load_trace + report.analyze_trace (full report)",
    "tbp": "torch-tb-profiler 0.4.3 parse + generate_run_profile",
}


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(res: dict, trace: dict, runs: int) -> dict:
    size_mb = trace["json_bytes"] / MB
    floor = res.get("floor", {}).get("best_s")
    tbp = res.get("tbp", {}).get("best_s")
    print()
    print(f"trace: {trace['path']}")
    what = f"{trace['times']} x {Path(trace['source']).name}" if trace.get("source") else "as given"
    gz = f"gzip {trace['gzip_bytes'] / MB:.1f} MB" if trace.get("gzip_bytes") else "not compressed"
    print(f"  {what}; uncompressed {size_mb:.1f} MB ({trace['json_bytes'] / 2**20:.1f} MiB), {gz}; "
          f"events: {res.get('ours', res.get('floor', {})).get('info', {}).get('events', '?')}")
    print(f"  best of {runs} fresh processes. cpu = CPU seconds of all its processes. Memory in MB (10^6 B):")
    print("  peak = sum of RSS over the measurement's processes (worker processes included),")
    print("  pss = the same as PSS (pages shared after fork counted once), main = ru_maxrss of the")
    print("  measuring process, imports = its ru_maxrss after interpreter + imports, added = peak - imports")
    head = (f"{'line':<54} {'time s':>7} {'cpu s':>6} {'peak':>6} {'pss':>5} {'main':>5} {'imports':>7} {'added':>6}"
            f" {'x floor':>7} {'tbp/x':>6}")
    print(head)
    print("-" * len(head))
    for mode in ("floor", "floor-isal", "ours", "ours-1proc", "ours+report", "tbp"):
        r = res.get(mode)
        if r is None:
            continue
        if "error" in r:
            print(f"{LABELS[mode]:<54} {r['error']}")
            continue
        t = r["best_s"]
        r["ratio_to_floor"] = round(t / floor, 2) if floor else None
        r["tbp_over_this"] = round(tbp / t, 1) if tbp else None
        print(f"{LABELS[mode]:<54} {t:7.2f} {r['cpu_s_of_best']:6.2f} {r['peak_rss_mb']:6.0f} "
              f"{_fmt(r['peak_pss_mb'], '5.0f')} {r['main_ru_maxrss_mb']:5.0f} "
              f"{r['imports_rss_mb']:7.0f} {r['added_rss_mb']:6.0f} {_fmt(r['ratio_to_floor'], '7.2f')} "
              f"{_fmt(r['tbp_over_this'], '6.1f')}")
    print()
    targets = []
    ours = res.get("ours", {})
    if "best_s" in ours and floor:
        v = ours["best_s"] / floor
        targets.append({"target": f"ours within {TARGET_FLOOR_RATIO}x of the decode floor", "value": round(v, 2),
                        "threshold": TARGET_FLOOR_RATIO, "met": v <= TARGET_FLOOR_RATIO})
    if "peak_rss_mb" in ours:
        v = ours["peak_rss_mb"]
        targets.append({"target": f"ours peak RSS (all its processes) below the uncompressed size ({size_mb:.0f} MB)",
                        "value": v, "threshold": round(size_mb, 1), "met": v < size_mb})
        if ours.get("peak_pss_mb"):
            v = ours["peak_pss_mb"]
            targets.append({"target": f"ours peak PSS (all its processes) below the uncompressed size ({size_mb:.0f} MB)",
                            "value": v, "threshold": round(size_mb, 1), "met": v < size_mb})
    if "best_s" in ours and tbp:
        v = tbp / ours["best_s"]
        targets.append({"target": f"tbp / ours >= {TARGET_TBP_RATIO:.0f}x (stretch)", "value": round(v, 1),
                        "threshold": TARGET_TBP_RATIO, "met": v >= TARGET_TBP_RATIO})
    rep = res.get("ours+report", {})
    if "best_s" in rep and tbp:
        v = tbp / rep["best_s"]
        targets.append({"target": f"tbp / (ours + report) >= {TARGET_TBP_RATIO:.0f}x (stretch)", "value": round(v, 1),
                        "threshold": TARGET_TBP_RATIO, "met": v >= TARGET_TBP_RATIO})
    for t in targets:
        print(f"  [{'met ' if t['met'] else 'MISS'}] {t['target']}: {t['value']} (threshold {t['threshold']})")
    return {"targets": targets}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to scale (default: %(default)s)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="cache for the scaled trace (default: %(default)s)")
    p.add_argument("--times", type=int, default=DEFAULT_TIMES,
                   help="copies of the source in the scaled trace (default %(default)s: ~325 MB of JSON)")
    p.add_argument("--trace", type=Path, help="benchmark this file as is instead of building one")
    p.add_argument("--rebuild", action="store_true", help="rebuild the scaled trace even if cached")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per line; the best time counts (default 3)")
    p.add_argument("--tbp-runs", type=int, help="runs for torch-tb-profiler (default: --runs)")
    p.add_argument("--skip-tbp", action="store_true", help="skip torch-tb-profiler (~25 s and ~1.5 GB per run)")
    p.add_argument("--skip-isal", action="store_true", help="skip the informational isal floor")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process (default %(default)s)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the numbers as JSON to OUT")
    # internal: one measurement in a fresh interpreter
    p.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        _child(a.child[0], a.child[1], a.result, a.cache_dir or tempfile.gettempdir())
        return 0

    a.out_dir.mkdir(parents=True, exist_ok=True)
    if a.trace:
        size = a.trace.stat().st_size
        with open(a.trace, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        trace = {"path": str(a.trace), "times": 1, "gzip_bytes": size if gz else None,
                 "json_bytes": _gunzipped_size(a.trace) if gz else size, "cached": True}
    else:
        if not a.source.exists():
            p.error(f"source trace not found: {a.source}")
        trace = build_trace(a.source, a.out_dir, a.times, a.rebuild)
    path = trace["path"]
    with open(path, "rb") as f:  # warm the page cache so run 1 is not a disk benchmark
        while f.read(8 << 20):
            pass

    modes = ["floor"]
    try:
        import isal  # noqa: F401
        if not a.skip_isal:
            modes.append("floor-isal")
    except ImportError:
        pass
    modes += ["ours", "ours-1proc", "ours+report"]  # the full report: what a user waits for
    if not a.skip_tbp:
        modes.append("tbp")
    runs = {m: ((a.tbp_runs or a.runs) if m == "tbp" else a.runs) for m in modes}
    load_before = os.getloadavg()
    res = measure_all(modes, path, runs, a.out_dir, a.timeout)
    load_after = os.getloadavg()
    summary = print_table(res, trace, a.runs)
    print(f"  load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)} on {os.cpu_count()} CPUs"
          " (other processes on the machine make the times noisy; compare ratios)")

    if a.json:
        doc = {
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                     "platform": platform.platform()},
            "versions": _versions(),
            "trace": trace,
            "uncompressed_mb": round(trace["json_bytes"] / MB, 1),
            "runs": runs,
            "load_average_before": load_before, "load_average_after": load_after,
            "results": res,
            **summary,
        }
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1))
        print(f"\nwrote {a.json}")
    return 0


def _load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def _versions() -> dict:
    out = {}
    for name in ("msgspec", "numpy", "isal", "torch_tb_profiler", "pandas"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 (informational only)
            out[name] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
