"""Worker processes die with their parent.

Every process the project starts (the service's analysis children, the loader's decode
workers) calls `die_with_parent` first thing. Two mechanisms, because neither is
enough alone:

- Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this process the moment
  its parent exits, SIGKILL of the parent included. (The signal is tied to the parent
  *thread* that forked; the project starts processes from a forkserver, from the loading
  thread (decode workers, which end with the load) or from the service's wait threads,
  which live as long as the Analyzer, so that never fires early.)
- Everywhere: a daemon thread polls ``os.getppid()`` (reparenting means the parent is
  gone) and, when given, whether the process that owns the work (``owner_pid``: with a
  forkserver the direct parent is the forkserver, not TensorBoard) still exists, and
  ends this process with ``os._exit`` within ``POLL_SECONDS``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Optional

POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1
_started = False


def _set_pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists (owned by another user)
        return True
    return True


def _watch(parent: int, owner_pid: Optional[int]) -> None:
    while True:
        time.sleep(POLL_SECONDS)
        if os.getppid() != parent or (owner_pid is not None and not _alive(owner_pid)):
            os._exit(1)  # no cleanup: the work is lost anyway and the parent is gone


def die_with_parent(owner_pid: Optional[int] = None) -> None:
    """Make this process exit when its parent (or ``owner_pid``) dies. Idempotent."""
    global _started
    if _started:
        return
    _started = True
    parent = os.getppid()
    _set_pdeathsig()
    if owner_pid is not None and not _alive(owner_pid):
        os._exit(1)  # the parent died before we got here (PDEATHSIG was set too late)
    threading.Thread(target=_watch, args=(parent, owner_pid), daemon=True, name=WATCH_THREAD_NAME).start()


WATCH_THREAD_NAME = "bottlenecks-parent-watch"


def only_watchers_running() -> bool:
    """True when the calling thread is the only one but for this module's watcher, which
    only sleeps and polls (holds no lock a forked process could inherit): a fork from here
    is as safe as from a single-threaded process (an analysis child's decode workers)."""
    me = threading.current_thread()
    return all(t is me or t.name == WATCH_THREAD_NAME for t in threading.enumerate())
