"""Per-span part of the distributed (ranks) view, metrics.md §12.

``span_partial(trace, steps) -> dict`` reduces one trace file to what the run-level
rank view (``tb_bottleneck_plugin.views.ranks``) needs: per included step its time split into
compute only / overlapped / exposed communication / other, and the ordered list of the
step's collectives (kind, duration, bytes). The result is plain JSON (lists, dicts,
floats, no numpy), a few KB, so the service can keep it beside the span's report and the
rank view never loads a trace again.

Intervals are measured with the vectorised helpers of ``intervals``; only the
collectives (few per step) are walked in Python.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

import numpy as np

from ..trace.model import CPU_OP, CPU_USER_ANNOTATION, GPU_KERNEL, GPU_MEMCPY, TraceData
from . import intervals as iv
from .breakdown import COMM_CPU_PREFIXES, comm_kernel_mask
from .factorize import unique_inverse
from .linking import gpu_runtime_index, innermost_enclosing, span_gpu_runtime, span_op_calls
from .steps import Steps

PARTIAL_VERSION = 1
# On CPU-only traces these CPU spans are communication too (besides nccl:/gloo:/rccl:):
# the c10d dispatcher ops (c10d::allreduce_, c10d::broadcast_, ...) and the op that
# records collective parameters.
COMM_CPU_EXTRA_PREFIXES = ("c10d::",)
COMM_CPU_EXTRA_NAMES = frozenset({"record_param_comms"})
# A step keeps at most this many collectives (FSDP can issue thousands): the partial
# stays a few KB; `collectives_truncated` says when it happened.
MAX_COLLECTIVES_PER_STEP = 512

# Collective kinds, matched in this order on the name with case, '_', ':' and '-' removed
# (so "allreduce", "all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float",
# "c10d::allreduce_" all read "allreduce"): longer names first.
_KINDS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
    ("barrier", "barrier"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
    ("send", "send"), ("recv", "recv"),
)
_NAME_PREFIX = re.compile(r"^(nccl|gloo|rccl|c10d)\s*:+", re.IGNORECASE)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::float": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8,
    "long int": 8, "short": 2, "int16": 2, "signed char": 1, "int8": 1, "unsigned char": 1, "uint8": 1,
    "bool": 1, "char": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "complexfloat": 8,
    "c10::complex<float>": 8, "complexdouble": 16, "c10::complex<double>": 16,
}


def collective_kind(name: str) -> str:
    """all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv, barrier,
    reduce, gather, scatter, send, recv, or "other" (e.g. ROCm's ncclDevKernel_Generic)."""
    low = _NAME_PREFIX.sub("", name).lower()
    if low.startswith(("nccldevkernel_", "ncclkernel_", "rccl")):
        low = low.split("_", 1)[1] if "_" in low else low
    key = re.sub(r"[_:\-\s]", "", low)
    for needle, kind in _KINDS:
        if needle in key:
            return kind
    return "other"


def _is_comm_cpu_name(name: str) -> bool:
    return name.startswith(COMM_CPU_PREFIXES) or name.startswith(COMM_CPU_EXTRA_PREFIXES) \
        or name in COMM_CPU_EXTRA_NAMES


def _tensor_bytes(shape, dtype) -> Optional[float]:
    """Bytes of one recorded tensor (its dims, its dtype name); None when either is unusable."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        return None
    size = _DTYPE_BYTES.get(str(dtype).lower())
    if size is None:
        return None
    return float(int(np.prod(shape, dtype=np.int64)) * size) if shape else float(size)


def _is_tensor_list(value) -> bool:
    """A recorded TensorList argument: a list of shapes (each a list of ints)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, list) and all(isinstance(d, int) for d in v) for v in value)


