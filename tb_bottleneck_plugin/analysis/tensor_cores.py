"""Tensor Core usage (metrics.md §5), vectorised.

Each distinct kernel *name* is classified once (by regular expression over the string
table); the per-event work is numpy indexing and bincounts.

Public API
----------
- ``TC_PATTERNS``: the maintained pattern list, as data (``TcPattern`` entries).
- ``is_tensor_core_name(name) -> bool``, ``precision_of_name(name) -> str``.
- ``tensor_core_name_mask(trace) -> np.ndarray[bool]`` over ``trace.strings``.
- ``tensor_core_kernel_mask(trace) -> np.ndarray[bool]`` over ``trace.gpu`` rows.
- ``tensor_core_usage(trace, top_n=10, not_available=None) -> dict`` with keys
  ``tensor_core_pct``, ``per_device``, ``eligible_not_using_pct``,
  ``top_eligible_not_using``, ``precision_split_pct``, ``kernel_us``, ``tensor_core_us``,
  ``eligible_not_using_us``; reasons go into ``not_available`` under the report's keys
  (``tensor_cores.<metric>``; analysis/units.py).

Deliberate differences from torch-tb-profiler (tbp), see metrics.md §5: the list is a
superset of tbp's allowlist (tbp's Kernel-view TC % is therefore a lower bound on
Ampere and newer and 0 on ROCm); "eligible but not using" counts only *non*-Tensor-Core
kernels, under *any* enclosing eligible op (once per kernel), linked through the
correlation id and time containment, not the External id.
"""
from __future__ import annotations

import json
import re
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from ..trace.model import GPU_KERNEL, TraceData
from . import linking, precision
from .accelerators import no_gpu_reason
from .factorize import thread_ids_of, unique_rows


class TcPattern(NamedTuple):
    """One entry of the maintained Tensor Core pattern list."""

    pattern: str  # Python regex, searched in the kernel name (case-sensitive unless (?i))
    family: str  # GPU family / library that emits such kernels
    example: str  # a kernel name the entry must match (tested, one test per entry)
    note: str  # where the example comes from and what the token means


