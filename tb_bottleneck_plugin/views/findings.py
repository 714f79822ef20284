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
                   for e in (report.get("errors") or [])][:5] + [_file_error(e) for e in (errors or [])][:5],
        "truncated": len(recs) > MAX_RECOMMENDATIONS,
    }
    return _bounded(out)


def _file_error(e) -> Optional[str]:
    """A file that could not be analysed, as one line: the tab's {file, error} rows or the CLI's lines."""
    if isinstance(e, dict):
        return _cut(f"{e.get('file')}: {e.get('error')}")
    return _cut(e)


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


# ----------------------------------------------------------------------------- agent queries
# Small answers over one result for the MCP tools (mcp_server.py); each row carries the id the
# findings' evidence uses.

TOP_KINDS = ("kernels", "ops", "lines")


def _ms(us) -> Optional[float]:
    return _num(us / 1000) if isinstance(us, (int, float)) and not isinstance(us, bool) else None


def top_table(result: dict, kind: str, n: int = 10) -> dict:
    """The ``n`` largest kernels (the kernels route), ops (the operators route, all included
    steps) or source lines (``source_attribution.lines``) of a result, with their ids.
    Raises ValueError for another kind."""
    n = max(1, min(int(n), 50))
    rep = result.get("report") or {}
    if kind == "kernels":
        rows = [{"id": f"kernel:{_cut(k.get('name'), MAX_NAME)}", "calls": k.get("calls"),
                 "total_ms": _ms(k.get("total_us")), "mean_us": _num(k.get("mean_us")), "time_pct": _num(k.get("time_pct"), 2),
                 "occupancy_pct": _num(k.get("est_achieved_occupancy_pct"), 1), "tensor_core": k.get("tensor_core")}
                for k in (result.get("kernels") or [])[:n] if isinstance(k, dict)]
        why = None if rows else (rep.get("not_available") or {}).get("occupancy") or "no kernels in the trace"
    elif kind == "ops":
        from ..analysis import operators

        view = result.get("operator_view")
        table = operators.view_table(view, None, "op") if isinstance(view, dict) else {"rows": []}
        rows = [{"id": f"op:{_cut(r.get('name'), MAX_NAME)}", "calls": r.get("calls"), "total_ms": _ms(r.get("total_us")),
                 "self_ms": _ms(r.get("self_us")), "gpu_ms": _ms(r.get("gpu_us")), "tflops": _num(r.get("tflops")),
                 "bound": r.get("bound")} for r in (table.get("rows") or [])[:n]]
        why = None if rows else "no operator view for this selection"
    elif kind == "lines":
        src = rep.get("source_attribution") if isinstance(rep.get("source_attribution"), dict) else {}
        rows = [{"id": f"line:{_cut(r.get('file'), MAX_NAME)}:{r.get('line')}", "function": r.get("function"),
                 "calls": r.get("calls"), "cpu_ms": _ms(r.get("cpu_us")), "gpu_ms": _ms(r.get("gpu_us")),
                 "kernels": r.get("kernels"), "sync_ms": _ms(r.get("sync_us")), "dataloader_ms": _ms(r.get("dataloader_us"))}
                for r in (src.get("lines") or [])[:n] if isinstance(r, dict)]
        why = None if rows else (src.get("hint") or (rep.get("not_available") or {}).get("source_attribution")
                                 or "no Python stacks in the trace (record with with_stack=True)")
    else:
        raise ValueError(f"kind must be one of {', '.join(TOP_KINDS)}, got {kind!r}")
    return {"kind": kind, "rows": rows, "not_available": why}


def what_if(report: dict, fix: Optional[str] = None) -> dict:
    """The step model's what-if for one fix (METRICS.md §19: ``step_model.what_if`` by ``id``,
    or by the recommendation ``rule`` it prices); without ``fix``, every what-if in short.
    Raises ValueError naming the known ids for an unknown fix, or why there is no step model."""
    sm = report.get("step_model")
    if not isinstance(sm, dict):
        why = (report.get("not_available") or {}).get("step_model") or "no step model for this selection"
        raise ValueError(f"no step model: {why}")
    rows = [r for r in sm.get("what_if") or [] if isinstance(r, dict)]

    def short(r):
        return {"id": r.get("id"), "label": r.get("label"), "rules": r.get("rules"),
                "saving_pct": _num(r.get("saving_pct"), 2), "saving_ms_per_step": _num(
                    (r.get("step_ms") or 0) - (r.get("predicted_step_ms") or 0)) if isinstance(r.get("predicted_step_ms"), (int, float)) else None,
                "step_ms": _num(r.get("step_ms")), "predicted_step_ms": _num(r.get("predicted_step_ms")),
                "assumption": _cut(r.get("assumption"), 2 * MAX_TEXT)}

    common = {"model_error_pct": _num(sm.get("model_error_pct"), 3), "reliable": sm.get("reliable"),
              "all_fixes": {k: _num(v) if k != "ids" else v for k, v in (sm.get("all_fixes") or {}).items()
                            if k in ("ids", "saving_pct", "step_ms", "predicted_step_ms")}}
    if not fix:
        return {"what_if": [short(r) for r in rows], **common}
    found = [r for r in rows if r.get("id") == fix] or [r for r in rows if fix in (r.get("rules") or [])]
    if not found:
        raise ValueError(f"no what-if {fix!r}; known: {', '.join(str(r.get('id')) for r in rows) or 'none'}")
    return {"what_if": short(found[0]), **common}


def compare_digest(cmp: dict, n: int = 5) -> dict:
    """A comparison (views/compare.compare) cut for an agent: its headline metrics, step time,
    recommendations and the first ``n`` rows of every other list."""
    def cap(value, depth=0):
        if isinstance(value, list):
            return [cap(v, depth + 1) for v in value[:n]] if depth else [cap(v, depth + 1) for v in value]
        if isinstance(value, dict):
            return {k: cap(v, depth + 1) for k, v in value.items()}
        if isinstance(value, str):
            return _cut(value, 2 * MAX_TEXT)
        return value

    keep = ("base", "cand", "setup_differences", "setup_warning", "metrics", "step_time", "recommendations",
            "not_available")
    out = {k: cap(cmp.get(k)) for k in keep if k in cmp}
    for k in ("kernels", "ops"):
        v = cmp.get(k)
        out[k] = cap(v, 1) if isinstance(v, (list, dict)) else v
    return out
