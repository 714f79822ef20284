"""Logdir -> runs -> workers -> spans (trace files), from ONE flat listing per scan.

Rules (torch-tb-profiler's, plus recognition by content):

- **Trace files.** ``*.pt.trace.json`` and ``*.pt.trace.json.gz`` are traces by name;
  worker and span come from tb_plugin's pattern ``^(.*?)(\\.\\d+)?\\.pt\\.trace\\.json(?:\\.gz)?$``:
  worker = group 1, span = the digits of group 2 (``timestamp`` = their int value; 13-digit
  ms and 19-digit ns names both occur). A name without digits (``worker0.pt.trace.json.gz``,
  Dec 2020) gives span name = the file name and ``timestamp=None``.
  Any other ``*.json`` / ``*.json.gz`` is a trace only if its first bytes look like a
  Kineto trace (`sniff_kineto`): worker = the file stem (``control`` for
  ``control.json.gz``), span name = the file name, ``timestamp=None``. Sniffing reads one
  ranged 4 KB head (64 KB for the rare file whose first 4 KB do not decide, such as
  TraceLens traces that prepend a 26 KB ``metadata`` object) and is cached by
  (file URL, fingerprint), so rescans do not reread unchanged files.
- **Skipped.** ``*.tmp`` (kineto writes ``<file>.tmp`` then renames), anything else that
  does not end in ``.json``/``.json.gz``, hidden files and anything inside hidden
  directories (name starting with ``.``, relative to the logdir), and *unnamed* files of
  size 0 (nothing to recognise). A ``*.pt.trace.json[.gz]`` of size 0 IS listed: its name
  says it is a trace, and the loader reports it as an empty/truncated file instead of it
  silently vanishing.
- **Runs.** Every directory (at any depth) holding a trace file is a run, named by its
  path relative to the logdir with ``/`` separators (``hta/trace_diff/control``). Traces
  directly in the logdir form the run named ``"."`` (`ROOT_RUN`): unlike the logdir's
  basename (torch-tb-profiler's choice) it can never collide with a sub-directory's
  name, and it is the same whether the logdir is local or ``gs://``. Runs are sorted by
  name, ``"."`` first.
- **Order.** Workers are sorted by name. Spans are sorted by time: numerically, with the
  unit taken from the digit count (19-digit ns and 13-digit ms names sort
  chronologically when mixed, and ``999`` comes before ``1000``); spans without a
  timestamp come first, by file name.
- **Symlinks** (local only): symlinked files are followed (size and fingerprint of the
  target). A symlinked directory is listed (with its own listing, loops guarded) only
  when its target stays inside the logdir, unless ``follow_symlinks=True`` (the
  ``--bottlenecks_follow_symlinks`` flag); a skipped one gives a note in
  ``Logdir.notes`` ("skipped symlink runs/link -> / (points outside the logdir)"), so a
  link to ``/`` never makes a scan walk the machine.

The plugin names runs/workers/spans in requests only through `resolve`, which accepts
only names of the discovered set, so no request can name a filesystem path.
"""
from __future__ import annotations

import logging
import os
import posixpath
import re
import stat as _stat
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import storage
from ..errors import StorageError

log = logging.getLogger(__name__)

ROOT_RUN = "."
TRACE_NAME_RE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")
SNIFF_BYTES = 4096  # the first ranged read of an unnamed .json[.gz]
SNIFF_MAX_BYTES = 65536  # a second, larger read only when the first does not decide
SNIFF_MAX_TEXT = 1 << 20  # decompressed bytes looked at, at most
SNIFF_CACHE_SIZE = 65536
_KINETO_KEYS = (b'"schemaVersion"', b'"traceEvents"', b'"deviceProperties"')
_TOKEN_RE = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:]')
_LOCAL_LINK_DEPTH = 8


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Span:
    """One trace file. ``name`` is the timestamp digits from the file name, or the file
    name when it has none. ``path`` is for the filesystem (``fs.open(path)``), ``url`` for
    people and caches (local: the absolute path; GCS: ``gs://bucket/key``), and
    ``storage.get_fs(url)`` gives back the filesystem. ``fingerprint`` changes whenever
    the file does (`storage.file_fingerprint`). ``timestamp`` is the int from the name as
    written (ms or ns since the epoch; for pattern-less names ``None``)."""

    name: str
    path: str
    url: str
    size: int
    fingerprint: str
    timestamp: Optional[int] = None

    @property
    def time_ns(self) -> Optional[int]:
        """``timestamp`` in ns since the epoch when its digit count says the unit
        (>= 17 digits: ns, 14-16: µs, 11-13: ms); else ``timestamp`` unchanged."""
        return _time_ns(self.timestamp)