# Where an example says "trace:", it is a kernel name from ../shared/traces; "public:" a
# name quoted in public code or issues; "naming:" built from the library's documented
# naming scheme (no trace at hand).
TC_PATTERNS = (
    # --- the classic NVIDIA list (PyProf / torch-tb-profiler allowlist) -------------
    TcPattern(r"h884", "Volta (sm70) fp16 HMMA 8x8x4",
              "volta_h884gemm_64x64_ldg8_nn",
              "naming: cuBLAS Volta half GEMM; h = fp16 accumulate"),
    TcPattern(r"s884", "Volta (sm70) fp16 in, fp32 accumulate",
              "volta_s884cudnn_fp16_256x64_ldg8_relu_exp_small_nhwc_tn_v1",
              "naming: cuDNN Volta Tensor Core convolution"),
    TcPattern(r"h1688", "Turing (sm75) fp16 HMMA 16x8x8",
              "turing_h1688gemm_256x128_ldg8_tn",
              "naming: cuBLAS Turing half GEMM"),
    TcPattern(r"s1688", "Turing fp16->fp32 / Ampere+ TF32 16x8x8",
              "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
              "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
              "trace: hta/nccl_parser_config (A100 TF32 in an FP32 run)"),
    TcPattern(r"hmma", "Volta+ HMMA instruction named in the kernel",
              "volta_fp16_hmma_implicit_gemm_128x128_nhwc_kernel",
              "naming: kernels named after the HMMA instruction"),
    TcPattern(r"i8816", "Turing+ int8 IMMA 8x8x16",
              "cutlass_tensorop_s8_i8816fprop_few_channels_s8_128x128_32x2_nhwc_align16",
              "public: CUTLASS conv2d sm75 int8 kernel"),
    TcPattern(r"16816", "Ampere+ fp16/bf16 MMA 16x8x16",
              "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>"
              "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)",
              "trace: tracelens/h100 (bf16)"),
    TcPattern(r"i16832", "Ampere+ int8 IMMA 16x8x32",
              "cutlass_tensorop_s8_i16832gemm_s8_256x128_64x3_tn_align16",
              "naming: CUTLASS sm80 int8 GEMM"),
    TcPattern(r"c1688", "Ampere complex TF32 16x8x8",
              "cutlass_tensorop_c1688tf32gemm_64x64_16x10_nt_align1",
              "naming: CUTLASS complex GEMM"),
    TcPattern(r"xmma_gemm", "cuBLAS/cuDNN XMMA GEMM (Volta+)",
              "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_"
              "execute_segment_k_off_kernel__5x_cublas",
              "trace: tracelens/h100"),
    TcPattern(r"xmma_implicit_gemm", "cuDNN XMMA implicit-GEMM convolution",
              "xmma_implicit_gemm_fprop_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_kernel",
              "naming: tbp allowlist entry"),
    TcPattern(r"xmma_sparse_conv", "cuDNN XMMA sparse convolution (Ampere 2:4)",
              "sm80_xmma_sparse_conv_fprop_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_kernel",
              "naming: tbp allowlist entry"),
    TcPattern(r"xmma_sparse_gemm", "cuBLASLt XMMA sparse GEMM (Ampere 2:4)",
              "sm80_xmma_sparse_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x64_kernel",
              "naming: tbp allowlist entry"),
    TcPattern(r"xmma_warp_specialized_implicit_gemm", "cuDNN XMMA warp-specialized conv (Hopper)",
              "sm90_xmma_warp_specialized_implicit_gemm_fprop_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_kernel",
              "naming: tbp allowlist entry"),
    TcPattern(r"dgrad_1x1_stride_2x2", "cuDNN Volta+ 1x1 stride-2 dgrad",
              "void cudnn::detail::dgrad_1x1_stride_2x2<__half, float>(cudnn::detail::dgrad_params)",
              "naming: tbp allowlist entry"),
    TcPattern(r"first_layer_wgrad_kernel", "cuDNN first-layer wgrad (Volta+)",
              "void cudnn::cnn::first_layer_wgrad_kernel<__half, float, 7, 7>(cudnn::cnn::wgrad_params)",
              "naming: tbp allowlist entry"),
    TcPattern(r"conv1x1", "cuDNN 1x1 convolution kernels (Volta+)",
              "void cudnn::cnn::conv1x1_fprop_kernel<__half, float>(cudnn::cnn::conv_params)",
              "naming: tbp allowlist entry"),
    TcPattern(r"conv2d_c1_k1", "cuDNN c1/k1 convolution (Volta+)",
              "void cudnn::cnn::conv2d_c1_k1_nhwc_kernel<__half, float>(cudnn::cnn::conv_params)",
              "naming: tbp allowlist entry"),
    TcPattern(r"direct_group", "cuDNN direct grouped convolution (Volta+)",
              "void cudnn::cnn::direct_group_conv_fprop_kernel<__half, float>(cudnn::cnn::conv_params)",
              "naming: tbp allowlist entry"),
    # --- Ampere / Hopper / Blackwell --------------------------------------------------
    TcPattern(r"sm8\d_xmma", "Ampere/Ada XMMA (cuDNN 8 / cuBLAS)",
              "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_"
              "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
              "trace: hta/nccl_parser_config (tbp misses it: no 'xmma_implicit_gemm' substring)"),
    TcPattern(r"sm9\d_xmma", "Hopper XMMA (cuBLAS / cuDNN 9)",
              "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_"
              "execute_segment_k_off_kernel__5x_cublas",
              "trace: tracelens/h100"),
    TcPattern(r"(?i)sm_?1[02]\d[af]?(?![0-9])", "Blackwell (sm100/sm120) kernels",
              "fmhaSm100aKernel_QkvE4m3OBfloat16HQk128HV128SeqQ128SeqKv128PersistentContext",
              "public: TRT-LLM/flashinfer Blackwell attention; cutlass3x_sm100_simt_* is excluded below"),
    TcPattern(r"tensorop", "CUTLASS Tensor Core kernels (lower-case cutlass naming)",
              "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128_16x4_"
              "nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_128x128_16x4_nhwc_align4::Params)",
              "trace: hta/nccl_parser_config; case-sensitive so MIOpen SubTensorOp* does not match"),
    TcPattern(r"MmaTensorOp|TensorOpMultiplicand", "CUTLASS mangled (templated) Tensor Core kernels",
              "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock"
              "22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi32EEENS4_6warp11MmaTensorOpINS7_"
              "ILi32ELi64ELi32EEEEEvNT_6ParamsE",
              "trace: hta/nccl_parser_config (shortened); cutlass::gemm::warp::MmaTensorOp"),
    TcPattern(r"(?i)wmma", "WMMA API kernels (Volta+)",
              "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
              "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
              "trace: tracelens/h100 (tbp misses it)"),
    TcPattern(r"[Ww]gmma|Gmma|(?<![A-Za-z])gmma", "Hopper warpgroup MMA (CUTLASS 3 / CuTe)",
              "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
              "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<4, "
              "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecialized> > > >"
              "(cutlass::gemm::kernel::GemmUniversal::Params)",
              "naming: CUTLASS 3 mainloop policy; case-sensitive so 'BGMManager'-like words do not match"),
    TcPattern(r"nvjet", "cuBLASLt nvJet GEMMs (Hopper/Blackwell)",
              "nvjet_sm100_tst_16x64_64x16_4x1_v_bz_TNN",
              "public: cuBLAS 12.8 Blackwell GEMM"),
    TcPattern(r"flash_fwd|flash_bwd|flash::|flash_attn", "FlashAttention (sm80+, MMA based)",
              "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, "
              "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
              "cutlass::bfloat16_t> >, false, false, false, false, false, true, false>"
              "(pytorch_flash::Flash_fwd_params)",
              "trace: tracelens/h100 (tbp misses it)"),
    TcPattern(r"(?i)fmha", "fused MHA kernels (PyTorch mem-efficient attention, TRT-LLM, CK tile)",
              "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
              "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
              "naming: PyTorch memory-efficient SDPA kernel"),
    TcPattern(r"(?i)(?<![A-Za-z])bmm_(?:Mx)?(?:E\dm\d|Bfloat16|Fp16)_", "Blackwell block-scaled GEMMs (trtllm-gen)",
              "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_Ab32_Bb32_Cb32_t128x8x512_s3_et128x8_m128x8x32_c1x1x1_rM_TN_"
              "transOut_schPd2x1x2x3_biasFp32M_bN_tma_ldgstsSf_rgTma_clmp_swiGlu_dynB_sm100f",
              "public: MXFP8 x MXFP4 MoE GEMM"),
    # --- AMD matrix cores -------------------------------------------------------------
    TcPattern(r"Cijk_.*_MI\d+x\d+x\d+", "AMD CDNA (MI100/200/300) Tensile/hipBLASLt MFMA GEMM",
              "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1",
              "trace: hta/amd_trace (MI250, shortened); MI<m>x<n>x<k> = matrix instruction"),
    TcPattern(r"(?i)xdlops", "AMD composable_kernel / MIOpen XDLOPS (MFMA)",
              "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_"
              "bk0mk1_bk0nk1_mn_xdlops_bwd_weightILi64EttftLNS_25InMemoryDataOperationEnumE1EEEvv",
              "trace: tracelens/mi300 (shortened)"),
    TcPattern(r"_xdl_", "AMD composable_kernel XDL (MFMA) device ops",
              "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28"
              "GridwiseGemm_xdl_cshuffle_v3EEEvv",
              "trace: tracelens/mi300 (shortened)"),
    TcPattern(r"igemm_(?:fwd|bwd|wrw)_gtcx", "AMD MIOpen implicit GEMM with XDLOPS (gtcx = MFMA)",
              "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt64x128x32_wt32x32x8_ws1x1_wr2x1_ta1x8x1x1_1x4x1x64_"
              "tb1x8x2x1_1x4x1x64_gkgs",
              "trace: tracelens/mi300; igemm_*_gtc_ (no x) are the non-MFMA variants"),
    TcPattern(r"^_?attn_(?:fwd|bwd)(?:_dkdv|_dq)?$|^bwd_kernel_(?:dk_dv|dq|fuse)$",
              "AMD AOTriton / Triton flash attention (tl.dot: MFMA on CDNA, MMA on NVIDIA)",
              "attn_fwd",
              "trace: tracelens/torch_compile_triton (MI300X bf16 SDPA: aten::_flash_attention_forward); "
              "AOTriton's backward kernels are bwd_kernel_dk_dv / bwd_kernel_dq / attn_bwd"),
    TcPattern(r"(?i)mfma", "AMD kernels named after the MFMA instruction",
              "miopenSp3AsmConv_v30_3_1_gfx11_fp16_mfma_stride1",
              "naming: MIOpen/rocBLAS kernels named after MFMA"),
)

