#!/usr/bin/env python3
"""Step timeline speed on the big benchmark trace (issue 15: every request < 100 ms after load).

    python benchmarks/bench_timeline.py [--times 9] [--requests 200] [--px 1600] [--json OUT]

1. Builds (or reuses) the scaled resnet50 trace of bench_load.py (`build_trace`, K copies,
   ~32.5 MB of JSON each) under benchmarks/out/.
2. Loads it once (loader.load_trace), builds the timeline store once (what the analysis
   child does per span: analysis/timeline.build_store), saves and reloads it as the
   service's .npz.
3. Times what one `timeline` request costs the server after that: analysis.timeline.window
   (numpy level of detail, at most 4,000 rectangles) plus the JSON encoding of the answer,
   for (a) the whole default step and every step, (b) random zoom windows of random steps,
   (c) the same on ONE window holding the whole trace (the ProfilerStep names hidden, as a
   trace without steps: every event of the file in one "step"), the worst case for the
   level of detail. Also the step_trace export of one step.
Prints min / median / p95 / max per kind and the target verdict; --json writes all numbers.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_load import DEFAULT_OUT, DEFAULT_SOURCE, DEFAULT_TIMES, build_trace  # noqa: E402

from tb_bottleneck_plugin.trace import loader  # noqa: E402
from tb_bottleneck_plugin.analysis import timeline as tl  # noqa: E402
from tb_bottleneck_plugin.views import timeline_window as tw  # noqa: E402
from tb_bottleneck_plugin.routes import json_text  # noqa: E402

TARGET_MS = 100.0


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def request_ms(store, step, t0, t1, px):
    """One request as the route serves it: window, JSON text (routes.json_text), and
    the gzip TensorBoard's http_util.Respond applies (level 3) for a browser."""
    def run():
        body = tw.window(store, step, t0, t1, px=px, cap=tw.DEFAULT_CAP)
        text = json_text(body)
        gzip.compress(text.encode(), compresslevel=3)
        return body, text
    (body, text), ms = _timed(run)
    return ms, body["rects"], len(text)


def summary(values):
    v = sorted(values)
    return {"n": len(v), "min": v[0], "median": statistics.median(v), "p95": v[min(len(v) - 1, int(0.95 * len(v)))],
            "max": v[-1]}


