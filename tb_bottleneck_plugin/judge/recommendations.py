"""Turns a report into actions on the PyTorch side (metrics §9).

Rules read only the assembled report (never the trace), so a rule is a small function
of numbers a user can also see in the tab. Each fired rule names its rule id, the
numbers that fired it, the evidence, and a concrete PyTorch action. Thresholds live in
thresholds.py.

Advice fits the run: the rules read ``report["context"]`` (analysis/context.py: training
or inference, CUDA graphs, torch.compile, distributed) and the GPU generation, so an
inference trace gets no DDP or GradScaler advice and a compiled, graph-replaying trace
is not told to use torch.compile or CUDA graphs.

Ordering (issue 20, "advice that pays"): by the share of step time the fix could give
back, `estimated_gain_pct` (a rough upper bound; each rule states its assumption in
`gain_assumption`), then by severity, then by the order of RULES. A cause that costs little
never outranks one that costs most of the step: advice that buys memory headroom rather than
time (allocator slack, memory growth) estimates 0 and comes last, and allocator slack is
advice only under memory pressure.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from .. import thresholds as T
from ..analysis.context import short_kernel_bound
from ..analysis.flops import mfu_severity
from ..analysis.input_bound import input_finding, transfer_severity, verdict_for
from ..analysis.devices import label as device_label

_SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2, "info": 3}
# Compute capability of Ampere, the first NVIDIA generation with bf16 and TF32 Tensor
# Cores (a hardware fact, not a threshold).
AMPERE_MAJOR = 8


# Rules whose evidence is kernel statistics, and the cards that read such statistics: below
# T.MIN_KERNELS_TO_JUDGE kernels the rules stay silent and the cards are not judged
# (``too_little_data``; a handful of kernels is no evidence of launch- or latency-bound work).
KERNEL_EVIDENCE_RULES = ("small_kernels", "host_bound", "tensor_cores_unused", "low_mfu", "communication")
KERNEL_EVIDENCE_CARDS = ("gpu_utilization", "occupancy", "short_kernels", "tensor_cores", "mfu", "communication")


def recommend(report: dict) -> List[dict]:
    if too_little_data(report):
        return []  # too few events for any confident advice (thresholds.MIN_EVENTS_TO_JUDGE)
    few_kernels = too_little_data(report, kernel_evidence=True)
    fired = []
    for rule in RULES:
        rec = rule(report)
        if rec and not (few_kernels and rec.get("rule") in KERNEL_EVIDENCE_RULES):
            priced = price(rec, report)
            if priced is not None:
                fired.append(priced)
    # sorted() is stable: equal gains and severities keep the order of RULES
    return sorted(fired, key=sort_key)


# Advice that buys memory, not time: never priced in step time, never made "info" for it.
MEMORY_RULES = ("allocator_slack", "memory_growth", "memory_peak")


def what_if_of(rule: str, report) -> Optional[str]:
    """The step model's what-if (METRICS.md §19) that prices a rule's fix: the change the
    rule's action asks for. None where no what-if models it (memory advice; launch advice
    on a run that already replays CUDA graphs)."""
    ctx = _context(report)
    compiled, graphs = bool(ctx.get("torch_compile")), bool(ctx.get("cuda_graphs"))
    if rule in ("small_kernels", "host_bound"):
        if graphs:  # launches already replayed: fusing the small kernels is what is left
            return None if compiled else "torch_compile"
        return "cuda_graphs" if compiled else "torch_compile"
    return {"input_bound": "input", "pageable_h2d": "pinned_h2d", "tensor_cores_unused": "bf16",
            "warmup_outlier": "warmup", "torch_compile": "graph_breaks", "low_mfu": "torch_compile",
            "synchronization": "sync", "communication": "overlap_comm", "ddp_buckets": "overlap_comm",
            "fsdp_prefetch": "overlap_comm", "d2d_copies": "d2d"}.get(rule)


# Rules whose fix the run has already applied when the context says so: told again only when
# the model still predicts GAIN_REPEAT_PCT or more.
_APPLIED = {"low_mfu": "torch_compile", "torch_compile": "torch_compile"}


def price(rec: dict, report) -> Optional[dict]:
    """The rule's gain from the step model (METRICS.md §19): the simulated step without the
    bottleneck, on the same scale for every rule (``estimated_gain_pct`` = the saving as %
    of the measured step, ``predicted_step_ms``, ``what_if``, ``gain_source``
    "step_model"); a rule the model prices under T.GAIN_INFO_PCT is "info". Without a step
    model (no GPU work, or the section failed) the rule's own estimate stays
    (``gain_source`` "rule"). Under T.VERDICT_MIN_GAIN_PCT a high or medium rule is "low":
    the verdict on top then reads healthy, and no advice below it shouts. None: advice an
    applied fix already took that the model no longer prices at T.GAIN_REPEAT_PCT."""
    rule = rec.get("rule")
    if rule in MEMORY_RULES:
        return {**rec, "gain_source": "memory"}
    sm = report.get("step_model") if isinstance(report.get("step_model"), dict) else None
    wid = what_if_of(rule, report)
    row = next((r for r in (sm or {}).get("what_if") or [] if r.get("id") == wid), None) if wid else None
    if sm is None or wid is None or sm.get("reliable") is False:  # no model, or one that misses the trace
        return {**rec, "gain_source": "rule"}
    if row is None:  # the model found nothing this fix would change
        row = {"saving_pct": 0.0, "step_ms": None, "predicted_step_ms": None, "assumption": "nothing to change"}
        gain = 0.0
    else:
        gain = _finite(row.get("saving_pct")) or 0.0
    applied = _APPLIED.get(rule)
    if applied and _context(report).get(applied) and gain < T.GAIN_REPEAT_PCT and rule == "low_mfu":
        return None
    out = {**rec, "estimated_gain_pct": round(gain, 2), "rule_estimate_pct": rec.get("estimated_gain_pct"),
           "gain_assumption": f"step model, what-if '{wid}': {row.get('assumption')}",
           "what_if": wid, "step_ms": row.get("step_ms"), "predicted_step_ms": row.get("predicted_step_ms"),
           "gain_source": "step_model"}
    if gain < T.GAIN_INFO_PCT:
        out["severity"] = "info"
    elif gain < T.VERDICT_MIN_GAIN_PCT and out.get("severity") in ("high", "medium"):
        out["severity"] = "low"  # under the verdict's threshold: never louder than a healthy verdict
    return out


def _trace_count(report, key: str) -> Optional[int]:
    value = (report.get("trace") or {}).get(key) if isinstance(report.get("trace"), dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def too_little_data(report, kernel_evidence: bool = False) -> Optional[str]:
    """Why the report holds too little data to judge, in words for a card ("not judged:
    ..."); None when there is enough, or the counts are unknown (a report made by hand: no
    trace section, or 0 events).
    Fewer than T.MIN_EVENTS_TO_JUDGE trace events: nothing is judged. With
    ``kernel_evidence`` (the rules and cards of KERNEL_EVIDENCE_RULES/_CARDS), also fewer
    than T.MIN_KERNELS_TO_JUDGE GPU kernels on a trace that ran any."""
    events = _trace_count(report, "events")
    if events is None or events <= 0:
        return None  # counts unknown: a report made by hand, or a summary of such reports
    if events < T.MIN_EVENTS_TO_JUDGE:
        return f"too little data ({events} trace events, fewer than {T.MIN_EVENTS_TO_JUDGE})"
    if kernel_evidence:
        kernels = _trace_count(report, "kernels")
        if kernels is not None and kernels < T.MIN_KERNELS_TO_JUDGE:
            return (f"too little data ({kernels} GPU kernel{'' if kernels == 1 else 's'}, "
                    f"fewer than {T.MIN_KERNELS_TO_JUDGE})")
    return None


# ---- the one window of a trace without ProfilerStep (METRICS.md §1) -----------------------
NO_STEPS_WINDOW = "the one window (the whole trace: no ProfilerStep#N)"


def steps_found(report) -> bool:
    """False only when the report says no ProfilerStep was found (one window)."""
    st = report.get("steps")
    return not (isinstance(st, dict) and st.get("found") is False)


def steps_words(report) -> str:
    """What the numbers are measured over, in words: "the steps", or the one window."""
    return "the steps" if steps_found(report) else NO_STEPS_WINDOW


def step_label(report, number) -> str:
    """A step named in words: "step 5", or the one window (never "step 0")."""
    return f"step {number}" if steps_found(report) else NO_STEPS_WINDOW


def step_noun(report) -> str:
    """The unit of time the shares are of: "step", or "window" without ProfilerStep."""
    return "step" if steps_found(report) else "window"


def capture_only(report) -> bool:
    """CUDA graphs captured but never replayed in this trace: its launches run nothing, so
    neither its idle GPU nor its launch cost says anything about the workload."""
    ctx = _context(report)
    return bool(ctx.get("cuda_graph_capture")) and not (ctx.get("evidence") or {}).get("graph_kernels")


CAPTURE_ONLY_WORDS = "CUDA graphs captured, not replayed, in this trace"


def sort_key(rec: dict):
    """The order of the list: most step time given back first, then the more severe."""
    gain = rec.get("estimated_gain_pct")
    return (-(gain if isinstance(gain, (int, float)) else 0.0), _SEVERITY_RANK.get(rec.get("severity"), 3))


def _get(d: Optional[dict], *path, default=None):
    for key in path:
        if not isinstance(d, dict) or key not in d or d[key] is None:
            return default
        d = d[key]
    return d


def _context(report) -> dict:
    return report.get("context") or {}


def _is_training(report) -> bool:
    """Training unless the context says otherwise (an unknown mode keeps training advice)."""
    return _context(report).get("mode") != "inference"


def _is_inference(report) -> bool:
    return _context(report).get("mode") == "inference"


def _is_amd(report) -> bool:
    for p in report.get("device_properties") or []:
        if not isinstance(p, dict):
            continue
        name = str(p.get("name", ""))
        if "AMD" in name or "Instinct" in name or "Radeon" in name or p.get("warpSize") == 64 \
                or "gcnArchName" in p or "maxSharedMemoryPerMultiProcessor" in p:
            return True
    return False


def _kernel_share(report) -> float:
    """Share of step time in GPU kernels (0-100), for gain estimates."""
    return float(_get(report, "breakdown_pct", "kernel", default=0.0) or 0.0)


def gpu_idle_share(report) -> Optional[float]:
    """Share of the step (0-100) the GPU sits idle and not because it waits for input:
    100 - mean GPU utilization - input-bound % (not below 0); None without a utilization.
    The gain estimate of launch- and host-bound advice (fusion, CUDA graphs, less host
    work between kernels give back at most the time the GPU waits)."""
    util = _mean_gpu(report, "utilization_pct")
    if util is None:
        return None
    waiting = (report.get("input") or {}).get("input_bound_pct") or 0.0
    return max(0.0, 100.0 - util - waiting)


def tc_speedup(major: Optional[int], amd: bool = False) -> float:
    """How much faster eligible fp32 matmul/conv kernels run on Tensor Cores (thresholds.py)."""
    table = T.TC_SPEEDUP_BY_COMPUTE_MAJOR
    return float(table.get(None if amd else major, table[None]))


def reserved_of_capacity_pct(mem: dict) -> Optional[float]:
    """A device's peak reserved memory as % of its capacity; None when either is unknown."""
    reserved, cap = mem.get("peak_reserved_bytes"), mem.get("capacity_bytes")
    if not isinstance(reserved, (int, float)) or not isinstance(cap, (int, float)) or cap <= 0:
        return None
    return 100.0 * reserved / cap


