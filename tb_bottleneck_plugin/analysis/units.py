"""The metric-unit contract (issue 11): one unit per metric family, one place for its maths.

A ``Unit`` is four plain functions around one report section (``report[name]``):

- ``compute(span) -> section`` (or, for a unit with ``fields``, a dict of those report keys): the span's section from the loaded trace; ``span`` is the
  ``SpanContext`` (trace, steps found once, step partition once, shown occupancy once,
  the report so far, ``not_available``). May write ``span.not_available["<name>.<metric>"]``.
- ``partial(report) -> dict``: the section's *additive sufficient statistics*
  (µs sums, byte·µs integrals, counts, per device / per step rows), in the field
  conventions below, so that any grouping of spans (a worker, a run, tomorrow a rank
  table or one side of a comparison) is ``merge(partials)``.
- ``finish(merged) -> section``: the section of a group from the merged partial
  (ratios of sums, never means of percentages).
- ``requires``: sections that must have succeeded first (else this one is n/a, saying why).

Partial field conventions (``merge`` knows them by the prefix of the key):

- ``sum:x``  number, added; an unknown (None) in any span makes the sum unknown
- ``max:x``  number, maximum; unknown when unknown in any span
- ``any:x``  bool, or-ed; ``all:x`` bool, and-ed
- ``rows:x`` list, concatenated in span order
- ``first:x`` the first span's value
- ``wmean:x`` [Σ value·weight, Σ weight] over spans where both are known (weight != 0)
- ``keyed:x`` {key: partial}, merged per key (keys in first-seen order)

``not_available``: one convention everywhere, ``report["not_available"][key] = reason``
with key ``<section>`` or ``<section>.<metric>`` or ``<section>.<device>.<metric>``.

Adding a metric: a module in analysis/ with ``UNIT = Unit(...)``, its line in
``registry.UNITS``, its METRICS.md entry; its headline numbers as ``Metric`` data in
``Unit.metrics`` (compare, diff, check, the report text and the dashboard's card list are
derived from them, views/headline.py); a headline card: a ``Card`` on its metric and its
function in judge/cards.py (``@register(card id)``, made with ``verdicts.card``).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple


def num(value) -> Optional[float]:
    """A finite number, else None (bools, strings, NaN, inf are unknown)."""
    kind = type(value)
    if kind is float or kind is int:  # the common case, first (summaries call this per value)
        value = float(value)
        return value if value - value == 0 else None
    if isinstance(value, bool):
        return None
    try:
        import numpy as np

        if isinstance(value, np.generic):
            if isinstance(value, np.bool_):
                return None
            value = value.item()
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def total(values) -> Optional[float]:
    """Sum of finite numbers; None when one of them is unknown."""
    out = 0.0
    for v in values:
        v = num(v)
        if v is None:
            return None
        out += v
    return out


def pct(part, whole) -> Optional[float]:
    return 100.0 * part / whole if part is not None and whole else None


def weighted_pair(value, weight) -> List[float]:
    """A ``wmean:`` field of one span: [value·weight, weight], or [0, 0] when either is unknown/0."""
    v, w = num(value), num(weight)
    if v is None or not w or not math.isfinite(v * w):
        return [0.0, 0.0]
    return [v * w, w]


def wmean(pair) -> Optional[float]:
    return pair[0] / pair[1] if pair and pair[1] else None


def per_step_across_spans(rows: List[dict], fields, rank_by: str, rank_value=None) -> List[dict]:
    """A group's per-step view, bounded by the number of steps, not by spans × steps.

    ``rows``: the merged ``rows:`` of per-span per-step rows (each ``{"step", <fields>,
    "span", "worker"}``; the partials tag them). Returns one row per step number, in step
    order: ``{"step", "spans": n, <field>: mean over the n spans that have that step (None
    when unknown in one of them), "min_<rank_by>", "max_<rank_by>", "max_worker",
    "max_span"}``; the min/max over the spans whose ``rank_value(row)`` (default: the row's
    ``rank_by``) is known, and the worker/span of the maximum (the first such span on a
    tie), so the rank to open is named. Rows without an integer step are left out."""
    value_of = rank_value or (lambda r: r.get(rank_by))
    groups: Dict[int, list] = {}
    for r in rows:
        step = r.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            groups.setdefault(step, []).append(r)
    out = []
    for step in sorted(groups):
        group = groups[step]
        n = len(group)
        row: Dict[str, Any] = {"step": step, "spans": n}
        for f in fields:
            s = total(r.get(f) for r in group)
            row[f] = s / n if s is not None else None
        lo = hi = None
        top = None
        for r in group:
            v = num(value_of(r))
            if v is None:
                continue
            if lo is None or v < lo:
                lo = v
            if hi is None or v > hi:
                hi, top = v, r
        row[f"min_{rank_by}"], row[f"max_{rank_by}"] = lo, hi
        row["max_worker"] = top.get("worker") if top is not None else None
        row["max_span"] = top.get("span") if top is not None else None
        out.append(row)
    return out


def merge(partials: List[dict]) -> dict:
    """Merge partials field by field, by the field's prefix (module docstring)."""
    out: dict = {}
    for p in partials:
        for key, value in p.items():
            kind = key.split(":", 1)[0]
            if key not in out:
                if kind == "keyed":
                    out[key] = {k: merge([v]) for k, v in value.items()}
                elif kind == "rows":
                    out[key] = list(value)
                elif kind == "wmean":
                    out[key] = [value[0], value[1]]
                elif kind in ("sum", "max"):
                    out[key] = num(value)
                else:
                    out[key] = value
                continue
            have = out[key]
            if kind == "sum":
                if have is not None:
                    value = num(value)
                    out[key] = None if value is None else have + value
            elif kind == "max":
                if have is not None:
                    value = num(value)
                    out[key] = None if value is None else max(have, value)
            elif kind == "any":
                out[key] = bool(have) or bool(value)
            elif kind == "all":
                out[key] = bool(have) and bool(value)
            elif kind == "rows":
                have.extend(value)
            elif kind == "wmean":
                have[0] += value[0]
                have[1] += value[1]
            elif kind == "keyed":
                for k, v in value.items():
                    have[k] = merge([have[k], v]) if k in have else merge([v])
            # "first": keep the first span's value
    return out