@dataclass(frozen=True)
class Worker:
    name: str
    spans: List[Span]


@dataclass(frozen=True)
class Run:
    """``name`` is the path relative to the logdir (``"."`` for the logdir itself);
    ``path`` the directory's filesystem path."""

    name: str
    path: str
    workers: List[Worker]


@dataclass(frozen=True)
class Logdir:
    """``url``: the logdir as a URL or absolute local path; ``root``: its filesystem path;
    ``fs``: the fsspec filesystem it was scanned with (not compared)."""

    url: str
    runs: List[Run]
    root: str = ""
    fs: Any = field(default=None, compare=False, repr=False)
    notes: Tuple[str, ...] = field(default=(), compare=False)  # e.g. skipped symlinks

    def tree(self) -> Dict[str, Dict[str, List[str]]]:
        """``{run: {worker: [span names in order]}}``: the names only, for comparisons."""
        return {r.name: {w.name: [s.name for s in w.spans] for w in r.workers} for r in self.runs}

    def spans(self) -> List[Tuple[Run, Worker, Span]]:
        return [(r, w, s) for r in self.runs for w in r.workers for s in w.spans]


@dataclass(frozen=True)
class Selection:
    """What `resolve` found: ``run``; ``worker`` when one was named (or implied by a span
    name that only one worker has); ``span`` when one was named; ``items`` = every
    selected ``(Worker, Span)`` (all of the run's, or of the worker's, when not narrowed)."""

    run: Run
    worker: Optional[Worker]
    span: Optional[Span]
    items: List[Tuple[Worker, Span]]


# ---------------------------------------------------------------------------- names


def _time_ns(ts: Optional[int]) -> Optional[int]:
    if ts is None:
        return None
    digits = len(str(abs(ts)))
    if digits >= 17:
        return ts
    if digits >= 14:
        return ts * 1_000
    if digits >= 11:
        return ts * 1_000_000
    return ts


def _span_sort_key(span: Span):
    if span.timestamp is None:
        return (0, 0, 0, span.name)
    return (1, _time_ns(span.timestamp), span.timestamp, span.name)


def parse_trace_name(filename: str) -> Optional[Tuple[str, str, Optional[int]]]:
    """``(worker, span_name, timestamp)`` for a ``*.pt.trace.json[.gz]`` name, else None.

    >>> parse_trace_name("worker0.1623143089861.pt.trace.json.gz")
    ('worker0', '1623143089861', 1623143089861)
    >>> parse_trace_name("worker0.pt.trace.json.gz")
    ('worker0', 'worker0.pt.trace.json.gz', None)
    """
    m = TRACE_NAME_RE.match(filename)
    if m is None:
        return None
    worker, digits = m.group(1), m.group(2)
    if digits:
        return worker, digits[1:], int(digits[1:])
    return worker, filename, None


def json_stem(filename: str) -> Optional[str]:
    """``control`` for ``control.json.gz`` / ``control.json``; None for other names."""
    for suffix in (".json.gz", ".json"):
        if filename.endswith(suffix) and len(filename) > len(suffix):
            return filename[: -len(suffix)]
    return None


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/") if part)


# ---------------------------------------------------------------------------- sniffing