def source_lines(report, kind: str, limit: int = 2) -> List[str]:
    """Evidence naming the user's own source line behind a bottleneck (METRICS §17:
    ``source_attribution.bottlenecks[kind]``, kind ``sync`` or ``dataloader``)."""
    src = report.get("source_attribution") or {}
    rows = ((src.get("bottlenecks") or {}).get(kind) or [])[:limit]
    first_line = src.get("frame_naming") == "function's first line"
    out = []
    for r in rows:
        if not isinstance(r, dict) or not r.get("frame"):
            continue
        text = (f"{r['frame']}" + (f" calls {r['op']}" if r.get("op") and kind == "sync" else "")
                + f": {(r.get('us') or 0) / 1000:.1f} ms, {r.get('pct') or 0:.1f} % of the step time")
        if first_line:
            text += " (the line shown is where the function begins; the call is inside it)"
        out.append(text)
    return out


def rule_input_bound(report) -> Optional[dict]:
    inp = report.get("input") or {}
    pct = inp.get("input_bound_pct")
    if verdict_for(pct)[1] not in ("high", "medium"):
        return None
    # the Input card's severity (analysis/input_bound.py input_finding: the wait and any
    # synchronous input copies), so the card and this advice never differ
    _, severity = input_finding(inp)
    ev = inp.get("evidence") or {}
    evidence = []
    iters = ev.get("dataloader_iterators") or []
    if iters:
        evidence.append("DataLoader iterator: " + ", ".join(iters))
    for s in (ev.get("slowest_steps") or [])[:3]:
        evidence.append(f"{step_label(report, s['step'])}: {s['dataloader_us'] / 1000:.1f} ms waiting for data "
                        f"of {s['step_us'] / 1000:.1f} ms")
    pageable = ev.get("pageable_h2d_copies") or 0
    if pageable:
        evidence.append(f"{pageable} host-to-device copies from pageable memory")
    loop = "training loop" if _is_training(report) else "inference loop"
    has_gpu = bool((report.get("trace") or {}).get("gpu_devices"))
    who = "The GPU waits" if has_gpu else f"The {loop} waits"
    if ev.get("num_workers_zero"):
        title = f"{who} for the DataLoader: it loads batches in the main process (num_workers=0)"
        if has_gpu:
            action = ("Load batches in worker processes: DataLoader(dataset, batch_size=..., num_workers=4, "
                      "pin_memory=True, persistent_workers=True, prefetch_factor=2) — start with num_workers "
                      "= number of CPU cores per GPU and raise it until the DataLoader share drops below "
                      f"{T.INPUT_BOUND_MODERATE_PCT:g} %.")
        else:
            # CPU-only: no GPU to copy to (pin_memory needs an accelerator), and the workers
            # share the cores with the loop's own intra-op threads.
            action = ("Load batches in worker processes: DataLoader(dataset, batch_size=..., num_workers=4, "
                      "persistent_workers=True, prefetch_factor=2) — on a CPU-only run the workers share the "
                      "cores with the loop's own threads (torch.get_num_threads()): start with a few workers "
                      "and raise num_workers until the DataLoader share drops below "
                      f"{T.INPUT_BOUND_MODERATE_PCT:g} %.")
    else:
        title = f"{who} for the DataLoader: its workers do not keep up"
        action = ("Give the input pipeline more throughput: raise num_workers and prefetch_factor, keep "
                  "persistent_workers=True" + (" and pin_memory=True" if has_gpu else "")
                  + ", and move heavy per-sample transforms "
                  + ("to the GPU or precompute them." if has_gpu else "out of the loop or precompute them."))
    if pageable and "pin_memory" not in action:
        action += " Set pin_memory=True so host-to-device copies are asynchronous."
    evidence += [f"the loop that waits: {line}" for line in source_lines(report, "dataloader", 1)]
    if not evidence:
        evidence.append(f"{pct:.1f} % of the step time waiting for the DataLoader")
    return {
        "rule": "input_bound", "severity": severity, "title": title, "action": action,
        "numbers": {"input_bound_pct": round(pct, 2), "input_transfer_pct": inp.get("input_transfer_pct"),
                    "pageable_h2d_copies": pageable},
        "evidence": evidence,
        # The waiting itself is what a faster input pipeline removes.
        "estimated_gain_pct": round(pct, 2),
        "gain_assumption": "the DataLoader wait share of the step: loading in the background removes the wait",
    }


def rule_pageable_copies(report) -> Optional[dict]:
    inp = report.get("input") or {}
    ev = inp.get("evidence") or {}
    transfer = inp.get("input_transfer_pct") or 0.0
    pageable = ev.get("pageable_h2d_copies") or 0
    if not pageable or transfer < T.INPUT_TRANSFER_PCT or (inp.get("input_bound_pct") or 0) >= T.INPUT_BOUND_MODERATE_PCT:
        return None  # the input-bound rule already says pin_memory
    return {
        "rule": "pageable_h2d", "severity": transfer_severity(transfer),  # the Input card's (input_finding)
        "title": "Host-to-device copies of the input are synchronous (pageable memory)",
        "action": "Use DataLoader(..., pin_memory=True) and tensor.to(device, non_blocking=True).",
        "numbers": {"input_transfer_pct": round(transfer, 2), "pageable_h2d_copies": pageable},
        "evidence": [f"{pageable} copies 'Memcpy HtoD (Pageable -> Device)'"],
        "estimated_gain_pct": round(transfer, 2),
        "gain_assumption": "the share of the step in input copies no kernel hides: asynchronous copies hide them",
    }


def _already_low_precision(top) -> List[str]:
    """The half precisions (bf16, fp16, fp8) the eligible-not-using ops recorded, when every float
    input they recorded is one of them (a run already on bf16 gets no bf16 advice); [] otherwise
    (an fp32 input, or nothing recorded)."""
    from ..analysis.precision import precision_of_dtype

    seen = []
    for op in top:
        types = op.get("input_types") if isinstance(op, dict) else None
        precs = [precision_of_dtype(t) for t in types or []]
        floats = [p for p in precs if p in ("fp32", "fp64", "bf16", "fp16", "fp8")]
        if not floats or any(p in ("fp32", "fp64") for p in floats):
            return []
        seen += [p for p in floats if p not in seen]
    return seen


