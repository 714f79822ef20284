"""torch.compile and CUDA graphs (METRICS.md "torch.compile and CUDA graphs"): what is
compiled, what breaks, what recompiles, and which fused ops an Inductor kernel holds.

What the profiler records (torch >= 2.4, checked on ../shared/traces/h100):

- ``Torch-Compiled Region: <frame>/<compile>`` (cpu_op) around each call of a frame that
  Dynamo compiled; ``<compile>`` > 0 is a recompile of that frame (its guards failed).
  A graph break makes Dynamo call the rest of the frame as a new *resume* frame from inside
  the region, so the resume frame's region is nested in the one that broke.
- ``CompiledFunction`` / ``CompiledFunctionBackward`` (AOTAutograd's forward/backward
  graph calls), ``## Call CompiledFxGraph <hash> ##`` (user_annotation, one per Inductor
  graph call), ``TorchDynamo Cache Lookup`` (guard evaluation before each compiled frame).
- Compilation itself (``dynamo``, ``entire_frame_compile``, ``_compile.compile_inner``,
  ``backend_compile`` ...) when it happens inside the profiled steps.
- Inductor's Triton kernels (``triton_poi_fused_add_mul_3``: the origin ATen ops in the
  name), launched through ``cuLaunchKernel(Ex)`` (cuda_driver), and CUDA graph replays
  (``cudaGraphLaunch``: every kernel with its correlation was replayed from a graph).

The section is per span; every number is a sum over included steps (partials are additive,
``finish`` takes ratios of the sums).
"""
from __future__ import annotations

import functools
import re
from typing import Dict, List, Optional

import numpy as np

from .. import thresholds as T
from ..trace.model import CPU_OP, CPU_PYTHON, CPU_USER_ANNOTATION, GPU_KERNEL, TraceData
from . import intervals as iv
from .context import GRAPH_LAUNCH_CALLS, TRITON_RE
from .signals import SYNC_CALLS, SYNC_MEMCPY_CALLS
from .source import is_user_frame, parse_frame

NAME = "compilation"

REGION_RE = re.compile(r"^Torch-Compiled Region(?::\s*\[?(\d+)/(\d+)(?:_\d+)?\]?)?\s*$")
BACKWARD_NAMES = frozenset({"CompiledFunctionBackward"})
FORWARD_GRAPH_NAMES = frozenset({"CompiledFunction"})
FX_GRAPH_RE = re.compile(r"^## Call CompiledFxGraph \S+ ##$")
GUARD_NAMES = frozenset({"TorchDynamo Cache Lookup"})
# Spans of compilation work (Dynamo tracing, AOTAutograd, Inductor): their time inside a
# compiled region is compile time, not compiled execution.
COMPILE_NAMES = frozenset({
    "dynamo", "entire_frame_compile", "_compile.compile_inner", "_compile.compile_inner (dynamo_timed)",
    "compile_attempt_0", "compile_attempt_0 (dynamo_timed)", "backend_compile",
    "OutputGraph.call_user_compiler", "OutputGraph.call_user_compiler (dynamo_timed)",
    "compile_fx_inner", "compile_fx_inner (dynamo_timed)", "inductor_compile", "aot_autograd",
    "TorchDynamo compile", "Dynamo compile",
})
# Library kernels: attention first (cuDNN SDPA kernels carry "wgmma"), then GEMMs.
ATTENTION_RE = re.compile(r"(?i)flash|sdpa|fmha|attn|attention")
GEMM_RE = re.compile(r"(?i)gemm|nvjet|cutlass|^Cijk_|cublas|xmma|wgmma|^void\s+gemv|gemv2|_mma_")

KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent_reduction", "tem": "template",
         "for": "foreach", "fused": "fused"}
UNKNOWN_OPS = ["unknown"]

# ATen / Inductor op names that Inductor joins with "_" into a kernel name (origins of the
# fused nodes). Longest match first, so "native_layer_norm_backward" beats
# "native_layer_norm"; a token that matches none is kept as written.
FUSED_OP_VOCAB = tuple(sorted({
    "_to_copy", "_unsafe_view", "_log_softmax", "_log_softmax_backward_data", "_softmax",
    "_softmax_backward_data", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_fused_rms_norm", "_foreach_add", "_foreach_mul", "_foreach_div",
    "_foreach_sqrt", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "_native_batch_norm_legit_functional", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_weight_norm_interface", "_pdist_forward",
    "abs", "acos", "add", "addcdiv", "addcmul", "addmm", "alias", "all", "amax", "amin", "any", "arange",
    "argmax", "argmin", "as_strided", "as_strided_scatter", "asin", "atan", "atan2", "avg_pool2d",
    "avg_pool2d_backward", "baddbmm", "bernoulli", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor",
    "bmm", "bucketize", "cat", "ceil", "clamp", "clamp_max", "clamp_min", "clone", "constant_pad_nd",
    "convolution", "convolution_backward", "copy", "cos", "cosh", "cumprod", "cumsum", "detach", "div",
    "div_", "elu", "elu_backward", "embedding", "embedding_dense_backward", "empty", "empty_like", "eq",
    "erf", "erfinv", "exp", "exp2", "expand", "expm1", "fill", "flip", "floor", "floor_divide", "fmod",
    "full", "full_like", "gather", "ge", "gelu", "gelu_backward", "gt", "hardsigmoid", "hardswish",
    "hardtanh", "hardtanh_backward", "index", "index_add", "index_put", "index_select", "isinf", "isnan",
    "iota", "le", "leaky_relu", "leaky_relu_backward", "lerp", "lift_fresh", "linalg_vector_norm", "log",
    "log1p", "log2", "log_softmax", "logical_and", "logical_not", "logical_or", "logsumexp", "lt",
    "masked_fill", "max", "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "maximum", "mean",
    "min", "minimum", "mm", "mul", "native_batch_norm", "native_batch_norm_backward", "native_dropout",
    "native_dropout_backward", "native_group_norm", "native_group_norm_backward", "native_layer_norm",
    "native_layer_norm_backward", "ne", "neg", "new_empty", "new_full", "new_ones", "new_zeros",
    "nll_loss_backward", "nll_loss_forward", "nll_loss2d_backward", "nll_loss2d_forward", "ones",
    "ones_like", "permute", "pow", "prepare_softmax_online", "prod", "rand", "randn", "reciprocal", "relu",
    "remainder", "repeat", "round", "rsqrt", "rsub", "scalar_tensor", "scatter", "scatter_add",
    "scatter_reduce", "select", "select_backward", "select_scatter", "sigmoid", "sigmoid_backward", "sign",
    "silu", "silu_backward", "sin", "sinh", "slice", "slice_backward", "slice_scatter", "softplus",
    "softplus_backward", "sort", "split", "split_with_sizes", "sqrt", "squeeze", "stack", "sub", "sum", "t",
    "tanh", "tanh_backward", "threshold_backward", "topk", "transpose", "tril", "triu", "trunc", "unbind",
    "unsqueeze", "unfold", "upsample_bilinear2d", "upsample_nearest2d", "var", "var_mean", "view",
    "view_as_complex", "view_as_real", "where", "zeros", "zeros_like", "mul_", "add_", "copy_",
    "reshape", "contiguous", "squeeze_copy", "unsqueeze_copy", "view_copy", "lt_", "ge_",
}, key=lambda s: (-len(s), s)))
_KERNEL_NAME_RE = re.compile(r"^triton_(?:(poi|red|per|tem|for)_)?(?:fused(?:_(.*?))?)?(?:_\d+)?$")


