"""One device, one name (issue 20 item 2; METRICS.md "Device names"): the header, the GPU
section, the memory section, the cards, the not_available labels and the CLI text name a
device by the trace's own device id ("GPU 3"), with deviceProperties' name or "unknown GPU";
a GPU's memory peak (a CUDA/HIP-graph capture's too) is judged against that device's
capacity (deviceProperties totalGlobalMem), or says why it cannot be.

Expected values come from what the tests write into the hand-built traces, and for the
shared traces from the trace files themselves (read here with json, not through the
plugin)."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from conftest import TRACES, needs_traces
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin.analysis import devices
from tb_bottleneck_plugin.trace.loader import load_trace
from tb_bottleneck_plugin.views.text_report import format_report

from trace_builder import H100, MI300, TraceBuilder

GIB = 1 << 30
GPU_WORDS = re.compile(r"\bGPU (cuda:\d+|\d+)\b")


def _memory(b: TraceBuilder, ts, allocated, reserved, device_type=1, device_id=0):
    b.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                     "ts": ts, "args": {"Device Type": device_type, "Device Id": device_id, "Addr": 1,
                                        "Bytes": 1024, "Total Allocated": allocated, "Total Reserved": reserved}})


def _capture_trace(props, device: int, mem_type: int, mem_id: int, capacity: int, capture_calls) -> TraceBuilder:
    """Three steps of eager kernels on ``device``, then a graph capture whose launches run
    nothing; memory on (mem_type, mem_id) peaking at 90 % allocated / 93 % reserved of
    ``capacity`` during the capture."""
    begin, end, inst = capture_calls
    b = TraceBuilder(props=props)
    t0 = 1_000_000
    for s in range(3):
        start = t0 + s * 1000
        b.step(s + 1, start, 1000)
        for k in range(20):
            t = start + 10 + k * 22
            b.cpu("aten::add", t, 20)
            c = b.runtime("hipLaunchKernel" if begin.startswith("hip") else "cudaLaunchKernel", t + 2, 5)
            b.kernel("elementwise_kernel", t + 10, 15, correlation=c, device=device)
        b.runtime(begin, start + 500, 5)
        _memory(b, start + 600, int(capacity * 0.90), int(capacity * 0.93), mem_type, mem_id)
        b.runtime(end, start + 920, 5)
        b.runtime(inst, start + 930, 50)
        _memory(b, start + 990, int(capacity * 0.50), int(capacity * 0.93), mem_type, mem_id)
    return b


def _gpu_ids_named(text: str) -> set:
    return {m.group(1) for m in GPU_WORDS.finditer(text)}


def _named_everywhere(rep: dict) -> str:
    """Every place a device is named: the CLI text, not_available labels, verdict words and
    device fields, recommendation words."""
    parts = [format_report(rep)] + list((rep.get("not_available_labels") or {}).values())
    for v in (rep.get("verdicts") or {}).values():
        if isinstance(v, dict):
            parts.append(str(v.get("verdict") or ""))
            if v.get("device"):
                parts.append(devices.label(v["device"], rep) + " ")
    for r in rep.get("recommendations") or []:
        parts += [str(r.get("title") or ""), " ".join(map(str, r.get("evidence") or []))]
    return "\n".join(parts)


MI300_192 = dict(MI300, totalGlobalMem=192 * GIB)


@pytest.mark.parametrize("mem_type", [1, 6])  # PyTorch's HIP build writes 1 ("cuda"), vLLM traces 6 (HIP)
def test_hip_capture_names_one_device_and_judges_its_capacity(tmp_path, mem_type):
    """The issue's case: a ROCm graph capture whose kernels say device 2 (roctracer's agent
    index) while the allocator says Device Id 0 (PyTorch's index) and deviceProperties has
    one entry (id 0): one GPU, named "GPU 2: AMD Instinct MI300X" everywhere; its peak is
    compared with the 192 GiB written into deviceProperties."""
    b = _capture_trace([MI300_192], device=2, mem_type=mem_type, mem_id=0, capacity=192 * GIB,
                       capture_calls=("hipStreamBeginCapture", "hipStreamEndCapture", "hipGraphInstantiate"))
    rep = report_mod.analyze_trace(b.load(tmp_path))["report"]
    assert rep["context"]["cuda_graph_capture"]
    assert rep["device_labels"]["2"] == {"label": "GPU 2", "name": "AMD Instinct MI300X"}
    assert rep["device_labels"]["cuda:0"] == {"label": "GPU 2", "name": "AMD Instinct MI300X"}
    assert list(rep["gpu"]) == ["2"] and list(k for k in rep["memory"] if k != "cpu") == ["cuda:0"]
    assert rep["memory"]["cuda:0"]["capacity_bytes"] == 192 * GIB
    assert "memory.cuda:0.capacity_bytes" not in rep["not_available"]
    peak = rep["verdicts"]["peak_memory"]
    assert peak["verdict"].startswith("90.0 % of capacity during CUDA-graph capture"), peak
    assert "peak reserved 93 % of capacity: near full" in peak["verdict"], peak
    text = _named_everywhere(rep)
    assert _gpu_ids_named(text) == {"2"}, text
    assert "GPU 2: AMD Instinct MI300X" in format_report(rep)


def test_cuda_device_without_properties_is_unknown_gpu_and_capacity_na(tmp_path):
    """A CUDA capture on device 2 of a trace whose deviceProperties list only device 0: "GPU 2:
    unknown GPU" (never device 0's name), memory "GPU 2", capacity n/a with the reason, and
    the peak card says it could not compare."""
    b = _capture_trace([H100], device=2, mem_type=1, mem_id=2, capacity=80 * GIB,
                       capture_calls=("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate"))
    rep = report_mod.analyze_trace(b.load(tmp_path))["report"]
    assert rep["device_labels"]["2"] == {"label": "GPU 2", "name": devices.UNKNOWN_GPU}
    assert rep["device_labels"]["cuda:2"] == {"label": "GPU 2", "name": devices.UNKNOWN_GPU}
    assert rep["device_names"]["2"] == "unknown GPU"
    assert rep["memory"]["cuda:2"]["capacity_bytes"] is None
    assert rep["not_available"]["memory.cuda:2.capacity_bytes"] == "no deviceProperties entry for device 2"
    assert rep["verdicts"]["peak_memory"]["verdict"].startswith("capacity unknown: no deviceProperties entry"), \
        rep["verdicts"]["peak_memory"]
    text = _named_everywhere(rep)
    assert _gpu_ids_named(text) == {"2"}, text
    assert "GPU 2: unknown GPU" in format_report(rep)
    assert "H100" not in format_report(rep).split("\n")[2]  # the header line names no other device's model


def test_cuda_nonzero_device_with_properties(tmp_path):
    """CUDA: kernel device 3 and memory Device Id 3 are the same GPU, named and sized by
    deviceProperties entry 3 (not entry 0)."""
    props = [dict(H100, id=i, name=f"GPU model {i}", totalGlobalMem=(70 + i) * GIB) for i in range(4)]
    b = _capture_trace(props, device=3, mem_type=1, mem_id=3, capacity=73 * GIB,
                       capture_calls=("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate"))
    rep = report_mod.analyze_trace(b.load(tmp_path))["report"]
    assert rep["device_labels"]["3"] == rep["device_labels"]["cuda:3"] == {"label": "GPU 3", "name": "GPU model 3"}
    assert rep["memory"]["cuda:3"]["capacity_bytes"] == 73 * GIB
    assert rep["verdicts"]["peak_memory"]["verdict"].startswith("90.0 % of capacity"), rep["verdicts"]["peak_memory"]
    assert _gpu_ids_named(_named_everywhere(rep)) == {"3"}


def test_label_is_the_one_formatter():
    rep = {"device_labels": {"2": {"label": "GPU 2", "name": "X"}, "cuda:0": {"label": "GPU 2", "name": "X"},
                             "cpu": {"label": "CPU", "name": None}}}
    assert devices.label("cuda:0", rep) == devices.label("2", rep) == "GPU 2"
    assert devices.label("cuda:0", rep, named=True) == "GPU 2: X"
    assert devices.label("cpu", rep, named=True) == "CPU"
    # older cached reports (no device_labels): the key's own number, the name or "unknown GPU"
    assert devices.label("cuda:1", {"device_names": {"1": "V100"}}, named=True) == "GPU 1: V100"
    assert devices.label("4", {}, named=True) == "GPU 4: unknown GPU"
    assert devices.label("type7:3") == "Device type 7 id 3"


def _props_of(rel: str) -> dict:
    with gzip.open(TRACES / rel, "rt") as f:
        doc = json.load(f)
    return {p["id"]: p for p in doc["deviceProperties"]}


@needs_traces
@pytest.mark.parametrize("rel, dev", [("hta/trace_diff/control/control.json.gz", 3),
                                      ("hta/df_index_resolver/df_index_resolver.json.gz", 1)])
def test_shared_traces_on_a_nonzero_gpu(rel, dev):
    """Real traces whose GPU is not device 0 (DDP rank 3 of 8 and rank 1 of 2): every device
    word names that id; the name and capacity are the file's deviceProperties[dev]."""
    props = _props_of(rel)[dev]
    rep = report_mod.analyze_trace(load_trace(str(TRACES / rel)))["report"]
    assert list(rep["gpu"]) == [str(dev)]
    assert rep["device_labels"][str(dev)] == {"label": f"GPU {dev}", "name": props["name"]}
    text = _named_everywhere(rep)
    assert _gpu_ids_named(text) == {str(dev)}, text
    assert f"GPU {dev}: {props['name']}" in format_report(rep)
    key = f"cuda:{dev}"
    if key in (rep.get("memory") or {}):
        assert rep["device_labels"][key]["label"] == f"GPU {dev}"
        assert rep["memory"][key]["capacity_bytes"] == props["totalGlobalMem"]


@needs_traces
@pytest.mark.parametrize("rel", ["tracelens/torch_compile_triton/trace.json.gz",
                                 "tracelens/mi300/resnet_act_checkpoint.json.gz"])
def test_rocm_agent_index_named_by_the_one_model(rel):
    """ROCm kernels on agent index 2; every deviceProperties entry is one model: named by it."""
    names = {p["name"] for p in _props_of(rel).values()}
    assert len(names) == 1
    rep = report_mod.analyze_trace(load_trace(str(TRACES / rel)))["report"]
    assert rep["device_labels"]["2"] == {"label": "GPU 2", "name": names.pop()}
    assert _gpu_ids_named(_named_everywhere(rep)) == {"2"}