def _bytes_of(trace: TraceData, cpu_row: int) -> Optional[float]:
    """Input size of a collective's CPU span (needs record_shapes=True); None when not recorded.

    One input: the product of the first input's dims times its dtype size. A coalesced op
    (``*_coalesced*``) sums every tensor input, and an op whose first input is a list of
    tensors (a TensorList: a list of shapes in one argument) sums that list, as nccl-tests
    sizes a coalesced collective (the bytes of all its tensors)."""
    dims = trace.op_inputs.dims.get(int(cpu_row))
    types = trace.op_inputs.types.get(int(cpu_row))
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    first, dtype = dims[0], types[0]
    if _is_tensor_list(first):  # one argument holding several tensors
        dtypes = dtype if isinstance(dtype, list) else [dtype] * len(first)
        parts = [_tensor_bytes(d, t) for d, t in zip(first, dtypes)]
        return float(sum(parts)) if parts and None not in parts and len(dtypes) == len(first) else None
    if "coalesced" in trace.strings[int(trace.cpu.name[int(cpu_row)])]:
        parts = [_tensor_bytes(d, t) for d, t in zip(dims, types) if t not in ("", "Scalar", "ScalarList")]
        return float(sum(parts)) if parts and None not in parts else None
    return _tensor_bytes(first, dtype)


def _kernel_msg_bytes(trace: TraceData, rows: np.ndarray) -> List[Optional[float]]:
    """Per communication kernel row: ``In msg nelems`` x the size of its ``dtype``
    (collective metadata on the kernel, 2023-10+); None when either is missing or the
    dtype is unknown."""
    g = trace.gpu
    out: List[Optional[float]] = []
    for nelems, dtype in zip(g.msg_nelems[rows].tolist(), g.msg_dtype[rows].tolist()):
        size = _DTYPE_BYTES.get(trace.strings[dtype].lower()) if dtype >= 0 else None
        out.append(float(nelems * size) if nelems >= 0 and size is not None else None)
    return out


def _host_span_mask(trace: TraceData) -> np.ndarray:
    return (trace.cpu.kind == CPU_OP) | (trace.cpu.kind == CPU_USER_ANNOTATION)


def _collective_spans(trace: TraceData) -> np.ndarray:
    """Rows of trace.cpu that are the CPU span of one collective each: nccl:/gloo:/rccl:
    spans (one per collective call)."""
    ids = trace.string_ids(lambda s: s.startswith(COMM_CPU_PREFIXES))
    return np.flatnonzero(np.isin(trace.cpu.name, ids) & _host_span_mask(trace))


def _host_compute(c, is_comp: np.ndarray, is_comm: np.ndarray) -> iv.Intervals:
    """Union over threads of (compute spans - communication spans of the same thread).

    An op that encloses a collective on its own thread (autograd's AccumulateGrad around
    c10d::allreduce_) is not computing while the collective runs: only compute on
    another thread overlaps communication. The loop is over threads (few)."""
    threads = np.stack([c.pid, c.tid], 1)
    comm_threads = np.unique(threads[is_comm], axis=0) if is_comm.any() else np.empty((0, 2), np.int64)
    on_comm_thread = np.zeros(len(c), bool)
    starts, ends = [], []
    for pid, tid in comm_threads.tolist():
        mine = (c.pid == pid) & (c.tid == tid)
        on_comm_thread |= mine
        own = iv.subtract(iv.merge(c.ts[is_comp & mine], (c.ts + c.dur)[is_comp & mine]),
                          iv.merge(c.ts[is_comm & mine], (c.ts + c.dur)[is_comm & mine]))
        starts.append(own[0])
        ends.append(own[1])
    rest = is_comp & ~on_comm_thread
    starts.append(c.ts[rest])
    ends.append((c.ts + c.dur)[rest])
    return iv.merge(np.concatenate(starts), np.concatenate(ends))


