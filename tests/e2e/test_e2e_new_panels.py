"""End to end: the panels of the newer analyses in a real TensorBoard and a real headless Chromium.

- FLOPs & roofline (report.flops, METRICS.md §15): on demo_logs' h100_fp32_matmul and
  resnet50_v100_nw0 the MFU card and the roofline panel name the GPU and the main precision of
  the /report route's `flops`, the chart draws both roofs and one point per op class with FLOPs
  (its hover names the class and the server's numbers), the class table has the route's rows.
- Source lines & modules (§17): on the H100 GPT-2 eager trace (with_stack=True) the top sync line
  is `record_h100.py(165): step`, the module tree's first root is GPT2LMHeadModel (expand/collapse
  work), a click on a line posts torch-tb-profiler's {filename, line} message upwards; a trace
  without stacks shows one n/a line with the with_stack hint.
- torch.compile details (§16) and Collectives (§18): a hand-built run whose record_function label
  and Triton kernel are named like HTML shows them as text; ddp_straggler_2rank's Ranks view
  shows the collective-bandwidth section (n/a with the server's reason on these gloo CPU ranks).
- Collectives on the sharded demo run (collectives_shard_2rank, rank 0): one row per kind and
  message size, bytes per call equal to demo_truth (what the code sent, nccl-tests' convention).
- No page errors, no console errors, no dialog, no request outside TensorBoard.
"""
from __future__ import annotations

import gzip
import json
import os

from conftest import DEMO_LOGS, TRACES, TraceBuilder, link_demo_run, wait_route

EVIL_LABEL = '<img src=x onerror="alert(1)">'
EVIL_TRITON = "triton_poi_fused_add_<b>bold</b>_0"
GPT2 = TRACES / "h100" / "gpt2_bf16_eager" / "worker0.1795701567436882984.pt.trace.json.gz"
NO_STEPS = TRACES / "tracelens" / "torch_compile_triton" / "trace.json.gz"


def _logdir(tmp_path):
    logs = tmp_path / "logs"
    for run in ("h100_fp32_matmul", "resnet50_v100_nw0", "ddp_straggler_2rank", "h200_stack_item_slow_module",
                "collectives_shard_2rank"):
        link_demo_run(logs, run, run)
    (logs / "gpt2_stacks").mkdir()
    os.symlink(GPT2, logs / "gpt2_stacks" / GPT2.name)
    (logs / "no_profiler_step").mkdir()  # MI300X torch.compile trace: no ProfilerStep#N at all
    os.symlink(NO_STEPS, logs / "no_profiler_step" / "worker0.1700000000001.pt.trace.json.gz")
    b = TraceBuilder()
    for n, off in ((1, 0), (2, 1000)):
        b.step(n, off, 1000)
        b.cpu(EVIL_LABEL, off + 10, 400, cat="user_annotation")
        b.launch(EVIL_TRITON, off + 20, kernel_ts=off + 100, kernel_dur=50, call="cuLaunchKernel")
    b.write(logs / "html_names" / "worker0.1700000000000.pt.trace.json.gz")
    return logs


def _js3(x):
    """roofline.js's number: 3 significant digits (String(Number(x.toPrecision(3))))."""
    return format(float(f"{x:.3g}"), "g")


def _selection(iframe):
    sel = iframe.evaluate("() => ({run: document.querySelector('#bn-run').value,"
                          " worker: document.querySelector('#bn-worker').value,"
                          " span: document.querySelector('#bn-span').value})")
    return {k: v for k, v in sel.items() if v and v != "all"}


def _open(w, frame, iframe, run, ready):
    iframe.evaluate("(sel) => document.querySelectorAll(sel).forEach((e) => e.remove())", ready)  # not the last view's
    frame.locator("#bn-run").select_option(run)
    iframe.wait_for_function("([r, sel]) => document.querySelector('#bn-run').value === r && document.querySelector(sel)",
                             arg=[run, ready], timeout=240_000)
    return wait_route(w.base, "report", timeout=240, **_selection(iframe))


