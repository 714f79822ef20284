"""The Bottlenecks tab's backend: TensorBoard routes over a service.Analyzer.

Routes (all GET, under data/plugin/bottlenecks/; see docs/DEVELOPMENT.md):
  index.js, static/<file>   the dashboard in frontend/ (ES modules, no build step)
  runs                      runs -> workers -> spans with loading state and progress
  report?run=&worker=&span= the report object (docs/report-schema.md)
  memory?run=&worker=&span= down-sampled allocated/reserved curves per device
  kernels?run=&worker=&span= the per-kernel table
  compare?base_run=&base_worker=&base_span=&cand_run=&... baseline vs candidate (compare.py)
Run, worker and span names are accepted only from the discovered set; no request
ever names a filesystem path.
"""
from __future__ import annotations

import logging
import posixpath
import re
from importlib import resources
from pathlib import Path
from typing import Optional

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from .plugin_loader import PLUGIN_NAME
from .service import Analyzer, default_cache_dir

log = logging.getLogger(__name__)

_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
                 ".html": "text/html", ".png": "image/png"}
_STATIC_NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # one plain file name
_STATIC_ROUTE_RE = re.compile(r"^.*?/static/(.*)$", re.S)  # the FIRST /static/ of the path


def _frontend_dir() -> Optional[Path]:
    """The dashboard's folder: ``tb_bottleneck_plugin/frontend`` in an installed wheel,
    ``<checkout>/frontend`` in a source checkout or an editable install (where
    ``tb_bottleneck_plugin.frontend``, a folder without ``__init__.py`` mapped by
    ``package_dir``, is not importable, so importlib.resources cannot find it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "frontend", here.parent / "frontend"):
        if (candidate / "index.js").is_file():
            return candidate
    try:
        found = resources.files("tb_bottleneck_plugin.frontend")
        return Path(str(found)) if (found / "index.js").is_file() else None
    except (ImportError, TypeError, ValueError):
        return None


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
        self.analyzer = Analyzer(self._logdir, cache_dir=cache_dir, rescan_seconds=rescan or 30.0) \
            if self._logdir else None

    # ------------------------------------------------------------------ TBPlugin
    def get_plugin_apps(self):
        return {
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/report": self._serve_report,
            "/memory": self._serve_memory,
            "/kernels": self._serve_kernels,
            "/compare": self._serve_compare,
            "/ranks": self._serve_ranks,
        }

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
        if not _STATIC_NAME_RE.match(name) or ".." in name or ext not in _STATIC_TYPES:
            return _error(request, "no such file", 404)
        folder = _frontend_dir()
        if folder is None:
            return _error(request, "the dashboard files are missing from this installation", 404)
        path = (folder / name).resolve()
        if path.parent != folder.resolve() or not path.is_file():
            return _error(request, "no such file", 404)
        return http_util.Respond(request, path.read_bytes(), _STATIC_TYPES[ext])

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

    def _result(self, request):
        """(result, None) or (None, error response) for the run/worker/span of a request."""
        if self.analyzer is None:
            return None, _error(request, self._problem, 404)
        run = request.args.get("run")
        if not run:
            return None, _error(request, "missing query parameter 'run'", 400)
        worker = request.args.get("worker") or None
        span = request.args.get("span") or None
        if span == "all":
            span = None
        try:
            result = self.analyzer.result(run, worker, span)
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
        body = dict(result["report"])
        if result.get("errors"):
            body["file_errors"] = result["errors"]
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_memory(self, request):
        result, failure = self._result(request)
        return failure or http_util.Respond(request, result["memory"], "application/json")

    @wrappers.Request.application
    def _serve_kernels(self, request):
        result, failure = self._result(request)
        return failure or http_util.Respond(request, {"kernels": result["kernels"]}, "application/json")

    @wrappers.Request.application
    def _serve_compare(self, request):
        from .compare import compare_route  # 200/202/400/404/422 like the report route

        body, code = compare_route(self.analyzer, request.args, self._problem)
        return http_util.Respond(request, body, "application/json", code=code)

    @wrappers.Request.application
    def _serve_ranks(self, request):
        from .ranks import ranks_route  # metrics §12: the run's ranks side by side

        body, code = ranks_route(self.analyzer, request.args, self._problem)
        return http_util.Respond(request, body, "application/json", code=code)


def _error(request, message: str, code: int):
    return http_util.Respond(request, {"error": message}, "application/json", code=code)
