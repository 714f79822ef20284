"""Where the server keeps the step-timeline stores (analysis/timeline.py) of its spans.

The analysis process builds one store per span (numpy arrays, tens of bytes per event)
next to the span's report; the service hands it here instead of putting it into the
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

log = logging.getLogger(__name__)

MEMORY_STORES = 8  # stores kept in memory
DISK_BYTES = 1 << 30  # timeline files kept on disk in all
SUFFIX = ".timeline.npz"
RESULT_KEY = "timeline_store"  # where analyze_span(timeline=True) leaves the store


def pop_store(result: dict):
    """The store an analysis left in its result (removed from it: the result goes to JSON)."""
    if isinstance(result, dict):
        return result.pop(RESULT_KEY, None)
    return None


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
        self._lock = threading.Lock()
        self.loads = 0  # stores read from disk (tests, stats)

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
            try:
                tmp.unlink()
            except OSError:
                pass
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
            from .analysis.timeline import STORE_VERSION

            if int(store["version"][0]) != STORE_VERSION:
                raise ValueError("old store version")
        except Exception as exc:  # noqa: BLE001 - a broken file is a missing store
            log.warning("bottlenecks: discarding an unreadable timeline store %s: %s", path, exc)
            try:
                path.unlink()
            except OSError:
                pass
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        self.loads += 1
        self._remember(key, store)
        return store

    def _prune(self, keep: Optional[Path] = None) -> None:
        try:
            files = []
            for p in self.directory.glob("*" + SUFFIX):
                st = p.stat()
                files.append((st.st_mtime, st.st_size, p))
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.disk_bytes:
                break
            if p == keep:
                continue
            try:
                p.unlink()
                total -= size
            except OSError:
                pass
