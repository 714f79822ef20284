"""Advice a new user can trust on traces we did not write (the trust pass): each test pins
one rule's words on a real shared trace (or, where no shared trace has the case, a report
built like the real ones), against what the trace is:

- CPU-only run: no `pin_memory` (it needs an accelerator) and no "cores per GPU";
- GPU model not recorded (the 2020 trace has no deviceProperties): no bare bf16/TF32 advice;
  both dtypes, each named with the GPUs it fits;
- GPU idle while kernels are neither short nor low-occupancy (A100 nccl_data: the host runs
  CPU operators 72 % of the step): not "many small kernels, launch-bound";
- AMD: "matrix cores", not NVIDIA's "Tensor Cores";
- memory device named as the tab and CLI name it ("GPU 1", not "cuda:1").
"""
from __future__ import annotations


import pytest

from tb_bottleneck_plugin.judge import recommendations as R
from conftest import needs_traces, real_report as real, rules_by_id as rules, MI250, MI300, V100

CPU_NW0 = "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json"
V100_2020 = "kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz"
V100_NW0 = "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
A100_NCCL = "hta/nccl_parser_config/nccl_data.json.gz"
H100_BERT = "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
V100_MEM = "hta/df_index_resolver/df_index_resolver.json.gz"




@needs_traces
def test_cpu_only_input_bound_advice_has_no_gpu_only_settings():
    rep = real(CPU_NW0)
    assert not rep["trace"]["gpu_devices"]
    rec = rules(rep)["input_bound"]
    assert rec["severity"] == "medium"  # 15.7 % waiting for data
    assert "num_workers=4" in rec["action"] and "persistent_workers=True" in rec["action"]
    assert "pin_memory" not in rec["action"], rec["action"]
    assert "per GPU" not in rec["action"] and "GPU" not in rec["title"]
    assert "training loop waits" in rec["title"]


@needs_traces
def test_gpu_input_bound_advice_keeps_pin_memory():
    rec = rules(real(V100_NW0))["input_bound"]
    assert "pin_memory=True" in rec["action"] and "CPU cores per GPU" in rec["action"]
    assert rec["title"].startswith("The GPU waits")


def test_workers_not_keeping_up_on_cpu_only_says_no_pin_memory():
    base = {"input": {"input_bound_pct": 30.0, "evidence": {"num_workers_zero": False}},
            "context": {"mode": "training"}}
    cpu = R.rule_input_bound({**base, "trace": {"gpu_devices": []}})
    gpu = R.rule_input_bound({**base, "trace": {"gpu_devices": [0]}})
    assert "pin_memory" not in cpu["action"] and "to the GPU" not in cpu["action"]
    assert "pin_memory=True" in gpu["action"] and "to the GPU" in gpu["action"]


@needs_traces
def test_unknown_gpu_generation_gets_advice_for_each_generation():
    rep = real(V100_2020)
    assert not rep["device_properties"]
    rec = rules(rep)["tensor_cores_unused"]
    action = rec["action"]
    assert "does not record the GPU model" in action
    # bf16/TF32 only with the GPUs that have them; fp16 with GradScaler for Volta/Turing
    assert "Ampere or newer" in action and "dtype=torch.bfloat16" in action
    assert "Volta/Turing" in action and "dtype=torch.float16" in action
    assert 'torch.amp.GradScaler("cuda")' in action and "torch.cuda.amp" not in action
    assert action.index("Ampere") < action.index("bfloat16") < action.index("Volta")


def test_unknown_gpu_generation_in_inference_has_no_gradscaler():
    rep = {"device_properties": [], "context": {"mode": "inference"},
           "tensor_cores": {"eligible_not_using_pct": 60.0, "top_eligible_not_using": [{"op": "aten::mm", "pct": 60.0}]},
           "breakdown_pct": {"kernel": 50.0}}
    action = R.rule_tensor_cores(rep)["action"]
    assert "GradScaler" not in action and "torch.inference_mode()" in action and "float16" in action


@needs_traces
def test_idle_gpu_with_ordinary_kernels_is_host_bound_not_launch_bound():
    rep = real(A100_NCCL)
    assert "small_kernels" not in rules(rep)  # its own rule id: the kernels are not the problem
    rec = rules(rep)["host_bound"]
    # the only reason is the idle GPU: its kernels are not short (2.9 % of kernel time) and
    # their occupancy is not low (37.8 %); the host runs CPU operators 72 % of the step
    assert list(rec["evidence"]) == ["GPU busy only 23 % of the steps, and not because of input"]
    assert rep["occupancy"]["short_kernels"]["time_pct"] < 5 and rep["breakdown_pct"]["cpu_exec"] > 70
    assert "Many small" not in rec["title"] and "launch-bound" not in rec["title"]
    assert rec["title"] == ("The GPU is idle 77 % of the steps, and not because of input: "
                            "the host does not keep it busy")
    assert "CPU operators with no GPU work for 72 % of the step" in rec["action"]
    assert "Operator view" in rec["action"] and "torch.compile(model)" in rec["action"]


@needs_traces
def test_tiny_kernels_stay_launch_bound():
    rec = rules(real(H100_BERT))["small_kernels"]  # 83 % of kernel time in kernels < 10 µs
    assert rec["title"] == "Many small or low-occupancy kernels: the GPU is launch- or latency-bound"