def span_partial(trace: TraceData, steps: Optional[Steps], span=None) -> dict:
    """The rank view's input from one trace file (metrics §12).

    ``{"version", "rank", "world_size", "backend", "pg_count", "device": "gpu"|"cpu",
    "comm_source": "kernels"|"cpu_spans"|None, "steps": [{"step", "step_us",
    "compute_only_us", "overlapped_us", "exposed_comm_us", "other_us", "collectives":
    {"kind": [...], "dur_us": [...], "bytes": [...], "pg": [...], "seq": [...]},
    "activity": {ACTIVITY key: µs}}], "process_groups": [{"name", "desc", "size", "ranks"}],
    "collectives_truncated": bool}``.
    With no steps (or ``steps`` None after a failed steps section) ``steps`` is [] and
    ``not_available`` ({"distributed.steps": reason}, the report's convention) says why.
    ``span``: the report's per-span context (analysis/units.SpanContext), whose GPU→runtime
    index and op/call pairs are reused.
    """
    info = trace.meta.distributed_info if isinstance(trace.meta.distributed_info, dict) else {}
    rank = info.get("rank")
    out: dict = {
        "version": PARTIAL_VERSION,
        "rank": int(rank) if isinstance(rank, (int, float)) and not isinstance(rank, bool) else None,
        "world_size": _int_or_none(info.get("world_size")),
        "backend": info.get("backend") if isinstance(info.get("backend"), str) else None,
        "pg_count": _int_or_none(info.get("pg_count")),
        "device": None, "comm_source": None, "steps": [], "collectives_truncated": False,
        "process_groups": process_groups(trace),
    }
    if steps is None or steps.count == 0:
        out["not_available"] = {"distributed.steps": "no included step"}
        return out
    g, c = trace.gpu, trace.cpu
    kernels = g.kind == GPU_KERNEL
    comm_k = comm_kernel_mask(trace)
    gpu_trace = bool(kernels.any())
    out["device"] = "gpu" if gpu_trace else "cpu"
    coll_rows = _collective_spans(trace)
    groups = out["process_groups"]
    # collectives that name no process group belong to the only one the trace declares
    default_pg = groups[0]["name"] if len(groups) == 1 else None
    if gpu_trace:
        comp = iv.merge(g.ts[kernels & ~comm_k], (g.ts + g.dur)[kernels & ~comm_k])
        comm = iv.merge(g.ts[comm_k], (g.ts + g.dur)[comm_k])
    else:
        span = _host_span_mask(trace)
        comm_ids = trace.string_ids(_is_comm_cpu_name)
        step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
        is_comm = np.isin(c.name, comm_ids) & span
        is_comp = span & ~is_comm & ~np.isin(c.name, step_ids)
        comm = iv.merge(c.ts[is_comm], (c.ts + c.dur)[is_comm])
        comp = _host_compute(c, is_comp, is_comm)
    lo, hi = steps.inc_start, steps.inc_end
    total = hi - lo
    comp_us = iv.covered_in(comp, lo, hi)
    comm_us = iv.covered_in(comm, lo, hi)
    both_us = iv.covered_in(iv.intersect(comp, comm), lo, hi)
    compute_only = np.maximum(comp_us - both_us, 0.0)
    exposed = np.maximum(comm_us - both_us, 0.0)
    other = np.maximum(total - compute_only - both_us - exposed, 0.0)

    # The collectives: one entry per call, in start order, assigned to the included step
    # whose (stretched) window holds its start.
    if gpu_trace and comm_k.any():
        out["comm_source"] = "kernels"
        rows = np.flatnonzero(comm_k)
        starts, durs = g.ts[rows], g.dur[rows]
        names = [trace.strings[i] for i in g.name[rows]]
        kinds = [collective_kind(n) for n in names]
        # The CPU span (nccl:all_reduce ...) whose launching call holds the kernel's runtime
        # call names the kind where the kernel name does not (ROCm ncclDevKernel_Generic)
        # and carries the recorded input size.
        cpu_of = np.full(len(rows), -1, np.int64)
        if len(coll_rows):
            rt = (gpu_runtime_index(trace) if span is None else span_gpu_runtime(span))[rows]
            linked = rt >= 0
            if linked.any():
                cpu_of[linked] = innermost_enclosing(trace, coll_rows, rt[linked],
                                                     among=None if span is None else span_op_calls(span))
        # Bytes: the kernel's own collective metadata (2023-10+: "In msg nelems" x size of
        # "dtype") first, else the launching CPU span's recorded input.
        kernel_bytes = _kernel_msg_bytes(trace, rows)
        byts: List[Optional[float]] = []
        for j, row in enumerate(cpu_of.tolist()):
            if row >= 0 and kinds[j] == "other":
                kinds[j] = collective_kind(trace.strings[c.name[row]])
            if kernel_bytes[j] is not None:
                byts.append(kernel_bytes[j])
            else:
                byts.append(_bytes_of(trace, row) if row >= 0 else None)
        # the process group and sequence number the kernel's collective metadata names
        pg_ids, seq_col = g.pg_name[rows].tolist(), g.seq[rows].tolist()
        pgs = [trace.strings[i] if i >= 0 else default_pg for i in pg_ids]
        seqs = [int(q) if q >= 0 else None for q in seq_col]
    elif len(coll_rows):
        out["comm_source"] = "cpu_spans"
        rows = coll_rows
        starts, durs = c.ts[rows], c.dur[rows]
        kinds = [collective_kind(trace.strings[i]) for i in c.name[rows]]
        byts = [_bytes_of(trace, r) for r in rows.tolist()]
        pgs, seqs = [default_pg] * len(rows), [None] * len(rows)
    else:
        starts, durs, kinds, byts, pgs, seqs = np.empty(0), np.empty(0), [], [], [], []
    order = np.argsort(starts, kind="stable")
    step_of = np.searchsorted(lo, starts[order], side="right") - 1
    inside = (step_of >= 0) & (starts[order] < hi[np.maximum(step_of, 0)])
    per_step: List[Dict[str, list]] = [{"kind": [], "dur_us": [], "bytes": [], "pg": [], "seq": []}
                                       for _ in range(len(lo))]
    for k, s, ok in zip(order.tolist(), step_of.tolist(), inside.tolist()):
        if not ok:
            continue
        entry = per_step[s]
        if len(entry["kind"]) >= MAX_COLLECTIVES_PER_STEP:
            out["collectives_truncated"] = True
            continue
        entry["kind"].append(kinds[k])
        entry["dur_us"].append(float(durs[k]))
        entry["bytes"].append(byts[k])
        entry["pg"].append(pgs[k])
        entry["seq"].append(seqs[k])

    act = step_activity(trace, lo, hi, comp, gpu_trace, span)
    p2p = point_to_point(trace, lo, hi, comp, gpu_trace, span)
    for i, n in enumerate(steps.inc_numbers.tolist()):
        out["steps"].append({
            "step": int(n), "step_us": float(total[i]),
            "compute_only_us": float(compute_only[i]), "overlapped_us": float(both_us[i]),
            "exposed_comm_us": float(exposed[i]), "other_us": float(other[i]),
            "collectives": per_step[i], "activity": {k: float(v[i]) for k, v in act.items()},
        })
        if p2p is not None:
            out["steps"][-1].update(p2p=p2p["calls"][i], bubble_us=float(p2p["bubble_us"][i]),
                                    microbatches=p2p["microbatches"][i], pp_stages=p2p["pp_stages"][i],
                                    pp_actions=p2p["pp_actions"][i])
    return out


