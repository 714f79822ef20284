"""The engine every batch front end stands on: discovery, scheduling, analysis, caching and the
run/worker/span summaries of one path, behind one small object API.

    eng = Engine("runs/")                        # a trace file, a run directory or a logdir (or gs://...)
    eng.runs()                                   # the discovered runs (rediscovered on demand)
    res = eng.result("my_run", worker=None, span=None)   # a span's result, or the summary of a worker/run
    analysis = eng.analyze_path()                # every span at once: what `report PATH` prints

- discovery: `trace/discovery.discover_path` (one flat listing; run/worker/span names);
- scheduling: `analyze_all`: spans in child processes within a memory budget
  (`scheduler.run_all`, `children.ChildPool`), on a Dask cluster (`dask_backend`), or in this
  process (one span, or ``jobs=1``);
- analysis: `report.analyze_span` per span; summaries `report.combine_results`;
- caching: results kept per span (keyed by URL and fingerprint) for the engine's life.

Front ends: `cli.py` (``report``, ``--json``, ``--findings``), `api.py` (the notebook API),
`mcp_server.py` (the MCP tools). The TensorBoard tab's long-lived, background variant of the
same pipeline is `serving/service.Analyzer` (re-exported here as `Analyzer`): `plugin.py` builds
it and `routes.py` reads it. No front end imports another (tests/project/test_architecture.py).
"""
from __future__ import annotations

import math
import os
import sys
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .. import report
from ..errors import BottleneckError
from ..trace import discovery
from ..views import findings as findings_view
from ..views import ranks
from .service import Analyzer  # noqa: F401  (the tab's engine, re-exported: plugin.py builds it)

# The analysis children's log (section tracebacks) is silenced unless debug (children._child_entry).
CHILD_TRACEBACKS_ENV = "TB_BOTTLENECKS_CHILD_TRACEBACKS"


class NothingAnalysed(Exception):
    """`collect` found nothing to report: the message (one line), or ``errors``, one line
    per file that could not be analysed (exit code 2)."""

    def __init__(self, message: str, errors=()):
        super().__init__(message)
        self.errors = list(errors)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def analyze_all(logdir, spans, *, debug: bool, jobs: Optional[int], memory_budget: Optional[int],
                dask_address: Optional[str]):
    """{span url: result} and [error line] in span order: on a Dask cluster, in child
    processes (``jobs`` at a time within the memory budget, `scheduler.run_all`), or in
    this process (one span, or ``jobs=1``)."""
    from . import scheduler

    outcomes = {}
    if dask_address:
        from . import dask_backend  # only with --dask

        backend = dask_backend.DaskBackend.connect(dask_address)  # DaskUnavailable: one line, exit 2
        try:
            backend.analyze_many(logdir.url, [(run, span) for run, _, span in spans],
                                 lambda job, outcome: outcomes.__setitem__(job[1].url, outcome))
        finally:
            backend.close()
    else:
        from . import children

        jobs = jobs or scheduler.default_slots()
        if jobs > 1 and len(spans) > 1 and children.processes_supported():
            # the children (started on demand) log a failed section's traceback: only with
            # debug; without it each failure is one line here
            saved_env = os.environ.get(CHILD_TRACEBACKS_ENV)
            os.environ[CHILD_TRACEBACKS_ENV] = "1" if debug else "0"
            pool = children.ChildPool(max_idle=jobs, nice=0)  # the foreground work here
            try:
                budget = memory_budget if memory_budget is not None else scheduler.default_memory_budget()
                done = scheduler.run_all(
                    [(run.name, (run, span), scheduler.estimate_peak_bytes(span)) for run, _, span in spans],
                    lambda job: pool.analyze(logdir.url, job[0], job[1]), slots=jobs, memory_budget=budget)
            finally:
                pool.close()
                if saved_env is None:
                    os.environ.pop(CHILD_TRACEBACKS_ENV, None)
                else:
                    os.environ[CHILD_TRACEBACKS_ENV] = saved_env
            outcomes = {job[1].url: outcome for job, outcome in done}
        else:
            for run, _, span in spans:
                try:
                    outcomes[span.url] = ("ok", report.analyze_span(logdir.url, run, span))
                except BottleneckError as exc:
                    outcomes[span.url] = ("error", str(exc))
                except Exception as exc:  # noqa: BLE001 - a bug on one file must not cost the others
                    if debug:
                        traceback.print_exc()
                    outcomes[span.url] = ("internal", describe(exc))
    results, errors = {}, []
    for _, _, span in spans:
        kind, value = outcomes.get(span.url, ("died", f"{span.url}: no answer"))
        if kind == "ok":
            results[span.url] = value
        elif kind == "internal":
            first, _, rest = (value or "").partition("\n")
            if debug and rest:
                print(rest, file=sys.stderr)
            errors.append(f"{span.url}: internal error: {first}" + ("" if debug else " (run with --debug for the traceback)"))
        else:  # the service's "tried again on a later scan" does not apply here
            errors.append(str(value).replace("; it is tried again on a later scan", ""))
    return results, errors


