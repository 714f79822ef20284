"""Issue 20: a report must not contradict itself. ``contradictions(report, ranks=None)`` reads
one report (a span's ``report.analyze_trace(...)["report"]``, or a worker/run summary of
``report.combine_results``) and, for a multi-worker run, its rank view, and lists every
statement that another part of the same report (or arithmetic) refutes:

- ``launch_bound_capture``: a card or recommendation calls the GPU launch-bound on a trace
  that captures CUDA graphs without replaying them (its launches run nothing);
- ``share_over_100``: an idle, utilization or breakdown share outside 0-100 %, or an
  HTA-style idle (or its parts) longer than the span it is measured over;
- ``banner_few_steps``: a straggler/imbalance banner of the rank view over fewer than
  ``T.MIN_STEPS_TO_COMPARE`` steps;
- ``green_card_rule_fired``: a card coloured "ok" (green) while the recommendation rule it
  names fired for the card's own number;
- ``green_low_utilization``: a green GPU utilization card below
  ``T.LOW_GPU_UTILIZATION_PCT`` (where something explains a low utilization the card is
  "none", uncoloured, with the words why);
- ``na_with_number``: a metric n/a (``not_available``, or an n/a card) while the same metric
  has a number elsewhere in the report;
- ``step_longer_than_activity``: the average step (or the steps window) longer than the
  activity the profiler recorded (``steps.activity_us``, METRICS.md §1);
- ``confident_on_little_data``: a recommendation or a coloured card on a report with fewer
  than ``T.MIN_EVENTS_TO_JUDGE`` events (kernel-statistics cards and rules: fewer than
  ``T.MIN_KERNELS_TO_JUDGE`` kernels);
- ``unpriced_confident_advice`` (issue 33): a medium/high recommendation that the step model
  prices under ``T.GAIN_INFO_PCT`` of the step, a recommendation whose predicted step is not
  its step less its gain, or a what-if the model says would lengthen the step;
- ``verdict_disagrees`` (issue 35): a healthy verdict above a high or medium card or
  recommendation, or a verdict whose sentence and fix are not the first time-saving
  recommendation's;
- ``severity_disagrees`` (issue 34 item 4): one finding judged twice with two severities: the
  MFU card and the low-MFU advice, the Input card and the input advice (``input_bound``,
  ``pageable_h2d``: a green "not input-bound" card beside a pageable-copy recommendation). The
  advice's severity is the card's, lowered only by the step model's price (``R.price``:
  under ``T.GAIN_INFO_PCT`` info, under ``T.VERDICT_MIN_GAIN_PCT`` at most low);
- ``layout_disagrees`` (issue 35 item 3): the first screen (``report["layout"]``, judge/layout.py)
  against the verdict and the cards: a card in no group and not listed as not applicable (or in
  both), a group folded to one line although a card in it warns, a warning card hidden as "not
  applicable", or a headline fix whose rule names cards none of which warns (all green or n/a);
- ``one_window_words``: a trace without ProfilerStep whose words name a "step 0" or "the
  steps", or whose per-step n/a gives another reason than the steps' own (METRICS.md §1).

The checker runs over every shared trace (``TRACES/**/*.pt.trace.json*``), every demo_logs
run (spans, worker and run summaries, rank views) and hand-built traces for issue 20 items 3
and 8 (a ProfilerStep that outlasts the activity, a 75-event trace, a trace without
ProfilerStep, a CUDA-graph capture without replay); each check is shown to fire on a report
crafted to contradict itself.
"""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from conftest import DEMO_LOGS, H100, TRACES, TraceBuilder, needs_traces, real_report
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.judge import recommendations as R

CHECKS = ("launch_bound_capture", "share_over_100", "banner_few_steps", "green_card_rule_fired",
          "green_low_utilization", "na_with_number", "step_longer_than_activity", "confident_on_little_data",
          "one_window_words", "unpriced_confident_advice", "verdict_disagrees", "severity_disagrees",
          "graph_flops", "layout_disagrees")

# "launch-bound", "launch- or latency-bound", but not "latency-bound, not launch-bound"
LAUNCH_BOUND = re.compile(r"(?<!not )\blaunch-(?:bound|\s+or\s+latency-bound)", re.IGNORECASE)
# A card's number among the numbers of the rule it names (cards whose rule also fires for
# other numbers: small_kernels colours each of its three cards by its own reason).
CARD_NUMBER = {"gpu_utilization": "gpu_utilization_pct", "occupancy": "est_achieved_occupancy_pct",
               "short_kernels": "short_kernel_time_pct"}
# Where each card's value lives in the report: an n/a card while that number exists
# contradicts the report.
CARD_SOURCE = {"input_bound": ("input", "input_bound_pct"), "tensor_cores": ("tensor_cores", "tensor_core_pct"),
               "occupancy": ("occupancy", "est_achieved_occupancy_pct"),
               "short_kernels": ("occupancy", "short_kernels", "time_pct"),
               "mfu": ("flops", "mfu_pct"), "compilation": ("compilation", "compiled_pct")}
# The same metric kept twice: a section total and its per-device copies.
PER_DEVICE_COPY = {"tensor_cores.tensor_core_pct": "tensor_core_pct",
                   "occupancy.est_achieved_occupancy_pct": "est_achieved_occupancy_pct"}
# A card and the advice that judge the same finding (issue 34 item 4): one severity.
SAME_FINDING = {"mfu": ("low_mfu",), "input_bound": ("input_bound", "pageable_h2d")}
EPS_US = 1.0  # µs of slack for sums of floats compared with spans
STEP_ZERO = re.compile(r"\bsteps?\s*#?0\b")


# ------------------------------------------------------------------------------ the checker

