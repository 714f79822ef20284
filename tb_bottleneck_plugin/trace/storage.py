"""fsspec access to local paths and remote URLs (``gs://`` through gcsfs), one thin layer.

Local paths are served by `LocalFiles`, which answers the calls discovery and the loader
make (exists, isfile, isdir, info, ls, open) itself, exactly as fsspec's LocalFileSystem
does, and hands anything else to that class: a report of local files never imports
fsspec (with asyncio under it, ~50 ms of a 1.2 s report; issue 39).

Everything that touches a filesystem goes through here so that errors look the same
everywhere: a missing, forbidden or unreachable file or logdir becomes
`errors.StorageError` whose message starts with the URL; a protocol whose package is not
installed becomes `errors.MissingExtraError` with the pip command that fixes it.

gcsfs is never imported at module import time (TensorBoard imports the plugin on
start-up, and gcsfs pulls in aiohttp and google-auth).

Emulators: when ``STORAGE_EMULATOR_HOST`` is set, ``gs://`` URLs are served by
``gcsfs.core.GCSFileSystem(token="anon", endpoint_url=$STORAGE_EMULATOR_HOST)``. The core
class is used on purpose: the class gcsfs registers by default
(``ExtendedGcsFileSystem``, chosen at gcsfs import time unless
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``) first asks the bucket type over gRPC, which
an emulator never answers, and stalls 60 s per bucket operation.
"""
from __future__ import annotations

import datetime as _dt
import os
import posixpath
import stat as _stat
import sys
from contextlib import contextmanager
from typing import Any, BinaryIO, Dict, Iterator, Optional, Tuple

from ..errors import MissingExtraError, StorageError

GCS_PROTOCOLS = ("gs", "gcs")
GCS_EXTRA_HINT = 'pip install "tb_bottleneck_plugin[gcs]"'
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"

# The package that serves a protocol, for protocols whose fsspec class lives elsewhere.
_PROTOCOL_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs",
                      "hf": "huggingface_hub", "sftp": "paramiko", "http": "aiohttp", "https": "aiohttp"}


def protocol_of(url_or_path: str) -> str:
    """``"gs"`` for ``gs://b/x``, ``"file"`` for local paths (no ``scheme://``)."""
    s = str(url_or_path)
    if "://" in s:
        return s.split("://", 1)[0].lower()
    return "file"


def is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _missing_gcsfs(url: str, exc: BaseException) -> MissingExtraError:
    return MissingExtraError(
        f"{url}: reading gs:// needs the gcsfs package, which is not installed "
        f"({exc}). Install it with: {GCS_EXTRA_HINT}")


class LocalFiles:
    """The local filesystem, as fsspec's ``LocalFileSystem`` (POSIX) without importing
    fsspec: the few calls on a report's path are answered here with the same results
    (tests/trace/test_storage_local.py compares them); every other attribute is fsspec's
    own, imported on first use. Paths are absolute posix paths (what `get_fs` returns)."""

    protocol = ("file", "local")
    root_marker = "/"

    def __init__(self):
        self._fsspec = None

    def __getattr__(self, name):
        if name.startswith("_"):  # (pickling, copy: this class's own state only)
            raise AttributeError(name)
        return getattr(self._fsspec_fs(), name)

    def _fsspec_fs(self):
        if self._fsspec is None:
            from fsspec.implementations.local import LocalFileSystem

            self._fsspec = LocalFileSystem()
        return self._fsspec

    def __eq__(self, other):
        return isinstance(other, LocalFiles)

    def __hash__(self):
        return hash(LocalFiles)

    def __reduce__(self):
        return LocalFiles, ()

    @staticmethod
    def _strip_protocol(path) -> str:
        path = os.fspath(path)
        for prefix in ("file://", "file:", "local://", "local:"):
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        return _posix_absolute(path).rstrip("/") or "/"

    def info(self, path, **kwargs) -> dict:
        path = self._strip_protocol(path)
        out = os.stat(path, follow_symlinks=False)
        link = _stat.S_ISLNK(out.st_mode)
        if link:
            out = os.stat(path, follow_symlinks=True)
        if _stat.S_ISDIR(out.st_mode):
            kind = "directory"
        elif _stat.S_ISREG(out.st_mode):
            kind = "file"
        else:
            kind = "other"
        result = {"name": path, "size": out.st_size, "type": kind,
                  "created": getattr(out, "st_birthtime", out.st_ctime), "islink": link}
        for field in ("mode", "uid", "gid", "mtime", "ino", "nlink"):
            result[field] = getattr(out, f"st_{field}")
        if link:
            result["destination"] = os.readlink(path)
        return result

    def exists(self, path, **kwargs) -> bool:
        try:
            self.info(path)
            return True
        except Exception:  # noqa: BLE001 - as fsspec: any failure to stat is "not there"
            return False

    def isfile(self, path) -> bool:
        return os.path.isfile(self._strip_protocol(path))

    def isdir(self, path) -> bool:
        return os.path.isdir(self._strip_protocol(path))

    def ls(self, path, detail=False, **kwargs):
        if detail:
            return self._fsspec_fs().ls(path, detail=True, **kwargs)
        path = self._strip_protocol(path)
        if self.info(path)["type"] != "directory":
            return [path]
        with os.scandir(path) as entries:
            return [self._strip_protocol(e.path) for e in entries]

    def open(self, path, mode="rb", **kwargs):
        if mode != "rb" or kwargs:
            return self._fsspec_fs().open(path, mode, **kwargs)
        return open(self._strip_protocol(path), "rb")