def rule_tensor_cores(report) -> Optional[dict]:
    tc = report.get("tensor_cores") or {}
    pct = tc.get("eligible_not_using_pct")
    if pct is None or pct < T.TC_ELIGIBLE_NOT_USING_PCT:
        return None
    majors = [int(p.get("computeMajor")) for p in (report.get("device_properties") or [])
              if isinstance(p, dict) and isinstance(p.get("computeMajor"), int)
              and not isinstance(p.get("computeMajor"), bool)]
    major = min(majors) if majors else None
    top = tc.get("top_eligible_not_using") or []
    evidence = []
    for op in top[:5]:
        text = f"{op['op']}: {op['pct']:.1f} % of kernel time"
        if op.get("input_types"):
            text += f", inputs {', '.join(str(t) for t in op['input_types'][:3])}"
        if op.get("shapes_multiple_of_8") is False:
            text += ", sizes not multiples of 8"
        evidence.append(text)
    inference = _is_inference(report)
    low = _already_low_precision(top)
    if low:
        # issue 34 item 6: the ops already run in bf16/fp16: autocast is not the lever
        cores = "matrix cores" if _is_amd(report) else "Tensor Cores"
        action = (f"These ops already run in {'/'.join(low)} (their recorded inputs), so autocast will not "
                  f"help: their kernels still miss the {cores}. Check that the library has a "
                  + ("MFMA" if _is_amd(report) else "Tensor Core") + " kernel for these shapes and layouts.")
    elif _is_amd(report):
        # ROCm builds keep the "cuda" device type; CDNA matrix cores (MI200/MI300) run
        # bf16/fp16 (and fp8 on MI300), so autocast is the lever.
        action = ("Use the matrix cores: run matmuls and convolutions in bf16 with "
                  "`with torch.autocast(\"cuda\", dtype=torch.bfloat16):` around the forward pass "
                  "(ROCm builds use the \"cuda\" device type)"
                  + (" inside `torch.inference_mode()`, or cast the model with `model.to(torch.bfloat16)`."
                     if inference else "; bf16 needs no GradScaler."))
    elif major is not None and major < AMPERE_MAJOR:
        # Volta/Turing: fp16 Tensor Cores only (no bf16, no TF32).
        if inference:
            action = ("Run matmuls and convolutions in fp16: `with torch.inference_mode(), "
                      "torch.autocast(\"cuda\", dtype=torch.float16):` around the model call, or "
                      "`model.half()` (this GPU has fp16 Tensor Cores only: no bf16, no TF32).")
        else:
            action = ("Run matmuls and convolutions in fp16 with automatic mixed precision: "
                      "`with torch.autocast(\"cuda\", dtype=torch.float16):` around the forward pass and "
                      "`scaler = torch.amp.GradScaler(\"cuda\")` with `scaler.scale(loss).backward()`, "
                      "`scaler.step(optimizer)`, `scaler.update()` (this GPU has fp16 Tensor Cores only: "
                      "no bf16, no TF32).")
    elif major is None:
        # No deviceProperties (2020-era traces): the generation is unknown, so bf16/TF32
        # (Ampere and newer) cannot be assumed; say which dtype fits which GPU.
        action = ("The trace does not record the GPU model: on Ampere or newer (A100, H100, ...) use "
                  "`with torch.autocast(\"cuda\", dtype=torch.bfloat16):` around the "
                  + ("model call inside `torch.inference_mode()`" if inference else
                     "forward pass (bf16 needs no GradScaler)")
                  + " or `torch.set_float32_matmul_precision(\"high\")` (TF32); on Volta/Turing (V100, T4) "
                  "use `dtype=torch.float16`"
                  + ("." if inference else
                     " with `scaler = torch.amp.GradScaler(\"cuda\")` (`scaler.scale(loss).backward()`, "
                     "`scaler.step(optimizer)`, `scaler.update()`)."))
    elif inference:
        action = ("Use Tensor Cores: `with torch.inference_mode(), torch.autocast(\"cuda\", dtype=torch.bfloat16):` "
                  "around the model call (or `model.to(torch.bfloat16)`), or at least "
                  "`torch.set_float32_matmul_precision(\"high\")` (TF32; also "
                  "`torch.backends.cudnn.allow_tf32 = True` for convolutions).")
    else:
        action = ("Use Tensor Cores: `with torch.autocast(\"cuda\", dtype=torch.bfloat16):` around the "
                  "forward pass (bf16 needs no GradScaler), or at least "
                  "`torch.set_float32_matmul_precision(\"high\")` "
                  "(TF32; also `torch.backends.cudnn.allow_tf32 = True` for convolutions).")
    if any(op.get("shapes_multiple_of_8") is False for op in top):
        action += " Pad channel, hidden and batch sizes to multiples of 8."
    if any("conv" in op.get("op", "") for op in top):
        action += " For convolutions also use channels-last: model.to(memory_format=torch.channels_last)."
    # The eligible kernels' share of the step, run `speedup` times faster on Tensor Cores;
    # from the roofline where the FLOPs section knows the precision and the GPU's peaks.
    speedup = tc_speedup(major, _is_amd(report))
    gain = pct * _kernel_share(report) / 100 * (1 - 1 / speedup)
    from_peaks = _tc_gain_from_peaks(report, "fp16" if major is not None and major < AMPERE_MAJOR else "bf16")
    if from_peaks is not None:
        gain, assumption = from_peaks
    else:
        assumption = (f"eligible-not-using kernel time ({pct:.0f} % of the {_kernel_share(report):.0f} % of the "
                      f"{step_noun(report)} in kernels) x (1 - 1/{speedup:g}): {speedup:g}x faster on "
                      + ("matrix cores" if _is_amd(report) else "Tensor Cores")
                      + (" (AMD: the conservative speedup)" if _is_amd(report)
                         else " (GPU generation unknown: the conservative speedup)" if major is None
                         else f" (compute capability {major}.x)"))
    if not evidence:
        evidence.append(f"{pct:.1f} % of kernel time in matmul/conv kernels that do not use "
                        + ("matrix cores" if _is_amd(report) else "Tensor Cores"))
    return {
        "rule": "tensor_cores_unused", "severity": "high" if pct >= T.TC_ELIGIBLE_NOT_USING_HIGH_PCT else "medium",
        "title": f"{pct:.0f} % of GPU kernel time is matmul/conv work that does not use "
                 + ("matrix cores" if _is_amd(report) else "Tensor Cores"),
        "action": action,
        "numbers": {"eligible_not_using_pct": round(pct, 2), "tensor_core_pct": tc.get("tensor_core_pct")},
        "evidence": evidence,
        "estimated_gain_pct": round(gain, 2),
        "gain_assumption": assumption,
    }


def _tc_gain_from_peaks(report, target: str) -> Optional[tuple]:
    """(gain %, assumption) from the FLOPs section (METRICS §15): the step share of the
    matmul/conv/attention kernels that ran in fp32 or tf32, each made faster by the ratio of
    the GPU's ``target`` (bf16/fp16) peak to its own precision's peak; for fp32 (CUDA
    cores) that ratio times ``T.TC_FP32_PEAK_FRACTION_KEPT`` (a kernel moved to Tensor
    Cores reaches a smaller fraction of the higher peak). None without those numbers."""
    flops = report.get("flops") or {}
    peaks = (flops.get("peak") or {}).get("tflops") or {}
    top = peaks.get(target)
    if not isinstance(top, (int, float)) or top <= 0:
        return None
    gain, parts = 0.0, []
    for name, c in (flops.get("by_class") or {}).items():
        prec = c.get("precision") if isinstance(c, dict) else None
        if name not in ("gemm", "conv", "attention") or prec not in ("fp32", "tf32"):
            continue
        own, share = peaks.get(prec), c.get("step_pct")
        if not isinstance(own, (int, float)) or own <= 0 or not isinstance(share, (int, float)) \
                or share < T.TC_MIN_CLASS_STEP_PCT:
            continue
        speedup = top / own * (T.TC_FP32_PEAK_FRACTION_KEPT if prec == "fp32" else 1.0)
        if speedup <= 1:
            continue
        gain += share * (1 - 1 / speedup)
        parts.append(f"{name} in {prec} ({share:.0f} % of the step) x (1 - 1/{speedup:.1f})")
    if not parts:
        return None
    return gain, ("; ".join(parts) + f": {target} peak {top:g} TFLOP/s against the precision's own peak"
                  + (f" (fp32 keeps {T.TC_FP32_PEAK_FRACTION_KEPT:g} of the ratio)"
                     if any(" fp32 " in p for p in parts) else ""))


