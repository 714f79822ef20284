"""Input-bound % (metrics.md §3).

``input_bound(trace, steps, partition=None) -> dict`` is the report's ``input`` object:
``{input_bound_pct, input_transfer_pct, xprof_input_pct, verdict, severity, per_step,
stats, evidence}``.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from .. import thresholds as T
from ..trace.model import GPU_KERNEL, GPU_MEMCPY, TraceData
from . import intervals as iv
from .breakdown import Partition, dataloader_mask, partition
from .steps import Steps

VERDICT_HIGH = "highly input-bound"
VERDICT_MODERATE = "moderately input-bound"
VERDICT_NONE = "not input-bound"

_ITER_CLASS = re.compile(r"^enumerate\((?:DataLoader|DataPipe)\)#([^.]+)")
SINGLE_PROCESS_ITER = "_SingleProcessDataLoaderIter"
SLOWEST_STEPS = 3


def verdict_for(pct: Optional[float]):
    """(verdict, severity) for an input-bound %, XProf's thresholds."""
    if pct is None:
        return None, None
    if pct >= T.INPUT_BOUND_HIGH_PCT:
        return VERDICT_HIGH, "high"
    if pct >= T.INPUT_BOUND_MODERATE_PCT:
        return VERDICT_MODERATE, "medium"
    return VERDICT_NONE, "ok"


_LOUDER = {"high": 3, "medium": 2, "low": 1, "ok": 0}


def transfer_severity(pct: Optional[float]) -> str:
    """The severity of host-to-device input copies no kernel hides (``input_transfer_pct``),
    on the input-bound scale (XProf counts them as input too): >= INPUT_BOUND_HIGH_PCT high,
    >= INPUT_BOUND_MODERATE_PCT medium, >= INPUT_TRANSFER_PCT low, else ok."""
    if pct is None or pct < T.INPUT_TRANSFER_PCT:
        return "ok"
    return "high" if pct >= T.INPUT_BOUND_HIGH_PCT else "medium" if pct >= T.INPUT_BOUND_MODERATE_PCT else "low"


def synchronous_transfer_pct(inp: Optional[dict]) -> Optional[float]:
    """The share of the step in input copies that pin_memory would make asynchronous: the
    input transfer % when the steps copy from pageable memory and it reaches
    INPUT_TRANSFER_PCT, else None (the finding of rule pageable_h2d)."""
    inp = inp if isinstance(inp, dict) else {}
    pct = inp.get("input_transfer_pct")
    pageable = (inp.get("evidence") or {}).get("pageable_h2d_copies") or 0
    if not pageable or not isinstance(pct, (int, float)) or pct < T.INPUT_TRANSFER_PCT:
        return None
    return float(pct)


def input_finding(inp: Optional[dict]):
    """(words, severity) of the input finding, made once for the Input card and the input
    advice (rules input_bound and pageable_h2d; issue 34 item 4): the DataLoader wait by
    ``verdict_for``, synchronous (pageable) input copies by ``transfer_severity``; the louder
    of the two. (None, None) without an input-bound %."""
    inp = inp if isinstance(inp, dict) else {}
    words, severity = verdict_for(inp.get("input_bound_pct"))
    if words is None:
        return None, None
    transfer = synchronous_transfer_pct(inp)
    if transfer is None:
        return words, severity
    copies = f"{transfer:.1f} % of the step in synchronous input copies (pageable memory)"
    # XProf counts these copies as input too: "not input-bound" would deny them
    words = f"not waiting for the DataLoader, but {copies}" if severity == "ok" else f"{words}; {copies}"
    louder = max((severity, transfer_severity(transfer)), key=_LOUDER.get)
    return words, louder


def input_bound_pct(wait_us: float, step_us: float) -> float:
    """The one ratio of §3: 100 * Σ waiting µs / Σ step µs (0 without step time); spans
    and summaries (``UNIT.finish``) both use it."""
    return 100.0 * wait_us / step_us if step_us > 0 else 0.0