def _posix_absolute(path: str) -> str:
    """fsspec's make_path_posix on POSIX: absolute, "~" expanded, no other normalisation."""
    if path.startswith("/"):
        return path
    if path.startswith("~"):
        return os.path.expanduser(path)
    if path.startswith("./"):
        path = path[2:]
    elif path == ".":
        path = ""
    return f"{os.getcwd()}/{path}"


def get_fs(url_or_path: str, **storage_options) -> Tuple[Any, str]:
    """``(fs, root_path)`` for a local path or an fsspec URL.

    ``root_path`` is what the filesystem's methods take (an absolute posix path for local
    files, ``bucket/prefix`` without a trailing slash for GCS). fsspec caches filesystem
    instances, so calling this once per file is cheap.

    Raises MissingExtraError for ``gs://`` without gcsfs (and for other protocols whose
    package is missing), StorageError for a malformed URL.
    """
    url = str(url_or_path)
    protocol = protocol_of(url)
    if protocol in GCS_PROTOCOLS:
        try:
            import gcsfs.core  # noqa: F401  (lazy: only for gs:// URLs)
        except ImportError as exc:
            raise _missing_gcsfs(url, exc) from None
        emulator = os.environ.get(EMULATOR_ENV, "")
        if emulator and emulator != "default":
            if "://" not in emulator:
                emulator = "http://" + emulator
            options = {"token": "anon", "endpoint_url": emulator, **storage_options}
            try:
                fs = gcsfs.core.GCSFileSystem(**options)
                return fs, fs._strip_protocol(url).rstrip("/")
            except (ValueError, OSError) as exc:
                raise StorageError(f"{url}: cannot open the GCS emulator at {emulator} ({exc})") from None
    if protocol == "file" and "::" not in url and not storage_options and os.sep == "/":
        return LocalFiles(), os.path.abspath(LocalFiles._strip_protocol(url))  # fsspec keeps ".." segments
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as exc:
        if protocol in GCS_PROTOCOLS:
            raise _missing_gcsfs(url, exc) from None
        package = _PROTOCOL_PACKAGES.get(protocol, f"the fsspec implementation for {protocol}://")
        raise MissingExtraError(f"{url}: reading {protocol}:// needs {package}, which is not installed "
                                f"({exc}). Install it with: pip install {package}") from None
    except ValueError as exc:  # unknown protocol, malformed URL
        raise StorageError(f"{url}: not a usable path or URL ({exc})") from None
    if is_local(fs):
        root = os.path.abspath(root)  # fsspec keeps ".." segments
    else:
        root = root.rstrip("/")
    return fs, root


def to_url(fs, path: str) -> str:
    """The user-facing name of ``path`` on ``fs``: the path itself for local files,
    ``gs://bucket/key`` for GCS (what `get_fs` accepts back)."""
    if is_local(fs):
        return path
    return fs.unstrip_protocol(path)


# ---------------------------------------------------------------------------- errors


