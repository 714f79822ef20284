"""The report's verdict (METRICS.md §19 "Verdict"): the bottleneck in one sentence with its share
of the step, the first fix as PyTorch code and the step time the step model predicts after it;
or, when no fix is worth ``T.VERDICT_MIN_GAIN_PCT`` of the step, that the run is healthy.

Made from the recommendations (already priced by the step model and sorted by the time they
give back) and the step model's critical path; decides nothing the recommendations did not.
"""
from __future__ import annotations

import re
from typing import Optional

from .. import thresholds as T
from ..analysis.step_model import GPU_PARTS, HOST_PARTS

# the fix as code: the first inline code of an action (`...`) that calls something, else one
# that sets something, else a call written without backticks (DataLoader(..., num_workers=4))
_CODE_CALL = re.compile(r"`([^`]*\([^`]*)`")
_CODE_SET = re.compile(r"`([^`]*=[^`]*)`")
_BARE_CALL = re.compile(r"\b([A-Za-z_][\w.]*\([^()]*=[^()]*\))")
# words for the critical path's parts
PART_WORDS = {
    "input_wait": "waiting for the DataLoader", "compile": "compiling", "host_compute": "host work between launches",
    "launch_overhead": "kernel launches", "sync_overhead": "synchronisation calls", "runtime_other": "other runtime calls",
    "gpu_gemm": "GEMMs", "gpu_conv": "convolutions", "gpu_attention": "attention", "gpu_elementwise": "elementwise kernels",
    "gpu_other_kernels": "other kernels", "gpu_communication": "communication", "gpu_h2d": "host-to-device copies",
    "gpu_d2h": "device-to-host copies", "gpu_d2d": "device-to-device copies", "gpu_memset": "memsets",
    "gpu_compiled_kernels": "compiled (Triton) kernels", "gpu_launch_latency": "launch latency",
}


def fix_code(action: Optional[str]) -> Optional[str]:
    """The first piece of code the action names (``DataLoader(..., num_workers=4, ...)``,
    ``model = torch.compile(model)``), else None."""
    for pattern in (_CODE_CALL, _CODE_SET, _BARE_CALL):
        m = pattern.search(action or "")
        if m:
            return m.group(1)
    return None


def critical_path_summary(report: dict) -> Optional[dict]:
    """{host_pct, gpu_pct, top: {part, words, pct}} of the step model's critical path, or None."""
    sm = report.get("step_model")
    path = (sm or {}).get("critical_path_us") if isinstance(sm, dict) else None
    if not isinstance(path, dict):
        return None
    total = sum(v for v in path.values() if isinstance(v, (int, float)) and v > 0)
    if total <= 0:
        return None
    host = sum(path.get(k) or 0.0 for k in HOST_PARTS)
    gpu = sum(path.get(k) or 0.0 for k in GPU_PARTS)
    part, us = max(((k, v) for k, v in path.items() if isinstance(v, (int, float))), key=lambda kv: kv[1])
    return {"host_pct": 100.0 * host / total, "gpu_pct": 100.0 * gpu / total,
            "top": {"part": part, "words": PART_WORDS.get(part, part), "pct": 100.0 * us / total}}


def step_verdict(report: dict) -> dict:
    """The verdict (module docstring): ``{healthy, sentence, share_pct, fix, step_ms,
    all_fixes_step_ms, critical_path, threshold_pct}``; ``fix`` is ``{rule, title, code, action,
    gain_pct, step_ms, predicted_step_ms, what_if, estimate}`` (``estimate``: priced by the
    rule's own estimate, no step model) or None when healthy."""
    sm = report.get("step_model") if isinstance(report.get("step_model"), dict) else None
    step_ms = (report.get("avg_step_us") or 0) / 1000 or None
    time_recs = [r for r in report.get("recommendations") or []
                 if isinstance(r, dict) and r.get("gain_source") != "memory"
                 and isinstance(r.get("estimated_gain_pct"), (int, float))]
    first = time_recs[0] if time_recs and time_recs[0]["estimated_gain_pct"] >= T.VERDICT_MIN_GAIN_PCT else None
    path = critical_path_summary(report)
    all_fixes = (sm or {}).get("all_fixes") or {}
    out = {"threshold_pct": T.VERDICT_MIN_GAIN_PCT, "step_ms": step_ms, "critical_path": path,
           "all_fixes_step_ms": all_fixes.get("predicted_step_ms") if all_fixes.get("ids") else None}
    if first is None:
        mfu = (report.get("flops") or {}).get("mfu_pct") if isinstance(report.get("flops"), dict) else None
        main = (report.get("flops") or {}).get("main_precision") if isinstance(report.get("flops"), dict) else None
        words = f"No fix worth {T.VERDICT_MIN_GAIN_PCT:g} % of the step or more found"
        if isinstance(mfu, (int, float)):
            words += f"; MFU {mfu:.0f} % of the {main + ' ' if main else ''}peak"
        if path is not None:
            words += (f"; the critical path is {path['host_pct']:.0f} % host, {path['gpu_pct']:.0f} % GPU "
                      f"(most of it {path['top']['words']})")
        return {**out, "healthy": True, "sentence": words + ".", "share_pct": None, "fix": None}
    estimate = first.get("gain_source") != "step_model"
    return {**out, "healthy": False, "sentence": first.get("title"), "share_pct": first["estimated_gain_pct"],
            "fix": {"rule": first.get("rule"), "title": first.get("title"), "code": fix_code(first.get("action")),
                    "action": first.get("action"), "gain_pct": first["estimated_gain_pct"],
                    "step_ms": first.get("step_ms") or step_ms,
                    "predicted_step_ms": first.get("predicted_step_ms")
                    if not estimate else (step_ms * (1 - first["estimated_gain_pct"] / 100) if step_ms else None),
                    "what_if": first.get("what_if"), "estimate": estimate}}