# c10d point-to-point ops (their peer: trace.op_inputs.peers) and the backend spans they run
P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
P2P_SPANS = ("gloo:send", "gloo:recv", "nccl:send", "nccl:recv", "rccl:send", "rccl:recv")
_MICROBATCH = re.compile(r"^(?:Forward (\d+)|PP:\d+F(\d+))$")
# torch.distributed.pipelining's action labels: PP:<stage><computation><microbatch> ("PP:2I1")
_PP_ACTION = re.compile(r"^PP:(\d+)([A-Z]+)(\d+)$")


def point_to_point(trace: TraceData, lo: np.ndarray, hi: np.ndarray, comp: iv.Intervals, gpu_trace: bool,
                   span=None) -> Optional[dict]:
    """Per included step (METRICS.md §12 "Pipeline parallelism"): the c10d point-to-point
    calls in start order ({"kind", "peer", "dur_us", "bytes"}), the bubble (µs blocked in
    point-to-point communication, not computing) and the microbatches torch.distributed.pipelining
    labelled ("Forward i", "PP:<stage>F<i>"; None without labels). None without any call."""
    c = trace.cpu
    host = _host_span_mask(trace)
    ops = np.flatnonzero(np.isin(c.name, trace.string_ids(lambda s: s in P2P_OPS)) & host)
    if not len(ops):
        return None
    ops = ops[np.argsort(c.ts[ops], kind="stable")]
    step_of = np.searchsorted(lo, c.ts[ops], side="right") - 1
    inside = (step_of >= 0) & (c.ts[ops] < hi[np.maximum(step_of, 0)])
    calls: List[Dict[str, list]] = [{"kind": [], "peer": [], "dur_us": [], "bytes": []} for _ in range(len(lo))]
    peers = trace.op_inputs.peers
    for row, st, ok in zip(ops.tolist(), step_of.tolist(), inside.tolist()):
        if not ok or len(calls[st]["kind"]) >= MAX_COLLECTIVES_PER_STEP:
            continue
        name = trace.strings[c.name[row]]
        calls[st]["kind"].append("send" if name == "c10d::send" else "recv")
        calls[st]["peer"].append(peers.get(row))
        calls[st]["dur_us"].append(float(c.dur[row]))
        calls[st]["bytes"].append(_bytes_of(trace, row))
    op_ints = iv.merge(c.ts[ops], (c.ts + c.dur)[ops])
    if gpu_trace:
        # the stream waits in the send/recv kernels the c10d ops launched
        g, rt = trace.gpu, trace.runtime
        rows = np.flatnonzero(comm_kernel_mask(trace))
        rt_row = (gpu_runtime_index(trace) if span is None else span_gpu_runtime(span))[rows]
        launched = np.where(rt_row >= 0, rt.ts[np.maximum(rt_row, 0)] if len(rt) else 0.0, np.nan)
        rows = rows[_inside(op_ints, launched)]
        blocked = iv.merge(g.ts[rows], (g.ts + g.dur)[rows])
    else:
        # compute = the CPU ops that are not communication (the labels around a microbatch, user
        # annotations such as "Forward 0", enclose its waits)
        ops_comp = (c.kind == CPU_OP) & ~np.isin(c.name, trace.string_ids(_is_comm_cpu_name))
        comp = iv.merge(c.ts[ops_comp], (c.ts + c.dur)[ops_comp])
        recv = np.flatnonzero(np.isin(c.name, trace.string_ids(lambda s: s in P2P_SPANS and "recv" in s)) & host)
        send = np.flatnonzero(np.isin(c.name, trace.string_ids(lambda s: s in P2P_SPANS and "send" in s)) & host)
        # a send span lasts from enqueue to completion while the thread goes on with the next
        # microbatch: only its part after the last compute that ends inside it is waiting for it
        a, b = c.ts[send], (c.ts + c.dur)[send]
        k = np.searchsorted(comp[0], b, side="left") - 1  # the last compute interval starting before b
        last_end = np.where(k >= 0, comp[1][np.maximum(k, 0)] if len(comp[0]) else a, a)
        a = np.maximum(a, np.minimum(last_end, b))
        blocked = iv.merge(np.concatenate([op_ints[0], c.ts[recv], a]),
                           np.concatenate([op_ints[1], (c.ts + c.dur)[recv], b]))
    bubble = iv.covered_in(iv.subtract(blocked, comp), lo, hi)
    micro: List[Optional[int]] = [None] * len(lo)
    seen: Dict[int, set] = {}
    for k, m in _labels_in_steps(trace, host, _MICROBATCH, lo, hi):
        seen.setdefault(k, set()).add(int(m.group(1) or m.group(2)))
    for k, mbs in seen.items():
        micro[k] = len(mbs)
    # the schedule's actions: the stages this rank runs (several: an interleaved schedule) and
    # the computations (I and W: backward split into input and weight gradients, zero bubble)
    stages: List[Optional[list]] = [None] * len(lo)
    kinds: List[Optional[list]] = [None] * len(lo)
    found: Dict[int, tuple] = {}
    for k, m in _labels_in_steps(trace, host, _PP_ACTION, lo, hi):
        got = found.setdefault(k, (set(), set()))
        got[0].add(int(m.group(1)))
        got[1].add(m.group(2))
    for k, (sts, kds) in found.items():
        stages[k], kinds[k] = sorted(sts), sorted(kds)
    return {"calls": calls, "bubble_us": bubble, "microbatches": micro, "pp_stages": stages, "pp_actions": kinds}


