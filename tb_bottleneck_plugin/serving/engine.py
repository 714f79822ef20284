"""The engine: discovery, scheduling, analysis, caching and the run/worker/span summaries of
one path, behind one small object API, in two modes over one pipeline.

    eng = Engine("runs/")                        # a trace file, a run directory or a logdir (or gs://...)
    eng.runs()                                   # the discovered runs (rediscovered on demand)
    res = eng.result("my_run", worker=None, span=None)   # a span's result, or the summary of a worker/run
    analysis = eng.analyze_path()                # every span at once: what `report PATH` prints

    live = Analyzer("runs/", cache_dir=...)      # the same pipeline kept running (the tab)
    live.result("my_run")                        # {"state": "loading"|"error"|"ready", ...}; never blocks

One pipeline, each step written once here:
- discovery: `discover` (`trace/discovery`: one flat listing; run/worker/span names);
- scheduling and analysis: `SpanRunner`: the scheduler (`scheduler.Scheduler`: slots, the
  memory budget, the wanted run first) starts each span on a backend (child processes
  `children.ChildPool`, a Dask cluster `dask_backend`, or this process's threads), waited on
  by daemon threads; every span of both modes goes through it (`analyze_all`, `Analyzer`);
- summaries: `summary` (`report.combine_results`), `json_report`, `result_findings`;
- caching: `Engine` keeps results per span URL and fingerprint for its life; the `Analyzer`
  keeps them per span state, on disk (`cache.DiskCache`, `timeline_store`) and rescans.

Two modes: `Engine` answers on demand and blocks (the CLI's ``report``, ``--json``,
``--findings``, ``diff``/``check`` through `run_result`; the notebook API; the MCP tools).
`Analyzer` is the long-lived mode the TensorBoard tab stands on (`plugin.py` builds it,
`routes.py` reads it): a background thread rescans the logdir, spans are analysed off the
request path, served from the disk cache after a restart, retried when a file was still
being written. The front ends (`cli.py`, `api.py`, `routes.py`, `mcp_server.py`) import
this module and not each other (tests/project/test_architecture.py).
"""
from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from .. import report
from ..errors import BottleneckError
from ..trace import discovery, storage
from ..views import findings as findings_view
from ..views import ranks
from .cache import DEFAULT_CACHE_BYTES, DiskCache, cache_max_bytes, default_cache_dir, valid_result  # noqa: F401
from .children import ChildPool, WaitThreads, outcome_in_thread, processes_supported
from .paths import BrowserPaths
from .scheduler import Scheduler, default_memory_budget, default_slots, estimate_peak_bytes, parse_bytes  # noqa: F401
from .timeline_store import NO_STORE_RETURNED, TimelineStores, span_to_show  # noqa: F401

log = logging.getLogger(__name__)

# The analysis children's log (section tracebacks) is silenced unless debug (children._child_entry).
CHILD_TRACEBACKS_ENV = "TB_BOTTLENECKS_CHILD_TRACEBACKS"
# A truncated file whose fingerprint does not change is analysed again this many times
# (on later scans) before it is left alone; any change of the file retries it again.
SAME_FILE_RETRIES = 2
# A file listed by the scan but gone when its analysis opens it (log rotation, a run being
# deleted or rewritten, a bucket listing that lags) is analysed again after a back-off of
# MISSING_FILE_BACKOFF_S, doubled each time, at most MISSING_FILE_RETRIES times; then its
# error names the file. A scan that no longer lists it drops the span (no stale error).
MISSING_FILE_RETRIES = 3
MISSING_FILE_BACKOFF_S = 1.0
# How often the logdir is rescanned for new trace files unless --bottlenecks_rescan_seconds
# says otherwise (plugin_loader's flag default is this number; the README says it:
# tests/project/test_documented_claims.py).
DEFAULT_RESCAN_SECONDS = 30.0


class NothingAnalysed(Exception):
    """`collect` found nothing to report: the message (one line), or ``errors``, one line
    per file that could not be analysed (exit code 2)."""

    def __init__(self, message: str, errors=()):
        super().__init__(message)
        self.errors = list(errors)


class EngineError(Exception):
    """A one-line reason a selection has no result (unknown name, nothing analysable)."""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------- discovery

def discover(path: str, *, directory: bool = False, follow_symlinks: bool = False):
    """The discovered runs/workers/spans of ``path`` (`discovery.Logdir`): a trace file, a run
    directory or a logdir; ``directory``: ``path`` is a logdir, listed as one even when it does
    not exist yet (a bucket prefix before the first upload: no runs). Raises BottleneckError."""
    if directory or follow_symlinks:
        return discovery.scan_logdir(path, follow_symlinks=follow_symlinks)
    return discovery.discover_path(path)


