"""Keeps the analysed state of one logdir, off TensorBoard's request path: the view-model.

Three parts, three modules:
- **scheduler** (`scheduler.Scheduler`): which span is analysed next and how many at
  once: the run the tab asked for last first, else the run with the fewest analyses in
  flight (round-robin among equals); one slot per core plus one kept for other runs (one
  run never holds more than ``max_workers - 1``, so a run of 1,000 ranks never keeps a
  new or small run waiting); and a memory budget (each analysis reserves its estimated
  peak, from the file's uncompressed size).
- **backends**: child processes on this machine (`children.ChildPool`), threads (tests),
  or an existing Dask cluster (`dask_backend`, only with ``dask_scheduler``).
- **disk cache** (`cache.DiskCache`): each span's result, keyed by the file's URL, its
  fingerprint (size + mtime or GCS generation) and cache.ANALYSIS_VERSION.

The Analyzer (this module) ties them: a background thread rescans the logdir (one flat
listing) every `rescan_seconds` and on demand; new or changed spans are served from the
disk cache by the scan thread itself (a TensorBoard restart shows analysed runs right
after the first listing) or queued; nothing is loaded twice. A file that ends early
(still being written) is retried when it changes (and up to `SAME_FILE_RETRIES` times on
later scans even if it does not) instead of being reported broken for ever; a run whose
files disappear disappears. Requests only read this state; they never touch storage.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ..trace import discovery, storage
from .. import report
from .cache import DEFAULT_CACHE_BYTES, DiskCache, default_cache_dir, valid_result  # noqa: F401 (re-exported)
from ..errors import BottleneckError
from .children import ChildPool, WaitThreads, outcome_in_thread, processes_supported
from .paths import BrowserPaths
from .timeline_store import TimelineStores
from .scheduler import Scheduler, default_memory_budget, default_slots, estimate_peak_bytes

log = logging.getLogger(__name__)

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
    """The analysed state of one logdir (local path or fsspec URL)."""

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
        # one run holds at most max_workers - 1 slots, so another run always finds one free
        self._sched = Scheduler(self.max_workers, memory_budget if memory_budget is not None
                                else default_memory_budget())
        self.per_run_limit = self._sched.per_run_limit
        self.dask_scheduler = dask_scheduler or None
        self._dask = None  # dask_backend.DaskBackend once connected (in the scan thread)
        self._dask_tried = False
        self._notes: List[str] = []  # service notes for the runs listing (the Dask fallback)
        self._analyze_span = analyze_span or functools.partial(report.analyze_span, timeline=True)
        self._injected = analyze_span
        if processes is None:
            processes = (analyze_span is None and processes_supported()
                         and os.environ.get("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "1") != "0")
        self.processes = bool(processes)
        self.follow_symlinks = bool(follow_symlinks)
        self.children = ChildPool(max_idle=self.max_workers) if self.processes else None
        self._cache = DiskCache(cache_dir, max_bytes=cache_max_bytes) if cache_dir else None
        # step-timeline stores (timeline_store.py): beside the cached reports, out of the JSON
        self.timelines = TimelineStores(cache_dir, self._cache.key_for if self._cache else None)
        # threads only wait (on a child or a Dask future); the scheduler bounds how many
        self._pool = WaitThreads("bottlenecks-load")  # daemon: never holds TensorBoard's exit
        self._lock = threading.RLock()
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
            self._sched.clear()
        self._wake.set()
        self._pool.shutdown()
        if self.children is not None:
            self.children.close()
        if self._dask is not None:
            self._dask.close()

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
            found = discovery.scan_logdir(self.logdir, follow_symlinks=self.follow_symlinks)
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
                self._start_allowed_loads()
        if connecting:
            # after the listing is published: an unreachable scheduler delays analyses, not the runs list
            self._connect_dask()
            with self._lock:
                self._start_allowed_loads()

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
            self._dask = backend
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

    # ------------------------------------------------------------------ scheduling
    def _start_allowed_loads(self) -> None:
        """Start every load the scheduler allows now (lock held): the run the tab asked
        for last first, within the slots and the memory budget (`scheduler.Scheduler`)."""
        while not self._stopped:
            nxt = self._sched.next()
            if nxt is None:
                return
            name, job, cost = nxt
            run, span, state = job
            if self._spans.get(span.url) is not state or state.state != "queued":
                self._sched.done(name, cost)  # superseded (file changed or deleted) while queued
                continue
            state.state = "loading"
            try:
                self._pool.submit(self._work, name, job, cost)
            except RuntimeError:  # the pool was shut down (stop())
                self._sched.done(name, cost)
                return

    def _work(self, name: str, job: tuple, cost: int) -> None:
        run, span, state = job
        try:
            self._load(run, span, state)
        finally:
            with self._lock:
                self._sched.done(name, cost)
                self._start_allowed_loads()

    def _load(self, run, span, state: SpanState) -> None:
        def progress(fraction: float) -> None:
            state.progress = min(max(float(fraction), 0.0), 1.0)

        with self._lock:
            self.parse_count += 1
        if self._dask is not None:
            kind, value = self._dask.analyze(self.logdir, run, span, progress)
        elif self.processes:
            kind, value = self.children.analyze(self.logdir, run, span, progress)
        else:
            kind, value = outcome_in_thread(self._analyze_span, self.logdir, run, span, progress)
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
            self._start_allowed_loads()
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
            self._start_allowed_loads()

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
                combined = report.combine_results([st.result for _, _, st in ready], run=run, worker=worker,
                                                  views=False)
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
