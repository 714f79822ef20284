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