# Names that match a pattern above but run on the SIMT (CUDA-core) pipes: CUTLASS's
# `_simt_`, and cuBLAS's XMMA kernels that say `_ffma_` (FP32 fused multiply-add, e.g.
# `sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_..._ffma_...`, what H100 runs
# for an FP32 matmul without TF32); tbp's `xmma_gemm` entry counts those too.
TC_EXCLUDE = re.compile(r"(?i)_simt_|_ffma_")



def _scoped(pattern: str) -> str:
    """A pattern as a group usable inside an alternation (leading ``(?i)`` scoped)."""
    if pattern.startswith("(?i)"):
        return f"(?i:{pattern[4:]})"
    return f"(?:{pattern})"


_TC_RE = re.compile("|".join(_scoped(p.pattern) for p in TC_PATTERNS))

# Ops that could run on Tensor Cores (metrics.md §5). Matched on the full op name.
ELIGIBLE_OP_RE = re.compile(
    r"^aten::(?:mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_?conv\w*|_convolution\w*|convolution\w*"
    r"|cudnn_convolution\w*|miopen_convolution\w*|mkldnn_convolution\w*|einsum"
    r"|_?scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*"
    r"|_?(?:cudnn_|miopen_)?(?:lstm|gru|rnn)\w*|_thnn_fused_(?:lstm|gru)\w*)$"
)