def warmup_outlier(report) -> Optional[dict]:
    """The launch section's longest runtime call (METRICS.md §8) when it is a first-call
    warm-up outlier: at least WARMUP_CALL_RUNTIME_PCT of the runtime-call time and
    WARMUP_CALL_STEP_PCT of the step time of the included steps; else None."""
    launch = report.get("launch") or {}
    call = launch.get("longest_runtime_call")
    share, of_step = launch.get("longest_runtime_call_pct"), launch.get("longest_runtime_call_step_pct")
    if not isinstance(call, dict) or not isinstance(share, (int, float)) or not isinstance(of_step, (int, float)):
        return None
    if share < T.WARMUP_CALL_RUNTIME_PCT or of_step < T.WARMUP_CALL_STEP_PCT:
        return None
    return call


def gpu_utilization_not_judged(report) -> Optional[str]:
    """Why a GPU utilization is not judged (the host_bound / small_kernels rules do not
    read it), in words for the card; None when it is judged."""
    if warmup_outlier(report):
        return "a first-call warm-up outlier holds the profiled steps"
    if ((report.get("input") or {}).get("input_bound_pct") or 0) >= T.INPUT_BOUND_MODERATE_PCT:
        return "the GPU waits for input (see Input-bound)"
    # A trace that captures CUDA graphs without replaying them launches work that never
    # runs on the GPU: its idle GPU says nothing about the workload.
    if capture_only(report):
        return CAPTURE_ONLY_WORDS
    # rule host_bound takes the time spent compiling off the idle GPU (recompiles in the
    # steps): when that leaves too little to judge, the idle GPU is the compiler's
    util = _mean_gpu(report, "utilization_pct")
    if util is not None and util < T.LOW_GPU_UTILIZATION_PCT and compiler_idle(report):
        return f"the host compiles {compile_share(report):.0f} % of the steps (see Compilation)"
    # rule host_bound needs the kernel statistics to tell host-bound from launch-bound: without
    # them (occupancy n/a or failed) a low utilization is not judged, never shown green
    short = (report.get("occupancy") or {}).get("short_kernels") if isinstance(report.get("occupancy"), dict) else None
    if util is not None and util < T.LOW_GPU_UTILIZATION_PCT \
            and not isinstance((short or {}).get("time_pct"), (int, float)):
        return "no kernel statistics (see Occupancy) to tell why the GPU idles"
    return None


def rule_warmup_outlier(report) -> Optional[dict]:
    """One runtime call holds most of the runtime time of the profiled steps: a first-call
    warm-up (lazy kernel/code-object loading, autotuning) inside the recorded steps. Its
    launch or idle numbers are not the steady state, so profile after warm-up rather than
    tune launches (rule_small_kernels stays silent)."""
    call = warmup_outlier(report)
    if call is None:
        return None
    launch = report.get("launch") or {}
    share, of_step = launch["longest_runtime_call_pct"], launch["longest_runtime_call_step_pct"]
    where = f" in {step_label(report, call['step'])}" if call.get("step") is not None else ""
    n = (report.get("steps") or {}).get("count")
    evidence = [f"{call.get('name')}: {call['us'] / 1000:.1f} ms{where}, {share:.0f} % of the "
                f"{(launch.get('runtime_us') or 0) / 1000:.1f} ms of runtime calls in the profiled steps"]
    if isinstance(n, int) and not isinstance(n, bool):
        evidence.append(f"{n} profiled step{'' if n == 1 else 's'}")
    return {
        "rule": "warmup_outlier", "severity": "medium",
        "title": f"One {call.get('name')} call takes {of_step:.0f} % of the profiled step time: "
                 "first-call warm-up, not the steady state",
        "action": ("Profile after warm-up: `torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, "
                   "warmup=1, active=3), on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir))` and "
                   "`prof.step()` at the end of every step, so first calls (lazy kernel and code-object "
                   "loading, autotuning, allocator growth) fall outside the recorded steps; judge launch "
                   "overhead and GPU idle time on that trace."),
        "numbers": {"longest_runtime_call_us": round(call["us"], 2), "longest_runtime_call_pct": round(share, 2),
                    "longest_runtime_call_step_pct": round(of_step, 2), "launch_pct": launch.get("launch_pct")},
        "evidence": evidence,
        # The call is a one-off: in the steady state its share of the step is not spent.
        "estimated_gain_pct": round(of_step, 2),
        "gain_assumption": "the one-off call's share of the profiled steps: not spent in the steady state",
    }


def rule_small_kernels(report) -> Optional[dict]:
    """Launch- or latency-bound kernels (rule id ``small_kernels``), or, when only the GPU
    utilization fired it, a GPU idle because the host does not feed it (``host_bound``).
    Silent on a first-call warm-up outlier (rule_warmup_outlier)."""
    if warmup_outlier(report):
        return None
    occ = report.get("occupancy") or {}
    short = occ.get("short_kernels") or {}
    short_pct = short.get("time_pct") or 0.0
    achieved = occ.get("est_achieved_occupancy_pct")
    gpu_util = _mean_gpu(report, "utilization_pct")
    launch = report.get("launch") or {}
    reasons, numbers = [], {}
    # On a capture-only trace the launches of the steady state are replays that did not run
    # here: the short kernels' launch cost is not judged (nor called launch-bound).
    if short.get("count") and short_pct >= T.SHORT_KERNEL_TIME_PCT and not capture_only(report):
        reasons.append(f"{short['count']} kernels shorter than {short.get('threshold_us', T.SHORT_KERNEL_US)} µs take "
                       f"{short_pct:.0f} % of kernel time")
        numbers["short_kernel_time_pct"] = round(short_pct, 2)
    low_occ = _low_occupancy_reason(report, occ, achieved)
    if low_occ is not None:
        reasons.append(low_occ[0])
        numbers.update(low_occ[1])
    if gpu_util is not None and gpu_util < T.LOW_GPU_UTILIZATION_PCT and gpu_utilization_not_judged(report) is None:
        reasons.append(f"GPU busy only {gpu_util:.0f} % of {steps_words(report)}, and not because of input")
        numbers["gpu_utilization_pct"] = round(gpu_util, 2)
    if launch.get("kernels_per_step"):
        numbers["kernels_per_step"] = launch["kernels_per_step"]
    if not reasons:
        return None
    severity = "medium" if len(reasons) > 1 or "gpu_utilization_pct" in numbers else "low"
    rule = "small_kernels"
    if len(reasons) == 1 and "gpu_utilization_pct" in numbers:
        # Neither short nor low-occupancy kernels: the GPU idles because the host does
        # not give it work (CPU-side code between launches), not because of launch cost.
        # That needs the kernel statistics: without them (occupancy section n/a or failed)
        # neither cause is known, and the GPU utilization card alone says the GPU idles.
        if not isinstance(short.get("time_pct"), (int, float)):
            return None
        rule = "host_bound"
        title = (f"The GPU is idle {100 - gpu_util:.0f} % of {steps_words(report)}, and not because of input: "
                 "the host does not keep it busy")
        action = _host_bound_action(report)
    elif short_kernel_bound(_context(report).get("cuda_graphs")) == "latency":
        # CUDA graphs already replay the launches: the kernels are small, not launch-bound
        # (the one classification of the short-kernel card and the step timeline).
        title = "Many small or low-occupancy kernels inside CUDA graphs: the GPU is latency-bound, not launch-bound"
        action = _small_kernels_action(report)
    elif capture_only(report):  # only low occupancy can have fired: latency, not launches
        title = f"Low-occupancy kernels: the GPU is latency-bound ({CAPTURE_ONLY_WORDS})"
        action = _small_kernels_action(report)
    else:
        title = "Many small or low-occupancy kernels: the GPU is launch- or latency-bound"
        action = _small_kernels_action(report)
    idle = gpu_idle_share(report)
    if rule == "host_bound" and compile_share(report):
        if compiler_idle(report):
            return None
        idle = host_idle_share(report)
    if idle is not None:
        gain, assumption = idle, ("the GPU idle share of the step (not waiting for input): "
                                  + ("less host work between kernels" if rule == "host_bound" else
                                     "fewer, fused kernels and replayed launches")
                                  + " give back at most the time the GPU waits")
    else:  # no utilization: the short kernels' share of the step
        gain, assumption = short_pct * _kernel_share(report) / 100, \
            "the short kernels' share of the step (the GPU utilization is unknown)"
    return {
        "rule": rule, "severity": severity,
        "title": title,
        "action": action,
        "numbers": numbers, "evidence": reasons,
        "estimated_gain_pct": round(gain, 2),
        "gain_assumption": assumption,
    }