def input_transfer_us(trace: TraceData, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window: Union(memcpy named *HtoD*) minus Union(all kernels)."""
    g = trace.gpu
    h2d = (g.kind == GPU_MEMCPY) & np.isin(g.name, trace.string_ids(lambda s: "HtoD" in s))
    k = g.kind == GPU_KERNEL
    copies = iv.merge(g.ts[h2d], g.ts[h2d] + g.dur[h2d])
    kernels = iv.merge(g.ts[k], g.ts[k] + g.dur[k])
    both = iv.intersect(copies, kernels)
    return np.maximum(iv.covered_in(copies, lo, hi) - iv.covered_in(both, lo, hi), 0.0)


def input_bound(trace: TraceData, steps: Steps, part: Optional[Partition] = None) -> dict:
    """The report's ``input`` object over the included steps.

    - ``input_bound_pct`` = 100 * Σ DataLoader-category µs / Σ step µs (ratio of sums)
    - ``input_transfer_pct`` = 100 * Σ (HtoD copies not under kernels) / Σ step µs
    - ``xprof_input_pct`` = the sum of both (XProf-compatible)
    - ``verdict`` / ``severity`` by thresholds.INPUT_BOUND_HIGH_PCT / _MODERATE_PCT
    - ``per_step``: [{step, input_bound_pct, dataloader_us, step_us}],
      ``stats``: {mean, min, max, std} of the per-step %
    - ``evidence``: {dataloader_iterators, num_workers_zero, slowest_steps:
      [{step, step_us, dataloader_us}] (3 slowest), pageable_h2d_copies, pageable_h2d_us}
    """
    lo, hi = steps.inc_start, steps.inc_end
    if len(lo) == 0:
        return {"input_bound_pct": None, "input_transfer_pct": None, "xprof_input_pct": None,
                "verdict": None, "severity": None, "per_step": [], "stats": None, "evidence": {}}
    if part is None:
        part = partition(trace, lo, hi)
    dl = part.us["dataloader"]
    total = part.total
    tot = float(total.sum())
    ib = input_bound_pct(float(dl.sum()), tot)
    xfer = input_transfer_us(trace, lo, hi) if len(trace.gpu) else np.zeros(len(lo))
    it = input_bound_pct(float(xfer.sum()), tot)
    per = np.where(total > 0, 100.0 * dl / np.where(total > 0, total, 1), 0.0)
    per_step = [{"step": int(n), "input_bound_pct": float(p), "dataloader_us": float(d), "step_us": float(s)}
                for n, p, d, s in zip(steps.inc_numbers, per, dl, total)]
    stats = {"mean": float(per.mean()), "min": float(per.min()), "max": float(per.max()),
             "std": float(per.std())}
    verdict, severity = verdict_for(ib)

    # Evidence
    names = sorted({trace.strings[i] for i in np.unique(trace.cpu.name[dataloader_mask(trace)])})
    iters = sorted({m.group(1) for m in map(_ITER_CLASS.match, names) if m})
    slow = np.argsort(-total, kind="stable")[:SLOWEST_STEPS]
    g = trace.gpu
    pageable = (g.kind == GPU_MEMCPY) & np.isin(g.name, trace.string_ids(lambda s: "HtoD" in s and "Pageable" in s))
    w0, w1 = steps.window
    pageable &= (g.ts >= w0) & (g.ts < w1)
    evidence = {
        "dataloader_iterators": iters,
        "num_workers_zero": SINGLE_PROCESS_ITER in iters,
        "slowest_steps": [{"step": int(steps.inc_numbers[i]), "step_us": float(total[i]),
                           "dataloader_us": float(dl[i])} for i in slow],
        "pageable_h2d_copies": int(pageable.sum()),
        "pageable_h2d_us": float(g.dur[pageable].sum()),
    }
    return {"input_bound_pct": ib, "input_transfer_pct": it, "xprof_input_pct": ib + it,
            "verdict": verdict, "severity": severity, "per_step": per_step, "stats": stats,
            "evidence": evidence}


# ---------------------------------------------------------------- metric unit (analysis/units.py)


def _unit_compute(span) -> dict:
    from .breakdown import span_partition

    found = span.found
    return input_bound(span.trace, found, span_partition(span) if found.count else None)


def _unit_partial(report: dict) -> dict:
    from .units import total, weighted_pair

    inp = report.get("input") or {}
    span, worker = report.get("span"), report.get("worker")
    per_step = [dict(s, span=span, worker=worker) for s in (inp.get("per_step") or []) if isinstance(s, dict)]
    step_us = total(s.get("step_us") for s in per_step)
    ev = inp.get("evidence") or {}
    return {"rows:per_step": per_step, "sum:step_us": step_us,
            "sum:dataloader_us": total(s.get("dataloader_us") for s in per_step),
            "wmean:input_transfer_pct": weighted_pair(inp.get("input_transfer_pct"), step_us),
            "rows:slowest_steps": [dict(s, span=span, worker=worker) for s in (ev.get("slowest_steps") or [])
                                   if isinstance(s, dict)],
            "rows:dataloader_iterators": [str(i) for i in (ev.get("dataloader_iterators") or [])],
            "sum:pageable_h2d_copies": ev.get("pageable_h2d_copies") or 0,
            "sum:pageable_h2d_us": ev.get("pageable_h2d_us") or 0.0}


def _unit_finish(m: dict) -> dict:
    from .units import num, per_step_across_spans, wmean

    rows, step_us, dataloader_us = m["rows:per_step"], m["sum:step_us"], m["sum:dataloader_us"]
    # one row per step number across the spans: mean DataLoader and step µs, their ratio,
    # min/max of the spans' own % and the worker/span of the max (METRICS.md §3)
    per_step = per_step_across_spans(rows, ("dataloader_us", "step_us"), "input_bound_pct")
    for r in per_step:
        r["input_bound_pct"] = input_bound_pct(r["dataloader_us"], r["step_us"]) \
            if r["dataloader_us"] is not None and r["step_us"] else None
    if not rows or not step_us or step_us <= 0 or dataloader_us is None:
        return {"input_bound_pct": None, "input_transfer_pct": None, "xprof_input_pct": None,
                "verdict": None, "severity": None, "per_step": per_step, "stats": None, "evidence": {}}
    pct = input_bound_pct(dataloader_us, step_us)
    transfer = wmean(m["wmean:input_transfer_pct"]) or 0.0
    verdict, severity = verdict_for(pct)
    values = np.array([v for v in (num(s.get("input_bound_pct")) for s in rows) if v is not None])
    slow = sorted(m["rows:slowest_steps"], key=lambda s: -(num(s.get("step_us")) or 0.0))
    iters = sorted(set(m["rows:dataloader_iterators"]))
    return {
        "input_bound_pct": pct, "input_transfer_pct": transfer, "xprof_input_pct": pct + transfer,
        "verdict": verdict, "severity": severity, "per_step": per_step,
        "stats": {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()),
                  "std": float(values.std())} if len(values) else None,
        "evidence": {"dataloader_iterators": iters, "num_workers_zero": SINGLE_PROCESS_ITER in iters,
                     "slowest_steps": slow[:SLOWEST_STEPS],
                     "pageable_h2d_copies": int(m["sum:pageable_h2d_copies"] or 0),
                     "pageable_h2d_us": m["sum:pageable_h2d_us"]},
    }


def input_wait_per_step(report: dict):
    """Mean DataLoader wait per included step (µs): the per-step rows' ``dataloader_us``
    (a summary's rows are per step number across its spans); None without steps."""
    rows = [r.get("dataloader_us") for r in ((report.get("input") or {}).get("per_step") or [])]
    if not rows or any(not isinstance(v, (int, float)) for v in rows):
        return None
    return float(sum(rows) / len(rows))


def _unit():
    from .units import LOWER, Card, Metric, Unit, path

    metrics = (
        Metric("input_bound_pct", "Input-bound", "%", LOWER, path("input", "input_bound_pct"), ("steps", "input"),
               card=Card("input_bound", "Input-bound", "Share of step time spent only waiting for the DataLoader.",
                         field=("input", "input_bound_pct"), order=10),
               text=False, order=20),
        # the absolute wait beside the share: a share can fall while the wait grows (the step
        # grew more), e.g. a straggler run against a balanced one
        Metric("input_wait_us_per_step", "Input wait per step", "us", LOWER, input_wait_per_step,
               ("steps", "input"), text=False, order=25),
        Metric("input_transfer_pct", "Input transfer (H2D)", "%", LOWER, path("input", "input_transfer_pct"),
               ("steps", "input"), text=False, order=30),
    )
    return Unit("input", _unit_compute, _unit_partial, _unit_finish, requires=("steps",), metrics=metrics)


UNIT = _unit()
