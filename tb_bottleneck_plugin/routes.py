"""Every HTTP route of the Bottlenecks tab: query parsing, lookups and responses.

Routes (GET or HEAD only, under data/plugin/bottlenecks/; see docs/DEVELOPMENT.md):
  index.js, static/<file>   the dashboard in static/ (ES modules, no build step)
  runs                      runs -> workers -> spans with loading state and progress
  report?run=&worker=&span= the report object (docs/report-schema.md)
  findings?run=&worker=&span= the report's findings for an agent, ≤ 8 KB (views/findings.py)
  memory?run=&worker=&span= down-sampled allocated/reserved curves per device
  kernels?run=&worker=&span= the per-kernel table
  compare?base_run=&base_worker=&base_span=&cand_run=&... baseline vs candidate (views/compare.py)
  ranks?run=                the run's ranks side by side (views/ranks.py)
  timeline?run=&worker=&span=&step=&t0=&t1=&px=  one step's timeline, level of detail (analysis/timeline.py)
  step_trace?run=&worker=&span=&step=  that step's events as a Chrome trace (a download)
  operators?run=&worker=&span=&step=all|N&group=op|op_shape  the operator view table
Run, worker and span names are accepted only from the discovered set; no request
ever names a filesystem path, and no answer contains one (paths are relative to the
logdir: ``Analyzer.relative``). Every error answer is JSON (with TensorBoard's
``X-Content-Type-Options: nosniff``): 404 unknown or absurd names, 405 other methods,
422 data that cannot be shown (with the reason), 503 when the service itself fails;
never a 500.

A handler is ``handler(context, request) -> response``. It reads its query through
:func:`selection` and raises :class:`RouteError` for every answer but a 200;
:func:`plugin_apps` wraps each handler in :func:`_guarded`, which turns a RouteError, and
any other exception, into the JSON answer. The payloads are built by the pure functions of
views/ and analysis/ and read from the engine's long-lived mode (`engine.Analyzer`, the one
thing of serving/ imported here), which never see a request (nothing there imports this module).
"""
from __future__ import annotations

import gzip
import json
import logging
import posixpath
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np
from tensorboard.backend import http_util, json_util
from werkzeug import wrappers

from .analysis import operators
from .serving import engine
from .views import compare as compare_view
from .views import headline as headline_view
from .views import ranks as ranks_view
from .views import timeline_window as tw

if TYPE_CHECKING:
    from .serving.engine import Analyzer

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 255  # worker, span and static names are file names: longer is never valid
MAX_RUN_CHARS = 4096  # a run is a relative directory path (PATH_MAX)
MAX_STEP_DIGITS = 19  # a step number fits an int64
TIMELINE_PX = 1200  # the plot width a timeline window is made for when px is not given
_ALLOWED_METHODS = ("GET", "HEAD")
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
                 ".html": "text/html", ".png": "image/png"}
_STATIC_NAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # one plain file name
_STATIC_ROUTE_RE = re.compile(r"^.*?/static/(.*)$", re.S)  # the FIRST /static/ of the path
NO_DASHBOARD = "the dashboard files are missing from this installation"


class RouteError(Exception):
    """An answer other than 200 (a 202 while loading included): ``status`` and the JSON
    ``body``, ``{"error": message, **fields}`` or, without a message, ``fields`` alone."""

    def __init__(self, status: int, message: Optional[str] = None, **fields: Any):
        super().__init__(message or f"HTTP {status}")
        self.status = status
        self.body = {"error": message, **fields} if message is not None else dict(fields)


def _loading(progress: float, **extra: Any) -> RouteError:
    return RouteError(202, state="loading", progress=progress, **extra)


