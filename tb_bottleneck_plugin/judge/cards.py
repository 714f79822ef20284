"""The headline cards (docs/report-schema.md `verdicts`): one function per card id,
``fn(report) -> verdict`` made with ``verdicts.card``, kept out of the metric units so that
analysis/ holds only the maths and never imports judge/ (judge -> analysis, not the reverse).

A metric unit names its cards as data (``Unit.cards``: card ids, in display order);
``card_verdicts`` looks each id up in ``CARD_FUNCTIONS``. A new card: a function
here under ``@register("<card id>")`` (tests/judge/test_units_verdicts.py fails on a unit's card
id without one, and on a function no unit or ``verdicts.CARDS`` names).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

from .. import thresholds as T
from ..analysis import compilation, registry
from ..analysis.context import short_kernel_bound
from ..analysis.flops import mfu_severity, roofline_efficient
from ..analysis.input_bound import input_finding
from . import verdicts as V
from .recommendations import (CAPTURE_ONLY_WORDS, KERNEL_EVIDENCE_CARDS, capture_only, gpu_utilization_not_judged,
                              reserved_of_capacity_pct, steps_words, sync_cost_pct, too_little_data)

CardFunction = Callable[[dict], dict]

# card id -> fn(report) -> verdict; filled by @register below, in registry order
CARD_FUNCTIONS: Dict[str, CardFunction] = {}


def register(card_id: str) -> Callable[[CardFunction], CardFunction]:
    """Decorator: ``fn`` judges card ``card_id``. One function per id (a second is a
    mistake, e.g. a copied id, so it raises at import rather than shadowing the first)."""
    def add(fn: CardFunction) -> CardFunction:
        if card_id in CARD_FUNCTIONS:
            raise ValueError(f"card {card_id!r} already has a function: {CARD_FUNCTIONS[card_id].__name__}")
        CARD_FUNCTIONS[card_id] = fn
        return fn
    return add


@register("input_bound")
def _card_input_bound(report: dict) -> dict:
    inp = report.get("input") or {}
    value = V.num(inp.get("input_bound_pct"))
    out = V.card(report, value, "pct", "input_bound", None,
                 ("INPUT_BOUND_HIGH_PCT", "INPUT_BOUND_MODERATE_PCT", "INPUT_TRANSFER_PCT"), ("input_bound_pct", "input"))
    if value is not None:
        # one severity for the card and the input advice (rules input_bound, pageable_h2d):
        # the DataLoader wait and the synchronous input copies, the louder of the two
        out["verdict"], out["severity"] = input_finding(inp)
        out["input_transfer_pct"] = V.num(inp.get("input_transfer_pct"))
    return out


@register("gpu_utilization")
def _card_gpu_utilization(report: dict) -> dict:
    value = V.mean_gpu_utilization(report)
    # host_bound judges the utilization alone; small_kernels when it fired with it among others
    rule = "small_kernels" if V.fired(report, "small_kernels", "gpu_utilization_pct") else "host_bound"
    out = V.card(report, value, "pct", rule, "gpu_utilization_pct",
                 ("LOW_GPU_UTILIZATION_PCT", "INPUT_BOUND_MODERATE_PCT"), ("utilization_pct", "gpu"))
    why = gpu_utilization_not_judged(report) if value is not None and out["severity"] in ("ok", "none") else None
    over = steps_words(report)  # "the steps", or the one window of a trace without ProfilerStep
    if why:  # uncoloured: the rules do not read this number here (never a green "ok")
        out["severity"] = "none"
        out["verdict"] = f"GPU busy {V.pct_words(value)} of {over}, not judged: {why}"
    elif value is not None and out["severity"] == "ok":
        out["verdict"] = f"GPU busy {V.pct_words(value)} of {over}"
    elif value is not None:
        out["verdict"] = f"GPU idle {V.pct_words(100 - value)} of {over}, and not because of input"
    n = len([g for g in (report.get("gpu") or {}).values() if isinstance(g, dict)])
    out["devices"] = n
    return out


@register("tensor_cores")
def _card_tensor_cores(report: dict) -> dict:
    tc = report.get("tensor_cores") or {}
    value = V.num(tc.get("tensor_core_pct"))
    out = V.card(report, value, "pct", "tensor_cores_unused", None,
                 ("TC_ELIGIBLE_NOT_USING_PCT", "TC_ELIGIBLE_NOT_USING_HIGH_PCT"), ("tensor_core_pct", "tensor_cores"))
    el = V.num(tc.get("eligible_not_using_pct"))
    out["eligible_not_using_pct"] = el
    if value is not None:
        if el is not None and el >= 1:
            out["verdict"] = f"{el:.1f} % of kernel time eligible but unused"
        else:
            out["verdict"] = "in use; no eligible op left out" if value > 0 else "no eligible work found"
    return out


def _fmt_tflops(v) -> str:
    whole = f"{v:.0f}"
    return whole if len(whole) > 2 else f"{v:.3g}"  # 989, 211, 86.5, 8.64, 0.0234


def _fmt_rate(tflops) -> str:
    """A FLOP rate with its unit scaled (issue 35: never "2.26e-05 of 67 TFLOP/s"):
    989 TFLOP/s, 86.5 TFLOP/s, 23.4 GFLOP/s, 4.92 MFLOP/s."""
    for scale, unit in ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (1e-6, "MFLOP/s"), (1e-9, "kFLOP/s")):
        if tflops >= scale or unit == "kFLOP/s":
            return f"{_fmt_tflops(tflops / scale)} {unit}"
    return f"{tflops:.3g} TFLOP/s"


def _fmt_share(pct: float) -> str:
    """A share of the peak in words: "34 %", "0.4 %", "< 0.1 %" (never "0 %" for a non-zero share)."""
    if pct >= 9.5:
        return f"{pct:.0f} %"
    if pct >= 0.1:
        return f"{pct:.2g} %"
    return "< 0.1 %" if pct > 0 else "0 %"


@register("mfu")
def _card_mfu(report: dict) -> dict:
    sec = report.get("flops") if isinstance(report.get("flops"), dict) else {}
    value = V.num(sec.get("mfu_pct"))
    out = V.card(report, value, "pct", "low_mfu", None, ("MFU_LOW_PCT", "MFU_MODERATE_PCT"),
                 ("flops.mfu_pct", "flops.flops", "flops"))
    peak = sec.get("peak") or {}
    out["tflops"] = V.num(sec.get("tflops"))
    out["peak_tflops"] = V.num(sec.get("peak_tflops"))
    out["peak_source"] = peak.get("source")
    # the MFU is a sum over precisions, each against its own peak (METRICS.md §15): its parts
    by_prec = sec.get("by_precision") if isinstance(sec.get("by_precision"), dict) else {}
    step_us = V.num(sec.get("step_us"))
    split = []
    for p, share in (sec.get("mfu_split_pct") or {}).items():
        share, row = V.num(share), by_prec.get(p) if isinstance(by_prec.get(p), dict) else {}
        if share is not None and share > 0:
            fl = V.num(row.get("flops"))
            split.append({"precision": p, "mfu_pct": share, "peak_tflops": V.num(row.get("peak_tflops")),
                          "tflops": fl / step_us / 1e6 if fl is not None and step_us else None})
    out["split"] = sorted(split, key=lambda r: -r["mfu_pct"])
    if value is not None:
        out["severity"] = mfu_severity(value)
        if len(out["split"]) > 1:  # e.g. fp8 and bf16 GEMMs: each part of the MFU at its own peak
            words = f"{_fmt_share(value)} of {peak.get('gpu')} peak · " + " + ".join(
                f"{r['precision']} {r['mfu_pct']:.2g} %" + (f" of {_fmt_tflops(r['peak_tflops'])}"
                                                          if r["peak_tflops"] is not None else "")
                for r in out["split"]) + " TFLOP/s"
            if out["tflops"] is not None:
                words += f" · {_fmt_rate(out['tflops'])} over the step"
        else:
            words = f"{_fmt_share(value)} of {peak.get('gpu')} {sec.get('main_precision') or ''} peak".replace("  ", " ")
            if out["tflops"] is not None and out["peak_tflops"] is not None:
                words += f" · {_fmt_rate(out['tflops'])} of {_fmt_rate(out['peak_tflops'])}"
        if peak.get("source", "").startswith("user"):
            words += " (user-given peak)"
        gr = sec.get("graph_replays") if isinstance(sec.get("graph_replays"), dict) else {}
        missed = (V.num(gr.get("kernels")) or 0) - (V.num(gr.get("attributed")) or 0)
        if missed > 0:  # the analysis's reason: not_available["flops.graph_replays"]
            words += f" · partial: {missed:.0f} kernels replayed from CUDA graphs not counted"
        out["verdict"] = words
    elif V.num(sec.get("tflops")) is not None and sec.get("flops"):
        # FLOPs but no peak (CPU-only, unknown GPU): the rate, uncoloured
        out["verdict"] = (f"{out['tflops'] * 1e3:.1f} GFLOP/s over the step time; MFU n/a: "
                          + (out["verdict"] or "no peak"))
    return out


@register("occupancy")
def _card_occupancy(report: dict) -> dict:
    occ = report.get("occupancy") or {}
    value = V.num(occ.get("est_achieved_occupancy_pct"))
    out = V.card(report, value, "pct", "small_kernels", "est_achieved_occupancy_pct",
                 ("LOW_OCCUPANCY_PCT", "ROOFLINE_EFFICIENT_PCT"),
                 # the section's reason first: it names ROCm where a device's reason cannot tell
                 ("occupancy.est_achieved_occupancy_pct", "est_achieved_occupancy_pct", "occupancy"))
    if value is not None and out["severity"] != "none":  # "none": verdicts.card's "not judged" words
        out["verdict"] = ("low occupancy: latency-bound kernels" if out["severity"] != "ok"
                          else f"at least {T.LOW_OCCUPANCY_PCT:g} %")
        if value < T.LOW_OCCUPANCY_PCT and out["severity"] == "ok":
            eff = roofline_efficient(report)
            if eff is not None and eff["pct"] >= T.ROOFLINE_EFFICIENT_PCT:
                # rule small_kernels leaves such occupancy out (METRICS.md §6, §9)
                out["verdict"] = (f"low by design: {eff['pct']:.0f} % of kernel time is GEMM/conv/attention "
                                  f"at ≥ {T.ROOFLINE_EFFICIENT_PCT:g} % of its roofline")
            elif eff is not None and eff["kernel_us"]:
                out["verdict"] = (f"low, but not in the kernels below {T.ROOFLINE_EFFICIENT_PCT:g} % "
                                  "of their roofline")
    return out


@register("short_kernels")
def _card_short_kernels(report: dict) -> dict:
    short = (report.get("occupancy") or {}).get("short_kernels")
    short = short if isinstance(short, dict) else {}
    value = V.num(short.get("time_pct"))
    out = V.card(report, value, "pct", "small_kernels", "short_kernel_time_pct",
                 ("SHORT_KERNEL_US", "SHORT_KERNEL_TIME_PCT"), ("short_kernels", "occupancy"))
    if value is not None and out["severity"] in ("ok", "none") and capture_only(report):
        # rule small_kernels does not judge launch cost where the graphs' replays did not run
        out["severity"] = "none"
        out["verdict"] = f"short kernels {V.pct_words(value)} of kernel time, not judged: {CAPTURE_ONLY_WORDS}"
    elif value is not None and out["severity"] != "none":  # "none": verdicts.card's "not judged" words
        # CUDA graph replays have no per-kernel launch: small kernels there are latency-bound
        # (the one classification of the rule and the step timeline: context.short_kernel_bound)
        graphs = (report.get("context") or {}).get("cuda_graphs")
        bound = ("latency-bound (replayed from CUDA graphs)" if short_kernel_bound(graphs) == "latency"
                 else "launch-bound")
        out["verdict"] = (f"short kernels: {bound}" if out["severity"] != "ok"
                          else f"short kernels below {T.SHORT_KERNEL_TIME_PCT:g} % of kernel time")
    out["count"] = short.get("count")
    return out


@register("peak_memory")
def _card_peak_memory(report: dict) -> dict:
    dev = V.memory_device(report)
    m = (report.get("memory") or {}).get(dev) or {} if dev else {}
    value = V.num(m.get("peak_allocated_bytes"))
    out = V.card(report, value, "bytes", "memory_growth", None,
                 ("MEMORY_LEAK_MIN_RISES", "MEMORY_LEAK_MIN_GROWTH_BYTES", "MEMORY_PRESSURE_PCT"),
                 (f"memory.{dev}.peak_allocated_bytes", "memory") if dev else ("memory",))
    out["device"] = dev
    if value is not None:
        # judged against the device's own capacity (deviceProperties totalGlobalMem of the
        # memory device, analysis/devices.py): also the peak of a CUDA-graph capture
        cap = V.num(m.get("capacity_bytes"))
        used = reserved_of_capacity_pct(m)
        near = (f"; peak reserved {used:.0f} % of capacity: near full" if used is not None
                and used >= T.MEMORY_PRESSURE_PCT else "")
        capture = " during CUDA-graph capture" if capture_only(report) else ""
        if out["severity"] != "ok":
            out["verdict"] = "allocated memory rises every step: possible leak"
        elif cap:
            out["verdict"] = f"{100.0 * value / cap:.1f} % of capacity{capture}{near}"
        elif dev and str(dev).startswith("cuda:"):
            why = (report.get("not_available") or {}).get(f"memory.{dev}.capacity_bytes")
            out["verdict"] = f"capacity unknown{': ' + why if why else ''}: not compared with the device's memory"
        else:
            out["verdict"] = "no steady growth across steps"
    return out


@register("allocator_slack")
def _card_allocator_slack(report: dict) -> dict:
    """The slack of the device the allocator_slack rule judged (or of the shown device): coloured
    only under memory pressure (METRICS §9); without it the slack is shown, uncoloured, as
    information ("not judged"), since a cache that fits easily costs nothing."""
    rec = V.fired(report, "allocator_slack")
    mem = report.get("memory") or {}
    dev = V.memory_device(report)
    if rec is not None and rec.get("device") in mem:  # the device the rule judged
        dev = rec["device"]
    else:  # else the worst slack above the reserve floor (shown as information), if any
        worst = [(k, V.num(v.get("slack_fragmentation_pct"))) for k, v in mem.items() if isinstance(v, dict)
                 and (V.num(v.get("peak_reserved_bytes")) or 0) >= T.SLACK_MIN_RESERVED_BYTES
                 and V.num(v.get("slack_fragmentation_pct")) is not None]
        dev = max(worst, key=lambda kv: kv[1])[0] if worst else dev
    m = mem.get(dev) or {} if dev else {}
    value = V.num(m.get("slack_fragmentation_pct"))
    out = V.card(report, value, "pct", "allocator_slack", None,
                 ("SLACK_FRAGMENTATION_PCT", "SLACK_FRAGMENTATION_HIGH_PCT", "SLACK_MIN_RESERVED_BYTES",
                  "MEMORY_PRESSURE_PCT"),
                 (f"memory.{dev}.slack_fragmentation_pct", "slack_fragmentation_pct") if dev else ("memory",))
    out["device"] = dev
    if value is None and dev and not str(dev).startswith("cuda:") and out["verdict"] == "not available":
        out["verdict"] = "GPU devices only"
    if value is not None:
        reserved = V.num(m.get("peak_reserved_bytes")) or 0
        used = reserved_of_capacity_pct(m)
        if out["severity"] != "ok":
            out["verdict"] = "much reserved memory unused at the peak, with the device nearly full"
        elif reserved < T.SLACK_MIN_RESERVED_BYTES:
            out["severity"] = "none"  # uncoloured: the rule does not judge tiny reserves (never a green "ok")
            out["verdict"] = f"less than {T.SLACK_MIN_RESERVED_BYTES / (1 << 30):g} GiB reserved: not judged"
        elif used is None:
            out["severity"] = "none"
            out["verdict"] = "device capacity unknown, so no memory pressure seen: not judged"
        elif used < T.MEMORY_PRESSURE_PCT:
            out["severity"] = "none"  # information: slack costs nothing while memory is to spare
            out["verdict"] = (f"peak reserved {used:.0f} % of capacity, no memory pressure: not judged"
                              + (" (unused reserve is harmless)" if value >= T.SLACK_FRAGMENTATION_PCT else ""))
        else:
            out["verdict"] = "little unused reserved memory"
    return out


@register("sync")
def _card_sync(report: dict) -> dict:
    sync = report.get("sync") or {}
    value = V.num(sync_cost_pct(sync))
    if V.cpu_only(report):
        value = None  # no GPU in the trace: "does the host starve the GPU" has no answer (n/a, the gpu reason)
    out = V.card(report, value, "pct", "synchronization", None,
                 ("SYNC_PCT", "SYNC_HIGH_PCT"), ("sync_pct", "sync", "gpu"))
    if value is not None and capture_only(report):
        # captured CUDA graphs, never replayed: the GPU the syncs wait on is idle by construction
        out.update(severity="none", verdict=f"not judged: {CAPTURE_ONLY_WORDS}")
    elif value is not None:
        out["verdict"] = ("the GPU idles during or after the host's waits on it" if out["severity"] != "ok"
                          else "host waits do not starve the GPU")
    return out


@register("d2d_copies")
def _card_d2d_copies(report: dict) -> dict:
    """Device-to-device copies, % of step time (METRICS.md §8): coloured by the d2d_copies
    rule; its words name the op that launches most of the copy time."""
    c = report.get("copies") or {}
    value = V.num(c.get("d2d_pct"))
    out = V.card(report, value, "pct", "d2d_copies", None, ("D2D_COPY_PCT", "D2D_COPY_HIGH_PCT"),
                 ("copies.d2d_pct", "copies"))
    if value is not None and out["severity"] == "ok":
        top = next(iter(c.get("top_ops") or []), None)
        out["verdict"] = ("few device-to-device copies" if not c.get("count")
                          else f"{c['count']} device-to-device copies, small share"
                          + (f" (most from {top['op']})" if isinstance(top, dict) and top.get("op") else ""))
    return out


@register("communication")
def _card_communication(report: dict) -> dict:
    comm = report.get("communication") or {}
    value = V.num(comm.get("comm_pct_of_kernel_time"))
    if V.cpu_only(report):
        value = None  # CPU-only: no kernels to share time with (n/a, the gpu reason)
    out = V.card(report, value, "pct", "communication", None,
                 ("COMM_SHARE_PCT", "COMM_OVERLAP_OK_PCT", "COMM_EXPOSED_HIGH_PCT"),
                 ("comm_pct_of_kernel_time", "communication", "gpu"))
    if value is not None:
        out["verdict"] = ("communication not hidden under compute" if out["severity"] != "ok"
                          else "communication small or overlapped")
    return out


@register(compilation.CARD)
def _card_compilation(report: dict) -> dict:
    sec = report.get(compilation.NAME) if isinstance(report.get(compilation.NAME), dict) else {}
    value = V.num(sec.get("compiled_pct"))
    out = V.card(report, value, "pct", compilation.RULE, None,
                 ("COMPILE_BREAKS_PER_STEP", "COMPILE_RECOMPILES_PER_STEP"),
                 (f"{compilation.NAME}.compiled_pct", compilation.NAME))
    if value is not None:
        out["severity"], out["verdict"] = compilation.card_severity(sec)
        causes = [c for c in sec.get("break_causes") or [] if isinstance(c, dict)]
        if causes and (sec.get("breaks_per_step") or 0) >= T.COMPILE_BREAKS_PER_STEP:
            # what broke the graph (METRICS.md §16 break_causes), beside the card's words
            out["break_cause"] = compilation.break_cause_words(causes[0])
    return out


# Ids of cards not owned by a metric unit (none today: every headline card is a unit's,
# Unit.cards); their functions are in judge/cards.py too.
CARDS: Tuple[str, ...] = ()


def not_judged_for_data(report: dict, card_id: str, verdict: dict) -> dict:
    """A card with a value on a report that holds too little data to judge it (too few
    events for any card, too few kernels for KERNEL_EVIDENCE_CARDS; thresholds.py
    MIN_EVENTS_TO_JUDGE, MIN_KERNELS_TO_JUDGE): uncoloured ("none"), its words say why, as
    the warm-up guard does. Other cards are returned as they are."""
    if verdict.get("value") is None or verdict.get("severity") == "na":
        return verdict
    if not verdict.get("rule") and not verdict.get("thresholds"):
        return verdict  # information only: no rule or threshold judges it anyway
    why = too_little_data(report, kernel_evidence=card_id in KERNEL_EVIDENCE_CARDS)
    if not why:
        return verdict
    names = ("MIN_EVENTS_TO_JUDGE", "MIN_KERNELS_TO_JUDGE") if card_id in KERNEL_EVIDENCE_CARDS \
        else ("MIN_EVENTS_TO_JUDGE",)
    return dict(verdict, severity="none", verdict=f"not judged: {why}",
                thresholds={**(verdict.get("thresholds") or {}), **{n: getattr(T, n) for n in names}})


def card_verdicts(report: dict) -> Dict[str, dict]:
    """Every card's verdict (the cards above, then those of the registered metric units);
    a card whose inputs are malformed is n/a, never an exception."""
    out = {}
    for card_id in CARDS + tuple(c for u in registry.UNITS for c in u.cards):
        try:
            # looked up per call (not bound at import) so a test may register a toy card
            out[card_id] = not_judged_for_data(report, card_id, CARD_FUNCTIONS[card_id](report))
        except Exception as exc:  # noqa: BLE001 - one card's bad input must not cost the report
            out[card_id] = {"value": None, "unit": "pct", "severity": "na",
                            "verdict": f"internal error in verdict {card_id}: {type(exc).__name__}: {exc}",
                            "thresholds": {}, "rule": None}
    return out