# Precision split: the one decoder of kernel and op precisions (analysis/precision.py)
PRECISIONS = precision.PRECISIONS
precision_of_name = precision.precision_of_name
# ops whose recorded dtype is the precision of the kernels they launch (the split): the eligible
# ops and the scaled / integer GEMMs (cuBLASLt nvjet fp8 kernels name no dtype)
_PRECISION_OP_RE = re.compile(ELIGIBLE_OP_RE.pattern[:-2] + r"|_scaled_mm|_scaled_grouped_mm|_int_mm"
                              r"|_addmm_activation|_grouped_mm)$")


def is_tensor_core_name(name: str) -> bool:
    """Whether a kernel name is a Tensor Core (matrix core) kernel by the list."""
    return bool(_TC_RE.search(name)) and not TC_EXCLUDE.search(name)


def _kernel_name_ids(trace: TraceData) -> np.ndarray:
    return np.unique(trace.gpu.name[trace.gpu.kind == GPU_KERNEL])


def tensor_core_name_mask(trace: TraceData) -> np.ndarray:
    """Boolean array over trace.strings: the string is a Tensor Core kernel name.
    Only names used by kernels are classified (once each); remembered on the trace (the
    occupancy, operator and step-model analyses ask again; tables are read-only once loaded)."""
    col = trace.gpu.name
    hit = trace.__dict__.get("_tc_name_mask")
    if hit is not None and hit[0] is col and hit[1] == len(trace.strings):
        return hit[2].copy()
    mask = np.zeros(len(trace.strings), dtype=bool)
    for i in _kernel_name_ids(trace):
        mask[i] = is_tensor_core_name(trace.strings[i])
    trace.__dict__["_tc_name_mask"] = (col, len(trace.strings), mask)
    return mask.copy()


def tensor_core_kernel_mask(trace: TraceData) -> np.ndarray:
    """Boolean array over trace.gpu rows: a kernel whose name is a Tensor Core name."""
    return tensor_core_name_mask(trace)[trace.gpu.name] & (trace.gpu.kind == GPU_KERNEL)


def eligible_op_rows(trace: TraceData) -> np.ndarray:
    """Rows of trace.cpu whose op name is on the eligible list."""
    ids = trace.string_ids(lambda s: ELIGIBLE_OP_RE.match(s) is not None)
    return np.flatnonzero(np.isin(trace.cpu.name, ids))


