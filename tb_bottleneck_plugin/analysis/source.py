"""Time by the user's source line, nn.Module and record_function label (METRICS.md §17).

- ``source_view(trace, steps, gpu_runtime=None, not_available=None) -> section``: the span
  maths, vectorised over one nesting of every host event (Python frames, CPU ops, user
  annotations, runtime calls) per thread (operators.host_nesting, shared with the Operator view).
- The **user frame** of a host event: walking up its stack (enclosing ``python_function``
  frames on the same pid/tid, or the old per-op ``Call stack`` arg), the first frame whose
  file is not inside the Python installation, site-/dist-packages or torch (``is_library_file``).
  GPU activity inherits the frame of the runtime call that launched it (correlation).
  Ops of the autograd engine's thread (no Python frame there) inherit the frame of the Python
  thread of the same process that waits in ``backward`` at that time.
- ``UNIT``: the metric unit (analysis/units.py), section ``source_attribution``.

Python frames of ``with_stack=True`` traces are named ``file(line): function`` with the
*function's first line* (``co_firstlineno``), not the line being executed; the old ``Call
stack`` arg names the executing line. ``frame_naming`` in the section says which.
"""
from __future__ import annotations

import functools
import json
import re
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..trace.model import CPU_OP, CPU_PYTHON, CPU_USER_ANNOTATION, TraceData
from . import intervals as iv
from .breakdown import dataloader_mask
from .operators import _nearest, _strict, _strict_none, host_nesting, op_nesting, span_host_nesting
from .units import Unit, NONE_FAILED, pct

NAME = "source_attribution"  # report["source"] is already the trace path
NO_STACK = ("the trace has no Python stacks (no python_function frames and no `Call stack` args): "
            "record with torch.profiler.profile(with_stack=True)")
NO_MODULES = ("the trace has no `nn.Module: <Class>_<id>` frames: record with "
              "torch.profiler.profile(with_stack=True) (torch >= 2.0 adds them for nn.Module calls)")
HINT = "record with torch.profiler.profile(with_stack=True)"
TOP_LINES = 50  # lines in the section (and its partial), most CPU + GPU time first
TOP_BOTTLENECK = 5  # lines per bottleneck kind
MAX_MODULES = 2000
MAX_LABELS = 100
MAX_SKIPPED = 8

_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
# Top-level packages of relative frame paths that are libraries. The profiler writes paths
# relative to the sys.path entry they were found under, so `transformers/models/x.py` (site-
# packages) and `mypkg/train.py` (the script's directory) look alike: a relative path is the
# user's unless its top-level name is the standard library's or one of these.
LIBRARY_ROOTS = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "torchdata", "torchrec", "functorch", "triton",
    "transformers", "accelerate", "datasets", "tokenizers", "safetensors", "huggingface_hub", "diffusers",
    "peft", "trl", "timm", "lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics", "apex",
    "deepspeed", "megatron", "fairscale", "xformers", "flash_attn", "numpy", "scipy", "pandas", "PIL",
    "cv2", "albumentations", "sklearn", "tqdm", "einops", "typing_extensions", "packaging", "google",
    "tensorboard", "wandb", "hydra", "omegaconf", "importlib_metadata", "filelock", "fsspec", "jinja2",
    "sympy", "networkx", "six", "yaml", "regex", "requests", "urllib3", "attr", "attrs", "pydantic",
    "IPython", "ipykernel", "_pytest", "pytest", "pkg_resources", "setuptools", "site", "runpy",
})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
_LIB_PATH = re.compile(r"[/\\](site-packages|dist-packages)[/\\]|[/\\]lib(64)?[/\\]python\d[^/\\]*[/\\]"
                       r"|[/\\]Lib[/\\]|[/\\]torch[/\\]|^torch[/\\]")
_BACKWARD_FUNCS = frozenset({"backward", "_engine_run_backward", "grad"})


def _at(values: np.ndarray, index: np.ndarray, fill) -> np.ndarray:
    """values[index] where index >= 0, else ``fill`` (also for an empty ``values``: a trace
    with GPU activity but no host events has no node to index)."""
    ok = index >= 0
    out = np.full(len(index), fill, dtype=values.dtype if len(values) else np.asarray(fill).dtype)
    if len(values) and ok.any():
        out[ok] = values[index[ok]]
    return out


