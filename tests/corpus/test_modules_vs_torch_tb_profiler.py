"""Our nn.Module view (``source_attribution.modules``, METRICS.md §17) against torch-tb-profiler
0.4.3's Module view, run live on the shared H100 traces that carry ``nn.Module: <Class>_<id>``
frames: the bf16 BERT inference trace (TraceLens), the GPT-2 eager training run (forward on the
main thread, backward on the autograd thread) and the TimeSformer inference trace (a module
called three times inside one call of its parent).

torch-tb-profiler (tbp) is driven through its own code, as its RunLoader does per file:
``RunProfileData.parse`` (event parser, per-thread operator tree with a ``ModuleNode`` per module
frame), then ``RunGenerator.generate_run_profile`` whose ``module_stats`` come from
``module_op.aggegate_module_view`` (the hierarchy from ``Python id``/``Python parent id``,
statistics keyed by (name, ``Python module id``)); ``module_op.get_module_tree`` gives the call
tree of the timeline. The file is parsed from its path; the plugin's ``<run>/<worker>.pt.trace.json``
layout only matters for discovery (the BERT file's name would not be discovered).

Two tbp variants:
- **installed**: the PyPI 0.4.3 code as shipped, what the plugin shows.
- **mapped**: the same code with ``EventTypeMap['cuda_runtime'] = Runtime``, the one entry its last
  source (kineto @ 4b3b2ed, ../shared/oracles/README.md) adds for these traces. Its module view is
  taken from ``aggegate_module_view`` directly: ``generate_run_profile``'s overview divides by
  zero on the GPT-2 trace under this mapping.

Where both are sound they agree:
- **Module set and hierarchy**: the same paths (tbp's ``<Class>_<id>`` names joined from the root;
  the id is the ``Python module id``, so the name alone is the key) and the same parent of each,
  although tbp builds it from the Python ids and we from time containment on the thread.
- **Calls** = tbp's ``occurences`` (and the number of ``get_module_tree`` nodes per path).
- **Host total** = tbp's ``host_duration``: both sum the frames' durations. tbp computes each as
  ``(ts + dur) - ts`` in float64 on absolute µs timestamps (1.4e12 µs on BERT, ulp 2^-12 µs):
  the rounding of ``ts + dur`` is at most ulp/2 and the subtraction is exact (Sterbenz), so the
  sums agree within n × ulp/2 for n summed durations (measured: at most 0.496 ulp per duration).
- **GPU time** (mapped only): tbp's ``device_duration`` / ``self_device_duration`` equal our
  ``gpu_fwd_us`` / ``gpu_self_fwd_us`` minus the GPU time launched by ``cuda_driver`` calls (below),
  within the same ulp bound over the GPU events summed. Self means without child modules in both.

Where they differ, and why (each asserted):
1. **GPU time 0 in the installed 0.4.3**: its ``EventTypeMap`` has ``runtime`` but not
   ``cuda_runtime``, the category of every launch call in these traces (Kineto ≥ 2.0), so no
   runtime node exists, no kernel is tied to an operator, and every module's device time is 0.
2. **Kernels launched through the driver API** (``cuda_driver`` ``cuLaunchKernel``/
   ``cuLaunchKernelEx``: the cutlass/nvjet GEMMs of cuBLAS(Lt), cuDNN's flash SDPA) are in no
   tbp category at all, even mapped: tbp leaves them out, we count them (the loader takes launches
   from both categories). BERT: 164.509 µs of the model's 309.437 µs (22 GEMMs; tbp mapped:
   144.929 µs, and 0 for 22 of the 26 ``Linear`` modules).
3. **Backward GPU time**: tbp's module nodes only hold what runs inside the forward frame on the
   main thread; the backward ops run on the autograd thread outside any module frame, so tbp has
   no backward time (its backward pairing reads ``forward_backward`` flow events; Kineto writes
   ``fwdbwd``, so it pairs nothing). Ours maps them back (``gpu_bwd_us``, GPT-2: 76,291.758 µs of
   ``GPT2LMHeadModel_0``'s 129,990.635 µs).
4. **Self host time** means another thing: ours is the frame minus its child modules' frames
   (so the selves of a tree add up to its root's total); tbp's ``self_host_duration`` also
   subtracts the CPU ops the module calls directly: it is the module's Python overhead only.
   BERT: Σ self 4,216.941 µs (= the root) against tbp's 2,096.609 µs mapped; ``Linear_0``
   75.641 µs against 10.280 µs.
5. **A module called k times within one call of its parent** (TimeSformer's ``Identity_<i>`` drop
   path, 3 times per layer): tbp's hierarchy lists it k times under the parent, each entry with the
   module's statistics over all its calls (keyed by name and id), so the view shows 3 rows of
   3 calls and the children's totals add up to 3 × its time; ours has one row per path (3 calls).
6. **Runtime calls without an External id** (``cudaDeviceSynchronize``, ``cudaStreamIsCapturing``)
   all land on the first module node, mapped: tbp ties runtime calls to operators by External id,
   a ``ModuleNode``'s is None, and the lookup pops them for the first one. It subtracts their time
   from the root module's self host time wherever they ran, mostly outside its frame (BERT: the two
   ``cudaDeviceSynchronize`` of 11.910 µs around the step, 103.191 → 91.281 µs).
"""
from __future__ import annotations

