"""End to end: the Operators panel in a real TensorBoard and a real headless Chromium.

On the demo's input-bound run (demo_logs/input_bound_nw0, recorded with record_shapes=True)
the table renders the route's rows, sorts by a clicked column, filters by name, switches to
group-by-shape and to one step; ops whose calls carry no recorded input say "no inputs" (with
why on hover), not "not recorded". On a hand-built run whose op names and dtypes look like HTML,
they stay text (no element is created, no dialog opens). On a run profiled without
record_shapes the shape columns show "—" with the hover "record_shapes=True was not set".
On the H100 BERT inference run (bf16) the FLOP columns (FLOPs, TFLOP/s, % peak, bound) show
the route's numbers for every shown op that has them, and the panel names the GPU whose peak
they use.
"""
from __future__ import annotations

import json
import os
import shutil

from conftest import TraceBuilder, link_demo_run, route_validator, wait_route

RUN = "input_bound"
HTML_RUN = "html_ops"
NO_SHAPES_RUN = "no_shapes"
GPU_RUN = "bert_h100"  # demo_logs/bert_h100_inference: bf16 GEMMs on an H100, record_shapes=True
EVIL = '<img src=x onerror="alert(1)">'
EVIL_TYPE = "<b>float</b>"
PANEL = "#bn-panel-operators"


def _logdir(tmp_path):
    link_demo_run(tmp_path / "logs", RUN)
    link_demo_run(tmp_path / "logs", GPU_RUN, "bert_h100_inference")
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu(EVIL, 10, 300, **{"Input Dims": [[8, 16]], "Input type": [EVIL_TYPE]})
    b.launch("volta_sgemm_128x64_nn", 20, kernel_ts=100, kernel_dur=50)
    b.step(2, 1000, 1000)
    b.cpu(EVIL, 1010, 300, **{"Input Dims": [[8, 16]], "Input type": [EVIL_TYPE]})
    b.launch("volta_sgemm_128x64_nn", 1020, kernel_ts=1100, kernel_dur=50)
    b.write(tmp_path / "logs" / HTML_RUN / "worker0.1700000000000.pt.trace.json.gz")
    b = TraceBuilder()  # no "Input Dims" anywhere: profiled without record_shapes
    for n, off in ((1, 0), (2, 1000)):
        b.step(n, off, 1000)
        b.cpu("aten::mm", off + 10, 300)
        b.cpu("my_region", off + 400, 200, cat="user_annotation")
    b.write(tmp_path / "logs" / NO_SHAPES_RUN / "worker0.1700000000002.pt.trace.json.gz")
    return tmp_path / "logs"


def _selection(iframe):
    sel = iframe.evaluate("() => ({run: document.querySelector('#bn-run').value,"
                          " worker: document.querySelector('#bn-worker') && document.querySelector('#bn-worker').value,"
                          " span: document.querySelector('#bn-span') && document.querySelector('#bn-span').value})")
    return {k: v for k, v in sel.items() if v and v != "all"}


def _table(iframe):
    return iframe.evaluate("""() => {
      const t = document.querySelector('%s table.operators');
      const keys = [...t.querySelectorAll('thead th')].map((th) => th.dataset.key);
      const rows = [...t.querySelectorAll('tbody tr')].filter((tr) => !tr.querySelector('.empty-row'))
        .map((tr) => Object.fromEntries([...tr.children].map((td, i) => [keys[i], td.textContent])));
      return {keys, rows, count: document.querySelector('%s .op-count').textContent};
    }""" % (PANEL, PANEL))


def _wait_table(iframe, group="op"):
    key = "dims" if group == "op_shape" else "self_us"
    iframe.wait_for_function(
        "() => document.querySelector('%s table.operators thead th[data-key=%s]') && "
        "document.querySelector('%s table.operators tbody tr')" % (PANEL, key, PANEL), timeout=120_000)