def _low_occupancy_reason(report, occ, achieved):
    """(words, numbers) of the low-occupancy reason of rule small_kernels, or None. Only
    kernel time the roofline does not judge compute-efficient counts (METRICS.md §9):
    when GEMM/conv/attention kernels at >= ROOFLINE_EFFICIENT_PCT of their roof hold at
    least that share of kernel time, low occupancy is their design (one large block per
    SM), not latency; otherwise the occupancy of the other kernels decides."""
    if achieved is None or achieved >= T.LOW_OCCUPANCY_PCT:
        return None
    from ..analysis.flops import roofline_efficient
    from ..analysis.occupancy import occupancy_without

    eff = roofline_efficient(report)
    if eff is None or not eff["kernel_us"]:
        return f"time-weighted theoretical occupancy {achieved:.0f} %", \
            {"est_achieved_occupancy_pct": round(achieved, 2)}
    if eff["pct"] >= T.ROOFLINE_EFFICIENT_PCT:
        return None
    rest = occupancy_without(occ, eff["names"])
    if rest is None or rest >= T.LOW_OCCUPANCY_PCT:
        return None
    return (f"time-weighted theoretical occupancy {rest:.0f} % of the kernels below "
            f"{T.ROOFLINE_EFFICIENT_PCT:g} % of their roofline ({100 - eff['pct']:.0f} % of kernel time)",
            {"est_achieved_occupancy_pct": round(achieved, 2), "occupancy_not_roofline_efficient_pct": round(rest, 2),
             "roofline_efficient_kernel_time_pct": round(eff["pct"], 2)})


def host_idle_share(report) -> Optional[float]:
    """The GPU idle share (gpu_idle_share) less the share of the step the host spent
    compiling (recompiles in the steps, rule torch_compile): that part is not host work
    between kernels. None without a utilization."""
    idle = gpu_idle_share(report)
    return None if idle is None else max(0.0, idle - compile_share(report))


def compiler_idle(report) -> bool:
    """Whether compiling explains the idle GPU: the host compiled in the steps and what is
    left idle is under a tenth of LOW_GPU_UTILIZATION_PCT (host_bound then stays silent and
    the GPU card is not judged)."""
    left = host_idle_share(report)
    return bool(compile_share(report)) and left is not None and left < T.LOW_GPU_UTILIZATION_PCT / 10


def compile_share(report) -> float:
    """Share of the step (0-100) spent compiling inside the steps (recompiles, METRICS §16)."""
    comp = report.get("compilation") or {}
    pct = comp.get("compile_pct") if comp.get("steady_recompiles") else 0.0
    return float(pct) if isinstance(pct, (int, float)) else 0.0


def rule_torch_compile(report) -> Optional[dict]:
    """A compiled run that recompiles in its steady state or breaks its graphs (METRICS
    §16, the Compilation card). Gain: the share of the step spent compiling inside the
    steps, plus, for graph breaks, the eager time between the graphs that the GPU waits
    for (min of the eager share and the GPU idle share)."""
    comp = report.get("compilation") or {}
    if not comp.get("has_regions"):
        return None
    steps = comp.get("steps") or 0
    breaks = comp.get("breaks_per_step")
    steady = comp.get("steady_recompiles") or 0
    recompiling = steps and steady / steps >= T.COMPILE_RECOMPILES_PER_STEP
    breaking = isinstance(breaks, (int, float)) and breaks >= T.COMPILE_BREAKS_PER_STEP
    if not (steady or breaking):
        return None
    numbers, evidence, actions = {}, [], []
    compiling = compile_share(report)
    gain, parts = 0.0, []
    if steady:
        ids = ", ".join(r["id"] for r in comp.get("recompile_ids") or [] if r.get("steady"))
        numbers.update(steady_recompiles=steady, compile_pct=round(compiling, 2))
        evidence.append(f"{steady} recompile(s) inside the profiled steps ({ids}); compiling holds "
                        f"{compiling:.0f} % of the step time")
        actions.append('Find the guard that fails with `TORCH_LOGS="recompiles"`; for shapes that change '
                       "use `torch.compile(model, dynamic=True)` or `torch._dynamo.mark_dynamic(x, dim)`, keep "
                       "Python values that change every step out of the compiled function, and check "
                       "`torch._dynamo.config.cache_size_limit`.")
        gain += compiling
        parts.append("the time spent compiling inside the steps")
    from ..analysis.compilation import BREAK_FIXES, break_cause_evidence, break_cause_words

    causes = [c for c in comp.get("break_causes") or [] if isinstance(c, dict)]
    if breaking:
        regions = ", ".join(r["id"] for r in comp.get("broken_regions") or [])
        numbers.update(breaks_per_step=round(breaks, 2), eager_pct=round(comp.get("eager_pct") or 0.0, 2))
        if causes:
            numbers["break_causes"] = [{k: c.get(k) for k in ("kind", "op", "call", "per_step")} for c in causes[:3]]
        evidence.extend(break_cause_evidence(c) for c in causes[:3])
        evidence.append(f"{breaks:g} graph break(s) per step, in compiled region(s) {regions}; "
                        f"{comp.get('eager_pct') or 0:.0f} % of the step runs eager")
        actions.extend(dict.fromkeys(BREAK_FIXES[c["kind"]] for c in causes[:3] if c.get("kind") in BREAK_FIXES))
        actions.append("See each break's reason and line with `TORCH_LOGS=\"graph_breaks\"` or "
                       "`torch._dynamo.explain(model)(*inputs)`, then remove it (`.item()`/`.tolist()`, print or "
                       "logging, Python branches on tensor values; for `.item()`, "
                       "`torch._dynamo.config.capture_scalar_outputs = True`), or make it an error with "
                       "`torch.compile(model, fullgraph=True)`.")
        idle = gpu_idle_share(report)
        eager = float(comp.get("eager_pct") or 0.0)
        gain += min(eager, idle) if idle is not None else eager
        parts.append("the eager time between the compiled graphs that the GPU waits for")
    gain = min(gain, 100.0 - float((report.get("input") or {}).get("input_bound_pct") or 0.0))
    at = f" at {break_cause_words(causes[0])}" if causes else ""
    if steady and breaking:
        title = (f"torch.compile breaks the graph {breaks:g}x per step{at} and recompiles {steady}x in the profiled "
                 "steps")
    elif steady:
        title = f"torch.compile recompiles {steady}x in the profiled steps: compiling holds {compiling:.0f} % of the step"
    else:
        title = f"torch.compile breaks the graph {breaks:g}x per step{at}: part of every step runs eager"
    return {
        "rule": "torch_compile", "severity": "high" if recompiling else "medium",
        "title": title, "action": " ".join(actions), "numbers": numbers, "evidence": evidence,
        "estimated_gain_pct": round(gain, 2), "gain_assumption": " plus ".join(parts),
    }


def rule_low_mfu(report) -> Optional[dict]:
    """Low MFU because memory-bound kernels hold the step (METRICS §15 roofline), in an eager
    run: fusing them (torch.compile) cuts their memory traffic. Gain: the memory-bound share of
    the step x (1 - 1/T.FUSION_SPEEDUP). Compiled runs are already fused; fp32 matmuls are the
    Tensor Core rule's."""
    flops = report.get("flops") or {}
    mfu = flops.get("mfu_pct")
    memory = (flops.get("bound_split_pct") or {}).get("memory")
    if not isinstance(mfu, (int, float)) or mfu >= T.MFU_MODERATE_PCT or _context(report).get("torch_compile"):
        return None
    if not isinstance(memory, (int, float)) or memory < T.FUSION_MEMORY_BOUND_STEP_PCT:
        return None
    classes = {name: c for name, c in (flops.get("by_class") or {}).items()
               if isinstance(c, dict) and c.get("bound") == "memory" and (c.get("step_pct") or 0) > 0}
    peak = flops.get("peak") or {}
    evidence = [f"MFU {mfu:.1f} % of the {peak.get('gpu') or 'GPU'} {flops.get('main_precision') or ''} peak "
                f"({flops.get('tflops') or 0:.1f} of {flops.get('peak_tflops') or 0:g} TFLOP/s)".replace("  ", " ")]
    for name, c in sorted(classes.items(), key=lambda kv: -(kv[1].get("step_pct") or 0)):
        gb = (c.get("bytes") or 0) / max(1, flops.get("steps") or 1) / 1e9
        evidence.append(f"{name} kernels: memory-bound, {c['step_pct']:.0f} % of the step, {gb:.1f} GB moved per step (estimated from the shapes)")
    inference = _is_inference(report)
    action = ("Fuse the memory-bound kernels (elementwise, normalisation, softmax: each reads and writes its "
              "tensors to GPU memory once more) with `model = torch.compile(model)`"
              + (" inside `torch.inference_mode()`" if inference else "")
              + "; check the result with the Compilation card (graph breaks leave parts eager).")
    gain = memory * (1 - 1 / T.FUSION_SPEEDUP)
    return {
        "rule": "low_mfu", "severity": mfu_severity(mfu),  # the MFU card's own scale (METRICS §15)
        "title": f"MFU {mfu:.0f} %: memory-bound kernels hold {memory:.0f} % of the step",
        "action": action,
        "numbers": {"mfu_pct": round(mfu, 2), "memory_bound_step_pct": round(memory, 2),
                    "tflops": flops.get("tflops"), "peak_tflops": flops.get("peak_tflops")},
        "evidence": evidence,
        "estimated_gain_pct": round(gain, 2),
        "gain_assumption": (f"the memory-bound kernels' share of the step ({memory:.0f} %) x "
                            f"(1 - 1/{T.FUSION_SPEEDUP:g}): fusion at least halves their memory traffic"),
    }


