"""Other accelerators (issue 20 item 7; METRICS.md "Other accelerators"): a trace of a
non-CUDA/ROCm accelerator (Meta MTIA, Intel XPU, Habana HPU, a PrivateUse1 backend) holds
its own Kineto activity categories (``mtia_ccp_events``, ``mtia_runtime``, ``xpu_runtime``,
...). The plugin analyses CUDA/ROCm GPU activity only: such a trace is named as what it is,
with its events counted, never called CPU-only (``no_gpu_reason``)."""
from __future__ import annotations

from typing import Dict

from ..trace.model import TraceData


# Kineto's activity categories of accelerators this plugin does not analyse (trace-format §3:
# MTIA_*, XPU_*, HPU_OP, PRIVATEUSE1_*), by category prefix -> the accelerator's name.
ACCELERATOR_PREFIXES = (("mtia_", "MTIA"), ("xpu_", "XPU"), ("hpu_", "HPU"), ("privateuse1_", "PrivateUse1"))


def other_accelerators(trace: TraceData) -> Dict[str, dict]:
    """{accelerator: {"events": n, "categories": {category: n}}} for the non-CUDA/ROCm
    accelerator events the trace holds (e.g. Meta MTIA's ``mtia_ccp_events``); {} if none."""
    out: Dict[str, dict] = {}
    for cat, n in sorted((trace.meta.category_counts or {}).items()):
        low = str(cat).lower()
        for prefix, name in ACCELERATOR_PREFIXES:
            if low.startswith(prefix) and n:
                entry = out.setdefault(name, {"events": 0, "categories": {}})
                entry["events"] += int(n)
                entry["categories"][str(cat)] = int(n)
    return out


def accelerator_words(accelerators: Dict[str, dict]) -> str:
    """'MTIA (25,800 events: mtia_ccp_events 25,800)'."""
    return "; ".join(f"{name} ({a['events']:,} events: "
                     + ", ".join(f"{c} {n:,}" for c, n in a["categories"].items()) + ")"
                     for name, a in accelerators.items())


def no_gpu_reason(trace: TraceData, default: str) -> str:
    """Why a GPU metric is n/a on a trace without CUDA/ROCm GPU activity: ``default`` ("CPU-only
    trace: ...") unless the trace holds another accelerator's events, which it then names."""
    acc = other_accelerators(trace)
    if not acc:
        return default
    return (f"no CUDA/ROCm GPU activity: a {'/'.join(acc)} trace ({accelerator_words(acc)}); "
            "its events are counted, not analysed: the GPU metrics read CUDA/ROCm kernels, memcpys and memsets")
