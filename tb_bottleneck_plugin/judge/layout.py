"""What the first screen shows (issue 35, METRICS.md §21 "Layout"): the cards grouped by topic,
each group collapsed to one line when nothing in it is judged, the cards that do not apply to the
run listed apart, and the dashboard's sections (the section bar) with the ones that matter open.

Decided here, from the card verdicts (judge/verdicts.py) and the verdict (judge/step_verdict.py),
so the dashboard (static/cards.js, static/sections.js) only lays out what the server says.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ..analysis import registry

# the card groups, in page order: (id, label)
GROUPS = (("input", "Input"), ("gpu", "GPU efficiency"), ("memory", "Memory"), ("host", "Host & sync"),
          ("compile", "Compile"), ("communication", "Communication"))
# the built-in cards' groups (a Card's own ``group`` wins; a card in none: "other")
CARD_GROUPS = {"input_bound": "input", "gpu_utilization": "gpu", "tensor_cores": "gpu", "mfu": "gpu",
               "occupancy": "gpu", "short_kernels": "gpu", "peak_memory": "memory", "allocator_slack": "memory",
               "d2d_copies": "memory", "sync": "host", "compilation": "compile", "communication": "communication"}
# severities that make a group "judged" (opened): a warning or worse
JUDGED = ("high", "medium", "low")
# the dashboard's sections, in bar order: (id, label)
SECTIONS = (("overview", "Overview"), ("kernels", "Kernels & roofline"), ("memory", "Memory"),
            ("source", "Source & modules"), ("compile", "Compile"), ("timeline", "Timeline"),
            ("operators", "Operators"), ("ranks", "Collectives/Ranks"))
# the section that holds a card group's evidence (a judged group opens it)
GROUP_SECTION = {"gpu": "kernels", "memory": "memory", "compile": "compile", "communication": "ranks"}
# sections short enough to open by default beside the overview
SHORT_SECTIONS = ()
# the section a first fix's rule points at (its evidence), opened with the overview
RULE_SECTION = {"tensor_cores_unused": "kernels", "low_mfu": "kernels", "small_kernels": "kernels",
                "allocator_slack": "memory", "memory_growth": "memory", "memory_peak": "memory",
                "torch_compile": "compile", "synchronization": "timeline", "host_bound": "timeline",
                "communication": "ranks", "ddp_buckets": "ranks", "fsdp_prefetch": "ranks", "straggler": "ranks",
                "pipeline_interleaved": "ranks", "pipeline_microbatches": "ranks", "pipeline_rebalance": "ranks",
                "pipeline_zero_bubble": "ranks"}


def card_group(card) -> str:
    """A Card's group id (module constants)."""
    return card.group or CARD_GROUPS.get(card.id, "other")


def _card_meta() -> Dict[str, tuple]:
    """card id -> (label, group, order) from the metric units' Card declarations."""
    out = {}
    for unit in registry.UNITS:
        for m in unit.metrics:
            c = m.card
            if c is not None:
                out[c.id] = (c.label, card_group(c), c.order)
    return out


def fmt_value(value, unit: Optional[str]) -> str:
    """A card's value for the collapsed line: 3 significant digits, units scaled."""
    if not isinstance(value, (int, float)):
        return "n/a"
    if unit == "pct":
        if abs(value) >= 9.5 or value == 0:
            return f"{value:.0f} %"
        return f"{value:.2g} %" if abs(value) >= 0.1 else "< 0.1 %"
    if unit == "bytes":
        for scale, word in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {word}"
        return f"{value:.0f} B"
    if unit == "us":
        return f"{value / 1000:.3g} ms" if abs(value) >= 1000 else f"{value:.3g} µs"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def not_applicable_reason(report: dict, card_id: str, verdict: dict) -> Optional[str]:
    """Why a card does not apply to this run (None: it applies). A card the server cannot compute
    for this trace (no GPU kernels, no torch.compile, no collectives) is not a card of the run."""
    if verdict.get("severity") == "na":
        return str(verdict.get("verdict") or "not available")
    if card_id == "communication":
        comm = report.get("communication") if isinstance(report.get("communication"), dict) else {}
        coll = report.get("collectives") if isinstance(report.get("collectives"), dict) else {}
        if not (comm.get("comm_us") or 0) and not (coll.get("calls") or 0):
            return "one process: no collectives in the trace"
    return None