def fused_ops(name: str) -> List[str]:
    """The ATen ops an Inductor kernel's name reveals (``triton_poi_fused_add_mul_3`` ->
    ``["add", "mul"]``), in name order, each once; ``["unknown"]`` when the name carries none
    (``triton_poi_fused_0``, a renamed or hashed kernel, a name that is not Inductor's)."""
    m = _KERNEL_NAME_RE.match(name or "")
    body = m.group(2) if m else None
    if not body:
        return list(UNKNOWN_OPS)
    out: List[str] = []
    i, n = 0, len(body)
    while i < n:
        op = next((v for v in FUSED_OP_VOCAB if body.startswith(v, i)
                   and (i + len(v) == n or body[i + len(v)] == "_")), None)
        if op is None:  # an op we do not list: up to the next "_" (a leading "_" belongs to it)
            j = body.find("_", i + 1)
            op = body[i:j if j >= 0 else n]
        if op and op.strip("_") and not op.strip("_").isdigit() and op not in out:
            out.append(op)
        i += len(op) + 1
    return out or list(UNKNOWN_OPS)


def kernel_kind(name: str) -> str:
    """pointwise / reduction / persistent_reduction / template / foreach / triton."""
    m = _KERNEL_NAME_RE.match(name or "")
    return KINDS.get(m.group(1), "triton") if m and m.group(1) else "triton"


@functools.lru_cache(maxsize=1 << 14)  # a few hundred kernel names per trace, asked by several units
def kernel_family(name: str) -> str:
    """The kernel family of one kernel name: ``triton`` (Inductor, §9 Context's test), else
    ``attention`` (flash/SDPA/FMHA: cuDNN SDPA kernels carry "wgmma"), else ``gemm``
    (library GEMMs), else ``other``. The section's triton/gemm/attention times use it, and
    so does the run comparison's kernel-family table (compare.py) for eager runs too."""
    if TRITON_RE.search(name) is not None:
        return "triton"
    if ATTENTION_RE.search(name) is not None:
        return "attention"
    if GEMM_RE.search(name) is not None:
        return "gemm"
    return "other"


def region_ids(name: str):
    """(frame, compile) of a ``Torch-Compiled Region: f/c`` name; (None, None) without ids;
    None when the name is not a region."""
    m = REGION_RE.match(name)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))) if m.group(1) is not None else (None, None)


def _ids(trace: TraceData, pred) -> np.ndarray:
    return trace.string_ids(pred)


def _rows(trace: TraceData, pred, kinds=(CPU_OP, CPU_USER_ANNOTATION)) -> np.ndarray:
    cpu = trace.cpu
    ids = _ids(trace, pred)
    if not len(ids) or not len(cpu):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.isin(cpu.name, ids) & np.isin(cpu.kind, kinds))


def _nesting(pid, tid, ts, end):
    """For regions (rows sorted however): the parent region index (-1: top level) and the
    depth, per thread, by containment (a region inside another region's span)."""
    n = len(ts)
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    order = np.lexsort((-(end - ts), ts, tid, pid))
    stack: List[int] = []
    key = None
    for i in order:
        k = (pid[i], tid[i])
        if k != key:
            stack, key = [], k
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = depth[stack[-1]] + 1
        stack.append(i)
    return parent, depth


def _thread_intervals(trace: TraceData, rows: np.ndarray) -> Dict[tuple, iv.Intervals]:
    cpu = trace.cpu
    out: Dict[tuple, iv.Intervals] = {}
    if not len(rows):
        return out
    keys = np.stack([cpu.pid[rows], cpu.tid[rows]], axis=1)
    for k in np.unique(keys, axis=0):
        sel = rows[(keys[:, 0] == k[0]) & (keys[:, 1] == k[1])]
        out[(int(k[0]), int(k[1]))] = iv.merge(cpu.ts[sel], cpu.ts[sel] + cpu.dur[sel])
    return out


def _inside(merged_by_thread: Dict[tuple, iv.Intervals], pid, tid, ts, end) -> np.ndarray:
    """For calls (pid, tid, ts, end): wholly inside one merged interval of their thread."""
    out = np.zeros(len(ts), bool)
    for (p, t), (s, e) in merged_by_thread.items():
        sel = np.flatnonzero((pid == p) & (tid == t))
        if not len(sel) or not len(s):
            continue
        j = np.searchsorted(s, ts[sel], side="right") - 1
        ok = j >= 0
        jj = np.maximum(j, 0)
        out[sel] = ok & (end[sel] <= e[jj])
    return out


# ---------------------------------------------------------------- what broke the graph (METRICS.md §16)

# Dynamo's own work inside a region (guards, compiling, the code around a graph call): never the break.
DYNAMO_BOOKKEEPING = GUARD_NAMES | COMPILE_NAMES | BACKWARD_NAMES | FORWARD_GRAPH_NAMES | frozenset({
    "Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue", "AOTDispatcher Runtime Wrapper Epilogue",
})
_BOOKKEEPING_PREFIXES = ("Torch-Compiled Region", "## Call CompiledFxGraph", "dynamo_data", "ProfilerStep#",
                         "TorchDynamo", "CompiledFunction")
# ATen ops whose output shape depends on the data (Dynamo: "Dynamic shape operator").
DYNAMIC_SHAPE_OPS = frozenset({"aten::nonzero", "aten::nonzero_numpy", "aten::masked_select", "aten::_unique2",
                               "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
                               "aten::repeat_interleave"})
SCALAR_OPS = ("aten::_local_scalar_dense", "aten::item")
BRANCH_OP = "aten::is_nonzero"  # bool(tensor): a Python `if`/`while`/`and` on a tensor's value
# What torch._dynamo.explain (torch 2.13) reports for each kind of break (first line, then its
# Explanation), checked on CPU with the same models (tests/analysis/test_graph_break_named.py).
BREAK_REASONS = {
    "item": ("Unsupported Tensor.item() call with capture_scalar_outputs=False",
             "Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False"),
    "dynamic_shape": ("Dynamic shape operator",
                      "the operator's output shape depends on input Tensor data"),
    "branch": ("generic_jump TensorVariable()",
               "a Python branch on a tensor's value (data-dependent control flow)"),
    "logging": ("logging.Logger method not supported for non-export cases",
                "logging.Logger methods are not supported for non-export cases"),
    "print": ("Failed to trace builtin operator",
              "Dynamo does not know how to trace builtin operator `print`"),
}
BREAK_CALLS = {"item": "Tensor.item()", "branch": "bool(tensor) in a Python `if`", "print": "print()"}
NO_OP_AT_BREAK = ("no op or sync ran there, so Dynamo stopped at a Python call it cannot trace (a logging.Logger "
                  "method, print, or another builtin or library call)")
_LOGGING_FRAME = re.compile(r"(?:^|[/\\])logging[/\\]__init__\.py\(\d+\): (\w+)$")
_TENSOR_METHOD = re.compile(r"^<built-in method (\w+) of Tensor object")
RESUME_RE = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$")
MAX_CAUSE_OPS = 5


class _Thread:
    """One thread's CPU rows and runtime rows, sorted by start (break windows are sliced
    from them with searchsorted), and its Python frames that can name a break's line:
    Dynamo's resume frames and the user's own frames."""

    def __init__(self, trace: TraceData, pid: int, tid: int, resume_ids, user_ids):
        cpu, rt = trace.cpu, trace.runtime
        rows = np.flatnonzero((cpu.pid == pid) & (cpu.tid == tid))
        self.rows = rows[np.argsort(cpu.ts[rows], kind="stable")]
        self.ts = cpu.ts[self.rows]
        rrows = np.flatnonzero((rt.pid == pid) & (rt.tid == tid)) if len(rt) else np.empty(0, np.int64)
        self.rt_rows = rrows[np.argsort(rt.ts[rrows], kind="stable")]
        self.rt_ts = rt.ts[self.rt_rows]
        py = self.rows[cpu.kind[self.rows] == CPU_PYTHON]
        self.resume = py[np.isin(cpu.name[py], resume_ids)] if len(resume_ids) else py[:0]
        self.user = py[np.isin(cpu.name[py], user_ids)] if len(user_ids) else py[:0]

    def cpu_in(self, trace, lo, hi):
        a, b = np.searchsorted(self.ts, lo, "left"), np.searchsorted(self.ts, hi, "left")
        w = self.rows[a:b]
        return w[trace.cpu.ts[w] + trace.cpu.dur[w] <= hi]

    def rt_in(self, trace, lo, hi):
        a, b = np.searchsorted(self.rt_ts, lo, "left"), np.searchsorted(self.rt_ts, hi, "left")
        w = self.rt_rows[a:b]
        return w[trace.runtime.ts[w] + trace.runtime.dur[w] <= hi]