def _pct(num: float, den: float) -> Optional[float]:
    return float(100.0 * num / den) if den > 0 else None


def _multiple_of_8(op_name: str, dims) -> Optional[bool]:
    """Are the Tensor-Core-relevant sizes of one recorded op call multiples of 8?

    conv*: input channels (dim 1 of the input) and output channels (dim 0 of the weight);
    attention: the head dimension (last dim of the query); matmul-like and RNN ops: the
    last two dims of every tensor input with >= 2 dims (M, N, K). None when nothing was
    recorded."""
    if not isinstance(dims, list):
        return None
    shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    if not shapes:
        return None
    low = op_name.lower()
    sizes: List[int] = []
    if "conv" in low:
        if len(shapes[0]) >= 2:
            sizes.append(shapes[0][1])
        if len(shapes) > 1 and len(shapes[1]) >= 1:
            sizes.append(shapes[1][0])
    elif "attention" in low:
        sizes.append(shapes[0][-1])
    else:
        for s in shapes:
            if len(s) >= 2:
                sizes += s[-2:]
    if not sizes:
        return None
    return all(x % 8 == 0 for x in sizes)


def _is_dtype(t: str) -> bool:
    """A recorded `Input type` that names a tensor dtype (``float``, ``c10::Half``,
    ``long int``), not an argument kind (``Scalar``, ``GenericList``, ``Int``, ...)."""
    return bool(t) and (t.startswith("c10::") or t[0].islower())


def _op_details(trace: TraceData, name: str, rows: np.ndarray, limit: int = 64):
    """Input dtypes and the multiple-of-8 verdict over (at most ``limit``) recorded calls."""
    types: List[str] = []
    verdicts: List[bool] = []
    for r in rows[:limit]:
        t = trace.op_inputs.types.get(int(r))
        if isinstance(t, list):
            for x in t:
                if isinstance(x, str) and _is_dtype(x) and x not in types:
                    types.append(x)
        v = _multiple_of_8(name, trace.op_inputs.dims.get(int(r)))
        if v is not None:
            verdicts.append(v)
    return types, (all(verdicts) if verdicts else None), len(verdicts)


def _recorded_types(trace: TraceData, row: int):
    """The ``Input type`` list an op recorded (record_shapes); None when absent."""
    types = trace.op_inputs.types.get(row)
    if types is None:
        sid = int(trace.cpu.input_types[row])
        if sid >= 0:
            try:
                types = json.loads(trace.strings[sid])
            except (ValueError, TypeError, IndexError):
                types = None
    return types if isinstance(types, list) else None


def _innermost_rows(trace: TraceData, rows: np.ndarray) -> np.ndarray:
    """The rows among ``rows`` (CPU ops) with none of the others inside them on their thread,
    sorted. Ops nest (a span holds another wholly or not at all), so in (thread, start, longer
    first) order an op holds another iff the next one on its thread starts before it ends."""
    if not len(rows):
        return rows
    cpu = trace.cpu
    ts, end = cpu.ts[rows], cpu.ts[rows] + np.nan_to_num(cpu.dur[rows], nan=0.0)
    # np.lexsort((ts - end, ts, tid, pid)): by start (few ties), then the thread (a stable
    # radix sort of dense ids in (pid, tid) order), not a lexsort of four keys (2 ms of 20k ops)
    order = linking.ordered_by_keys([ts - end, ts])
    thread = thread_ids_of(cpu.pid[rows], cpu.tid[rows])[0]
    if len(thread) and thread.max() > 0:
        order = order[np.argsort(thread[order].astype(np.int16 if thread.max() < 1 << 15 else np.int64), kind="stable")]
    r, ts, end = rows[order], ts[order], end[order]
    same = (cpu.pid[r][1:] == cpu.pid[r][:-1]) & (cpu.tid[r][1:] == cpu.tid[r][:-1])
    holds = np.zeros(len(r), bool)
    holds[:-1] = same & (ts[1:] < end[:-1])
    return np.sort(r[~holds])