def _num(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _at(d, path) -> object:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _texts(rep: dict) -> Iterator[Tuple[str, str]]:
    """(where, words) of everything a user reads as a judgement: card verdicts, recommendation
    titles, evidence and gain assumptions."""
    for card, v in (rep.get("verdicts") or {}).items():
        if isinstance(v, dict) and isinstance(v.get("verdict"), str):
            yield f"card {card}", v["verdict"]
    for rec in rep.get("recommendations") or []:
        if not isinstance(rec, dict):
            continue
        for key in ("title", "gain_assumption"):
            if isinstance(rec.get(key), str):
                yield f"rule {rec.get('rule')} {key}", rec[key]
        for line in rec.get("evidence") or []:
            if isinstance(line, str):
                yield f"rule {rec.get('rule')} evidence", line


def _fired(rep: dict) -> dict:
    return {r.get("rule"): r for r in rep.get("recommendations") or [] if isinstance(r, dict)}


def check_launch_bound_capture(rep: dict) -> List[str]:
    if not R.capture_only(rep):
        return []
    return [f"{where}: says launch-bound, but the trace captures CUDA graphs without replaying them: {words!r}"
            for where, words in _texts(rep) if LAUNCH_BOUND.search(words)]


def check_share_over_100(rep: dict) -> List[str]:
    out = []
    for dev, g in (rep.get("gpu") or {}).items():
        if not isinstance(g, dict):
            continue
        for key in ("utilization_pct", "est_sm_efficiency_pct", "est_achieved_occupancy_pct", "tensor_core_pct"):
            v = _num(g.get(key))
            if v is not None and not -1e-9 <= v <= 100 + 1e-9:
                out.append(f"gpu {dev} {key} = {v} outside 0-100 %")
        idle = g.get("idle") if isinstance(g.get("idle"), dict) else {}
        pct, idle_us, span = _num(idle.get("idle_pct")), _num(idle.get("idle_us")), _num(idle.get("span_us"))
        if pct is not None and not -1e-9 <= pct <= 100 + 1e-9:
            out.append(f"gpu {dev} idle_pct = {pct} outside 0-100 %")
        if idle_us is not None and span is not None and idle_us > span + EPS_US:
            out.append(f"gpu {dev} HTA idle {idle_us} µs longer than its span {span} µs")
        # (host_wait/kernel_wait/other are HTA's gaps summed per stream: on a device with
        # several streams they add up to more than the device's idle, by definition; METRICS.md §4)
    for key, v in (rep.get("breakdown_pct") or {}).items():
        v = _num(v)
        if v is not None and not -1e-9 <= v <= 100 + 1e-9:
            out.append(f"breakdown_pct.{key} = {v} outside 0-100 %")
    v = _num((rep.get("input") or {}).get("input_bound_pct"))
    if v is not None and not -1e-9 <= v <= 100 + 1e-9:
        out.append(f"input_bound_pct = {v} outside 0-100 %")
    return out


def check_banner_few_steps(ranks: Optional[dict]) -> List[str]:
    if not isinstance(ranks, dict) or not (ranks.get("flagged") or ranks.get("recommendation")):
        return []
    steps = ranks.get("steps") or []
    per_rank = [r.get("steps") for r in ranks.get("ranks") or [] if isinstance(r, dict)]
    fewest = min([len(steps)] + [n for n in per_rank if isinstance(n, int)])
    if fewest < T.MIN_STEPS_TO_COMPARE:
        return [f"straggler/imbalance banner over {fewest} step(s), fewer than {T.MIN_STEPS_TO_COMPARE}"]
    return []


def check_green_card_rule_fired(rep: dict) -> List[str]:
    out, fired = [], _fired(rep)
    for card, v in (rep.get("verdicts") or {}).items():
        if not isinstance(v, dict) or v.get("severity") != "ok" or v.get("rule") not in fired:
            continue
        rec = fired[v["rule"]]
        if card in CARD_NUMBER and CARD_NUMBER[card] not in (rec.get("numbers") or {}):
            continue  # the rule fired for another card's number
        out.append(f"card {card} is ok (green) while rule {v['rule']} fired ({rec.get('severity')}): "
                   f"{rec.get('title')!r}")
    return out


def check_green_low_utilization(rep: dict) -> List[str]:
    v = (rep.get("verdicts") or {}).get("gpu_utilization") or {}
    value = _num(v.get("value"))
    if v.get("severity") == "ok" and value is not None and value < T.LOW_GPU_UTILIZATION_PCT:
        return [f"GPU utilization card green at {value:.1f} %, below {T.LOW_GPU_UTILIZATION_PCT:g} %, "
                f"with no reason given: {v.get('verdict')!r}"]
    return []


def check_na_with_number(rep: dict) -> List[str]:
    out = []
    na = rep.get("not_available") or {}
    for key in na:
        value = _at(rep, str(key).split("."))
        if _num(value) is not None:
            out.append(f"not_available[{key!r}] ({na[key]!r}) but {key} = {value}")
        if key in PER_DEVICE_COPY:
            for dev, g in (rep.get("gpu") or {}).items():
                if isinstance(g, dict) and _num(g.get(PER_DEVICE_COPY[key])) is not None:
                    out.append(f"not_available[{key!r}] but gpu.{dev}.{PER_DEVICE_COPY[key]} = "
                               f"{g[PER_DEVICE_COPY[key]]}")
    for card, path in CARD_SOURCE.items():
        v = (rep.get("verdicts") or {}).get(card)
        if isinstance(v, dict) and v.get("severity") == "na" and _num(_at(rep, path)) is not None:
            out.append(f"card {card} n/a ({v.get('verdict')!r}) but {'.'.join(path)} = {_at(rep, path)}")
    return out


def check_step_longer_than_activity(rep: dict) -> List[str]:
    st = rep.get("steps") if isinstance(rep.get("steps"), dict) else {}
    activity = _num(st.get("activity_us"))
    if activity is None:
        return []
    out = []
    avg = _num(rep.get("avg_step_us"))
    if avg is not None and avg > activity + EPS_US:
        out.append(f"average step {avg:.0f} µs longer than the recorded activity {activity:.0f} µs")
    window = _num(st.get("window_us"))
    if window is not None and window > activity + EPS_US:
        out.append(f"steps window {window:.0f} µs longer than the recorded activity {activity:.0f} µs")
    return out


def check_confident_on_little_data(rep: dict) -> List[str]:
    out = []
    little, few_kernels = R.too_little_data(rep), R.too_little_data(rep, kernel_evidence=True)
    for rec in rep.get("recommendations") or []:
        if little or (few_kernels and rec.get("rule") in R.KERNEL_EVIDENCE_RULES):
            out.append(f"rule {rec.get('rule')} fired on {little or few_kernels}")
    for card, v in (rep.get("verdicts") or {}).items():
        why = little or (few_kernels if card in R.KERNEL_EVIDENCE_CARDS else None)
        if why and isinstance(v, dict) and v.get("severity") not in ("none", "na"):
            out.append(f"card {card} judged {v.get('severity')} on {why}")
    return out


def check_one_window_words(rep: dict) -> List[str]:
    st = rep.get("steps") if isinstance(rep.get("steps"), dict) else {}
    if st.get("found") is not False:
        return []
    out = [f"{where}: names a step of a trace without ProfilerStep: {words!r}"
           for where, words in _texts(rep) if STEP_ZERO.search(words) or "of the steps" in words]
    na = rep.get("not_available") or {}
    for key, reason in na.items():
        if key.endswith("_per_step") and reason != na.get("steps"):
            out.append(f"not_available[{key!r}] = {reason!r}, not the steps' own reason {na.get('steps')!r}")
    return out


def check_unpriced_confident_advice(rep: dict) -> List[str]:
    out = []
    for r in rep.get("recommendations") or []:
        if r.get("gain_source") != "step_model":
            continue
        gain = r.get("estimated_gain_pct")
        if r.get("severity") in ("high", "medium") and isinstance(gain, (int, float)) and gain < T.GAIN_INFO_PCT:
            out.append(f"{r['rule']} is {r['severity']} but the step model prices it at {gain:.2f} %")
        before, after = r.get("step_ms"), r.get("predicted_step_ms")
        if isinstance(before, (int, float)) and isinstance(after, (int, float)) and isinstance(gain, (int, float)) \
                and abs(after - before * (1 - gain / 100)) > 0.01 * before:
            out.append(f"{r['rule']}: predicted step {after:.2f} ms is not {before:.2f} ms less {gain:.1f} %")
    sm = rep.get("step_model") if isinstance(rep.get("step_model"), dict) else {}
    for w in sm.get("what_if") or []:
        if isinstance(w.get("saving_us"), (int, float)) and w["saving_us"] < 0:
            out.append(f"what-if {w.get('id')} lengthens the step")
    return out


def check_verdict_disagrees(rep: dict) -> List[str]:
    v = rep.get("verdict")
    if not isinstance(v, dict):
        return []
    out = []
    loud = [r for r in rep.get("recommendations") or [] if r.get("severity") in ("high", "medium")]
    cards = [c for c, x in (rep.get("verdicts") or {}).items()
             if isinstance(x, dict) and x.get("severity") in ("high", "medium") and x.get("rule") != "input_bound"
             and c not in ("compilation", "mfu", "input_bound")]  # these three keep their own scales (METRICS §9, §15, §16)
    if v.get("healthy"):
        out += [f"healthy verdict above the {r['rule']} recommendation ({r['severity']})" for r in loud
                if r.get("gain_source") != "memory"]
        out += [f"healthy verdict above the {c} card ({rep['verdicts'][c]['severity']})" for c in cards
                if rep["verdicts"][c].get("rule") not in ("allocator_slack", "memory_growth")]
    else:
        time_recs = [r for r in rep.get("recommendations") or [] if r.get("gain_source") != "memory"]
        first = time_recs[0] if time_recs else None
        fix = v.get("fix") or {}
        if first is None or v.get("sentence") != first.get("title") or fix.get("rule") != first.get("rule"):
            out.append(f"the verdict names {fix.get('rule')}, the first recommendation is "
                       f"{first.get('rule') if first else None}")
    return out


def _as_priced(severity: str, rec: dict) -> str:
    """A card's severity as the advice for the same finding must read once the step model
    priced it (the demotion of ``R.price``)."""
    gain = rec.get("estimated_gain_pct")
    if rec.get("gain_source") != "step_model" or not isinstance(gain, (int, float)) or severity == "ok":
        return severity
    if gain < T.GAIN_INFO_PCT:
        return "info"
    return "low" if gain < T.VERDICT_MIN_GAIN_PCT and severity in ("high", "medium") else severity


def check_severity_disagrees(rep: dict) -> List[str]:
    out, fired = [], _fired(rep)
    for card, rules in SAME_FINDING.items():
        v = (rep.get("verdicts") or {}).get(card)
        if not isinstance(v, dict) or v.get("severity") in (None, "na", "none"):
            continue
        for rule in rules:
            rec = fired.get(rule)
            if rec is None:
                continue
            want = _as_priced(v["severity"], rec)
            if rec.get("severity") != want:
                out.append(f"card {card} is {v['severity']} ({v.get('verdict')!r}) but rule {rule} is "
                           f"{rec.get('severity')} (priced at {rec.get('estimated_gain_pct')} %): {rec.get('title')!r}")
    return out


def check_graph_flops(rep: dict) -> List[str]:
    """Issue 34 item 2: the MFU card says the steps ran no GEMM/convolution/attention while the
    compilation card counts kernels replayed from CUDA graphs (which carry no shapes)."""
    comp = rep.get("compilation") if isinstance(rep.get("compilation"), dict) else {}
    n = comp.get("graph_kernels") or 0
    words = ((rep.get("verdicts") or {}).get("mfu") or {}).get("verdict")
    if n and isinstance(words, str) and "no GEMM, convolution or attention" in words:
        return [f"MFU card says {words!r} beside {n} kernels replayed from CUDA graphs"]
    return []


def check_layout_disagrees(rep: dict) -> List[str]:
    lay = rep.get("layout")
    verdicts = rep.get("verdicts") if isinstance(rep.get("verdicts"), dict) else {}
    if not isinstance(lay, dict):
        return []
    out = []
    grouped = [c for g in lay["groups"] for c in g["cards"]]
    na = [x["id"] for x in lay["not_applicable"]]
    for cid in verdicts:
        if (grouped + na).count(cid) != 1:
            out.append(f"card {cid} is {(grouped + na).count(cid)} times on the first screen")
    for g in lay["groups"]:
        warn = [c for c in g["cards"] if verdicts[c].get("severity") in ("high", "medium", "low")]
        if warn and not g["judged"]:
            out.append(f"group {g['id']} is one line although {warn} warn")
    out += [f"warning card {c} listed as not applicable" for c in na
            if verdicts[c].get("severity") in ("high", "medium", "low")]
    # the headline's rule: where cards name it, one of them warns on the page (a rule shared by
    # cards judges only the ones whose number made it fire: judge/verdicts.py)
    fix = (rep.get("verdict") or {}).get("fix") or {}
    own = [c for c, v in verdicts.items() if fix.get("rule") and v.get("rule") == fix["rule"]]
    if own and not any(verdicts[c].get("severity") in ("high", "medium", "low") and c not in na for c in own):
        out.append(f"the headline fixes {fix['rule']} but no card of that rule warns: "
                   + ", ".join(f"{c} {verdicts[c].get('severity')}" for c in own))
    return out


def contradictions(rep: dict, ranks: Optional[dict] = None) -> List[str]:
    """Every contradiction of one report (and of its run's rank view), as "check: words"."""
    found = []
    for name in CHECKS:
        fn = globals()[f"check_{name}"]
        found += [f"{name}: {msg}" for msg in (fn(ranks) if name == "banner_few_steps" else fn(rep))]
    return found


# ------------------------------------------------------------------------------ hand-built traces

def profiler_span(b: TraceBuilder, ts: float, dur: float) -> None:
    """The profiler's own span, as Kineto writes it (the `Trace` event)."""
    b.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                     "tid": "PyTorch Profiler", "ts": ts, "dur": dur, "args": {"Op count": 0}})