def _outside(ts, end, book: iv.Intervals) -> np.ndarray:
    """Whether each [ts, end] lies outside every merged bookkeeping interval."""
    s, e = book
    if not len(s):
        return np.ones(len(ts), bool)
    j = np.searchsorted(s, ts, side="right") - 1
    return ~((j >= 0) & (end <= e[np.maximum(j, 0)]))


def _outermost(ts, end) -> np.ndarray:
    """Indices (into ts) of the events no other event of the list contains."""
    order = np.lexsort((-(end - ts), ts))
    out, reach = [], -np.inf
    for i in order.tolist():
        if ts[i] >= reach or end[i] > reach:
            out.append(i)
            reach = max(reach, end[i])
    return np.asarray(out, np.int64)


def _gap_cause(trace: TraceData, thread: "_Thread", lo: float, hi: float, book_ids, book_prefix) -> Optional[dict]:
    """What ran eagerly in one window between a compiled graph (or the region's start) and
    the nested region that follows it: the op at the break, the sync, the Python call; None
    when only Dynamo's own work (guards, compiling) ran there."""
    cpu, rt, S = trace.cpu, trace.runtime, trace.strings
    w = thread.cpu_in(trace, lo, hi)
    r = thread.rt_in(trace, lo, hi)
    if not len(w) and not len(r):
        return None
    names = cpu.name[w]
    is_book = np.isin(names, book_ids) | np.isin(names, book_prefix)
    book = iv.merge(cpu.ts[w[is_book]], cpu.ts[w[is_book]] + cpu.dur[w[is_book]])
    keep = ~is_book & _outside(cpu.ts[w], cpu.ts[w] + cpu.dur[w], book)
    w = w[keep]
    r = r[_outside(rt.ts[r], rt.ts[r] + rt.dur[r], book)] if len(r) else r
    ops = w[cpu.kind[w] == CPU_OP]
    py = w[cpu.kind[w] == CPU_PYTHON]
    op_names = [S[int(n)] for n in cpu.name[ops]]
    py_names = [S[int(n)] for n in cpu.name[py]]
    rt_names = {S[int(n)] for n in rt.name[r]}
    sync = bool(rt_names & (SYNC_CALLS | SYNC_MEMCPY_CALLS))
    top_ops: List[str] = []
    us = 0.0
    if len(ops):
        o_ts, o_end = cpu.ts[ops], cpu.ts[ops] + cpu.dur[ops]
        outer = _outermost(o_ts, o_end)
        us = float((o_end[outer] - o_ts[outer]).sum())
        for i in outer.tolist():
            if op_names[i] not in top_ops:
                top_ops.append(op_names[i])
    kind, op, call, python = None, None, None, None
    for name in py_names:
        m = _LOGGING_FRAME.search(name)
        if m:
            kind, call, python = "logging", f"logging.Logger.{m.group(1)}()", name
            break
        if name == "<built-in function print>":
            kind, call, python = "print", BREAK_CALLS["print"], name
            break
    if kind is None:
        dyn = next((n for n in op_names if n in DYNAMIC_SHAPE_OPS), None)
        if BRANCH_OP in op_names:
            kind, op, call = "branch", BRANCH_OP, BREAK_CALLS["branch"]
        elif dyn is not None:
            kind, op, call = "dynamic_shape", dyn, f"torch.{dyn.split('::', 1)[1]}"
        elif any(n in SCALAR_OPS for n in op_names):
            kind, call = "item", BREAK_CALLS["item"]
            op = next(n for n in SCALAR_OPS if n in op_names)
    if kind is None:
        method = next((m.group(1) for m in map(_TENSOR_METHOD.match, py_names) if m), None)
        user = next((n for n in py_names if is_user_frame(n) and not RESUME_RE.search(n)), None)
        if method is not None:
            kind, call, op = "tensor_method", f"Tensor.{method}()", top_ops[0] if top_ops else None
        elif sync:
            kind, op = "sync", top_ops[0] if top_ops else None
        elif top_ops:
            kind, op = "op", top_ops[0]
        elif user is not None:
            kind, python = "python", user
        else:
            return None
    if python is None and kind in ("item", "branch", "dynamic_shape", "tensor_method"):
        python = next((n for n in py_names if _TENSOR_METHOD.match(n) or n.startswith("<built-in method")), None)
    if kind in ("logging", "print") and python is not None:
        pi = py_names.index(python)
        us = max(us, float(cpu.dur[py[pi]]))
    reason, explanation = BREAK_REASONS.get(kind, (None, None))
    if kind == "dynamic_shape":
        explanation = f"`{op.replace('::', '.')}`'s output shape depends on input Tensor data"
    return {"kind": kind, "op": op, "call": call, "reason": reason, "explanation": explanation,
            "ops": top_ops[:MAX_CAUSE_OPS], "python": python, "sync": sync, "us": us}


_USER_FRAMES_LOOKED_AT = 4096  # user frames before a break searched for the one around it


def _break_source(trace: TraceData, thread: "_Thread", lo: float, hi: float, child_ts: float,
                  child_end: float) -> Optional[dict]:
    """The source line of a break when the trace has Python stacks: the resume frame Dynamo
    called after the break, ``torch_dynamo_resume_in_<function>_at_<line>`` (the line that
    broke, as torch._dynamo.explain's user_stack), inside the nested region; else the
    innermost user frame around the break (named by its first line: ``exact`` false)."""
    cpu, S = trace.cpu, trace.strings
    r = thread.resume
    if len(r):
        r_ts = cpu.ts[r]
        inside = r[(r_ts >= child_ts) & (r_ts + cpu.dur[r] <= child_end)]
        if len(inside):
            name = S[int(cpu.name[inside[0]])]
            m, parsed = RESUME_RE.search(name), parse_frame(name)
            return {"frame": name, "file": parsed[0] if parsed else None, "line": int(m.group(2)),
                    "function": m.group(1), "exact": True}
    u = thread.user
    if len(u):
        j = int(np.searchsorted(cpu.ts[u], lo, side="right"))
        cand = u[max(0, j - _USER_FRAMES_LOOKED_AT):j]
        around = cand[cpu.ts[cand] + cpu.dur[cand] >= hi]
        if len(around):  # the latest start: the innermost
            name = S[int(cpu.name[around[-1]])]
            parsed = parse_frame(name)
            return {"frame": name, "file": parsed[0], "line": parsed[1], "function": parsed[2], "exact": False}
    return None


