"""`tb-bottlenecks mcp --logdir DIR [--logdir DIR2 ...]`: a Model Context Protocol server over
stdio (the official `mcp` Python SDK, ``pip install "tb_bottleneck_plugin[mcp]"``), so that a
coding agent can ask why a training job is slow and get the verified, compact answer.

Tools (each answer is JSON text; every row carries the ids the findings use):
  list_runs(logdir?)                          the runs, workers and spans of a logdir
  diagnose(run, worker?, span?, logdir?)      the findings (views/findings.py, at most 8 KB)
  compare_runs(base_run, cand_run, logdir?)   baseline vs candidate (views/compare.py), cut
  what_if(run, fix?, worker?, span?, logdir?) the step model's what-if for one fix (or all)
  top(run, kind, n?, worker?, span?, logdir?) the largest kernels, ops or source lines

Confined: a tool names runs (relative names from the listing), never paths; the names are looked
up in what discovery found under the logdirs given at start (an absolute path, ``..``, a URL or
a run that links outside its logdir is refused), so no tool reads outside them. Every failure
is a tool error of one line (``is_error``); the server keeps answering.

A thin front end over the engine (serving/engine.py); `mcp` is imported only here, and this
module only by the ``mcp`` command.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
from typing import Dict, List, Optional

from .serving import engine as engine_mod
from .views import compare as compare_view
from .views import findings as findings_view

INSTALL = 'pip install "tb_bottleneck_plugin[mcp]"'
MAX_NAME_CHARS = 4096
SERVER_INSTRUCTIONS = (
    "Diagnoses PyTorch training performance from torch.profiler traces under the configured logdir(s). "
    "Start with list_runs, then diagnose a run: its verdict and recommendations are ordered by the step "
    "time each fix would give back (predicted by a step model). Evidence ids (step:N, kernel:NAME, op:NAME, "
    "line:FILE:N) point into the report; use top and what_if for detail.")


class ToolFailure(Exception):
    """A one-line reason a tool call cannot be answered."""


def _one_line(text: str, limit: int = 500) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def checked_name(value: str, what: str = "run") -> str:
    """A run/worker/span name as an agent may give it: relative, no ``..`` component, no
    absolute path, URL, backslash or NUL (the lookup is in the discovered set anyway)."""
    value = (value or "").strip()
    if not value:
        raise ToolFailure(f"{what} is required (list_runs shows the names)")
    if (len(value) > MAX_NAME_CHARS or "\x00" in value or "\\" in value or "://" in value
            or value.startswith(("/", "~")) or (len(value) > 1 and value[1] == ":")
            or ".." in value.split("/")):
        raise ToolFailure(f"{what} {value[:200]!r} is not a name relative to the logdir (no absolute paths or '..')")
    return value


class Service:
    """The logdirs given at start, one confined engine each; the tools' logic without the SDK."""

    def __init__(self, logdirs: List[str], jobs: Optional[int] = None):
        if not logdirs:
            raise ValueError("give at least one --logdir")
        self.engines: Dict[str, engine_mod.Engine] = {}
        for d in logdirs:
            self.engines[d] = engine_mod.Engine(d, jobs=jobs, confined=True)

    def _engine(self, logdir: Optional[str]) -> engine_mod.Engine:
        if not logdir:
            return next(iter(self.engines.values()))
        for given, eng in self.engines.items():
            if logdir in (given, given.rstrip("/").rsplit("/", 1)[-1]):
                return eng
        raise ToolFailure(f"logdir {logdir[:200]!r} is not one this server was started with: "
                          + ", ".join(self.engines))

    def _call(self, fn):
        """Runs a tool body: stdout kept for the protocol (anything printed goes to stderr),
        every failure one line."""
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return json.dumps(engine_mod.json_safe(fn()), ensure_ascii=False, allow_nan=False,
                                  separators=(",", ":"))  # compact: the findings' 8 KB bound is of this text
        except ToolFailure:
            raise
        except (engine_mod.EngineError, engine_mod.NothingAnalysed, ValueError, KeyError) as exc:
            raise ToolFailure(_one_line(str(exc.args[0]) if exc.args else str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - one tool's failure must not end the server
            logging.getLogger(__name__).exception("tool failed")
            raise ToolFailure(_one_line(f"internal error: {type(exc).__name__}: {exc}")) from None

    def _result(self, logdir, run, worker, span, views=False):
        eng = self._engine(logdir)
        run = checked_name(run)
        worker = checked_name(worker, "worker") if worker else None
        span = checked_name(span, "span") if span else None
        return eng.result(run, worker, span, views=views)

    # ------------------------------------------------------------------ the tools

    def list_runs(self, logdir: str = "") -> str:
        return self._call(lambda: {"logdir": logdir or next(iter(self.engines)), "runs": self._engine(logdir).runs()})

    def diagnose(self, run: str, worker: str = "", span: str = "", logdir: str = "") -> str:
        def body():
            return engine_mod.result_findings(self._result(logdir, run, worker, span))
        return self._call(body)

    def compare_runs(self, base_run: str, cand_run: str, logdir: str = "") -> str:
        def body():
            base = self._result(logdir, base_run, None, None, views=True)
            cand = self._result(logdir, cand_run, None, None, views=True)
            cmp = compare_view.compare(base, cand, base_label=base_run, cand_label=cand_run)
            return findings_view.compare_digest(cmp)
        return self._call(body)

    def what_if(self, run: str, fix: str = "", worker: str = "", span: str = "", logdir: str = "") -> str:
        return self._call(lambda: findings_view.what_if(self._result(logdir, run, worker, span)["report"], fix or None))

    def top(self, run: str, kind: str = "kernels", n: int = 10, worker: str = "", span: str = "",
            logdir: str = "") -> str:
        def body():
            if kind not in findings_view.TOP_KINDS:
                raise ToolFailure(f"kind must be one of {', '.join(findings_view.TOP_KINDS)}")
            return findings_view.top_table(self._result(logdir, run, worker, span, views=kind == "ops"), kind, n)
        return self._call(body)


def build_server(service: Service):
    """The SDK's MCPServer with the tools registered (imports `mcp`)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("tb-bottlenecks", instructions=SERVER_INSTRUCTIONS)

    def tool(fn, description):
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ToolFailure as exc:
                raise ToolError(str(exc)) from None
        wrapped.__name__ = fn.__name__
        wrapped.__doc__ = description
        wrapped.__signature__ = inspect.signature(fn)  # the SDK builds the tool's input schema from it
        wrapped.__annotations__ = {k: v for k, v in fn.__annotations__.items()}
        server.tool(name=fn.__name__, description=description, structured_output=False)(wrapped)

    tool(service.list_runs, "List the runs (with their workers and spans) of a logdir this server was started "
         "with. `logdir`: empty for the first one.")
    tool(service.diagnose, "Diagnose a run (or one worker/span of it): the findings JSON: the verdict sentence, "
         "each recommendation with its predicted gain (ms per step and %), severity, evidence ids pointing into "
         "the report, and the assumptions. `run` is a name from list_runs.")
    tool(service.compare_runs, "Compare two runs of the logdir: headline metrics (base, cand, verdict), step time, "
         "and the largest kernel and op differences.")
    tool(service.what_if, "The step model's prediction for one fix: `fix` is a what-if id (input, sync, bf16, "
         "torch_compile, cuda_graphs, ...) or a recommendation rule; empty lists every what-if.")
    tool(service.top, "The largest `kind` = kernels | ops | lines (source lines, needs with_stack=True) of a run, "
         "`n` rows (at most 50), each with its id and times in ms.")
    return server


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tb-bottlenecks mcp", description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", action="append", required=True, metavar="DIR",
                        help="a logdir the tools may read (repeat for several); nothing outside them is read")
    parser.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                        help="spans analysed at once, one process each (default: the cores)")
    args = parser.parse_args(argv)
    try:
        import mcp  # noqa: F401
    except ImportError:
        print(f"tb-bottlenecks: the MCP server needs the mcp package: {INSTALL}", file=sys.stderr)
        return 1
    logdirs = []
    for d in args.logdir:
        if "://" not in d:
            d = os.path.abspath(d)  # the tools' answers name it; a relative one would depend on the cwd
        logdirs.append(d)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout is the protocol's
    build_server(Service(logdirs, jobs=args.jobs)).run("stdio")
    return 0
