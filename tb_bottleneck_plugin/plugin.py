"""The Bottlenecks tab's backend: TensorBoard routes over a service.Analyzer.

Routes (GET or HEAD only, under data/plugin/bottlenecks/; see docs/DEVELOPMENT.md):
  index.js, static/<file>   the dashboard in static/ (ES modules, no build step)
  runs                      runs -> workers -> spans with loading state and progress
  report?run=&worker=&span= the report object (docs/report-schema.md)
  memory?run=&worker=&span= down-sampled allocated/reserved curves per device
  kernels?run=&worker=&span= the per-kernel table
  compare?base_run=&base_worker=&base_span=&cand_run=&... baseline vs candidate (compare.py)
  timeline?run=&worker=&span=&step=&t0=&t1=&px=  one step's timeline, level of detail (timeline_store.py)
  step_trace?run=&worker=&span=&step=  that step's events as a Chrome trace (a download)
  operators?run=&worker=&span=&step=all|N&group=op|op_shape  the operator view table
Run, worker and span names are accepted only from the discovered set; no request
ever names a filesystem path, and no answer contains one (paths are relative to the
logdir). Every error answer is JSON (with TensorBoard's ``X-Content-Type-Options:
nosniff``): 404 unknown or absurd names, 405 other methods, 422 data that cannot be
shown (with the reason), 503 when the service itself fails; never a 500.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import posixpath
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from tensorboard.backend import http_util, json_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from .serving.scheduler import parse_bytes
from .analysis import peaks
from .serving.cache import cache_max_bytes
from .serving.service import Analyzer, default_cache_dir

log = logging.getLogger(__name__)

_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
                 ".html": "text/html", ".png": "image/png"}
_STATIC_NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # one plain file name
_STATIC_ROUTE_RE = re.compile(r"^.*?/static/(.*)$", re.S)  # the FIRST /static/ of the path
_ALLOWED_METHODS = ("GET", "HEAD")
PLUGIN_NAME = "bottlenecks"  # the tab's name in TensorBoard and in its /data/plugin/<name>/ URLs
MAX_NAME_CHARS = 255  # worker, span and static names are file names: longer is never valid
MAX_RUN_CHARS = 4096  # a run is a relative directory path (PATH_MAX)


def _frontend_dir() -> Optional[Path]:
    """The dashboard's folder, ``tb_bottleneck_plugin/static`` next to this module (in a
    wheel, a source checkout and an editable install alike)."""
    folder = Path(__file__).resolve().parent / "static"
    return folder if (folder / "index.js").is_file() else None


class _EncodedBodies:
    """JSON bodies of the data routes, encoded once (and gzipped once) per result: a
    span's report is hundreds of KB that TensorBoard would otherwise walk, encode and
    compress again on every request. Keyed by route and query; an entry is used only
    while the result object it was made from is still the current one."""

    def __init__(self, size: int = 128):
        self.size = size
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._lock = threading.Lock()

    def respond(self, request, key: tuple, source, extra, build):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is source and entry[1] == extra:
                self._entries.move_to_end(key)
        if entry is None or entry[0] is not source or entry[1] != extra:
            # exactly what http_util.Respond would send for the dict
            text = json.dumps(json_util.Cleanse(build(), "utf-8"), ensure_ascii=True).encode("utf-8")
            entry = (source, extra, text, [None])
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        text, gz = entry[2], entry[3]
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            if gz[0] is None:
                gz[0] = gzip.compress(text, compresslevel=3, mtime=0)
            return http_util.Respond(request, gz[0], "application/json", content_encoding="gzip")
        return http_util.Respond(request, text, "application/json")


class BottlenecksPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        flags = context.flags
        self._logdir = context.logdir or ""
        self._problem: Optional[str] = None
        if not self._logdir:
            spec = getattr(flags, "logdir_spec", "") if flags else ""
            self._problem = ("--logdir_spec is not supported by the Bottlenecks tab; start TensorBoard "
                             "with --logdir" if spec else "TensorBoard was started without --logdir")
        cache_flag = getattr(flags, "bottlenecks_cache_dir", None) if flags else None
        if cache_flag and cache_flag.lower() == "none":
            cache_dir = None
        else:
            cache_dir = cache_flag or default_cache_dir()
        rescan = getattr(flags, "bottlenecks_rescan_seconds", None) if flags else None
        follow = bool(getattr(flags, "bottlenecks_follow_symlinks", False)) if flags else False
        jobs = getattr(flags, "bottlenecks_analysis_jobs", None) if flags else None
        jobs = jobs if isinstance(jobs, int) and jobs > 0 else None
        memory = getattr(flags, "bottlenecks_analysis_memory", None) if flags else None
        memory = memory if isinstance(memory, str) and memory else None
        dask_address = getattr(flags, "bottlenecks_dask_scheduler", None) if flags else None
        dask_address = dask_address if isinstance(dask_address, str) and dask_address else None
        peak = getattr(flags, "bottlenecks_peak_tflops", None) if flags else None
        if isinstance(peak, str) and peak.strip():
            # Before the Analyzer: its disk cache keys entries by this setting too
            # (cache.analysis_settings), and the analysis processes inherit it.
            os.environ[peaks.ENV_PEAK] = peak.strip()
        cache_mb = getattr(flags, "bottlenecks_cache_max_mb", None) if flags else None
        cache_mb = cache_mb if isinstance(cache_mb, (int, float)) and not isinstance(cache_mb, bool) \
            and 0 < cache_mb < float("inf") else None  # fix_flags refuses others
        self.analyzer = Analyzer(self._logdir, cache_dir=cache_dir, rescan_seconds=rescan or 30.0,
                                 cache_max_bytes=cache_max_bytes(cache_mb),
                                 follow_symlinks=follow, max_workers=jobs + 1 if jobs else None,
                                 memory_budget=parse_bytes(memory) if memory else None,
                                 dask_scheduler=dask_address or None) if self._logdir else None
        self._bodies = _EncodedBodies()

    # ------------------------------------------------------------------ TBPlugin
    def get_plugin_apps(self):
        # (app, status for an unexpected exception): 422 where the data of a run cannot be
        # shown, 503 where the service itself failed. Never 500 (see _guarded).
        if self.analyzer is not None:
            # TensorBoard builds its app once, at startup: scan from now on (a background
            # thread), so that runs in the disk cache are ready when the server first answers
            # (warm reopen: ~20 ms to the first report instead of a 202 and a wait for the scan
            # the dashboard's first is_active call would start; benchmarks/bench_first_card.py).
            self.analyzer.start()
        apps = {
            "/index.js": (self._serve_index, 503),
            "/static/*": (self._serve_static, 503),
            "/runs": (self._serve_runs, 503),
            "/report": (self._serve_report, 422),
            "/memory": (self._serve_memory, 422),
            "/kernels": (self._serve_kernels, 422),
            "/compare": (self._serve_compare, 422),
            "/ranks": (self._serve_ranks, 422),
            "/timeline": (self._serve_timeline, 422),
            "/step_trace": (self._serve_step_trace, 422),
            "/operators": (self._serve_operators, 422),
        }
        return {route: _guarded(app, route, code, self._relative) for route, (app, code) in apps.items()}

    def _relative(self, text: str) -> str:
        return self.analyzer.relative(text) if self.analyzer is not None else text

    def is_active(self) -> bool:
        # Called on every dashboard load: never touch storage here. Until the first
        # background scan finishes, a configured logdir counts as active.
        if self.analyzer is None:
            return False
        state, scanned_at, runs = self.analyzer.activity()  # starts the scan thread, reads state
        if scanned_at is None:
            return True
        return runs > 0 or state == "error"

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Bottlenecks",
                                            disable_reload=False)

    # ------------------------------------------------------------------ static
    @wrappers.Request.application
    def _serve_index(self, request):
        return self._static_file(request, "index.js")

    @wrappers.Request.application
    def _serve_static(self, request):
        # request.path is percent-decoded: "..%2f" arrives as "../" and is refused below.
        m = _STATIC_ROUTE_RE.match(request.path)
        return self._static_file(request, m.group(1) if m else "")

    def _static_file(self, request, name: str):
        # Only plain file names directly in the frontend folder: no "..", no sub-paths,
        # no absolute paths, no backslashes, no hidden files, only known extensions.
        ext = posixpath.splitext(name)[1]
        if (len(name) > MAX_NAME_CHARS or not _STATIC_NAME_RE.match(name) or ".." in name
                or ext not in _STATIC_TYPES):
            return _error(request, "no such file", 404)
        folder = _frontend_dir()
        if folder is None:
            return _error(request, "the dashboard files are missing from this installation", 404)
        try:
            path = (folder / name).resolve()
            if path.parent != folder.resolve() or not path.is_file():
                return _error(request, "no such file", 404)
            data = path.read_bytes()
        except OSError:  # a name the filesystem refuses, a file removed meanwhile
            return _error(request, "no such file", 404)
        return http_util.Respond(request, data, _STATIC_TYPES[ext])

    # ------------------------------------------------------------------ data
    @wrappers.Request.application
    def _serve_runs(self, request):
        if self.analyzer is None:
            return http_util.Respond(request, {"logdir": None, "runs": [],
                                               "scan": {"state": "error", "error": self._problem, "notes": []}},
                                     "application/json")
        if request.args.get("rescan"):
            self.analyzer.rescan()
        return http_util.Respond(request, self.analyzer.runs_view(), "application/json")

    def _key(self, request, route: str) -> tuple:
        return (route, request.args.get("run"), request.args.get("worker") or None, request.args.get("span") or None)

    def _result(self, request, views: bool = False):
        """(result, None) or (None, error response) for the run/worker/span of a request;
        ``views``: with a summary's Operator view and kernel names (service.Analyzer.result)."""
        if self.analyzer is None:
            return None, _error(request, self._problem, 404)
        run = request.args.get("run")
        if not run:
            return None, _error(request, "missing query parameter 'run'", 400)
        worker = request.args.get("worker") or None
        span = request.args.get("span") or None
        if span == "all":
            span = None
        if (len(run) > MAX_RUN_CHARS or len(worker or "") > MAX_NAME_CHARS
                or len(span or "") > MAX_NAME_CHARS or "\x00" in run + (worker or "") + (span or "")):
            return None, _error(request, "unknown run, worker or span (name too long or not a name)", 404)
        try:
            result = self.analyzer.result(run, worker, span, views=views)
        except KeyError:
            if self.analyzer.activity()[1] is None:  # not scanned yet: the name may well exist
                return None, http_util.Respond(request, {"state": "loading", "progress": 0.0, "scan": "pending"},
                                               "application/json", code=202)
            what = f"run {run!r}" + (f", worker {worker!r}" if worker else "") + (f", span {span!r}" if span else "")
            return None, _error(request, f"unknown {what} (not among the runs found in the logdir)", 404)
        if result["state"] == "loading":
            return None, http_util.Respond(request, {"state": "loading", "progress": result["progress"]},
                                           "application/json", code=202)
        if result["state"] == "error":
            return None, http_util.Respond(request, {"state": "error", "error": result["error"],
                                                     "errors": result.get("errors", [])},
                                           "application/json", code=422)
        return result, None

    @wrappers.Request.application
    def _serve_report(self, request):
        result, failure = self._result(request)
        if failure is not None:
            return failure
        errors = result.get("errors") or []

        def build():
            body = dict(result["report"])
            if errors:
                body["file_errors"] = errors
            return body

        return self._bodies.respond(request, self._key(request, "report"), result["report"], errors, build)

    @wrappers.Request.application
    def _serve_memory(self, request):
        result, failure = self._result(request)
        return failure or self._bodies.respond(request, self._key(request, "memory"), result["memory"], None,
                                               lambda: result["memory"])

    @wrappers.Request.application
    def _serve_kernels(self, request):
        result, failure = self._result(request)
        return failure or self._bodies.respond(request, self._key(request, "kernels"), result["kernels"], None,
                                               lambda: {"kernels": result["kernels"]})

    @wrappers.Request.application
    def _serve_compare(self, request):
        from .views.compare import compare_route  # 200/202/400/404/422 like the report route

        body, code = compare_route(self.analyzer, request.args, self._problem)
        return http_util.Respond(request, body, "application/json", code=code)

    @wrappers.Request.application
    def _serve_ranks(self, request):
        from .views.ranks import ranks_route  # metrics §12: the run's ranks side by side

        body, code = ranks_route(self.analyzer, request.args, self._problem)
        return http_util.Respond(request, body, "application/json", code=code)

    @wrappers.Request.application
    def _serve_timeline(self, request):
        from .serving.timeline_store import timeline_route  # METRICS.md: Step timeline

        body, code = timeline_route(self.analyzer, request.args, self._problem)
        return http_util.Respond(request, body, "application/json", code=code)

    @wrappers.Request.application
    def _serve_step_trace(self, request):
        from .serving.timeline_store import step_trace_route

        body, code, filename = step_trace_route(self.analyzer, request.args, self._problem)
        headers = [("Content-Disposition", f'attachment; filename="{filename}"')] if filename else None
        return http_util.Respond(request, body, "application/json", code=code, headers=headers)


    @wrappers.Request.application
    def _serve_operators(self, request):
        from .analysis.operators import route_answer  # METRICS.md: Operator view

        result, failure = self._result(request, views=True)
        if failure is not None:
            return failure
        view = result.get("operator_view")
        body, code = route_answer(view, request.args)
        if code == 422:  # name the failing part (the span's or the run-level combine's error), not only the log
            failed = [e for e in ((result.get("report") or {}).get("errors") or []) + (result.get("view_errors") or [])
                      if isinstance(e, dict) and e.get("section") == "operator_view"]
            if failed:
                body["error"] = "the operator view could not be computed for this selection: " + "; ".join(
                    str(e.get("error")) for e in failed)
            body["errors"] = [{"file": e.get("file"), "section": "operator_view", "error": str(e.get("error"))}
                              for e in failed]
        if code != 200:
            return http_util.Respond(request, body, "application/json", code=code)
        extra = (request.args.get("step") or "all", request.args.get("group") or "op")
        return self._bodies.respond(request, self._key(request, "operators") + extra, view, None, lambda: body)


