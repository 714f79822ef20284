"""Shared pytest fixtures and constants. Keep heavy setup in helper modules.

Constants (import them: ``from conftest import TRACES``; tests/ is on sys.path):
  REPO, SHARED, TRACES, ORACLES, DEMO_LOGS, ARTIFACTS, ROUTE_SCHEMA_PATH, CHROMIUM
The synthetic trace builder (tests/trace_builder.py) is re-exported here:
  ``from conftest import TraceBuilder, V100, write_trace`` (or the ``trace_builder`` fixture).
  ``write_trace(path, events, props=(), distributed_info=None)`` writes any hand-made event
  list as a Kineto file (.gz by name); use it instead of a per-file json.dumps wrapper.
  ``write_html_names_trace(path, kernel_dur=500)``: a small trace whose kernel (``XSS_KERNEL``)
  and operator (``XSS_OP``) are named like HTML, for the "trace strings stay text" checks.

End-to-end helpers (a real ``tensorboard --logdir`` and a real headless Chromium):
  - ``tensorboard_server`` (module-scoped factory): ``base = tensorboard_server(logdir)``
    starts TensorBoard (``start_tensorboard``: every installed plugin but torch-tb-profiler's,
    see TENSORBOARD_WITHOUT_TBP) with ``--logdir LOGDIR`` on a free port with the disk cache
    off, waits until it answers, returns ``http://127.0.0.1:PORT``; killed at module end.
  - ``chromium`` (module-scoped): a Playwright Browser on Debian's /usr/bin/chromium.
  - ``browser_page`` (function-scoped factory): ``w = browser_page(base)`` is a
    :class:`Watched` page recording requests, dialogs and page errors; call
    ``w.check_clean()`` at the end; closed after the test.
  - ``wait_route(base, "report", run=...)``: the route's 200 JSON body (polls while 202).
  - ``route_validator("report")``: a jsonschema validator for one docs/route-schema.json $def.
Without a server: ``route_response(analyzer, "ranks", run=...)`` answers one route over an
Analyzer (routes.py behind werkzeug's test client).
Deadlines on a busy machine: ``patience(30)`` is 30 s when the test gets a whole core and
proportionally longer when it gets less (``cpu_share()``, measured); use it for hang guards
(``a.wait_idle(patience(30))``), never to widen a bound that pins a measured number.
Both fixtures skip when Playwright/Chromium are missing, and fail instead when
BOTTLENECKS_REQUIRE_BROWSER=1 (CI).
"""
# The GCS emulator (fake-gcs-server): `gcs_emulator` (session) and `gcs` (per test).
# Importing gcs_emulator also sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before any
# test module can import gcsfs.
from gcs_emulator import gcs, gcs_emulator  # noqa: F401

import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tb_bottleneck_plugin.trace import discovery  # noqa: E402
from trace_builder import (  # noqa: E402,F401  (re-exported: one trace builder for every test)
    A100, B200, H100, MI250, MI300, V100, XSS_KERNEL, XSS_OP, TraceBuilder, occupancy_args, write_html_names_trace,
    write_trace)

REPO = Path(__file__).resolve().parents[1]
# A few tests reuse another folder's helpers (``from test_compare import result_of``): every
# stage folder is importable, also when one test file runs alone.
sys.path.extend(str(p) for p in sorted(Path(__file__).resolve().parent.iterdir())
                if p.is_dir() and p.name not in ("fixtures", "__pycache__") and str(p) not in sys.path)
SHARED = REPO.parent / "shared"          # read-only data beside the checkout
TRACES = SHARED / "traces"
ORACLES = SHARED / "oracles"
DEMO_LOGS = REPO / "demo_logs"
ARTIFACTS = REPO / "test-artifacts"      # screenshots (git-ignored)
ROUTE_SCHEMA_PATH = REPO / "docs" / "route-schema.json"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic")

