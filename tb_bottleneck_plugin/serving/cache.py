"""The disk cache of analysed span results (one JSON file per span, bounded in size).

Separate from the scheduler (`scheduler.py`: which span is analysed next, and how many
at once) and from the view-model (`engine.Analyzer`: what the tab is shown). The
Analyzer keys an entry by the span's URL, its fingerprint (size + mtime, or the GCS
generation) and `current_version` (``ANALYSIS_VERSION``, a digest of the
package's source and the user-given peak/link settings); the CLI does not use the cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional

from .. import report

# The layout of a cached result: bump when results change shape (the code digest below
# invalidates them on any code change anyway; the history is in git log).
ANALYSIS_VERSION = f"{report.SCHEMA_VERSION}.13"

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 512 << 20  # ≈ 1,000 resnet50-sized span results (≈ 0.5 MB each)
CACHE_MAX_ENV = "TB_BOTTLENECKS_CACHE_MAX_MB"


def cache_max_bytes(flag_mb=None) -> int:
    """The disk cache's bound: ``--bottlenecks_cache_max_mb`` when given, else
    ``$TB_BOTTLENECKS_CACHE_MAX_MB``, else 512 MiB. Megabytes are MiB; a value that is not
    a positive number raises ValueError (the flag) or is ignored with a warning (the env)."""
    if flag_mb is not None:
        return _mb(flag_mb, "--bottlenecks_cache_max_mb")
    env = os.environ.get(CACHE_MAX_ENV)
    if env:
        try:
            return _mb(env, CACHE_MAX_ENV)
        except ValueError as exc:
            log.warning("%s; using the default %d MiB", exc, DEFAULT_CACHE_BYTES >> 20)
    return DEFAULT_CACHE_BYTES


def _mb(value, what: str) -> int:
    try:
        mb = float(value)
    except (TypeError, ValueError):
        mb = float("nan")
    if isinstance(value, bool) or not mb > 0 or mb == float("inf"):
        raise ValueError(f"{what} must be a positive number of MiB, not {value!r}")
    return max(1, int(mb * (1 << 20)))


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tb_bottleneck_plugin"


_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # tb_bottleneck_plugin/
_code_digest: Optional[str] = None


def code_digest() -> str:
    """A short digest of the package's Python source (every ``*.py`` under
    tb_bottleneck_plugin/, read once per process, ~2 ms). A cached result holds numbers,
    verdict words and advice made by the code that wrote it: with this digest in the
    entry's version, an upgrade or a local edit never serves them stale, even when nobody
    bumped ANALYSIS_VERSION (a forgotten bump once served old advice after a restart). The
    dashboard's static files are not part of it: they render what the routes send."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha1()
        for path in sorted(_PACKAGE_DIR.rglob("*.py")):
            h.update(path.relative_to(_PACKAGE_DIR).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        _code_digest = h.hexdigest()[:12]
    return _code_digest


# Environment variables the analysis reads (analysis/peaks.py ENV_PEAK, collectives.py
# ENV_LINK): a report made with another user-given peak or link holds other MFU, roofline
# and bandwidth numbers, so their values are part of a cache entry's version.
SETTINGS_ENV = ("BOTTLENECKS_PEAK_TFLOPS", "BOTTLENECKS_LINK_GBPS")


def analysis_settings() -> str:
    """The analysis settings given through the environment, as part of the version:
    ``""`` when none is set (entries written without them stay valid), else
    ``"+env:"`` and a digest of the names and values."""
    given = [(k, os.environ.get(k, "").strip()) for k in SETTINGS_ENV]
    given = [(k, v) for k, v in given if v]
    if not given:
        return ""
    return "+env:" + hashlib.sha1(repr(given).encode()).hexdigest()[:12]


def current_version() -> str:
    """The version a cache entry must carry to be used: ``ANALYSIS_VERSION`` (the
    report layout), the code digest and the settings from the environment
    (`analysis_settings`: a changed ``--bottlenecks_peak_tflops`` analyses again)."""
    return f"{ANALYSIS_VERSION}+{code_digest()}{analysis_settings()}"


def valid_result(value) -> bool:
    """Whether ``value`` has the shape of a span result: {"report": dict with this
    schema_version, "memory": dict, "kernels": list}."""
    return (isinstance(value, dict) and isinstance(value.get("report"), dict)
            and value["report"].get("schema_version") == report.SCHEMA_VERSION
            and isinstance(value.get("memory"), dict) and isinstance(value.get("kernels"), list))


class DiskCache:
    """Analysed span results as JSON files, bounded in total size (oldest evicted).

    An entry is ``{"version": <version>, "key": <its key>, "result": {...}}`` and is used
    only when it has exactly that shape (`valid_result`); anything else (an old layout,
    ``[]``, ``{}``, garbage bytes, a truncated or forged file) is deleted and the span
    analysed again. Writes go to ``<key>.json.tmp<pid>.<thread>`` and are renamed;
    temporary files left by a killed process are removed when the cache is opened.
    ``version`` defaults to `current_version` (ANALYSIS_VERSION + code digest) at construction.
    """

    STALE_TMP_SECONDS = 600.0  # a write takes milliseconds: an older .tmp was abandoned

    def __init__(self, directory, max_bytes: int = DEFAULT_CACHE_BYTES, version: Optional[str] = None):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.version = version if version is not None else current_version()
        self._lock = threading.Lock()
        self.discarded = 0  # invalid entries deleted (tests, stats)
        self._clean_stale_tmp()

    def key_for(self, url: str, fingerprint: str) -> str:
        return hashlib.sha256(f"{self.version}\0{url}\0{fingerprint}".encode()).hexdigest()

    def _clean_stale_tmp(self) -> None:
        now = time.time()
        try:
            candidates = list(self.directory.glob("*.json.tmp*"))
        except OSError:
            return
        for path in candidates:
            try:
                if now - path.stat().st_mtime >= self.STALE_TMP_SECONDS:
                    path.unlink()
            except OSError:
                continue

    def get(self, key: str) -> Optional[dict]:
        path = self.directory / f"{key}.json"
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            entry = None
        if not (isinstance(entry, dict) and entry.get("version") == self.version
                and entry.get("key") == key and valid_result(entry.get("result"))):
            log.warning("bottlenecks: discarding an invalid report cache entry %s", path)
            self.discarded += 1
            discard(path)
            return None
        mark_used(path)
        return entry["result"]

    def put(self, key: str, value: dict) -> None:
        tmp = self.directory / f"{key}.json.tmp{os.getpid()}.{threading.get_ident()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # pid + thread: two TensorBoards may share one cache directory
            entry = {"version": self.version, "key": key, "result": value}
            tmp.write_text(json.dumps(entry, allow_nan=True))
            os.replace(tmp, self.directory / f"{key}.json")
            self._prune(keep=key)
        except (OSError, TypeError, ValueError) as exc:  # a read-only or full disk must not break the tab
            log.warning("bottlenecks: cannot write the report cache in %s: %s", self.directory, exc)
            discard(tmp)

    def _prune(self, keep: Optional[str] = None) -> None:
        """Evict least recently used entries until the total fits in ``max_bytes``
        (the entry just written is kept even if it alone is larger)."""
        with self._lock:
            evict_oldest(self.directory, "*.json", self.max_bytes,
                         keep=self.directory / f"{keep}.json" if keep is not None else None)


# The bounded on-disk store's pieces, shared with timeline_store.TimelineStores: an entry
# that does not validate is discarded, one that is used is marked used (its mtime), and
# the least recently used go first when the files exceed their bound.

def discard(path: Path) -> None:
    """Removes a file; quietly when it is gone already or cannot be removed."""
    try:
        path.unlink()
    except OSError:
        pass


def mark_used(path: Path) -> None:
    """Sets a file's mtime to now: recently used, evicted last (`evict_oldest`)."""
    try:
        os.utime(path)
    except OSError:
        pass


def evict_oldest(directory: Path, pattern: str, max_bytes: int, keep: Optional[Path] = None) -> None:
    """Removes the files of ``directory`` matching ``pattern``, least recently modified
    first, until their total size fits in ``max_bytes``; ``keep`` (the entry just written)
    stays even if it alone is larger. A file removed meanwhile (another process pruned it)
    counts as removed; one that cannot be removed is passed over."""
    files = []
    try:
        paths = list(directory.glob(pattern))
    except OSError:
        return
    for path in paths:
        try:
            st = path.stat()
        except OSError:  # removed meanwhile
            continue
        files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        if path == keep:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            continue
        total -= size