def classify_head(text: bytes, complete: bool) -> Optional[bool]:
    """Whether the start of a JSON document is a Kineto/Chrome trace.

    True: an object with a top-level ``"schemaVersion"``, ``"traceEvents"`` or
    ``"deviceProperties"`` key, or a bare array whose first element is an object with a
    ``"ph"`` key (2020 traces). False: anything else that ``text`` already decides
    (another first character, an object or first element that closes without those
    keys, a complete document). None: undecided, read more.
    """
    t = text.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not t:
        return None if not complete else False
    first = t[:1]
    if first == b"[":
        rest = t[1:].lstrip(b" \t\r\n")
        if not rest:
            return None if not complete else False
        if rest[:1] != b"{":
            return False
    elif first != b"{":
        return False
    is_array = first == b"["
    key_depth = 2 if is_array else 1
    stack: List[int] = []
    pending: Optional[bytes] = None  # a string token that may be a key
    for m in _TOKEN_RE.finditer(t):
        tok = m.group()
        c = tok[:1]
        if c == b'"':
            pending = tok if len(stack) == key_depth and stack[-1] == 0x7B else None
            continue
        if c == b":":
            if pending is not None:
                if is_array:
                    if pending == b'"ph"':
                        return True
                elif pending in _KINETO_KEYS:
                    return True
            pending = None
            continue
        pending = None
        if c in (b"{", b"["):
            stack.append(c[0])
        else:  # } or ]
            if not stack:
                return False
            stack.pop()
            if len(stack) < key_depth:  # the top object / the first element closed
                return False
    return None if not complete else False


def _decode_head(raw: bytes, complete: bool) -> Tuple[bytes, bool]:
    """(text, text_is_complete) from raw head bytes, gunzipping when they are gzip."""
    if raw[:2] != b"\x1f\x8b":
        return raw, complete
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = inflater.decompress(raw, SNIFF_MAX_TEXT)
    except zlib.error:
        return b"", True  # not valid gzip: not something we can recognise
    return text, complete and inflater.eof


def sniff_kineto(fs, path: str, size: Optional[int] = None, url: Optional[str] = None) -> bool:
    """Read the head of ``path`` (gunzip if gzip, whatever the name) and say whether it is
    a Kineto trace (`classify_head`). Raises StorageError when it cannot be read."""
    nbytes = SNIFF_BYTES
    while True:
        raw = storage.read_head(fs, path, nbytes, url=url)
        complete = len(raw) < nbytes or (size is not None and len(raw) >= size)
        text, text_complete = _decode_head(raw, complete)
        verdict = classify_head(text, text_complete)
        if verdict is not None:
            return verdict
        if complete or nbytes >= SNIFF_MAX_BYTES or len(text) >= SNIFF_MAX_TEXT:
            return False
        nbytes = SNIFF_MAX_BYTES


class _SniffCache:
    """(url, fingerprint) -> bool, bounded LRU, thread-safe."""

    def __init__(self, maxsize: int = SNIFF_CACHE_SIZE):
        self.maxsize = maxsize
        self._data: "OrderedDict[Tuple[str, str], bool]" = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0  # files actually sniffed (for tests and stats)

    def get(self, key) -> Optional[bool]:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key, value: bool) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.reads = 0


_SNIFF_CACHE = _SniffCache()


def clear_sniff_cache() -> None:
    _SNIFF_CACHE.clear()


def sniff_reads() -> int:
    """How many files were sniffed (read) since the last `clear_sniff_cache`."""
    return _SNIFF_CACHE.reads


def _is_kineto_cached(fs, path: str, url: str, size: int, fingerprint: str) -> bool:
    key = (url, fingerprint)
    cached = _SNIFF_CACHE.get(key)
    if cached is not None:
        return cached
    _SNIFF_CACHE.reads += 1
    try:
        verdict = sniff_kineto(fs, path, size=size, url=url)
    except StorageError as exc:  # unreadable now: skip it, retry on the next scan
        log.warning("bottlenecks: cannot inspect %s: %s", url, exc)
        return False
    _SNIFF_CACHE.put(key, verdict)
    return verdict