def _kernel_precisions(trace: TraceData, prec_name: np.ndarray, rt_of_gpu: np.ndarray, is_kernel: np.ndarray,
                       op_calls=None) -> np.ndarray:
    """Index into PRECISIONS per GPU row (analysis/precision.kernel_precision): the recorded
    dtype of the matmul/conv/attention op whose call launched the kernel, else (no such op, no
    shapes recorded) what the kernel's name says. As the FLOPs section owns kernels (§15): an
    innermost such op (none inside it: aten::addmm, not the aten::linear around it, whose cast
    kernels keep their names) owns every kernel launched inside it. Non-kernel rows: their
    name's."""
    k_prec = prec_name[trace.gpu.name].astype(np.int64)
    linked = np.flatnonzero(is_kernel & (rt_of_gpu >= 0))
    if not len(linked) or not len(trace.runtime):
        return k_prec
    ids = trace.string_ids(lambda s: _PRECISION_OP_RE.match(s) is not None)
    if not len(ids):
        return k_prec
    leaf = _innermost_rows(trace, np.flatnonzero(np.isin(trace.cpu.name, ids)))
    if not len(leaf):
        return k_prec
    pair_op, pair_rt = linking.calls_inside(trace, np.sort(leaf), among=op_calls)
    inner = linking.first_per_call(pair_op, pair_rt, len(trace.runtime), (trace.cpu.dur, -trace.cpu.ts))
    k_op = inner[rt_of_gpu[linked]]
    hit = k_op >= 0
    linked, k_op = linked[hit], k_op[hit]
    if not len(linked):
        return k_prec
    # op calls with a TF32 kernel: an fp32 call ran tf32, all its kernels (precision.kernel_precision)
    cpu = trace.cpu
    tf32_call = np.zeros(len(cpu), bool)
    tf32_call[k_op[prec_name[trace.gpu.name[linked]] == PRECISIONS.index("tf32")]] = True
    # one decode per distinct (op name, Input type text, kernel name, TF32 call)
    keys = np.stack([cpu.name[k_op], np.where(cpu.input_types[k_op] >= 0, cpu.input_types[k_op], -2 - k_op),
                     trace.gpu.name[linked], tf32_call[k_op]], axis=1)
    uniq, inv = unique_rows(keys)
    first = np.zeros(len(uniq), np.int64)
    first[inv[::-1]] = np.arange(len(inv) - 1, -1, -1)
    codes = np.empty(len(uniq), np.int64)
    for u, j in enumerate(first.tolist()):
        row = int(k_op[j])
        op_prec = precision.op_precision(trace.strings[int(cpu.name[row])], _recorded_types(trace, row))
        got = precision.kernel_precision(trace.strings[int(uniq[u, 2])], op_prec, bool(uniq[u, 3]))
        codes[u] = PRECISIONS.index(got) if got in PRECISIONS else int(prec_name[uniq[u, 2]])
    k_prec[linked] = codes[inv]
    return k_prec


