"""Fast static checks of the dashboard (tb_bottleneck_plugin/static/) and of its mock server.

No browser here: these read the source files and call the mock server's
routes over HTTP. They guard the rules TensorBoard's iframe imposes (CSP,
relative URLs, the index.js/static/ import layout) and the XSS rule
(trace strings are always text).
"""
import json
import os
import re
import urllib.error
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRONTEND = os.path.join(REPO, "tb_bottleneck_plugin", "static")
FIXTURES = os.path.join(REPO, "tests", "fixtures")

SVG_NS = "http://www.w3.org/2000/svg"  # an XML namespace name, never fetched


def _files(*exts):
    out = []
    for name in sorted(os.listdir(FRONTEND)):
        if name.endswith(exts):
            out.append(os.path.join(FRONTEND, name))
    return out


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _strip_comments(js):
    js = re.sub(r"/\*.*?\*/", "", js, flags=re.S)
    return re.sub(r"(^|[^:\\])//[^\n]*", r"\1", js)


JS = _files(".js")
CSS = _files(".css")


def test_frontend_has_the_expected_modules():
    names = {os.path.basename(p) for p in JS + CSS}
    assert {"index.js", "model.js", "panels.js", "views.js", "cards.js", "charts.js", "dom.js", "style.css"} <= names


@pytest.mark.parametrize("path", JS + CSS, ids=os.path.basename)
def test_no_external_urls(path):
    text = _read(path).replace(SVG_NS, "")
    hits = re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[a-z]{2,}[^\s\"'`)]*", _strip_comments(text) if path.endswith(".js") else text)
    assert not [h for h in hits if h.startswith(("http", "//"))], hits
    assert "http://" not in text and "https://" not in text
    # CSS: no @import of remote sheets, no url() outside data:
    if path.endswith(".css"):
        for m in re.finditer(r"url\(([^)]*)\)", text):
            assert m.group(1).strip("'\" ").startswith("data:"), m.group(0)


@pytest.mark.parametrize("path", JS, ids=os.path.basename)
def test_no_html_parsing_sinks(path):
    code = _strip_comments(_read(path))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "createContextualFragment",
                 "DOMParser", "srcdoc"):
        assert sink not in code, f"{os.path.basename(path)} uses {sink}"
    assert not re.search(r"\beval\s*\(|new\s+Function\s*\(", code)
    # String event handlers would be code: handlers are functions (see dom.js).
    assert not re.search(r"setAttribute\(\s*[\"']on", code)


def _imports(code):
    pat = r"""(?:^|\n)\s*(?:import|export)\s[^;]*?from\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)"""
    return [a or b for a, b in re.findall(pat, code)]


@pytest.mark.parametrize("path", JS, ids=os.path.basename)
def test_imports_are_relative_and_resolve(path):
    """index.js is served at <base>/index.js, the rest at <base>/static/<file>."""
    name = os.path.basename(path)
    specs = _imports(_read(path))
    for spec in specs:
        assert spec.startswith("./"), f"{name}: import {spec!r} is not relative"
        if name == "index.js":
            assert spec.startswith("./static/"), f"index.js must import './static/<file>', got {spec!r}"
            target = spec[len("./static/"):]
        else:
            assert "static/" not in spec, f"{name}: modules under static/ import siblings as './x.js', got {spec!r}"
            target = spec[2:]
        assert "/" not in target and os.path.isfile(os.path.join(FRONTEND, target)), f"{name}: {spec!r} does not exist"
    if name == "index.js":
        assert specs, "index.js imports its modules"


def test_index_exports_render():
    code = _read(os.path.join(FRONTEND, "index.js"))
    assert re.search(r"export\s+async\s+function\s+render\s*\(", code)
    # The stylesheet is loaded relative to the module, not from an absolute path.
    assert "./static/style.css" in code


@pytest.mark.parametrize("path", JS, ids=os.path.basename)
def test_fetches_use_relative_urls(path):
    code = _strip_comments(_read(path))
    for m in re.finditer(r"fetch\(\s*([\"'`])([^\"'`]*)", code):
        assert not m.group(2).startswith("/"), m.group(0)
    assert "/data/plugin" not in code


def test_no_html_files_with_inline_script():
    for path in _files(".html"):
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", _read(path), flags=re.I), path


# ---------------------------------------------------------------- fixture