def profiler_cost_note(report) -> str:
    """How much of a host- or launch-bound step the profiler itself can be (METRICS.md §9:
    the demo's launch-bound model took 13.9 ms a step unprofiled and 26.9 ms profiled on an
    H200; a GEMM-bound one 1.003x), naming the options the trace says were on."""
    opts = (report.get("trace") or {}).get("profiler_options") or []
    on = f" with {', '.join(f'`{o}=True`' for o in opts)}" if opts else ""
    prof = (report.get("step_model") or {}).get("profiler") if isinstance(report.get("step_model"), dict) else None
    share = _finite((prof or {}).get("share_of_host_path_pct"))
    est = (f" (here about {share:.0f} % of the host time on the critical path: "
           f"{(prof.get('ops_per_step') or 0):.0f} ops a step at ~{prof.get('us_per_op'):g} µs each)"
           if share is not None else "")
    return (f" The profiler itself adds host time to every op (this trace was recorded{on}){est}: on a step "
            "that waits for the host it can double the step, so confirm the gain by timing steps "
            "without the profiler (`torch.cuda.synchronize()` around `time.perf_counter()`).")


def _host_bound_action(report) -> str:
    """The GPU waits on the host's own work (not input, not launch cost of tiny kernels)."""
    ctx = _context(report)
    cpu = _get(report, "breakdown_pct", "cpu_exec")
    where = (f"the host runs CPU operators with no GPU work for {cpu:.0f} % of the step" if isinstance(cpu, (int, float)) and cpu >= 1
             else "the host is busy between kernels")
    text = ("Find what keeps the host busy between kernels (" + where + "; see the Step timeline and "
            "the Operator view: CPU time with little GPU time): move CPU-side preprocessing, Python loops "
            "over tensors and per-step logging out of the step")
    if ctx.get("torch_compile"):
        text += ", and remove graph breaks that leave eager regions (`TORCH_LOGS=\"graph_breaks\"`)."
    else:
        text += ", and cut Python overhead with `model = torch.compile(model)`."
    return text + profiler_cost_note(report)


def _small_kernels_action(report) -> str:
    """Launch-overhead advice, qualified by the profiler's own cost where launches are the
    cost (CUDA graph replays have none to inflate)."""
    graphs = bool(_context(report).get("cuda_graphs"))
    return _small_kernels_fix(report) + ("" if graphs else profiler_cost_note(report))


def _small_kernels_fix(report) -> str:
    """Launch-overhead advice that does not tell a trace to use what it already uses."""
    ctx = _context(report)
    compiled, graphs = bool(ctx.get("torch_compile")), bool(ctx.get("cuda_graphs"))
    batch = ("batch more requests per forward pass" if _is_inference(report)
             else "raise the batch size so each kernel has more work")
    if compiled and graphs:
        return ("This run already uses torch.compile and CUDA graphs: " + batch + ", and look for graph "
                "breaks that leave eager regions between compiled ones (`TORCH_LOGS=\"graph_breaks\"`).")
    if compiled:
        return ("This run already uses torch.compile: also replay it as CUDA graphs with "
                "`torch.compile(model, mode=\"reduce-overhead\")`, remove graph breaks "
                "(`TORCH_LOGS=\"graph_breaks\"`), or " + batch + ".")
    if graphs:
        # Launches are already replayed: no launch-overhead advice, only fewer, larger kernels.
        return ("This run already replays CUDA graphs, so launch overhead is not the cost: fuse the small "
                "kernels into fewer, larger ones with `torch.compile(model)` inside the captured region, "
                "or " + batch + ".")
    if _is_inference(report):
        return ("Fuse kernels and remove launch overhead with `model = torch.compile(model, "
                "mode=\"reduce-overhead\")` (fusion plus CUDA graphs), run under `torch.inference_mode()`, "
                "or " + batch + ".")
    return ("Fuse kernels with `model = torch.compile(model)` (`mode=\"reduce-overhead\"` also uses CUDA "
            "graphs), capture static parts with CUDA graphs, or " + batch + ".")


def allocator_slack_device(report) -> Optional[tuple]:
    """(device key, slack %, memory entry) the allocator_slack rule judges: the worst slack
    among GPU devices that reserved at least SLACK_MIN_RESERVED_BYTES and are under memory
    pressure (peak reserved >= MEMORY_PRESSURE_PCT of capacity); None when there is none."""
    worst = None
    for dev, mem in (report.get("memory") or {}).items():
        if not isinstance(mem, dict):
            continue
        slack = mem.get("slack_fragmentation_pct")
        reserved = mem.get("peak_reserved_bytes") or 0
        if slack is None or reserved < T.SLACK_MIN_RESERVED_BYTES:
            continue
        used = reserved_of_capacity_pct(mem)
        if used is None or used < T.MEMORY_PRESSURE_PCT:
            continue  # memory to spare (or capacity unknown): the slack costs nothing
        if worst is None or slack > worst[1]:
            worst = (dev, slack, mem)
    return worst


def rule_allocator_slack(report) -> Optional[dict]:
    """Reserved memory no tensor used, advised on only under memory pressure (issue 20): on a
    device with room to spare the cache costs nothing, and expandable segments would not hand
    it to other processes anyway. The report holds no allocation-retry or OOM counts; peak
    reserved near capacity is the pressure it can see."""
    worst = allocator_slack_device(report)
    if worst is None or worst[1] < T.SLACK_FRAGMENTATION_PCT:
        return None
    key, slack, mem = worst
    dev = device_label(key, report)
    gib = 1 << 30
    used = reserved_of_capacity_pct(mem)
    return {
        "rule": "allocator_slack", "severity": "high" if slack >= T.SLACK_FRAGMENTATION_HIGH_PCT else "medium",
        "title": f"{slack:.0f} % of the memory reserved on {dev} was never used by tensors, even at the peak",
        "action": (f"{dev} is close to full ({used:.0f} % of its memory reserved) while much of the reservation "
                   "holds no tensor: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so the caching "
                   "allocator grows segments in place instead of keeping many fixed-size ones (less "
                   "fragmentation, fewer out-of-memory errors for the same tensors), and avoid many distinct "
                   "tensor shapes (pad or bucket variable-length batches). It does not give cached memory back "
                   "to other processes; torch.cuda.empty_cache() releases unused cached blocks, at the cost "
                   "of allocating them again."),
        "numbers": {"slack_fragmentation_pct": round(slack, 2),
                    # bytes, so the tab's chips format them with a unit (a bare "gib" key read
                    # "peak reserved gib: 11.9")
                    "peak_reserved_bytes": mem["peak_reserved_bytes"],
                    "peak_allocated_bytes": mem.get("peak_allocated_bytes")},
        "evidence": [f"{dev}: peak reserved {mem['peak_reserved_bytes'] / gib:.2f} GiB, peak allocated "
                     f"{(mem.get('peak_allocated_bytes') or 0) / gib:.2f} GiB, capacity "
                     f"{mem['capacity_bytes'] / gib:.2f} GiB ({used:.0f} % reserved)"],
        "device": key,
        "estimated_gain_pct": 0.0,  # memory headroom, not time
        "gain_assumption": "none in step time: the fix buys memory headroom (fewer out-of-memory errors)",
    }


def rule_memory_growth(report) -> Optional[dict]:
    for key, mem in (report.get("memory") or {}).items():
        growth = mem.get("growth") or {}
        if growth.get("possible_leak"):
            dev = device_label(key, report)
            steps = growth.get("per_step") or []
            return {
                "rule": "memory_growth", "severity": "medium",
                "title": f"Allocated memory on {dev} rises at every step: a possible leak",
                "action": (("Look for tensors kept across requests: run the model under "
                            "torch.inference_mode(), do not keep outputs or per-request caches after the "
                            "request, clear caches.") if _is_inference(report) else
                           ("Look for tensors kept across steps: accumulate losses with loss.item() or "
                            "loss.detach(), do not append graph-attached tensors to lists, clear caches.")),
                "numbers": {"first_bytes": steps[0]["allocated_bytes"] if steps else None,
                            "last_bytes": steps[-1]["allocated_bytes"] if steps else None},
                # (a summary's step row is a mean over spans: unknown when one span's is)
                "evidence": [f"{step_label(report, s['step'])}: {s['allocated_bytes'] / (1 << 20):.0f} MiB"
                             for s in steps[:8]
                             if isinstance(s.get("allocated_bytes"), (int, float))]
                or [f"{dev}: allocated memory rose at {growth.get('rises', 'every')} step boundaries in a row"],
                "estimated_gain_pct": 0.0,
                "gain_assumption": "none in step time: the fix stops memory from running out",
            }
    return None


