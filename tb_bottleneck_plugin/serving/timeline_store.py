"""Where the server keeps the step-timeline stores (analysis/timeline.py) of its spans.

The analysis process builds one store per span (numpy arrays, tens of bytes per event)
next to the span's report; the service hands it here instead of putting it into the
JSON result. Stores are kept in memory (a few, least recently used first out) and,
with a disk cache, as ``<cache key>.timeline.npz`` beside the cached report (no pickle),
bounded in total size (oldest files removed). A request loads a store from disk when it
is not in memory; it never parses a trace.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from .cache import discard, evict_oldest, mark_used

log = logging.getLogger(__name__)

MEMORY_STORES = 8  # stores kept in memory
DISK_BYTES = 1 << 30  # timeline files kept on disk in all
SUFFIX = ".timeline.npz"
RESULT_KEY = "timeline_store"  # where analyze_span(timeline=True) leaves the store


# Why a span has no store, said by the timeline routes (422). A store that was built and
# is gone since (an unreadable or evicted ``.timeline.npz``) is not one of these: the
# span is analysed again (``Analyzer.reanalyze``, asked by the routes).
NO_STORE_BUILT = ("building the step timeline failed on this trace (an internal error; the TensorBoard "
                  "log has the traceback); the report's other sections are there")
NO_STORE_RETURNED = ("the analysis of this span returned no step-timeline store (a custom analysis "
                     "function, or a Dask worker running a plugin version without timelines)")


def pop_store(result: dict):
    """The store an analysis left in its result (removed from it: the result goes to JSON)."""
    if isinstance(result, dict):
        return result.pop(RESULT_KEY, None)
    return None


def missing_store_reason(result) -> Optional[str]:
    """Why ``result`` (before ``pop_store``) carries no timeline store; None when it has one.
    ``report.analyze_span(timeline=True)`` always leaves the key (None: building failed)."""
    if not isinstance(result, dict) or RESULT_KEY not in result:
        return NO_STORE_RETURNED
    return NO_STORE_BUILT if not isinstance(result[RESULT_KEY], dict) else None


class TimelineStores:
    """Timeline stores by (span URL, fingerprint); ``disk_key(url, fingerprint)`` names the
    file of a store in ``directory`` (the disk cache's own key), or there is no disk."""

    def __init__(self, directory=None, disk_key=None, memory_stores: int = MEMORY_STORES,
                 disk_bytes: int = DISK_BYTES):
        self.directory = Path(directory) if directory is not None and disk_key is not None else None
        self._disk_key = disk_key
        self.memory_stores = max(1, int(memory_stores))
        self.disk_bytes = disk_bytes
        self._mem: "OrderedDict[Tuple[str, str], Dict[str, np.ndarray]]" = OrderedDict()
        self._missing: Dict[Tuple[str, str], str] = {}  # spans whose analysis left no store: why
        self._lock = threading.Lock()
        self.loads = 0  # stores read from disk (tests, stats)
        self.discarded = 0  # unreadable store files deleted (tests, stats)

    def _path(self, url: str, fingerprint: str) -> Optional[Path]:
        if self.directory is None:
            return None
        return self.directory / f"{self._disk_key(url, fingerprint)}{SUFFIX}"

    def _remember(self, key, store) -> None:
        with self._lock:
            self._mem[key] = store
            self._mem.move_to_end(key)
            while len(self._mem) > self.memory_stores:
                self._mem.popitem(last=False)

    def put_result(self, url: str, fingerprint: str, result: dict) -> None:
        """Keeps the store an analysis left in ``result`` (popped from it), or why there is none."""
        reason = missing_store_reason(result)
        store = pop_store(result)
        with self._lock:
            if reason is None:
                self._missing.pop((url, fingerprint), None)
            else:
                self._missing[(url, fingerprint)] = reason
        self.put(url, fingerprint, store)

    def missing_reason(self, url: str, fingerprint: str) -> Optional[str]:
        """Why the analysis of this span (in this process) left no store; None when it left
        one, or when it was not analysed here (served from the disk cache)."""
        with self._lock:
            return self._missing.get((url, fingerprint))

    def put(self, url: str, fingerprint: str, store) -> None:
        if not isinstance(store, dict):
            return
        path = self._path(url, fingerprint)
        if path is None:
            # no disk: memory is the only copy, so keep every store
            with self._lock:
                self._mem[(url, fingerprint)] = store
            return
        self._remember((url, fingerprint), store)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}.npz")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, **store)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("bottlenecks: cannot write a timeline store in %s: %s", path.parent, exc)
            discard(tmp)
            return
        self._prune(keep=path)

    def has(self, url: str, fingerprint: str) -> bool:
        with self._lock:
            if (url, fingerprint) in self._mem:
                return True
        path = self._path(url, fingerprint)
        return path is not None and path.is_file()

    def get(self, url: str, fingerprint: str):
        """The store, or None when this span has none (not analysed here yet, or an
        unreadable file, which is removed)."""
        key = (url, fingerprint)
        with self._lock:
            store = self._mem.get(key)
            if store is not None:
                self._mem.move_to_end(key)
                return store
        path = self._path(url, fingerprint)
        if path is None or not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                store = {k: z[k] for k in z.files}
            from ..analysis.timeline import STORE_VERSION

            if int(store["version"][0]) != STORE_VERSION:
                raise ValueError("old store version")
        except Exception as exc:  # noqa: BLE001 - a broken file is a missing store
            log.warning("bottlenecks: discarding an unreadable timeline store %s (the span is analysed "
                        "again when its timeline is asked for): %s", path, exc)
            discard(path)
            self.discarded += 1
            return None
        mark_used(path)
        self.loads += 1
        self._remember(key, store)
        return store

    def _prune(self, keep: Optional[Path] = None) -> None:
        evict_oldest(self.directory, "*" + SUFFIX, self.disk_bytes, keep=keep)


