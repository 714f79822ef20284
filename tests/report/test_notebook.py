"""The example notebook examples/bottlenecks.ipynb (issue 25), executed top to bottom by a real
Jupyter kernel (nbclient + ipykernel, the `test` and `notebook` extras) started in examples/, as
Jupyter starts it: the notebook finds demo_logs/ itself (from its working directory upwards;
$TBB_DEMO_LOGS is unset here). Its outputs are checked against `tb-bottlenecks report/diff
--json` run beside it: the DataFrames' shapes and numbers, the cards, the top recommendation,
the comparison and the ranks.

CI must run it: a missing package or a kernel that cannot start fails with the reason."""
from __future__ import annotations

import json
from html import escape as html_escape
import os
import subprocess
import sys
import time

import pytest

from conftest import DEMO_LOGS, REPO

NOTEBOOK = REPO / "examples" / "bottlenecks.ipynb"
KERNEL = "tbb-notebook-test"


def _jupyter():
    try:
        import nbclient
        import nbformat
        import ipykernel  # noqa: F401  (the kernel the notebook runs in)
    except ImportError as exc:
        pytest.fail(f"the notebook test needs nbclient, nbformat and ipykernel: pip install -e \".[test]\" ({exc})")
    return nbclient, nbformat


def _kernelspec(tmp_path, monkeypatch):
    """A kernel spec running this interpreter (the installed python3 spec runs whatever `python`
    is first on PATH), found first through JUPYTER_PATH; the package importable from the repo."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (tb_bottleneck_plugin tests)", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("TBB_DEMO_LOGS", raising=False)
    monkeypatch.setenv("MPLBACKEND", "agg")


def _cli_json(*args):
    return subprocess.Popen([sys.executable, "-m", "tb_bottleneck_plugin.cli", *args, "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out)


def _outputs(cell, output_type=None):
    return [o for o in cell.get("outputs", []) if output_type is None or o["output_type"] == output_type]


def test_example_notebook_runs_and_shows_the_clis_numbers(tmp_path, monkeypatch):
    nbclient, nbformat = _jupyter()
    _kernelspec(tmp_path, monkeypatch)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(_outputs(c) for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    nw0, nw4, ddp = (str(DEMO_LOGS / n) for n in ("resnet50_v100_nw0", "resnet50_v100_nw4", "ddp_straggler_2rank"))
    # the CLI's numbers, computed while the kernel runs
    procs = [_cli_json("report", nw0), _cli_json("diff", nw0, nw4), _cli_json("report", ddp)]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=KERNEL, startup_timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    start = time.monotonic()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError:
        raise  # a cell failed: its traceback says why
    except Exception as exc:  # the kernel did not start or died: say so, never skip
        pytest.fail(f"the notebook's Jupyter kernel failed ({type(exc).__name__}: {exc}); "
                    f"kernel spec {KERNEL} runs {sys.executable} -m ipykernel_launcher")
    took = time.monotonic() - start
    rep_json, diff_json, ddp_json = (_done(p) for p in procs)
    print(f"notebook executed in {took:.1f} s")

    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        assert not _outputs(c, "error"), c.source
        for o in _outputs(c, "stream"):
            assert o["name"] == "stdout" or "Warning" not in o["text"], o["text"]
    summary_cell = next(c for c in code if "summary" in c.metadata.get("tags", []))
    got = json.loads("".join(o["text"] for o in _outputs(summary_cell, "stream") if o["name"] == "stdout"))

    # the run: one directory of one trace file -> its worker's report
    [run] = rep_json["runs"]
    want = run["workers"][0]["summary"]
    per_step = want["breakdown_per_step"]
    assert got["steps_shape"][0] == len(per_step) > 0 and got["steps"] == [r["step"] for r in per_step]
    assert got["step_total_us"] == pytest.approx([r["total_us"] for r in per_step])
    assert got["input_bound"] == pytest.approx(want["verdicts"]["input_bound"]["value"])
    assert got["cards"] == sorted(want["verdicts"])
    assert got["top_recommendation"] == want["recommendations"][0]["title"]
    top = max(want["occupancy"]["kernels"], key=lambda k: k["total_us"])
    assert got["kernels_shape"][0] >= len(want["occupancy"]["kernels"]) and got["top_kernel"] == top["name"]
    assert got["top_kernel_total_us"] == pytest.approx(top["total_us"])
    assert got["operators_shape"][0] > 10 and got["operators_shape"][1] >= 5
    # the comparison
    m = {x["key"]: x for x in diff_json["metrics"]}
    assert got["metrics_shape"][0] == len(diff_json["metrics"])
    assert got["avg_step_us"] == pytest.approx([m["avg_step_us"]["base"], m["avg_step_us"]["cand"]])
    # the ranks
    ranks = ddp_json["runs"][0]["ranks"]["ranks"]
    assert got["ranks_shape"][0] == len(ranks) == 2 and got["ranks"] == [r["worker"] for r in ranks]
    assert 100_000 < got["html_bytes"] < 1_000_000

    # what Jupyter shows: the Report as the tab's cards, the Comparison and the DataFrames as tables
    html = ["".join(o["data"].get("text/html", "")) for c in code for o in _outputs(c, "execute_result")]
    cards_html = next(h for h in html if "tbb-card" in h)
    assert cards_html.count("class='tbb-card'") == len(want["verdicts"])
    assert html_escape(want["recommendations"][0]["title"]) in cards_html
    assert sum("<table" in h and "dataframe" in h for h in html) >= 6
    assert took < 120, took
