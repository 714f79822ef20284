"""Kernels replayed from CUDA graphs, matched to the launches of their capture (METRICS.md §15
"CUDA graph replays"; issue 34 item 2).

A kernel replayed by ``cudaGraphLaunch`` carries the graph launch's correlation id: no op with
shapes launched it, so its FLOPs, module and source line are unknown. When the trace also
records the capture (``cudaStreamBeginCapture`` … ``cudaStreamEndCapture`` on one thread: the
ops run once with their shapes, and their launch calls put kernels in the graph instead of on
the GPU), the i-th kernel launch of the capture is the i-th kernel of each replay of that
graph (a graph replays its kernels in capture order on one stream). A replay is matched to a
capture with as many kernel launches: the latest one that ended before it on the same process,
else any; once a capture's first replay names its kernels, a later replay must have the same
names in the same order. Unmatched replays stay unattributed (their FLOPs are not counted and
the reason says how to record the capture).

A summary of the spans of one worker pairs a span's unmatched replays with a capture
recorded in another span of that worker (``pair_across_spans``, over what each span's FLOPs
section describes; the traces are not read again).

Public API: ``replays(trace, gpu_runtime) -> dict | None``, ``names_key(names)``,
``pair_across_spans(captures, replays)``.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..trace.model import GPU_KERNEL, TraceData

GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch", "cuGraphLaunch",
                                "cuGraphLaunch_ptsz", "cudaGraphLaunch_ptsz"})
BEGIN_CAPTURE = ("cudaStreamBeginCapture", "hipStreamBeginCapture", "cuStreamBeginCapture")
END_CAPTURE = ("cudaStreamEndCapture", "hipStreamEndCapture", "cuStreamEndCapture")
# kernel launch calls (runtime and driver API; analysis/signals.LAUNCH_CALLS)
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel",
})

HOW_TO_RECORD = ("record the capture: start the profiler before the first call that captures the graphs "
                 "(torch.compile(mode=\"reduce-overhead\") captures on the 2nd call of each shape, "
                 "torch.cuda.graph(g) where it is entered), e.g. warm up inside the profiled steps "
                 "(torch.profiler.schedule(wait=0, warmup=0, active=N) from the first step) with "
                 "record_shapes=True")


def names_key(names) -> str:
    """A short key of a replayed graph's kernel-name sequence, the same in every trace file (the
    string ids are per file): pairs a replay with a capture recorded in another span."""
    return hashlib.blake2b("\x00".join(names).encode("utf-8", "replace"), digest_size=8).hexdigest()


def pair_across_spans(captures: List[dict], replays: List[dict]) -> List[Tuple[dict, dict]]:
    """(replay group, capture) pairs of a worker or run summary (METRICS.md §15): a span's
    unmatched replays (rows of ``flops.graph_replays.unmatched``) with a capture recorded in
    ANOTHER span of the SAME worker (rows of ``recorded_captures``; both tagged with their
    ``worker`` and ``span``), with as many kernels, whose kernel names (when a replay in its own
    span named them) are the replay's. As in one file: the capture's names are set by its first
    replay; among those that fit, the latest that ended before the replay, else the first.
    Rows without a worker pair with nothing."""
    out: List[Tuple[dict, dict]] = []
    named: Dict[int, str] = {}  # capture (by id) -> the names_key its first pairing gave it
    for g in sorted(replays, key=lambda r: r.get("first_ts") or 0.0):
        if g.get("worker") is None:
            continue

        def names(c):
            return c.get("names_key") or named.get(id(c))

        fits = [c for c in captures if c.get("worker") == g["worker"] and c.get("span") != g.get("span")
                and c.get("kernels") == g.get("kernels") and names(c) in (None, g.get("names_key"))]
        if not fits:
            continue
        same = [c for c in fits if names(c) == g.get("names_key")]
        pool = same or fits
        before = [c for c in pool if (c.get("end_ts") or 0.0) <= (g.get("first_ts") or 0.0)]
        pick = max(before, key=lambda c: c.get("end_ts") or 0.0) if before else pool[0]
        named.setdefault(id(pick), g.get("names_key"))
        out.append((g, pick))
    return out


def _names_mask(trace: TraceData, test) -> np.ndarray:
    ids = trace.string_ids(test)
    return np.isin(trace.runtime.name, ids) if len(ids) else np.zeros(len(trace.runtime), bool)


def replays(trace: TraceData, gpu_runtime: np.ndarray) -> Optional[Dict[str, np.ndarray]]:
    """The graph-replayed kernels of the trace and their capture-time launch calls; None when no
    kernel was replayed from a graph. Keys: ``kernels`` (GPU rows, by replay then start),
    ``replay`` (each one's graph launch call, a row of trace.runtime), ``capture_call`` (the
    launch call of the capture it came from; -1 when no recorded capture matches), ``captures``
    (how many captures the trace records), ``capture_calls`` (every capture launch call),
    ``capture_list``/``capture_end`` (each capture's launch calls in order, its end),
    ``capture_names`` (capture index -> the kernel name ids of its first matched replay)."""
    gpu, rt = trace.gpu, trace.runtime
    if not len(gpu) or not len(rt):
        return None
    is_graph = _names_mask(trace, lambda s: s in GRAPH_LAUNCH_CALLS)
    if not is_graph.any():
        return None
    linked = (gpu.kind == GPU_KERNEL) & (gpu_runtime >= 0)
    kernels = np.flatnonzero(linked)
    kernels = kernels[is_graph[gpu_runtime[kernels]]]
    if not len(kernels):
        return None
    replay = gpu_runtime[kernels]
    order = np.lexsort((kernels, gpu.ts[kernels], replay))
    kernels, replay = kernels[order], replay[order]
    capture_call = np.full(len(kernels), -1, np.int64)

    # captures: BeginCapture .. the next EndCapture on the same thread; their kernel launch calls
    # that put no kernel on the GPU, in call order
    begin = np.flatnonzero(_names_mask(trace, lambda s: s.startswith(BEGIN_CAPTURE)))
    end = np.flatnonzero(_names_mask(trace, lambda s: s.startswith(END_CAPTURE)))
    ran = np.zeros(len(rt), bool)
    ran[gpu_runtime[gpu_runtime >= 0]] = True
    launch = np.flatnonzero(_names_mask(trace, lambda s: s in LAUNCH_CALLS) & ~ran)
    captures = []  # (pid, end ts, launch call rows)
    for b in begin[np.argsort(rt.ts[begin], kind="stable")].tolist():
        same = end[(rt.pid[end] == rt.pid[b]) & (rt.tid[end] == rt.tid[b]) & (rt.ts[end] >= rt.ts[b])]
        if not len(same):
            continue
        e = int(same[np.argmin(rt.ts[same])])
        inside = launch[(rt.pid[launch] == rt.pid[b]) & (rt.tid[launch] == rt.tid[b])
                        & (rt.ts[launch] > rt.ts[b]) & (rt.ts[launch] < rt.ts[e])]
        if len(inside):
            captures.append((int(rt.pid[b]), float(rt.ts[e]), inside[np.argsort(rt.ts[inside], kind="stable")]))
    all_calls = np.concatenate([c[2] for c in captures]) if captures else np.zeros(0, np.int64)
    out = {"kernels": kernels, "replay": replay, "capture_call": capture_call, "captures": len(captures),
           "capture_calls": all_calls, "capture_list": [c[2] for c in captures],
           "capture_end": [c[1] for c in captures], "capture_names": {}}
    if not captures:
        return out
    names: Dict[int, np.ndarray] = out["capture_names"]  # capture index -> kernel name ids of its first replay
    starts = np.flatnonzero(np.r_[True, replay[1:] != replay[:-1]])
    bounds = np.r_[starts, len(replay)]
    for i0, i1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        r = int(replay[i0])
        n = i1 - i0
        fits = [j for j, c in enumerate(captures) if len(c[2]) == n]
        if not fits:
            continue
        before = [j for j in fits if captures[j][0] == int(rt.pid[r]) and captures[j][1] <= rt.ts[r]]
        j = max(before, key=lambda j: captures[j][1]) if before else fits[0]
        seq = gpu.name[kernels[i0:i1]]
        if j in names and not np.array_equal(names[j], seq):
            continue
        names.setdefault(j, seq)
        capture_call[i0:i1] = captures[j][2]
    return out