@dataclass
class SpanContext:
    """What every unit of one span shares, computed once: the steps, the step
    partition, the shown occupancy per kernel, the report so far."""

    trace: Any
    report: dict
    not_available: Dict[str, str]
    snapshot: Optional[dict] = None
    sections: Any = None  # report._Sections: run(name, fn, ...) isolates a sub-step, .failed
    found: Any = None  # analysis.steps.Steps
    extras: Dict[str, Any] = field(default_factory=dict)  # span-result parts beside the report
    _cache: Dict[str, Any] = field(default_factory=dict)

    _lock: Any = field(default_factory=threading.Lock)  # guards _key_locks
    _key_locks: Dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, fn: Callable[[], Any]):
        """fn() the first time `key` is asked for in this span, its value afterwards; one
        computation when two threads ask at once (report.analyze_trace's side-by-side part)."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._cache:
                self._cache[key] = fn()
            return self._cache[key]

    def release(self, key: str) -> None:
        """Forget `key` (a later `once` computes it again): for a large value whose last
        reader has run, so that it does not add to the span's peak memory."""
        self._cache.pop(key, None)


ALL_PRESENT, NONE_FAILED, ALWAYS = "all_present", "none_failed", "always"

# ---------------------------------------------------------------------------- headline metadata
# Data only (no judging, no formatting code): views/headline.py derives compare's HEADLINE,
# the gate's metric names, the report text's lines and the dashboard's card list from it.

LOWER, HIGHER = "lower", "higher"  # Metric.direction: which way is better (None: neither)


def path(*keys: str) -> Callable[[dict], Any]:
    """A getter: ``report[k0][k1]...``, None where a level is missing or not a dict."""
    def get(rep):
        d = rep
        for k in keys:
            if not isinstance(d, dict):
                return None
            d = d.get(k)
        return d
    return get


