"""Decode worker processes for large files (opt-in by load: `_decode_workers`).

Part of the loader. `_ChunkSink` sends each chunk of whole events either to this
process's builder or, while a worker is free, to a worker process that decodes it into
columns of its own (`_decode_chunk`); results are merged in file order, so the string
ids, rows and warnings are the same as decoding every chunk here.
"""
from __future__ import annotations

import collections
import gc
import logging
import os
import threading

from .columns import _Builder
from .events import _decode_events

log = logging.getLogger(__name__)


def _decode_chunk(payload: bytes, seed=None) -> _Builder:
    """Decode one chunk of whole events into columns of its own (in a worker process, or
    here while the chunks before it are still out). ``seed``: `_Builder.seed()` of the
    builder it will be merged into."""
    builder = _Builder("", seed)
    builder.add(_decode_events(payload, builder))
    return builder


# Decoding is CPU-bound Python (msgspec holds the GIL), so large files can be decoded by
# worker processes (`_Worker`, up to IN_FLIGHT_PER_WORKER chunks each) while this process
# gunzips, decodes the chunks the workers are too busy for, and merges in file order
# (_ChunkSink). Small files never start a worker; how many workers: _decode_workers.
PARALLEL_MIN_CHUNKS = 2  # chunks decoded in-process before a worker is used
PARALLEL_MIN_BYTES = 64 << 20  # estimated text size (gzip inflates traces >= 12x) worth a worker
IN_FLIGHT_PER_WORKER = 2  # chunks a worker holds: one decoding, one waiting (so it never waits for this thread)


def _decode_workers() -> int:
    """Worker processes that decode chunks of large files beside this process.

    TB_BOTTLENECKS_DECODE_PROCESSES=N decides when set (0: in-process). Otherwise one
    worker when this process may use two or more cores and about one of them is idle
    (1-minute load average below cores - 0.5), else none: a second core speeds a quiet
    machine's report up, while on a busy one the extra interpreter and pickling only add
    CPU (measurements: benchmarks/README.md, "after perf" and "perf3"). Analyses of many
    spans at once load every core, so they decode in-process."""
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


class _Worker:
    """One decode process fed by the loading thread itself, without helper threads.

    No executor: a `ProcessPoolExecutor` hands chunks over and results back through
    helper threads that must win the GIL from the loading thread, which starved the
    worker. Here the loading thread copies the chunk into a shared memory slot (an
    anonymous shared mapping made before the fork) and writes a small message into a
    pipe, a write that never waits for the worker to be scheduled. The worker answers the
    same way: its pickled columns in a second slot. Before each next chunk the loading
    thread takes a finished result if one is there (`ready`). The worker keeps a mirror of
    this process's string table, so a chunk carries only the table's new entries. Without
    fork (a fork server, when threads run) or for a chunk larger than its slot, the bytes
    go through the pipe. Measurements: benchmarks/README.md, "perf3" and "perf4"."""

    SLOT_BYTES = 8 << 20

    def __init__(self):
        import mmap
        import multiprocessing

        # fork is cheap but unsafe once threads run (TensorBoard's server): then use a
        # fork server, which forks from a clean single-threaded process.
        if threading.active_count() == 1:
            context = multiprocessing.get_context("fork")
            # MAP_SHARED; per chunk in flight: its text, its result
            self.slots = [(mmap.mmap(-1, self.SLOT_BYTES), mmap.mmap(-1, self.SLOT_BYTES))
                          for _ in range(IN_FLIGHT_PER_WORKER)]
        else:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            self.slots = None
        self.conn, child = context.Pipe()
        args = (child, os.getpid(), self.slots, self.conn if self.slots else None)
        self.process = context.Process(target=_worker_main, args=args, daemon=True)
        self.process.start()
        child.close()
        self.out = collections.deque()  # per chunk out, in order: its slot, its size or its bytes
        self.sent_count = 0
        self.sent_strings = 0  # entries of the main string table the worker has
        self.sent_raw = 1  # ... and of its recorded-input ids (b"" -> -1 is always there)

    def send(self, payload, builder: _Builder) -> None:
        strings = list(builder.strings)[self.sent_strings:] if len(builder.strings) > self.sent_strings else []
        raw = builder._raw_id_cache
        raw_new = list(raw.items())[self.sent_raw:] if len(raw) > self.sent_raw else []
        size = len(payload)
        slot = self.sent_count % IN_FLIGHT_PER_WORKER  # its previous chunk's result is in: free
        if self.slots is not None and size <= self.SLOT_BYTES:
            self.slots[slot][0][:size] = payload
            self.conn.send((strings, raw_new, slot, size))
            self.out.append((slot, size))
        else:
            payload = bytes(payload)
            self.conn.send((strings, raw_new, slot, None))
            self.conn.send_bytes(payload)
            self.out.append((slot, payload))
        self.sent_count += 1
        self.sent_strings += len(strings)
        self.sent_raw += len(raw_new)

    def can_take(self, size: int) -> bool:
        """A second chunk only through the slot: two large writes through the pipe, this
        chunk and the worker's result, would wait for each other."""
        if not self.out:
            return True
        return (self.slots is not None and size <= self.SLOT_BYTES and len(self.out) < IN_FLIGHT_PER_WORKER
                and all(isinstance(size, int) for _, size in self.out))

    def chunks(self) -> list:
        """The chunks out, in order (for decoding them here instead)."""
        return [self.slots[slot][0][:size] if isinstance(size, int) else size for slot, size in self.out]

    def ready(self) -> bool:
        return self.conn.poll()

    def result(self) -> _Builder:
        """The chunk's builder (blocks until it is there); raises what decoding raised,
        or `_WorkerLost` when the worker is gone."""
        import pickle

        try:
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise _WorkerLost(str(exc)) from None
        if status == "slot":
            status, value = pickle.loads(memoryview(self.slots[self.out[0][0]][1])[:value])
        self.out.popleft()
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        """End the worker: a free one exits when told, a busy one (its chunk no longer
        wanted) is killed."""
        if not self.out:
            try:
                self.conn.send(None)
            except OSError:
                pass
        else:
            self.process.kill()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()
        if self.slots is not None:
            for pair in self.slots:
                for slot in pair:
                    slot.close()