# ----------------------------------------------------------------------------- routes

def _number(args, name: str, kind=float):
    raw = args.get(name)
    if raw is None or raw == "":
        return None
    value = kind(raw)  # ValueError -> 400
    if kind is float and not np.isfinite(value):
        raise ValueError(name)
    return value


def _pick(analyzer, args, problem):
    """((worker, span, state, store, step) or None, error (body, code) or None)."""
    from ..plugin import MAX_NAME_CHARS, MAX_RUN_CHARS

    if analyzer is None:
        return None, ({"error": problem or "no logdir"}, 404)
    run = args.get("run")
    if not run:
        return None, ({"error": "missing query parameter 'run'"}, 400)
    worker = args.get("worker") or None
    span = args.get("span") or None
    if span == "all":
        span = None
    if (len(run) > MAX_RUN_CHARS or len(worker or "") > MAX_NAME_CHARS
            or len(span or "") > MAX_NAME_CHARS or "\x00" in run + (worker or "") + (span or "")):
        return None, ({"error": "unknown run, worker or span (name too long or not a name)"}, 404)
    try:
        step = _number(args, "step", int)
    except ValueError:
        return None, ({"error": f"step must be a step number, got {args.get('step')!r}"}, 400)
    try:
        selected = analyzer.span_states(run, worker, span)
    except KeyError:
        if analyzer.activity()[1] is None:
            return None, ({"state": "loading", "progress": 0.0, "scan": "pending"}, 202)
        what = f"run {run!r}" + (f", worker {worker!r}" if worker else "") + (f", span {span!r}" if span else "")
        return None, ({"error": f"unknown {what} (not among the runs found in the logdir)"}, 404)
    loading = [st for _, _, st in selected if st.state in ("queued", "loading")]
    if loading:
        progress = sum(st.progress for st in loading) / len(loading)
        return None, ({"state": "loading", "progress": round(progress, 3)}, 202)
    ready = [(w, s, st) for w, s, st in selected if st.state == "ready" and st.result]
    if not ready:
        rel = analyzer.relative
        errors = [{"file": rel(s.url), "error": rel(st.error), "retry": st.retry}
                  for _, s, st in selected if st.error]
        return None, ({"state": "error", "error": errors[0]["error"] if errors else "no trace files",
                       "errors": errors}, 422)
    # the span: the one holding the step asked for, else the slowest included step of all
    best, best_us = None, -1.0
    for w, s, st in ready:
        per = ((st.result.get("report") or {}).get("input") or {}).get("per_step") or []
        for p in per:
            us = p.get("step_us")
            num = p.get("step")
            if step is not None:
                if num == step:
                    best, best_us = (w, s, st), 0.0
            elif isinstance(us, (int, float)) and us > best_us:
                best, best_us = (w, s, st), float(us)
        if best is not None and step is not None:
            break
    if best is None and step is not None:  # an excluded step: only the stores know it
        from ..analysis import timeline as tl

        for w, s, st in ready:
            store = analyzer.timelines.get(s.url, st.fingerprint)
            if store is not None and (tl.step_index(store, step) or -1) >= 0:
                best = (w, s, st)
                break
    if best is None:
        best = ready[0]
    w, s, st = best
    store = analyzer.timelines.get(s.url, st.fingerprint)
    if store is None:
        reason = analyzer.timelines.missing_reason(s.url, st.fingerprint)
        if reason is None and _analyse_again(analyzer, run, s):
            # built once, gone now (an unreadable or evicted .timeline.npz): analysed again
            return None, ({"state": "loading", "progress": 0.0}, 202)
        return None, ({"state": "error", "error": "the step timeline is not available for this span: "
                       + (reason or NO_STORE_RETURNED), "errors": []}, 422)
    from ..analysis import timeline as tl

    if tl.step_index(store, step) is None:
        return None, ({"state": "error", "error": "this span has no step", "errors": []}, 422)
    if step is not None and tl.step_index(store, step) < 0:
        return None, ({"error": f"unknown step {step} in this span"}, 404)
    return (w, s, st, store, step), None


