"""What kind of run the trace is (metrics.md §9 "Context"), so that advice fits it.

``detect(trace) -> {"mode", "cuda_graphs", "cuda_graph_capture", "torch_compile",
"distributed", "world_size", "evidence": {...}}``

- **mode**: ``"training"`` when the host ran backward ops (``autograd::engine::
  evaluate_function: …``, ops whose name contains ``Backward``, ``aten::*_backward``)
  or optimizer ops (``Optimizer.step#…``, ``Optimizer.zero_grad#…``, ``optimizer.step``,
  the optimizers' ``aten::_foreach_*`` math and ``aten::_fused_adam(w)_``/``_fused_sgd_``);
  ``"inference"`` when it ran CPU ops but none of those; ``"unknown"`` when the trace has
  no CPU ops to tell (GPU-only traces). ``aten::_foreach_copy_`` alone is no optimizer:
  CUDA-graph trees copy a replayed graph's inputs with it in inference too
  (``evidence.foreach_copy_ops`` counts them). Only ops and user annotations count, not
  Python stack frames (a frame named after ``distributed_c10d.py`` is not an op).
- **cuda_graphs**: a ``cudaGraphLaunch``/``hipGraphLaunch`` (or driver ``cuGraphLaunch``)
  call; ``graph_kernels`` counts the kernels launched by one (same correlation).
  ``cuda_graph_capture``: the trace also records capture (``cudaStreamBeginCapture``,
  ``cudaGraphInstantiate`` and HIP twins).
- **torch_compile**: Triton kernels (name starting with ``triton_`` or containing
  ``triton_poi``/``triton_red``/``triton_per``/``triton_tem``), or CPU spans
  ``CompiledFunction``/``CompiledFunctionBackward``/``Torch-Compiled Region``.
- **distributed**: the trace's ``distributedInfo.world_size`` > 1; without it,
  communication kernels (§2) or ``nccl:``/``gloo:``/``rccl:``/``c10d::`` CPU ops.
"""
from __future__ import annotations

import re
from typing import Dict, Optional

import numpy as np

from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, TraceData
from .breakdown import COMM_CPU_PREFIXES, comm_kernel_mask
from .linking import gpu_runtime_index

class _Prefiltered:
    """A compiled regex behind a plain-text test that every string it matches passes (``in``,
    ``startswith``): its ``search`` is the regex's where the test passes, else None, the same
    answers. An unanchored alternative (``|Backward``) keeps ``re`` from its fast literal
    search: 2 ms per scan of the 292 MB benchmark's string table, several scans per span."""

    __slots__ = ("regex", "pattern", "_may_match")

    def __init__(self, regex, may_match):
        self.regex, self.pattern, self._may_match = regex, regex.pattern, may_match

    def search(self, s):
        return self.regex.search(s) if self._may_match(s) else None


BACKWARD_RE = _Prefiltered(re.compile(r"^autograd::engine::evaluate_function|Backward|^aten::\w*_backward"),
                           lambda s: "Backward" in s or s.startswith(("autograd::engine::evaluate_function", "aten::")))
# Optimizer ops: the optimizers' annotations, their multi-tensor (foreach) math and fused kernels.
# Not aten::_foreach_copy_: CUDA-graph trees copy a graph's static inputs with
# _foreach_copy_ before each replay, in inference as in training (issue 34 item 5).
OPTIMIZER_RE = re.compile(r"^Optimizer\.(step|zero_grad)#|^optimizer\.step|^Optimizer\.step"
                          r"|^aten::_foreach_(?!copy_?$)\w+|^aten::_fused_(adam|adamw|sgd|adagrad)\w*")
FOREACH_COPY_RE = re.compile(r"^aten::_foreach_copy_?$")
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch", "cuGraphLaunch",
                                "cuGraphLaunch_ptsz", "cudaGraphLaunch_ptsz"})
GRAPH_CAPTURE_CALLS = frozenset({"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                                 "cudaGraphInstantiateWithFlags", "hipStreamBeginCapture", "hipStreamEndCapture",
                                 "hipGraphInstantiate", "cuStreamBeginCapture", "cuGraphInstantiate",
                                 "cudaStreamBeginCapture_v10000", "cudaGraphInstantiate_v12000"})
def short_kernel_bound(cuda_graphs) -> str:
    """How short kernels and the gaps between them are classified: "latency" on a trace that
    replays CUDA/HIP graphs (``context.cuda_graphs``: its launches are replays, so it is
    latency-bound, not launch-bound), else "launch". One classification for the short-kernel
    card, rule small_kernels and the step timeline's idle causes (issue 34 item 12: the
    CUDA-graph demo run's cards said "latency-bound, not launch-bound" while its timeline
    shaded the gaps between its eager short kernels "launch-bound")."""
    return "latency" if cuda_graphs else "launch"


TRITON_RE = _Prefiltered(re.compile(r"^triton_|triton_(poi|red|per|tem)_"), lambda s: "triton_" in s)
COMPILED_REGION_RE = re.compile(r"^CompiledFunction(Backward)?$|^Torch-Compiled Region|^torch_compile|"
                                r"^TorchDynamo|^CompiledFxGraph")
