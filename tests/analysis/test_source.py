"""Source-line, nn.Module and record_function attribution (analysis/source.py, METRICS.md §17):
hand-built traces fix every containment case; the shared H100 GPT-2 eager run and the V100
ResNet-50 samples (old `Call stack` args) fix the real answers."""
import json
import time
from pathlib import Path

import pytest

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import source, units
from tb_bottleneck_plugin.analysis.steps import find_steps

from trace_builder import TraceBuilder

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
GPT2 = next(iter(sorted((SHARED / "traces/h100/gpt2_bf16_eager").glob("*.pt.trace.json.gz"))), None)
RESNET = sorted((SHARED / "traces/kineto-tb-samples/resnet50_num_workers_0").glob("*.pt.trace.json.gz"))
TRUTH = SHARED / "oracles/h100_truth.json"
NAME = source.NAME


def _py(b, name, ts, dur, tid=1):
    return b.cpu(name, ts, dur, cat="python_function", tid=tid)


def _view(trace):
    na = {}
    return source.source_view(trace, find_steps(trace), not_available=na), na


def _line(sec, frame):
    return next(r for r in sec["lines"] if r["frame"] == frame)


# ---------------------------------------------------------------------------- frame rules


def test_library_files():
    lib = ["torch/nn/modules/module.py", "transformers/models/gpt2/modeling_gpt2.py", "dataclasses.py",
           "<frozen os>", "<string>", "/usr/lib/python3.11/threading.py",
           "/home/u/env/lib/python3.7/site-packages/torchvision/datasets/cifar.py",
           "/opt/conda/lib/python3.10/dist-packages/foo/bar.py", "/src/pytorch/torch/_tensor.py"]
    user = ["record_h100.py", "train.py", "mypkg/model.py", "/home/u/project/train.py"]
    assert all(source.is_library_file(f) for f in lib)
    assert not any(source.is_library_file(f) for f in user)
    assert source.parse_frame("record_h100.py(165): step") == ("record_h100.py", 165, "step")
    assert source.parse_frame("<built-in method item of Tensor object at 0x1>") is None
    assert not source.is_user_frame("nn.Module: Linear_0")


# ---------------------------------------------------------------------------- containment cases