def _report(b: TraceBuilder, tmp_path: Path, name: str) -> dict:
    return report_mod.analyze_trace(b.load(tmp_path, f"{name}.pt.trace.json"))["report"]


T0 = 1_000_000.0
STEP_US = 13_300_000.0  # the issue's 13.3 s ProfilerStep
PROFILER_US = 355_000.0  # ... and the profiler's own 355 ms span


def stretched_step_issue(tmp_path: Path) -> dict:
    """Issue 20 item 3 as reported: a 13.3 s ProfilerStep whose every op and kernel lies in its
    first 1.5 ms (one 1.8 µs kernel), in a 355 ms profiler span."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 200, PROFILER_US)
    b.step(7, T0, STEP_US)
    b.cpu("aten::ones", T0 + 10, 400)
    b.cpu("aten::add", T0 + 500, 900)
    c = b.runtime("cudaLaunchKernel", T0 + 600, 5)
    b.kernel("vectorized_elementwise_kernel", T0 + 620, 1.8, correlation=c)
    b.cpu("aten::sum", T0 + 1420, 80)
    return _report(b, tmp_path, "stretched_issue")


def stretched_step_busy(tmp_path: Path) -> dict:
    """The same stretched annotation over enough work to judge (>= MIN_EVENTS_TO_JUDGE
    events, >= MIN_KERNELS_TO_JUDGE kernels): 50 ops launching a 30 µs kernel each, back to
    back, in the first 1.9 ms; the GPU is busy 81 % of that."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 200, PROFILER_US)
    b.step(7, T0, STEP_US)
    t = T0 + 10
    for _ in range(50):
        b.cpu("aten::add", t, 30)
        c = b.runtime("cudaLaunchKernel", t + 5, 5)
        b.kernel("vectorized_elementwise_kernel", t + 8, 30, correlation=c)
        t += 37
    return _report(b, tmp_path, "stretched_busy")