# ---------------------------------------------------------------------------- scheduling and analysis

class SpanRunner:
    """Where every span is analysed, in both modes: the scheduler says which queued span
    starts now (slots, memory budget, the wanted run first); a daemon thread
    (`children.WaitThreads`) runs it on the backend (a Dask cluster once ``dask`` is set, else
    child processes when ``processes``, else this process) and hands the outcome
    (``("ok", result)`` or ``(kind, message)``, children.py) to ``finish(job, outcome)``.

    A job is ``(run, span, token)``. ``begin(job)`` (lock held) may decline a job that went
    stale while queued (False); ``progress(job, fraction)`` follows a running one. The owner
    calls `push` and `start_allowed` under ``lock``."""

    def __init__(self, root: str, *, slots: int, memory_budget: Optional[int], processes: bool,
                 analyze_span: Callable, timeline: bool, finish: Callable, begin: Optional[Callable] = None,
                 progress: Optional[Callable] = None, per_run_limit: Optional[int] = None,
                 nice: Optional[int] = None, lock=None, tracebacks_in_outcome: bool = False,
                 thread_name: str = "bottlenecks-load"):
        self.root = root
        self.sched = Scheduler(slots, memory_budget, per_run_limit)
        self.children = ChildPool(max_idle=self.sched.slots, nice=nice) if processes else None
        self.dask = None  # dask_backend.DaskBackend: its workers analyse instead
        self.threads = WaitThreads(thread_name)  # they only wait (on a child or a Dask future)
        self.lock = lock if lock is not None else threading.RLock()
        self.stopped = False
        self._analyze_span = analyze_span  # in this process (threads)
        self._timeline = timeline  # Dask: the result carries the span's step-timeline store
        self._tracebacks = tracebacks_in_outcome  # in this process: the traceback in the outcome, not logged
        self._finish = finish
        self._begin = begin or (lambda job: True)
        self._progress = progress

    def push(self, run_name: str, job: tuple, cost: int = 0) -> None:
        self.sched.push(run_name, job, cost)

    def start_allowed(self) -> None:
        """Start every job the scheduler allows now (lock held)."""
        while not self.stopped:
            nxt = self.sched.next()
            if nxt is None:
                return
            name, job, cost = nxt
            if not self._begin(job):
                self.sched.done(name, cost)  # superseded while queued (file changed or deleted)
                continue
            try:
                self.threads.submit(self._work, job, then=functools.partial(self._done, name, cost))
            except RuntimeError:  # the threads were shut down (close())
                self.sched.done(name, cost)
                return

    def analyze(self, run, span, progress=None) -> tuple:
        """One span's outcome, in the calling thread (blocks)."""
        if self.dask is not None:
            return self.dask.analyze(self.root, run, span, progress, timeline=self._timeline)
        if self.children is not None:
            return self.children.analyze(self.root, run, span, progress)
        return outcome_in_thread(self._analyze_span, self.root, run, span, progress,
                                 traceback_in_outcome=self._tracebacks)

    def _work(self, job: tuple) -> None:
        run, span, _ = job
        progress = functools.partial(self._progress, job) if self._progress else None
        try:
            outcome = self.analyze(run, span, progress)
        except Exception as exc:  # noqa: BLE001 - a backend bug: this span's error, never a lost job
            log.exception("bottlenecks: analysing %s failed", span.url)
            outcome = ("internal", describe(exc))
        self._finish(job, outcome)

    def run_here(self) -> None:
        """Run the queued jobs one after another in the calling thread, not on a wait thread:
        the one-shot mode in this process (``jobs=1``, one span), whose analysis so stays on
        the caller's thread and its malloc arena (a second arena costs ~8 MB of peak RSS)."""
        while True:
            with self.lock:
                nxt = None if self.stopped else self.sched.next()
                if nxt is None:
                    return
                name, job, cost = nxt
                if not self._begin(job):
                    self.sched.done(name, cost)
                    continue
            try:
                self._work(job)
            finally:
                with self.lock:
                    self.sched.done(name, cost)

    def _done(self, name: str, cost: int) -> None:
        """After a job (its thread idle again): its slot and memory back, the next jobs started."""
        with self.lock:
            self.sched.done(name, cost)
            self.start_allowed()

    def close(self) -> None:
        """Drop the queued jobs; kill the children (analyses in flight are lost)."""
        with self.lock:
            self.stopped = True
            self.sched.clear()
        self.threads.shutdown()
        if self.children is not None:
            self.children.close()
        if self.dask is not None:
            self.dask.close()


