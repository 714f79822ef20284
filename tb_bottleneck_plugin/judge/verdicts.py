"""Card verdicts (docs/report-schema.md `verdicts`): the colour and the
words of every headline card are decided here, on the server, from thresholds.py.

``card(...)`` builds one card's verdict; judge/cards.py holds each card's function (by the
ids in ``Unit.cards``, analysis/*.py) and ``cards.card_verdicts(report)`` makes every card's,
for a span report or a combined summary whose ``recommendations`` are already made.

A card's severity is the severity of the recommendation rule named in ``rule`` when that
rule fired *for this card's number* (the rule's ``numbers`` hold the card's key: e.g.
``small_kernels`` colours "GPU utilization" only when it fired because of utilization),
else "ok", or "none" (uncoloured) where the rule does not judge the number (the card
says "not judged" and why: e.g. ``small_kernels``/``host_bound`` on a first-call warm-up
outlier, GPU utilization of an input-bound run, slack under the reserve floor); the
input-bound card uses the metric's own XProf scale (high/medium/ok, from
analysis/input_bound.verdict_for). A null value gives severity "na" and, as the verdict,
the `not_available` reason. ``thresholds`` names the thresholds.py constants used, with
their values, so a reader (and tests/judge/test_units_verdicts.py) can check every colour.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from .. import thresholds as T

SEVERITIES = ("high", "medium", "low", "info", "ok", "none", "na")
# "none": a value the rules do not judge here (e.g. GPU utilization of an input-bound run,
# allocator slack under SLACK_MIN_RESERVED_BYTES): shown uncoloured, its words say why.

# Rules that do not judge their cards when the profiled steps hold a first-call warm-up
# outlier (recommendations.warmup_outlier): their cards are "none", not "ok".
WARMUP_SILENCES = ("small_kernels", "host_bound")


def _num(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np

            if isinstance(value, np.generic) and not isinstance(value, np.bool_):
                value = value.item()
            else:
                return None
        except ImportError:
            return None
    value = float(value)
    return value if math.isfinite(value) else None


def _na_reason(report: dict, *keys: str) -> Optional[str]:
    """The first `not_available` reason for one of `keys` (exact key, then a key that
    ends with `.key` or starts with `key.`), as the dashboard looked it up. A card names
    the section-level key first (``occupancy.est_achieved_occupancy_pct``) where a
    per-device key (``gpu.2.est_achieved_occupancy_pct``) says less."""
    found = _na_entry(report, *keys)
    return found[1] if found else None


def _na_entry(report: dict, *keys: str) -> Optional[Tuple[str, str]]:
    """(not_available key, reason) that _na_reason finds, or None."""
    na = report.get("not_available") or {}
    for k in keys:
        if isinstance(na.get(k), str):
            return k, na[k]
    for k in keys:
        for nk, reason in na.items():
            if str(nk).endswith(f".{k}") or str(nk).startswith(f"{k}."):
                return str(nk), str(reason)
    return None


# Sections that exist only where the trace has GPU activity: on a CPU-only report (no GPU
# device, not_available["gpu"]) a card that is n/a for a reason of these sections is n/a
# because the trace is CPU-only; its verdict gets na_cause "cpu_only" and the dashboard
# folds such cards into one line (static/cards.js). A card n/a for another reason (e.g. the
# CPU allocator's slack, or no memory events) keeps its own card.
GPU_SECTIONS = ("gpu", "occupancy", "tensor_cores")


def cpu_only(report: dict) -> bool:
    """No GPU device at all (a summary that mixes CPU and GPU spans has GPU devices)."""
    return "gpu" in (report.get("not_available") or {}) and not report.get("gpu")


def _fired(report: dict, rule: str, number_key: Optional[str] = None) -> Optional[dict]:
    for rec in report.get("recommendations") or []:
        if isinstance(rec, dict) and rec.get("rule") == rule:
            if number_key is None or number_key in (rec.get("numbers") or {}):
                return rec
    return None


def _thresholds(*names: str) -> Dict[str, float]:
    return {n: getattr(T, n) for n in names}


def _pct(v: float, digits: int = 0) -> str:
    return f"{v:.{digits}f} %"


def memory_device(report: dict) -> Optional[str]:
    """The memory device a card shows: cuda:N first by N, then the rest by name."""
    mem = report.get("memory") if isinstance(report.get("memory"), dict) else {}

    def key(k):
        kind, _, num = str(k).partition(":")
        if kind == "cuda" and num.isdigit():
            return (0, int(num), "")
        return (1, 0, str(k))

    keys = sorted((k for k, v in mem.items() if isinstance(v, dict)), key=key)
    return keys[0] if keys else None


def mean_gpu_utilization(report: dict) -> Optional[float]:
    values = [_num(g.get("utilization_pct")) for g in (report.get("gpu") or {}).values() if isinstance(g, dict)]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def card(report: dict, value, unit: str, rule: Optional[str], number_key: Optional[str],
         threshold_names, na_keys) -> dict:
    """One card's verdict: ``value`` (None: severity "na", the first `not_available` reason
    of ``na_keys`` as the words), ``unit`` ("pct", "bytes", "us", "count"), the
    recommendation ``rule`` whose firing (with ``number_key`` among its numbers, when
    given) sets the severity and the words, and the thresholds.py constants it uses."""
    return _card(report, value, unit, rule, number_key, threshold_names, na_keys)


def _card(report, value, unit, rule, number_key, threshold_names, na_keys) -> dict:
    if value is None:
        found = _na_entry(report, *na_keys)
        out = {"value": None, "unit": unit, "severity": "na", "verdict": found[1] if found else "not available",
               "thresholds": _thresholds(*threshold_names), "rule": rule}
        if found and str(found[0]).split(".")[0] in GPU_SECTIONS and cpu_only(report):
            out["na_cause"] = "cpu_only"
        return out
    rec = _fired(report, rule, number_key)
    if rec is None and rule in WARMUP_SILENCES:
        from .recommendations import warmup_outlier

        if warmup_outlier(report):
            return {"value": value, "unit": unit, "severity": "none",
                    "verdict": "not judged: a first-call warm-up outlier holds the profiled steps",
                    "thresholds": _thresholds(*threshold_names, "WARMUP_CALL_RUNTIME_PCT", "WARMUP_CALL_STEP_PCT"),
                    "rule": rule}
    return {"value": value, "unit": unit, "severity": rec["severity"] if rec else "ok",
            "verdict": rec["title"] if rec else "ok", "thresholds": _thresholds(*threshold_names), "rule": rule}


num, pct_words, fired = _num, _pct, _fired  # for the card functions (judge/cards.py)
