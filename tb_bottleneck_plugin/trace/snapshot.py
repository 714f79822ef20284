"""CUDA memory snapshots (the pickles ``torch.cuda.memory._dump_snapshot`` writes), read so
that a corrupt or hostile one costs only its own n/a, never the trace beside it (issue 34).

`reduce_snapshot(src, reduce)` unpickles a snapshot and returns ``reduce(snapshot,
pickle_size)``, a small summary (analysis/memory.py's free-block fragmentation walk):

- Plain data only: a pickle that names a class is refused (it could run code).
- Bounded in size: at most MAX_SNAPSHOT_BYTES are read.
- Bounded in memory and time: the C unpickler trusts the lengths and memo indices it reads
  (one corrupt LONG_BINPUT index makes it allocate and zero up to 64 GiB of memo for a
  10-byte pickle), so the unpickling and ``reduce`` run in a forked child process with an
  address-space limit (this process's size + SNAPSHOT_MEMORY_ALLOWANCE + 16 bytes per
  pickle byte: a snapshot unpickles to about ten times its size) and a CPU-time limit,
  under a wall-clock deadline (`snapshot_seconds`); only ``reduce``'s result comes back.
  Where there is no fork (Windows) they run here, bounded by size alone.
- Every failure is `SnapshotError` (a ValueError) with the reason, or
  pickle.UnpicklingError for a pickle that names a class; OSError when reading fails.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Optional, Tuple

from . import storage

try:  # POSIX only
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

MAX_SNAPSHOT_BYTES = 1 << 30
SNAPSHOT_MEMORY_ALLOWANCE = 1 << 30
SNAPSHOT_BYTES_MEMORY_FACTOR = 16


def snapshot_seconds(size: int) -> float:
    """CPU (and, doubled, wall-clock) seconds a snapshot of ``size`` bytes may take: 30 s plus
    1 s per 4 MiB (a 28 MB snapshot unpickles in 0.6 s)."""
    return 30.0 + size / (4 << 20)


class SnapshotError(ValueError):
    """A CUDA memory snapshot that cannot be used (corrupt, absurd, too large, too slow):
    the metrics made from it are n/a with this reason, and the trace's report stands."""


class _SafeUnpickler(pickle.Unpickler):
    """Snapshots hold only dicts, lists, strings and numbers: refuse any class, so a
    pickle found in a log directory cannot run code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"memory snapshot refers to {module}.{name}; only plain data is accepted")


class _PickleBytes:
    """The pickle's bytes as a file that has only ``read`` and ``readline``: the C
    unpickler then reads a counted value (bytes, bytearray) by ``read``, within what is
    there, and never into a buffer it allocated from a corrupt length first."""

    def __init__(self, data: bytes):
        f = io.BytesIO(data)
        self.read, self.readline = f.read, f.readline


_hook_lock = threading.Lock()
_hook_users = 0
_hook_saved: Any = None


@contextlib.contextmanager
def _quiet_excepthook():
    """CPython (3.11) prints "SystemError: deallocated bytearray object has exported
    buffers" through ``sys.excepthook`` when a corrupt BYTEARRAY8 length cannot be
    allocated (the unpickler then raises MemoryError, which becomes a SnapshotError). The
    hook is silenced while snapshots unpickle here, and put back after the last one."""
    global _hook_users, _hook_saved
    with _hook_lock:
        if _hook_users == 0:
            _hook_saved = sys.excepthook
            sys.excepthook = _no_hook
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                sys.excepthook = _hook_saved
                _hook_saved = None


def _no_hook(*args) -> None:
    pass


def _unpickle(data: bytes) -> Any:
    return _SafeUnpickler(_PickleBytes(data)).load()


def snapshot_bytes(src: Any) -> bytes:
    """The pickle's bytes from bytes or a binary file object, at most MAX_SNAPSHOT_BYTES
    (SnapshotError beyond)."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    else:
        try:  # a file's size, when it tells it: a huge one is not read at all
            pos = src.tell()
            size = src.seek(0, 2) - pos
            src.seek(pos)
        except (AttributeError, OSError, ValueError, TypeError):
            size = None
        if size is not None and size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(f"larger than {MAX_SNAPSHOT_BYTES >> 20} MiB, not read")
        try:
            data = src.read(MAX_SNAPSHOT_BYTES + 1)
        except MemoryError:
            raise SnapshotError("not enough memory to read it") from None
        if not isinstance(data, bytes):
            raise SnapshotError("not a binary file")
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"larger than {MAX_SNAPSHOT_BYTES >> 20} MiB, not read")
    return data