def break_causes(trace: TraceData, region_rows: np.ndarray, parent: np.ndarray, broken: np.ndarray, ids,
                 graph_rows: np.ndarray) -> Dict[str, dict]:
    """What broke each compiled region that broke (``broken``: holds a nested region, in the
    steps): the eager host work between a compiled graph call (``graph_rows``: CompiledFunction,
    ``## Call CompiledFxGraph``), an earlier nested region or the region's start, and the next
    nested region, less Dynamo's own work (guards, compiling). Classified as torch._dynamo.explain
    words it (BREAK_REASONS): ``item`` (aten::item / aten::_local_scalar_dense), ``branch``
    (aten::is_nonzero), ``dynamic_shape`` (aten::nonzero ...), ``logging``/``print`` (Python
    frames, with_stack), ``tensor_method``, ``sync``, ``op`` (another eager op), ``python`` (a
    user frame only), ``none`` (nothing ran: a Python-only break in a trace without stacks).
    One cause per broken region call (the first window that ran something; ``none`` when no
    window did). -> {key: {kind, op, call, reason, explanation, ops, python, sync, source,
    regions, count, us}}."""
    cpu, S = trace.cpu, trace.strings
    book_ids = trace.string_ids(lambda s: s in DYNAMO_BOOKKEEPING)
    book_prefix = trace.string_ids(lambda s: s.startswith(_BOOKKEEPING_PREFIXES))
    r_ts = cpu.ts[region_rows]
    r_end = r_ts + cpu.dur[region_rows]
    r_pid, r_tid = cpu.pid[region_rows], cpu.tid[region_rows]
    g_ts = cpu.ts[graph_rows]
    g_end = g_ts + cpu.dur[graph_rows]
    g_pid, g_tid = cpu.pid[graph_rows], cpu.tid[graph_rows]
    resume_ids = trace.string_ids(lambda s: RESUME_RE.search(s) is not None)
    user_ids = trace.string_ids(lambda s: is_user_frame(s) and RESUME_RE.search(s) is None)
    threads: Dict[tuple, _Thread] = {}
    out: Dict[str, dict] = {}
    for k in np.flatnonzero(broken).tolist():
        key_t = (int(r_pid[k]), int(r_tid[k]))
        thread = threads.get(key_t) or threads.setdefault(key_t, _Thread(trace, *key_t, resume_ids, user_ids))
        lo_k, hi_k = r_ts[k], r_end[k]
        children = np.flatnonzero(parent == k)
        children = children[np.argsort(r_ts[children], kind="stable")]
        mine = (g_pid == key_t[0]) & (g_tid == key_t[1]) & (g_ts >= lo_k) & (g_end <= hi_k)
        ends = np.concatenate([g_end[mine], r_end[children]])
        found, source = None, None
        for c in children.tolist():
            before = ends[ends <= r_ts[c]]
            lo = float(before.max()) if len(before) else float(lo_k)
            cause = _gap_cause(trace, thread, lo, float(r_ts[c]), book_ids, book_prefix)
            if cause is not None:
                found = cause
                source = _break_source(trace, thread, lo, float(r_ts[c]), float(r_ts[c]), float(r_end[c]))
                break
        if found is None:
            found = {"kind": "none", "op": None, "call": None, "reason": None, "explanation": NO_OP_AT_BREAK,
                     "ops": [], "python": None, "sync": False, "us": 0.0}
            c0 = children[0] if len(children) else None
            if c0 is not None:
                source = _break_source(trace, thread, float(lo_k), float(r_ts[c0]), float(r_ts[c0]),
                                       float(r_end[c0]))
        f, c = ids[k] if ids[k] is not None else (None, None)
        region = S[int(cpu.name[region_rows[k]])] if f is None else f"{f}/{c}"
        key = "|".join(str(x or "") for x in (found["kind"], found["op"], found["call"],
                                               (source or {}).get("frame"), (source or {}).get("line")))
        row = out.get(key)
        if row is None:
            row = out[key] = dict(found, source=source, regions=[], count=0, us=0.0)
        row["count"] += 1
        row["us"] += found["us"]
        if region not in row["regions"]:
            row["regions"].append(region)
    return out


NA_NO_MARKERS = ("no torch.compile regions, Inductor (Triton) kernels or CUDA graph launches in this trace: "
                 "an eager run")
NA_NO_REGIONS = ("no 'Torch-Compiled Region' markers in this trace (an eager run, or a profiler older than "
                 "torch 2.4): compiled share, graph breaks and recompiles cannot be told")
NA_NO_COMPILED = ("no compiled region or AOTAutograd graph call (CompiledFunction) in this trace: the Triton "
                  "kernels or CUDA graphs ran without a compiled frame the profiler marked")
NA_NO_STEPS = "no included step"
NA_NO_GPU = "no GPU kernel in the included steps"
NA_NO_REGION_IDS = "the trace's compiled regions carry no <frame>/<compile> ids (torch older than 2.5)"


