"""The single-file HTML report: `tb-bottlenecks report PATH --html FILE` (and `diff`/`check
--html`). One self-contained page that opens from disk: the dashboard's own stylesheet
(static/style.css) and its own ES modules (static/report_page.js and what it imports: the
cards, recommendations, step breakdown, kernel, memory, operator and compare views) inlined
at write time, and the data (the same report objects the CLI prints with ``--json``, the
kernel table, memory curves and operator tables) embedded as JSON. No network, no CDN, no
server: nothing is fetched (report_page.js answers the views' data calls from the page).

The modules are joined into one ``<script type="module">`` by `bundle`, a tiny linker for
the dashboard's own import style (``import {a, b as c} from "./x.js";``, ``export function``
/ ``export const``): each module becomes a function scope returning its exports, in
dependency order. Every trace string reaches the page only as JSON data, shown by dom.js
as text (never parsed as HTML); `</script` and `<!--` cannot end or bend the data block
because ``<``, ``>`` and ``&`` are written as JSON escapes.
"""
from __future__ import annotations

import datetime
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import headline

ENTRY = "report_page.js"
_IMPORT_RE = re.compile(r"^import\s*(?:\{([^}]*)\}\s*from\s*)?\"\./([A-Za-z0-9_]+\.js)\";[ \t]*$", re.M | re.S)
_REEXPORT_RE = re.compile(r"^export\s*\{([^}]*)\}\s*from\s*\"\./([A-Za-z0-9_]+\.js)\";[ \t]*$", re.M)
_EXPORT_RE = re.compile(r"^export\s+(?:async\s+)?(?:function\*?|const|let|class)\s+([A-Za-z_$][\w$]*)", re.M)


def _static_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "static"


def _static_text(name: str) -> str:
    """A file of the dashboard (static/, next to this module)."""
    return (_static_dir() / name).read_text(encoding="utf-8")


def _names(spec: str) -> List[Tuple[str, str]]:
    """'a, b as c' -> [("a", "a"), ("b", "c")]."""
    out = []
    for part in spec.split(","):
        part = " ".join(part.split())
        if not part:
            continue
        name, _, alias = part.partition(" as ")
        out.append((name.strip(), (alias or name).strip()))
    return out


def _var(module: str) -> str:
    return "__bn_" + module[:-3]


def bundle(entry: str = ENTRY, read=_static_text) -> str:
    """The module ``entry`` and every module it imports (transitively) as one module
    script: each module's body in its own function scope, imports turned into reads of
    the imported module's exports object, in dependency order."""
    order: List[str] = []
    sources: Dict[str, str] = {}

    def visit(name: str, stack: Tuple[str, ...]) -> None:
        if name in sources:
            return
        if name in stack:
            raise ValueError(f"import cycle through {name}")
        text = read(name)
        sources[name] = text
        for m in _IMPORT_RE.finditer(text):
            visit(m.group(2), stack + (name,))
        for m in _REEXPORT_RE.finditer(text):
            visit(m.group(2), stack + (name,))
        order.append(name)

    visit(entry, ())
    parts = ["// The Bottlenecks dashboard's modules (tb_bottleneck_plugin/static), joined by html_report.bundle."]
    for name in order:
        text = sources[name]
        own = [f"{n}" for n in _EXPORT_RE.findall(text)]  # export function/const/let/class NAME

        def imp(m):
            if m.group(1) is None:  # a side-effect import: the module ran already (dependency order)
                return ""
            pairs = ", ".join(n if n == a else f"{n}: {a}" for n, a in _names(m.group(1)))
            return f"const {{{pairs}}} = {_var(m.group(2))};"

        def reexport(m):  # export {a, b as c} from "./x.js": read from x's exports object
            own.extend(f"{a}: {_var(m.group(2))}.{n}" for n, a in _names(m.group(1)))
            return ""

        body = _IMPORT_RE.sub(imp, _REEXPORT_RE.sub(reexport, text))
        body = re.sub(r"^export\s+(?=(?:async\s+)?(?:function|const|let|class)\b)", "", body, flags=re.M)
        leftover = re.search(r"^\s*(?:import|export)\b.*$", body, re.M)
        if leftover:
            raise ValueError(f"{name}: cannot inline {leftover.group(0).strip()!r}")
        parts.append(f"// ---- {name}\nconst {_var(name)} = (() => {{\n{body}\nreturn {{{', '.join(own)}}};\n}})();")
    return "\n".join(parts) + "\n"