def card_layout(report: dict) -> dict:
    """``{groups: [{id, label, cards, judged, warn, lead, line}], not_applicable: [{id, label, why}]}``:
    ``cards`` the ids of the group (card order), ``warn`` those that warn, ``judged`` one does
    (the group shows them, its other cards one click away), else ``line`` is the group's one
    line: its ``lead`` card's label, value and words."""
    verdicts = report.get("verdicts") if isinstance(report.get("verdicts"), dict) else {}
    meta = _card_meta()
    groups: Dict[str, List[str]] = {g: [] for g, _ in GROUPS}
    not_applicable = []
    ids = sorted(meta, key=lambda i: meta[i][2])
    ids += [i for i in verdicts if i not in meta]  # a verdict no card declares: group "other"
    for cid in ids:
        v = verdicts.get(cid)
        if not isinstance(v, dict):
            continue
        label, group = (meta[cid][0], meta[cid][1]) if cid in meta else (cid, "other")
        why = not_applicable_reason(report, cid, v)
        if why is not None:
            not_applicable.append({"id": cid, "label": label, "why": why})
            continue
        groups.setdefault(group, []).append(cid)
    labels = dict(GROUPS)
    groups = {g: groups[g] for g in [*dict(GROUPS), *groups] if g in groups}  # page order, "other" last
    out = []
    for gid, cids in groups.items():
        if not cids:
            continue
        judged = [c for c in cids if verdicts[c].get("severity") in JUDGED]
        lead = judged[0] if judged else cids[0]
        v = verdicts[lead]
        words = str(v.get("verdict") or "")
        line = f"{meta[lead][0] if lead in meta else lead} {fmt_value(v.get('value'), v.get('unit'))}" + (f" — {words}" if words else "")
        out.append({"id": gid, "label": labels.get(gid, "Other"), "cards": cids, "judged": bool(judged),
                    "warn": judged, "lead": lead, "line": line})
    return {"groups": out, "not_applicable": not_applicable}


def sections(report: dict, layout: Optional[dict] = None) -> List[dict]:
    """The section bar: ``[{id, label, relevant, open, why}]`` for the sections that apply to this
    report; ``relevant``: the overview, the section of the first fix's evidence, the section of a
    judged card group (``why`` says which); ``open``: shown by default (the overview, and a
    relevant section in SHORT_SECTIONS)."""
    layout = layout if layout is not None else card_layout(report)
    verdicts = report.get("verdicts") if isinstance(report.get("verdicts"), dict) else {}
    gpu = bool(report.get("gpu")) and not ("gpu" in (report.get("not_available") or {}) and not report.get("gpu"))
    coll = report.get("collectives") if isinstance(report.get("collectives"), dict) else {}
    comp = verdicts.get("compilation") if isinstance(verdicts.get("compilation"), dict) else {}
    applies = {
        "overview": True,
        "kernels": gpu,
        "memory": True,
        "source": isinstance(report.get("source_attribution"), dict),
        "compile": comp.get("severity") not in (None, "na") or _compiled_work(report),
        "timeline": True,
        "operators": True,
        "ranks": bool(coll.get("calls")) or len({s.get("worker") for s in report.get("spans") or []
                                                 if isinstance(s, dict)}) > 1,
    }
    opened: Dict[str, str] = {"overview": "the verdict and the evidence"}
    verdict = report.get("verdict") if isinstance(report.get("verdict"), dict) else {}
    fix = verdict.get("fix") if isinstance(verdict.get("fix"), dict) else None
    sec = RULE_SECTION.get(str(fix.get("rule"))) if fix else None
    if sec and applies.get(sec):
        opened[sec] = f"the evidence of the first fix ({fix.get('rule')})"
    for g in layout["groups"]:
        s = GROUP_SECTION.get(g["id"])
        if g["judged"] and s and applies.get(s) and s not in opened and len(opened) < 2:
            opened[s] = f"{g['label']}: {g['line']}"
    # open by default: the overview, and a relevant section whose panels fit the first screens
    # (SHORT_SECTIONS); a relevant long one (kernels: roofline and kernel table, ~1,900 px) is
    # marked relevant, one click away, so the default page stays within 2.5 viewports
    return [{"id": sid, "label": label, "relevant": sid in opened and sid != "overview",
             "open": sid == "overview" or (sid in opened and sid in SHORT_SECTIONS), "why": opened.get(sid)}
            for sid, label in SECTIONS if applies[sid]]


def _compiled_work(report: dict) -> bool:
    """The trace holds compiled work to list (Torch-Compiled regions, Inductor kernels, CUDA graph
    replays) even where the Compilation card has no number."""
    c = report.get("compilation") if isinstance(report.get("compilation"), dict) else {}
    return bool(c.get("has_regions") or c.get("kernels") or c.get("triton_kernels") or c.get("graph_launches"))


def report_layout(report: dict) -> dict:
    """``report["layout"]``: ``{groups, not_applicable, sections}`` (card_layout, sections)."""
    cards = card_layout(report)
    return {**cards, "sections": sections(report, cards)}