def compilation(trace: TraceData, steps, gpu_runtime: Optional[np.ndarray] = None,
                not_available: Optional[Dict[str, str]] = None) -> Optional[dict]:
    """The span's section (module docstring; METRICS.md). None (n/a with the reason) when the
    trace holds no compiled region, Triton kernel or CUDA graph launch."""
    na = not_available if not_available is not None else {}
    cpu, rt, g = trace.cpu, trace.runtime, trace.gpu
    region_name_ids = _ids(trace, lambda s: s.startswith("Torch-Compiled Region") and REGION_RE.match(s) is not None)
    region_rows = np.flatnonzero(np.isin(cpu.name, region_name_ids) & (cpu.kind == CPU_OP)) \
        if len(region_name_ids) and len(cpu) else np.empty(0, np.int64)
    launch_ids = _ids(trace, lambda s: s in GRAPH_LAUNCH_CALLS)
    is_graph_call = np.isin(rt.name, launch_ids) if len(launch_ids) and len(rt) else np.zeros(len(rt), bool)
    is_kernel = g.kind == GPU_KERNEL
    triton_name_ids = _ids(trace, lambda s: TRITON_RE.search(s) is not None)
    is_triton = is_kernel & np.isin(g.name, triton_name_ids) if len(triton_name_ids) else np.zeros(len(g), bool)
    if not len(region_rows) and not is_graph_call.any() and not is_triton.any():
        na[NAME] = NA_NO_MARKERS
        return None
    if steps is None or steps.count == 0:
        na[NAME] = NA_NO_STEPS
        return None

    order = np.argsort(steps.inc_host_start, kind="stable")
    numbers = steps.inc_numbers[order]
    h_lo, h_hi = steps.inc_host_start[order], steps.inc_host_end[order]
    s_lo, s_hi = steps.inc_start[order], steps.inc_end[order]
    n_steps = len(numbers)

    def step_of(ts, lo=h_lo, hi=h_hi):
        """Index of the included step whose host span (CPU events; ``lo``/``hi`` = the
        stretched span for GPU activity) holds ts, else -1."""
        j = np.searchsorted(lo, ts, side="right") - 1
        jj = np.maximum(j, 0)
        return np.where((j >= 0) & (ts < hi[jj]), j, -1)

    # ---- compiled regions: nesting, frames and compile ids
    r_ts, r_end = cpu.ts[region_rows], cpu.ts[region_rows] + cpu.dur[region_rows]
    parent, depth = _nesting(cpu.pid[region_rows], cpu.tid[region_rows], r_ts, r_end)
    has_child = np.zeros(len(region_rows), bool)
    has_child[parent[parent >= 0]] = True
    r_step = step_of(r_ts)
    ids = [region_ids(trace.strings[int(n)]) for n in cpu.name[region_rows]]

    # ---- compiled intervals (forward regions + backward graphs), compile spans, guards
    bwd_rows = _rows(trace, lambda s: s in BACKWARD_NAMES, kinds=(CPU_OP,))
    fwd_graph_rows = _rows(trace, lambda s: s in FORWARD_GRAPH_NAMES, kinds=(CPU_OP,))
    compiled_rows = np.concatenate([region_rows, fwd_graph_rows, bwd_rows])
    compile_rows = _rows(trace, lambda s: s in COMPILE_NAMES, kinds=(CPU_OP, CPU_USER_ANNOTATION))
    guard_rows = _rows(trace, lambda s: s in GUARD_NAMES, kinds=(CPU_OP,))
    fx_rows = _rows(trace, lambda s: FX_GRAPH_RE.match(s) is not None, kinds=(CPU_USER_ANNOTATION, CPU_OP))
    all_compiled = iv.merge(cpu.ts[compiled_rows], cpu.ts[compiled_rows] + cpu.dur[compiled_rows])
    all_compile = iv.merge(cpu.ts[compile_rows], cpu.ts[compile_rows] + cpu.dur[compile_rows])
    compiled_only = iv.subtract(all_compiled, all_compile)
    by_thread = _thread_intervals(trace, compiled_rows)
    region_by_thread = _thread_intervals(trace, region_rows)
    # forward graph calls: Inductor graph calls inside a region (else AOT CompiledFunction)
    in_region = _inside(region_by_thread, cpu.pid[fx_rows], cpu.tid[fx_rows], cpu.ts[fx_rows],
                        cpu.ts[fx_rows] + cpu.dur[fx_rows]) if len(fx_rows) else np.zeros(0, bool)
    graph_rows = fx_rows[in_region] if len(fx_rows) and in_region.any() else fwd_graph_rows

    # ---- GPU kernels: the step (by their launch call, else their start), compiled, graphs
    g_rt = gpu_runtime if gpu_runtime is not None else np.full(len(g), -1, np.int64)
    rt_step = np.full(len(rt), -1, np.int64)
    if len(rt):
        j = np.searchsorted(h_lo, rt.ts, side="right") - 1
        jj = np.maximum(j, 0)
        ok = (j >= 0) & (rt.ts + rt.dur <= h_hi[jj])
        rt_step[ok] = j[ok]
    linked = g_rt >= 0
    gr = np.maximum(g_rt, 0)
    k_step = np.where(linked, rt_step[gr] if len(rt) else -1, step_of(g.ts, s_lo, s_hi)) if len(g) else np.empty(0, np.int64)
    rt_compiled = _inside(by_thread, rt.pid, rt.tid, rt.ts, rt.ts + rt.dur) if len(rt) else np.zeros(0, bool)
    k_compiled = linked & (rt_compiled[gr] if len(rt) else False)
    k_graph = linked & (is_graph_call[gr] if len(rt) else False)
    names = g.name
    gemm_name_ids = _ids(trace, lambda s: kernel_family(s) == "gemm")
    attn_name_ids = _ids(trace, lambda s: kernel_family(s) == "attention")
    is_gemm = is_kernel & np.isin(names, gemm_name_ids) if len(gemm_name_ids) else np.zeros(len(g), bool)
    is_attn = is_kernel & np.isin(names, attn_name_ids) if len(attn_name_ids) else np.zeros(len(g), bool)
    in_steps = is_kernel & (k_step >= 0)

    def per_step_sum(mask, values):
        out = np.zeros(n_steps)
        sel = mask & in_steps
        np.add.at(out, k_step[sel], values[sel])
        return out

    dur = g.dur
    kernel_us = per_step_sum(np.ones(len(g), bool), dur)
    compiled_gpu_us = per_step_sum(k_compiled, dur)
    graph_gpu_us = per_step_sum(k_graph, dur)
    graph_kernels = per_step_sum(k_graph, np.ones(len(g)))
    triton_us = per_step_sum(is_triton, dur)
    gemm_us = per_step_sum(is_gemm, dur)
    attn_us = per_step_sum(is_attn, dur)
    graph_launches = np.bincount(rt_step[is_graph_call & (rt_step >= 0)], minlength=n_steps) if len(rt) \
        else np.zeros(n_steps, np.int64)

    def count_in_steps(rows):
        st = step_of(cpu.ts[rows]) if len(rows) else np.empty(0, np.int64)
        return np.bincount(st[st >= 0], minlength=n_steps) if len(st) else np.zeros(n_steps, np.int64)

    def dur_in_steps(rows):
        out = np.zeros(n_steps)
        if len(rows):
            st = step_of(cpu.ts[rows])
            np.add.at(out, st[st >= 0], cpu.dur[rows][st >= 0])
        return out

    guard_us, guard_calls = dur_in_steps(guard_rows), count_in_steps(guard_rows)
    graphs = count_in_steps(graph_rows)
    compile_top = compile_rows
    if len(compile_rows):  # top-level compile spans (a compile span inside another is one compile)
        c_par, _ = _nesting(cpu.pid[compile_rows], cpu.tid[compile_rows], cpu.ts[compile_rows],
                            cpu.ts[compile_rows] + cpu.dur[compile_rows])
        compile_top = compile_rows[c_par < 0]
    compiles = count_in_steps(compile_top)

    per_step = []
    have_regions = bool(len(region_rows))
    have_compiled = bool(len(compiled_rows))
    for i in range(n_steps):
        lo, hi = float(h_lo[i]), float(h_hi[i])  # CPU time: the host span
        step_us = float(s_hi[i] - s_lo[i])  # the step's (stretched) time, as every section
        comp = float(iv.covered_in(compiled_only, lo, hi)[0]) if have_compiled else None
        cmp_us = float(iv.covered_in(all_compile, lo, hi)[0])
        mine = r_step == i
        per_step.append({
            "step": int(numbers[i]), "step_us": step_us,
            "compiled_us": comp, "compile_us": cmp_us,
            "eager_us": max(step_us - comp - cmp_us, 0.0) if comp is not None else None,
            "guard_us": float(guard_us[i]), "guard_calls": int(guard_calls[i]),
            "regions": int(mine.sum()), "nested_regions": int((mine & (parent >= 0)).sum()),
            "breaks": int((mine & has_child).sum()) if have_regions else None,
            "max_depth": int(depth[mine].max()) if mine.any() else 0,
            "graphs": int(graphs[i]), "compiles": int(compiles[i]),
            "kernel_us": float(kernel_us[i]), "compiled_gpu_us": float(compiled_gpu_us[i]),
            "graph_launches": int(graph_launches[i]), "graph_kernels": int(graph_kernels[i]),
            "graph_gpu_us": float(graph_gpu_us[i]), "triton_us": float(triton_us[i]),
            "gemm_us": float(gemm_us[i]), "attention_us": float(attn_us[i]),
        })

    # ---- frames and compile ids (regions inside the steps)
    frames: Dict[str, dict] = {}
    recompiles: Dict[str, dict] = {}
    compile_steps = set(int(numbers[i]) for i in np.flatnonzero(compiles > 0))
    for k, (fc, st) in enumerate(zip(ids, r_step)):
        if st < 0 or fc is None:
            continue
        f, c = fc
        fkey = "?" if f is None else str(f)
        fr = frames.setdefault(fkey, {"frame": f, "regions": 0, "cpu_us": 0.0, "compile_ids": []})
        fr["regions"] += 1
        fr["cpu_us"] += float(cpu.dur[region_rows[k]])
        if c is not None and c not in fr["compile_ids"]:
            fr["compile_ids"].append(c)
        if c:
            step_no = int(numbers[st])
            rc = recompiles.setdefault(f"{f}/{c}", {"id": f"{f}/{c}", "frame": f, "compile": c,
                                                     "first_step": step_no, "regions": 0,
                                                     "compiled_in_step": step_no in compile_steps})
            rc["regions"] += 1
    broken: Dict[str, dict] = {}  # regions that broke (hold a nested region): where to look
    for k in np.flatnonzero(has_child & (r_step >= 0)):
        f, c = ids[k] if ids[k] is not None else (None, None)
        key = trace.strings[int(cpu.name[region_rows[k]])] if f is None else f"{f}/{c}"
        b = broken.setdefault(key, {"id": key, "frame": f, "count": 0, "nested": 0})
        b["count"] += 1
        b["nested"] += int((parent == k).sum())
    if have_regions and all(fc == (None, None) for fc in ids):
        na[f"{NAME}.recompiles"] = NA_NO_REGION_IDS
    causes = break_causes(trace, region_rows, parent, has_child & (r_step >= 0), ids,
                          np.concatenate([fwd_graph_rows, fx_rows])) if has_child.any() else {}

    # ---- Inductor (Triton) kernels
    kernels: Dict[str, dict] = {}
    sel = np.flatnonzero(is_triton & in_steps)
    if len(sel):
        uniq, inv = np.unique(names[sel], return_inverse=True)
        counts = np.bincount(inv, minlength=len(uniq))
        sums = np.bincount(inv, weights=dur[sel], minlength=len(uniq))
        graphed = np.bincount(inv, weights=k_graph[sel].astype(float), minlength=len(uniq))
        for u, c, s, gk in zip(uniq, counts, sums, graphed):
            kernels[trace.strings[int(u)]] = {"count": int(c), "us": float(s), "graph_count": int(gk)}

    sec = _finish_from(per_step, frames, recompiles, kernels, have_regions, broken,
                       kernel_sources(trace, sel, g_rt), causes)
    if not have_compiled:
        na[f"{NAME}.compiled_pct"] = NA_NO_COMPILED
    if not have_regions:
        na[f"{NAME}.breaks_per_step"] = NA_NO_REGIONS
        na[f"{NAME}.recompiles"] = NA_NO_REGIONS
    if not sec["kernel_us"]:
        na[f"{NAME}.compiled_gpu_pct"] = NA_NO_GPU
    return sec