def test_sample_report_fixture():
    """sample_report.json is the real report of demo_logs' V100 ResNet-50 num_workers=0 span
    (recorded by record_route_fixtures.py; tests/routes/test_route_schema.py checks it against the
    backend). These are the public numbers of that trace (metrics.md, the oracles)."""
    rep = json.loads(_read(os.path.join(FIXTURES, "sample_report.json")))
    assert rep["schema_version"] == 1
    assert rep["run"] == "resnet50_v100_nw0" and rep["span"] == "1623143089861"
    assert rep["input"]["input_bound_pct"] == pytest.approx(33.4, abs=0.05)
    assert rep["gpu"]["0"]["utilization_pct"] == pytest.approx(55.5, abs=0.05)
    assert rep["tensor_cores"]["tensor_core_pct"] == 0
    assert rep["tensor_cores"]["eligible_not_using_pct"] == pytest.approx(67.6, abs=0.05)
    assert set(rep["breakdown_pct"]) == {"kernel", "memcpy", "memset", "communication", "runtime",
                                         "dataloader", "cpu_exec", "other"}
    for row in rep["breakdown_per_step"]:
        assert sum(row[k] for k in rep["breakdown_pct"]) == pytest.approx(row["total_us"], rel=1e-6)
    assert rep["recommendations"] and all({"rule", "severity", "title", "action", "evidence"} <= set(r)
                                          for r in rep["recommendations"])


def test_recorded_responses_cover_what_the_frontend_shows():
    data = json.loads(_read(os.path.join(FIXTURES, "route_responses.json")))
    responses = data["responses"]
    kernels = [k["name"] for k in responses["kernels?run=xss&worker=worker0&span=1700000000001"]["body"]["kernels"]]
    assert "<img src=x onerror=alert(1)>" in kernels
    v100 = responses["memory?run=resnet50_v100_nw0&worker=worker0&span=1623143089861"]["body"]["devices"]
    assert len(v100["cuda:0"]["ts_us"]) == len(v100["cuda:0"]["allocated_bytes"]) > 10
    statuses = {v["status"] for v in responses.values()}
    assert {200, 202, 400, 404, 422} <= statuses


# ---------------------------------------------------------------- mock server


@pytest.fixture(scope="module")
def mock(frontend_mock):
    return frontend_mock


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_mock_server_routes(mock):
    p = mock + "/data/plugin/bottlenecks/"
    st, hd, body = _get(p + "index.js")
    assert st == 200 and hd["Content-Type"].startswith("text/javascript") and b"render" in body
    st, hd, _ = _get(p + "static/style.css")
    assert st == 200 and hd["Content-Type"].startswith("text/css")
    st, hd, _ = _get(p + "static/views.js")
    assert st == 200 and hd["X-Content-Type-Options"] == "nosniff"
    assert _get(p + "static/../setup.py")[0] == 404
    assert _get(p + "static/%2e%2e/setup.py")[0] == 404
    st, hd, body = _get(mock + "/data/plugin_entry.html?name=bottlenecks")
    assert st == 200 and "default-src 'self'" in hd["Content-Security-Policy"]
    assert b'<base href="plugin/bottlenecks/">' in body and b"<script type=\"module\" src=" in body

    # The mock replays the recorded answers of the real plugin, byte for byte in JSON terms.
    recorded = json.loads(_read(os.path.join(FIXTURES, "route_responses.json")))["responses"]
    runs = json.loads(_get(p + "runs")[2])
    states = {r["run"]: r["state"] for r in runs["runs"]}
    assert states["resnet50_v100_nw0"] == "ready" and states["still_loading"] == "loading"
    for key in ("report?run=resnet50_v100_nw0&worker=worker0&span=1623143089861",
                "report?run=still_loading&worker=worker0&span=1700000000000",
                "report?run=no_such_run",
                "report?run=partly_broken&worker=worker0&span=1795283141093437397",
                "report?run=partly_broken&worker=worker0",
                "kernels?run=xss&worker=worker0&span=1700000000001",
                "memory?run=resnet50_v100_nw0&worker=worker0&span=1623143089861"):
        st, _, body = _get(p + key)
        assert st == recorded[key]["status"] and json.loads(body) == recorded[key]["body"], key
    # span=all is how the dashboard names a summary: the worker summary
    st, _, body = _get(p + "report?run=input_bound_nw0&worker=worker0&span=all")
    assert st == 200 and json.loads(body)["span"] is None
    assert json.loads(_get(p + "report?run=partly_broken&worker=worker0")[2])["file_errors"]


# ---------------------------------------------------------------- issue 11: one place for data and verdicts


def _threshold_values():
    """Every module-level constant of thresholds.py with its value (evaluated from the source,
    so `1 << 30` counts as 1073741824)."""
    import ast

    src = _read(os.path.join(REPO, "tb_bottleneck_plugin", "thresholds.py"))
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.isupper():
            value = eval(compile(ast.Expression(node.value), "thresholds.py", "eval"), {})
            if isinstance(value, dict):  # a table of factors per GPU generation: not a threshold
                continue                   # a view could compare with
            out[node.targets[0].id] = float(value)
    return out


_NUM = r"(?:\d+(?:\.\d+)?(?:e\d+)?(?:\s*(?:\*\*|<<)\s*\d+)?)"
_CMP = r"(?:<=|>=|===|!==|==|!=|(?<![<])<(?![<=])|(?<![=>-])>(?![>=]))"  # not =>, <<, >>
_CMP_LITERAL = re.compile(rf"{_CMP}\s*\(?\s*-?({_NUM})(?![\w.])|(?<![\w.])({_NUM})\s*\)?\s*{_CMP}")


