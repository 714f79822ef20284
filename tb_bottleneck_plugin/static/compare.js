// Compare mode of the Bottlenecks tab: a baseline and a candidate (runs, optionally one
// worker/span each) side by side, from the `compare` route (compare.py, METRICS.md §11).
//
// Every judgement comes from the server: a number's direction ("lower_is_better",
// "higher_is_better", "neutral": metrics[].direction, step_time.direction, kernels/ops.directions)
// and the verdict of its change ("better"/"worse", "unchanged" within the server's noise band,
// "changed" for a neutral number, "n/a"). This file decides colours from those words only;
// it holds no numeric threshold and never reads a change's sign to judge it. Names from a trace (kernels, operators,
// runs) are inserted as text through dom.js.
//
// The selection lives in the URL hash (router.js route "compare"); index.js owns it and hands
// the view to renderCompare while the route is compare, with onSelect(next) to change it.

import {h, s, mount} from "./dom.js";
import {getCompare, getReport} from "./model.js";
import {responsive, withTooltip, niceTicks} from "./charts.js";
import {isNum, fmtPct, fmtUs, fmtUsTick, fmtBytes, fmtNum, shortenKernelName} from "./format.js";
import {CATEGORIES, CAT_NAMES} from "./defs.js";
import {load, renderError} from "./states.js";
import {mountPanel} from "./panels.js";
import {renderCards} from "./cards.js";

const ALL = "all";
const SIDES = ["base", "cand"];
const SIDE_NAMES = {base: "Baseline", cand: "Candidate"};
const TABLE_LIMIT = 200; // rows drawn per diff table (the filter finds the rest)
const catColor = (k) => `var(--c-${String(k).replace("_", "-")})`;
// Verdict word (from the server) -> colour class already defined in style.css.
const VERDICT_CLASS = {better: "sev-text-ok", worse: "sev-text-high", unchanged: "muted", changed: "muted"};
const DIRECTION_TEXT = {lower_is_better: "lower is better", higher_is_better: "higher is better", neutral: "no better/worse direction"};
const VERDICT_TEXT = {unchanged: "unchanged (within noise)"};
const REC_STATUS_CLASS = {resolved: "sev-ok", better: "sev-ok", new: "sev-high", worse: "sev-high", unchanged: "sev-low"};

// ------------------------------------------------------------ availability

/**
 * Whether the top bar's Compare button can open compare mode: it needs two comparable things,
 * two runs or one run with two spans or workers (the pickers compare span with span).
 * Returns {enabled, title}; the title says why when it is disabled.
 */
export function compareAvailability(runsPayload) {
  const runs = runsPayload && Array.isArray(runsPayload.runs) ? runsPayload.runs.filter((r) => r && typeof r.run === "string") : [];
  let things = 0;
  for (const r of runs) {
    const workers = Array.isArray(r.workers) ? r.workers : [];
    const spans = workers.reduce((n, w) => n + (w && Array.isArray(w.spans) ? w.spans.length : 0), 0);
    things += Math.max(1, spans, workers.length);
  }
  if (things > 1) return {enabled: true, title: "Compare two runs (baseline vs candidate)"};
  return {enabled: false, title: runs.length
    ? "Compare needs two runs, or a run with two spans or workers: this logdir has one run with one trace"
    : "Compare needs two runs: this logdir has none yet"};
}

// ------------------------------------------------------------ the mode

const cur = {key: null, ac: null};

/**
 * Renders compare mode into container. ctx: {runs: runs payload, sel: {base, cand} (normaliseCompare's),
 * onSelect(next sel): index.js stores it in the route and calls renderCompare again, onExit()}.
 * Called on every run-list refresh: it re-renders only when the selection or the runs changed.
 */
export function renderCompare(container, ctx, {force = false} = {}) {
  const runs = ctx.runs && Array.isArray(ctx.runs.runs) ? ctx.runs.runs : [];
  const sel = ctx.sel;
  const runState = SIDES.map((k) => {
    const r = runs.find((x) => x.run === sel[k].run);
    return r ? [r.state, r.error || null, JSON.stringify(r.workers || [])] : null;
  });
  const key = JSON.stringify([sel, runState]);
  if (!force && key === cur.key && container.querySelector(".cmp")) return;
  cur.key = key;
  if (cur.ac) cur.ac.abort();
  const ac = new AbortController();
  cur.ac = ac;

  const pick = (side, change) => ctx.onSelect({...sel, [side]: {...sel[side], ...change}});
  const controls = h("div", {class: "cmp-controls table-tools", style: {"flex-wrap": "wrap", gap: "14px", margin: "0 0 10px"}},
    sidePicker("base", sel.base, runs, pick),
    h("button", {type: "button", class: "btn", id: "bn-cmp-swap", title: "Swap baseline and candidate",
      onclick: () => ctx.onSelect({base: sel.cand, cand: sel.base})}, "⇄ Swap"),
    sidePicker("cand", sel.cand, runs, pick),
    h("button", {type: "button", class: "btn", id: "bn-cmp-exit", onclick: () => ctx.onExit && ctx.onExit()}, "Back to single run"));
  const body = h("div", {class: "cmp-body"});
  mount(container, h("div", {class: "cmp", id: "bn-compare"}, controls, body));
  if (!sel.base.run || !sel.cand.run) {
    renderError(body, {title: "Nothing to compare", message: "Compare mode needs at least one run in the logdir."});
    return;
  }
  loadCompare(body, sel, ac.signal, () => renderCompare(container, ctx, {force: true}));
}

