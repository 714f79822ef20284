"""`tb-bottlenecks`: the same reports as the tab, in a terminal or as JSON.

    tb-bottlenecks report PATH [--json]   PATH: a trace file, a run directory or a logdir
                                          (local path or URL such as gs://bucket/prefix)
        [--jobs N] [--memory SIZE]        spans analysed at once, one process each (default:
                                          the cores), within a memory budget (default: half
                                          the machine; each reserves ~0.8x its JSON size)
        [--dask tcp://host:8786]          analyse the spans on an existing Dask cluster
        [--html FILE]                     also write a self-contained HTML report (html_report.py)
        [--findings]                      print the findings JSON (views/findings.py, ≤ 8 KB a run)
        [--peak-tflops PEAK]              the GPU's peak for MFU (989, or bf16=989,hbm=3350)
    tb-bottlenecks mcp --logdir DIR       an MCP server over stdio for coding agents (mcp_server.py)
    tb-bottlenecks demo OUTDIR [--quick]  write demo runs made with real PyTorch training
    tb-bottlenecks diff BASE CAND [--json]  compare two runs; `check PATH --max M=V ...` is a
                                          CI gate (gate.py: exit 1 on a violated bound)

Exit codes: 0 every file gave a report (an analysis section that failed inside one is
printed as one line on stderr, the rest of the report is there); 1 some files could not
be read (the others are printed); 2 none could (bad path, no traces, broken file) or an
internal error; 130 interrupted (Ctrl-C); 141 the reader of stdout went away (`... | head`:
the rest of the output is dropped quietly, as a tool killed by SIGPIPE; every command).
`--debug` prints tracebacks; without it every error is one line.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import traceback
from typing import List, Optional

from .views import gate


EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a tool its pipe reader left


EXIT_CODES = """exit codes:
  0    every file gave a report (a failed section is one line on stderr) / the gate holds
  1    some files could not be read / a gate bound is violated / demo without torch
  2    nothing could be analysed, or an internal error (one line; --debug: the traceback)
  130  interrupted (Ctrl-C)
  141  the reader of stdout went away (`... | head`): the rest of the output is dropped
       quietly, as for a tool killed by SIGPIPE (0 when everything fit in the pipe)"""


class _StdoutClosed(BaseException):
    """The reader of stdout went away (``| head``). A BaseException, so that no
    ``except Exception`` on the way (gate.run, the report's last line of defence) turns it
    into an "internal error" with a traceback; `main` ends quietly with EXIT_PIPE_CLOSED."""


class _GuardedStdout:
    """sys.stdout while a command runs: a BrokenPipeError (EPIPE) from a write or flush
    becomes `_StdoutClosed`; everything else is the real stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise _StdoutClosed() from None

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise _StdoutClosed() from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_stdout(stream) -> None:
    """After the reader of the real stdout left: make ``sys.stdout`` None, so that the
    interpreter's last flush of what is still buffered (it flushes ``sys.stdout`` only)
    does not print "Exception ignored ... BrokenPipeError"; print() to None prints
    nothing. A stream that is not a real file (a test's capture) is left in place."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    sys.stdout = None


def main(argv: Optional[List[str]] = None) -> int:
    """The console script: exit codes 0 (ok), 1 (a gate failed / demo without torch),
    2 (an error, one line), 130 (Ctrl-C: one line, the traceback only with --debug),
    141 (stdout's reader went away, e.g. ``| head``: nothing printed on stderr)."""
    from .trace import heap

    heap.one_arena()  # this process analyses: one malloc arena for its threads (trace/heap.py)
    real = sys.stdout
    sys.stdout = _GuardedStdout(real)
    try:
        try:
            code = _main(argv)
            sys.stdout.flush()  # a closed pipe shows here when the output fit in the buffer
            return code
        finally:
            if isinstance(sys.stdout, _GuardedStdout):
                sys.stdout = real
    except (_StdoutClosed, BrokenPipeError):
        _drop_stdout(real)
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            traceback.print_exc()
        print("tb-bottlenecks: interrupted", file=sys.stderr)
        return 130


def _main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tb-bottlenecks", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="analyse a trace file, a run directory or a logdir")
    rep.add_argument("path", help="trace file, run directory or logdir (local or URL, e.g. gs://b/p)")
    rep.add_argument("--json", action="store_true",
                     help="print JSON: the report object for a single file, else {runs: [...]}")
    rep.add_argument("--debug", action="store_true",
                     help="print the Python traceback of internal errors (default: one line each)")
    rep.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                     help="spans analysed at once, one process each (default: the number of cores)")
    rep.add_argument("--memory", default=None, metavar="SIZE",
                     help="memory budget of the concurrent analyses, e.g. 8G (default: "
                     "$TB_BOTTLENECKS_ANALYSIS_MEMORY, else half the machine's memory)")
    rep.add_argument("--dask", default=None, metavar="ADDRESS",
                     help="analyse the spans on an existing Dask cluster, e.g. tcp://scheduler:8786 "
                     "(needs dask[distributed]; its workers must see PATH: a shared path or gs://)")
    rep.add_argument("--what-if", action="store_true", dest="what_if",
                     help="print the step model's what-if table (METRICS.md §19): each fix's predicted step time, "
                          "all fixes together, the critical path; with --json, the step_model sections")
    rep.add_argument("--findings", action="store_true",
                     help="print the findings as JSON (METRICS.md §20): the verdict, each recommendation with its "
                          "predicted gain and evidence ids, the assumptions; at most 8 KB per run")
    rep.add_argument("--html", default=None, metavar="FILE",
                     help="also write a single-file HTML report (cards, recommendations, step breakdown, "
                     "kernels, operators) that opens offline from disk")
    gate.add_peak_argument(rep)
    mcp = sub.add_parser("mcp", help="a Model Context Protocol server over stdio for coding agents (needs mcp)")
    mcp.add_argument("--logdir", action="append", required=True, metavar="DIR",
                     help="a logdir the tools may read (repeat for several); nothing outside them is read")
    mcp.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                     help="spans analysed at once, one process each (default: the cores)")
    demo = sub.add_parser("demo", help="generate demo runs with real PyTorch training (needs torch)")
    demo.add_argument("outdir")
    demo.add_argument("--quick", action="store_true", help="smaller, faster runs (for tests)")
    gate.add_subcommands(sub)  # diff, check (gate.py)
    args = parser.parse_args(argv)
    peak = getattr(args, "peak_tflops", None)
    if peak is not None:
        from .analysis import peaks

        if peaks.user_peaks(peak) is None:
            return _fail(f"--peak-tflops: expected TFLOP/s (989) or precision=value pairs "
                         f"(bf16=989,fp32=67,hbm=3350; hbm in GB/s), got {peak!r}")
        with _environ(peaks.ENV_PEAK, peak):  # the analysis children inherit it
            return _run(args)
    return _run(args)


