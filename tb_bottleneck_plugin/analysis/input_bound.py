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
from ..model import GPU_KERNEL, GPU_MEMCPY, TraceData
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
    ib = 100.0 * float(dl.sum()) / tot if tot > 0 else 0.0
    xfer = input_transfer_us(trace, lo, hi) if len(trace.gpu) else np.zeros(len(lo))
    it = 100.0 * float(xfer.sum()) / tot if tot > 0 else 0.0
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
