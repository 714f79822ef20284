"""Comparing two analysed selections: a baseline and a candidate (METRICS.md §11).

``compare(base_result, cand_result)`` is pure: it reads two results exactly as
``report.analyze_span`` / ``report.combine_results`` / ``Analyzer.result`` return them
(``{"report", "kernels", "operator_view", ...}``) and never looks at a trace again. The same
dict is served by the ``compare`` route, printed by ``tb-bottlenecks diff`` and read by
the ``check`` gate (gate.py). Schema: docs/report-schema.md, "The compare object".
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from .. import thresholds as T
from ..analysis import breakdown, operators
from ..analysis.gpu import NA_NO_GPU
from ..analysis.units import HIGHER, LOWER
from . import headline

COMPARE_SCHEMA_VERSION = 1
# the direction words the route sends beside `better` (the frontend colours by verdict only)
DIRECTION_WORDS = {LOWER: "lower_is_better", HIGHER: "higher_is_better", None: "neutral"}
_SEVERITY_RANK = {"low": 1, "medium": 2, "high": 3}


# ---------------------------------------------------------------------------- headline
# The headline numbers are declared once, in their metric units (analysis/units.py
# ``Metric``, ``Unit.metrics``); views/headline.py lists them in order. HEADLINE and the
# names below are that list when this module was imported (the gate's and the CLI's help);
# compare itself reads headline.metrics() at call time, so a unit added later is in it.


def _throughput(rep, batch_size):
    step = rep.get("avg_step_us")
    if not batch_size or not step:
        return None
    return batch_size * 1e6 / step


def _as_row(m) -> tuple:
    """(key, label, unit, better, getter, not_available keys of the report that explain an n/a)"""
    return (m.key, m.label, m.unit, m.direction, m.get, m.na_keys)


HEADLINE: List[tuple] = [_as_row(m) for m in headline.metrics()]
METRIC_NAMES = tuple(h[0] for h in HEADLINE)
DIRECTION = {h[0]: h[3] for h in HEADLINE}
UNITS = {h[0]: h[2] for h in HEADLINE}


def _metric(key: str):
    return next(m for m in headline.metrics() if m.key == key)


def headline_value(result: dict, key: str, batch_size: Optional[float] = None):
    """One headline number of one result (None when n/a)."""
    rep = result["report"] if "report" in result else result
    return _value(rep, _metric(key), batch_size)


def _value(rep: dict, metric, batch_size):
    if metric.key == "throughput_samples_per_s":
        return _throughput(rep, batch_size)
    value = metric.get(rep)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def headline_na_reason(result: dict, key: str, batch_size: Optional[float] = None) -> str:
    """Why a headline number of one result is n/a, in words."""
    rep = result["report"] if "report" in result else result
    return _why_na(rep, _metric(key), batch_size)


def _why_na(rep: dict, metric, batch_size) -> str:
    if metric.key == "throughput_samples_per_s":
        if not batch_size:
            return "the trace does not record the batch size: pass it (diff --batch-size, route batch_size=)"
        return "no average step time"
    na = rep.get("not_available") or {}
    for k in metric.na_keys:
        if k in na:
            return na[k]
    if metric.na_device_metric:  # per device: e.g. gpu.<dev>.<name>
        head, _, tail = metric.na_device_metric.partition("*")
        for k, why in na.items():
            if k.startswith(head) and k.endswith(tail):
                return why
    return metric.na_default


def noise_band(unit: str, scale: Optional[float]) -> Optional[float]:
    """The |change| at or below which a change is "unchanged" (METRICS.md §11), in the
    number's unit: COMPARE_NOISE_PP points for a percentage, else COMPARE_NOISE_REL_PCT % of
    |scale| (the baseline value, or for a step-time category the baseline's step time)."""
    if unit == "%":
        return T.COMPARE_NOISE_PP
    if scale is None:
        return None
    return T.COMPARE_NOISE_REL_PCT / 100.0 * abs(scale)


def _verdict(better: Optional[str], delta: Optional[float], band: Optional[float] = 0.0) -> str:
    """better / worse / unchanged (|delta| within the noise band) / changed (a number with
    no better direction, outside the band) / n/a (a side is n/a)."""
    if delta is None:
        return "n/a"
    if abs(delta) <= (band or 0.0):
        return "unchanged"
    if better is None:
        return "changed"
    return "better" if (delta < 0) == (better == LOWER) else "worse"


def _one_peak_words(base_rep: dict, cand_rep: dict) -> str:
    """The peak the MFU row compares both runs on (issue 34 item 11), for its label:
    " (H100 SXM, 989 TFLOP/s)", or each side's where they differ; "" where neither has one."""
    def peak(rep):
        f = rep.get("flops") if isinstance(rep.get("flops"), dict) else {}
        tf = f.get("bf16_peak_tflops")
        return f"{(f.get('peak') or {}).get('gpu') or 'GPU'}, {tf:.0f} TFLOP/s" if isinstance(tf, (int, float)) else None
    b, c = peak(base_rep), peak(cand_rep)
    if b is None and c is None:
        return ""
    return f" ({b})" if b == c else f" ({b or 'n/a'} vs {c or 'n/a'})"


# rows whose label names the peak they are on (the headline's one-peak MFU)
_PEAK_LABELLED = ("mfu_pct",)


def _metric_rows(base_rep, cand_rep, batch_sizes) -> Tuple[List[dict], Dict[str, str]]:
    rows, not_available = [], {}
    for m in headline.metrics():
        key, label, unit, better = m.key, m.label, m.unit, m.direction
        if key in _PEAK_LABELLED:
            label += _one_peak_words(base_rep, cand_rep)
        b = _value(base_rep, m, batch_sizes[0])
        c = _value(cand_rep, m, batch_sizes[1])
        delta = c - b if b is not None and c is not None else None
        band = noise_band(unit, b) if delta is not None else None
        row = {"key": key, "label": label, "unit": unit, "better": better, "direction": DIRECTION_WORDS[better],
               "base": b, "cand": c,
               "delta": delta, "rel_pct": 100.0 * delta / abs(b) if delta is not None and b else None,
               "noise_band": band, "verdict": _verdict(better, delta, band)}
        if b is None:
            not_available[f"metrics.{key}.base"] = _why_na(base_rep, m, batch_sizes[0])
        if c is None:
            not_available[f"metrics.{key}.cand"] = _why_na(cand_rep, m, batch_sizes[1])
        rows.append(row)
    return rows, not_available


# ---------------------------------------------------------------------------- ranks, collectives
# Run-level rows (METRICS.md §11, "Ranks and collectives"): from a side's rank view
# (views/ranks.rank_view of its workers, which the caller puts under ``result["ranks"]``: the
# compare route, diff and check do so for a run of several workers) and its report's
# collectives section. Declared once, in views/ranks.py: RUN_METRICS (straggler gap, load
# imbalance), RANK_METRICS (one row per rank number), KIND_METRICS (one row per collective kind).
# A run of more ranks than this gets, per RANK_METRICS, one row for its largest value instead.
MAX_RANK_ROWS = 8
SINGLE_SIDE = "not a run of several ranks (one worker, or a worker or span was picked)"


def _rank_view(result: dict) -> Optional[dict]:
    view = result.get("ranks") if isinstance(result, dict) else None
    return view if isinstance(view, dict) and view.get("available") and (view.get("rank_count") or 0) >= 2 else None


def _view_na(view: dict, metric) -> str:
    na = view.get("not_available") or {}
    return next((na[k] for k in metric.na_keys if k in na), metric.na_default)


def _collective_kinds(result: dict) -> Tuple[Dict[str, dict], Dict[str, dict]]:
    """({kind: run-level row (shortest rank's time)}, {kind: the report's row (own time)})."""
    view = _rank_view(result)
    cb = (view or {}).get("collective_bandwidth") or {}
    run = {k["kind"]: k for k in cb.get("kinds") or [] if cb.get("available") and k.get("matched_calls")}
    sec = (result.get("report") or {}).get("collectives")
    own = {k["kind"]: k for k in (sec or {}).get("kinds") or [] if isinstance(k, dict)} if isinstance(sec, dict) else {}
    return run, own


def side_values(result: dict, pair: Optional[dict] = None) -> Dict[str, dict]:
    """Every run-level row of one side: {key: {label, unit, better, value, why (n/a), group,
    source}}. ``pair``: the other side's result (compare): a collective kind is read at the
    shortest rank's time only where both sides have it so, else at each rank's own time on
    both; rows of ranks or kinds that only the other side has are n/a here."""
    from .ranks import KIND_METRICS, RANK_METRICS, RUN_METRICS

    out: Dict[str, dict] = {}
    view, other = _rank_view(result), (_rank_view(pair) if pair is not None else None)
    if view is not None or other is not None:
        for m in RUN_METRICS:
            v = m.get(view) if view is not None else None
            out[m.key] = {"label": m.label, "unit": m.unit, "better": m.direction, "group": "ranks",
                          "value": _number(v), "why": None if view is None else _view_na(view, m)}
        mine = {r["rank"]: r for r in (view or {}).get("ranks") or []}
        theirs = {r["rank"]: r for r in (other or {}).get("ranks") or []}
        numbers = sorted(set(mine) | set(theirs))
        for m in RANK_METRICS:
            if len(numbers) <= MAX_RANK_ROWS:
                for n in numbers:
                    v = m.get(mine[n]) if n in mine else None
                    out[f"{m.key}.rank{n}"] = {"label": f"{m.label}, rank {n}", "unit": m.unit, "better": m.direction,
                                               "group": "ranks", "value": _number(v),
                                               "why": m.na_default if n in mine else (f"no rank {n} in this run"
                                                                                      if view is not None else None)}
            else:
                values = [_number(m.get(r)) for r in mine.values()]
                known = [v for v in values if v is not None]
                out[f"{m.key}.max"] = {"label": f"{m.label}, largest over ranks", "unit": m.unit,
                                       "better": m.direction, "group": "ranks", "value": max(known) if known else None,
                                       "why": m.na_default if view is not None else None}
    run, own = _collective_kinds(result)
    run_o, own_o = _collective_kinds(pair) if pair is not None else (run, own)
    rep = result.get("report") or {}
    for kind in sorted(set(own) | set(own_o) | set(run) | set(run_o)):
        # the shortest rank's time where every side that ran the kind has it (else own time on both)
        shortest = kind in run and (kind in run_o or kind not in own_o)
        row = run.get(kind) if shortest else own.get(kind)
        for m in KIND_METRICS:
            if row is not None:
                why = (rep.get("not_available") or {}).get("collectives.bytes") or m.na_default
            elif not isinstance(rep.get("collectives"), dict):
                why = (rep.get("not_available") or {}).get("collectives") or "no collective in the included steps"
            else:
                why = f"no {kind} call in the included steps"
            out[f"{m.key}.{kind}"] = {
                "label": f"{m.label} {kind}", "unit": m.unit, "better": m.direction, "group": "collectives",
                "value": _number(m.get(row)) if row is not None else None, "why": why,
                "source": "shortest_rank" if shortest else "own_time_includes_wait"}
    return out


def _number(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _run_rows(base: dict, cand: dict) -> Tuple[List[dict], Dict[str, str]]:
    """compare's rows of the rank spread and the collectives' bus bandwidth (the same row
    shape as the headline rows, with ``group`` "ranks" / "collectives")."""
    b_rows, c_rows = side_values(base, cand), side_values(cand, base)
    rows, na = [], {}
    for key in list(b_rows) + [k for k in c_rows if k not in b_rows]:
        b_row, c_row = b_rows.get(key), c_rows.get(key)
        info = b_row or c_row
        b, c = (b_row or {}).get("value"), (c_row or {}).get("value")
        delta = c - b if b is not None and c is not None else None
        band = noise_band(info["unit"], b) if delta is not None else None
        row = {"key": key, "label": info["label"], "unit": info["unit"], "better": info["better"],
               "direction": DIRECTION_WORDS[info["better"]], "group": info["group"], "base": b, "cand": c,
               "delta": delta, "rel_pct": 100.0 * delta / abs(b) if delta is not None and b else None,
               "noise_band": band, "verdict": _verdict(info["better"], delta, band)}
        if "source" in info:
            row["source"] = info["source"]
        for side, r, v in (("base", b_row, b), ("cand", c_row, c)):
            if v is None:
                na[f"metrics.{key}.{side}"] = (r or {}).get("why") or SINGLE_SIDE
        rows.append(row)
    return rows, na


def run_metric_names() -> Tuple[str, ...]:
    """The patterns of the run-level row keys (the gate's help and its name check)."""
    from .ranks import KIND_METRICS, RANK_METRICS, RUN_METRICS

    return (tuple(m.key for m in RUN_METRICS) + tuple(f"{m.key}.rank<N>" for m in RANK_METRICS)
            + tuple(f"{m.key}.max" for m in RANK_METRICS) + tuple(f"{m.key}.<kind>" for m in KIND_METRICS))


def run_metric(name: str):
    """The declaration of a run-level row key (None: not one)."""
    from .ranks import KIND_METRICS, RANK_METRICS, RUN_METRICS

    for m in RUN_METRICS:
        if name == m.key:
            return m
    for m in RANK_METRICS:
        if re.fullmatch(re.escape(m.key) + r"\.(rank\d+|max)", name):
            return m
    for m in KIND_METRICS:
        if re.fullmatch(re.escape(m.key) + r"\.[A-Za-z0-9_]+", name):
            return m
    return None


def run_value(result: dict, name: str) -> Tuple[Optional[float], str]:
    """(value, why n/a) of a run-level row of one result (the gate)."""
    row = side_values(result).get(name)
    if row is not None:
        return row["value"], row["why"] or SINGLE_SIDE
    from .ranks import KIND_METRICS

    if run_metric(name) in KIND_METRICS:
        rep = result.get("report") or {}
        if not isinstance(rep.get("collectives"), dict):
            return None, (rep.get("not_available") or {}).get("collectives") or "no collective in the included steps"
        return None, f"no {name.split('.', 1)[1]} call in the included steps"
    if _rank_view(result) is None:
        return None, SINGLE_SIDE
    return None, f"no rank {name.rsplit('.rank', 1)[-1]} in this run" if ".rank" in name else "not available"


# ---------------------------------------------------------------------------- step time


def _step_time(base_rep, cand_rep) -> Tuple[Optional[dict], Optional[str]]:
    b_avg, c_avg = base_rep.get("avg_step_us"), cand_rep.get("avg_step_us")
    b_bd, c_bd = base_rep.get("breakdown_us") or {}, cand_rep.get("breakdown_us") or {}
    for side, avg, bd in (("baseline", b_avg, b_bd), ("candidate", c_avg, c_bd)):
        if avg is None or any(bd.get(cat) is None for cat in breakdown.CATEGORIES):
            return None, f"the {side} has no step-time breakdown (no included step)"
    delta = c_avg - b_avg
    band = noise_band("us", b_avg)  # every category is held to a share of the whole step
    cats = []
    for cat in breakdown.CATEGORIES:
        d = c_bd[cat] - b_bd[cat]
        cats.append({"category": cat, "base_us": b_bd[cat], "cand_us": c_bd[cat], "delta_us": d,
                     "base_pct": 100.0 * b_bd[cat] / b_avg if b_avg else None,
                     "cand_pct": 100.0 * c_bd[cat] / c_avg if c_avg else None,
                     "share_of_change_pct": 100.0 * d / delta if delta else None,
                     "verdict": _verdict(LOWER, d, band)})
    largest = max(cats, key=lambda r: abs(r["delta_us"]))
    return {"base_avg_step_us": b_avg, "cand_avg_step_us": c_avg, "delta_us": delta,
            "rel_pct": 100.0 * delta / b_avg if b_avg else None, "direction": DIRECTION_WORDS[LOWER],
            "noise_band_us": band, "verdict": _verdict(LOWER, delta, band),
            "categories": cats,
            # breakdown_us adds up to avg_step_us in each report; this is what the float
            # sums leave over (0 up to rounding), shown rather than hidden in a category.
            "residual_us": delta - sum(r["delta_us"] for r in cats),
            "largest_change": largest["category"] if largest["delta_us"] else None}, None


# ---------------------------------------------------------------------------- names

_WS_RE = re.compile(r"\s+")
_DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)#[^.]*\.__next__$")


def _collapse_templates(name: str) -> str:
    """Every outermost balanced <...> becomes <…>; an unbalanced name is kept as is."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth > 0:
            depth -= 1
        elif ch == ">":
            return name
        elif depth == 0:
            out.append(ch)
    return name if depth else "".join(out)


def _drop_parameter_list(name: str) -> str:
    """A trailing balanced (...) right after the function name goes (its parameter list)."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                head = name[:i]
                if head and (head[-1].isalnum() or head[-1] in "_>…"):
                    return head
                return name
    return name


def normalise_kernel_name(name: str) -> str:
    """The name a kernel is matched by across runs and builds (METRICS.md §11): leading
    ``void `` dropped, template arguments collapsed to ``<…>``, a trailing parameter list
    ``(...)`` dropped, white space collapsed. Numeric suffixes are kept."""
    s = _WS_RE.sub(" ", name).strip()
    if s.startswith("void "):
        s = s[5:]
    s = _collapse_templates(s)
    s = _drop_parameter_list(s).strip()
    return s or name


def normalise_op_name(name: str) -> str:
    """CPU operator names are matched as written, except the DataLoader span, whose
    iterator class (what num_workers changes) is replaced by ``<iterator>``."""
    if _DATALOADER_RE.match(name):
        return "enumerate(DataLoader)#<iterator>.__next__"
    return name


# ---------------------------------------------------------------------------- tables


# Rows a kernel or operator diff carries, largest |change per step| first (the counts of
# new/vanished/changed/unknown cover every row; rows_left_out says how many were cut).
MAX_DIFF_ROWS = 500
_NO_STEPS = "a side has no included step (times per step are undefined)"


def _step_count(result: dict) -> int:
    return ((result.get("report") or {}).get("steps") or {}).get("count") or 0


def _group(rows, normalise, fields) -> Dict[str, dict]:
    """Rows summed per normalised name; a value unknown (None) in a row is unknown in its sum."""
    out: Dict[str, dict] = {}
    for r in rows or []:
        key = normalise(r["name"])
        g = out.setdefault(key, {"raw_names": [], **{f: 0.0 for f in fields}})
        if r["name"] not in g["raw_names"]:
            g["raw_names"].append(r["name"])
        for f in fields:
            v = r.get(f)
            g[f] = None if v is None or g[f] is None else g[f] + v
    return out


def _per_step(value, steps):
    return None if value is None else value / steps


def _per_step_label(field: str) -> str:
    return field.replace("_us", "_us_per_step") if field.endswith("_us") else field + "_per_step"


def _diff_table(base_rows, cand_rows, base_steps, cand_steps, normalise, fields, sort_field,
                base_truncated, cand_truncated) -> dict:
    """Rows per normalised name; each row's ``verdicts`` judge each per-step change: times
    are costs (lower is better), counts have no direction (fewer calls can mean fusion or a
    smaller model); a change within the noise band of the row's baseline is "unchanged"."""
    b = _group(base_rows, normalise, fields)
    c = _group(cand_rows, normalise, fields)
    directions = {_per_step_label(f): DIRECTION_WORDS[LOWER if f.endswith("_us") else None] for f in fields}
    rows = []
    for name in set(b) | set(c):
        row = {"name": name}
        in_b, in_c = name in b, name in c
        verdicts = {}
        for f in fields:
            bv = _per_step(b[name][f], base_steps) if in_b else (None if base_truncated else 0.0)
            cv = _per_step(c[name][f], cand_steps) if in_c else (None if cand_truncated else 0.0)
            label = _per_step_label(f)
            row["base_" + label], row["cand_" + label] = bv, cv
            delta = cv - bv if bv is not None and cv is not None else None
            row["delta_" + label] = delta
            verdicts[label] = _verdict(LOWER if f.endswith("_us") else None, delta, noise_band("", bv))
        row["verdicts"] = verdicts
        if in_b and in_c:
            same = all(_per_step(b[name][f], base_steps) == _per_step(c[name][f], cand_steps) for f in fields)
            row["status"] = "same" if same else "changed"
        elif in_c:
            row["status"] = "unknown" if base_truncated else "new"
        else:
            row["status"] = "unknown" if cand_truncated else "vanished"
        row["raw_names"] = sorted(set((b.get(name) or {}).get("raw_names", []))
                                  | set((c.get(name) or {}).get("raw_names", [])))[:20]
        rows.append(row)
    key = "delta_" + sort_field.replace("_us", "_us_per_step")
    rows.sort(key=lambda r: (-abs(r[key]) if r[key] is not None else 0.0, r["name"]))
    statuses = [r["status"] for r in rows]
    totals = {}
    for side, groups, steps in (("base", b, base_steps), ("cand", c, cand_steps)):
        values = [g[sort_field] for g in groups.values()]
        totals[f"{side}_{sort_field.replace('_us', '_us_per_step')}"] = \
            None if any(v is None for v in values) else sum(values) / steps
    return {"rows": rows[:MAX_DIFF_ROWS], "rows_left_out": max(0, len(rows) - MAX_DIFF_ROWS), "directions": directions,
            "new": statuses.count("new"), "vanished": statuses.count("vanished"),
            "changed": statuses.count("changed"), "unknown": statuses.count("unknown"), **totals}


def _kernel_diff(base, cand) -> Tuple[Optional[dict], Optional[str]]:
    """Kernel rows: the §6 kernel table's calls and times per kernel name (the result's
    ``kernel_names``, occupancy.kernel_name_totals), by normalised name."""
    bs, cs = _step_count(base), _step_count(cand)
    if not bs or not cs:
        return None, _NO_STEPS
    bk, ck = base.get("kernel_names"), cand.get("kernel_names")
    if not isinstance(bk, dict) or not isinstance(ck, dict):
        return None, "a side's result carries no kernel times by name (analysed by an older version: re-analyse)"
    out = _diff_table(bk.get("rows"), ck.get("rows"), bs, cs, normalise_kernel_name, ("total_us", "calls"),
                      "total_us", bool(bk.get("left_out")), bool(ck.get("left_out")))
    out["source"] = "kernel_table"
    return out, None


def _op_diff(base, cand) -> Tuple[Optional[dict], Optional[str]]:
    """Operator rows: the Operator view (§13, result["operator_view"]) summed over the
    included steps per op name (operators.name_totals), by normalised name."""
    bo = operators.name_totals(base.get("operator_view"))
    co = operators.name_totals(cand.get("operator_view"))
    if bo is None or co is None:
        return None, "a side's result carries no operator view (analysed by an older version: re-analyse)"
    bs, cs = _step_count(base), _step_count(cand)
    if not bs or not cs:
        return None, _NO_STEPS
    out = _diff_table(bo, co, bs, cs, normalise_op_name, ("self_us", "total_us", "calls", "top_calls"),
                      "self_us", False, False)
    for r in out["rows"]:
        r["top_level"] = bool((r.get("base_top_calls_per_step") or 0) or (r.get("cand_top_calls_per_step") or 0))
    return out, None


# ---------------------------------------------------------------------------- torch.compile

FAMILY_LABELS = {"triton": "Triton (Inductor)", "gemm": "library GEMM", "attention": "attention",
                 "other": "other kernels"}
# ATen ops a pointwise/reduction Triton kernel can name (an input it reads or a view of the
# output it feeds) but not replace: the GEMM/attention still runs in a library kernel. They
# count as replaced only by a template kernel (triton_tem_*), which is the GEMM itself.
LIBRARY_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution",
                         "convolution_backward", "_scaled_dot_product_flash_attention",
                         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"})
FUSED_ROWS_MAX = 25


def _families(result: dict, steps: int) -> Optional[Dict[str, list]]:
    """{family: [kernels, µs]} over the result's kernel_names (the §11 kernel diff's rows),
    each name classified by compilation.kernel_family; None when names were left out."""
    from ..analysis.compilation import kernel_family

    kn = result.get("kernel_names")
    if not isinstance(kn, dict) or kn.get("left_out") or not steps:
        return None
    out = {f: [0.0, 0.0] for f in FAMILY_LABELS}
    for r in kn.get("rows") or []:
        if r.get("total_us") is None:
            return None
        f = out[kernel_family(r["name"])]
        f[0] += r.get("calls") or 0
        f[1] += r["total_us"]
    return out


def _op_gpu(view: Optional[dict]) -> Optional[Dict[str, list]]:
    """{op name: [calls, device total µs]} summed over the Operator view's rows (§13 gpu_us:
    every GPU activity launched inside the op or its children); None without a view."""
    if not isinstance(view, dict):
        return None
    rows, names = view.get("rows") or {}, view.get("names") or []
    name_col = rows.get("name") or []
    calls = rows.get("calls") or [0] * len(name_col)
    gpu = rows.get("gpu_us") or [None] * len(name_col)
    out: Dict[str, list] = {}
    for n, c, g in zip(name_col, calls, gpu):
        o = out.setdefault(names[n], [0, 0.0])
        o[0] += c or 0
        o[1] = None if g is None or o[1] is None else o[1] + g  # null: no GPU activity known
    return out


def _fused(compiled: dict, eager: dict) -> Tuple[Optional[dict], Optional[str]]:
    """Which eager ops the compiled side's Triton kernels replaced: each kernel's fused ATen
    ops (compilation.fused_ops of its name) matched to the eager side's ``aten::<op>`` rows
    of the Operator view, with their device time per step against the fused kernel's."""
    from ..analysis.compilation import fused_ops, kernel_kind

    sec = compiled["report"].get("compilation") or {}
    kernels = sec.get("all_kernels") or {}
    n = sec.get("steps") or 0
    ops = _op_gpu(eager.get("operator_view"))
    e_steps = _step_count(eager)
    if not kernels or not n:
        return None, "the compiled side ran no Triton (Inductor) kernel in its steps"
    if ops is None:
        return None, "the eager side's result carries no operator view (analysed by an older version: re-analyse)"
    if not e_steps:
        return None, _NO_STEPS
    users: Dict[str, List[str]] = {}
    rows = []
    for name, (count, us, _graph) in kernels.items():
        kind = kernel_kind(name)
        entries = []
        for op in fused_ops(name):
            if op == "unknown":
                continue
            eager_name = "aten::" + op
            calls, gpu = ops.get(eager_name, (0, 0.0))
            counted = op not in LIBRARY_OPS or kind == "template"
            if counted:
                users.setdefault(op, []).append(name)
            entries.append({"op": op, "eager_name": eager_name, "found": eager_name in ops, "counted": counted,
                            "eager_calls_per_step": calls / e_steps,
                            "eager_us_per_step": None if gpu is None else gpu / e_steps})
        counted = [e["eager_us_per_step"] for e in entries if e["counted"]]
        eager_us = None if any(v is None for v in counted) else sum(counted)
        rows.append({"name": name, "kind": kind, "ops": entries, "launches_per_step": count / n,
                     "us_per_step": us / n, "eager_us_per_step": eager_us,
                     "saved_us_per_step": None if eager_us is None else eager_us - us / n})
    rows.sort(key=lambda r: (-r["us_per_step"], r["name"]))
    per_op = []
    for op, names in users.items():
        calls, gpu = ops.get("aten::" + op, (0, 0.0))
        per_op.append({"op": op, "eager_name": "aten::" + op, "found": ("aten::" + op) in ops,
                       "eager_calls_per_step": calls / e_steps,
                       "eager_us_per_step": None if gpu is None else gpu / e_steps,
                       "triton_kernels": len(names),
                       "triton_us_per_step": sum(kernels[k][1] for k in names) / n})
    per_op.sort(key=lambda r: (-(r["eager_us_per_step"] or 0.0), r["op"]))
    op_times = [r["eager_us_per_step"] for r in per_op]
    return {"compiled_side": None, "triton_kernels": len(rows),
            "triton_us_per_step": sum(r[1] for r in kernels.values()) / n,
            "eager_us_per_step": None if any(v is None for v in op_times) else sum(op_times),
            "rows": rows[:FUSED_ROWS_MAX], "rows_left_out": max(0, len(rows) - FUSED_ROWS_MAX),
            "ops": per_op[:FUSED_ROWS_MAX], "ops_left_out": max(0, len(per_op) - FUSED_ROWS_MAX)}, None


def _compilation_part(base: dict, cand: dict) -> Tuple[Optional[dict], Dict[str, str]]:
    """The torch.compile part of a comparison (METRICS.md §11, "torch.compile"): kernel
    launches per step, kernel time per family (Triton / library GEMM / attention / other)
    and the eager ops the Triton kernels replaced. None when neither side compiled."""
    b_sec, c_sec = base["report"].get("compilation"), cand["report"].get("compilation")
    if not isinstance(b_sec, dict) and not isinstance(c_sec, dict):
        return None, {"compilation": "neither side has torch.compile regions, Inductor kernels or CUDA graph launches"}
    na: Dict[str, str] = {}
    bs, cs = _step_count(base), _step_count(cand)
    launch = {}
    for side, res, steps in (("base", base, bs), ("cand", cand, cs)):
        lsec = res["report"].get("launch") or {}
        launch[f"{side}_kernels_per_step"] = lsec.get("kernels_per_step")
        lu = lsec.get("launch_us")
        launch[f"{side}_launch_us_per_step"] = lu / steps if lu is not None and steps else None
    b_k, c_k = launch["base_kernels_per_step"], launch["cand_kernels_per_step"]
    launch["delta_kernels_per_step"] = c_k - b_k if b_k is not None and c_k is not None else None
    launch["rel_pct"] = 100.0 * launch["delta_kernels_per_step"] / b_k \
        if launch["delta_kernels_per_step"] is not None and b_k else None
    fb, fc = _families(base, bs), _families(cand, cs)
    families = None
    if fb is None or fc is None:
        na["compilation.families"] = "a side has no included step or left kernel names out"
    else:
        b_tot, c_tot = sum(v[1] for v in fb.values()), sum(v[1] for v in fc.values())
        band = noise_band("us", b_tot / bs)  # held to a share of the baseline's kernel time
        families = []
        for fam, label in FAMILY_LABELS.items():
            b_us, c_us = fb[fam][1] / bs, fc[fam][1] / cs
            families.append({"family": fam, "label": label,
                             "base_us_per_step": b_us, "cand_us_per_step": c_us, "delta_us_per_step": c_us - b_us,
                             "base_kernels_per_step": fb[fam][0] / bs, "cand_kernels_per_step": fc[fam][0] / cs,
                             "base_pct": 100.0 * fb[fam][1] / b_tot if b_tot else None,
                             "cand_pct": 100.0 * fc[fam][1] / c_tot if c_tot else None,
                             "verdict": _verdict(LOWER, c_us - b_us, band)})
    b_tr = bool(isinstance(b_sec, dict) and b_sec.get("triton_kernels"))
    c_tr = bool(isinstance(c_sec, dict) and c_sec.get("triton_kernels"))
    fused, why = None, None
    if c_tr and not b_tr:
        fused, why = _fused(cand, base)
        side = "cand"
    elif b_tr and not c_tr:
        fused, why = _fused(base, cand)
        side = "base"
    else:
        why = ("both sides ran Triton kernels: no eager side to map them to" if b_tr and c_tr
               else "neither side ran a Triton (Inductor) kernel")
    if fused is not None:
        fused["compiled_side"] = side
    if why:
        na["compilation.fused"] = why
    return {"base_compiled": isinstance(b_sec, dict), "cand_compiled": isinstance(c_sec, dict),
            "launch": launch, "families": families, "fused": fused}, na


# ---------------------------------------------------------------------------- recommendations


def _recommendation_diff(base_rep, cand_rep) -> List[dict]:
    b = {r["rule"]: r for r in base_rep.get("recommendations") or []}
    c = {r["rule"]: r for r in cand_rep.get("recommendations") or []}
    out = []
    for rule in list(b) + [r for r in c if r not in b]:
        rb, rc = b.get(rule), c.get(rule)
        if rb and rc:
            sb, sc = _SEVERITY_RANK.get(rb["severity"], 0), _SEVERITY_RANK.get(rc["severity"], 0)
            status = "unchanged" if sb == sc else ("better" if sc < sb else "worse")
        else:
            status = "resolved" if rb else "new"
        any_rec = rc or rb
        out.append({"rule": rule, "status": status, "title": any_rec.get("title"), "action": any_rec.get("action"),
                    "base_severity": rb and rb.get("severity"), "cand_severity": rc and rc.get("severity"),
                    "base_numbers": rb and rb.get("numbers"), "cand_numbers": rc and rc.get("numbers")})
    order = {"resolved": 0, "new": 1, "worse": 2, "better": 3, "unchanged": 4}
    out.sort(key=lambda r: order[r["status"]])
    return out


# ---------------------------------------------------------------------------- compare


def _side(result: dict, label: Optional[str]) -> dict:
    rep = result.get("report") or {}
    return {"label": label, "run": rep.get("run"), "worker": rep.get("worker"), "span": rep.get("span"),
            "spans": len(rep.get("spans") or []), "steps": (rep.get("steps") or {}).get("count"),
            "device_names": rep.get("device_names") or {}, "setup": setup(rep)}


# ---------------------------------------------------------------------------- setup


# What a before/after of one change keeps: the GPU model, training vs inference, the number
# of ranks. (torch.compile, CUDA graphs, batch size, num_workers are changes one tests.)
SETUP_LABELS = {"gpu": "GPU", "mode": "mode", "world_size": "world size"}


def setup(rep: dict) -> dict:
    """The run's setup as compare judges it, from the report's own sections (None: the report
    cannot tell): ``gpu`` the distinct device names joined with " + " ("none (CPU only)"
    for a CPU-only trace), ``mode`` training/inference (context),
    ``world_size`` (context.world_size; 1 when the context says not distributed)."""
    names = sorted({str(n) for n in (rep.get("device_names") or {}).values() if n})
    if names:
        gpu = " + ".join(names)
    elif not rep.get("gpu") and (rep.get("not_available") or {}).get("gpu") == NA_NO_GPU:
        gpu = "none (CPU only)"
    else:
        gpu = None  # GPU events without deviceProperties (2020 traces): the model is unknown
    ctx = rep.get("context") if isinstance(rep.get("context"), dict) else {}
    mode = ctx.get("mode") if ctx.get("mode") in ("training", "inference") else None
    ws = ctx.get("world_size")
    if isinstance(ws, bool) or not isinstance(ws, int):
        ws = 1 if ctx.get("distributed") is False else None
    return {"gpu": gpu, "mode": mode, "world_size": ws}


def setup_differences(base_rep: dict, cand_rep: dict) -> List[dict]:
    """Where the two runs' setups differ (both sides known and not equal), in SETUP_LABELS order."""
    b, c = setup(base_rep), setup(cand_rep)
    return [{"key": k, "label": label, "base": b[k], "cand": c[k]} for k, label in SETUP_LABELS.items()
            if b[k] is not None and c[k] is not None and b[k] != c[k]]


def setup_warning(differences: List[dict]) -> Optional[str]:
    """One sentence for the banner and the CLI: the runs differ in ..., so the deltas are not
    the effect of one change. None when the setups agree (or cannot be told apart)."""
    if not differences:
        return None
    what = ", ".join(f"{d['label']} ({d['base']} vs {d['cand']})" for d in differences)
    return (f"These runs differ in {what}: not a before/after of one change; every delta below mixes "
            "the effects of all the differences.")


def compare(base_result: dict, cand_result: dict, *, base_batch_size: Optional[float] = None,
            cand_batch_size: Optional[float] = None, base_label: Optional[str] = None,
            cand_label: Optional[str] = None) -> dict:
    """The comparison of a baseline and a candidate result (METRICS.md §11). Pure."""
    base_rep, cand_rep = base_result["report"], cand_result["report"]
    metrics, not_available = _metric_rows(base_rep, cand_rep, (base_batch_size, cand_batch_size))
    rows, why = _run_rows(base_result, cand_result)
    metrics += rows
    not_available.update(why)
    step_time, why = _step_time(base_rep, cand_rep)
    if why:
        not_available["step_time"] = why
    kernels, why = _kernel_diff(base_result, cand_result)
    if why:
        not_available["kernels"] = why
    ops, why = _op_diff(base_result, cand_result)
    if why:
        not_available["ops"] = why
    compilation, why = _compilation_part(base_result, cand_result)
    not_available.update(why)
    differences = setup_differences(base_rep, cand_rep)
    return {"schema_version": COMPARE_SCHEMA_VERSION, "kind": "compare",
            "base": _side(base_result, base_label), "cand": _side(cand_result, cand_label),
            "setup_differences": differences, "setup_warning": setup_warning(differences),
            "metrics": metrics, "step_time": step_time, "kernels": kernels, "ops": ops, "compilation": compilation,
            "recommendations": _recommendation_diff(base_rep, cand_rep), "not_available": not_available}


# ---------------------------------------------------------------------------- text


def _fmt(value, unit) -> str:
    if value is None:
        return "n/a"
    if unit == "us":
        return f"{value / 1000:.2f} ms"
    if unit == "bytes":
        from .text_report import size  # the report's own byte format ("2.60 GiB", "8 B")

        return size(value)
    if unit == "%":
        return f"{value:.2f}%"
    if unit == "samples/s":
        return f"{value:.1f}/s"
    if unit == "TFLOP/s":
        return f"{value:.3g} TFLOP/s"
    if unit == "GB/s":
        return f"{value:.3g} GB/s"
    return f"{value:.1f}"


def _fmt_delta(value, unit) -> str:
    if value is None:
        return ""
    sign = "+" if value > 0 else ("-" if value < 0 else "±")
    body = _fmt(abs(value), unit)
    return sign + (body.replace("%", " pp") if unit == "%" else body)


def _side_line(side: dict) -> str:
    steps = side.get("steps")
    what = "steps n/a" if steps is None else f"{steps} step{'' if steps == 1 else 's'}"
    return f"{side.get('label') or side.get('run')} ({what})"


def _compilation_text(part: Optional[dict], section, top: int) -> None:
    """diff's torch.compile lines: launches, kernel time by family, the replaced eager ops."""
    if not part:
        return
    la = part["launch"]
    body = []
    if la["base_kernels_per_step"] is not None and la["cand_kernels_per_step"] is not None:
        rel = f", {la['rel_pct']:+.1f}%" if la["rel_pct"] is not None else ""
        body.append(f"  kernels per step {la['base_kernels_per_step']:.0f} -> {la['cand_kernels_per_step']:.0f}"
                    f" ({la['delta_kernels_per_step']:+.0f}{rel})")
    for r in part.get("families") or []:
        if not r["base_us_per_step"] and not r["cand_us_per_step"]:
            continue
        body.append(f"  {r['label']:<18} {_fmt(r['base_us_per_step'], 'us'):>10} -> {_fmt(r['cand_us_per_step'], 'us'):>10}"
                    f"  {_fmt_delta(r['delta_us_per_step'], 'us'):>10}  kernels/step "
                    f"{r['base_kernels_per_step']:.0f} -> {r['cand_kernels_per_step']:.0f}")
    section("torch.compile: kernel launches and kernel time per step by family:", body)
    fu = part.get("fused")
    if not fu:
        return
    eager_side = "baseline" if fu["compiled_side"] == "cand" else "candidate"
    eager_total = _fmt(fu["eager_us_per_step"], "us")
    section(f"Triton kernels ({fu['triton_kernels']}, {_fmt(fu['triton_us_per_step'], 'us')} per step) fuse ATen ops "
            f"that hold {eager_total} of kernel time per step in the {eager_side}; those ops:",
            [f"  {'aten::' + r['op']:<36} {_fmt(r['eager_us_per_step'], 'us'):>10} ({r['eager_calls_per_step']:.0f}/step)"
             f"  in {r['triton_kernels']} Triton kernel{'' if r['triton_kernels'] == 1 else 's'}"
             f" ({_fmt(r['triton_us_per_step'], 'us')})" for r in fu["ops"][:top] if r["eager_us_per_step"]])
    section(f"largest Triton kernels per step, against the {eager_side} kernel time of their ops "
            "(an op fused into several kernels counts in each):",
            [f"  {_fmt(r['us_per_step'], 'us'):>10} <- {_fmt(r['eager_us_per_step'], 'us'):>10}  {r['name'][:100]}"
             for r in fu["rows"][:top]])


def format_text(cmp: dict, top: int = 10) -> str:
    """The comparison for a terminal: the setup warning, headline deltas, the step-time
    waterfall, the largest kernel and operator changes, recommendations resolved and new.
    A heading is printed only with lines under it."""
    from .text_report import _CATEGORY_WORDS  # the words `report` prints for the categories

    b, c = cmp["base"], cmp["cand"]
    lines = [f"baseline:  {_side_line(b)}", f"candidate: {_side_line(c)}"]
    if cmp.get("setup_warning"):
        lines += ["", f"WARNING: {cmp['setup_warning']}"]

    def section(heading: str, body: List[str]) -> None:
        if body:
            lines.extend(["", heading] + body)

    body = []
    width = max([28] + [len(m["label"]) for m in cmp["metrics"] if m["base"] is not None or m["cand"] is not None])
    for m in cmp["metrics"]:
        if m["base"] is None and m["cand"] is None:
            continue
        rel = f" ({m['rel_pct']:+.1f}%)" if m.get("rel_pct") is not None and m["unit"] != "%" else ""
        verdict = m["verdict"] if m["verdict"] != "n/a" else "n/a on one side"
        delta = _fmt_delta(m["delta"], m["unit"])
        body.append(f"  {m['label']:<{width}} {_fmt(m['base'], m['unit']):>12} -> {_fmt(m['cand'], m['unit']):>12}"
                    f"  {delta + rel + '  ' if delta else ''}{verdict}")
    section("headline", body)
    st = cmp.get("step_time")
    if st:
        body = []
        for r in sorted(st["categories"], key=lambda r: -abs(r["delta_us"])):
            if not r["delta_us"]:
                continue
            share = f"  {r['share_of_change_pct']:.0f}% of the change" if r["share_of_change_pct"] is not None else ""
            name = _CATEGORY_WORDS.get(r["category"], r["category"])
            body.append(f"  {name:<14} {_fmt(r['base_us'], 'us'):>12} -> {_fmt(r['cand_us'], 'us'):>12}"
                        f"  {_fmt_delta(r['delta_us'], 'us')}{share}")
        head = (f"step time {_fmt(st['base_avg_step_us'], 'us')} -> {_fmt(st['cand_avg_step_us'], 'us')} "
                f"({_fmt_delta(st['delta_us'], 'us')})")
        if body:
            section(head + ", by category:", body)
        else:
            lines.extend(["", head + ": no category changed"])
    for title, key, field in (("kernels", "kernels", "total_us"), ("CPU operators (self time)", "ops", "self_us")):
        table = cmp.get(key)
        if not table or not table["rows"]:
            continue
        label = field.replace("_us", "_us_per_step")
        body = [f"  {r['status']:<9} {_fmt_delta(r['delta_' + label], 'us'):>12}  "
                f"{_fmt(r['base_' + label], 'us')} -> {_fmt(r['cand_' + label], 'us')}  {r['name'][:100]}"
                for r in table["rows"][:top] if r["status"] != "same"]
        section(f"{title}: {table['new']} new, {table['vanished']} vanished, {table['changed']} changed; "
                "largest changes per step:", body)
    _compilation_text(cmp.get("compilation"), section, top)
    section("recommendations", [f"  {r['status']:<9} [{r['base_severity'] or '-'} -> {r['cand_severity'] or '-'}] "
                                f"{r['title']}" for r in cmp.get("recommendations") or []])
    by_reason: Dict[str, List[str]] = {}
    na = cmp.get("not_available") or {}
    for key, why in na.items():
        if key.startswith("metrics.") and key.endswith(".cand") and na.get(key[:-5] + ".base") == why:
            continue  # said once, for both sides
        if key.startswith("metrics."):
            metric, side = key[len("metrics."):].rsplit(".", 1)
            both = side == "base" and na.get(f"metrics.{metric}.cand") == why
            name = metric if both else f"{metric} ({'baseline' if side == 'base' else 'candidate'})"
        else:
            name = key
        by_reason.setdefault(why, []).append(name)
    section("not available", [f"  {', '.join(names)}: {why}" for why, names in by_reason.items() if names])
    return "\n".join(lines)
