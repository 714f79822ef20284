"""The step model (METRICS.md §19): one dependency graph of the profiled steps, its critical
path, and what-if transformations re-simulated on it, so that every fix is priced in
milliseconds on the same scale.

The graph (built vectorised from the loaded columns):

- **host nodes**: the runtime/driver calls of the included steps of every host thread of the
  process, as one serial host timeline in start order (the threads that launch take turns:
  the main thread waits in ``backward()`` while the autograd thread launches), plus a
  zero-length marker at each step start and one at the end of the last step. Between two
  nodes, the host's own time (``gap``): split into DataLoader wait (``__next__`` spans),
  compile (Dynamo/Inductor spans) and host compute (the rest: Python, operators, the
  profiler's own cost). A node's ``busy`` time is the part of the call not inside an
  earlier call.
- **GPU nodes**: kernels, memcpys and memsets, each after the call that launched it
  (correlation id; an activity with no launching call hangs on the host node before it),
  in FIFO order on its stream.
- **edges**: host node → next host node; launch → activity (the activity starts no earlier
  than the call start + its launch latency); stream predecessor → activity (no earlier than
  its end + the stream's dispatch gap); every GPU activity launched before a blocking
  synchronisation (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
  ``cudaEventSynchronize``, a blocking ``cudaMemcpy`` DtoH) → that call's end.

Simulation: list scheduling over the graph with every duration fixed (host times as
recorded; a sync ends at max(its start + its own cost, the end of the GPU work before it)),
vectorised between syncs (a stream's ends are a running maximum). The unmodified graph
reproduces the trace's step times (``model_error_pct``); a what-if changes durations or
edges and is simulated the same way; its saving is the difference of the two simulated
times, so every saving is on the same scale.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from .. import thresholds as T
from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, TraceData
from . import intervals as iv
from .factorize import unique_columns, unique_rows

NAME = "step_model"
# Compute capability of Ampere, the first NVIDIA generation with bf16 Tensor Cores (a fact)
AMPERE_MAJOR = 8

# host node kinds
H_MARKER, H_LAUNCH, H_COPY, H_SYNC, H_GRAPH, H_OTHER = 0, 1, 2, 3, 4, 5
# GPU node classes
C_GEMM, C_CONV, C_ATTN, C_ELEM, C_OTHER, C_COMM, C_H2D, C_D2H, C_D2D, C_MEMSET, C_TRITON = range(11)
CLASS_NAMES = ("gemm", "conv", "attention", "elementwise", "other_kernels", "communication", "h2d", "d2h", "d2d",
               "memset", "compiled_kernels")
MEMORY_BOUND = (C_ELEM, C_OTHER)  # eager kernels a compiler can fuse
# Kernels that reduce (a fused kernel ends with one: Inductor fuses the pointwise work before
# a reduction into it, and starts a new kernel after it)
REDUCTION_RE = re.compile(r"(?i)reduce|softmax|norm|welford|cross_entropy|nll_loss|argmax|topk|scan|cumsum")
# GEMM kernels instantiated for operands not aligned to 16 bytes (a dimension not a multiple
# of 8 in 16-bit types): CUTLASS names say `align1`/`align2`. Inductor pads such matmuls
# (torch._inductor.config.shape_padding) so they run at the speed of the aligned ones.
MISALIGNED_RE = re.compile(r"_align[12](?:\b|_|>|$)")
# Compile-time work inside the steps, beyond the Dynamo/Inductor spans the Compilation section
# counts (compilation.COMPILE_NAMES): every `(dynamo_timed)` phase, Triton autotuning at a
# new graph's first call, loading compiled code from the caches.
COMPILE_WORK_RE = re.compile(r"\(dynamo_timed\)$|^CachingAutotuner\.|^PyCodeCache\.|^AOTAutogradCache\.|"
                             r"^FxGraphCache\.|^async_compile\.|^StaticAutotunerFuture\.")

# the critical path's composition keys (METRICS.md §19)
HOST_PARTS = ("input_wait", "compile", "host_compute", "launch_overhead", "sync_overhead", "runtime_other")
GPU_PARTS = tuple(f"gpu_{c}" for c in CLASS_NAMES) + ("gpu_launch_latency",)
PARTS = HOST_PARTS + GPU_PARTS

# Syncs that wait for every stream of the device (the others wait for one stream or event).
DEVICE_SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize"})
COPY_CALLS = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy", "cudaMemset", "hipMemcpyAsync",
                        "hipMemsetAsync", "hipMemcpy", "hipMemset", "cuMemcpyAsync", "cuMemsetD8Async",
                        "cudaMemcpy2DAsync", "hipMemcpyWithStream", "hipMemsetD32Async", "hipMemsetD8Async"})


@dataclass
class Graph:
    """The step graph of one span (module docstring). Host arrays are in host order; GPU
    arrays in launch order (host node, then start)."""

    gap: np.ndarray          # host time before the node (µs)
    gap_input: np.ndarray    # part of gap inside DataLoader spans
    gap_compile: np.ndarray  # part of gap inside compile spans
    busy: np.ndarray         # the call's own host time (µs); a sync's: its cost without the wait
    kind: np.ndarray         # H_* codes
    sync_stream: np.ndarray  # per sync node: the stream it waits for (-1: every stream)
    eager_between: np.ndarray  # host node in an eager region between compiled graphs of a step
    compiled: np.ndarray     # host node inside a compiled region
    compiling: np.ndarray    # host node inside compile-time work (its GPU work: autotuning)
    markers: np.ndarray      # host index of each included step's start marker, then the end marker
    g_launch: np.ndarray     # host node that launched the activity
    g_lat: np.ndarray        # launch latency: start - launching call's start, when not queued
    g_gap: np.ndarray        # dispatch gap after the stream predecessor (µs)
    g_dur: np.ndarray
    g_stream: np.ndarray     # dense stream ids (device, stream)
    g_cls: np.ndarray        # C_* codes
    g_row: np.ndarray        # row in trace.gpu
    g_ts: np.ndarray         # the activity's recorded start
    g_flops: np.ndarray
    g_bytes: np.ndarray
    g_prec: np.ndarray       # precision code of the op that launched it: index into `precisions` (0: "" unknown)
    g_reduction: np.ndarray  # a reduction kernel (ends a fusion group)
    g_tc: np.ndarray         # a Tensor Core kernel (by name)
    g_misaligned: np.ndarray  # a GEMM kernel built for unaligned operands (CUTLASS alignN, N < 8 / 4)
    g_pageable: np.ndarray   # a copy from pageable host memory ("Memcpy HtoD (Pageable -> Device)")
    step_us: np.ndarray      # measured (stretched) duration of each included step
    recorded_us: float       # the graph's span as recorded: first step start to its last end (host or GPU)
    step_numbers: np.ndarray
    precisions: tuple        # the names of g_prec's codes ("" first)
    launch_us: float         # median host cost of one kernel launch in this trace
    queued_latency_us: float  # launch latency used for a kernel that was queued in the trace

    @property
    def n_steps(self) -> int:
        return len(self.step_us)


# ---------------------------------------------------------------- building the graph

def _name_mask(trace: TraceData, names: np.ndarray, pred) -> np.ndarray:
    """``pred(name)`` per row of a name column (string ids; -1: none), evaluated once per
    distinct name in the column (a kernel column holds tens of names, the string table
    hundreds to thousands of strings)."""
    return _name_masks(trace, names)(pred)


def _name_masks(trace: TraceData, names: np.ndarray):
    """``lambda pred: _name_mask(trace, names, pred)``, the column's string ids and its
    distinct names found once (the graph asks several questions of each column)."""
    n_s = len(trace.strings)
    if not len(names):
        return lambda pred: np.zeros(0, bool)
    col = np.where((names >= 0) & (names < n_s), names, n_s)
    present = np.zeros(n_s + 1, bool)
    present[col] = True
    ids = np.flatnonzero(present[:n_s]).tolist()
    del present

    def mask(pred) -> np.ndarray:
        table = np.zeros(n_s + 1, bool)
        for i in ids:
            table[i] = bool(pred(trace.strings[i]))
        return table[col]
    return mask


def _codes(col: np.ndarray, codes) -> np.ndarray:
    """``np.isin`` for a few small codes (the H_*/C_* codes, CPU kinds: 0-15): one comparison
    per code (a lookup table indexed by an int8 column converts it to intp first: 20x slower)."""
    out = None
    for c in codes:
        out = col == c if out is None else np.logical_or(out, col == c, out=out)
    return out if out is not None else np.zeros(len(col), bool)


def _cpu_intervals(trace: TraceData, pred, kinds=(CPU_OP, CPU_USER_ANNOTATION), names=None) -> iv.Intervals:
    """``names``: ``_name_masks(trace, trace.cpu.name)`` when the caller has it."""
    cpu = trace.cpu
    m = (names or _name_masks(trace, cpu.name))(pred)
    m &= _codes(cpu.kind, kinds)
    return iv.merge(cpu.ts[m], cpu.ts[m] + cpu.dur[m])


def build_graph(trace: TraceData, steps, gpu_runtime: np.ndarray, per_kernel: Optional[dict] = None,
                not_available: Optional[Dict[str, str]] = None) -> Optional[Graph]:
    """The span's graph (module docstring); None (with the reason) without steps or GPU work."""
    from .breakdown import comm_kernel_mask, is_dataloader_name
    from .compilation import COMPILE_NAMES, kernel_family
    from .context import COMPILED_REGION_RE, GRAPH_LAUNCH_CALLS, TRITON_RE
    from .signals import LAUNCH_CALLS, sync_rows
    from .tensor_cores import tensor_core_kernel_mask

    na = {} if not_available is None else not_available
    if steps is None or steps.count == 0:
        na[NAME] = "no included step"
        return None
    g, rt = trace.gpu, trace.runtime
    if not len(g) or not len(rt):
        na[NAME] = ("no GPU activity and runtime calls in this trace: the step model links launches to GPU work"
                    if len(rt) or len(g) else "no GPU activity in this trace (CPU-only): nothing to model")
        return None
    hs, he = steps.inc_host_start, steps.inc_host_end
    order = np.argsort(hs, kind="stable")
    hs, he = hs[order], he[order]
    step_us = (steps.inc_end - steps.inc_start)[order].astype(float)
    # runtime calls inside an included step's host span
    j = np.searchsorted(hs, rt.ts, side="right") - 1
    inside = (j >= 0) & (rt.ts < he[np.maximum(j, 0)])
    rows = np.flatnonzero(inside)
    if not len(rows):
        na[NAME] = "no runtime call inside the included steps"
        return None
    # host nodes: step markers + calls (+ the end marker), in start order (markers first on ties)
    n_m = len(hs)
    # markers first, so that a stable sort puts them before a call that starts at the same time
    ts = np.concatenate([hs, [he[-1]], rt.ts[rows]])
    dur = np.concatenate([np.zeros(n_m + 1), np.nan_to_num(rt.dur[rows])])
    src = np.concatenate([np.full(n_m + 1, -1), rows]).astype(np.int64)
    is_marker = np.concatenate([np.ones(n_m + 1, bool), np.zeros(len(rows), bool)])
    horder = np.argsort(ts, kind="stable")
    ts, dur, src, is_marker = ts[horder], dur[horder], src[horder], is_marker[horder]
    markers = np.flatnonzero(is_marker)
    # serial host time: the part of a call already inside an earlier one is not counted twice
    end = ts + dur
    prev_end = np.concatenate([[ts[0]], np.maximum.accumulate(end)[:-1]])
    prev_end = np.maximum(prev_end, np.concatenate([[ts[0]], ts[:-1]]))
    gap = np.maximum(ts - prev_end, 0.0)
    busy = np.maximum(end - np.maximum(ts, prev_end), 0.0)
    gap_lo = ts - gap
    cpu_names = _name_masks(trace, trace.cpu.name)
    dl = _cpu_intervals(trace, is_dataloader_name, names=cpu_names)
    comp = _cpu_intervals(trace, lambda s: s in COMPILE_NAMES or COMPILE_WORK_RE.search(s) is not None,
                          names=cpu_names)
    gap_input = np.minimum(iv.covered_in(dl, gap_lo, ts), gap) if len(dl[0]) else np.zeros(len(ts))
    gap_compile = np.minimum(iv.covered_in(comp, gap_lo, ts), gap - gap_input) if len(comp[0]) else np.zeros(len(ts))
    compiling = (iv.covered_in(comp, ts, ts + np.maximum(dur, 1e-3)) > 0) if len(comp[0]) else np.zeros(len(ts), bool)
    # kinds
    n_h = len(ts)
    kind = np.full(n_h, H_OTHER, np.int8)
    kind[is_marker] = H_MARKER
    call = src >= 0
    names = np.full(n_h, -1, np.int64)
    names[call] = rt.name[src[call]]
    host_names = _name_masks(trace, names)
    kind[call & host_names(lambda s: s in LAUNCH_CALLS)] = H_LAUNCH
    kind[call & host_names(lambda s: s in COPY_CALLS)] = H_COPY
    kind[call & host_names(lambda s: s in GRAPH_LAUNCH_CALLS)] = H_GRAPH
    del host_names
    sync_of_rt = np.zeros(len(rt), bool)
    sync_of_rt[sync_rows(trace, gpu_runtime)] = True
    kind[call & sync_of_rt[np.maximum(src, 0)]] = H_SYNC
    # compiled regions: host nodes inside them; eager between two compiled graphs of a step
    compiled_iv = _cpu_intervals(trace, lambda s: COMPILED_REGION_RE.search(s) is not None, names=cpu_names)
    del cpu_names
    compiled = np.zeros(n_h, bool)
    eager_between = np.zeros(n_h, bool)
    if len(compiled_iv[0]):
        compiled = iv.covered_in(compiled_iv, ts, ts + np.maximum(dur, 1e-3)) > 0
        step_of = np.maximum(np.searchsorted(ts[markers], ts, side="right") - 1, 0)
        first = np.full(len(markers), np.inf)
        last = np.full(len(markers), -np.inf)
        np.minimum.at(first, step_of[compiled], ts[compiled])
        np.maximum.at(last, step_of[compiled], ts[compiled])
        eager_between = ~compiled & ~is_marker & (ts > first[step_of]) & (ts < last[step_of])

    # GPU nodes: linked to a host node, or hung on the host node before them
    host_of_rt = np.full(len(rt), -1, np.int64)
    host_of_rt[src[call]] = np.flatnonzero(call)
    glink = np.where(gpu_runtime >= 0, host_of_rt[np.maximum(gpu_runtime, 0)], -1)
    lo_w, hi_w = float(steps.inc_start.min()), float(steps.inc_end.max())
    unlinked = (gpu_runtime < 0) & (g.ts >= lo_w) & (g.ts < hi_w)
    if unlinked.any():
        glink[unlinked] = np.maximum(np.searchsorted(ts, g.ts[unlinked], side="right") - 1, 0)
    grows = np.flatnonzero(glink >= 0)
    by_ts = np.argsort(g.ts[grows], kind="stable")  # (launch node, start): two stable sorts
    gorder = by_ts[np.argsort(glink[grows][by_ts], kind="stable")]
    grows = grows[gorder]
    g_launch = glink[grows]
    g_ts, g_dur = g.ts[grows], np.nan_to_num(g.dur[grows])
    g_stream = (unique_columns(g.device[grows].astype(np.int64), g.stream[grows])[1]
                if len(grows) else np.zeros(0, np.int64))
    g_stream = np.asarray(g_stream, np.int64).reshape(-1)
    # stream order = launch order (FIFO); predecessor's end
    sorder = _by_stream_then_start(g_stream, g_ts)
    prev_end = np.full(len(grows), -np.inf)
    if len(grows):
        s_sorted = g_stream[sorder]
        e_sorted = (g_ts + g_dur)[sorder]
        same = np.concatenate([[False], s_sorted[1:] == s_sorted[:-1]])
        pe = np.concatenate([[-np.inf], e_sorted[:-1]])
        prev_end[sorder] = np.where(same, pe, -np.inf)
    launch_ts = ts[g_launch]
    # queued: launched before its stream predecessor ended, so the predecessor's end (plus the
    # recorded dispatch gap) set its start; else its launch did (plus the recorded latency)
    queued = np.isfinite(prev_end) & (launch_ts < prev_end)
    lat_obs = np.maximum(g_ts - launch_ts, 0.0)
    free_lat = lat_obs[~queued & (kind[g_launch] == H_LAUNCH)]
    queued_latency = float(np.median(free_lat)) if len(free_lat) else T.STEP_MODEL_LAUNCH_LATENCY_US
    queued_latency = min(queued_latency, T.STEP_MODEL_LAUNCH_LATENCY_US)
    g_lat = np.where(queued, np.minimum(lat_obs, queued_latency), lat_obs)
    g_gap = np.where(queued, np.maximum(g_ts - prev_end, 0.0), 0.0)
    launches = busy[kind == H_LAUNCH]
    launch_us = float(np.median(launches)) if len(launches) else T.STEP_MODEL_LAUNCH_US

    # classes
    g_cls = np.full(len(grows), C_OTHER, np.int8)
    gk = g.kind[grows]
    gname = g.name[grows]
    flops = np.zeros(len(grows))
    nbytes = np.zeros(len(grows))
    prec_code = np.zeros(len(grows), np.int8)  # index into prec_names; 0: unknown
    prec_names = ("",)
    pk = per_kernel or {}
    if len(pk.get("cls", ())) == len(g):
        from .flops import CLASSES

        code = {"gemm": C_GEMM, "conv": C_CONV, "attention": C_ATTN, "elementwise": C_ELEM, "other": C_OTHER}
        table = np.array([code[c] for c in CLASSES], np.int8)
        g_cls[:] = table[pk["cls"][grows]]
        flops, nbytes = pk["flops"][grows], pk["bytes"][grows]
        prec_names = ("",) + tuple(pk["precisions"])
        prec_code = (pk["precision_code"][grows] + 1).astype(np.int8)
    is_k = gk == GPU_KERNEL
    gpu_names = _name_masks(trace, gname)
    fam_gemm = gpu_names(lambda s: kernel_family(s) == "gemm")
    fam_attn = gpu_names(lambda s: kernel_family(s) == "attention")
    g_cls[is_k & fam_gemm & (g_cls == C_OTHER)] = C_GEMM
    g_cls[is_k & fam_attn & _codes(g_cls, (C_OTHER, C_ELEM))] = C_ATTN
    g_cls[is_k & gpu_names(lambda s: TRITON_RE.search(s) is not None)] = C_TRITON
    g_cls[comm_kernel_mask(trace)[grows]] = C_COMM
    memcpy = gk == GPU_MEMCPY
    g_cls[memcpy] = C_D2D
    g_cls[memcpy & gpu_names(lambda s: "HtoD" in s)] = C_H2D
    g_cls[memcpy & gpu_names(lambda s: "DtoH" in s)] = C_D2H
    g_cls[gk == GPU_MEMSET] = C_MEMSET

    # which stream each sync waits for: a device sync all of them (-1); a stream or event
    # sync, a blocking copy, the stream whose work (launched before it) ended closest before
    # the call returned, else (it did not wait) the stream of the last launch before it
    sync = kind == H_SYNC
    sync_nodes = np.flatnonzero(sync)
    sync_stream = np.full(n_h, -1, np.int64)
    done = np.full(n_h, -np.inf)
    if len(grows) and len(sync_nodes):
        k = np.searchsorted(g_launch, sync_nodes, side="right") - 1  # the last GPU node launched by then
        ends = g_ts + g_dur
        n_str = int(g_stream.max()) + 1
        per_stream = np.full((len(sync_nodes), n_str), -np.inf)
        for sid in range(n_str):  # a few streams: a running maximum of each one's ends
            own = np.where(g_stream == sid, ends, -np.inf)
            run = np.maximum.accumulate(own)
            per_stream[:, sid] = np.where(k >= 0, run[np.maximum(k, 0)], -np.inf)
        s_end = end[sync_nodes]
        waited = np.where(per_stream <= s_end[:, None] + T.STEP_MODEL_QUEUED_GAP_US, per_stream, -np.inf)
        best = np.argmax(waited, axis=1)
        best_end = waited[np.arange(len(sync_nodes)), best]
        did_wait = best_end > ts[sync_nodes]
        last_stream = np.where(k >= 0, g_stream[np.maximum(k, 0)], -1)
        device_wide = _name_mask(trace, names[sync_nodes], lambda s: s in DEVICE_SYNC_CALLS)
        sync_stream[sync_nodes] = np.where(device_wide, -1, np.where(did_wait, best, last_stream))
        all_done = per_stream.max(axis=1)
        done[sync_nodes] = np.where(device_wide, all_done, np.where(did_wait, best_end, -np.inf))
    # a sync's own cost: the part of its call after the GPU work it waited for ended (the call
    # returns that long after the wait; all of it when it did not wait)
    tail = np.maximum(end - np.maximum(ts, done), 0.0)
    busy = np.where(sync, np.minimum(busy, tail), busy)
    return Graph(gap=gap, gap_input=gap_input, gap_compile=gap_compile, busy=busy, kind=kind, sync_stream=sync_stream,
                 eager_between=eager_between, compiled=compiled, compiling=compiling & ~is_marker, markers=markers, g_launch=g_launch, g_lat=g_lat,
                 g_gap=g_gap, g_dur=g_dur, g_stream=g_stream, g_cls=g_cls, g_row=grows, g_ts=g_ts, g_flops=flops,
                 g_bytes=nbytes, g_prec=prec_code, precisions=prec_names, g_reduction=is_k & gpu_names(lambda s: REDUCTION_RE.search(s) is not None),
                 g_tc=tensor_core_kernel_mask(trace)[grows],
                 g_pageable=memcpy & gpu_names(lambda s: "HtoD" in s and "Pageable" in s),
                 g_misaligned=is_k & (g_cls == C_GEMM) & gpu_names(lambda s: MISALIGNED_RE.search(s)
                                                                   is not None),
                 step_us=step_us, step_numbers=steps.inc_numbers[order], launch_us=launch_us,
                 recorded_us=float(max(ts[markers[-1]], float(np.max(g_ts + g_dur, initial=-np.inf))) - ts[markers[0]]),
                 queued_latency_us=queued_latency)


