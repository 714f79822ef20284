"""Keeps the analysed state of one logdir, off TensorBoard's request path.

- A background thread rescans the logdir (one flat listing) every `rescan_seconds`
  and on demand; new or changed spans are analysed in a bounded thread pool, so one
  huge run never blocks the others and nothing is loaded twice.
- Each span's result (report, memory curves, kernel table) is kept in memory and on
  disk (`DiskCache`), keyed by the file's URL, its fingerprint (size + mtime or GCS
  generation) and ANALYSIS_VERSION: a TensorBoard restart shows analysed runs at once.
- A file that ends early (still being written) is retried on later scans instead of
  being reported broken for ever; a run whose files disappear disappears.
Requests only read this state; they never touch storage.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from . import discovery, report
from .errors import BottleneckError, TruncatedTraceError

log = logging.getLogger(__name__)

# Bump when a metric definition or the report layout changes: old disk caches are ignored.
ANALYSIS_VERSION = f"{report.SCHEMA_VERSION}.1"

DEFAULT_CACHE_BYTES = 512 << 20


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tb_bottleneck_plugin"


class DiskCache:
    """Analysed span results as JSON files, bounded in total size (oldest evicted)."""

    def __init__(self, directory, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @staticmethod
    def key(url: str, fingerprint: str) -> str:
        return hashlib.sha256(f"{ANALYSIS_VERSION}\0{url}\0{fingerprint}".encode()).hexdigest()

    def get(self, key: str) -> Optional[dict]:
        path = self.directory / f"{key}.json"
        try:
            with open(path, "rb") as f:
                value = json.loads(f.read())
            os.utime(path)  # recently used: evicted last
            return value
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: dict) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f"{key}.json.tmp{threading.get_ident()}"
            tmp.write_text(json.dumps(value, allow_nan=True))
            os.replace(tmp, self.directory / f"{key}.json")
            self._prune()
        except OSError as exc:  # a read-only or full disk must not break the tab
            log.warning("bottlenecks: cannot write the report cache in %s: %s", self.directory, exc)

    def _prune(self) -> None:
        with self._lock:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.directory.glob("*.json")]
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files, key=lambda f: f[0]):
                if total <= self.max_bytes:
                    break
                try:
                    path.unlink()
                    total -= size
                except OSError:
                    pass


@dataclass
class SpanState:
    state: str = "queued"  # queued | loading | ready | error
    progress: float = 0.0
    error: Optional[str] = None
    retry: bool = False  # a truncated file: analyse again on the next scan
    fingerprint: str = ""
    result: Optional[dict] = None  # {"report", "memory", "kernels"}


@dataclass
class _Summary:
    key: Tuple[str, ...]
    value: dict = field(default_factory=dict)


class Analyzer:
    """The analysed state of one logdir (local path or fsspec URL)."""

    def __init__(self, logdir: str, *, cache_dir=None, max_workers: int = 2,
                 rescan_seconds: float = 30.0, analyze_span: Optional[Callable] = None):
        self.logdir = logdir
        self.rescan_seconds = rescan_seconds
        self._analyze_span = analyze_span or report.analyze_span
        self._cache = DiskCache(cache_dir) if cache_dir else None
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="bottlenecks-load")
        self._lock = threading.RLock()
        self._logdir_obj: Optional[discovery.Logdir] = None
        self._spans: Dict[str, SpanState] = {}  # by span URL
        self._summaries: Dict[Tuple, _Summary] = {}
        self._scan_error: Optional[str] = None
        self._scan_state = "pending"
        self._scanned_at: Optional[float] = None
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self.parse_count = 0  # trace files actually parsed (not served from a cache)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._scan_loop, daemon=True, name="bottlenecks-scan")
                self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

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
            time.sleep(0.05)
        return False

    def _scan_loop(self) -> None:
        while not self._stopped:
            self._scan_once()
            self._wake.wait(self.rescan_seconds)
            self._wake.clear()

    def _scan_once(self) -> None:
        with self._lock:
            self._scan_state = "scanning"
        try:
            found = discovery.scan_logdir(self.logdir)
        except BottleneckError as exc:
            with self._lock:
                self._scan_state, self._scan_error = "error", str(exc)
                self._scanned_at = time.time()
            return
        except Exception as exc:  # never let a scan bug kill the thread
            log.exception("bottlenecks: scanning %s failed", self.logdir)
            with self._lock:
                self._scan_state, self._scan_error = "error", f"{self.logdir}: {exc}"
                self._scanned_at = time.time()
            return
        with self._lock:
            self._logdir_obj = found
            self._scan_state, self._scan_error = "ok", None
            self._scanned_at = time.time()
            alive = set()
            for run in found.runs:
                for worker in run.workers:
                    for span in worker.spans:
                        alive.add(span.url)
                        self._consider(run, span)
            for url in list(self._spans):
                if url not in alive:
                    del self._spans[url]  # deleted files (and runs) disappear
            self._summaries.clear()

    def _consider(self, run, span) -> None:
        state = self._spans.get(span.url)
        if state is not None and state.fingerprint == span.fingerprint and not state.retry:
            return
        if state is not None and state.state in ("queued", "loading"):
            return  # never two loads of one file
        state = SpanState(fingerprint=span.fingerprint)
        self._spans[span.url] = state
        self._pool.submit(self._load, run, span, state)

    def _load(self, run, span, state: SpanState) -> None:
        key = DiskCache.key(span.url, span.fingerprint)
        cached = self._cache.get(key) if self._cache else None
        if cached is not None:
            with self._lock:
                state.result, state.state, state.progress = cached, "ready", 1.0
            return
        with self._lock:
            state.state = "loading"

        def progress(fraction: float) -> None:
            state.progress = fraction

        try:
            self.parse_count += 1
            result = self._analyze_span(self.logdir, run, span, progress=progress)
        except TruncatedTraceError as exc:
            with self._lock:
                state.state, state.error, state.retry = "error", str(exc), True
            return
        except BottleneckError as exc:
            with self._lock:
                state.state, state.error = "error", str(exc)
            return
        except Exception as exc:  # a bug in one analysis must not take the tab down
            log.exception("bottlenecks: analysing %s failed", span.url)
            with self._lock:
                state.state, state.error = "error", f"{span.url}: internal error while analysing ({exc!r})"
            return
        if self._cache:
            self._cache.put(key, result)
        with self._lock:
            state.result, state.state, state.progress = result, "ready", 1.0
            self._summaries.clear()

    # ------------------------------------------------------------------ queries
    def runs_view(self) -> dict:
        self.start()
        with self._lock:
            runs = []
            for run in (self._logdir_obj.runs if self._logdir_obj else []):
                states = [self._spans.get(s.url) for w in run.workers for s in w.spans]
                states = [s for s in states if s is not None]
                runs.append({
                    "run": run.name,
                    "state": _combined_state(states),
                    "progress": round(sum(s.progress for s in states) / len(states), 3) if states else 0.0,
                    "error": next((s.error for s in states if s.error), None),
                    "workers": [{
                        "worker": w.name,
                        "spans": [{"span": s.name, "file": s.url, "timestamp": s.timestamp,
                                   "state": self._spans[s.url].state if s.url in self._spans else "queued",
                                   "error": self._spans[s.url].error if s.url in self._spans else None}
                                  for s in w.spans],
                    } for w in run.workers],
                })
            return {
                "logdir": self.logdir,
                "scan": {"state": self._scan_state, "error": self._scan_error, "scanned_at": self._scanned_at},
                "runs": runs,
            }

    def lookup(self, run: str, worker: Optional[str] = None, span: Optional[str] = None):
        """The discovered run/workers/spans for the names of a request (KeyError if unknown)."""
        with self._lock:
            if self._logdir_obj is None:
                raise KeyError(run)
            return discovery.resolve(self._logdir_obj, run, worker, span)

    def span_states(self, run: str, worker: Optional[str] = None, span: Optional[str] = None):
        """[(Span, SpanState)] for the selected spans; KeyError for unknown names."""
        self.lookup(run, worker, span)  # validates the names against the discovered set
        with self._lock:
            run_obj = next(r for r in self._logdir_obj.runs if r.name == run)
            out = []
            for w in run_obj.workers:
                if worker is not None and w.name != worker:
                    continue
                for s in w.spans:
                    if span is not None and s.name != span:
                        continue
                    out.append((w, s, self._spans.get(s.url) or SpanState()))
            return out

    def result(self, run: str, worker: Optional[str] = None, span: Optional[str] = None) -> dict:
        """{"state": "loading"|"error"|"ready", ...}: for one span its result, for a
        worker or run the combined report over all its ready spans."""
        selected = self.span_states(run, worker, span)
        states = [st for _, _, st in selected]
        state = _combined_state(states)
        if state in ("loading", "queued") or any(st.state in ("loading", "queued") for st in states):
            return {"state": "loading", "progress": round(sum(st.progress for st in states) / max(1, len(states)), 3)}
        ready = [(w, s, st) for w, s, st in selected if st.state == "ready"]
        errors = [{"file": s.url, "error": st.error} for _, s, st in selected if st.state == "error"]
        if not ready:
            return {"state": "error", "error": errors[0]["error"] if errors else "no trace files", "errors": errors}
        if len(selected) == 1:
            return {"state": "ready", **ready[0][2].result, "errors": errors}
        key = (run, worker, span, tuple(st.fingerprint for _, _, st in ready))
        with self._lock:
            cached = self._summaries.get(key)
        if cached is None:
            combined = report.combine_results([st.result for _, _, st in ready], run=run, worker=worker)
            cached = _Summary(key, combined)
            with self._lock:
                self._summaries[key] = cached
        return {"state": "ready", **cached.value, "errors": errors}


def _combined_state(states: List[SpanState]) -> str:
    if not states:
        return "queued"
    kinds = {s.state for s in states}
    if kinds & {"queued", "loading"}:
        return "loading"
    if kinds == {"error"}:
        return "error"
    return "ready"