def _labels_in_steps(trace: TraceData, host: np.ndarray, pattern, lo: np.ndarray, hi: np.ndarray):
    """(step index, match) for each host event whose name matches ``pattern`` and that starts
    inside step [lo, hi): the pipelining labels (few per step)."""
    c = trace.cpu
    rows = np.flatnonzero(np.isin(c.name, trace.string_ids(lambda s: bool(pattern.match(s)))) & host)
    if not len(rows):
        return
    st = np.searchsorted(lo, c.ts[rows], side="right") - 1
    for row, k in zip(rows.tolist(), st.tolist()):
        if k >= 0 and c.ts[row] < hi[k]:
            yield k, pattern.match(trace.strings[c.name[row]])


def process_groups(trace: TraceData) -> List[dict]:
    """The process groups a trace declares (METRICS.md §12 "Process groups"):
    ``distributedInfo.pg_config`` (name, description, size, ranks), then the groups that only
    the collectives' metadata names ("Process Group Name"/"Process Group Ranks" on kernels)."""
    info = trace.meta.distributed_info if isinstance(trace.meta.distributed_info, dict) else {}
    out: Dict[str, dict] = {}
    for p in info.get("pg_config") or [] if isinstance(info.get("pg_config"), list) else []:
        if not isinstance(p, dict) or p.get("pg_name") is None:
            continue
        ranks = p.get("ranks")
        ranks = [int(r) for r in ranks] if isinstance(ranks, list) and all(
            isinstance(r, int) and not isinstance(r, bool) for r in ranks) else None
        out[str(p["pg_name"])] = {"name": str(p["pg_name"]),
                                  "desc": p.get("pg_desc") if isinstance(p.get("pg_desc"), str) else None,
                                  "size": _int_or_none(p.get("pg_size")) or (len(ranks) if ranks else None),
                                  "ranks": ranks}
    g = trace.gpu
    named = g.pg_name >= 0
    if named.any():
        pairs = np.unique(np.stack([g.pg_name[named], g.pg_ranks[named], g.group_size[named]], 1), axis=0)
        for name_id, ranks_id, size in pairs.tolist():
            name = trace.strings[name_id]
            ranks = _ranks_text(trace.strings[ranks_id]) if ranks_id >= 0 else None
            row = out.setdefault(name, {"name": name, "desc": None, "size": None, "ranks": None})
            if row["ranks"] is None and ranks:
                row["ranks"] = ranks
            if row["size"] is None:
                row["size"] = int(size) if size > 0 else (len(ranks) if ranks else None)
    return list(out.values())