def _outcome(exc: BaseException) -> Tuple[str, str]:
    """(kind, message) of what unpickling or reducing raised."""
    text = str(exc).strip()[:200]
    if isinstance(exc, SnapshotError):
        return "snapshot", text
    if isinstance(exc, pickle.UnpicklingError) and "only plain data" in text:
        return "class", text
    if isinstance(exc, MemoryError):
        text = "needs more memory than a snapshot of its size may use"
    return "snapshot", f"corrupt pickle ({type(exc).__name__}{': ' + text if text else ''})"


def _raise(kind: str, message: str):
    if kind == "class":
        raise pickle.UnpicklingError(message)
    raise SnapshotError(message)


def _reduce_here(data: bytes, reduce: Callable[[Any, Optional[int]], Any]) -> Any:
    try:
        with _quiet_excepthook():
            snap = _unpickle(data)
        return reduce(snap, len(data))
    except Exception as exc:  # noqa: BLE001 - a corrupt pickle raises anything (MemoryError: one huge length)
        kind, message = _outcome(exc)
    _raise(kind, message)


def _process_bytes() -> Optional[int]:
    """This process's address space in bytes (Linux /proc), None where unknown."""
    text = storage.local_text("/proc/self/statm", 256)
    try:
        return int(text.split()[0]) * os.sysconf("SC_PAGE_SIZE") if text else None
    except (ValueError, IndexError, OSError, AttributeError):
        return None


def _limit(which: int, value: int) -> None:
    """Lower the soft limit ``which`` to ``value`` (never above the hard limit)."""
    try:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        if soft == resource.RLIM_INFINITY or value < soft:
            resource.setrlimit(which, (value, hard))
    except (ValueError, OSError):
        pass


def _child(data: bytes, reduce, write_fd: int, memory: Optional[int], seconds: float) -> None:
    """In the forked child: limits, unpickle, reduce, write the pickled (kind, value); exit."""
    try:
        sys.excepthook = _no_hook  # one thread here: see _quiet_excepthook
        _limit(resource.RLIMIT_CPU, int(seconds) + 1)
        if memory is not None:
            _limit(resource.RLIMIT_AS, memory)
        try:
            reply: Tuple[str, Any] = ("ok", reduce(_unpickle(data), len(data)))
        except Exception as exc:  # noqa: BLE001 - sent to the parent as its reason
            reply = _outcome(exc)
        del data
        payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(0)


def _reduce_isolated(data: bytes, reduce) -> Any:
    seconds = snapshot_seconds(len(data))
    base = _process_bytes()
    memory = (base + SNAPSHOT_MEMORY_ALLOWANCE + SNAPSHOT_BYTES_MEMORY_FACTOR * len(data)
              if base is not None else None)
    read_fd, write_fd = os.pipe()
    try:
        with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads; the child runs no thread's code
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return _reduce_here(data, reduce)
    if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
        os.close(read_fd)
        _child(data, reduce, write_fd, memory, seconds)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + 2 * seconds
    timed_out = answered = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                answered = True
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if not answered:  # timed out, or this thread was interrupted: the child goes too
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        status = None
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:  # reaped by a SIGCHLD handler of the application
            pass
    if timed_out:
        raise SnapshotError(f"reading it took more than {2 * seconds:.0f} s; stopped")
    if not chunks:
        if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            raise SnapshotError(f"reading it took more than {seconds:.0f} s of CPU; stopped")
        raise SnapshotError("reading it failed (the reading process ended without an answer"
                            + (f", status {status}" if status is not None else "") + ")")
    try:
        kind, value = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - an answer cut short (the child was stopped while writing it)
        raise SnapshotError("reading it failed (the reading process's answer was cut short)") from None
    if kind == "ok":
        return value
    _raise(kind, value)


def reduce_snapshot(src: Any, reduce: Callable[[Any, Optional[int]], Any]) -> Any:
    """``reduce(snapshot, pickle_size)`` of the CUDA memory snapshot ``src`` (its pickle's
    bytes, a binary file object, or the already-unpickled data: then ``pickle_size`` is
    None and ``reduce`` runs here). ``reduce`` raises SnapshotError for a snapshot it cannot
    use; its result must be small plain data (it comes back through a pipe)."""
    if isinstance(src, (dict, list)):
        return reduce(src, None)
    data = snapshot_bytes(src)
    if hasattr(os, "fork") and resource is not None:
        return _reduce_isolated(data, reduce)
    return _reduce_here(data, reduce)  # pragma: no cover - Windows
