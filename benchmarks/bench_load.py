#!/usr/bin/env python3
"""What users wait for, side by side: the decode floor, our loader, our whole report,
torch-tb-profiler and Holistic Trace Analysis, on the same big trace.

    python benchmarks/bench_load.py [--runs 3] [--skip-tbp] [--skip-hta] [--json OUT]

1. Builds (once, then cached under --out-dir) a big gzip-compressed trace by repeating a
   real resnet50 Kineto trace K times with ../shared/bench/scale_trace.py (default K = 9,
   ~292 MB of JSON, the issue-14 file).
2. Runs every line in a fresh process, interleaved (floor, ours, report, tbp, hta, floor,
   ...), N runs each, best time kept:
     floor         ../shared/bench/decode_floor.py FILE, as shipped: read + gunzip (zlib,
                   one thread) + one typed msgspec decode of the fields the analyses read.
                   THE REFERENCE LINE: every "x floor" ratio divides by its time.
     floor-loader  the same gunzip + one msgspec decode into the loader's own (wider)
                   schema, loader.TraceObject (information: the floor of the old benchmark)
     floor-isal    floor-loader with isal's gunzip (information only)
     ours          tb_bottleneck_plugin.trace.loader.load_trace(path), as shipped
     ours-1proc    the same with TB_BOTTLENECKS_DECODE_PROCESSES=0 (no worker processes)
     report        `tb-bottlenecks report FILE --json` end to end (python -m
                   tb_bottleneck_plugin.cli): discovery + report.analyze_span (load +
                   every analysis) + JSON to a file. What the CLI and the tab compute
                   for one span; what a user waits for. The targets are this line's.
     report-1proc  the same with TB_BOTTLENECKS_DECODE_PROCESSES=0 (all in one process)
     report-1worker  the same with TB_BOTTLENECKS_DECODE_PROCESSES=1 (one forked worker
                   decodes chunks beside the main process; what the default does when a
                   core is idle: 1-minute load average < cores - 0.5)
     report-workers  the same with TB_BOTTLENECKS_DECODE_PROCESSES=2 (2 forked decode
                   workers beside the main process)
     tbp           torch-tb-profiler 0.4.3: RunProfileData.parse(...) then
                   RunGenerator(...).generate_run_profile(), what its RunLoader runs per file
     hta           Holistic Trace Analysis: TraceAnalysis(trace_dir) (parse) then
                   get_temporal_breakdown(); run with the interpreter of a separate venv:
                   `traceinsight` 0.6 (HTA's 2026 package name) in --traceinsight-venv,
                   else HolisticTraceAnalysis 0.5.0 in --hta-venv, each created with pip
                   if missing; the line is skipped with a message if both fail
   "time s" is the whole process, interpreter start to exit, as a user sees it (the
   issue's numbers are whole-process too); "op s" is the operation alone where the
   process can report it. Memory: "peak" is the largest sum of RSS over the process and
   all its descendants (sampled every 20 ms from /proc, and never below the ru_maxrss
   that wait4 returns for the process tree), "pss" the same as PSS. Every line runs
   with its bytecode compiled once beforehand (PYTHONPYCACHEPREFIX), as installed.
3. Prints a table with ratios to the floor and the issue-14 targets (met / MISSED), and
   optionally writes JSON (--json) with os.getloadavg() before and after.
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
FLOOR_SCRIPT = SHARED / "bench/decode_floor.py"
PYCACHE = Path.home() / ".cache" / "tb_bottlenecks_bench" / "pycache_load"
# 9 copies of the resnet50 span (issue 14's file, `--times 9 --gzip`): ~292 MB of JSON.
# scale_trace.py re-serialises compactly and widens ids, so one copy is ~32.5 MB.
DEFAULT_TIMES = 9
HTA_VENV = Path.home() / ".cache" / "tb_bottlenecks_bench" / "htavenv"
HTA_REQUIREMENTS = ["HolisticTraceAnalysis==0.5.0", "pandas<3"]  # HTA 0.5.0 fails with pandas 3
TRACEINSIGHT_VENV = Path.home() / ".cache" / "tb_bottlenecks_bench" / "tivenv"
TRACEINSIGHT_REQUIREMENTS = ["traceinsight==0.6.0", "pandas<3"]  # HTA renamed; same `hta` module

MB = 1_000_000  # sizes and RSS are reported in decimal MB throughout

# issue 14's targets, for the full report (the `report` line)
TARGET_FLOOR_RATIO = 1.0  # report <= 1.0x the single-thread decode floor
TARGET_MEMORY_RATIO = 0.75  # peak memory of all processes <= 0.75x the uncompressed size
TARGET_TBP_RATIO = 15.0  # torch-tb-profiler / report >= 15x
# issue 39's, tighter: wall <= 0.6x the floor's, CPU <= 1.0x the floor's, peak <= 0.5x the JSON
TARGET39_FLOOR_RATIO = 0.6
TARGET39_CPU_RATIO = 1.0
TARGET39_MEMORY_RATIO = 0.5


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
    if mode in ("floor-loader", "floor-isal"):
        from typing import List

        import msgspec

        from tb_bottleneck_plugin.trace import loader

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

    elif mode in ("ours", "ours-1proc"):
        from tb_bottleneck_plugin.trace import loader

        def op():
            trace = loader.load_trace(path)
            info["events"] = trace.meta.event_count
            info["rows"] = {"cpu": len(trace.cpu), "gpu": len(trace.gpu), "runtime": len(trace.runtime),
                            "memory": len(trace.memory)}
            return trace

    elif mode == "hta":
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.disable(logging.WARNING)
        # HTA reads a directory of rank files: the trace alone in a directory of its own.
        trace_dir = Path(cache_dir) / "hta_trace"
        trace_dir.mkdir()
        (trace_dir / os.path.basename(path)).symlink_to(os.path.abspath(path))

        def op():
            analyzer = TraceAnalysis(trace_dir=str(trace_dir))
            breakdown = analyzer.get_temporal_breakdown(visualize=False)
            info["ranks"] = len(analyzer.t.traces)
            info["breakdown_rows"] = len(breakdown)
            return analyzer, breakdown

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
    # The loader may decode in worker processes (loader_workers._Worker): the load ends
    # and joins them itself, so their CPU time is already in RUSAGE_CHILDREN.
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


def _bytecode_env(env: dict) -> dict:
    """Every line reads its modules' bytecode from a cache, as an installed package (pip
    compiles at install) and torch-tb-profiler/HTA from site-packages do. With
    PYTHONDONTWRITEBYTECODE=1 (set on the development machines) each run would compile
    our ~100 modules again (~0.25 s), a cost no user pays."""
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def compile_sources() -> None:
    """Fill the bytecode cache once, before any timed run."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "tb_bottleneck_plugin"),
                    str(FLOOR_SCRIPT), str(Path(__file__).resolve())],
                   env=_bytecode_env(dict(os.environ)), check=False, capture_output=True)