class _WorkerLost(Exception):
    pass


def _worker_main(conn, owner_pid: int, slots, parent_end) -> None:
    import pickle

    from . import procguard

    if parent_end is not None:  # forked: this process's copy of the parent's end
        parent_end.close()
    procguard.die_with_parent(owner_pid)
    gc.disable()  # it only decodes: no reference cycles (see loader._collector_paused)
    strings: dict = {}
    raw: dict = {b"": -1}
    try:
        while True:
            try:
                message = conn.recv()
                if message is None:
                    break
                new_strings, new_raw, slot, size = message
                payload = conn.recv_bytes() if size is None else slots[slot][0][:size]
            except (EOFError, OSError):
                break
            for s in new_strings:
                strings[s] = len(strings)
            raw.update(new_raw)
            try:
                reply = ("ok", _decode_chunk(payload, (dict(strings), dict(raw))))
            except Exception as exc:  # noqa: BLE001 - raised again in the loading process
                reply = ("error", exc)
            del payload
            try:
                if slots is not None:
                    data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
                    if len(data) <= len(slots[slot][1]):
                        slots[slot][1][:len(data)] = data
                        conn.send(("slot", len(data)))
                        continue
                conn.send(reply)
            except (EOFError, OSError):
                break
    finally:
        os._exit(0)  # a forked copy: nothing of the parent's to tear down


def _start_workers(n: int) -> list:
    return [_Worker() for _ in range(n)]


class _ChunkSink:
    """Sends chunks to the builder: in-process, and (large files) also to the workers.

    With workers, this thread keeps decoding too: a chunk goes to a worker that is free,
    else it is decoded here into a chunk builder of its own. Results are merged in file
    order (the same string ids, rows and warnings as decoding every chunk here). If a
    worker is lost (killed, no multiprocessing here), the chunks are decoded in this
    process instead.
    """

    def __init__(self, builder: _Builder, text_bytes: int):
        """``text_bytes``: the file's estimated text size; below PARALLEL_MIN_BYTES no workers."""
        self.builder = builder
        self.chunks = 0
        self.sent = 0  # chunks decoded by workers (for tests and benchmarks)
        n = _decode_workers() if text_bytes >= PARALLEL_MIN_BYTES else 0
        # file order: (worker, None) sent to a worker | (None, _Builder) decoded here
        self.pending = collections.deque()
        self.pool: list = []
        if n:
            try:
                self.pool = _start_workers(n)  # forked before any thread of ours
            except Exception:  # noqa: BLE001 - no workers here (e.g. a daemonic process may not fork
                # children: AssertionError): decode in-process, never a failed load
                log.debug("decode workers unavailable; decoding in-process", exc_info=True)
                self.pool = []
        self.workers = len(self.pool)

    def add(self, payload) -> None:
        """``payload``: the JSON array text of whole events (bytes or a view, which is not
        kept after this call)."""
        self.chunks += 1
        self._merge_ready()
        free = None
        if self.pool and self.chunks > PARALLEL_MIN_CHUNKS:
            free = next((w for w in self.pool if w.can_take(len(payload))), None)
        if free is None:
            if not self.pending:  # nothing before it is still out: straight into the builder
                self.builder.add(_decode_events(payload, self.builder))
            else:
                self.pending.append((None, _decode_chunk(payload, self.builder.seed())))
            return
        try:
            free.send(payload, self.builder)
        except (OSError, EOFError):  # the worker is gone
            self._local_fallback()
            self.builder.add(_decode_events(payload, self.builder))
            return
        self.sent += 1
        self.pending.append((free, None))

    def _merge_ready(self) -> None:
        while self.pending and (self.pending[0][0] is None or self.pending[0][0].ready()):
            self._merge_oldest()

    def _merge_oldest(self) -> None:
        worker, item = self.pending[0]
        if worker is None:
            self.pending.popleft()
            self.builder.merge(item)
            return
        try:
            result = worker.result()
        except _WorkerLost:
            self._local_fallback()
            return
        self.pending.popleft()
        self.builder.merge(result)

    def _local_fallback(self) -> None:
        pending, self.pending = self.pending, collections.deque()
        out = {id(w): w.chunks() for w in self.pool}
        chunks = [(worker, item if worker is None else out[id(worker)].pop(0)) for worker, item in pending]
        self.close()
        for worker, item in chunks:
            if worker is None:
                self.builder.merge(item)
            else:
                self.builder.add(_decode_events(item, self.builder))

    def drain(self) -> None:
        while self.pending:
            self._merge_oldest()

    def cancel(self) -> None:
        self.pending.clear()

    def close(self) -> None:
        """End the decode workers (a chunk still out is dropped): their memory (a forked
        copy of this process plus one chunk's events) is not held while the analyses run."""
        pool, self.pool = self.pool, []
        self.workers = 0
        for worker in pool:
            worker.close()
