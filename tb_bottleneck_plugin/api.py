"""The Python API, for notebooks and scripts: the same analyses as the tab and
`tb-bottlenecks`, as Python objects and pandas DataFrames.

    import tb_bottleneck_plugin as tbb
    from tb_bottleneck_plugin.api import compare

    rep = tbb.analyze("runs/my_experiment")     # a trace file, a run directory or a logdir (or gs://...)
    rep                                         # in Jupyter: the headline cards and recommendations
    rep.cards["input_bound"]["value"]           # the server's verdicts (report["verdicts"])
    rep.recommendations                         # most important first
    rep.findings                                # the compact findings for an agent (`report --findings`)
    rep.steps_df(); rep.kernels_df(); rep.operators_df(); rep.memory_df(); rep.ranks_df(); rep.groups_df(); rep.pipeline_df()
    rep.memory_holders_df()                     # who holds the memory at the peak (category, op, module, line)
    rep.to_dict()                               # exactly what `tb-bottlenecks report PATH --json` prints
    rep.write_html("report.html")               # the single-file HTML report (`report --html`)
    compare("runs/baseline", "runs/num_workers_4").metrics_df()  # `tb-bottlenecks diff`
    # at package level the same function is tbb.compare_runs: the package's own
    # `tb_bottleneck_plugin.views.compare` is the compare.py module

examples/bottlenecks.ipynb walks through demo_logs/ with it (tests/report/test_notebook.py runs it).

One code path, the engine's (serving/engine.py), as the CLI's: `analyze` is `Engine.analyze_path`
(discovery, `report.analyze_span` per span in child processes or on Dask) and `to_dict` is
`engine.json_report`; summaries are
`report.combine_results`; `compare` is `engine.run_result` + `compare.compare`, as `diff`.
pandas is imported only inside the DataFrame methods (``pip install
"tb_bottleneck_plugin[notebook]"``): importing this module, the tab or the CLI never loads it.
"""
from __future__ import annotations

import html
import json
import math
import os
from typing import Dict, List, Optional, Union

NOTEBOOK_EXTRA = 'pip install "tb_bottleneck_plugin[notebook]"'
_SEVERITY_COLOURS = {  # style.css's --red/--amber/--green (light theme) and their backgrounds
    "high": ("#c5221f", "#fce8e6"), "medium": ("#a05a00", "#fef3e0"), "low": ("#a05a00", "#fef3e0"),
    "info": ("#1a73e8", "#e8f0fe"), "ok": ("#137333", "#e6f4ea"),
}

__all__ = ["analyze", "compare", "Report", "Comparison", "NOTEBOOK_EXTRA"]


def _pandas():
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(f"DataFrames need pandas: {NOTEBOOK_EXTRA}") from exc
    return pandas


def _peak_env(peak_tflops) -> Optional[str]:
    """``peak_tflops`` as BOTTLENECKS_PEAK_TFLOPS text (analysis/peaks.user_peaks):
    989 (every precision), "bf16=989,hbm=3350" or {"bf16": 989, "hbm": 3350}."""
    if peak_tflops is None:
        return None
    if isinstance(peak_tflops, dict):
        return ",".join(f"{k}={float(v):g}" for k, v in peak_tflops.items())
    if isinstance(peak_tflops, (int, float)):
        if not (math.isfinite(peak_tflops) and peak_tflops > 0):
            raise ValueError(f"peak_tflops must be a positive number, got {peak_tflops!r}")
        return f"{float(peak_tflops):g}"
    return str(peak_tflops)


