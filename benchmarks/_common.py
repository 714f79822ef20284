"""Small pieces the benchmarks share: a free local port, one HTTP GET, stopping a
TensorBoard started in its own process group, warming the page cache, and the JSON
results file (date and CPU count first)."""
from __future__ import annotations

import datetime as _dt
import http.client
import json
import os
import signal
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 30.0):
    """(status, body) of one GET on localhost (one connection per request, like a
    browser without keep-alive)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of ``proc`` (started with start_new_session=True:
    TensorBoard and its analysis children), SIGKILL after 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def warm_page_cache(path) -> None:
    """Reads a file once, so that the first timed run is not a disk benchmark."""
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def write_results(path: Path, doc: dict) -> None:
    """Writes ``{"date", "cpus", **doc}`` as indented JSON to ``path`` (parents made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                                "cpus": os.cpu_count(), **doc}, indent=1))
    print(f"wrote {path}")