# ---------------------------------------------------------------- the group maths (span and summary alike)

PER_STEP_FIELDS = ("step_us", "compiled_us", "compile_us", "eager_us", "guard_us", "guard_calls", "regions",
                   "nested_regions", "breaks", "graphs", "compiles", "kernel_us", "compiled_gpu_us",
                   "graph_launches", "graph_kernels", "graph_gpu_us", "triton_us", "gemm_us", "attention_us")
TOP_KERNELS = 25
TOP_CAUSES = 10
CAUSE_FIELDS = ("kind", "op", "call", "reason", "explanation", "ops", "python", "sync", "source")


def _sum(rows, key):
    vals = [r.get(key) for r in rows]
    if any(v is None for v in vals):
        return None
    return float(sum(vals))


def _ratio(part, whole):
    return 100.0 * part / whole if part is not None and whole else None


def _per(part, n):
    return part / n if part is not None and n else None


def kernel_sources(trace: TraceData, gpu_rows: np.ndarray, gpu_runtime: np.ndarray) -> Dict[str, dict]:
    """Kernel name -> where its fused ops come from, for the Triton kernels ``gpu_rows`` whose
    launch call lies inside an Inductor launch op that carries ``kernel_file``/``kernel_hash``/
    ``kernel_backend`` (the innermost such op on the call's thread, linking.innermost_enclosing):
    ``{hash, file (basename only), backend, variants, ops, source_nodes, ops_source}``. Of several
    kernel files under one name (graphs reuse names), the one with most launches; ``variants``
    counts them. ``ops``/``source_nodes`` from the ``Original ATen`` / ``Source Nodes`` lines of
    Inductor's generated code when the loader found that file on this machine
    (``trace.kernel_origins``, ``ops_source`` "kernel_file"), else none here (the name's ops)."""
    from .linking import innermost_enclosing

    launches = trace.kernel_launches
    if not launches or not len(gpu_rows):
        return {}
    rt_rows = gpu_runtime[gpu_rows] if len(gpu_runtime) else np.full(len(gpu_rows), -1, np.int64)
    linked = rt_rows >= 0
    if not linked.any():
        return {}
    op_rows = np.fromiter(sorted(launches), np.int64, len(launches))
    enc = innermost_enclosing(trace, op_rows, rt_rows[linked])
    tally: Dict[str, Dict[tuple, int]] = {}
    for g_row, op in zip(gpu_rows[linked][enc >= 0].tolist(), enc[enc >= 0].tolist()):
        name = trace.strings[int(trace.gpu.name[g_row])]
        per = tally.setdefault(name, {})
        launch = launches[op]
        per[launch] = per.get(launch, 0) + 1
    out: Dict[str, dict] = {}
    for name, per in tally.items():
        launch = max(per.items(), key=lambda kv: (kv[1], kv[0]))[0]
        base = launch.file.replace("\\", "/").rsplit("/", 1)[-1] or None
        origin = trace.kernel_origins.get(base) if base else None
        ops = [a[5:] if a.startswith("aten.") else a for a in origin.aten] if origin and origin.aten else None
        out[name] = {"hash": launch.hash or None, "file": base, "backend": launch.backend or None,
                     "variants": len(per), "ops": ops,
                     "source_nodes": list(origin.source_nodes) if ops else None}
    return out


def _kernel_row_source(name: str, src: Optional[dict]) -> dict:
    """A kernel row's fused ops and their source (``fused_ops_source``: "kernel_file" when
    read from Inductor's generated code, "name" from the kernel's name, "unknown" when neither
    tells), and the launch's kernel hash, file basename and backend (null when the trace's
    launch op carries none)."""
    src = src or {}
    if src.get("ops"):
        ops, where = list(src["ops"]), "kernel_file"
    else:
        ops = fused_ops(name)
        where = "unknown" if ops == UNKNOWN_OPS else "name"
    return {"ops": ops, "fused_ops_source": where, "source_nodes": list(src.get("source_nodes") or []),
            "kernel_hash": src.get("hash"), "kernel_file": src.get("file"), "kernel_backend": src.get("backend"),
            "kernel_variants": int(src.get("variants") or 0)}


