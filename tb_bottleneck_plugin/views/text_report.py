"""The report for a terminal (`tb-bottlenecks report`): run and worker summaries first,
then each span; numbers with units that fit, words rather than report keys.

Pure formatting of the report objects of `report.py` (docs/report-schema.md); nothing
here computes a metric.
"""
from __future__ import annotations

import math

import posixpath
from typing import Dict, Iterable, List, Optional

from ..analysis.accelerators import accelerator_words
from ..analysis.devices import label as device_label
from ..judge.recommendations import _is_amd
from ..report import not_available_label

_PLURALS = {"memcpy": "memcpys", "memset": "memsets"}
# Step-time categories (metrics §2) as the tab's legend names them.
_CATEGORY_WORDS = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "communication": "Communication",
                   "runtime": "Runtime", "dataloader": "DataLoader", "cpu_exec": "CPU Exec", "other": "Other (idle)"}


def plural(count, word: str, words: Optional[str] = None) -> str:
    """'1 kernel', '2 kernels', '1,234 CPU events'."""
    n = int(count or 0)
    many = words or _PLURALS.get(word) or word + "s"
    return f"{n:,} {word if n == 1 else many}"


def duration(us) -> str:
    """µs as a duration with a unit that fits: '850 µs', '12.3 ms', '4.56 s'."""
    if us is None:
        return "n/a"
    us = float(us)
    if abs(us) < 1000:
        return f"{us:.3g} µs" if us else "0 µs"
    if abs(us) < 1_000_000:
        return f"{us / 1000:.3g} ms" if abs(us) < 10_000 else f"{us / 1000:.1f} ms"
    return f"{us / 1_000_000:.2f} s"


def size(nbytes) -> str:
    """Bytes with a binary unit: '512 B', '3.5 MiB', '2.60 GiB'."""
    if nbytes is None:
        return "n/a"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.2f} {unit}" if unit == "GiB" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"  # not reached