def collect(path: str, *, debug: bool = False, jobs: Optional[int] = None, memory_budget: Optional[int] = None,
            dask_address: Optional[str] = None):
    """Discover PATH and analyse its spans, as `tb-bottlenecks report` does (and the Python
    API, api.analyze): (logdir, spans, {span url: result}, [error line], single_file).
    Raises NothingAnalysed when nothing could be analysed."""
    try:
        logdir = discovery.discover_path(path)
    except BottleneckError as exc:
        raise NothingAnalysed(str(exc)) from exc
    spans = [(run, worker, span) for run in logdir.runs for worker in run.workers for span in worker.spans]
    if not spans:
        raise NothingAnalysed(f"{path}: no PyTorch profiler trace files found "
                              "(expected *.pt.trace.json[.gz] or Kineto *.json[.gz] files)")
    try:
        results, errors = analyze_all(logdir, spans, debug=debug, jobs=jobs, memory_budget=memory_budget,
                                      dask_address=dask_address)
    except Exception as exc:  # noqa: BLE001 - dask_backend.DaskUnavailable: one line, exit 2
        if type(exc).__name__ == "DaskUnavailable":
            raise NothingAnalysed(str(exc)) from exc
        raise
    if not results:
        raise NothingAnalysed("; ".join(errors) or f"{path}: nothing could be analysed", errors)
    single_file = len(spans) == 1 and path.rstrip("/").endswith((".json", ".json.gz"))
    return logdir, spans, results, errors, single_file


def json_report(logdir, spans, results, errors, single_file: bool) -> dict:
    """What `report --json` prints: a single file's report object, else
    {schema_version, logdir, runs: [{run, workers: [{worker, summary, spans}], summary?, ranks?}], errors}."""
    if single_file:
        return results[spans[0][2].url]["report"]
    out = {"schema_version": report.SCHEMA_VERSION, "logdir": logdir.url, "runs": [], "errors": errors}
    for run in logdir.runs:
        entry = {"run": run.name, "workers": []}
        all_ready = [results[s.url] for w in run.workers for s in w.spans if s.url in results]
        if len(run.workers) > 1 and len(all_ready) > 1:
            entry["summary"] = report.combine_results(all_ready, run=run.name, views=False)["report"]
            entry["ranks"] = ranks.rank_view({w.name: [results[s.url] for s in w.spans if s.url in results]
                                              for w in run.workers})
        for worker in run.workers:
            ready = [results[s.url] for s in worker.spans if s.url in results]
            entry["workers"].append({
                "worker": worker.name,
                "summary": report.combine_results(ready, run=run.name, worker=worker.name, views=False)["report"]
                if len(ready) > 1 else (ready[0]["report"] if ready else None),
                "spans": [r["report"] for r in ready],
            })
        out["runs"].append(entry)
    return out