def _finish_from(rows: List[dict], frames: Dict[str, dict], recompiles: Dict[str, dict],
                 kernels: Dict[str, dict], have_regions: bool, broken: Optional[Dict[str, dict]] = None,
                 sources: Optional[Dict[str, dict]] = None, causes: Optional[Dict[str, dict]] = None) -> dict:
    n = len(rows)
    broken_list = sorted((dict(b, per_step=_per(b["count"], n)) for b in (broken or {}).values()),
                         key=lambda b: (-b["count"], b["id"]))
    cause_list = sorted((dict(c, key=k, regions=sorted(c.get("regions") or []), per_step=_per(c["count"], n))
                         for k, c in (causes or {}).items()),
                        key=lambda c: (c["kind"] == "none", -c["count"], c["key"]))[:TOP_CAUSES]
    S = {k: _sum(rows, k) for k in PER_STEP_FIELDS}
    step_us, kernel_us = S["step_us"], S["kernel_us"]
    first_step = min((r["step"] for r in rows if isinstance(r.get("step"), int)), default=None)
    rec_list = []
    for rc in sorted(recompiles.values(), key=lambda r: (r["frame"] if r["frame"] is not None else -1,
                                                         r["compile"])):
        steady = bool(rc.get("compiled_in_step")) or (first_step is not None and rc["first_step"] > first_step)
        rec_list.append(dict(rc, steady=steady))
    frame_list = sorted(({**f, "compile_ids": sorted(f["compile_ids"])} for f in frames.values()),
                        key=lambda f: (f["frame"] is None, f["frame"] if f["frame"] is not None else 0))
    triton_us = S["triton_us"] or 0.0
    krows = []
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:TOP_KERNELS]:
        krows.append({"name": name, "kind": kernel_kind(name), **_kernel_row_source(name, (sources or {}).get(name)),
                      "count": k["count"], "us": k["us"], "us_per_step": _per(k["us"], n),
                      "pct_of_triton": _ratio(k["us"], triton_us), "graph_count": k.get("graph_count", 0)})
    breaks = S["breaks"] if have_regions else None
    return {
        "has_regions": have_regions, "steps": n, "step_us": step_us,
        "compiled_us": S["compiled_us"], "compiled_pct": _ratio(S["compiled_us"], step_us),
        "eager_us": S["eager_us"], "eager_pct": _ratio(S["eager_us"], step_us),
        "compile_us": S["compile_us"], "compile_pct": _ratio(S["compile_us"], step_us),
        "compiles_in_steps": int(S["compiles"] or 0),
        "guard_us": S["guard_us"], "guard_calls": int(S["guard_calls"] or 0),
        "guard_pct": _ratio(S["guard_us"], step_us),
        "regions": int(S["regions"] or 0), "regions_per_step": _per(S["regions"], n),
        "nested_regions": int(S["nested_regions"] or 0), "nested_per_step": _per(S["nested_regions"], n),
        "breaks": int(breaks) if breaks is not None else None, "breaks_per_step": _per(breaks, n),
        "broken_regions": broken_list,
        "break_causes": cause_list,
        "graphs_per_step": _per(S["graphs"], n),
        "max_depth": max((r.get("max_depth") or 0 for r in rows), default=0),
        "frames": frame_list, "compiled_frames": len(frame_list),
        "recompiles": len(rec_list) if have_regions else None,
        "steady_recompiles": sum(1 for r in rec_list if r["steady"]) if have_regions else None,
        "recompile_ids": rec_list,
        "kernel_us": kernel_us,
        "compiled_gpu_us": S["compiled_gpu_us"], "compiled_gpu_pct": _ratio(S["compiled_gpu_us"], kernel_us),
        "graph_launches": int(S["graph_launches"] or 0), "graph_kernels": int(S["graph_kernels"] or 0),
        "graph_gpu_us": S["graph_gpu_us"], "graph_gpu_pct": _ratio(S["graph_gpu_us"], kernel_us),
        "triton_us": S["triton_us"], "triton_pct": _ratio(S["triton_us"], kernel_us),
        "triton_kernels": len(kernels),
        "gemm_us": S["gemm_us"], "gemm_pct": _ratio(S["gemm_us"], kernel_us),
        "attention_us": S["attention_us"], "attention_pct": _ratio(S["attention_us"], kernel_us),
        "kernels": krows,
        # every Triton kernel: name -> [launches, µs, launches from CUDA graphs] (the partial's input)
        "all_kernels": {name: [k["count"], k["us"], k.get("graph_count", 0)] for name, k in kernels.items()},
        # the Triton kernels linked to an Inductor launch op with kernel args (kernel_sources)
        "kernel_sources": dict(sources or {}),
        "per_step": [dict(r, compiled_pct=_ratio(r.get("compiled_us"), r.get("step_us")),
                          compiled_gpu_pct=_ratio(r.get("compiled_gpu_us"), r.get("kernel_us")))
                     for r in rows],
    }


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span):
    from .linking import span_gpu_runtime

    return compilation(span.trace, span.found, gpu_runtime=span_gpu_runtime(span),
                       not_available=span.not_available)


def _unit_partial(report: dict) -> dict:
    sec = report.get(NAME)
    if not isinstance(sec, dict):  # an eager span: nothing to add to a group
        return {}
    span, worker = report.get("span"), report.get("worker")
    return {
        "rows:per_step": [dict(r, span=span, worker=worker) for r in sec.get("per_step") or []],
        "any:has_regions": bool(sec.get("has_regions")),
        "keyed:frames": {str(f.get("frame")): {"first:frame": f.get("frame"), "sum:regions": f.get("regions", 0),
                                               "sum:cpu_us": f.get("cpu_us", 0.0),
                                               "rows:compile_ids": list(f.get("compile_ids") or [])}
                         for f in sec.get("frames") or []},
        "keyed:broken": {b["id"]: {"first:frame": b.get("frame"), "sum:count": b.get("count", 0),
                                   "sum:nested": b.get("nested", 0)} for b in sec.get("broken_regions") or []},
        # what broke the graphs (one row per cause and source line; the first span's words)
        "keyed:break_causes": {c["key"]: {"first:cause": {k: v for k, v in c.items() if k in CAUSE_FIELDS},
                                          "sum:count": c.get("count", 0), "sum:us": c.get("us", 0.0),
                                          "rows:regions": list(c.get("regions") or [])}
                               for c in sec.get("break_causes") or [] if c.get("key")},
        "keyed:recompiles": {r["id"]: {"first:frame": r.get("frame"), "first:compile": r.get("compile"),
                                       "rows:first_step": [r.get("first_step")], "sum:regions": r.get("regions", 0),
                                       "any:compiled_in_step": bool(r.get("compiled_in_step"))}
                             for r in sec.get("recompile_ids") or []},
        # every Triton kernel of the span, not only the shown top (so a group's top is exact)
        "keyed:kernels": {k: {"sum:count": v[0], "sum:us": v[1], "sum:graph_count": v[2]}
                          for k, v in (sec.get("all_kernels") or {}).items()},
        # where each kernel's ops come from: the first span's (a name keeps its code in one job)
        "keyed:kernel_sources": {k: {"first:source": v} for k, v in (sec.get("kernel_sources") or {}).items()},
    }


def _unit_finish(m: dict) -> Optional[dict]:
    from .units import per_step_across_spans

    rows = m.get("rows:per_step") or []
    if not rows:
        return None
    frames = {k: {"frame": v.get("first:frame"), "regions": int(v.get("sum:regions") or 0),
                  "cpu_us": v.get("sum:cpu_us") or 0.0,
                  "compile_ids": sorted(set(v.get("rows:compile_ids") or []))}
              for k, v in (m.get("keyed:frames") or {}).items()}
    recompiles = {k: {"id": k, "frame": v.get("first:frame"), "compile": v.get("first:compile"),
                      "first_step": min(s for s in v.get("rows:first_step") or [0] if s is not None),
                      "regions": int(v.get("sum:regions") or 0),
                      "compiled_in_step": bool(v.get("any:compiled_in_step"))}
                  for k, v in (m.get("keyed:recompiles") or {}).items()}
    kernels = {k: {"count": int(v.get("sum:count") or 0), "us": v.get("sum:us") or 0.0,
                   "graph_count": int(v.get("sum:graph_count") or 0)}
               for k, v in (m.get("keyed:kernels") or {}).items()}
    broken = {k: {"id": k, "frame": v.get("first:frame"), "count": int(v.get("sum:count") or 0),
                  "nested": int(v.get("sum:nested") or 0)} for k, v in (m.get("keyed:broken") or {}).items()}
    sources = {k: v.get("first:source") for k, v in (m.get("keyed:kernel_sources") or {}).items()
               if isinstance(v.get("first:source"), dict)}
    causes = {k: dict(v.get("first:cause") or {}, count=int(v.get("sum:count") or 0), us=v.get("sum:us") or 0.0,
                      regions=sorted(set(v.get("rows:regions") or [])))
              for k, v in (m.get("keyed:break_causes") or {}).items() if isinstance(v.get("first:cause"), dict)}
    sec = _finish_from(rows, frames, recompiles, kernels, bool(m.get("any:has_regions")), broken, sources, causes)
    # one row per step number across spans (the mean over spans; min/max of compiled %)
    steps = per_step_across_spans(rows, PER_STEP_FIELDS, "compiled_pct")
    for r in steps:
        r["compiled_pct"] = _ratio(r.get("compiled_us"), r.get("step_us"))
        r["compiled_gpu_pct"] = _ratio(r.get("compiled_gpu_us"), r.get("kernel_us"))
    sec["per_step"] = steps
    return sec


# ---------------------------------------------------------------- card id, rule, scale (the card: judge/cards.py)

CARD = "compilation"
RULE = "torch_compile"  # the recommendation rule a Compilation card names (recommendations.py)
NOT_JUDGED_NO_REGIONS = ("not judged: no 'Torch-Compiled Region' markers, so graph breaks and recompiles "
                         "cannot be told")


