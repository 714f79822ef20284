"""A user migrating from torch-tb-profiler has both plugins installed. The one real TensorBoard
of the suite with EVERY installed plugin (a plain ``python -m tensorboard.main``: ours and
torch-tb-profiler's, each through its own entry point; every other test's TensorBoard leaves
torch-tb-profiler's out, see conftest.TENSORBOARD_WITHOUT_TBP): both tabs are listed, the
other plugin really works (its own runs route lists the run), and our tab works beside it in a
real headless Chromium: the run's cards show the route's number, no dialog, no page error,
nothing fetched from another origin.
"""
from __future__ import annotations

import json
import time

import pytest

from conftest import http_get, link_demo_run, need_torch_tb_profiler, wait_route

RUN = "input_bound"


def test_our_tab_works_beside_torch_tb_profiler(tmp_path, tensorboard_server, browser_page):
    need_torch_tb_profiler()  # the [oracle] extra: present in CI
    logs = tmp_path / "logs"
    link_demo_run(logs, RUN)
    base = tensorboard_server(logs, all_plugins=True)

    status, body = http_get(f"{base}/data/plugins_listing")
    assert status == 200
    listing = json.loads(body)
    assert listing["bottlenecks"]["enabled"] is True and listing["bottlenecks"]["tab_name"] == "Bottlenecks"
    assert "pytorch_profiler" in listing, sorted(listing)

    # torch-tb-profiler is loaded and parsing the same logdir (its runs route lists the run once
    # its workers have loaded it): the two plugins really run side by side.
    deadline = time.monotonic() + 240
    while True:
        status, body = http_get(f"{base}/data/plugin/pytorch_profiler/runs", timeout=30)
        assert status == 200, body[:300]
        if RUN in json.loads(body).get("runs", []):
            break
        assert time.monotonic() < deadline, f"torch-tb-profiler never listed {RUN}: {body[:300]!r}"
        time.sleep(0.5)

    report = wait_route(base, "report", run=RUN, timeout=240)
    w = browser_page(base)
    frame = w.open_tab(timeout=120_000)
    frame.locator("#bn-run").select_option(RUN)
    frame.locator(".card").first.wait_for(timeout=120_000)
    cards = w.plugin_frame().evaluate("""() => Object.fromEntries([...document.querySelectorAll('.card')].map(c =>
        [c.querySelector('.card-label').firstChild.textContent, c.querySelector('.card-value').textContent]))""")
    assert cards["Input-bound"] == f"{report['input']['input_bound_pct']:.1f}%", cards
    w.check_clean()