def _json_for_script(value) -> str:
    """JSON text safe inside a <script> element: no '<', '>' or '&' (so no '</script>' or
    '<!--'), and the two line separators JavaScript once refused in string literals."""
    text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _text(value: str) -> str:
    return (str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


# ---------------------------------------------------------------------------- the data


def view_of(result: dict, label: str, view_id: str) -> dict:
    """One selectable view of the page from a span result or a `combine_results` summary
    (with its views): the report, the kernel table, memory curves, operator tables."""
    from ..analysis import operators

    op_view = result.get("operator_view")
    tables = None
    if isinstance(op_view, dict):
        tables = {}
        for group in ("op", "op_shape"):
            table = operators.view_table(op_view, None, group)
            table = dict(table, steps=[])  # per-step tables stay in the tab: "All steps" only
            tables[group] = table
    return {"id": view_id, "label": label, "report": result.get("report"), "kernels": result.get("kernels"),
            "memory": result.get("memory"), "operators": tables,
            "operators_na": None if tables else "the operator view could not be computed for this selection"}


def run_views(logdir, results: Dict[str, dict]) -> List[dict]:
    """One view per run of a CLI `report`: a single span's own result, else the run's
    summary over all its analysed spans (`report.combine_results`, the tab's run summary)."""
    from .. import report
    from . import text_report

    views = []
    for i, run in enumerate(logdir.runs):
        ready = [results[s.url] for w in run.workers for s in w.spans if s.url in results]
        if not ready:
            continue
        result = ready[0] if len(ready) == 1 else report.combine_results(ready, run=run.name)
        name = text_report._run_name(run, logdir)  # a run at the root of PATH: the directory's name
        label = name if len(ready) == 1 else f"{name} (summary of {len(ready)} trace files)"
        view = view_of(result, label, f"run{i}")
        if len(run.workers) > 1 and len(ready) > 1:
            view.update(ranks_of(run, results))
        views.append(view)
    return views


def ranks_of(run, results: Dict[str, dict]) -> dict:
    """The Ranks view of a run of several workers (the tab's ranks route body,
    ranks.rank_view, as `report --json` puts it under the run) and each worker's own
    report (the panel's "Cards per rank"): {"ranks": ..., "rank_reports": {worker: report}}."""
    from . import ranks
    from .. import report

    by_worker = {w.name: [results[s.url] for s in w.spans if s.url in results] for w in run.workers}
    view = ranks.rank_view(by_worker)
    missing = sorted((w for w, rs in by_worker.items() if not rs), key=ranks._natural_key)
    if missing:
        view["not_available"]["ranks.workers"] = f"no analysed span for worker(s) {', '.join(missing)}"
    view["run"] = run.name
    per_worker = {}
    for w, ready in by_worker.items():
        if ready:
            per_worker[w] = (ready[0]["report"] if len(ready) == 1 else
                             report.combine_results(ready, run=run.name, worker=w, views=False)["report"])
    return {"ranks": ranks._clean(view), "rank_reports": per_worker}


def page_data(kind: str, views: List[dict], *, title: str, compare: Optional[dict] = None,
              check: Optional[dict] = None, errors=()) -> dict:
    from .. import __version__

    return {"kind": kind, "title": title, "tool": f"tb_bottleneck_plugin {__version__}",
            "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z").strip(),
            "views": views, "compare": compare, "check": check, "errors": list(errors),
            "cards": headline.card_list()}  # the dashboard's card list, as the runs route sends it


def render(data: dict) -> str:
    """The whole page: style.css, the data, the bundled modules."""
    css = _static_text("style.css")
    script = bundle()
    if re.search(r"</script", script, re.I) or re.search(r"</style", css, re.I):
        raise ValueError("the dashboard's code contains a closing tag that cannot be inlined")
    title = _text(data.get("title") or "Bottlenecks report")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            # nothing may be fetched: the page carries everything it shows
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
            f"<title>{title}</title>\n<style>\n{css}\n</style>\n</head>\n"
            "<body class=\"bn\">\n<noscript>This report needs JavaScript to show its data.</noscript>\n"
            f"<script type=\"application/json\" id=\"bn-data\">{_json_for_script(data)}</script>\n"
            f"<script type=\"module\">\n{script}</script>\n</body>\n</html>\n")


def write_html(path: str, data: dict) -> int:
    """Writes the page to a local ``path``; returns its size in bytes."""
    text = render(data)
    raw = text.encode("utf-8")
    Path(path).write_bytes(raw)
    return len(raw)


def read_page_data(text: str) -> dict:
    """The data embedded in a page written by `render` (tests, tools)."""
    m = re.search(r'<script type="application/json" id="bn-data">(.*?)</script>', text, re.S)
    if not m:
        raise ValueError("no embedded report data")
    return json.loads(m.group(1))


def write_html_report(html_path: str, data: dict) -> Optional[str]:
    """Writes the HTML report for the CLI (``--html FILE``): None, or the one-line reason it failed."""
    try:
        size = write_html(html_path, data)
    except OSError as exc:
        return f"--html {html_path}: {exc.strerror or exc}"
    print(f"tb-bottlenecks: wrote {html_path} ({size / 1024:.0f} KiB)", file=sys.stderr)
    return None