/** The compare selection made valid for the runs (runs that exist, their workers and spans). */
export function normaliseCompare(sel, runs) {
  const names = runs.map((r) => r.run);
  const out = {};
  for (const k of SIDES) {
    const x = sel[k] || {};
    const run = names.includes(x.run) ? x.run : (k === "base" ? names[0] : names.find((n) => n !== out.base.run) || names[0]) || null;
    const r = runs.find((y) => y.run === run);
    const workers = r && Array.isArray(r.workers) ? r.workers : [];
    const w = workers.find((y) => y.worker === x.worker);
    const spans = w && Array.isArray(w.spans) ? w.spans : [];
    out[k] = {run, worker: w ? w.worker : null, span: w && spans.some((sp) => sp.span === x.span) ? x.span : null};
  }
  return out;
}

function sidePicker(side, sel, runs, pick) {
  const opt = (value, label, selected, title) => h("option", {value, selected: selected || false, title: title || null}, label);
  const run = runs.find((r) => r.run === sel.run);
  const runSel = h("select", {id: `bn-cmp-${side}-run`, "aria-label": `${SIDE_NAMES[side]} run`,
    onchange: () => pick(side, {run: runSel.value, worker: null, span: null})},
  runs.map((r) => opt(r.run, r.state === "ready" || !r.state ? r.run : `${r.run} (${r.state})`, r.run === sel.run, r.run)));
  const workers = run && Array.isArray(run.workers) ? run.workers : [];
  const workerSel = h("select", {id: `bn-cmp-${side}-worker`, "aria-label": `${SIDE_NAMES[side]} worker`,
    disabled: workers.length <= 1, onchange: () => pick(side, {worker: workerSel.value === ALL ? null : workerSel.value, span: null})},
  opt(ALL, workers.length > 1 ? "all workers" : (workers[0] ? workers[0].worker : "(none)"), !sel.worker),
  workers.length > 1 ? workers.map((w) => opt(w.worker, w.worker, w.worker === sel.worker, w.worker)) : null);
  // one worker: its spans can be picked without choosing the worker first
  const w = workers.find((x) => x.worker === sel.worker) || (workers.length === 1 ? workers[0] : null);
  const spans = w && Array.isArray(w.spans) ? w.spans : [];
  const spanSel = h("select", {id: `bn-cmp-${side}-span`, "aria-label": `${SIDE_NAMES[side]} span`,
    disabled: !w || spans.length <= 1,
    onchange: () => pick(side, spanSel.value === ALL ? {span: null} : {worker: w.worker, span: spanSel.value})},
  opt(ALL, spans.length > 1 ? `all ${spans.length} spans` : "whole run", !sel.span),
  w && spans.length > 1 ? spans.map((sp, i) => opt(sp.span, `span ${i + 1}`, sp.span === sel.span, [sp.span, sp.file].filter(Boolean).join("\n"))) : null);
  return h("div", {class: ["cmp-side", `cmp-side-${side}`], style: {display: "flex", gap: "6px", "align-items": "center"}},
    h("strong", {}, SIDE_NAMES[side]), runSel, workerSel, spanSel);
}