# torch-tb-profiler is in the [test] extra (tests compare against it live), so a plain
# ``python -m tensorboard.main`` also loads ITS plugin, which parses every trace of the logdir
# in spawned worker processes: seconds to minutes of CPU on a busy 2-core machine, GBs on big
# traces, and children that outlive their parent (CI once failed on one of its zombies). The
# tests' TensorBoards therefore load every installed plugin but that one (ours still comes in
# through its real entry point); tests/e2e/test_e2e_beside_torch_tb_profiler.py runs the one real
# TensorBoard with every plugin, as a user migrating from torch-tb-profiler has it.
TENSORBOARD_ALL_PLUGINS = (sys.executable, "-m", "tensorboard.main")
TENSORBOARD_WITHOUT_TBP = (sys.executable, "-c", "\n".join((
    "import sys",
    "from importlib import metadata",
    "import tensorboard.default as d",
    "import tensorboard.main as m",
    "d.get_dynamic_plugins = lambda: [e.load() for e in metadata.entry_points(group='tensorboard_plugins')",
    "                                 if e.module.split('.')[0] != 'torch_tb_profiler']",
    "sys.argv[0] = 'tensorboard'",
    "m.run_main()")))


@pytest.fixture(autouse=True)
def _fresh_sniff_cache():
    """Discovery caches Kineto sniffs by (URL, fingerprint) per process: start each test clean."""
    discovery.clear_sniff_cache()
    yield
    discovery.clear_sniff_cache()


needs_traces = pytest.mark.skipif(not TRACES.exists(), reason="../shared/traces not present")


@functools.lru_cache(maxsize=None)
def real_report(rel: str) -> dict:
    """The span report of the shared trace ``TRACES / rel``, analysed once per test process."""
    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.trace.loader import load_trace

    return report.analyze_trace(load_trace(str(TRACES / rel)))["report"]


def rules_by_id(rep: dict) -> dict:
    """A report's recommendations by rule id."""
    return {r["rule"]: r for r in rep["recommendations"]}


def load_frontend_mock_server():
    """tests/fixtures/frontend_mock_server.py as a module (it replays the route answers
    recorded from the real backend, route_responses.json)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("frontend_mock_server",
                                                  REPO / "tests" / "fixtures" / "frontend_mock_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def frontend_mock():
    """Base URL of the recorded-route mock server, for the module."""
    srv, base = load_frontend_mock_server().serve_in_thread()
    yield base
    srv.shutdown()
    srv.server_close()


def link_demo_run(logs: Path, run: str, demo: str = "input_bound_nw0") -> Path:
    """``logs/run`` holding links to the trace files of ``demo_logs/<demo>`` (the test is
    skipped when that demo run is missing)."""
    files = sorted((DEMO_LOGS / demo).glob("*.pt.trace.json.gz"))
    if not files:
        pytest.skip(f"demo_logs/{demo} is missing")
    dest = logs / run
    dest.mkdir(parents=True)
    for f in files:
        os.symlink(f, dest / f.name)
    return dest


@pytest.fixture
def trace_builder():
    """The synthetic-trace builder class (tests/trace_builder.py): ``trace_builder(props=(A100,))``."""
    return TraceBuilder


def route_response(analyzer, route: str, problem=None, **query):
    """One route of the plugin answered over ``analyzer`` (an Analyzer, or None with
    ``problem``), without TensorBoard or a plugin object: routes.plugin_apps behind
    werkzeug's test client. The werkzeug response (``status_code``, ``get_json()``, headers)."""
    from werkzeug import test as wtest
    from werkzeug import wrappers

    from tb_bottleneck_plugin import routes

    app = routes.plugin_apps(lambda: routes.RouteContext(analyzer, problem))["/" + route]
    return wtest.Client(app, wrappers.Response).get("/" + route, query_string=query or None)


# ---------------------------------------------------------------- end to end: TensorBoard + Chromium

def browser_or_skip():
    """Skip (or fail, with BOTTLENECKS_REQUIRE_BROWSER=1) when Playwright or Chromium is missing."""
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