DISTRIBUTED_CPU_RE = re.compile(r"^(" + "|".join(re.escape(p) for p in COMM_CPU_PREFIXES) + r")|^c10d::")


def _count(trace: TraceData, names: np.ndarray, pattern) -> int:
    ids = trace.string_ids(lambda s: pattern.search(s) is not None)
    return int(np.isin(names, ids).sum()) if len(ids) and len(names) else 0


def _world_size(trace: TraceData) -> Optional[int]:
    info = trace.meta.distributed_info
    ws = info.get("world_size") if isinstance(info, dict) else None
    if isinstance(ws, bool) or not isinstance(ws, (int, float)) or not np.isfinite(ws) or ws < 1:
        return None
    return int(min(ws, 1 << 31))


def detect(trace: TraceData, gpu_runtime: Optional[np.ndarray] = None) -> Dict:
    """The run's context (module docstring). ``gpu_runtime``: linking.gpu_runtime_index(trace)
    when the caller has it."""
    cpu = trace.cpu
    ops = (cpu.kind == CPU_OP) | (cpu.kind == CPU_USER_ANNOTATION)
    op_names = cpu.name[ops]
    backward = _count(trace, op_names, BACKWARD_RE)
    optimizer = _count(trace, op_names, OPTIMIZER_RE)
    foreach_copy = _count(trace, op_names, FOREACH_COPY_RE)
    if backward or optimizer:
        mode = "training"
    elif len(op_names):
        mode = "inference"
    else:
        mode = "unknown"

    rt = trace.runtime
    launch_ids = trace.string_ids(lambda s: s in GRAPH_LAUNCH_CALLS)
    is_launch = np.isin(rt.name, launch_ids) if len(launch_ids) else np.zeros(len(rt), bool)
    capture_ids = trace.string_ids(lambda s: s in GRAPH_CAPTURE_CALLS)
    captures = int(np.isin(rt.name, capture_ids).sum()) if len(capture_ids) else 0
    g = trace.gpu
    graph_kernels = 0
    if is_launch.any() and len(g):
        g_rt = gpu_runtime_index(trace) if gpu_runtime is None else gpu_runtime
        graph_kernels = int(((g.kind == GPU_KERNEL) & (g_rt >= 0) & is_launch[np.maximum(g_rt, 0)]).sum())

    kernel_names = g.name[g.kind == GPU_KERNEL]
    triton = _count(trace, kernel_names, TRITON_RE)
    compiled = _count(trace, op_names, COMPILED_REGION_RE)

    world = _world_size(trace)
    comm_kernels = int((comm_kernel_mask(trace) & (g.kind == GPU_KERNEL)).sum()) if len(g) else 0
    comm_ops = _count(trace, op_names, DISTRIBUTED_CPU_RE)
    distributed = world > 1 if world is not None else bool(comm_kernels or comm_ops)
    return {
        "mode": mode,
        "cuda_graphs": bool(is_launch.any()),
        "cuda_graph_capture": captures > 0,
        "torch_compile": bool(triton or compiled),
        "distributed": bool(distributed),
        "world_size": world,
        "evidence": {"backward_ops": backward, "optimizer_ops": optimizer, "foreach_copy_ops": foreach_copy,
                     "graph_launches": int(is_launch.sum()),
                     "graph_kernels": graph_kernels, "graph_capture_calls": captures, "triton_kernels": triton,
                     "compiled_regions": compiled, "communication_kernels": comm_kernels,
                     "communication_ops": comm_ops},
    }


def combine(contexts) -> Optional[Dict]:
    """The context of a worker or run summary from its spans' contexts: training if any
    span trained, else inference if any span ran inference; a flag is true if any span
    has it; evidence counts are summed."""
    parts = [c for c in contexts if isinstance(c, dict)]
    if not parts:
        return None
    modes = {c.get("mode") for c in parts}
    mode = "training" if "training" in modes else "inference" if "inference" in modes else "unknown"
    worlds = [c.get("world_size") for c in parts if isinstance(c.get("world_size"), int)]
    evidence: Dict[str, int] = {}
    for c in parts:
        for k, v in (c.get("evidence") or {}).items():
            if isinstance(v, (int, float)):
                evidence[k] = evidence.get(k, 0) + v
    return {"mode": mode, **{k: any(bool(c.get(k)) for c in parts)
                             for k in ("cuda_graphs", "cuda_graph_capture", "torch_compile", "distributed")},
            "world_size": max(worlds) if worlds else None, "evidence": evidence}


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span) -> Dict:
    from .linking import span_gpu_runtime

    return detect(span.trace, gpu_runtime=span_gpu_runtime(span))


def _unit():
    from .units import ALWAYS, Unit

    return Unit("context", _unit_compute, lambda report: {"rows:contexts": [report.get("context")]},
                lambda m: combine(m["rows:contexts"]), group=ALWAYS)


UNIT = _unit()
