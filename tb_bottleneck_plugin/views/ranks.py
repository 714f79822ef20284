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
from ..analysis.collectives import stable_order
from ..analysis.devices import label as device_label
from ..analysis.units import HIGHER, LOWER, Metric, path
from .pipeline import NO_P2P, format_pipeline_text, pipeline_view

SPLIT = ("compute_only_us", "overlapped_us", "exposed_comm_us", "other_us")
ROW_SUMS = ("step_us",) + SPLIT
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
                  "straggler_gap": None, "process_groups": [], "straggler_cause": None, "pipeline": None,
                  "not_available": na}
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
    pg_flat: List[str] = []
    seq_flat: List[int] = []
    activity: Dict[Tuple[int, int], dict] = {}  # (rank index, step) -> the partial's activity
    seg_rank: List[int] = []  # one entry per (rank, step): rank index, step number, #collectives
    seg_step: List[int] = []
    seg_len: List[int] = []
    any_p2p = False  # a send/recv in any step: the pipeline view has something to read
    for ri, w in enumerate(workers):
        steps = [s for p in partials[w] for s in p.get("steps") or []]
        row: dict = {"rank": rank_of[w], "worker": w, "rank_source": source, "steps": len(steps)}
        if not partials[w]:
            na[f"ranks.{w}"] = NO_PARTIAL
        elif not steps:
            na[f"ranks.{w}"] = NO_STEPS
        for key in ROW_SUMS:  # plain loops: a third of sum() over a generator, the same additions
            t = 0
            for s in steps:
                t += s[key]
            row[key] = t if steps else None
        total = row["step_us"] if steps else 0
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
            pg_flat.extend(coll.get("pg") or [None] * n)  # None: the group "unknown" (below)
            seq_flat.extend(coll.get("seq") or [None] * n)
            if isinstance(s.get("activity"), dict):
                activity[(ri, int(s["step"]))] = s["activity"]
            if not any_p2p and isinstance(s.get("p2p"), dict) and s["p2p"].get("kind"):
                any_p2p = True
            seg_rank.append(ri)
            seg_step.append(int(s["step"]))
            seg_len.append(n)
        rows.append(row)

    # ---- collectives: flat arrays, matched per step number by position ----------------
    n_ranks = len(rows)
    dur = np.asarray(durs_flat, dtype=np.float64)
    byts = np.array([np.nan if b is None else b for b in bytes_flat], dtype=np.float64)
    # kind codes in name order (np.unique's), by a lookup per call in a table of the few names
    # (sorting 1,024 ranks' kind strings took 4 ms)
    kind_words = {v: str(v) for v in set(kinds_flat)}
    kind_names = np.array(sorted(set(kind_words.values())), dtype=str) if kinds_flat else np.empty(0, str)
    kind_code = {v: int(np.searchsorted(kind_names, w)) for v, w in kind_words.items()}
    kind = np.fromiter(map(kind_code.__getitem__, kinds_flat), np.int64, len(kinds_flat))
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
    straggler_steps = np.zeros(n_ranks, np.int64)
    # Per step with a straggler: (straggler's rank index, 100 * mean wait of the others /
    # mean step time); the median over steps is the wait the rank caused.
    leads: List[Tuple[int, float]] = []
    common_steps = sorted(set(seg_step))
    # step time per (rank index, step column of common_steps); a (rank, step) seen twice keeps the last
    step_us_of = np.full((n_ranks, len(common_steps)), np.nan)
    rank_cols = (np.empty(0, np.int64), np.empty(0, np.int64))
    if common_steps:
        rr = np.repeat(np.arange(n_ranks), [len(r["per_step"]["steps"]) for r in rows])
        cc = np.searchsorted(np.asarray(common_steps), np.array([n for r in rows for n in r["per_step"]["steps"]],
                                                                np.int64))
        step_us_of[rr, cc] = [v for r in rows for v in r["per_step"]["step_us"]]
        rank_cols = (rr, cc)
    # group codes: a C-level lookup per call in a table of the few distinct names (None: "unknown")
    names_of = {v: UNKNOWN_PG if v is None else str(v) for v in set(pg_flat)}
    name_list = sorted(set(names_of.values()))
    code_of = {v: name_list.index(nm) for v, nm in names_of.items()}
    pg_names = np.array(name_list, dtype=object).astype(str) if name_list else np.empty(0, str)
    ent_pg = np.zeros(len(pg_flat), np.int64) if len(name_list) <= 1 else \
        np.fromiter(map(code_of.__getitem__, pg_flat), np.int64, len(pg_flat))
    try:  # every call with its sequence number: one C-level conversion
        ent_seq = np.array(seq_flat, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        ent_seq = np.full(len(seq_flat), -1, np.int64) if seq_flat.count(None) == len(seq_flat) else \
            np.nan_to_num(np.array(seq_flat, dtype=np.float64), nan=-1.0).astype(np.int64)
    declared_groups = _declared_groups(partials, workers)
    wait_mat = np.full((n_ranks, len(common_steps)), np.nan)
    groups = _match_groups(rows, source, pg_names.tolist(), declared_groups, ent_rank, ent_step, ent_pos, ent_pg,
                           ent_seq,
                           kind, kind_names, dur, byts, seg_rank_a, seg_step_a, common_steps, step_us_of,
                           matched, ent_wait, ent_transfer, wait_mat, na)
    steps_with_straggler = 0
    col_of_step = {n: j for j, n in enumerate(common_steps)}
    for n in common_steps:
        present = seg_rank_a[seg_step_a == n]
        if len(present) < 2:
            continue
        j = col_of_step[n]
        waits = np.nan_to_num(wait_mat[present, j])  # a rank in none of the step's matched groups: 0
        wait_mat[present, j] = waits
        if len(waits) and waits.max() > waits.min():
            lowest = np.flatnonzero(waits == waits.min())
            s_local = int(lowest[np.argmin(np.array([rows[present[i]]["rank"] for i in lowest]))])
            s_rank = int(present[s_local])
            straggler_steps[s_rank] += 1
            steps_with_straggler += 1
            others = np.delete(waits, s_local)
            base = float(step_us_of[present, col_of_step[n]].mean())
            leads.append((s_rank, 100.0 * float(others.mean()) / base if base > 0 else 0.0))

    has_comm = len(dur) > 0
    if not has_comm:
        na["ranks.wait_us"] = NO_COMMUNICATION
    rank_wait = np.bincount(ent_rank[matched], weights=ent_wait[matched], minlength=n_ranks) if has_comm \
        else np.zeros(n_ranks)
    rank_transfer = np.bincount(ent_rank[matched], weights=ent_transfer[matched], minlength=n_ranks) \
        if has_comm else np.zeros(n_ranks)
    rank_comm = np.bincount(ent_rank, weights=dur, minlength=n_ranks) if has_comm else np.zeros(n_ranks)
    # each rank's waits in the order of its per_step lists (rank_cols: built with step_us_of)
    step_waits = wait_mat[rank_cols].tolist() if has_comm and common_steps else []
    at = 0
    for r, row in enumerate(rows):
        row["straggler_steps"] = int(straggler_steps[r])
        row["wait_us"] = float(rank_wait[r]) if has_comm else None
        row["transfer_us"] = float(rank_transfer[r]) if has_comm else None
        row["comm_us"] = float(rank_comm[r]) if has_comm else None
        k = len(row["per_step"]["steps"])
        row["per_step"]["wait_us"] = [None if v != v else v for v in step_waits[at:at + k]] if has_comm \
            else [None] * k
        at += k

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
    # ---- per process group: its straggler and the cause by difference ------------------
    for g in groups:
        st = g["straggler"]
        if st is None:
            continue
        idx, members = st.pop("_index"), st.pop("_members")
        st["cause"] = None
        if _real_straggler(st):
            p = int(np.flatnonzero(pg_names == g["name"])[0])
            comm_of = _comm_per_rank_step(ent_pg == p, ent_rank, ent_step, dur, n_ranks, common_steps)
            st["cause"] = straggler_cause(idx, members, st["late_steps"], rows, activity, comm_of, g["kinds"])
        st["sentence"] = (f"{g['label']}: rank {st['rank']} is late in {st['late_pct']:.0f}% of its "
                          f"{'/'.join(k.replace('_', '-') for k in g['kinds'])}s ({st['late_calls']} of "
                          f"{st['of_calls']} matched calls; the straggler in {st['steps']} of {st['of_steps']} steps)"
                          if st["late_pct"] is not None else f"{g['label']}: rank {st['rank']}")
    if straggler is not None and _real_straggler(straggler):
        top_i = next(i for i, r in enumerate(rows) if r["worker"] == straggler["worker"])
        comm_all = _comm_per_rank_step(np.ones(len(dur), bool), ent_rank, ent_step, dur, n_ranks, common_steps)
        late_at = [n for n in common_steps
                   if _straggler_of_step(n, seg_rank_a, seg_step_a, wait_mat[:, col_of_step[n]], rows) == top_i]
        view["straggler_cause"] = straggler_cause(top_i, list(range(n_ranks)), late_at, rows, activity,
                                                  comm_all, [str(k) for k in kind_names.tolist()])
    view.update(available=True, ranks=rows, steps=common_steps, collectives=collectives,
                imbalance_pct=imbalance, straggler=straggler, process_groups=groups)
    view["pipeline"] = pipeline_view(rows, {rank_of[w]: [s for p in partials[w] for s in p.get("steps") or []]
                                            for w in workers},
                                     {rank_of[w]: next((p.get("process_groups") for p in partials[w]
                                                        if p.get("process_groups")), []) for w in workers}
                                     ) if any_p2p else pipeline_view(rows, {}, {})
    if view["pipeline"]["not_available"] not in (None, NO_P2P):
        na["ranks.pipeline"] = view["pipeline"]["not_available"]
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
        cause = view.get("straggler_cause")
        if straggler_fires and cause and cause.get("activity"):
            rec = view["recommendation"]
            rec["difference"] = {k: cause[k] for k in ("activity", "diff_us", "hidden_compute", "sentence")}
            fix = CAUSE_FIX[cause["activity"]].format(rank=rec["rank"])
            rec["action"] = f"Why it is late: {cause['sentence']}. {fix}. " + rec["action"].replace(
                f"Fix rank {rec['rank']} first: its own report's top finding is",
                "Its own report's top finding (which the other ranks may share) is", 1)
            rec["evidence"] = [cause["sentence"]] + list(rec.get("evidence") or [])
    # Plain JSON already: partials hold finite Python floats (span_partial), sums and
    # ratios of them are guarded against zero denominators.
    return view


UNKNOWN_PG = "unknown"
# The terminal lists at most this many process groups (the tab and --json: all).
MAX_GROUP_LINES = 12
# Point-to-point kinds: a send on one rank pairs with a recv on another (the pipeline view)
P2P_KINDS = ("send", "recv")
# Unmatched sequence numbers listed per group (the count is always complete).
MAX_UNMATCHED_LISTED = 20
# Waits per (rank, group x step cell) summed in one dense array up to this many cells x ranks
# (8 bytes each), else through a sort of the keys
DENSE_CELLS = 1 << 21


def _declared_groups(partials: Dict[str, List[dict]], workers: List[str]) -> Dict[str, dict]:
    """Process group name -> {desc, size, ranks} over every rank's partial (the first that
    says each)."""
    out: Dict[str, dict] = {}
    complete = set()  # names whose three fields are known: the other ranks' copies are skipped
    last = None
    for w in workers:
        for p in partials[w]:
            groups = p.get("process_groups") or []
            if groups == last:  # most ranks declare the same groups: one C-level comparison
                continue
            last = groups
            for g in groups:
                name = g.get("name") if isinstance(g, dict) else None
                if name is None:
                    continue
                name = str(name)
                if name in complete:
                    continue
                row = out.get(name)
                if row is None:
                    row = out[name] = {"desc": g.get("desc"), "size": g.get("size"), "ranks": g.get("ranks")}
                else:
                    for k in ("desc", "size", "ranks"):
                        if row[k] is None and g.get(k) is not None:
                            row[k] = g[k]
                if None not in row.values():
                    complete.add(name)
    return out


def _ranks_words(ranks: List[int]) -> str:
    """[0, 1, 2, 3] -> '0-3'; [0, 2, 4] -> '0,2,4'."""
    if not ranks:
        return "?"
    rs = sorted(ranks)
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"{rs[0]}-{rs[-1]}"
    return ",".join(str(r) for r in rs)


def _median(values: List[float]) -> float:
    """``np.median`` of a short list of finite numbers, the same value without numpy's ~50 µs a
    call (once per group: 1,024 ranks in TP x DP groups have 136)."""
    v = sorted(values)
    h = len(v) // 2
    return float(v[h]) if len(v) % 2 else (v[h - 1] + v[h]) / 2


def _match_groups(rows, source, pg_names, declared, ent_rank, ent_step, ent_pos, ent_pg, ent_seq, kind, kind_names,
                  dur, byts, seg_rank, seg_step, common_steps, step_us_of, matched, ent_wait, ent_transfer,
                  wait_mat, na) -> List[dict]:
    """The collectives matched across the ranks of each process group (METRICS.md §12
    "Process groups"): per group and step (a *cell*), by sequence number where every call of the
    cell carries one, else by position among the rank's calls of that group in the step, with
    the same kind and size on every rank (matching by position stops at the first call that
    differs). Fills ``matched``, ``ent_wait``, ``ent_transfer`` (per entry) and ``wait_mat`` (rank
    index x step column of ``common_steps``: the rank's wait summed over its groups' matched
    calls, NaN where it has no part in any group's step) and returns one row per group with its
    straggler. Vectorised over all cells and groups (entries arrive in rank order, so one
    sort by cell and call keeps the ranks in order within a call); Python loops only over the
    groups, to write their rows."""
    n_ranks, n_groups, n_steps = len(rows), len(pg_names), len(common_steps)
    index_of_rank = {r["rank"]: i for i, r in enumerate(rows)}
    steps_arr = np.asarray(common_steps, np.int64)
    S = max(n_steps, 1)
    has_step = np.zeros((n_ranks, S), bool)  # (rank index, step column)
    if len(seg_rank):
        has_step[seg_rank, np.searchsorted(steps_arr, seg_step)] = True
    m = len(ent_rank)
    ent_col = np.searchsorted(steps_arr, ent_step) if n_steps else np.zeros(m, np.int64)
    p2p_kind = np.isin(kind, [i for i, k in enumerate(kind_names.tolist()) if k in P2P_KINDS])
    coll = ~p2p_kind  # send/recv pair across ranks (the pipeline view), never matched here
    # each collective's position among its rank's collectives of its group in its step (entries
    # are in rank, step, start order; point-to-point calls take no position)
    if n_groups <= 1 and not p2p_kind.any():
        pos = ent_pos
    else:
        pos = np.zeros(m, np.int64)
        nz = np.flatnonzero(coll)
        seg_key = seg_rank * S + np.searchsorted(steps_arr, seg_step) if n_steps else seg_rank
        if n_groups < 2 ** 16 and len(np.unique(seg_key)) == len(seg_key):
            # each (rank, step) one run of entries: a stable sort by group alone keeps a run's
            # calls of a group together and in order (numpy's radix sort of 16-bit keys)
            o = nz[np.argsort(ent_pg[nz].astype(np.uint16), kind="stable")]
        else:
            o = nz[stable_order((ent_rank[nz] * S + ent_col[nz]) * max(n_groups, 1) + ent_pg[nz])]
        k = len(o)
        brk = np.r_[True, (np.diff(ent_rank[o]) != 0) | (np.diff(ent_step[o]) != 0) | (np.diff(ent_pg[o]) != 0)]
        starts = np.flatnonzero(brk)
        pos[o] = np.arange(k) - np.repeat(starts, np.diff(np.r_[starts, k]))
    p2p_per_group = np.bincount(ent_pg[p2p_kind], minlength=n_groups)
    calls_per_group = np.bincount(ent_pg[coll], minlength=n_groups)
    seen = np.zeros((n_groups, n_ranks), bool)
    seen[ent_pg[coll], ent_rank[coll]] = True
    # ---- the groups' members
    members = np.zeros((n_groups, n_ranks), bool)
    meta = []
    # calls that name no group, where the ranks declare several: which calls go together is
    # unknown (two data-parallel groups' all-reduces look alike), so they are not matched
    ambiguous = len(declared) > 1
    unmatchable = np.zeros(n_groups, bool)
    for p, name in enumerate(pg_names):
        conf = declared.get(name) or {}
        conf_ranks = conf.get("ranks") if isinstance(conf.get("ranks"), list) else None
        if name == UNKNOWN_PG and ambiguous:
            members[p] = seen[p]
            unmatchable[p] = True
            na["ranks.process_groups.unknown"] = (
                "collectives that name no process group (gloo's CPU spans, kernels without collective metadata) "
                f"while the ranks declare {len(declared)} groups: which calls belong together is unknown, they "
                "are not matched")
        elif name == UNKNOWN_PG:
            members[p] = True
        elif conf_ranks and source == "distributed_info":
            members[p] = seen[p]
            members[p, [index_of_rank[r] for r in conf_ranks if r in index_of_rank]] = True
        else:
            members[p] = seen[p]
        missing = sorted(r for r in conf_ranks if r not in index_of_rank) if conf_ranks and \
            source == "distributed_info" else []
        meta.append((conf, conf_ranks, missing))
    # ---- the calls of every cell with two ranks or more present
    # groups x steps (a float product: BLAS, exact for counts)
    present_count = (members.astype(np.float64) @ has_step.astype(np.float64)).astype(np.int64)
    present_count[unmatchable] = 0
    idx = np.flatnonzero(coll)
    cell = ent_pg[idx] * S + ent_col[idx]
    pc = present_count.reshape(-1)[cell] if len(idx) else np.empty(0, np.int64)
    idx, cell, pc = idx[pc >= 2], cell[pc >= 2], pc[pc >= 2]
    n_cells = n_groups * S
    seq_cell = np.bincount(cell, weights=(ent_seq[idx] < 0).astype(float), minlength=n_cells) == 0
    col = np.where(seq_cell[cell], ent_seq[idx], pos[idx])
    # by cell, then call (sequence number or position), then rank: idx is in rank order
    width = int(col.max()) + 1 if len(idx) else 1
    o = stable_order(cell * width + col) if n_cells * width < 2 ** 62 else np.lexsort((col, cell))
    idx, cell, pc, col = idx[o], cell[o], pc[o], col[o]
    r_e, d_e = ent_rank[idx], dur[idx]
    by_seq = np.zeros(n_groups, bool)
    by_order = np.zeros(n_groups, bool)
    of_calls = np.zeros(n_groups, np.int64)
    late = np.zeros((n_groups, n_ranks), np.int64)  # matched calls in which the rank arrived last
    unmatched_seqs: Dict[int, List[int]] = {}
    late_steps = np.zeros((n_groups, n_ranks), np.int64)
    # the cells with a straggler, in cell order (so by group, then step): group, rank index, step, lead
    s_group = s_rank = s_step = s_lead = np.zeros(0, np.int64)
    if len(idx):
        new = np.r_[True, (np.diff(cell) != 0) | (np.diff(col) != 0)]
        call = np.cumsum(new) - 1
        starts = np.flatnonzero(new)
        n_calls = len(starts)
        distinct = np.r_[True, (np.diff(call) != 0) | (np.diff(r_e) != 0)]
        n_ranks_in = np.bincount(call, weights=distinct, minlength=n_calls)
        k_e, b_e = kind[idx], byts[idx]
        same_kind = np.minimum.reduceat(k_e, starts) == np.maximum.reduceat(k_e, starts)
        bmax = np.maximum.reduceat(np.where(np.isnan(b_e), -np.inf, b_e), starts)
        bmin = np.minimum.reduceat(np.where(np.isnan(b_e), np.inf, b_e), starts)
        dmin, dmax = np.minimum.reduceat(d_e, starts), np.maximum.reduceat(d_e, starts)
        c_cell, c_col, c_seq = cell[starts], col[starts], seq_cell[cell[starts]]
        c_group = c_cell // S
        ok = (n_ranks_in == pc[starts]) & same_kind & (~np.isfinite(bmax) | (bmax == bmin))
        # by position: matching of a cell stops at its first call that differs
        big = np.iinfo(np.int64).max
        first_fail = np.full(n_cells, big)
        np.minimum.at(first_fail, c_cell, np.where(~ok & ~c_seq, c_col, big))
        ok &= c_seq | (c_col < first_fail[c_cell])
        by_seq[np.unique(c_group[c_seq])] = True
        by_order[np.unique(c_group[~c_seq])] = True
        for g, q in zip(c_group[c_seq & ~ok].tolist(), c_col[c_seq & ~ok].tolist()):
            unmatched_seqs.setdefault(g, []).append(int(q))
        of_calls = np.bincount(c_group[ok], minlength=n_groups)
        hit = ok[call]
        matched[idx[hit]] = True
        ent_transfer[idx[hit]] = dmin[call[hit]]
        ent_wait[idx[hit]] = d_e[hit] - dmin[call[hit]]
        # the rank that arrived last at each matched call: the shortest duration (ties: the
        # lowest rank, the first of the call's entries)
        spread = ok & (dmax > dmin)
        shortest = np.flatnonzero(d_e == dmin[call])
        head = shortest[np.r_[True, np.diff(call[shortest]) != 0]]
        head = head[spread[call[head]]]
        np.add.at(late, (c_group[call[head]], r_e[head]), 1)
        # waits per (rank, cell) over the matched calls
        key = r_e[hit].astype(np.int64) * n_cells + cell[hit]
        if n_ranks * n_cells <= DENSE_CELLS:  # one bin per (rank, cell): no sort
            uk = np.flatnonzero(np.bincount(key, minlength=n_ranks * n_cells))
            sums = np.bincount(key, weights=d_e[hit] - dmin[call[hit]], minlength=n_ranks * n_cells)[uk]
        else:
            uk, inv = np.unique(key, return_inverse=True)
            sums = np.bincount(inv.reshape(-1), weights=d_e[hit] - dmin[call[hit]], minlength=len(uk))
        k_rank, k_cell = uk // n_cells, uk % n_cells
        if n_steps:
            order = np.argsort(k_cell, kind="stable")
            # (bincount adds in the order given, as np.add.at would)
            dense = np.bincount(k_rank[order] * n_steps + k_cell[order] % S, weights=sums[order],
                                minlength=n_ranks * n_steps).reshape(n_ranks, n_steps)
            part = has_step[:, :n_steps] & ((members.T.astype(np.float64) @ (present_count[:, :n_steps] >= 2)) > 0)
            wait_mat[part] = (np.nan_to_num(wait_mat) + dense)[part]
    if len(idx) and len(uk):
        # ---- per cell with a matched call: the straggler (least wait among the present
        # ranks, 0 for a present rank without a matched call; ties: the lowest rank). The
        # present ranks of every such cell, in cell then rank order:
        cells = np.unique(k_cell)
        g_c, j_c = cells // S, cells % S
        mem_g, mem_r = np.nonzero(members)
        mem_start = np.searchsorted(mem_g, np.arange(n_groups))
        cnt = np.bincount(mem_g, minlength=n_groups)[g_c]
        c_of = np.repeat(np.arange(len(cells)), cnt)
        at = np.arange(len(c_of)) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(mem_start[g_c], cnt)
        p_rank = mem_r[at]
        keep = has_step[p_rank, j_c[c_of]]
        c_of, p_rank = c_of[keep], p_rank[keep]
        p_key = p_rank * n_cells + cells[c_of]
        found = np.minimum(np.searchsorted(uk, p_key), len(uk) - 1)
        has_w = uk[found] == p_key
        w = np.where(has_w, sums[found], 0.0)
        c_start = np.flatnonzero(np.r_[True, np.diff(c_of) != 0])
        w_min, w_max = np.minimum.reduceat(w, c_start), np.maximum.reduceat(w, c_start)
        # Σ of each cell's waits as np.sum adds them (SIMD lanes, pairwise: not in order), so
        # the same to the last bit: one row per cell in a matrix per count of waits
        vals, n_w = w[has_w], np.bincount(c_of[has_w], minlength=len(cells))
        first_w = np.cumsum(n_w) - n_w
        w_sum = np.zeros(len(cells))
        for c in np.unique(n_w[n_w > 0]).tolist():
            at_c = np.flatnonzero(n_w == c)
            w_sum[at_c] = vals[first_w[at_c, None] + np.arange(c)].sum(axis=1)
        least = np.flatnonzero(w == w_min[c_of])
        least = least[np.r_[True, np.diff(c_of[least]) != 0]]
        strag = w_max > w_min
        n_present = present_count[g_c, j_c]
        s_group, s_rank, s_step = g_c[strag], p_rank[least][strag], steps_arr[j_c[strag]]
        np.add.at(late_steps, (s_group, s_rank), 1)
        # the others' mean wait over the group's mean step time (the straggler rule's lead)
        step_sum = members.astype(np.float64) @ np.where(has_step[:, :n_steps], np.nan_to_num(step_us_of), 0.0)
        base = step_sum[s_group, j_c[strag]] / n_present[strag]
        others = (w_sum - w_min)[strag] / (n_present[strag] - 1)
        s_lead = np.where(base > 0, 100.0 * others / np.where(base > 0, base, 1.0), 0.0)
    if not len(idx) and n_steps:
        part = has_step[:, :n_steps] & ((members.T.astype(np.float64) @ (present_count[:, :n_steps] >= 2)) > 0)
        wait_mat[part] = np.nan_to_num(wait_mat)[part]
    # ---- one row per group (its numbers read from per-group arrays made here once)
    m_per_group = np.bincount(ent_pg[coll & matched], minlength=n_groups).tolist()
    n_kinds = max(len(kind_names), 1)
    group_kinds = np.unique(ent_pg[coll] * n_kinds + kind[coll])
    kind_bounds = np.searchsorted(group_kinds, np.arange(n_groups + 1) * n_kinds).tolist()
    group_kinds = (group_kinds % n_kinds).tolist()
    kind_words = [str(k) for k in kind_names.tolist()]
    strag_bounds = np.searchsorted(s_group, np.arange(n_groups + 1)).tolist()
    mem_g, mem_r = np.nonzero(members)
    mem_bounds = np.searchsorted(mem_g, np.arange(n_groups + 1)).tolist()
    mem_r = mem_r.tolist()
    rank_list = [r["rank"] for r in rows]
    top_of = late_steps.argmax(axis=1) if n_ranks else np.zeros(n_groups, np.int64)
    of_steps_of = late_steps.sum(axis=1).tolist()
    late_top = late[np.arange(n_groups), top_of].tolist() if n_ranks else [0] * n_groups
    steps_top = late_steps[np.arange(n_groups), top_of].tolist() if n_ranks else [0] * n_groups
    top_of = top_of.tolist()
    calls_of, p2p_of, of_calls = calls_per_group.tolist(), p2p_per_group.tolist(), of_calls.tolist()
    by_seq, by_order = by_seq.tolist(), by_order.tolist()
    out = []
    for p, name in enumerate(pg_names):
        conf, conf_ranks, missing = meta[p]
        calls = calls_of[p]
        m_calls = m_per_group[p]
        mine_idx = mem_r[mem_bounds[p]:mem_bounds[p + 1]]
        ranks_declared = sorted(conf_ranks) if conf_ranks else None
        ranks_present = sorted(rank_list[i] for i in mine_idx)
        label_ranks = ranks_declared or ranks_present
        desc = conf.get("desc")
        row = {"name": name, "desc": desc,
               "label": f"{desc or ('process group ' + name)} (ranks {_ranks_words(label_ranks)})",
               "size": conf.get("size") or (len(conf_ranks) if conf_ranks else len(mine_idx) or None),
               "ranks": ranks_declared, "ranks_present": ranks_present, "missing_ranks": missing,
               "kinds": sorted({kind_words[k] for k in group_kinds[kind_bounds[p]:kind_bounds[p + 1]]}),
               "match_by": "seq" if by_seq[p] and not by_order[p] else (
                   "order" if by_order[p] and not by_seq[p] else ("seq_and_order" if by_seq[p] else None)),
               "calls": calls, "matched_calls": m_calls, "unmatched_calls": calls - m_calls,
               "p2p_calls": p2p_of[p],
               "unmatched_seqs": sorted(set(unmatched_seqs.get(p, [])))[:MAX_UNMATCHED_LISTED],
               "straggler": None}
        if missing:
            na[f"ranks.process_groups.{name}"] = (
                f"no trace for rank(s) {', '.join(map(str, missing))} of {row['label']}: its calls are matched "
                f"over the {len(ranks_present)} ranks present")
        of_steps = of_steps_of[p]
        if of_steps:
            top = top_of[p]
            a, b = strag_bounds[p], strag_bounds[p + 1]
            mine = s_rank[a:b] == top
            caused = _median(np.where(mine, s_lead[a:b], 0.0).tolist())
            row["straggler"] = {"rank": rows[top]["rank"], "worker": rows[top]["worker"],
                                "late_calls": late_top[p], "of_calls": of_calls[p],
                                "late_pct": 100.0 * late_top[p] / of_calls[p] if of_calls[p] else None,
                                "steps": steps_top[p], "of_steps": of_steps,
                                "wait_caused_pct": caused, "late_steps": s_step[a:b][mine].tolist(),
                                "_index": top, "_members": list(mine_idx)}
        out.append(row)
    out.sort(key=lambda g: (-(g["calls"] or 0), g["name"]))
    return out


# The activities a cause is named from (analysis/distributed.ACTIVITY), in words.
CAUSE_WORDS = {
    "dataloader_us": "in the DataLoader",
    "h2d_us": "in host-to-device copies",
    "sync_us": "in host synchronisation (cuda*Synchronize/blocking copies)",
    "compute_forward_us": "computing outside backward and the optimizer (forward)",
    "compute_backward_us": "computing backward",
    "compute_optimizer_us": "in the optimizer step",
    "host_gap_us": "with its host idle (host gaps: no op running)",
}
COMPUTE_ACTIVITIES = ("compute_forward_us", "compute_backward_us", "compute_optimizer_us")
# A compute cause's kernel families (analysis/distributed.KERNEL_FAMILY_ACTIVITY; GPU traces), in words.
KERNEL_FAMILY_WORDS = {"compute_gemm_us": "GEMM kernels", "compute_attention_us": "attention kernels",
                       "compute_triton_us": "Triton (torch.compile) kernels",
                       "compute_other_kernels_us": "other kernels"}
# The cause by difference reads at most this many of the straggler's late steps (evenly spaced).
MAX_CAUSE_STEPS = 64
# What to do about each cause, said of the late rank.
CAUSE_FIX = {
    "dataloader_us": "Make rank {rank}'s input as fast as the others' (its data shard, its DataLoader's "
                     "num_workers, prefetch_factor and pin_memory)",
    "h2d_us": "Make rank {rank}'s host-to-device copies cheaper (pin_memory=True and .to(device, "
              "non_blocking=True), or fewer, larger copies)",
    "sync_us": "Remove the host synchronisation on rank {rank} (.item(), .cpu(), .tolist(), "
               "torch.cuda.synchronize() inside the step)",
    "compute_forward_us": "Balance the forward work across ranks: look for uneven batch shapes or sequence "
                          "lengths, a slower device or host CPU contention on rank {rank}",
    "compute_backward_us": "Balance the backward work across ranks: look for uneven batch shapes or sequence "
                           "lengths, extra gradient work (hooks, checkpointing), a slower device or host CPU "
                           "contention on rank {rank}",
    "compute_optimizer_us": "Balance the optimizer step across ranks (uneven parameter sharding, or extra "
                            "optimizer work on rank {rank})",
    "host_gap_us": "Rank {rank}'s host sits idle: look for CPU contention, a descheduled process or a slow "
                   "filesystem on its host",
}


def straggler_cause(rank_index: int, members: List[int], steps: List[int], rows: List[dict],
                    activity: Dict[Tuple[int, int], dict], comm_of: "_CommPerRankStep",
                    kinds: List[str]) -> Optional[dict]:
    """What the straggler did more than the other ranks of its group (METRICS.md §12 "The
    straggler's cause by difference"): per step where it was late, each activity's µs on the
    straggler minus the median over the other members; the median over those steps (one
    descheduled step of a busy host does not make a cause)."""
    others = [m for m in members if m != rank_index]
    if len(steps) > MAX_CAUSE_STEPS:  # a long run: evenly spaced late steps (the medians barely move)
        steps = [steps[i] for i in np.linspace(0, len(steps) - 1, MAX_CAUSE_STEPS).round().astype(int).tolist()]
    use = [n for n in steps if (rank_index, n) in activity and all((m, n) in activity for m in others)]
    if not others or not use:
        return None
    keys = [k for k in CAUSE_WORDS if all(k in activity[(rank_index, n)] for n in use)]
    diff, own, med = {}, {}, {}
    # (members x steps) per activity: one median per step over the other members
    # (medians of short lists in Python: np.median's ~50 µs a call was most of the cost)
    theirs_of = {n: [activity[(m, n)] for m in others] for n in use}
    for k in keys:
        mine = [activity[(rank_index, n)][k] for n in use]
        theirs = [_median([a[k] for a in theirs_of[n]]) for n in use]
        diff[k] = _median([a - b for a, b in zip(mine, theirs)])
        own[k], med[k] = _median(mine), _median(theirs)
    step_of = [{n: i for i, n in enumerate(rows[m]["per_step"]["steps"])} for m in members]
    step_med = _median([_median([rows[m]["per_step"]["step_us"][step_of[j][n]] for j, m in enumerate(members)])
                        for n in use])
    comm_own = _median([comm_of.get((rank_index, n), 0.0) for n in use])
    comm_med = _median([_median([comm_of.get((m, n), 0.0) for m in others]) for n in use])
    top = max(diff, key=lambda k: diff[k]) if diff else None
    named = top is not None and step_med > 0 and 100.0 * diff[top] / step_med >= T.STRAGGLER_CAUSE_MIN_PCT
    r = rows[rank_index]["rank"]
    out = {"rank": r, "steps": use, "diff_us_per_step": diff, "straggler_us_per_step": own,
           "median_others_us_per_step": med, "step_us": step_med, "activity": top if named else None,
           "diff_us": diff[top] if named else None, "comm_us_per_step": comm_own,
           "median_others_comm_us_per_step": comm_med, "hidden_compute": False}
    if named:
        out["sentence"] = (f"rank {r} spends {diff[top] / 1000:.1f} ms more per step {CAUSE_WORDS[top]} than the "
                           f"median of the other ranks of its group ({own[top] / 1000:.1f} vs "
                           f"{med[top] / 1000:.1f} ms)")
        if top in COMPUTE_ACTIVITIES and comm_own < comm_med:
            what = "/".join(k.replace("_", "-") for k in kinds) or "collective"
            out["hidden_compute"] = True
            out["sentence"] += (f": a compute straggler hidden by the {what}: its own {what} time looks short "
                                f"({comm_own / 1000:.1f} vs {comm_med / 1000:.1f} ms per step) because it arrives "
                                f"last and waits for no one")
        if top in COMPUTE_ACTIVITIES:
            _add_kernel_families(out, rank_index, use, activity, theirs_of)
    else:
        out["sentence"] = (f"no activity of rank {r} exceeds the other ranks' median by "
                           f"{T.STRAGGLER_CAUSE_MIN_PCT:g}% of a step (DataLoader, copies, sync, compute, host gaps)")
    return out


def _add_kernel_families(out: dict, rank_index: int, use: List[int], activity: Dict[Tuple[int, int], dict],
                         theirs_of: Dict[int, List[dict]]) -> None:
    """A compute cause on a GPU trace, by kernel family: the same median difference per family
    (``kernel_family_diff_us_per_step``); the families that account for it named in the sentence
    (largest first, those of at least STRAGGLER_CAUSE_FAMILY_MIN_PCT of the compute difference)."""
    keys = [k for k in KERNEL_FAMILY_WORDS if all(k in activity[(rank_index, n)] for n in use)]
    if not keys:
        return
    fam = {k: _median([activity[(rank_index, n)][k] - _median([a[k] for a in theirs_of[n]]) for n in use])
           for k in keys}
    out["kernel_family_diff_us_per_step"] = fam
    named = sorted((k for k in keys if fam[k] > 0 and 100.0 * fam[k] >= T.STRAGGLER_CAUSE_FAMILY_MIN_PCT * out["diff_us"]),
                   key=lambda k: -fam[k])
    if named:
        out["sentence"] += "; by kernel family: " + ", ".join(
            f"{KERNEL_FAMILY_WORDS[k]} +{fam[k] / 1000:.1f} ms" for k in named)


class _CommPerRankStep:
    """Σ collective durations per (rank index, step): ``get((rank, step), default)``."""

    def __init__(self, mat: np.ndarray, steps: List[int]):
        self.mat, self.col = mat, {n: i for i, n in enumerate(steps)}

    def get(self, key, default=0.0):
        j = self.col.get(key[1])
        return default if j is None else float(self.mat[key[0], j])


def _comm_per_rank_step(mask, ent_rank, ent_step, dur, n_ranks, steps) -> _CommPerRankStep:
    mat = np.zeros((n_ranks, max(len(steps), 1)))
    if mask.any() and steps:
        np.add.at(mat, (ent_rank[mask], np.searchsorted(np.asarray(steps), ent_step[mask])), dur[mask])
    return _CommPerRankStep(mat, steps)


def _real_straggler(st: dict) -> bool:
    """A straggler worth a cause: late in STRAGGLER_STEP_SHARE_PCT of the steps that have one,
    the others waiting STRAGGLER_MIN_WAIT_PCT of a step for it (the straggler rule's test)."""
    share = st.get("share_pct")
    if share is None and st.get("of_steps"):
        share = 100.0 * st["steps"] / st["of_steps"]
    return (share or 0.0) >= T.STRAGGLER_STEP_SHARE_PCT and (st.get("wait_caused_pct") or 0.0) >= \
        T.STRAGGLER_MIN_WAIT_PCT


def _straggler_of_step(n, seg_rank, seg_step, step_waits, rows) -> Optional[int]:
    """The rank index that waited least in step n (ties: the lowest rank), None without one."""
    present = seg_rank[seg_step == n].tolist()
    if len(present) < 2:
        return None
    waits = [0.0 if w != w else w for w in step_waits[present].tolist()]
    if max(waits) <= min(waits):
        return None
    return min((w, rows[r]["rank"], r) for w, r in zip(waits, present))[2]


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
        take_from = _INPUT_FROM.get(p.get("device"), ())
        for s in p.get("steps") or []:
            left = waits.get(s["step"])
            if isinstance(left, (int, float)) and left > 0:
                known = True
                parts = {k: s[k] for k in SPLIT}
                for k in take_from:
                    take = min(left, parts[k])
                    parts[k] -= take
                    bar["input_wait_us"] += take
                    left -= take
            else:
                known = known or isinstance(left, (int, float))
                parts = s  # nothing taken out: the step's own parts (read only)
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
    groups = view.get("process_groups") or []
    # at most MAX_GROUP_LINES groups: those whose straggler causes the most wait first
    shown_groups = groups if len(groups) <= MAX_GROUP_LINES else sorted(
        groups, key=lambda g: -((g.get("straggler") or {}).get("wait_caused_pct") or -1.0))[:MAX_GROUP_LINES]
    for g in shown_groups:
        st = g.get("straggler")
        head = (f"{indent}  group {g['label']}: {g['calls']} calls, {g['matched_calls']} matched"
                + (f" by {g['match_by']}" if g.get("match_by") else "")
                + (f", {g['unmatched_calls']} unmatched" if g.get("unmatched_calls") else "")
                + (f" (Seq {', '.join(map(str, g['unmatched_seqs']))})" if g.get("unmatched_seqs") else "")
                + (f"; no trace for rank(s) {', '.join(map(str, g['missing_ranks']))}" if g.get("missing_ranks")
                   else ""))
        lines.append(head)
        if st:
            lines.append(f"{indent}    {st['sentence']}")
            if st.get("cause"):
                lines.append(f"{indent}    cause: {st['cause']['sentence']}")
    if len(groups) > len(shown_groups):
        lines.append(f"{indent}  ... {len(groups) - len(shown_groups)} more process groups (--json has all)")
    lines.extend(format_pipeline_text(view.get("pipeline") or {}, indent))
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
