"""Where the server keeps the step-timeline stores (analysis/timeline.py) of its spans.

The analysis process builds one store per span (numpy arrays, tens of bytes per event)
next to the span's report; the engine's Analyzer hands it here instead of putting it into the
JSON result. Stores are kept in memory (a few, least recently used first out) and,
with a disk cache, as ``<cache key>.timeline.npz`` beside the cached report (no pickle),
bounded in total size (oldest files removed). A request loads a store from disk when it
is not in memory; it never parses a trace.
"""
from __future__ import annotations

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


# ----------------------------------------------------------------------------- span choice

def span_to_show(ready: list, step: Optional[int], store_of):
    """The (worker, span, state) of ``ready`` whose timeline a request shows: the one whose
    report lists ``step`` (else whose store holds it: a step the report excluded), or
    without a step the one with the slowest included step; the first when none matches.
    ``store_of(span, state)``: that span's store or None (read only for excluded steps)."""
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
        from ..views import timeline_window as tw

        for w, s, st in ready:
            store = store_of(s, st)
            index = tw.step_index(store, step) if store is not None else None
            if index is not None and index >= 0:  # -1: not in this store; 0 is the first step
                best = (w, s, st)
                break
    return best if best is not None else ready[0]
