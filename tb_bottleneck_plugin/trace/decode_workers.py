"""Decode worker processes for large files (opt-in by load: `_decode_workers`).

Part of the loader. `_ChunkSink` sends each chunk of whole events either to this
process's builder or, while a worker is free, to a worker process that decodes it into
columns of its own (`_decode_chunk`); results are merged in file order, so the string
ids, rows and warnings are the same as decoding every chunk here.
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import pickle
import threading
from typing import List, Tuple

import numpy as np

from . import model, procguard
from .columns import _Builder, _last
from . import native

log = logging.getLogger(__name__)


def _decode_chunk(payload: bytes, seed=None) -> _Builder:
    """Decode one chunk of whole events into columns of its own (in a worker process, or
    here while the chunks before it are still out). ``seed``: `_Builder.seed()` of the
    builder it will be merged into."""
    builder = _Builder("", seed)
    native.decode_into(payload, builder)
    return builder


# ---------------------------------------------------------------- the columns' handover
# A worker hands a chunk's columns back as raw bytes, not as pickled Python objects: a small
# header (pickled: the table layout, the counters, the few distinct Inductor launches) and
# then every numeric column, the chunk's new strings and recorded-input texts as one blob
# each, and the recorded inputs the Tensor Core analysis keeps as (row, text) arrays,
# decoded here through this process's own cache of decoded texts (as in-process decoding
# does). Layout: header size (8 bytes), header, columns at 8-byte aligned offsets.
_TABLES = ("gpu", "cpu", "runtime", "memory", "annotations")
_ALIGN = 8


def _blob(items: list) -> tuple:
    """Byte strings as (lengths, one uint8 array)."""
    return np.fromiter(map(len, items), np.int64, len(items)), np.frombuffer(b"".join(items), np.uint8)


def _unblob(lengths: np.ndarray, data: np.ndarray) -> List[bytes]:
    raw = data.tobytes()
    ends = np.cumsum(lengths).tolist()
    return [raw[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _pack(builder: _Builder) -> Tuple[bytes, List[np.ndarray], int]:
    """(header, columns, size written by `_write_packed`) of a decoded chunk builder."""
    arrays: List[np.ndarray] = []

    def put(array) -> int:
        arrays.append(np.ascontiguousarray(array))
        return len(arrays) - 1

    tables = {attr: [{f.name: put(getattr(t, f.name)) for f in dataclasses.fields(t)} for t in getattr(builder, attr)]
              for attr in _TABLES}
    added = builder.added_strings()
    strings = [put(a) for a in _blob([s.encode("utf-8", "surrogatepass") for s in added])]
    raw = builder.added_raw()
    put_blob = [put(a) for a in _blob([k for k, _ in raw])] + [put(np.fromiter((i for _, i in raw), np.int64,
                                                                               len(raw)))]
    # recorded inputs: each value is the one decoded object of its text (_Builder._decoded)
    texts = list(builder._decoded_cache)
    text_of = {id(v): i for i, v in enumerate(builder._decoded_cache.values())}
    inputs = {}
    for name in ("dims", "types"):
        values = getattr(builder.op_inputs, name)
        inputs[name] = (put(np.fromiter(values, np.int64, len(values))),
                        put(np.fromiter((text_of[id(v)] for v in values.values()), np.int64, len(values))))
    peers = builder.op_inputs.peers
    inputs["peers"] = (put(np.fromiter(peers, np.int64, len(peers))),
                       put(np.fromiter(peers.values(), np.int64, len(peers))))
    inputs["texts"] = [put(a) for a in _blob(texts)]
    launches = list(dict.fromkeys(builder.kernel_launches.values()))
    index = {launch: i for i, launch in enumerate(launches)}
    rows = builder.kernel_launches
    kernel_launches = ([tuple(launch) for launch in launches], put(np.fromiter(rows, np.int64, len(rows))),
                       put(np.fromiter((index[v] for v in rows.values()), np.int64, len(rows))))
    counters = {name: getattr(builder, name) for name in _COUNTERS}
    layout = []
    offset = 0
    for a in arrays:
        layout.append((a.dtype.str, a.shape, offset))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    header = pickle.dumps({"base": builder._base, "tables": tables, "strings": strings, "raw": put_blob,
                           "inputs": inputs, "launches": kernel_launches, "counters": counters,
                           "layout": layout}, protocol=pickle.HIGHEST_PROTOCOL)
    return header, arrays, 8 + -(-len(header) // _ALIGN) * _ALIGN + offset


_COUNTERS = ("cpu_rows", "category_counts", "event_count", "first_ts", "last_ts", "profiler_first_ts",
             "profiler_last_ts", "dropped_missing_dur", "dropped_bad_ts", "negative_dur", "field_problems",
             "skipped_deep", "skipped_not_object", "replaced_strings")


def _write_packed(header: bytes, arrays: List[np.ndarray], out) -> int:
    """Write a `_pack` result into ``out`` (a writable buffer at least its size long)."""
    target = np.frombuffer(out, np.uint8)
    start = 8 + -(-len(header) // _ALIGN) * _ALIGN
    target[:8] = np.frombuffer(len(header).to_bytes(8, "little"), np.uint8)
    target[8:8 + len(header)] = np.frombuffer(header, np.uint8)
    offset = start
    for a in arrays:
        n = a.nbytes
        if n:
            target[offset:offset + n] = a.reshape(-1).view(np.uint8)
        offset += -(-n // _ALIGN) * _ALIGN
    del target
    return offset


def _decode_detached(payload, builder: _Builder) -> _Builder:
    """`_decode_chunk` seeded with ``builder``'s own tables, without copying them (a copy
    per chunk costs as much as the chunk when a trace has a million names): the chunk
    grows them, then what it added is taken out again and kept on the chunk for `merge`."""
    strings, raw = builder.strings, builder._raw_id_cache
    n_strings, n_raw = len(strings), len(raw)
    try:
        chunk = _decode_chunk(payload, (strings, raw))
    finally:
        added = _last(strings, len(strings) - n_strings)
        added_raw = _last(raw.items(), len(raw) - n_raw)
        for s in added:
            del strings[s]
        for key, _ in added_raw:
            del raw[key]
    chunk.__class__ = _Received  # same state; merge reads what it added from the lists below
    chunk.strings, chunk._raw_id_cache = {}, {}
    chunk._added_strings, chunk._added_raw = added, added_raw
    return chunk


class _Received(_Builder):
    """A chunk's columns as a worker handed them over (`_unpack`), ready for `_Builder.merge`."""

    def added_strings(self) -> List[str]:
        return self._added_strings

    def added_raw(self) -> List[Tuple[bytes, int]]:
        return self._added_raw


