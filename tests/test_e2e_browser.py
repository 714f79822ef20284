"""End to end: a real `tensorboard` process, a real headless Chromium (Debian's, driven by
Playwright), the Bottlenecks tab inside TensorBoard's iframe.

Checks that the cards show the numbers of the JSON route, that a kernel named like an
HTML tag is shown as text, and that the page loads nothing from another origin.
Screenshots go to test-artifacts/ (git-ignored) for a person to look at.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"
XSS = "<img src=x onerror=alert(1)>"


def _browser_or_skip():
    required = os.environ.get("BOTTLENECKS_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        if required:
            pytest.fail("playwright is not installed (pip install -e '.[test]')")
        pytest.skip("playwright is not installed")
    if not os.path.exists(CHROMIUM):
        if required:
            pytest.fail(f"{CHROMIUM} missing: apt-get install chromium")
        pytest.skip(f"{CHROMIUM} missing (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _xss_trace(path: Path):
    """A small trace whose only kernel carries an HTML-looking name."""
    events = []
    for step in range(3):
        t0 = 1000 + step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 900})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t0 + 100, "dur": 10, "args": {"correlation": step + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": XSS, "pid": 0, "tid": 7, "ts": t0 + 120, "dur": 500,
                       "args": {"device": 0, "stream": 7, "correlation": step + 1, "grid": [1, 1, 1],
                                "block": [128, 1, 1], "registers per thread": 32, "shared memory": 0,
                                "blocks per SM": 0.0125, "est. achieved occupancy %": 6}})
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}))


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    _browser_or_skip()
    logdir = tmp_path_factory.mktemp("logdir")
    nw0 = TRACES / "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    (logdir / "resnet50_nw0").mkdir()
    shutil.copy(nw0, logdir / "resnet50_nw0" / nw0.name)
    (logdir / "xss").mkdir()
    _xss_trace(logdir / "xss" / "worker0.1700000000000.pt.trace.json")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--bottlenecks_cache_dir", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                _get(base + "/data/plugins_listing")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("tensorboard did not start: " + proc.stderr.read(4000).decode())
                time.sleep(0.3)
        yield base
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _ready_report(base, run):
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            status, body = _get(f"{base}/data/plugin/bottlenecks/report?run={run}")
            if status == 200:
                return json.loads(body)
        except urllib.error.HTTPError as e:
            if e.code not in (202,):
                raise
        time.sleep(0.5)
    raise TimeoutError(run)


def test_tab_in_a_real_browser(tensorboard):
    from playwright.sync_api import sync_playwright

    base = tensorboard
    report = _ready_report(base, "resnet50_nw0")
    _ready_report(base, "xss")
    ARTIFACTS.mkdir(exist_ok=True)
    requests, dialogs, errors = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(base + "/#bottlenecks", wait_until="domcontentloaded")
            frame = page.frame_locator("iframe")
            frame.locator("#bn-run").wait_for(timeout=60_000)
            frame.locator("#bn-run").select_option("resnet50_nw0")
            expected = f"{report['input']['input_bound_pct']:.1f}%"
            card = frame.locator(".card", has_text="Input-bound").first
            card.locator(".card-value", has_text=expected).wait_for(timeout=60_000)
            assert "highly input-bound" in card.inner_text()
            gpu_util = f"{report['gpu']['0']['utilization_pct']:.1f}%"
            frame.locator(".card-value", has_text=gpu_util).first.wait_for(timeout=10_000)
            first_rec = report["recommendations"][0]
            assert first_rec["rule"] == "input_bound"
            frame.get_by_text(first_rec["title"]).first.wait_for(timeout=10_000)
            page.screenshot(path=str(ARTIFACTS / "bottlenecks_resnet50_nw0.png"), full_page=True)

            frame.locator("#bn-run").select_option("xss")
            frame.locator(".card-value").first.wait_for(timeout=60_000)
            iframe = next(f for f in page.frames if "plugin" in f.url)
            # The kernel table shows the name as text (long names may sit in a title too).
            iframe.wait_for_function(
                "(name) => [...document.querySelectorAll('td, [title]')].some("
                "e => e.textContent.includes(name) || (e.getAttribute('title') || '').includes(name))",
                arg=XSS, timeout=60_000)
            # ... and as text only: no <img src=x> element exists and no alert fired.
            assert iframe.evaluate("document.querySelectorAll('img[src=\"x\"]').length") == 0
            page.screenshot(path=str(ARTIFACTS / "bottlenecks_xss_kernel.png"), full_page=True)
        finally:
            browser.close()
    assert not dialogs, dialogs
    assert not errors, errors
    foreign = [u for u in requests if not u.startswith(base) and not u.startswith(("data:", "blob:", "about:"))]
    assert not foreign, foreign
