"""Is the GPU doing useful work? FLOPs, MFU and the roofline (METRICS.md §15).

FLOPs are counted per CPU op from its recorded shapes (``record_shapes=True``: the op's
"Input Dims" / "Input type"), with the formulas of ``torch.utils.flop_counter.FlopCounterMode``
(GEMMs 2·M·N·K, convolutions, attention forward and backward), once per op call: the
innermost op that has shapes and a formula (a parent whose child is counted is not).
Ops without a formula (elementwise, norms, softmax, copies, fused Triton kernels) count
bytes instead. An op's FLOPs and bytes go to the GPU kernels it launched (linking:
correlation id, then the runtime call inside the op), split by kernel time. On a trace whose
kernels link to runtime calls only ops that launched a kernel count (issue 34: ops traced
while compiling have shapes but run nothing). Each kernel, and each precision's part of an
op class, is judged against its own precision's roof; a number no GPU can reach (GB/s above
the memory bandwidth, TFLOP/s above the peak) is null with the reason in ``not_available``.

Scope: the ops that start inside an included step (host span); the step time is the
stretched step (analysis/steps.py). Peaks: analysis/peaks.py, matched on deviceProperties'
name, or ``BOTTLENECKS_PEAK_TFLOPS`` (user-given, said so in the report).

Public API
----------
- ``op_flops(name, dims, types, conv_out=None) -> (flops, bytes, precision, op_class) | None``
- ``flops_report(trace, steps, ...) -> dict`` the span section; ``UNIT`` the metric unit.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..trace.model import GPU_KERNEL, TraceData
from . import linking
from .accelerators import no_gpu_reason
from . import graph_replays, peaks, precision
from .factorize import unique_columns, unique_inverse, unique_rows, unique_values
from .operators import NA_FLOPS_NO_SHAPES

CLASSES = ("gemm", "conv", "attention", "elementwise", "other")
FLOP_CLASSES = ("gemm", "conv", "attention")
TOP_KERNELS = 10

# dtype text of "Input type" -> (precision, bytes per element): the one table (analysis/precision.py)
_DTYPES = precision.DTYPES

_GEMM_AB = {"mm", "_scaled_mm", "matmul", "_int_mm", "bmm"}  # (a, b, ...)
_GEMM_BIAS = {"addmm", "_addmm_activation", "baddbmm", "addbmm"}  # (self, a, b, ...)
_CONV_FWD = re.compile(r"^(?:convolution|_convolution|conv[123]d|cudnn_convolution(?:_relu|_add_relu)?"
                       r"|mkldnn_convolution|miopen_convolution|miopen_depthwise_convolution"
                       r"|_slow_conv2d_forward|slow_conv3d_forward|slow_conv_dilated[23]d|thnn_conv2d"
                       r"|convolution_overrideable|_nnpack_spatial_convolution|_mps_convolution)$")
_CONV_T = re.compile(r"^(?:conv_transpose[123]d|cudnn_convolution_transpose|miopen_convolution_transpose"
                     r"|slow_conv_transpose[23]d|_mps_convolution_transpose)$")
_CONV_BWD = re.compile(r"^(?:convolution_backward|convolution_backward_overrideable)$")
# before torch 1.11 (cudnn_/miopen_convolution_backward take (input, grad_output, weight))
_CONV_BWD_XGW = re.compile(r"^(?:cudnn_convolution_backward|miopen_convolution_backward"
                           r"|miopen_depthwise_convolution_backward|mkldnn_convolution_backward)$")
# attention forward with (q, k, v) as [batch, heads, seq, dim]
_ATTN_FWD_BHSD = re.compile(r"^(?:_scaled_dot_product_(?:flash|efficient|cudnn|fused)_attention(?:_overrideable)?"
                            r"|_scaled_dot_product_flash_attention_for_cpu|_cudnn_attention_forward"
                            r"|scaled_dot_product_attention)$")
# ... as [batch, seq, heads, dim] (the flash / memory-efficient kernels' own ops)
_ATTN_FWD_BSHD = re.compile(r"^(?:_flash_attention_forward|_efficient_attention_forward)$")
_ATTN_BWD_BHSD = re.compile(r"^(?:_scaled_dot_product_(?:flash|efficient|cudnn|fused)_attention(?:_overrideable)?_backward"
                            r"|_scaled_dot_product_flash_attention_for_cpu_backward|_cudnn_attention_backward)$")
_ATTN_BWD_BSHD = re.compile(r"^(?:_flash_attention_backward|_efficient_attention_backward)$")


def _base(name: str) -> str:
    return name[6:] if name.startswith("aten::") else name


@functools.lru_cache(maxsize=1 << 14)  # a few hundred distinct op names per trace, called per call
def flop_kind(name: str) -> Optional[str]:
    """The formula an op name gets: gemm / conv / conv_t / conv_bwd / attn_fwd / attn_fwd_bshd /
    attn_bwd / attn_bwd_bshd, or None (no FLOPs: bytes only)."""
    if not name.startswith("aten::"):
        return None
    b = _base(name)
    if b in _GEMM_AB or b in _GEMM_BIAS or b == "linear":
        return "gemm"
    if _CONV_FWD.match(b):
        return "conv"
    if _CONV_T.match(b):
        return "conv_t"
    if _CONV_BWD.match(b):
        return "conv_bwd"
    if _CONV_BWD_XGW.match(b):
        return "conv_bwd_xgw"
    if _ATTN_FWD_BHSD.match(b):
        return "attn_fwd"
    if _ATTN_FWD_BSHD.match(b):
        return "attn_fwd_bshd"
    if _ATTN_BWD_BHSD.match(b):
        return "attn_bwd"
    if _ATTN_BWD_BSHD.match(b):
        return "attn_bwd_bshd"
    return None


def _tensors(dims, types) -> List[Tuple[List[int], Optional[str]]]:
    """The recorded tensor arguments in order: (shape, dtype text or None); a non-tensor
    argument (scalar, list, None) is (None, None) so positions stay."""
    out = []
    if not isinstance(dims, list):
        return out
    for i, d in enumerate(dims):
        t = types[i] if isinstance(types, list) and i < len(types) and isinstance(types[i], str) else None
        is_shape = isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in d)
        is_dtype = t in _DTYPES if t is not None else None
        if is_shape and (is_dtype or (t is None and d)) and (d or is_dtype):
            out.append((d, t))
        else:
            out.append((None, None))
    return out


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= max(int(x), 0)
    return n


def _esize(t: Optional[str], default: int = 4) -> int:
    return _DTYPES[t][1] if t in _DTYPES else default


def _matmul(a, b) -> Optional[Tuple[int, int]]:
    """(FLOPs, output elements) of a @ b with torch.matmul's broadcasting."""
    if not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return (2 * a[0], 1) if a[0] == b[0] else None
    a2 = a if len(a) >= 2 else [1] + list(a)
    b2 = b if len(b) >= 2 else list(b) + [1]
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    ba, bb = list(a2[:-2]), list(b2[:-2])
    width = max(len(ba), len(bb))
    ba, bb = [1] * (width - len(ba)) + ba, [1] * (width - len(bb)) + bb
    batch = 1
    for x, y in zip(ba, bb):
        if x != y and 1 not in (x, y):
            return None
        batch *= max(x, y)
    return 2 * batch * m * n * k, batch * m * n


def _attn(q, k, v, bshd: bool) -> Optional[Tuple[int, int, int, int, int, int]]:
    """(b·h_q, s_q, s_k, d_q, d_v, out elements) of an attention call; None when not 4-D."""
    if not (q and k and v and len(q) == len(k) == len(v) == 4):
        return None
    if bshd:  # [b, s, h, d] -> [b, h, s, d]
        q, k, v = [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]], [v[0], v[2], v[1], v[3]]
    b, hq, sq, dq = q
    _, hk, sk, dk = k
    dv = v[3]
    if dk != dq or v[2] != sk or (hk and hq % hk):
        return None
    return b * hq, sq, sk, dq, dv, b * hq * sq * dv


def op_flops(name: str, dims, types, conv_out: Optional[dict] = None
             ) -> Optional[Tuple[int, int, str, str]]:
    """(FLOPs, bytes, precision, class) of one op call from its recorded inputs (METRICS.md
    §15); None when the op has a formula but its shapes do not fit it (not counted).
    Ops without a formula: FLOPs 0, class "elementwise", bytes = the tensor inputs plus
    an output the size of the largest input. ``conv_out``: {(x shape, w shape): output
    spatial dims} learnt from the trace's convolution backward calls."""
    kind = flop_kind(name)
    ts = _tensors(dims, types)
    shapes = [s for s, _ in ts]
    tens = [(s, t) for s, t in ts if s is not None]
    in_bytes = sum(_numel(s) * _esize(t) for s, t in tens)
    first_t = next((t for _, t in tens if t in _DTYPES), None)
    prec = _DTYPES[first_t][0] if first_t else "unknown"
    es = _esize(first_t)
    if kind is None:
        if not tens:
            return None
        b = _base(name)
        # in place (add_, copy_) or out= : the output is one of the inputs
        # Triton / custom ops (not aten::) get every buffer, outputs included, as an argument
        out_elems = 0 if b.endswith("_") or b.endswith(".out") or not name.startswith("aten::") \
            else max(_numel(s) for s, _ in tens)
        return 0, in_bytes + out_elems * es, prec, "elementwise"
    b = _base(name)

    def at(i):
        return shapes[i] if i < len(shapes) else None

    if kind == "gemm":
        if b == "linear":
            x, w = at(0), at(1)
            if not x or not w or len(w) != 2:
                return None
            r = _matmul(x, [w[1], w[0]])
        elif b in _GEMM_BIAS:
            r = _matmul(at(1), at(2))
            if r and b == "addbmm":  # the batch is summed into one [n, p] output
                r = (r[0], at(1)[1] * at(2)[2])
        else:
            r = _matmul(at(0), at(1))
        if r is None:
            return None
        if b in _GEMM_BIAS or b == "linear":
            # dtype of the matrices, not of the bias
            mt = ts[1][1] if b in _GEMM_BIAS and len(ts) > 1 else first_t
            if mt in _DTYPES:
                prec, es = _DTYPES[mt][0], _DTYPES[mt][1]
        return r[0], in_bytes + r[1] * es, prec, "gemm"
    if kind in ("conv", "conv_t"):
        x, w = at(0), at(1)
        if not x or not w or len(x) != len(w) or len(x) < 3:
            return None
        if kind == "conv_t":  # FlopCounterMode: 2 · N · prod(input spatial) · prod(weight)
            flops = 2 * x[0] * _numel(x[2:]) * _numel(w)
            out_elems = x[0] * w[1] * _numel(x[2:])  # a lower bound (stride 1)
            return flops, in_bytes + out_elems * es, prec, "conv"
        spatial = (conv_out or {}).get((tuple(x), tuple(w)))
        if spatial is None:
            return None
        flops = 2 * x[0] * w[0] * _numel(spatial) * _numel(w[1:])
        return flops, in_bytes + x[0] * w[0] * _numel(spatial) * es, prec, "conv"
    if kind in ("conv_bwd", "conv_bwd_xgw"):
        go, x, w = (at(0), at(1), at(2)) if kind == "conv_bwd" else (at(1), at(0), at(2))
        if not go or not x or not w or len(go) != len(w) or len(go) < 3:
            return None
        one = 2 * go[0] * go[1] * _numel(go[2:]) * _numel(w[1:])  # = the forward
        # grad input + grad weight (output_mask is not recorded: both assumed)
        return 2 * one, in_bytes + (_numel(x) + _numel(w)) * es, prec, "conv"
    if kind in ("attn_fwd", "attn_fwd_bshd"):
        a = _attn(at(0), at(1), at(2), kind == "attn_fwd_bshd")
        if a is None:
            return None
        bh, sq, sk, dq, dv, out = a
        return 2 * bh * sq * sk * dq + 2 * bh * sq * sk * dv, in_bytes + out * es, prec, "attention"
    if kind in ("attn_bwd", "attn_bwd_bshd"):
        go = at(0)
        a = _attn(at(1), at(2), at(3), kind == "attn_bwd_bshd")
        if a is None or not go:
            return None
        bh, sq, sk, dq, dv, _ = a
        flops = 2 * bh * sq * sk * (3 * dq + 2 * dv)  # FlopCounterMode: 5 bmm, 2.5x the forward
        grads = sum(_numel(at(i)) for i in (1, 2, 3))
        return flops, in_bytes + grads * es, prec, "attention"
    return None


