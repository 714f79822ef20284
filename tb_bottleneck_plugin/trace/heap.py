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
_resolved = False


def _malloc_trim() -> Optional[Callable[[int], int]]:
    global _trim, _resolved
    with _lock:
        if not _resolved:
            _resolved = True
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = libc.malloc_trim
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
                _trim = fn
            except (OSError, AttributeError):  # not glibc (macOS, musl without it, Windows)
                _trim = None
    return _trim


def release_free_memory() -> None:
    """Return the C heap's free pages to the system (cost: ~1 ms per 100 MB freed)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