# ---------------------------------------------------------------- simulation

@dataclass
class Sim:
    host_start: np.ndarray
    host_end: np.ndarray
    g_start: np.ndarray
    g_end: np.ndarray
    waited: np.ndarray       # per host node: the GPU node whose end ended a GPU-bound sync, else -1
    total_us: float
    per_step_us: np.ndarray


def _by_stream_then_start(stream: np.ndarray, start: np.ndarray) -> np.ndarray:
    """GPU nodes by stream, then by recorded start: the order a stream ran them in (FIFO;
    the launch order can differ when several threads launch onto one stream)."""
    by_start = np.argsort(start, kind="stable")
    return by_start[np.argsort(stream[by_start], kind="stable")]


def _stream_order(gr: Graph, g_stream: np.ndarray) -> np.ndarray:
    """GPU nodes by stream, in the order each ran them (the graph's own streams: computed once)."""
    if g_stream is gr.g_stream:
        so = gr.__dict__.get("_stream_order")
        if so is None:
            so = gr.__dict__["_stream_order"] = _by_stream_then_start(g_stream, gr.g_ts)
        return so
    return _by_stream_then_start(g_stream, gr.g_ts)


def _stream_blocks(gr: Graph, g_stream: np.ndarray):
    """(stream order, first and end position of each stream's block, launching host node in
    that order); the graph's own streams: computed once."""
    own = g_stream is gr.g_stream
    if own and "_stream_blocks" in gr.__dict__:
        return gr.__dict__["_stream_blocks"]
    n_g = len(g_stream)
    so = _stream_order(gr, g_stream)
    s_sorted = g_stream[so]
    s_first = np.flatnonzero(np.concatenate([[True], s_sorted[1:] != s_sorted[:-1]])) if n_g \
        else np.zeros(0, np.int64)
    out = (so, s_first, np.append(s_first[1:], n_g), gr.g_launch[so])
    if own:
        gr.__dict__["_stream_blocks"] = out
    return out