class EncodedBodies:
    """JSON bodies of the data routes, encoded once (and gzipped once) per result: a
    span's report is hundreds of KB that TensorBoard would otherwise walk, encode and
    compress again on every request. Keyed by route and query; an entry is used only
    while the result object it was made from is still the current one."""

    def __init__(self, size: int = 128):
        self.size = size
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._lock = threading.Lock()

    def respond(self, request, key: tuple, source, extra, build, compact: bool = False):
        """``compact``: JSON without spaces, in UTF-8 (the findings: exactly the bytes
        views/findings.py bounds), instead of TensorBoard's ASCII with spaces."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is source and entry[1] == extra:
                self._entries.move_to_end(key)
        if entry is None or entry[0] is not source or entry[1] != extra:
            # exactly what http_util.Respond would send for the dict (compact: findings.size's bytes)
            text = json.dumps(json_util.Cleanse(build(), "utf-8"), ensure_ascii=not compact,
                              separators=(",", ":") if compact else None).encode("utf-8")
            entry = (source, extra, text, [None])
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        text, gz = entry[2], entry[3]
        content_type = "application/json; charset=utf-8" if compact else "application/json"
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            if gz[0] is None:
                gz[0] = gzip.compress(text, compresslevel=3, mtime=0)
            return http_util.Respond(request, gz[0], content_type, content_encoding="gzip")
        return http_util.Respond(request, text, content_type)


@dataclass
class RouteContext:
    """What the handlers use of the plugin. ``analyzer`` None: no logdir, ``problem`` says
    why. ``read_static(name)``: the bytes of a dashboard file, None when there is none
    (plugin.py reads them: this module touches no file, tests/project/test_architecture.py)."""

    analyzer: Optional["Analyzer"]
    problem: Optional[str] = None
    bodies: EncodedBodies = field(default_factory=EncodedBodies)
    read_static: Optional[Callable[[str], Optional[bytes]]] = None

    def relative(self, text: str) -> str:
        return self.analyzer.relative(text) if self.analyzer is not None else text


# ----------------------------------------------------------------------------- query


@dataclass(frozen=True)
class Selection:
    """The run, worker and span a request names (worker/span None: all of them), and the
    step (None: absent or ``all``, the route's default)."""

    run: str
    worker: Optional[str] = None
    span: Optional[str] = None
    step: Optional[int] = None

    def describe(self) -> str:
        return (f"run {self.run!r}" + (f", worker {self.worker!r}" if self.worker else "")
                + (f", span {self.span!r}" if self.span else ""))


def selection(args, prefix: str = "", with_step: bool = False) -> Selection:
    """The selection of a query (``prefix``: compare's ``base_``/``cand_``): 400 without
    a run or with a step that is not ``all`` or a step number, 404 for names that cannot
    be a run, worker or span. Not looked up here: :func:`_result`, :func:`_span_states`."""
    run = args.get(prefix + "run")
    if not run:
        raise RouteError(400, f"missing query parameter '{prefix}run'")
    worker = args.get(prefix + "worker") or None
    span = args.get(prefix + "span") or None
    if span == "all":
        span = None
    if (len(run) > MAX_RUN_CHARS or len(worker or "") > MAX_NAME_CHARS
            or len(span or "") > MAX_NAME_CHARS or "\x00" in run + (worker or "") + (span or "")):
        raise RouteError(404, "unknown run, worker or span (name too long or not a name)")
    step = None
    if with_step:
        raw = args.get("step") or "all"
        if raw != "all":
            if len(raw) > MAX_STEP_DIGITS or not (raw.isascii() and raw.isdigit()):
                raise RouteError(400, "query parameter 'step' must be 'all' or a step number")
            step = int(raw)
    return Selection(run, worker, span, step)


def _number(args, name: str, kind=float, message: str = "") -> Optional[float]:
    raw = args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise RouteError(400, message) from None
    if kind is float and not np.isfinite(value):
        raise RouteError(400, message)
    return value


def _analyzer(ctx: RouteContext):
    if ctx.analyzer is None:
        raise RouteError(404, ctx.problem or "no logdir")
    return ctx.analyzer


def _unknown(analyzer, sel: Selection, label: str = "") -> RouteError:
    if analyzer.activity()[1] is None:  # not scanned yet: the name may well exist
        return _loading(0.0, scan="pending")
    return RouteError(404, f"{label}unknown {sel.describe()} (not among the runs found in the logdir)")


def _result(analyzer, sel: Selection, views: bool = False) -> dict:
    """The ready result of a selection (``Analyzer.result``; ``views``: with the
    summary's Operator view and kernel names); 202 while loading, 404 unknown names, 422
    when no file of it could be analysed."""
    try:
        result = analyzer.result(sel.run, sel.worker, sel.span, views=views)
    except KeyError:
        raise _unknown(analyzer, sel) from None
    if result["state"] == "loading":
        raise _loading(result["progress"])
    if result["state"] == "error":
        raise RouteError(422, state="error", error=result["error"], errors=result.get("errors", []))
    return result


def _span_states(analyzer, sel: Selection) -> list:
    """[(Worker, Span, SpanState)] of a selection; 202 before the first scan, 404 unknown names."""
    try:
        return analyzer.span_states(sel.run, sel.worker, sel.span)
    except KeyError:
        raise _unknown(analyzer, sel) from None


def _cache_key(route: str, sel: Selection) -> tuple:
    return (route, sel.run, sel.worker, sel.span)


def _json(request, body, status: int = 200, headers=None):
    return http_util.Respond(request, body, "application/json", code=status, headers=headers)


# ----------------------------------------------------------------------------- static


def _serve_index(ctx: RouteContext, request):
    return _static(ctx, request, "index.js")


def _serve_static(ctx: RouteContext, request):
    # request.path is percent-decoded: "..%2f" arrives as "../" and is refused below.
    m = _STATIC_ROUTE_RE.match(request.path)
    return _static(ctx, request, m.group(1) if m else "")


def _static(ctx: RouteContext, request, name: str):
    # Only plain file names directly in the frontend folder: no "..", no sub-paths,
    # no absolute paths, no backslashes, no hidden files, only known extensions.
    ext = posixpath.splitext(name)[1]
    if (len(name) > MAX_NAME_CHARS or not _STATIC_NAME_RE.match(name) or ".." in name
            or ext not in STATIC_TYPES):
        raise RouteError(404, "no such file")
    if ctx.read_static is None:
        raise RouteError(404, NO_DASHBOARD)
    data = ctx.read_static(name)
    if data is None:
        raise RouteError(404, "no such file")
    return http_util.Respond(request, data, STATIC_TYPES[ext])


# ----------------------------------------------------------------------------- data


def _serve_runs(ctx: RouteContext, request):
    """The run list, and ``cards``: the headline cards the dashboard renders (views/headline.py
    ``card_list``, declared in the metric units; static/cards.js has no list of its own)."""
    if ctx.analyzer is None:
        return _json(request, {"logdir": None, "runs": [], "default_run": None,
                               "scan": {"state": "error", "error": ctx.problem, "notes": []},
                               "cards": headline_view.card_list()})
    if request.args.get("rescan"):
        ctx.analyzer.rescan()
    return _json(request, {**ctx.analyzer.runs_view(), "cards": headline_view.card_list()})


def _serve_report(ctx: RouteContext, request):
    analyzer = _analyzer(ctx)
    sel = selection(request.args)
    result = _result(analyzer, sel)
    errors = result.get("errors") or []

    def build():
        body = dict(result["report"])
        if errors:
            body["file_errors"] = errors
        return body

    return ctx.bodies.respond(request, _cache_key("report", sel), result["report"], errors, build)


def _serve_findings(ctx: RouteContext, request):
    """METRICS.md §20: the selection's findings (views/findings.py), at most 8 KB; error
    lines with paths relative to the logdir."""
    analyzer = _analyzer(ctx)
    sel = selection(request.args)
    result = _result(analyzer, sel)
    errors = result.get("errors") or []

    def build():
        body = engine.result_findings(result, errors)
        body["errors"] = [ctx.relative(e) if isinstance(e, str) else e for e in body["errors"]]
        return body

    return ctx.bodies.respond(request, _cache_key("findings", sel), result["report"], errors, build, compact=True)


def _serve_memory(ctx: RouteContext, request):
    analyzer = _analyzer(ctx)
    sel = selection(request.args)
    result = _result(analyzer, sel)
    return ctx.bodies.respond(request, _cache_key("memory", sel), result["memory"], None,
                              lambda: result["memory"])


def _serve_kernels(ctx: RouteContext, request):
    analyzer = _analyzer(ctx)
    sel = selection(request.args)
    result = _result(analyzer, sel)
    return ctx.bodies.respond(request, _cache_key("kernels", sel), result["kernels"], None,
                              lambda: {"kernels": result["kernels"]})


def _serve_operators(ctx: RouteContext, request):
    """METRICS.md: Operator view. 400 for a group other than op/op_shape, 404 for a step
    the selection did not include, 422 naming why the view could not be made."""
    analyzer = _analyzer(ctx)
    sel = selection(request.args, with_step=True)
    group = request.args.get("group") or "op"
    if group not in ("op", "op_shape"):
        raise RouteError(400, "query parameter 'group' must be 'op' or 'op_shape'")
    result = _result(analyzer, sel, views=True)
    view = result.get("operator_view")
    if not isinstance(view, dict):
        # name the failing part (the span's or the run-level combine's error), not only the log
        failed = [e for e in ((result.get("report") or {}).get("errors") or []) + (result.get("view_errors") or [])
                  if isinstance(e, dict) and e.get("section") == "operator_view"]
        error = ("the operator view could not be computed for this selection: "
                 + "; ".join(str(e.get("error")) for e in failed) if failed else
                 "the operator view could not be computed for this selection (see the report's errors)")
        raise RouteError(422, state="error", error=error,
                         errors=[{"file": e.get("file"), "section": "operator_view", "error": str(e.get("error"))}
                                 for e in failed])
    if sel.step is not None and sel.step not in (view.get("steps") or []):
        what = "this selection has no per-step rows (several spans)" if not view.get("steps") \
            else "not one of the included steps"
        raise RouteError(404, f"unknown step {sel.step}: {what}")
    key = _cache_key("operators", sel) + ("all" if sel.step is None else str(sel.step), group)
    return ctx.bodies.respond(request, key, view, None, lambda: operators.view_table(view, sel.step, group))


def _serve_compare(ctx: RouteContext, request):
    """METRICS.md §11: 200 with the compare dict, 202 while either side is loading, 400
    for a missing run or a bad batch size, 404 for unknown names, 422 when a side has no
    analysable file."""
    analyzer = _analyzer(ctx)
    args = request.args
    picks = {side: selection(args, prefix=f"{side}_") for side in ("base", "cand")}
    batch = {}
    for side in ("base", "cand"):
        raw = args.get(f"{side}_batch_size") or args.get("batch_size")
        if raw:
            try:
                batch[side] = float(raw)
                if not batch[side] > 0:
                    raise ValueError
            except ValueError:
                raise RouteError(400, f"batch size must be a positive number, got {raw!r}") from None
    results, progress = {}, []
    for side, sel in picks.items():
        try:
            res = analyzer.result(sel.run, sel.worker, sel.span)
        except KeyError:
            raise _unknown(analyzer, sel, "baseline: " if side == "base" else "candidate: ") from None
        if res["state"] == "error":
            raise RouteError(422, state="error", side=side, error=res["error"], errors=res.get("errors", []))
        if res["state"] == "loading":
            progress.append(res["progress"])
        results[side] = res
    if progress:
        raise _loading(round(min(progress), 3))
    for side, sel in picks.items():
        if sel.worker is None and sel.span is None:  # a whole run: its rank view for the rank-spread rows
            spans = _span_states(analyzer, sel)
            if len({w.name for w, _, _ in spans}) >= 2:
                results[side] = dict(results[side], ranks=ranks_view.run_rank_view(sel.run, spans, analyzer.relative))
    body = compare_view.compare(results["base"], results["cand"], base_batch_size=batch.get("base"),
                                cand_batch_size=batch.get("cand"))
    for side in ("base", "cand"):
        # a count only: the messages name files, and the report route serves them per side
        body[side]["file_errors"] = len(results[side].get("errors") or [])
    return _json(request, body)


def _serve_ranks(ctx: RouteContext, request):
    """METRICS.md §12: the run's ranks side by side."""
    analyzer = _analyzer(ctx)
    whole_run = selection({"run": request.args.get("run")})  # worker and span of the query are not read
    spans = _span_states(analyzer, whole_run)
    states = [st for _, _, st in spans]
    if any(st.state in ("loading", "queued") for st in states):
        raise _loading(round(sum(st.progress for st in states) / max(1, len(states)), 3))
    return _json(request, ranks_view.run_rank_view(whole_run.run, spans, analyzer.relative))


# ----------------------------------------------------------------------------- timeline


def _timeline_store(analyzer, sel: Selection):
    """(Worker, Span, store) of the span a timeline request shows: the one holding the step
    asked for, else the slowest included step of the selection (`engine.span_to_show`).
    202 while loading (or while a lost store is rebuilt), 404 unknown names or steps, 422
    when no span is analysed or the span has no store or no step."""
    selected = _span_states(analyzer, sel)
    loading = [st for _, _, st in selected if st.state in ("queued", "loading")]
    if loading:
        raise _loading(round(sum(st.progress for st in loading) / len(loading), 3))
    ready = [(w, s, st) for w, s, st in selected if st.state == "ready" and st.result]
    if not ready:
        rel = analyzer.relative
        errors = [{"file": rel(s.url), "error": rel(st.error), "retry": st.retry}
                  for _, s, st in selected if st.error]
        raise RouteError(422, state="error", error=errors[0]["error"] if errors else "no trace files", errors=errors)
    w, s, st = engine.span_to_show(ready, sel.step,
                                   lambda span, state: analyzer.timelines.get(span.url, state.fingerprint))
    store = analyzer.timelines.get(s.url, st.fingerprint)
    if store is None:
        reason = analyzer.timelines.missing_reason(s.url, st.fingerprint)
        if reason is None and _analyse_again(analyzer, sel.run, s):
            # built once, gone now (an unreadable or evicted .timeline.npz): analysed again
            raise _loading(0.0)
        raise RouteError(422, state="error", error="the step timeline is not available for this span: "
                         + (reason or engine.NO_STORE_RETURNED), errors=[])
    index = tw.step_index(store, sel.step)
    if index is None:
        raise RouteError(422, state="error", error="this span has no step", errors=[])
    if sel.step is not None and index < 0:
        raise RouteError(404, f"unknown step {sel.step} in this span")
    return w, s, store


def _analyse_again(analyzer, run: str, span) -> bool:
    """Queue ``span`` for a new analysis (the engine's ``Analyzer.reanalyze``); False when the
    analyzer cannot (an older or injected one) or the span is not ready any more."""
    again = getattr(analyzer, "reanalyze", None)
    if again is None:
        return False
    try:
        return bool(again(run, span))
    except Exception:  # noqa: BLE001 - the 422 after it still names the cause
        log.exception("bottlenecks: queueing %s for a new analysis failed", getattr(span, "url", span))
        return False


def json_text(body: dict):
    """The JSON text of an answer whose numbers are all finite (no NaN walk needed); the
    dict itself, for TensorBoard's cleansing encoder, when one is not."""
    try:
        return json.dumps(body, ensure_ascii=True, allow_nan=False)
    except ValueError:
        return body


def _serve_timeline(ctx: RouteContext, request):
    """METRICS.md: Step timeline. 200 with one level-of-detail window
    (analysis/timeline.window), 400 for bad numbers."""
    analyzer = _analyzer(ctx)
    args = request.args
    sel = selection(args, with_step=True)
    w, s, store = _timeline_store(analyzer, sel)
    bad = "t0 and t1 must be numbers (µs from the step start), px a whole number"
    t0, t1 = _number(args, "t0", float, bad), _number(args, "t1", float, bad)
    px = _number(args, "px", int, bad)
    body = tw.window(store, sel.step, t0, t1, px=px or TIMELINE_PX, cap=tw.DEFAULT_CAP)
    body["worker"], body["span"] = w.name, s.name
    body["has_gpu"] = bool(np.any(store["row_kind"] == tw.ROW_GPU))
    body["spans"] = [{"worker": ww.name, "span": ss.name} for ww, ss, _ in _span_states(analyzer, sel)]
    return _json(request, json_text(body))


def _serve_step_trace(ctx: RouteContext, request):
    """The step's events (those overlapping [t0, t1] µs from the step start when given)
    as a Chrome trace to download, at most analysis.timeline.EXPORT_MAX_EVENTS of them
    (the cut, and a trace without steps, said in otherData.note)."""
    analyzer = _analyzer(ctx)
    args = request.args
    sel = selection(args, with_step=True)
    w, _, store = _timeline_store(analyzer, sel)
    bad = "t0 and t1 must be numbers (µs from the step start)"
    t0, t1 = _number(args, "t0", float, bad), _number(args, "t1", float, bad)
    doc = tw.chrome_trace(store, sel.step, t0, t1)
    other = doc["otherData"]
    what = f"step{other['step']}" if other["steps_found"] else "whole-trace"
    w0, w1 = other["window_us"]
    if w0 > 0 or w1 < other["step_end_us"] - other["step_start_us"]:  # a zoomed window
        what += f"-{w0:.0f}-{w1:.0f}us"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{sel.run}-{w.name}-{what}")
    filename = safe[:120] + ".trace.json"
    return _json(request, doc, headers=[("Content-Disposition", f'attachment; filename="{filename}"')])


# ----------------------------------------------------------------------------- apps

# path -> (handler, status of an unexpected exception): 422 where the data of a run cannot
# be shown, 503 where the service itself failed. Never 500.
ROUTES: Dict[str, tuple] = {
    "/index.js": (_serve_index, 503),
    "/static/*": (_serve_static, 503),
    "/runs": (_serve_runs, 503),
    "/report": (_serve_report, 422),
    "/findings": (_serve_findings, 422),
    "/memory": (_serve_memory, 422),
    "/kernels": (_serve_kernels, 422),
    "/compare": (_serve_compare, 422),
    "/ranks": (_serve_ranks, 422),
    "/timeline": (_serve_timeline, 422),
    "/step_trace": (_serve_step_trace, 422),
    "/operators": (_serve_operators, 422),
}


def plugin_apps(context: Callable[[], RouteContext]) -> Dict[str, Callable]:
    """TensorBoard's ``get_plugin_apps``: one guarded WSGI app per route. ``context`` is
    called per request (the plugin's analyzer may be replaced after the apps are built)."""
    return {path: _guarded(handler, path, status, context) for path, (handler, status) in ROUTES.items()}


def _guarded(handler, route: str, failure_status: int, context: Callable[[], RouteContext]):
    """One route's WSGI app: GET/HEAD only (405 with a JSON body otherwise); a RouteError
    becomes its answer, and an unexpected exception a logged JSON error (``failure_status``:
    422 for data routes, this view of this run cannot be shown; 503 for the others),
    never a 500 that takes the tab down."""

    def wsgi(environ, start_response):
        request = wrappers.Request(environ)
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method not in _ALLOWED_METHODS:
            response = _json(request, {"error": f"method {method[:20]} not allowed here (GET or HEAD only)"}, 405)
            response.headers["Allow"] = ", ".join(_ALLOWED_METHODS)
            return response(environ, start_response)
        ctx = None
        try:
            ctx = context()
            response = handler(ctx, request)
        except RouteError as exc:
            response = _json(request, exc.body, exc.status)
        except Exception as exc:  # noqa: BLE001 - the tab must keep answering
            log.exception("bottlenecks: %s failed", route)
            message = f"internal error while answering {route.strip('/')}: {type(exc).__name__}: {exc}"
            body: Dict[str, Any] = {"error": (ctx.relative(message) if ctx is not None else message)[:2000]}
            if failure_status == 422:
                body["state"] = "error"
            response = _json(request, body, failure_status)
        return response(environ, start_response)

    wsgi.__name__ = getattr(handler, "__name__", "route")
    return wsgi


__all__: List[str] = ["EncodedBodies", "MAX_NAME_CHARS", "MAX_RUN_CHARS", "ROUTES", "RouteContext", "RouteError",
                      "Selection", "json_text", "plugin_apps", "selection"]