def _literal_value(text):
    text = text.replace(" ", "")
    if "**" in text:
        a, b = text.split("**")
        return float(a) ** float(b)
    if "<<" in text:
        a, b = text.split("<<")
        return float(int(float(a)) << int(b))
    return float(text)


def test_threshold_values_parse():
    vals = _threshold_values()
    assert vals["INPUT_BOUND_HIGH_PCT"] == 20.0 and vals["SLACK_MIN_RESERVED_BYTES"] == 2.0 ** 30
    assert len(vals) >= 20
    # the literal finder sees the forms a threshold could take in JS
    for js, v in (("x >= 30", 30.0), ("x<2 ** 30", 2.0 ** 30), ("(1 << 20) <= y", 2.0 ** 20), ("if (p > 0.8)", 0.8),
                  ("a === 5", 5.0), ("5.0 < b", 5.0)):
        found = [_literal_value(a or b) for a, b in _CMP_LITERAL.findall(js)]
        assert v in found, (js, found)
    assert not _CMP_LITERAL.findall("const x = f(30); y.toFixed(2); arr[20]; x => 5")


@pytest.mark.parametrize("path", JS, ids=os.path.basename)
def test_no_threshold_of_thresholds_py_as_a_comparison_literal(path):
    """Issue 11 item 2: verdicts are decided on the server (verdicts.py from thresholds.py) and
    travel in report.verdicts; the frontend compares no number against any thresholds.py value
    (e.g. the old `slack >= 30` in views.js). Comments are ignored."""
    values = _threshold_values()
    by_value = {}
    for name, v in values.items():
        by_value.setdefault(v, []).append(name)
    code = _strip_comments(_read(path))
    hits = []
    for lineno, line in enumerate(code.splitlines(), 1):
        for a, b in _CMP_LITERAL.findall(line):
            v = _literal_value(a or b)
            # the small counts 0-3 (plurals, "more than one device") are not thresholds, as in the
            # backend's twin check (tests/judge/test_units_verdicts.py); GAIN_INFO_PCT is 1
            if v in by_value and v not in (0.0, 1.0, 2.0, 3.0):
                hits.append(f"{os.path.basename(path)}:{lineno}: {line.strip()[:120]}  (= {'/'.join(by_value[v])})")
    assert not hits, "\n".join(hits)
    # nor under a threshold-like name (a renamed copy of a threshold)
    for m in re.finditer(r"\bconst\s+([A-Z][A-Z0-9_]*_(?:PCT|US|BYTES|RISES|RATIO))\s*=\s*([\d.e<* ]+)[;,\n]", code):
        assert _literal_value(m.group(2).strip()) not in by_value, m.group(0)


def test_only_the_data_module_fetches():
    """Issue 11 item 4: static/model.js is the one module that talks to the routes; view
    builders get data from it (ctx.data / model functions), never fetch themselves."""
    for path in JS:
        name = os.path.basename(path)
        code = _strip_comments(_read(path))
        if name == "model.js":
            assert re.search(r"\bfetch\(", code)
            continue
        assert not re.search(r"\bfetch\(|XMLHttpRequest|\bgetJson\(|\bpollJson\(", code), f"{name} fetches"


def test_views_are_split_and_cards_come_from_descriptors():
    for path in JS:
        n = len(_read(path).splitlines())
        assert n <= 800, f"{os.path.basename(path)} has {n} lines (split files over ~800)"
    cards = _read(os.path.join(FRONTEND, "cards.js"))
    # cards.js lists no card: the list (ids, order, labels, units) is the server's (the runs
    # answer's `cards`, views/headline.py card_list from the metric units); what it keeps per
    # id (EXTRAS: detail lines, sublabels, hover text) is for cards the server declares.
    # A verdict the list does not name is still shown (cards.js genericDescriptor).
    assert not re.search(r'^\s+id: "[a-z_]+",', cards, flags=re.M) and "CARDS" not in cards
    assert not re.search(r'^\s+label: "', cards, flags=re.M) and "setCards" in cards
    extras = cards.split("const EXTRAS = {", 1)[1].split("\n};", 1)[0]
    ids = re.findall(r"^  ([a-z_]+): \{", extras, flags=re.M)
    from tb_bottleneck_plugin.judge import cards as judge_cards
    from tb_bottleneck_plugin.analysis import registry
    from tb_bottleneck_plugin.views import headline

    server_cards = set(judge_cards.CARDS) | {card for u in registry.UNITS for card in u.cards}
    listed = [c["id"] for c in headline.card_list()]
    assert ids and set(ids) <= set(listed) <= server_cards, (ids, listed, server_cards)
    assert len(ids) == len(set(ids)) and len(listed) == len(set(listed)) and "genericDescriptor" in cards
    # colours come from the verdict's severity word only
    assert "severityClass(v.severity)" in cards and "ruleSeverity" not in cards