function loadCompare(body, sel, signal, retry) {
  // Each side's own report (cached on the server) for the verdict cards (cards.js, the single-run cards).
  const reports = SIDES.map((k) => getReport(sel[k], {signal}));
  return load(body, (opts) => getCompare(sel, {signal, ...opts}), {
    title: "Comparing…", detail: "Each side is analysed once and cached; large traces take a while the first time.",
    route: "compare", what: "this comparison", isCurrent: () => !signal.aborted, onRetry: retry,
    errorTitle: (r) => (r.status === 404 ? "Not found" : "Could not compare"),
    valid: (d) => Boolean(d && typeof d === "object" && Array.isArray(d.metrics)),
    onData: (cmp) => {
      mount(body, compareView(cmp));
      const slot = body.querySelector("#bn-cmp-cards .panel-body");
      Promise.all(reports).then((rs) => {
        if (signal.aborted || !slot) return;
        if (rs.every((x) => x.kind === "ok" && x.data && typeof x.data === "object")) {
          renderCards(slot, rs.map((x) => x.data), {labels: SIDES.map((k) => `${SIDE_NAMES[k]}: ${sideText(cmp[k])}`)});
        } else if (!rs.some((x) => x.kind === "aborted")) {
          const bad = rs.find((x) => x.kind !== "ok");
          mount(slot, h("p", {class: "note"}, `n/a: ${(bad && bad.message) || "a side's report could not be loaded"}`));
        }
      });
    },
  });
}

// ------------------------------------------------------------ formatting

/** A metric value by the unit the server gives ("us", "%", "bytes", "samples/s", "TFLOP/s", ""). */
export function fmtValue(v, unit) {
  if (!isNum(v)) return "n/a";
  if (unit === "us") return fmtUs(v);
  if (unit === "%") return fmtPct(v, 1);
  if (unit === "bytes") return fmtBytes(v);
  if (unit === "samples/s") return `${fmtNum(v, 1)}/s`;
  if (unit === "TFLOP/s") return `${fmtNum(Number(v.toPrecision(3)), 4)} TFLOP/s`;
  if (unit === "GB/s") return `${Number(v.toPrecision(3))} GB/s`;  // compare's busbw rows
  return fmtNum(v, 2);
}

/** A signed change: "−46.6 pp" for percentages (percentage points), "−334.9 ms", "+2.01 MiB". */
export function fmtDelta(v, unit) {
  if (!isNum(v)) return "";
  const sign = v > 0 ? "+" : v < 0 ? "−" : "±";
  if (unit === "%") return `${sign}${Math.abs(v).toFixed(1)} pp`;
  return `${sign}${fmtValue(Math.abs(v), unit)}`;
}

function fmtRel(v) {
  return isNum(v) ? `${v > 0 ? "+" : v < 0 ? "−" : "±"}${Math.abs(v).toFixed(1)}%` : "";
}

function sideText(x) {
  if (!x) return "?";
  const bits = [x.label || x.run];
  if (x.worker) bits.push(`worker ${x.worker}`);
  if (x.span) bits.push(`span ${x.span}`);
  const steps = isNum(x.steps) ? ` (${fmtNum(x.steps)} ${x.steps === 1 ? "step" : "steps"}${isNum(x.spans) && x.spans > 1 ? ` in ${x.spans} spans` : ""})` : "";
  return `${bits.join(", ")}${steps}`;
}

// ------------------------------------------------------------ the view

export function compareView(cmp) {
  const na = cmp.not_available && typeof cmp.not_available === "object" ? cmp.not_available : {};
  return h("div", {class: "cmp-view"},
    summary(cmp),
    mountPanel(null, {title: "Headline numbers", id: "bn-cmp-metrics", subtitle: "baseline → candidate; the colour says whether the change is an improvement for that metric"},
      metricCards(cmp.metrics)),
    mountPanel(null, {title: "Bottleneck cards", id: "bn-cmp-cards", subtitle: "each side's own cards: the single-run view's verdicts, side by side"},
      h("p", {class: "note muted"}, "Loading both reports…")),
    stepTimePanel(cmp.step_time, na.step_time),
    recommendationsPanel(cmp.recommendations || []),
    diffPanel("Kernel diff", "kernels", cmp.kernels, na.kernels),
    diffPanel("CPU operator diff", "ops", cmp.ops, na.ops),
    compilationPanel(cmp.compilation, na),
    notAvailablePanel(cmp.metrics, na));
}

// torch.compile part (views/compare.py `_compilation_part`, METRICS.md §16): launches per step,
// kernel time per family (server verdicts), and which eager ops each Triton kernel fused.
const FUSED_ROWS = 20;