def seventy_five_events(tmp_path: Path) -> dict:
    """A 75-event synthetic trace: a profiler span, 3 steps of 8, 8 and 7 tiny kernels (2 µs,
    launched 45 µs apart: short kernels, a GPU idle 95 % of the time) and 2 allocations.
    The kernel-statistics rules would fire on it without the guard."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 50, 3 * 400 + 100)
    for s in range(3):
        start = T0 + s * 400
        b.step(s + 1, start, 400)
        for k in range(8 if s < 2 else 7):
            t = start + 10 + k * 45
            b.cpu("aten::add", t, 20)
            c = b.runtime("cudaLaunchKernel", t + 2, 5)
            b.kernel("vectorized_elementwise_kernel", t + 10, 2, correlation=c)
    b.cpu("aten::empty", T0 + 1, 3)
    b.cpu("aten::empty", T0 + 401, 3)
    assert len(b.events) == 75
    return _report(b, tmp_path, "seventy_five")


def no_profiler_step(tmp_path: Path) -> dict:
    """A trace without ProfilerStep (enough events and kernels to judge): a DataLoader wait of
    3 ms, then 50 ops launching a 50 µs kernel each."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 100, 10_000)
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", T0, 3000)
    t = T0 + 3000
    for _ in range(50):
        b.cpu("aten::mul", t, 40)
        c = b.runtime("cudaLaunchKernel", t + 5, 10)
        b.kernel("vectorized_elementwise_kernel", t + 20, 50, correlation=c)
        t += 60
    b.cpu("aten::item", t, 40)
    return _report(b, tmp_path, "no_steps")


def capture_without_replay(tmp_path: Path) -> dict:
    """CUDA graphs captured, never replayed: eager warm-up kernels of 2 µs each (short), then a
    capture whose launches run nothing on the GPU; 3 steps."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 100, 3 * 1000 + 200)
    for s in range(3):
        start = T0 + s * 1000
        b.step(s + 1, start, 1000)
        for k in range(10):
            t = start + 10 + k * 40
            b.cpu("aten::add", t, 20)
            c = b.runtime("cudaLaunchKernel", t + 2, 5)
            b.kernel("vectorized_elementwise_kernel", t + 10, 2, correlation=c)
        b.runtime("cudaStreamBeginCapture", start + 500, 5)
        for k in range(10):
            b.cpu("aten::mul", start + 510 + k * 40, 20)
            b.runtime("cudaLaunchKernel", start + 512 + k * 40, 5)
        b.runtime("cudaStreamEndCapture", start + 920, 5)
        b.runtime("cudaGraphInstantiate", start + 930, 50)
    return _report(b, tmp_path, "capture_only")


def _without_clipping(monkeypatch):
    """The steps as they were before issue 20 item 3: annotation ends kept as recorded."""
    from tb_bottleneck_plugin.analysis import steps

    monkeypatch.setattr(steps, "clip_to_recorded", lambda trace, rows, start, end, activity_end: end)


def _without_guard(monkeypatch):
    monkeypatch.setattr(T, "MIN_EVENTS_TO_JUDGE", 0)
    monkeypatch.setattr(T, "MIN_KERNELS_TO_JUDGE", 0)


# ------------------------------------------------------------------------------ item 3: stretched step

def test_stretched_step_is_clipped_to_the_recorded_activity(tmp_path, monkeypatch):
    rep = stretched_step_issue(tmp_path)
    st = rep["steps"]
    # The step ends with its last recorded event (aten::sum at +1420 µs, 80 µs long), not
    # 13.3 s later: what the user reads as the average step.
    assert rep["avg_step_us"] == pytest.approx(1500.0)
    assert st["clipped_us"] == pytest.approx(STEP_US - 1500.0)
    assert st["clipped"] == [{"number": 7, "annotation_us": STEP_US, "recorded_us": 1500.0,
                              "clipped_us": pytest.approx(STEP_US - 1500.0)}]
    assert st["activity_us"] == pytest.approx(PROFILER_US)
    assert any("ProfilerStep#7 lasts 13.3 s" in w and "first 1.5 ms" in w for w in rep["trace"]["warnings"])
    # Utilization on the recorded activity: 1.8 µs of 1.5 ms (before: of 13.3 s).
    assert rep["gpu"]["0"]["utilization_pct"] == pytest.approx(100 * 1.8 / 1500.0)
    # One 1.8 µs kernel in 7 events: too little data; no "launch-bound" from it, no advice.
    assert rep["recommendations"] == []
    for card, v in rep["verdicts"].items():
        assert v["severity"] in ("none", "na"), (card, v)
        assert not LAUNCH_BOUND.search(v["verdict"]), (card, v)
    assert "too little data (7 trace events" in rep["verdicts"]["gpu_utilization"]["verdict"]
    assert contradictions(rep) == []
    # the CLI text says it too, once
    from tb_bottleneck_plugin.views.text_report import format_report

    text = format_report(rep)
    warned = [line for line in text.splitlines() if line.strip().startswith("warning: ProfilerStep#7 lasts 13.3 s")]
    assert len(warned) == 1, text

    # Before the fix the same trace read: an average step of 13.3 s (longer than the
    # profiler's 355 ms span), GPU idle ~100 %, "launch-bound" from the one kernel.
    _without_clipping(monkeypatch)
    _without_guard(monkeypatch)
    before = stretched_step_issue(tmp_path)
    assert before["avg_step_us"] == pytest.approx(STEP_US)
    assert before["gpu"]["0"]["utilization_pct"] < 0.001
    assert before["verdicts"]["short_kernels"]["verdict"] == "short kernels: launch-bound"
    found = contradictions(before)
    assert any(f.startswith("step_longer_than_activity") for f in found), found


def test_stretched_step_over_enough_work_is_judged_on_what_was_recorded(tmp_path, monkeypatch):
    rep = stretched_step_busy(tmp_path)
    assert rep["trace"]["events"] >= T.MIN_EVENTS_TO_JUDGE and rep["trace"]["kernels"] >= T.MIN_KERNELS_TO_JUDGE
    # 50 launches 37 µs apart from +10: the last kernel ends at +10 + 49*37 + 8 + 30
    end = 10 + 49 * 37 + 38
    assert rep["avg_step_us"] == pytest.approx(end, abs=1e-6)
    assert rep["gpu"]["0"]["utilization_pct"] == pytest.approx(100 * 50 * 30 / end)
    v = rep["verdicts"]["gpu_utilization"]
    assert v["severity"] == "ok" and v["verdict"] == "GPU busy 81 % of the steps", v
    assert not {"host_bound", "small_kernels"} & {r["rule"] for r in rep["recommendations"]}
    assert contradictions(rep) == []

    _without_clipping(monkeypatch)
    before = stretched_step_busy(tmp_path)
    # Before: "GPU idle 100 % of the steps", host_bound over 13.3 s of annotation.
    assert before["verdicts"]["gpu_utilization"]["verdict"] == \
        "GPU idle 100 % of the steps, and not because of input"
    assert "host_bound" in {r["rule"] for r in before["recommendations"]}
    assert any(f.startswith("step_longer_than_activity") for f in contradictions(before))


def test_steps_inside_the_profiler_span_are_not_clipped(tmp_path):
    """Normal traces: the last step outlasts its last op (host time before prof.step()) but not
    the profiler's span: nothing is clipped, the annotation is the step."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 100, 2_500)
    b.step(1, T0, 1000)
    b.step(2, T0 + 1000, 1000)
    for s in range(2):
        b.cpu("aten::add", T0 + s * 1000 + 10, 100)
        c = b.runtime("cudaLaunchKernel", T0 + s * 1000 + 20, 5)
        b.kernel("k", T0 + s * 1000 + 30, 50, correlation=c)
    rep = _report(b, tmp_path, "normal")
    assert rep["steps"]["clipped_us"] == 0 and rep["steps"]["clipped"] == []
    assert rep["avg_step_us"] == pytest.approx(1000.0)
    assert rep["steps"]["activity_us"] == pytest.approx(2_500.0)