def test_operators_panel(tmp_path, tensorboard_server, browser_page):
    base = tensorboard_server(_logdir(tmp_path))
    w = browser_page(base, viewport=(1400, 1000))
    frame = w.open_tab()
    frame.locator("#bn-run").select_option(RUN)
    iframe = w.plugin_frame()
    _wait_table(iframe)
    sel = _selection(iframe)
    assert sel["run"] == RUN
    body = wait_route(base, "operators", **sel)
    validate = route_validator("operators")
    assert not list(validate.iter_errors(body))
    assert body["record_shapes"] is True and body["rows"]

    # renders the route's rows, largest self CPU time first
    t = _table(iframe)
    assert t["keys"][:2] == ["name", "calls"] and "top_inputs" in t["keys"]
    # the demo run is CPU-only: GPU columns are n/a (not shown), not 0
    assert "CPU-only" in body["not_available"]["gpu"] and "gpu_us" not in t["keys"]
    assert len(t["rows"]) == min(300, len(body["rows"]))
    by_self = sorted(body["rows"], key=lambda r: -r["self_us"])
    assert [r["name"] for r in t["rows"][:5]] == [r["name"] for r in by_self[:5]]
    # ops whose calls have no recorded input (the DataLoader region here) say so, explicitly
    empty = {r["name"]: sum(e["calls"] for e in r["top_inputs"] if e["dims"] is None and e["types"] is None)
             for r in body["rows"] if any(e["dims"] is None and e["types"] is None for e in r.get("top_inputs") or [])}
    assert any(n.startswith("enumerate(DataLoader)") for n in empty), sorted(empty)
    cells = iframe.evaluate("""() => [...document.querySelectorAll('%s tbody tr')].map((tr) => [
        tr.querySelector('td.opname').textContent,
        [...tr.querySelectorAll('td.op-inputs .op-no-inputs')].map((d) => [d.textContent, d.title])])
      .filter((x) => x[1].length)""" % PANEL)
    assert {name for name, _ in cells} == {n for n in empty if n in {r["name"] for r in t["rows"]}} and cells
    for name, divs in cells:
        assert [text for text, _ in divs] == [f"×{empty[name]} no inputs"], (name, divs)
        assert all("record_shapes=True" in title and "no input shapes recorded" in title.lower() for _, title in divs)
    assert "not recorded" not in iframe.evaluate("() => document.querySelector('%s table.operators').textContent" % PANEL)

    # sorts by a clicked column (calls: descending, then ascending)
    iframe.click(f"{PANEL} th[data-key=calls]")
    calls = [r["calls"] for r in sorted(body["rows"], key=lambda r: -r["calls"])][:5]
    got = [int(r["calls"].replace(",", "").replace("\u202f", "")) for r in _table(iframe)["rows"][:5]]
    assert got == calls
    iframe.click(f"{PANEL} th[data-key=calls]")
    got = [int(r["calls"].replace(",", "").replace("\u202f", "")) for r in _table(iframe)["rows"][:5]]
    assert got == sorted(r["calls"] for r in body["rows"])[:5]

    # filters by name
    iframe.fill(f"{PANEL} input.op-filter", "conv")
    rows = _table(iframe)["rows"]
    want = [r for r in body["rows"] if "conv" in r["name"].lower()
            or any("conv" in str(e["dims"]).lower() for e in r.get("top_inputs") or [])]
    assert rows and len(rows) == len(want)
    assert all("conv" in r["name"].lower() for r in rows)
    iframe.fill(f"{PANEL} input.op-filter", "")

    # group by operator + input shape: one row per (name, dims, types) of the route
    iframe.select_option(f"{PANEL} select.op-group", "op_shape")
    _wait_table(iframe, "op_shape")
    shaped = wait_route(base, "operators", group="op_shape", **sel)
    assert not list(validate.iter_errors(shaped))
    t = _table(iframe)
    assert t["keys"][:2] == ["name", "calls"] and t["keys"][-2:] == ["dims", "types"]
    assert len(t["rows"]) == min(300, len(shaped["rows"])) and len(shaped["rows"]) > len(body["rows"])
    first = max(shaped["rows"], key=lambda r: r["self_us"])
    assert (t["rows"][0]["name"], t["rows"][0]["dims"]) == (first["name"], first["dims"] or "no inputs")
    no_inputs = [r for r in shaped["rows"] if r["dims"] is None and r["types"] is None]
    assert no_inputs
    dims_cells = iframe.evaluate("() => [...document.querySelectorAll('%s td.op-no-inputs')].map((td) => td.textContent)"
                                 % PANEL)
    shown_names = {r["name"] for r in t["rows"]}
    assert len(dims_cells) == 2 * sum(1 for r in no_inputs if r["name"] in shown_names) > 0  # dims and types cells
    assert set(dims_cells) == {"no inputs"}

    # the worker summary (two spans) has no per-step rows; one span has
    assert body["steps"] == [] and sel.get("span") is None, sel
    assert iframe.evaluate("() => document.querySelectorAll('%s select.op-step option').length" % PANEL) == 1
    span = iframe.evaluate("() => [...document.querySelectorAll('#bn-span option')].map((o) => o.value)"
                           ".filter((v) => v && v !== 'all')[0]")
    iframe.select_option("#bn-span", span)
    sel = dict(sel, span=span)
    span_body = wait_route(base, "operators", group="op_shape", **sel)
    iframe.wait_for_function("() => document.querySelectorAll('%s select.op-step option').length === %d"
                             % (PANEL, 1 + len(span_body["steps"])), timeout=120_000)
    iframe.select_option(f"{PANEL} select.op-group", "op_shape")
    _wait_table(iframe, "op_shape")
    if True:
        shaped = span_body
        step = span_body["steps"][-1]
        iframe.select_option(f"{PANEL} select.op-step", str(step))
        one = wait_route(base, "operators", group="op_shape", step=step, **sel)
        n = min(300, len(one["rows"]))
        iframe.wait_for_function("() => document.querySelector('%s .op-count').textContent.startsWith('%d of %d ')"
                                 % (PANEL, n, len(one["rows"])), timeout=60_000)
        assert len(_table(iframe)["rows"]) == n
        os.makedirs("test-artifacts", exist_ok=True)
        frame.locator(PANEL).screenshot(path=os.path.join("test-artifacts", "operators_step_by_shape.png"))
        assert sum(r["calls"] for r in one["rows"]) < sum(r["calls"] for r in shaped["rows"])

    # an op named like HTML stays text
    frame.locator("#bn-run").select_option(HTML_RUN)
    iframe.wait_for_function("() => document.querySelector('#bn-run').value === '%s' && "
                             "[...document.querySelectorAll('%s td.opname')].some((td) => td.textContent === %s)"
                             % (HTML_RUN, PANEL, json.dumps(EVIL)), timeout=120_000)
    assert iframe.evaluate("() => document.querySelectorAll('%s img, %s b').length" % (PANEL, PANEL)) == 0
    html_row = _table(iframe)["rows"][0]  # a GPU run: its columns are there
    assert html_row["gpu_us"] == "100 µs" and html_row["tc_pct"] == "0.0%"
    tops = iframe.evaluate("() => [...document.querySelectorAll('%s td.op-inputs')].map((td) => td.textContent)" % PANEL)
    assert any(EVIL_TYPE in t for t in tops)
    os.makedirs("test-artifacts", exist_ok=True)
    frame.locator(PANEL).screenshot(path=os.path.join("test-artifacts", "operators_html.png"))

    # a GPU run: the FLOP columns render the route's numbers (roofline.js and the Operator
    # view format them; the server computes them, METRICS.md "Operator view: FLOPs")
    frame.locator("#bn-run").select_option(GPU_RUN)
    iframe.wait_for_function("() => document.querySelector('#bn-run').value === '%s' && "
                             "document.querySelector('%s table.operators thead th[data-key=tflops]')"
                             % (GPU_RUN, PANEL), timeout=240_000)
    gpu_body = wait_route(base, "operators", **_selection(iframe))
    assert not list(validate.iter_errors(gpu_body))
    assert gpu_body["peak_gpu"] and "H100" in gpu_body["peak_gpu"]
    iframe.click(f"{PANEL} th[data-key=tflops]")  # largest achieved TFLOP/s first
    t = _table(iframe)
    assert {"flops", "tflops", "pct_of_peak", "bound"} <= set(t["keys"])
    by_name = {r["name"]: r for r in gpu_body["rows"]}
    shown = [r for r in t["rows"] if by_name[r["name"]]["tflops"] is not None]
    assert shown and shown[0]["name"] == max((r for r in gpu_body["rows"] if r["tflops"] is not None),
                                             key=lambda r: r["tflops"])["name"]
    for cells in shown:
        want = by_name[cells["name"]]
        got = float(cells["tflops"].replace(",", ""))
        assert abs(got - float(f"{want['tflops']:.3g}")) <= 1e-4 + 1e-9 * want["tflops"], (cells, want)
        assert cells["pct_of_peak"] == f"{want['pct_of_peak']:.1f}%", (cells, want)
        assert cells["bound"] == want["bound"] and want["bound"] in ("compute", "memory")
        assert want["pct_of_peak"] <= 100.0  # never above the GPU's peak
    panel_text = iframe.evaluate("() => document.querySelector('%s').textContent" % PANEL)
    assert f"the dense peak of {gpu_body['peak_gpu']}" in panel_text
    frame.locator(PANEL).screenshot(path=os.path.join("test-artifacts", "operators_flops_h100.png"))

    # a run profiled without record_shapes: "—" in the shape columns, the hover says why
    frame.locator("#bn-run").select_option(NO_SHAPES_RUN)
    iframe.wait_for_function("() => document.querySelector('#bn-run').value === '%s' && "
                             "[...document.querySelectorAll('%s td.opname')].some((td) => td.textContent === 'my_region')"
                             % (NO_SHAPES_RUN, PANEL), timeout=120_000)
    ns = wait_route(base, "operators", run=NO_SHAPES_RUN, group="op_shape")
    assert ns["record_shapes"] is False
    if iframe.evaluate("() => document.querySelector('%s select.op-group').value" % PANEL) != "op_shape":
        iframe.select_option(f"{PANEL} select.op-group", "op_shape")
    iframe.wait_for_function("() => document.querySelectorAll('%s td.op-no-shapes').length === 4" % PANEL,
                             timeout=60_000)
    cells = iframe.evaluate("() => [...document.querySelectorAll('%s td.op-no-shapes')].map((td) => [td.textContent, td.title])"
                            % PANEL)
    assert all(text == "—" and title.startswith("record_shapes=True was not set") for text, title in cells), cells
    assert not iframe.evaluate("() => document.querySelector('%s td.op-no-inputs')" % PANEL)
    frame.locator(PANEL).screenshot(path=os.path.join("test-artifacts", "operators_no_shapes.png"))
    w.check_clean()
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)