def _command(mode: str, path: str, result_path: Path, tmp: str, hta_python) -> list:
    if mode == "floor":
        return [sys.executable, str(FLOOR_SCRIPT), path]
    if mode in ("report", "report-1proc", "report-1worker", "report-workers"):
        return [sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", path, "--json"]
    python = str(hta_python) if mode == "hta" else sys.executable
    return [python, str(Path(__file__).resolve()), "--child", mode, path, "--result", str(result_path),
            "--cache-dir", tmp]


def run_child(mode: str, path: str, out_dir: Path, timeout: float, hta_python=None) -> dict:
    """One fresh process measuring `mode`. Returns its numbers, or {'error': ...}.

    "seconds" is the whole process (start to exit, as a user waits). While it runs, this
    process samples the memory of its whole process tree (decode workers, analysis
    children, HTA's pool): the sum of RSS every 20 ms and the sum of PSS every 100 ms.
    The tree's peak is never reported below the ru_maxrss that wait4 returns (the largest
    single process of the tree, children reaped by it included)."""
    log_path = out_dir / f"child-{mode.replace('+', '_')}.log"
    env = _bytecode_env(dict(os.environ))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if mode in ("ours-1proc", "report-1proc"):
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = "0"
    if mode == "report-1worker":
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = "1"
    if mode == "report-workers":
        env["TB_BOTTLENECKS_DECODE_PROCESSES"] = str(REPORT_WORKERS)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        result_path = Path(tmp) / "result.json"
        stdout_path = Path(tmp) / "stdout"
        cmd = _command(mode, path, result_path, tmp, hta_python)
        tree_rss = tree_pss = 0
        with open(log_path, "w") as log, open(stdout_path, "wb") as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=out, stderr=log, env=env)
            deadline = time.monotonic() + timeout
            tick = 0
            status = usage = None
            while True:
                pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    seconds = time.perf_counter() - t0
                    status, usage = st, ru
                    proc.returncode = os.waitstatus_to_exitcode(st)
                    break
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
        del status
        maxrss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        r = {"mode": mode, "info": {}}
        if mode == "floor":  # decode_floor.py prints "<n> events <t>s"
            words = stdout_path.read_text().split()
            r["op_seconds"] = float(words[2].rstrip("s"))
            r["info"]["events"] = int(words[0])
        elif mode in ("report", "report-1proc", "report-1worker", "report-workers"):
            rep = json.loads(stdout_path.read_bytes())
            r["info"] = {"recommendations": len(rep.get("recommendations") or []), "errors": len(rep.get("errors") or []),
                         "avg_step_us": rep.get("avg_step_us"), "json_bytes": stdout_path.stat().st_size}
        else:
            if not result_path.exists():
                return {"error": "no result written"}
            child = json.loads(result_path.read_text())
            r.update({"op_seconds": child["seconds"], "info": child["info"],
                      "imports_rss_bytes": child["baseline_rss_bytes"]})
        r["seconds"] = seconds
        r["cpu_seconds"] = usage.ru_utime + usage.ru_stime  # the process and every descendant it reaped
        r["main_rss_bytes"] = maxrss
        r["tree_rss_bytes"] = max(tree_rss, maxrss)
        r["tree_pss_bytes"] = tree_pss or None
        return r


