"""Card verdicts (issue 11 item 2, /docs/report-schema.md `verdicts`): the colour and the
words of every headline card are decided here, on the server, from thresholds.py.

``card_verdicts(report)`` -> ``{card id: {value, unit, severity, verdict, thresholds, rule}}``
for a span report or a combined summary whose ``recommendations`` are already made.

A card's severity is the severity of the recommendation rule named in ``rule`` when that
rule fired *for this card's number* (the rule's ``numbers`` hold the card's key: e.g.
``small_kernels`` colours "GPU utilization" only when it fired because of utilization),
else "ok"; the input-bound card uses the metric's own XProf scale (high/medium/ok, from
analysis/input_bound.verdict_for). A null value gives severity "na" and, as the verdict,
the `not_available` reason. ``thresholds`` names the thresholds.py constants used, with
their values, so a reader (and tests/test_units_verdicts.py) can check every colour.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

from . import thresholds as T

SEVERITIES = ("high", "medium", "low", "ok", "na")


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
    ends with `.key` or starts with `key.`), as the dashboard looked it up."""
    na = report.get("not_available") or {}
    for k in keys:
        if isinstance(na.get(k), str):
            return na[k]
    for k in keys:
        for nk, reason in na.items():
            if str(nk).endswith(f".{k}") or str(nk).startswith(f"{k}."):
                return str(reason)
    return None


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


# ---------------------------------------------------------------- the cards
# Each returns (value, unit, rule id, rule's number key, threshold names, words(value, fired, report)).


def _input_bound(report: dict) -> dict:
    inp = report.get("input") or {}
    value = _num(inp.get("input_bound_pct"))
    out = _card(report, value, "pct", "input_bound", None,
                ("INPUT_BOUND_HIGH_PCT", "INPUT_BOUND_MODERATE_PCT"), ("input_bound_pct", "input"))
    if value is not None:
        from .analysis.input_bound import verdict_for

        out["verdict"], out["severity"] = verdict_for(value)
    return out


def _gpu_utilization(report: dict) -> dict:
    value = mean_gpu_utilization(report)
    out = _card(report, value, "pct", "small_kernels", "gpu_utilization_pct",
                ("LOW_GPU_UTILIZATION_PCT", "INPUT_BOUND_MODERATE_PCT"), ("utilization_pct", "gpu"))
    if value is not None and out["severity"] == "ok":
        out["verdict"] = (f"GPU busy {_pct(value)} of the steps" if value >= T.LOW_GPU_UTILIZATION_PCT
                          else f"GPU idle {_pct(100 - value)} of the steps, not judged (input-bound or "
                               "CUDA graph capture only)")
    elif value is not None:
        out["verdict"] = f"GPU idle {_pct(100 - value)} of the steps, and not because of input"
    n = len([g for g in (report.get("gpu") or {}).values() if isinstance(g, dict)])
    out["devices"] = n
    return out


def _tensor_cores(report: dict) -> dict:
    tc = report.get("tensor_cores") or {}
    value = _num(tc.get("tensor_core_pct"))
    out = _card(report, value, "pct", "tensor_cores_unused", None,
                ("TC_ELIGIBLE_NOT_USING_PCT", "TC_ELIGIBLE_NOT_USING_HIGH_PCT"), ("tensor_core_pct", "tensor_cores"))
    el = _num(tc.get("eligible_not_using_pct"))
    out["eligible_not_using_pct"] = el
    if value is not None:
        if el is not None and el >= 1:
            out["verdict"] = f"{el:.1f} % of kernel time eligible but unused"
        else:
            out["verdict"] = "in use; no eligible op left out" if value > 0 else "no eligible work found"
    return out


def _occupancy(report: dict) -> dict:
    occ = report.get("occupancy") or {}
    value = _num(occ.get("est_achieved_occupancy_pct"))
    out = _card(report, value, "pct", "small_kernels", "est_achieved_occupancy_pct",
                ("LOW_OCCUPANCY_PCT",), ("est_achieved_occupancy_pct", "occupancy"))
    if value is not None:
        out["verdict"] = ("low occupancy: latency-bound kernels" if out["severity"] != "ok"
                          else f"at least {T.LOW_OCCUPANCY_PCT:g} %")
    return out


def _short_kernels(report: dict) -> dict:
    short = (report.get("occupancy") or {}).get("short_kernels")
    short = short if isinstance(short, dict) else {}
    value = _num(short.get("time_pct"))
    out = _card(report, value, "pct", "small_kernels", "short_kernel_time_pct",
                ("SHORT_KERNEL_US", "SHORT_KERNEL_TIME_PCT"), ("short_kernels", "occupancy"))
    if value is not None:
        out["verdict"] = ("short kernels: launch-bound" if out["severity"] != "ok"
                          else f"short kernels below {T.SHORT_KERNEL_TIME_PCT:g} % of kernel time")
    out["count"] = short.get("count")
    return out


def _peak_memory(report: dict) -> dict:
    dev = memory_device(report)
    m = (report.get("memory") or {}).get(dev) or {} if dev else {}
    value = _num(m.get("peak_allocated_bytes"))
    out = _card(report, value, "bytes", "memory_growth", None,
                ("MEMORY_LEAK_MIN_RISES", "MEMORY_LEAK_MIN_GROWTH_BYTES"),
                (f"memory.{dev}.peak_allocated_bytes", "memory") if dev else ("memory",))
    out["device"] = dev
    if value is not None:
        cap = _num(m.get("capacity_bytes"))
        if out["severity"] != "ok":
            out["verdict"] = "allocated memory rises every step: possible leak"
        elif cap:
            out["verdict"] = f"{100.0 * value / cap:.1f} % of capacity"
        else:
            out["verdict"] = "no steady growth across steps"
    return out