function compilationPanel(c, na) {
  const id = "bn-cmp-compilation";
  const title = "torch.compile";
  if (!c || typeof c !== "object") {
    return mountPanel(null, {title, id}, h("p", {class: "note"}, `n/a: ${na.compilation || "not available"}`));
  }
  const side = (b) => (b ? "compiled" : "eager");
  const parts = [h("p", {class: "cmp-compile-sides"},
    `Baseline ${side(c.base_compiled)}, candidate ${side(c.cand_compiled)}.`)];
  const la = c.launch;
  if (la && typeof la === "object") {
    parts.push(h("p", {class: "cmp-compile-launch"},
      `Kernels per step ${fmtNum(la.base_kernels_per_step)} → ${fmtNum(la.cand_kernels_per_step)}`,
      isNum(la.rel_pct) ? ` (${la.rel_pct > 0 ? "+" : ""}${fmtPct(la.rel_pct, 1)})` : "",
      `; launch calls ${fmtUs(la.base_launch_us_per_step)} → ${fmtUs(la.cand_launch_us_per_step)} per step.`));
  }
  const fams = Array.isArray(c.families) ? c.families.filter((f) => f && typeof f === "object") : [];
  if (fams.length) {
    parts.push(h("table", {class: "grid-table compact cmp-families"},
      h("thead", {}, h("tr", {}, ["Kernel family", "Baseline /step", "Candidate /step", "Change /step", "Kernels /step"]
        .map((t, i) => h("th", {class: i ? "num" : null}, t)))),
      h("tbody", {}, fams.map((f) => h("tr", {"data-family": f.family},
        h("td", {}, String(f.label ?? f.family)),
        h("td", {class: "num"}, fmtUs(f.base_us_per_step)), h("td", {class: "num"}, fmtUs(f.cand_us_per_step)),
        h("td", {class: ["num", VERDICT_CLASS[f.verdict]], "data-verdict": f.verdict || null},
          fmtDelta(f.delta_us_per_step, "us") || "±0"),
        h("td", {class: "num"}, `${fmtNum(f.base_kernels_per_step)} → ${fmtNum(f.cand_kernels_per_step)}`))))));
  } else if (na["compilation.families"]) {
    parts.push(h("p", {class: "note muted"}, `Kernel families: n/a: ${na["compilation.families"]}`));
  }
  const fused = c.fused && typeof c.fused === "object" ? c.fused : null;
  if (fused && Array.isArray(fused.rows) && fused.rows.length) {
    const eagerSide = fused.compiled_side === "cand" ? "baseline" : "candidate";
    parts.push(h("h3", {class: "sub-h"}, `Triton kernels and the ${eagerSide}'s ops they fused`));
    parts.push(h("table", {class: "grid-table compact cmp-fused"},
      h("thead", {}, h("tr", {}, h("th", {}, "Triton kernel"), h("th", {}, "Fused ops"),
        h("th", {class: "num"}, `Those ops in the ${eagerSide} /step`))),
      h("tbody", {}, fused.rows.slice(0, FUSED_ROWS).map((r) => {
        const ops = Array.isArray(r.ops) ? r.ops : [];
        const eager = ops.reduce((a, o) => a + (o && o.counted && isNum(o.eager_us_per_step) ? o.eager_us_per_step : 0), 0);
        return h("tr", {},
          h("td", {class: "kname", title: String(r.name ?? "")}, shortenKernelName(String(r.name ?? ""))),
          h("td", {}, ops.map((o) => String(o && o.op)).join(", ")),
          h("td", {class: "num"}, fmtUs(eager)));
      }))));
    if (fused.rows.length > FUSED_ROWS) {
      parts.push(h("p", {class: "note muted"}, `${fused.rows.length - FUSED_ROWS} more Triton kernels in the route's JSON.`));
    }
  } else if (na["compilation.fused"]) {
    parts.push(h("p", {class: "note muted"}, `Fused ops: n/a: ${na["compilation.fused"]}`));
  }
  return mountPanel(null, {title, id, subtitle: "launches, kernel time by family and what the compiled side fused (METRICS.md §16)"}, ...parts);
}

function summary(cmp) {
  const st = cmp.step_time;
  const lines = [
    setupBanner(cmp),
    h("div", {}, h("strong", {}, "Baseline: "), sideText(cmp.base), fileErrNote(cmp.base)),
    h("div", {}, h("strong", {}, "Candidate: "), sideText(cmp.cand), fileErrNote(cmp.cand)),
  ];
  if (st && isNum(st.delta_us)) {
    const largest = (st.categories || []).find((c) => c.category === st.largest_change);
    lines.push(h("div", {class: "cmp-headline", style: {"margin-top": "6px", "font-size": "15px"}},
      "Avg step time ", fmtUs(st.base_avg_step_us), " → ", fmtUs(st.cand_avg_step_us), " ",
      h("span", {class: ["cmp-headline-delta", VERDICT_CLASS[st.verdict] || null], "data-verdict": st.verdict || null},
        `${fmtDelta(st.delta_us, "us")} (${fmtRel(st.rel_pct)})`),
      largest ? ` — largest change: ${CAT_NAMES[largest.category] || largest.category} ${fmtDelta(largest.delta_us, "us")} per step` : ""));
  }
  return mountPanel(null, {title: null, cls: "cmp-summary"}, lines);
}