def _analyse_again(analyzer, run: str, span) -> bool:
    """Queue ``span`` for a new analysis (the service's ``reanalyze``); False when the
    analyzer cannot (an older or injected one) or the span is not ready any more."""
    again = getattr(analyzer, "reanalyze", None)
    if again is None:
        return False
    try:
        return bool(again(run, span))
    except Exception:  # noqa: BLE001 - the 422 below still names the cause
        log.exception("bottlenecks: queueing %s for a new analysis failed", getattr(span, "url", span))
        return False


def timeline_route(analyzer, args, problem: Optional[str] = None):
    """(body, HTTP status) of ``timeline?run=&worker=&span=&step=&t0=&t1=&px=``: 200 with
    one level-of-detail window (analysis/timeline.window), 202 while loading, 400 for bad
    numbers, 404 for unknown names or steps, 422 when the span has no timeline."""
    from ..analysis import timeline as tl

    picked, failure = _pick(analyzer, args, problem)
    if failure is not None:
        return failure
    w, s, st, store, step = picked
    try:
        t0, t1 = _number(args, "t0"), _number(args, "t1")
        px = _number(args, "px", int)
    except ValueError:
        return {"error": "t0 and t1 must be numbers (µs from the step start), px a whole number"}, 400
    body = tl.window(store, step, t0, t1, px=px or 1200, cap=tl.DEFAULT_CAP)
    body["worker"], body["span"] = w.name, s.name
    body["has_gpu"] = bool(np.any(store["row_kind"] == tl.ROW_GPU))
    body["spans"] = [{"worker": ww.name, "span": ss.name} for ww, ss, _ in analyzer.span_states(
        args.get("run"), args.get("worker") or None, None if args.get("span") in (None, "", "all") else args.get("span"))]
    return encode(body), 200


def encode(body: dict):
    """The JSON text of an answer (every number is finite: no NaN walk needed); the dict
    itself, for TensorBoard's cleansing encoder, if one is not."""
    try:
        return json.dumps(body, ensure_ascii=True, allow_nan=False)
    except ValueError:
        return body


def step_trace_route(analyzer, args, problem: Optional[str] = None):
    """(body, status, filename) of ``step_trace?run=&worker=&span=&step=&t0=&t1=``: the
    step's events (those overlapping [t0, t1] µs from the step start when given) as a
    Chrome trace to download, at most analysis.timeline.EXPORT_MAX_EVENTS of them
    (filename None on errors)."""
    from ..analysis import timeline as tl

    picked, failure = _pick(analyzer, args, problem)
    if failure is not None:
        return failure[0], failure[1], None
    w, s, st, store, step = picked
    try:
        t0, t1 = _number(args, "t0"), _number(args, "t1")
    except ValueError:
        return {"error": "t0 and t1 must be numbers (µs from the step start)"}, 400, None
    # at most tl.EXPORT_MAX_EVENTS events (the cut and a trace without steps said in otherData.note)
    doc = tl.chrome_trace(store, step, t0, t1)
    other = doc["otherData"]
    what = f"step{other['step']}" if other["steps_found"] else "whole-trace"
    w0, w1 = other["window_us"]
    if w0 > 0 or w1 < other["step_end_us"] - other["step_start_us"]:  # a zoomed window
        what += f"-{w0:.0f}-{w1:.0f}us"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{args.get('run')}-{w.name}-{what}")
    return doc, 200, safe[:120] + ".trace.json"