def _check_roofline(iframe, rep):
    f = rep["flops"]
    peak = f["peak"]
    # the MFU card: the server's verdict words name the GPU and the precision
    card = iframe.evaluate("() => document.querySelector('.card[data-card=mfu]').textContent")
    assert rep["verdicts"]["mfu"]["verdict"] in card
    assert peak["gpu"] in card and f["main_precision"] in card
    head = iframe.evaluate("() => { const p = document.querySelector('#bn-panel-roofline .roof-gpu');"
                           " return {text: p.textContent, gpu: p.dataset.gpu, prec: p.dataset.precision}; }")
    assert head["gpu"] == peak["gpu"] and head["prec"] == f["main_precision"]
    assert f"GPU: {peak['gpu']}" in head["text"] and peak["device_name"] in head["text"]
    assert f"main precision {f['main_precision']}" in head["text"]
    assert f"{f['main_precision']} dense peak {_js3(f['peak_tflops'])} TFLOP/s" in head["text"]
    iframe.wait_for_function("() => document.querySelector('#bn-panel-roofline svg.roofline-chart')", timeout=30_000)
    chart = iframe.evaluate("""() => {
      const svg = document.querySelector('#bn-panel-roofline svg.roofline-chart');
      return {roofs: [...svg.querySelectorAll('[data-roof]')].map((e) => e.dataset.roof),
              points: [...svg.querySelectorAll('circle.roof-class')].map((c) => [c.dataset.name, c.querySelector('title').textContent]),
              kernels: svg.querySelectorAll('circle.roof-kernel').length};
    }""")
    assert sorted(chart["roofs"]) == ["compute", "memory"]
    want = {k for k, c in f["by_class"].items() if (c.get("intensity") or 0) > 0 and (c.get("achieved_tflops") or 0) > 0}
    assert {n for n, _ in chart["points"]} == want and want
    for name, title in chart["points"]:
        c = f["by_class"][name]
        assert f"op class: {name}" in title and f"{c['bound']}-bound" in title
        assert f"{c['roofline_pct']:.1f}% of the roofline" in title
    assert chart["kernels"] == sum(1 for k in f["kernels"] if (k.get("intensity") or 0) > 0 and (k.get("achieved_tflops") or 0) > 0)
    rows = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-roofline table.roofline-table tbody tr')]"
                           ".map((tr) => [tr.dataset.class, [...tr.children].map((td) => td.textContent.trim())])")
    assert {r[0] for r in rows} == set(f["by_class"])
    for name, cells in rows:
        c = f["by_class"][name]
        assert cells[1] == (c["precision"] or "—") and cells[4] == (c["bound"] or "n/a")
        assert cells[3] == (f"{c['roofline_pct']:.1f}%" if c["roofline_pct"] is not None else "n/a")
        assert cells[5] == f"{c['step_pct']:.1f}%"