def test_host_bound_action_on_a_compiled_run_names_graph_breaks():
    rep = {"context": {"mode": "training", "torch_compile": True}, "gpu": {"0": {"utilization_pct": 30.0}},
           "input": {"input_bound_pct": 0.0}, "breakdown_pct": {"cpu_exec": 60.0},
           "occupancy": {"short_kernels": {"count": 3, "time_pct": 1.0, "threshold_us": 10}}}
    rec = R.rule_small_kernels(rep)
    assert rec["rule"] == "host_bound" and "host does not keep it busy" in rec["title"]
    assert "graph_breaks" in rec["action"] and "model = torch.compile(model)" not in rec["action"]


@pytest.mark.parametrize("props,word", [(MI250, "matrix cores"), (MI300, "matrix cores"), (V100, "Tensor Cores")])
def test_tensor_core_title_uses_the_vendor_word(props, word):
    rep = {"device_properties": [props], "context": {"mode": "training"},
           "tensor_cores": {"eligible_not_using_pct": 60.0, "top_eligible_not_using": [{"op": "aten::mm", "pct": 60.0}]},
           "breakdown_pct": {"kernel": 50.0}}
    title = R.rule_tensor_cores(rep)["title"]
    assert title == f"60 % of GPU kernel time is matmul/conv work that does not use {word}"


def under_pressure(rep: dict, key: str = "cuda:1", used_pct: float = 90.0) -> dict:
    """A copy of a real report whose device ``key`` is under memory pressure: its capacity
    shrunk so that peak reserved is ``used_pct`` % of it (no shared trace comes near full;
    allocator slack is advice only then, METRICS §9)."""
    import copy

    out = copy.deepcopy(rep)
    mem = out["memory"][key]
    mem["capacity_bytes"] = int(mem["peak_reserved_bytes"] * 100 / used_pct)
    return out


@needs_traces
def test_memory_advice_names_the_device_as_the_tab_does():
    assert "allocator_slack" not in rules(real(V100_MEM))  # 11.9 GiB of 31.7 GiB: no pressure
    rec = R.rule_allocator_slack(under_pressure(real(V100_MEM)))
    assert rec["title"] == "48 % of the memory reserved on GPU 1 was never used by tensors, even at the peak"
    assert rec["evidence"][0].startswith("GPU 1: peak reserved 11.90 GiB")
    assert "cuda:" not in rec["title"]


# ------------------------------------------------------------------ the CLI's words (text_report.py)
MI250_TRAIN = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"


@needs_traces
def test_cli_says_matrix_cores_on_amd_and_tensor_cores_on_nvidia():
    from tb_bottleneck_plugin.views.text_report import format_report

    amd = format_report(real(MI250_TRAIN))
    assert "GPU 2: utilization 1.19%, matrix cores 27.27%" in amd and "Tensor Cores" not in amd
    nvidia = format_report(real(H100_BERT))
    assert "Tensor Cores 76.50%" in nvidia and "matrix cores" not in nvidia


@needs_traces
def test_cli_names_step_categories_as_the_tab_does():
    from tb_bottleneck_plugin.views.text_report import format_report

    text = format_report(real(H100_BERT))
    assert ("average step 4.43 ms: Kernel 6.9%, Memcpy 0.1%, Runtime 8.6%, CPU Exec 35.9%, Other (idle) 48.5%"
            in text)
    assert "cpu_exec" not in text


def test_cli_step_list_of_a_multi_rank_summary_has_each_number_once():
    from tb_bottleneck_plugin.views.text_report import format_report

    text = format_report({"source": "x", "steps": {"found": True, "numbers": [2, 3, 4, 2, 3, 4]}})
    assert "steps [2, 3, 4] (numbers repeated across spans: 6 step windows)" in text
    assert "steps [5, 6]\n" in format_report({"source": "x", "steps": {"found": True, "numbers": [5, 6]}}) + "\n"


@needs_traces
def test_memory_advice_numbers_are_bytes_the_tab_formats_with_a_unit():
    rec = R.rule_allocator_slack(under_pressure(real(V100_MEM)))
    nums = rec["numbers"]
    assert set(nums) == {"slack_fragmentation_pct", "peak_reserved_bytes", "peak_allocated_bytes"}
    # 11.90 GiB reserved, 6.17 GiB allocated (the evidence line and the Memory panel say the same)
    assert nums["peak_reserved_bytes"] / (1 << 30) == pytest.approx(11.90, abs=0.005)
    assert nums["peak_allocated_bytes"] / (1 << 30) == pytest.approx(6.17, abs=0.005)


def test_host_bound_needs_the_kernel_statistics():
    """'The host does not keep it busy' says the kernels are neither short nor of low
    occupancy; with the occupancy section n/a (or failed) neither cause is known, so no
    cause is claimed (the GPU utilization card alone shows the idle GPU)."""
    rep = {"context": {"mode": "training"}, "gpu": {"0": {"utilization_pct": 30.0}},
           "input": {"input_bound_pct": 0.0}, "breakdown_pct": {"cpu_exec": 60.0}}
    assert R.rule_small_kernels(rep) is None
    rep["occupancy"] = {"short_kernels": {"count": 0, "time_pct": 0.0, "threshold_us": 10}}
    assert R.rule_small_kernels(rep)["rule"] == "host_bound"