def _unpack(data, into: _Builder) -> _Received:
    """The chunk builder of a `_pack`ed handover in ``data`` (a buffer, read before this
    returns); its recorded inputs decoded through ``into``'s cache (the builder it is
    merged into)."""
    view = memoryview(data)
    size = int.from_bytes(view[:8], "little")
    header = pickle.loads(view[8:8 + size])
    start = 8 + -(-size // _ALIGN) * _ALIGN
    arrays = [np.frombuffer(view, np.dtype(dtype), int(np.prod(shape)), start + offset).reshape(shape).copy()
              for dtype, shape, offset in header["layout"]]
    view.release()
    chunk = _Received("", None)
    chunk._base = header["base"]
    for attr, table_cls in zip(_TABLES, (model.GpuTable, model.CpuTable, model.RuntimeTable, model.MemoryTable,
                                         model.GpuAnnotationTable)):
        setattr(chunk, attr, [table_cls(**{name: arrays[i] for name, i in cols.items()})
                              for cols in header["tables"][attr]])
    lengths, blob = (arrays[i] for i in header["strings"])
    chunk._added_strings = [b.decode("utf-8", "surrogatepass") for b in _unblob(lengths, blob)]
    lengths, blob, ids = (arrays[i] for i in header["raw"])
    chunk._added_raw = list(zip(_unblob(lengths, blob), ids.tolist()))
    inputs = header["inputs"]
    texts = [into._decoded(t) for t in _unblob(*(arrays[i] for i in inputs["texts"]))]
    for name in ("dims", "types"):
        rows, which = (arrays[i].tolist() for i in inputs[name])
        setattr(chunk.op_inputs, name, dict(zip(rows, map(texts.__getitem__, which))))
    rows, peers = (arrays[i].tolist() for i in inputs["peers"])
    chunk.op_inputs.peers = dict(zip(rows, peers))
    launches, rows, which = header["launches"]
    launches = [model.KernelLaunch(*launch) for launch in launches]
    chunk.kernel_launches = dict(zip(arrays[rows].tolist(), map(launches.__getitem__, arrays[which].tolist())))
    for name, value in header["counters"].items():
        setattr(chunk, name, value)
    return chunk


# Decoding is CPU-bound Python (msgspec holds the GIL), so large files can be decoded by
# worker processes (`_Worker`, up to IN_FLIGHT_PER_WORKER chunks each) while this process
# gunzips, decodes the chunks the workers are too busy for, and merges in file order
# (_ChunkSink). Small files never start a worker; how many workers: _decode_workers.
PARALLEL_MIN_CHUNKS = 2  # chunks decoded in-process before a worker is used
PARALLEL_MIN_BYTES = 64 << 20  # estimated text size (gzip inflates traces >= 12x) worth a worker
IN_FLIGHT_PER_WORKER = 2  # chunks a worker holds: one decoding, one waiting (so it never waits for this thread)


def default_count() -> int:
    """How many decode workers a load here would start (`_decode_workers`): what an
    analysis child is told to use while it is the only one running (serving/children.py)."""
    return _decode_workers()


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _decode_workers() -> int:
    """Worker processes that decode chunks of large files beside this process.

    TB_BOTTLENECKS_DECODE_PROCESSES=N decides when set (0: in-process). Otherwise one
    worker when this process may use two or more cores and about one of them is idle
    (1-minute load average below cores - 0.5), else none: a second core speeds a quiet
    machine's report up, while on a busy one the extra interpreter and pickling only add
    CPU (measurements: benchmarks/README.md, "after perf" and "perf3"). Analyses of many
    spans at once load every core, so they decode in-process. With the native scanner
    (native.py) a chunk costs a few ms here and the gunzip thread already takes a second
    core: a worker's handover then only adds CPU (+0.3 s on the 292 MB trace, no faster on
    2 cores; benchmarks/README.md, issue 39's native section), so it needs three cores and
    about two of them idle."""
    value = os.environ.get("TB_BOTTLENECKS_DECODE_PROCESSES")
    if value is not None and value.strip():
        try:
            return max(0, int(value))
        except ValueError:
            return 0
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
        import multiprocessing

        if multiprocessing.current_process().daemon:  # e.g. a Dask worker: may not have children
            return 0
    except (AttributeError, OSError, ImportError):
        return 0
    if native.available():
        return 1 if cores >= 3 and load < cores - 1.5 else 0
    return 1 if cores >= 2 and load < cores - 0.5 else 0


class _Worker:
    """One decode process fed by the loading thread itself, without helper threads.

    No executor: a `ProcessPoolExecutor` hands chunks over and results back through
    helper threads that must win the GIL from the loading thread, which starved the
    worker. Here the loading thread copies the chunk into a shared memory slot (an
    anonymous shared mapping made before the fork) and writes a small message into a
    pipe, a write that never waits for the worker to be scheduled. The worker answers the
    same way: its columns as raw bytes (`_pack`) in a second slot. Before each next chunk
    the loading thread takes a finished result if one is there (`ready`). The worker keeps
    a string table of its own, so a result carries only the names it met first, mapped to
    this process's ids on merge (`id_map`). Without fork (a fork server, when threads run)
    or for a chunk larger than its slot, the bytes go through the pipe. Measurements:
    benchmarks/README.md, "perf3", "perf4" and issue 39's section."""

    SLOT_BYTES = 8 << 20
    # A result always fits its slot (anonymous memory: only the pages written are used), so a
    # worker never writes a large result into the pipe while this process writes a large
    # message (a chunk's many new names) into it: both would wait for ever.
    RESULT_SLOT_BYTES = 128 << 20

    def __init__(self):
        import mmap
        import multiprocessing

        # fork is cheap but unsafe once threads run (TensorBoard's server): then use a
        # fork server, which forks from a clean single-threaded process. An analysis
        # child's parent watcher (procguard) does not count.
        if procguard.only_watchers_running():
            context = multiprocessing.get_context("fork")
            # MAP_SHARED; per chunk in flight: its text, its result
            self.slots = [(mmap.mmap(-1, self.SLOT_BYTES), mmap.mmap(-1, self.RESULT_SLOT_BYTES))
                          for _ in range(IN_FLIGHT_PER_WORKER)]
        else:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            self.slots = None
        self.conn, child = context.Pipe()
        args = (child, os.getpid(), self.slots, self.conn if self.slots else None)
        try:
            self.process = context.Process(target=_worker_main, args=args, daemon=True)
            self.process.start()  # may fail: no fork here (EAGAIN, a daemonic process, no fork server)
        except BaseException:
            for end in (self.conn, child):
                end.close()
            for slot in (s for pair in self.slots or () for s in pair):
                slot.close()
            raise
        finally:
            child.close()
        self.out = collections.deque()  # per chunk out, in order: its slot, its size or its bytes
        self.sent_count = 0
        # The worker keeps a string table of its own (the names of the chunks it decoded,
        # in the order it met them): its ids here, set by each merge (_Builder.merge)
        self.id_map = np.empty(0, np.int32)

    def send(self, payload) -> None:
        size = len(payload)
        slot = self.sent_count % IN_FLIGHT_PER_WORKER  # its previous chunk's result is in: free
        if self.slots is not None and size <= self.SLOT_BYTES:
            self.slots[slot][0][:size] = payload
            self.conn.send((slot, size))
            self.out.append((slot, size))
        else:
            payload = bytes(payload)
            self.conn.send((slot, None))
            self.conn.send_bytes(payload)
            self.out.append((slot, payload))
        self.sent_count += 1

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

    def result(self, into: _Builder) -> _Builder:
        """The chunk's builder, to be merged into ``into`` (blocks until it is there);
        raises what decoding raised, or `_WorkerLost` when the worker is gone."""
        try:
            status, value = self.conn.recv()
            if status == "pipe":
                value = self.conn.recv_bytes()
        except (EOFError, OSError) as exc:
            raise _WorkerLost(str(exc)) from None
        if status == "error":
            self.out.popleft()
            raise value
        if status == "slot":
            value = memoryview(self.slots[self.out[0][0]][1])[:value]
        try:
            chunk = _unpack(value, into)
            if chunk._base != len(self.id_map):  # results come in the order sent: never
                raise RuntimeError(f"decode worker: {chunk._base} strings before its chunk, {len(self.id_map)} mapped")
            chunk._base_map = self.id_map
            return chunk
        finally:
            if status == "slot":
                value.release()
            self.out.popleft()

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
    from . import procguard

    if parent_end is not None:  # forked: this process's copy of the parent's end
        parent_end.close()
    procguard.die_with_parent(owner_pid)
    gc.disable()  # it only decodes: no reference cycles (see loader._collector_paused)
    # This worker's own string table and recorded-input ids, grown chunk by chunk: a chunk
    # hands over only the names this worker had not met (the loading process maps its ids,
    # _Worker.id_map), and nothing flows the other way.
    strings: dict = {}
    raw: dict = {b"": -1}
    try:
        while True:
            try:
                message = conn.recv()
                if message is None:
                    break
                slot, size = message
                payload = conn.recv_bytes() if size is None else slots[slot][0][:size]
            except (EOFError, OSError):
                break
            n_strings, n_raw = len(strings), len(raw)
            try:
                header, arrays, packed = _pack(_decode_chunk(payload, (strings, raw)))
                reply = None
            except Exception as exc:  # noqa: BLE001 - raised again in the loading process
                reply = ("error", exc)
                for s in _last(strings, len(strings) - n_strings):  # the table as the loading process knows it
                    del strings[s]
                for key in _last(raw, len(raw) - n_raw):
                    del raw[key]
            del payload
            try:
                if reply is not None:
                    conn.send(reply)
                elif slots is not None and packed <= len(slots[slot][1]):
                    conn.send(("slot", _write_packed(header, arrays, slots[slot][1])))
                else:
                    out = bytearray(packed)
                    _write_packed(header, arrays, out)
                    conn.send(("pipe", None))
                    conn.send_bytes(out)
                    del out
                del header, arrays
            except (EOFError, OSError):
                break
    finally:
        os._exit(0)  # a forked copy: nothing of the parent's to tear down


def _start_workers(n: int) -> list:
    """``n`` workers, or an exception and none (those started are ended)."""
    pool: list = []
    try:
        for _ in range(n):
            pool.append(_Worker())
    except BaseException:
        for worker in pool:
            worker.close()
        raise
    return pool


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
                native.decode_into(payload, self.builder)
            else:
                self.pending.append((None, _decode_detached(payload, self.builder)))
            return
        try:
            free.send(payload)
        except (OSError, EOFError):  # the worker is gone
            self._local_fallback()
            native.decode_into(payload, self.builder)
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
            result = worker.result(self.builder)
        except _WorkerLost:
            self._local_fallback()
            return
        self.pending.popleft()
        self.builder.merge(result)
        worker.id_map = result._base_map  # the worker's table after this chunk, in this one's ids

    def _local_fallback(self) -> None:
        pending, self.pending = self.pending, collections.deque()
        out = {id(w): w.chunks() for w in self.pool}
        chunks = [(worker, item if worker is None else out[id(worker)].pop(0)) for worker, item in pending]
        self.close()
        for worker, item in chunks:
            if worker is None:
                self.builder.merge(item)
            else:
                native.decode_into(item, self.builder)

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