# ---------------------------------------------------------------- the span


class _Decoder:
    """Input Dims / Input type of CPU rows, decoded once per distinct raw text."""

    def __init__(self, trace: TraceData):
        self.trace = trace
        self.cache: Dict[int, object] = {}

    def text(self, sid: int):
        if sid < 0:
            return None
        got = self.cache.get(sid, self)
        if got is self:
            try:
                got = json.loads(self.trace.strings[sid])
            except (ValueError, TypeError, IndexError):
                got = None
            self.cache[sid] = got
        return got

    def row(self, r: int):
        oi = self.trace.op_inputs
        dims = oi.dims.get(r)
        if dims is None:
            dims = self.text(int(self.trace.cpu.input_dims[r]))
        types = oi.types.get(r)
        if types is None:
            types = self.text(int(self.trace.cpu.input_types[r]))
        return dims, types


def _user_peak() -> Optional[Dict[str, float]]:
    return peaks.user_peaks(os.environ.get(peaks.ENV_PEAK))


def peak_for(trace: TraceData, not_available: Dict[str, str], user: Optional[Dict[str, float]] = None
             ) -> Optional[dict]:
    """The peak the span's MFU uses: {"gpu", "device_name", "source", "tflops", "hbm_gbps",
    "url", "note"}; None (and ``flops.mfu_pct``'s reason) when there is none."""
    names = [p.get("name") for p in (trace.meta.device_properties or []) if isinstance(p, dict)]
    names = [n for n in names if isinstance(n, str) and n]
    if user:
        tf = {k: v for k, v in user.items() if k in peaks.PRECISIONS}
        known = peaks.match(names[0]) if names else None
        return {"gpu": "user-given", "device_name": names[0] if names else None,
                "source": f"user-given ({peaks.ENV_PEAK})", "tflops": tf,
                "hbm_gbps": user.get("hbm", known.hbm_gbps if known else None), "url": None,
                "note": "peaks from the environment variable, not from the table"}
    if not len(trace.gpu):
        not_available["flops.mfu_pct"] = no_gpu_reason(trace, "no GPU in the trace (CPU-only): no peak to compare with")
        return None
    if not names:
        not_available["flops.mfu_pct"] = ("no deviceProperties in the trace: GPU model unknown, no peak "
                                          f"(set {peaks.ENV_PEAK})")
        return None
    if len(set(names)) > 1:
        not_available["flops.mfu_pct"] = f"several GPU models in one trace ({', '.join(sorted(set(names)))})"
        return None
    p = peaks.match(names[0])
    if p is None:
        not_available["flops.mfu_pct"] = (f"no peak known for GPU '{names[0]}' (analysis/peaks.py; "
                                          f"set {peaks.ENV_PEAK})")
        return None
    return {"gpu": p.key, "device_name": names[0], "source": "table", "tflops": dict(p.tflops),
            "hbm_gbps": p.hbm_gbps, "url": p.source, "note": p.note}


NA_NO_SHAPES = NA_FLOPS_NO_SHAPES  # the Operator view says the same


def _no_shapes(trace: TraceData, steps, na: Dict[str, str], user_peak=None) -> dict:
    """The section of a trace without recorded shapes: no FLOPs, MFU n/a; the step kernels
    are all class "other"."""
    gpu = trace.gpu
    is_k = gpu.kind == GPU_KERNEL
    in_step = is_k.copy() if getattr(steps, "gpu_step", None) is None or len(steps.gpu_step) != len(gpu) \
        else is_k & np.isin(steps.gpu_step, np.flatnonzero(steps.included))
    kus = float(np.nan_to_num(gpu.dur[in_step], nan=0.0).sum())
    peak = peak_for(trace, na, user_peak if user_peak is not None else _user_peak())
    durations = steps.durations.astype(float)
    section = {
        "flops": 0.0, "bytes": None, "step_us": float(durations.sum()), "steps": int(steps.count),
        "flop_kernel_us": 0.0, "gpu_busy_us": None, "ideal_us": None,
        "devices": len(np.unique(gpu.device[in_step])) if in_step.any() else 0, "counted_calls": 0,
        "unlaunched_calls": 0, "unlaunched_flops": 0.0,
        "uncounted_calls": {}, "peak": peak, "by_precision": {},
        "by_class": {"other": {"flops": 0.0, "bytes": None, "kernel_us": kus, "kernels": int(in_step.sum()),
                               "calls": 0, "flops_by_precision": {}}} if in_step.any() else {},
        "kernels": [], "record_shapes": False, "graph_replays": None,
        "per_step": [{"step": int(n), "flops": 0.0, "step_us": float(d), "ideal_us": None, "tflops": 0.0,
                      "mfu_pct": None} for n, d in zip(steps.inc_numbers, durations)],
    }
    na["flops.flops"] = na["flops.mfu_pct"] = NA_NO_SHAPES
    return flops_unknown(derive(section, na))


def flops_unknown(sec: dict) -> dict:
    """A section whose FLOPs could not be counted (no recorded shapes): its FLOP numbers are
    unknown (null, with `not_available["flops.flops"]`), never 0 FLOPs (issue 20: n/a beside
    a number is a contradiction). The partial still adds 0 for it, so a summary's FLOPs are
    those of the spans that recorded shapes."""
    for key in ("flops", "flops_per_step", "tflops", "gflops_per_s", "achieved_tflops"):
        sec[key] = None
    for row in sec.get("per_step") or []:
        row["flops"] = row["tflops"] = None
    return sec