def analyze_all(logdir, spans, *, debug: bool, jobs: Optional[int], memory_budget: Optional[int],
                dask_address: Optional[str]):
    """{span url: result} and [error line] in span order, every span at once through a
    `SpanRunner`: on a Dask cluster, in child processes (``jobs`` at a time within the memory
    budget), or in this process (one span, or ``jobs=1``). All runs are equal here: no slot is
    kept back for another run."""
    backend = None
    if dask_address:
        from . import dask_backend  # only with --dask

        backend = dask_backend.DaskBackend.connect(dask_address)  # DaskUnavailable: one line, exit 2
    jobs = jobs or default_slots()
    processes = backend is None and jobs > 1 and len(spans) > 1 and processes_supported()
    slots = backend.slots() if backend is not None else jobs if processes else 1
    budget = (memory_budget if memory_budget is not None else default_memory_budget()) if processes else None
    outcomes: Dict[str, tuple] = {}
    finished = threading.Semaphore(0)

    def finish(job, outcome):
        outcomes[job[1].url] = outcome
        finished.release()

    saved_env = os.environ.get(CHILD_TRACEBACKS_ENV)
    if processes:
        # the children (started on demand) log a failed section's traceback: only with
        # debug; without it each failure is one line here
        os.environ[CHILD_TRACEBACKS_ENV] = "1" if debug else "0"
    runner = SpanRunner(logdir.url, slots=slots, memory_budget=budget, per_run_limit=slots, processes=processes,
                        nice=0,  # the foreground work here
                        analyze_span=report.analyze_span, timeline=False, finish=finish,
                        tracebacks_in_outcome=True, thread_name="bottlenecks-run")
    runner.dask = backend
    try:
        with runner.lock:
            for run, _, span in spans:
                runner.push(run.name, (run, span, None), estimate_peak_bytes(span) if processes else 0)
        if processes or backend is not None:
            with runner.lock:
                runner.start_allowed()
            for _ in spans:
                finished.acquire()  # Ctrl-C interrupts the wait; `close` ends the analyses in flight
        else:
            runner.run_here()
    finally:
        runner.close()
        if processes:
            if saved_env is None:
                os.environ.pop(CHILD_TRACEBACKS_ENV, None)
            else:
                os.environ[CHILD_TRACEBACKS_ENV] = saved_env
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
        else:  # the live mode's "tried again on a later scan" does not apply here
            errors.append(str(value).replace("; it is tried again on a later scan", ""))
    return results, errors