def memory_peak_device(report) -> Optional[tuple]:
    """(device key, its memory_peak entry) of the GPU device whose peak allocated is the
    largest share of its capacity, when that share is >= MEMORY_PEAK_PCT; else None."""
    worst = None
    for dev, e in (report.get("memory_peak") or {}).items():
        pct = e.get("peak_pct_of_capacity") if isinstance(e, dict) else None
        if dev == "cpu" or not isinstance(pct, (int, float)) or pct < T.MEMORY_PEAK_PCT:
            continue
        if worst is None or pct > worst[1]["peak_pct_of_capacity"]:
            worst = (dev, e)
    return worst


def rule_memory_peak(report) -> Optional[dict]:
    """The peak allocated near capacity (METRICS.md §7 "Memory at the peak"): what holds it and
    what frees it, priced by the bytes it frees (memory, not step time). Checkpointing the
    modules whose activations hold most at the peak frees those bytes for a recomputation of
    their forward in backward."""
    found = memory_peak_device(report)
    if found is None:
        return None
    key, e = found
    dev = device_label(key, report)
    gib = 1 << 30
    cats = e.get("categories") or {}
    cands = e.get("checkpoint_candidates") or []
    frees = sum(c.get("activation_bytes") or 0 for c in cands)
    held = ", ".join(f"{k.replace('_', ' ')} {v / gib:.2f} GiB" for k, v in cats.items() if v)
    if cands:
        names = ", ".join(c["module"] for c in cands)
        costs = [c.get("recompute_gpu_us_per_step") for c in cands]
        cost = (f" (about {sum(costs) / 1000:.1f} ms of GPU time per step, their forward)"
                if all(isinstance(v, (int, float)) for v in costs) else "")
        action = (f"Wrap the modules whose activations hold most at the peak ({names}) in "
                  "torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False): their activations are "
                  f"recomputed in backward instead of kept, freeing about {frees / gib:.2f} GiB at the peak for "
                  f"one more forward of those modules{cost}. Or lower the batch size (activations scale with it).")
    else:
        action = ("Lower the batch size (activations scale with it), or record with "
                  "torch.profiler.profile(with_stack=True) to name the modules whose activations to "
                  "checkpoint with torch.utils.checkpoint.checkpoint(..., use_reentrant=False).")
    pct = e["peak_pct_of_capacity"]
    return {
        "rule": "memory_peak", "severity": "high" if pct >= T.MEMORY_PEAK_HIGH_PCT else "medium",
        "title": f"The peak allocated on {dev} is {pct:.0f} % of its memory",
        "action": action,
        "numbers": {"peak_allocated_bytes": e.get("peak_allocated_bytes"), "capacity_bytes": e.get("capacity_bytes"),
                    "peak_pct_of_capacity": round(pct, 2), "frees_bytes": frees or None},
        "evidence": [f"{dev} at the peak: {held}" if held else f"{dev}: peak {e['peak_allocated_bytes'] / gib:.2f} GiB"]
        + [f"{c['module']}: {c['activation_bytes'] / gib:.2f} GiB of activations" for c in cands[:3]],
        "device": key,
        "frees_bytes": frees or None,
        "estimated_gain_pct": 0.0,  # memory headroom, not time
        "gain_assumption": "none in step time: the fix frees memory at the peak (frees_bytes), at the cost of "
                           "recomputing the checkpointed modules' forward",
    }


def rule_sync(report) -> Optional[dict]:
    """Fires on the GPU idle time synchronisation causes (§8): during the wait, and after it
    until the host launches again; not on the sync time: a host that waits on a busy GPU
    and refills its queue at once costs nothing."""
    sync = report.get("sync") or {}
    pct = sync_cost_pct(sync)
    if pct is None or pct < T.SYNC_PCT:
        return None
    if capture_only(report):
        # CUDA graphs captured, never replayed: the captured launches ran nothing, so the GPU
        # the syncs wait on is idle by construction; the steady state (replays) is not here
        return None
    busy = sync.get("gpu_busy_during_sync_pct")
    ops = sync.get("top_ops") or []
    refill = sync.get("sync_refill_idle_pct")
    unit = step_noun(report)
    if _is_inference(report):
        action = ("Remove host-device synchronisation from the inference loop: avoid .item(), .cpu(), .numpy(), "
                  "print(tensor) and data-dependent shapes (torch.nonzero, boolean masks) inside the forward pass; "
                  "keep outputs on the GPU until the batch is done and copy them back once per batch "
                  "(`.to(\"cpu\", non_blocking=True)` into pinned memory, then one event or stream wait), so "
                  "the host queues the next batch while the GPU runs this one.")
    else:
        action = ("Remove host-device synchronisation from the step: avoid .item(), .cpu(), .numpy(), "
                  "print(tensor) and data-dependent shapes (torch.nonzero, boolean masks) in the loop; log "
                  "metrics every N steps (keep the loss as a tensor and call .item() on a running sum); "
                  "use non_blocking=True copies.")
    return {
        "rule": "synchronization", "severity": "high" if pct >= T.SYNC_HIGH_PCT else "medium",
        "title": (f"Host-device synchronisation leaves the GPU idle {pct:.0f} % of the {unit}"
                  + (" (it drains the GPU's queue: the GPU waits for the host after each sync)"
                     if refill and refill >= (sync.get("sync_gpu_idle_pct") or 0) else "")),
        "action": action,
        "numbers": {"sync_cost_pct": round(pct, 2), "sync_gpu_idle_pct": sync.get("sync_gpu_idle_pct"),
                    "sync_refill_idle_pct": refill, "sync_pct": sync.get("sync_pct"),
                    "gpu_busy_during_sync_pct": busy, "sync_us": sync.get("sync_us")},
        "evidence": (source_lines(report, "sync") + [f"{o['op']}: {o['sync_us'] / 1000:.1f} ms" for o in ops[:5]])
        or [f"synchronisation calls: {(sync.get('sync_us') or 0) / 1000:.1f} ms, the GPU idle {pct:.1f} % "
            f"of the {unit} during and after them"],
        "estimated_gain_pct": round(pct, 2),
        "gain_assumption": ("the share of the step the GPU idles while the host waits in synchronisation calls "
                            "and after them until the host launches again (at most the wait)"),
    }


