"""Findings (METRICS.md §20): a small, stable, versioned digest of one report for an agent or a
script: the verdict sentence, each recommendation with its predicted gain (ms per step and %
of the step, the step model's pricing), severity, evidence items whose ids point back into
the report (``step:N``, ``kernel:NAME``, ``op:NAME``, ``line:FILE:N``), and the assumptions.

Made only from the report object (docs/report-schema.md): no trace is read and nothing is
decided here that the report did not decide. Bounded: the JSON text is at most
``FINDINGS_MAX_BYTES``; what does not fit is dropped from the end (evidence first, then the
lowest-ranked recommendations) and ``truncated`` says so. Shape: docs/route-schema.json
``$defs.findings``; route ``findings?run=&worker=&span=``; ``tb-bottlenecks report --findings``.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional

FINDINGS_VERSION = 1
FINDINGS_MAX_BYTES = 8192  # fits an agent's context beside the question (issue 38)
MAX_RECOMMENDATIONS = 8
MAX_EVIDENCE = 5
MAX_TOP = 5
MAX_TEXT = 240  # characters of one sentence (titles, actions, evidence)
MAX_NAME = 400  # characters of a kernel, op or frame name in an id (a longer one ends in "…": a prefix)

_STEP = re.compile(r"\bstep (\d+)\b")
_OP = re.compile(r"\b([A-Za-z_]\w*::[A-Za-z_][\w.]*)")
_FRAME = re.compile(r"([\w./\\-]+\.py)\((\d+)\)")


def _num(value, digits: int = 3) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), digits)


def _cut(text, limit: int = MAX_TEXT) -> Optional[str]:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kernel_names(report: dict) -> List[str]:
    occ = report.get("occupancy") if isinstance(report.get("occupancy"), dict) else {}
    return [k["name"] for k in occ.get("kernels") or [] if isinstance(k, dict) and isinstance(k.get("name"), str)]


def evidence_refs(text: str, kernels: List[str]) -> List[str]:
    """The report entries an evidence sentence names: ``step:N`` (``breakdown_per_step``),
    ``op:NAME`` (the operators route), ``line:FILE:N`` (``source_attribution.lines``),
    ``kernel:NAME`` (``occupancy.kernels`` / the kernels route)."""
    refs = [f"step:{n}" for n in _STEP.findall(text)]
    refs += [f"line:{f}:{n}" for f, n in _FRAME.findall(text)]
    refs += [f"op:{_cut(op, MAX_NAME)}" for op in _OP.findall(text)]
    refs += [f"kernel:{_cut(k, MAX_NAME)}" for k in kernels if k and k in text]
    return list(dict.fromkeys(refs))


def _recommendation(rank: int, rec: dict, kernels: List[str]) -> dict:
    from ..judge.step_verdict import fix_code

    step_ms, after = _num(rec.get("step_ms")), _num(rec.get("predicted_step_ms"))
    gain_ms = _num(step_ms - after) if step_ms is not None and after is not None else None
    evidence = [{"text": _cut(e), "refs": evidence_refs(str(e), kernels)}
                for e in (rec.get("evidence") or [])[:MAX_EVIDENCE] if e is not None]
    return {
        "rank": rank, "rule": rec.get("rule"), "severity": rec.get("severity"), "title": _cut(rec.get("title")),
        "code": _cut(fix_code(rec.get("action"))), "action": _cut(rec.get("action")),
        "gain": {"pct": _num(rec.get("estimated_gain_pct"), 2), "ms_per_step": gain_ms, "step_ms": step_ms,
                 "predicted_step_ms": after, "source": rec.get("gain_source"), "what_if": rec.get("what_if")},
        "evidence": evidence, "assumption": _cut(rec.get("gain_assumption")),
    }


def _top(report: dict) -> Dict[str, List[dict]]:
    """The largest kernels, source lines and slowest steps, with their ids."""
    out: Dict[str, List[dict]] = {}
    occ = report.get("occupancy") if isinstance(report.get("occupancy"), dict) else {}
    out["kernels"] = [{"id": f"kernel:{_cut(k.get('name'), MAX_NAME)}", "total_ms": _num((k.get("total_us") or 0) / 1000),
                       "time_pct": _num(k.get("time_pct"), 2), "calls": k.get("calls")}
                      for k in (occ.get("kernels") or [])[:MAX_TOP] if isinstance(k, dict)]
    src = report.get("source_attribution") if isinstance(report.get("source_attribution"), dict) else {}
    out["lines"] = [{"id": f"line:{_cut(r.get('file'), MAX_NAME)}:{r.get('line')}", "function": _cut(r.get("function"), MAX_NAME),
                     "cpu_ms": _num((r.get("cpu_us") or 0) / 1000), "gpu_ms": _num((r.get("gpu_us") or 0) / 1000)}
                    for r in (src.get("lines") or [])[:MAX_TOP] if isinstance(r, dict)]
    steps = [r for r in report.get("breakdown_per_step") or [] if isinstance(r, dict)
             and isinstance(r.get("total_us"), (int, float))]
    steps.sort(key=lambda r: -r["total_us"])
    out["steps"] = [{"id": f"step:{r.get('step')}", "total_ms": _num(r["total_us"] / 1000)} for r in steps[:3]]
    return out


def _verdict(report: dict) -> Optional[dict]:
    v = report.get("verdict")
    if not isinstance(v, dict):
        return None
    fix = v.get("fix") if isinstance(v.get("fix"), dict) else {}
    return {"sentence": _cut(v.get("sentence"), 2 * MAX_TEXT), "healthy": v.get("healthy"),
            "share_pct": _num(v.get("share_pct"), 2), "step_ms": _num(v.get("step_ms")),
            "predicted_step_ms": _num(fix.get("predicted_step_ms")), "fix_rule": fix.get("rule"),
            "all_fixes_step_ms": _num(v.get("all_fixes_step_ms"))}


def _assumptions(report: dict, recs: List[dict]) -> List[str]:
    out = []
    sm = report.get("step_model") if isinstance(report.get("step_model"), dict) else None
    if sm is not None:
        err = _num(sm.get("model_error_pct"), 2)
        out.append(f"step model: the recorded steps replayed as a dependency graph ({sm.get('steps')} steps, "
                   f"model error {err} % of the recorded time, {'reliable' if sm.get('reliable') else 'NOT reliable'})")
    elif "step_model" in (report.get("not_available") or {}):
        out.append(_cut(f"no step model: {report['not_available']['step_model']}; gains are the rules' own estimates"))
    out.append("gains are per step and do not add up: fixes overlap (the step model's all_fixes prices them together)")
    out.append("the numbers describe the profiled steps only")
    return out


def findings(report: dict, errors: Optional[List[str]] = None) -> dict:
    """The findings of one report object (a span's or a worker/run summary), at most
    ``FINDINGS_MAX_BYTES`` as JSON."""
    kernels = _kernel_names(report)
    recs = [r for r in report.get("recommendations") or [] if isinstance(r, dict)]
    steps = report.get("steps") if isinstance(report.get("steps"), dict) else {}
    na = report.get("not_available") if isinstance(report.get("not_available"), dict) else {}
    out: Dict[str, Any] = {
        "findings_version": FINDINGS_VERSION,
        "schema_version": report.get("schema_version"),
        "selection": {"run": report.get("run"), "worker": report.get("worker"), "span": report.get("span"),
                      "spans": len(report["spans"]) if isinstance(report.get("spans"), list) else None},
        "steps": {"count": steps.get("count"), "avg_step_ms": _num((report.get("avg_step_us") or 0) / 1000)
                  if isinstance(report.get("avg_step_us"), (int, float)) else None},
        "verdict": _verdict(report),
        "recommendations": [_recommendation(i + 1, r, kernels) for i, r in enumerate(recs[:MAX_RECOMMENDATIONS])],
        "top": _top(report),
        "assumptions": _assumptions(report, recs),
        "not_available": {k: _cut(na[k], 160) for k in sorted(na) if "." not in k}
        if na else {},
        "errors": [_cut(f"{e.get('section')}: {e.get('error')}" if isinstance(e, dict) else e)
                   for e in (report.get("errors") or [])][:5] + [_cut(e) for e in (errors or [])][:5],
        "truncated": len(recs) > MAX_RECOMMENDATIONS,
    }
    return _bounded(out)


def size(doc: dict) -> int:
    """Bytes of the findings as JSON text (what an agent receives)."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _bounded(out: dict) -> dict:
    """Drop from the end until the JSON fits FINDINGS_MAX_BYTES: the top lists, evidence of the
    lower recommendations, then those recommendations (never the first)."""
    def fits():
        return size(out) <= FINDINGS_MAX_BYTES

    for key in ("lines", "kernels", "steps"):
        while not fits() and len(out["top"][key]) > 1:
            out["top"][key].pop()
            out["truncated"] = True
    if not fits():
        out["not_available"] = {}
        out["truncated"] = True
    for rec in reversed(out["recommendations"][1:]):
        while not fits() and len(rec["evidence"]) > 1:
            rec["evidence"].pop()
            out["truncated"] = True
    while not fits() and len(out["recommendations"]) > 1:
        out["recommendations"].pop()
        out["truncated"] = True
    while not fits() and out["recommendations"] and len(out["recommendations"][0]["evidence"]) > 1:
        out["recommendations"][0]["evidence"].pop()
        out["truncated"] = True
    if not fits() and out["recommendations"]:  # one recommendation with huge names: drop its action's words
        out["recommendations"][0]["action"] = None
        out["truncated"] = True
    return out


def headline_report(entry: dict) -> Optional[dict]:
    """A run entry's headline report (of ``report --json``): the run summary, else its one
    worker's summary."""
    if isinstance(entry.get("summary"), dict):
        return entry["summary"]
    reps = [w["summary"] for w in entry.get("workers") or [] if isinstance(w.get("summary"), dict)]
    return reps[0] if len(reps) == 1 else None


def document_findings(doc: dict) -> dict:
    """``report --findings``: the findings of what ``report --json`` prints: a single file's
    report's, else ``{findings_version, runs: [{run, findings}], errors}`` (one per run, of its
    headline report; a run without one has ``findings`` null)."""
    if "runs" not in doc:
        return findings(doc)
    return {"findings_version": FINDINGS_VERSION,
            "runs": [{"run": e.get("run"), "findings": findings(rep) if rep is not None else None}
                     for e in doc["runs"] for rep in [headline_report(e)]],
            "errors": [_cut(e) for e in doc.get("errors") or []]}
