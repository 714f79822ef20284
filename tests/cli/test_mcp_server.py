"""`tb-bottlenecks mcp` as a real subprocess, driven by the mcp SDK's own stdio client: the tools
are listed; diagnose gives the findings whose first recommendation is `report --json`'s; a path
outside the logdir, a symlink out of it and a broken trace are tool errors of one line, and the
server keeps answering after each."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tb_bottleneck_plugin import mcp_server  # noqa: E402  (imports no mcp: only its main() does)

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_logs"
RUNS = ("h100_input_bound_nw0", "h100_input_fixed_nw4")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    if not DEMO.is_dir():
        pytest.skip("demo_logs missing")
    root = tmp_path_factory.mktemp("mcp")
    logdir = root / "logs"
    for name in RUNS:
        shutil.copytree(DEMO / name, logdir / name)
    broken = logdir / "broken"
    broken.mkdir()
    data = next((DEMO / RUNS[0]).glob("*.pt.trace.json.gz")).read_bytes()
    (broken / "worker0.1700000000000.pt.trace.json.gz").write_bytes(data[: len(data) // 3])
    outside = root / "outside"
    shutil.copytree(DEMO / RUNS[1], outside)
    linked = logdir / "linked_out"
    linked.mkdir()
    for f in outside.glob("*.json.gz"):
        (linked / f.name).symlink_to(f)  # a run whose trace files are links out of the logdir
    return logdir


def _cli_json(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(path), "--json", "-j", "1"],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _text(result) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def _session_calls(logdir: Path):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "tb_bottleneck_plugin.cli", "mcp", "--logdir",
                                                                 str(logdir), "--jobs", "1"],
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    out = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            out["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
            out["runs"] = await session.call_tool("list_runs", {})
            out["diagnose"] = await session.call_tool("diagnose", {"run": RUNS[0]})
            out["escape"] = await session.call_tool("diagnose", {"run": "../" + RUNS[0]})
            out["absolute"] = await session.call_tool("diagnose", {"run": str(DEMO / RUNS[0])})
            out["after_escape"] = await session.call_tool("what_if", {"run": RUNS[0], "fix": "input"})
            out["linked"] = await session.call_tool("diagnose", {"run": "linked_out"})
            out["broken"] = await session.call_tool("diagnose", {"run": "broken"})
            out["top"] = await session.call_tool("top", {"run": RUNS[0], "kind": "kernels", "n": 3})
            out["bad_kind"] = await session.call_tool("top", {"run": RUNS[0], "kind": "everything"})
            out["compare"] = await session.call_tool("compare_runs", {"base_run": RUNS[0], "cand_run": RUNS[1]})
            out["unknown_logdir"] = await session.call_tool("list_runs", {"logdir": "/etc"})
    return out


def test_mcp_server_over_stdio_with_the_sdk_client(logdir):
    pytest.importorskip("mcp")
    import anyio

    out = anyio.run(_session_calls, logdir)
    assert out["tools"] == ["compare_runs", "diagnose", "list_runs", "top", "what_if"]
    runs = json.loads(_text(out["runs"]))
    assert {r["run"] for r in runs["runs"]} >= set(RUNS) | {"broken"}
    # diagnose = the findings of `report --json`'s run summary; first recommendation identical
    assert not out["diagnose"].is_error, _text(out["diagnose"])
    findings = json.loads(_text(out["diagnose"]))
    rep = _cli_json(logdir / RUNS[0])["runs"][0]["workers"][0]["summary"]
    first, theirs = findings["recommendations"][0], rep["recommendations"][0]
    assert (first["rule"], first["title"], first["severity"]) == (theirs["rule"], theirs["title"], theirs["severity"])
    assert first["gain"]["pct"] == pytest.approx(theirs["estimated_gain_pct"], abs=0.01)
    assert first["gain"]["predicted_step_ms"] == pytest.approx(theirs["predicted_step_ms"], abs=1e-3)
    assert findings["verdict"]["sentence"] == rep["verdict"]["sentence"]
    assert len(_text(out["diagnose"]).encode()) <= 8192
    # confinement and errors: one line each, and the server answers the next call
    for key in ("escape", "absolute", "linked", "broken", "bad_kind", "unknown_logdir"):
        res = out[key]
        assert res.is_error, (key, _text(res))
        assert "\n" not in _text(res).strip() and _text(res).strip(), (key, _text(res))
    assert "relative" in _text(out["escape"]) and "relative" in _text(out["absolute"])
    assert "outside the logdir" in _text(out["linked"])
    assert "broken" in _text(out["broken"]) or ".pt.trace.json.gz" in _text(out["broken"])
    assert not out["after_escape"].is_error
    wi = json.loads(_text(out["after_escape"]))["what_if"]
    sm = next(w for w in rep["step_model"]["what_if"] if w["id"] == "input")
    assert wi["predicted_step_ms"] == pytest.approx(sm["predicted_step_ms"], abs=1e-3)
    top = json.loads(_text(out["top"]))
    assert [r["id"] for r in top["rows"]] == ["kernel:" + k["name"] for k in rep["occupancy"]["kernels"][:3]]
    cmp = json.loads(_text(out["compare"]))
    assert not out["compare"].is_error and cmp["metrics"]


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "gs://bucket/x", "C:\\x", "~root", ""])
def test_names_that_are_not_relative_run_names_are_refused(name):
    with pytest.raises(mcp_server.ToolFailure):
        mcp_server.checked_name(name)
    assert mcp_server.checked_name("sub/run.v2") == "sub/run.v2"


def test_without_the_sdk_the_command_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` raises ImportError
    from tb_bottleneck_plugin import cli

    assert cli.main(["mcp", "--logdir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and 'pip install "tb_bottleneck_plugin[mcp]"' in err
