"""The run-level rank view of a distributed run (metrics.md §12).

Built only from span results the service already keeps (each span result's
``distributed`` partial, from ``analysis/distributed.py``, and its ``report``): no trace
is loaded again. Cost is a few numpy passes over the collectives of all ranks, so
1,000 ranks take milliseconds.

- ``rank_view(results_by_worker) -> dict``: ``{worker name: [span result, ...]}`` to the
  ``ranks`` object of docs/report-schema.md.
- ``format_ranks_text(view) -> str``: the same for a terminal (``tb-bottlenecks report``).
- ``run_rank_view(run, spans, relative) -> dict``: the body of the ``/ranks?run=`` route
  (routes.py parses the request).
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import thresholds as T
from ..analysis.devices import label as device_label
from ..analysis.units import HIGHER, LOWER, Metric, path

SPLIT = ("compute_only_us", "overlapped_us", "exposed_comm_us", "other_us")
SINGLE_WORKER = "single worker: no ranks to compare"
NO_COMMUNICATION = "no communication in any rank's steps"
NO_STEPS = "no included step"
NO_PARTIAL = "span results carry no distributed part (analysed by an older version; re-analyse)"


def _per_step(key: str):
    """A rank row's total ``key`` per included step (None when unknown or no step)."""
    def get(row):
        v, n = row.get(key), row.get("steps")
        return v / n if isinstance(v, (int, float)) and n else None
    return get


def _enough(get):
    """``get`` where every rank has MIN_STEPS_TO_COMPARE included steps (else None: the
    view's ``ranks.recommendation`` not_available says "too little data")."""
    return lambda view: get(view) if (view.get("fewest_steps") or 0) >= T.MIN_STEPS_TO_COMPARE else None


# The run-level numbers of a run of several ranks, declared once (the ``Metric`` type of the
# headline numbers, METRICS.md §11-12): compare's rows, ``diff``, the ``check`` gate. RUN_METRICS
# read the rank view (``rank_view``'s object); RANK_METRICS read one rank's row of it and make
# one compare row per rank number (key ``<key>.rank<N>``). ``na_keys``: the view's not_available.
RUN_METRICS = (
    Metric("straggler_gap_us", "Straggler gap per step", "us", LOWER, path("straggler_gap", "mean_us"),
           na_keys=("ranks", "ranks.straggler_gap"), text=False),
    Metric("load_imbalance_pct", "Load imbalance", "%", LOWER, _enough(path("imbalance_pct")),
           na_keys=("ranks", "ranks.imbalance_pct", "ranks.recommendation"), text=False),
)
RANK_METRICS = (
    Metric("input_wait_us_per_step", "Input wait per step", "us", LOWER, _per_step("input_wait_us"),
           na_default="no DataLoader wait known for this rank", text=False),
    Metric("exposed_comm_us_per_step", "Exposed communication per step", "us", LOWER, _per_step("exposed_comm_us"),
           na_default="no included step on this rank", text=False),
)


# One row per collective kind (key ``busbw_gbps.<kind>``), read from a kind's row: the run's
# ``collective_bandwidth.kinds`` (shortest rank's time) or the report's ``collectives.kinds``
# (each rank's own time, waiting included), the same on both sides of a comparison.
KIND_METRICS = (
    Metric("busbw_gbps", "Bus bandwidth", "GB/s", HIGHER, path("busbw_gbps"),
           na_default="no message size known for these calls", text=False),
)


