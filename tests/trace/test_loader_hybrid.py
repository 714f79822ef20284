"""The opt-in parallel decode (TB_BOTTLENECKS_DECODE_PROCESSES): this process decodes the
chunks its worker is too busy for, and every chunk is merged in file order, so the
result is exactly the in-process one (same rows, same string ids, same recorded
inputs and warnings); a worker that dies mid-file means decoding here."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tb_bottleneck_plugin.trace import loader, decode_workers as loader_workers, text as loader_text

from conftest import TRACES  # noqa: E402

NAME = "hta/trace_diff/control/control.json.gz"


_DECODE_CHUNK = loader_workers._decode_chunk


def _slow_decode(payload, seed=None):
    """loader_workers._decode_chunk, 50 ms slower (runs in the forked worker too)."""
    time.sleep(0.05)
    return _DECODE_CHUNK(payload, seed)


def _same(a, b):
    assert a.strings == b.strings
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        for f in getattr(a, table).__dataclass_fields__:
            np.testing.assert_array_equal(getattr(getattr(a, table), f), getattr(getattr(b, table), f),
                                          err_msg=f"{table}.{f}")
    assert a.op_inputs.dims == b.op_inputs.dims and a.op_inputs.types == b.op_inputs.types
    assert a.meta.category_counts == b.meta.category_counts and a.meta.warnings == b.meta.warnings


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(loader_workers, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "0")
    return loader.load_trace(str(TRACES / NAME))


FRESH_ENV = "TB_BOTTLENECKS_TEST_FRESH_INTERPRETER"
FORK_PATH_TESTS = ("share_the_chunks", "through_the_slot_or_the_pipe", "worker_that_dies", "decode_error_in_the_worker")


@pytest.fixture
def forking():
    """The plain-fork path (shared slots; a patched _decode_chunk reaches the worker) is
    taken only when this process runs no other thread. Late in a full run, earlier tests
    have left threads behind and the worker comes from the fork server: these tests then
    run in a fresh interpreter instead (test_fork_path_in_a_fresh_interpreter)."""
    import threading

    if threading.active_count() > 1:
        pytest.skip("threads run in this test process: the fork path is tested in a fresh interpreter")


def test_fork_path_in_a_fresh_interpreter():
    import subprocess
    import sys
    import threading

    from conftest import REPO, patience

    if os.environ.get(FRESH_ENV) or threading.active_count() == 1:
        pytest.skip("this process takes the fork path itself: the tests ran here")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                          "-k", " or ".join(FORK_PATH_TESTS)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, FRESH_ENV: "1"}, timeout=patience(180))
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "5 passed" in out and "skipped" not in out, out[-3000:]


@pytest.fixture
def workers_started(monkeypatch):
    """The decode workers each load starts (to check they are gone after it)."""
    started = []
    original = loader_workers._Worker.__init__

    def init(self):
        original(self)
        started.append(self)

    monkeypatch.setattr(loader_workers._Worker, "__init__", init)
    return started


def _all_ended(workers):
    for w in workers:
        w.process.join(timeout=5)  # close() joined it already: returns at once
        assert w.process.exitcode is not None, "the decode workers end with the load"


def test_one_worker_and_this_process_share_the_chunks(forking, monkeypatch, small_chunks, workers_started):
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    kinds = []
    original = loader_workers._ChunkSink._merge_oldest

    def merge_oldest(self):
        kinds.append("here" if self.pending[0][0] is None else "worker")
        original(self)

    monkeypatch.setattr(loader_workers._ChunkSink, "_merge_oldest", merge_oldest)
    # a slow worker: this process must decode the chunks meanwhile, held back until
    # the worker's earlier chunk is merged
    monkeypatch.setattr(loader_workers, "_decode_chunk", _slow_decode)
    parallel = loader.load_trace(str(TRACES / NAME))
    assert "worker" in kinds and "here" in kinds, kinds
    _same(small_chunks, parallel)
    assert len(workers_started) == 1
    _all_ended(workers_started)


@pytest.mark.parametrize("slot_bytes", [8 << 20, 1 << 10])  # chunks in the shared slot / through the pipe
def test_worker_chunks_through_the_slot_or_the_pipe(forking, monkeypatch, small_chunks, workers_started, slot_bytes):
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    monkeypatch.setattr(loader_workers._Worker, "SLOT_BYTES", slot_bytes)
    monkeypatch.setattr(loader_workers, "_decode_chunk", _slow_decode)  # the worker is busy now and then
    sinks = []
    original = loader_workers._ChunkSink.close
    monkeypatch.setattr(loader_workers._ChunkSink, "close", lambda self: (sinks.append(self.sent), original(self)))
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))
    assert sinks and sinks[0] >= 2, "the worker decoded chunks"
    _all_ended(workers_started)


def test_with_threads_running_the_worker_comes_from_a_fork_server(monkeypatch, small_chunks, workers_started):
    """TensorBoard's server threads run: no fork of this process, no shared slots; the
    chunks go through the pipe."""
    import threading

    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        parallel = loader.load_trace(str(TRACES / NAME))
    finally:
        stop.set()
        thread.join()
    _same(small_chunks, parallel)
    assert len(workers_started) == 1 and workers_started[0].slots is None
    _all_ended(workers_started)


_TEST_PID = os.getpid()


def _dies(payload, seed=None):
    if os.getpid() != _TEST_PID:  # only in the worker: killed mid-file
        os._exit(3)
    return _DECODE_CHUNK(payload, seed)


def test_a_worker_that_dies_falls_back_to_this_process(forking, monkeypatch, small_chunks, workers_started):
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    monkeypatch.setattr(loader_workers, "_decode_chunk", _dies)
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))
    assert workers_started and workers_started[0].process.exitcode == 3


def _fails(payload, seed=None):
    import msgspec

    raise msgspec.DecodeError("broken chunk")


def test_a_decode_error_in_the_worker_is_the_loads(forking, monkeypatch, small_chunks, workers_started):
    """A chunk the worker cannot decode is a chunk that cannot be decoded: the whole-file
    path takes over, as in-process."""
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")
    monkeypatch.setattr(loader_workers, "_decode_chunk", _fails)
    whole = []
    original = loader._load_whole
    monkeypatch.setattr(loader, "_load_whole", lambda *a, **k: (whole.append(1), original(*a, **k))[1])
    path = str(TRACES / NAME)
    with open(path, "rb") as f:
        expected = original(f, path, True, None)
    _same(expected, loader.load_trace(path))
    assert whole == [1]
    _all_ended(workers_started)


def test_how_many_workers(monkeypatch):
    """The setting decides when set; else one worker only with a core to spare."""
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "3")
    assert loader_workers._decode_workers() == 3
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "0")
    assert loader_workers._decode_workers() == 0
    monkeypatch.delenv("TB_BOTTLENECKS_DECODE_PROCESSES")
    monkeypatch.setenv("TB_BOTTLENECKS_NATIVE_DECODE", "0")  # decoding with msgspec
    monkeypatch.setattr(loader_workers.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (0.9, 0.0, 0.0))
    assert loader_workers._decode_workers() == 1
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (1.6, 0.0, 0.0))  # both cores busy
    assert loader_workers._decode_workers() == 0
    monkeypatch.setattr(loader_workers.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert loader_workers._decode_workers() == 0


def test_how_many_workers_with_the_native_scanner(monkeypatch):
    """The native scanner leaves little for a worker: one only with three cores, two idle."""
    monkeypatch.delenv("TB_BOTTLENECKS_DECODE_PROCESSES", raising=False)
    monkeypatch.delenv("TB_BOTTLENECKS_NATIVE_DECODE", raising=False)
    monkeypatch.setattr(loader_workers.native, "available", lambda: True)
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(loader_workers.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert loader_workers._decode_workers() == 0
    monkeypatch.setattr(loader_workers.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert loader_workers._decode_workers() == 1
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    assert loader_workers._decode_workers() == 0
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")  # the setting still decides
    assert loader_workers._decode_workers() == 2


def test_a_daemonic_process_decodes_in_process(monkeypatch, small_chunks):
    """A Dask worker (a daemonic process) may not fork children: no workers by default,
    and a pool that cannot start (AssertionError there) means decoding in-process."""
    import multiprocessing

    monkeypatch.delenv("TB_BOTTLENECKS_DECODE_PROCESSES")
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    assert loader_workers._decode_workers() == 0
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "1")

    def no_children(n):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(loader_workers, "_start_workers", no_children)
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))


def _chunk(*events) -> bytes:
    """The JSON array text of hand-made events (cpu ops with recorded shapes, kernels)."""
    import json

    out = []
    for i, (cat, name, dims) in enumerate(events):
        args = {"External id": i}
        if dims is not None:
            args.update({"Input Dims": dims, "Input type": ["float"] * len(dims)})
        if cat == "kernel":
            args.update({"device": 0, "stream": 7, "correlation": i, "grid": [1, 2, 3], "block": [4, 5, 6],
                         "est. achieved occupancy %": 50, "dtype": "Float"})
        out.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 2, "ts": 10.0 * i, "dur": 5,
                    "args": args})
    return json.dumps(out).encode()


def test_seeded_chunk_builders_merge_to_the_sequential_result():
    """Chunk builders start from a copy of the main string table (loader_columns._Builder.seed).
    Merged in file order they give exactly the strings and ids of decoding every chunk
    here, both when nothing new came in meanwhile (no remap) and when an earlier chunk,
    merged after this one was seeded, brought the same new names (remap)."""
    from tb_bottleneck_plugin.trace.columns import _Builder
    from tb_bottleneck_plugin.trace.events import _decode_events

    first = _chunk(("cpu_op", "aten::mm", [[2, 3], [3, 4]]), ("kernel", "gemm_a", None))
    second = _chunk(("cpu_op", "aten::conv2d", [[1, 3, 8, 8]]), ("cpu_op", "aten::mm", [[2, 3], [3, 4]]),
                    ("kernel", "conv_k", None), ("kernel", "gemm_a", None))
    third = _chunk(("cpu_op", "aten::conv2d", [[1, 3, 8, 8]]), ("cpu_op", "aten::relu", [[5]]),
                   ("kernel", "relu_k", None))
    meta = lambda: loader.model.TraceMeta(source="x")  # noqa: E731

    sequential = _Builder("x")
    for text in (first, second, third):
        sequential.add(_decode_events(text, sequential))
    expected = sequential.finish(meta())

    main = _Builder("x")
    main.add(_decode_events(first, main))
    b2 = loader_workers._decode_chunk(second, main.seed())  # both seeded before either is merged
    b3 = loader_workers._decode_chunk(third, main.seed())
    final = {name: i for i, name in enumerate(expected.strings)}
    assert all(final[name] == i for name, i in b2.strings.items())  # b2's ids are already the final ones
    assert b3.strings["relu_k"] != final["relu_k"]  # b3's provisional ids are not
    main.merge(b2)  # nothing new in main since b2 was seeded: ids kept as they are
    main.merge(b3)  # b2's new names came first: b3's new names (relu_k, aten::relu, ...) remapped
    _same(expected, main.finish(meta()))


# ------------------------------------------------ every shared trace: in-process vs 2 workers
ALL_TRACES = sorted(p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _everything(trace) -> dict:
    """Every part of a loaded trace, by part, as bytes or text (compared exactly)."""
    import dataclasses

    out = {"strings": trace.strings, "kernel_launches": sorted(trace.kernel_launches.items()),
           "meta": repr(sorted(dataclasses.asdict(trace.meta).items()))}
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        t = getattr(trace, table)
        for f in dataclasses.fields(t):
            col = getattr(t, f.name)
            out[f"{table}.{f.name}"] = (col.dtype.str, col.shape, col.tobytes())
    for part in ("dims", "types", "peers"):
        out[f"op_inputs.{part}"] = sorted(getattr(trace.op_inputs, part).items())
    return out


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.relative_to(TRACES).as_posix())
def test_every_shared_trace_is_the_same_with_two_workers(monkeypatch, path):
    """Issue 39: chunks decoded by 2 worker processes and handed over as raw columns give
    exactly the in-process tables (every column's bytes, strings, recorded inputs, kernel
    launches, meta and warnings). Chunks (and text blocks) of a twelfth of the file, so that
    small files use the workers too (the first PARALLEL_MIN_CHUNKS are decoded here)."""
    import gzip

    raw = path.read_bytes()
    size = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
    chunk = max(4096, size // 12)
    monkeypatch.setattr(loader, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(loader, "PARALLEL_CHUNK_BYTES", chunk)
    monkeypatch.setattr(loader_text, "_OUT_BYTES", chunk)  # text blocks no larger (one cut per block)
    monkeypatch.setattr(loader_workers, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "0")
    local = _everything(loader.load_trace(str(path)))
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")
    sent = []
    close = loader_workers._ChunkSink.close
    monkeypatch.setattr(loader_workers._ChunkSink, "close", lambda self: (sent.append(self.sent), close(self))[1])
    parallel = _everything(loader.load_trace(str(path)))
    assert sum(sent) >= 1, "the workers decoded chunks"
    assert local.keys() == parallel.keys()
    for key in local:
        assert local[key] == parallel[key], key


# ------------------------------------------------ no processes: the same result in-process
def test_a_fork_that_fails_means_decoding_in_process(monkeypatch, small_chunks):
    """The OS refuses a process (fork: EAGAIN, a full process table): the load decodes
    here with the same result, and the worker that did start before the refusal is ended."""
    import errno
    import multiprocessing.process

    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")
    started = []
    original = multiprocessing.process.BaseProcess.start

    def start(self):
        if started:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        original(self)
        started.append(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    sinks = []
    close = loader_workers._ChunkSink.close
    monkeypatch.setattr(loader_workers._ChunkSink, "close", lambda self: (sinks.append(self.sent), close(self))[1])
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))
    assert sinks == [0], "no chunk went to a worker"
    assert len(started) == 1
    started[0].join(timeout=5)
    assert started[0].exitcode is not None, "the worker started before the refusal was ended"


def test_one_core_decodes_in_process(monkeypatch, small_chunks):
    """A 1-core machine starts no worker by default; the result is the same."""
    monkeypatch.delenv("TB_BOTTLENECKS_DECODE_PROCESSES")
    monkeypatch.setattr(loader_workers.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(loader_workers.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    started = []
    monkeypatch.setattr(loader_workers, "_start_workers", lambda n: started.append(n) or [])
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))
    assert started == []


def test_a_worker_killed_mid_load_falls_back_to_this_process(monkeypatch, small_chunks, workers_started):
    """One of two workers is killed (SIGKILL, as the OOM killer would) after its second
    chunk: the chunks still out are decoded here, the other worker is ended, and the
    tables are the in-process ones."""
    import signal

    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")
    # Workers forked with their shared slots even while other threads run (the full suite's
    # browser and server threads would select the fork server, whose pipe a stopped worker
    # would block): a send through a slot never waits for the worker.
    monkeypatch.setattr(loader_workers.procguard, "only_watchers_running", lambda: True)
    original = loader_workers._Worker.send
    killed = []

    def send(self, payload):
        target = self is workers_started[0] and self.sent_count == 1 and not killed
        if target:  # stopped first: with the native scanner it could finish the chunk before the kill
            assert self.slots is not None
            os.kill(self.process.pid, signal.SIGSTOP)
        original(self, payload)
        if target:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(timeout=5)
            killed.append(self.process.exitcode)

    monkeypatch.setattr(loader_workers._Worker, "send", send)
    fallbacks = []
    fallback = loader_workers._ChunkSink._local_fallback
    monkeypatch.setattr(loader_workers._ChunkSink, "_local_fallback",
                        lambda self: (fallbacks.append(len(self.pending)), fallback(self))[1])
    _same(small_chunks, loader.load_trace(str(TRACES / NAME)))
    assert killed == [-signal.SIGKILL]
    assert fallbacks and fallbacks[0] >= 1, "chunks the dead worker held were decoded here"
    assert len(workers_started) == 2
    _all_ended(workers_started)


def test_many_names_and_repaired_inputs_across_workers(tmp_path, monkeypatch):
    """Each worker keeps a string table of its own and hands over only the names it had not
    met; this process maps them (_Worker.id_map). Names new in every chunk, names repeated
    across chunks of different workers, and recorded inputs with invalid UTF-8 met in many
    chunks (one repair counted per distinct text, as in-process) give the in-process load."""
    import json

    events = []
    for i in range(3000):
        args = {"Input Dims": [[i % 7, 3]], "Input type": ["float"]}
        text = json.dumps({"ph": "X", "cat": "cpu_op", "name": f"aten::mm_{i % 300}" if i % 2 else f"fn_{i}",
                           "pid": 1, "tid": 1, "ts": 2.0 * i, "dur": 1, "args": args}).encode()
        if i % 5 == 0:  # the same broken text in many chunks
            text = text.replace(b'"float"', b'"fl\xffoat"')
        events.append(text)
    path = tmp_path / "names.pt.trace.json"
    path.write_bytes(b'{"traceEvents": [' + b", ".join(events) + b"]}")
    for module, name in ((loader, "CHUNK_BYTES"), (loader, "PARALLEL_CHUNK_BYTES"), (loader_text, "_OUT_BYTES")):
        monkeypatch.setattr(module, name, 8192)
    monkeypatch.setattr(loader_workers, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "0")
    local = loader.load_trace(str(path))
    assert any("invalid UTF-8" in w for w in local.meta.warnings)
    monkeypatch.setenv("TB_BOTTLENECKS_DECODE_PROCESSES", "2")
    sent = []
    close = loader_workers._ChunkSink.close
    monkeypatch.setattr(loader_workers._ChunkSink, "close", lambda self: (sent.append(self.sent), close(self))[1])
    # A chunk goes to a worker only while one is free; on a busy machine (the full suite beside
    # other work) this process decoded nearly every chunk itself. Slower decoding here (not in
    # the forked workers) leaves the workers free: the handover is what this test is about.
    here, detached = os.getpid(), loader_workers._decode_detached

    def slow_here(payload, builder):
        if os.getpid() == here:
            time.sleep(0.01)
        return detached(payload, builder)

    monkeypatch.setattr(loader_workers, "_decode_detached", slow_here)
    parallel = loader.load_trace(str(path))
    assert sum(sent) >= 10
    a, b = _everything(local), _everything(parallel)
    for key in a:
        assert a[key] == b[key], key
