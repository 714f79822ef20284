"""Freed memory handed back to the operating system between the stages that free much
of it (glibc's ``malloc_trim``; a no-op where the C library has none).

Why: glibc serves numpy arrays below its mmap threshold from the heap, and that threshold
rises (up to 32 MiB) each time a larger mapped block is freed; once the loader has
dropped its per-chunk columns, or an analysis its temporaries, glibc keeps those heap
pages (it gives back only the top of the heap), while the next stage's large arrays are
mapped beside them: the process's peak is the sum. On a 10M-event trace the load left
~670 MiB of freed chunk columns resident beside 655 MiB of columns (benchmarks/README.md,
"Bounded memory").
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Callable, Optional

_lock = threading.Lock()
_trim: Optional[Callable[[int], int]] = None
_free_bytes: Optional[Callable[[], int]] = None
_resolved = False
# Trim only when the heap holds at least this much free memory: each trim hands pages back
# that the next stage faults in again (system time), which on the 292 MB benchmark cost ~7 %
# of the report's time for 13 MB of peak; on multi-GB or 10M-event traces the free heap is
# hundreds of MB after the load (benchmarks/README.md, "Bounded memory").
MIN_FREE_BYTES = 64 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _libc():
    """The C library (raises OSError where there is none to load)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _resolve() -> None:
    global _trim, _free_bytes, _resolved
    with _lock:
        if _resolved:
            return
        _resolved = True
        try:
            libc = _libc()
            fn = libc.malloc_trim
            fn.argtypes = [ctypes.c_size_t]
            fn.restype = ctypes.c_int
            _trim = fn
        except (OSError, AttributeError):  # not glibc (macOS, musl without it, Windows)
            _trim = None
            return
        try:  # glibc >= 2.33; without it every call trims
            info = libc.mallinfo2
            info.argtypes = []
            info.restype = _MallInfo2
            _free_bytes = lambda: int(info().fordblks)  # noqa: E731
        except AttributeError:
            _free_bytes = None


_M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_arena() -> bool:
    """Every thread of this process allocates from one malloc arena from now on (glibc's
    ``mallopt(M_ARENA_MAX, 1)``); False where the C library has no such setting.

    For the processes that analyse, first thing (the CLI, the tab's analysis children):
    glibc gives each new thread that allocates an arena of its own, whose freed pages the
    other threads never reuse. The loader's gunzip thread and the analyses' second lane
    (report._run_lanes) so raised the 292 MB benchmark's peak: its load 127-130 -> 121-122
    MiB, the report 181-183 -> 168-170 MiB with one arena (numpy's large arrays are mapped
    outside the arenas either way; Python's small objects are in its own pools)."""
    try:
        fn = _libc().mallopt
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn(_M_ARENA_MAX, 1) == 1


def release_free_memory() -> None:
    """Return the C heap's free pages to the system when it holds at least MIN_FREE_BYTES
    (cost: ~1 ms per 100 MB freed, plus the page faults of using them again)."""
    if not _resolved:
        _resolve()
    if _trim is None:
        return
    if _free_bytes is not None and _free_bytes() < MIN_FREE_BYTES:
        return
    _trim(0)
