"""The CLI in pipes (issue 20, item 2): `tb-bottlenecks … | head` ends quietly in every
command: no BrokenPipeError traceback, no "internal error", no "Exception ignored" line
on stderr; the exit code is 0 (everything fit in the pipe before the reader left) or 141
(cli.EXIT_PIPE_CLOSED: the rest was dropped, as a tool killed by SIGPIPE). And the
analysis children of a multi-file report print no traceback without --debug."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.serving import engine

from conftest import DEMO_LOGS  # noqa: E402
from trace_builder import TraceBuilder

EXE = shutil.which("tb-bottlenecks")
COMMANDS = {
    "report": ["report", str(DEMO_LOGS / "input_bound_nw0")],
    "report_json": ["report", str(DEMO_LOGS / "input_bound_nw0"), "--json"],
    "diff": ["diff", str(DEMO_LOGS / "input_bound_nw0"), str(DEMO_LOGS / "input_fixed_nw4")],
    "diff_json": ["diff", str(DEMO_LOGS / "input_bound_nw0"), str(DEMO_LOGS / "input_fixed_nw4"), "--json"],
    "check": ["check", str(DEMO_LOGS / "input_bound_nw0"), "--max", "input_bound_pct=100"],
}
NOISE = ("Traceback", "BrokenPipe", "Broken pipe", "Exception ignored", "internal error")


def _argv(args):
    return [EXE, *args] if EXE else [sys.executable, "-m", "tb_bottleneck_plugin.cli", *args]


def _quiet(err: str) -> None:
    for word in NOISE:
        assert word not in err, err[-2000:]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_head_1_in_a_shell_pipe(name, tmp_path):
    """The real thing: a shell pipeline into `head -1`, the command's own status."""
    cmd = " ".join(f"'{a}'" for a in _argv(COMMANDS[name]))
    p = subprocess.run(["bash", "-c", f"{cmd} 2>err.txt | head -1; echo \"rc=${{PIPESTATUS[0]}}\""],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = p.stdout.splitlines()
    err = (tmp_path / "err.txt").read_text()
    assert len(out) == 2 and out[0].strip(), p.stdout  # head's one line, then our status
    rc = int(out[1].split("=")[1])
    assert rc in (0, cli.EXIT_PIPE_CLOSED), (rc, err)
    _quiet(err)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_reader_gone_before_the_first_write_exits_141(name):
    """Deterministic: stdout's reader is closed before the command writes anything."""
    r, w = os.pipe()
    os.close(r)  # no reader at all: the first write (or the final flush) gets EPIPE
    try:
        p = subprocess.run(_argv(COMMANDS[name]), stdout=w, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == cli.EXIT_PIPE_CLOSED, (p.returncode, p.stderr[-2000:])
    assert p.stderr == "" or "WARNING" in p.stderr, p.stderr[-2000:]  # diff's setup warning may stay
    _quiet(p.stderr)


def test_in_process_closed_stdout_is_141_and_restores_sys_stdout(monkeypatch, capsys):
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    closed = Closed()
    monkeypatch.setattr(sys, "stdout", closed)
    assert cli.main(COMMANDS["diff"]) == cli.EXIT_PIPE_CLOSED
    assert sys.stdout is closed
    _quiet(capsys.readouterr().err)


def test_documented_in_the_help(capsys):
    assert "141" in cli.__doc__ and "head" in cli.__doc__
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out and "141" in out and "| head" in out


def test_children_print_no_traceback_without_debug(tmp_path):
    """A section failing inside an analysis child (a multi-file report, --jobs 2) is one
    line on stderr, exit 0; its traceback only with --debug."""
    b = TraceBuilder()
    for n in range(3):
        b.step(n, 1000 + n * 1000, 900)
        b.launch("volta_sgemm", 1010 + n * 1000, 1100 + n * 1000, 300)
    run = tmp_path / "run"
    b.write(run / "w0.1.pt.trace.json")
    b.write(run / "w1.1.pt.trace.json")
    site = tmp_path / "site"
    site.mkdir()
    # every interpreter of the run (the CLI and its children) breaks the sync section
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import tb_bottleneck_plugin.analysis.signals as _s

        def _boom(*a, **k):
            raise RuntimeError("boom in a child")

        _s.sync_signal = _boom
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    p = subprocess.run(_argv(["report", str(run), "--jobs", "2"]), capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = [x for x in p.stderr.splitlines() if "boom in a child" in x]
    assert len(lines) == 2 and all(x.startswith("tb-bottlenecks: ") for x in lines), p.stderr
    dbg = subprocess.run(_argv(["report", str(run), "--jobs", "2", "--debug"]), capture_output=True, text=True,
                         env=env, timeout=300)
    assert dbg.returncode == 0 and "Traceback" in dbg.stderr, dbg.stderr
    assert engine.CHILD_TRACEBACKS_ENV not in os.environ