def _allocator_slack(report: dict) -> dict:
    rec = _fired(report, "allocator_slack")
    mem = report.get("memory") or {}
    dev = memory_device(report)
    if rec is not None:  # the device the rule judged (the worst one above the reserve floor)
        worst = [(k, _num(v.get("slack_fragmentation_pct"))) for k, v in mem.items() if isinstance(v, dict)
                 and (_num(v.get("peak_reserved_bytes")) or 0) >= T.SLACK_MIN_RESERVED_BYTES
                 and _num(v.get("slack_fragmentation_pct")) is not None]
        dev = max(worst, key=lambda kv: kv[1])[0] if worst else dev
    m = mem.get(dev) or {} if dev else {}
    value = _num(m.get("slack_fragmentation_pct"))
    out = _card(report, value, "pct", "allocator_slack", None,
                ("SLACK_FRAGMENTATION_PCT", "SLACK_FRAGMENTATION_HIGH_PCT", "SLACK_MIN_RESERVED_BYTES"),
                (f"memory.{dev}.slack_fragmentation_pct", "slack_fragmentation_pct") if dev else ("memory",))
    out["device"] = dev
    if value is None and dev and not str(dev).startswith("cuda:") and out["verdict"] == "not available":
        out["verdict"] = "GPU devices only"
    if value is not None:
        reserved = _num(m.get("peak_reserved_bytes")) or 0
        if out["severity"] != "ok":
            out["verdict"] = "much reserved memory unused at the peak"
        elif reserved < T.SLACK_MIN_RESERVED_BYTES:
            out["verdict"] = f"less than {T.SLACK_MIN_RESERVED_BYTES / (1 << 30):g} GiB reserved: not judged"
        else:
            out["verdict"] = "little unused reserved memory"
    return out


def _sync(report: dict) -> dict:
    sync = report.get("sync") or {}
    value = _num(sync.get("sync_gpu_idle_pct")) if "sync_gpu_idle_pct" in sync else _num(sync.get("sync_pct"))
    out = _card(report, value, "pct", "synchronization", None,
                ("SYNC_PCT", "SYNC_HIGH_PCT", "SYNC_GPU_BUSY_OK_PCT"), ("sync_pct", "sync"))
    if value is not None:
        out["verdict"] = ("the GPU idles while the host waits on it" if out["severity"] != "ok"
                          else "host waits do not starve the GPU")
    return out


def _communication(report: dict) -> dict:
    comm = report.get("communication") or {}
    value = _num(comm.get("comm_pct_of_kernel_time"))
    out = _card(report, value, "pct", "communication", None,
                ("COMM_SHARE_PCT", "COMM_OVERLAP_OK_PCT", "COMM_EXPOSED_HIGH_PCT"),
                ("comm_pct_of_kernel_time", "communication"))
    if value is not None:
        out["verdict"] = ("communication not hidden under compute" if out["severity"] != "ok"
                          else "communication small or overlapped")
    return out


def card(report: dict, value, unit: str, rule: Optional[str], number_key: Optional[str],
         threshold_names, na_keys) -> dict:
    """One card's verdict: ``value`` (None: severity "na", the first `not_available` reason
    of ``na_keys`` as the words), ``unit`` ("pct", "bytes", "us", "count"), the
    recommendation ``rule`` whose firing (with ``number_key`` among its numbers, when
    given) sets the severity and the words, and the thresholds.py constants it uses."""
    return _card(report, value, unit, rule, number_key, threshold_names, na_keys)


def _card(report, value, unit, rule, number_key, threshold_names, na_keys) -> dict:
    if value is None:
        return {"value": None, "unit": unit, "severity": "na",
                "verdict": _na_reason(report, *na_keys) or "not available",
                "thresholds": _thresholds(*threshold_names), "rule": rule}
    rec = _fired(report, rule, number_key)
    return {"value": value, "unit": unit, "severity": rec["severity"] if rec else "ok",
            "verdict": rec["title"] if rec else "ok", "thresholds": _thresholds(*threshold_names), "rule": rule}


CARDS: List[Tuple[str, Callable[[dict], dict]]] = [
    ("input_bound", _input_bound), ("gpu_utilization", _gpu_utilization), ("tensor_cores", _tensor_cores),
    ("occupancy", _occupancy), ("short_kernels", _short_kernels), ("peak_memory", _peak_memory),
    ("allocator_slack", _allocator_slack), ("sync", _sync), ("communication", _communication),
]


def card_verdicts(report: dict) -> Dict[str, dict]:
    """Every card's verdict (the cards above, then those of the registered metric units);
    a card whose inputs are malformed is n/a, never an exception."""
    from .analysis import registry

    out = {}
    for card_id, fn in CARDS + [c for u in registry.UNITS for c in u.cards]:
        try:
            out[card_id] = fn(report)
        except Exception as exc:  # noqa: BLE001 - one card's bad input must not cost the report
            out[card_id] = {"value": None, "unit": "pct", "severity": "na",
                            "verdict": f"internal error in verdict {card_id}: {type(exc).__name__}: {exc}",
                            "thresholds": {}, "rule": None}
    return out