import collections
import functools
import gzip
import json
import math
import tempfile

import pytest

from conftest import TRACES, need_torch_tb_profiler, real_report

BERT = "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
GPT2 = next((p.relative_to(TRACES).as_posix() for p in sorted((TRACES / "h100" / "gpt2_bf16_eager").glob(
    "*.pt.trace.json.gz"))), "h100/gpt2_bf16_eager/missing")
TSF = "tracelens/h100_timesformer/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
ALL = [BERT, GPT2, TSF]
IDS = ["bert", "gpt2_eager", "timesformer"]

pytestmark = pytest.mark.skipif(not all((TRACES / r).exists() for r in ALL),
                                reason="../shared/traces (H100 traces with nn.Module frames) not present")

# ---------------------------------------------------------------------------- the three views


def _flatten(stats):
    """tbp's Stats tree -> {path: (Stats, parent path, [child Stats entries])}."""
    out = {}

    def walk(ss, prefix, parent):
        for s in ss:
            path = prefix + s.name
            assert path not in out or out[path][0] == s  # a repeated entry carries the same stats
            out[path] = (s, parent, list(s.children))
            walk(s.children, path + "/", path)

    walk(stats or [], "", None)
    return out


def _call_tree_counts(roots):
    """get_module_tree's per-call nodes -> {path: [calls, Σ host µs]}."""
    out = collections.defaultdict(lambda: [0, 0.0])

    def walk(nodes, prefix):
        for n in nodes:
            path = prefix + n.name.replace("nn.Module: ", "")
            out[path][0] += 1
            out[path][1] += n.end_time - n.start_time
            walk(n.children, path + "/")

    walk(roots, "")
    return dict(out)


@functools.lru_cache(maxsize=None)
def tbp(rel: str) -> dict:
    """tbp's module views of one trace (both variants), computed once per test process."""
    need_torch_tb_profiler()
    from torch_tb_profiler.profiler import trace as tbp_trace
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.module_op import aggegate_module_view, get_module_tree
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    def parse(cache):
        data = RunProfileData.parse("worker0", "span", str(TRACES / rel), cache)
        return data[0] if isinstance(data, tuple) else data

    out = {"installed_has_cuda_runtime": "cuda_runtime" in tbp_trace.EventTypeMap}
    with tempfile.TemporaryDirectory() as cache:
        data = parse(cache)
        run = RunGenerator("worker0", "span", data).generate_run_profile()
        out.update(installed=_flatten(run.module_stats), installed_views=[v.display_name for v in run.views],
                   installed_has_runtime=data.has_runtime)
        assert "cuda_runtime" not in tbp_trace.EventTypeMap
        tbp_trace.EventTypeMap["cuda_runtime"] = tbp_trace.EventTypes.RUNTIME
        try:
            data = parse(cache)
        finally:
            del tbp_trace.EventTypeMap["cuda_runtime"]
        out.update(mapped=_flatten(aggegate_module_view(data.tid2tree, data.events)),
                   mapped_has_runtime=data.has_runtime,
                   call_tree=_call_tree_counts(get_module_tree(data.tid2tree)))
    return out