def analyze(path_or_url: str, *, jobs: Optional[int] = None, dask: Optional[str] = None,
            peak_tflops: Union[None, float, str, Dict[str, float]] = None,
            memory: Optional[str] = None, debug: bool = False) -> "Report":
    """Analyse a trace file, a run directory or a logdir (local path or URL such as
    ``gs://bucket/prefix``) exactly as ``tb-bottlenecks report`` does.

    ``jobs``: spans analysed at once, one process each (default: the cores; 1: in this
    process). ``dask``: a Dask scheduler address (``tcp://host:8786``) to analyse on.
    ``peak_tflops``: the GPU's dense peak for MFU when the built-in table does not know it
    (989, ``"bf16=989,hbm=3350"`` or ``{"bf16": 989, "hbm": 3350}``; as the environment
    variable BOTTLENECKS_PEAK_TFLOPS, which it sets for the analysis; Dask workers read
    their own environment). ``memory``: the memory budget of concurrent analyses ("8G").

    Raises ``ValueError`` when nothing could be analysed (the CLI's exit code 2), with the
    CLI's one-line reason; files that failed beside analysed ones are in ``Report.errors``.
    """
    from .analysis import peaks
    from .serving import engine

    budget = None
    if memory is not None:
        budget = engine.parse_bytes(str(memory))
    if jobs is not None and jobs <= 0:
        raise ValueError("jobs must be positive")
    peak = _peak_env(peak_tflops)
    saved = os.environ.get(peaks.ENV_PEAK)
    if peak is not None:
        os.environ[peaks.ENV_PEAK] = peak  # the analysis children inherit it
    try:
        analysis = engine.Engine(str(path_or_url), jobs=jobs, memory_budget=budget, dask_address=dask,
                                 debug=debug).analyze_path()
    except engine.NothingAnalysed as exc:
        raise ValueError(str(exc)) from None
    finally:
        if peak is not None:
            if saved is None:
                os.environ.pop(peaks.ENV_PEAK, None)
            else:
                os.environ[peaks.ENV_PEAK] = saved
    return Report(str(path_or_url), analysis.logdir, analysis.spans, analysis.results, analysis.errors,
                  analysis.single_file)


