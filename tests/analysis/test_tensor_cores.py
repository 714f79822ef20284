"""Tensor Core detection (metrics.md §5): one test per pattern entry with its example
kernel name, negative names, precision split, and the usage numbers on a hand-made trace."""
from __future__ import annotations

import json
import re

import pytest

from tb_bottleneck_plugin.analysis import tensor_cores as tc
from tb_bottleneck_plugin.trace.loader import load_trace


@pytest.mark.parametrize("entry", tc.TC_PATTERNS, ids=[p.pattern[:40] for p in tc.TC_PATTERNS])
def test_each_pattern_matches_its_example(entry):
    assert re.search(entry.pattern, entry.example), entry
    assert tc.is_tensor_core_name(entry.example)
    assert entry.family and entry.note


def test_entries_cover_the_contract_list():
    must = ["h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "i16832", "c1688", "xmma_gemm",
            "xmma_implicit_gemm", "xmma_sparse_conv", "xmma_sparse_gemm", "xmma_warp_specialized_implicit_gemm",
            "dgrad_1x1_stride_2x2", "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group",
            "sm80_xmma", "sm90_xmma", "sm100", "tensorop", "wmma", "gmma", "wgmma", "nvjet", "flash_fwd",
            "flash_bwd", "fmha", "bmm_MxE4m3_x", "Cijk_Ailk_MT64x16x16_MI16x16x1", "xdlops", "_xdl_",
            "igemm_fwd_gtcx3", "mfma"]
    for token in must:
        assert tc.is_tensor_core_name(token), token


NOT_TENSOR_CORE = [
    # real names from ../shared/traces
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<...> >(int, ...)",
    "volta_sgemm_128x64_nn",  # FP32 SIMT GEMM on V100
    "ampere_sgemm_128x64_nn",
    "sgemm_128x64",
    "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)",
    "cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1",
    "volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1",
    "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, true, true>(int, int, int)",
    "SubTensorOpWithScalar1d",  # MIOpen elementwise on MI300, not cutlass tensorop
    "SubTensorOpWithCastTensor1d",
    "batched_transpose_32x32_half",
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
    "igemm_fwd_gtc_nhwc_fp32_bx0_ex1_bt128x128x16",  # MIOpen non-XDLOPS implicit GEMM
    "cutlass3x_sm100_simt_sgemm_f32_f32_f32_f32_f32_128x128x8_1x1x1_3_nnn_align1",
    "BGMManager",
]


@pytest.mark.parametrize("name", NOT_TENSOR_CORE)
def test_negative_names(name):
    assert not tc.is_tensor_core_name(name)


def test_volta_fp16_is_tc_fp32_is_not():
    assert tc.is_tensor_core_name("volta_h884gemm_64x64_ldg8_nn")
    assert not tc.is_tensor_core_name("volta_sgemm_128x64_nn")


@pytest.mark.parametrize("name,precision", [
    ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", "fp16"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(...)", "bf16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "bf16"),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_Ab32_Bb32_Cb32_t128x8x512", "fp8"),
    ("nvjet_sm90_e4m3_gemm", "fp8"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(...)", "tf32"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "tf32"),
    ("volta_sgemm_128x64_nn", "fp32"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "fp32"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "unknown"),
])
def test_precision_by_name(name, precision):
    assert tc.precision_of_name(name) == precision


@pytest.mark.parametrize("op,eligible", [
    ("aten::mm", True), ("aten::addmm", True), ("aten::linear", True), ("aten::conv2d", True),
    ("aten::cudnn_convolution", True), ("aten::convolution_backward", True), ("aten::_convolution", True),
    ("aten::bmm", True), ("aten::baddbmm", True), ("aten::einsum", True), ("aten::matmul", True),
    ("aten::scaled_dot_product_attention", True), ("aten::_scaled_dot_product_flash_attention", True),
    ("aten::_efficient_attention_forward", True), ("aten::lstm", True), ("aten::_cudnn_rnn", True),
    ("aten::relu", False), ("aten::add_", False), ("aten::copy_", False), ("aten::batch_norm", False),
])
def test_eligible_ops(op, eligible):
    assert (tc.ELIGIBLE_OP_RE.match(op) is not None) == eligible


