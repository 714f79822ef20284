"""`tb-bottlenecks`: the same reports as the tab, in a terminal or as JSON.

    tb-bottlenecks report PATH [--json]   PATH: a trace file, a run directory or a logdir
                                          (local path or URL such as gs://bucket/prefix)
    tb-bottlenecks demo OUTDIR [--quick]  write demo runs made with real PyTorch training
    tb-bottlenecks diff BASE CAND [--json]  compare two runs; `check PATH --max M=V ...` is a
                                          CI gate (gate.py: exit 1 on a violated bound)

Exit codes: 0 everything analysed; 1 some files could not be analysed (the others are
printed); 2 nothing could be analysed (bad path, no traces, broken file).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import List, Optional

from . import gate


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tb-bottlenecks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="analyse a trace file, a run directory or a logdir")
    rep.add_argument("path", help="trace file, run directory or logdir (local or URL, e.g. gs://b/p)")
    rep.add_argument("--json", action="store_true",
                     help="print JSON: the report object for a single file, else {runs: [...]}")
    demo = sub.add_parser("demo", help="generate demo runs with real PyTorch training (needs torch)")
    demo.add_argument("outdir")
    demo.add_argument("--quick", action="store_true", help="smaller, faster runs (for tests)")
    gate.add_subcommands(sub)  # diff, check (gate.py)
    args = parser.parse_args(argv)
    if args.command in ("diff", "check"):
        return gate.run(args)
    if args.command == "demo":
        from . import demo as demo_module

        return demo_module.main([args.outdir] + (["--quick"] if args.quick else []))
    return _report(args.path, as_json=args.json)


def _fail(message: str) -> int:
    print(f"tb-bottlenecks: {message}", file=sys.stderr)
    return 2


def _report(path: str, *, as_json: bool) -> int:
    from . import discovery, report
    from .errors import BottleneckError

    try:
        logdir = discovery.discover_path(path)
    except BottleneckError as exc:
        return _fail(str(exc))
    spans = [(run, worker, span) for run in logdir.runs for worker in run.workers for span in worker.spans]
    if not spans:
        return _fail(f"{path}: no PyTorch profiler trace files found "
                     "(expected *.pt.trace.json[.gz] or Kineto *.json[.gz] files)")
    results, errors = {}, []
    for run, worker, span in spans:
        try:
            results[span.url] = report.analyze_span(logdir.url, run, span)
        except BottleneckError as exc:
            errors.append(str(exc))
    if not results:
        for e in errors[1:]:
            print(f"tb-bottlenecks: {e}", file=sys.stderr)
        return _fail(errors[0])

    single_file = len(spans) == 1 and path.rstrip("/").endswith((".json", ".json.gz"))
    if as_json:
        if single_file:
            out = results[spans[0][2].url]["report"]
        else:
            out = {"schema_version": report.SCHEMA_VERSION, "logdir": logdir.url, "runs": [], "errors": errors}
            for run in logdir.runs:
                entry = {"run": run.name, "workers": []}
                for worker in run.workers:
                    ready = [results[s.url] for s in worker.spans if s.url in results]
                    entry["workers"].append({
                        "worker": worker.name,
                        "summary": report.combine_results(ready, run=run.name, worker=worker.name)["report"]
                        if len(ready) > 1 else (ready[0]["report"] if ready else None),
                        "spans": [r["report"] for r in ready],
                    })
                out["runs"].append(entry)
        json.dump(_json_safe(out), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for run in logdir.runs:
            print(f"run {run.name}")
            for worker in run.workers:
                for span in worker.spans:
                    if span.url in results:
                        print(report.format_text(results[span.url]["report"], indent="  "))
                    print()
        for e in errors:
            print(f"error: {e}")
    for e in errors:
        print(f"tb-bottlenecks: {e}", file=sys.stderr)
    return 1 if errors else 0


def _json_safe(value):
    """NaN/inf are not JSON: print them as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