def tensor_core_usage(trace: TraceData, top_n: int = 10, not_available: Optional[Dict[str, str]] = None,
                      gpu_runtime: Optional[np.ndarray] = None, op_calls=None) -> Dict:
    """§5 over the whole trace (all kernel time, not clipped to steps). A share that has
    no answer is None, its reason in ``not_available`` as ``tensor_cores.<metric>``;
    ``gpu_runtime``: linking.gpu_runtime_index(trace), ``op_calls``: linking.op_calls(trace),
    when the caller has them."""
    if not_available is None:
        not_available = {}
    gpu = trace.gpu
    is_kernel = gpu.kind == GPU_KERNEL
    dur = np.where(is_kernel, gpu.dur, 0.0)
    kernel_us = float(dur.sum())
    out: Dict = {"tensor_core_pct": None, "per_device": {}, "eligible_not_using_pct": None,
                 "top_eligible_not_using": [], "precision_split_pct": {k: None for k in PRECISIONS},
                 "kernel_us": kernel_us, "tensor_core_us": 0.0, "eligible_not_using_us": 0.0}
    if not is_kernel.any() or not (np.isfinite(kernel_us) and kernel_us > 0):
        # Every share here is of kernel time: none when there is none (no kernel, or
        # every kernel lasted 0 µs, as integer-µs traces can write for short kernels).
        reason = (no_gpu_reason(trace, "no GPU kernels in the trace (CPU-only)") if not is_kernel.any()
                  else "kernels have no usable duration (every kernel lasted 0 µs, or the total is not "
                  "finite): no kernel time to share")
        for metric in ("tensor_core_pct", "eligible_not_using_pct", "precision_split_pct"):
            not_available[f"tensor_cores.{metric}"] = reason
        return out

    # Classify each distinct kernel name once (the Tensor Core names: the trace's remembered mask,
    # which the occupancy, Operator view and step model read too)
    tc_name = tensor_core_name_mask(trace)
    prec_name = np.full(len(trace.strings), len(PRECISIONS) - 1, dtype=np.int8)
    for i in _kernel_name_ids(trace):
        prec_name[i] = PRECISIONS.index(precision_of_name(trace.strings[i]))
    tc = tc_name[gpu.name] & is_kernel

    tc_us = float(dur[tc].sum())
    out["tensor_core_us"] = tc_us
    out["tensor_core_pct"] = _pct(tc_us, kernel_us)
    devs, dinv = np.unique(gpu.device, return_inverse=True)
    d_all = np.bincount(dinv, weights=dur, minlength=len(devs))
    d_tc = np.bincount(dinv, weights=np.where(tc, dur, 0.0), minlength=len(devs))
    out["per_device"] = {str(int(d)): _pct(t, a) for d, a, t in zip(devs, d_all, d_tc) if a > 0}
    rt_of_gpu = linking.gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
    k_prec = _kernel_precisions(trace, prec_name, rt_of_gpu, is_kernel, op_calls)
    prec = np.bincount(k_prec, weights=dur, minlength=len(PRECISIONS))
    out["precision_split_pct"] = {k: 100.0 * float(prec[j]) / kernel_us for j, k in enumerate(PRECISIONS)}

    # Eligible but not using: non-TC kernels whose launching call lies inside an eligible op.
    candidates = np.flatnonzero(is_kernel & ~tc & (rt_of_gpu >= 0))
    if len(trace.runtime) == 0:
        not_available["tensor_cores.eligible_not_using_pct"] = "trace has no runtime calls to link kernels to ops"
        return out
    op_rows = eligible_op_rows(trace)
    pair_op, pair_rt = linking.calls_inside(trace, op_rows, among=op_calls)
    # innermost eligible op per call: latest start, then shortest
    inner = linking.first_per_call(pair_op, pair_rt, len(trace.runtime), (trace.cpu.dur, -trace.cpu.ts))
    k_op = inner[rt_of_gpu[candidates]]
    hit = k_op >= 0
    k_rows, k_op = candidates[hit], k_op[hit]
    k_dur = dur[k_rows]
    not_using_us = float(k_dur.sum())
    out["eligible_not_using_us"] = not_using_us
    out["eligible_not_using_pct"] = _pct(not_using_us, kernel_us)
    if len(k_rows):
        op_names = trace.cpu.name[k_op]
        uniq, inv = np.unique(op_names, return_inverse=True)
        per_name = np.bincount(inv, weights=k_dur, minlength=len(uniq))
        calls_by_name = {}
        # k_op grouped by name once (a stable radix sort of the small name index), not one
        # comparison of every kernel per listed name
        by_name = np.argsort(inv.astype(np.int16) if len(uniq) < 1 << 15 else inv, kind="stable")
        bounds = np.searchsorted(inv[by_name], np.arange(len(uniq) + 1))
        for j in np.argsort(-per_name)[:top_n]:
            nid = int(uniq[j])
            name = trace.strings[nid]
            rows = np.unique(k_op[by_name[bounds[j]:bounds[j + 1]]])
            types, mult8, checked = _op_details(trace, name, rows)
            calls_by_name[name] = {
                "op": name, "kernel_us": float(per_name[j]), "pct": 100.0 * float(per_name[j]) / kernel_us,
                "calls": int(len(rows)), "input_types": types, "shapes_multiple_of_8": mult8,
                "shapes_checked": checked,
            }
        out["top_eligible_not_using"] = list(calls_by_name.values())
    return out


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span) -> dict:
    return tensor_core_usage(span.trace, not_available=span.not_available,
                             gpu_runtime=linking.span_gpu_runtime(span), op_calls=linking.span_op_calls(span))


