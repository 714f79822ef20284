"""Analysis tasks on an existing Dask cluster (``--dask`` / ``--bottlenecks_dask_scheduler``).

One task per span: ``_analyze_task(logdir, run, span)`` runs on a Dask worker, which reads
the trace itself through the same storage layer as here (a local path the worker can
see, or ``gs://...`` with the worker's own credentials) and returns only the span's
result (the report, memory curves and kernel table: KBs), which the engine caches
like a local one. Errors come back as the same outcome tuples as from an analysis child
(`children.ChildPool.analyze`): ("ok", result) | ("truncated" | "error" | "internal" |
"died", message). A worker that dies mid-task (out of memory, preempted) is the
scheduler's business: it reruns the task on another worker, up to its
``distributed.scheduler.allowed-failures`` (default 3); after that the span is
"died" and retried on a later scan.

Imported only when a Dask scheduler is configured: nothing here is imported by the
plugin's entry point, the CLI without ``--dask`` or the tab without it.
"""
from __future__ import annotations

import logging
import os
import traceback
from typing import Callable, Optional

log = logging.getLogger(__name__)

# How long to try to reach the scheduler before giving up (TB_BOTTLENECKS_DASK_TIMEOUT).
CONNECT_TIMEOUT_S = 10.0


def _connect_timeout() -> float:
    try:
        return float(os.environ.get("TB_BOTTLENECKS_DASK_TIMEOUT", CONNECT_TIMEOUT_S))
    except ValueError:
        return CONNECT_TIMEOUT_S


class DaskUnavailable(Exception):
    """The Dask scheduler cannot be used (not installed, unreachable): one line, for people."""


def _analyze_task(analyze_span: Optional[Callable], logdir: str, run, span, timeline: bool = False) -> tuple:
    """Runs on a Dask worker: one span analysed, its outcome tuple. ``timeline``: the
    result also carries the span's step-timeline store (report.analyze_span(timeline=True):
    numpy arrays, ~2 MB for a resnet50-sized span; the tab keeps it for the timeline
    routes)."""
    from .. import report
    from ..errors import BottleneckError, TruncatedTraceError

    try:
        if analyze_span is None:
            return "ok", report.analyze_span(logdir, run, span, timeline=timeline)
        return "ok", analyze_span(logdir, run, span)
    except TruncatedTraceError as exc:
        return "truncated", str(exc)
    except BottleneckError as exc:
        return "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the engine, which logs it
        return "internal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


class DaskBackend:
    """A `distributed.Client` connected to an existing scheduler."""

    def __init__(self, client, address: str, analyze_span: Optional[Callable] = None):
        self.client = client
        self.address = address
        self._analyze_span = analyze_span  # tests inject one; None: report.analyze_span

    @classmethod
    def connect(cls, address: str, *, timeout: Optional[float] = None,
                analyze_span: Optional[Callable] = None) -> "DaskBackend":
        try:
            from distributed import Client
        except ImportError as exc:
            raise DaskUnavailable(f"Dask scheduler {address}: dask[distributed] is not installed "
                                  f"(pip install 'tb_bottleneck_plugin[dask]'): {exc}") from None
        try:
            client = Client(address, timeout=timeout if timeout is not None else _connect_timeout(),
                            set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, CommClosedError, bad addresses
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DaskUnavailable(f"Dask scheduler {address} is unreachable ({reason[:300]})") from None
        return cls(client, address, analyze_span)

    def slots(self) -> int:
        """Worker threads in the cluster now (at least 1)."""
        try:
            return max(1, sum(self.client.nthreads().values()))
        except Exception:  # noqa: BLE001 - the scheduler went away: the next task will say so
            return 1

    def analyze(self, logdir: str, run, span, progress: Optional[Callable[[float], None]] = None, *,
                timeline: bool = True) -> tuple:
        """Analyse one span on the cluster (blocks this thread until done: engine.SpanRunner);
        ``timeline``: the result carries the span's timeline store too (the tab; the CLI not)."""
        try:
            future = self.client.submit(_analyze_task, self._analyze_span, logdir, run, span, timeline, pure=False)
            if progress is not None:
                progress(0.0)
            outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - KilledWorker, a lost scheduler, cancellation
            name = type(exc).__name__
            detail = str(exc).splitlines()[0][:300] if str(exc) else ""
            return "died", (f"{span.url}: the Dask analysis failed ({name}{': ' + detail if detail else ''}); "
                            "it is tried again on a later scan")
        if not (isinstance(outcome, tuple) and len(outcome) == 2):
            return "internal", f"unexpected answer from a Dask worker: {type(outcome).__name__}"
        return outcome

    def close(self) -> None:
        try:
            self.client.close(timeout=5)
        except Exception:  # noqa: BLE001 - closing a client whose scheduler is gone
            pass
