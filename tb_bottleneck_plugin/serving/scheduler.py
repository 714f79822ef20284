"""Which span is analysed next, and how many at once: the engine's scheduler.

Separate from the disk cache (`cache.py`) and from the view-model (`engine.Analyzer`);
`engine.SpanRunner` owns one for both of the engine's modes (the CLI's one-shot
`engine.analyze_all` too). Pure bookkeeping, no I/O, no threads of its own:

- **Slots**: at most ``slots`` analyses at a time (one child process each; by default
  the machine's cores, plus one slot kept for the other runs, see below).
- **Memory budget**: an analysis reserves its estimated peak (`estimate_peak_bytes`:
  ``PEAK_BASE_BYTES`` + the larger of the file's uncompressed size x ``PEAK_FACTOR`` and
  its estimated event count x ``PEAK_BYTES_PER_EVENT``); a span starts
  only while the reservations in flight plus its own fit in ``memory_budget`` (default:
  half the machine's memory, `default_memory_budget`; ``--bottlenecks_analysis_memory`` /
  ``TB_BOTTLENECKS_ANALYSIS_MEMORY``), except when nothing is in flight (a span larger
  than the whole budget still runs, alone).
- **The requested run first**: the run the tab asked for last (`want`) takes the next
  free slot; otherwise the run with the fewest analyses in flight, round-robin among
  equals. One run never holds more than ``per_run_limit`` slots (default ``slots - 1``),
  so a run of 1,000 ranks never keeps a new or small run waiting.

Not thread-safe: the owner calls it under its own lock.
"""
from __future__ import annotations

import os
import re
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ..errors import StorageError

# Peak memory of one analysis (its whole child process, with the step-timeline store) ~
# PEAK_BASE_BYTES + PEAK_FACTOR x the uncompressed JSON size: measured 0.38-0.49 x the JSON
# on top of ~96 MiB on the 292 MB and 2.2 GB scale traces, rounded so the estimate errs high
# (1.2-1.6x the measured peaks; benchmarks/README.md, "Bounded memory").
PEAK_FACTOR = 0.6
PEAK_BASE_BYTES = 96 << 20
# ... and at least this much per trace event: the decoded columns cost per event, not per
# byte, so a file of tiny events (45 bytes each) peaks at 5x its size (measured 209 bytes
# per event over the base on 10M tiny events, 126 on 400k, 207 on the 2.2 GB trace).
PEAK_BYTES_PER_EVENT = 320
# The event count is estimated from the density of events in the first HEAD_SAMPLE_BYTES
# of (decompressed) JSON; local files only (a remote file is not read at scheduling time).
HEAD_SAMPLE_BYTES = 1 << 20
# gzip ratio assumed when the uncompressed size cannot be read (a gzip trailer holds it
# modulo 4 GiB); Kineto JSON compresses 15-30x (../shared/traces/INDEX.md), 30 errs high.
ASSUMED_GZIP_RATIO = 30
MEMORY_ENV = "TB_BOTTLENECKS_ANALYSIS_MEMORY"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text) -> int:
    """``"4G"``, ``"512MiB"``, ``"1.5g"``, ``"1000000"`` -> bytes; ValueError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ValueError(f"not a size: {text!r} (examples: 8G, 512M, 1000000)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"a memory budget must be positive, not {text!r}")
    return value


def machine_memory() -> Optional[int]:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def default_memory_budget() -> int:
    """``TB_BOTTLENECKS_ANALYSIS_MEMORY`` if set, else half the machine's memory (4 GiB
    when it cannot be read)."""
    env = os.environ.get(MEMORY_ENV)
    if env:
        return parse_bytes(env)
    total = machine_memory()
    return total // 2 if total else 4 << 30


def default_slots() -> int:
    """Analyses at a time by default: one per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def uncompressed_size(span, read_tail: Optional[Callable[[Any, int], bytes]] = None) -> int:
    """The JSON size of a span's file: its size, or for ``.gz`` the gzip trailer's ISIZE
    (``read_tail(span, 4)``, by default read through storage for local files only) when plausible, else size x
    ``ASSUMED_GZIP_RATIO``."""
    size = int(getattr(span, "size", 0) or 0)
    if not str(getattr(span, "url", "")).endswith(".gz"):
        return size
    isize = None
    if size >= 18:  # a gzip member's header and trailer alone take 18 bytes
        try:
            if read_tail is not None:
                tail = read_tail(span, 4)
                isize = int.from_bytes(tail, "little") if len(tail) == 4 else None
            elif "://" not in str(span.url):
                isize = _local_isize(span)
        except (OSError, ValueError, StorageError):
            isize = None
    if isize is not None and isize >= size:  # ISIZE is modulo 4 GiB: smaller than the gzip is not the truth
        return isize
    return size * ASSUMED_GZIP_RATIO