/** The server's warning when the two runs differ in GPU, mode or world size (compare.py
 *  setup_differences): the deltas below are then not the effect of one change. */
function setupBanner(cmp) {
  const diffs = Array.isArray(cmp.setup_differences) ? cmp.setup_differences.filter((d) => d && typeof d === "object") : [];
  if (!diffs.length) return null;
  const what = diffs.map((d) => String(d.label ?? d.key)).join(", ");
  return h("div", {class: "banner banner-warn cmp-setup-warning", id: "bn-cmp-setup-warning", role: "note",
    title: typeof cmp.setup_warning === "string" ? cmp.setup_warning : null},
  h("strong", {}, `These runs differ in ${what}: not a before/after of one change.`),
  h("ul", {class: "cmp-setup-list"}, diffs.map((d) => h("li", {"data-key": String(d.key ?? "")},
    `${String(d.label ?? d.key)}: `, h("span", {class: "cmp-base"}, String(d.base ?? "?")), " → ",
    h("span", {class: "cmp-cand"}, String(d.cand ?? "?"))))),
  h("div", {class: "muted"}, "Every delta below mixes the effects of all these differences."));
}

function fileErrNote(x) {
  return x && isNum(x.file_errors) && x.file_errors > 0
    ? h("span", {class: "sev-text-medium"}, ` · ${x.file_errors} file(s) could not be read (see the single-run view)`) : null;
}

function metricCards(metrics) {
  const shown = (metrics || []).filter((m) => m && (isNum(m.base) || isNum(m.cand)));
  if (!shown.length) return h("p", {class: "note"}, "No headline number is available on either side.");
  return h("div", {class: "cards"}, shown.map((m) => {
    const cls = VERDICT_CLASS[m.verdict] || "muted";
    const dir = DIRECTION_TEXT[m.direction] || DIRECTION_TEXT.neutral;
    const band = isNum(m.noise_band) ? `changes within ±${fmtDelta(m.noise_band, m.unit).slice(1)} count as unchanged` : null;
    return h("div", {class: "card cmp-card", "data-key": m.key, "data-verdict": m.verdict, "data-direction": m.direction || null,
      title: band, tabindex: "0"},
      h("div", {class: "card-label"}, m.label, h("span", {class: "card-sublabel"}, dir)),
      h("div", {class: "cmp-values", style: {"font-size": "18px", "margin-top": "4px"}},
        h("span", {class: "cmp-base"}, fmtValue(m.base, m.unit)), " → ",
        h("span", {class: "cmp-cand", style: {"font-weight": "600"}}, fmtValue(m.cand, m.unit))),
      h("div", {class: ["card-verdict", "cmp-delta", cls]},
        isNum(m.delta) ? h("span", {class: "cmp-delta-value"}, fmtDelta(m.delta, m.unit)) : null,
        isNum(m.rel_pct) && m.unit !== "%" ? ` (${fmtRel(m.rel_pct)})` : "",
        isNum(m.delta) ? " " : null,
        // a side is n/a: the verdict is the words, not "n/a" after them
        h("span", {class: "cmp-verdict"}, m.verdict === "n/a" || !isNum(m.delta) ? "n/a on one side" : (VERDICT_TEXT[m.verdict] || m.verdict))));
  }));
}

// ------------------------------------------------------------ step time waterfall

function stepTimePanel(st, why) {
  if (!st) return mountPanel(null, {title: "Step-time change by category", id: "bn-cmp-steptime"}, h("p", {class: "note"}, `n/a: ${why || "not available"}`));
  const cats = (st.categories || []).filter((c) => c && isNum(c.delta_us));
  const chart = h("div", {class: "chart-box cmp-waterfall"});
  responsive(chart, (w) => waterfall(w, st, cats));
  const moved = cats.filter((c) => c.delta_us !== 0 || c.base_us || c.cand_us);
  const table = h("table", {class: "grid-table compact cmp-cats"},
    h("thead", {}, h("tr", {}, ["Category", "Baseline /step", "Candidate /step", "Change /step", "Share of change"]
      .map((t, i) => h("th", {class: i ? "num" : null}, t)))),
    h("tbody", {}, moved.map((c) => h("tr", {},
      h("td", {}, h("span", {class: "swatch", style: {background: catColor(c.category)}}), " ", CAT_NAMES[c.category] || c.category),
      h("td", {class: "num"}, fmtUs(c.base_us)), h("td", {class: "num"}, fmtUs(c.cand_us)),
      h("td", {class: ["num", "cmp-cat-delta", VERDICT_CLASS[c.verdict]], "data-verdict": c.verdict || null}, fmtDelta(c.delta_us, "us") || "±0"),
      h("td", {class: "num"}, isNum(c.share_of_change_pct) ? fmtPct(c.share_of_change_pct, 1) : "n/a")))));
  const residual = isNum(st.residual_us) && st.residual_us !== 0 ? h("p", {class: "note"}, `Rounding residual: ${fmtUs(st.residual_us)}`) : null;
  return mountPanel(null, {title: "Step-time change by category", id: "bn-cmp-steptime",
    subtitle: "average step time of the baseline, each category's change per step, the candidate's average step time"},
  chart, table, residual);
}