def summarize(results: list) -> dict:
    """Best time of the runs; memory is the max over runs (the conservative number)."""
    best = min(results, key=lambda r: r["seconds"])
    tree_rss = max(r["tree_rss_bytes"] for r in results)
    pss = [r["tree_pss_bytes"] for r in results if r.get("tree_pss_bytes")]
    imports = [r["imports_rss_bytes"] for r in results if r.get("imports_rss_bytes")]
    ops = [r["op_seconds"] for r in results if r.get("op_seconds") is not None]
    return {
        "runs_s": [round(r["seconds"], 3) for r in results],
        "best_s": round(best["seconds"], 3),  # whole process
        "op_best_s": round(min(ops), 3) if ops else None,  # the operation alone, where known
        "cpu_s_of_best": round(best["cpu_seconds"], 3),  # the process tree
        "peak_rss_mb": round(tree_rss / MB, 1),  # all processes of the measurement, max over runs
        "peak_pss_mb": round(max(pss) / MB, 1) if pss else None,
        "main_ru_maxrss_mb": round(max(r["main_rss_bytes"] for r in results) / MB, 1),
        "imports_rss_mb": round(max(imports) / MB, 1) if imports else None,
        "info": best["info"],
    }


def measure_all(modes: list, path: str, runs: dict, out_dir: Path, timeout: float, hta_python=None) -> dict:
    """Round-robin over the lines (floor, ours, report, tbp, hta, floor, ...) so that load
    from other processes on the machine hits every line alike; best of each line's runs."""
    raw = {m: [] for m in modes}
    failed = {}
    for i in range(max(runs.values())):
        for mode in modes:
            if i >= runs[mode] or (mode in failed and not raw[mode] and i >= 2):
                continue  # failed twice without a success: given up
            r = run_child(mode, path, out_dir, timeout, hta_python)
            if "error" in r:  # kept going: the tree may be mid-edit (other people's work), or a run flaky
                failed[mode] = r
                print(f"  {mode:<12} run {i + 1}/{runs[mode]}: FAILED {r['error']}", flush=True)
                continue
            raw[mode].append(r)
            op = f" (op {r['op_seconds']:.2f} s)" if r.get("op_seconds") is not None else ""
            print(f"  {mode:<12} run {i + 1}/{runs[mode]}: {r['seconds']:7.2f} s{op}, cpu {r['cpu_seconds']:6.2f} s, "
                  f"peak {r['tree_rss_bytes'] / MB:5.0f} MB, load {os.getloadavg()[0]:.1f}", flush=True)
    out = {}
    for mode in modes:
        if not raw[mode]:
            out[mode] = {"error": failed[mode]["error"]}
        else:
            out[mode] = summarize(raw[mode])
            if mode in failed:
                out[mode]["failed_runs"] = failed[mode]["error"]
    return out