def _unit_partial(report: dict) -> dict:
    from .units import num, weighted_pair

    tc = report.get("tensor_cores") or {}
    kernel_us = tc.get("kernel_us", 0.0)
    out = {"sum:kernel_us": kernel_us, "sum:tensor_core_us": tc.get("tensor_core_us") or 0.0,
           "sum:eligible_not_using_us": tc.get("eligible_not_using_us") or 0.0,
           "keyed:ops": {}, "keyed:precision_split_pct": {}, "keyed:per_device": {}}
    if num(kernel_us) is not None and num(kernel_us) <= 0:
        out["first:section"] = tc  # no kernel time anywhere: the first span's section (its n/a values)
    for op in tc.get("top_eligible_not_using") or []:
        if isinstance(op, dict):
            out["keyed:ops"][str(op.get("op"))] = {"first:row": op, "sum:kernel_us": op.get("kernel_us") or 0.0,
                                                   "sum:calls": int(num(op.get("calls")) or 0)}
    for key, v in (tc.get("precision_split_pct") or {}).items():
        out["keyed:precision_split_pct"][key] = {"wmean:pct": weighted_pair(v, kernel_us)}
    for dev, v in (tc.get("per_device") or {}).items():
        out["keyed:per_device"][str(dev)] = {"wmean:pct": weighted_pair(v, kernel_us)}
    return out


def _unit_finish(m: dict) -> dict:
    import math

    from .units import pct, wmean

    kernel_us = m["sum:kernel_us"]
    if kernel_us is not None and kernel_us <= 0:
        return dict(m["first:section"])
    ops = [dict(o["first:row"], kernel_us=o["sum:kernel_us"], calls=int(o["sum:calls"] or 0))
           for o in m["keyed:ops"].values()]
    for o in ops:
        o["pct"] = pct(o["kernel_us"], kernel_us)
    tc_us, enu_us = m["sum:tensor_core_us"], m["sum:eligible_not_using_us"]
    return {"tensor_core_pct": pct(tc_us, kernel_us),
            "per_device": {d: wmean(v["wmean:pct"]) for d, v in m["keyed:per_device"].items()},
            "eligible_not_using_pct": pct(enu_us, kernel_us),
            "top_eligible_not_using": sorted(ops, key=lambda o: -(o["kernel_us"] or math.inf))[:10],
            "precision_split_pct": {k: wmean(v["wmean:pct"]) for k, v in m["keyed:precision_split_pct"].items()},
            "kernel_us": kernel_us, "tensor_core_us": tc_us, "eligible_not_using_us": enu_us}


def join_gpu(report: dict) -> None:
    """The GPU section's per-device ``tensor_core_pct`` is this unit's per-device share
    (null on every device when the Tensor Core section is missing)."""
    gpu, tc = report.get("gpu"), report.get("tensor_cores")
    if not isinstance(gpu, dict):
        return
    if not isinstance(tc, dict):
        for g in gpu.values():
            if isinstance(g, dict):
                g["tensor_core_pct"] = None  # the key stays; not_available["tensor_cores"] says why
        return
    for dev, share in (tc.get("per_device") or {}).items():
        gpu.setdefault(dev, {})["tensor_core_pct"] = share


def _unit():
    from .units import HIGHER, LOWER, Card, Metric, Unit, path

    metrics = (
        Metric("tensor_core_pct", "Tensor Core", "%", HIGHER, path("tensor_cores", "tensor_core_pct"),
               ("tensor_cores.tensor_core_pct", "tensor_cores"),
               card=Card("tensor_cores", "Tensor Cores", "Share of kernel time in Tensor Core kernels.",
                         field=("tensor_cores", "tensor_core_pct"), amd_label="Matrix cores",
                         amd_explain="Share of kernel time in matrix-core (MFMA) kernels.", order=30),
               text=False, order=60),
        Metric("tc_eligible_not_using_pct", "TC-eligible, not using", "%", LOWER,
               path("tensor_cores", "eligible_not_using_pct"), ("tensor_cores.eligible_not_using_pct", "tensor_cores"),
               text=False, order=70),
    )
    return Unit("tensor_cores", _unit_compute, _unit_partial, _unit_finish, metrics=metrics)


UNIT = _unit()