@contextlib.contextmanager
def _environ(name: str, value: str):
    """``os.environ[name] = value`` for the block, then as it was."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def _run(args) -> int:
    if args.command in ("diff", "check"):
        return gate.run(args, _run_result)
    if args.command == "mcp":
        # the MCP front end: its own module, imported only by this command (the mcp SDK with it)
        from . import mcp_server

        return mcp_server.main([a for d in args.logdir for a in ("--logdir", d)]
                               + (["--jobs", str(args.jobs)] if args.jobs else []))
    if args.command == "demo":
        # The generator lives outside the runtime package (torch only in the demo extra);
        # without torch it prints one line with the pip command and returns 1.
        from tb_bottleneck_demo import generator as demo_module

        return demo_module.main([args.outdir] + (["--quick"] if args.quick else []))
    debug = args.debug
    pkg_log = logging.getLogger("tb_bottleneck_plugin")
    # Section errors are printed as one line each by _report; their tracebacks (logged by
    # report.py) go to stderr only with --debug. Without it a NullHandler in the hierarchy
    # keeps logging's last resort from printing them.
    handler = logging.StreamHandler(sys.stderr) if debug else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    pkg_log.addHandler(handler)
    if args.jobs is not None and args.jobs <= 0:
        return _fail("--jobs must be positive")
    budget = None
    if args.memory:
        from .serving.engine import parse_bytes

        try:
            budget = parse_bytes(args.memory)
        except ValueError as exc:
            return _fail(f"--memory: {exc}")
    try:
        return _report(args.path, as_json=args.json, debug=debug, jobs=args.jobs, memory_budget=budget,
                       dask_address=args.dask, html=args.html, what_if=args.what_if, findings=args.findings)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 2
        if debug:
            traceback.print_exc()
            return 2
        return _fail(f"internal error: {_describe(exc)} (run with --debug for the traceback)")
    finally:
        pkg_log.removeHandler(handler)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fail(message: str) -> int:
    print(f"tb-bottlenecks: {message}", file=sys.stderr)
    return 2


def _report(path: str, *, as_json: bool, debug: bool = False, jobs: Optional[int] = None,
            memory_budget: Optional[int] = None, dask_address: Optional[str] = None,
            html: Optional[str] = None, what_if: bool = False, findings: bool = False) -> int:
    from .serving import engine
    from .views import text_report

    try:
        analysis = engine.Engine(path, jobs=jobs, memory_budget=memory_budget, dask_address=dask_address,
                                 debug=debug).analyze_path()
    except engine.NothingAnalysed as exc:
        if not exc.errors:
            return _fail(str(exc))
        for e in exc.errors:
            print(f"tb-bottlenecks: {e}", file=sys.stderr)
        return 2
    logdir, results, errors, single_file = analysis.logdir, analysis.results, analysis.errors, analysis.single_file
    if findings:
        json.dump(analysis.findings(), sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    elif as_json and what_if:
        json.dump(_step_models(analysis.document()), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif as_json:
        json.dump(analysis.document(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif what_if:
        summary = functools.partial(engine.summary, views=False)
        print(text_report.format_what_if_logdir(logdir, results, summary, single_file=single_file))
    else:
        summary = functools.partial(engine.summary, views=False)  # the text reads only "report"
        print(text_report.format_logdir(logdir, results, summary, single_file=single_file))
    for line in text_report.section_errors(results.values()):
        print(f"tb-bottlenecks: {line}", file=sys.stderr)
    for e in errors:
        print(f"tb-bottlenecks: {e}", file=sys.stderr)
    if html:
        from .views import html_report

        data = html_report.page_data("report", html_report.run_views(logdir, results), title=f"Bottlenecks: {path}",
                                     errors=errors)
        failed = html_report.write_html_report(html, data)
        if failed:
            return _fail(failed)
    return 1 if errors else 0


def _run_result(path: str) -> dict:
    """``diff``/``check``'s input: one file's or run's result, from the engine."""
    from .serving import engine

    try:
        return engine.run_result(path)
    except engine.EngineError as exc:
        raise gate.InputError(str(exc)) from None


def _step_models(doc: dict) -> dict:
    """``report --json --what-if``: the same document with each report cut to its identity,
    ``step_model`` and the recommendations' prices (METRICS.md §19)."""
    keep = ("schema_version", "source", "run", "worker", "span", "avg_step_us", "step_model")

    def cut(rep):
        if not isinstance(rep, dict):
            return rep
        out = {k: rep.get(k) for k in keep if k in rep}
        out["recommendations"] = [{k: r.get(k) for k in ("rule", "severity", "title", "estimated_gain_pct", "what_if",
                                                          "step_ms", "predicted_step_ms", "gain_source")}
                                  for r in rep.get("recommendations") or []]
        if "step_model" in (rep.get("not_available") or {}):
            out["not_available"] = {"step_model": rep["not_available"]["step_model"]}
        return out

    if "runs" not in doc:
        return cut(doc)
    return {**doc, "runs": [{**entry, "summary": cut(entry.get("summary")),
                             "workers": [{**w, "summary": cut(w.get("summary")), "spans": [cut(r) for r in w["spans"]]}
                                         for w in entry.get("workers") or []]}
                            for entry in doc["runs"]]}


if __name__ == "__main__":
    sys.exit(main())