def _ancestors_marked(parent: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Bool over nesting entries: a strict ancestor of one of ``seeds``."""
    # A frontier walk up the tree without sorting (np.unique per level cost ~0.1 s on a
    # 300 MB trace): the frontier never grows (parent is a function) and marked nodes leave it.
    mark = np.zeros(len(parent), bool)
    cur = parent[seeds] if len(seeds) else np.zeros(0, np.int64)
    cur = cur[cur >= 0]
    while len(cur):
        cur = cur[~mark[cur]]
        mark[cur] = True
        cur = parent[cur]
        cur = cur[cur >= 0]
    return mark


def _launched(trace: TraceData, rows: np.ndarray, entries: np.ndarray, is_k: np.ndarray,
              rt_of: Optional[np.ndarray], op_calls) -> Optional[np.ndarray]:
    """Bool over the op nesting's entries: the op (or an op inside it: a runtime call
    wholly inside its span on its thread) launched a GPU kernel that the trace recorded
    (issue 34: ops traced while compiling carry shapes but run nothing). Only ``entries``
    (a bool mask over the nesting) are looked at; the rest are False. None when no kernel
    of the trace is linked to a runtime call (CPU-only traces, traces without correlation
    ids): there is nothing to check against, and every op counts."""
    if rt_of is None or not len(rt_of):
        return None
    linked = is_k & (rt_of >= 0)
    if not linked.any():
        return None
    call_k = np.zeros(len(trace.runtime), bool)
    call_k[rt_of[linked]] = True
    # every op's pairs, not those of ``entries`` selected first: an op's pairs are its own either
    # way, and the answer is read at ``entries`` only (the selection copied ~250k pairs)
    op, call = op_calls if op_calls is not None else linking.op_calls(trace)
    hit = np.zeros(len(trace.cpu), bool)
    hit[op[call_k[call]]] = True
    return hit[rows] & entries


def _holds_calls(trace: TraceData, rows: np.ndarray, entries: np.ndarray, calls: Optional[np.ndarray],
                 op_calls) -> np.ndarray:
    """Bool over the op nesting's entries (only ``entries`` looked at): the op holds one of the
    runtime ``calls`` (a launch of a CUDA graph capture) on its thread."""
    out = np.zeros(len(rows), bool)
    if calls is None or not len(calls) or not entries.any():
        return out
    sel = np.zeros(len(trace.cpu), bool)
    sel[rows[entries]] = True
    op, call = linking.calls_inside(trace, sel, among=op_calls if op_calls is not None else linking.op_calls(trace))
    is_cap = np.zeros(len(trace.runtime), bool)
    is_cap[calls] = True
    hit = np.zeros(len(trace.cpu), bool)
    hit[op[is_cap[call]]] = True
    return hit[rows] & entries


def _capture_templates(trace: TraceData, rows, parent, cand, shape_ok, captured, has_shape, is_flop_name, pos,
                       cols, gr, op_calls) -> Optional[dict]:
    """The capture-time ops a CUDA graph's kernels come from (issue 34 item 2), as the eager
    path owns kernels: per capture launch call, the innermost op with a FLOP formula whose shapes
    fit around it, else the innermost shaped op without one (bytes only). ``{"owner": template
    index per runtime row (-1 none), "entry", "flops", "bytes", "prec", "cls", "counted": bool per
    template}``; None without a recorded capture."""
    if gr is None or not len(gr["capture_calls"]):
        return None
    c_flops, c_bytes, c_prec, c_cls = cols
    cpu = trace.cpu
    flop_op = np.zeros(len(rows), bool)
    flop_op[cand[shape_ok & captured[cand]]] = True
    flop_op &= ~_ancestors_marked(parent, np.flatnonzero(flop_op))
    byte_op = captured & has_shape & ~is_flop_name & ~_ancestors_marked(parent, np.flatnonzero(flop_op))
    byte_op &= ~_ancestors_marked(parent, np.flatnonzero(captured & has_shape))
    f_e, b_e = np.flatnonzero(flop_op), np.flatnonzero(byte_op)
    if not len(f_e) and not len(b_e):
        return None
    b_bytes = np.zeros(len(b_e))
    for i, e in enumerate(b_e.tolist()):
        r = int(rows[e])
        got = op_flops(trace.strings[int(cpu.name[r])], *_Decoder(trace).row(r))
        b_bytes[i] = got[1] if got else 0.0
    entry = np.concatenate([f_e, b_e])
    sel = np.zeros(len(cpu), bool)
    sel[rows[entry]] = True
    op, call = linking.calls_inside(trace, sel, among=op_calls if op_calls is not None else linking.op_calls(trace))
    keep = np.isin(call, gr["capture_calls"])
    op, call = op[keep], call[keep]
    byte_only = np.zeros(len(cpu), bool)
    byte_only[rows[b_e]] = True
    best = linking.first_per_call(op, call, len(trace.runtime), (-cpu.ts, byte_only))
    t_of_row = np.full(len(cpu), -1, np.int64)
    t_of_row[rows[entry]] = np.arange(len(entry))
    owner = np.where(best >= 0, t_of_row[np.maximum(best, 0)], -1)
    at = pos[f_e]
    return {"owner": owner, "entry": entry, "counted": np.arange(len(entry)) < len(f_e),
            "flops": np.concatenate([c_flops[at], np.zeros(len(b_e))]),
            "bytes": np.concatenate([c_bytes[at], b_bytes]),
            "prec": np.concatenate([c_prec[at], np.zeros(len(b_e), np.int64)]),
            "cls": np.concatenate([c_cls[at], np.full(len(b_e), CLASSES.index("elementwise"), np.int64)])}


def _replay_ops(trace: TraceData, gr, tmpl, hs_s, he_s, order) -> Optional[dict]:
    """One virtual op call per (capture-time op, graph replay in an included step): the op's
    FLOPs, bytes, precision and class, counted once per replay, in the step the replay was
    launched in; ``kernel``/``kernel_op``: each replayed kernel and its virtual op (counted
    ones first: ``f_*``, then byte-only: ``e_*``). None when nothing is attributed."""
    if gr is None or tmpl is None:
        return None
    cc = gr["capture_call"]
    k = np.flatnonzero(cc >= 0)
    t = tmpl["owner"][cc[k]] if len(k) else k
    k, t = k[t >= 0], t[t >= 0]
    if not len(k):
        return None
    replay = gr["replay"][k]
    ts = trace.runtime.ts[replay]
    j = np.searchsorted(hs_s, ts, side="right") - 1
    inside = (j >= 0) & (ts < he_s[np.maximum(j, 0)])
    k, t, replay, step = k[inside], t[inside], replay[inside], order[np.maximum(j, 0)][inside]
    if not len(k):
        return None
    counted = tmpl["counted"][t]
    # counted virtual ops first: the key sorts (not counted, template, replay)
    pairs, inv = unique_rows(np.stack([~counted, t, replay], axis=1).astype(np.int64))
    first = np.zeros(len(pairs), np.int64)
    first[inv[::-1]] = np.arange(len(inv) - 1, -1, -1)
    vt, vstep = pairs[:, 1], step[first]
    nf = int((pairs[:, 0] == 0).sum())
    f, e = slice(0, nf), slice(nf, len(pairs))
    return {"kernel": gr["kernels"][k], "kernel_op": inv,
            "f_entry": tmpl["entry"][vt[f]], "f_flops": tmpl["flops"][vt[f]], "f_bytes": tmpl["bytes"][vt[f]],
            "f_prec": tmpl["prec"][vt[f]], "f_cls": tmpl["cls"][vt[f]], "f_step": vstep[f],
            "e_entry": tmpl["entry"][vt[e]], "e_bytes": tmpl["bytes"][vt[e]]}


# per-op columns handed to the Operator view (``per_op``; METRICS.md "Operator view: FLOPs")
OP_FIELDS = ("flops", "flop_bytes", "flop_kernel_us", "peak_us", "hbm_us", "flop_calls", "byte_calls",
             "inner_calls")
INNER, COUNTED, BYTES = 1, 2, 3  # an op's FLOP status: its FLOPs counted in an op inside it / its own / bytes only


def flops_report(trace: TraceData, steps, not_available: Optional[Dict[str, str]] = None,
                 nesting=None, gpu_runtime=None, op_calls=None, user_peak=None,
                 per_op: Optional[dict] = None, per_kernel: Optional[dict] = None) -> Optional[dict]:
    """The span's ``flops`` section (METRICS.md §15); None (with the reason) when there is
    nothing to count. ``per_op`` (a dict, filled when the FLOPs were counted): the per-op
    numbers the Operator view shows, ``{"index": op nesting entries, "fields": {OP_FIELDS
    name: values at those entries}, "peak_gpu", "peak_na"}`` (``_per_op``, sparse)."""
    from .operators import op_nesting

    na = {} if not_available is None else not_available
    if steps is None or steps.count == 0:
        na["flops"] = "no included step"
        return None
    cpu = trace.cpu
    if not (len(trace.op_inputs.dims) or (cpu.input_dims >= 0).any()):
        return _no_shapes(trace, steps, na, user_peak)
    nest = op_nesting(trace) if nesting is None else (nesting() if callable(nesting) else nesting)
    rows, parent = nest["rows"], nest["parent"]
    # ops starting inside an included step (host span)
    hs, he = steps.inc_host_start, steps.inc_host_end
    order = np.argsort(hs, kind="stable")
    hs_s, he_s = hs[order], he[order]
    ts = cpu.ts[rows]
    k = np.searchsorted(hs_s, ts, side="right") - 1
    inside = (k >= 0) & (ts < he_s[np.maximum(k, 0)])
    step_of = np.where(inside, order[np.maximum(k, 0)], -1)
    del ts, k, inside  # arrays over every op: this unit's temporaries set the span's peak memory

    dec = _Decoder(trace)
    has_shape = cpu.input_dims[rows] >= 0
    if len(trace.op_inputs.dims):
        extra = np.fromiter(trace.op_inputs.dims.keys(), np.int64)
        has_shape |= np.isin(rows, extra)
    # formula kind per distinct name
    names = cpu.name[rows]
    present = np.zeros(len(trace.strings), bool)  # a lookup table over string ids: no sort
    present[names] = True
    kind_of = {int(n): flop_kind(trace.strings[int(n)]) for n in np.flatnonzero(present)}
    flop_name = np.zeros(len(trace.strings), bool)
    flop_name[[n for n, k in kind_of.items() if k is not None]] = True
    is_flop_name = flop_name[names]

    # convolution output sizes learnt from the backward calls: (x, w) -> grad_out spatial
    conv_out: Dict[tuple, list] = {}
    bwd_name = np.zeros(len(trace.strings), bool)
    bwd_name[[n for n, k in kind_of.items() if k in ("conv_bwd", "conv_bwd_xgw")]] = True
    bwd = np.flatnonzero(bwd_name[names] & has_shape)
    # one call per distinct (name, dims): the rest repeat it (ops with op_inputs shapes: each)
    bwd_dims = cpu.input_dims[rows[bwd]]
    bwd_key = np.stack([names[bwd], np.where(bwd_dims < 0, -1 - rows[bwd], bwd_dims)], axis=1)
    for j in bwd[np.sort(np.unique(bwd_key, axis=0, return_index=True)[1])] if len(bwd) else bwd:
        kd = kind_of[int(names[j])]
        if kd in ("conv_bwd", "conv_bwd_xgw"):
            d, _ = dec.row(int(rows[j]))
            if isinstance(d, list) and len(d) >= 3 and all(isinstance(x, list) for x in d[:3]):
                go, x = (d[0], d[1]) if kd == "conv_bwd" else (d[1], d[0])
                if len(go) >= 3 and all(isinstance(v, int) for v in go + x + d[2]):
                    conv_out.setdefault((tuple(x), tuple(d[2])), list(go[2:]))

    # FLOPs per candidate, computed once per distinct (name, dims, types) and broadcast:
    # ops repeat a few hundred signatures tens of thousands of times
    cand = np.flatnonzero(is_flop_name & has_shape)
    rc = rows[cand]
    dims_c = cpu.input_dims[rc]
    # an op whose shapes sit in op_inputs (no dims id) is its own key
    if len(cand):
        # np.unique(axis=0)'s order and inverse of the (name, dims, types, own row) rows, without
        # its sort or a stacked copy
        _, inv = unique_columns(names[cand], dims_c, cpu.input_types[rc], np.where(dims_c < 0, rc, -1))
        first = np.zeros(int(inv.max()) + 1, np.int64)
        first[inv[::-1]] = np.arange(len(inv) - 1, -1, -1)
    else:
        first, inv = np.zeros(0, np.int64), np.zeros(0, np.int64)
    u_got = []
    for j in cand[first]:
        d, t = dec.row(int(rows[j]))
        u_got.append(op_flops(trace.strings[int(names[j])], d, t, conv_out))
    u_ok = np.array([g is not None for g in u_got], bool)
    ok = u_ok[inv]
    c_flops = np.array([g[0] if g else 0.0 for g in u_got], float)[inv]
    c_bytes = np.array([g[1] if g else 0.0 for g in u_got], float)[inv]
    # precisions and classes as codes: indices into `precisions` and CLASSES
    precisions: List[str] = sorted({g[2] for g in u_got if g} | {"unknown", "fp32", "tf32"})
    prec_code = {p: i for i, p in enumerate(precisions)}
    c_prec = np.array([prec_code[g[2] if g else "unknown"] for g in u_got], np.int64)[inv]
    c_cls = np.array([CLASSES.index(g[3] if g else "other") for g in u_got], np.int64)[inv]

    def count_names(mask) -> Dict[str, int]:
        ids, n = np.unique(names[cand[mask]], return_counts=True)
        return {trace.strings[int(i)]: int(c) for i, c in zip(ids, n)}

    # ops that launched a GPU kernel (themselves or an op inside them); None when the trace
    # has no kernel linked to a runtime call (CPU-only): every op counts, as before
    gpu = trace.gpu
    is_k = gpu.kind == GPU_KERNEL
    rt_of = None
    if len(gpu) and len(trace.runtime):
        rt_of = linking.gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
        op_calls = op_calls() if callable(op_calls) else op_calls
    launched = _launched(trace, rows, has_shape, is_k, rt_of, op_calls)
    went = np.ones(len(rows), bool) if launched is None else launched
    # ops with a formula that launched nothing (e.g. traced while compiling: shapes, no kernel)
    # (each FLOP once: the innermost of them, as for the counted ops)
    # CUDA graph replays and the launches of their recorded capture (analysis/graph_replays.py)
    gr = graph_replays.replays(trace, rt_of) if rt_of is not None else None
    captured = _holds_calls(trace, rows, has_shape, gr["capture_calls"] if gr else None, op_calls)
    idle = np.zeros(len(rows), bool)
    idle[cand[ok & ~went[cand] & ~captured[cand] & (step_of[cand] >= 0)]] = True
    idle &= ~_ancestors_marked(parent, np.flatnonzero(idle))
    unlaunched_calls = int(idle.sum())
    unlaunched_flops = float(c_flops[np.flatnonzero(idle[cand])].sum()) if unlaunched_calls else 0.0
    shape_ok = ok
    ok = ok & went[cand]
    uncounted = count_names(~u_ok[inv] & went[cand] & (step_of[cand] >= 0)) if len(cand) else {}
    # innermost counted: a candidate with a counted candidate below it is not counted
    counted_mask = np.zeros(len(rows), bool)
    counted_mask[cand[ok]] = True
    anc = _ancestors_marked(parent, np.flatnonzero(counted_mask))
    final = counted_mask & ~anc
    # an uncounted op whose descendant was counted, or that holds another candidate
    # (aten::conv2d -> ... -> aten::cudnn_convolution: only the innermost), is not listed
    anc_cand = _ancestors_marked(parent, cand)
    for nm, n in count_names(~u_ok[inv] & went[cand] & (anc[cand] | anc_cand[cand])
                             & (step_of[cand] >= 0)).items():
        uncounted[nm] -= n
        if not uncounted[nm]:
            del uncounted[nm]
    pos = np.full(len(rows), -1, np.int64)
    pos[cand] = np.arange(len(cand))
    f_idx = np.flatnonzero(final & (step_of >= 0))  # nesting entries of counted ops in steps
    f_flops = c_flops[pos[f_idx]]
    f_bytes = c_bytes[pos[f_idx]]
    f_prec = c_prec[pos[f_idx]]
    f_cls = c_cls[pos[f_idx]]
    f_step = step_of[f_idx]
    tmpl = _capture_templates(trace, rows, parent, cand, shape_ok, captured, has_shape, is_flop_name, pos,
                              (c_flops, c_bytes, c_prec, c_cls), gr, op_calls)
    del pos

    # byte-only ops: shaped, not a FLOP op nor an ancestor of one, no shaped child below
    shaped = has_shape & ~is_flop_name & ~anc
    below = _ancestors_marked(parent, np.flatnonzero(has_shape))
    e_idx = np.flatnonzero(shaped & ~below & went & (step_of >= 0))
    e_bytes = np.zeros(len(e_idx))
    if len(e_idx):
        e_rows = rows[e_idx]
        pairs = np.stack([cpu.name[e_rows].astype(np.int64), cpu.input_dims[e_rows].astype(np.int64),
                          cpu.input_types[e_rows].astype(np.int64)], 1)
        upairs, inv = unique_rows(pairs)
        first = np.zeros(len(upairs), np.int64)
        first[inv[::-1]] = np.arange(len(inv))[::-1]
        vals = np.zeros(len(upairs))
        for u in range(len(upairs)):
            r = int(e_rows[first[u]])
            d, t = dec.row(r)
            got = op_flops(trace.strings[int(cpu.name[r])], d, t)
            vals[u] = got[1] if got else 0.0
        e_bytes = vals[inv]

    # kernels replayed from CUDA graphs: one virtual op call per (capture-time op, replay)
    n_f_real, n_e_real = len(f_idx), len(e_idx)
    virt = _replay_ops(trace, gr, tmpl, hs_s, he_s, order)
    if virt is not None:
        f_idx = np.concatenate([f_idx, virt["f_entry"]])
        f_flops = np.concatenate([f_flops, virt["f_flops"]])
        f_bytes = np.concatenate([f_bytes, virt["f_bytes"]])
        f_prec = np.concatenate([f_prec, virt["f_prec"]])
        f_cls = np.concatenate([f_cls, virt["f_cls"]])
        f_step = np.concatenate([f_step, virt["f_step"]])
        e_idx = np.concatenate([e_idx, virt["e_entry"]])
        e_bytes = np.concatenate([e_bytes, virt["e_bytes"]])

    # ---------------------------------------------------------------- kernels
    n_counted = len(f_idx)
    # owner per kernel: 0..n_counted-1 counted ops, n_counted.. byte-only ops, -1 none
    owner = np.full(len(gpu), -1, np.int64)
    if rt_of is not None:
        all_rows = np.concatenate([rows[f_idx[:n_f_real]], rows[e_idx[:n_e_real]]])
        call_owner = np.full(len(trace.runtime), -1, np.int64)
        if len(all_rows):
            among = op_calls if op_calls is not None else linking.op_calls(trace)
            sel = np.zeros(len(cpu), bool)
            sel[all_rows] = True
            op, call = linking.calls_inside(trace, sel, among=among)
            idx_of_row = np.full(len(cpu), -1, np.int64)
            # counted ops first, then the byte-only ops (after the virtual counted ones)
            idx_of_row[all_rows] = np.r_[np.arange(n_f_real), n_counted + np.arange(len(all_rows) - n_f_real)]
            # a call inside a counted op is that op's (counted ops are disjoint; byte-only ops
            # inside it, e.g. cudnn_convolution_backward_input, do not take its kernels);
            # else the innermost byte-only op (latest start)
            byte_only = np.zeros(len(cpu), bool)
            byte_only[rows[e_idx]] = True
            best = linking.first_per_call(op, call, len(trace.runtime), (-cpu.ts, byte_only))
            del op, call, sel, byte_only
            got = best >= 0
            call_owner[got] = idx_of_row[best[got]]
            del best, got, idx_of_row
        linked = is_k & (rt_of >= 0)
        owner[linked] = call_owner[rt_of[linked]]
        if virt is not None:  # replayed kernels: their virtual op (counted, else byte-only)
            vk, vo = virt["kernel"], virt["kernel_op"]
            owner[vk] = np.where(vo < len(virt["f_entry"]), n_f_real + vo,
                                 n_counted + n_e_real + vo - len(virt["f_entry"]))
    kdur = np.where(is_k, np.nan_to_num(gpu.dur, nan=0.0), 0.0)
    n_own = n_counted + len(e_idx)
    own_k = owner >= 0
    op_kus = np.bincount(owner[own_k], weights=kdur[own_k], minlength=n_own) if n_own else np.zeros(0)
    op_kn = np.bincount(owner[own_k], minlength=n_own) if n_own else np.zeros(0)
    op_flops_all = np.concatenate([f_flops, np.zeros(len(e_idx))])
    op_bytes_all = np.concatenate([f_bytes, e_bytes])
    # classes as indices into CLASSES; precisions only for the counted ops (the byte-only ops
    # after them have none): per-op Python lists over every byte-only op cost ~0.07 s at 300 MB
    cls_of_op = np.concatenate([f_cls, np.full(len(e_idx), CLASSES.index("elementwise"), np.int64)])
    op_prec = f_prec  # codes into `precisions`, per counted op
    # fp32 GEMMs/convs that ran TF32 Tensor Core kernels count as tf32
    if n_counted and own_k.any():
        tf32_name = np.zeros(len(trace.strings), bool)
        seen = np.zeros(len(trace.strings), bool)
        seen[gpu.name[own_k]] = True
        for nid in np.flatnonzero(seen):  # the Tensor Core card's decoder: an fp32 op on a TF32 kernel
            tf32_name[nid] = precision.kernel_precision(trace.strings[int(nid)], "fp32") == "tf32"
        tf = own_k & tf32_name[gpu.name]
        has_tf = np.bincount(owner[tf], minlength=n_own) > 0
        op_prec = np.where((op_prec == prec_code["fp32"]) & has_tf[:n_counted], prec_code["tf32"], op_prec)
    # per kernel share of its op's FLOPs / bytes: by kernel time (equal when all last 0 µs)
    share = np.zeros(len(gpu))
    if own_k.any():
        tot = op_kus[owner[own_k]]
        cnt = op_kn[owner[own_k]]
        share[own_k] = np.where(tot > 0, kdur[own_k] / np.where(tot > 0, tot, 1.0), 1.0 / np.maximum(cnt, 1))
    k_flops = np.zeros(len(gpu))
    k_bytes = np.zeros(len(gpu))
    k_flops[own_k] = op_flops_all[owner[own_k]] * share[own_k]
    k_bytes[own_k] = op_bytes_all[owner[own_k]] * share[own_k]

    # kernels of the included steps: those launched by an op in a step, plus the step's
    # other kernels (gpu_step) as "other"
    in_step = own_k.copy()
    if getattr(steps, "gpu_step", None) is not None and len(steps.gpu_step) == len(gpu):
        inc_idx = np.flatnonzero(steps.included)
        in_step |= is_k & np.isin(steps.gpu_step, inc_idx)
    in_step &= is_k
    replay_stats = _replay_stats(gr, in_step, owner, kdur)
    cls_names = np.array(list(CLASSES))
    k_cls = np.full(len(gpu), CLASSES.index("other"), np.int64)
    k_cls[own_k] = cls_of_op[owner[own_k]]
    has_gpu = bool(is_k.any())

    peak = peak_for(trace, na, user_peak if user_peak is not None else _user_peak())
    tflops_peak = (peak or {}).get("tflops") or {}
    n_dev = max(len(np.unique(gpu.device[in_step])), 1) if has_gpu else 1
    if replay_stats is not None:  # what a worker summary pairs across its spans (METRICS.md §15)
        replay_stats.update(_graph_parts(trace, gr, tmpl, in_step, kdur, (hs_s, he_s, order, steps.inc_numbers),
                                         precisions, n_dev))

    # ---------------------------------------------------------------- sums
    step_us_each = steps.durations.astype(float)
    step_us = float(step_us_each.sum())
    total_flops = float(f_flops.sum())
    by_prec: Dict[str, dict] = {}
    for code in np.flatnonzero(np.bincount(op_prec, minlength=len(precisions))).tolist():
        p = precisions[code]
        m = op_prec == code
        fl = float(f_flops[m].sum())
        kus = float(op_kus[:n_counted][m].sum()) if n_counted else 0.0
        pk = tflops_peak.get(p)
        by_prec[p] = {"flops": fl, "kernel_us": kus,
                      "ideal_us": fl / (pk * 1e12) * 1e6 / n_dev if pk else None}
    ideal_us = sum(v["ideal_us"] for v in by_prec.values() if v["ideal_us"] is not None) if peak else None
    no_peak_flops = sum(v["flops"] for v in by_prec.values() if v["ideal_us"] is None and v["flops"] > 0)
    if peak and no_peak_flops and total_flops:
        na["flops.mfu_pct.precision"] = (f"{100 * no_peak_flops / total_flops:.1f} % of the FLOPs in a precision "
                                         f"with no peak for {peak['gpu']}; left out of the MFU")
    # per step
    per_step = []
    peak_of_code = np.array([tflops_peak.get(p) or 0.0 for p in precisions], float)
    pk_op = peak_of_code[op_prec]
    with np.errstate(divide="ignore", invalid="ignore"):
        ideal_per_op = np.where(pk_op > 0, f_flops / (pk_op * 1e12) * 1e6 / n_dev, 0.0)
    nums = steps.inc_numbers
    for s in range(steps.count):
        m = f_step == s
        fl = float(f_flops[m].sum())
        su = float(step_us_each[s])
        iu = float(ideal_per_op[m].sum()) if peak else None
        per_step.append({"step": int(nums[s]), "flops": fl, "step_us": su, "ideal_us": iu,
                         "tflops": fl / su / 1e6 if su > 0 else None,
                         "mfu_pct": 100.0 * iu / su if iu is not None and su > 0 else None})
    # GPU busy time of the included steps (union of kernel intervals inside the step windows)
    busy_us = None
    if has_gpu:
        from . import intervals

        ks, ke = gpu.ts[is_k], gpu.ts[is_k] + kdur[is_k]
        merged = intervals.merge(ks, ke)
        busy_us = float(intervals.covered_in(merged, steps.inc_start, steps.inc_end).sum())
    # the precision of the counted op that launched each kernel (an index into `precisions`;
    # -1 when none): each kernel is judged against its own precision's roof
    k_prec = np.full(len(gpu), -1, np.int64)
    counted_k = own_k & (owner < n_counted)
    if counted_k.any():
        k_prec[counted_k] = op_prec[owner[counted_k]]
    # per class
    by_class: Dict[str, dict] = {}
    for ci, c in enumerate(CLASSES):
        km = in_step & (k_cls == ci)
        om = cls_of_op == ci
        fl = float(op_flops_all[om].sum()) if n_own else 0.0
        by = float(op_bytes_all[om].sum()) if n_own else 0.0
        kus = float(kdur[km].sum())
        calls = int(om.sum()) if c != "other" else 0
        if not (fl or by or kus or calls):
            continue
        mc = om[:n_counted]
        # bincount adds in row order, as a running sum over the ops would
        per_code = np.bincount(op_prec[mc], weights=f_flops[mc], minlength=len(precisions))
        present, first = np.unique(op_prec[mc], return_index=True)  # in the order the ops come
        precs = {precisions[i]: float(per_code[i]) for i in present[np.argsort(first)].tolist()}
        by_class[c] = {"flops": fl, "bytes": by if c != "other" else None, "kernel_us": kus,
                       "kernels": int(km.sum()), "calls": calls, "flops_by_precision": precs}
        if c in FLOP_CLASSES:
            # the class split by precision (issue 34 item 1): each part against its own roof
            split = {}
            for i in present[np.argsort(first)].tolist():
                pm = mc & (op_prec == i)
                kpm = km & (k_prec == i)
                split[precisions[i]] = {"flops": float(per_code[i]), "bytes": float(f_bytes[pm].sum()),
                                        "kernel_us": float(kdur[kpm].sum()), "kernels": int(kpm.sum()),
                                        "calls": int(pm.sum())}
            by_class[c]["by_precision"] = split
    # per kernel name (top by kernel time among the step kernels)
    top = []
    km = in_step
    if km.any():
        ids, inv = unique_inverse(gpu.name[km])
        kus = np.bincount(inv, weights=kdur[km], minlength=len(ids))
        kfl = np.bincount(inv, weights=k_flops[km], minlength=len(ids))
        kby = np.bincount(inv, weights=k_bytes[km], minlength=len(ids))
        kn = np.bincount(inv, minlength=len(ids))
        # each name's most frequent class (the first on ties): one 2-D count
        n_cls = len(CLASSES)
        name_cls = np.bincount(inv * n_cls + k_cls[km], minlength=len(ids) * n_cls).reshape(-1, n_cls).argmax(1)
        # each name's precision: the one with the most kernel time (-1: launched by no counted op)
        n_pr = len(precisions) + 1
        name_prec = np.bincount(inv * n_pr + k_prec[km] + 1, weights=kdur[km] + 1e-12,
                                minlength=len(ids) * n_pr).reshape(-1, n_pr).argmax(1) - 1
        order_k = np.argsort(-kus, kind="stable")[:TOP_KERNELS * 5]
        for j in order_k:
            cls = CLASSES[int(name_cls[j])]
            top.append({"name": trace.strings[int(ids[j])], "class": cls, "flops": float(kfl[j]),
                        "bytes": float(kby[j]) if cls != "other" else None, "kernel_us": float(kus[j]),
                        "count": int(kn[j]),
                        "precision": precisions[int(name_prec[j])] if name_prec[j] >= 0 and cls in FLOP_CLASSES
                        else None})
    if per_kernel is not None:
        # per GPU row, for the step model (analysis/step_model.py): class code (CLASSES), FLOPs,
        # bytes and the precision of the counted op that launched it (an index into
        # `precisions`; -1 when none)
        per_kernel.update(cls=k_cls, flops=k_flops, bytes=k_bytes, precision_code=k_prec,
                          precisions=list(precisions), peak_tflops=dict(tflops_peak), peak=peak)
    if per_op is not None and has_shape.any():
        per_op.update(_per_op(f_idx, e_idx, anc & ~final & (step_of >= 0), f_flops, op_bytes_all,
                              op_kus, np.where(pk_op > 0, pk_op, np.nan), peak, na))
    section = {
        "flops": total_flops, "bytes": float(op_bytes_all.sum()) if n_own else 0.0, "step_us": step_us,
        "unlaunched_calls": unlaunched_calls, "unlaunched_flops": unlaunched_flops,
        "steps": int(steps.count), "flop_kernel_us": float(op_kus[:n_counted].sum()) if n_counted else 0.0,
        "gpu_busy_us": busy_us, "ideal_us": ideal_us, "devices": n_dev if has_gpu else 0,
        "counted_calls": int(n_counted), "uncounted_calls": dict(sorted(uncounted.items(), key=lambda kv: -kv[1])),
        "peak": peak, "by_precision": by_prec, "by_class": by_class, "kernels": top, "per_step": per_step,
        "record_shapes": bool(has_shape.any()), "graph_replays": replay_stats,
    }
    _replay_na(replay_stats, total_flops, peak, na)
    if not has_shape.any():
        na["flops.flops"] = NA_NO_SHAPES
        return flops_unknown(derive(section, na))
    if uncounted:
        na["flops.uncounted_calls"] = ("calls with a FLOP formula whose recorded shapes do not fit it (e.g. a "
                                       "convolution forward with no backward to learn its output size) are not "
                                       "counted: " + ", ".join(f"{k} ×{v}" for k, v in list(uncounted.items())[:4]))
    if not has_gpu:
        na["flops.roofline"] = no_gpu_reason(trace, "no GPU kernels (CPU-only): no roofline; GFLOP/s over the step "
                                             "time only")
    return derive(section, na)


def _replay_stats(gr, in_step, owner, kdur) -> Optional[dict]:
    """The kernels of the included steps replayed from CUDA graphs (METRICS.md §15): ``kernels``,
    ``kernel_us``, those attributed to a recorded capture's ops (``attributed``,
    ``attributed_kernel_us``) and how many captures the trace records; None without replays."""
    if gr is None:
        return None
    k = gr["kernels"][in_step[gr["kernels"]]]
    got = k[(gr["capture_call"][in_step[gr["kernels"]]] >= 0) & (owner[k] >= 0)]
    return {"kernels": int(len(k)), "kernel_us": float(kdur[k].sum()), "attributed": int(len(got)),
            "attributed_kernel_us": float(kdur[got].sum()), "captures": int(gr["captures"]),
            "step_kernel_us": float(kdur[in_step].sum())}


def _graph_parts(trace: TraceData, gr, tmpl, in_step, kdur, step_windows, precisions, n_dev) -> dict:
    """The span's CUDA graph captures and unmatched replays, as a worker summary pairs them
    across the spans of one worker (METRICS.md §15 "CUDA graph replays", issue 34 item 2):

    - ``recorded_captures``: per recorded capture: ``kernels`` (launches), ``names_key`` (graph_replays.names_key of the kernel names of its
      first replay in this trace; null when none replayed here), ``end_ts``, ``ops`` (each
      capture-time op once: flops, bytes, precision (null: bytes only), class, counted) and
      ``kernel_op`` (per launch, its index in ``ops``; -1 none);
    - ``unmatched``: the replays in included steps that no capture of this trace matched,
      one row per kernel-name sequence: ``kernels``, ``names_key``, ``names`` (distinct) and
      ``kernel_name`` (per position, its index there), ``kernel_us`` (per position, summed over
      the replays, µs to 3 decimals), ``replays`` ([[step, count]]), ``first_ts``,
      ``devices``.

    Small: a few numbers per capture-time op and per replayed kernel position, nothing on
    traces without CUDA graph replays."""
    names_of = trace.strings
    # times comparable across the files of a worker: new traces count from baseTimeNanoseconds
    base_us = (getattr(trace.meta, "base_time_ns", None) or 0) / 1000.0
    caps = []
    for j, calls in enumerate(gr["capture_list"]):  # every capture, as one file matches them
        pos = tmpl["owner"][calls] if tmpl is not None else np.full(len(calls), -1, np.int64)
        used, inv = np.unique(pos[pos >= 0], return_inverse=True)
        kernel_op = np.full(len(pos), -1, np.int64)
        kernel_op[pos >= 0] = inv
        seq = gr["capture_names"].get(j)
        caps.append({
            "kernels": int(len(calls)), "end_ts": float(gr["capture_end"][j]) + base_us,
            "names_key": graph_replays.names_key([names_of[int(n)] for n in seq]) if seq is not None else None,
            "ops": [{"flops": float(tmpl["flops"][t]) if tmpl["counted"][t] else 0.0,
                     "bytes": float(tmpl["bytes"][t]),
                     "precision": precisions[int(tmpl["prec"][t])] if tmpl["counted"][t] else None,
                     "class": CLASSES[int(tmpl["cls"][t])], "counted": bool(tmpl["counted"][t])}
                    for t in used.tolist()],
            "kernel_op": kernel_op.tolist()})
    hs_s, he_s, order, numbers = step_windows
    k, cc, rp = gr["kernels"], gr["capture_call"], gr["replay"]
    groups: Dict[tuple, dict] = {}
    bounds = np.r_[np.flatnonzero(np.r_[True, rp[1:] != rp[:-1]]), len(rp)] if len(rp) else np.zeros(0, np.int64)
    rt_ts = trace.runtime.ts
    for i0, i1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ks = k[i0:i1]
        if cc[i0] >= 0 or not in_step[ks].all():
            continue
        ts = float(rt_ts[rp[i0]])
        j = int(np.searchsorted(hs_s, ts, side="right")) - 1
        if j < 0 or ts >= he_s[j]:
            continue
        step = int(numbers[order[j]])
        key = tuple(trace.gpu.name[ks].tolist())
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"us": np.zeros(len(ks)), "steps": {}, "first_ts": ts}
        g["us"] += kdur[ks]
        g["steps"][step] = g["steps"].get(step, 0) + 1
        g["first_ts"] = min(g["first_ts"], ts)
    unmatched = []
    for key, g in groups.items():
        distinct, kernel_name = np.unique(np.asarray(key, np.int64), return_inverse=True)
        unmatched.append({"kernels": len(key), "names_key": graph_replays.names_key([names_of[int(n)] for n in key]),
                          "names": [names_of[int(n)] for n in distinct], "kernel_name": kernel_name.tolist(),
                          "kernel_us": [round(u, 3) for u in g["us"].tolist()],
                          "replays": [[s, c] for s, c in sorted(g["steps"].items())],
                          "first_ts": g["first_ts"] + base_us, "devices": int(n_dev)})
    return {"recorded_captures": caps, "unmatched": unmatched}


def replay_reason(stats: Optional[dict], summary: bool = False) -> Optional[str]:
    """Why the FLOPs miss the kernels replayed from CUDA graphs (None when none is missed);
    ``summary``: the words of a worker or run summary (its spans' captures were looked at)."""
    if not stats or stats["kernels"] <= stats["attributed"]:
        return None
    n = stats["kernels"] - stats["attributed"]
    us = stats["kernel_us"] - stats["attributed_kernel_us"]
    total = stats.get("step_kernel_us")
    share = f", {100 * us / total:.0f} % of the steps' kernel time" if total else ""
    if summary:
        where = "no span of their worker records a matching capture"
    else:
        where = ("no capture recorded in this trace matches them" if stats["captures"]
                 else "the trace does not record their capture")
    return (f"{n} kernels replayed from CUDA graphs ({us:,.0f} µs{share}) carry no shapes and {where}: their FLOPs "
            f"are not counted; {graph_replays.HOW_TO_RECORD}")


def _replay_na(stats, total_flops, peak, na) -> None:
    """Say what the FLOPs miss under CUDA graphs: the MFU's reason when nothing was counted, else
    ``flops.graph_replays`` (the count is partial)."""
    why = replay_reason(stats)
    if why is None:
        return
    na["flops.graph_replays"] = ("FLOPs and MFU are partial: " if total_flops else "") + why
    if not total_flops and peak:
        na["flops.mfu_pct"] = "no FLOPs counted in the steps: " + why


def _per_op(f_idx, e_idx, inner, f_flops, op_bytes, op_kus, pk, peak, na) -> dict:
    """The Operator view's FLOP columns per op nesting entry (METRICS.md "Operator view:
    FLOPs"): ``flops`` (its own counted FLOPs: each FLOP once, on the innermost op with a
    formula), ``flop_bytes`` (bytes of counted and byte-only ops), ``flop_kernel_us`` (the
    kernels it owns, as in ``by_precision``), ``peak_us`` (FLOPs / the peak of its
    precision, µs; NaN without one), ``hbm_us`` (bytes / HBM bandwidth, µs; NaN without
    one) and the status counts ``flop_calls``, ``byte_calls``, ``inner_calls``. ``pk``: the
    peak TFLOP/s of each counted op's precision (NaN without one).

    Sparse: ``index`` (ascending nesting entries that have any of them) and each field's
    values at those entries; every other entry is 0 in every field. Most ops count nothing
    (on the 292 MB benchmark 8 dense columns over 213k entries were 13 MB kept until the
    Operator view ran)."""
    hbm = (peak or {}).get("hbm_gbps")
    own = np.concatenate([f_idx, e_idx]).astype(np.int64)
    inner_idx = np.flatnonzero(inner) if inner.dtype == bool else np.asarray(inner, np.int64)
    index = unique_values(np.concatenate([own, inner_idx]))
    # each entry's place in ``index`` (every one of them is in it): a table over the entries, not
    # a binary search per entry
    if len(index) and index[0] >= 0:
        place = np.zeros(int(index[-1]) + 1, np.int64)
        place[index] = np.arange(len(index))

        def find(x):
            return place[np.asarray(x, np.int64)]
    else:
        def find(x):
            return np.searchsorted(index, x)
    at_f, at_own = find(f_idx), find(own)
    fields = {f: np.zeros(len(index)) for f in OP_FIELDS}
    # added, not set: a CUDA graph's capture-time op holds one call per replay (issue 34 item 2)
    np.add.at(fields["flops"], at_f, f_flops)
    np.add.at(fields["flop_bytes"], at_own, op_bytes)
    np.add.at(fields["flop_kernel_us"], at_own, op_kus)
    np.add.at(fields["peak_us"], at_f, np.where(f_flops > 0, f_flops / (pk * 1e12) * 1e6, 0.0))
    if hbm:
        np.add.at(fields["hbm_us"], at_own, op_bytes / (hbm * 1e9) * 1e6)
    else:
        fields["hbm_us"][at_own] = np.nan
    np.add.at(fields["flop_calls"], at_f, 1.0)
    np.add.at(fields["byte_calls"], find(e_idx), 1.0)
    fields["inner_calls"][find(inner_idx)] = 1.0
    peak_na = None
    if not peak:
        peak_na = na.get("flops.mfu_pct") or "no peak known for this device"
    elif not hbm:
        peak_na = f"no HBM bandwidth known for {peak.get('gpu')}: no bound"
    return {"index": index, "fields": fields, "peak_gpu": (peak or {}).get("gpu"), "peak_na": peak_na}


# ---------------------------------------------------------------- derived numbers (span and summary alike)


def _rate(flops, us) -> Optional[float]:
    """TFLOP/s of FLOPs over µs."""
    return flops / us / 1e6 if flops is not None and us else None


def _ratio_pct(a, b) -> Optional[float]:
    return 100.0 * a / b if a is not None and b else None


def _roofline(flops, bytes_, kus, peak_tf, hbm) -> dict:
    out = {"achieved_tflops": _rate(flops, kus),
           "achieved_gbps": bytes_ / kus / 1e3 if bytes_ is not None and kus else None,
           "intensity": flops / bytes_ if flops is not None and bytes_ else None,
           "attainable_tflops": None, "roofline_pct": None, "bound": None}
    if peak_tf and hbm:
        ridge = peak_tf * 1e12 / (hbm * 1e9)  # FLOPs/byte where the two roofs meet
        out["ridge"] = ridge
        if not flops and bytes_:
            out["intensity"] = 0.0
            out["bound"] = "memory"
            out["roofline_pct"] = _ratio_pct(out["achieved_gbps"], hbm)  # of the bandwidth roof
        elif out["intensity"] is not None:
            att = min(peak_tf, out["intensity"] * hbm * 1e9 / 1e12)
            out["attainable_tflops"] = att
            out["roofline_pct"] = _ratio_pct(out["achieved_tflops"], att)
            out["bound"] = "compute" if out["intensity"] >= ridge else "memory"
    return out


def _main_precision(precs: dict) -> Optional[str]:
    precs = {k: v for k, v in (precs or {}).items() if v}
    return max(precs, key=precs.get) if precs else None


_OVER = 1 + 1e-9  # float slack: a number exactly at its roof is not above it


def _impossible(row: dict, flops, peak_tf, hbm, what: str) -> Dict[str, str]:
    """Null the numbers of one roofline row (a class, a class's precision, a kernel) that no
    GPU can reach (issue 34 item 9): achieved GB/s above the device's memory bandwidth means
    its byte count (estimated from the recorded shapes) is wrong for those kernels, achieved
    TFLOP/s above the precision's peak that its FLOP count (or kernel time) is; a roofline
    share above 100 % is one of the two. Returns {field: reason} of what it nulled, for
    ``not_available`` (METRICS.md §15)."""
    out: Dict[str, str] = {}
    gbps, tf = row.get("achieved_gbps"), row.get("achieved_tflops")
    if hbm and gbps is not None and gbps > hbm * _OVER:
        why = (f"{what}: {gbps:,.0f} GB/s achieved is above the memory bandwidth ({hbm:,.0f} GB/s): the byte "
               "count estimated from the recorded shapes is wrong for these kernels (n/a, never a share above 100 %)")
        ridge, intensity = row.get("ridge"), row.get("intensity")
        row["achieved_gbps"] = None
        out["achieved_gbps"] = why
        if flops:
            # the bytes are too many, so the true intensity is higher: compute-bound stays known
            row["intensity"] = None
            out["intensity"] = why
            row["bound"] = "compute" if intensity is not None and ridge is not None and intensity >= ridge else None
        else:
            row["bound"] = "memory" if row.get("bound") else None  # no FLOPs: memory-bound by definition
        if row.get("roofline_pct") is not None or row.get("attainable_tflops") is not None:
            row["roofline_pct"] = row["attainable_tflops"] = None
            out["roofline_pct"] = why
    if peak_tf and tf is not None and tf > peak_tf * _OVER:
        why = (f"{what}: {tf:,.1f} TFLOP/s achieved is above the peak ({peak_tf:,.1f} TFLOP/s): the FLOP count or "
               "the kernel time is wrong for these kernels (n/a, never above the peak)")
        row["achieved_tflops"] = None
        out["achieved_tflops"] = why
        for key in ("roofline_pct", "pct_of_peak"):
            if row.get(key) is not None:
                row[key] = None
                out[key] = why
    pct = row.get("roofline_pct")
    if pct is not None and pct > 100 * _OVER:
        row["roofline_pct"] = None
        out["roofline_pct"] = f"{what}: {pct:,.0f} % of the roofline is above the roof: n/a"
    return out


def _blend(v: dict, split: dict, tfp: dict, fallback, hbm) -> Optional[dict]:
    """The roofline of a class that mixes precisions (issue 34 item 1): each precision's
    part against its own roof. The time the class's work would take at the roof is
    Σ_p max(FLOPs_p / peak_p, bytes_p / bandwidth); ``roofline_pct`` = 100 × that / the
    class's kernel time, ``attainable_tflops`` = FLOPs / that time, ``peak_tflops`` the
    blended peak FLOPs / Σ_p FLOPs_p / peak_p, ``bound`` compute when Σ_p FLOPs_p / peak_p
    ≥ bytes / bandwidth. With one precision these are the single-peak formulas. None
    when a precision has no peak (the caller falls back to the main precision's)."""
    flops, bytes_, kus = v.get("flops"), v.get("bytes"), v.get("kernel_us")
    if not (hbm and flops and bytes_):
        return None
    comp_s = roof_s = 0.0  # seconds of the class's work at the compute roofs; at the roof of each part
    for q, r in split.items():
        fq, bq = r.get("flops") or 0.0, r.get("bytes") or 0.0
        pk = tfp.get(q) or fallback
        if fq and not pk:
            return None
        c_s = fq / (pk * 1e12) if fq else 0.0
        comp_s += c_s
        roof_s += max(c_s, bq / (hbm * 1e9))
    mem_s = bytes_ / (hbm * 1e9)
    if not comp_s or not roof_s:
        return None
    eff = flops / comp_s / 1e12
    return {"achieved_tflops": _rate(flops, kus), "achieved_gbps": bytes_ / kus / 1e3 if kus else None,
            "intensity": flops / bytes_, "ridge": eff * 1e12 / (hbm * 1e9), "peak_tflops": eff,
            "attainable_tflops": flops / roof_s / 1e12, "roofline_pct": 100.0 * roof_s * 1e6 / kus if kus else None,
            "bound": "compute" if comp_s >= mem_s else "memory"}


def _kernel_na(bad: List[Tuple[str, Dict[str, str]]], na: Dict[str, str]) -> None:
    """One ``not_available`` entry per nulled kernel field, naming the kernels (a few)."""
    fields: Dict[str, List[str]] = {}
    for name, got in bad:
        for f, why in got.items():
            fields.setdefault(f, []).append(why)
    for f, whys in fields.items():
        more = f" (and {len(whys) - 2} more kernels)" if len(whys) > 2 else ""
        na[f"flops.kernels.{f}"] = "; ".join(whys[:2]) + more


def derive(sec: dict, na: Optional[Dict[str, str]] = None) -> dict:
    """Ratios of the sums: TFLOP/s, MFU, busy efficiency, the roofline per class (and per
    precision inside it) and per kernel, the step-time split by bound (METRICS.md §15).
    Numbers no GPU can reach are null, with the reason in ``na`` (``_impossible``)."""
    na = {} if na is None else na
    peak = sec.get("peak") or {}
    tfp = peak.get("tflops") or {}
    hbm = peak.get("hbm_gbps")
    gpu = peak.get("gpu") or "the GPU"
    step_us = sec.get("step_us")
    sec["flops_per_step"] = sec["flops"] / sec["steps"] if sec.get("steps") else None
    sec["tflops"] = _rate(sec["flops"], step_us)  # over the step time
    sec["gflops_per_s"] = sec["tflops"] * 1e3 if sec["tflops"] is not None else None
    sec["achieved_tflops"] = _rate(sec["flops"], sec.get("flop_kernel_us"))  # over the FLOP ops' kernel time
    top_peak = max(tfp.values()) if tfp else None
    if top_peak and sec["achieved_tflops"] is not None and sec["achieved_tflops"] > top_peak * _OVER:
        na["flops.achieved_tflops"] = (f"{sec['achieved_tflops']:,.1f} TFLOP/s in the FLOP kernels is above every "
                                       f"peak of {gpu} ({top_peak:,.1f} TFLOP/s): the FLOP count or kernel time is wrong")
        sec["achieved_tflops"] = None
    ideal = sec.get("ideal_us")
    sec["mfu_pct"] = _ratio_pct(ideal, step_us) if peak and sec.get("flops") else None
    if peak and not sec.get("flops") and "flops.mfu_pct" not in na:
        na["flops.mfu_pct"] = "no FLOPs counted in the steps (no GEMM, convolution or attention with shapes)"
    # One scale to compare and gate runs on (issue 34 item 11): every FLOP against the GPU's
    # dense bf16/fp16 Tensor Core peak, whatever precision ran it (an fp32 run's MFU above is
    # against the fp32 peak: 69 % there is 5 % here)
    bf16 = tfp.get("bf16") or tfp.get("fp16")
    sec["bf16_peak_tflops"] = bf16
    devices = max(int(sec.get("devices") or 0), 1)
    sec["mfu_bf16_peak_pct"] = (_ratio_pct(sec["flops"] / (bf16 * 1e12 * devices) * 1e6, step_us)
                                if bf16 and sec["mfu_pct"] is not None else None)
    if sec["mfu_pct"] is not None and not bf16:
        na["flops.mfu_bf16_peak_pct"] = f"no dense bf16/fp16 peak for {gpu} (give one: --peak-tflops bf16=...)"
    sec["busy_efficiency_pct"] = _ratio_pct(ideal, sec.get("gpu_busy_us")) if sec["mfu_pct"] is not None else None
    sec["mfu_split_pct"] = {p: _ratio_pct(v.get("ideal_us"), step_us) for p, v in sec["by_precision"].items()
                            if v.get("ideal_us") is not None} if sec["mfu_pct"] is not None else {}
    for p, v in sec["by_precision"].items():
        v["achieved_tflops"] = _rate(v["flops"], v["kernel_us"])
        v["peak_tflops"] = tfp.get(p)
        v["pct_of_peak"] = _ratio_pct(v["achieved_tflops"], tfp.get(p))
        for f, why in _impossible(v, v["flops"], tfp.get(p), None, f"{p} on {gpu}").items():
            na[f"flops.by_precision.{p}.{f}"] = why
    # the headline peak: the precision with the most FLOPs
    main = _main_precision({p: v["flops"] for p, v in sec["by_precision"].items()})
    sec["main_precision"] = main
    sec["peak_tflops"] = tfp.get(main) if main else None
    bound_us = {"compute": 0.0, "memory": 0.0, "unknown": 0.0}
    for c, v in sec["by_class"].items():
        p = _main_precision(v.get("flops_by_precision"))
        v["precision"] = p
        pk = tfp.get(p) if p else (max(tfp.values()) if tfp and v.get("flops") == 0 else None)
        split = v.get("by_precision") or {}
        part_bad = []
        for q, r in split.items():  # each precision against its own roof
            r.update(_roofline(r["flops"], r.get("bytes"), r["kernel_us"], tfp.get(q), hbm))
            r["peak_tflops"] = tfp.get(q)
            r["pct_of_peak"] = _ratio_pct(r["achieved_tflops"], tfp.get(q)) if r["flops"] else None
            got = _impossible(r, r["flops"], tfp.get(q), hbm, f"{c} in {q} on {gpu}")
            for f, why in got.items():
                na[f"flops.by_class.{c}.by_precision.{q}.{f}"] = why
            if "roofline_pct" in got:
                part_bad.append(got["roofline_pct"])
        mixed = len([q for q, f in (v.get("flops_by_precision") or {}).items() if f]) > 1
        blend = _blend(v, split, tfp, pk, hbm) if mixed else None
        if blend is not None:
            v.update(blend)
        else:
            v.update(_roofline(v["flops"], v.get("bytes"), v["kernel_us"], pk, hbm))
            v["peak_tflops"] = pk if v.get("flops") else None
        got = _impossible(v, v["flops"], v["peak_tflops"], hbm, f"{c} on {gpu}")
        if part_bad and v.get("roofline_pct") is not None:  # a share made of an impossible part
            v["roofline_pct"] = None
            got["roofline_pct"] = part_bad[0]
        for f, why in got.items():
            na[f"flops.by_class.{c}.{f}"] = why
        bound_us[v["bound"] or "unknown"] += v["kernel_us"] or 0.0
        v["step_pct"] = _ratio_pct(v["kernel_us"], step_us)
    sec["bound_split_pct"] = {k: _ratio_pct(u, step_us) for k, u in bound_us.items()} if step_us else {}
    main_pk = tfp.get(main) if main else (max(tfp.values()) if tfp else None)
    sec["kernels"] = sorted(sec["kernels"], key=lambda k: -(k["kernel_us"] or 0.0))[:TOP_KERNELS]
    bad = []
    for k in sec["kernels"]:
        # its own precision's roof (the op that launched it), else its class's main precision's
        p = k.get("precision") or (sec["by_class"].get(k["class"]) or {}).get("precision")
        pk = tfp.get(p) if p else main_pk
        fl = k["flops"] if k["class"] != "other" else None
        k.update(_roofline(fl, k.get("bytes"), k["kernel_us"], pk, hbm))
        k["peak_tflops"] = pk if fl else None
        k["pct_of_peak"] = _ratio_pct(k["achieved_tflops"], pk) if fl else None
        got = _impossible(k, fl, pk if fl else None, hbm, f"kernel {k['name'][:80]}")
        if got:
            bad.append((k["name"], got))
    _kernel_na(bad, na)
    return sec


def roofline_efficient(report: dict) -> Optional[dict]:
    """The kernel time judged compute-efficient by the roofline (METRICS.md §9, §15):
    GEMM/conv/attention kernels at >= ROOFLINE_EFFICIENT_PCT of their attainable rate.
    Each top kernel (``flops.kernels``) by its own ``roofline_pct``; the rest of a FLOP
    class's kernel time by the class's. ``{"names": {kernel name}, "kernel_us", "total_us",
    "pct"}`` (pct: of all kernel time in the steps); None without a roofline (no peak, no
    FLOPs, n/a)."""
    sec = report.get("flops") if isinstance(report.get("flops"), dict) else None
    if not sec:
        return None
    by_class = sec.get("by_class") if isinstance(sec.get("by_class"), dict) else {}
    total = sum(float(v.get("kernel_us") or 0.0) for v in by_class.values() if isinstance(v, dict))
    judged = any(isinstance(v, dict) and v.get("roofline_pct") is not None
                 for c, v in by_class.items() if c in FLOP_CLASSES)
    if not total or not judged:
        return None

    def efficient(row) -> bool:
        r = row.get("roofline_pct")
        return isinstance(r, (int, float)) and r >= T.ROOFLINE_EFFICIENT_PCT

    names, eff_us, top_us = set(), 0.0, {}
    for k in sec.get("kernels") or []:
        if not isinstance(k, dict) or k.get("class") not in FLOP_CLASSES:
            continue
        top_us[k["class"]] = top_us.get(k["class"], 0.0) + float(k.get("kernel_us") or 0.0)
        if efficient(k):
            names.add(k.get("name"))
            eff_us += float(k.get("kernel_us") or 0.0)
    for c in FLOP_CLASSES:
        v = by_class.get(c)
        if isinstance(v, dict) and efficient(v):
            eff_us += max(0.0, float(v.get("kernel_us") or 0.0) - top_us.get(c, 0.0))
    return {"names": names, "kernel_us": eff_us, "total_us": total, "pct": 100.0 * eff_us / total}


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span):
    from .operators import span_op_nesting

    per_op: dict = {}
    per_kernel: dict = {}
    span.once("flops_per_op", lambda: per_op)  # the Operator view's FLOP columns (operators.operator_view)
    span.once("flops_per_kernel", lambda: per_kernel)  # the step model's kernel classes (analysis/step_model.py)
    return flops_report(span.trace, span.found, span.not_available, nesting=lambda: span_op_nesting(span), per_op=per_op,
                        per_kernel=per_kernel,
                        gpu_runtime=linking.span_gpu_runtime(span), op_calls=lambda: linking.span_op_calls(span))