def need_torch_tb_profiler():
    """torch-tb-profiler for the tests that run it live: the ``oracle`` extra. Skipped with
    the install hint where it is missing, except in CI (BOTTLENECKS_REQUIRE_ORACLE=1, set by
    .ci/run, which installs it): there a missing reference tool fails."""
    try:
        import torch_tb_profiler  # noqa: F401
    except ImportError:
        if os.environ.get("BOTTLENECKS_REQUIRE_ORACLE") == "1":
            pytest.fail("torch-tb-profiler is required here (BOTTLENECKS_REQUIRE_ORACLE=1): pip install -e '.[oracle]'")
        pytest.skip("torch-tb-profiler not installed: pip install -e '.[oracle]'")


def fmt_verdict_value(v: dict) -> str:
    """A card's value as static/cards.js fmtVerdictValue writes it (the units the tests
    meet: pct and bytes; bytes through ranks._bytes_words, the server's mirror of format.js)."""
    from tb_bottleneck_plugin.views.ranks import _bytes_words

    if v["value"] is None:
        return "n/a"
    if v["unit"] == "pct":
        return f"{v['value']:.1f}%"
    if v["unit"] == "bytes":
        return _bytes_words(v["value"])
    raise AssertionError(f"unit {v['unit']!r} not handled by this test")


def default_sigint() -> None:
    """preexec_fn for children a test sends SIGINT to: a suite started with SIGINT ignored
    (``nohup ... &``, CI wrappers) would pass SIG_IGN on, and Python keeps ignoring an
    inherited SIG_IGN, so Ctrl-C would never reach the child."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    """(status, body bytes); 4xx/5xx answers are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_route(base, route, timeout=120, **params):
    """The plugin route's 200 JSON body, polling while it answers 202 (analysis running)."""
    url = f"{base}/data/plugin/bottlenecks/{route}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    deadline = time.time() + timeout
    while True:
        status, body = http_get(url)
        if status == 200:
            return json.loads(body)
        if status != 202:
            raise AssertionError(f"{url} answered {status}: {body[:500]!r}")
        if time.time() > deadline:
            raise TimeoutError(f"{url} kept answering 202")
        time.sleep(0.5)


