"""In-process CPU seconds of one span's analysis (report.analyze_trace with the timeline
store, as the service runs it) on an already-loaded trace, and how many times the shared
per-span pieces are computed (linking.gpu_runtime_index, linking.calls_inside, the CPU op
nesting).

    python3 benchmarks/bench_analysis_span.py [TRACE] [--repeat N] [--out FILE]

Default trace: ../shared/traces/kineto-tb-samples/resnet50_num_workers_0 (first file).
Prints the median/min CPU seconds (time.process_time) over N runs and the call counts."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# BENCH_PACKAGE_ROOT: a directory holding another tb_bottleneck_plugin (an older copy), to
# time before/after side by side under the same machine load
sys.path.insert(0, os.environ.get("BENCH_PACKAGE_ROOT") or str(ROOT))

from tb_bottleneck_plugin.trace import loader  # noqa: E402
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import linking, operators  # noqa: E402

DEFAULT = ROOT.parent / "shared/traces/kineto-tb-samples/resnet50_num_workers_0"


def _counting(module, name, counts):
    """Count calls of module.name, wherever the analysis modules hold that function."""
    real = getattr(module, name)

    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return real(*a, **k)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tb_bottleneck_plugin") and getattr(mod, name, None) is real:
            setattr(mod, name, wrapper)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("trace", nargs="?", default=str(DEFAULT))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args(argv)
    path = Path(a.trace)
    if path.is_dir():
        path = sorted(path.glob("*.json*"))[0]
    trace = loader.load_trace(str(path))
    report.analyze_trace(trace, timeline=True)  # warm-up (imports, regex caches)
    times = []
    for _ in range(a.repeat):
        t0 = time.process_time()
        report.analyze_trace(trace, timeline=True)
        times.append(time.process_time() - t0)
    counts: dict = {}
    nesting = "_nesting" if hasattr(operators, "_nesting") else None
    _counting(linking, "gpu_runtime_index", counts)
    _counting(linking, "calls_inside", counts)  # calls, selections from the span's pairs included
    _counting(linking, "_thread_ids", counts)  # the pairs actually computed (one per computation)
    if nesting:
        _counting(operators, nesting, counts)
    from tb_bottleneck_plugin.analysis import timeline
    if hasattr(timeline, "_nesting_depth"):
        _counting(timeline, "_nesting_depth", counts)
    report.analyze_trace(trace, timeline=True)
    doc = {"trace": str(path), "events": {"cpu": len(trace.cpu), "runtime": len(trace.runtime), "gpu": len(trace.gpu)},
           "repeat": a.repeat, "cpu_s_median": statistics.median(times), "cpu_s_min": min(times),
           "cpu_s": times, "calls_per_span": counts}
    print(json.dumps(doc, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
