"""Analysis child processes: spans are analysed in fresh interpreters, off TensorBoard's
request threads (`ChildPool`), or in this process for tests (`outcome_in_thread`); the
daemon threads that wait on them (`WaitThreads`).

Outcomes of one analysis: ("ok", result) | ("truncated" | "error" | "internal" | "died", message).
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import signal
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Callable, List, Optional

from .. import report
from ..errors import BottleneckError, TruncatedTraceError
from ..trace import decode_workers, heap, procguard

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- analysis children
#
# Spans are analysed in child processes (at most ``max_workers`` at a time), so the decode
# and the analyses (CPU-bound Python that holds the GIL for seconds) never slow
# TensorBoard's request threads, a crash or an out-of-memory kill costs one span and not
# the server, and the memory of a large trace goes back to the system.
# A child is a fresh interpreter (`subprocess`, like multiprocessing's "spawn": no fork of
# the multithreaded TensorBoard) that imports only this package — multiprocessing's own
# spawn/forkserver would also re-import TensorBoard's __main__ in every child. Parent and
# child talk over a socketpair with multiprocessing's Connection framing: a span in,
# coarse progress and one outcome out (the JSON-able result, KBs to a few MB).
# Children are reused for the next span (an interpreter start costs ~0.5 s of CPU), except
# after a large file (its memory is given back by ending the process), and an idle child
# ends after IDLE_CHILD_SECONDS.

# Outcomes of one analysis: ("ok", result) | ("truncated" | "error" | "internal" | "died", message)
_PROGRESS_INTERVAL_S = 0.1
IDLE_CHILD_SECONDS = 60.0
RECYCLE_AFTER_BYTES = 64 << 20  # a child that analysed a file this large is not reused
# Analyses are background work: when the CPU is contended, TensorBoard's request threads
# go first (a lower priority only slows an analysis while something else needs the CPU).
# (TB_BOTTLENECKS_ANALYSIS_NICE overrides it; the CLI's children run at 0: they are the
# foreground work there.) On a heavily loaded machine niced children get a small share.
ANALYSIS_NICE = 10
DECODE_PROCESSES_ENV = "TB_BOTTLENECKS_DECODE_PROCESSES"
_CHILD_CODE = ("import sys; from tb_bottleneck_plugin.serving.children import _child_entry; "
               "_child_entry(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")


def default_nice() -> int:
    try:
        return int(os.environ.get("TB_BOTTLENECKS_ANALYSIS_NICE", ANALYSIS_NICE))
    except ValueError:
        return ANALYSIS_NICE
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the package
_live_children: "weakref.WeakSet" = weakref.WeakSet()  # every pool's processes, for atexit
_children_lock = threading.Lock()


def processes_supported() -> bool:
    return os.name == "posix"


def _child_entry(fd: int, owner_pid: int, nice: int = ANALYSIS_NICE) -> None:
    """Entry point of an analysis child: analyse spans one after another until the
    parent closes the connection; one outcome per span."""
    heap.one_arena()  # before the threads below and the loader's (trace/heap.py)
    procguard.die_with_parent(owner_pid)
    # The parent ends its children (ChildPool.close, at exit; procguard when it is gone):
    # a SIGINT that still reaches one (the child runs in its own session, see _Child; a
    # `kill -INT` to it) must not print a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("TB_BOTTLENECKS_CHILD_TRACEBACKS") == "0":
        # the CLI without --debug (cli.CHILD_TRACEBACKS_ENV): a failed section is one line
        # there, from the report; no traceback from logging's last resort here
        logging.getLogger("tb_bottleneck_plugin").addHandler(logging.NullHandler())
    from multiprocessing.connection import Connection

    try:
        if nice > 0:
            os.nice(nice)
    except (OSError, AttributeError):
        pass
    conn = Connection(fd)
    last = [0.0]

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if now - last[0] >= _PROGRESS_INTERVAL_S:
            last[0] = now
            conn.send(("progress", float(fraction)))

    try:
        while True:
            try:
                logdir, run, span, decode_processes = conn.recv()
            except (EOFError, OSError):
                return  # the parent is done with us (or gone)
            os.environ[DECODE_PROCESSES_ENV] = str(decode_processes)  # ChildPool.analyze decided
            try:
                outcome = ("ok", report.analyze_span(logdir, run, span, progress=progress, timeline=True))
            except TruncatedTraceError as exc:
                outcome = ("truncated", str(exc))
            except BottleneckError as exc:
                outcome = ("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which logs it
                outcome = ("internal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            try:
                conn.send(outcome)
            except (OSError, EOFError):
                return
            del outcome
    finally:
        conn.close()


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory, or stopped by someone)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


class _Child:
    """One analysis child process and our end of its connection."""

    def __init__(self, nice: int = ANALYSIS_NICE):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE, str(theirs.fileno()), str(os.getpid()), str(int(nice))],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process
                # group) reaches only the parent, which ends its children. Ignoring SIGINT in
                # the child alone left a window while its interpreter starts ("Fatal Python
                # error: init_import_site"); procguard still ends it with its parent.
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the child holds the only other end: EOF when it ends
        self.conn = Connection(ours.detach())
        self.idle_since = time.monotonic()
        with _children_lock:
            _live_children.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.kill()
        except OSError:
            pass

    def close(self, wait: float = 2.0) -> Optional[int]:
        """Close our end (the child then exits), reap it; its exit code."""
        import subprocess

        try:
            self.conn.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        with _children_lock:
            _live_children.discard(self)
        return self.process.returncode


def _kill_children() -> None:
    """Kill every live analysis child (interpreter exit)."""
    with _children_lock:
        children = list(_live_children)
    for child in children:
        child.kill()


atexit.register(_kill_children)


class WaitThreads:
    """Daemon threads that run the engine's jobs (engine.SpanRunner: each waits on an
    analysis child or a Dask future), kept for the runner's life and reused.

    Not a ThreadPoolExecutor: its threads are joined at interpreter exit
    (concurrent.futures' exit hook), so a TensorBoard told to stop (SIGTERM, Ctrl-C) waited
    for every analysis in flight to end: seconds per span, minutes on a large trace. Daemon
    threads never hold the exit; the children they wait on are killed by `Analyzer.stop`
    (at exit, `engine._stop_analyzers`). Not one thread per job either: a child's
    PR_SET_PDEATHSIG fires when the *thread* that started it ends (procguard), and children
    are reused across jobs."""

    def __init__(self, name: str):
        self._name = name
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable, *args, then: Optional[Callable] = None) -> None:
        """Run ``fn(*args)`` on an idle thread (a new one when none is idle); ``then()`` after
        it, once the thread counts as idle again: a job that starts the next one there (the
        engine's scheduler) hands it to this thread instead of starting one more."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the Analyzer was stopped")
            self._jobs.put((fn, args, then))
            if not self._idle.acquire(blocking=False):  # no idle thread: one more
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"{self._name}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, then = job
            job = None
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - _work handles its own; never lose the thread
                log.exception("bottlenecks: a background job failed")
            fn = args = None
            self._idle.release()
            if then is not None:
                try:
                    then()
                except Exception:  # noqa: BLE001 - never lose the thread
                    log.exception("bottlenecks: a background job failed")
                then = None

    def shutdown(self) -> None:
        """Drop the jobs not started; idle threads end (busy ones when their job ends)."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
            while True:
                try:
                    self._jobs.get_nowait()
                except queue.Empty:
                    break
            for _ in range(threads):
                self._jobs.put(None)

    def threads(self) -> List[threading.Thread]:
        with self._lock:
            return list(self._threads)



class ChildPool:
    """At most one busy child per calling thread; idle children are reused."""

    def __init__(self, max_idle: int = 2, nice: Optional[int] = None):
        self.max_idle = max(0, int(max_idle))
        self.nice = default_nice() if nice is None else int(nice)
        self._idle: List[_Child] = []
        self._busy: set = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # child processes started (tests, stats)

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive():
                    self._busy.add(child)
                    return child
                child.close(wait=0.1)
            if self._closed:
                raise RuntimeError("the analysis pool was stopped")
            self.started += 1
        child = _Child(self.nice) if self.nice != ANALYSIS_NICE else _Child()
        with self._lock:
            self._busy.add(child)
            if self._closed:
                child.kill()
        return child

    def _give_back(self, child: _Child, reuse: bool) -> None:
        with self._lock:
            self._busy.discard(child)
            if reuse and not self._closed and len(self._idle) < self.max_idle and child.alive():
                child.idle_since = time.monotonic()
                self._idle.append(child)
                return
        child.close()

    def reap_idle(self, older_than: float = IDLE_CHILD_SECONDS) -> None:
        now = time.monotonic()
        with self._lock:
            old = [c for c in self._idle if now - c.idle_since >= older_than]
            self._idle = [c for c in self._idle if c not in old]
        for child in old:
            child.close()

    def pids(self) -> List[int]:
        with self._lock:
            return [c.pid for c in list(self._idle) + list(self._busy)]

    def close(self, reap: float = 1.0) -> None:
        """Kill every child (busy ones too: their analyses are dropped) and reap them,
        waiting at most ``reap`` seconds in all (SIGKILL: the kernel frees them at once)."""
        with self._lock:
            self._closed = True
            children = list(self._idle) + list(self._busy)
            self._idle = []
        for child in children:
            child.kill()
        deadline = time.monotonic() + max(0.0, reap)
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired, or being reaped elsewhere: init will
                pass
            with _children_lock:
                _live_children.discard(child)

    def analyze(self, logdir: str, run, span,
                progress: Optional[Callable[[float], None]] = None) -> tuple:
        """Analyse one span in a child; the outcome tuple (see above). A child that dies
        without answering (killed, out of memory) gives ("died", why)."""
        try:
            child = self._take()
        except (OSError, ValueError, RuntimeError) as exc:
            return "internal", f"cannot start an analysis process: {type(exc).__name__}: {exc}"
        outcome = None
        # Children run up to one per core (scheduler.py) and the memory budget counts one
        # process per span: a child decodes with a worker process of its own only while no
        # other analysis of this pool runs, and then only as the loader would here (an idle
        # core); a number the user set (TB_BOTTLENECKS_DECODE_PROCESSES) holds for every span.
        with self._lock:
            alone = len(self._busy) == 1
        asked = os.environ.get(DECODE_PROCESSES_ENV, "").strip()
        decode_processes = decode_workers.default_count() if alone or asked else 0
        try:
            child.conn.send((logdir, run, span, decode_processes))
            while True:
                message = child.conn.recv()
                if message[0] == "progress":
                    if progress is not None:
                        progress(message[1])
                    continue
                outcome = message
                break
        except (EOFError, OSError):
            pass  # the child ended without an answer
        finally:
            reuse = outcome is not None and (span.size or 0) < RECYCLE_AFTER_BYTES
            self._give_back(child, reuse)
        if outcome is None:
            return "died", (f"{span.url}: the analysis process {_describe_exit(child.process.returncode)} "
                            "before it finished; it is tried again on a later scan")
        return outcome


def outcome_in_thread(analyze_span: Callable, logdir: str, run, span, progress, *,
                      traceback_in_outcome: bool = False) -> tuple:
    """The same outcomes as `ChildPool.analyze`, from a function called in this process. A
    bug is logged with its traceback, or with ``traceback_in_outcome`` (the CLI, which
    prints it only with --debug) carried after the outcome's first line, as a child does."""
    try:
        return "ok", analyze_span(logdir, run, span, progress=progress)
    except TruncatedTraceError as exc:
        return "truncated", str(exc)
    except BottleneckError as exc:
        return "error", str(exc)
    except Exception as exc:  # a bug in one analysis must not take the tab down
        if traceback_in_outcome:
            return "internal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        log.exception("bottlenecks: analysing %s failed", span.url)
        return "internal", f"{type(exc).__name__}: {exc}"