# ---------------------------------------------------------------------------- listing


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _local_listing(fs, root: str, url: str, follow_symlinks: bool = False,
                   notes: Optional[List[str]] = None) -> Dict[str, dict]:
    """The flat listing, with symlinks followed (fsspec lists them as type "other").
    Directory links are followed only when their target is inside the logdir (or
    ``follow_symlinks``); skipped ones are described in ``notes``."""
    out: Dict[str, dict] = {}
    real_root = os.path.realpath(root)
    seen = {real_root}
    todo = [(root, url, 0)]
    while todo:
        top, top_url, depth = todo.pop()
        for path, info in storage.list_files(fs, top, url=top_url).items():
            if not info.get("islink"):
                out[path] = info
                continue
            try:
                st = os.stat(path)  # follows the link
            except OSError:
                continue  # dangling
            if _stat.S_ISREG(st.st_mode):
                out[path] = {**info, "type": "file", "size": st.st_size, "mtime": st.st_mtime}
            elif _stat.S_ISDIR(st.st_mode) and depth < _LOCAL_LINK_DEPTH:
                real = os.path.realpath(path)
                if not follow_symlinks and not _inside(real, real_root):
                    if notes is not None:
                        rel = os.path.relpath(path, root).replace(os.sep, "/")
                        try:
                            target = os.readlink(path)
                        except OSError:
                            target = "?"
                        notes.append(f"skipped symlink {rel} -> {target} (points outside the logdir; "
                                     "--bottlenecks_follow_symlinks follows it)")
                    continue
                if real not in seen:
                    seen.add(real)
                    todo.append((path, path, depth + 1))
    return out


def _listing(fs, root: str, url: str, follow_symlinks: bool = False,
             notes: Optional[List[str]] = None) -> Dict[str, dict]:
    if storage.is_local(fs):
        if not fs.exists(root):
            raise StorageError(f"{url}: not found (no such directory)")
        if not fs.isdir(root):
            raise StorageError(f"{url}: not a directory")
        return _local_listing(fs, root, url, follow_symlinks, notes)
    return storage.list_files(fs, root, url=url)


def _build(fs, root: str, url: str, entries: Dict[str, dict], sniff: bool = True,
           notes: Tuple[str, ...] = ()) -> Logdir:
    root_clean = root.rstrip("/") or "/"
    prefix = root_clean if root_clean.endswith("/") else root_clean + "/"
    runs: Dict[str, Dict[str, List[Span]]] = {}
    run_paths: Dict[str, str] = {}
    for path in sorted(entries):
        info = entries[path]
        if info.get("type", "file") not in ("file", None):
            continue
        if path.endswith("/"):  # GCS "directory" placeholder objects
            continue
        rel = path[len(prefix):] if path.startswith(prefix) else posixpath.basename(path)
        if not rel or _hidden(rel):
            continue
        filename = posixpath.basename(rel)
        rel_dir = posixpath.dirname(rel)
        size = int(info.get("size") or 0)
        fingerprint = storage.file_fingerprint(info)
        file_url = storage.to_url(fs, path)
        parsed = parse_trace_name(filename)
        if parsed is not None:
            worker, span_name, timestamp = parsed
        else:
            stem = json_stem(filename)
            if stem is None or size == 0:
                continue
            if sniff and not _is_kineto_cached(fs, path, file_url, size, fingerprint):
                continue
            worker, span_name, timestamp = stem, filename, None
        run_name = rel_dir or ROOT_RUN
        run_paths[run_name] = posixpath.dirname(path)
        runs.setdefault(run_name, {}).setdefault(worker, []).append(
            Span(name=span_name, path=path, url=file_url, size=size, fingerprint=fingerprint,
                 timestamp=timestamp))
    run_list = []
    for run_name in sorted(runs, key=lambda n: (n != ROOT_RUN, n)):
        workers = [Worker(name=w, spans=sorted(spans, key=_span_sort_key))
                   for w, spans in sorted(runs[run_name].items())]
        run_list.append(Run(name=run_name, path=run_paths[run_name], workers=workers))
    return Logdir(url=url, runs=run_list, root=root_clean, fs=fs, notes=tuple(notes))


def files_matching(fs, directory: str, patterns) -> List[str]:
    """Paths of the files directly in ``directory`` whose names match one of the fnmatch
    ``patterns`` (e.g. analysis.memory.MEMORY_SNAPSHOT_PATTERNS: CUDA memory snapshots
    beside a run's traces), sorted; [] when the directory cannot be listed."""
    import fnmatch

    try:
        names = fs.ls(directory, detail=False)
    except Exception:  # noqa: BLE001 - an unlistable run directory has no snapshot, never an error
        return []
    return sorted(p for p in names if any(fnmatch.fnmatch(posixpath.basename(p), pat) for pat in patterns))