def test_new_panels(tmp_path, tensorboard_server, browser_page):
    base = tensorboard_server(_logdir(tmp_path))
    w = browser_page(base, viewport=(1400, 1000))
    console = []
    # console errors of the plugin's own modules (TensorBoard's page may log its own)
    w.page.on("console", lambda m: console.append(f"{m.location}: {m.text}")
              if m.type == "error" and "bottlenecks" in str((m.location or {}).get("url", "")) else None)
    frame = w.open_tab()
    iframe = w.plugin_frame()
    iframe.wait_for_function("() => document.querySelectorAll('#bn-run option').length >= 5", timeout=120_000)

    # ---- FLOPs & roofline: an H100 fp32 GEMM run (worker summary of 2 spans) and the V100 ResNet-50
    for run in ("h100_fp32_matmul", "resnet50_v100_nw0"):
        rep = _open(w, frame, iframe, run, "#bn-panel-roofline .roof-gpu")
        _check_roofline(iframe, rep)

    # ---- Source lines & modules: the GPT-2 eager trace recorded with_stack=True
    rep = _open(w, frame, iframe, "gpt2_stacks", "#bn-panel-source table.module-tree")
    sa = rep["source_attribution"]
    assert sa["bottlenecks"]["sync"][0]["frame"] == "record_h100.py(165): step"
    first_sync = iframe.evaluate("() => document.querySelector('#bn-panel-source table.src-sync tbody tr td').textContent")
    assert first_sync == "record_h100.py(165): step"
    roots = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-source tr.module-row[data-depth=\"0\"]')]"
                            ".map((tr) => tr.dataset.path)")
    assert roots[0].startswith("GPT2LMHeadModel") and roots == [m["path"] for m in sa["modules"] if m["depth"] == 0]
    n_open = iframe.evaluate("() => document.querySelectorAll('#bn-panel-source tr.module-row').length")
    iframe.click("#bn-panel-source tr.module-row[data-depth='0'] button.tree-toggle")  # collapse the root
    assert iframe.evaluate("() => document.querySelectorAll('#bn-panel-source tr.module-row').length") == len(roots) < n_open
    iframe.click("#bn-panel-source tr.module-row[data-depth='0'] button.tree-toggle")  # and open it again
    assert iframe.evaluate("() => document.querySelectorAll('#bn-panel-source tr.module-row').length") == n_open
    labels = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-source table.src-labels tbody tr td:first-child')]"
                             ".map((td) => td.textContent)")
    assert set(labels) == {x["name"] for x in sa["labels"]}
    # a click on a line posts torch-tb-profiler's message to the frame above TensorBoard (VS Code)
    w.page.evaluate("() => { window.__posted = []; window.addEventListener('message', (e) => window.__posted.push(e.data)); }")
    iframe.click("#bn-panel-source table.src-sync button.src-line")
    w.page.wait_for_function("() => window.__posted.some((d) => d && d.filename)", timeout=10_000)
    posted = [d for d in w.page.evaluate("() => window.__posted") if isinstance(d, dict) and "filename" in d]
    assert posted == [{"filename": "record_h100.py", "line": 165}]
    assert not any(u for u in w.requests if "record_h100" in u)  # a line is no link the tab opens

    # ---- the demo's with_stack run on an H200 (ground truth in the trace, demo_truth): the
    # .item() sync names the line PyTorch's inspect gave, the slow module leads the tree by GPU time
    (raw_path,) = (DEMO_LOGS / "h200_stack_item_slow_module").glob("*.pt.trace.json.gz")
    with gzip.open(raw_path, "rt", encoding="utf-8") as f:
        truth = json.load(f)["demo_truth"]
    rep = _open(w, frame, iframe, "h200_stack_item_slow_module", "#bn-panel-source table.module-tree")
    assert rep["source_attribution"]["bottlenecks"]["sync"][0]["frame"] == truth["sync"]["frame"]
    first_sync = iframe.evaluate("() => document.querySelector('#bn-panel-source table.src-sync tbody tr td').textContent")
    assert first_sync == truth["sync"]["frame"]
    tree = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-source tr.module-row')]"
                           ".map((tr) => [tr.dataset.depth, tr.dataset.path])")
    assert tree[0][0] == "0" and tree[0][1].startswith(truth["slow_module"]["parent_class"])
    assert tree[1][0] == "1" and tree[1][1].split("/")[-1].startswith(truth["slow_module"]["class"] + "_")
    # the sync recommendation (the GPU idles after each .item() until the host launches
    # again, §8) names that line first in its evidence
    rec = iframe.evaluate("() => { const li = [...document.querySelectorAll('li.rec')].find((e) =>"
                          " e.querySelector('.rec-rule')?.textContent === 'synchronization');"
                          " return li ? [...li.querySelectorAll('ul.evidence li')].map((e) => e.textContent) : null; }")
    assert rec and rec[0].startswith(truth["sync"]["frame"]), rec

    # ---- no ProfilerStep (issue 20 item 8): the header says one window, not "1 step (0)", and
    # the launch row counts the window's kernels (launch.kernels_per_window)
    rep = _open(w, frame, iframe, "no_profiler_step", ".summary-line")
    assert rep["steps"]["found"] is False
    bar = iframe.evaluate("() => document.querySelector('.summary-line').textContent")
    assert "one window (no ProfilerStep)" in bar and " step" not in bar.replace("ProfilerStep", ""), bar
    launch_row = iframe.evaluate("() => [...document.querySelectorAll('table.kv th')].find((d) => d.textContent === 'Kernel launch')"
                                 "?.nextElementSibling?.textContent")
    assert f"{rep['launch']['kernels_per_window']:,} kernels in the one window" in launch_row, launch_row
    assert "of the window" in launch_row and "per step" not in launch_row

    # ---- no stacks (h100_fp32_matmul): one n/a line with the with_stack hint; labels still listed
    _open(w, frame, iframe, "h100_fp32_matmul", "#bn-panel-source .src-na")
    na = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-source .src-na')].map((p) => p.textContent)")
    assert len(na) == 1 and "n/a" in na[0] and "with_stack=True" in na[0]
    assert not iframe.evaluate("() => document.querySelector('#bn-panel-source table.module-tree')")
    # eager run on one process: no Compile and no Collectives/Ranks section (the server's
    # report.layout.sections, issue 35), so neither panel; the cards say why (n/a)
    rep = wait_route(base, "report", **_selection(iframe))
    sections = [x["id"] for x in rep["layout"]["sections"]]
    assert "compile" not in sections and "ranks" not in sections, sections
    bar = iframe.evaluate("() => [...document.querySelectorAll('#bn-section-bar [data-section]')].map((b) => b.dataset.section)")
    assert bar == sections + ["all"], bar
    for panel in ("compilation", "collectives"):
        assert not iframe.evaluate(f"() => document.querySelector('#bn-panel-{panel}')"), panel
    assert rep["verdicts"]["compilation"]["severity"] == "na"

    # ---- HTML-looking names (a record_function label, a Triton kernel) render as text
    rep = _open(w, frame, iframe, "html_names", "#bn-panel-compilation table.triton-kernels")
    assert [k["name"] for k in rep["compilation"]["kernels"]] == [EVIL_TRITON]
    kern = iframe.evaluate("() => document.querySelector('#bn-panel-compilation table.triton-kernels tbody td').textContent")
    assert kern == EVIL_TRITON
    label = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-source table.src-labels tbody td:first-child')]"
                            ".map((td) => td.textContent)")
    assert EVIL_LABEL in label
    assert iframe.evaluate("() => document.querySelectorAll('img, #bn-view b').length") == 0

    # ---- the Ranks view of a 2-rank DDP run: the collective-bandwidth section, here n/a with the reason
    frame.locator("#bn-run").select_option("ddp_straggler_2rank")
    iframe.wait_for_function("() => document.querySelector('#bn-ranks .coll-bw')", timeout=240_000)
    ranks = wait_route(base, "ranks", timeout=240, run="ddp_straggler_2rank")
    cb = ranks["collective_bandwidth"]
    text = iframe.evaluate("() => document.querySelector('#bn-ranks .coll-bw').textContent")
    if cb["available"] and cb["groups"]:
        kinds = iframe.evaluate("() => [...document.querySelectorAll('#bn-ranks table.coll-bw-table tbody tr')].map((t) => t.dataset.kind)")
        assert sorted(kinds) == sorted(g["kind"] for g in cb["groups"])
    else:
        assert "n/a" in text and ranks["not_available"]["ranks.collective_bandwidth"] in text

    # ---- the FSDP-style sharded run (all_gather_into_tensor / reduce_scatter_tensor on gloo):
    # the Collectives panel of rank 0 shows each kind with the bytes per call the code sent
    # (demo_truth: nccl-tests' convention, the gathered / scattered tensor)
    (raw_path,) = (DEMO_LOGS / "collectives_shard_2rank").glob("rank0.*.pt.trace.json.gz")
    with gzip.open(raw_path, "rt", encoding="utf-8") as f:
        shard_truth = json.load(f)["demo_truth"]
    frame.locator("#bn-run").select_option("collectives_shard_2rank")
    iframe.wait_for_function("() => document.querySelector('#bn-run').value === 'collectives_shard_2rank'"
                             " && document.querySelector('#bn-worker option[value=\"rank0\"]')", timeout=240_000)
    if iframe.evaluate("() => document.querySelector('#bn-worker').value") != "rank0":
        frame.locator("#bn-worker").select_option("rank0")
    # this run's table (the DDP run before has all_reduce only)
    iframe.wait_for_function("() => document.querySelector('#bn-worker').value === 'rank0' && [...document.querySelectorAll("
                             "'#bn-panel-collectives table.coll-bw-table tbody tr')].some((tr) => tr.dataset.kind === 'reduce_scatter')",
                             timeout=240_000)
    rep = wait_route(base, "report", timeout=240, **_selection(iframe))
    assert rep["collectives"]["source"] == "cpu_spans"
    want = sorted({("reduce_scatter" if c["op"].startswith("reduce_scatter") else "all_gather", c["nccl_tests_bytes"])
                   for c in shard_truth["calls_per_step"]})
    got = sorted({(g["kind"], g["bytes_per_call"]) for g in rep["collectives"]["groups"]})
    assert got == want, (got, want)
    shown = iframe.evaluate("() => [...document.querySelectorAll('#bn-panel-collectives table.coll-bw-table tbody tr')]"
                            ".map((tr) => [tr.dataset.kind, tr.querySelector('td.col-bytes_per_call').textContent])")
    # the tab's own formatter (index.js imports its modules from ./static/)
    expected_text = iframe.evaluate("async (rows) => { const {fmtBytes} = await import('./static/format.js');"
                                    " return rows.map(([k, b]) => [k, fmtBytes(b)]); }", [list(x) for x in want])
    assert sorted(map(tuple, shown)) == sorted(map(tuple, expected_text)), shown

    w.check_clean()
    assert not console, console
