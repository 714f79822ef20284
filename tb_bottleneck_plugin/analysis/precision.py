"""One precision decoder for kernels and ops (METRICS.md §5 "Precision split", §15), used by
the Tensor Core analysis (analysis/tensor_cores.py) and the FLOPs analysis
(analysis/flops.py) alike, so their precisions never disagree (issue 34 item 6).

- ``precision_of_name(kernel name)``: what the name says (``sm90_xmma_gemm_bf16bf16…`` bf16,
  ``s1688`` tf32, …), "unknown" when it says nothing (cuBLASLt ``nvjet_sm90_tst_…``,
  hipBLASLt, Triton kernels).
- ``op_precision(op name, Input type)``: the dtype of the matrices an op recorded
  (record_shapes): the first tensor's, for ``addmm``-like ops (self, a, b) the second's.
- ``kernel_precision(kernel name, op precision)``: a kernel's precision: the op's that launched
  it when recorded (an fp32 op whose kernel is a TF32 Tensor Core kernel by name: tf32), else
  its name's.
"""
from __future__ import annotations

import functools
import re
from typing import Optional

# dtype text of "Input type" -> (precision, bytes per element)
DTYPES = {
    "float": ("fp32", 4), "double": ("fp64", 8), "c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "c10::Float8_e8m0fnu": ("fp8", 1), "c10::Float4_e2m1fn_x2": ("fp8", 1),
    "long int": ("int", 8), "long": ("int", 8), "int": ("int", 4), "short int": ("int", 2), "short": ("int", 2),
    "signed char": ("int", 1), "unsigned char": ("int", 1), "bool": ("int", 1),
    "c10::complex<float>": ("fp32", 8), "c10::complex<double>": ("fp64", 16), "c10::ComplexHalf": ("fp16", 4),
}

# Precision split of kernel names (first match wins, narrowest type first).
PRECISIONS = ("fp8", "bf16", "fp16", "tf32", "fp32", "unknown")
_PRECISION_RES = (
    ("fp8", re.compile(r"(?i)fp8|e4m3|e5m2|e2m1|fp4|float8")),
    ("bf16", re.compile(r"(?i)bf16|bfloat16")),
    ("fp16", re.compile(r"(?i)fp16|half|(?<![a-z])h(?:884|1688|16816)|hgemm|f16f16|(?<![bt])f16_|__half")),
    ("tf32", re.compile(r"(?i)tf32|tfloat32|s1688")),
    ("fp32", re.compile(r"(?i)sgemm|scudnn|fp32|f32f32|<float\b|\bfloat>|\bfloat,")),
)
# ops whose matrices are their 2nd and 3rd tensors (self, a, b): the bias may be fp32 beside bf16 matrices
_BIAS_FIRST = {"aten::addmm", "aten::_addmm_activation", "aten::baddbmm", "aten::addbmm"}


@functools.lru_cache(maxsize=1 << 14)  # kernel names repeat across uses and spans
def precision_of_name(name: str) -> str:
    """The precision a kernel name says; "unknown" when it says none."""
    for key, rx in _PRECISION_RES:
        if rx.search(name):
            return key
    return "unknown"


def precision_of_dtype(dtype) -> Optional[str]:
    """"c10::BFloat16" -> "bf16"; None for a non-tensor type ("Scalar", "", "TensorList")."""
    got = DTYPES.get(dtype) if isinstance(dtype, str) else None
    return got[0] if got else None


def op_precision(op_name: str, types) -> Optional[str]:
    """The precision of the matrices of one op call from its recorded ``Input type``: the first
    tensor dtype, for ``addmm``-like ops (self, a, b) the second argument's when it is one; None
    when nothing was recorded."""
    if not isinstance(types, list):
        return None
    if op_name in _BIAS_FIRST and len(types) > 1:
        p = precision_of_dtype(types[1])
        if p is not None:
            return p
    return next((p for p in map(precision_of_dtype, types) if p is not None), None)


def kernel_precision(name: str, op_prec: Optional[str], tf32_call: bool = False) -> str:
    """A kernel's precision: the launching op's (``op_prec``) when known, except that an fp32
    op call with a TF32 Tensor Core kernel by name ran tf32 (``tf32_call``: another kernel of
    the same call is one, e.g. cuBLAS's ``splitKreduce_kernel<float…>`` after a TF32 GEMM);
    else the name's."""
    by_name = precision_of_name(name)
    if op_prec in (None, "unknown"):
        return by_name
    if op_prec == "fp32" and (tf32_call or by_name == "tf32"):
        return "tf32"
    return op_prec
