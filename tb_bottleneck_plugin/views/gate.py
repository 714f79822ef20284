"""`tb-bottlenecks diff` and `tb-bottlenecks check`: the comparison in a terminal and a
CI gate over it (METRICS.md §11, README "Compare runs and gate CI").

    tb-bottlenecks diff BASE CAND [--json]
    tb-bottlenecks check PATH --max input_bound_pct=5 --min tensor_core_pct=40 \\
        [--baseline BASE --max-regression avg_step_us=5%] [--peak-tflops 989]

PATH, BASE, CAND: a trace file or a run directory (local or URL). Exit codes of
`check`: 0 every bound holds; 1 some bound is violated (one line each on stdout; a
metric that is n/a violates its bound); 2 unreadable input or a bad argument (unknown
metric name, malformed bound). `diff` exits 0, or 2 on unreadable input. `check
--baseline` on runs whose setup differs (GPU, mode, world size) prints diff's WARNING
line on stderr; the exit code is unchanged.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable, List, Optional, Tuple

from . import compare as cmp_mod
from . import headline

ALIASES = {"avg_step_ms": ("avg_step_us", 1e-3)}  # name -> (metric, factor applied to its value)


def gate_metrics() -> Tuple[str, ...]:
    """The names `check` takes: every headline number (views/headline.py, from the metric
    units), then the aliases, then the run-level rows' patterns (compare.run_metric_names:
    ``straggler_gap_us``, ``busbw_gbps.<kind>``, ``input_wait_us_per_step.rank<N>``, ...)."""
    return tuple(m.key for m in headline.metrics()) + tuple(ALIASES) + cmp_mod.run_metric_names()


def _known(name: str) -> bool:
    return name in gate_metrics() or cmp_mod.run_metric(name) is not None


def _direction(metric: str) -> Optional[str]:
    found = next((m.direction for m in headline.metrics() if m.key == metric), None)
    run = cmp_mod.run_metric(metric)
    return run.direction if found is None and run is not None else found


GATE_METRICS = gate_metrics()  # at import; parse_bound asks gate_metrics() at call time


class InputError(Exception):
    """Unreadable input or a bad argument: exit code 2."""


# ---------------------------------------------------------------------------- argparse


def _metric_help() -> str:
    lines = ["metrics (direction of better):"]
    for m in headline.metrics():
        key, better, unit = m.key, m.direction or "neither", m.unit
        lines.append(f"  {key:<28} {unit:<10} {better}")
    lines.append(f"  {'avg_step_ms':<28} {'ms':<10} lower (avg_step_us / 1000)")
    lines.append("run-level (a run directory of several ranks; busbw also for one rank, waiting included):")
    for name in cmp_mod.run_metric_names():
        m = cmp_mod.run_metric(name.replace("<N>", "0").replace("<kind>", "all_reduce"))
        lines.append(f"  {name:<28} {m.unit:<10} {m.direction or 'neither'}")
    return "\n".join(lines)


def add_subcommands(sub) -> None:
    """The `diff` and `check` subcommands on the CLI's subparsers."""
    diff = sub.add_parser("diff", help="compare two runs (or trace files): baseline BASE, candidate CAND",
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_metric_help())
    diff.add_argument("base", help="baseline: trace file or run directory (local or URL)")
    diff.add_argument("cand", help="candidate: trace file or run directory (local or URL)")
    diff.add_argument("--json", action="store_true", help="print the compare object (docs/report-schema.md)")
    diff.add_argument("--batch-size", metavar="N[,M]",
                      help="samples per step, for throughput (N for both, or N,M for baseline,candidate)")
    diff.add_argument("--top", type=int, default=10, help="kernel/operator rows to print (default 10)")
    diff.add_argument("--html", metavar="FILE", help="also write a single-file HTML report of the comparison")
    add_peak_argument(diff)
    check = sub.add_parser(
        "check", help="CI gate: exit 1 when a metric violates a bound, 2 on unreadable input",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Exit 0 when every bound holds, 1 with one line per violated bound (a metric that "
                    "is n/a violates its bound), 2 on unreadable input or an unknown metric.",
        epilog=_metric_help())
    check.add_argument("path", help="candidate: trace file or run directory (local or URL)")
    check.add_argument("--max", action="append", default=[], metavar="METRIC=VALUE",
                       help="upper bound, in the metric's unit (e.g. input_bound_pct=5, avg_step_ms=250)")
    check.add_argument("--min", action="append", default=[], metavar="METRIC=VALUE",
                       help="lower bound (e.g. tensor_core_pct=40)")
    check.add_argument("--baseline", metavar="PATH", help="baseline run for --max-regression")
    check.add_argument("--max-regression", action="append", default=[], metavar="METRIC=VALUE[%]",
                       help="largest allowed change in the worse direction against --baseline: "
                            "relative with %% (avg_step_us=5%%), else in the metric's unit")
    check.add_argument("--batch-size", metavar="N[,M]", help="samples per step, for throughput_samples_per_s")
    check.add_argument("--html", metavar="FILE", help="also write a single-file HTML report (the gate's verdict and "
                       "the candidate's report), whether the gate passes or fails")
    add_peak_argument(check)


def add_peak_argument(parser) -> None:
    """``--peak-tflops`` of report, diff and check: BOTTLENECKS_PEAK_TFLOPS for the analysis."""
    parser.add_argument("--peak-tflops", default=None, metavar="PEAK",
                        help="the GPU's dense peak for MFU and the roofline, replacing the built-in table: "
                        "TFLOP/s for every precision (989) or per precision, hbm in GB/s "
                        "(bf16=989,fp32=67,hbm=3350); sets $BOTTLENECKS_PEAK_TFLOPS for the analysis")


def run(args, load: Callable[[str], dict]) -> int:
    """`diff` or `check`; ``load(path)``: the result of one trace file or run directory (the
    engine's ``run_result``, given by the CLI), InputError when there is none."""
    try:
        if args.command == "diff":
            return _diff(args, load)
        return _check(args, load)
    except InputError as exc:
        print(f"tb-bottlenecks: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a crash must never read as "bound violated" (1) in CI
        import traceback

        traceback.print_exc()
        print(f"tb-bottlenecks: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------------------- diff


def _batch_sizes(raw: Optional[str]) -> Tuple[Optional[float], Optional[float]]:
    if not raw:
        return None, None
    parts = raw.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise InputError(f"--batch-size: expected N or N,M, got {raw!r}") from None
    if len(values) not in (1, 2) or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise InputError(f"--batch-size: expected one or two positive numbers, got {raw!r}")
    return (values[0], values[-1])


def _diff(args, load) -> int:
    bs = _batch_sizes(args.batch_size)
    base, cand = load(args.base), load(args.cand)
    out = cmp_mod.compare(base, cand, base_batch_size=bs[0], cand_batch_size=bs[1],
                          base_label=args.base, cand_label=args.cand)
    if args.json:
        json.dump(out, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(cmp_mod.format_text(out, top=args.top))
    if getattr(args, "html", None):
        from . import html_report

        views = [html_report.view_of(base, f"Baseline: {args.base}", "base"),
                 html_report.view_of(cand, f"Candidate: {args.cand}", "cand")]
        _write_html(args.html, html_report.page_data("compare", views, compare=out,
                                                     title=f"Bottlenecks: {args.base} vs {args.cand}"))
    return 0


def _write_html(path: str, data: dict) -> None:
    from .html_report import write_html_report

    failed = write_html_report(path, data)
    if failed:
        raise InputError(failed)


# ---------------------------------------------------------------------------- check


def parse_bound(text: str, option: str, allow_relative: bool = False) -> Tuple[str, float, bool]:
    """'name=value' -> (name, value, relative). Unknown names raise InputError."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise InputError(f"{option} {text!r}: expected METRIC=VALUE")
    known = gate_metrics()
    if not _known(name):
        raise InputError(f"{option} {text!r}: unknown metric {name!r}; known metrics: " + ", ".join(known))
    relative = value.endswith("%") and allow_relative
    try:
        number = float(value[:-1] if relative else value)
    except ValueError:
        raise InputError(f"{option} {text!r}: {value!r} is not a number"
                         + ("" if allow_relative else " (a % suffix only works with --max-regression)")) from None
    if not math.isfinite(number):
        raise InputError(f"{option} {text!r}: the bound must be a finite number")
    return name, number, relative


def metric_value(result: dict, name: str, batch_size=None) -> Optional[float]:
    if cmp_mod.run_metric(name) is not None:
        return cmp_mod.run_value(result, name)[0]
    metric, factor = ALIASES.get(name, (name, 1.0))
    value = cmp_mod.headline_value(result, metric, batch_size)
    return None if value is None else value * factor


def _na_reason(result: dict, name: str, batch_size) -> str:
    if cmp_mod.run_metric(name) is not None:
        return cmp_mod.run_value(result, name)[1]
    return cmp_mod.headline_na_reason(result, ALIASES.get(name, (name, 1.0))[0], batch_size)


def _num(v: float) -> str:
    return f"{v:.6g}"


def evaluate(cand: dict, bounds_max, bounds_min, regressions=(), base: Optional[dict] = None,
             batch_sizes=(None, None)) -> List[str]:
    """One line per violated bound (empty: all hold). Bounds are parsed (name, value, rel)."""
    violations = []
    for (name, limit, _), kind in [(b, "max") for b in bounds_max] + [(b, "min") for b in bounds_min]:
        value = metric_value(cand, name, batch_sizes[1])
        if value is None:
            violations.append(f"{name} is n/a ({_na_reason(cand, name, batch_sizes[1])}); "
                              f"bound {kind} {_num(limit)}")
        elif (kind == "max" and value > limit) or (kind == "min" and value < limit):
            violations.append(f"{name} = {_num(value)} {'>' if kind == 'max' else '<'} {kind} {_num(limit)}")
    for name, limit, relative in regressions:
        metric = ALIASES.get(name, (name, 1.0))[0]
        better = _direction(metric)
        if better is None:
            raise InputError(f"--max-regression {name}: this metric has no better direction; use --max/--min")
        b = metric_value(base, name, batch_sizes[0])
        c = metric_value(cand, name, batch_sizes[1])
        if b is None or c is None:
            side = "baseline" if b is None else "candidate"
            violations.append(f"{name} is n/a in the {side}; max regression {_num(limit)}{'%' if relative else ''}")
            continue
        worse_by = (c - b) if better == cmp_mod.LOWER else (b - c)
        if relative:
            if b == 0:
                amount = math.inf if worse_by > 0 else 0.0
            else:
                amount = 100.0 * worse_by / abs(b)
            text = f"{amount:+.2f}%"
        else:
            amount, text = worse_by, f"{worse_by:+.6g}"
        if amount > limit:
            violations.append(f"{name} regressed by {text} ({_num(b)} -> {_num(c)}, {better} is better); "
                              f"max regression {_num(limit)}{'%' if relative else ''}")
    return violations


def _check(args, load) -> int:
    maxes = [parse_bound(t, "--max") for t in args.max]
    mins = [parse_bound(t, "--min") for t in args.min]
    regressions = [parse_bound(t, "--max-regression", allow_relative=True) for t in args.max_regression]
    for name, _, _ in regressions:
        if _direction(ALIASES.get(name, (name, 1.0))[0]) is None:
            raise InputError(f"--max-regression {name}: this metric has no better direction; use --max/--min")
    if regressions and not args.baseline:
        raise InputError("--max-regression needs --baseline PATH")
    if not (maxes or mins or regressions):
        raise InputError("no bound given: use --max, --min or --baseline with --max-regression")
    bs = _batch_sizes(args.batch_size)
    cand = load(args.path)
    base = load(args.baseline) if args.baseline else None
    if base is not None:
        # the same WARNING line as `diff` (compare.setup_warning), on stderr: stdout stays one
        # line per violated bound (or the ok line), the exit code is the bounds' alone
        warning = cmp_mod.setup_warning(cmp_mod.setup_differences(base["report"], cand["report"]))
        if warning:
            print(f"WARNING: {warning}", file=sys.stderr)
    violations = evaluate(cand, maxes, mins, regressions, base, (bs[0], bs[1]))
    for line in violations:
        print(f"FAIL {line}")
    count = len(maxes) + len(mins) + len(regressions)
    if not violations:
        print(f"ok: {count} bound(s) hold for {args.path}")
    if getattr(args, "html", None):  # written whether the gate passes or fails
        from . import html_report

        views = [html_report.view_of(cand, f"Candidate: {args.path}", "cand")]
        compared = None
        if base is not None:
            views.append(html_report.view_of(base, f"Baseline: {args.baseline}", "base"))
            compared = cmp_mod.compare(base, cand, base_batch_size=bs[0], cand_batch_size=bs[1],
                                       base_label=args.baseline, cand_label=args.path)
            views = views[::-1]  # baseline, candidate: the comparison's order
        summary = (f"{count} bound(s) hold for {args.path}" if not violations
                   else f"{len(violations)} of {count} bound(s) violated for {args.path}")
        check = {"ok": not violations, "summary": summary, "lines": [f"FAIL {v}" for v in violations],
                 "bounds": {"max": args.max, "min": args.min, "max_regression": args.max_regression,
                            "baseline": args.baseline}}
        _write_html(args.html, html_report.page_data("check", views, compare=compared, check=check,
                                                     title=f"Bottlenecks gate: {args.path}"))
    return 1 if violations else 0
