"""Decode worker processes for large files (opt-in by load: `_decode_workers`).

Part of the loader. `_ChunkSink` sends each chunk of whole events either to this
process's builder or, while a worker is free, to a worker process that decodes it into
columns of its own (`_decode_chunk`); results are merged in file order, so the string
ids, rows and warnings are the same as decoding every chunk here.
"""
from __future__ import annotations

import collections
import logging
import os
import threading

from .loader_columns import _Builder
from .loader_events import _decode_events

log = logging.getLogger(__name__)


def _decode_chunk(payload: bytes, seed=None) -> _Builder:
    """Decode one chunk of whole events into columns of its own (in a worker process, or
    here while the chunks before it are still out). ``seed``: `_Builder.seed()` of the
    builder it will be merged into."""
    builder = _Builder("", seed)
    builder.add(_decode_events(payload, builder))
    return builder


# Decoding is CPU-bound Python (msgspec holds the GIL), so large files can be decoded by
# worker processes, one chunk each, while this process gunzips, decodes the chunks the
# workers are too busy for, and merges in file order (_ChunkSink). Small files never
# start the pool; how many workers: _decode_workers.
PARALLEL_MIN_CHUNKS = 2  # chunks decoded in-process before the pool is used
PARALLEL_MIN_BYTES = 64 << 20  # estimated text size (gzip inflates traces >= 12x) worth a pool
_MAX_IN_FLIGHT_PER_WORKER = 1  # a worker holds one chunk; meanwhile this process decodes the next
_pool = None
_pool_lock = threading.Lock()


def _decode_workers() -> int:
    """Worker processes that decode chunks of large files beside this process.

    TB_BOTTLENECKS_DECODE_PROCESSES=N decides when set (0: in-process). Otherwise one
    worker when this process may use two or more cores and about one of them is idle
    (1-minute load average below cores - 0.5), else none: on the 292 MB benchmark trace
    (2 cores, benchmarks/README.md "after perf") one worker with 2 MB chunks cut the
    report from 2.69 to 2.30-2.40 s on a quiet machine at about the same peak memory, but
    on a busy one (load 3-10) it saved little and cost ~0.5 s more CPU (pickling, a
    second interpreter; since chunk builders start from the main string table, "perf3"
    in benchmarks/README.md, the CPU is about the in-process figure, but at load 8-10 it
    was still no faster). Analyses of many spans at once load every core, so they decode
    in-process."""
    value = os.environ.get("TB_BOTTLENECKS_DECODE_PROCESSES")
    if value is not None and value.strip():
        try:
            return max(0, int(value))
        except ValueError:
            return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
        import multiprocessing

        if multiprocessing.current_process().daemon:  # e.g. a Dask worker: may not have children
            return 0
    except (AttributeError, OSError, ImportError):
        return 0
    return 1 if cores >= 2 and load < cores - 0.5 else 0


def _get_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # fork is cheap but unsafe once threads run (TensorBoard's server): then use
            # a fork server, which forks from a clean single-threaded process.
            if threading.active_count() == 1:
                context = multiprocessing.get_context("fork")
            else:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload([__name__])
            from . import procguard

            # the workers exit when this process dies, SIGKILL included (no orphans)
            _pool = ProcessPoolExecutor(max_workers=_decode_workers(), mp_context=context,
                                        initializer=procguard.die_with_parent, initargs=(os.getpid(),))
            import atexit

            atexit.register(_drop_pool)  # shut the workers down before the interpreter tears down
            if context.get_start_method() == "fork":  # fork them now, before the caller's gunzip thread
                _pool.submit(int).result()
        return _pool


def _drop_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


class _ChunkSink:
    """Sends chunks to the builder: in-process, and (large files) also to the pool.

    With a pool, this thread keeps decoding too: a chunk goes to a worker while the
    workers have fewer than ``_MAX_IN_FLIGHT_PER_WORKER`` chunks each, else it is decoded
    here into a chunk builder of its own. Results are merged in file order (the same
    string ids, rows and warnings as decoding every chunk here). If the pool breaks (a
    worker killed, no multiprocessing here), the chunks are decoded in this process
    instead.
    """

    def __init__(self, builder: _Builder, text_bytes: int):
        """``text_bytes``: the file's estimated text size; below PARALLEL_MIN_BYTES no workers."""
        self.builder = builder
        self.chunks = 0
        self.workers = _decode_workers() if text_bytes >= PARALLEL_MIN_BYTES else 0
        # file order: (future, payload) sent to a worker | (None, _Builder) decoded here
        self.pending = collections.deque()
        if self.workers:
            try:
                _get_pool()  # started (workers forked) before any thread of ours
            except Exception:  # noqa: BLE001 - no pool here (e.g. a daemonic process may not fork
                # children: AssertionError): decode in-process, never a failed load
                log.debug("decode workers unavailable; decoding in-process", exc_info=True)
                _drop_pool()
                self.workers = 0

    def add(self, payload) -> None:
        """``payload``: the JSON array text of whole events (bytes or a view, which is not
        kept after this call)."""
        self.chunks += 1
        self._merge_ready()
        if self.workers == 0 or self.chunks <= PARALLEL_MIN_CHUNKS or self._in_flight() >= \
                self.workers * _MAX_IN_FLIGHT_PER_WORKER:
            if not self.pending:  # nothing before it is still out: straight into the builder
                self.builder.add(_decode_events(payload, self.builder))
            else:
                self.pending.append((None, _decode_chunk(payload, self.builder.seed())))
            return
        payload = bytes(payload)  # sent to a worker and kept for a fallback
        try:
            self.pending.append((_get_pool().submit(_decode_chunk, payload, self.builder.seed()), payload))
        except RuntimeError:  # pool broken or shut down
            self._local_fallback()
            self.builder.add(_decode_events(payload, self.builder))

    def _in_flight(self) -> int:
        return sum(1 for f, _ in self.pending if f is not None)

    def _merge_ready(self) -> None:
        while self.pending and (self.pending[0][0] is None or self.pending[0][0].done()):
            self._merge_oldest()

    def _merge_oldest(self) -> None:
        from concurrent.futures.process import BrokenProcessPool

        future, item = self.pending[0]
        if future is None:
            self.pending.popleft()
            self.builder.merge(item)
            return
        try:
            result = future.result()
        except BrokenProcessPool:
            self._local_fallback()
            return
        self.pending.popleft()
        self.builder.merge(result)

    def _local_fallback(self) -> None:
        _drop_pool()
        self.workers = 0
        pending, self.pending = self.pending, collections.deque()
        for future, item in pending:
            if future is None:
                self.builder.merge(item)
            else:
                self.builder.add(_decode_events(item, self.builder))

    def drain(self) -> None:
        while self.pending:
            self._merge_oldest()

    def cancel(self) -> None:
        for f, _ in self.pending:
            if f is not None:
                f.cancel()
        self.pending.clear()

    def close(self) -> None:
        """Cancel what is left and end the decode workers: their memory (a forked copy
        of this process plus one chunk's events) is not held while the analyses run."""
        self.cancel()
        if self.workers:
            _drop_pool()