LABELS = {
    "floor": "decode floor: shared decode_floor.py (REFERENCE)",
    "floor-loader": "floor, loader's schema (info)",
    "floor-isal": "floor, loader's schema, isal gunzip (info)",
    "ours": "ours: loader.load_trace",
    "ours-1proc": "ours: load_trace, DECODE_PROCESSES=0",
    "report": "ours: tb-bottlenecks report FILE --json",
    "report-1proc": "same, TB_BOTTLENECKS_DECODE_PROCESSES=0",
    "report-1worker": "same, TB_BOTTLENECKS_DECODE_PROCESSES=1",
    "report-workers": "same, TB_BOTTLENECKS_DECODE_PROCESSES=2",
    "tbp": "torch-tb-profiler 0.4.3 parse + run profile",
    "hta": "HTA (traceinsight 0.6, else 0.5.0) parse + temporal breakdown",
}
ORDER = ("floor", "floor-loader", "floor-isal", "ours", "ours-1proc", "report", "report-1proc", "report-1worker",
         "report-workers", "tbp", "hta")
REPORT_WORKERS = 2  # decode worker processes of the report-workers line


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(res: dict, trace: dict, runs: dict, skipped: dict) -> dict:
    size_mb = trace["json_bytes"] / MB
    floor = res.get("floor", {}).get("best_s")
    tbp = res.get("tbp", {}).get("best_s")
    floor_cpu = res.get("floor", {}).get("cpu_s_of_best")
    tbp_cpu = res.get("tbp", {}).get("cpu_s_of_best")
    print()
    print(f"trace: {trace['path']}")
    what = f"{trace['times']} x {Path(trace['source']).name}" if trace.get("source") else "as given"
    gz = f"gzip {trace['gzip_bytes'] / MB:.1f} MB" if trace.get("gzip_bytes") else "not compressed"
    print(f"  {what}; uncompressed {size_mb:.1f} MB ({trace['json_bytes'] / 2**20:.1f} MiB), {gz}")
    print(f"  fresh process per run, interleaved, best of {max(runs.values())} (tbp/hta: {runs.get('tbp', '-')}/"
          f"{runs.get('hta', '-')}). time = whole process; op = the operation alone; cpu = CPU s of the")
    print("  process tree. peak = max sum of RSS over the process and all its descendants, pss = the same as")
    print("  PSS, main = ru_maxrss (largest single process), imports = RSS after imports; MB = 10^6 B")
    head = (f"{'line':<50} {'time s':>7} {'op s':>6} {'cpu s':>6} {'peak MB':>7} {'pss':>5} {'main':>5} "
            f"{'imports':>7} {'x floor':>7} {'cpu x fl':>8} {'peak/size':>9} {'tbp/x':>6} {'tbp/x cpu':>9}")
    print(head)
    print("-" * len(head))
    for mode in ORDER:
        r = res.get(mode)
        if r is None:
            if mode in skipped:
                print(f"{LABELS[mode]:<50} skipped: {skipped[mode]}")
            continue
        if "error" in r:
            print(f"{LABELS[mode]:<50} FAILED: {r['error']}")
            continue
        t = r["best_s"]
        r["ratio_to_floor"] = round(t / floor, 2) if floor else None
        r["tbp_over_this"] = round(tbp / t, 1) if tbp else None
        r["peak_over_size"] = round(r["peak_rss_mb"] / size_mb, 2)
        # CPU seconds of the process tree: less sensitive to other jobs on the machine than
        # wall time (but blind to overlap: a line that uses two cores shows its sum)
        r["cpu_ratio_to_floor"] = round(r["cpu_s_of_best"] / floor_cpu, 2) if floor_cpu else None
        r["tbp_cpu_over_this"] = round(tbp_cpu / r["cpu_s_of_best"], 1) if tbp_cpu else None
        print(f"{LABELS[mode]:<50} {t:7.2f} {_fmt(r['op_best_s'], '6.2f')} {r['cpu_s_of_best']:6.2f} "
              f"{r['peak_rss_mb']:7.0f} {_fmt(r['peak_pss_mb'], '5.0f')} {r['main_ru_maxrss_mb']:5.0f} "
              f"{_fmt(r['imports_rss_mb'], '7.0f')} {_fmt(r['ratio_to_floor'], '7.2f')} "
              f"{_fmt(r['cpu_ratio_to_floor'], '8.2f')} {r['peak_over_size']:9.2f} {_fmt(r['tbp_over_this'], '6.1f')} "
              f"{_fmt(r['tbp_cpu_over_this'], '9.1f')}")
    print()
    targets = []
    rep = res.get("report", {})
    if "best_s" in rep and floor:
        v = rep["best_s"] / floor
        targets.append({"target": f"full report <= {TARGET_FLOOR_RATIO}x the decode floor", "value": round(v, 2),
                        "threshold": TARGET_FLOOR_RATIO, "met": v <= TARGET_FLOOR_RATIO})
    if "peak_rss_mb" in rep:
        v = rep["peak_rss_mb"] / size_mb
        targets.append({"target": f"full report peak RSS of all processes <= {TARGET_MEMORY_RATIO}x the "
                                  f"uncompressed size ({TARGET_MEMORY_RATIO * size_mb:.0f} MB)",
                        "value": round(v, 2), "threshold": TARGET_MEMORY_RATIO, "met": v <= TARGET_MEMORY_RATIO})
    if "best_s" in rep and tbp:
        v = tbp / rep["best_s"]
        targets.append({"target": f"torch-tb-profiler / full report >= {TARGET_TBP_RATIO:.0f}x", "value": round(v, 1),
                        "threshold": TARGET_TBP_RATIO, "met": v >= TARGET_TBP_RATIO})
    if "best_s" in rep and floor:
        v = rep["best_s"] / floor
        targets.append({"target": f"issue 39: full report <= {TARGET39_FLOOR_RATIO}x the decode floor's wall",
                        "value": round(v, 2), "threshold": TARGET39_FLOOR_RATIO, "met": v <= TARGET39_FLOOR_RATIO})
    if rep.get("cpu_ratio_to_floor") is not None:
        v = rep["cpu_ratio_to_floor"]
        targets.append({"target": f"issue 39: full report CPU <= {TARGET39_CPU_RATIO}x the decode floor's CPU",
                        "value": v, "threshold": TARGET39_CPU_RATIO, "met": v <= TARGET39_CPU_RATIO})
    if "peak_rss_mb" in rep:
        v = rep["peak_rss_mb"] / size_mb
        targets.append({"target": f"issue 39: peak RSS <= {TARGET39_MEMORY_RATIO}x the uncompressed size "
                                  f"({TARGET39_MEMORY_RATIO * size_mb:.0f} MB)",
                        "value": round(v, 2), "threshold": TARGET39_MEMORY_RATIO, "met": v <= TARGET39_MEMORY_RATIO})
    for t in targets:
        print(f"  [{'met   ' if t['met'] else 'MISSED'}] {t['target']}: {t['value']} (threshold {t['threshold']})")
    if rep.get("cpu_ratio_to_floor") is not None:
        print(f"  (CPU seconds, less noisy on a busy machine: report {rep['cpu_ratio_to_floor']}x the floor's, "
              f"torch-tb-profiler {rep.get('tbp_cpu_over_this')}x the report's)")
    return {"targets": targets}


