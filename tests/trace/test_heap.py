"""trace/heap.py: the heap is trimmed only when it holds enough free memory (a trim's pages are
faulted in again by the next stage), and the real glibc calls resolve and run on this machine."""
from __future__ import annotations

from tb_bottleneck_plugin.trace import heap


def test_trims_only_above_the_free_threshold(monkeypatch):
    calls = []
    free = {"bytes": heap.MIN_FREE_BYTES - 1}
    monkeypatch.setattr(heap, "_resolved", True)
    monkeypatch.setattr(heap, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(heap, "_free_bytes", lambda: free["bytes"])
    heap.release_free_memory()
    assert calls == []
    free["bytes"] = heap.MIN_FREE_BYTES
    heap.release_free_memory()
    assert calls == [0]
    # without mallinfo2 (glibc < 2.33) every call trims; without malloc_trim none does
    monkeypatch.setattr(heap, "_free_bytes", None)
    heap.release_free_memory()
    assert calls == [0, 0]
    monkeypatch.setattr(heap, "_trim", None)
    heap.release_free_memory()
    assert calls == [0, 0]


def test_the_real_calls_run():
    heap.release_free_memory()  # resolves glibc's functions (or finds none) and never raises
    if heap._free_bytes is not None:
        assert heap._free_bytes() >= 0


_ARENAS = r'''
import ctypes, os, sys, tempfile, threading
from tb_bottleneck_plugin.trace import heap
import numpy  # (as in the CLI: its threads, if any, exist before ours)
if sys.argv[1] == "one":
    assert heap.one_arena()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
kept = []
def allocate():  # as the gunzip thread or an analysis lane: blocks below the mmap threshold
    kept.extend(libc.malloc(4096) for _ in range(1000))
for _ in range(2):
    t = threading.Thread(target=allocate)
    t.start(); t.join()
allocate()
fd, path = tempfile.mkstemp()
libc.fdopen.restype = ctypes.c_void_p
f = libc.fdopen(fd, b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(open(path).read().count("<heap nr="))
os.unlink(path)
'''


def test_one_arena_keeps_the_threads_in_one_malloc_arena():
    import subprocess
    import sys

    if not heap.one_arena():  # (this process too: harmless, the pytest process analyses as well)
        import pytest

        pytest.skip("no glibc mallopt here")

    def arenas(mode):
        done = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip())

    assert arenas("default") >= 2  # glibc: a thread that allocates gets an arena of its own
    assert arenas("one") == 1