# Frames repeat across call stacks and spans (a few thousand distinct texts): parsed once.
@functools.lru_cache(maxsize=1 << 14)
def parse_frame(name: str) -> Optional[Tuple[str, int, str]]:
    """``file(line): function`` -> (file, line, function); None for other names
    (``<built-in ...>``, ``nn.Module: ...``)."""
    m = _FRAME.match(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def is_library_file(path: str) -> bool:
    """Whether a frame's file is not the user's: not a file (``<frozen os>``, ``<string>``),
    inside the Python installation, site-/dist-packages or torch (absolute paths), or a
    relative path whose top-level name is the standard library's or in LIBRARY_ROOTS."""
    if not path or path.startswith("<"):
        return True
    if path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[/\\]", path):
        return bool(_LIB_PATH.search(path))
    if _LIB_PATH.search(path):
        return True
    top = re.split(r"[/\\]", path, 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top in _STDLIB or top in LIBRARY_ROOTS


@functools.lru_cache(maxsize=1 << 14)
def is_user_frame(name: str) -> bool:
    parsed = parse_frame(name)
    return parsed is not None and not is_library_file(parsed[0])


def _stack_entries(text: str) -> List[str]:
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    return [e for e in str(value).split(";") if e] if value else []


class _Keys:
    """Local string table of frame keys."""

    def __init__(self):
        self.ids: Dict[str, int] = {}
        self.names: List[str] = []

    def get(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


def _in_windows(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each time lies in one of the sorted disjoint windows [lo, hi)."""
    if not len(lo):
        return np.zeros(len(ts), bool)
    out = np.empty(len(ts), bool)
    for a in range(0, len(ts), _BLOCK):  # (in blocks: the index temporaries are a block's)
        t = ts[a:a + _BLOCK]
        i = np.searchsorted(lo, t, side="right") - 1
        out[a:a + _BLOCK] = (i >= 0) & (t < hi[np.maximum(i, 0)])
    return out


_BLOCK = 1 << 18


def _sum_inside(thr_a, ts_a, w, thr_q, lo_q, hi_q) -> np.ndarray:
    """For each query window (thread, [lo, hi]), Σ w of the points (thread, ts) inside."""
    out = np.zeros(len(lo_q))
    if not len(ts_a) or not len(lo_q):
        return out
    order = np.lexsort((ts_a, thr_a))
    t_s, x_s = thr_a[order], ts_a[order]
    cum = np.concatenate([[0.0], np.cumsum(w[order])])
    for t in np.unique(thr_q):
        a, b = np.searchsorted(t_s, t, "left"), np.searchsorted(t_s, t, "right")
        if a == b:
            continue
        sel = thr_q == t
        lo = a + np.searchsorted(x_s[a:b], lo_q[sel], "left")
        hi = a + np.searchsorted(x_s[a:b], hi_q[sel], "right")
        out[sel] = cum[hi] - cum[lo]
    return out


def _line_fields(key: str) -> dict:
    parsed = parse_frame(key)
    if parsed is None:
        return {"frame": key, "file": None, "line": None, "function": None}
    return {"frame": key, "file": parsed[0], "line": parsed[1], "function": parsed[2]}


def source_view(trace: TraceData, steps, gpu_runtime: Optional[np.ndarray] = None,
                not_available: Optional[Dict[str, str]] = None, host=None) -> dict:
    """The span's ``source`` section (module docstring; METRICS.md §17). ``host``:
    operators.host_nesting(trace) when the caller has it."""
    na = not_available if not_available is not None else {}
    cpu, rt, gpu, S = trace.cpu, trace.runtime, trace.gpu, trace.strings
    nc, nr = len(cpu), len(rt)
    if gpu_runtime is None:
        from .linking import gpu_runtime_index
        gpu_runtime = gpu_runtime_index(trace)
    # --- one nesting of every host event (cpu rows, then runtime rows) --------------------
    if host is None:
        host = host_nesting(trace)
    ts, dur, end = host["ts"], host["dur"], host["end"]
    parent = host["parent"]
    n = nc + nr
    kind = np.concatenate([cpu.kind, np.full(nr, -1, np.int8)])
    name = np.concatenate([cpu.name, np.full(nr, -1, np.int32)])
    is_py = kind == CPU_PYTHON
    # ProfilerStep#N (an Operator in old traces, with the profiler's own stack) is no op here
    not_step = ~np.isin(name, trace.string_ids(lambda s: s.startswith("ProfilerStep#")))
    is_op = (kind == CPU_OP) & not_step
    del kind
    # frame classes per distinct name
    py_names = np.unique(name[is_py]) if is_py.any() else np.zeros(0, np.int32)
    user_ids, module_ids, bwd_ids = [], [], []
    for nid in py_names.tolist():
        s = S[nid]
        if s.startswith("nn.Module: "):
            module_ids.append(nid)
            continue
        parsed = parse_frame(s)
        if parsed is not None and not is_library_file(parsed[0]):
            user_ids.append(nid)
        func = parsed[2] if parsed else ""
        if func in _BACKWARD_FUNCS or "run_backward" in s:
            bwd_ids.append(nid)
    # (a trace without Python frames or `Call stack` args, e.g. one recorded without with_stack:
    # its per-node masks, keys and ways are read-only broadcasts, no memory per node; they are
    # written only where a frame or a call stack is found)
    no = np.broadcast_to(False, (n,))
    any_py = bool(len(py_names))
    is_user = is_py & np.isin(name, user_ids) if any_py else no
    is_module = is_py & np.isin(name, module_ids) if any_py else no
    is_bwd = is_py & np.isin(name, bwd_ids) if any_py else no
    if cpu.call_stack.strides == (0,) and (not nc or cpu.call_stack[0] < 0):  # (a constant column: none)
        has_cs = no
    else:
        has_cs = np.concatenate([cpu.call_stack >= 0, np.zeros(nr, bool)]) & not_step
    del not_step
    has_frames = bool(is_user.any())
    has_stack = has_frames or bool(has_cs.any())
    # (without frames or call stacks: one read-only -1 per node, no memory per node)
    none = np.broadcast_to(np.int64(-1), (n,))
    uf = _nearest(parent, is_user) if has_frames else none
    cs = _nearest(parent, has_cs) if has_cs.any() else none
    # --- frame key of each node ----------------------------------------------------------
    keys = _Keys()
    stackless = not any_py and not has_cs.any()
    # (int32: an index into keys.names)
    key = np.broadcast_to(np.int32(-1), (n,)) if stackless else np.full(n, -1, np.int32)
    how = np.broadcast_to(np.int8(0), (n,)) if stackless else np.zeros(n, np.int8)  # 1 python frame, 2 call stack,
    # 3/4 backward thread
    if has_frames:
        fnames = np.unique(name[uf[uf >= 0]])
        fkey = {int(f): keys.get(S[f]) for f in fnames.tolist()}
        hit = uf >= 0
        lut = np.full(len(S), -1, np.int64)
        for f, k in fkey.items():
            lut[f] = k
        key[hit] = lut[name[uf[hit]]]
        how[hit] = 1
    cs_user: Dict[int, Tuple[int, List[str]]] = {}
    cs_bwd = np.zeros(len(S), bool)  # call stacks inside backward()
    if has_cs.any():
        lut = np.full(len(S), -1, np.int64)
        for sid in np.unique(cpu.call_stack[cpu.call_stack >= 0]).tolist():
            entries = _stack_entries(S[sid])
            cs_bwd[sid] = any((parse_frame(e) or ("", 0, ""))[2] in _BACKWARD_FUNCS for e in entries)
            for i, e in enumerate(entries):
                if is_user_frame(e):
                    lut[sid] = keys.get(e)
                    cs_user[sid] = (lut[sid], entries[:i])
                    break
        hit = (key < 0) & (cs >= 0)
        key[hit] = lut[cpu.call_stack[cs[hit]]]
        how[hit & (key >= 0)] = 2
    # --- autograd-engine threads: adopt the waiting Python thread's context ---------------
    anchor = None  # (np.arange(n), made only when an event adopts another's: 8 bytes per node)
    in_bwd = _nearest(parent, is_bwd) if is_bwd.any() else None
    thr = host["thread"]  # dense thread ids, in (pid, tid) order
    n_thr = int(thr.max()) + 1 if n else 0
    thr_pid = host["thread_pid"]

    def threads_of(mask) -> set:
        return set(np.flatnonzero(np.bincount(thr[mask], minlength=n_thr)).tolist())

    stack_threads = threads_of(is_py | has_cs)
    py_threads = threads_of(is_py)
    want = (key < 0) & ~is_py & (cs < 0) if stack_threads else None  # nothing to adopt from
    for t in (sorted(threads_of(want) - stack_threads) if stack_threads else ()):
        q = np.flatnonzero(want & (thr == t))
        for t2 in sorted(stack_threads):
            if thr_pid[t2] != thr_pid[t] or not len(q):
                continue
            if t2 not in py_threads:  # old traces: the last op with a `Call stack` before, if in backward()
                on = np.flatnonzero((thr == t2) & has_cs)
                on = on[np.argsort(ts[on], kind="stable")]
                j = np.searchsorted(ts[on], ts[q], side="right") - 1
                cand = np.where(j >= 0, on[np.maximum(j, 0)], -1)
                ok = cand >= 0
                ok[ok] = cs_bwd[cpu.call_stack[cand[ok]]]
                got = q[ok]
                anchor = np.arange(n) if anchor is None else anchor
                anchor[got] = cand[ok]
                key[got] = key[cand[ok]]
                how[got] = 4
                q = q[~ok]
                continue
            if in_bwd is None:
                continue
            on = np.flatnonzero(thr == t2)
            on = on[np.lexsort((-end[on], ts[on]))]
            j = np.searchsorted(ts[on], ts[q], side="right") - 1
            cand = np.where(j >= 0, on[np.maximum(j, 0)], -1)
            for _ in range(512):  # walk up to the innermost event still open at ts[q]
                open_ = cand >= 0
                open_[open_] = end[cand[open_]] < ts[q[open_]]
                if not open_.any():
                    break
                cand[open_] = parent[cand[open_]]
            ok = cand >= 0
            ok[ok] = in_bwd[cand[ok]] >= 0
            got = q[ok]
            anchor = np.arange(n) if anchor is None else anchor
            anchor[got] = cand[ok]
            key[got] = key[cand[ok]]
            how[got] = 3
            q = q[~ok]
    # --- included steps ------------------------------------------------------------------
    h_lo, h_hi = steps.inc_host_start, steps.inc_host_end
    order = np.argsort(h_lo)
    h_lo, h_hi = h_lo[order], h_hi[order]
    host_steps_us = float((h_hi - h_lo).sum())
    steps_us = float(steps.durations.sum()) if steps.count else 0.0
    inc_node = _in_windows(ts, h_lo, h_hi)
    g_node = np.where(gpu_runtime >= 0, nc + gpu_runtime, -1)
    if steps.gpu_step is not None and len(steps.gpu_step) == len(gpu):
        inc_gpu = (steps.gpu_step >= 0) & steps.included[np.maximum(steps.gpu_step, 0)] if len(gpu) else \
            np.zeros(0, bool)
    else:
        inc_gpu = _at(inc_node, g_node, False)
    # kernels replayed from a CUDA graph whose capture the trace records: the capture-time launch
    # call (inside its op, module and line) instead of the cudaGraphLaunch (issue 34 item 2;
    # the step stays the replay's)
    from .graph_replays import replays

    gr = replays(trace, gpu_runtime)
    if gr is not None and (gr["capture_call"] >= 0).any():
        hit = gr["capture_call"] >= 0
        g_node[gr["kernels"][hit]] = nc + gr["capture_call"][hit]
    gdur = np.maximum(np.nan_to_num(gpu.dur, nan=0.0), 0.0)
    g_key = _at(key, g_node, -1)
    # what a worker summary pairs with another span's capture (METRICS.md §17; issue 34 item 2)
    graph = _graph_sources(trace, gr, key, keys, parent, is_module, name, nc, inc_gpu, gdur) if gr else None
    gpu_us = float(gdur[inc_gpu].sum())
    # --- per line ------------------------------------------------------------------------
    nk = len(keys.names)
    if nk:
        op_near = _nearest(parent, is_op)
        top_op = is_op & _strict_none(parent, op_near) & inc_node
        del op_near  # (8 bytes per node, not held through the sections below)
        top_op &= key >= 0
        cpu_lines = {"cpu_us": np.bincount(key[top_op], dur[top_op], minlength=nk),
                     "calls": np.bincount(key[top_op], minlength=nk)}
        del top_op
    else:  # no frame key: no line (the top-level ops are not needed: an 8-byte walk per node)
        cpu_lines = {"cpu_us": np.zeros(0), "calls": np.zeros(0, np.int64)}
    lines = {
        **cpu_lines,
        "gpu_us": np.bincount(g_key[inc_gpu & (g_key >= 0)], gdur[inc_gpu & (g_key >= 0)], minlength=nk),
        "kernels": np.bincount(g_key[inc_gpu & (g_key >= 0)], minlength=nk),
    }
    unattributed_gpu = float(gdur[inc_gpu & (g_key < 0)].sum())
    # --- bottlenecks: sync calls, DataLoader waits ---------------------------------------
    from .signals import sync_rows

    merged = iv.merge(h_lo, h_hi)
    s_rows = nc + sync_rows(trace, gpu_runtime)
    s_us = iv.covered_in(merged, ts[s_rows], end[s_rows]) if len(s_rows) else np.zeros(0)
    d_rows = np.flatnonzero(dataloader_mask(trace))
    d_us = iv.covered_in(merged, ts[d_rows], end[d_rows]) if len(d_rows) else np.zeros(0)

    def chain(node: int) -> Tuple[Optional[str], List[str]]:
        """(outermost CPU op below the user frame, skipped frames innermost first)."""
        stop = uf[node] if how[node] == 1 else -1
        top, skipped, i = None, [], node
        while i >= 0 and i != stop and (how[node] != 2 or key[i] == key[node]):
            if is_op[i]:
                top = S[name[i]]
            elif is_py[i] and not is_module[i]:
                skipped.append(S[name[i]])
            i = parent[i]
        if how[node] == 3:  # the waiting thread's frames above the adopted event
            i, stop = anchor[node], uf[anchor[node]]
            while i >= 0 and i != stop:
                if is_py[i] and not is_module[i]:
                    skipped.append(S[name[i]])
                i = parent[i]
        if how[node] in (2, 4):
            sid = int(cpu.call_stack[cs[node] if how[node] == 2 else anchor[node]])
            skipped = skipped + cs_user.get(sid, (0, []))[1]
        return top, skipped[:MAX_SKIPPED]

    def bottleneck(rows: np.ndarray, us: np.ndarray) -> Tuple[dict, float]:
        inside = us > 0
        rows, us = rows[inside], us[inside]
        out: Dict[str, dict] = {}
        k = key[rows]
        for kid in np.unique(k).tolist():
            sel = k == kid
            heaviest = int(rows[sel][np.argmax(us[sel])])
            op, skipped = chain(heaviest)
            label = keys.names[kid] if kid >= 0 else "(no stack)"
            out[label] = {"us": float(us[sel].sum()), "count": int(sel.sum()), "op": op,
                          "skipped": skipped, "via": _VIA[int(how[heaviest])]}
        return out, float(us.sum())

    sync, sync_us = bottleneck(s_rows, s_us)
    dl, dl_us = bottleneck(d_rows, d_us)
    line_rows = []
    for kid, k in enumerate(keys.names):
        row = dict(_line_fields(k), cpu_us=float(lines["cpu_us"][kid]), calls=int(lines["calls"][kid]),
                   gpu_us=float(lines["gpu_us"][kid]), kernels=int(lines["kernels"][kid]),
                   sync_us=(sync.get(k) or {}).get("us", 0.0), dataloader_us=(dl.get(k) or {}).get("us", 0.0))
        if row["cpu_us"] or row["gpu_us"] or row["sync_us"] or row["dataloader_us"]:
            line_rows.append(row)
    line_rows.sort(key=lambda r: -(r["cpu_us"] + r["gpu_us"]))
    # --- modules -------------------------------------------------------------------------
    modules = _modules(trace, parent, is_module, is_op, name, ts, dur, inc_node, g_node, inc_gpu, gdur, anchor,
                       thr_pid, thr, nc)
    # --- record_function labels ----------------------------------------------------------
    labels, label_union = _labels(trace, steps, thr, ts, anchor, g_node, inc_gpu, gdur, h_lo, h_hi)
    section = {
        "has_stack": has_stack,
        "stack_source": "python_function" if has_frames else ("call_stack" if has_stack else None),
        "frame_naming": ("function's first line" if has_frames else
                         "line being executed" if has_stack else None),
        "steps_us": steps_us, "host_steps_us": host_steps_us, "gpu_us": gpu_us,
        "unattributed_gpu_us": unattributed_gpu if has_stack else None,
        "lines": line_rows[:TOP_LINES] if has_stack else None,
        "sync_us": sync_us, "dataloader_us": dl_us,
        "bottlenecks": ({"sync": _top(sync, steps_us), "dataloader": _top(dl, steps_us)} if has_stack else None),
        "modules": modules,
        "labels": with_kind(labels), "label_union_us": label_union,
        "label_coverage_pct": pct(label_union, host_steps_us),
        "hint": None if has_stack and modules is not None else HINT,
        "graph_replays": graph,
    }
    if not has_stack:
        for k in ("lines", "bottlenecks", "unattributed_gpu_us"):
            na[f"{NAME}.{k}"] = NO_STACK
    if modules is None:
        na[f"{NAME}.modules"] = NO_STACK if not has_stack else NO_MODULES
    return section


_VIA = {0: None, 1: "python_function", 2: "call_stack", 3: "autograd thread", 4: "autograd thread"}


def _table(values) -> Tuple[List[str], List[int]]:
    """Distinct non-null values and, per value, its index (-1: null)."""
    names: List[str] = []
    at: Dict[str, int] = {}
    out = []
    for v in values:
        if v is None:
            out.append(-1)
            continue
        if v not in at:
            at[v] = len(names)
            names.append(v)
        out.append(at[v])
    return names, out


def _graph_sources(trace, gr, key, keys, parent, is_module, name, nc, inc_gpu, gdur) -> Optional[dict]:
    """The span's CUDA graph captures and unmatched replays, for a worker summary to pair across
    its spans (graph_replays.pair_across_spans; METRICS.md §17 "CUDA graph replays"):
    ``captures``: per recorded capture ``kernels``, ``names_key``, ``end_ts``, the user line
    (``frames`` + ``kernel_frame``) and nn.Module path (``modules`` + ``kernel_module``) of
    each launch; ``unmatched``: the replays of included steps no capture of this trace matched,
    per kernel-name sequence and launching line/module: ``kernels``, ``names_key``,
    ``kernel_us`` per position (summed), ``replays``, ``first_ts``, ``frame``, ``module`` (where
    this span put their GPU time). None without captures or unmatched replays."""
    from .graph_replays import names_key

    S = trace.strings
    near = _nearest(parent, is_module) if is_module.any() else None
    up = _strict(parent, near) if near is not None else None
    memo: Dict[int, str] = {}

    def module_of(node: int) -> Optional[str]:
        m = int(near[node]) if near is not None else -1
        chain = []
        while m >= 0 and m not in memo:
            chain.append(m)
            m = int(up[m])
        base = memo.get(m) if m >= 0 else None
        for x in reversed(chain):
            own = S[int(name[x])][len("nn.Module: "):]
            base = memo[x] = (base + "/" + own) if base else own
        return base

    def frame_of(node: int) -> Optional[str]:
        return keys.names[int(key[node])] if key[node] >= 0 else None

    base_us = (getattr(trace.meta, "base_time_ns", None) or 0) / 1000.0  # times across files (flops too)
    caps = []
    for j, calls in enumerate(gr["capture_list"]):
        seq = gr["capture_names"].get(j)
        frames, kernel_frame = _table([frame_of(nc + int(c)) for c in calls])
        modules, kernel_module = _table([module_of(nc + int(c)) for c in calls])
        caps.append({"kernels": int(len(calls)), "end_ts": float(gr["capture_end"][j]) + base_us,
                     "names_key": names_key([S[int(n)] for n in seq]) if seq is not None else None,
                     "frames": frames, "kernel_frame": kernel_frame,
                     "modules": modules, "kernel_module": kernel_module})
    k, cc, rp = gr["kernels"], gr["capture_call"], gr["replay"]
    groups: Dict[tuple, dict] = {}
    bounds = np.r_[np.flatnonzero(np.r_[True, rp[1:] != rp[:-1]]), len(rp)] if len(rp) else np.zeros(0, np.int64)
    for i0, i1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ks = k[i0:i1]
        if cc[i0] >= 0 or not inc_gpu[ks].all():
            continue
        node = nc + int(rp[i0])
        gk = (tuple(trace.gpu.name[ks].tolist()), frame_of(node), module_of(node))
        g = groups.get(gk)
        ts = float(trace.runtime.ts[rp[i0]])
        if g is None:
            g = groups[gk] = {"us": np.zeros(len(ks)), "n": 0, "first_ts": ts}
        g["us"] += gdur[ks]
        g["n"] += 1
        g["first_ts"] = min(g["first_ts"], ts)
    unmatched = [{"kernels": len(gk[0]), "names_key": names_key([S[int(n)] for n in gk[0]]),
                  "kernel_us": [round(u, 3) for u in g["us"].tolist()], "replays": g["n"],
                  "first_ts": g["first_ts"] + base_us,
                  "frame": gk[1], "module": gk[2]} for gk, g in groups.items()]
    return {"captures": caps, "unmatched": unmatched} if caps or unmatched else None


def _top(per_key: Dict[str, dict], steps_us: float) -> List[dict]:
    rows = [dict(_line_fields(k), us=v["us"], pct=pct(v["us"], steps_us), count=v["count"], op=v["op"],
                 skipped=v["skipped"], via=v["via"]) for k, v in per_key.items()]
    rows.sort(key=lambda r: -r["us"])
    return rows[:TOP_BOTTLENECK]


def _modules(trace, parent, is_module, is_op, name, ts, dur, inc_node, g_node, inc_gpu, gdur, anchor, thr_pid, thr,
             nc):
    """Per module path (``GPT2LMHeadModel_0/GPT2Model_0/GPT2Block_0``): calls, total and self
    CPU time of its frames, GPU time launched in forward (inside the frame) and in backward
    (ops of the autograd engine whose ``Sequence number`` is a forward op's inside it).
    ``thr_pid[thr[i]]``: node i's pid (gathered for the few nodes read, not for every node)."""
    S = trace.strings
    mods = np.flatnonzero(is_module)
    if not len(mods):
        return None
    near = _nearest(parent, is_module)
    up = _strict(parent, near)  # parent module node
    mods = mods[np.lexsort((-dur[mods], ts[mods]))]
    path_of: Dict[int, str] = {}
    for m in mods.tolist():
        own = S[name[m]][len("nn.Module: "):]
        p = int(up[m])
        path_of[m] = (path_of[p] + "/" + own) if p in path_of else own
    paths = sorted(set(path_of.values()))
    pid_of = {p: i for i, p in enumerate(paths)}
    node_path = np.full(len(parent), -1, np.int64)
    for m, p in path_of.items():
        node_path[m] = pid_of[p]
    np_ = len(paths)
    inc_m = mods[inc_node[mods]]
    calls = np.bincount(node_path[inc_m], minlength=np_)
    total = np.bincount(node_path[inc_m], dur[inc_m], minlength=np_)
    child = inc_m[up[inc_m] >= 0]
    self_us = total - np.bincount(node_path[up[child]], dur[child], minlength=np_)
    # forward: GPU activity whose launching call (its own thread) is inside a module frame
    g_mod = _at(node_path, _at(near, g_node, -1), -1)
    sel = inc_gpu & (g_mod >= 0)
    fwd = np.bincount(g_mod[sel], gdur[sel], minlength=np_)
    # backward: the launching call's nearest op with a sequence number -> the forward op's module
    cpu = trace.cpu
    seq = np.concatenate([cpu.sequence, np.full(len(parent) - nc, -1, np.int64)])
    bwd = np.zeros(np_)
    has_seq = is_op & (seq >= 0)
    if has_seq.any():
        fwd_ops = np.flatnonzero(has_seq & (near >= 0))
        fkey = dict(zip(zip(thr_pid[thr[fwd_ops]].tolist(), seq[fwd_ops].tolist()), node_path[near[fwd_ops]].tolist()))
        seq_near = _nearest(parent, has_seq)
        cand = inc_gpu & (g_mod < 0) & (g_node >= 0)
        gi = np.flatnonzero(cand)
        sn = seq_near[g_node[gi]]
        gi, sn = gi[sn >= 0], sn[sn >= 0]
        mp = np.array([fkey.get((p, s), -1) for p, s in zip(thr_pid[thr[sn]].tolist(), seq[sn].tolist())], np.int64)
        ok = mp >= 0
        bwd = np.bincount(mp[ok], gdur[gi[ok]], minlength=np_)
    # totals include descendants: roll self GPU time up the path tree
    fwd_total, bwd_total = fwd.copy(), bwd.copy()
    for i, p in enumerate(paths):
        cut = p.rfind("/")
        while cut > 0:
            anc = pid_of.get(p[:cut])
            if anc is not None:
                fwd_total[anc] += fwd[i]
                bwd_total[anc] += bwd[i]
            cut = p.rfind("/", 0, cut)
    rows = []
    for i, p in enumerate(paths):
        leaf = p.rsplit("/", 1)[-1]
        cls = leaf.rsplit("_", 1)[0] if "_" in leaf else leaf
        rows.append({"path": p, "module": leaf, "class": cls, "depth": p.count("/"),
                     "parent": p.rsplit("/", 1)[0] if "/" in p else None, "calls": int(calls[i]),
                     "total_us": float(total[i]), "self_us": float(self_us[i]),
                     "gpu_fwd_us": float(fwd_total[i]), "gpu_bwd_us": float(bwd_total[i]),
                     "gpu_us": float(fwd_total[i] + bwd_total[i]),
                     "gpu_self_fwd_us": float(fwd[i]), "gpu_self_bwd_us": float(bwd[i])})
    rows = [r for r in rows if r["calls"] or r["gpu_us"]]
    if len(rows) > MAX_MODULES:
        keep = {r["path"] for r in sorted(rows, key=lambda r: -r["total_us"])[:MAX_MODULES]}
        rows = [r for r in rows if r["path"] in keep]
    return rows


# torch.compile's own record_function labels (METRICS.md §17 `kind`): Inductor's call of one
# compiled graph, and a compile pass ("aot_trace_joint_graph_data: compile_id=0/3")
_FX_GRAPH_LABEL = re.compile(r"^## Call CompiledFxGraph \S+ ##$")
_COMPILE_PASS_LABEL = re.compile(r"_data: (?:.*, )?compile_id=\d+/\d+$")


def label_kind(name: str) -> str:
    """"compiled_graph" (``## Call CompiledFxGraph <hash> ##``), "compile_pass" (a
    torch.compile pass or autotuning, ``<pass>_data: [key=value, ...] compile_id=N/M``) or
    "user" (the program's own)."""
    if _FX_GRAPH_LABEL.match(name):
        return "compiled_graph"
    if _COMPILE_PASS_LABEL.search(name):
        return "compile_pass"
    return "user"


def with_kind(labels: List[dict]) -> List[dict]:
    """The label rows, each with its ``kind`` (label_kind)."""
    return [{**r, "kind": label_kind(str(r.get("name") or ""))} for r in labels]


def _labels(trace, steps, thr, ts, anchor, g_node, inc_gpu, gdur, h_lo, h_hi):
    """Per record_function label (user annotations but ProfilerStep#N): count, CPU span time
    (clipped to the included steps), GPU time launched by calls inside it (the waiting
    thread's for autograd-engine calls) and its gpu_user_annotation time."""
    cpu, S = trace.cpu, trace.strings
    step_ids = trace.string_ids(lambda s: s.startswith("ProfilerStep#"))
    rows = np.flatnonzero(cpu.kind == CPU_USER_ANNOTATION)
    rows = rows[~np.isin(cpu.name[rows], step_ids)]  # (the few annotations' names: no isin over every event)
    if not len(rows):
        return [], 0.0
    merged = iv.merge(h_lo, h_hi)
    r_end = ts[rows] + np.maximum(np.nan_to_num(cpu.dur[rows], nan=0.0), 0.0)
    clipped = iv.covered_in(merged, ts[rows], r_end)
    inside = clipped > 0
    rows, r_end, clipped = rows[inside], r_end[inside], clipped[inside]
    if not len(rows):
        return [], 0.0
    union = float(iv.covered_in(iv.merge(ts[rows], r_end), h_lo, h_hi).sum()) if len(h_lo) else 0.0
    # GPU activity by its anchor (thread, start)
    sel = np.flatnonzero(inc_gpu & (g_node >= 0))
    a = np.asarray(g_node[sel], np.int64) if anchor is None else anchor[g_node[sel]]  # (None: each its own)
    g_in = _sum_inside(thr[a], ts[g_node[sel]], gdur[sel], thr[rows], ts[rows], r_end)
    ga = trace.gpu_annotations
    g_inc = _in_windows(ga.ts, *_sorted_windows(steps.inc_start, steps.inc_end))
    out = []
    names = cpu.name[rows]
    for nid in np.unique(names).tolist():
        s = names == nid
        gsel = g_inc & (ga.name == nid)
        out.append({"name": S[nid], "count": int(s.sum()), "cpu_us": float(clipped[s].sum()),
                    "gpu_us": float(g_in[s].sum()),
                    "gpu_annotation_us": float(np.maximum(np.nan_to_num(ga.dur[gsel]), 0).sum())})
    out.sort(key=lambda r: -r["cpu_us"])
    return out[:MAX_LABELS], union


def _sorted_windows(lo, hi):
    o = np.argsort(lo)
    return lo[o], hi[o]


# ---------------------------------------------------------------- the metric unit


def _compute(span) -> dict:
    from .linking import span_gpu_runtime

    host = span_host_nesting(span)
    section = source_view(span.trace, span.found, gpu_runtime=span_gpu_runtime(span),
                          not_available=span.not_available, host=host)
    # the last reader of the host nesting (9 columns over every host event: 22 MB on the 292 MB
    # benchmark) but the op nesting, derived from it: derive that now, then let it go, its
    # time columns reused for the ops' (operators.op_nesting, consume_host)
    span.release("host_nesting")
    host = {k: v for k, v in host.items() if k not in ("thread", "thread_pid")}  # (not read by the derivation)
    # the view's freed per-node masks and blocks back to the system first (trace/heap.py): glibc kept
    # ~470 MiB of them on 10M tiny events, under the derivation's arrays (the section's peak)
    from ..trace import heap

    heap.release_free_memory()
    span.once("op_nesting", lambda: op_nesting(span.trace, host, consume_host=True))  # (span_op_nesting's key)
    return section


_LINE_SUMS = ("cpu_us", "calls", "gpu_us", "kernels", "sync_us", "dataloader_us")
_MODULE_SUMS = ("calls", "total_us", "self_us", "gpu_fwd_us", "gpu_bwd_us", "gpu_self_fwd_us", "gpu_self_bwd_us")
_MODULE_FIRST = ("module", "class", "depth", "parent")
_LABEL_SUMS = ("count", "cpu_us", "gpu_us", "gpu_annotation_us")


def _partial(report: dict) -> dict:
    sec = report.get(NAME) or {}
    out = {"any:has_stack": bool(sec.get("has_stack")), "first:stack_source": sec.get("stack_source"),
           "first:frame_naming": sec.get("frame_naming"),
           "any:has_modules": sec.get("modules") is not None}
    for k in ("steps_us", "host_steps_us", "gpu_us", "unattributed_gpu_us", "sync_us", "dataloader_us",
              "label_union_us"):
        out[f"sum:{k}"] = sec.get(k)
    out["keyed:lines"] = {r["frame"]: {f"sum:{f}": r.get(f) for f in _LINE_SUMS}
                          for r in sec.get("lines") or []}
    for kind in ("sync", "dataloader"):
        out[f"keyed:{kind}"] = {r["frame"]: {"sum:us": r.get("us"), "sum:count": r.get("count"),
                                             "first:op": r.get("op"), "first:skipped": r.get("skipped"),
                                             "first:via": r.get("via")}
                                for r in (sec.get("bottlenecks") or {}).get(kind) or []}
    out["keyed:modules"] = {r["path"]: dict({f"sum:{f}": r.get(f) for f in _MODULE_SUMS},
                                            **{f"first:{f}": r.get(f) for f in _MODULE_FIRST})
                            for r in sec.get("modules") or []}
    out["keyed:labels"] = {r["name"]: {f"sum:{f}": r.get(f) for f in _LABEL_SUMS} for r in sec.get("labels") or []}
    graph = sec.get("graph_replays") if isinstance(sec.get("graph_replays"), dict) else {}
    for part in ("captures", "unmatched"):  # paired across the spans of a worker (_pair_replays)
        rows = graph.get(part) if isinstance(graph.get(part), list) else []
        out[f"rows:graph_{part}"] = [dict(r, worker=report.get("worker"), span=report.get("span"))
                                     for r in rows if isinstance(r, dict)]
    return out


def _move_module_gpu(mods: dict, path: Optional[str], us: float) -> None:
    """Add ``us`` forward GPU time to module ``path`` (self) and its ancestors (total)."""
    if not path:
        return
    row = mods.get(path)
    if row is None:
        leaf = path.rsplit("/", 1)[-1]
        row = mods[path] = {"first:module": leaf, "first:class": leaf.rsplit("_", 1)[0] if "_" in leaf else leaf,
                            "first:depth": path.count("/"),
                            "first:parent": path.rsplit("/", 1)[0] if "/" in path else None,
                            **{f"sum:{f}": 0.0 for f in _MODULE_SUMS}}
    for f, v in (("gpu_self_fwd_us", us), ("gpu_fwd_us", us)):
        if row.get(f"sum:{f}", 0.0) is not None:
            row[f"sum:{f}"] = row.get(f"sum:{f}", 0.0) + v
    cut = path.rfind("/")
    while cut > 0:
        anc = mods.get(path[:cut])
        if anc is not None and anc.get("sum:gpu_fwd_us") is not None:
            anc["sum:gpu_fwd_us"] += us
        cut = path.rfind("/", 0, cut)


def _pair_replays(m: dict) -> None:
    """A summary: the replays a span could not attribute, paired with a capture recorded in
    another span of their worker (graph_replays.pair_across_spans): their GPU time moves from
    the line and module that launched the replay (or the unattributed time) to the capture's
    line and module of each kernel, as in one file (METRICS.md §17). Changes ``m`` in place."""
    from .graph_replays import pair_across_spans

    caps, groups = m.get("rows:graph_captures") or [], m.get("rows:graph_unmatched") or []
    if not caps or not groups:
        return
    lines = m.setdefault("keyed:lines", {})
    mods = m.get("keyed:modules") if m.get("any:has_modules") else None

    def to_line(frame, us, kernels):
        if frame is None:
            if m.get("sum:unattributed_gpu_us") is not None:
                m["sum:unattributed_gpu_us"] += us
            return
        row = lines.setdefault(frame, {f"sum:{f}": 0.0 for f in _LINE_SUMS})
        for f, v in (("gpu_us", us), ("kernels", kernels)):
            if row.get(f"sum:{f}") is not None:
                row[f"sum:{f}"] += v

    for g, c in pair_across_spans(caps, groups):
        us = np.asarray(g.get("kernel_us") or [], float)
        kf, km = c.get("kernel_frame") or [], c.get("kernel_module") or []
        if len(us) != len(kf) or len(us) != len(km):
            continue
        n_rep = int(g.get("replays") or 0)
        total = float(us.sum())
        to_line(g.get("frame"), -total, -len(us) * n_rep)  # where the span had put them
        if mods is not None:
            _move_module_gpu(mods, g.get("module"), -total)
        for i, u in enumerate(us.tolist()):
            to_line(c["frames"][kf[i]] if kf[i] >= 0 else None, u, n_rep)
            if mods is not None and km[i] >= 0:
                _move_module_gpu(mods, c["modules"][km[i]], u)


def _finish(m: dict) -> dict:
    _pair_replays(m)
    has_stack = bool(m.get("any:has_stack"))
    steps_us = m.get("sum:steps_us")

    def line(frame, v):
        row = _line_fields(frame)
        row.update({f: v.get(f"sum:{f}") for f in _LINE_SUMS})
        for f in ("calls", "kernels"):
            row[f] = int(row[f] or 0)
        return row

    lines = [line(k, v) for k, v in (m.get("keyed:lines") or {}).items()]
    lines.sort(key=lambda r: -((r["cpu_us"] or 0) + (r["gpu_us"] or 0)))

    def top(kind):
        rows = [dict(_line_fields(k), us=v.get("sum:us"), pct=pct(v.get("sum:us"), steps_us),
                     count=int(v.get("sum:count") or 0), op=v.get("first:op"), skipped=v.get("first:skipped"),
                     via=v.get("first:via")) for k, v in (m.get(f"keyed:{kind}") or {}).items()]
        rows.sort(key=lambda r: -(r["us"] or 0))
        return rows[:TOP_BOTTLENECK]

    modules = None
    if m.get("any:has_modules"):
        modules = []
        for p, v in (m.get("keyed:modules") or {}).items():
            row = {"path": p, **{f: v.get(f"first:{f}") for f in _MODULE_FIRST},
                   **{f: v.get(f"sum:{f}") for f in _MODULE_SUMS}}
            row["calls"] = int(row["calls"] or 0)
            row["gpu_us"] = (row["gpu_fwd_us"] + row["gpu_bwd_us"]
                             if row["gpu_fwd_us"] is not None and row["gpu_bwd_us"] is not None else None)
            modules.append(row)
        modules.sort(key=lambda r: r["path"])
    labels = []
    for k, v in (m.get("keyed:labels") or {}).items():
        row = {"name": k, **{f: v.get(f"sum:{f}") for f in _LABEL_SUMS}}
        row["count"] = int(row["count"] or 0)
        labels.append(row)
    labels.sort(key=lambda r: -(r["cpu_us"] or 0))
    host = m.get("sum:host_steps_us")
    return {
        "has_stack": has_stack, "stack_source": m.get("first:stack_source"),
        "frame_naming": m.get("first:frame_naming"),
        "steps_us": steps_us, "host_steps_us": host, "gpu_us": m.get("sum:gpu_us"),
        "unattributed_gpu_us": m.get("sum:unattributed_gpu_us") if has_stack else None,
        "lines": lines[:TOP_LINES] if has_stack else None,
        "sync_us": m.get("sum:sync_us"), "dataloader_us": m.get("sum:dataloader_us"),
        "bottlenecks": {"sync": top("sync"), "dataloader": top("dataloader")} if has_stack else None,
        "modules": modules, "labels": with_kind(labels), "label_union_us": m.get("sum:label_union_us"),
        "label_coverage_pct": pct(m.get("sum:label_union_us"), host),
        "hint": None if has_stack and modules is not None else HINT,
    }


UNIT = Unit(NAME, _compute, _partial, _finish, requires=("steps",), group=NONE_FAILED)