_SPLIT_SUMS = ("flops", "bytes", "kernel_us", "kernels", "calls")  # a class's per-precision sums


def _graph_rows(sec: dict, key: str) -> list:
    gr = sec.get("graph_replays")
    rows = gr.get(key) if isinstance(gr, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _unit_partial(report: dict) -> dict:
    sec = report.get("flops") or {}
    span, worker = report.get("span"), report.get("worker")
    replayed = {n for g in _graph_rows(sec, "unmatched") for n in g.get("names") or []}
    return {
        # unknown FLOPs (no recorded shapes, null in the report) add nothing
        "sum:flops": sec.get("flops") if sec.get("record_shapes") else 0.0,
        "sum:bytes": sec.get("bytes"), "sum:step_us": sec.get("step_us"),
        "sum:steps": sec.get("steps"), "sum:flop_kernel_us": sec.get("flop_kernel_us"),
        "sum:gpu_busy_us": sec.get("gpu_busy_us") if sec.get("gpu_busy_us") is not None else 0.0,
        "sum:ideal_us": sec.get("ideal_us"), "max:devices": sec.get("devices") or 0,
        "sum:counted_calls": sec.get("counted_calls") or 0, "first:peak": sec.get("peak"),
        "sum:unlaunched_calls": sec.get("unlaunched_calls") or 0,
        "sum:unlaunched_flops": sec.get("unlaunched_flops") or 0.0,
        "all:record_shapes": bool(sec.get("record_shapes")), "any:record_shapes": bool(sec.get("record_shapes")),
        "keyed:graph_replays": {"all": {f"sum:{f}": v for f, v in sec["graph_replays"].items()
                                        if not isinstance(v, list)}}
        if isinstance(sec.get("graph_replays"), dict) else {},
        # a span's CUDA graph captures and unmatched replays, paired across the spans of one
        # worker by the summary (_pair_replays; METRICS.md §15); empty without replays
        "rows:graph_captures": [dict(c, worker=worker, span=span) for c in _graph_rows(sec, "recorded_captures")],
        "rows:graph_unmatched": [dict(g, worker=worker, span=span) for g in _graph_rows(sec, "unmatched")],
        "keyed:uncounted_calls": {k: {"sum:n": v} for k, v in (sec.get("uncounted_calls") or {}).items()},
        "keyed:by_precision": {p: {"sum:flops": v.get("flops"), "sum:kernel_us": v.get("kernel_us"),
                                   "sum:ideal_us": v.get("ideal_us")}
                               for p, v in (sec.get("by_precision") or {}).items()},
        "keyed:by_class": {c: {"sum:flops": v.get("flops"), "sum:bytes": v.get("bytes"),
                               "sum:kernel_us": v.get("kernel_us"), "sum:kernels": v.get("kernels"),
                               "sum:calls": v.get("calls"),
                               "keyed:flops_by_precision": {p: {"sum:f": f} for p, f in
                                                            (v.get("flops_by_precision") or {}).items()},
                               "keyed:by_precision": {p: {f"sum:{f}": r.get(f) for f in _SPLIT_SUMS}
                                                      for p, r in (v.get("by_precision") or {}).items()}}
                           for c, v in (sec.get("by_class") or {}).items()},
        "keyed:kernels": {k["name"]: {"first:class": k.get("class"), "first:precision": k.get("precision"),
                                      "sum:flops": k.get("flops"),
                                      # an unmatched replayed kernel ("other", no bytes) adds 0: a
                                      # capture in another span may give it bytes (_pair_replays)
                                      "sum:bytes": 0.0 if k.get("bytes") is None and k["name"] in replayed
                                      else k.get("bytes"), "sum:kernel_us": k.get("kernel_us"),
                                      "sum:count": k.get("count")} for k in (sec.get("kernels") or [])},
        "rows:per_step": [{"step": r.get("step"), "flops": r.get("flops") if sec.get("record_shapes") else 0.0,
                           "step_us": r.get("step_us"),
                           "ideal_us": r.get("ideal_us"), "mfu_pct": r.get("mfu_pct"), "span": span,
                           "worker": worker} for r in (sec.get("per_step") or [])],
    }


def _unit_finish(m: dict):
    from .units import per_step_across_spans

    if not m.get("sum:steps"):
        return None
    _pair_replays(m)
    per_step = per_step_across_spans(m["rows:per_step"], ("flops", "step_us", "ideal_us"), "mfu_pct")
    for r in per_step:
        r["tflops"] = _rate(r["flops"], r["step_us"])
        r["mfu_pct"] = _ratio_pct(r["ideal_us"], r["step_us"])
    sec = {
        "flops": m["sum:flops"] or 0.0, "bytes": m["sum:bytes"], "step_us": m["sum:step_us"],
        "steps": int(m["sum:steps"]), "flop_kernel_us": m["sum:flop_kernel_us"],
        "gpu_busy_us": m["sum:gpu_busy_us"], "ideal_us": m["sum:ideal_us"] if m.get("first:peak") else None,
        "devices": int(m["max:devices"] or 0), "counted_calls": int(m["sum:counted_calls"] or 0),
        "unlaunched_calls": int(m.get("sum:unlaunched_calls") or 0),
        "unlaunched_flops": float(m.get("sum:unlaunched_flops") or 0.0),
        "uncounted_calls": {k: int(v["sum:n"] or 0) for k, v in m["keyed:uncounted_calls"].items()},
        "peak": m.get("first:peak"), "record_shapes": bool(m.get("all:record_shapes")),
        "graph_replays": {f[4:]: (v if f.endswith("_us") else int(v))
                          for f, v in m["keyed:graph_replays"]["all"].items()}
        if (m.get("keyed:graph_replays") or {}).get("all") else None,
        "by_precision": {p: {"flops": v["sum:flops"], "kernel_us": v["sum:kernel_us"], "ideal_us": v["sum:ideal_us"]}
                         for p, v in m["keyed:by_precision"].items()},
        "by_class": {c: {"flops": v["sum:flops"], "bytes": v.get("sum:bytes"), "kernel_us": v["sum:kernel_us"],
                         "kernels": int(v["sum:kernels"] or 0), "calls": int(v["sum:calls"] or 0),
                         "flops_by_precision": {p: f["sum:f"] for p, f in v["keyed:flops_by_precision"].items()},
                         **({"by_precision": {p: {f: (int(r[f"sum:{f}"] or 0) if f in ("kernels", "calls")
                                                      else r[f"sum:{f}"]) for f in _SPLIT_SUMS}
                                              for p, r in v["keyed:by_precision"].items()}}
                            if "keyed:by_precision" in v and c in FLOP_CLASSES else {})}
                     for c, v in m["keyed:by_class"].items()},
        "kernels": [{"name": n, "class": v["first:class"], "precision": v.get("first:precision"),
                     "flops": v["sum:flops"], "bytes": v.get("sum:bytes") if v["first:class"] != "other" else None,
                     "kernel_us": v["sum:kernel_us"], "count": int(v["sum:count"] or 0)}
                    for n, v in m["keyed:kernels"].items()],
        "per_step": per_step,
    }
    if not m.get("any:record_shapes", True):
        return flops_unknown(derive(sec))  # no span recorded shapes: the FLOPs are unknown
    return derive(sec)


def _add(d: dict, key: str, value) -> None:
    """Add to a merged ``sum:`` field (an unknown sum stays unknown; a missing one starts at 0)."""
    if key not in d:
        d[key] = 0.0
    if d[key] is not None and value is not None:
        d[key] += value


def _pair_replays(m: dict) -> None:
    """A worker or run summary: the replays a span could not attribute, paired with a capture
    recorded in another span of their worker (graph_replays.pair_across_spans), counted as if
    the capture were in their span (METRICS.md §15 "CUDA graph replays"): each capture-time op's
    FLOPs, bytes, precision and class once per replay, in the replay's step and span; its
    kernels move from "other" to the op's class. Changes the merged partial ``m`` in place."""
    caps, groups = m.get("rows:graph_captures") or [], m.get("rows:graph_unmatched") or []
    if not caps or not groups:
        return
    peak = (m.get("first:peak") or {}).get("tflops") or {}
    stats = (m.get("keyed:graph_replays") or {}).get("all")
    by_class, by_prec = m.setdefault("keyed:by_class", {}), m.setdefault("keyed:by_precision", {})
    kernels = m.setdefault("keyed:kernels", {})
    pairs = graph_replays.pair_across_spans(caps, groups)
    if not pairs:
        return
    # the merged rows are the spans' own dicts (stored results): changed on copies
    m["rows:per_step"] = [dict(r) for r in m.get("rows:per_step") or []]
    step_rows = {(r.get("worker"), r.get("span"), r.get("step")): r for r in m["rows:per_step"]}
    for g, c in pairs:
        us = np.asarray(g.get("kernel_us") or [], float)
        kernel_op = np.asarray(c.get("kernel_op") or [], np.int64)
        distinct, at_name = g.get("names") or [], g.get("kernel_name") or []
        if len(us) != len(kernel_op) or len(at_name) != len(us) or any(not 0 <= i < len(distinct) for i in at_name):
            continue
        names = [distinct[i] for i in at_name]
        n_rep = sum(int(n) for _, n in g.get("replays") or [])
        n_dev = max(int(g.get("devices") or 1), 1)
        per_replay_flops = per_replay_ideal = 0.0
        for o, op in enumerate(c.get("ops") or []):
            at = np.flatnonzero(kernel_op == o)
            if not len(at):
                continue
            kus, nk = float(us[at].sum()), int(len(at)) * n_rep
            cls, counted = op.get("class") or "other", bool(op.get("counted"))
            prec = op.get("precision") if counted else None
            if prec == "fp32" and any(precision.kernel_precision(names[i], "fp32") == "tf32" for i in at.tolist()):
                prec = "tf32"  # an fp32 op on a TF32 Tensor Core kernel, as in one span
            fl = float(op.get("flops") or 0.0) * n_rep if counted else 0.0
            by = float(op.get("bytes") or 0.0) * n_rep
            pk = peak.get(prec) if prec else None
            ideal = fl / (pk * 1e12) * 1e6 / n_dev if pk else None
            _add(m, "sum:bytes", by)
            row = by_class.setdefault(cls, {"keyed:flops_by_precision": {}, "keyed:by_precision": {}})
            for f, v in (("flops", fl), ("bytes", by), ("kernel_us", kus), ("kernels", nk), ("calls", n_rep)):
                _add(row, f"sum:{f}", v)
            other = by_class.get("other")
            if other is not None and cls != "other":
                _add(other, "sum:kernel_us", -kus)
                _add(other, "sum:kernels", -nk)
            if counted:
                _add(m, "sum:flops", fl)
                _add(m, "sum:flop_kernel_us", kus)
                _add(m, "sum:counted_calls", n_rep)
                if ideal is not None and m.get("first:peak"):
                    _add(m, "sum:ideal_us", ideal)
                p_row = by_prec.setdefault(prec, {"sum:flops": 0.0, "sum:kernel_us": 0.0,
                                                  "sum:ideal_us": 0.0 if pk else None})
                _add(p_row, "sum:flops", fl)
                _add(p_row, "sum:kernel_us", kus)
                _add(p_row, "sum:ideal_us", ideal)
                _add(row.setdefault("keyed:flops_by_precision", {}).setdefault(prec, {}), "sum:f", fl)
                split = row.setdefault("keyed:by_precision", {}).setdefault(prec, {})
                for f, v in (("flops", fl), ("bytes", by), ("kernel_us", kus), ("kernels", nk), ("calls", n_rep)):
                    _add(split, f"sum:{f}", v)
                per_replay_flops += fl / n_rep if n_rep else 0.0
                per_replay_ideal += (ideal or 0.0) / n_rep if n_rep else 0.0
            for i in at.tolist():  # the op's FLOPs and bytes over its kernels by kernel time
                share = float(us[i]) / kus if kus > 0 else 1.0 / len(at)
                k = kernels.get(names[i])
                if k is None:
                    k = kernels[names[i]] = {"first:class": cls, "first:precision": None, "sum:flops": 0.0,
                                             "sum:bytes": 0.0, "sum:kernel_us": float(us[i]), "sum:count": n_rep}
                if k.get("first:class") in (None, "other"):
                    k["first:class"] = cls
                if k.get("first:precision") is None and cls in FLOP_CLASSES:
                    k["first:precision"] = prec
                _add(k, "sum:flops", fl * share)
                _add(k, "sum:bytes", by * share)
        if "other" in by_class and not any(abs(by_class["other"].get(f"sum:{f}") or 0.0) > 1e-6
                                           for f in _SPLIT_SUMS):
            del by_class["other"]  # as a span leaves out a class with nothing in it
        for step, n in g.get("replays") or []:
            r = step_rows.get((g.get("worker"), g.get("span"), step))
            if r is None:
                continue
            r["flops"] = (r.get("flops") or 0.0) + per_replay_flops * n
            if r.get("ideal_us") is not None:
                r["ideal_us"] += per_replay_ideal * n
                r["mfu_pct"] = _ratio_pct(r["ideal_us"], r.get("step_us"))
        if stats is not None:
            got = int((kernel_op >= 0).sum()) * n_rep
            _add(stats, "sum:attributed", got)
            _add(stats, "sum:attributed_kernel_us", float(us[kernel_op >= 0].sum()))
            _add(stats, "sum:attributed_other_span", got)


def _summary_na(report: dict, na: Dict[str, str]) -> None:
    """A summary's reasons about CUDA graph replays, once its spans' replays were paired with
    captures of other spans (_pair_replays): the spans' "the trace does not record their
    capture" dropped when every replay got its capture, else said again with the count left."""
    sec = report.get("flops") if isinstance(report.get("flops"), dict) else {}
    stats = sec.get("graph_replays")
    if not isinstance(stats, dict) or not stats.get("attributed_other_span"):
        return
    na.pop("flops.graph_replays", None)
    if sec.get("mfu_pct") is not None or sec.get("flops"):
        if (na.get("flops.mfu_pct") or "").startswith("no FLOPs counted in the steps: "):
            na.pop("flops.mfu_pct")
    why = replay_reason(stats, summary=True)
    if why is not None:
        na["flops.graph_replays"] = ("FLOPs and MFU are partial: " if sec.get("flops") else "") + why
        if not sec.get("flops") and sec.get("peak"):
            na["flops.mfu_pct"] = "no FLOPs counted in the steps: " + why


# the MFU card's own scale (the card, like every card, is judged in judge/cards.py)


def mfu_severity(value: float) -> str:
    """MFU's own scale (like input-bound's): below MFU_LOW_PCT medium, below MFU_MODERATE_PCT low."""
    return "medium" if value < T.MFU_LOW_PCT else "low" if value < T.MFU_MODERATE_PCT else "ok"


def _unit():
    from .units import HIGHER, Card, Metric, Unit, path

    card = Card("mfu", "MFU", "Model FLOPs (from recorded shapes) per step time, as a share of the GPU's dense peak.",
                field=("flops", "mfu_pct"), order=40,
                definition="MFU: FLOPs counted from the recorded shapes of GEMM, convolution and attention ops (as "
                "FlopCounterMode counts them) over the step time, divided by the GPU's dense peak for each "
                "precision. Roofline: FLOPs per byte against the ridge point peak / memory bandwidth.")
    metrics = (
        # compare and gate on one peak for every run (issue 34 item 11); the card's MFU (each
        # precision at its own peak) is the detail row beside it
        Metric("mfu_pct", "MFU of the dense bf16/fp16 peak", "%", HIGHER, path("flops", "mfu_bf16_peak_pct"),
               ("flops.mfu_bf16_peak_pct", "flops.mfu_pct", "flops.flops", "flops"), text=False, order=80),
        Metric("mfu_own_peak_pct", "MFU, each precision at its own peak", "%", None, path("flops", "mfu_pct"),
               ("flops.mfu_pct", "flops.flops", "flops"), card=card, text=False, order=81),
        Metric("tflops", "TFLOP/s over the step time", "TFLOP/s", HIGHER, path("flops", "tflops"),
               ("flops.flops", "flops"), text=False, order=90),
        Metric("achieved_tflops", "TFLOP/s in FLOP kernels", "TFLOP/s", HIGHER, path("flops", "achieved_tflops"),
               ("flops.flops", "flops"), text=False, order=100),
    )
    return Unit("flops", _unit_compute, _unit_partial, _unit_finish, requires=("steps",), metrics=metrics,
                summary_not_available=_summary_na)


UNIT = _unit()