def sync_cost_pct(sync: dict) -> Optional[float]:
    """The GPU idle the syncs cause, % of step time (§8); older reports: the idle during the
    wait, or the sync time itself."""
    for key in ("sync_cost_pct", "sync_gpu_idle_pct", "sync_pct"):
        if key in sync:
            value = sync.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def _finite(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        return None
    return float(v)


def rule_d2d_copies(report) -> Optional[dict]:
    """Device-to-device copies (Memcpy DtoD/PtoP) that hold D2D_COPY_PCT of the step or more
    (METRICS.md §8): fired on the copy time, ranked by the part no kernel hides (what the step
    would lose without them), with the ops that launch them as evidence."""
    c = report.get("copies") or {}
    share, exposed = (_finite(c.get(k)) for k in ("d2d_pct", "d2d_exposed_pct"))
    if share is None or share < T.D2D_COPY_PCT:
        return None
    ops = [o for o in c.get("top_ops") or [] if isinstance(o, dict)]
    evidence = [f"{o['op']}: {(o.get('us') or 0) / 1000:.2f} ms in {o.get('count') or 0} copies" for o in ops[:5]]
    return {
        "rule": "d2d_copies", "severity": "high" if share >= T.D2D_COPY_HIGH_PCT else "medium",
        "title": (f"Device-to-device copies take {share:.0f} % of the step"
                  + (f" ({exposed:.0f} % with no kernel beside them)" if exposed is not None else "")),
        "action": ("Copy less on the GPU: skip `.contiguous()`, `.clone()` and `.to()` on tensors that are already "
                   "in the layout, dtype and device needed (check `t.is_contiguous()`; prefer views: `view`, "
                   "`narrow`, `expand`, indexing with slices); preallocate the result and fill slices instead of "
                   "growing it with `torch.cat`/`torch.stack` in a loop; use in-place ops and `out=` "
                   "(`x.add_(y)`, `torch.add(a, b, out=buf)`); keep one memory format end to end "
                   "(`model.to(memory_format=torch.channels_last)` and inputs in channels_last too, so no layer "
                   "converts); between GPUs copy with `non_blocking=True` and overlap it with compute; "
                   "`torch.compile(model)` removes many layout copies by fusing them into the kernels."),
        "numbers": {"d2d_pct": round(share, 2), "d2d_exposed_pct": exposed, "d2d_us": c.get("d2d_us"),
                    "count": c.get("count"), "bytes": c.get("bytes")},
        "evidence": evidence or [f"{c.get('count') or 0} copies 'Memcpy DtoD/PtoP', "
                                 f"{(c.get('d2d_us') or 0) / 1000:.2f} ms"],
        "estimated_gain_pct": round(exposed if exposed is not None else share, 2),
        "gain_assumption": ("the share of the step in device-to-device copies that no kernel overlaps: removing "
                            "the copies gives back at most that time"),
    }


def rule_communication(report) -> Optional[dict]:
    comm = report.get("communication") or {}
    share = comm.get("comm_pct_of_kernel_time")
    overlap = comm.get("overlap_pct")
    if share is None or share < T.COMM_SHARE_PCT or (overlap is not None and overlap >= T.COMM_OVERLAP_OK_PCT):
        return None
    ctx = _context(report)
    if ctx.get("distributed") is False:
        return None  # collectives of a single-process group: no DDP to tune
    exposed = share * (1 - (overlap or 0) / 100)
    # The exposed share of the step: the breakdown's Communication category (collective time
    # no compute kernel hid, METRICS §2); overlapping it with compute gives it back.
    step_share = _get(report, "breakdown_pct", "communication")
    if isinstance(step_share, (int, float)):
        gain, assumption = float(step_share), "the exposed share of the step: collective time no compute kernel hides"
    else:
        gain = exposed * _kernel_share(report) / 100
        assumption = "exposed communication (share of kernel time not overlapped) x the kernel share of the step"
    return {
        "rule": "communication", "severity": "high" if exposed >= T.COMM_EXPOSED_HIGH_PCT else "medium",
        "title": f"Collective communication takes {share:.0f} % of GPU kernel time, "
                 f"{overlap or 0:.0f} % of it overlapped with compute",
        "action": (("Reduce and overlap collectives of model-parallel inference: use fewer ranks per "
                    "replica when the model fits (tensor parallelism costs an all-reduce per layer), "
                    "batch more requests per step, or use the serving stack's custom all-reduce.")
                   if _is_inference(report) else
                   ("Overlap and reduce communication: tune DistributedDataParallel(bucket_cap_mb=...), use "
                    "gradient accumulation with model.no_sync() on inner steps, gradient compression hooks, "
                    "or a larger per-GPU batch.")),
        "numbers": {"comm_pct_of_kernel_time": round(share, 2), "overlap_pct": overlap},
        "evidence": [f"communication kernels: {(comm.get('comm_us') or 0) / 1000:.1f} ms"],
        "estimated_gain_pct": round(gain, 2),
        "gain_assumption": assumption,
    }


def _exposed_kinds(report, kinds) -> Optional[tuple]:
    """(exposed µs per step, calls per step, mean bytes per call or None, {kind: row}) of the
    collective kinds ``kinds`` (collectives section §18: exposed = not overlapped with compute
    on the same device); None without such calls or steps."""
    sec = report.get("collectives")
    steps = _get(report, "steps", "count")
    if not isinstance(sec, dict) or not steps:
        return None
    rows = {r["kind"]: r for r in sec.get("kinds") or [] if isinstance(r, dict) and r.get("kind") in kinds}
    if not rows:
        return None
    calls = sum(r.get("calls") or 0 for r in rows.values())
    b_calls = sum(r.get("bytes_calls") or 0 for r in rows.values())
    mean_bytes = sum(r.get("bytes") or 0.0 for r in rows.values()) / b_calls if b_calls else None
    return sum(r.get("exposed_us") or 0.0 for r in rows.values()) / steps, calls / steps, mean_bytes, rows


def _exposed_pct(report, exposed_us_per_step) -> Optional[float]:
    step = report.get("avg_step_us")
    return 100.0 * exposed_us_per_step / step if isinstance(step, (int, float)) and step > 0 else None


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def rule_ddp_buckets(report) -> Optional[dict]:
    """Many small all-reduces per step (DDP gradient buckets too small, or per-parameter
    all-reduces) whose time is exposed: larger buckets, fewer calls (METRICS.md §9)."""
    if _context(report).get("distributed") is False or _is_inference(report):
        return None
    found = _exposed_kinds(report, ("all_reduce",))
    if found is None:
        return None
    exposed, per_step, mean_bytes, _ = found
    pct = _exposed_pct(report, exposed)
    if (per_step < T.DDP_SMALL_ALLREDUCES_PER_STEP or mean_bytes is None or mean_bytes > T.DDP_SMALL_ALLREDUCE_BYTES
            or pct is None or pct < T.COMM_ADVICE_EXPOSED_PCT):
        return None
    noun = step_noun(report)
    return {
        "rule": "ddp_buckets", "severity": "high" if pct >= T.COMM_EXPOSED_HIGH_PCT else "medium",
        "title": f"{per_step:.0f} small all-reduces per {noun} ({_mib(mean_bytes)} each on average), "
                 f"{exposed / 1000:.1f} ms per {noun} not overlapped with compute",
        "action": ("Send fewer, larger gradient buckets: DistributedDataParallel(model, bucket_cap_mb=...) above "
                   "the default 25 (e.g. 50-100) with gradient_as_bucket_view=True; do not all-reduce parameters "
                   "one by one by hand; with gradient accumulation, skip the all-reduce of inner steps with "
                   "model.no_sync()."),
        "numbers": {"all_reduce_per_step": round(per_step, 2), "mean_bytes_per_call": round(mean_bytes),
                    "exposed_us_per_step": round(exposed, 1), "exposed_pct": round(pct, 2)},
        "evidence": [f"all_reduce: {per_step:.1f} calls per {noun}, {_mib(mean_bytes)} per call "
                     f"(at most {_mib(T.DDP_SMALL_ALLREDUCE_BYTES)} counts as small), {exposed / 1000:.2f} ms "
                     f"per {noun} exposed ({pct:.1f} % of the {noun})"],
        "estimated_gain_pct": round(pct, 2),
        "gain_assumption": "the exposed all-reduce share of the step: larger buckets start earlier in the "
                           "backward pass and overlap with it (an upper bound)",
    }


def rule_fsdp_prefetch(report) -> Optional[dict]:
    """All-gathers / reduce-scatters (FSDP, ZeRO) whose time is exposed: prefetch the next
    unit's all-gather so that it overlaps with compute (METRICS.md §9)."""
    if _context(report).get("distributed") is False:
        return None
    found = _exposed_kinds(report, ("all_gather", "reduce_scatter"))
    if found is None:
        return None
    exposed, per_step, _, rows = found
    pct = _exposed_pct(report, exposed)
    if pct is None or pct < T.COMM_ADVICE_EXPOSED_PCT:
        return None
    noun = step_noun(report)
    steps = _get(report, "steps", "count")
    split = ", ".join(f"{k} {(r.get('exposed_us') or 0.0) / steps / 1000:.2f} ms" for k, r in sorted(rows.items()))
    return {
        "rule": "fsdp_prefetch", "severity": "high" if pct >= T.COMM_EXPOSED_HIGH_PCT else "medium",
        "title": f"Sharded-parameter communication is exposed: {exposed / 1000:.1f} ms per {noun} "
                 f"({pct:.0f} % of the {noun}) of all-gather/reduce-scatter not overlapped with compute",
        "action": ("Prefetch the next unit's all-gather so it runs under compute. FSDP2: fully_shard each block, "
                   "then block.set_modules_to_forward_prefetch([next_block]) and "
                   "set_modules_to_backward_prefetch([previous_block]); keep the last blocks gathered with "
                   "fully_shard(block, reshard_after_forward=False) if memory allows. FSDP1: "
                   "FullyShardedDataParallel(model, forward_prefetch=True, "
                   "backward_prefetch=BackwardPrefetch.BACKWARD_PRE)."),
        "numbers": {"exposed_us_per_step": round(exposed, 1), "exposed_pct": round(pct, 2),
                    "calls_per_step": round(per_step, 2)},
        "evidence": [f"exposed per {noun}: {split}; {per_step:.1f} calls per {noun}"],
        "estimated_gain_pct": round(pct, 2),
        "gain_assumption": "the exposed all-gather/reduce-scatter share of the step: prefetching overlaps it "
                           "with the previous unit's compute (an upper bound)",
    }


def _mean_gpu(report, key) -> Optional[float]:
    values = [g.get(key) for g in (report.get("gpu") or {}).values() if g.get(key) is not None]
    return sum(values) / len(values) if values else None


RULES: List[Callable[[dict], Optional[dict]]] = [
    rule_input_bound, rule_pageable_copies, rule_tensor_cores, rule_warmup_outlier, rule_torch_compile, rule_low_mfu,
    rule_small_kernels,
    rule_allocator_slack, rule_memory_growth, rule_memory_peak, rule_sync, rule_communication, rule_ddp_buckets, rule_fsdp_prefetch,
    rule_d2d_copies,
]