class Report:
    """The analysis of a trace file, a run or a logdir (`analyze`).

    ``report`` is the headline report object (docs/report-schema.md): the file's own
    report, or for a run the summary over all its spans (what the tab shows for the run).
    A logdir of several runs has no single headline: use ``runs`` and ``run(name)``; the
    DataFrames of such a Report hold every run (column ``run``)."""

    def __init__(self, path, logdir, spans, results, errors, single_file, runs=None):
        self.path = path
        self.logdir = logdir
        self._spans = spans
        self._results = results
        self.errors: List[str] = list(errors)
        self.single_file = single_file
        self._runs = [r for r in (runs if runs is not None else logdir.runs)
                      if any(s.url in results for w in r.workers for s in w.spans)]
        self._dict = None
        self._combined: Dict[str, dict] = {}

    # ------------------------------------------------------------------ selection

    @property
    def runs(self) -> List[str]:
        """The names of the analysed runs (a run at the root of the path: the directory's name)."""
        from .views import text_report

        return [text_report._run_name(r, self.logdir) for r in self._runs]

    def run(self, name: str) -> "Report":
        """The Report of one run of a logdir."""
        for r, shown in zip(self._runs, self.runs):
            if name in (r.name, shown):
                spans = [s for s in self._spans if s[0] is r]
                return Report(self.path, self.logdir, spans, self._results, [], False, runs=[r])
        raise KeyError(f"no run {name!r}; runs: {', '.join(self.runs)}")

    def _one_run(self):
        if len(self._runs) != 1:
            raise ValueError(f"{self.path} holds {len(self._runs)} runs ({', '.join(self.runs[:10])}): "
                             "pick one with .run(name)")
        return self._runs[0]

    def _ready(self, run) -> List[dict]:
        return [self._results[s.url] for w in run.workers for s in w.spans if s.url in self._results]

    def _result(self, run) -> dict:
        """The run's result with its views (`engine.summary`: its one span's, else
        `report.combine_results`)."""
        from .serving import engine

        if run.name not in self._combined:
            self._combined[run.name] = engine.summary(self._ready(run), run=run.name)
        return self._combined[run.name]

    # ------------------------------------------------------------------ the CLI's JSON

    def to_dict(self) -> dict:
        """What ``tb-bottlenecks report PATH --json`` prints (engine.json_report; NaN as None)."""
        if self._dict is None:
            from .serving import engine

            spans = [s for s in self._spans if any(s[0] is r for r in self._runs)]
            data = engine.json_report(self.logdir, spans, self._results, self.errors, self.single_file)
            if not self.single_file:
                keep = {r.name for r in self._runs}
                data = dict(data, runs=[e for e in data["runs"] if e["run"] in keep])
            self._dict = engine.json_safe(data)
        return self._dict

    def to_json(self, indent: Optional[int] = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def _run_reports(self) -> List[tuple]:
        """[(run name, the run's headline report as in to_dict, run entry or None)]."""
        data = self.to_dict()
        if self.single_file:
            return [(self.runs[0], data, None)]
        out = []
        for entry, shown in zip(data["runs"], self.runs):
            if "summary" in entry:
                rep = entry["summary"]
            else:
                reps = [w["summary"] for w in entry["workers"] if w["summary"] is not None]
                rep = reps[0] if len(reps) == 1 else None
            out.append((shown, rep, entry))
        return out

    @property
    def report(self) -> dict:
        """The headline report object (docs/report-schema.md) of the file or the run."""
        self._one_run()
        return self._run_reports()[0][1]

    @property
    def cards(self) -> Dict[str, dict]:
        """The verdicts of the headline cards, decided on the server (report["verdicts"]):
        {card id: {value, unit, severity, verdict, thresholds, rule, ...}}."""
        return self.report.get("verdicts") or {}

    @property
    def recommendations(self) -> List[dict]:
        """The recommendations, most important first (report["recommendations"])."""
        return self.report.get("recommendations") or []

    @property
    def findings(self) -> dict:
        """The findings (METRICS.md §20, views/findings.py): the verdict, each recommendation
        with its predicted gain (ms per step and %), severity, evidence ids into the report,
        the assumptions; at most 8 KB. As ``tb-bottlenecks report --findings`` prints them for
        one file or one run."""
        from .views import findings as findings_view

        return findings_view.findings(self.report)

    # ------------------------------------------------------------------ DataFrames

    def _frame(self, rows: List[dict], columns_first=("run",)):
        pd = _pandas()
        frame = pd.DataFrame(rows)
        first = [c for c in columns_first if c in frame.columns]
        return frame[first + [c for c in frame.columns if c not in first]] if len(frame.columns) else frame

    def steps_df(self):
        """One row per included step: the step-time breakdown in µs (``total_us`` and each
        category) and ``input_bound_pct``; a summary's rows are per step number across its
        spans (means, with ``spans``, ``min_*``/``max_*``)."""
        rows = []
        for run, rep, _ in self._run_reports():
            if rep is None:
                continue
            inp = {r.get("step"): r for r in ((rep.get("input") or {}).get("per_step") or [])}
            for row in rep.get("breakdown_per_step") or []:
                extra = {k: v for k, v in inp.get(row.get("step"), {}).items() if k not in row}
                rows.append({"run": run, **row, **extra})
        return self._frame(rows, ("run", "step"))

    def kernels_df(self):
        """The kernel table (up to 200 kernels by total time, the tab's kernels route; the
        report's ``occupancy.kernels`` are its first 50)."""
        rows = []
        for r, run in zip(self._runs, self.runs):
            rows += [{"run": run, **k} for k in (self._result(r).get("kernels") or [])]
        return self._frame(rows)

    def operators_df(self, group: str = "op"):
        """The Operator view over the included steps (the tab's operators route, METRICS.md
        §13): one row per op name (``group="op_shape"``: per op and input shape)."""
        from .analysis import operators

        if group not in ("op", "op_shape"):
            raise ValueError("group must be 'op' or 'op_shape'")
        rows = []
        for r, run in zip(self._runs, self.runs):
            view = self._result(r).get("operator_view")
            if isinstance(view, dict):
                rows += [{"run": run, **row} for row in operators.view_table(view, None, group)["rows"]]
        return self._frame(rows)

    def memory_df(self):
        """One row per memory device (``cuda:0``, ``cpu``): peaks, capacity, allocator
        slack and fragmentation (report["memory"]; the per-step growth is left out)."""
        rows = []
        for run, rep, _ in self._run_reports():
            for dev, sec in ((rep or {}).get("memory") or {}).items():
                if isinstance(sec, dict):
                    rows.append({"run": run, "device": dev,
                                 **{k: v for k, v in sec.items() if not isinstance(v, (dict, list))}})
        return self._frame(rows, ("run", "device"))

    def memory_holders_df(self):
        """Who holds the memory at the peak (METRICS.md §7 "Memory at the peak"): one row per
        device and holder (category, op, nn.Module, source line) of the live set at the
        instant of peak allocated, most bytes first, with ``peak_allocated_bytes``,
        ``peak_step`` and ``pct_of_peak``; the categories alone are in
        ``report["memory_peak"][device]["categories"]``."""
        rows = []
        for run, rep, _ in self._run_reports():
            for dev, sec in ((rep or {}).get("memory_peak") or {}).items():
                if not isinstance(sec, dict):
                    continue
                peak = sec.get("peak_allocated_bytes")
                for h in sec.get("holders") or []:
                    share = 100.0 * h["bytes"] / peak if peak else None
                    rows.append({"run": run, "device": dev, **h, "pct_of_peak": share,
                                 "peak_allocated_bytes": peak, "peak_step": sec.get("peak_step")})
        return self._frame(rows, ("run", "device", "category", "op", "module", "line", "bytes"))

    def memory_timeline_df(self):
        """Allocated/reserved bytes over time (µs) per device, for runs of one trace file
        (a summary's curves are per span: analyse the file)."""
        pd = _pandas()
        frames = []
        for r, run in zip(self._runs, self.runs):
            if len(self._ready(r)) != 1:
                continue
            for dev, curve in ((self._result(r).get("memory") or {}).get("devices") or {}).items():
                f = pd.DataFrame(curve)
                f.insert(0, "device", dev)
                f.insert(0, "run", run)
                frames.append(f)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def ranks_df(self):
        """One row per rank of each multi-worker run (the ranks view, METRICS.md §12):
        step time split into compute, overlapped and exposed communication, input wait."""
        rows = []
        for run, _, entry in self._run_reports():
            for row in (((entry or {}).get("ranks") or {}).get("ranks") or []):
                rows.append({"run": run, **{k: v for k, v in row.items() if not isinstance(v, (dict, list))}})
        return self._frame(rows, ("run", "rank", "worker"))

    def groups_df(self):
        """One row per process group of each multi-worker run (METRICS.md §12 "Process
        groups"): its calls, how they were matched, its straggler, how often it was late and
        the cause by difference (``cause``: the server's sentence; ``cause_activity``,
        ``cause_diff_us``: the activity and its difference per step)."""
        rows = []
        for run, _, entry in self._run_reports():
            for g in (((entry or {}).get("ranks") or {}).get("process_groups") or []):
                st = g.get("straggler") or {}
                cause = st.get("cause") or {}
                rows.append({"run": run, "group": g.get("name"), "label": g.get("label"), "size": g.get("size"),
                             "calls": g.get("calls"), "matched_calls": g.get("matched_calls"),
                             "unmatched_calls": g.get("unmatched_calls"), "match_by": g.get("match_by"),
                             "missing_ranks": g.get("missing_ranks"), "straggler_rank": st.get("rank"),
                             "late_pct": st.get("late_pct"), "wait_caused_pct": st.get("wait_caused_pct"),
                             "straggler": st.get("sentence"), "cause": cause.get("sentence"),
                             "cause_activity": cause.get("activity"), "cause_diff_us": cause.get("diff_us"),
                             "hidden_compute": cause.get("hidden_compute")})
        return self._frame(rows, ("run", "group"))

    def pipeline_df(self):
        """One row per pipeline stage of each multi-worker run (METRICS.md §12 "Pipeline
        parallelism"): its ranks, bubble per step and share, beside the run's stage count,
        microbatches, schedule and theoretical bubble."""
        rows = []
        for run, _, entry in self._run_reports():
            pp = ((entry or {}).get("ranks") or {}).get("pipeline") or {}
            if not pp.get("available"):
                continue
            for st in pp.get("per_stage") or []:
                rows.append({"run": run, "stage": st.get("stage"), "ranks": st.get("ranks"),
                             "bubble_us_per_step": st.get("bubble_us_per_step"), "bubble_pct": st.get("bubble_pct"),
                             "busy_us_per_step": st.get("busy_us_per_step"), "stages": pp.get("stages"),
                             "microbatches": pp.get("microbatches"), "schedule": pp.get("schedule"),
                             "theoretical_bubble_pct": pp.get("theoretical_bubble_pct")})
        return self._frame(rows, ("run", "stage"))

    def _section_rows(self, section: str, table: str, key_name: Optional[str] = None):
        """Rows of ``report[section][table]`` per run (a list of dicts, or a dict keyed by
        ``key_name``); runs where the section is n/a add none (``Report.report["not_available"]``
        says why)."""
        rows = []
        for run, rep, _ in self._run_reports():
            sec = (rep or {}).get(section)
            items = sec.get(table) if isinstance(sec, dict) else None
            if isinstance(items, dict):
                items = [{key_name: k, **v} for k, v in items.items() if isinstance(v, dict)]
            for row in items or []:
                if isinstance(row, dict):
                    rows.append({"run": run, **{k: v for k, v in row.items() if not isinstance(v, dict)}})
        return self._frame(rows, ("run", key_name) if key_name else ("run",))

    def source_lines_df(self):
        """One row per line of the user's code (METRICS.md §17, traces recorded with
        ``with_stack=True`` or old ``Call stack`` args): the CPU time of the ops it called,
        the GPU time they launched, calls and kernels; empty without stacks."""
        return self._section_rows("source_attribution", "lines")

    def modules_df(self):
        """The nn.Module tree (METRICS.md §17) as rows: ``path``, ``parent``, ``depth``, self and
        total CPU time, GPU time launched, calls; empty without ``nn.Module`` frames."""
        return self._section_rows("source_attribution", "modules")

    def labels_df(self):
        """One row per ``record_function`` label (METRICS.md §17): CPU span time, the GPU time
        of the kernels launched inside it and its ``gpu_user_annotation`` time."""
        return self._section_rows("source_attribution", "labels")

    def flops_df(self):
        """FLOPs and the roofline per op class (METRICS.md §15, ``report["flops"]["by_class"]``):
        FLOPs, bytes, intensity, achieved TFLOP/s, the bound and the share of the roofline."""
        return self._section_rows("flops", "by_class", "op_class")

    def what_if_df(self):
        """One row per what-if of the step model (METRICS.md §19, ``report["step_model"]``):
        ``id``, ``label``, the recommendation ``rule`` it prices, ``saving_us``/``saving_pct``,
        ``step_ms`` and ``predicted_step_ms``, the ``assumption``; then an ``all_fixes`` row and
        the ``roofline`` ceiling (a bound, never advice) where known. Empty without a step model
        (no GPU work: ``report["not_available"]["step_model"]`` says why)."""
        rows = []
        for run, rep, _ in self._run_reports():
            sm = (rep or {}).get("step_model")
            if not isinstance(sm, dict):
                continue
            for r in sm.get("what_if") or []:
                rows.append({"run": run, **r})
            a = sm.get("all_fixes") or {}
            if a.get("ids"):
                rows.append({"run": run, "id": "all_fixes", "label": "All fixes together", "rule": None,
                             "assumption": " + ".join(a["ids"]),
                             **{k: a.get(k) for k in ("model_us", "saving_us", "saving_pct", "step_ms",
                                                      "predicted_step_ms")}})
            if isinstance(sm.get("ceiling"), dict):
                rows.append({"run": run, **sm["ceiling"]})
        return self._frame(rows, ("run", "id"))

    def collectives_df(self):
        """One row per collective kind (METRICS.md §18, ``report["collectives"]["kinds"]``):
        calls, bytes, time, algbw/busbw and the share of the link's peak where known."""
        return self._section_rows("collectives", "kinds")

    # ------------------------------------------------------------------ HTML

    def html_data(self) -> dict:
        from .views import html_report

        runs = set(id(r) for r in self._runs)
        results = {s.url: self._results[s.url] for run, _, s in self._spans
                   if id(run) in runs and s.url in self._results}
        views = html_report.run_views(self.logdir, results)
        return html_report.page_data("report", views, title=f"Bottlenecks: {self.path}", errors=self.errors)

    def write_html(self, path: str) -> int:
        """Writes the single-file HTML report (as ``report --html``); returns its size in bytes."""
        from .views import html_report

        return html_report.write_html(path, self.html_data())

    def _repr_html_(self) -> str:
        parts = []
        for run, rep, _ in self._run_reports():
            parts.append(_report_html(run, rep))
        errs = "".join(f"<li>{html.escape(str(e))}</li>" for e in self.errors)
        if errs:
            parts.append(f"<div style='color:#a05a00'>Files not analysed:<ul>{errs}</ul></div>")
        return "<div class='tbb-report'>" + "".join(parts) + "</div>"

    def __repr__(self) -> str:
        return f"<Report {self.path!r}: {len(self._runs)} run(s), {len(self._results)} trace file(s) analysed>"


def _fmt(value, unit) -> str:
    from .views import text_report

    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    if unit == "pct":
        return f"{value:.1f}%"
    if unit == "bytes":
        return text_report.size(value)
    if unit == "us":
        return text_report.duration(value)
    return f"{value:,.0f}" if unit == "count" else f"{value:g}"


def _verdict_html(rep: dict) -> str:
    """The server's verdict (report["verdict"], METRICS.md §19) on top: the sentence, the first
    fix as code and its predicted step; escaped."""
    esc = html.escape
    v = rep.get("verdict")
    if not isinstance(v, dict) or not v.get("sentence"):
        return ""
    colour = "#137333" if v.get("healthy") else "#c5221f"
    share = v.get("share_pct")
    text = (f"<div class='tbb-verdict' data-healthy='{str(bool(v.get('healthy'))).lower()}' "
            f"style='border-left:4px solid {colour};padding:6px 10px;margin:6px 0'>"
            f"<b>{esc(str(v['sentence']))}</b>"
            + (f" (its fix gives back {share:.0f} % of the step)" if isinstance(share, (int, float)) else ""))
    fix = v.get("fix") if isinstance(v.get("fix"), dict) else None
    if fix:
        before, after = fix.get("step_ms"), fix.get("predicted_step_ms")
        text += (f"<br>First fix: <code>{esc(str(fix.get('code') or fix.get('title') or ''))}</code>"
                 + (f" → {'estimated' if fix.get('estimate') else 'predicted'} step {before:.1f} → {after:.1f} ms"
                    if isinstance(before, (int, float)) and isinstance(after, (int, float)) else ""))
    return text + "</div>"


def _what_if_html(rep: dict) -> str:
    """The step model's what-if rows (METRICS.md §19) as a small table; escaped."""
    esc = html.escape
    sm = rep.get("step_model")
    if not isinstance(sm, dict) or not sm.get("what_if"):
        return ""
    rows = "".join(f"<tr><td>{esc(str(r.get('label') or r.get('id')))}</td><td>−{r['saving_pct']:.1f} %</td>"
                   f"<td>{r['predicted_step_ms']:.2f} ms</td></tr>"
                   for r in sm["what_if"] if isinstance(r, dict) and (r.get("saving_us") or 0) > 0
                   and isinstance(r.get("saving_pct"), (int, float)) and isinstance(r.get("predicted_step_ms"), (int, float)))
    if not rows:
        return ""
    return ("<table class='tbb-what-if' style='margin:4px 0'><tr><th style='text-align:left'>What would each fix buy?"
            "</th><th>saving</th><th>predicted step</th></tr>" + rows + "</table>")


def _report_html(run: str, rep: Optional[dict]) -> str:
    """The headline cards (the server's verdicts and colours) and the recommendations as
    HTML for a notebook cell; every string from the trace is escaped."""
    esc = html.escape
    if rep is None:
        return f"<h3>{esc(str(run))}</h3><p>no summary (several workers without a run summary)</p>"
    cards = []
    for cid, v in (rep.get("verdicts") or {}).items():
        if not isinstance(v, dict):
            continue
        fg, bg = _SEVERITY_COLOURS.get(str(v.get("severity")), ("#5f6368", "#f5f6f7"))
        cards.append(
            f"<div class='tbb-card' data-card='{esc(str(cid))}' data-severity='{esc(str(v.get('severity')))}' "
            f"style='border-top:4px solid {fg};background:{bg};padding:6px 10px;min-width:150px;max-width:230px'>"
            f"<div style='font-size:11px;text-transform:uppercase;color:#5f6368'>{esc(str(cid).replace('_', ' '))}</div>"
            f"<div style='font-size:20px;color:{fg}'>{esc(_fmt(v.get('value'), v.get('unit')))}</div>"
            f"<div style='font-size:12px'>{esc(str(v.get('verdict') or ''))}</div></div>")
    recs = []
    for r in rep.get("recommendations") or []:
        if not isinstance(r, dict):
            continue
        fg, _ = _SEVERITY_COLOURS.get(str(r.get("severity")), ("#5f6368", ""))
        recs.append(f"<li><b style='color:{fg}'>{esc(str(r.get('severity') or ''))}</b> "
                    f"<b>{esc(str(r.get('title') or r.get('rule') or ''))}</b><br>"
                    f"<span>{esc(str(r.get('action') or ''))}</span></li>")
    steps = rep.get("steps") or {}
    head = (f"<h3 style='margin:4px 0'>{esc(str(run))}</h3><div style='color:#5f6368'>"
            f"{esc(str(steps.get('count', 'n/a')))} steps · avg step {esc(_fmt(rep.get('avg_step_us'), 'us'))}</div>")
    return (head + _verdict_html(rep) + _what_if_html(rep)
            + "<div style='display:flex;flex-wrap:wrap;gap:8px;margin:6px 0'>" + "".join(cards) + "</div>"
            + (f"<b>Recommendations</b><ol>{''.join(recs)}</ol>" if recs else "<p>No bottleneck rule fired.</p>"))


def compare(base, cand, *, base_batch_size: Optional[float] = None, cand_batch_size: Optional[float] = None,
            batch_size: Optional[float] = None) -> "Comparison":
    """The comparison of ``tb-bottlenecks diff BASE CAND`` (compare.compare, METRICS.md §11):
    BASE and CAND are trace files or run directories (paths or URLs), or Reports of one run.

    Spelled ``from tb_bottleneck_plugin.api import compare``; at package level it is
    ``tb_bottleneck_plugin.compare_runs`` (the same function), because
    ``tb_bottleneck_plugin.views.compare`` is the compare.py module."""
    from .serving import engine
    from .views import compare as cmp_mod

    def load(side):
        if isinstance(side, Report):
            return side._result(side._one_run()), side.path
        try:
            return engine.run_result(str(side)), str(side)
        except engine.EngineError as exc:
            raise ValueError(str(exc)) from None

    (b, bl), (c, cl) = load(base), load(cand)
    out = cmp_mod.compare(b, c, base_batch_size=base_batch_size or batch_size,
                          cand_batch_size=cand_batch_size or batch_size, base_label=bl, cand_label=cl)
    return Comparison(out, b, c)


class Comparison:
    """A comparison (the compare object of docs/report-schema.md)."""

    def __init__(self, data: dict, base_result: dict, cand_result: dict):
        self._data = data
        self._base, self._cand = base_result, cand_result

    def to_dict(self) -> dict:
        return self._data

    def to_json(self, indent: Optional[int] = 1) -> str:
        return json.dumps(self._data, indent=indent, allow_nan=False)

    def __getitem__(self, key):
        return self._data[key]

    def metrics_df(self):
        """One row per headline number: base, cand, delta, rel_pct, verdict."""
        return _pandas().DataFrame(self._data.get("metrics") or [])

    def text(self, top: int = 10) -> str:
        from .views import compare as cmp_mod

        return cmp_mod.format_text(self._data, top=top)

    def write_html(self, path: str) -> int:
        from .views import html_report

        d = self._data
        views = [html_report.view_of(self._base, f"Baseline: {d['base'].get('label')}", "base"),
                 html_report.view_of(self._cand, f"Candidate: {d['cand'].get('label')}", "cand")]
        return html_report.write_html(path, html_report.page_data(
            "compare", views, compare=d, title=f"Bottlenecks: {d['base'].get('label')} vs {d['cand'].get('label')}"))

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = []
        colours = {"better": "#137333", "worse": "#c5221f"}
        for m in self._data.get("metrics") or []:
            colour = colours.get(m.get("verdict"), "#5f6368")
            unit = {"%": "pct", "us": "us", "bytes": "bytes"}.get(m.get("unit"), "")
            rows.append(f"<tr><td>{esc(str(m.get('label')))}</td><td>{esc(_fmt(m.get('base'), unit))}</td>"
                        f"<td>{esc(_fmt(m.get('cand'), unit))}</td>"
                        f"<td style='color:{colour}'>{esc(str(m.get('verdict')))}</td></tr>")
        warn = self._data.get("setup_warning")
        return ((f"<p style='color:#a05a00'>{esc(str(warn))}</p>" if warn else "")
                + "<table><tr><th>metric</th><th>base</th><th>cand</th><th></th></tr>" + "".join(rows) + "</table>")

    def __repr__(self) -> str:
        return f"<Comparison {self._data['base'].get('label')!r} -> {self._data['cand'].get('label')!r}>"