def collect(path: str, *, debug: bool = False, jobs: Optional[int] = None, memory_budget: Optional[int] = None,
            dask_address: Optional[str] = None):
    """Discover PATH and analyse its spans, as `tb-bottlenecks report` does (and the Python
    API, api.analyze): (logdir, spans, {span url: result}, [error line], single_file).
    Raises NothingAnalysed when nothing could be analysed."""
    try:
        logdir = discover(path)
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
            entry["summary"] = summary(all_ready, run=run.name, views=False)["report"]
            entry["ranks"] = ranks.rank_view({w.name: [results[s.url] for s in w.spans if s.url in results]
                                              for w in run.workers})
        for worker in run.workers:
            ready = [results[s.url] for s in worker.spans if s.url in results]
            entry["workers"].append({
                "worker": worker.name,
                "summary": summary(ready, run=run.name, worker=worker.name, views=False)["report"] if ready else None,
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


def run_result(path: str) -> dict:
    """The result of one trace file or one run directory, its spans combined (`summary`), with
    its rank view when it has several workers: what ``diff`` and ``check`` compare (and the
    notebook API's ``compare``). Spans in this process, one after another. Raises EngineError
    (one line) for a bad path, no traces, several runs, or the first span that failed."""
    try:
        logdir = discover(path)
    except BottleneckError as exc:
        raise EngineError(str(exc)) from exc
    runs = [r for r in logdir.runs if any(w.spans for w in r.workers)]
    if not runs:
        raise EngineError(f"{path}: no PyTorch profiler trace files found "
                          "(expected *.pt.trace.json[.gz] or Kineto *.json[.gz] files)")
    if len(runs) > 1:
        names = ", ".join(r.name for r in runs[:10])
        raise EngineError(f"{path}: holds {len(runs)} runs ({names}); name one run directory or trace file")
    run = runs[0]
    spans = [(run, worker, span) for worker in run.workers for span in worker.spans]
    results, errors = analyze_all(logdir, spans, debug=False, jobs=1, memory_budget=None, dask_address=None)
    if errors:
        raise EngineError(errors[0])
    combined = dict(summary([results[s.url] for _, _, s in spans], run=run.name))
    by_worker = {w.name: [results[s.url] for s in w.spans] for w in run.workers if w.spans}
    if len(by_worker) >= 2:  # compare's rank-spread rows read the run's rank view (views/ranks.py)
        combined["ranks"] = ranks.rank_view(by_worker)
    return combined


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
            self._logdir = discover(self.path)
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


# ---------------------------------------------------------------------------- the long-lived mode (the tab)

_live_analyzers: "weakref.WeakSet" = weakref.WeakSet()  # started Analyzers, stopped at exit


def _stop_analyzers() -> None:
    """Interpreter exit (TensorBoard's SIGTERM handler and Ctrl-C end in sys.exit): stop
    every started Analyzer, so no analysis starts during the exit and every child is
    killed and reaped now (registered after `_kill_children`, so it runs first)."""
    for analyzer in list(_live_analyzers):
        try:
            analyzer.stop()
        except Exception:  # noqa: BLE001 - exiting anyway: the other Analyzers still stop
            log.exception("bottlenecks: stopping the analyzer failed")


atexit.register(_stop_analyzers)

@dataclass
class SpanState:
    state: str = "queued"  # queued | loading | ready | error
    progress: float = 0.0
    error: Optional[str] = None
    retry: bool = False  # a truncated file: analysed again when it changes (or on a later scan)
    attempts: int = 0  # analyses of this fingerprint that ended in a truncated-file error
    missing: int = 0  # analyses that failed because the file had vanished (not found)
    fingerprint: str = ""
    result: Optional[dict] = None  # {"report", "memory", "kernels"}


@dataclass
class _Summary:
    key: Tuple[str, ...]
    value: dict = field(default_factory=dict)
    # the run-level Operator view and kernel names (report.combine_views): made when a
    # route asks for them, then kept with the summary
    views: Optional[dict] = None
    views_lock: threading.Lock = field(default_factory=threading.Lock)


class Analyzer:
    """The engine's long-lived mode: the analysed state of one logdir (local path or fsspec
    URL), kept off TensorBoard's request path (the view-model the routes read).

    A background thread rescans the logdir (`discover`, one flat listing) every
    `rescan_seconds` and on demand; new or changed spans are served from the disk cache
    (`cache.DiskCache`: keyed by the file's URL, its fingerprint and the analysis version) by
    the scan thread itself (a TensorBoard restart shows analysed runs right after the first
    listing) or queued on the `SpanRunner`, whose scheduler starts the run the tab asked for
    last first and keeps one slot for other runs (one run holds at most ``max_workers - 1``,
    so a run of 1,000 ranks never keeps a new or small run waiting); nothing is loaded twice.
    A file that ends early (still being written) is retried when it changes (and up to
    `SAME_FILE_RETRIES` times on later scans even if it does not) instead of being reported
    broken for ever; a run whose files disappear disappears. Requests only read this state;
    they never touch storage."""

    def __init__(self, logdir: str, *, cache_dir=None, max_workers: Optional[int] = None,
                 rescan_seconds: float = DEFAULT_RESCAN_SECONDS, analyze_span: Optional[Callable] = None,
                 cache_max_bytes: int = DEFAULT_CACHE_BYTES, processes: Optional[bool] = None,
                 follow_symlinks: bool = False, memory_budget: Optional[int] = None,
                 dask_scheduler: Optional[str] = None):
        """``processes``: analyse each span in a child process (default), or in this
        process's threads (False; the default when ``analyze_span`` is injected, as tests
        do, or when TB_BOTTLENECKS_ANALYSIS_PROCESSES=0). ``follow_symlinks``: follow
        directory symlinks that point outside the logdir too. ``max_workers``: analyses
        at a time (default: the cores plus one slot kept for other runs, so one run uses
        every core). ``memory_budget``: bytes the analyses in flight may reserve (default
        `scheduler.default_memory_budget`, half the machine). ``dask_scheduler``: the
        address of an existing Dask scheduler (``tcp://host:8786``): spans are analysed on
        its workers (`dask_backend`), or here with a note when it cannot be reached."""
        self.logdir = logdir
        self.rescan_seconds = rescan_seconds
        self.max_workers = max(1, int(max_workers)) if max_workers else default_slots() + 1
        self.dask_scheduler = dask_scheduler or None
        self._dask_tried = False
        self._notes: List[str] = []  # service notes for the runs listing (the Dask fallback)
        self._analyze_span = analyze_span or functools.partial(report.analyze_span, timeline=True)
        self._injected = analyze_span
        if processes is None:
            processes = (analyze_span is None and processes_supported()
                         and os.environ.get("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "1") != "0")
        self.processes = bool(processes)
        self.follow_symlinks = bool(follow_symlinks)
        self._cache = DiskCache(cache_dir, max_bytes=cache_max_bytes) if cache_dir else None
        # step-timeline stores (timeline_store.py): beside the cached reports, out of the JSON
        self.timelines = TimelineStores(cache_dir, self._cache.key_for if self._cache else None)
        self._lock = threading.RLock()
        # one run holds at most max_workers - 1 slots, so another run always finds one free
        self._runner = SpanRunner(logdir, slots=self.max_workers, processes=self.processes,
                                  memory_budget=memory_budget if memory_budget is not None else default_memory_budget(),
                                  analyze_span=self._analyze_span, timeline=True, lock=self._lock,
                                  begin=self._begin, progress=self._progress, finish=self._finish)
        self._sched = self._runner.sched
        self.per_run_limit = self._sched.per_run_limit
        self.children = self._runner.children  # None: analysed in this process's threads
        self._pool = self._runner.threads  # daemon threads: they never hold TensorBoard's exit
        self._logdir_obj: Optional[discovery.Logdir] = None
        self._spans: Dict[str, SpanState] = {}  # by span URL
        self._summaries: Dict[Tuple, _Summary] = {}
        self._scan_error: Optional[str] = None
        self._paths = BrowserPaths(logdir)
        self._scan_state = "pending"
        self._scanned_at: Optional[float] = None
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self.parse_count = 0  # trace files actually parsed (not served from a cache)
        self.cache_hits = 0  # spans served from the disk cache
        self.scan_count = 0  # finished scans (ok or error)

    @property
    def _dask(self):
        """The dask_backend.DaskBackend once connected (in the scan thread), else None."""
        return self._runner.dask

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is not None or self._stopped:
            return
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._scan_loop, daemon=True, name="bottlenecks-scan")
                self._thread.start()
                _live_analyzers.add(self)

    def stop(self) -> None:
        """Stop scanning and analysing: queued spans are dropped, the analysis children
        killed and reaped (analyses in flight are lost; a restart redoes them). Returns in
        about a second at most (tests/serving/test_shutdown.py); TensorBoard's exit calls it."""
        with self._lock:
            self._stopped = True
        self._wake.set()
        self._runner.close()

    def rescan(self) -> None:
        """Ask for a scan now (the tab's reload button)."""
        self.start()
        self._wake.set()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until a scan happened and nothing is queued or loading (tests, CLI)."""
        self.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                busy = self._scanned_at is None or any(s.state in ("queued", "loading") for s in self._spans.values())
            if not busy:
                return True
            time.sleep(0.02)
        return False

    def wait_scan(self, timeout: float = 60.0) -> bool:
        """Ask for a scan and block until it finished (tests)."""
        with self._lock:
            target = self.scan_count + 1 if self._scan_state != "scanning" else self.scan_count + 2
        self.rescan()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.scan_count >= target:
                    return True
            time.sleep(0.01)
        return False

    def _scan_loop(self) -> None:
        while not self._stopped:
            self._wake.clear()
            self._scan_once()
            self._wake.wait(self.rescan_seconds)

    def _scan_once(self) -> None:
        with self._lock:
            self._scan_state = "scanning"
        if self.children is not None:
            self.children.reap_idle()
        if self._dask_tried:
            self._connect_dask()
        try:
            found = discover(self.logdir, directory=True, follow_symlinks=self.follow_symlinks)
        except BottleneckError as exc:
            self._scan_failed(str(exc))
            return
        except Exception as exc:  # never let a scan bug kill the thread
            log.exception("bottlenecks: scanning %s failed", self.logdir)
            self._scan_failed(f"{self.logdir}: {exc}")
            return
        self._paths.learn(found)
        todo = []
        with self._lock:
            alive = set()
            changed = self._logdir_obj is None or found.runs != self._logdir_obj.runs
            for run in found.runs:
                for worker in run.workers:
                    for span in worker.spans:
                        alive.add(span.url)
                        state = self._consider(span)
                        if state is not None:
                            todo.append((run, span, state))
        # Disk-cache hits are served here, before the run is listed, so a restarted
        # TensorBoard shows analysed runs as ready from its first answer.
        misses = [(run, span, state, self._cost(span)) for run, span, state in todo
                  if not self._from_cache(span, state)]
        with self._lock:
            for url in list(self._spans):
                if url not in alive:
                    del self._spans[url]  # deleted files (and runs) disappear
            if changed:
                self._summaries.clear()
            self._logdir_obj = found
            self._scan_state, self._scan_error = "ok", None
            self._scanned_at = time.time()
            self.scan_count += 1
            for run, span, state, cost in misses:
                self._sched.push(run.name, (run, span, state), cost)
            connecting = bool(self.dask_scheduler) and not self._dask_tried
            if not connecting:
                self._runner.start_allowed()
        if connecting:
            # after the listing is published: an unreachable scheduler delays analyses, not the runs list
            self._connect_dask()
            with self._lock:
                self._runner.start_allowed()

    def _cost(self, span) -> int:
        """Memory an analysis of ``span`` reserves (0 on Dask: workers have their own limits)."""
        if self.dask_scheduler and self._dask is not None:
            return 0
        try:
            return estimate_peak_bytes(span)
        except Exception:  # noqa: BLE001 - an estimate must not stop a scan
            return 0

    def _connect_dask(self) -> None:
        """Connect to the Dask scheduler once (scan thread); on failure analyse here, with a note."""
        if not self.dask_scheduler or self._dask_tried:  # already tried: refresh the cluster's size
            if self._dask is not None:
                slots = self._dask.slots() + 1
                with self._lock:
                    self._sched.slots = slots
                    self._sched.per_run_limit = max(1, slots - 1)
            return
        self._dask_tried = True
        from . import dask_backend  # imported only with --bottlenecks_dask_scheduler

        try:
            backend = dask_backend.DaskBackend.connect(self.dask_scheduler, analyze_span=self._injected)
        except dask_backend.DaskUnavailable as exc:
            log.warning("bottlenecks: %s; analysing on this machine", exc)
            with self._lock:
                self._notes.append(f"{exc}; analysing on this machine instead")
            return
        slots = backend.slots() + 1
        with self._lock:
            self._runner.dask = backend
            self._sched.slots = slots
            self._sched.per_run_limit = max(1, slots - 1)
            self._sched.memory_budget = None

    def _scan_failed(self, message: str) -> None:
        with self._lock:
            self._scan_state, self._scan_error = "error", message
            self._scanned_at = time.time()
            self.scan_count += 1

    def _consider(self, span) -> Optional[SpanState]:
        """A new SpanState to load for ``span``, or None when its state stands (lock held)."""
        state = self._spans.get(span.url)
        if state is not None:
            if state.state in ("queued", "loading"):
                return None  # never two loads of one file (a change is seen on the next scan)
            if state.fingerprint == span.fingerprint:
                if not state.retry or state.attempts > SAME_FILE_RETRIES:
                    return None
                attempts = state.attempts  # truncated and unchanged: retry, a bounded number of times
            else:
                attempts = 0
        else:
            attempts = 0
        state = SpanState(fingerprint=span.fingerprint, attempts=attempts)
        self._spans[span.url] = state
        return state

    def _from_cache(self, span, state: SpanState) -> bool:
        if self._cache is None:
            return False
        cached = self._cache.get(self._cache.key_for(span.url, span.fingerprint))
        if cached is None or (self._injected is None and not self.timelines.has(span.url, span.fingerprint)):
            return False  # no timeline store beside it (an older cache): analysed again (on Dask too)
        with self._lock:
            state.result, state.state, state.progress = self._paths.view(cached), "ready", 1.0
            self.cache_hits += 1
        return True

    # ------------------------------------------------------------------ analysis (SpanRunner's callbacks)
    def _begin(self, job) -> bool:
        """A queued span starts (lock held): False when a scan replaced or dropped it meanwhile."""
        run, span, state = job
        if self._spans.get(span.url) is not state or state.state != "queued":
            return False  # superseded (file changed or deleted) while queued
        state.state = "loading"
        self.parse_count += 1
        return True

    @staticmethod
    def _progress(job, fraction: float) -> None:
        job[2].progress = min(max(float(fraction), 0.0), 1.0)

    def _finish(self, job, outcome: tuple) -> None:
        run, span, state = job
        kind, value = outcome
        if kind == "internal":
            if self.processes or self._dask is not None:
                log.error("bottlenecks: analysing %s failed: %s", span.url, value)
            value = f"{span.url}: internal error while analysing ({value.splitlines()[0] if value else ''})"
        if kind not in ("ok", "died") and self._vanished(span):
            self._missing_file(run, span, state)
            return
        if kind != "ok":
            with self._lock:
                # a truncated file (still being written) or a child that died (killed, out of
                # memory) is tried again later, a bounded number of times while unchanged
                state.state, state.error = "error", value
                if kind in ("truncated", "died"):
                    state.retry = True
                    state.attempts += 1
            return
        result = value
        self.timelines.put_result(span.url, span.fingerprint, result)  # the store, or why there is none
        if self._cache:
            self._cache.put(self._cache.key_for(span.url, span.fingerprint), result)
        with self._lock:
            state.result, state.state, state.progress = self._paths.view(result), "ready", 1.0

    def reanalyze(self, run_name: str, span) -> bool:
        """Analyse a ready span again (its step-timeline store was lost: an unreadable or
        evicted ``.timeline.npz``); it is "loading" meanwhile. False when it is not ready
        (already queued, failed, replaced by a scan) or the run is not known."""
        cost = self._cost(span)
        with self._lock:
            state = self._spans.get(span.url)
            run = next((r for r in (self._logdir_obj.runs if self._logdir_obj else []) if r.name == run_name), None)
            if self._stopped or run is None or state is None or state.state != "ready":
                return False
            fresh = SpanState(fingerprint=state.fingerprint)
            self._spans[span.url] = fresh
            self._sched.push(run.name, (run, span, fresh), cost)
            self._runner.start_allowed()
        return True

    @staticmethod
    def _vanished(span) -> bool:
        """True when the file of a failed analysis is not there now (storage says "not found")."""
        try:
            fs, _ = storage.get_fs(span.url)
            return storage.is_missing(fs, span.path) is True
        except Exception:  # noqa: BLE001 - cannot tell: the failure stands as it is
            return False

    def _missing_file(self, run, span, state: SpanState) -> None:
        """The file vanished between the scan that listed it and its analysis: analysed
        again after a back-off (MISSING_FILE_BACKOFF_S, doubled each time), at most
        MISSING_FILE_RETRIES times, queued meanwhile; then an error naming the file."""
        with self._lock:
            state.missing += 1
            if state.missing > MISSING_FILE_RETRIES:
                waited = MISSING_FILE_BACKOFF_S * (2 ** MISSING_FILE_RETRIES - 1)
                state.state, state.progress, state.retry = "error", 0.0, False
                state.error = (f"{span.url}: file not found: the scan listed it but it was gone when read "
                               f"(deleted, renamed or rotated?); tried {state.missing} times over {waited:g} s. "
                               "A file gone for good leaves the list at the next scan.")
                return
            state.state, state.progress, state.error = "queued", 0.0, None
        delay = MISSING_FILE_BACKOFF_S * 2 ** (state.missing - 1)
        timer = threading.Timer(delay, self._requeue, args=(run, span, state))
        timer.daemon = True
        timer.start()

    def _requeue(self, run, span, state: SpanState) -> None:
        """Queue a vanished file's span again after its back-off, unless a scan dropped or
        replaced it meanwhile (or the Analyzer stopped)."""
        cost = self._cost(span)
        with self._lock:
            if self._stopped or self._spans.get(span.url) is not state or state.state != "queued":
                return
            self._sched.push(run.name, (run, span, state), cost)
            self._runner.start_allowed()

    # ------------------------------------------------------------------ queries
    def runs_view(self) -> dict:
        """The runs listing for the browser: every path relative to the logdir."""
        self.start()
        rel = self._paths.relative
        with self._lock:
            runs = []
            for run in (self._logdir_obj.runs if self._logdir_obj else []):
                states = [self._spans.get(s.url) for w in run.workers for s in w.spans]
                states = [s for s in states if s is not None]
                runs.append({
                    "run": run.name,
                    "state": _combined_state(states),
                    "progress": round(sum(s.progress for s in states) / len(states), 3) if states else 0.0,
                    "error": rel(next((s.error for s in states if s.error), None)),
                    "workers": [{
                        "worker": w.name,
                        "spans": [{"span": s.name, "file": rel(s.url), "timestamp": s.timestamp,
                                   **_span_view(self._spans.get(s.url), rel)}
                                  for s in w.spans],
                    } for w in run.workers],
                })
            newest = max((r for r in (self._logdir_obj.runs if self._logdir_obj else [])),
                         key=lambda r: max((_written_s(s) for w in r.workers for s in w.spans), default=0.0),
                         default=None)
            return {
                "logdir": self.logdir,
                # the run a user just profiled (issue 35): the one whose newest trace file was written last
                "default_run": newest.name if newest is not None else None,
                "scan": {"state": self._scan_state, "error": rel(self._scan_error), "scanned_at": self._scanned_at,
                         "rescan_seconds": self.rescan_seconds,
                         "notes": [rel(note) for note in
                                   (list(self._logdir_obj.notes) if self._logdir_obj else []) + self._notes]},
                "runs": runs,
            }

    def relative(self, text: Optional[str]) -> Optional[str]:
        """``text`` with the logdir's location removed from every path in it."""
        return self._paths.relative(text)

    def activity(self) -> Tuple[str, Optional[float], int]:
        """(scan state, time of the last finished scan or None, number of runs): cheap,
        for TensorBoard's is_active() which runs on every dashboard load."""
        self.start()
        with self._lock:
            runs = len(self._logdir_obj.runs) if self._logdir_obj is not None else 0
            return self._scan_state, self._scanned_at, runs

    def lookup(self, run: str, worker: Optional[str] = None, span: Optional[str] = None):
        """The discovered run/workers/spans for the names of a request (KeyError if unknown)."""
        with self._lock:
            if self._logdir_obj is None:
                raise KeyError(run)
            return discovery.resolve(self._logdir_obj, run, worker, span)

    def span_states(self, run: str, worker: Optional[str] = None, span: Optional[str] = None):
        """[(Worker, Span, SpanState)] for the selected spans; KeyError for unknown names
        (names are looked up in the discovered set only)."""
        with self._lock:  # one lock: a scan may replace the discovered set meanwhile
            selection = self.lookup(run, worker, span)
            return [(w, s, self._spans.get(s.url) or SpanState()) for w, s in selection.items]

    def result(self, run: str, worker: Optional[str] = None, span: Optional[str] = None, *,
               views: bool = True) -> dict:
        """{"state": "loading"|"error"|"ready", ...}: for one span its result, for a
        worker or run the combined report over all its ready spans. Never starts a
        load (scans do); a run asked for while loading goes first in the queue.
        ``views=False``: a summary without its Operator view and kernel names (the
        report, memory and kernels routes do not read them; made lazily, then cached)."""
        selected = self.span_states(run, worker, span)
        states = [st for _, _, st in selected]
        if any(st.state in ("loading", "queued") for st in states):
            with self._lock:
                self._sched.want(run)
            return {"state": "loading", "progress": round(sum(st.progress for st in states) / max(1, len(states)), 3)}
        ready = [(w, s, st) for w, s, st in selected if st.state == "ready"]
        rel = self._paths.relative
        errors = [{"file": rel(s.url), "error": rel(st.error), "retry": st.retry}
                  for _, s, st in selected if st.state == "error"]
        if not ready:
            return {"state": "error", "error": errors[0]["error"] if errors else "no trace files", "errors": errors}
        if len(selected) == 1:
            return {"state": "ready", **ready[0][2].result, "errors": errors}
        key = (run, worker, span, tuple((s.url, st.fingerprint) for _, s, st in ready))
        with self._lock:
            cached = self._summaries.get(key)
        if cached is None:
            try:
                combined = summary([st.result for _, _, st in ready], run=run, worker=worker, views=False)
            except Exception as exc:  # noqa: BLE001 - one run's summary must not break the tab
                log.exception("bottlenecks: combining the spans of run %r failed", run)
                what = f"run {run!r}" + (f", worker {worker!r}" if worker else "")
                combined = {"error": self.relative(f"internal error while combining the spans of {what}: "
                                                   f"{type(exc).__name__}: {exc}")}
            cached = _Summary(key, combined)
            with self._lock:
                self._summaries[key] = cached
        if "error" in cached.value:  # kept: the same spans fail the same way until one changes
            return {"state": "error", "error": cached.value["error"], "errors": errors}
        if views and cached.views is None:
            with cached.views_lock:  # one computation per summary, however many ask at once
                if cached.views is None:
                    cached.views = report.combine_views([st.result for _, _, st in ready])
        return {"state": "ready", **cached.value, **(cached.views if views else {}), "errors": errors}


def _written_s(span) -> float:
    """When a trace file was last written, in s since the epoch: the mtime in its fingerprint
    (storage.file_fingerprint: local "m", object stores "u"), else the time in its name, else 0."""
    _, _, stamp = str(span.fingerprint or "").partition(":")
    if stamp[:1] in ("m", "u"):
        try:
            return float(stamp[1:])
        except ValueError:
            pass
    ns = span.time_ns
    return ns / 1e9 if isinstance(ns, int) else 0.0


def _combined_state(states: List[SpanState]) -> str:
    if not states:
        return "queued"
    kinds = {s.state for s in states}
    if kinds & {"queued", "loading"}:
        return "loading"
    if kinds == {"error"}:
        return "error"
    return "ready"


def _span_view(state: Optional[SpanState], rel: Callable[[Optional[str]], Optional[str]]) -> dict:
    if state is None:
        return {"state": "queued", "progress": 0.0, "error": None, "retry": False}
    return {"state": state.state, "progress": round(state.progress, 3), "error": rel(state.error),
            "retry": state.retry}
