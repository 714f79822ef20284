"""The ground-truth demo runs (tb_bottleneck_demo/ground_truth.py): the plugin's report
agrees with what PyTorch itself says about each run, on runs generated now (through the
CLI, ``python -m tb_bottleneck_demo OUT --ground-truth``) and on those committed in
demo_logs/.

Each trace carries its ground truth as the top-level ``demo_truth`` key, written by the
generator while the profiler recorded:

- ``stack_item_slow_module`` (issue 22, metrics §17): the file and first line of the
  function whose ``.item()`` logs the loss (``inspect.getsourcelines``; with_stack frames are
  named ``file(first line): function``), and the slow module's class, ``SlowMixer``. Its
  share of its parent's children is bounded below by construction: each of its SLOW_REPS
  matmuls multiplies the same (512, 512) activations by a 512 x 512 matrix, at least the
  work of any of the 3 sibling ops (embed Linear 64->512, ReLU, head Linear 512->10), so
  share >= SLOW_REPS / (SLOW_REPS + 3) = 8/11 (measured: about 94 %).
- the compiled pair (issue 23, metrics §16): ``torch._dynamo.explain`` (graph_count,
  graph_break_count per call, one call per step) and the per-step deltas of
  ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: every graph compiled in a
  recorded step is a recompile (each frame's first compile ran in the warm-up step).
- ``collectives_shard_2rank`` (issue 24, metrics §12/§18): the bytes of each
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` call, from the code.

Limits found here (the tests pin today's behaviour, so a change in the analysis shows):
- On a CPU trace ``bottlenecks.sync`` is empty: metrics §8 counts CUDA/HIP synchronisation
  calls, and a CPU ``.item()`` waits for nothing. The ``.item()`` line is still named in
  ``source_attribution.lines`` (its ``aten::item`` ops). With CUDA the run's ``.item()``
  is a real sync (test_stack_sync_line_on_cuda, skipped without a GPU).
- ``report.collectives`` (§18) reads the ``gloo:`` CPU spans of a trace without
  communication kernels (source "cpu_spans"): each call named by the op that enqueued it
  (``reduce_scatter_tensor`` runs as ``gloo:all_reduce`` and is named reduce_scatter), bytes
  in nccl-tests' size, busbw from the span's duration (waiting included), no link peak.
  The rank partial (§12) reads the same spans: an all-gather's bytes there are its recorded
  input (the local shard: 1/n of nccl-tests' size), and the reduce-scatter shows as kind
  ``all_reduce`` with the full input's bytes (= nccl-tests' reduce-scatter size).
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tb_bottleneck_demo import generator as demo  # noqa: E402
from tb_bottleneck_demo import ground_truth as gt  # noqa: E402
from tb_bottleneck_plugin.trace import discovery  # noqa: E402
from tb_bottleneck_plugin.views import ranks
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.trace.loader import load_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MAX_TRACE_BYTES = 300 * 1024
# Inductor on CUDA records its compile and autotuning spans: the broken run's trace is larger
MAX_H100_TRACE_BYTES = 700 * 1024
# The same runs made on a GPU (``--ground-truth --device cuda``: the with_stack run on an
# H200, the compiled pair with Inductor on an H100; demo_logs/README.md).
GPU_RUN_DIRS = {gt.STACK_RUN: "h200_stack_item_slow_module", gt.COMPILE_PAIR[0]: "h100_compile_graph_break",
                gt.COMPILE_PAIR[1]: "h100_compile_static_fixed"}
H100_RUNS = tuple(GPU_RUN_DIRS)
_COMMITTED = set()


@pytest.fixture(scope="module", params=["generated", "committed", "committed_h100"])
def logdir(request, tmp_path_factory):
    if request.param == "generated":
        out = tmp_path_factory.mktemp("ground_truth")
        assert demo.main([str(out), "--ground-truth"]) == 0
        assert sorted(os.listdir(out)) == sorted(gt.GROUND_TRUTH_RUNS)
        return out
    if request.param == "committed_h100":
        # a logdir that names the H100 runs as the generator does
        out = tmp_path_factory.mktemp("h100")
        for run in H100_RUNS:
            (out / run).symlink_to(REPO / "demo_logs" / GPU_RUN_DIRS[run], target_is_directory=True)
        _COMMITTED.add(out)
        return out
    _COMMITTED.add(REPO / "demo_logs")
    return REPO / "demo_logs"


def _committed(logdir: Path) -> bool:
    return logdir in _COMMITTED


def _require(logdir: Path, run: str) -> None:
    if not (logdir / run).exists():
        pytest.skip(f"{run} is made on a CPU only (gloo)")


def _trace_files(run_dir: Path, prefix: str = "worker0"):
    return sorted(run_dir.glob(f"{prefix}*.pt.trace.json.gz"))


def _one(logdir: Path, run: str):
    (path,) = _trace_files(logdir / run)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    return path, raw, report.analyze_trace(load_trace(str(path)))["report"]


def test_runs_are_small_and_carry_their_truth(logdir):
    h100 = sorted(os.listdir(logdir)) == sorted(H100_RUNS)
    for run in H100_RUNS if h100 else gt.GROUND_TRUTH_RUNS:
        files = _trace_files(logdir / run, "rank" if run == gt.COLLECTIVES_RUN else "worker0")
        assert len(files) == (2 if run == gt.COLLECTIVES_RUN else 1), (run, files)
        for path in files:
            assert path.stat().st_size < (MAX_H100_TRACE_BYTES if h100 else MAX_TRACE_BYTES), (
                path, path.stat().st_size)
            with gzip.open(path, "rt", encoding="utf-8") as f:
                raw = json.load(f)
            assert raw["demo_run"] == run and isinstance(raw["demo_truth"], dict)
            assert raw["demo_settings"]["story"] == run
            assert raw["demo_settings"].get("device", "cpu") == ("cuda" if h100 else "cpu")
            if h100 and run in gt.COMPILE_PAIR:
                assert raw["demo_settings"]["backend"] == gt.COMPILE_BACKEND_CUDA


# ---------------------------------------------------------------- issue 22


def test_stack_item_line(logdir):
    _, raw, rep = _one(logdir, gt.STACK_RUN)
    truth = raw["demo_truth"]["sync"]
    if not _committed(logdir):
        # generated now: the truth in the trace is the source as it is now
        assert truth == dict(gt.item_call_site(), op="aten::item", calls_per_step=1)
    assert raw["with_stack"] == 1 and raw["record_shapes"] == 1
    sa = rep["source_attribution"]
    assert sa["has_stack"] and sa["frame_naming"] == "function's first line"
    # with_stack names the frame by the function's first line, so the dedicated function's
    # `def` line identifies the .item() two lines below it
    assert truth["item_line"] > truth["function_first_line"]
    rows = [r for r in sa["lines"] if r["file"] == truth["file"] and r["line"] == truth["function_first_line"]]
    assert len(rows) == 1 and rows[0]["function"] == truth["function"] == "_log_loss", sa["lines"][:5]
    assert rows[0]["frame"] == truth["frame"]
    assert rep["steps"]["count"] == gt.ACTIVE
    assert rows[0]["calls"] == truth["calls_per_step"] * gt.ACTIVE  # one aten::item per step
    if rep["device_names"]:
        sync = sa["bottlenecks"]["sync"]
        assert sync and sync[0]["file"] == truth["file"] and sync[0]["line"] == truth["function_first_line"]
    else:
        # a CPU .item() is no GPU sync (metrics §8): nothing to attribute
        assert sa["bottlenecks"]["sync"] == [] and sa["sync_us"] == 0


def _slow_module_share(rep: dict, truth: dict) -> float:
    modules = rep["source_attribution"]["modules"]
    (root,) = [m for m in modules if m["depth"] == 0]
    children = [m for m in modules if m["parent"] == root["path"]]
    def time_us(m):
        return m["gpu_us"] if rep["device_names"] else m["total_us"] + m["gpu_us"]

    slow = sum(time_us(m) for m in children if m["class"] == truth["class"])
    return slow / sum(time_us(m) for m in children)


def test_slow_module_leads_the_module_tree(logdir, tmp_path):
    _, raw, rep = _one(logdir, gt.STACK_RUN)
    truth = raw["demo_truth"]["slow_module"]
    if not _committed(logdir):
        # A timing experiment on a shared 2-core machine: the bound lets the siblings take
        # up to 3/8 of SlowMixer's time, they take ~1/16 on a quiet machine (share ~94 %),
        # but one sibling op descheduled for tens of ms can exceed it. Then the run (~2 s)
        # is made again, at most twice; the bound asserted stays as derived.
        import torch

        for attempt in range(2):
            if _slow_module_share(rep, truth) >= truth["min_share_of_children"]:
                break
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                run_dir = gt.run_stack(torch, str(tmp_path / f"retry{attempt}"))
            finally:
                torch.set_num_threads(threads)
            _, raw, rep = _one(Path(run_dir).parent, gt.STACK_RUN)
    assert truth["class"] == gt.SLOW_MODULE and truth["min_share_of_children"] == pytest.approx(
        gt.SLOW_REPS / (gt.SLOW_REPS + 3))
    modules = rep["source_attribution"]["modules"]
    (root,) = [m for m in modules if m["depth"] == 0]
    assert root["class"] == truth["parent_class"]
    children = [m for m in modules if m["parent"] == root["path"]]

    def time_us(m):
        # On a GPU the matmuls' work is GPU time; their CPU time is the launch, about the
        # same for every op, so the work bound (module docstring) applies to GPU time alone.
        return m["gpu_us"] if rep["device_names"] else m["total_us"] + m["gpu_us"]

    children.sort(key=time_us, reverse=True)
    assert children[0]["class"] == truth["class"], [(m["class"], time_us(m)) for m in children]
    share = time_us(children[0]) / sum(time_us(m) for m in children)
    assert share >= truth["min_share_of_children"], share
    # by its own (self) time it is first of the whole tree
    assert max(modules, key=lambda m: m["self_us"] + m["gpu_self_fwd_us"])["class"] == truth["class"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA: a CPU .item() is no sync")
def test_stack_sync_line_on_cuda(tmp_path):
    import torch

    run_dir = gt.run_stack(torch, str(tmp_path), device="cuda")
    _, raw, rep = _one(Path(run_dir).parent, gt.STACK_RUN)
    truth = raw["demo_truth"]["sync"]
    top = rep["source_attribution"]["bottlenecks"]["sync"][0]
    assert (top["file"], top["line"], top["op"]) == (truth["file"], truth["function_first_line"], "aten::item")


# ---------------------------------------------------------------- issue 23


@pytest.mark.parametrize("run", gt.COMPILE_PAIR)
def test_compilation_matches_dynamo(logdir, run):
    _, raw, rep = _one(logdir, run)
    truth = raw["demo_truth"]
    c = rep["compilation"]
    assert c is not None and c["has_regions"]
    # one compiled call per step: explain's counts per call are the per-step counts
    assert c["breaks_per_step"] == truth["explain"]["graph_break_count"]
    assert c["graphs_per_step"] == truth["explain"]["graph_count"]
    assert c["regions_per_step"] == truth["explain"]["graph_count"]
    assert c["recompiles"] == truth["recompiles_in_recorded_steps"]
    recorded = [s for s in truth["counters_per_step"] if s["step"] in truth["recorded_steps"]]
    assert len(recorded) == len(truth["recorded_steps"]) == 2
    if run == gt.COMPILE_PAIR[0]:
        assert truth["explain"] == {"graph_count": 2, "graph_break_count": 1, "break_reasons": [
            truth["explain"]["break_reasons"][0]]} and "item()" in truth["explain"]["break_reasons"][0]
        # a new batch size every step: each frame (the forward and its resume after the
        # break) compiles again in every recorded step, while the profiler records
        assert [s["unique_graphs"] for s in recorded] == [2, 2]
        assert c["recompiles"] == c["steady_recompiles"] == 4
        assert all(r["compiled_in_step"] for r in c["recompile_ids"])
    else:
        assert truth["explain"]["graph_break_count"] == 0 and truth["explain"]["graph_count"] == 1
        assert [s["unique_graphs"] for s in recorded] == [0, 0]
        assert c["recompiles"] == 0 and c["breaks_per_step"] == 0


# ---------------------------------------------------------------- issue 24


def _rank_results(logdir: Path):
    scanned = discovery.scan_logdir(str(logdir))
    run = next(r for r in scanned.runs if r.name == gt.COLLECTIVES_RUN)
    return {w.name: [report.analyze_span(str(logdir), run, s) for s in w.spans] for w in run.workers}


def test_gloo_collective_bytes(logdir):
    _require(logdir, gt.COLLECTIVES_RUN)
    results = _rank_results(logdir)
    assert sorted(results) == ["rank0", "rank1"]
    for worker, (res,) in results.items():
        path = _trace_files(logdir / gt.COLLECTIVES_RUN, worker)[0]
        with gzip.open(path, "rt", encoding="utf-8") as f:
            truth = json.load(f)["demo_truth"]
        calls = truth["calls_per_step"]
        assert calls == gt.expected_calls(truth["world_size"])
        n = truth["world_size"]
        # §18 on a gloo CPU trace reads the gloo: spans: each call named by the op that
        # enqueued it (reduce_scatter_tensor runs as gloo:all_reduce), bytes in nccl-tests' size
        sec = res["report"]["collectives"]
        assert sec["source"] == "cpu_spans" and "collectives" not in res["report"]["not_available"]
        assert sec["call_rows"]["kind"] == [("all_gather" if c["op"] == "all_gather_into_tensor" else "reduce_scatter")
                                            for c in calls] * truth["recorded_steps"]
        assert sec["call_rows"]["bytes"] == [float(c["nccl_tests_bytes"]) for c in calls] * truth["recorded_steps"]
        assert sec["link"]["gbps"] is None  # gloo: no link peak
        # §12's rank partial reads the gloo: CPU spans (record_shapes)
        part = res["distributed"]
        assert part["comm_source"] == "cpu_spans"
        expected_kinds, expected_bytes = [], []
        for c in calls:
            if c["op"] == "all_gather_into_tensor":
                # the recorded input: the local shard = nccl-tests' size / n
                expected_kinds.append("all_gather")
                expected_bytes.append(c["input_bytes"])
                assert c["input_bytes"] * n == c["nccl_tests_bytes"]
            else:
                # gloo reduce-scatters by all-reducing the full input (gloo:all_reduce)
                expected_kinds.append("all_reduce")
                expected_bytes.append(c["input_bytes"])
                assert c["input_bytes"] == c["nccl_tests_bytes"]
        assert len(part["steps"]) == truth["recorded_steps"]
        for s in part["steps"]:
            assert s["collectives"]["kind"] == expected_kinds, s
            assert s["collectives"]["bytes"] == [float(b) for b in expected_bytes], s
    view = ranks.rank_view(results)
    assert view["available"] and view["backend"] == "gloo" and view["world_size"] == 2
    by_kind = {c["kind"]: c for c in view["collectives"]}
    steps = truth["recorded_steps"] * len(results)
    gather = sum(c["input_bytes"] for c in calls if c["op"] == "all_gather_into_tensor")
    scatter = sum(c["input_bytes"] for c in calls if c["op"] == "reduce_scatter_tensor")
    assert by_kind["all_gather"]["bytes"] == gather * steps
    assert by_kind["all_gather"]["calls"] == by_kind["all_gather"]["bytes_known_calls"] == 2 * steps
    assert by_kind["all_reduce"]["bytes"] == scatter * steps
    assert "reduce_scatter" not in by_kind