def ours(rel: str) -> dict:
    return {r["path"]: r for r in real_report(rel)["source_attribution"]["modules"]}


@functools.lru_cache(maxsize=None)
def raw(rel: str) -> dict:
    """Facts read straight from the file, per module name (``<Class>_<id>``, one path each here):
    GPU time launched inside its frames by ``cuda_runtime`` / ``cuda_driver`` calls (all frames
    or only the innermost one: total / self), and the host µs of the CPU ops whose nearest
    enclosing frame-or-op is the module's frame (what tbp's self also subtracts). Also: the
    runtime calls without an ``External id`` (count, Σ µs) and ``ulp``, the float64 spacing at
    the largest timestamp."""
    with gzip.open(TRACES / rel) as f:
        ev = json.load(f)["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    gpu = collections.defaultdict(lambda: [0, 0.0])  # correlation -> [GPU events, µs]
    for e in xs:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            g = gpu[e["args"].get("correlation")]
            g[0] += 1
            g[1] += e["dur"]
    zero = lambda: [0, 0.0]  # noqa: E731
    facts = collections.defaultdict(lambda: collections.defaultdict(zero))
    kinds = {"python_function": "M", "cpu_op": "O", "cuda_runtime": "R", "cuda_driver": "D"}
    per_thread = collections.defaultdict(list)
    for e in xs:
        k = kinds.get(e.get("cat"))
        if k == "M" and not e["name"].startswith("nn.Module: "):
            continue
        if k:
            per_thread[(e["pid"], e["tid"])].append((e["ts"], -e.get("dur", 0), "MORD".index(k), k, e))
    for items in per_thread.values():
        stack = []  # open module frames and ops, outermost first
        for ts, mdur, _, k, e in sorted(items, key=lambda t: t[:3]):
            end = ts - mdur
            while stack and not stack[-1]["ts"] + stack[-1]["dur"] >= end:
                stack.pop()
            top = stack[-1] if stack else None
            top_module = top["name"][11:] if top is not None and top.get("cat") == "python_function" else None
            if k == "O" and top_module:
                facts[top_module]["direct_ops"][0] += 1
                facts[top_module]["direct_ops"][1] += e["dur"]
            if k in "RD" and e["args"].get("correlation") in gpu:
                n, us = gpu[e["args"]["correlation"]]
                frames = [s["name"][11:] for s in stack if s.get("cat") == "python_function"]
                for name in frames:
                    facts[name][k][0] += n
                    facts[name][k][1] += us
                if frames:
                    facts[frames[-1]][k + "_self"][0] += n
                    facts[frames[-1]][k + "_self"][1] += us
            if k in "MO":
                stack.append(e)
    ulp = math.ulp(max(e["ts"] + e.get("dur", 0) for e in xs))
    orphans = [e["dur"] for e in xs if e.get("cat") == "cuda_runtime"
               and e["args"].get("External id", e["args"].get("external id")) is None]
    flows = collections.Counter(e.get("cat") for e in ev if e.get("ph") in ("s", "f"))
    return {"facts": facts, "ulp": ulp, "orphan_runtime": (len(orphans), sum(orphans)), "flows": flows}


def close(a, b, n, ulp):
    """|a - b| within n float64 roundings of ulp/2 (plus the float error of our own sums)."""
    return abs(a - b) <= n * ulp / 2 + 1e-9 * max(abs(a), abs(b), 1.0)


# ---------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_same_modules_hierarchy_and_calls(rel):
    mine, t = ours(rel), tbp(rel)
    assert "Module" in t["installed_views"]
    assert len(mine) == {BERT: 84, GPT2: 79, TSF: 334}[rel]
    for view in ("installed", "mapped"):
        assert set(t[view]) == set(mine), view
        for path, (s, parent, _) in t[view].items():
            m = mine[path]
            assert (m["parent"], m["calls"], m["module"], m["class"]) == \
                (parent, s.occurences, s.name, s.name.rsplit("_", 1)[0]), (view, path)
    assert {p: c for p, (c, _) in t["call_tree"].items()} == {p: m["calls"] for p, m in mine.items()}


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_host_total_time_equal(rel):
    mine, t, ulp = ours(rel), tbp(rel), raw(rel)["ulp"]
    for path, m in mine.items():
        for view in ("installed", "mapped"):
            s = t[view][path][0]
            assert close(m["total_us"], s.host_duration, m["calls"], ulp), (view, path, m["total_us"], s.host_duration)
        assert close(m["total_us"], t["call_tree"][path][1], m["calls"], ulp), path
    root = [m for m in mine.values() if m["parent"] is None]
    assert len(root) == 1 and round(root[0]["total_us"], 3) == {BERT: 4216.941, GPT2: 44951.633, TSF: 30460.089}[rel]


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_gpu_time_equal_but_for_driver_launches(rel):
    """tbp (mapped) counts the GPU time launched by ``cuda_runtime`` calls inside the frame; we
    count it plus the ``cuda_driver`` launches (difference 2): each against the file itself."""
    mine, t, r = ours(rel), tbp(rel), raw(rel)
    facts, ulp = r["facts"], r["ulp"]
    for path, m in mine.items():
        s, f = t["mapped"][path][0], facts[m["module"]]
        assert close(s.device_duration, f["R"][1], f["R"][0], ulp), path
        assert close(s.self_device_duration, f["R_self"][1], f["R_self"][0], ulp), path
        assert close(m["gpu_fwd_us"], f["R"][1] + f["D"][1], 0, ulp), path
        assert close(m["gpu_self_fwd_us"], f["R_self"][1] + f["D_self"][1], 0, ulp), path
        if f["D"][0] == 0:  # no driver launch inside: the same number
            assert close(m["gpu_fwd_us"], s.device_duration, f["R"][0], ulp), path


# ---------------------------------------------------------------------------- the differences


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_installed_0_4_3_has_no_gpu_time(rel):
    """Difference 1: no ``cuda_runtime`` category in 0.4.3, so no runtime, every device time 0."""
    mine, t = ours(rel), tbp(rel)
    assert not t["installed_has_cuda_runtime"]
    assert not t["installed_has_runtime"] and t["mapped_has_runtime"]
    assert all(s.device_duration == 0 and s.self_device_duration == 0 for s, _, _ in t["installed"].values())
    assert sum(m["gpu_us"] for m in mine.values() if m["parent"] is None) > 100


# model GPU µs: ours (forward), tbp mapped, driver-launched (GPU events), ours backward
ROOT_GPU = {BERT: (309.437, 144.929, 164.509, 22, 0.0),
            GPT2: (53698.877, 28644.902, 25053.985, 93, 76291.758),
            TSF: (154969.032, 109970.678, 44998.353, 48, 0.0)}


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_driver_launches_and_backward_are_ours_only(rel):
    """Differences 2 and 3, at the root module (measured numbers)."""
    mine, t, facts = ours(rel), tbp(rel), raw(rel)["facts"]
    root = next(m for m in mine.values() if m["parent"] is None)
    fwd, tbp_us, drv_us, drv_n, bwd = ROOT_GPU[rel]
    f = facts[root["module"]]
    assert (round(root["gpu_fwd_us"], 3), round(t["mapped"][root["path"]][0].device_duration, 3),
            round(f["D"][1], 3), f["D"][0], round(root["gpu_bwd_us"], 3)) == (fwd, tbp_us, drv_us, drv_n, bwd)
    assert round(root["gpu_us"], 3) == round(fwd + bwd, 3)
    # tbp's backward pairing reads flow events of category forward_backward: Kineto names them fwdbwd
    flows = raw(rel)["flows"]
    assert flows["forward_backward"] == 0 and (flows["fwdbwd"] > 0) == (rel == GPT2)
    if rel == BERT:  # 22 of the 26 Linear modules launch their GEMM through cuLaunchKernel
        lin = [m for m in mine.values() if m["class"] == "Linear"]
        zero = [m for m in lin if t["mapped"][m["path"]][0].device_duration == 0]
        assert (len(lin), len(zero)) == (26, 22) and all(m["gpu_fwd_us"] > 5 for m in zero)


# runtime calls without an External id: (count, Σ µs) that tbp (mapped) takes off the root's self
ORPHANS = {BERT: (2, 11.91), GPT2: (10, 71.847), TSF: (2, 27.32)}


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_self_host_time_definitions(rel):
    """Differences 4 and 6: ours = total - child modules = tbp's total - its (distinct)
    children's totals; tbp's own self also leaves out the ops called directly and, mapped, the
    runtime calls that carry no External id, all on the first module node (the root's first call)."""
    mine, t, r = ours(rel), tbp(rel), raw(rel)
    facts, ulp = r["facts"], r["ulp"]
    n_orphans, orphan_us = r["orphan_runtime"]
    assert (n_orphans, round(orphan_us, 3)) == ORPHANS[rel]
    root = next(m for m in mine.values() if m["parent"] is None)
    for path, m in mine.items():
        for view in ("installed", "mapped"):
            s, _, kids = t[view][path]
            distinct = {c.name: c for c in kids}.values()
            n = m["calls"] + sum(c.occurences for c in distinct)
            assert close(m["self_us"], s.host_duration - sum(c.host_duration for c in distinct), n, ulp), (view, path)
            ops_n, ops_us = facts[m["module"]]["direct_ops"]
            if view == "mapped" and m is root:
                ops_n, ops_us = ops_n + n_orphans, ops_us + orphan_us
            assert close(s.self_host_duration, m["self_us"] - ops_us, n + ops_n, ulp), (view, path)
    assert close(sum(m["self_us"] for m in mine.values()), root["total_us"], 0, 0)
    if rel == BERT:  # its root module calls no op: the installed self is ours, the mapped one 11.91 µs less
        assert round(root["self_us"], 3) == round(t["installed"][root["path"]][0].self_host_duration, 3) == 103.191
        assert round(t["mapped"][root["path"]][0].self_host_duration, 3) == 91.281
        assert round(sum(s.self_host_duration for s, _, _ in t["mapped"].values()), 3) == 2096.609
        lin0 = t["mapped"]["BertLMHeadModel_0/BertModel_0/BertEncoder_0/BertLayer_0/BertAttention_0/"
                           "BertSdpaSelfAttention_0/Linear_0"][0]
        assert (round(lin0.host_duration, 3), round(lin0.self_host_duration, 3)) == (75.641, 10.28)


@pytest.mark.parametrize("rel", ALL, ids=IDS)
def test_repeated_calls_within_a_parent_call(rel):
    """Difference 5: tbp lists a module k times under its parent when it runs k times within one
    call of the parent, each entry with all its calls; ours has one row per path."""
    mine, t = ours(rel), tbp(rel)
    repeated = {}
    for path, (s, _, kids) in t["mapped"].items():
        for name, k in collections.Counter(c.name for c in kids).items():
            child = mine[f"{path}/{name}"]
            assert child["calls"] == k * mine[path]["calls"], (path, name)
            if k > 1:
                repeated[child["module"]] = (k, child["calls"])
    want = {f"Identity_{i}": (3, 3) for i in range(12)} if rel == TSF else {}
    assert repeated == want