def simulate(gr: Graph, gap=None, busy=None, is_sync=None, g_lat=None, g_gap=None, g_dur=None,
             g_stream=None) -> Sim:
    """List-schedule the graph with the given durations (module docstring); any argument
    left None is the graph's own. A GPU node with ``g_lat`` = -inf is removed (it delays
    nothing).

    Between two syncs nothing waits, so the host's starts are a running sum shifted by one
    offset per segment, and a stream's ends a running maximum: with C the cumulative
    (gap + duration) along the stream, end_j = C_j + max(E0 - C_before, offset + max_{k<=j}
    (ready0_k + dur_k - C_k)) where ready0 is the ready time without the offset. One loop
    iteration per sync and stream, each a few operations on array views."""
    gap = gr.gap if gap is None else gap
    busy = gr.busy if busy is None else busy
    is_sync = (gr.kind == H_SYNC) if is_sync is None else is_sync
    g_lat = gr.g_lat if g_lat is None else g_lat
    g_gap = gr.g_gap if g_gap is None else g_gap
    g_dur = gr.g_dur if g_dur is None else g_dur
    g_stream = gr.g_stream if g_stream is None else g_stream
    n_h, n_g = len(gap), len(g_dur)
    # host starts without waits; a segment adds its offset
    cs = np.cumsum(gap + busy)
    start0 = cs - busy
    # GPU nodes in stream order (launch order within a stream), per stream a block
    so, s_first, s_last, launch_sorted = _stream_blocks(gr, g_stream)
    streams = s_first
    one = len(s_first) == 1  # one stream: stream order is launch order, no gathers
    step = g_gap + g_dur if one else (g_gap + g_dur)[so]
    c_incl = np.cumsum(step)
    if not one:  # the cumulative restarts per stream: subtract the stream's sum before its block
        c_incl -= np.repeat((c_incl - step)[s_first], s_last - s_first) if n_g else 0.0
    x0 = start0[launch_sorted]
    x0 += (g_lat + g_dur - c_incl) if one else (g_lat[so] + g_dur[so] - c_incl)  # ready0 + dur - C
    # the block of each stream id (a sync names the stream it waits for by id)
    ids = g_stream[so[s_first]] if n_g else np.zeros(0, np.int64)
    block_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, np.int64)
    block_of[ids] = np.arange(len(ids))
    syncs = np.flatnonzero(is_sync)
    bounds = np.concatenate([syncs, [n_h - 1]]) if n_h else np.zeros(0, np.int64)
    if len(bounds) > 1:
        bounds = np.unique(bounds)
    # per stream, the block position of each segment's end (nodes launched by host <= b)
    # a stream runs its nodes in order: a segment takes the prefix of each block whose launches
    # all came by its end (the running maximum of the launching node)
    cut = [np.searchsorted(np.maximum.accumulate(launch_sorted[a:z]), bounds, side="right") + a
           for a, z in zip(s_first, s_last)]
    seg_off = np.empty(len(bounds))
    g_end_sorted = np.zeros(n_g)
    stream_end = np.zeros(len(streams))
    stream_pos = s_first.copy()  # next block position per stream
    waited = np.full(n_h, -1, np.int64)
    sync_end = {}
    offset = 0.0
    for i, b in enumerate(bounds.tolist()):
        seg_off[i] = offset
        for k in range(len(streams)):
            p0, p1 = stream_pos[k], cut[k][i]
            if p1 > p0:
                m = np.maximum.accumulate(x0[p0:p1])
                c_before = c_incl[p0 - 1] if p0 > s_first[k] else 0.0
                ends = c_incl[p0:p1] + np.maximum(stream_end[k] - c_before, offset + m)
                g_end_sorted[p0:p1] = ends
                stream_end[k] = ends[-1]
                stream_pos[k] = p1
        if is_sync[b] and len(streams):
            target = gr.sync_stream[b]
            k = int(np.argmax(stream_end)) if target < 0 else int(block_of[target]) if target < len(block_of) else -1
            start_b = start0[b] + offset
            if k >= 0 and stream_end[k] > start_b and stream_pos[k] > s_first[k]:
                end_b = float(stream_end[k]) + busy[b]
                waited[b] = so[stream_pos[k] - 1]
                sync_end[b] = end_b
                offset = end_b - cs[b]
    lengths = np.diff(np.concatenate([[-1], bounds]))
    off = np.repeat(seg_off, lengths)
    host_start = start0 + off
    host_end = host_start + busy
    for b, e in sync_end.items():
        host_end[b] = e
    if one:
        g_end = g_end_sorted
    else:
        g_end = np.empty(n_g)
        g_end[so] = g_end_sorted
    g_start = g_end - g_dur
    m = gr.markers
    gpu_done = float(np.max(g_end, initial=-np.inf)) if n_g else -np.inf
    final = max(float(host_end[m[-1]]), gpu_done)
    starts = host_start[m]
    bounds_t = np.concatenate([starts[1:-1], [final]])
    per_step = np.maximum(bounds_t - starts[:-1], 0.0)
    return Sim(host_start, host_end, g_start, g_end, waited, float(final - starts[0]), per_step)