def _nested(tmp_path):
    """train.py(10): main > torch/nn/modules/module.py(1): _call_impl > nn.Module: Net_0 >
    model.py(5): forward > aten::mm > cudaLaunchKernel -> kernel; a sync via .item() inside
    main; a DataLoader wait inside train.py(20): loop; a second thread with its own frames."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    _py(b, "train.py(10): main", 0, 1000)
    _py(b, "torch/nn/modules/module.py(1): _call_impl", 10, 300)
    _py(b, "nn.Module: Net_0", 20, 280)
    _py(b, "model.py(5): forward", 30, 260)
    _py(b, "nn.Module: Linear_0", 40, 100)
    b.cpu("aten::mm", 50, 80)
    b.launch("gemm", 60, kernel_ts=100, kernel_dur=40)
    b.cpu("aten::relu", 200, 50)  # in model.py(5): forward, Net_0 itself
    b.launch("relu_k", 210, kernel_ts=200, kernel_dur=10)
    # .item(): a built-in frame, the op, the sync call
    _py(b, "<built-in method item of Tensor object at 0x1>", 400, 100)
    b.cpu("aten::item", 405, 90)
    b.runtime("cudaStreamSynchronize", 410, 80)
    # DataLoader wait from another user function
    _py(b, "train.py(20): loop", 600, 300)
    _py(b, "torch/utils/data/dataloader.py(600): __next__", 610, 200)
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 620, 150, cat="user_annotation")
    # thread 2: its own frames, overlapping in time with thread 1's model.py frame
    _py(b, "worker.py(3): run", 30, 200, tid=2)
    b.cpu("aten::add", 40, 50, tid=2)
    return b


def test_nested_frames_modules_and_other_threads(tmp_path):
    sec, na = _view(_nested(tmp_path).load(tmp_path))
    assert sec["has_stack"] and sec["stack_source"] == "python_function"
    assert sec["frame_naming"] == "function's first line"
    model = _line(sec, "model.py(5): forward")  # innermost user frame, not train.py
    assert (model["cpu_us"], model["calls"], model["gpu_us"], model["kernels"]) == (130, 2, 50, 2)
    # frames on another thread never contain thread 1's ops
    assert _line(sec, "worker.py(3): run")["cpu_us"] == 50
    main = _line(sec, "train.py(10): main")
    assert main["cpu_us"] == 90 and main["gpu_us"] == 0 and main["sync_us"] == 80
    sync = sec["bottlenecks"]["sync"][0]
    assert (sync["frame"], sync["us"], sync["op"], sync["count"]) == ("train.py(10): main", 80, "aten::item", 1)
    assert sync["skipped"] == ["<built-in method item of Tensor object at 0x1>"]
    assert sync["pct"] == pytest.approx(8.0)
    dl = sec["bottlenecks"]["dataloader"][0]
    assert (dl["frame"], dl["us"], dl["line"]) == ("train.py(20): loop", 150, 20)
    assert dl["skipped"] == ["torch/utils/data/dataloader.py(600): __next__"]
    mods = {m["path"]: m for m in sec["modules"]}
    assert set(mods) == {"Net_0", "Net_0/Linear_0"}
    net, lin = mods["Net_0"], mods["Net_0/Linear_0"]
    assert (net["total_us"], net["self_us"], net["gpu_fwd_us"], net["gpu_self_fwd_us"]) == (280, 180, 50, 10)
    assert (lin["total_us"], lin["gpu_fwd_us"], lin["parent"], lin["class"], lin["depth"]) == (100, 40, "Net_0",
                                                                                                "Linear", 1)
    assert sec["unattributed_gpu_us"] == 0
    assert not [k for k in na if k.startswith(NAME)]


def test_missing_parents_and_ops_outside_frames(tmp_path):
    """An op with no enclosing frame (the frame's parent was not recorded, or never there)
    counts as unattributed; a frame without a user ancestor gives no line."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    _py(b, "torch/optim/optimizer.py(1): step", 10, 100)  # no user frame above it (parent missing)
    b.cpu("aten::add_", 20, 50)
    b.launch("add_k", 25, kernel_ts=100, kernel_dur=30)
    b.cpu("aten::mul", 300, 50)  # outside every frame
    b.launch("mul_k", 310, kernel_ts=400, kernel_dur=20)
    _py(b, "train.py(7): go", 500, 100)
    b.cpu("aten::sub", 510, 20)
    sec, _ = _view(b.load(tmp_path))
    assert [r["frame"] for r in sec["lines"]] == ["train.py(7): go"]
    assert sec["unattributed_gpu_us"] == 50 and sec["gpu_us"] == 50


def test_backward_ops_on_the_autograd_thread(tmp_path):
    """Autograd-engine ops (own thread, no frames) inherit the frame that waits in backward()
    on the Python thread, and the forward module via their Sequence number."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    _py(b, "train.py(30): step", 0, 1000)
    b.cpu("forward", 10, 300, cat="user_annotation")
    _py(b, "nn.Module: Lin_0", 20, 200)
    b.cpu("aten::addmm", 30, 100, **{"Sequence number": 7})
    b.launch("fwd_gemm", 40, kernel_ts=50, kernel_dur=60)
    b.cpu("backward", 400, 400, cat="user_annotation")
    _py(b, "torch/_tensor.py(600): backward", 410, 380)
    _py(b, "torch/autograd/graph.py(800): _engine_run_backward", 420, 360)
    _py(b, "<built-in method run_backward of torch._C._EngineBase object at 0x1>", 430, 340)
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 450, 200, tid=9, **{"Sequence number": 7})
    b.cpu("aten::mm", 460, 100, tid=9)
    corr = b.runtime("cudaLaunchKernel", 470, 5, tid=9)
    b.kernel("bwd_gemm", 480, 70, correlation=corr)
    sec, _ = _view(b.load(tmp_path))
    step = _line(sec, "train.py(30): step")
    assert step["gpu_us"] == 130 and step["cpu_us"] == 300  # addmm 100 + evaluate_function 200
    lin = sec["modules"][0]
    assert (lin["path"], lin["gpu_fwd_us"], lin["gpu_bwd_us"], lin["gpu_us"]) == ("Lin_0", 60, 70, 130)
    labels = {r["name"]: r for r in sec["labels"]}
    assert labels["forward"]["gpu_us"] == 60 and labels["backward"]["gpu_us"] == 70
    assert labels["backward"]["cpu_us"] == 400 and labels["forward"]["count"] == 1
    assert sec["label_coverage_pct"] == pytest.approx(70.0)


def test_old_call_stack_args(tmp_path):
    """Old traces: the innermost-first `Call stack` arg on ops; ProfilerStep's own stack is not
    inherited; backward ops on the engine thread take the line that called backward()."""
    site = "/env/lib/python3.7/site-packages/torch"
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 0, 1000, cat="Operator", **{"Call stack": f"{site}/profiler/profiler.py(312): step;"
                                                                       "train.py(54): <module>"})
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 300, cat="Operator",
          **{"Call stack": f"{site}/utils/data/dataloader.py(518): __next__;train.py(42): <module>"})
    b.cpu("aten::to", 400, 100, cat="Operator", **{"Call stack": "train.py(44): <module>"})
    b.cpu("aten::copy_", 410, 80, cat="Operator", **{"Call stack": "train.py(44): <module>"})
    b.runtime("cudaStreamSynchronize", 420, 50)
    b.cpu("aten::ones_like", 600, 10, cat="Operator",
          **{"Call stack": f"{site}/autograd/__init__.py(143): backward;{site}/_tensor.py(255): backward;"
                           "train.py(50): <module>"})
    b.cpu("NllLossBackward", 650, 100, cat="Operator", tid=5)
    corr = b.runtime("cudaLaunchKernel", 660, 5, tid=5)
    b.kernel("nll_bwd", 700, 40, correlation=corr)
    b.cpu("aten::zeros", 900, 10, cat="Operator")  # no stack at all
    sec, na = _view(b.load(tmp_path))
    assert sec["stack_source"] == "call_stack" and sec["frame_naming"] == "line being executed"
    dl = sec["bottlenecks"]["dataloader"][0]
    assert (dl["frame"], dl["us"], dl["via"]) == ("train.py(42): <module>", 300, "call_stack")
    assert dl["skipped"] == [f"{site}/utils/data/dataloader.py(518): __next__"]
    sync = sec["bottlenecks"]["sync"][0]
    assert (sync["frame"], sync["op"], sync["us"]) == ("train.py(44): <module>", "aten::to", 50)
    bwd = _line(sec, "train.py(50): <module>")
    assert bwd["gpu_us"] == 40 and bwd["cpu_us"] == 110
    assert "train.py(54): <module>" not in [r["frame"] for r in sec["lines"]]
    assert na == {f"{NAME}.modules": source.NO_MODULES}


def test_no_stack_is_not_available_with_the_hint(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("forward", 10, 400, cat="user_annotation")
    b.cpu("aten::mm", 20, 100)
    b.launch("gemm", 30, kernel_ts=40, kernel_dur=50)
    sec, na = _view(b.load(tmp_path))
    assert sec["lines"] is None and sec["bottlenecks"] is None and sec["modules"] is None
    assert sec["hint"] == "record with torch.profiler.profile(with_stack=True)"
    for part in ("lines", "bottlenecks", "modules"):
        assert "with_stack=True" in na[f"{NAME}.{part}"]
    assert sec["labels"] == [{"name": "forward", "count": 1, "cpu_us": 400, "gpu_us": 50, "gpu_annotation_us": 0,
                              "kind": "user"}]


def test_partials_are_additive(tmp_path):
    """Two spans: the summary's numbers are the sums of the spans' numbers."""
    t = _nested(tmp_path).load(tmp_path)
    rep = report.analyze_trace(t)["report"]
    sec = rep[NAME]
    unit = source.UNIT
    two = unit.finish(units.merge([unit.partial(rep), unit.partial(rep)]))
    assert two["bottlenecks"]["sync"][0]["us"] == 2 * sec["bottlenecks"]["sync"][0]["us"]
    assert two["bottlenecks"]["sync"][0]["pct"] == pytest.approx(sec["bottlenecks"]["sync"][0]["pct"])
    assert {r["frame"]: 2 * r["cpu_us"] for r in sec["lines"]} == {r["frame"]: r["cpu_us"] for r in two["lines"]}
    assert {m["path"]: 2 * m["gpu_us"] for m in sec["modules"]} == {m["path"]: m["gpu_us"] for m in two["modules"]}
    assert two["label_coverage_pct"] == pytest.approx(sec["label_coverage_pct"])
    json.dumps(two)


# ---------------------------------------------------------------------------- shared traces


@pytest.fixture(scope="module")
def gpt2():
    if GPT2 is None:
        pytest.skip("shared H100 traces not present")
    trace = loader.load_trace(str(GPT2))
    steps = find_steps(trace)
    t0 = time.perf_counter()
    sec = source.source_view(trace, steps, not_available={})
    return trace, steps, sec, time.perf_counter() - t0


def test_gpt2_sync_is_the_loss_item_frame(gpt2):
    _, steps, sec, _ = gpt2
    truth = json.loads(TRUTH.read_text())["runs"]["gpt2_bf16_eager"]["sync_item"]
    top = sec["bottlenecks"]["sync"][0]
    assert top["frame"] == truth["in_function_frame"] == "record_h100.py(165): step"
    assert top["op"] == "aten::item" and top["count"] == steps.count == 3
    assert top["skipped"][0].startswith("<built-in method item of Tensor")
    per_step = top["us"] / steps.count
    assert 15_000 < per_step < 20_000  # ≈19 ms of each ≈52 ms step (the sync call inside aten::item)
    assert 30 < top["pct"] < 40
    assert sec["frame_naming"] == "function's first line"  # the call itself is on line 174


def test_gpt2_module_tree_and_gpu_time(gpt2):
    _, _, sec, _ = gpt2
    mods = {m["path"]: m for m in sec["modules"]}
    root = mods["GPT2LMHeadModel_0"]
    blocks = [m for m in sec["modules"] if m["class"] == "GPT2Block"]
    assert len(blocks) == 6 and all(b["parent"] == "GPT2LMHeadModel_0/GPT2Model_0" for b in blocks)
    for b in blocks:
        kids = {mods[p]["class"] for p in mods if mods[p]["parent"] == b["path"]}
        assert {"GPT2Attention", "GPT2MLP", "LayerNorm"} <= kids
        assert b["calls"] == 3
    labels = {r["name"]: r for r in sec["labels"]}
    # forward kernels: all launched inside the module tree (tolerance 1%)
    assert root["gpu_fwd_us"] == pytest.approx(labels["forward"]["gpu_us"], rel=0.01)
    # backward kernels: back to their forward module through the Sequence number (1%)
    assert root["gpu_bwd_us"] == pytest.approx(labels["backward"]["gpu_us"], rel=0.01)
    # a block's GPU time is its children's plus its own
    b = mods["GPT2LMHeadModel_0/GPT2Model_0/GPT2Block_0"]
    kids = [m for m in sec["modules"] if m["parent"] == b["path"]]
    assert b["gpu_us"] == pytest.approx(sum(k["gpu_us"] for k in kids) + b["gpu_self_fwd_us"] + b["gpu_self_bwd_us"])
    assert root["gpu_us"] <= sec["gpu_us"]


def test_gpt2_record_function_regions_cover_the_step(gpt2):
    _, steps, sec, _ = gpt2
    labels = {r["name"]: r for r in sec["labels"]}
    assert {"forward", "backward", "optimizer"} <= set(labels)
    assert all(labels[k]["count"] == 3 for k in ("forward", "backward", "optimizer"))
    # forward + backward + optimizer, and the loss.item() sync after them: the whole step (±3%)
    three = sum(labels[k]["cpu_us"] for k in ("forward", "backward", "optimizer"))
    assert three == pytest.approx(sec["label_union_us"], rel=0.001)  # disjoint regions
    assert (three + sec["bottlenecks"]["sync"][0]["us"]) / sec["host_steps_us"] == pytest.approx(1.0, abs=0.03)
    assert labels["backward"]["gpu_us"] > labels["forward"]["gpu_us"] > labels["optimizer"]["gpu_us"] > 0
    # every kernel is attributed: to the one user frame
    assert sec["unattributed_gpu_us"] == 0
    assert [r["frame"] for r in sec["lines"]] == ["record_h100.py(165): step"]


@pytest.mark.skipif(not RESNET, reason="shared V100 samples not present")
@pytest.mark.parametrize("path", RESNET, ids=lambda p: p.name)
def test_resnet_dataloader_wait_is_the_loop_line(path):
    trace = loader.load_trace(str(path))
    steps = find_steps(trace)
    t0 = time.perf_counter()
    sec = source.source_view(trace, steps, not_available={})
    elapsed = time.perf_counter() - t0
    assert sec["stack_source"] == "call_stack"
    dl = sec["bottlenecks"]["dataloader"]
    assert len(dl) == 1 and dl[0]["frame"] == "resnet50_profiler_api.py(42): <module>"  # `for ... in loader`
    assert dl[0]["count"] == steps.count and 20 < dl[0]["pct"] < 50  # strongly input-bound (29%, 39%)
    assert any("dataloader.py" in s for s in dl[0]["skipped"])
    assert sec["unattributed_gpu_us"] < 0.01 * sec["gpu_us"]
    assert elapsed < 2.0


def test_analysis_time_is_small(gpt2):
    assert gpt2[3] < 2.0