def card_severity(sec: dict):
    """(severity, words) of the Compilation card from its section: "high" with steady-state
    recompiles per step >= COMPILE_RECOMPILES_PER_STEP, "medium" with fewer (any) or with graph
    breaks per step >= COMPILE_BREAKS_PER_STEP, else "ok"; "none" (not judged) without
    region markers."""
    if not sec.get("has_regions"):
        return "none", NOT_JUDGED_NO_REGIONS
    steady = sec.get("steady_recompiles") or 0
    breaks = sec.get("breaks_per_step")
    if steady > 0:
        ids = ", ".join(r["id"] for r in sec.get("recompile_ids") or [] if r.get("steady"))
        words = f"{steady} recompile{'s' if steady != 1 else ''} in the profiled steps ({ids})"
        per_step = steady / sec["steps"] if sec.get("steps") else None
        return ("high" if per_step is not None and per_step >= T.COMPILE_RECOMPILES_PER_STEP else "medium"), words
    if breaks is not None and breaks >= T.COMPILE_BREAKS_PER_STEP:
        return "medium", f"{breaks:g} graph break{'s' if breaks != 1 else ''} per step"
    return "ok", "ok"


# What to change for each kind of graph break break_causes names (rule torch_compile's action).
BREAK_FIXES = {
    "item": ("The break is a `.item()` (aten::_local_scalar_dense, a host-device sync on a GPU): keep the value a "
             "tensor (`torch.where(cond, a, b)` instead of a Python `if` on it), or let Dynamo trace it with "
             "`torch._dynamo.config.capture_scalar_outputs = True`."),
    "branch": ("The break is a Python `if` on a tensor's value (aten::is_nonzero): use `torch.where(cond, a, b)` or "
               "`torch.cond(pred, true_fn, false_fn, (x,))`."),
    "dynamic_shape": ("The break is an op whose output shape depends on the data (`torch.nonzero`, a boolean mask): "
                      "keep the shape static (`torch.where(mask, x, 0)`), or set "
                      "`torch._dynamo.config.capture_dynamic_output_shape_ops = True`."),
    "logging": ("The break is a logging call: move it out of the compiled function, or add the method to "
                "`torch._dynamo.config.ignore_logger_methods`."),
    "print": "The break is a `print`: move it out of the compiled function.",
    "tensor_method": ("The break is a Tensor method Dynamo does not trace (`.tolist()`, `.numpy()`, ...): move it out "
                      "of the compiled function or keep the value a tensor."),
    "none": ("No op ran at the break, so it is a Python-side call (a logging.Logger method, print, an unsupported "
             "builtin or library function); record with `with_stack=True` or run with `TORCH_LOGS=\"graph_breaks\"` "
             "to name it, and move it out of the compiled function (for a logger, "
             "`torch._dynamo.config.ignore_logger_methods`)."),
}


def break_cause_words(cause: dict) -> str:
    """A break's cause in a few words: what was called, the op, the source line."""
    what = cause.get("call") or cause.get("op")
    if cause.get("kind") == "none":
        what = "a Python-only call"
    elif cause.get("kind") == "python" and cause.get("python"):
        what = f"a Python call in {cause['python']}"
    elif cause.get("op") and cause.get("call") and cause["op"] not in cause["call"]:
        what = f"{cause['call']} ({cause['op']})"
    what = what or ("a host-device sync" if cause.get("kind") == "sync" else "an eager op")
    src = cause.get("source") or {}
    if src.get("file") and src.get("line") is not None:
        what += f", {src['file']}:{src['line']}" + (f" in {src['function']}" if src.get("function") else "")
    return what


def break_cause_evidence(cause: dict) -> str:
    """One evidence line per break cause, worded as torch._dynamo.explain reports it."""
    per = cause.get("per_step")
    line = (f"graph break at {break_cause_words(cause)}: {per:g}x per step" if isinstance(per, (int, float))
            else f"graph break at {break_cause_words(cause)}")
    if cause.get("regions"):
        line += f" in region(s) {', '.join(cause['regions'])}"
    ops = [o for o in cause.get("ops") or [] if o != cause.get("op")]
    if ops:
        line += f" (eager ops there: {', '.join(ops)})"
    if cause.get("sync"):
        line += "; the host waits for the GPU there"
    if cause.get("reason"):
        line += f'; torch._dynamo.explain: "{cause["reason"]}"'
    elif cause.get("explanation"):
        line += f"; {cause['explanation']}"
    src = cause.get("source")
    if not src:
        line += " (no Python stacks in the trace: record with `with_stack=True` to name the line)"
    elif not src.get("exact"):
        line += " (the line is where the function begins: the break is inside it)"
    return line


def _unit():
    from .units import HIGHER, LOWER, NONE_FAILED, Card, Metric, Unit

    card = Card(CARD, "Compilation",
                "Share of step time inside torch.compile'd regions and compiled backward graphs (CPU wall).",
                field=(NAME, "compiled_pct"), sublabel="torch.compile", optional=True, order=100,
                definition="torch.compile: CPU time inside 'Torch-Compiled Region' spans and CompiledFunctionBackward, "
                "share of step time. A graph break splits a compiled frame (the rest runs as a nested resume frame); a "
                "compile id above 0 is a recompile. Triton kernel names reveal the ATen ops Inductor fused.")
    metrics = (
        # CPU wall in compiled regions: no direction, since CUDA graph replays shrink it as they
        # speed the step up (h100_compiled -> h100_compiled_cuda_graphs: 62 % -> 33 %)
        Metric("compiled_pct", "Compiled share (CPU)", "%", None, headline_getter("compiled_pct"),
               ("compilation.compiled_pct", "compilation"), card=card, text=False, order=210),
        Metric("compiled_gpu_pct", "Compiled share (GPU)", "%", HIGHER, headline_getter("compiled_gpu_pct"),
               ("compilation.compiled_gpu_pct", "compilation"), text=False, order=220),
        Metric("graph_breaks_per_step", "Graph breaks per step", "", LOWER, headline_getter("breaks_per_step"),
               ("compilation.breaks_per_step", "compilation"), text=False, order=230),
        Metric("steady_recompiles_per_step", "Steady recompiles per step", "", LOWER,
               headline_getter("steady_recompiles_per_step"),
               ("compilation.recompiles", "compilation.breaks_per_step", "compilation"), text=False, order=240),
    )
    return Unit(NAME, _unit_compute, _unit_partial, _unit_finish, requires=("steps",), group=NONE_FAILED,
                metrics=metrics)


def _eager(rep) -> bool:
    """The report is of an eager run: its steps hold no compiled region, Inductor kernel or
    CUDA graph launch (NA_NO_MARKERS), so its compiled share, graph breaks and recompiles
    are 0, not unknown."""
    return (not isinstance(rep.get(NAME), dict)
            and (rep.get("not_available") or {}).get(NAME) == NA_NO_MARKERS
            and bool((rep.get("steps") or {}).get("count")))


def headline_getter(key: str):
    """A headline getter (§16): the section's ``key``, 0 for an eager run (_eager);
    ``steady_recompiles_per_step`` = steady_recompiles / the section's steps."""
    def get(rep):
        sec = rep.get(NAME)
        if not isinstance(sec, dict):
            if key == "compiled_gpu_pct" and not (rep.get("launch") or {}).get("kernels_per_step"):
                return None  # no kernels: no GPU time to share out
            return 0.0 if _eager(rep) else None
        if key == "steady_recompiles_per_step":
            n, steady = sec.get("steps"), sec.get("steady_recompiles")
            return steady / n if steady is not None and n else None
        return sec.get(key)
    return get


UNIT = _unit()