def _error(request, message: str, code: int):
    return http_util.Respond(request, {"error": message}, "application/json", code=code)


def _guarded(app, route: str, failure_code: int, relative=lambda text: text):
    """Wrap one route's WSGI app: GET/HEAD only (405 with a JSON body otherwise), and an
    unexpected exception becomes a logged JSON error (422 for data routes: this view of
    this run cannot be shown; 503 for the others), never a 500 that takes the tab down."""

    def wsgi(environ, start_response):
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method not in _ALLOWED_METHODS:
            request = wrappers.Request(environ)
            response = _error(request, f"method {method[:20]} not allowed here (GET or HEAD only)", 405)
            response.headers["Allow"] = ", ".join(_ALLOWED_METHODS)
            return response(environ, start_response)
        try:
            return app(environ, start_response)
        except Exception as exc:  # noqa: BLE001 - the tab must keep answering
            log.exception("bottlenecks: %s failed", route)
            request = wrappers.Request(environ)
            message = relative(f"internal error while answering {route.strip('/')}: {type(exc).__name__}: {exc}")
            body = {"error": message[:2000]}
            if failure_code == 422:
                body["state"] = "error"
            return http_util.Respond(request, body, "application/json", code=failure_code)(environ, start_response)

    wsgi.__name__ = getattr(app, "__name__", "route")
    return wsgi