# ---------------------------------------------------------------- the critical path

def critical_path(gr: Graph, sim: Sim, g_dur=None, g_gap=None, gap=None, busy=None,
                  per_step: bool = False):
    """µs of each PARTS category on the critical path of the simulated span: walked back
    from the end through the node that set each node's start (the stream predecessor or
    the launch; the host predecessor or, after a GPU-bound sync, the GPU work it waited for).
    One iteration per host/GPU switch; the parts add up to the simulated time. With
    ``per_step``: also the same parts per step ((steps × parts) array; host time goes to the
    step it lies in, a GPU activity's to the step it ends in, work after the last step's end
    to the last step)."""
    g_dur = gr.g_dur if g_dur is None else g_dur
    g_gap = gr.g_gap if g_gap is None else g_gap
    busy = gr.busy if busy is None else busy
    gap = gr.gap if gap is None else gap
    n_g, n_p = len(g_dur), len(PARTS)
    idx = {p: i for i, p in enumerate(PARTS)}
    # host parts per node: gap parts (input wait, compile, host compute), busy parts by kind
    inp = np.minimum(gr.gap_input, gap)
    cmp_ = np.minimum(gr.gap_compile, gap - inp)
    gap_parts = ((idx["input_wait"], inp), (idx["compile"], cmp_),
                 (idx["host_compute"], np.maximum(gap - inp - cmp_, 0.0)))
    busy_part = np.where(_codes(gr.kind, (H_LAUNCH, H_COPY, H_GRAPH)), idx["launch_overhead"],
                         np.where(gr.kind == H_SYNC, idx["sync_overhead"], idx["runtime_other"]))
    # steps: a node's gap lies before it (a step marker's gap ends the step before), its busy after
    m = gr.markers
    n_s = max(len(m) - 1, 1)
    node_ids = np.arange(len(busy))
    step_of_gap = np.clip(np.searchsorted(m, node_ids, side="left") - 1, 0, n_s - 1)
    step_of_busy = np.clip(np.searchsorted(m, node_ids, side="right") - 1, 0, n_s - 1)
    step_starts = sim.host_start[m[:-1]] if len(m) > 1 else sim.host_start[m]

    def step_of_time(t):
        return np.clip(np.searchsorted(step_starts, t, side="right") - 1, 0, n_s - 1)

    # GPU: stream order, run heads (the last launch-bound node at or before each)
    so = _stream_order(gr, gr.g_stream)
    pos = np.empty(n_g, np.int64)
    pos[so] = np.arange(n_g)
    s_sorted = gr.g_stream[so]
    first = np.concatenate([[True], s_sorted[1:] != s_sorted[:-1]]) if n_g else np.zeros(0, bool)
    prev_end = np.concatenate([[-np.inf], sim.g_end[so][:-1]]) if n_g else np.zeros(0)
    bound = first | (sim.g_start[so] > prev_end + g_gap[so] + 1e-6)
    head = np.maximum.accumulate(np.where(bound, np.arange(n_g), 0)) if n_g else np.zeros(0, np.int64)
    cls_part = np.array([idx[f"gpu_{c}"] for c in CLASS_NAMES], np.int64)[gr.g_cls[so]] if n_g else np.zeros(0, np.int64)
    dur_sorted, gap_sorted, end_sorted = g_dur[so], g_gap[so], sim.g_end[so]
    cells, weights = [], []  # (step * n_p + part) and µs, added once at the end

    def add(step, part, us):
        cells.append(np.asarray(step, np.int64) * n_p + part)
        weights.append(np.asarray(us, float))

    # every node's cell of each part once (the walk appends slices of them: the same cells and
    # values in the same order as computing each slice's on the way, without ~900 small arrays)
    end_step = step_of_time(end_sorted) * n_p
    start_step = step_of_time(sim.g_start) if n_g else np.zeros(0, np.int64)
    lat = idx["gpu_launch_latency"]
    gpu_cells, lat_cells = end_step + cls_part, end_step + lat
    # (a part that is 0 at every node adds nothing: a bincount's sums start at +0.0, and
    # adding 0 changes no sum; the compile part of an eager trace)
    gap_cells = [(step_of_gap * n_p + part, values) for part, values in gap_parts if (values != 0).any()]
    busy_cells = step_of_busy * n_p + busy_part
    sync_cells = step_of_busy * n_p + idx["sync_overhead"]

    gb = np.flatnonzero(sim.waited >= 0)  # sync nodes that ended GPU-bound, in host order
    final_host = float(sim.host_end[m[-1]])
    at_gpu = n_g and float(sim.g_end.max()) > final_host
    node = int(np.argmax(sim.g_end)) if at_gpu else int(m[-1])
    on_gpu = bool(at_gpu)
    for _ in range(4 * (len(gb) + 2) + 8):
        if on_gpu:
            p = pos[node]
            h = int(head[p])
            cells.append(gpu_cells[h:p + 1])
            weights.append(dur_sorted[h:p + 1])
            cells.append(lat_cells[h + 1:p + 1])
            weights.append(gap_sorted[h + 1:p + 1])
            hnode = int(so[h])
            launch = int(gr.g_launch[hnode])
            add(start_step[hnode:hnode + 1], lat, [max(float(sim.g_start[hnode] - sim.host_start[launch]), 0.0)])
            node, on_gpu = launch, False
            continue
        # host: back to the last GPU-bound sync before this node
        k = np.searchsorted(gb, node, side="left") - 1
        b = int(gb[k]) if k >= 0 else -1
        for part_cells, values in gap_cells:
            cells.append(part_cells[b + 1:node + 1])
            weights.append(values[b + 1:node + 1])
        cells.append(busy_cells[b + 1:node])
        weights.append(busy[b + 1:node])
        if b < 0:
            break
        cells.append(sync_cells[b:b + 1])  # the sync's return after the wait
        weights.append(busy[b:b + 1])
        node, on_gpu = int(sim.waited[b]), True
    grid = np.bincount(np.concatenate(cells), weights=np.concatenate(weights),
                       minlength=n_s * n_p).reshape(n_s, n_p) if cells else np.zeros((n_s, n_p))
    out = {p: float(grid[:, i].sum()) for i, p in enumerate(PARTS)}
    return (out, grid) if per_step else out


# ---------------------------------------------------------------- what-ifs

@dataclass
class WhatIf:
    id: str
    label: str
    assumption: str
    rule: Optional[str]        # the recommendation rule it prices
    total_us: float
    nodes: int = 0             # how many nodes it changed (0: nothing to change)


