"""Tensor Core, occupancy and memory numbers against torch-tb-profiler (tbp) on the
shared real traces (../shared/oracles/reference.json), with the deliberate differences
of metrics.md §5 pinned to values computed here from the kernel names."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from tb_bottleneck_plugin.analysis.memory import memory_usage
from tb_bottleneck_plugin.analysis.occupancy import device_properties, kernel_occupancy
from tb_bottleneck_plugin.analysis.steps import find_steps
from tb_bottleneck_plugin.analysis.tensor_cores import tensor_core_usage
from tb_bottleneck_plugin.loader import load_trace

from conftest import SHARED, TRACES  # noqa: E402  (the one definition, tests/conftest.py)
REF = json.loads((SHARED / "oracles" / "reference.json").read_text())["traces"]

RESNET = [
    "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
    "kineto-tb-samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "kineto-tb-samples/resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
]
V100 = RESNET + ["hta/df_index_resolver/df_index_resolver.json.gz",
                 "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]
# tbp's Kernel-view allowlist (substrings), from oracles/README.md
TBP_ALLOWLIST = ("h884 s884 h1688 s1688 hmma i8816 16816 dgrad_1x1_stride_2x2 first_layer_wgrad_kernel conv1x1 "
                 "conv2d_c1_k1 direct_group xmma_implicit_gemm xmma_sparse_conv "
                 "xmma_warp_specialized_implicit_gemm xmma_gemm xmma_sparse_gemm c1688").split()
# Where our list deliberately goes beyond tbp's: the kernel-name markers of the extra
# Tensor Core kernels in each trace (checked by hand against the trace's kernel list).
EXTRA_TC_MARKERS = {
    "hta/trace_diff/control/control.json.gz": (),  # A100: every tensorop kernel there has s1688
    "hta/nccl_parser_config/nccl_data.json.gz": ("sm80_xmma_", "MmaTensorOp"),  # cuDNN 8 TF32 convs
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz": ("wmma_tensorop", "flash_fwd_kernel",
                                                                     "sm90_xmma_gemm"),
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": ("Cijk_",),
    "tracelens/mi300/resnet_act_checkpoint.json.gz": ("Cijk_", "xdlops", "_xdl_", "igemm_fwd_gtcx",
                                                      "igemm_bwd_gtcx", "igemm_wrw_gtcx"),
}


@lru_cache(maxsize=None)
def load(rel):
    return load_trace(str(TRACES / rel))


@lru_cache(maxsize=None)
def tc_result(rel):
    return tensor_core_usage(load(rel))


def tbp(rel):
    return REF[rel]["torch_tb_profiler"]


def kernel_times(rel):
    tr = load(rel)
    k = tr.gpu.kind == 0
    ids, inv = np.unique(tr.gpu.name[k], return_inverse=True)
    return [tr.strings[i] for i in ids], np.bincount(inv, weights=tr.gpu.dur[k])


def pct_matching(rel, pred):
    names, times = kernel_times(rel)
    return 100.0 * sum(t for n, t in zip(names, times) if pred(n)) / times.sum()


def tbp_match(name):
    return any(s in name for s in TBP_ALLOWLIST)


WITH_TC = [r for r, v in REF.items()
           if v["torch_tb_profiler"].get("ok") and v["torch_tb_profiler"].get("tensor_core_kernel_time_pct_kernel_view") is not None]


@pytest.mark.parametrize("rel", WITH_TC)
def test_tbp_allowlist_reimplementation_matches_tbp(rel):
    # the oracle is reproduced from our kernel table with tbp's substrings
    assert pct_matching(rel, tbp_match) == pytest.approx(tbp(rel)["tensor_core_kernel_time_pct_kernel_view"], abs=0.01)


@pytest.mark.parametrize("rel", V100)
def test_tensor_core_pct_equals_tbp_on_v100(rel):
    assert tc_result(rel)["tensor_core_pct"] == pytest.approx(tbp(rel)["tensor_core_kernel_time_pct_kernel_view"], abs=0.01)
    if rel in RESNET:
        assert tc_result(rel)["tensor_core_pct"] == 0.0


@pytest.mark.parametrize("rel", sorted(EXTRA_TC_MARKERS))
def test_tensor_core_pct_deliberate_superset(rel):
    """Deliberate difference (metrics.md §5): tbp's list misses cutlass wmma/tensorop
    without 16816/s1688, sm80/sm90 XMMA convs, flash attention and AMD MFMA kernels, so
    its value is a lower bound here. Ours = tbp's kernels + the listed extra kernels."""
    markers = EXTRA_TC_MARKERS[rel]
    expected = pct_matching(rel, lambda n: tbp_match(n) or any(m in n for m in markers))
    ours = tc_result(rel)["tensor_core_pct"]
    assert ours == pytest.approx(expected, abs=1e-6)
    assert ours >= tbp(rel)["tensor_core_kernel_time_pct_kernel_view"] - 0.01
    if markers:
        assert ours > tbp(rel)["tensor_core_kernel_time_pct_kernel_view"] + 1.0


@pytest.mark.parametrize("rel", RESNET)
def test_eligible_share_on_fp32_resnet50(rel):
    """No kernel uses Tensor Cores here, so tbp's eligible share (TC + non-TC kernels of
    the innermost eligible ops) equals our eligible-not-using share (non-TC kernels under
    any eligible op). Measured difference <= 0.005 pp; allowed 0.3 pp because tbp
    attributes through External id and we through correlation + time containment."""
    assert tc_result(rel)["eligible_not_using_pct"] == pytest.approx(tbp(rel)["tc_eligible_ops_kernel_time_pct"], abs=0.3)


