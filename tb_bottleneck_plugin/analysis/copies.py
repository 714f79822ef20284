"""Device-to-device copies (METRICS.md §8 "Device-to-device copies", issue 20 item 6).

- ``d2d_mask(trace)``: the memcpys that copy GPU memory to GPU memory: Kineto names them
  "Memcpy DtoD (Device -> Device)" and, between two GPUs, "Memcpy PtoP (Device -> Device)"
  (ROCm: "DeviceToDevice", "PeerToPeer").
- ``d2d_copies(trace, steps, gpu_runtime, op_calls)``: over the included steps,
  ``d2d_us`` = Union(those copies clipped to the steps), ``d2d_exposed_us`` = the part no
  kernel overlaps (what the step would lose without them: the estimate the recommendation
  ranks by), ``d2d_pct`` / ``d2d_exposed_pct`` = 100 × each / Σ step µs, ``count``,
  ``bytes``, and ``top_ops``: [{op, us, count}] the outermost ``aten::`` op (what the user
  called: ``aten::contiguous``, ``aten::clone``, ``aten::to``, ``aten::copy_``) around the
  runtime call that launched each copy (linked through the correlation id; METRICS.md
  "Launched by"), by copy time.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from ..trace.model import GPU_MEMCPY, TraceData
from . import intervals as iv
from .accelerators import no_gpu_reason

D2D_WORDS = ("DtoD", "PtoP", "DeviceToDevice", "PeerToPeer")
TOP_N = 5
NO_OP = "(no CPU op: launched outside any recorded op)"


def d2d_mask(trace: TraceData) -> np.ndarray:
    g = trace.gpu
    ids = trace.string_ids(lambda s: any(w in s for w in D2D_WORDS))
    return (g.kind == GPU_MEMCPY) & np.isin(g.name, ids) if len(ids) else np.zeros(len(g), bool)


def _op_names(trace: TraceData, call_rows: np.ndarray, op_calls) -> np.ndarray:
    """Per runtime row in ``call_rows``: the name of the longest enclosing ``aten::`` op (the
    user's call), else of the longest enclosing op; NO_OP where none."""
    out = np.full(len(call_rows), NO_OP, dtype=object)
    if op_calls is None or not len(call_rows):
        return out
    op, call = op_calls
    if not len(op):
        return out
    want = np.isin(call, call_rows)
    op, call = op[want], call[want]
    if not len(op):
        return out
    names = np.array([trace.strings[int(n)] for n in trace.cpu.name[op]], dtype=object)
    aten = np.array([str(n).startswith("aten::") for n in names], dtype=bool)
    # per call: aten ops first, then the longest
    order = np.lexsort((-trace.cpu.dur[op], ~aten, call))
    call_s, names_s = call[order], names[order]
    first = np.r_[True, call_s[1:] != call_s[:-1]]
    best = dict(zip(call_s[first].tolist(), names_s[first].tolist()))
    return np.array([best.get(int(c), NO_OP) for c in call_rows], dtype=object)


def d2d_copies(trace: TraceData, steps, gpu_runtime: Optional[np.ndarray] = None, op_calls=None,
               not_available: Optional[Dict[str, str]] = None) -> Optional[dict]:
    na = {} if not_available is None else not_available
    g = trace.gpu
    if not len(g):
        na["copies"] = no_gpu_reason(trace, "no GPU activity in the trace")  # as collectives: one n/a line
        return None
    lo, hi = np.asarray(steps.inc_start, float), np.asarray(steps.inc_end, float)
    if not len(lo):
        na["copies"] = "no included step"
        return None
    step_us = float((hi - lo).sum())
    rows = np.flatnonzero(d2d_mask(trace))
    s, e = g.ts[rows].astype(float), (g.ts[rows] + g.dur[rows]).astype(float)
    # the step each copy starts in (copies outside every step are not counted)
    i = np.searchsorted(lo, s, side="right") - 1
    inside = (i >= 0) & (s < hi[np.maximum(i, 0)])
    rows, s, e, i = rows[inside], s[inside], e[inside], i[inside]
    e = np.minimum(e, hi[i])
    copies = iv.merge(s, e)
    d2d_us = float((copies[1] - copies[0]).sum())
    k = g.kind != GPU_MEMCPY  # every kernel (and memset) hides the part of a copy it overlaps
    kernels = iv.merge(g.ts[k].astype(float), (g.ts[k] + g.dur[k]).astype(float))
    exposed = iv.subtract(copies, kernels)
    exposed_us = float((exposed[1] - exposed[0]).sum())
    top = []
    if len(rows):
        calls = gpu_runtime[rows] if gpu_runtime is not None else np.full(len(rows), -1)
        names = _op_names(trace, calls[calls >= 0], op_calls)
        all_names = np.full(len(rows), NO_OP, dtype=object)
        all_names[calls >= 0] = names
        if not len(trace.cpu):
            na["copies.top_ops"] = "the trace has no CPU ops: the copies cannot be linked to the code"
        by: Dict[str, list] = {}
        for n, d in zip(all_names.tolist(), (e - s).tolist()):
            b = by.setdefault(str(n), [0.0, 0])
            b[0] += d
            b[1] += 1
        top = sorted(({"op": n, "us": v[0], "count": v[1]} for n, v in by.items()), key=lambda o: -o["us"])
    nbytes = g.bytes[rows] if len(rows) else np.zeros(0, np.int64)
    return {"d2d_us": d2d_us, "d2d_exposed_us": exposed_us, "step_us": step_us,
            "d2d_pct": 100.0 * d2d_us / step_us if step_us > 0 else None,
            "d2d_exposed_pct": 100.0 * exposed_us / step_us if step_us > 0 else None,
            "count": int(len(rows)), "bytes": int(nbytes[nbytes > 0].sum()) if len(nbytes) else 0,
            "top_ops": top[:TOP_N]}


# ---------------------------------------------------------------- metric unit (analysis/units.py)

def _compute(span):
    from .linking import span_gpu_runtime, span_op_calls

    return d2d_copies(span.trace, span.found, gpu_runtime=span_gpu_runtime(span), op_calls=span_op_calls(span),
                      not_available=span.not_available)


def _partial(report: dict) -> dict:
    from .units import num

    c = report.get("copies") or {}
    ops = {}
    for o in c.get("top_ops") or []:
        if isinstance(o, dict):
            ops[str(o.get("op"))] = {"first:op": o.get("op"), "sum:us": o.get("us"),
                                     "sum:count": int(num(o.get("count")) or 0)}
    return {"sum:d2d_us": c.get("d2d_us"), "sum:d2d_exposed_us": c.get("d2d_exposed_us"),
            "sum:step_us": c.get("step_us"), "sum:count": c.get("count") or 0, "sum:bytes": c.get("bytes") or 0,
            "keyed:top_ops": ops}


def _finish(m: dict) -> dict:
    from .units import pct

    ops = [{"op": o["first:op"], "us": o["sum:us"], "count": int(o["sum:count"] or 0)}
           for o in m["keyed:top_ops"].values()]
    return {"d2d_us": m["sum:d2d_us"], "d2d_exposed_us": m["sum:d2d_exposed_us"], "step_us": m["sum:step_us"],
            "d2d_pct": pct(m["sum:d2d_us"], m["sum:step_us"]),
            "d2d_exposed_pct": pct(m["sum:d2d_exposed_us"], m["sum:step_us"]),
            "count": int(m["sum:count"] or 0), "bytes": int(m["sum:bytes"] or 0),
            "top_ops": sorted(ops, key=lambda o: -(o["us"] if o["us"] is not None else math.inf))[:TOP_N]}


def _unit():
    from .units import LOWER, Card, Metric, Unit, path

    metric = Metric("d2d_copy_pct", "Device-to-device copies", "%", LOWER, path("copies", "d2d_pct"),
                    ("copies",),
                    card=Card("d2d_copies", "Device copies",
                              "Share of step time in GPU-to-GPU memory copies (Memcpy DtoD/PtoP).",
                              field=("copies", "d2d_pct"), optional=True, order=65),
                    order=155)
    return Unit("copies", _compute, _partial, _finish, requires=("steps",), metrics=(metric,))


UNIT = _unit()