class _Changes(dict):
    """A what-if's values (``simulate``'s keyword arguments): the graph's own arrays until a
    what-if writes one, which it makes its own first (``own``): each what-if copies the two or
    three arrays it changes, not all six (~0.4 ms each on the 292 MB benchmark)."""

    __slots__ = ("_owned",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._owned = set()

    def own(self, *keys) -> None:
        for key in keys:
            if key not in self._owned:
                self[key] = self[key].copy()
                self._owned.add(key)

    def shared(self) -> "_Changes":
        """This state again, its arrays shared: whichever of the two writes one copies it."""
        self._owned = set()
        return _Changes(self)


def _changes(gr: Graph) -> _Changes:
    # g_stream stays the graph's own array (simulate reuses its stream order): a what-if that
    # moves work to another stream assigns a new array
    return _Changes(gap=gr.gap, busy=gr.busy, is_sync=gr.kind == H_SYNC, g_lat=gr.g_lat, g_gap=gr.g_gap,
                    g_dur=gr.g_dur, g_stream=gr.g_stream)


def _apply_input(gr, ch):
    n = int((gr.gap_input > 0).sum())
    ch.own("gap")
    ch["gap"] -= np.minimum(gr.gap_input, ch["gap"])
    return n


def _apply_pinned(gr, ch):
    """Pageable H2D copies → asynchronous from pinned memory, prefetched: the call costs one
    launch and blocks nothing; the copy runs on the copy engine while the previous step
    computes (pin_memory=True, non_blocking=True, the DataLoader's prefetch), so it leaves the
    step's graph."""
    pageable = (gr.g_cls == C_H2D) & gr.g_pageable
    if not pageable.any():
        return 0
    calls = np.unique(gr.g_launch[pageable])
    ch.own("busy", "is_sync", "g_dur", "g_gap", "g_lat")
    ch["busy"][calls] = np.minimum(ch["busy"][calls], gr.launch_us)
    ch["is_sync"][calls] = False
    ch["g_dur"][pageable] = 0.0
    ch["g_gap"][pageable] = 0.0
    ch["g_lat"][pageable] = -np.inf
    return int(pageable.sum())


def _apply_sync(gr, ch):
    """Every sync removed: no wait, and the call costs at most one launch (what an
    asynchronous copy or a logged-later tensor costs)."""
    m = ch["is_sync"].copy()
    ch.own("is_sync", "busy")
    ch["is_sync"][:] = False
    ch["busy"][m] = np.minimum(ch["busy"][m], gr.launch_us)
    return int(m.sum())


def _launch_runs(gr: Graph, sel_nodes: np.ndarray) -> np.ndarray:
    """Host nodes (of ``sel_nodes``) whose gap lies between two launches of the same run:
    the previous node is a launch too and nothing but host compute separates them."""
    k = gr.kind
    launch = _codes(k, (H_LAUNCH, H_COPY))
    prev_launch = np.concatenate([[False], launch[:-1]])
    return sel_nodes & launch & prev_launch


def _apply_cuda_graphs(gr, ch, replay_gap_us: float):
    """Launches replayed from a CUDA graph: a run of launches (between syncs, input waits and
    compiles) costs one graph launch on the host; its kernels follow each other at the
    replay gap."""
    if "_graph_plan" not in gr.__dict__:  # (the graph's part, once: alone and in the all-fixes row)
        inner = _launch_runs(gr, np.ones(len(gr.gap), bool))
        gr.__dict__["_graph_plan"] = (inner, _codes(gr.kind, (H_LAUNCH, H_COPY)) & ~inner,
                                      _codes(gr.kind[gr.g_launch], (H_LAUNCH, H_COPY))) if inner.any() else None
    if gr.__dict__["_graph_plan"] is None:
        return 0
    inner, first, replayed = gr.__dict__["_graph_plan"]
    host_part = ch["gap"] - gr.gap_input - gr.gap_compile
    ch.own("gap", "busy", "g_lat", "g_gap")
    ch["gap"][inner] -= np.maximum(host_part[inner], 0.0)
    ch["busy"][inner] = 0.0
    ch["busy"][first] = T.STEP_MODEL_GRAPH_LAUNCH_US
    ch["g_lat"][replayed] = np.minimum(ch["g_lat"][replayed], replay_gap_us)
    ch["g_gap"][replayed] = np.minimum(ch["g_gap"][replayed], replay_gap_us)
    return int(inner.sum())


def _chains(gr: Graph, cls_ok: np.ndarray, ends: Optional[np.ndarray] = None) -> np.ndarray:
    """Chain id per GPU node (-1 outside a chain): a maximal run of ``cls_ok`` kernels that
    follow each other on one stream (launch order), with no other activity between; a node
    of ``ends`` closes its chain (the next one starts a new chain)."""
    n = len(gr.g_dur)
    so = _stream_order(gr, gr.g_stream)
    ok = cls_ok[so]
    s = gr.g_stream[so]
    closed = np.zeros(n, bool) if ends is None else ends[so]
    cont = np.concatenate([[False], ok[:-1] & (s[1:] == s[:-1]) & ~closed[:-1]])
    new = ok & ~cont
    cid = np.cumsum(new) - 1
    out = np.full(n, -1, np.int64)
    out[so[ok]] = cid[ok]
    return out


def _apply_fusion(gr, ch, compiled_host_us: float):
    """torch.compile on an eager run: each chain of memory-bound kernels between two compute
    kernels on a stream, up to and including a reduction, becomes one kernel that makes one
    pass over the chain's largest tensors (the time of its longest member); each remaining
    launch costs the host ``compiled_host_us`` (Inductor's wrapper instead of the eager
    dispatcher)."""
    plan = _fusion_plan(gr)
    if plan is None:
        return 0
    head, head_dur, gone, gone_calls, inner, relaunched = plan
    ch.own("g_dur", "g_gap", "g_lat", "gap", "busy")
    ch["g_dur"][head] = head_dur
    ch["g_dur"][gone] = 0.0
    _pad_gemms(gr, ch)
    ch["g_gap"][gone] = 0.0
    ch["g_lat"][gone] = -np.inf
    # host: launches of vanished kernels cost nothing; every other launch in a run of launches
    # costs the compiled wrapper's time (host compute before it included)
    host_part = np.maximum(ch["gap"] - gr.gap_input - gr.gap_compile, 0.0)
    own = ch["busy"] + np.where(inner, host_part, 0.0)
    target = np.where(gone_calls, 0.0, np.minimum(own, compiled_host_us))
    cut = np.where(relaunched, own - target, 0.0)
    from_gap = np.where(inner, np.minimum(cut, host_part), 0.0)
    ch["gap"] -= from_gap
    ch["busy"] -= np.minimum(cut - from_gap, ch["busy"])
    return int(gone.sum())


def _fusion_plan(gr):
    """What ``_apply_fusion`` changes that depends on the graph alone, found once per graph (the
    what-if alone and the all-fixes row both apply it): the chains' heads and their fused
    durations, the vanished kernels and the calls that launched only those, the host nodes
    inside a run of launches, the eager launches that would run compiled. None: no chain."""
    if "_fusion_plan" in gr.__dict__:
        return gr.__dict__["_fusion_plan"]
    plan = None
    mem = _codes(gr.g_cls, MEMORY_BOUND) & (gr.g_dur > 0)
    cid = _chains(gr, mem, gr.g_reduction)
    inchain = cid >= 0
    if inchain.any():
        n_c = int(cid.max()) + 1
        longest = np.zeros(n_c)
        np.maximum.at(longest, cid[inchain], gr.g_dur[inchain])
        # the chain's first member (launch order) keeps the fused kernel, the others vanish
        idx = np.flatnonzero(inchain)
        first_of = np.full(n_c, np.iinfo(np.int64).max)
        np.minimum.at(first_of, cid[inchain], idx)
        head = np.zeros(len(gr.g_dur), bool)
        head[first_of[first_of < len(gr.g_dur)]] = True
        gone = inchain & ~head
        gone_calls = np.zeros(len(gr.gap), bool)
        gone_calls[gr.g_launch[gone]] = True
        keep_calls = np.zeros(len(gr.gap), bool)
        keep_calls[gr.g_launch[~gone]] = True
        gone_calls &= ~keep_calls
        launchish = _codes(gr.kind, (H_LAUNCH, H_COPY))
        inner = _launch_runs(gr, np.ones(len(gr.gap), bool))
        plan = (head, longest[cid[head]], gone, gone_calls, inner, launchish & ~gr.compiled)
    gr.__dict__["_fusion_plan"] = plan
    return plan


def _pad_gemms(gr, ch) -> int:
    """Misaligned GEMMs padded (Inductor's shape padding): each runs at the FLOP rate the
    aligned GEMMs of its precision reach in this trace (needs FLOPs per kernel)."""
    bad = gr.g_misaligned & (gr.g_flops > 0) & (gr.g_dur > 0)
    if not bad.any():
        return 0
    n = 0
    for p in np.unique(gr.g_prec[bad]):
        ok = (gr.g_cls == C_GEMM) & ~gr.g_misaligned & (gr.g_prec == p) & (gr.g_flops > 0) & (gr.g_dur > 0)
        if ok.sum() < 2:
            continue
        rate = gr.g_flops[ok].sum() / gr.g_dur[ok].sum()  # FLOP per µs
        m = bad & (gr.g_prec == p)
        ch.own("g_dur")
        ch["g_dur"][m] = np.minimum(gr.g_dur[m], gr.g_flops[m] / rate)
        n += int(m.sum())
    return n


def _apply_bf16(gr, ch, speedup_of):
    """fp32/tf32 GEMM, conv and attention kernels on Tensor Cores in bf16: each runs
    ``speedup_of[precision]`` times faster (the ratio of the GPU's peaks, METRICS §19)."""
    n = 0
    # an fp32 op whose kernel runs on Tensor Cores ran in TF32
    code = {p: i for i, p in enumerate(gr.precisions)}
    fp32, tf32 = code.get("fp32", -1), code.get("tf32", -2)
    compute = _codes(gr.g_cls, (C_GEMM, C_CONV, C_ATTN))
    for p, sp in speedup_of.items():
        if sp <= 1:
            continue
        if p == "fp32":
            m = compute & (gr.g_prec == fp32) & ~gr.g_tc
        elif p == "tf32":
            m = compute & ((gr.g_prec == tf32) | ((gr.g_prec == fp32) & gr.g_tc))
        else:
            m = compute & (gr.g_prec == code.get(p, -3))
        if m.any():
            ch.own("g_dur")
            ch["g_dur"][m] = gr.g_dur[m] / sp
            n += int(m.sum())
    return n


def _apply_compile_breaks(gr, ch, compiled_host_us: float):
    """A graph break removed and compile time inside the steps → 0: the eager region between
    two compiled graphs runs as the compiled regions of the same trace do (its launches at
    their host cost per launch, its syncs gone)."""
    n = int((gr.gap_compile > 0).sum() + gr.compiling.sum())
    ch.own("gap", "busy", "is_sync", "g_dur", "g_gap", "g_lat")
    ch["gap"] -= np.minimum(gr.gap_compile, ch["gap"])
    # the calls made while compiling (autotuning benchmarks) and the GPU work they launched
    ch["busy"][gr.compiling] = 0.0
    ch["is_sync"][gr.compiling] = False
    gone = gr.compiling[gr.g_launch]
    ch["g_dur"][gone] = 0.0
    ch["g_gap"][gone] = 0.0
    ch["g_lat"][gone] = -np.inf
    e = gr.eager_between
    if e.any():
        host_part = np.maximum(ch["gap"] - gr.gap_input - gr.gap_compile, 0.0)
        launchish = _codes(gr.kind, (H_LAUNCH, H_COPY))
        own = np.where(e & launchish, ch["busy"] + host_part, 0.0)
        target = np.minimum(own, compiled_host_us)
        ch["gap"][e] -= np.where(launchish[e], np.minimum(own[e] - target[e], host_part[e]), host_part[e])
        ch["busy"][e & launchish] = np.minimum(ch["busy"][e & launchish], compiled_host_us)
        ch["is_sync"][e] = False
        n += int(e.sum())
    return n


def _apply_d2d(gr, ch):
    m = gr.g_cls == C_D2D
    ch.own("g_dur")
    ch["g_dur"][m] = 0.0
    return int(m.sum())


def _apply_comm(gr, ch):
    """Exposed communication overlapped: collectives move to a stream of their own, and the
    kernels the trace shows starting right at a collective's end (held back by it) start at
    their launch instead."""
    m = gr.g_cls == C_COMM
    if not m.any():
        return 0
    ch["g_stream"] = np.where(m, int(gr.g_stream.max()) + 1, ch["g_stream"])
    comm_end = np.sort(gr.g_ts[m] + gr.g_dur[m])
    k = np.searchsorted(comm_end, gr.g_ts, side="right") - 1
    held = ~m & (k >= 0) & (gr.g_ts - comm_end[np.maximum(k, 0)] <= T.STEP_MODEL_QUEUED_GAP_US) \
        & (gr.g_lat > gr.queued_latency_us)
    ch.own("g_lat", "g_gap")
    ch["g_lat"][held] = gr.queued_latency_us
    ch["g_gap"][held] = np.minimum(ch["g_gap"][held], T.STEP_MODEL_QUEUED_GAP_US)
    return int(m.sum())


def _apply_roofline(gr, ch, peak: Optional[dict]):
    """The ceiling (never a recommendation): every kernel with FLOPs or bytes at its roofline
    time, max(FLOPs / its precision's peak, bytes / HBM bandwidth), when that is shorter."""
    if not peak:
        return 0
    tf = peak.get("tflops") or {}
    hbm = peak.get("hbm_gbps")
    t_flop = np.zeros(len(gr.g_dur))
    code = {p: i for i, p in enumerate(gr.precisions)}
    for p, v in tf.items():
        if isinstance(v, (int, float)) and v > 0 and p in code:
            m = gr.g_prec == code[p]
            t_flop[m] = gr.g_flops[m] / (v * 1e12) * 1e6
    t_mem = gr.g_bytes / (hbm * 1e9) * 1e6 if hbm else np.zeros(len(gr.g_dur))
    ideal = np.maximum(t_flop, t_mem)
    m = (ideal > 0) & (ideal < gr.g_dur) & (gr.g_cls != C_COMM)
    ch.own("g_dur")
    ch["g_dur"][m] = ideal[m]
    return int(m.sum())


def _total(gr: Graph, ch: dict) -> float:
    """``simulate(gr, **ch).total_us``: by ``_simulated_total`` (no per-node times), else by
    ``simulate`` where that does not apply."""
    total = _simulated_total(gr, **ch)
    return simulate(gr, **ch).total_us if total is None else total


def _simulated_total(gr: Graph, gap, busy, is_sync, g_lat, g_gap, g_dur, g_stream) -> Optional[float]:
    """``simulate``'s ``total_us`` bit for bit, without its per-node arrays (the what-ifs read
    only the total: 12 of the 14 simulations of the 292 MB benchmark, ~3 ms each): the same
    recurrence over the syncs, on scalars. A segment of a stream enters it only by its last
    end, which is ``c_last + max(end before - c_before, offset + the segment's maximum of
    x0)``: the maxima come from one ``np.maximum.reduceat`` per stream. The span's GPU end is
    the largest segment end: a stream's ends never decrease within a segment when no step
    (gap + duration) is negative. None (use ``simulate``) when one is, or a time is NaN."""
    n_h, n_g = len(gap), len(g_dur)
    if not n_h or not n_g:
        return None
    so, s_first, s_last, launch_sorted = _stream_blocks(gr, g_stream)
    one = len(s_first) == 1
    # the host side (cs, start0 at each launch) and the GPU side (the cumulative steps) of the
    # graph's own arrays once: a what-if leaves one side the graph's own (_Changes), and each
    # is the same arithmetic on the same arrays
    memo = gr.__dict__.setdefault("_total_memo", {})
    own_streams = g_stream is gr.g_stream
    host_key = own_streams and gap is gr.gap and busy is gr.busy
    if host_key and "host" in memo:
        cs, start0_at_launch = memo["host"]
    else:
        cs = gap + busy
        np.cumsum(cs, out=cs)
        start0_at_launch = cs[launch_sorted] - busy[launch_sorted]
        if host_key:
            memo["host"] = (cs, start0_at_launch)
    gpu_key = own_streams and g_gap is gr.g_gap and g_dur is gr.g_dur
    if gpu_key and "gpu" in memo:
        c_incl = memo["gpu"]
    else:
        step = g_gap + g_dur if one else (g_gap + g_dur)[so]
        c_incl = None
        if (step >= 0).all():  # (NaN too)
            c_incl = np.cumsum(step)
            # every time finite (a finite total of non-negative parts): no NaN or inf below,
            # where the scalar max would not propagate it as np.maximum does
            if not np.isfinite(c_incl[-1]):
                c_incl = None
            elif not one:
                c_incl -= np.repeat((c_incl - step)[s_first], s_last - s_first)
        if gpu_key:
            memo["gpu"] = c_incl
    if c_incl is None or not np.isfinite(cs[-1]):
        return None
    # x0 = start0[launch] + (g_lat + g_dur - c_incl), start0 = cs - busy (simulate's operations)
    x0 = g_lat + g_dur if one else g_lat[so] + g_dur[so]
    x0 -= c_incl
    x0 += start0_at_launch
    if not (x0 < np.inf).all():  # (NaN too; -inf: a removed node)
        return None
    ids = g_stream[so[s_first]]
    block_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, np.int64)
    block_of[ids] = np.arange(len(ids))
    bounds = np.concatenate([np.flatnonzero(is_sync), [n_h - 1]])
    if len(bounds) > 1:
        bounds = np.unique(bounds)
    # per stream and segment: nonempty, last end's c_incl, c_incl before it, maximum of x0
    per_stream = []
    for a, z in zip(s_first.tolist(), s_last.tolist()):
        cut = np.searchsorted(_launch_cummax(gr, g_stream, launch_sorted)[a:z], bounds, side="right") + a
        prev = np.concatenate([[a], cut[:-1]])
        full = cut > prev
        seg_max = np.zeros(len(cut))
        seg_max[full] = np.maximum.reduceat(x0[a:z], prev[full] - a)
        c_before = np.where(prev > a, c_incl[np.maximum(prev - 1, 0)], 0.0)
        per_stream.append((full.tolist(), c_incl[np.maximum(cut - 1, 0)].tolist(), c_before.tolist(),
                           seg_max.tolist()))
    n_s = len(per_stream)
    stream_end = [0.0] * n_s
    started = [False] * n_s
    gpu_done = -np.inf
    sync_stream = gr.sync_stream
    n_block = len(block_of)
    seg_off = []
    sync_end = {}
    offset = 0.0
    # each bound's values as Python floats (numpy scalar reads were most of the loop's time)
    b_sync = is_sync[bounds].tolist()
    b_target = sync_stream[bounds].tolist()
    b_busy = busy[bounds].tolist()
    b_cs = cs[bounds].tolist()
    b_start0 = (cs[bounds] - busy[bounds]).tolist()
    for i, b in enumerate(bounds.tolist()):
        seg_off.append(offset)
        for k in range(n_s):
            full, c_last, c_before, seg_max = per_stream[k]
            if full[i]:
                before = stream_end[k] - c_before[i]
                ready = offset + seg_max[i]
                end = c_last[i] + (ready if ready > before else before)
                stream_end[k] = end
                started[k] = True
                if end > gpu_done:
                    gpu_done = end
        if b_sync[i]:
            target = b_target[i]
            k = (max(range(n_s), key=stream_end.__getitem__) if target < 0
                 else int(block_of[target]) if target < n_block else -1)
            start_b = b_start0[i] + offset
            if k >= 0 and stream_end[k] > start_b and started[k]:
                end_b = stream_end[k] + b_busy[i]
                sync_end[b] = end_b
                offset = end_b - b_cs[i]
    bounds_list = bounds.tolist()
    m0, m1 = int(gr.markers[0]), int(gr.markers[-1])
    host_end_last = sync_end.get(m1)
    if host_end_last is None:
        host_end_last = (cs[m1] - busy[m1]) + seg_off[bisect.bisect_left(bounds_list, m1)] + busy[m1]
    final = max(float(host_end_last), float(gpu_done))
    return float(final - ((cs[m0] - busy[m0]) + seg_off[bisect.bisect_left(bounds_list, m0)]))