def _ranks_text(text: str) -> Optional[List[int]]:
    """'"[0, 1]"' or '[0, 1]' (the raw JSON text of "Process Group Ranks") -> [0, 1]; None if not that."""
    import json

    try:
        v = json.loads(text)
        if isinstance(v, str):
            v = json.loads(v)
    except (ValueError, TypeError):
        return None
    return [int(x) for x in v] if isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v) else None


# What one rank did in a step, besides communicating (METRICS.md §12 "The straggler's cause"):
# the straggler's minus the median of the other ranks of its group names why it arrives late.
ACTIVITY = ("dataloader_us", "h2d_us", "sync_us", "compute_forward_us", "compute_backward_us",
            "compute_optimizer_us", "host_gap_us")
# On a GPU trace, besides: each kernel family's compute (compilation.kernel_family of the kernel
# name), so that a compute cause says which kind of kernel the straggler runs longer.
KERNEL_FAMILY_ACTIVITY = {"gemm": "compute_gemm_us", "attention": "compute_attention_us",
                          "triton": "compute_triton_us", "other": "compute_other_kernels_us"}
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
OPTIMIZER_PREFIX = "Optimizer.step#"


def step_activity(trace: TraceData, lo: np.ndarray, hi: np.ndarray, comp: iv.Intervals, gpu_trace: bool,
                  span=None) -> Dict[str, np.ndarray]:
    """Per included step window [lo, hi): µs of each ACTIVITY (each measured on its own: the
    parts may overlap), and on a GPU trace of each KERNEL_FAMILY_ACTIVITY. ``comp``: the rank's
    compute intervals (§12: kernels on a GPU trace, host compute on a CPU-only one)."""
    from .breakdown import dataloader_mask, union_merged
    from .signals import SYNC_CALLS, SYNC_MEMCPY_CALLS

    c, g, rt = trace.cpu, trace.gpu, trace.runtime
    host = _host_span_mask(trace)

    def union(mask_or_rows, table):
        starts = table.ts[mask_or_rows]  # (ts + dur of the rows only: no sum over every row)
        return iv.merge(starts, starts + table.dur[mask_or_rows])

    def cover(ints):
        return iv.covered_in(ints, lo, hi)

    loader = union(dataloader_mask(trace) & host, c)
    backward = union(np.isin(c.name, trace.string_ids(lambda s: s.startswith(BACKWARD_PREFIX))) & host, c)
    optimizer = union(np.isin(c.name, trace.string_ids(lambda s: s.startswith(OPTIMIZER_PREFIX))) & host, c)
    h2d = union((g.kind == GPU_MEMCPY) & np.isin(g.name, trace.string_ids(lambda s: "HtoD" in s)), g)
    sync = union(np.isin(rt.name, trace.string_ids(lambda s: s in SYNC_CALLS or s in SYNC_MEMCPY_CALLS)), rt)
    if gpu_trace:
        # a kernel's phase is that of the host call that launched it
        kern = (g.kind == GPU_KERNEL) & ~comm_kernel_mask(trace)
        rows = np.flatnonzero(kern)
        rt_row = (gpu_runtime_index(trace) if span is None else span_gpu_runtime(span))[rows]
        launched = np.where(rt_row >= 0, rt.ts[np.maximum(rt_row, 0)] if len(rt) else 0.0, np.nan)
        in_bwd = _inside(backward, launched)
        in_opt = _inside(optimizer, launched) & ~in_bwd
        bwd_k, opt_k = rows[in_bwd], rows[in_opt]
        comp_bwd, comp_opt = union(bwd_k, g), union(opt_k, g)
        comp_rest = iv.subtract(comp, iv.merge(np.concatenate([comp_bwd[0], comp_opt[0]]),
                                               np.concatenate([comp_bwd[1], comp_opt[1]])))
        by_family = _kernel_family_activity(trace, kern, union, cover)
    else:
        by_family = {}
        comp_bwd = iv.intersect(comp, backward)
        comp_opt = iv.subtract(iv.intersect(comp, optimizer), backward)
        taken = iv.merge(np.concatenate([loader[0], backward[0], optimizer[0]]),
                         np.concatenate([loader[1], backward[1], optimizer[1]]))
        comp_rest = iv.subtract(comp, taken)
    # host gaps: the step's time in which no host span other than communication (and the
    # ProfilerStep itself) and no runtime call runs, on any thread
    comm_ids = trace.string_ids(_is_comm_cpu_name)
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    busy_mask = host & ~np.isin(c.name, comm_ids) & ~np.isin(c.name, step_ids)
    # (each table's union first: a table in start or end order merges without a sort, and the
    # union of the two unions is the same union, in the same pieces)
    host_busy = union(busy_mask, c)
    del busy_mask
    # (breakdown.union_merged: the few calls fused into the host's union without concatenating
    # and sorting 16 bytes per host event: the section's peak on 10M tiny events)
    busy = union_merged(host_busy, [union(np.ones(len(rt), bool), rt)])
    del host_busy
    return {"dataloader_us": cover(loader), "h2d_us": cover(h2d), "sync_us": cover(sync),
            "compute_forward_us": cover(comp_rest), "compute_backward_us": cover(comp_bwd),
            "compute_optimizer_us": cover(comp_opt),
            "host_gap_us": np.maximum((hi - lo) - cover(busy), 0.0), **by_family}