function waterfall(width, st, cats) {
  const rows = [{label: "Baseline", kind: "total", from: 0, to: st.base_avg_step_us}];
  let run = st.base_avg_step_us;
  const order = CATEGORIES.filter((k) => cats.some((c) => c.category === k && c.delta_us !== 0));
  for (const k of order) {
    const c = cats.find((x) => x.category === k);
    rows.push({label: CAT_NAMES[k] || k, kind: "delta", cat: c, from: run, to: run + c.delta_us});
    run += c.delta_us;
  }
  rows.push({label: "Candidate", kind: "total", from: 0, to: st.cand_avg_step_us});
  const m = {l: 110, r: 90, t: 8, b: 26};
  const rowH = 26;
  const height = m.t + m.b + rows.length * rowH;
  const pw = Math.max(10, width - m.l - m.r);
  const maxV = Math.max(...rows.map((r) => Math.max(r.from, r.to)), 1);
  const minV = Math.min(0, ...rows.map((r) => Math.min(r.from, r.to)));
  const ticks = niceTicks(minV, maxV, 5);
  const lo = ticks[0];
  const hi = ticks[ticks.length - 1];
  const x = (v) => m.l + ((v - lo) / (hi - lo || 1)) * pw;
  const svg = s("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `Waterfall of the step-time change: ${fmtUs(st.base_avg_step_us)} to ${fmtUs(st.cand_avg_step_us)}`});
  const axis = s("g", {class: "axis"});
  for (const t of ticks) {
    axis.appendChild(s("line", {x1: x(t), x2: x(t), y1: m.t, y2: height - m.b, class: "grid"}));
    axis.appendChild(s("text", {x: x(t), y: height - m.b + 16, class: "axis-label", "text-anchor": "middle"}, fmtUsTick(t)));
  }
  svg.appendChild(axis);
  rows.forEach((r, i) => {
    const y = m.t + i * rowH;
    const x0 = x(Math.min(r.from, r.to));
    const x1 = x(Math.max(r.from, r.to));
    const fill = r.kind === "total" ? "var(--c-accent)"
      : r.cat.verdict === "better" ? "var(--green)" : r.cat.verdict === "worse" ? "var(--red)" : "var(--muted)";
    svg.appendChild(s("text", {x: m.l - 8, y: y + rowH / 2 + 4, class: "axis-label", "text-anchor": "end"}, r.label));
    const bar = s("rect", {x: x0, y: y + 4, width: Math.max(1.5, x1 - x0), height: rowH - 8, fill, rx: 2,
      class: ["cmp-wf-bar", r.kind === "delta" ? `cmp-wf-${r.cat.category}` : "cmp-wf-total"].join(" ")});
    const tipLines = r.kind === "total"
      ? [{text: r.label, bold: true}, `avg step time ${fmtUs(r.to)}`]
      : [{text: r.label, bold: true, color: catColor(r.cat.category)}, `${fmtUs(r.cat.base_us)} → ${fmtUs(r.cat.cand_us)} per step`,
        `change ${fmtDelta(r.cat.delta_us, "us")}${isNum(r.cat.share_of_change_pct) ? ` (${fmtPct(r.cat.share_of_change_pct, 1)} of the change)` : ""}`];
    svg.appendChild(withTooltip(bar, tipLines));
    if (r.kind === "delta") {
      svg.appendChild(s("rect", {x: m.l - 104, y: y + 9, width: 8, height: 8, fill: catColor(r.cat.category)}));
      if (i + 1 < rows.length) {
        const yy = y + rowH - 4;
        svg.appendChild(s("line", {x1: x(r.to), x2: x(r.to), y1: yy, y2: yy + 8, class: "grid", "stroke-dasharray": "2 2"}));
      }
    }
    svg.appendChild(s("text", {x: x1 + 6, y: y + rowH / 2 + 4, class: "axis-label", "text-anchor": "start"},
      r.kind === "total" ? fmtUs(r.to) : fmtDelta(r.cat.delta_us, "us")));
  });
  return svg;
}

// ------------------------------------------------------------ recommendations

function recommendationsPanel(recs) {
  const moved = recs.filter((r) => r && r.status !== "unchanged");
  const same = recs.filter((r) => r && r.status === "unchanged");
  const item = (r) => h("div", {class: ["rec", "cmp-rec", REC_STATUS_CLASS[r.status]], "data-rule": r.rule, "data-status": r.status},
    h("div", {class: "rec-head"},
      h("span", {class: ["badge", REC_STATUS_CLASS[r.status]]}, r.status),
      " ", h("strong", {}, String(r.title ?? r.rule)),
      h("span", {class: "muted"}, ` · severity ${r.base_severity || "—"} → ${r.cand_severity || "—"}`)),
    r.status !== "resolved" && r.action ? h("div", {class: "rec-action"}, String(r.action)) : null);
  return mountPanel(null, {title: "Recommendations", id: "bn-cmp-recs", subtitle: "resolved, new and changed between baseline and candidate"},
    moved.length ? moved.map(item) : h("p", {class: "note"}, recs.length ? "No recommendation appeared, disappeared or changed severity." : "Neither side has a recommendation."),
    same.length ? h("details", {}, h("summary", {}, `${same.length} unchanged`), same.map(item)) : null);
}

// ------------------------------------------------------------ diff tables

const DIFF_COLS = {
  kernels: [
    {key: "name", label: "Kernel", text: true},
    {key: "status", label: "Status", text: true},
    {key: "base_total_us_per_step", label: "Baseline /step", fmt: fmtUs},
    {key: "cand_total_us_per_step", label: "Candidate /step", fmt: fmtUs},
    {key: "delta_total_us_per_step", label: "Change /step", fmt: (v) => fmtDelta(v, "us"), delta: true},
    {key: "base_calls_per_step", label: "Calls /step (base)", fmt: (v) => fmtNum(v, 2)},
    {key: "cand_calls_per_step", label: "Calls /step (cand)", fmt: (v) => fmtNum(v, 2)},
  ],
  ops: [
    {key: "name", label: "Operator", text: true},
    {key: "status", label: "Status", text: true},
    {key: "base_self_us_per_step", label: "Self /step (base)", fmt: fmtUs},
    {key: "cand_self_us_per_step", label: "Self /step (cand)", fmt: fmtUs},
    {key: "delta_self_us_per_step", label: "Self change", fmt: (v) => fmtDelta(v, "us"), delta: true},
    {key: "base_total_us_per_step", label: "Total /step (base)", fmt: fmtUs},
    {key: "cand_total_us_per_step", label: "Total /step (cand)", fmt: fmtUs},
    {key: "delta_total_us_per_step", label: "Total change", fmt: (v) => fmtDelta(v, "us"), delta: true},
    {key: "base_calls_per_step", label: "Calls (base)", fmt: (v) => fmtNum(v, 2)},
    {key: "cand_calls_per_step", label: "Calls (cand)", fmt: (v) => fmtNum(v, 2)},
  ],
};
const DEFAULT_SORT = {kernels: "delta_total_us_per_step", ops: "delta_self_us_per_step"};

function diffPanel(title, kind, table, why) {
  const id = `bn-cmp-${kind}`;
  if (!table) return mountPanel(null, {title, id}, h("p", {class: "note"}, `n/a: ${why || "not available"}`));
  const rows = Array.isArray(table.rows) ? table.rows.filter((r) => r && typeof r === "object") : [];
  const sub = `${fmtNum(table.new)} new · ${fmtNum(table.vanished)} vanished · ${fmtNum(table.changed)} changed`
    + (table.unknown ? ` · ${fmtNum(table.unknown)} unknown (a side's table was truncated)` : "")
    + (table.rows_left_out ? ` · ${fmtNum(table.rows_left_out)} smaller changes not listed` : "");
  if (!rows.length) {
    return mountPanel(null, {title, id, subtitle: sub}, h("p", {class: "note"},
      kind === "kernels" ? "Neither side ran a GPU kernel (CPU-only traces)." : "Neither side has CPU operators."));
  }
  const cols = DIFF_COLS[kind];
  const state = {sortKey: DEFAULT_SORT[kind], dir: -1, abs: true, filter: ""};
  const filterBox = h("input", {type: "search", class: "filter", placeholder: `Filter by name or status…`, "aria-label": `Filter ${title} by name`});
  const count = h("span", {class: "muted count"});
  const thead = h("thead");
  const tbody = h("tbody");
  const tableEl = h("table", {class: ["grid-table", "cmp-diff", `cmp-diff-${kind}`]}, thead, tbody);

  function drawHead() {
    mount(thead, h("tr", {}, cols.map((c) => {
      const active = state.sortKey === c.key;
      const ind = active ? (state.abs ? " ▼|Δ|" : state.dir > 0 ? " ▲" : " ▼") : "";
      return h("th", {class: [c.text ? null : "num", "sortable", active ? "sorted" : null], tabindex: "0", "data-col": c.key,
        "aria-sort": active && !state.abs ? (state.dir > 0 ? "ascending" : "descending") : "none",
        onclick: () => sortBy(c), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(c); } }},
      c.label, h("span", {class: "sort-ind"}, ind));
    })));
  }
  function sortBy(c) {
    if (state.sortKey === c.key) {
      // numeric columns: descending, ascending, (deltas) by size of the change
      if (c.delta && !state.abs && state.dir > 0) state.abs = true;
      else { state.dir = state.abs ? -1 : -state.dir; state.abs = false; }
    } else {
      state.sortKey = c.key; state.dir = c.text ? 1 : -1; state.abs = false;
    }
    drawHead();
    drawBody();
  }
  function drawBody() {
    const f = state.filter.trim().toLowerCase();
    const col = cols.find((c) => c.key === state.sortKey) || cols[0];
    const shownRows = rows.filter((r) => !f || String(r.name ?? "").toLowerCase().includes(f) || String(r.status ?? "") === f
      || (Array.isArray(r.raw_names) && r.raw_names.some((n) => String(n).toLowerCase().includes(f))));
    shownRows.sort((a, b) => {
      const va = a[col.key];
      const vb = b[col.key];
      if (col.text) return state.dir * String(va ?? "").localeCompare(String(vb ?? ""));
      const na = isNum(va) ? (state.abs ? Math.abs(va) : va) : -Infinity;
      const nb = isNum(vb) ? (state.abs ? Math.abs(vb) : vb) : -Infinity;
      return (state.abs ? -1 : state.dir) * (na - nb);
    });
    const shown = shownRows.slice(0, TABLE_LIMIT);
    mount(tbody, shown.map((r) => h("tr", {"data-status": r.status}, cols.map((c) => {
      if (c.key === "name") {
        const full = String(r.name ?? "");
        const raw = Array.isArray(r.raw_names) ? r.raw_names.map(String) : [];
        const title = [full, ...raw.filter((n) => n !== full).map((n) => `as: ${n}`)].join("\n");
        return h("td", {class: "kname cmp-name", title}, kind === "kernels" ? shortenKernelName(full) : full,
          kind === "ops" && r.top_level ? h("span", {class: "badge", title: "top-level operator (called by the step itself)"}, "top") : null);
      }
      if (c.key === "status") {
        const cls = r.status === "new" || r.status === "vanished" ? "badge" : "muted";
        return h("td", {}, h("span", {class: cls}, String(r.status ?? "")));
      }
      const v = r[c.key];
      // a delta's colour: the server's verdict of that change (its direction and noise band)
      const verdict = c.delta && r.verdicts && typeof r.verdicts === "object" ? r.verdicts[c.key.replace(/^delta_/, "")] : null;
      const vcls = verdict ? VERDICT_CLASS[verdict] || null : null;
      return h("td", {class: ["num", vcls], "data-verdict": typeof verdict === "string" ? verdict : null}, isNum(v) ? c.fmt(v) : "n/a");
    }))));
    if (!shown.length) tbody.appendChild(h("tr", {}, h("td", {colspan: String(cols.length), class: "empty-row"}, "No row matches the filter.")));
    count.textContent = shownRows.length > TABLE_LIMIT
      ? `showing ${TABLE_LIMIT} of ${shownRows.length} matching (${rows.length} total); refine the filter`
      : `${shownRows.length} of ${rows.length}`;
  }
  filterBox.addEventListener("input", () => { state.filter = filterBox.value; drawBody(); });
  drawHead();
  drawBody();
  return mountPanel(null, {title, id, subtitle: sub},
    h("div", {class: "table-tools"}, filterBox, count),
    h("div", {class: "table-scroll"}, tableEl));
}

// ------------------------------------------------------------ not available

function notAvailablePanel(metrics, na) {
  const items = [];
  for (const m of metrics || []) {
    const b = na[`metrics.${m.key}.base`];
    const c = na[`metrics.${m.key}.cand`];
    if (!b && !c) continue;
    if (b && c && b === c) items.push([m.label, `both: ${b}`]);
    else {
      if (b) items.push([m.label, `baseline: ${b}`]);
      if (c) items.push([m.label, `candidate: ${c}`]);
    }
  }
  if (!items.length) return null;
  return mountPanel(null, {title: "Not available", id: "bn-cmp-na"},
    h("ul", {class: "na-list"}, items.map(([label, why]) => h("li", {}, h("strong", {}, label), ": ", why))));
}