def test_eligible_deliberate_differences():
    # tbp counts Tensor Core kernels too: on the bf16 H100 trace every GEMM uses them
    h100 = "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
    assert tbp(h100)["tc_eligible_ops_kernel_time_pct"] > 20 and tc_result(h100)["eligible_not_using_pct"] == 0.0
    # tbp cannot link 2022-04..2024-02 kernels (External id == correlation): 0 there
    df = "hta/df_index_resolver/df_index_resolver.json.gz"
    assert tbp(df)["tc_eligible_ops_kernel_time_pct"] == 0.0 and tc_result(df)["eligible_not_using_pct"] > 30


OCC = [r for r, v in REF.items() if v["torch_tb_profiler"].get("ok")
       and any(g.get("est_achieved_occupancy_pct") is not None for g in v["torch_tb_profiler"]["gpu"].values())]


@pytest.mark.parametrize("rel", OCC)
def test_est_achieved_occupancy_per_device(rel):
    tr = load(rel)
    r = kernel_occupancy(tr, find_steps(tr).window, kineto_only=True)
    for dev, g in tbp(rel)["gpu"].items():
        assert r["per_device"][dev] == pytest.approx(g["est_achieved_occupancy_pct"], abs=0.1)


# metrics.md §6 DELIBERATE DIFFERENCE: where Kineto wrote 0 for a kernel that ran (it
# calls the occupancy calculator with the default 48 KB per-block shared memory, so a
# kernel that opted in to more gets 0 resident blocks), the tab shows the calculator's
# estimate. Kineto's genuine zeros (estimates below 0.5 %, rounded) stay. Measured:
# share of clipped kernel time that takes the calculator's value, and the new mean.
SHOWN_OCCUPANCY = {
    "hta/nccl_parser_config/nccl_data.json.gz": ({"0": 37.79}, 48.11),  # tbp 35.31 (A100)
    "hta/trace_diff/control/control.json.gz": ({"3": 33.58}, 13.98),  # tbp 32.46 (A100)
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz": ({"0": 6.58}, 32.19),  # tbp 4.08
}


@pytest.mark.parametrize("rel", OCC)
def test_shown_occupancy_deliberate_difference(rel):
    tr = load(rel)
    r = kernel_occupancy(tr, find_steps(tr).window)
    if rel in SHOWN_OCCUPANCY:
        per_device, calc_pct = SHOWN_OCCUPANCY[rel]
        assert r["per_device"] == pytest.approx(per_device, abs=0.01)
        assert r["calculator_kernel_time_pct"] == pytest.approx(calc_pct, abs=0.01)
        assert any(k["occupancy_source"] == "calculator" for k in r["kernels"])
    else:  # V100 resnet50, df_index_resolver, ns_resolution: Kineto's values, tbp's numbers
        assert r["calculator_kernel_time_pct"] == 0.0
        for dev, g in tbp(rel)["gpu"].items():
            assert r["per_device"][dev] == pytest.approx(g["est_achieved_occupancy_pct"], abs=0.1)
    # No kernel row shows Kineto's artefact 0 where the calculator has a value.
    assert not [k for k in r["kernels"] if k["occupancy_source"] == "kineto" and k["est_achieved_occupancy_pct"] == 0
                and (k["theoretical_occupancy_pct"] or 0) > 0 and (k["blocks_per_sm"] or 0) >= 0.1]


def test_resnet_spans_are_in_the_occupancy_list():
    assert set(RESNET) <= set(OCC)


MEM = [r for r, v in REF.items() if v["torch_tb_profiler"].get("ok") and (v["torch_tb_profiler"].get("memory") or {})
       .get("peak_total_allocated_bytes")]


def our_key(tbp_key):
    kind, _, did = tbp_key.partition(":")
    return "cpu" if kind == "CPU" else f"cuda:{did}"


@pytest.mark.parametrize("rel", MEM)
def test_memory_peaks_equal_tbp(rel):
    na = {}
    r = memory_usage(load(rel), not_available=na)
    m = tbp(rel)["memory"]
    for key, peak in m["peak_total_allocated_bytes"].items():
        assert r[our_key(key)]["peak_allocated_bytes"] == peak
        reserved = m["peak_total_reserved_bytes_from_records"][key]
        if our_key(key) == "cpu" and reserved == 0:
            # metrics.md §7 DELIBERATE DIFFERENCE: the CPU allocator writes Total Reserved 0;
            # tbp shows 0 B, we show n/a with the reason.
            assert r["cpu"]["peak_reserved_bytes"] is None
            assert "CPU allocator" in na["memory.cpu.peak_reserved_bytes"]
        else:
            assert r[our_key(key)]["peak_reserved_bytes"] == reserved


def test_df_index_resolver_slack_is_the_allocated_reserved_gap():
    rel = "hta/df_index_resolver/df_index_resolver.json.gz"
    m = tbp(rel)["memory"]
    alloc, res = m["peak_total_allocated_bytes"]["CUDA:1"], m["peak_total_reserved_bytes_from_records"]["CUDA:1"]
    r = memory_usage(load(rel))["cuda:1"]
    assert r["slack_fragmentation_pct"] == pytest.approx(100.0 * (res - alloc) / res)  # ~48 %: 6.2 of 11.9 GiB used
    assert 40 < r["slack_fragmentation_pct"] < 55
    assert r["capacity_bytes"] == device_properties(load(rel))[1]["totalGlobalMem"]
    assert len(r["curve"]["ts_us"]) <= 2000 + 2 and max(r["curve"]["allocated_bytes"]) == alloc


def test_2021_memory_is_relative_where_tbp_has_no_peak():
    r = memory_usage(load(RESNET[0]))
    assert tbp(RESNET[0])["memory"]["peak_total_allocated_bytes"] == {}
    assert r["cuda:0"]["allocated_is_relative"] is True and r["cuda:0"]["peak_reserved_bytes"] is None