def _kernel_family_activity(trace: TraceData, kern: np.ndarray, union, cover) -> Dict[str, np.ndarray]:
    """Per step, µs of compute kernels (``kern``) of each family: one name classification per
    distinct kernel name."""
    from .compilation import kernel_family

    names = trace.gpu.name
    rows = np.flatnonzero(kern)
    out = {}
    if not len(rows):
        return {key: cover(union(rows, trace.gpu)) for key in KERNEL_FAMILY_ACTIVITY.values()}
    uniq, inv = unique_inverse(names[rows])  # (dense name ids: no sort)
    fam = [kernel_family(trace.strings[int(i)]) for i in uniq.tolist()]
    for family, key in KERNEL_FAMILY_ACTIVITY.items():
        out[key] = cover(union(rows[np.array([f == family for f in fam], bool)[inv]], trace.gpu))
    return out


def _inside(ints: iv.Intervals, t: np.ndarray) -> np.ndarray:
    """Whether each time t (NaN: never) lies in one of the merged intervals."""
    s, e = ints
    if not len(s):
        return np.zeros(len(t), bool)
    k = np.searchsorted(s, np.nan_to_num(t, nan=-np.inf), side="right") - 1
    return ~np.isnan(t) & (k >= 0) & (t < e[np.maximum(k, 0)])


def _int_or_none(v) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
