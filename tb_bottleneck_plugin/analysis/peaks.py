"""Dense peak throughput per GPU model and precision (METRICS.md §15), for MFU and the roofline.

Every entry is the vendor's *dense* number (NVIDIA datasheets print Tensor Core numbers
"with sparsity": those are halved here; the entry's ``note`` says so), per GPU (per GCD for
the MI250/MI250X, which PyTorch shows as two devices), with the datasheet it comes from.

Precisions: ``fp32`` (the non-Tensor-Core FP32 rate on NVIDIA; the FP32 matrix rate on AMD
Instinct, which runs FP32 GEMMs on matrix cores), ``tf32``, ``bf16`` (= ``fp16``), ``fp8``;
a precision the GPU has no peak for is absent. ``hbm_gbps``: memory bandwidth in GB/s (10^9
bytes/s).

Public API
----------
- ``PEAKS``: the table (``Peak`` entries), as data.
- ``match(device_name) -> Peak | None``: the entry whose pattern matches deviceProperties'
  ``name`` (first match wins, the more specific patterns first).
- ``user_peaks(text) -> dict | None``: ``BOTTLENECKS_PEAK_TFLOPS`` parsed: one number (every
  precision) or ``bf16=989,fp32=67,hbm=3350``.
"""
from __future__ import annotations

import re
from typing import Dict, NamedTuple, Optional

PRECISIONS = ("fp8", "bf16", "fp16", "tf32", "fp32")
ENV_PEAK = "BOTTLENECKS_PEAK_TFLOPS"


class Peak(NamedTuple):
    key: str  # short model name shown in the report ("H100 SXM")
    pattern: str  # regex searched (case-insensitive) in deviceProperties' name
    tflops: Dict[str, float]  # dense TFLOP/s per precision
    hbm_gbps: float  # memory bandwidth, GB/s
    source: str  # vendor datasheet / product page
    note: str  # how the dense numbers were read off it
    dense: bool = True  # every number here is dense (tests/analysis/test_flops.py checks)


def _bf(fp32, tf32, bf16, fp8=None):
    out = {"fp32": fp32}
    if tf32 is not None:
        out["tf32"] = tf32
    if bf16 is not None:
        out["bf16"] = out["fp16"] = bf16
    if fp8 is not None:
        out["fp8"] = fp8
    return out


_NV_DS = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_SPARSE = "Tensor Core numbers: the datasheet's 'with sparsity' values halved"