def json_safe(value):
    """NaN/inf are not JSON: print them as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def result_findings(result: dict, errors: Optional[List[str]] = None) -> dict:
    """The findings of a result (views/findings.py): what `report --findings`, the findings
    route, `Report.findings` and the MCP ``diagnose`` tool answer, made here once."""
    return findings_view.findings(result["report"], errors if errors is not None else result.get("errors"))


def summary(results: List[dict], *, run=None, worker=None, views: bool = True) -> dict:
    """The result of a group of span results: the one span's, else their combined summary
    (`report.combine_results`)."""
    if len(results) == 1:
        return results[0]
    return report.combine_results(results, run=run, worker=worker, views=views)


@dataclass
class Analysis:
    """Every span of a path analysed at once (`Engine.analyze_path`, `collect`)."""

    logdir: object
    spans: list
    results: Dict[str, dict]
    errors: List[str]
    single_file: bool

    def document(self) -> dict:
        """`report --json` (NaN as null)."""
        return json_safe(json_report(self.logdir, self.spans, self.results, self.errors, self.single_file))

    def findings(self) -> dict:
        """`report --findings`."""
        return findings_view.document_findings(self.document())


class EngineError(Exception):
    """A one-line reason a selection has no result (unknown name, nothing analysable)."""


@dataclass
class Engine:
    """One path (a logdir, run directory or trace file; local or a URL) and what has been
    analysed of it. Results are kept per span URL and fingerprint: asking again costs nothing
    until the file changes. Not thread-safe: one caller at a time (the CLI, a notebook, the
    MCP server's one request loop)."""

    path: str
    jobs: Optional[int] = None
    memory_budget: Optional[int] = None
    dask_address: Optional[str] = None
    debug: bool = False
    confined: bool = False  # refuse spans whose real path lies outside the path (symlinks out)
    _logdir: object = None
    max_results: int = 256  # span results kept (least recently used dropped): a long-lived MCP server stays bounded
    _results: "OrderedDict[Tuple[str, str], dict]" = field(default_factory=OrderedDict)
    _errors: Dict[Tuple[str, str], str] = field(default_factory=dict)

    def analyze_path(self) -> Analysis:
        """Every span of the path (`collect`); raises NothingAnalysed."""
        return Analysis(*collect(self.path, debug=self.debug, jobs=self.jobs, memory_budget=self.memory_budget,
                                 dask_address=self.dask_address))

    # ------------------------------------------------------------------ selections

    def discover(self):
        """Lists the path again (new and changed files); raises EngineError."""
        try:
            self._logdir = discovery.discover_path(self.path)
        except BottleneckError as exc:
            raise EngineError(str(exc)) from None
        return self._logdir

    @property
    def logdir(self):
        return self._logdir if self._logdir is not None else self.discover()

    def runs(self) -> List[dict]:
        """[{run, workers: [{worker, spans: [name]}]}] after a fresh listing."""
        return [{"run": r.name, "workers": [{"worker": w.name, "spans": [s.name for s in w.spans]} for w in r.workers]}
                for r in self.discover().runs]

    def select(self, run: str, worker: Optional[str] = None, span: Optional[str] = None):
        """`discovery.resolve` of the names (listing again once if a name is unknown)."""
        for attempt in (0, 1):
            try:
                sel = discovery.resolve(self.logdir, run, worker or None, span or None)
                break
            except KeyError as exc:
                if attempt:
                    raise EngineError(str(exc.args[0]) if exc.args else str(exc)) from None
                self.discover()
        if self.confined:
            for _, s in sel.items:
                if discovery.outside_root(self.logdir, s.path):
                    raise EngineError(f"run {run!r}: {s.name} links outside the logdir (refused)")
        return sel

    def result(self, run: str, worker: Optional[str] = None, span: Optional[str] = None, *,
               views: bool = True) -> dict:
        """The selection's result (`report.analyze_span` per span, cached; a worker or run:
        `summary`), with ``errors``: one line per file of it that could not be analysed.
        Raises EngineError when none could."""
        sel = self.select(run, worker, span)
        todo = [(sel.run, w, s) for w, s in sel.items if (s.url, s.fingerprint) not in self._results
                and (s.url, s.fingerprint) not in self._errors]
        if todo:
            results, errors = analyze_all(self.logdir, todo, debug=self.debug, jobs=self.jobs,
                                          memory_budget=self.memory_budget, dask_address=self.dask_address)
            for _, _, s in todo:
                if s.url in results:
                    self._results[(s.url, s.fingerprint)] = results[s.url]
                else:  # kept until the file changes (its fingerprint): a truncated file is retried then
                    self._errors[(s.url, s.fingerprint)] = next((e for e in errors if s.url in e),
                                                                errors[0] if errors else f"{s.url}: no answer")
        for _, s in sel.items:  # most recently used last; the selection itself is never dropped
            if (s.url, s.fingerprint) in self._results:
                self._results.move_to_end((s.url, s.fingerprint))
        while len(self._results) > max(self.max_results, len(sel.items)):
            self._results.popitem(last=False)
        ready = [self._results[(s.url, s.fingerprint)] for _, s in sel.items if (s.url, s.fingerprint) in self._results]
        errors = [self._errors[(s.url, s.fingerprint)] for _, s in sel.items if (s.url, s.fingerprint) in self._errors]
        if not ready:
            raise EngineError(errors[0] if errors else f"run {run!r}: no trace files")
        out = summary(ready, run=sel.run.name, worker=worker or None, views=views)
        return {**out, "errors": errors}

    def report(self, run: str, worker: Optional[str] = None, span: Optional[str] = None) -> dict:
        return self.result(run, worker, span, views=False)["report"]

    def findings(self, run: str, worker: Optional[str] = None, span: Optional[str] = None) -> dict:
        """The selection's findings (views/findings.py)."""
        return result_findings(self.result(run, worker, span, views=False))