def _launch_cummax(gr: Graph, g_stream: np.ndarray, launch_sorted: np.ndarray) -> np.ndarray:
    """Per stream block, the running maximum of the launching host node (stream order): a
    segment of the schedule takes the prefix of each block whose launches all came by its
    end; the graph's own streams: computed once."""
    own = g_stream is gr.g_stream
    if own and "_launch_cummax" in gr.__dict__:
        return gr.__dict__["_launch_cummax"]
    _, s_first, s_last, _ = _stream_blocks(gr, g_stream)
    out = np.empty(len(launch_sorted), launch_sorted.dtype)
    for a, z in zip(s_first.tolist(), s_last.tolist()):
        np.maximum.accumulate(launch_sorted[a:z], out=out[a:z])
    if own:
        gr.__dict__["_launch_cummax"] = out
    return out


# ---------------------------------------------------------------- the section

def _tc_speedups(peak_tflops: dict, major: Optional[int], amd: bool) -> Dict[str, float]:
    """Per precision, how much faster its GEMM/conv kernels run in bf16 (fp16 before Ampere):
    the ratio of the peaks, fp32 keeping T.TC_FP32_PEAK_FRACTION_KEPT of it (a kernel moved to
    Tensor Cores reaches a smaller fraction of the higher peak); without peaks the
    generation's table (thresholds.TC_SPEEDUP_BY_COMPUTE_MAJOR)."""
    target = "fp16" if (major is not None and major < AMPERE_MAJOR and not amd) else "bf16"
    top = peak_tflops.get(target)
    out = {}
    for p in ("fp32", "tf32"):
        own = peak_tflops.get(p)
        if isinstance(top, (int, float)) and isinstance(own, (int, float)) and own > 0:
            out[p] = top / own * (T.TC_FP32_PEAK_FRACTION_KEPT if p == "fp32" else 1.0)
    if "fp32" not in out:
        table = T.TC_SPEEDUP_BY_COMPUTE_MAJOR
        out["fp32"] = float(table.get(None if amd else major, table[None]))
    return out