# (module, exception class) pairs that also mean "storage problem"; looked up only in
# modules already imported, so checking them never imports gcsfs or its stack.
_OPTIONAL_STORAGE_ERRORS = (
    ("gcsfs.retry", "HttpError"),
    ("aiohttp", "ClientError"),
    ("google.auth.exceptions", "GoogleAuthError"),
    ("requests", "RequestException"),
    ("fsspec.exceptions", "FSTimeoutError"),
)


def _storage_exception_types() -> tuple:
    """Exception classes that mean "storage problem", without importing anything new."""
    types = [OSError, TimeoutError, ValueError]
    for module_name, class_name in _OPTIONAL_STORAGE_ERRORS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None:
            types.append(cls)
    return tuple(types)


def describe_error(exc: BaseException) -> str:
    """A short human description of a storage exception (no URL)."""
    code = getattr(exc, "code", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return "not found (no such file, directory, bucket or prefix)"
    if isinstance(exc, PermissionError) or code in (401, 403) or text.startswith("Forbidden"):
        return f"permission denied ({text})"
    if type(exc).__name__ == "HttpError":
        return f"storage request failed (HTTP {code}: {text})"
    if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
        return f"timed out ({text})"
    module = type(exc).__module__ or ""
    if module.startswith(("aiohttp", "requests")) or isinstance(exc, ConnectionError):
        return f"network error ({type(exc).__name__}: {text})"
    if module.startswith("google.auth"):
        return f"authentication failed ({text})"
    return f"{type(exc).__name__}: {text}"


@contextmanager
def wrap_errors(url: str, action: str = "") -> Iterator[None]:
    """Turn storage exceptions raised inside the block into StorageError naming ``url``."""
    try:
        yield
    except StorageError:
        raise
    except _storage_exception_types() as exc:
        what = f"cannot {action}: " if action else ""
        raise StorageError(f"{url}: {what}{describe_error(exc)}") from exc


# ---------------------------------------------------------------------------- operations


def list_files(fs, root: str, url: Optional[str] = None) -> Dict[str, dict]:
    """``{path: info}`` for every file under ``root``: ONE flat ``fs.find(root, detail=True)``
    (on GCS a single paged object listing, not one request per directory)."""
    url = url or to_url(fs, root)
    with wrap_errors(url, "list"):
        found = fs.find(root, detail=True)
    return {path: info for path, info in found.items() if info.get("type", "file") != "directory"}


def info(fs, path: str, url: Optional[str] = None) -> dict:
    """``fs.info(path)`` with errors wrapped."""
    url = url or to_url(fs, path)
    with wrap_errors(url, "read"):
        return fs.info(path)


def is_missing(fs, path: str) -> Optional[bool]:
    """Whether the file ``path`` is gone now (its directory's cached listing dropped first):
    True when storage answers "not found", False when it is there, None when storage
    cannot tell (another error)."""
    forget_listing(fs, path)
    try:
        fs.info(path)
        return False
    except FileNotFoundError:
        return True
    except _storage_exception_types():
        return None


def not_regular(fs, path: str) -> Optional[str]:
    """What the local ``path`` is when it exists but is not a regular file (links followed):
    "a FIFO", "a directory", ...; None for a regular file, a missing one (opening it says
    so) and any path of an object store (they hold only files). Checked before opening: a
    FIFO would block the reader forever."""
    if fs is not None and not is_local(fs):
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if _stat.S_ISREG(mode):
        return None
    for test, what in ((_stat.S_ISDIR, "a directory"), (_stat.S_ISFIFO, "a FIFO"),
                       (_stat.S_ISSOCK, "a socket"), (_stat.S_ISCHR, "a character device"),
                       (_stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def open_binary(fs, path: str, url: Optional[str] = None, **kwargs) -> BinaryIO:
    """A readable binary stream of the raw bytes (no decompression: the loader gunzips).

    Opening errors become StorageError naming the file (a local path that is not a regular
    file too: `not_regular`); read errors later on surface as the filesystem raises them
    (the caller wraps its reads with `wrap_errors`).
    """
    url = url or to_url(fs, path)
    forget_listing(fs, path)
    what = not_regular(fs, path)
    if what is not None:
        raise StorageError(f"{url}: cannot open: not a regular file ({what})")
    with wrap_errors(url, "open"):
        return fs.open(path, "rb", **kwargs)


def forget_listing(fs, path: str) -> None:
    """Drop the filesystem's cached listing of ``path``'s directory before opening it.

    gcsfs answers ``open``/``info`` from its directory cache when it holds the parent:
    a long-lived analysis process that listed a run directory for an earlier span (the
    memory-snapshot lookup does) would otherwise report a trace uploaded since then as
    "file not found". A dict pop; local filesystems keep no such cache."""
    if is_local(fs):
        return
    try:
        fs.invalidate_cache(posixpath.dirname(path.rstrip("/")))
    except Exception:  # noqa: BLE001 - a cache we cannot drop only means a possibly stale listing
        pass


def read_head(fs, path: str, nbytes: int, url: Optional[str] = None) -> bytes:
    """The first ``nbytes`` raw bytes of a file: one ranged read (on GCS a single
    ``Range`` request, not a 5 MB read-ahead block)."""
    url = url or to_url(fs, path)
    with wrap_errors(url, "read"):
        return fs.cat_file(path, start=0, end=nbytes)


def read_tail(fs, path: str, nbytes: int, url: Optional[str] = None) -> bytes:
    """The last ``nbytes`` raw bytes of a file (one ranged read)."""
    url = url or to_url(fs, path)
    with wrap_errors(url, "read"):
        return fs.cat_file(path, start=-nbytes)


def gzip_uncompressed_size(fs, path: str, url: Optional[str] = None) -> Optional[int]:
    """A gzip file's ISIZE trailer (the uncompressed size modulo 4 GiB, RFC 1952), or None
    when the file is too short to carry one. Raises StorageError when it cannot be read."""
    tail = read_tail(fs, path, 4, url)
    return int.from_bytes(tail, "little") if len(tail) == 4 else None


def _stamp(value: Any) -> Optional[str]:
    if value is None or value == "":
        return None
    if isinstance(value, _dt.datetime):
        return repr(value.timestamp())
    if isinstance(value, float):
        return repr(value)
    return str(value)


def file_fingerprint(info: dict) -> str:
    """A stable cache key for one version of a file, from its ``info()``/``find`` entry.

    ``size`` plus the most precise version marker the filesystem offers: GCS
    ``generation`` (changes on every overwrite), else ``mtime`` (local: float seconds),
    ``updated``/``LastModified`` (object stores), ``ETag``/``md5Hash``, ``created``.
    Examples: ``"1771264:g1795280707880880"`` (GCS), ``"555408:m1795274786.66"`` (local).
    """
    size = info.get("size")
    for key, tag in (("generation", "g"), ("mtime", "m"), ("updated", "u"), ("LastModified", "u"),
                     ("last_modified", "u"), ("ETag", "e"), ("etag", "e"), ("md5Hash", "e"),
                     ("created", "c")):
        stamp = _stamp(info.get(key))
        if stamp is not None:
            return f"{size}:{tag}{stamp}"
    return f"{size}:"


# ---------------------------------------------------------------------------- local files named in a trace


def local_text(path: str, max_bytes: int) -> Optional[str]:
    """The text (UTF-8, bad bytes replaced) of a regular local file of at most
    ``max_bytes``; None when it is missing, unreadable, not a regular file or larger.
    Never raises: for files a trace names (Inductor's generated code, trace/inductor.py),
    which are there only when this machine recorded the trace."""
    try:
        if not os.path.isfile(path):  # before opening: a FIFO would block
            return None
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except (OSError, ValueError):
        return None
    if len(data) > max_bytes:
        return None
    return data.decode("utf-8", "replace")


def local_subfolder_files(root: str, max_files: int) -> list:
    """Sorted paths of the regular files one folder below the local folder ``root``
    (``root/<sub>/<file>``, Inductor's cache layout), at most ``max_files``; [] when
    ``root`` cannot be listed. Never raises."""
    out: list = []
    try:
        subs = sorted(e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except OSError:
        return out
    for sub in subs:
        try:
            names = sorted(e.path for e in os.scandir(sub) if e.is_file(follow_symlinks=False))
        except OSError:
            continue
        out += names[:max_files - len(out)]
        if len(out) >= max_files:
            break
    return out