def cpu_share(sample_cpu_s: float = 0.05) -> float:
    """The share of one core this process gets right now: a short CPU-bound loop's CPU time
    over its wall time (about 1.0 on a free core; 0.02-0.05 seen with the tests at nice 10
    and 3 busy loops at nice 0 on the 2 cores)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < sample_cpu_s:
        pass
    return min(1.0, (time.thread_time() - c0) / max(time.perf_counter() - t0, 1e-9))


def patience(seconds: float) -> float:
    """A hang guard's deadline derived from the machine: ``seconds`` when this process gets a
    whole core, ``seconds / cpu_share()`` when it gets less (at most 20x). For waits that
    only guard against a hang (wait_idle, until a state shows); never for a bound that pins
    a measured number."""
    return seconds / max(cpu_share(), 0.05)


def route_validator(name):
    """A Draft 2020-12 validator for ``$defs/<name>`` of docs/route-schema.json."""
    import jsonschema

    schema = json.loads(ROUTE_SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"],
                                            "$ref": f"#/$defs/{name}"})


@contextlib.contextmanager
def start_tensorboard(logdir, extra_args=(), startup_timeout=90, all_plugins=False, env=None, cwd=None):
    """A real ``tensorboard --logdir`` subprocess (disk cache off unless extra_args set it);
    yields its base URL; killed (with its process group) on exit. Every installed plugin but
    torch-tb-profiler's is loaded, unless ``all_plugins`` (see TENSORBOARD_WITHOUT_TBP).
    ``env``/``cwd``: the process's environment and folder (default: this process's)."""
    args = list(extra_args)
    if not any(a.startswith("--bottlenecks_cache_dir") for a in args):
        args += ["--bottlenecks_cache_dir", "none"]
    port = free_port()
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty server never blocks
        proc = subprocess.Popen(
            [*(TENSORBOARD_ALL_PLUGINS if all_plugins else TENSORBOARD_WITHOUT_TBP),
             "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", str(port), *args],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, env=env,
            cwd=None if cwd is None else str(cwd))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + startup_timeout
            while True:
                try:
                    with urllib.request.urlopen(base + "/data/plugins_listing", timeout=5) as r:
                        r.read()
                    break
                except (urllib.error.URLError, ConnectionError, socket.timeout):
                    if time.time() > deadline or proc.poll() is not None:
                        err.seek(0)
                        raise RuntimeError("tensorboard did not start: " + err.read()[-4000:].decode(errors="replace"))
                    time.sleep(0.3)
            yield base
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tensorboard_server():
    """Factory: ``base = tensorboard_server(logdir, extra_args=(), all_plugins=False)``; servers
    end with the module."""
    browser_or_skip()  # every user of a real TensorBoard here drives it with the browser
    with contextlib.ExitStack() as stack:
        yield lambda logdir, extra_args=(), all_plugins=False: stack.enter_context(
            start_tensorboard(logdir, extra_args, all_plugins=all_plugins))


@pytest.fixture(scope="session")
def chromium():
    """A headless Debian Chromium driven by Playwright, one for the whole session: each test's
    pages (`browser_page`) get their own browser context, so no state crosses tests."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS))
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page with every request, dialog and page error recorded."""

    def __init__(self, browser, base, viewport=(1280, 800), all_sections=True):
        self.base = base
        self.requests, self.dialogs, self.errors = [], [], []
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        if all_sections:  # every section of the tab open, as a reader who clicked "All" (sections.js)
            self.page.add_init_script("try { localStorage.setItem('bottlenecks.sections', 'all'); } catch (e) {}")
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open_tab(self, timeout=60_000):
        """TensorBoard's page on the Bottlenecks tab; returns the plugin iframe's FrameLocator
        once its run selector exists."""
        self.page.goto(self.base + "/#bottlenecks", wait_until="domcontentloaded")
        frame = self.page.frame_locator("iframe")
        frame.locator("#bn-run").wait_for(timeout=timeout)
        return frame

    def plugin_frame(self):
        """The plugin iframe as a Frame (for evaluate / wait_for_function)."""
        return next(f for f in self.page.frames if "plugin" in f.url)

    def open_run(self, run, ready=None, timeout=240_000):
        """The tab with ``run`` selected: (FrameLocator, Frame). ``ready``: a CSS selector
        that must exist too (e.g. a card of the run's report) before it returns."""
        frame = self.open_tab()
        iframe = self.plugin_frame()
        iframe.wait_for_function("(r) => [...document.querySelectorAll('#bn-run option')].some((o) => o.value === r)",
                                 arg=run, timeout=timeout)
        frame.locator("#bn-run").select_option(run)
        iframe.wait_for_function("([r, sel]) => document.querySelector('#bn-run').value === r"
                                 " && (!sel || document.querySelector(sel))", arg=[run, ready], timeout=timeout)
        return frame, iframe

    def check_clean(self):
        assert not self.dialogs, self.dialogs
        assert not self.errors, self.errors
        foreign = [u for u in self.requests if not u.startswith(self.base)
                   and not u.startswith(("data:", "blob:", "about:"))]
        assert not foreign, foreign


@pytest.fixture
def browser_page(chromium):
    """Factory: ``w = browser_page(base, viewport=(1280, 800), all_sections=True)`` -> :class:`Watched`;
    closed after the test. ``all_sections``: every section of the tab open (the reader's "All",
    static/sections.js); False: the default first screen (issue 35)."""
    pages = []

    def make(base, viewport=(1280, 800), all_sections=True):
        w = Watched(chromium, base, viewport, all_sections)
        pages.append(w)
        return w

    yield make
    for w in pages:
        with contextlib.suppress(Exception):
            w.page.close()