def test_without_the_profiler_span_nothing_is_clipped(tmp_path):
    """A hand-made trace without the profiler's own span: nothing tells a step's end from host
    time after its last op, so the annotation stays the step (METRICS.md §1)."""
    b = TraceBuilder(props=(H100,))
    b.step(1, T0, 10_000)
    b.cpu("aten::add", T0 + 10, 100)
    rep = _report(b, tmp_path, "no_profiler_span")
    assert rep["avg_step_us"] == pytest.approx(10_000.0) and rep["steps"]["clipped_us"] == 0
    assert rep["steps"]["activity_us"] == pytest.approx(10_000.0)


# ------------------------------------------------------------------------------ item 3: too little data

def test_seventy_five_event_trace_gets_no_confident_advice(tmp_path, monkeypatch):
    rep = seventy_five_events(tmp_path)
    assert rep["trace"]["events"] == 75
    assert rep["recommendations"] == []
    judged = {card: v for card, v in rep["verdicts"].items() if v["severity"] != "na"}
    assert judged and all(v["severity"] == "none" for v in judged.values()), judged
    for card, v in judged.items():
        assert v["verdict"] == f"not judged: too little data (75 trace events, fewer than {T.MIN_EVENTS_TO_JUDGE})", \
            (card, v)
        assert v["thresholds"]["MIN_EVENTS_TO_JUDGE"] == T.MIN_EVENTS_TO_JUDGE
    assert contradictions(rep) == []

    # Without the guard the same 24 kernels of 2 µs read "launch-bound" and idle-GPU advice.
    _without_guard(monkeypatch)
    loud = seventy_five_events(tmp_path)
    assert {"small_kernels"} <= {r["rule"] for r in loud["recommendations"]}
    monkeypatch.undo()
    assert any(f.startswith("confident_on_little_data") for f in contradictions(loud))