WHAT_IFS = (
    ("input", "The DataLoader keeps up (enough workers)",
     "the DataLoader wait between the host's calls → 0 (batches loaded in background workers)"),
    ("pinned_h2d", "Input copies from pinned memory, overlapped",
     "each pageable host-to-device copy → an asynchronous copy from pinned memory, prefetched while the previous "
     "step computes: the call costs one launch and blocks nothing, the copy leaves the step"),
    ("sync", "No host-device synchronisation in the step",
     "every blocking sync call (.item(), .cpu(), nonzero, synchronize) → no wait, at most one launch's cost: "
     "the host runs ahead and the GPU no longer drains"),
    ("cuda_graphs", "Launches replayed from CUDA graphs",
     "each run of launches between syncs → one graph launch on the host; its kernels follow each "
     "other at the replay gap"),
    ("torch_compile", "torch.compile: memory-bound chains fused, compiled launches",
     "each chain of memory-bound kernels between two compute kernels, up to a reduction → one kernel as long as "
     "its longest member (one pass over the largest tensors); GEMMs built for unaligned operands at the FLOP rate "
     "of the aligned ones (shape padding); every other launch at the compiled host cost per launch"),
    ("bf16", "fp32 matmul/conv on Tensor Cores (bf16)",
     "fp32/tf32 GEMM, conv and attention kernels → their time divided by the ratio of the GPU's bf16 peak "
     "to their precision's peak (fp32 keeps half of it)"),
    ("graph_breaks", "Graph breaks removed, no compiling in the steps",
     "compile time inside the steps → 0; the eager region between two compiled graphs runs as the compiled "
     "regions do (their host cost per launch, no sync)"),
    ("overlap_comm", "Communication overlapped with compute",
     "collectives on their own stream; the compute kernels no longer wait for them"),
    ("d2d", "No device-to-device copies",
     "device-to-device copies → 0"),
    ("warmup", "No one-off warm-up call in the steps",
     "the longest runtime call → the median cost of its kind"),
)


def step_model(trace: TraceData, steps, gpu_runtime: np.ndarray, per_kernel: Optional[dict] = None,
               context: Optional[dict] = None, device_properties=None,
               not_available: Optional[Dict[str, str]] = None) -> Optional[dict]:
    """The span's ``step_model`` section (METRICS.md §19)."""
    na = {} if not_available is None else not_available
    gr = build_graph(trace, steps, gpu_runtime, per_kernel, na)
    if gr is None:
        return None
    ctx = context or {}
    base = simulate(gr)
    measured = float(gr.step_us.sum())
    n = gr.n_steps
    path, path_steps = critical_path(gr, base, per_step=True)
    # host cost per launch inside compiled regions (this trace), else the documented constant
    comp_launch = gr.compiled & _codes(gr.kind, (H_LAUNCH, H_COPY))
    if comp_launch.sum() >= T.STEP_MODEL_MIN_COMPILED_LAUNCHES:
        inner = _launch_runs(gr, comp_launch)
        per = gr.busy[comp_launch].sum() + np.maximum(gr.gap - gr.gap_input - gr.gap_compile, 0.0)[inner].sum()
        compiled_host_us = float(per / comp_launch.sum())
        compiled_host_src = "measured in this trace's compiled regions"
    else:
        compiled_host_us = T.STEP_MODEL_COMPILED_HOST_US
        compiled_host_src = "thresholds.STEP_MODEL_COMPILED_HOST_US"
    # the replay gap between kernels launched by one graph launch, else the constant
    graph_kernels = gr.kind[gr.g_launch] == H_GRAPH
    replay_gap = T.STEP_MODEL_REPLAY_GAP_US
    if graph_kernels.sum() >= T.STEP_MODEL_MIN_REPLAYED_KERNELS:
        replay_gap = float(np.median(gr.g_gap[graph_kernels]))
    majors = [p.get("computeMajor") for p in device_properties or [] if isinstance(p, dict)]
    majors = [m for m in majors if isinstance(m, int) and not isinstance(m, bool)]
    amd = any("gcnArchName" in p or p.get("warpSize") == 64 for p in device_properties or [] if isinstance(p, dict))
    pk = per_kernel or {}
    speedups = _tc_speedups(pk.get("peak_tflops") or {}, min(majors) if majors else None, amd)

    rows = []
    # the warm-up what-if only where one call could be a first-call outlier (rule warmup_outlier:
    # at least WARMUP_CALL_STEP_PCT of the step time)
    warm = None
    if len(gr.busy):
        warm = int(np.argmax(gr.busy))
        if gr.busy[warm] < T.WARMUP_CALL_STEP_PCT / 200 * measured:  # half: busy is the call's serial part
            warm = None
    alone = {}  # what-if id -> its simulated total on its own
    for wid, label, assumption in WHAT_IFS:
        ch = _changes(gr)
        if wid == "input":
            changed = _apply_input(gr, ch)
        elif wid == "pinned_h2d":
            changed = _apply_pinned(gr, ch)
        elif wid == "sync":
            changed = _apply_sync(gr, ch)
        elif wid == "cuda_graphs":
            if ctx.get("cuda_graphs"):
                continue
            changed = _apply_cuda_graphs(gr, ch, replay_gap)
            assumption = assumption + f" ({replay_gap:.1f} µs)"
        elif wid == "torch_compile":
            if ctx.get("torch_compile"):
                continue
            changed = _apply_fusion(gr, ch, compiled_host_us)
            assumption = assumption + f" ({compiled_host_us:.1f} µs, {compiled_host_src})"
        elif wid == "bf16":
            changed = _apply_bf16(gr, ch, speedups)
            assumption = assumption + " (" + ", ".join(f"{p} {s:.1f}x" for p, s in speedups.items()) + ")"
        elif wid == "graph_breaks":
            if not ctx.get("torch_compile"):
                continue
            changed = _apply_compile_breaks(gr, ch, compiled_host_us)
            assumption = assumption + f" ({compiled_host_us:.1f} µs per launch, {compiled_host_src})"
        elif wid == "overlap_comm":
            changed = _apply_comm(gr, ch)
        elif wid == "d2d":
            changed = _apply_d2d(gr, ch)
        else:  # warmup
            if warm is None:
                continue
            same = gr.kind == gr.kind[warm]
            typical = float(np.median(gr.busy[same])) if same.any() else 0.0
            ch.own("busy")
            ch["busy"][warm] = min(ch["busy"][warm], typical)
            changed = 1
        if not changed:
            continue
        total = alone[wid] = _total(gr, ch)
        rows.append(_row(wid, PRICES.get(wid), label, assumption, base.total_us, total, measured, n,
                         changed))
    # all fixes together (the recommendation what-ifs, each once, largest saving first). Two
    # fixes' rules can overlap (graph breaks and CUDA graphs both re-price the same launches): a
    # fix that makes the combined step no faster is left out, so all fixes together are never
    # slower than the best one alone
    ch = _changes(gr)
    applied = []
    all_total = base.total_us
    for r in sorted(rows, key=lambda r: -r["saving_us"]):
        if r["saving_us"] <= 0 or r["id"] == "warmup":
            continue
        wid = r["id"]
        # (the graph's own streams not copied: a what-if assigns a new array, and simulate
        # reuses the stream order of the graph's own)
        before = ch.shared()  # (arrays shared: the fix below copies the ones it changes)
        if wid == "input":
            _apply_input(gr, ch)
        elif wid == "pinned_h2d":
            _apply_pinned(gr, ch)
        elif wid == "sync":
            _apply_sync(gr, ch)
        elif wid == "cuda_graphs":
            _apply_cuda_graphs(gr, ch, replay_gap)
        elif wid == "torch_compile":
            _apply_fusion(gr, ch, compiled_host_us)
        elif wid == "bf16":
            _apply_bf16(gr, ch, speedups)
        elif wid == "graph_breaks":
            _apply_compile_breaks(gr, ch, compiled_host_us)
        elif wid == "overlap_comm":
            _apply_comm(gr, ch)
        elif wid == "d2d":
            _apply_d2d(gr, ch)
        # (the first fix kept is applied to the graph's own values, as when it was priced alone)
        total = alone[wid] if not applied else _total(gr, ch)
        if total < all_total:
            applied.append(wid)
            all_total = total
        else:
            ch = before
    ceiling = None
    peak = pk.get("peak")
    if peak and len(pk.get("flops", ())):
        ch = _changes(gr)
        if _apply_roofline(gr, ch, peak):
            ceiling = _row("roofline", None, "Every kernel at its roofline (the ceiling)",
                           "each kernel with counted FLOPs or bytes → max(FLOPs / its precision's peak, bytes / HBM "
                           "bandwidth); a bound, never a recommendation", base.total_us, _total(gr, ch), measured, n, 1)
    else:
        na[f"{NAME}.ceiling"] = "no FLOPs and peak for this trace (record_shapes=True and a known GPU): no roofline"
    if gr.recorded_us > 0 and abs(base.total_us - gr.recorded_us) > T.STEP_MODEL_MAX_ERROR_PCT / 100 * gr.recorded_us:
        na[f"{NAME}.what_if"] = (f"the model reproduces the recorded steps only within "
                                 f"{100 * abs(base.total_us - gr.recorded_us) / gr.recorded_us:.1f} % (more than "
                                 f"{T.STEP_MODEL_MAX_ERROR_PCT:g} %): its what-ifs do not price the recommendations")
    return {
        "profiler": _profiler_cost(trace, steps, path, n),
        "steps": n, "step_us": measured, "model_us": base.total_us,
        "recorded_us": gr.recorded_us,
        "model_error_pct": 100.0 * (base.total_us - gr.recorded_us) / gr.recorded_us if gr.recorded_us > 0 else None,
        "reliable": bool(gr.recorded_us > 0
                         and abs(base.total_us - gr.recorded_us) <= T.STEP_MODEL_MAX_ERROR_PCT / 100 * gr.recorded_us),
        "host_nodes": int(len(gr.busy)), "gpu_nodes": int(len(gr.g_dur)),
        "syncs": int((gr.kind == H_SYNC).sum()),
        "critical_path_us": {k: v for k, v in path.items()},
        "per_step": [{"step": int(num), "step_us": float(s), "model_us": float(m),
                      "critical_path_us": {p: float(v) for p, v in zip(PARTS, row) if v > 0}}
                     for num, s, m, row in zip(gr.step_numbers, gr.step_us, base.per_step_us, path_steps)],
        "what_if": sorted(rows, key=lambda r: -r["saving_us"]),
        "all_fixes": {"ids": applied, "model_us": all_total, **_saving(base.total_us, all_total, measured, n)},
        "ceiling": ceiling,
        "assumptions": {"launch_us": gr.launch_us, "compiled_host_us": compiled_host_us,
                        "replay_gap_us": replay_gap, "queued_latency_us": gr.queued_latency_us,
                        "tc_speedup": speedups},
    }


