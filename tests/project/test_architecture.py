"""The layout rules of docs/ARCHITECTURE.md, checked on the code itself.

- No import cycle among the runtime package's modules (a static graph of module-level
  imports: what runs when a module is imported; imports inside functions are lazy and
  do not count).
- plugin_loader.py (TensorBoard imports it at start-up) pulls in nothing beyond
  TensorBoard's base_plugin and the package's empty __init__.
- analysis/ (the maths) imports nothing of the later stages (judge/, report, views/,
  serving/, plugin, cli, api), not even inside a function: judging builds on the maths.
- The runtime package never imports torch or the demo generator (tb_bottleneck_demo), at
  module level or lazily, except `tb-bottlenecks demo` in cli.py; the demo depends on the
  runtime package, not the reverse.
- The dashboard's files are found next to plugin.py via __file__, from any working directory.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PKG = REPO / "tb_bottleneck_plugin"
DEMO_PKG = REPO / "tb_bottleneck_demo"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: Path):
    return {_module_name(p): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(node) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module_level_only: bool):
    """(imported module name, line) for every import in the file; with module_level_only,
    only those that run on import (not inside def/lambda bodies, not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if module_level_only and isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            visit_stmt(child)

    def visit_stmt(child):
        if isinstance(child, ast.Import):
            out.extend((a.name, child.lineno) for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                base = package.split(".")
                base = base[:len(base) - (child.level - 1)]
                mod = ".".join(base + ([child.module] if child.module else []))
            else:
                mod = child.module
            out.append((mod, child.lineno))
            # `from pkg import submodule` imports pkg.submodule too
            out.extend((f"{mod}.{a.name}", child.lineno) for a in child.names)
        visit(child)

    visit(tree)
    return out


def _graph(modules, module_level_only: bool = True):
    """module -> set of package modules it imports (at module level, or with
    module_level_only=False inside functions too), with the parents a submodule import runs:
    importing a.b.c runs a/__init__ and a/b/__init__ first. A module's own package is no edge."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for imported, _ in _imports(path, module_level_only=module_level_only):
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in modules and target != name and not name.startswith(target + "."):
                    edges.add(target)
        graph[name] = edges
    return graph


def _find_cycle(graph):
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack = []

    def dfs(node):
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's __init__ imported by its own submodule is no cycle of the
            # interpreter's (the package is already in sys.modules): skip parent edges.
            if node.startswith(nxt + "."):
                continue
            if colour[nxt] == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if colour[nxt] == WHITE:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            found = dfs(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    """The checker itself can fail: a -> b -> c -> a is reported, a DAG is not."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_runtime_package():
    modules = _modules(PKG)
    assert "tb_bottleneck_plugin.plugin" in modules and "tb_bottleneck_plugin.analysis" in modules
    graph = _graph(modules)
    # The graph is real: plugin imports the service at module level, the loader the model.
    assert "tb_bottleneck_plugin.trace.model" in graph["tb_bottleneck_plugin.trace.loader"]
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


# The stages in data order (docs/ARCHITECTURE.md): a module imports only from its own stage
# and earlier ones; thresholds and errors are shared by all.
_STAGES = (("tb_bottleneck_plugin.errors", "tb_bottleneck_plugin.thresholds"),
           ("tb_bottleneck_plugin.trace",), ("tb_bottleneck_plugin.analysis",), ("tb_bottleneck_plugin.judge",),
           ("tb_bottleneck_plugin.report",), ("tb_bottleneck_plugin.views",), ("tb_bottleneck_plugin.serving",),
           ("tb_bottleneck_plugin.plugin", "tb_bottleneck_plugin.plugin_loader", "tb_bottleneck_plugin.routes",
            "tb_bottleneck_plugin.cli", "tb_bottleneck_plugin.api", "tb_bottleneck_plugin.mcp_server"))


def _stage(module: str) -> int:
    for i, prefixes in enumerate(_STAGES):
        if _is_under(module, prefixes):
            return i
    raise AssertionError(f"{module} is in no stage of docs/ARCHITECTURE.md")


def test_no_import_of_a_later_stage_and_no_cycle_counting_lazy_imports():
    modules = _modules(PKG)
    graph = _graph(modules, module_level_only=False)
    back = []
    for name, edges in graph.items():
        if name == "tb_bottleneck_plugin":
            # the package __init__ imports only the Python API, on first use (module __getattr__)
            assert edges <= {"tb_bottleneck_plugin.api"}, edges
            continue
        for target in edges:
            if target != "tb_bottleneck_plugin" and _stage(target) > _stage(name):
                back.append(f"{name} -> {target}")
    assert not back, sorted(back)
    graph["tb_bottleneck_plugin"] = set()
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)
    # the check sees lazy imports: cli imports the demo generator's module only inside a function
    assert _stage("tb_bottleneck_plugin.judge.cards") > _stage("tb_bottleneck_plugin.analysis.flops")


# The front ends (docs/ARCHITECTURE.md "One engine under every front end"): the terminal, the
# notebook, the tab (its routes, and plugin.py that builds the engine's long-lived mode for
# them) and the MCP server; each stands on serving/engine.py.
_FRONT_ENDS = ("tb_bottleneck_plugin.cli", "tb_bottleneck_plugin.api", "tb_bottleneck_plugin.routes",
               "tb_bottleneck_plugin.mcp_server")
_TAB = "tb_bottleneck_plugin.plugin"
_ENGINE = "tb_bottleneck_plugin.serving.engine"
# The edges between front ends: `tb-bottlenecks mcp` starts the MCP server's main(), inside
# cli._run (lazily: the mcp SDK loads only for that command); cli uses nothing else of it. The
# tab's plugin class hands TensorBoard the routes (routes.plugin_apps).
_FRONT_END_DISPATCH = {("tb_bottleneck_plugin.cli", "tb_bottleneck_plugin.mcp_server"): {"_run"},
                       (_TAB, "tb_bottleneck_plugin.routes"): {"<module>"}}


def _lazy_imports_by_function(path: Path):
    """{imported module: {enclosing function or "<module>"}} of a file, imports inside functions too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name.rpartition(".")[0]
    out = {}

    def visit(node, fn):
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn == "<module>" else fn
            if isinstance(child, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - (child.level - 1)] if child.level else []
                mod = ".".join(base + ([child.module] if child.module else [])) if child.level else child.module
                for target in [mod] + [f"{mod}.{a.name}" for a in child.names]:
                    out.setdefault(target, set()).add(here)
            elif isinstance(child, ast.Import):
                for a in child.names:
                    out.setdefault(a.name, set()).add(here)
            visit(child, here)

    visit(tree, "<module>")
    return out


def test_front_ends_stand_on_the_engine_and_not_on_each_other():
    """cli, api, routes (with plugin.py) and mcp_server import serving/engine.py (lazily
    counted), nothing else of serving/, and none of them imports another front end (the
    `mcp` command's dispatch in cli._run and the tab's plugin → routes aside); the engine
    imports no front end."""
    modules = _modules(PKG)
    graph = _graph(modules, module_level_only=False)
    for fe in _FRONT_ENDS + (_TAB,):
        assert fe in modules, fe
        assert _ENGINE in graph[fe], f"{fe} does not import the engine"
        serving = {m for m in graph[fe] if _is_under(m, ["tb_bottleneck_plugin.serving"])}
        assert serving <= {"tb_bottleneck_plugin.serving", _ENGINE}, f"{fe} imports {sorted(serving - {_ENGINE})}"
        for other in _FRONT_ENDS + (_TAB,):
            if other == fe or other not in graph[fe]:
                continue
            allowed = _FRONT_END_DISPATCH.get((fe, other))
            where = _lazy_imports_by_function(modules[fe]).get(other, set())
            assert allowed and where == allowed, f"{fe} imports the front end {other} (in {sorted(where)})"
    assert not graph[_ENGINE] & set(_FRONT_ENDS + (_TAB,)), graph[_ENGINE]
    # the check can fail: the old api imported cli, the old routes and plugin the service
    assert "tb_bottleneck_plugin.cli" not in graph["tb_bottleneck_plugin.api"]
    assert "tb_bottleneck_plugin.serving.service" not in modules


def test_mcp_sdk_is_imported_only_by_the_mcp_server_and_lazily():
    offending = []
    for name, path in _modules(PKG).items():
        for imported, line in _imports(path, module_level_only=False):
            if imported.split(".")[0] == "mcp" and name != "tb_bottleneck_plugin.mcp_server":
                offending.append(f"{name}:{line}")
    assert not offending, offending
    static = {m.split(".")[0] for m, _ in _imports(PKG / "mcp_server.py", module_level_only=True)}
    assert "mcp" not in static


@pytest.mark.parametrize("start", ["tb_bottleneck_plugin.api", "tb_bottleneck_plugin.cli",
                                   "tb_bottleneck_plugin.mcp_server", _TAB])
def test_a_walk_from_a_front_end_down_to_the_units_never_climbs_back(start):
    """Every import reachable from a front end's entry point (api.analyze, the CLI, the MCP
    server, the tab's plugin; lazy imports counted) goes to the same stage or an earlier one,
    reaches the engine and the analysis units, and meets no other front end on the way (but
    the dispatch edges above)."""
    modules = _modules(PKG)
    graph = _graph(modules, module_level_only=False)
    own = {start} | {b for (a, b) in _FRONT_END_DISPATCH if a == start}
    seen, todo, climbs = {start}, [start], []
    while todo:
        node = todo.pop()
        for nxt in graph[node]:
            if nxt == "tb_bottleneck_plugin" or node.startswith(nxt + "."):
                continue
            if _stage(nxt) > _stage(node) or (nxt in _FRONT_ENDS + (_TAB,) and nxt not in own):
                climbs.append(f"{node} -> {nxt}")
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert not climbs, climbs
    assert {"tb_bottleneck_plugin.analysis.registry", "tb_bottleneck_plugin.analysis.step_model", _ENGINE,
            "tb_bottleneck_plugin.report", "tb_bottleneck_plugin.trace.discovery"} <= seen
    assert not seen & (set(_FRONT_ENDS + (_TAB,)) - own)


# One orchestration (docs/ARCHITECTURE.md): only the engine discovers a path, runs the
# scheduler and starts analyses; the backends run `analyze_span` on their side of a process or
# cluster boundary. {name: modules that may name it (besides the one defining it)}.
_ORCHESTRATION = {
    "discover_path": {_ENGINE}, "scan_logdir": {_ENGINE},
    "Scheduler": {_ENGINE}, "ChildPool": {_ENGINE}, "WaitThreads": {_ENGINE}, "DaskBackend": {_ENGINE},
    "outcome_in_thread": {_ENGINE},
    "analyze_span": {_ENGINE, "tb_bottleneck_plugin.serving.children", "tb_bottleneck_plugin.serving.dask_backend"},
}


def _names_used(path: Path):
    """{name} of _ORCHESTRATION used in a file (a call, an attribute, an import), definitions aside."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id in _ORCHESTRATION:
            used.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in _ORCHESTRATION:
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used.update(a.name for a in node.names if a.name in _ORCHESTRATION)
    return used


def test_only_the_engine_orchestrates(tmp_path):
    """Discovery of a path, the scheduler, the analysis children, Dask and the analysis of a
    span are reached from serving/engine.py only: no front end or view runs its own loop
    (the old gate.load_result, service.Analyzer and cli._analyze_all did)."""
    offending = []
    for name, path in _modules(PKG).items():
        for used in _names_used(path):
            defined = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                       if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            if used not in defined and name not in _ORCHESTRATION[used]:
                offending.append(f"{name} uses {used}")
    assert not offending, sorted(offending)
    # the check can fail: a view that discovers and analyses on its own is seen
    probe = tmp_path / "probe.py"
    probe.write_text("from ..trace import discovery\nfrom .. import report\n\ndef load(path):\n"
                     "    logdir = discovery.discover_path(path)\n"
                     "    return [report.analyze_span(logdir.url, r, s) for r in logdir.runs for s in r.spans]\n")
    assert _names_used(probe) == {"discover_path", "analyze_span"}


# What analysis/ may import from the package: itself and what comes before it in the stages.
_ANALYSIS_MAY_IMPORT = ("tb_bottleneck_plugin.analysis", "tb_bottleneck_plugin.trace",
                        "tb_bottleneck_plugin.thresholds", "tb_bottleneck_plugin.errors")


def _is_under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_analysis_never_imports_a_later_stage():
    """No module under analysis/ imports judge/ (verdicts, cards, recommendations), report,
    views/, serving/ or the front ends, at module level or lazily inside a function: the
    cards are judged in judge/cards.py, from the ids a unit declares (Unit.cards)."""
    modules = _modules(PKG)
    analysis = {n: p for n, p in modules.items() if _is_under(n, ["tb_bottleneck_plugin.analysis"])}
    assert "tb_bottleneck_plugin.analysis.input_bound" in analysis
    offending = []
    for name, path in analysis.items():
        for imported, line in _imports(path, module_level_only=False):
            if _is_under(imported, ["tb_bottleneck_plugin"]) and imported != "tb_bottleneck_plugin" \
                    and not _is_under(imported, _ANALYSIS_MAY_IMPORT):
                offending.append(f"{path.relative_to(REPO)}:{line} imports {imported}")
    assert not offending, offending
    # The rule is one way: judging builds on the maths (the check sees package imports).
    cards = {m for m, _ in _imports(modules["tb_bottleneck_plugin.judge.cards"], module_level_only=False)}
    assert any(_is_under(m, ["tb_bottleneck_plugin.analysis"]) for m in cards), cards


def test_plugin_loader_imports_only_tensorboard_base_plugin_statically():
    modules = _modules(PKG)
    imported = {m for m, _ in _imports(modules["tb_bottleneck_plugin.plugin_loader"], module_level_only=True)}
    assert imported <= {"tensorboard.plugins", "tensorboard.plugins.base_plugin", "__future__",
                        "typing", "typing.Optional"}, imported
    init_imports = _imports(modules["tb_bottleneck_plugin"], module_level_only=True)
    assert init_imports == [], init_imports  # the package __init__ stays import-free
    # ... but for the Python API, imported lazily (module __getattr__) on first use
    lazy = [m for m, _ in _imports(modules["tb_bottleneck_plugin"], module_level_only=False)]
    assert "tb_bottleneck_plugin.api" in lazy and set(lazy) <= {"tb_bottleneck_plugin", "tb_bottleneck_plugin.api"}, lazy


def _new_modules_after(setup: str, statement: str):
    """Modules that `statement` adds to sys.modules after `setup`, in a fresh interpreter."""
    code = (f"import sys, json\n{setup}\nbefore = set(sys.modules)\n{statement}\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plugin_loader_pulls_in_nothing_heavy_at_runtime():
    """What TensorBoard imports at start-up: beyond base_plugin, only our two tiny modules."""
    added = _new_modules_after("from tensorboard.plugins import base_plugin",
                               "import tb_bottleneck_plugin.plugin_loader")
    assert added == ["tb_bottleneck_plugin", "tb_bottleneck_plugin.plugin_loader"], added


def test_runtime_package_never_imports_torch_or_the_demo():
    offending = []
    for name, path in _modules(PKG).items():
        for imported, line in _imports(path, module_level_only=False):
            top = imported.split(".")[0]
            if top in ("torch", "tb_bottleneck_demo"):
                # the one allowed place: `tb-bottlenecks demo` loads the generator on demand
                if not (name == "tb_bottleneck_plugin.cli" and top == "tb_bottleneck_demo"):
                    offending.append(f"{path.relative_to(REPO)}:{line} imports {imported}")
    assert not offending, offending
    # ... and the cli's import of the demo is a lazy one (inside a function).
    cli_static = {m for m, _ in _imports(PKG / "cli.py", module_level_only=True)}
    assert not any(m.startswith("tb_bottleneck_demo") for m in cli_static), cli_static


def test_every_runtime_module_imports_without_torch():
    """Every runtime module imports in an interpreter where `import torch` fails, and
    importing all of them loads neither torch nor the demo generator."""
    names = [n for n in _modules(PKG) if not n.endswith("__main__")]
    code = ("import sys, importlib\nsys.modules['torch'] = None\n"
            f"for n in {names!r}:\n    importlib.import_module(n)\n"
            "bad = [m for m in sys.modules if m.startswith('tb_bottleneck_demo')]\n"
            "assert not bad, bad\nprint('ok', len(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


def test_the_demo_depends_on_the_runtime_package_not_the_reverse():
    demo_imports = {m.split(".")[0] for p in DEMO_PKG.rglob("*.py") for m, _ in _imports(p, False)}
    assert "tb_bottleneck_plugin" in demo_imports and "torch" not in {
        m for p in DEMO_PKG.rglob("*.py") for m, _ in _imports(p, module_level_only=True)}


def test_static_files_are_found_next_to_plugin_py_from_any_directory(tmp_path):
    code = ("import json, tb_bottleneck_plugin.plugin as p\n"
            "d = p._frontend_dir()\nprint(json.dumps([str(d), p.__file__]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    folder, plugin_file = json.loads(done.stdout)
    assert Path(folder) == Path(plugin_file).resolve().parent / "static" == PKG / "static"
    assert (Path(folder) / "index.js").is_file()
    # One place for the dashboard: no second copy left where it used to live.
    assert not (REPO / "frontend").exists()


def test_static_folder_is_derived_from_dunder_file():
    """The lookup is `Path(__file__)... / "static"` (no package_dir probing, no cwd, no sys.prefix)."""
    source = (PKG / "plugin.py").read_text(encoding="utf-8")
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "_frontend_dir")
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    constants = {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant)}
    assert "__file__" in names and "static" in constants, ast.unparse(fn)
    for probe in ("getcwd", "sys.prefix", "package_dir", "site-packages"):
        assert probe not in source, probe


# ---------------------------------------------------------------- file access: storage/discovery own it

_FILE_CALLS = {"open", "listdir", "scandir", "walk", "stat", "ls", "glob", "rglob", "iglob", "read_bytes",
               "read_text", "write_text", "write_bytes", "unlink", "remove", "makedirs", "mkdir", "isfile",
               "isdir", "exists", "cat_file", "find"}
# Where a module may touch files itself ("*": anywhere in it; else the functions named), and why.
_FILE_ACCESS_ALLOWED = {
    "tb_bottleneck_plugin.trace.storage": "*",              # fsspec: local paths and gs:// alike
    "tb_bottleneck_plugin.trace.discovery": "*",            # logdir listing, sniffing, snapshots (through storage)
    "tb_bottleneck_plugin.trace.loader": {"load_trace"},    # opens the one trace stream it decodes
    "tb_bottleneck_plugin.serving.cache": "*",                # its own local disk cache of analysed reports
    "tb_bottleneck_plugin.serving.timeline_store": "*",       # its own local store of step timelines
    "tb_bottleneck_plugin.plugin": {"_static_file", "_preloaded_static"},  # the dashboard's files next to plugin.py
    # the single-file HTML report: reads the dashboard's files next to it, writes the local --html FILE
    "tb_bottleneck_plugin.views.html_report": {"_static_text", "write_html"},
}


def _file_access(path: Path):
    """[(enclosing function, line, call)] of file-touching calls, plus fsspec/gcsfs imports."""
    found = []

    def visit(node, fn):
        for child in ast.iter_child_nodes(node):
            name = fn
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.Call):
                f = child.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                # str.find on a text buffer and list.remove are no file access: only fs.find / os.remove
                exact = {"find": "fs.find", "remove": "os.remove"}.get(called)
                if called in _FILE_CALLS and (exact is None or ast.unparse(f) == exact):
                    found.append((name, child.lineno, ast.unparse(f)))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                found.extend((name, child.lineno, f"import {m}") for m in mods
                             if m.split(".")[0] in ("fsspec", "gcsfs"))
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return found


def test_the_file_access_check_sees_file_access(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import fsspec\n\ndef f(fs, p):\n    with fs.open(p) as h:\n        return h.read()\n"
                     "def g(text):\n    return text.find('x')\n")
    assert [(fn, call) for fn, _, call in _file_access(probe)] == [("<module>", "import fsspec"),
                                                                   ("f", "fs.open")]


def test_only_storage_discovery_and_the_caches_touch_files():
    """Analyses, report assembly, verdicts, recommendations, compare, ranks, the routes and
    the CLI reach files only through storage/discovery (snapshots included)."""
    offending = []
    for name, path in _modules(PKG).items():
        allowed = _FILE_ACCESS_ALLOWED.get(name, set())
        if allowed == "*":
            continue
        offending += [f"{path.relative_to(REPO)}:{line} {call} (in {fn})"
                      for fn, line, call in _file_access(path) if fn not in allowed]
    assert not offending, offending
    # The allowances are real (a stale entry would hide nothing and mean nothing).
    for name, allowed in _FILE_ACCESS_ALLOWED.items():
        path = _modules(PKG)[name]
        used = {fn for fn, _, _ in _file_access(path)}
        assert used, name
        if allowed != "*":
            assert allowed <= used, (name, allowed - used)


# ---------------------------------------------------------------- docs/ARCHITECTURE.md's toy metric, as written

def _doc_toy_sources():
    """(the unit module, the card function) of the 'Adding a metric' section."""
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = doc.split("## Adding a metric", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```python\n")[1:]
    assert len(blocks) == 2, "the 'Adding a metric' section holds two python blocks: unit, card"
    return tuple(b.split("```", 1)[0] for b in blocks)


def test_the_documented_toy_metric_works_end_to_end(monkeypatch, tmp_path):
    """The code blocks of docs/ARCHITECTURE.md 'Adding a metric': the first as module
    analysis/runtime_share.py plus its line in registry.UNITS, the second added to
    judge/cards.py (and nothing else): the span section, its partial, the summary (a ratio
    of sums) and its card verdict, numbers by hand."""
    import types

    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.analysis import registry
    from tb_bottleneck_plugin.judge import cards

    from conftest import TraceBuilder

    unit_source, card_source = _doc_toy_sources()
    # the toy unit follows the rule it teaches: no import of judge/ from analysis/
    toy_imports = [n for n in ast.walk(ast.parse(unit_source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert toy_imports and not any("judge" in ast.unparse(n) for n in toy_imports)
    name = "tb_bottleneck_plugin.analysis.runtime_share"
    mod = types.ModuleType(name)
    mod.__package__ = "tb_bottleneck_plugin.analysis"
    monkeypatch.setitem(sys.modules, name, mod)
    exec(compile(unit_source, "docs/ARCHITECTURE.md", "exec"), mod.__dict__)
    monkeypatch.setattr(registry, "UNITS", registry.UNITS + [mod.UNIT])
    # The card block runs with judge/cards.py's names (register, V); its registration goes
    # into a copy of CARD_FUNCTIONS that monkeypatch puts back afterwards.
    monkeypatch.setattr(cards, "CARD_FUNCTIONS", dict(cards.CARD_FUNCTIONS))
    exec(compile(card_source, "docs/ARCHITECTURE.md", "exec"), dict(vars(cards)))
    assert mod.UNIT.cards == ("runtime_share",) and "runtime_share" in cards.CARD_FUNCTIONS

    # Span a: steps [0,1000) [1000,2000) [2000,3000); runtime calls starting in them: 50 + 200 + 30 µs
    # (the one at 1900 runs past the step end: the toy counts a call by where it starts); 10 µs outside.
    a = TraceBuilder()
    for n in range(3):
        a.step(n, 1000 * n, 1000)
    for ts, dur in ((100, 50), (1900, 200), (2500, 30), (3500, 10)):
        a.runtime("cudaStreamSynchronize", ts, dur)
    # Span b: one step [0,500), one 20 µs call.
    b = TraceBuilder().step(7, 0, 500)
    b.runtime("cudaMemcpyAsync", 10, 20)
    res_a = report.analyze_trace(a.load(tmp_path, "a.pt.trace.json"), span="a")
    res_b = report.analyze_trace(b.load(tmp_path, "b.pt.trace.json"), span="b")

    sec = res_a["report"]["runtime_share"]
    assert sec == {"runtime_us": 280.0, "step_us": 3000.0, "runtime_pct": pytest.approx(100 * 280 / 3000)}
    assert res_a["partials"]["runtime_share"] == {"sum:runtime_us": 280.0, "sum:step_us": 3000.0}
    card = res_a["report"]["verdicts"]["runtime_share"]
    assert (card["value"], card["unit"], card["severity"]) == (sec["runtime_pct"], "pct", "ok")

    summary = report.combine_results([res_a, res_b], run="r", worker="w")["report"]
    assert summary["runtime_share"]["runtime_pct"] == pytest.approx(100 * (280 + 20) / (3000 + 500))
    assert summary["verdicts"]["runtime_share"]["value"] == summary["runtime_share"]["runtime_pct"]
    assert not [e for e in summary["errors"] + res_a["report"]["errors"] if "runtime_share" in str(e)]

    # Declared once in its unit, the metric is in compare (diff, check), in the report text
    # and in the card list the runs route sends to the dashboard: no other file changed.
    from tb_bottleneck_plugin.views import compare, gate, headline, text_report

    cmp = compare.compare(res_a, res_b)
    row = next(r for r in cmp["metrics"] if r["key"] == "runtime_pct")
    assert (row["label"], row["unit"], row["better"]) == ("CUDA runtime share", "%", "lower")
    assert row["base"] == pytest.approx(100 * 280 / 3000) and row["cand"] == pytest.approx(100 * 20 / 500)
    assert row["verdict"] == "better" and [r["key"] for r in cmp["metrics"]][-1] == "runtime_pct"
    assert "CUDA runtime share" in compare.format_text(cmp)
    assert gate.parse_bound("runtime_pct=5", "--max") == ("runtime_pct", 5.0, False)
    assert gate.evaluate(res_a, [("runtime_pct", 5.0, False)], []) == [
        f"runtime_pct = {100 * 280 / 3000:.6g} > max 5"]
    text = text_report.format_report(res_a["report"])
    assert f"  CUDA runtime share {100 * 280 / 3000:.2f}%" in text.splitlines(), text
    listed = headline.card_list()
    assert listed[-1]["id"] == "runtime_share" and listed[-1]["label"] == "Runtime share"
    assert (listed[-1]["unit"], listed[-1]["metric"], listed[-1]["field"]) == ("pct", "runtime_pct",
                                                                           ["runtime_share", "runtime_pct"])
    # ... which is what the runs route sends (routes.py), the dashboard's only card list
    from tb_bottleneck_plugin import routes
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    ctx = routes.RouteContext(analyzer=None, problem="no logdir")
    body = json.loads(routes._serve_runs(ctx, Request(EnvironBuilder(path="/runs").get_environ())).get_data())
    assert body["cards"] == listed



def test_architecture_doc_names_only_what_exists():
    """Every file and every identifier the page names in `backticks` (outside its toy
    example) exists in the code: the worked example follows the code as it is."""
    import re

    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", "", doc, flags=re.S)
    tokens = set(re.findall(r"`([^`\n]+)`", prose))
    toy = {"runtime_share", "tb_bottleneck_plugin/analysis/runtime_share.py", "runtime_share.UNIT"}
    sources = [p for p in PKG.rglob("*.py")] + list((PKG / "static").glob("*.js")) + [
        REPO / "docs" / "route-schema.json", PKG / "METRICS.md"]
    corpus = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    missing = []
    for t in sorted(tokens - toy):
        path = t.split(" ")[-1] if t.startswith("python ") else t
        if re.fullmatch(r"[\w./-]+\.(py|js|json|md)|[\w/-]+/", path):
            if not any((base / path).exists() for base in (REPO, PKG, PKG / "analysis", PKG / "static")):
                missing.append(t)
        elif re.fullmatch(r"[A-Za-z_][\w.]*(\(.*\))?", t):
            name = re.sub(r"\(.*", "", t).split(".")[-1]
            if not re.search(rf"\b{re.escape(name)}\b", corpus):
                missing.append(t)
    assert not missing, missing