def scan_logdir(logdir: str, *, follow_symlinks: bool = False, **storage_options) -> Logdir:
    """Discover every run/worker/span under ``logdir`` (local path or URL such as
    ``gs://bucket/prefix``) with ONE flat listing (``fs.find(root, detail=True)``) plus
    cached ranged reads of unnamed ``.json[.gz]`` candidates.

    Raises StorageError (missing/forbidden/unreachable logdir or bucket) and
    MissingExtraError (``gs://`` without gcsfs). An empty or not-yet-existing GCS prefix
    is an empty Logdir (object stores have no directories to be missing); a missing local
    directory is a StorageError.
    """
    fs, root = storage.get_fs(logdir, **storage_options)
    url = storage.to_url(fs, root)
    notes: List[str] = []
    entries = _listing(fs, root, url, follow_symlinks, notes)
    return _build(fs, root, url, entries, notes=notes)


def discover_path(path: str, **storage_options) -> Logdir:
    """For the CLI: ``path`` may be one trace file, a run directory or a logdir (local or
    URL). A file gives a Logdir (url = its directory) with one run ``"."``, one worker and
    one span, whatever its content (the loader reports files that are not traces); worker
    and span names follow the same rules as in a scan. A directory is `scan_logdir`."""
    fs, root = storage.get_fs(path, **storage_options)
    url = storage.to_url(fs, root)
    if storage.is_local(fs):
        if not fs.exists(root):
            raise StorageError(f"{url}: not found (no such file or directory)")
        is_file = fs.isfile(root)
    else:
        # Object stores: a name is a file if an object has exactly that name.
        try:
            is_file = storage.info(fs, root, url=url).get("type") == "file"
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise StorageError(f"{url}: not found (no object or prefix of that name)") from None
            raise
    if not is_file:
        return scan_logdir(path, **storage_options)
    info = storage.info(fs, root, url=url)
    if storage.is_local(fs) and info.get("islink"):
        st = os.stat(root)
        info = {**info, "size": st.st_size, "mtime": st.st_mtime, "type": "file"}
    filename = posixpath.basename(root)
    parsed = parse_trace_name(filename)
    if parsed is not None:
        worker, span_name, timestamp = parsed
    else:
        stem = json_stem(filename) or (filename[:-3] if filename.endswith(".gz") else filename)
        worker, span_name, timestamp = stem, filename, None
    parent = posixpath.dirname(root)
    span = Span(name=span_name, path=root, url=url, size=int(info.get("size") or 0),
                fingerprint=storage.file_fingerprint(info), timestamp=timestamp)
    run = Run(name=ROOT_RUN, path=parent, workers=[Worker(name=worker, spans=[span])])
    return Logdir(url=storage.to_url(fs, parent), runs=[run], root=parent, fs=fs)


# ---------------------------------------------------------------------------- lookup


def outside_root(logdir_obj: Logdir, path: str) -> bool:
    """True when a local ``path`` found under the logdir really lies outside it (a symlinked
    trace file pointing elsewhere): front ends confined to a logdir (mcp_server.py) refuse it.
    Object stores have no links: never outside."""
    if logdir_obj.fs is None or not storage.is_local(logdir_obj.fs):
        return False
    return not _inside(os.path.realpath(path), os.path.realpath(logdir_obj.root))


def resolve(logdir_obj: Logdir, run: str, worker: Optional[str] = None,
            span: Optional[str] = None) -> Selection:
    """Look up request names in the discovered set only; KeyError for any unknown name.

    ``span`` without ``worker`` selects that span name in every worker that has it.
    """
    run_obj = next((r for r in logdir_obj.runs if r.name == run), None)
    if run_obj is None:
        raise KeyError(f"unknown run {run!r}")
    workers = run_obj.workers
    worker_obj = None
    if worker is not None:
        worker_obj = next((w for w in workers if w.name == worker), None)
        if worker_obj is None:
            raise KeyError(f"unknown worker {worker!r} in run {run!r}")
        workers = [worker_obj]
    items = [(w, s) for w in workers for s in w.spans if span is None or s.name == span]
    if span is not None and not items:
        raise KeyError(f"unknown span {span!r} in run {run!r}"
                       + (f", worker {worker!r}" if worker is not None else ""))
    span_obj = items[0][1] if span is not None and len(items) == 1 else None
    if worker_obj is None and span is not None and len(items) == 1:
        worker_obj = items[0][0]
    return Selection(run=run_obj, worker=worker_obj, span=span_obj, items=items)