def _profiler_cost(trace: TraceData, steps, path: Dict[str, float], n: int) -> dict:
    """How much of the host time on the critical path the profiler itself adds (METRICS §19):
    ops per step × (PROFILER_US_PER_OP + PROFILER_US_PER_OP_PER_OPTION per option on)."""
    cpu = trace.cpu
    lo, hi = float(steps.inc_host_start.min()), float(steps.inc_host_end.max())
    ops = int(((cpu.kind == CPU_OP) & (cpu.ts >= lo) & (cpu.ts < hi)).sum())
    options = [o for o, on in (("record_shapes", trace.meta.record_shapes), ("profile_memory", trace.meta.profile_memory),
                               ("with_stack", trace.meta.with_stack)) if on]
    per_op = T.PROFILER_US_PER_OP + T.PROFILER_US_PER_OP_PER_OPTION * len(options)
    host = sum(path.get(k, 0.0) for k in ("host_compute", "launch_overhead", "sync_overhead", "runtime_other")) / n
    overhead = ops / n * per_op
    return {"options": options, "ops_per_step": ops / n, "us_per_op": per_op, "overhead_us_per_step": overhead,
            "host_path_us_per_step": host,
            "share_of_host_path_pct": min(100.0, 100.0 * overhead / host) if host > 0 else None}


# The recommendation rules each what-if prices (judge/recommendations.what_if_of maps each rule
# to one of these; which of them fired is the recommendations' business: each carries its
# `what_if`).
PRICES = {"input": ["input_bound"], "pinned_h2d": ["pageable_h2d"], "sync": ["synchronization"],
          "cuda_graphs": ["small_kernels", "host_bound"], "torch_compile": ["low_mfu", "small_kernels", "host_bound"],
          "bf16": ["tensor_cores_unused"], "graph_breaks": ["torch_compile"],
          "overlap_comm": ["communication", "ddp_buckets", "fsdp_prefetch"], "d2d": ["d2d_copies"],
          "warmup": ["warmup_outlier"]}


def _saving(base_us: float, total_us: float, measured: float, n: int) -> dict:
    saving = max(base_us - total_us, 0.0)
    return {"saving_us": saving, "saving_pct": 100.0 * saving / measured if measured > 0 else None,
            "step_ms": measured / n / 1000 if n else None,
            "predicted_step_ms": (measured - saving) / n / 1000 if n else None}


def _row(wid, rules, label, assumption, base_us, total_us, measured, n, changed) -> dict:
    return {"id": wid, "rules": list(rules or []), "label": label, "assumption": assumption, "model_us": total_us,
            "changed": int(changed), **_saving(base_us, total_us, measured, n)}


# ---------------------------------------------------------------- metric unit

def _unit_compute(span):
    from .linking import span_gpu_runtime

    per_kernel = span.once("flops_per_kernel", lambda: {})
    span.release("flops_per_kernel")  # its last reader (per-kernel columns: 2.5 MB on the benchmark)
    return step_model(span.trace, span.found, span_gpu_runtime(span), per_kernel=per_kernel,
                      context=span.report.get("context"), device_properties=span.trace.meta.device_properties,
                      not_available=span.not_available)


def _unit_partial(report: dict) -> dict:
    sec = report.get(NAME) or {}
    if not sec:
        return {"sum:step_us": None, "sum:steps": 0, "sum:model_us": None, "sum:recorded_us": 0.0, "all:reliable": True,
                "sum:host_nodes": 0, "sum:gpu_nodes": 0,
                "sum:syncs": 0, "keyed:critical_path_us": {}, "keyed:what_if": {}, "sum:all_saving_us": 0.0,
                "rows:all_ids": [], "sum:ceiling_saving_us": 0.0, "first:ceiling": None}
    rows = {r["id"]: {"first:id": r["id"], "first:rules": r.get("rules"), "first:label": r.get("label"),
                      "first:assumption": r.get("assumption"), "sum:saving_us": r.get("saving_us"),
                      "sum:changed": r.get("changed") or 0} for r in sec.get("what_if") or []}
    ceil = sec.get("ceiling") or {}
    return {"sum:step_us": sec.get("step_us"), "sum:steps": sec.get("steps") or 0, "sum:model_us": sec.get("model_us"),
            "sum:recorded_us": sec.get("recorded_us"), "all:reliable": sec.get("reliable", True),
            "sum:host_nodes": sec.get("host_nodes") or 0, "sum:gpu_nodes": sec.get("gpu_nodes") or 0,
            "sum:syncs": sec.get("syncs") or 0,
            "keyed:critical_path_us": {k: {"sum:us": v} for k, v in (sec.get("critical_path_us") or {}).items()},
            "keyed:what_if": rows,
            "sum:all_saving_us": (sec.get("all_fixes") or {}).get("saving_us"),
            "rows:all_ids": list((sec.get("all_fixes") or {}).get("ids") or []),
            "sum:ceiling_saving_us": ceil.get("saving_us") if ceil else 0.0,
            "first:ceiling": {k: ceil.get(k) for k in ("label", "assumption")} if ceil else None}


def _unit_finish(m: dict) -> Optional[dict]:
    from .units import num

    measured, n = num(m.get("sum:step_us")), int(m.get("sum:steps") or 0)
    if not measured or not n:
        return None
    model = num(m.get("sum:model_us"))

    def saving(us):
        us = num(us) or 0.0
        return {"saving_us": us, "saving_pct": 100.0 * us / measured, "step_ms": measured / n / 1000,
                "predicted_step_ms": (measured - us) / n / 1000}

    rows = [{"id": r["first:id"], "rules": r["first:rules"] or [], "label": r["first:label"],
             "assumption": r["first:assumption"], "changed": int(r["sum:changed"] or 0),
             "model_us": (model - (num(r["sum:saving_us"]) or 0.0)) if model is not None else None,
             **saving(r["sum:saving_us"])} for r in (m.get("keyed:what_if") or {}).values()]
    ceil = m.get("first:ceiling")
    return {"steps": n, "step_us": measured, "model_us": model,
            "recorded_us": num(m.get("sum:recorded_us")),
            "model_error_pct": (100.0 * (model - m["sum:recorded_us"]) / m["sum:recorded_us"]
                                if model is not None and num(m.get("sum:recorded_us")) else None),
            "reliable": bool(m.get("all:reliable", True)),
            "host_nodes": int(m.get("sum:host_nodes") or 0), "gpu_nodes": int(m.get("sum:gpu_nodes") or 0),
            "syncs": int(m.get("sum:syncs") or 0),
            "critical_path_us": {k: v["sum:us"] for k, v in (m.get("keyed:critical_path_us") or {}).items()},
            "per_step": [],
            "what_if": sorted(rows, key=lambda r: -r["saving_us"]),
            "all_fixes": {"ids": list(dict.fromkeys(m.get("rows:all_ids") or [])),
                          "model_us": (model - (num(m.get("sum:all_saving_us")) or 0.0)) if model is not None else None,
                          **saving(m.get("sum:all_saving_us"))},
            "ceiling": ({**ceil, "id": "roofline", "rules": [], "changed": 1,
                         "model_us": (model - (num(m.get("sum:ceiling_saving_us")) or 0.0)) if model is not None else None,
                         **saving(m.get("sum:ceiling_saving_us"))} if ceil else None),
            "assumptions": None, "profiler": None}


def _unit():
    from .units import Unit

    return Unit(NAME, _unit_compute, _unit_partial, _unit_finish, requires=("steps",))


UNIT = _unit()
