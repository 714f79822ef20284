"""Issue 34 item 12: the docs say what the product does. The claims of README.md and
demo_logs/README.md that can be checked are read from the text and compared with the product:

- the runs demo_logs/README.md lists (its run table and its "What the tab recommends" table)
  are the run directories of demo_logs/, and the README's Quick start does not undercount them
  (it said "three public traces ... plus" a CPU pair and a distributed pair of 21 runs);
- the recommendations each demo run gets, in order (info-level left out), are those the product
  makes for the run's summary (demo_logs/README.md said the H200 run got no sync advice while
  the tab gave one);
- the rescan period the README states is the server's default (serving/engine.py
  DEFAULT_RESCAN_SECONDS = plugin_loader's flag default), and the run list's re-read period
  is the tab's (static/index.js RUNS_POLL_MS; the README said 30 s where the tab said 10 s);
- every virtual environment the README tells to create is in .gitignore (`.venv-test/` was not).
"""
from __future__ import annotations

import argparse
import re
import subprocess

import pytest

from conftest import DEMO_LOGS, REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
DEMO_README = (DEMO_LOGS / "README.md").read_text(encoding="utf-8")
RUN = re.compile(r"`([\w.-]+)/`")


def demo_dirs() -> set:
    return {d.name for d in DEMO_LOGS.iterdir() if d.is_dir()}


def table_after(heading_row: str, text: str) -> list:
    """The rows (lists of cells) of the markdown table whose header row starts with
    ``heading_row``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading_row))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def advice_table() -> dict:
    return {RUN.fullmatch(row[0]).group(1): [] if row[1] == "none" else re.findall(r"`(\w+)`", row[1])
            for row in table_after("| run | recommendations", DEMO_README)}


def test_the_run_table_lists_every_demo_run():
    listed = {name for row in table_after("| run | what it is |", DEMO_README) for name in RUN.findall(row[0])}
    assert listed == demo_dirs()


def test_the_advice_table_lists_every_demo_run():
    assert set(advice_table()) == demo_dirs()


def test_the_quick_start_counts_the_demo_runs_truthfully():
    quick = README[README.index("## Quick start"):]
    m = re.search(r"`demo_logs/` holds more than (\d+) runs", quick)
    assert m, "the Quick start says how many runs demo_logs/ holds"
    assert len(demo_dirs()) > int(m.group(1))
    assert "demo_logs/README.md" in quick[:m.end() + 200]


def test_each_demo_run_gets_the_documented_advice():
    """The product's recommendations for each run's summary, info-level left out, in order."""
    from tb_bottleneck_plugin import report
    from tb_bottleneck_plugin.trace import discovery

    documented = advice_table()
    logdir = discovery.discover_path(str(DEMO_LOGS))
    wrong = {}
    for run in logdir.runs:
        results = [report.analyze_span(logdir.url, run, s) for w in run.workers for s in w.spans]
        rep = results[0]["report"] if len(results) == 1 else report.combine_results(results, run=run.name)["report"]
        got = [r["rule"] for r in rep["recommendations"] if r["severity"] != "info"]
        if got != documented.get(run.name):
            wrong[run.name] = {"documented": documented.get(run.name), "product": got}
    assert not wrong, wrong
    # the claim of issue 34 item 12 (b): the H200 .item() run does get sync advice
    assert "synchronization" in documented["h200_stack_item_slow_module"]


def test_the_rescan_periods_are_the_code_s():
    from tb_bottleneck_plugin.plugin_loader import BottlenecksLoader
    from tb_bottleneck_plugin.serving.engine import DEFAULT_RESCAN_SECONDS, Analyzer

    server = re.search(r"the server rescans the logdir every (\d+) s", README)
    tab = re.search(r"the tab re-reads its run list every\s+(\d+) s", README)
    assert server and tab, "the README states both periods"
    parser = argparse.ArgumentParser()
    BottlenecksLoader().define_flags(parser)
    assert float(server.group(1)) == DEFAULT_RESCAN_SECONDS == parser.parse_args([]).bottlenecks_rescan_seconds
    index_js = (REPO / "tb_bottleneck_plugin" / "static" / "index.js").read_text(encoding="utf-8")
    poll_ms = float(re.search(r"const RUNS_POLL_MS = (\d+);", index_js).group(1))
    assert float(tab.group(1)) == poll_ms / 1000
    # the tab names the server's period from the /runs answer, not a number of its own
    assert "scan.rescan_seconds" in index_js and "re-read every 10 s" not in index_js
    analyzer = Analyzer(str(DEMO_LOGS / "compile_static_fixed"), cache_dir=None)
    try:
        assert analyzer.runs_view()["scan"]["rescan_seconds"] == DEFAULT_RESCAN_SECONDS
    finally:
        analyzer.stop()


def test_every_virtual_environment_the_readme_creates_is_ignored():
    venvs = set(re.findall(r"python3? -m venv (\.?[\w.-]+)", README))
    assert ".venv-test" in venvs, venvs
    for name in venvs:
        probe = subprocess.run(["git", "check-ignore", "-q", f"{name}/bin/python"], cwd=REPO)
        assert probe.returncode == 0, f"{name}/ is not in .gitignore"