def _natural_key(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _partials(results: List[dict]) -> List[dict]:
    return [r["distributed"] for r in results if isinstance(r, dict) and isinstance(r.get("distributed"), dict)]


def rank_view(results_by_worker: Dict[str, List[dict]]) -> dict:
    """The ``ranks`` object: one row per rank, per-collective table, imbalance,
    straggler and its recommendation, ``not_available`` with reasons (metrics §12)."""
    workers = sorted(results_by_worker, key=_natural_key)
    na: Dict[str, str] = {}
    view: dict = {"available": False, "rank_count": len(workers), "world_size": None, "backend": None,
                  "ranks": [], "steps": [], "collectives": [], "imbalance_pct": None, "straggler": None,
                  "flagged": False, "recommendation": None, "collective_bandwidth": None, "fewest_steps": 0,
                  "straggler_gap": None, "not_available": na}
    if len(workers) < 2:
        na["ranks"] = SINGLE_WORKER
        return view

    partials = {w: _partials(results_by_worker[w]) for w in workers}
    # Rank numbers: distributedInfo.rank when every worker has one and they are distinct.
    declared = {w: next((p["rank"] for p in partials[w] if p.get("rank") is not None), None) for w in workers}
    numbers = list(declared.values())
    if all(n is not None for n in numbers) and len(set(numbers)) == len(numbers):
        rank_of, source = declared, "distributed_info"
    else:
        rank_of, source = {w: i for i, w in enumerate(workers)}, "worker_order"
        if any(n is not None for n in numbers):
            na["ranks.rank"] = ("distributedInfo.rank missing in some workers or not distinct: "
                                "ranks numbered by worker order")
    workers.sort(key=lambda w: rank_of[w])
    first = next((p for w in workers for p in partials[w]), {})
    view["world_size"] = first.get("world_size")
    view["backend"] = first.get("backend")

    # ---- per-rank split (sums over all included steps of all spans) ------------------
    rows: List[dict] = []
    kinds_flat: List[str] = []
    durs_flat: List[float] = []
    bytes_flat: List[Optional[float]] = []
    seg_rank: List[int] = []  # one entry per (rank, step): rank index, step number, #collectives
    seg_step: List[int] = []
    seg_len: List[int] = []
    for ri, w in enumerate(workers):
        steps = [s for p in partials[w] for s in p.get("steps") or []]
        row: dict = {"rank": rank_of[w], "worker": w, "rank_source": source, "steps": len(steps)}
        if not partials[w]:
            na[f"ranks.{w}"] = NO_PARTIAL
        elif not steps:
            na[f"ranks.{w}"] = NO_STEPS
        total = sum(s["step_us"] for s in steps)
        for key in ("step_us",) + SPLIT:
            row[key] = sum(s[key] for s in steps) if steps else None
        for key in SPLIT:
            row[key.replace("_us", "_pct")] = 100.0 * row[key] / total if steps and total > 0 else None
        row["avg_step_us"] = total / len(steps) if steps else None
        row["compute_us_per_step"] = ((row["compute_only_us"] + row["overlapped_us"]) / len(steps)
                                      if steps else None)
        row.update(_report_numbers(results_by_worker[w]))
        row.update(_bar_split(results_by_worker[w]))
        row["per_step"] = {"steps": [s["step"] for s in steps], "step_us": [s["step_us"] for s in steps],
                           "wait_us": [None] * len(steps)}
        for s in steps:
            coll = s.get("collectives") or {}
            n = len(coll.get("kind") or [])
            kinds_flat.extend(coll.get("kind") or [])
            durs_flat.extend(coll.get("dur_us") or [])
            bytes_flat.extend(coll.get("bytes") or [None] * n)
            seg_rank.append(ri)
            seg_step.append(int(s["step"]))
            seg_len.append(n)
        rows.append(row)

    # ---- collectives: flat arrays, matched per step number by position ----------------
    n_ranks = len(rows)
    dur = np.asarray(durs_flat, dtype=np.float64)
    byts = np.array([np.nan if b is None else b for b in bytes_flat], dtype=np.float64)
    kind_names, kind = np.unique(np.asarray(kinds_flat, dtype=object).astype(str), return_inverse=True) \
        if kinds_flat else (np.empty(0, str), np.empty(0, np.int64))
    seg_rank_a = np.asarray(seg_rank, np.int64)
    seg_step_a = np.asarray(seg_step, np.int64)
    seg_len_a = np.asarray(seg_len, np.int64)
    ent_rank = np.repeat(seg_rank_a, seg_len_a)
    ent_step = np.repeat(seg_step_a, seg_len_a)
    seg_off = np.concatenate([[0], np.cumsum(seg_len_a)])[:-1]
    ent_pos = np.arange(len(dur)) - np.repeat(seg_off, seg_len_a)
    matched = np.zeros(len(dur), bool)
    ent_wait = np.zeros(len(dur))
    ent_transfer = np.zeros(len(dur))
    wait_by_rank_step: Dict[Tuple[int, int], float] = {}
    straggler_steps = np.zeros(n_ranks, np.int64)
    # Per step with a straggler: (straggler's rank index, 100 * mean wait of the others /
    # mean step time); the median over steps is the wait the rank caused.
    leads: List[Tuple[int, float]] = []
    step_us_of = {(r, s): rows[r]["per_step"]["step_us"][i]
                  for r in range(n_ranks) for i, s in enumerate(rows[r]["per_step"]["steps"])}
    steps_with_straggler = 0
    common_steps = sorted(set(seg_step))
    for n in common_steps:
        segs = np.flatnonzero(seg_step_a == n)
        present = seg_rank_a[segs]
        if len(present) < 2:
            continue
        k_max = int(seg_len_a[segs].min())
        sel = np.flatnonzero(ent_step == n)
        local = np.full(n_ranks, -1, np.int64)
        local[present] = np.arange(len(present))
        waits = np.zeros(len(present))
        if k_max > 0:
            sel = sel[ent_pos[sel] < k_max]
            D = np.empty((len(present), k_max))
            K = np.empty((len(present), k_max), np.int64)
            D[local[ent_rank[sel]], ent_pos[sel]] = dur[sel]
            K[local[ent_rank[sel]], ent_pos[sel]] = kind[sel]
            same = (K == K[0]).all(axis=0)
            k_ok = k_max if same.all() else int(np.argmin(same))
            if k_ok > 0:
                transfer = D[:, :k_ok].min(axis=0)
                W = D[:, :k_ok] - transfer
                waits = W.sum(axis=1)
                hit = sel[ent_pos[sel] < k_ok]
                matched[hit] = True
                ent_transfer[hit] = transfer[ent_pos[hit]]
                ent_wait[hit] = W[local[ent_rank[hit]], ent_pos[hit]]
        for r, wv in zip(present.tolist(), waits.tolist()):
            wait_by_rank_step[(r, n)] = wv
        if len(waits) and waits.max() > waits.min():
            lowest = np.flatnonzero(waits == waits.min())
            s_local = int(lowest[np.argmin(np.array([rows[present[i]]["rank"] for i in lowest]))])
            s_rank = int(present[s_local])
            straggler_steps[s_rank] += 1
            steps_with_straggler += 1
            others = np.delete(waits, s_local)
            base = float(np.mean([step_us_of[(int(r), n)] for r in present]))
            leads.append((s_rank, 100.0 * float(others.mean()) / base if base > 0 else 0.0))

    has_comm = len(dur) > 0
    if not has_comm:
        na["ranks.wait_us"] = NO_COMMUNICATION
    rank_wait = np.bincount(ent_rank[matched], weights=ent_wait[matched], minlength=n_ranks) if has_comm \
        else np.zeros(n_ranks)
    rank_transfer = np.bincount(ent_rank[matched], weights=ent_transfer[matched], minlength=n_ranks) \
        if has_comm else np.zeros(n_ranks)
    rank_comm = np.bincount(ent_rank, weights=dur, minlength=n_ranks) if has_comm else np.zeros(n_ranks)
    for r, row in enumerate(rows):
        row["straggler_steps"] = int(straggler_steps[r])
        row["wait_us"] = float(rank_wait[r]) if has_comm else None
        row["transfer_us"] = float(rank_transfer[r]) if has_comm else None
        row["comm_us"] = float(rank_comm[r]) if has_comm else None
        row["per_step"]["wait_us"] = [wait_by_rank_step.get((r, s)) if has_comm else None
                                      for s in row["per_step"]["steps"]]

    collectives = []
    for k, name in enumerate(kind_names.tolist()):
        m = kind == k
        mm = m & matched
        known = m & ~np.isnan(byts)
        collectives.append({
            "kind": name, "calls": int(m.sum()), "matched_calls": int(mm.sum()),
            "unmatched_calls": int((m & ~matched).sum()),
            "bytes": float(byts[known].sum()) if known.any() else None,
            "bytes_known_calls": int(known.sum()),
            "total_us": float(dur[m].sum()), "transfer_us": float(ent_transfer[mm].sum()),
            "wait_us": float(ent_wait[mm].sum()),
        })
    collectives.sort(key=lambda c: -c["total_us"])

    # ---- imbalance, straggler, recommendation -----------------------------------------
    compute = np.array([r["compute_us_per_step"] for r in rows if r["compute_us_per_step"] is not None])
    imbalance = None
    if len(compute) >= 2 and compute.mean() > 0:
        imbalance = float(100.0 * (compute.max() - compute.mean()) / compute.mean())
    elif len(compute) < 2:
        na["ranks.imbalance_pct"] = "fewer than two ranks with included steps"
    else:
        na["ranks.imbalance_pct"] = "no compute time in any rank's steps"
    straggler = None
    if steps_with_straggler:
        top = int(np.argmax(straggler_steps))
        # median over the steps that have a straggler (0 where another rank was it): a
        # rank that is late by construction leads in most steps; a few scheduling hiccups
        # of a balanced run do not move the median
        caused = float(np.median([lead if r == top else 0.0 for r, lead in leads]))
        straggler = {"rank": rows[top]["rank"], "worker": rows[top]["worker"],
                     "steps": int(straggler_steps[top]), "of_steps": steps_with_straggler,
                     "share_pct": 100.0 * straggler_steps[top] / steps_with_straggler,
                     "wait_caused_pct": caused}
    elif has_comm:
        na["ranks.straggler"] = "no step in which the ranks waited different times"
    view.update(available=True, ranks=rows, steps=common_steps, collectives=collectives,
                imbalance_pct=imbalance, straggler=straggler)
    view["collective_bandwidth"] = _collective_bandwidth(workers, rank_of, results_by_worker, na)
    # one common step is no pattern: neither "holds the others back in 1 of 1 steps" nor an
    # imbalance banner is said from it (METRICS.md §9, MIN_STEPS_TO_COMPARE)
    fewest = min([len(common_steps)] + [r["steps"] for r in rows])
    enough = fewest >= T.MIN_STEPS_TO_COMPARE
    view["fewest_steps"] = fewest
    view["straggler_gap"] = straggler_gap(rows, na, enough)
    if not enough and (straggler is not None or imbalance is not None):
        na["ranks.recommendation"] = (f"too little data: a rank has {fewest} included step(s), "
                                      f"fewer than {T.MIN_STEPS_TO_COMPARE}")
    straggler_fires = (enough and straggler is not None and straggler["share_pct"] >= T.STRAGGLER_STEP_SHARE_PCT
                       and (straggler["wait_caused_pct"] or 0.0) >= T.STRAGGLER_MIN_WAIT_PCT)
    imbalance_fires = enough and imbalance is not None and imbalance >= T.LOAD_IMBALANCE_PCT
    if straggler_fires or imbalance_fires:
        if straggler_fires:
            worker = straggler["worker"]
        else:
            worker = max((r for r in rows if r["compute_us_per_step"] is not None),
                         key=lambda r: r["compute_us_per_step"])["worker"]
        row = next(r for r in rows if r["worker"] == worker)
        view["flagged"] = True
        view["recommendation"] = _recommendation(row, straggler if straggler_fires else None, imbalance,
                                                 results_by_worker[worker], compute)
    # Plain JSON already: partials hold finite Python floats (span_partial), sums and
    # ratios of them are guarded against zero denominators.
    return view


def straggler_gap(rows: List[dict], na: Dict[str, str], enough: bool = True) -> dict:
    """The straggler gap (METRICS.md §12): per step seen by two ranks or more, the slowest
    rank's *busy* time (its step time minus the time it waited in collectives for its peers,
    ``per_step.wait_us``; the step time itself where no collective was matched) minus the
    median busy time of the other ranks. Collectives synchronise the ranks, so their step
    times agree; the busy time is how long each needed on its own, and the gap is how much
    later than a typical rank the straggler arrived. ``mean_us``: the mean over those
    steps; None (n/a) with fewer than MIN_STEPS_TO_COMPARE steps (``enough``)."""
    busy: Dict[int, List[Tuple[float, int]]] = {}
    for r in rows:
        ps = r["per_step"]
        for step, st, wait in zip(ps["steps"], ps["step_us"], ps["wait_us"]):
            busy.setdefault(int(step), []).append((st - (wait or 0.0), r["rank"]))
    per_step = []
    for step in sorted(busy):
        values = busy[step]
        if len(values) < 2:
            continue
        slow = max(values, key=lambda v: (v[0], -v[1]))
        others = [v[0] for v in values if v is not slow]
        per_step.append({"step": step, "rank": slow[1], "busy_us": slow[0],
                         "median_others_us": float(np.median(others)), "gap_us": slow[0] - float(np.median(others))})
    out = {"per_step": per_step, "mean_us": None}
    if not per_step:
        na["ranks.straggler_gap"] = "no step seen by two ranks or more"
    elif not enough:
        na["ranks.straggler_gap"] = (f"too little data: a rank has fewer than {T.MIN_STEPS_TO_COMPARE} "
                                     "included steps")
    else:
        out["mean_us"] = float(np.mean([p["gap_us"] for p in per_step]))
    return out


def _collective_bandwidth(workers: List[str], rank_of: Dict[str, int], results_by_worker: Dict[str, List[dict]],
                          na: Dict[str, str]) -> dict:
    """Bandwidth per collective against the link over all ranks (METRICS.md "Collective
    bandwidth", analysis/collectives.run_table): each call's transfer time is the shortest
    duration among the ranks that ran it."""
    from ..analysis import collectives as C

    table = C.run_table([C.rank_call_rows(results_by_worker[w]) for w in workers], [rank_of[w] for w in workers],
                        next((link for w in workers for link in [C.run_link(results_by_worker[w])] if link), None))
    for key, why in table.pop("not_available").items():
        na[f"ranks.{key}"] = why
    return table


def _clean(view: dict) -> dict:
    """Plain JSON: partials hold Python floats, so NaN/inf are rare; check in C first and
    only walk the object when there is one (the walk costs more than the whole view)."""
    import json

    try:
        json.dumps(view, allow_nan=False)
        return view
    except ValueError:
        return _walk_clean(view)


BAR_KEYS = ("compute_us", "overlapped_us", "exposed_comm_us", "input_wait_us", "other_us")
# Where the DataLoader wait sits in the four-way split: on a CPU-only trace the DataLoader
# spans are host spans, so compute (then overlapped, then other); on a GPU trace the
# DataLoader category (§2: no kernel, copy or runtime call under it) lies in "other".
_INPUT_FROM = {"cpu": ("compute_only_us", "overlapped_us", "other_us"), "gpu": ("other_us",)}


def _bar_split(results: List[dict]) -> dict:
    """The step split as drawn, five parts that add up to the step time (sums over the
    rank's included steps): the four-way split with the input wait taken out as its own
    part. Input wait per step = the span report's DataLoader-category µs of that step (the
    numerator of its input-bound %, §3), taken from the part that holds it (_INPUT_FROM)."""
    bar = dict.fromkeys(BAR_KEYS, 0.0)
    known = False
    devices = set()
    for r in results:
        p = r.get("distributed") if isinstance(r, dict) else None
        if not isinstance(p, dict):
            continue
        devices.add(p.get("device"))
        waits = {s.get("step"): s.get("dataloader_us")
                 for s in ((r.get("report") or {}).get("input") or {}).get("per_step") or [] if isinstance(s, dict)}
        for s in p.get("steps") or []:
            parts = {k: s[k] for k in SPLIT}
            left = waits.get(s["step"])
            if isinstance(left, (int, float)) and left > 0:
                known = True
                for k in _INPUT_FROM.get(p.get("device"), ()):
                    take = min(left, parts[k])
                    parts[k] -= take
                    bar["input_wait_us"] += take
                    left -= take
            elif isinstance(left, (int, float)):
                known = True
            bar["compute_us"] += parts["compute_only_us"]
            bar["overlapped_us"] += parts["overlapped_us"]
            bar["exposed_comm_us"] += parts["exposed_comm_us"]
            bar["other_us"] += parts["other_us"]
    devices.discard(None)
    return {"device": devices.pop() if len(devices) == 1 else ("mixed" if devices else None),
            "input_wait_us": bar["input_wait_us"] if known else None, "bar_us": bar}


def _report_numbers(results: List[dict]) -> dict:
    """input-bound % (ratio of sums over the steps of all spans), GPU utilization
    (weighted by each span's steps window), MFU and TFLOP/s from the rank's span reports."""
    dl = st = 0.0
    util = weight = 0.0
    for r in results:
        rep = r.get("report") or {}
        for s in (rep.get("input") or {}).get("per_step") or []:
            dl += s.get("dataloader_us") or 0.0
            st += s.get("step_us") or 0.0
        window = (rep.get("steps") or {}).get("window_us") or 0.0
        for g in (rep.get("gpu") or {}).values():
            if g.get("utilization_pct") is not None and window:
                util += g["utilization_pct"] * window
                weight += window
    # MFU (METRICS.md §15) as a ratio of sums over the rank's spans: Σ ideal time at the
    # GPU's peak / Σ step time; unknown when any span has no FLOPs or no peak
    ideal = flop = fstep = 0.0
    flops_known = bool(results)
    for r in results:
        f = (r.get("report") or {}).get("flops")
        if isinstance(f, dict) and isinstance(f.get("ideal_us"), (int, float)) and f.get("step_us"):
            ideal += f["ideal_us"]
            flop += f.get("flops") or 0.0
            fstep += f["step_us"]
        else:
            flops_known = False
    return {"input_bound_pct": 100.0 * dl / st if st > 0 else None,
            "gpu_utilization_pct": util / weight if weight > 0 else None,
            "mfu_pct": 100.0 * ideal / fstep if flops_known and fstep > 0 else None,
            "tflops": flop / fstep / 1e6 if flops_known and fstep > 0 else None}


def _recommendation(row: dict, straggler: Optional[dict], imbalance: Optional[float],
                    results: List[dict], compute: np.ndarray) -> dict:
    """Names the rank and quotes its own report's top bottleneck (metrics §12)."""
    from .. import report as report_mod  # the rank's own report, all its spans combined

    rep = report_mod.combine_results(results, worker=row["worker"], views=False)["report"] if len(results) > 1 \
        else (results[0].get("report") or {})
    own = (rep.get("recommendations") or [])
    top_kernel = next(iter((rep.get("occupancy") or {}).get("kernels") or []), None)
    peaks = [(k, m.get("peak_allocated_bytes")) for k, m in (rep.get("memory") or {}).items()
             if isinstance(m, dict) and m.get("peak_allocated_bytes") is not None]
    peak = max(peaks, key=lambda kv: kv[1]) if peaks else None
    who = f"rank {row['rank']} (worker {row['worker']})"
    numbers = {"rank": row["rank"], "imbalance_pct": imbalance,
               "input_bound_pct": row.get("input_bound_pct"),
               "compute_us_per_step": row.get("compute_us_per_step")}
    if straggler is not None:
        numbers.update(straggler_steps=straggler["steps"], of_steps=straggler["of_steps"],
                       wait_caused_pct=straggler["wait_caused_pct"])
        title = (f"{who} holds the others back: straggler in {straggler['steps']} of "
                 f"{straggler['of_steps']} steps; the other ranks wait "
                 f"{straggler['wait_caused_pct']:.1f}% of a typical step for it")
        gain = straggler["wait_caused_pct"]
        high = (straggler["wait_caused_pct"] >= T.STRAGGLER_WAIT_HIGH_PCT
                or (imbalance or 0.0) >= T.LOAD_IMBALANCE_HIGH_PCT)
    else:
        title = (f"Load imbalance {imbalance:.1f}%: {who} computes "
                 f"{row['compute_us_per_step'] / 1000:.2f} ms per step, the mean is "
                 f"{compute.mean() / 1000:.2f} ms")
        gain = 100.0 * (compute.max() - compute.mean()) / compute.max() if compute.max() > 0 else None
        high = imbalance >= T.LOAD_IMBALANCE_HIGH_PCT
    facts = []
    if row.get("input_bound_pct") is not None:
        facts.append(f"input-bound {row['input_bound_pct']:.1f}%")
    if top_kernel:
        facts.append(f"top kernel {top_kernel.get('name')} ({(top_kernel.get('time_pct') or 0):.1f}% of kernel time)")
    if peak:
        facts.append(f"peak memory {_bytes_words(peak[1])} on {device_label(peak[0], rep)}")
    if own:
        first = own[0]
        action = (f"Fix rank {row['rank']} first: its own report's top finding is \"{first.get('title')}\" "
                  f"-> {first.get('action')}")
        cause = {"rule": first.get("rule"), "severity": first.get("severity"), "title": first.get("title"),
                 "action": first.get("action")}
    else:
        action = (f"Rank {row['rank']}'s own report shows no bottleneck above threshold: look at what "
                  f"differs on that rank (data shard sizes, host CPU contention, a slower link or GPU).")
        cause = None
    if facts:
        action += " Its numbers: " + ", ".join(facts) + "."
    return {"rule": "straggler", "severity": "high" if high else "medium", "title": title, "action": action,
            "rank": row["rank"], "worker": row["worker"], "numbers": numbers, "cause": cause,
            "evidence": facts, "estimated_gain_pct": gain}


def _bytes_words(b: float) -> str:
    """Bytes as the cards write them (static/format.js fmtBytes): binary units, about three
    significant digits ('716 KiB', '1.50 MiB', '12.3 GiB')."""
    a = abs(b)
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= f:
            x = a / f
            return f"{b / f:.{min(2, max(0, 2 - int(math.floor(math.log10(x)))))}f} {unit}"
    return f"{b:g} B"


# ---------------------------------------------------------------------------- text


def gbps(value: float) -> str:
    """A bandwidth with 3 significant digits: gloo's 0.0033 GB/s and NVLink's 412 GB/s alike."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def format_ranks_text(view: dict, indent: str = "") -> str:
    """The rank view for a terminal: recommendation, one line per rank (at most 40, the
    slowest first beyond that), the per-collective table."""
    if not view.get("available"):
        why = (view.get("not_available") or {}).get("ranks", "not available")
        return f"{indent}ranks: n/a ({why})"
    lines = [f"{indent}ranks: {view['rank_count']} ranks"
             + (f", backend {view['backend']}" if view.get("backend") else "")
             + (f", world size {view['world_size']}" if view.get("world_size") else "")
             + (f"; load imbalance {view['imbalance_pct']:.1f}%" if view.get("imbalance_pct") is not None else "")]
    rec = view.get("recommendation")
    if rec:
        lines.append(f"{indent}  [{rec['severity']}] {rec['title']}")
        lines.append(f"{indent}      -> {rec['action']}")
    rows = view["ranks"]
    shown = rows if len(rows) <= 40 else sorted(rows, key=lambda r: -(r["avg_step_us"] or 0))[:40]
    lines.append(f"{indent}  {'rank':>5} {'worker':<16} {'step ms':>8} {'compute':>8} {'overlap':>8} "
                 f"{'exposed':>8} {'input':>8} {'other':>8} {'stragl':>6} {'wait ms':>9} {'xfer ms':>9}")
    lines.append(f"{indent}  (% of step time, the five parts the tab draws: the input wait (DataLoader) taken out "
                 f"of compute/other; stragl = steps in which the rank waited least; wait/xfer = totals over all steps)")

    def pct(v):
        return f"{v:7.1f}%" if v is not None else f"{'n/a':>8}"

    def ms(v, width=9):
        return f"{v / 1000:{width}.2f}" if v is not None else f"{'n/a':>{width}}"

    def part(r, key):  # a part of the bar as % of the rank's step time (ranks.js draws the same)
        bar, step = r.get("bar_us") or {}, r.get("step_us")
        return 100.0 * bar[key] / step if isinstance(bar.get(key), (int, float)) and step else None

    for r in shown:
        lines.append(f"{indent}  {r['rank']:>5} {str(r['worker'])[:16]:<16} {ms(r['avg_step_us'], 8)} "
                     + " ".join(pct(part(r, k)) for k in BAR_KEYS)
                     + f" {r['straggler_steps']:>6} {ms(r['wait_us'])} {ms(r['transfer_us'])}")
    if len(rows) > len(shown):
        lines.append(f"{indent}  ... {len(rows) - len(shown)} more ranks (slowest 40 shown; --json has all)")
    for c in view.get("collectives") or []:
        size = f", {c['bytes'] / 2**20:.1f} MiB" if c.get("bytes") is not None else ""
        lines.append(f"{indent}  {c['kind']}: {c['calls']} calls{size}, {c['total_us'] / 1000:.2f} ms "
                     f"(transfer {c['transfer_us'] / 1000:.2f} ms, wait {c['wait_us'] / 1000:.2f} ms"
                     + (f", {c['unmatched_calls']} unmatched" if c.get("unmatched_calls") else "") + ")")
    cb = view.get("collective_bandwidth") or {}
    link = cb.get("link") or {}
    for g in (cb.get("groups") or [])[:12]:
        if g.get("busbw_gbps") is None:
            continue
        pct = f" = {g['link_pct']:.0f}% of {link.get('link')} {link.get('gbps'):g} GB/s" \
            if g.get("link_pct") is not None else ""
        lines.append(f"{indent}  busbw {g['kind']} {g['size_bucket']} pg {g['process_group']}: "
                     f"{gbps(g['busbw_gbps'])} GB/s{pct} ({g['matched_calls']} calls, shortest rank's time)")
    for key, why in (view.get("not_available") or {}).items():
        lines.append(f"{indent}  n/a {key}: {why}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- route


def run_rank_view(run: str, spans: list, relative) -> dict:
    """The ``/ranks?run=`` answer of a run none of whose spans is still loading: the rank
    view over its ready spans, the spans that failed in ``file_errors``. ``spans``:
    [(Worker, Span, SpanState)] (``Analyzer.span_states``); ``relative``: the redaction
    the report route applies (``Analyzer.relative``), since an error names its file and
    no answer may carry a server path."""
    by_worker: Dict[str, List[dict]] = {}
    errors = []
    for w, s, st in spans:
        if st.state == "ready" and st.result is not None:
            by_worker.setdefault(w.name, []).append(st.result)
        elif st.state == "error":
            errors.append({"worker": w.name, "span": s.name, "error": relative(st.error)})
    workers = {w.name for w, _, _ in spans}
    view = rank_view(by_worker)
    missing = sorted(workers - set(by_worker), key=_natural_key)
    if missing and len(workers) > 1:
        view["not_available"]["ranks.workers"] = f"no analysed span for worker(s) {', '.join(missing)}"
    view["run"] = run
    view["state"] = "ready"
    view["file_errors"] = errors
    return _clean(view)


def _walk_clean(v):
    if isinstance(v, dict):
        return {k: _walk_clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_walk_clean(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


__all__ = ["rank_view", "format_ranks_text", "run_rank_view"]