def _local_isize(span) -> Optional[int]:
    """The gzip trailer's ISIZE of a local span, read through storage."""
    from ..trace import storage  # fsspec: not at import time (the TensorBoard entry point stays light)

    fs, path = storage.get_fs(span.path)
    return storage.gzip_uncompressed_size(fs, path, url=span.url)


def estimate_peak_bytes(span, read_tail=None, read_head=None) -> int:
    """Estimated peak memory of one span's analysis process (module docstring).
    ``read_head(span, n)``: the first ``n`` bytes of the span's JSON, decompressed (by
    default read for local files only)."""
    size = uncompressed_size(span, read_tail)
    events = estimated_events(span, size, read_head)
    return int(PEAK_BASE_BYTES + max(PEAK_FACTOR * size, PEAK_BYTES_PER_EVENT * (events or 0)))


def estimated_events(span, size: int, read_head=None) -> Optional[int]:
    """Trace events in a span's file of ``size`` JSON bytes, from the count of ``"ph"``
    keys in its first HEAD_SAMPLE_BYTES (every Chrome trace event has one); None when the
    head cannot be read or holds none."""
    try:
        if read_head is not None:
            head = read_head(span, HEAD_SAMPLE_BYTES)
        elif "://" not in str(getattr(span, "url", "")) and getattr(span, "path", None):
            head = _local_head(span, HEAD_SAMPLE_BYTES)
        else:
            return None
    except (OSError, ValueError, EOFError, StorageError):
        return None
    count = head.count(b'"ph"') if head else 0
    if not count:
        return None
    if len(head) >= size:
        return count
    return int(count * size / len(head))


def _local_head(span, nbytes: int) -> bytes:
    """The first ``nbytes`` of a local span's JSON (gunzipped for ``.gz``)."""
    import gzip

    from ..trace import storage  # fsspec: not at import time (the TensorBoard entry point stays light)

    fs, path = storage.get_fs(span.path)
    with storage.open_binary(fs, path, url=span.url) as raw:
        if str(span.url).endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as f:
                return f.read(nbytes)
        return raw.read(nbytes)


class Scheduler:
    """Queues of jobs per run; `next` gives the job to start now (or None)."""

    def __init__(self, slots: int, memory_budget: Optional[int] = None, per_run_limit: Optional[int] = None):
        self.slots = max(1, int(slots))
        self.memory_budget = memory_budget  # None: unbounded
        self.per_run_limit = max(1, int(per_run_limit if per_run_limit is not None else self.slots - 1))
        self._queues: Dict[str, Deque[Tuple[Any, int]]] = {}
        self._inflight: Dict[str, int] = {}
        self._rr: Deque[str] = deque()  # round-robin order of runs
        self.wanted: Optional[str] = None  # the run asked for last
        self.running = 0
        self.reserved = 0  # bytes reserved by the analyses in flight
        self.peak_running = 0  # most analyses at once (tests, stats)
        self.peak_reserved = 0

    # ------------------------------------------------------------------ queue
    def push(self, run: str, job: Any, cost: int = 0) -> None:
        self._queues.setdefault(run, deque()).append((job, max(0, int(cost))))
        if run not in self._rr:
            self._rr.append(run)

    def want(self, run: Optional[str]) -> None:
        self.wanted = run

    def clear(self) -> None:
        self._queues.clear()
        self._rr.clear()

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    # ------------------------------------------------------------------ decisions
    def _fits(self, cost: int) -> bool:
        if self.memory_budget is None or self.running == 0:
            return True  # nothing in flight: even a span larger than the budget runs (alone)
        return self.reserved + cost <= self.memory_budget

    def _startable(self, run: str) -> bool:
        queue = self._queues.get(run)
        return bool(queue) and self._inflight.get(run, 0) < self.per_run_limit and self._fits(queue[0][1])

    def next(self) -> Optional[Tuple[str, Any, int]]:
        """(run, job, cost) to start now, counted as in flight until `done`; or None."""
        if self.running >= self.slots:
            return None
        candidates = [r for r in self._rr if self._startable(r)]
        if not candidates:
            return None
        if self.wanted in candidates:
            run = self.wanted
        else:
            run = min(candidates, key=lambda r: self._inflight.get(r, 0))  # min: first in rr order
        self._rr.remove(run)
        queue = self._queues[run]
        job, cost = queue.popleft()
        if queue:
            self._rr.append(run)  # to the back: round-robin
        else:
            del self._queues[run]
        self._inflight[run] = self._inflight.get(run, 0) + 1
        self.running += 1
        self.reserved += cost
        self.peak_running = max(self.peak_running, self.running)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return run, job, cost

    def done(self, run: str, cost: int) -> None:
        left = self._inflight.get(run, 1) - 1
        if left > 0:
            self._inflight[run] = left
        else:
            self._inflight.pop(run, None)
        self.running = max(0, self.running - 1)
        self.reserved = max(0, self.reserved - cost)
