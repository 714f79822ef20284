"""The tab survives a reinstall under a running TensorBoard (issue 20 item 11).

README's quick start installs the package and starts TensorBoard; its test command then
runs ``pip install -e``, which removes the installed package's files while the server runs.
The dashboard's files used to be read from disk per request, so the tab went blank. Here a
real TensorBoard runs a copy of the package (first on its PYTHONPATH); once a run is
analysed the copy is deleted, as ``pip uninstall`` does, and the tab must still load in a
real Chromium, with every dashboard file served (from the copy's bytes: a marker proves it).
"""
from __future__ import annotations

import os
import shutil

from conftest import REPO, http_get, link_demo_run, start_tensorboard, wait_route

MARKER = b"/* served from the installed copy */\n"


def test_the_tab_survives_the_package_being_removed_under_it(tmp_path, browser_page):
    site = tmp_path / "site"
    shutil.copytree(REPO / "tb_bottleneck_plugin", site / "tb_bottleneck_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))
    css = site / "tb_bottleneck_plugin" / "static" / "style.css"
    css.write_bytes(css.read_bytes() + MARKER)
    logs = tmp_path / "logs"
    link_demo_run(logs, "input_bound_nw0", "input_bound_nw0")
    env = dict(os.environ, PYTHONPATH=str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # cwd: `python -c` puts its folder (a checkout?) first on sys.path, before PYTHONPATH
    with start_tensorboard(logs, env=env, cwd=tmp_path) as base:
        status, body = http_get(f"{base}/data/plugin/bottlenecks/static/style.css")
        assert status == 200 and body.endswith(MARKER)  # the copy is the one TensorBoard runs
        wait_route(base, "report", run="input_bound_nw0")

        shutil.rmtree(site / "tb_bottleneck_plugin")  # what pip uninstall does to the files

        names = sorted(p.name for p in (REPO / "tb_bottleneck_plugin" / "static").iterdir() if p.is_file())
        for name in names:
            status, body = http_get(f"{base}/data/plugin/bottlenecks/static/{name}")
            assert status == 200 and body, name
        assert http_get(f"{base}/data/plugin/bottlenecks/index.js")[0] == 200
        assert http_get(f"{base}/data/plugin/bottlenecks/static/style.css")[1].endswith(MARKER)

        w = browser_page(base)
        w.open_run("input_bound_nw0", ready=".card[data-card]")
        iframe = w.plugin_frame()
        assert iframe.evaluate("() => document.querySelectorAll('.card[data-card]').length") > 3
        assert not iframe.evaluate("() => document.querySelector('.state-error, .error-state')")
        w.check_clean()
