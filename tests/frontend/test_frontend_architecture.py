"""The frontend's shape (tb_bottleneck_plugin/static/, issue 19 item 3), read from the sources:
one data module (model.js is the only one that fetches), one router (router.js is the only one
that touches window.location / history), one loader (states.js `load`: no other module calls
renderLoading) and one way to mount a panel (panels.js `mountPanel`: no other module builds a
panel <section>, and every module that makes a panel mounts it through mountPanel or
registerPanel)."""
import re
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "tb_bottleneck_plugin" / "static"
JS = sorted(STATIC.glob("*.js"))


def _code(path):
    """The module without comments and with its string, template and regex literals emptied
    (so that a word in a message is not read as code)."""
    js = path.read_text(encoding="utf-8")
    out, i, n, prev = [], 0, len(js), ""  # prev: the last character of code that is not a space
    while i < n:
        c = js[i]
        if js.startswith("//", i):
            i = js.find("\n", i) if js.find("\n", i) >= 0 else n
        elif js.startswith("/*", i):
            i = js.index("*/", i) + 2
        elif c in "\"'`" or (c == "/" and (not prev or prev in "(,=:[!&|?{};+-*%<>~^")):
            j, in_class = i + 1, False
            while j < n and (js[j] != c or in_class):
                if c == "/" and js[j] in "[]":
                    in_class = js[j] == "["
                j += 2 if js[j] == "\\" else 1
            out.append(c + c)
            i, prev = j + 1, c
        else:
            out.append(c)
            i += 1
            prev = c if not c.isspace() else prev
    return "".join(out)


CODE = {p.name: _code(p) for p in JS}


def _using(pattern):
    return sorted(name for name, code in CODE.items() if re.search(pattern, code))


def test_the_stripper_keeps_code_and_drops_strings():
    assert "fetch(" in CODE["model.js"] and "window.location" in CODE["router.js"]
    assert _code(STATIC / "states.js").count('""') > 5  # the literals are emptied, not kept
    for name, code in CODE.items():  # nothing of a literal is left over to unbalance the code
        assert [code.count(a) - code.count(b) for a, b in ("{}", "()", "[]")] == [0, 0, 0], name


def test_only_model_js_fetches():
    assert _using(r"\bfetch\s*\(|XMLHttpRequest|\bEventSource\b|\bsendBeacon\b") == ["model.js"]


def test_only_the_router_reads_or_writes_the_address():
    assert _using(r"\blocation\b|\bhistory\s*\.|\bhashchange\b|\bpopstate\b") == ["router.js"]
    # and index.js, which owns the state, is the router's one user
    assert _importers("router.js") == ["index.js"]


def _importers(module):
    out = []
    for p in JS:
        src = p.read_text(encoding="utf-8")
        if re.search(r'^import[^;]*from\s*"\./(?:static/)?' + re.escape(module) + '";', src, re.M):
            out.append(p.name)
    return sorted(out)


def test_every_wait_on_a_route_goes_through_the_one_loader():
    """states.js load() shows the loading state, the route's progress and its error; nothing
    else draws a loading state or wires progress, except index.js's run-list states (the run
    list is re-read on a timer: a list that changes, not a 202 answer to wait for)."""
    assert _using(r"\brenderLoading\s*\(") == ["index.js", "states.js"]
    assert _using(r"\bonProgress\b") == ["model.js", "states.js"]
    loaders = _using(r"\bload(?:Route)?\s*\(\s*[\w.]+\s*,")
    assert {"index.js", "compare.js", "ranks.js", "memory_view.js", "kernel_table.js", "timeline.js", "operators.js"} <= set(loaders), loaders


# The modules that make panels: the report's (views.js and the panels it places), compare mode's,
# the Ranks panel, the offline page's Operators section and the registered panels.
PANEL_MAKERS = {"views.js", "memory_view.js", "kernel_table.js", "recommendations.js", "compare.js", "ranks.js",
                "report_page.js", "index.js", "timeline.js", "roofline.js", "source_view.js", "compilation_view.js",
                "collectives_view.js", "operators.js"}


def test_every_panel_is_mounted_one_way():
    raw = {p.name: p.read_text(encoding="utf-8") for p in JS}
    # only panels.js builds a panel's <section> or its header / body element (reading one,
    # querySelector("#bn-cmp-cards .panel-body"), is fine)
    hand_made = r'h\(\s*"section"|h\(\s*"(?:div|header)"\s*,\s*\{\s*class:\s*"panel-(?:head|body)"'
    assert sorted(n for n, src in raw.items() if re.search(hand_made, src)) == ["panels.js"]
    assert not _using(r"\bfunction\s+panel\s*\(")  # no second panel builder under the old name
    for name in sorted(PANEL_MAKERS):
        assert re.search(r"\b(?:mountPanel|mountRegistered|mountRegisteredPanels|registerPanel)\s*\(", CODE[name]), \
            f"{name} makes a panel without panels.js"