def _x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def small_trace(tmp_path):
    ev = [
        # linear > addmm > launch(1): FP32 SIMT kernel, 100 us  -> eligible, not using
        _x("aten::linear", "cpu_op", 0, 100),
        _x("aten::addmm", "cpu_op", 10, 80, **{"Input Dims": [[64], [30, 17], [17, 64]],
                                              "Input type": ["float", "float", "float"]}),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 5, correlation=1),
        # matmul > mm > launch(2): Tensor Core kernel, 50 us
        _x("aten::matmul", "cpu_op", 200, 100),
        _x("aten::mm", "cpu_op", 210, 80, **{"Input Dims": [[32, 64], [64, 128]],
                                            "Input type": ["c10::Half", "c10::Half"]}),
        _x("cudaLaunchKernel", "cuda_runtime", 220, 5, correlation=2),
        # relu > launch(3): not eligible, 50 us
        _x("aten::relu", "cpu_op", 400, 50),
        _x("cudaLaunchKernel", "cuda_runtime", 410, 5, correlation=3),
        _x("volta_sgemm_128x64_nn", "kernel", 1000, 100, pid=0, tid=7, device=0, stream=7, correlation=1),
        _x("volta_h884gemm_64x64_ldg8_nn", "kernel", 1200, 50, pid=0, tid=7, device=0, stream=7, correlation=2),
        _x("void at::native::vectorized_elementwise_kernel<4, float>", "kernel", 1300, 50, pid=1, tid=7,
           device=1, stream=7, correlation=3),
    ]
    p = tmp_path / "w.pt.trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": ev}))
    return load_trace(str(p))


def test_usage_on_hand_made_trace(tmp_path):
    r = tc.tensor_core_usage(small_trace(tmp_path))
    assert r["kernel_us"] == 200
    assert r["tensor_core_pct"] == pytest.approx(25.0)
    assert r["per_device"] == {"0": pytest.approx(100 * 50 / 150), "1": 0.0}
    # the SIMT kernel lies under linear and addmm: counted once
    assert r["eligible_not_using_pct"] == pytest.approx(50.0)
    (top,) = r["top_eligible_not_using"]
    assert top["op"] == "aten::addmm"  # innermost eligible op
    assert top["kernel_us"] == 100 and top["pct"] == pytest.approx(50.0)
    assert top["input_types"] == ["float"]
    assert top["shapes_multiple_of_8"] is False  # 30 and 17
    split = r["precision_split_pct"]
    assert split["fp32"] == pytest.approx(75.0) and split["fp16"] == pytest.approx(25.0)
    assert sum(split.values()) == pytest.approx(100.0)


def test_cpu_only_is_not_available(tmp_path):
    p = tmp_path / "c.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": [_x("aten::mm", "cpu_op", 0, 10)]}))
    na = {}
    r = tc.tensor_core_usage(load_trace(str(p)), not_available=na)
    assert r["tensor_core_pct"] is None and "CPU-only" in na["tensor_cores.tensor_core_pct"]
    assert set(na) == {"tensor_cores.tensor_core_pct", "tensor_cores.eligible_not_using_pct",
                       "tensor_cores.precision_split_pct"} and "not_available" not in r


def test_multiple_of_8_rules():
    assert tc._multiple_of_8("aten::mm", [[32, 64], [64, 128]]) is True
    assert tc._multiple_of_8("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7], [], [], []]) is False
    assert tc._multiple_of_8("aten::cudnn_convolution", [[32, 64, 56, 56], [64, 64, 3, 3]]) is True
    assert tc._multiple_of_8("aten::mm", None) is None