def test_few_kernels_silence_only_the_kernel_statistics(tmp_path):
    """Enough events (a long CPU side) but 4 kernels: the kernel-statistics cards and rules are
    not judged; the input-bound card (host time) still is."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 100, 4 * 1000 + 200)
    for s in range(4):
        start = T0 + s * 1000
        b.step(s + 1, start, 1000)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 5, 400)
        for k in range(40):
            b.cpu("aten::view", start + 410 + k * 11, 5)
        c = b.runtime("cudaLaunchKernel", start + 900, 5)
        b.kernel("vectorized_elementwise_kernel", start + 910, 2, correlation=c)
    rep = _report(b, tmp_path, "few_kernels")
    assert rep["trace"]["events"] >= T.MIN_EVENTS_TO_JUDGE and rep["trace"]["kernels"] == 4
    v = rep["verdicts"]
    for card in ("gpu_utilization", "short_kernels", "tensor_cores", "communication"):
        assert v[card]["severity"] in ("none", "na"), (card, v[card])
        if v[card]["severity"] == "none":
            assert v[card]["verdict"] == "not judged: too little data (4 GPU kernels, fewer than 10)"
    assert v["input_bound"]["severity"] == "high"  # 40 % of the step waiting for data
    assert [r["rule"] for r in rep["recommendations"]] == ["input_bound"]
    assert contradictions(rep) == []


# ------------------------------------------------------------------------------ item 8: no ProfilerStep

def test_no_profiler_step_names_the_one_window(tmp_path):
    rep = no_profiler_step(tmp_path)
    st, na = rep["steps"], rep["not_available"]
    assert st["found"] is False and st["count"] == 1
    assert na["steps"] == "no steps found (no ProfilerStep#N): the whole trace is analysed as one window"
    # per-step numbers of the one window: n/a with the same reason, the window's own count given
    assert rep["launch"]["kernels_per_step"] is None and na["launch.kernels_per_step"] == na["steps"]
    assert rep["launch"]["kernels_per_window"] == 50
    # the words name the one window, never a "step 0" or "the steps"
    gpu = rep["verdicts"]["gpu_utilization"]["verdict"]
    assert gpu.startswith("GPU busy 41 % of the one window (the whole trace: no ProfilerStep#N)"), gpu
    inp = next(r for r in rep["recommendations"] if r["rule"] == "input_bound")
    assert any(e.startswith("the one window (the whole trace: no ProfilerStep#N): 3.0 ms waiting for data")
               for e in inp["evidence"]), inp["evidence"]
    for where, words in _texts(rep):
        assert not STEP_ZERO.search(words) and "of the steps" not in words, (where, words)
    assert contradictions(rep) == []


# ------------------------------------------------------------------------------ CUDA-graph capture

def test_capture_without_replay_is_never_called_launch_bound(tmp_path):
    rep = capture_without_replay(tmp_path)
    ctx = rep["context"]
    assert ctx["cuda_graph_capture"] and not ctx["cuda_graphs"] and R.capture_only(rep)
    assert rep["occupancy"]["short_kernels"]["time_pct"] == pytest.approx(100.0)
    v = rep["verdicts"]["short_kernels"]
    assert v["severity"] == "none" and v["verdict"].endswith(
        "not judged: CUDA graphs captured, not replayed, in this trace"), v
    assert rep["verdicts"]["gpu_utilization"]["severity"] == "none"
    assert not {"small_kernels", "host_bound"} & {r["rule"] for r in rep["recommendations"]}
    for where, words in _texts(rep):
        assert not LAUNCH_BOUND.search(words), (where, words)
    assert contradictions(rep) == []


def test_low_utilization_without_kernel_statistics_is_not_green():
    """Rule host_bound needs the kernel statistics (short kernels) to tell host- from
    launch-bound; without them (occupancy n/a) a 20 % utilization used to read as a green
    "GPU busy 20 % of the steps" card: now it is "none", with the words why."""
    from tb_bottleneck_plugin.judge import cards

    rep = _clean_report()
    rep["gpu"]["0"]["utilization_pct"] = 20.0
    rep["gpu"]["0"]["idle"].update(idle_us=2400.0, idle_pct=80.0, host_wait_us=2200.0)
    rep["occupancy"] = None
    rep["not_available"]["occupancy"] = "no kernel carries occupancy fields"
    rep["recommendations"] = R.recommend(rep)
    rep["verdicts"] = cards.card_verdicts(rep)
    v = rep["verdicts"]["gpu_utilization"]
    assert v["severity"] == "none" and "not judged: no kernel statistics" in v["verdict"], v
    assert contradictions(rep) == []


# ------------------------------------------------------------------------------ the checker fires

def _clean_report() -> dict:
    """A small consistent report (by hand) that every check passes."""
    return {
        "trace": {"events": 5000, "kernels": 400},
        "steps": {"count": 3, "numbers": [1, 2, 3], "found": True, "window_us": 3000.0, "activity_us": 3500.0},
        "avg_step_us": 1000.0,
        "breakdown_pct": {"kernel": 60.0, "other": 40.0},
        "input": {"input_bound_pct": 1.0},
        "gpu": {"0": {"utilization_pct": 60.0, "tensor_core_pct": 10.0,
                      "idle": {"span_us": 3000.0, "idle_us": 1200.0, "idle_pct": 40.0, "host_wait_us": 1000.0,
                               "kernel_wait_us": 100.0, "other_us": 100.0}}},
        "tensor_cores": {"tensor_core_pct": 10.0},
        "occupancy": {"est_achieved_occupancy_pct": 40.0, "short_kernels": {"time_pct": 5.0}},
        "context": {"cuda_graphs": False, "cuda_graph_capture": False, "evidence": {}},
        "recommendations": [],
        "verdicts": {
            "gpu_utilization": {"value": 60.0, "severity": "ok", "verdict": "GPU busy 60 % of the steps",
                                "rule": "host_bound"},
            "short_kernels": {"value": 5.0, "severity": "ok", "verdict": "short kernels below 30 % of kernel time",
                              "rule": "small_kernels"},
            "tensor_cores": {"value": 10.0, "severity": "ok", "verdict": "in use", "rule": "tensor_cores_unused"},
        },
        "not_available": {},
    }


def _bad_reports():
    """(check, report, ranks) crafted so that exactly that check fires."""
    out = []
    r = _clean_report()
    r["context"] = {"cuda_graphs": False, "cuda_graph_capture": True, "evidence": {"graph_kernels": 0}}
    r["verdicts"]["short_kernels"].update(severity="medium", verdict="short kernels: launch-bound")
    r["recommendations"] = [{"rule": "small_kernels", "severity": "medium", "numbers": {"short_kernel_time_pct": 5.0},
                             "title": "Many small or low-occupancy kernels: the GPU is launch- or latency-bound"}]
    out.append(("launch_bound_capture", r, None))
    r = _clean_report()
    r["gpu"]["0"]["idle"].update(idle_us=3100.0, idle_pct=103.3, host_wait_us=2900.0)
    out.append(("share_over_100", r, None))
    ranks = {"flagged": True, "steps": [4], "ranks": [{"steps": 1}, {"steps": 1}],
             "recommendation": {"rule": "straggler"}}
    out.append(("banner_few_steps", _clean_report(), ranks))
    r = _clean_report()
    r["recommendations"] = [{"rule": "tensor_cores_unused", "severity": "high", "numbers": {},
                             "title": "60 % of GPU kernel time is matmul/conv work that does not use Tensor Cores"}]
    out.append(("green_card_rule_fired", r, None))
    r = _clean_report()
    r["gpu"]["0"]["utilization_pct"] = 20.0
    r["gpu"]["0"]["idle"].update(idle_us=2400.0, idle_pct=80.0, host_wait_us=2200.0)
    r["verdicts"]["gpu_utilization"].update(value=20.0, verdict="GPU busy 20 % of the steps")
    out.append(("green_low_utilization", r, None))
    r = _clean_report()
    r["not_available"]["tensor_cores.tensor_core_pct"] = "no kernels"
    r["tensor_cores"]["tensor_core_pct"] = None
    out.append(("na_with_number", r, None))
    r = _clean_report()
    r["avg_step_us"] = 13_300_000.0
    r["steps"]["window_us"] = 3000.0
    out.append(("step_longer_than_activity", r, None))
    r = _clean_report()
    r["trace"] = {"events": 75, "kernels": 24}
    r["verdicts"] = {}
    r["recommendations"] = [{"rule": "input_bound", "severity": "high", "numbers": {}, "title": "The GPU waits"}]
    out.append(("confident_on_little_data", r, None))
    r = _clean_report()
    r["steps"].update(found=False, count=1, numbers=[0])
    r["not_available"].update({"steps": "no steps found", "launch.kernels_per_step": "no steps found"})
    r["verdicts"]["gpu_utilization"]["verdict"] = "GPU busy 60 % of the steps"
    out.append(("one_window_words", r, None))
    r = _clean_report()
    r["recommendations"] = [{"rule": "synchronization", "severity": "high", "numbers": {}, "title": "Sync",
                             "estimated_gain_pct": 0.3, "gain_source": "step_model", "what_if": "sync",
                             "step_ms": 10.0, "predicted_step_ms": 9.97}]
    out.append(("unpriced_confident_advice", r, None))
    r = _clean_report()
    r["verdict"] = {"healthy": True, "sentence": "No fix worth 5 % of the step or more found.", "fix": None}
    r["recommendations"] = [{"rule": "synchronization", "severity": "medium", "numbers": {}, "title": "Sync",
                             "estimated_gain_pct": 3.0, "gain_source": "rule"}]
    out.append(("verdict_disagrees", r, None))
    r = _clean_report()  # issue 34 item 4: a green Input card beside a pageable-copy advice
    r["verdicts"]["input_bound"] = {"value": 0.8, "severity": "ok", "verdict": "not input-bound", "rule": "input_bound"}
    r["recommendations"] = [{"rule": "pageable_h2d", "severity": "medium", "numbers": {}, "title": "Pageable copies",
                             "estimated_gain_pct": 6.7, "gain_source": "step_model", "what_if": "pinned_h2d",
                             "step_ms": 10.0, "predicted_step_ms": 9.33}]
    out.append(("severity_disagrees", r, None))
    r = _clean_report()  # issue 34 item 2: the demo's reduce-overhead run before the fix
    r["compilation"] = {"graph_kernels": 140}
    r["verdicts"]["mfu"] = {"value": None, "severity": "na", "rule": "low_mfu",
                            "verdict": "no FLOPs counted in the steps (no GEMM, convolution or attention with shapes)"}
    out.append(("graph_flops", r, None))
    r = _clean_report()  # issue 35 item 3: a warning card folded into its group's one line
    r["verdicts"]["sync"] = {"value": 30.0, "unit": "pct", "severity": "high", "verdict": "host waits starve the GPU",
                             "rule": "synchronization"}
    r["layout"] = {"groups": [{"id": "other", "cards": list(r["verdicts"]), "judged": False}], "not_applicable": []}
    out.append(("layout_disagrees", r, None))
    return out


def test_the_clean_report_passes_every_check():
    assert contradictions(_clean_report(), ranks={"flagged": False, "steps": [1, 2, 3]}) == []


@pytest.mark.parametrize("check, rep, ranks", _bad_reports(), ids=[c for c, _, _ in _bad_reports()])
def test_each_check_fires_on_a_crafted_bad_report(check, rep, ranks):
    found = contradictions(copy.deepcopy(rep), ranks)
    assert {f.split(":")[0] for f in found} == {check}, found


def test_every_check_has_a_crafted_bad_report():
    assert {c for c, _, _ in _bad_reports()} == set(CHECKS)


def test_a_no_step_window_with_its_own_reason_passes():
    r = _clean_report()
    r["steps"].update(found=False, count=1, numbers=[0])
    r["not_available"].update({"steps": "no steps", "launch.kernels_per_step": "no steps"})
    r["verdicts"]["gpu_utilization"]["verdict"] = f"GPU busy 60 % of {R.NO_STEPS_WINDOW}"
    assert contradictions(r) == []


# ------------------------------------------------------------------------------ every real report

SHARED = sorted(str(p.relative_to(TRACES)) for p in TRACES.glob("**/*.pt.trace.json*")) if TRACES.exists() else []


@needs_traces
def test_there_are_shared_traces_to_check():
    assert len(SHARED) >= 20, SHARED


@needs_traces
@pytest.mark.parametrize("rel", SHARED)
def test_no_shared_trace_contradicts_itself(rel):
    assert contradictions(real_report(rel)) == []


@pytest.fixture(scope="module")
def demo_results():
    from tb_bottleneck_plugin.trace import discovery
    from tb_bottleneck_plugin.views import ranks

    if not DEMO_LOGS.is_dir():
        pytest.skip("demo_logs missing")
    logdir = discovery.discover_path(str(DEMO_LOGS))
    out = []  # (where, report, rank view or None)
    for run in logdir.runs:
        by_worker = {}
        for worker in run.workers:
            results = [report_mod.analyze_span(logdir.url, run, span) for span in worker.spans]
            by_worker[worker.name] = results
            out += [(f"{run.name}/{worker.name}/{span.name}", res["report"], None)
                    for span, res in zip(worker.spans, results)]
            if len(results) > 1:
                out.append((f"{run.name}/{worker.name} summary",
                            report_mod.combine_results(results, run=run.name, worker=worker.name)["report"], None))
        view = ranks.rank_view(by_worker) if len(by_worker) > 1 else None
        everything = [r for rs in by_worker.values() for r in rs]
        if len(by_worker) > 1:
            out.append((f"{run.name} run summary", report_mod.combine_results(everything, run=run.name)["report"], view))
    return out


def test_no_demo_run_contradicts_itself(demo_results):
    runs = {where.split("/")[0].split(" ")[0] for where, _, _ in demo_results}
    assert len(runs) == len([d for d in DEMO_LOGS.iterdir() if d.is_dir()]), runs
    problems = [f"{where}: {c}" for where, rep, view in demo_results for c in contradictions(rep, view)]
    assert problems == [], "\n".join(problems)


def test_one_step_of_two_ranks_gets_no_straggler_banner(tmp_path):
    """Issue 20 item 4: two ranks of one step. A late rank in the only step is no pattern: the
    rank view names neither a straggler nor an imbalance (it says why), and the checker is
    clean; with three such steps the same construction is flagged."""
    from tb_bottleneck_plugin.trace.loader import load_trace
    from tb_bottleneck_plugin.views import ranks as ranks_mod

    def rank_results(n_steps):
        out = {}
        for rank, late in ((0, 0.0), (1, 4000.0)):
            b = TraceBuilder(props=(H100,), distributed_info={"backend": "nccl", "rank": rank, "world_size": 2})
            for i in range(n_steps):
                t = T0 + i * 20_000
                b.step(i + 1, t, 15_000)
                for k in range(12):  # enough kernels to be judged
                    c = b.runtime("cudaLaunchKernel", t + 100 + k * 50 + late, 5)
                    b.kernel("gemm_kernel", t + 200 + k * 50 + late, 40, correlation=c)
                c = b.runtime("cudaLaunchKernel", t + 1000 + late, 5)
                # the collective ends at the same time on both ranks: the early rank waits
                b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 1100 + late, 9000 - late, correlation=c)
            path = tmp_path / f"r{n_steps}" / f"rank{rank}.1.pt.trace.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            b.write(path)
            out[f"rank{rank}"] = [report_mod.analyze_trace(load_trace(str(path)))]
        return ranks_mod.rank_view(out)

    one = rank_results(1)
    assert not one["flagged"] and one["recommendation"] is None
    assert "too little data" in one["not_available"]["ranks.recommendation"]
    assert check_banner_few_steps(one) == []
    three = rank_results(3)
    assert three["flagged"] and three["recommendation"] is not None
    assert check_banner_few_steps(three) == []


# ------------------------------------------------------------------------------ issue 34 item 4: one severity

def test_mfu_card_and_low_mfu_advice_one_level_apart_is_found():
    """Before issue 34 the MFU card used MFU_LOW_PCT/MFU_MODERATE_PCT as medium/low while rule
    low_mfu used them as high/medium: 29 % MFU read "low" on the card and "medium" in the
    advice (the H100 bf16 demo run), 8.7 % "medium" and "high" (GPT-2 eager)."""
    r = _clean_report()
    r["verdicts"]["mfu"] = {"value": 29.3, "severity": "low", "verdict": "29 % of H100 SXM bf16 peak", "rule": "low_mfu"}
    r["recommendations"] = [{"rule": "low_mfu", "severity": "medium", "numbers": {"mfu_pct": 29.3}, "title": "MFU 29 %",
                             "estimated_gain_pct": 46.8, "gain_source": "step_model", "what_if": "torch_compile",
                             "step_ms": 10.0, "predicted_step_ms": 5.32}]
    assert [f.split(":")[0] for f in contradictions(r)] == ["severity_disagrees"]
    r["recommendations"][0]["severity"] = "low"
    assert contradictions(r) == []
    # priced under VERDICT_MIN_GAIN_PCT the advice may read lower than the card, never louder
    r["verdicts"]["mfu"]["severity"] = "medium"
    r["recommendations"][0].update(severity="low", estimated_gain_pct=3.0, predicted_step_ms=9.7)
    assert contradictions(r) == []


@needs_traces
def test_one_severity_per_finding_on_the_shared_traces():
    """The MFU card and rule low_mfu, the Input card and rules input_bound/pageable_h2d, read
    one severity (issue 34 item 4); the values here are computed from the report's numbers
    with the thresholds, independently of analysis/input_bound.py and flops.mfu_severity."""
    seen = set()
    for rel in SHARED:
        rep = real_report(rel)
        recs = {r["rule"]: r for r in rep["recommendations"]}
        mfu = rep["verdicts"]["mfu"]
        if "low_mfu" in recs:
            value = rep["flops"]["mfu_pct"]
            want = "medium" if value < T.MFU_LOW_PCT else "low"
            assert mfu["severity"] == want and recs["low_mfu"]["severity"] in (want, "info"), (rel, mfu, recs["low_mfu"])
            seen.add("low_mfu")
        if "pageable_h2d" in recs:
            inp = rep["input"]
            transfer = inp["input_transfer_pct"]
            want = "high" if transfer >= 20 else "medium" if transfer >= 5 else "low"
            card = rep["verdicts"]["input_bound"]
            assert inp["input_bound_pct"] < T.INPUT_BOUND_MODERATE_PCT
            assert card["severity"] == want != "ok", (rel, card)  # before: a green "not input-bound"
            assert f"{transfer:.1f} % of the step in synchronous input copies" in card["verdict"], card
            assert card["input_transfer_pct"] == pytest.approx(transfer)
            assert recs["pageable_h2d"]["severity"] in (want, "info"), (rel, recs["pageable_h2d"])
            seen.add("pageable_h2d")
        assert check_severity_disagrees(rep) == [], rel
    assert seen == {"low_mfu", "pageable_h2d"}  # GPT-2 eager, bf16 demo; resnet50 num_workers=4


def pageable_copy_steps(tmp_path: Path) -> dict:
    """4 steps of 1000 µs, each a pageable host-to-device copy of 450 µs (its call blocks the
    host) that no kernel overlaps, then 12 GEMM kernels of 35 µs: no DataLoader at all."""
    b = TraceBuilder(props=(H100,))
    profiler_span(b, T0 - 100, 4 * 1000 + 300)
    for s in range(4):
        t0 = T0 + s * 1000
        b.step(s + 1, t0, 1000)
        b.cpu("aten::copy_", t0 + 5, 460)
        corr = b.runtime("cudaMemcpyAsync", t0 + 10, 455)
        b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                         "tid": 7, "ts": t0 + 15, "dur": 450,
                         "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 1 << 26}})
        for k in range(12):
            t = t0 + 470 + k * 40
            b.cpu("aten::mm", t, 30)
            b.launch("void big_gemm_kernel<float>", t + 2, t + 8, 35)
    return _report(b, tmp_path, "pageable_copies")


def test_large_pageable_copies_are_judged_high_on_the_card_and_the_advice(tmp_path):
    """Issue 34 item 4's case: a green "not input-bound" Input card beside a large pageable-H2D
    recommendation. By hand: 450 µs of each 1000 µs step in a copy no kernel hides = 45.0 %;
    on the input-bound scale (>= INPUT_BOUND_HIGH_PCT) high, for the card and the advice."""
    rep = pageable_copy_steps(tmp_path)
    assert rep["input"]["input_bound_pct"] == 0.0
    assert rep["input"]["input_transfer_pct"] == pytest.approx(100 * 450 / 1000)
    card = rep["verdicts"]["input_bound"]
    assert card["severity"] == "high" and card["input_transfer_pct"] == pytest.approx(45.0)
    assert card["verdict"] == ("not waiting for the DataLoader, but 45.0 % of the step in synchronous input copies "
                               "(pageable memory)"), card
    first = rep["recommendations"][0]
    assert first["rule"] == "pageable_h2d" and first["severity"] == "high", first
    assert check_severity_disagrees(rep) == [] and contradictions(rep) == []


def test_a_folded_warning_group_and_a_green_headline_card_are_found():
    """layout_disagrees finds a warning card folded into one line, and the card of the headline's
    own rule shown green (a hand-made report; judge/layout.py makes neither)."""
    from tb_bottleneck_plugin.judge import layout

    rep = {"verdicts": {"input_bound": {"severity": "high", "rule": "input_bound", "value": 40.0, "unit": "pct",
                                        "verdict": "highly input-bound"},
                        "sync": {"severity": "ok", "rule": "synchronization", "value": 1.0, "unit": "pct", "verdict": "ok"}},
           "verdict": {"healthy": False, "fix": {"rule": "input_bound"}}}
    rep["layout"] = layout.report_layout(rep)
    assert check_layout_disagrees(rep) == []
    assert [g["judged"] for g in rep["layout"]["groups"]] == [True, False]
    rep["layout"]["groups"][0]["judged"] = False
    assert check_layout_disagrees(rep) == ["group input is one line although ['input_bound'] warn"]
    rep["layout"] = layout.report_layout(rep)
    rep["verdict"]["fix"]["rule"] = "synchronization"
    assert check_layout_disagrees(rep) == ["the headline fixes synchronization but no card of that rule warns: sync ok"]