def pct(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def flop_text(flops: float, per_s: bool = False) -> str:
    """FLOPs (or FLOP/s) with the unit scaled, 3 significant digits, never an exponent:
    '8.19 GFLOP', '46.5 TFLOP/s', '4.92 MFLOP/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0)):
        if abs(flops) >= scale or not prefix:
            x = flops / scale
            digits = 0 if abs(x) >= 100 or x == 0 else max(0, 2 - int(math.floor(math.log10(abs(x)))))
            return f"{x:.{digits}f} {prefix}FLOP" + ("/s" if per_s else "")
    return "n/a"


def headline_text(value, unit: str) -> str:
    """A headline number (analysis/units.py ``Metric``) in its unit: '12.34%', '2.60 GiB', '12.3 ms'."""
    if value is None:
        return "n/a"
    if unit == "%":
        return pct(value)
    if unit == "bytes":
        return size(value)
    if unit == "us":
        return duration(value)
    if unit == "TFLOP/s":
        return flop_text(value * 1e12, per_s=True)
    return f"{value:.3g}" + (f" {unit}" if unit else "")


def _headline_lines(rep: dict) -> List[str]:
    """One line per headline number whose unit asks for a plain line (``Metric.text``; the
    built-in ones have their own lines above), when the report has it: 'Runtime share 9.33%'."""
    from .headline import metrics

    out = []
    for m in metrics():
        if not m.text or m.get is None:
            continue
        value = m.get(rep)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{m.label} {headline_text(float(value), m.unit)}")
    return out


def format_report(rep: dict, indent: str = "", heading: Optional[str] = None) -> str:
    """One report (a span, or a worker/run summary) as text; `heading` is its first line
    (by default the trace file it came from)."""
    lines: List[str] = []
    add = lines.append
    add(f"{indent}{heading if heading is not None else rep.get('source')}")
    indent += "  "
    for line in verdict_lines(rep):
        add(f"{indent}{line}")
    t = rep.get("trace") or {}
    if t:
        counts = ", ".join([plural(t.get("kernels"), "kernel"), plural(t.get("memcpys"), "memcpy"),
                            plural(t.get("memsets"), "memset"), plural(t.get("runtime_calls"), "runtime call"),
                            plural(t.get("cpu_events"), "CPU event"), plural(t.get("memory_events"), "memory event")])
        dur = t.get("duration_us")
        add(f"{indent}{plural(t.get('events'), 'event')}: {counts}" + (f"; {duration(dur)} of trace" if dur else ""))
        gpus = t.get("gpu_devices") or []
        if gpus:  # named as everywhere else: "GPU 2: NVIDIA A100", "GPU 0: unknown GPU"
            add(f"{indent}devices: " + ", ".join(device_label(d, rep, named=True) for d in gpus))
        elif t.get("accelerators"):  # MTIA, XPU, ...: named with their events, not "CPU-only"
            add(f"{indent}{not_available_label('gpu')}: " + str((rep.get("not_available") or {}).get("gpu")
                                                          or accelerator_words(t["accelerators"])))
        else:
            add(f"{indent}CPU-only trace: no GPU activity")
        for w in dict.fromkeys(t.get("warnings") or []):  # e.g. a step clipped to the recorded activity
            add(f"{indent}warning: {w}")
    st = rep.get("steps")
    if st:
        if st.get("found"):
            numbers = list(st.get("numbers") or [])
            unique = list(dict.fromkeys(numbers))  # a summary lists each number once (ranks share them)
            windows = max(len(numbers), int(st.get("count") or 0))  # count: the included steps of all spans
            add(f"{indent}steps {unique}" + (f" (numbers repeated across spans: {windows} step windows)"
                                               if len(unique) < windows else "") + (
                "; excluded " + ", ".join(f"{e.get('number')} ({e.get('reason')})" for e in st.get("excluded", []))
                if st.get("excluded") else ""))
        else:
            add(f"{indent}no steps found (no ProfilerStep#N): the whole trace is one window")
    if rep.get("avg_step_us") is not None:
        add(f"{indent}average step {duration(rep['avg_step_us'])}: " + ", ".join(
            f"{_CATEGORY_WORDS.get(k, k)} {v:.1f}%" for k, v in (rep.get("breakdown_pct") or {}).items() if v))
    inp = rep.get("input") or {}
    if inp.get("input_bound_pct") is not None:
        add(f"{indent}input-bound {inp['input_bound_pct']:.2f}% ({inp.get('verdict')})")
    cores = "matrix cores" if _is_amd(rep) else "Tensor Cores"  # AMD's word for its MFMA units
    for dev, g in (rep.get("gpu") or {}).items():
        parts = [f"{label} {g[key]:.2f}%" for key, label in (
            ("utilization_pct", "utilization"), ("est_sm_efficiency_pct", "estimated SM efficiency"),
            ("est_achieved_occupancy_pct", "estimated occupancy"), ("tensor_core_pct", cores))
            if g.get(key) is not None]
        add(f"{indent}{device_label(dev, rep)}: " + (", ".join(parts) if parts else "n/a"))
    launch = rep.get("launch") or {}
    if st and st.get("found") and launch.get("kernels_per_step") is not None and (t.get("kernels") or not t):
        kps = launch["kernels_per_step"]
        add(f"{indent}kernel launches: " + (plural(round(kps), "kernel") if abs(kps - round(kps)) < 0.05
                                            else f"{kps:,.1f} kernels") + " per step"
            + (f", {pct(launch.get('launch_pct'), 1)} of step time in launch calls"
               if launch.get("launch_pct") is not None else ""))
    sync = rep.get("sync") or {}
    if sync.get("sync_pct"):
        busy = sync.get("gpu_busy_during_sync_pct")
        refill = sync.get("sync_refill_idle_pct")
        add(f"{indent}host waits on the GPU (sync calls): {pct(sync['sync_pct'], 1)} of step time"
            + (f", the GPU busy {pct(busy, 0)} of that wait" if busy is not None else "")
            + (f", then idle {pct(refill, 1)} of step time until the host launches again" if refill else ""))
    for line in _sync_and_input_lines(rep):
        add(f"{indent}{line}")
    for line in _flops_lines(rep) + _compilation_lines(rep) + _collective_lines(rep):
        add(f"{indent}{line}")
    for key, m in (rep.get("memory") or {}).items():
        text = f"{indent}memory {device_label(key, rep)}: peak allocated {size(m.get('peak_allocated_bytes'))}"
        if m.get("allocated_is_relative"):
            text += " (relative to the start of the trace)"
        reserved = m.get("peak_reserved_bytes")
        # CPU [memory] events record no reserved memory (their 0 means unknown)
        if reserved and key != "cpu":
            text += f", peak reserved {size(reserved)}"
        if m.get("capacity_bytes"):
            text += f" of {size(m['capacity_bytes'])}"
        if m.get("slack_fragmentation_pct") is not None:
            text += f", allocator slack {m['slack_fragmentation_pct']:.1f}%"
        add(text)
    for line in _memory_peak_lines(rep):
        add(f"{indent}{line}")
    for line in _headline_lines(rep):
        add(f"{indent}{line}")
    for rec in rep.get("recommendations") or []:
        add(f"{indent}[{rec.get('severity')}] {rec.get('title')}{_gain_words(rec)}")
        add(f"{indent}    -> {rec.get('action')}")
    labels = rep.get("not_available_labels") or {}
    # one line per cause, not per metric: a CPU-only trace has a dozen n/a numbers and few causes
    by_cause: dict = {}
    for key, why in (rep.get("not_available") or {}).items():
        by_cause.setdefault(str(why), []).append(labels.get(key) or not_available_label(key))
    for why, what in by_cause.items():
        add(f"{indent}n/a {'; '.join(what)}: {why}")
    return "\n".join(lines)


_HOLDER_WORDS = {"resident_before_window": "resident", "activations": "activations", "gradients": "gradients",
                 "optimizer_state": "optimizer state", "optimizer_temporaries": "optimizer temporaries",
                 "other_temporaries": "other temporaries"}


def _memory_peak_lines(rep: dict) -> List[str]:
    """Memory at the peak (METRICS.md §7): the live set by category, the top holders, the
    checkpointing candidates and what fits."""
    out = []
    devices = rep.get("memory_peak") or {}
    gpu = any(k != "cpu" for k in devices)
    for key, e in devices.items():
        if not isinstance(e, dict) or (gpu and key == "cpu"):  # the host's few bytes beside a GPU's
            continue
        cats = e.get("categories") or {}
        parts = [f"{_HOLDER_WORDS.get(k, k)} {size(v)}" for k, v in cats.items() if v]
        if cats.get("resident_before_window") is None:
            parts.append("resident n/a")
        where = f" (step {e['peak_step']})" if e.get("peak_step") is not None else ""
        text = f"memory at the peak {device_label(key, rep)}{where}: {size(e.get('peak_allocated_bytes'))} = " \
            + ", ".join(parts)
        if e.get("headroom_bytes") is not None:
            text += f"; headroom {size(e['headroom_bytes'])}"
        scale = e.get("batch_scale_fit_estimate")
        if isinstance(scale, (int, float)):
            text += f"; a batch {scale:.1f}x as large would fit (estimate: activations linear in the batch)"
        out.append(text)
        for h in (e.get("holders") or [])[:3]:
            out.append(f"    {size(h['bytes'])} {_HOLDER_WORDS.get(h['category'], h['category'])}: {h['op']}"
                       f" in {h['module']} at {h['line']}")
        snap = e.get("snapshot") if isinstance(e.get("snapshot"), dict) else None
        if snap:
            out.append(f"    CUDA memory snapshot: {size(snap.get('allocated_bytes'))} allocated, "
                       f"{size(snap.get('free_bytes'))} free in {size(snap.get('reserved_bytes'))} reserved")
            for b in (snap.get("largest_blocks") or [])[:3]:
                out.append(f"      {size(b.get('bytes'))} block allocated at {(b.get('frames') or ['(no frames)'])[0]}")
        cands = e.get("checkpoint_candidates") or []
        if cands:
            out.append("    activation-checkpointing candidates: "
                       + ", ".join(f"{c['module']} {size(c['activation_bytes'])}"
                                   + (f" (recompute {duration(c['recompute_gpu_us_per_step'])}/step)"
                                      if isinstance(c.get("recompute_gpu_us_per_step"), (int, float)) else "")
                                   for c in cands))
    return out


def verdict_lines(rep: dict) -> List[str]:
    """The verdict on top (METRICS.md §19 "Verdict"): the sentence, then the first fix and the
    predicted step; nothing when the report has none."""
    v = rep.get("verdict")
    if not isinstance(v, dict) or not v.get("sentence"):
        return []
    share = v.get("share_pct")
    out = [f"verdict: {v['sentence']}"
           + (f" (its fix gives back {share:.0f} % of the step)" if isinstance(share, (int, float)) else "")]
    fix = v.get("fix") if isinstance(v.get("fix"), dict) else None
    if fix:
        before, after = fix.get("step_ms"), fix.get("predicted_step_ms")
        text = f"first fix: {fix.get('code') or fix.get('title')}"
        if isinstance(before, (int, float)) and isinstance(after, (int, float)):
            text += f" -> {'estimated' if fix.get('estimate') else 'predicted'} step {before:.2f} -> {after:.2f} ms"
        out.append(text)
    return out


def _gain_words(rec: dict) -> str:
    """ " (predicted step 46.9 -> 21.0 ms, -55 %)" from the step model, else the rule's estimate."""
    gain, before, after = rec.get("estimated_gain_pct"), rec.get("step_ms"), rec.get("predicted_step_ms")
    if rec.get("gain_source") == "memory" and isinstance(rec.get("frees_bytes"), (int, float)):
        return f" (frees about {size(rec['frees_bytes'])} at the peak)"
    if not isinstance(gain, (int, float)):
        return ""
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return f" (predicted step {before:.1f} -> {after:.1f} ms, -{gain:.0f} %)"
    return f" (could give back up to {gain:.0f}% of the step)" if gain >= 1 else ""


WHAT_IF_PARTS_SHOWN = 6


def format_what_if(rep: dict, indent: str = "", heading: Optional[str] = None) -> str:
    """The step model's what-if table (METRICS.md §19): today's step, each fix's predicted step
    and saving, all fixes together, the ceiling, the critical path's largest parts."""
    lines = [f"{indent}{heading}"] if heading else []
    sm = rep.get("step_model")
    if not isinstance(sm, dict) or not sm.get("steps"):
        why = (rep.get("not_available") or {}).get("step_model") or "no step model"
        lines.append(f"{indent}what-if: n/a: {why}")
        return "\n".join(lines)
    n = sm["steps"]
    err = sm.get("model_error_pct")
    lines.append(f"{indent}What would each fix buy? today {sm['step_us'] / n / 1000:.2f} ms per step over "
                 f"{plural(n, 'step')}" + (f" (the model reproduces it within {abs(err):.1f} %)"
                                            if isinstance(err, (int, float)) else ""))
    width = max([len(r.get("label") or "") for r in sm.get("what_if") or []] + [10])
    for r in sm.get("what_if") or []:
        rule = next((f"  [{x.get('rule')}]" for x in rep.get("recommendations") or []
                     if isinstance(x, dict) and x.get("what_if") == r["id"]), "")
        lines.append(f"{indent}  {r.get('label') or r['id']:<{width}}  -{r['saving_us'] / n / 1000:7.2f} ms "
                     f"({r['saving_pct'] or 0:5.1f} %) -> {r['predicted_step_ms']:.2f} ms{rule}")
    a = sm.get("all_fixes") or {}
    if a.get("ids"):
        lines.append(f"{indent}  {'all fixes together':<{width}}  -{a['saving_us'] / n / 1000:7.2f} ms "
                     f"({a['saving_pct'] or 0:5.1f} %) -> {a['predicted_step_ms']:.2f} ms  ({', '.join(a['ids'])})")
    c = sm.get("ceiling")
    if isinstance(c, dict):
        lines.append(f"{indent}  ceiling (a bound, not advice): {c['label']}: -> {c['predicted_step_ms']:.2f} ms")
    parts = sorted(((k, v) for k, v in (sm.get("critical_path_us") or {}).items() if v and v > 0),
                   key=lambda kv: -kv[1])[:WHAT_IF_PARTS_SHOWN]
    if parts:
        lines.append(f"{indent}  critical path per step: " + ", ".join(f"{k} {v / n / 1000:.2f} ms" for k, v in parts))
    for r in sm.get("what_if") or []:
        lines.append(f"{indent}  assumption {r['id']}: {r.get('assumption')}")
    return "\n".join(lines)


def format_what_if_logdir(logdir, results: Dict[str, dict], combine, *, single_file: bool = False) -> str:
    """``format_what_if`` for each headline report: the file, else each run's summary (one span:
    the span's report)."""
    blocks = []
    for run in logdir.runs:
        ready = [s for w in run.workers for s in w.spans if s.url in results]
        if not ready:
            continue
        if len(ready) == 1:
            rep = results[ready[0].url]["report"]
            heading = posixpath.basename(ready[0].url) if single_file else f"run {_run_name(run, logdir)}"
        else:
            rep = combine([results[s.url] for s in ready], run=run.name)["report"]
            heading = f"run {_run_name(run, logdir)} ({plural(len(ready), 'span')})"
        blocks.append(format_what_if(rep, heading=heading))
    return "\n\n".join(blocks)


def _sync_and_input_lines(rep: dict) -> List[str]:
    """The user's own lines behind the sync and DataLoader waits (METRICS §17)."""
    src = rep.get("source_attribution") or {}
    out = []
    for kind, words in (("sync", "waits on the GPU"), ("dataloader", "waits for the DataLoader")):
        for r in ((src.get("bottlenecks") or {}).get(kind) or [])[:1]:
            if isinstance(r, dict) and r.get("frame") and (r.get("pct") or 0) >= 0.1:
                out.append(f"source: {r['frame']} {words}"
                           + (f" ({r['op']})" if kind == "sync" and r.get("op") else "")
                           + f": {pct(r.get('pct'), 1)} of step time")
    return out


def _flops_lines(rep: dict) -> List[str]:
    """MFU (the server's words) and the roofline split of the step (METRICS §15)."""
    f = rep.get("flops") or {}
    if not f or not f.get("flops"):
        return []
    v = (rep.get("verdicts") or {}).get("mfu") or {}
    head = (f"MFU {v['verdict']}" if v.get("value") is not None and v.get("verdict")
            else f"{f.get('gflops_per_s') or 0:,.0f} GFLOP/s over the steps (MFU n/a: "
            + str((rep.get("not_available") or {}).get("flops.mfu_pct") or "no peak") + ")")
    split = f.get("bound_split_pct") or {}
    bound = ", ".join(f"{k}-bound {v:.0f}%" for k, v in split.items() if k != "unknown" and v and round(v))
    return [f"{head}; {flop_text(f.get('flops_per_step') or 0)} per step"
            + (f"; kernels {bound} of the step" if bound else "")]


def _compilation_lines(rep: dict) -> List[str]:
    """torch.compile regions, breaks and recompiles (METRICS §16)."""
    c = rep.get("compilation") or {}
    if not c.get("has_regions"):
        return []
    parts = [f"compiled {pct(c.get('compiled_pct'), 0)} of the step, eager {pct(c.get('eager_pct'), 0)}"]
    if c.get("compile_pct"):
        parts.append(f"compiling {pct(c.get('compile_pct'), 0)}")
    breaks = c.get("breaks_per_step")
    if isinstance(breaks, (int, float)):
        regions = ", ".join(r["id"] for r in c.get("broken_regions") or [])
        parts.append(f"{breaks:g} graph break(s) per step" + (f" (in {regions})" if regions else ""))
    if c.get("steady_recompiles"):
        ids = ", ".join(r["id"] for r in c.get("recompile_ids") or [] if r.get("steady"))
        parts.append(f"{c['steady_recompiles']} recompile(s) in the steps ({ids})")
    if c.get("graph_launches"):
        parts.append(f"{c['graph_launches']} CUDA graph replays")
    return ["torch.compile: " + "; ".join(parts)]


def _collective_lines(rep: dict) -> List[str]:
    """Bandwidth per collective kind against the link (METRICS §18)."""
    from .ranks import gbps

    c = rep.get("collectives") or {}
    link = c.get("link") or {}
    out = []
    for k in c.get("kinds") or []:
        if not k.get("calls"):
            continue
        text = f"{k['kind']}: {plural(k['calls'], 'call')}"
        if k.get("bytes_per_call") is not None:
            text += f", {size(k['bytes_per_call'])} per call"
        if k.get("busbw_gbps") is not None:
            text += f", busbw {gbps(k['busbw_gbps'])} GB/s"
            if k.get("link_pct") is not None and link.get("gbps"):
                text += f" ({k['link_pct']:.1f}% of {link.get('link')} {link['gbps']:g} GB/s"
                text += (", link assumed" if link.get("scope_assumed") else "") + ")"
        if k.get("exposed_us") is not None:
            text += f", exposed {duration(k['exposed_us'])}"
        out.append("collective " + text)
    if out and c.get("time_includes_wait"):
        what = "gloo: span durations" if c.get("source") == "cpu_spans" else "kernel durations"
        out.append(f"  (one rank's {what} include waiting for its peers: bandwidths are lower bounds)")
    return out


def _run_name(run, logdir) -> str:
    """A run at the root of the path is named '.' by discovery: show the directory's name."""
    if run.name in ("", "."):
        return posixpath.basename(str(logdir.url).rstrip("/")) or str(logdir.url)
    return run.name


def _span_heading(run, worker, span, rep: dict) -> str:
    name = posixpath.basename(str(rep.get("source") or span.url))
    return f"worker {worker.name}, span {span.name}" + ("" if name == span.name else f": {name}")


def format_logdir(logdir, results: Dict[str, dict], combine, *, single_file: bool = False) -> str:
    """Every run of a discovered logdir: the run header with its workers, the run
    summary (and worker summaries when a run has several workers), then each span.
    `results`: span url -> analyze_span result; `combine`: report.combine_results."""
    if single_file:
        (run, worker, span), = [(r, w, s) for r in logdir.runs for w in r.workers for s in w.spans]
        if span.url in results:
            return format_report(results[span.url]["report"], heading=posixpath.basename(span.url))
        return ""
    blocks: List[str] = []
    for run in logdir.runs:
        spans = [(w, s) for w in run.workers for s in w.spans]
        ready = [(w, s) for w, s in spans if s.url in results]
        workers = ", ".join(f"{w.name} ({plural(len(w.spans), 'span')})" for w in run.workers)
        lines = [f"run {_run_name(run, logdir)}: {plural(len(run.workers), 'worker')}: {workers}"]
        if len(ready) > 1:
            summary = combine([results[s.url] for _, s in ready], run=run.name,
                              worker=run.workers[0].name if len(run.workers) == 1 else None)["report"]
            lines.append(format_report(summary, indent="  ",
                                       heading=f"run summary ({plural(len(ready), 'span')})"))
            if len(run.workers) > 1:
                # Distributed runs: every rank side by side, the straggler named (metrics §12).
                from . import ranks

                by_worker = {w.name: [results[s.url] for s in w.spans if s.url in results] for w in run.workers}
                lines.append(ranks.format_ranks_text(ranks.rank_view(by_worker), indent="  "))
                for w in run.workers:
                    mine = [results[s.url] for s in w.spans if s.url in results]
                    if len(mine) > 1:
                        rep = combine(mine, run=run.name, worker=w.name)["report"]
                        lines.append(format_report(rep, indent="  ",
                                                   heading=f"worker {w.name} summary ({plural(len(mine), 'span')})"))
        for w, s in ready:
            rep = results[s.url]["report"]
            lines.append(format_report(rep, indent="  ", heading=_span_heading(run, w, s, rep)))
        blocks.append("\n\n".join(lines))
    return "\n\n".join(blocks)


def section_errors(results: Iterable[dict]) -> List[str]:
    """One line per analysis section that failed: '<file>: internal error in <section>: ...'."""
    out = []
    for result in results:
        rep = result.get("report") or {}
        for e in rep.get("errors") or []:
            out.append(f"{rep.get('source')}: {e.get('error')}")
    return out