PEAKS = (
    # --- NVIDIA Blackwell --------------------------------------------------------------
    Peak("GB200", r"GB200", _bf(80.0, 1250.0, 2500.0, 5000.0), 8000.0,
         "https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
         "GB200 NVL72 totals / 72 GPUs (FP32 5,760 TF; TF32 180, BF16 360, FP8 720 PF sparse); "
         + _SPARSE + "; HBM3e 576 TB/s / 72"),
    Peak("B200", r"\bB200", _bf(75.0, 1125.0, 2250.0, 4500.0), 8000.0,
         "https://www.nvidia.com/en-us/data-center/hgx/",
         "HGX B200 totals / 8 GPUs (FP32 600 TF; TF32 18, BF16 36, FP8 72 PF sparse); "
         + _SPARSE + "; HBM3e 64 TB/s / 8"),
    # --- NVIDIA Hopper -------------------------------------------------------------------
    Peak("H200", r"H200", _bf(67.0, 494.7, 989.4, 1978.9), 4800.0,
         "https://www.nvidia.com/en-us/data-center/h200/",
         "H200 SXM column (TF32 989, BF16 1,979, FP8 3,958 TF sparse); " + _SPARSE + "; HBM3e 4.8 TB/s"),
    Peak("H100 NVL", r"H100 NVL", _bf(60.0, 417.5, 835.5, 1670.5), 3900.0, _NV_DS,
         "H100 NVL column (TF32 835, BF16 1,671, FP8 3,341 TF sparse); " + _SPARSE + "; HBM3 3.9 TB/s"),
    Peak("H100 PCIe", r"H100 PCIe", _bf(51.0, 378.0, 756.0, 1513.0), 2000.0, _NV_DS,
         "H100 PCIe column (TF32 756, BF16 1,513, FP8 3,026 TF sparse); " + _SPARSE + "; HBM2e 2 TB/s"),
    Peak("H100 SXM", r"H100(?: 80GB HBM3| SXM|-SXM)|H100$", _bf(67.0, 494.7, 989.4, 1978.9), 3350.0, _NV_DS,
         "H100 SXM column (TF32 989, BF16 1,979, FP8 3,958 TF sparse); " + _SPARSE
         + "; HBM3 3.35 TB/s. deviceProperties name 'NVIDIA H100 80GB HBM3' is the SXM5 board"),
    # --- NVIDIA Ada ----------------------------------------------------------------------
    Peak("L40S", r"L40S", _bf(91.6, 183.0, 366.5, 733.0), 864.0,
         "https://www.nvidia.com/en-us/data-center/l40s/",
         "TF32 366, BF16 733, FP8 1,466 TF sparse; " + _SPARSE + "; GDDR6 864 GB/s"),
    Peak("L4", r"\bL4\b", _bf(30.3, 60.0, 121.0, 242.5), 300.0,
         "https://www.nvidia.com/en-us/data-center/l4/",
         "TF32 120, BF16 242, FP8 485 TF sparse; " + _SPARSE + "; GDDR6 300 GB/s"),
    # --- NVIDIA Ampere -------------------------------------------------------------------
    Peak("A100 80GB PCIe", r"A100.*80GB PCIe|A100-PCIE-80GB", _bf(19.5, 156.0, 312.0), 1935.0,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
         "A100 80GB PCIe column (TF32 156, BF16 312 TF dense; the starred values are sparse); HBM2e 1,935 GB/s"),
    Peak("A100 SXM 80GB", r"A100.*80GB|A100-PG509-210", _bf(19.5, 156.0, 312.0), 2039.0,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
         "A100 80GB SXM column (TF32 156, BF16 312 TF dense); HBM2e 2,039 GB/s"),
    Peak("A100 40GB", r"A100", _bf(19.5, 156.0, 312.0), 1555.0,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
         "A100 40GB column (TF32 156, BF16 312 TF dense); HBM2 1,555 GB/s. Also the A100 boards "
         "named by part number ('A100-PG509-200', an SXM4 40GB board)"),
    # --- NVIDIA Volta --------------------------------------------------------------------
    Peak("V100 PCIe", r"V100-PCIE|V100 PCIe", _bf(14.0, None, 112.0), 900.0,
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
         "V100 PCIe column (FP32 14, Tensor 112 TF; no sparsity on Volta); HBM2 900 GB/s"),
    Peak("V100 SXM2", r"V100", _bf(15.7, None, 125.0), 900.0,
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
         "V100 SXM2 column (FP32 15.7, Tensor 125 TF: fp16 only, no bf16 units: used for bf16 too); "
         "HBM2 900 GB/s. Also the DGX Station's 'V100-DGXS'"),
    # --- AMD Instinct --------------------------------------------------------------------
    Peak("MI325X", r"MI325X", _bf(163.4, 653.7, 1307.4, 2614.9), 6000.0,
         "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
         "dense peak (AMD lists sparsity separately); FP32 matrix 163.4; HBM3E 6 TB/s"),
    Peak("MI300X", r"MI300X", _bf(163.4, 653.7, 1307.4, 2614.9), 5300.0,
         "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
         "dense peak (AMD lists sparsity separately); FP32 matrix 163.4; HBM3 5.3 TB/s"),
    Peak("MI250X (per GCD)", r"MI250X", _bf(47.85, None, 191.5), 1638.4,
         "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
         "package totals / 2 GCDs (FP32 matrix 95.7, FP16/BF16 383 TF; HBM2e 3.2768 TB/s); "
         "no TF32 or FP8 on CDNA2"),
    Peak("MI250 (per GCD)", r"MI250", _bf(45.25, None, 181.0), 1638.4,
         "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html",
         "package totals / 2 GCDs (FP32 matrix 90.5, FP16/BF16 362.1 TF; HBM2e 3.2768 TB/s)"),
)


def match(device_name) -> Optional[Peak]:
    """The table entry for deviceProperties' ``name``; None when no entry matches."""
    if not isinstance(device_name, str) or not device_name.strip():
        return None
    for p in PEAKS:
        if re.search(p.pattern, device_name, re.IGNORECASE):
            return p
    return None


def user_peaks(text) -> Optional[Dict[str, float]]:
    """``BOTTLENECKS_PEAK_TFLOPS``: ``"989"`` (that peak for every precision) or
    ``"bf16=989,fp32=67,hbm=3350"`` (``hbm`` in GB/s). None when empty or unreadable."""
    if text is None:
        return None
    text = str(text).strip()
    if not text:
        return None
    out: Dict[str, float] = {}
    try:
        if "=" not in text:
            v = float(text)
            if v > 0:
                out = {p: v for p in PRECISIONS}
        else:
            for part in text.split(","):
                k, _, v = part.partition("=")
                k, v = k.strip().lower(), float(v)
                if v <= 0:
                    continue
                if k in ("hbm", "hbm_gbps", "bw"):
                    out["hbm"] = v
                elif k in ("bf16", "fp16"):
                    out.setdefault("bf16", v)
                    out.setdefault("fp16", v)
                    out[k] = v
                elif k in PRECISIONS:
                    out[k] = v
    except ValueError:
        return None
    return out or None