def bench_store(store, requests, px, rnd, label):
    out = {}
    nums = [int(n) for n in store["step_number"]]
    default = tw.window(store)["step"]
    full = [request_ms(store, None, None, None, px)] + [request_ms(store, n, None, None, px) for n in nums]
    out["full_step"] = full
    zoom = []
    for _ in range(requests):
        n = rnd.choice(nums)
        i = tw.step_index(store, n)
        dur = float(store["step_end"][i] - store["step_start"][i])
        width = dur * 10 ** rnd.uniform(-4, 0)
        a = rnd.uniform(0, max(0.0, dur - width))
        zoom.append(request_ms(store, n, a, a + width, px))
    out["zoom"] = zoom
    doc, export_ms = _timed(lambda: tw.chrome_trace(store, default))
    text, dump_ms = _timed(lambda: json.dumps(doc))
    res = {"label": label, "steps": len(nums), "events": int(len(store["ev_ts"])),
           "store_bytes": int(sum(v.nbytes for v in store.values())), "export_ms": export_ms + dump_ms,
           "export_events": doc["otherData"]["events_exported"], "export_events_total": doc["otherData"]["events_total"],
           "export_bytes": len(text)}
    for kind, rows in out.items():
        res[kind] = {"ms": summary([r[0] for r in rows]), "rects_max": max(r[1] for r in rows),
                     "json_bytes_max": max(r[2] for r in rows)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--times", type=int, default=DEFAULT_TIMES)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--trace", type=Path, help="use this trace file instead of building one")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--px", type=int, default=1600)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    if args.trace:
        path, meta = args.trace, {"path": str(args.trace)}
    else:
        meta = build_trace(args.source, args.out_dir, args.times, False)
        path = Path(meta["path"])
    print(f"trace: {path} ({meta.get('json_bytes', os.path.getsize(path)) / 1e6:.0f} MB of JSON)", flush=True)
    trace, load_ms = _timed(lambda: loader.load_trace(str(path)))
    print(f"load: {load_ms / 1e3:.1f} s (once per span, in the analysis process)", flush=True)
    store, build_ms = _timed(lambda: tl.build_store(trace))
    print(f"build_store alone: {build_ms / 1e3:.2f} s, {len(store['ev_ts']):,} events, "
          f"{sum(v.nbytes for v in store.values()) / 1e6:.1f} MB", flush=True)
    # what the analysis child does: the report, then the store from the report's per-span
    # context (steps and category unions shared), in CPU seconds (a shared machine is noisy)
    from tb_bottleneck_plugin import report

    def cpu(fn):
        t = time.process_time()
        out = fn()
        return out, (time.process_time() - t) * 1e3
    _, report_cpu_ms = cpu(lambda: report.analyze_trace(trace))
    with_store, both_cpu_ms = cpu(lambda: report.analyze_trace(trace, timeline=True))
    _, alone_cpu_ms = cpu(lambda: tl.build_store(trace))
    assert all(np.array_equal(with_store["timeline_store"][k], store[k]) for k in store)
    del with_store
    print(f"report {report_cpu_ms / 1e3:.2f} s CPU; report + store from its context {both_cpu_ms / 1e3:.2f} s CPU "
          f"(store {max(both_cpu_ms - report_cpu_ms, 0) / 1e3:.2f} s) vs store alone {alone_cpu_ms / 1e3:.2f} s CPU",
          flush=True)
    with tempfile.TemporaryDirectory() as d:
        npz = Path(d) / "s.timeline.npz"
        _, save_ms = _timed(lambda: np.savez(npz, **store))
        npz_bytes = npz.stat().st_size

        def reload():
            with np.load(npz, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        store, npz_load_ms = _timed(reload)
    print(f"npz: {npz_bytes / 1e6:.1f} MB, save {save_ms:.0f} ms, load {npz_load_ms:.0f} ms (first request after a restart)")

    rnd = random.Random(args.seed)
    results = [bench_store(store, args.requests, args.px, rnd, "per step")]
    # worst case: the whole trace as one window (a trace without ProfilerStep)
    trace.strings = [s.replace("ProfilerStep#", "ProfilerStep_hidden#") for s in trace.strings]
    one, one_build_ms = _timed(lambda: tl.build_store(trace))
    del trace
    big = bench_store(one, max(20, args.requests // 4), args.px, rnd, "one window = whole trace")
    big["build_ms"] = one_build_ms
    results.append(big)

    worst = 0.0
    print(f"\n{'store':<26} {'kind':<10} {'n':>4} {'min ms':>8} {'median':>8} {'p95':>8} {'max':>8} {'rects max':>9}")
    for r in results:
        for kind in ("full_step", "zoom"):
            s = r[kind]["ms"]
            worst = max(worst, s["max"])
            print(f"{r['label']:<26} {kind:<10} {s['n']:>4} {s['min']:>8.1f} {s['median']:>8.1f} {s['p95']:>8.1f} "
                  f"{s['max']:>8.1f} {r[kind]['rects_max']:>9}")
        print(f"{r['label']:<26} events {r['events']:,}, steps {r['steps']}, export of one step {r['export_ms']:.0f} ms, "
              f"{r['export_events']:,} of {r['export_events_total']:,} events, {r['export_bytes'] / 1e6:.1f} MB")
    verdict = "met" if worst < TARGET_MS else "MISSED"
    print(f"\nslowest request {worst:.1f} ms: target < {TARGET_MS:.0f} ms {verdict}; load avg {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"trace": str(path), "json_bytes": meta.get("json_bytes"),
                                         "load_ms": load_ms, "build_store_ms": build_ms, "npz_bytes": npz_bytes,
                                         "report_cpu_ms": report_cpu_ms, "report_and_store_cpu_ms": both_cpu_ms,
                                         "store_alone_cpu_ms": alone_cpu_ms,
                                         "npz_save_ms": save_ms, "npz_load_ms": npz_load_ms, "results": results,
                                         "worst_request_ms": worst, "target_ms": TARGET_MS,
                                         "loadavg": os.getloadavg()}, indent=1))
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
