"""Pipeline parallelism across the ranks of a run (METRICS.md §12 "Pipeline parallelism").

``pipeline_view(rows, steps_by_rank) -> dict``: from each rank's point-to-point calls per
step (the span partials' ``steps[].p2p``, ``bubble_us``, ``microbatches``; analysis/distributed
.point_to_point) the stages (chains of successors), per stage and step the bubble and its
share, the theoretical bubble of the schedule beside it, and advice priced by the bubble.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

import numpy as np

from .. import thresholds as T

NO_P2P = "no point-to-point call (c10d::send/recv_) in any rank's steps"
NO_PEER = ("the point-to-point calls carry no peer rank (profile with record_shapes=True: their "
           "'Concrete Inputs' name it)")
NO_CHAIN = "the point-to-point calls form no chain of stages (no rank sends activations on to another)"


def _successor(calls: dict, me: int, ranks: set) -> Optional[int]:
    """The peer of the rank's first send whose peer it has not received from before in the
    step (None: its first send returns gradients, or it sends nothing)."""
    got = set()
    for kind, peer in zip(calls.get("kind") or [], calls.get("peer") or []):
        if peer is None or peer == me or peer not in ranks:
            continue
        if kind == "recv":
            got.add(peer)
        elif kind == "send":
            return None if peer in got else peer
    return None


def theoretical_bubble(p: int, m: int) -> Optional[float]:
    """(p - 1) / (m + p - 1): the idle fraction of balanced stages (GPipe and 1F1B alike)."""
    return (p - 1) / (m + p - 1) if p >= 1 and m >= 1 else None


def _global_peers(have: Dict[int, List[dict]], groups_by_rank: Dict[int, List[dict]]) -> Dict[int, Dict[int, int]]:
    """Per rank, group-local peer number -> rank of the run. A c10d op records its peer as a rank
    of the group it ran in; the group is not recorded, so each rank takes the one of its groups
    (``pg_config``) under which its sends and receives are answered by the peers' (a send to X
    that X receives from it), the smallest group on a tie; the identity when no group answers
    better (the default group)."""
    ranks = set(have)

    def candidates(r):
        out = [{q: q for q in ranks}]  # the default group: peers are ranks of the run
        for g in sorted(groups_by_rank.get(r) or [], key=lambda g: len(g.get("ranks") or [])):
            rs = g.get("ranks")
            if isinstance(rs, list) and r in rs and 2 <= len(rs) < len(ranks):
                out.append({i: q for i, q in enumerate(rs)})
        return out

    def pairs(r, mapping):
        got = Counter()
        for s in have[r]:
            for kind, peer in zip(s["p2p"]["kind"], s["p2p"]["peer"]):
                q = mapping.get(peer) if peer is not None else None
                if q is not None and q != r:
                    got[(kind, q)] += 1
        return got

    cand = {r: candidates(r) for r in ranks}
    seen = {r: [pairs(r, m) for m in cand[r]] for r in ranks}
    chosen: Dict[int, Dict[int, int]] = {}
    for r in ranks:
        def answered(i):
            n = 0
            for (kind, q), k in seen[r][i].items():
                back = "recv" if kind == "send" else "send"
                if q in seen and any(p.get((back, r)) for p in seen[q]):
                    n += k
            return n
        scores = [answered(i) for i in range(len(cand[r]))]
        best = max(range(len(scores)), key=lambda i: (scores[i], i > 0, -i))
        chosen[r] = cand[r][best] if scores[best] > 0 else cand[r][0]
    return chosen


def pipeline_view(rows: List[dict], steps_by_rank: Dict[int, List[dict]],
                  groups_by_rank: Optional[Dict[int, List[dict]]] = None) -> dict:
    """``rows``: the rank view's rows (``rank``, ``worker``); ``steps_by_rank``: rank number ->
    its partial steps (with ``p2p``); ``groups_by_rank``: rank number -> its process groups
    (the partial's ``process_groups``), to read group-local peer numbers."""
    out: dict = {"available": False, "pipelines": [], "stages": None, "microbatches": None, "schedule": None,
                 "per_stage": [], "per_step": [], "bubble_pct": None, "theoretical_bubble_pct": None,
                 "advice": [], "not_available": None}
    have = {r: [s for s in st if isinstance(s.get("p2p"), dict) and s["p2p"].get("kind")]
            for r, st in steps_by_rank.items()}
    if not any(have.values()):
        out["not_available"] = NO_P2P
        return out
    ranks = set(steps_by_rank)
    if not any(p is not None for st in have.values() for s in st for p in s["p2p"].get("peer") or []):
        out["not_available"] = NO_PEER
        return out
    mapping = _global_peers({r: st for r, st in have.items() if st}, groups_by_rank or {})
    have = {r: [dict(s, p2p=dict(s["p2p"], peer=[None if q is None else mapping[r].get(q) for q in s["p2p"]["peer"]]))
                for s in st] for r, st in have.items() if st}
    succ: Dict[int, int] = {}
    for r, st in have.items():
        votes = Counter(_successor(s["p2p"], r, ranks) for s in st)
        best, n = votes.most_common(1)[0]
        if best is not None and n * 2 > len(st):
            succ[r] = best
    roots = sorted(r for r in succ if r not in set(succ.values()))
    chains = []
    for r in roots:
        chain, seen = [r], {r}
        while chain[-1] in succ and succ[chain[-1]] not in seen:
            chain.append(succ[chain[-1]])
            seen.add(chain[-1])
        if len(chain) >= 2:
            chains.append(chain)
    if not chains:
        out["not_available"] = NO_CHAIN
        return out
    p = max(len(c) for c in chains)
    chains = [c for c in chains if len(c) == p]
    # microbatches: the first stage's sends to its successor per step (median over its steps)
    firsts = [(c[0], c[1]) for c in chains]
    m_counts, gpipe_votes = [], []
    for first, nxt in firsts:
        for s in have.get(first) or []:
            kinds, peers = s["p2p"]["kind"], s["p2p"]["peer"]
            sends = [i for i, (k, q) in enumerate(zip(kinds, peers)) if k == "send" and q == nxt]
            recvs = [i for i, (k, q) in enumerate(zip(kinds, peers)) if k == "recv" and q == nxt]
            if sends:
                m_counts.append(len(sends))
                gpipe_votes.append(not recvs or max(sends) < min(recvs))
    m = int(np.median(m_counts)) if m_counts else None
    labelled = [s.get("microbatches") for first, _ in firsts for s in have.get(first) or [] if s.get("microbatches")]
    schedule = None
    if gpipe_votes:
        schedule = "GPipe" if sum(gpipe_votes) * 2 > len(gpipe_votes) else "1F1B"
    # torch.distributed.pipelining's action labels, when present, say more: several stages on
    # one rank (interleaved), backward split into input (I) and weight (W) gradients (zero bubble)
    labelled_stages = [len(s.get("pp_stages") or []) for st in have.values() for s in st]
    actions = {a for st in have.values() for s in st for a in s.get("pp_actions") or []}
    interleaved = any(n > 1 for n in labelled_stages)
    zero_bubble = "W" in actions or "I" in actions
    if interleaved or zero_bubble:
        schedule = ("Interleaved " if interleaved else "") + ("zero bubble" if zero_bubble else "1F1B")
    worker_of = {r["rank"]: r["worker"] for r in rows}
    per_stage, per_step = [], []
    tot_b = tot_s = 0.0
    busy_per_stage = []
    step_times = []
    for k in range(p):
        b = st_us = 0.0
        n = 0
        for c in chains:
            r = c[k]
            for s in steps_by_rank.get(r) or []:
                if "bubble_us" not in s:
                    continue
                per_step.append({"step": s["step"], "stage": k, "rank": r, "worker": worker_of.get(r),
                                 "bubble_us": s["bubble_us"], "step_us": s["step_us"],
                                 "bubble_pct": 100.0 * s["bubble_us"] / s["step_us"] if s["step_us"] else None})
                b += s["bubble_us"]
                st_us += s["step_us"]
                n += 1
                step_times.append(s["step_us"])
        tot_b += b
        tot_s += st_us
        busy = (st_us - b) / n if n else None
        busy_per_stage.append(busy)
        per_stage.append({"stage": k, "ranks": [c[k] for c in chains], "steps": n,
                          "bubble_us_per_step": b / n if n else None, "step_us_per_step": st_us / n if n else None,
                          "busy_us_per_step": busy, "bubble_pct": 100.0 * b / st_us if st_us else None})
    theo = theoretical_bubble(p, m) if m else None
    out.update(available=True, pipelines=chains, stages=p, microbatches=m,
               microbatches_labelled=int(np.median(labelled)) if labelled else None, schedule=schedule,
               per_stage=per_stage, per_step=per_step, bubble_pct=100.0 * tot_b / tot_s if tot_s else None,
               theoretical_bubble_pct=100.0 * theo if theo is not None else None)
    out["advice"] = _advice(out, p, m, float(np.median(step_times)) if step_times else None, busy_per_stage)
    return out


def _advice(view: dict, p: int, m: Optional[int], step_us: Optional[float], busy: List[Optional[float]]) -> List[dict]:
    """The pipeline's fixes priced per step (METRICS.md §12), the largest saving first."""
    if view["bubble_pct"] is None or view["bubble_pct"] < T.PIPELINE_BUBBLE_PCT or not step_us:
        return []
    measured = step_us * view["bubble_pct"] / 100.0
    out = []
    if m:
        b_m = theoretical_bubble(p, m)
        more = step_us * (b_m - theoretical_bubble(p, 2 * m))
        out.append({"rule": "pipeline_microbatches", "saving_us_per_step": more,
                    "title": f"More microbatches: {m} -> {2 * m} per step",
                    "action": (f"Split each batch into {2 * m} microbatches (n_microbatches={2 * m}): the theoretical "
                               f"bubble of {p} stages falls from {100 * b_m:.1f}% to "
                               f"{100 * theoretical_bubble(p, 2 * m):.1f}% of the step")})
        inter = step_us * (b_m - (p - 1) / (2 * m + p - 1))
        out.append({"rule": "pipeline_interleaved", "saving_us_per_step": inter,
                    "title": "Interleaved schedule: 2 stages per rank",
                    "action": ("torch.distributed.pipelining.ScheduleInterleaved1F1B with two model chunks per rank "
                               "(virtual stages): each rank idles for half as long at the start and end of the step")})
    out.append({"rule": "pipeline_zero_bubble", "saving_us_per_step": measured,
                "title": "Zero-bubble schedule",
                "action": ("torch.distributed.pipelining.ScheduleInterleavedZeroBubble splits the backward into input "
                           "and weight gradients and fills the bubble with the weight-gradient work (saving at most "
                           "the measured bubble)")})
    known = [b for b in busy if b is not None]
    if len(known) >= 2 and np.mean(known) > 0:
        top = int(np.argmax([b if b is not None else -1 for b in busy]))
        excess = busy[top] - float(np.mean(known))
        if 100.0 * excess / float(np.mean(known)) >= T.PIPELINE_IMBALANCE_PCT:
            out.append({"rule": "pipeline_rebalance", "saving_us_per_step": excess,
                        "title": f"Stage {top} is the slowest: rebalance the layers",
                        "action": (f"Stage {top} computes {busy[top] / 1000:.1f} ms per step, the mean stage "
                                   f"{np.mean(known) / 1000:.1f} ms: move layers from it to its neighbours "
                                   f"(the split points of pipeline()/PipelineStage)")})
    for a in out:
        a["saving_pct"] = 100.0 * a["saving_us_per_step"] / step_us
    out.sort(key=lambda a: -a["saving_us_per_step"])
    return out


def format_pipeline_text(view: dict, indent: str = "") -> List[str]:
    if not view or not view.get("available"):
        return []
    lines = [f"{indent}  pipeline: {view['stages']} stages x {len(view['pipelines'])} replica(s)"
             + (f", {view['microbatches']} microbatches" if view.get("microbatches") else "")
             + (f", schedule {view['schedule']}" if view.get("schedule") else "")
             + (f"; bubble {view['bubble_pct']:.1f}% of the step" if view.get("bubble_pct") is not None else "")
             + (f" (theoretical {view['theoretical_bubble_pct']:.1f}%)" if view.get("theoretical_bubble_pct")
                is not None else "")]
    for s in view["per_stage"]:
        if s["bubble_pct"] is not None:
            lines.append(f"{indent}    stage {s['stage']} (ranks {', '.join(map(str, s['ranks']))}): bubble "
                         f"{s['bubble_us_per_step'] / 1000:.2f} ms per step = {s['bubble_pct']:.1f}%")
    for a in view.get("advice") or []:
        lines.append(f"{indent}    -> {a['title']} (saves ~{a['saving_us_per_step'] / 1000:.2f} ms per step, "
                     f"{a['saving_pct']:.1f}%): {a['action']}")
    return lines