@dataclass(frozen=True)
class Card:
    """A headline card of the dashboard (its verdict: judge/cards.py under ``id``). What the
    card shows besides the server's verdict: ``label`` (``amd_label``/``amd_explain`` for AMD
    traces), ``sublabel`` (small text beside the label), ``explain`` (one line under the
    verdict), ``definition`` (hover text; the frontend may have its own for the id),
    ``field`` (the report path of the number, shown uncoloured only when the report has no
    verdict), ``optional`` (no card when the value is n/a or 0), ``order`` (position in the
    card row; equal orders keep registry order), ``group`` (its topic on the first screen:
    judge/layout.py ``GROUPS``)."""

    id: str
    label: str
    explain: str = ""
    field: Optional[Tuple[str, ...]] = None
    sublabel: Optional[str] = None
    definition: Optional[str] = None
    amd_label: Optional[str] = None
    amd_explain: Optional[str] = None
    optional: bool = False
    order: int = 1000
    group: Optional[str] = None  # its card group (judge/layout.py GROUPS); None: judge/layout.py CARD_GROUPS


@dataclass(frozen=True)
class Metric:
    """A headline number (compare's ``metrics`` rows, ``diff``, ``check``): ``key`` (the
    name in compare, the gate and the CLI), ``label`` (words), ``unit`` ("%", "bytes",
    "us", "TFLOP/s", "" for a count), ``direction`` (LOWER / HIGHER is better, None:
    neither), ``get(report)`` (its value; ``path(...)`` for a plain path), ``na_keys`` (the
    report's ``not_available`` keys that explain an n/a, first found wins),
    ``na_device_metric`` (else a per-device key matching this pattern, e.g.
    ``"gpu.*.utilization_pct"``, explains it),
    ``na_default`` (else these words), ``card`` (its headline card, if any), ``text``
    (printed as a plain line by ``tb-bottlenecks report``; False where the report text has
    its own line for it), ``order`` (position among the headline numbers; equal orders keep
    registry order)."""

    key: str
    label: str
    unit: str
    direction: Optional[str]
    get: Optional[Callable[[dict], Any]]
    na_keys: Tuple[str, ...] = ()
    na_device_metric: Optional[str] = None
    na_default: str = "not available in this report"
    card: Optional[Card] = None
    text: bool = True
    order: int = 1000


@dataclass
class Unit:
    """One metric family (module docstring). ``fields``: for a unit that fills several
    top-level report keys (``{key: default}``) instead of ``report[name]``. ``group``:
    when a group of spans gets this section: ALL_PRESENT (every span has the section, else
    n/a naming the span), NONE_FAILED (no span's computation of ``requires`` + this one
    raised), ALWAYS."""

    name: str
    compute: Callable[[SpanContext], Any]
    partial: Callable[[dict], Optional[dict]]
    finish: Callable[[dict], Any]
    requires: Tuple[str, ...] = ()
    fields: Optional[Dict[str, Any]] = None
    group: str = ALL_PRESENT
    # headline numbers of this unit (Metric above: compare, CLI, gate, card list)
    metrics: Tuple[Metric, ...] = ()
    # headline card ids of this unit, in display order; by default those of ``metrics``. Data
    # only: the verdict functions live in judge/cards.py (CARD_FUNCTIONS), so the maths never
    # imports the judging
    cards: Tuple[str, ...] = ()
    # optional ``(summary report, not_available) -> None``: a worker or run summary's reasons
    # where finishing the merged partials answers what a span could not (the spans' reasons are
    # merged first; e.g. flops: CUDA graph replays paired with another span's capture)
    summary_not_available: Optional[Callable[[dict, Dict[str, str]], None]] = None

    def __post_init__(self):
        if not self.cards:
            self.cards = tuple(m.card.id for m in self.metrics if m.card is not None)

    def defaults(self) -> Dict[str, Any]:
        import copy

        return copy.deepcopy(self.fields) if self.fields is not None else {self.name: None}