def hta_python(venv: Path, install: bool, requirements=HTA_REQUIREMENTS):
    """The venv's interpreter with HTA importable, created if missing; (python or None, why not)."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import hta, pandas; from hta.trace_analysis import TraceAnalysis"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python, None
    if not install:
        return None, f"no HTA in {venv} (run without --no-hta-install to create it)"
    print(f"installing {' '.join(requirements)} into {venv} ...", flush=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True,
                       capture_output=True, timeout=1200)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        lines = [x for x in err.decode(errors="replace").splitlines() if "WARNING" not in x][-2:]
        return None, f"could not install HTA into {venv}: {exc} {' | '.join(lines)}"
    if subprocess.run(check, capture_output=True).returncode != 0:
        return None, f"HTA installed into {venv} but does not import"
    return python, None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to scale (default: %(default)s)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="cache for the scaled trace (default: %(default)s)")
    p.add_argument("--times", type=int, default=DEFAULT_TIMES,
                   help="copies of the source in the scaled trace (default %(default)s: ~292 MB of JSON)")
    p.add_argument("--trace", type=Path, help="benchmark this file as is instead of building one")
    p.add_argument("--rebuild", action="store_true", help="rebuild the scaled trace even if cached")
    p.add_argument("--runs", type=int, default=3, help="fresh processes per line; the best time counts (default 3)")
    p.add_argument("--tbp-runs", type=int, help="runs for torch-tb-profiler and HTA (default: --runs)")
    p.add_argument("--lines", help="comma-separated subset of: " + ",".join(ORDER))
    p.add_argument("--skip-tbp", action="store_true", help="skip torch-tb-profiler (~40 s and ~1.5 GB per run)")
    p.add_argument("--skip-hta", action="store_true", help="skip Holistic Trace Analysis (~35 s and ~1.3 GB per run)")
    p.add_argument("--hta-venv", type=Path, default=HTA_VENV, help="venv with HTA 0.5.0 (default: %(default)s)")
    p.add_argument("--traceinsight-venv", type=Path, default=TRACEINSIGHT_VENV,
                   help="venv with traceinsight 0.6, tried before --hta-venv (default: %(default)s)")
    p.add_argument("--no-hta-install", action="store_true", help="do not create the HTA venv if it is missing")
    p.add_argument("--skip-workers", action="store_true",
                   help="skip the report with decode worker processes (TB_BOTTLENECKS_DECODE_PROCESSES=2)")
    p.add_argument("--with-info-floors", action="store_true",
                   help="also the loader-schema floors (floor-loader, floor-isal), information only")
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
    compile_sources()
    with open(path, "rb") as f:  # warm the page cache so run 1 is not a disk benchmark
        while f.read(8 << 20):
            pass

    skipped = {}
    modes = ["floor"]
    if a.with_info_floors:
        modes.append("floor-loader")
        try:
            import isal  # noqa: F401
            modes.append("floor-isal")
        except ImportError:
            skipped["floor-isal"] = "isal is not installed"
    modes += ["ours", "report"]  # the full report: what a user waits for
    if not a.skip_workers:
        modes += ["report-1proc", "report-1worker", "report-workers"]
    if os.environ.get("TB_BOTTLENECKS_DECODE_PROCESSES", "0") not in ("", "0"):
        modes.append("ours-1proc")
    if a.skip_tbp:
        skipped["tbp"] = "--skip-tbp"
    else:
        modes.append("tbp")
    hta_py = None
    if a.skip_hta:
        skipped["hta"] = "--skip-hta"
    else:
        hta_py, why = hta_python(a.traceinsight_venv, not a.no_hta_install, TRACEINSIGHT_REQUIREMENTS)
        if hta_py is None:
            print(f"traceinsight 0.6 unavailable ({why}); trying HTA 0.5.0", flush=True)
            hta_py, why = hta_python(a.hta_venv, not a.no_hta_install)
        if hta_py is None:
            skipped["hta"] = why
            print(f"HTA skipped: {why}", flush=True)
        else:
            modes.append("hta")
    if a.lines:
        wanted = a.lines.split(",")
        modes = [m for m in ORDER if m in wanted and (m in modes or m in ("floor-loader", "floor-isal", "ours-1proc"))]
    runs = {m: ((a.tbp_runs or a.runs) if m in ("tbp", "hta") else a.runs) for m in modes}
    load_before = os.getloadavg()
    print(f"load average before: {_load(load_before)} on {os.cpu_count()} CPUs", flush=True)
    res = measure_all(modes, path, runs, a.out_dir, a.timeout, hta_py)
    load_after = os.getloadavg()
    summary = print_table(res, trace, runs, skipped)
    print(f"  load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)} on {os.cpu_count()} CPUs"
          " (other processes on the machine make the times noisy; compare ratios)")

    if a.json:
        doc = {
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                     "platform": platform.platform()},
            "versions": _versions(hta_py),
            "trace": trace,
            "uncompressed_mb": round(trace["json_bytes"] / MB, 1),
            "runs": runs,
            "load_average_before": load_before, "load_average_after": load_after,
            "results": res, "skipped": skipped,
            **summary,
        }
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1))
        print(f"\nwrote {a.json}")
    return 0


def _load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def _versions(hta_py=None) -> dict:
    out = {}
    for name in ("msgspec", "numpy", "isal", "torch_tb_profiler", "pandas"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 (informational only)
            out[name] = None
    if hta_py is not None:
        for dist in ("traceinsight", "HolisticTraceAnalysis"):
            r = subprocess.run([str(hta_py), "-c", "import importlib.metadata as m, pandas; "
                                f"print(m.version({dist!r}), pandas.__version__)"],
                               capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.split():
                out["hta_package"] = dist
                out["hta"], out["hta_pandas"] = r.stdout.split()[:2]
                break
    return out


if __name__ == "__main__":
    sys.exit(main())
