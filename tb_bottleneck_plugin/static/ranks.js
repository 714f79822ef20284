// The Ranks panel of a distributed run (metrics §12, docs/report-schema.md `ranks`):
// the straggler recommendation, a stacked bar per rank (compute only / overlapped /
// exposed communication / other), a sortable rank table, the per-collective table and a
// rank x step heatmap. Shown above the run's report when the run has more than one worker.
//
// Scale: a run may have 1,000+ ranks. The heatmap is ONE <canvas> (rows aggregated to at
// most HEATMAP_MAX_ROWS, each row showing the slowest rank of its group so a straggler
// stays visible); the bars are aggregated to at most BAR_MAX groups; the table shows
// TABLE_LIMIT rows of the current order until asked for all. No DOM element per cell.
//
// Every verdict (flagged, severity, the recommendation's words) comes from the server:
// no thresholds here. Strings from traces (worker names) are inserted as text only.

import {h, mount, clear} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtUsTick, fmtBytes, fmtCount} from "./format.js";
import {responsive, stackedBarChart, showTooltip, hideTooltip} from "./charts.js";
import {renderCards} from "./cards.js";
import {severityClass} from "./common.js";
import {load} from "./states.js";
import {mountPanel} from "./panels.js";
import {rankCollectivesSection} from "./collectives_view.js";

// The bar's five parts (ranks.py BAR_KEYS, row.bar_us): the four-way split of metrics §12 with
// the DataLoader wait (the report's input-bound time, §3) taken out as its own part, so a rank
// that waits on its input is not drawn as computing. Named by what they hold on the run's device.
const SPLIT = ["compute_us", "overlapped_us", "exposed_comm_us", "input_wait_us", "other_us"];
const SPLIT_WORDS = {
  gpu: {compute_us: "compute kernels only", overlapped_us: "compute kernels ∩ communication",
    exposed_comm_us: "exposed communication (transfer + waiting for other ranks)",
    input_wait_us: "input wait (DataLoader, GPU idle)", other_us: "other (GPU idle, not input)"},
  cpu: {compute_us: "CPU ops only (no DataLoader, no collective)", overlapped_us: "CPU ops ∩ communication",
    exposed_comm_us: "exposed communication (transfer + waiting for other ranks)",
    input_wait_us: "input wait (DataLoader)", other_us: "other (no op running)"},
  any: {compute_us: "compute only", overlapped_us: "compute ∩ communication",
    exposed_comm_us: "exposed communication (transfer + waiting for other ranks)",
    input_wait_us: "input wait (DataLoader)", other_us: "other"},
};
const SPLIT_COLORS = {compute_us: "var(--c-kernel)", overlapped_us: "var(--c-runtime)",
  exposed_comm_us: "var(--c-communication)", input_wait_us: "var(--c-dataloader)", other_us: "var(--c-other)"};
/** The words of the bar's parts for the run's device ("gpu", "cpu"; anything else: neutral words). */
export function splitNames(device) {
  return SPLIT_WORDS[device] || SPLIT_WORDS.any;
}
const BAR_MAX = 100; // beyond this many ranks, one bar per group of ranks (mean of the group)
const HEATMAP_MAX_ROWS = 120; // beyond this, one canvas row per group of ranks (the group's max): rows >= 3 px
const HEATMAP_HEIGHT = 360; // px available to the rows
const TABLE_LIMIT = 100; // rows shown before "Show all"
const FEW_BARS = 12; // up to this many bars, each is labelled "rank N" (more: the bare numbers)
const CARD_RANKS = 8; // "Cards per rank": the flagged rank first, then the table's order, at most this many reports
// A sequential colour ramp (viridis stops), readable on light and dark backgrounds.
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

/**
 * Shows the panel at the top of container (above the report). request is the data module's
 * ranks?run=RUN (model.js; this file never fetches), loaded through states.js load in its
 * "line" look: a progress line, and an error as a short note that never replaces the report.
 */
export function mountRanks(container, {request, loadReports = null, worker, signal, onPick}) {
  const slot = h("div", {class: "ranks-slot", id: "bn-ranks-slot"});
  container.insertBefore(slot, container.firstChild);
  return load(slot, request, {look: "line", label: "Ranks", route: "ranks", isCurrent: () => !(signal && signal.aborted),
    onData: (view) => mount(slot, renderRanksPanel(view, {selectedWorker: worker, onPick, loadReports}))});
}

function sub(title, ...children) {
  return h("div", {class: "ranks-sub", style: {margin: "14px 0 4px"}},
    h("h3", {style: {margin: "0 0 6px", "font-size": "13px"}}, title), ...children);
}

/**
 * The panel for one `ranks` route body. loadReports(workers) -> promise of one report-route
 * result per worker (model.js; index.js hands it in): the "Cards per rank" section.
 */
export function renderRanksPanel(view, {selectedWorker = null, onPick = null, loadReports = null} = {}) {
  const rows = Array.isArray(view.ranks) ? view.ranks : [];
  const bits = [`${fmtCount(view.rank_count)} ranks`];
  if (view.backend) bits.push(`backend ${view.backend}`);
  if (isNum(view.world_size)) bits.push(`world size ${view.world_size}`);
  if (isNum(view.imbalance_pct)) bits.push(`load imbalance ${fmtPct(view.imbalance_pct)}`);
  const children = [renderVerdict(view)];
  if (view.available && rows.length) {
    children.push(
      sub("Where each rank's step goes (average per step)", renderBars(rows, onPick)),
      sub(`Step time per rank and step`, renderHeatmap(view, rows, onPick)),
      // the highlighted row is the rank the server flagged (not merely the one that waited least)
      sub("Ranks", renderRankTable(rows, {selectedWorker, onPick,
        flaggedWorker: view.flagged && view.recommendation ? view.recommendation.worker : null})),
      sub("Collectives", renderCollectives(view.collectives || [])),
      sub("Process groups", renderGroups(view.process_groups || [])),
      ...(view.pipeline && view.pipeline.available ? [sub("Pipeline stages", renderPipeline(view.pipeline))] : []),
      sub("Collective bandwidth against the link", rankCollectivesSection(view)));
    if (loadReports) children.push(renderRankCards(view, rows, loadReports));
  }
  children.push(renderNotAvailable(view));
  return mountPanel(null, {title: "Ranks", id: "bn-ranks", cls: "ranks-panel", subtitle: bits.join(" · "),
    info: "One row per worker (rank) of this run: where each rank's step time goes, who waits for whom "
      + "in the collectives, and which rank holds the others back. Click a rank to open its own report.",
    infoLabel: "About the Ranks view"}, ...children);
}

/**
 * Each rank's own headline cards (the single-run cards, cards.js renderCards with one report per
 * rank: the worker summaries), loaded when the section is opened.
 */
function renderRankCards(view, rows, loadReports) {
  const flagged = view.flagged && view.recommendation ? view.recommendation.worker : null;
  const workers = rows.map((r) => r.worker).filter((w) => typeof w === "string");
  const pick = [...(flagged && workers.includes(flagged) ? [flagged] : []), ...workers.filter((w) => w !== flagged)].slice(0, CARD_RANKS);
  const slot = h("div", {class: "rank-cards"}, h("p", {class: "note muted"}, "Loading the ranks' reports…"));
  const more = workers.length > pick.length ? ` (${pick.length} of ${workers.length}: the flagged rank first)` : "";
  let loaded = false;
  const details = h("details", {class: "ranks-cards", id: "bn-ranks-cards", ontoggle: () => {
    if (!details.open || loaded) return;
    loaded = true;
    loadReports(pick).then((rs) => {
      if (rs.some((x) => x.kind === "aborted")) return;
      const ok = rs.map((x, i) => [x, pick[i]]).filter(([x]) => x.kind === "ok" && x.data && typeof x.data === "object");
      if (!ok.length) {
        mount(slot, h("p", {class: "note"}, `n/a: ${(rs[0] && rs[0].message) || "the ranks' reports could not be loaded"}`));
        return;
      }
      renderCards(slot, ok.map(([x]) => x.data), {labels: ok.map(([, w]) => `${w}${w === flagged ? " (flagged)" : ""}`)});
    });
  }},
  h("summary", {}, `Cards per rank${more}: each rank's own verdicts, as in its single-worker view`), slot);
  return h("div", {class: "ranks-sub", style: {margin: "14px 0 4px"}}, details);
}

function renderVerdict(view) {
  const rec = view.recommendation;
  if (view.flagged && rec) {
    const sev = severityClass(rec.severity); // the server's word (ranks.py, thresholds.py)
    // The action quotes the rank's own top finding and its numbers (ranks.py): shown once, with
    // no separate "top finding" line or evidence list repeating it.
    return h("div", {class: ["rec", "ranks-rec", `sev-${sev}`], role: "alert"},
      h("div", {class: "rec-head"}, h("span", {class: ["badge", `sev-${sev}`]}, sev),
        h("span", {class: "rec-title"}, String(rec.title || "")),
        rec.rule ? h("span", {class: "rec-rule", title: "rule name"}, String(rec.rule)) : null),
      h("p", {class: "rec-action"}, String(rec.action || "")));
  }
  const st = view.straggler;
  const words = ["No rank holds the others back beyond the thresholds."];
  if (st) words.push(" ", stragglerWords(st, Array.isArray(view.ranks) ? view.ranks : []));
  if (!view.available) words[0] = "Ranks cannot be compared for this run.";
  return h("div", {class: ["rec", "ranks-rec", view.available ? "sev-ok" : "sev-low"], role: "status"},
    h("div", {class: "rec-head"}, h("span", {class: ["badge", view.available ? "sev-ok" : "sev-low"]},
      view.available ? "ok" : "n/a"), h("span", {class: "rec-title"}, words.join(""))));
}

/**
 * The straggler sentence: a count of steps and the totals of the table's Wait column, said as
 * what they are so that they cannot read as a contradiction (the rank that waited least in most
 * steps can wait more in total when a few long waits fall on it).
 */
export function stragglerWords(st, rows) {
  const caused = isNum(st.wait_caused_pct) ? ` (the others waited ${fmtPct(st.wait_caused_pct)} of a typical step)` : "";
  let s = `Counted step by step, rank ${st.rank} waited least in ${st.steps} of ${st.of_steps} steps${caused}.`;
  const waits = rows.filter((r) => isNum(r.wait_us));
  const own = waits.find((r) => r.worker === st.worker);
  if (own && waits.some((r) => r !== own)) {
    const least = waits.reduce((a, b) => (b.wait_us < a.wait_us ? b : a));
    s += least.worker === own.worker
      ? ` Summed over all steps it also waited least: ${fmtUs(own.wait_us)} in total.`
      : ` Summed over all steps it waited ${fmtUs(own.wait_us)} in total, more than rank ${least.rank} `
        + `(${fmtUs(least.wait_us)}): a few long waits outweigh the step count.`;
  }
  return s;
}

function renderNotAvailable(view) {
  const na = view.not_available && typeof view.not_available === "object" ? Object.entries(view.not_available) : [];
  const errs = Array.isArray(view.file_errors) ? view.file_errors : [];
  if (!na.length && !errs.length) return null;
  return h("div", {class: "ranks-na note"},
    na.length ? h("ul", {class: "na-list"}, na.map(([k, why]) => h("li", {}, h("code", {}, String(k)), " — ", String(why)))) : null,
    errs.length ? h("ul", {class: "err-list"}, errs.map((e) => h("li", {},
      `worker ${e.worker}, span ${e.span}: `, String(e.error)))) : null);
}

// ------------------------------------------------------------ stacked bars

const FOUR_WAY = {compute_us: "compute_only_us", overlapped_us: "overlapped_us", exposed_comm_us: "exposed_comm_us",
  other_us: "other_us"}; // a row without bar_us (older server): the four-way split, no input part

function perStep(row, key) {
  const bar = row.bar_us && typeof row.bar_us === "object" ? row.bar_us : null;
  const v = bar ? bar[key] : (FOUR_WAY[key] ? row[FOUR_WAY[key]] : null);
  return isNum(v) && row.steps > 0 ? v / row.steps : null;
}

/** "gpu" or "cpu" when every rank's traces say the same, else "any" (neutral words). */
function runDevice(rows) {
  const ds = new Set(rows.map((r) => r.device));
  return ds.size === 1 && (ds.has("gpu") || ds.has("cpu")) ? [...ds][0] : "any";
}

function renderBars(rows, onPick) {
  const names = splitNames(runDevice(rows));
  const groups = groupRanks(rows, BAR_MAX);
  const bars = groups.map((g) => {
    const parts = {};
    for (const k of SPLIT) {
      const vals = g.map((r) => perStep(r, k)).filter(isNum);
      parts[k] = vals.length ? vals.reduce((a, b) => a + b, 0) / vals.length : null;
    }
    const single = g.length === 1;
    const first = g[0];
    const last = g[g.length - 1];
    const few = groups.length <= FEW_BARS; // "rank 3" under each bar while they fit, else the bare numbers
    return {label: single ? `${few ? "rank " : ""}${first.rank}` : `${few ? "ranks " : ""}${first.rank}–${last.rank}`, parts,
      title: single ? `rank ${first.rank} (worker ${first.worker})` : `ranks ${first.rank}–${last.rank} (mean of ${g.length})`};
  });
  const note = groups.length < rows.length
    ? h("p", {class: "note muted"}, `${rows.length} ranks: each bar is the mean of ${groups[0].length} consecutive ranks; `
      + "the heatmap and the table show every rank.") : null;
  const legend = h("div", {class: "legend", style: {display: "flex", gap: "12px", "flex-wrap": "wrap", "font-size": "12px"}},
    SPLIT.map((k) => h("span", {class: "legend-item", "data-key": k}, h("span", {class: "swatch", style: {background: SPLIT_COLORS[k], display: "inline-block",
      width: "10px", height: "10px", "margin-right": "4px"}}), names[k])));
  const box = responsive(h("div", {class: "chart-box ranks-bars"}), (w) => stackedBarChart({
    width: w, height: 240, bars, keys: SPLIT, colors: SPLIT_COLORS, names, fmt: fmtUs, axisFmt: fmtUsTick,
    yLabel: "per step", maxLabels: groups.length < rows.length ? 10 : 32}));
  if (onPick && groups.length === rows.length) {
    box.addEventListener("click", (e) => {
      const g = e.target && e.target.closest ? e.target.closest("g.bar") : null;
      if (!g || !g.parentNode) return;
      const i = [...g.parentNode.querySelectorAll("g.bar")].indexOf(g);
      if (i >= 0 && rows[i]) onPick(rows[i].worker);
    });
  }
  return h("div", {}, legend, box, note);
}

/** Consecutive groups (rank order) so that there are at most max groups. */
function groupRanks(rows, max) {
  const size = Math.max(1, Math.ceil(rows.length / max));
  const out = [];
  for (let i = 0; i < rows.length; i += size) out.push(rows.slice(i, i + size));
  return out;
}

// ------------------------------------------------------------ heatmap (one canvas)

function rampColor(t) {
  const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const c = RAMP[i].map((v, j) => Math.round(v + (RAMP[i + 1][j] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function heatmapData(view, rows, metric) {
  const steps = Array.isArray(view.steps) && view.steps.length ? view.steps
    : [...new Set(rows.flatMap((r) => (r.per_step && r.per_step.steps) || []))].sort((a, b) => a - b);
  const col = new Map(steps.map((s, i) => [s, i]));
  const key = metric === "wait" ? "wait_us" : "step_us";
  // rank-level matrix, then grouped rows (max of the group: a slow rank stays visible)
  const groups = groupRanks(rows, HEATMAP_MAX_ROWS);
  const cells = new Float64Array(groups.length * steps.length).fill(NaN);
  const who = new Int32Array(groups.length * steps.length).fill(-1); // row index of the group's max
  let lo = Infinity;
  let hi = -Infinity;
  let base = 0;
  groups.forEach((g, gi) => {
    g.forEach((r, k) => {
      const ps = r.per_step || {};
      const ss = ps.steps || [];
      const vs = ps[key] || [];
      for (let i = 0; i < ss.length; i++) {
        const c = col.get(ss[i]);
        const v = vs[i];
        if (c === undefined || !isNum(v)) continue;
        const at = gi * steps.length + c;
        if (!(cells[at] >= v)) { cells[at] = v; who[at] = base + k; }
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    });
    base += g.length;
  });
  return {steps, groups, cells, who, lo, hi};
}

function renderHeatmap(view, rows, onPick) {
  const hasWait = rows.some((r) => r.per_step && (r.per_step.wait_us || []).some(isNum));
  const st = {metric: "step"};
  const legend = h("div", {class: "heat-legend", style: {display: "flex", "align-items": "center", gap: "8px", "font-size": "12px", margin: "4px 0"}});
  const box = h("div", {class: "chart-box ranks-heatmap"});
  const buttons = [["step", "step time"], ["wait", "wait in collectives"]].map(([m, label]) =>
    h("button", {type: "button", class: ["btn", "heat-metric"], "data-metric": m, disabled: m === "wait" && !hasWait,
      title: m === "wait" ? (hasWait ? "Per step: the rank's collective time minus the fastest rank's (metrics §12)" : "no communication recorded") : "Per step: the rank's step time",
      onclick: () => { st.metric = m; redraw(); }}, label));
  let lastW = 0;
  function redraw() {
    for (const b of buttons) {
      const on = b.getAttribute("data-metric") === st.metric;
      b.setAttribute("aria-pressed", on ? "true" : "false");
      b.style.setProperty("font-weight", on ? "700" : "400");
      b.style.setProperty("border-color", on ? "var(--c-accent)" : "");
    }
    if (lastW > 0) draw(lastW);
  }
  function draw(width) {
    lastW = width;
    const d = heatmapData(view, rows, st.metric);
    clear(box);
    box.appendChild(drawHeatCanvas(d, rows, width, onPick, st.metric));
    const span = isNum(d.lo) && isNum(d.hi) && d.hi >= d.lo;
    mount(legend, h("span", {}, span ? fmtUs(d.lo) : "n/a"),
      h("span", {style: {display: "inline-block", width: "160px", height: "10px",
        background: `linear-gradient(to right, ${[0, 0.25, 0.5, 0.75, 1].map(rampColor).join(", ")})`}}),
      h("span", {}, span ? fmtUs(d.hi) : "n/a"),
      h("span", {class: "muted"}, d.groups.length < rows.length
        ? `· ${rows.length} ranks in ${d.groups.length} rows of ${d.groups[0].length} (each row shows its slowest rank)` : ""));
    return box;
  }
  // responsive() replaces the container's children: give it a holder and draw into box.
  const holder = responsive(h("div", {class: "chart-box"}), (w) => { draw(w); return box; });
  redraw();
  return h("div", {}, h("div", {style: {display: "flex", gap: "6px", "align-items": "center"}},
    h("span", {class: "muted", style: {"font-size": "12px"}}, "Colour:"), buttons), legend, holder);
}

function drawHeatCanvas(d, rows, width, onPick, metric) {
  const nRows = d.groups.length;
  const nCols = d.steps.length;
  const m = {l: 64, r: 8, t: 4, b: 22};
  const rowH = Math.max(1, Math.min(22, Math.floor(HEATMAP_HEIGHT / Math.max(1, nRows))));
  const height = m.t + m.b + rowH * nRows;
  const pw = Math.max(10, width - m.l - m.r);
  const colW = pw / Math.max(1, nCols);
  const canvas = h("canvas", {class: "heatmap", role: "img", width: 1, height: 1,
    "aria-label": `Heatmap of ${metric === "wait" ? "wait" : "step time"}: ${rows.length} ranks by ${nCols} steps`,
    "data-rows": String(nRows), "data-cols": String(nCols), style: {display: "block", width: `${width}px`, height: `${height}px`, cursor: onPick ? "pointer" : "default"}});
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext("2d");
  if (!ctx) return canvas;
  ctx.scale(dpr, dpr);
  const styles = getComputedStyle(document.body);
  const muted = (styles.getPropertyValue("--muted") || "#888").trim() || "#888";
  const range = d.hi > d.lo ? d.hi - d.lo : 1;
  let drawn = 0;
  for (let r = 0; r < nRows; r++) {
    for (let c = 0; c < nCols; c++) {
      const v = d.cells[r * nCols + c];
      const x = m.l + c * colW;
      const y = m.t + r * rowH;
      if (Number.isNaN(v)) {
        ctx.fillStyle = "rgba(128,128,128,0.25)";
      } else {
        ctx.fillStyle = rampColor(d.hi > d.lo ? (v - d.lo) / range : 0.5);
        drawn++;
      }
      ctx.fillRect(x, y, Math.max(1, colW - (colW > 4 ? 1 : 0)), Math.max(1, rowH - (rowH > 4 ? 1 : 0)));
    }
  }
  canvas.setAttribute("data-cells", String(drawn));
  ctx.fillStyle = muted;
  ctx.font = "11px sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const labelEvery = Math.max(1, Math.ceil(14 / rowH));
  for (let r = 0; r < nRows; r += labelEvery) {
    const g = d.groups[r];
    ctx.fillText(g.length === 1 ? `rank ${g[0].rank}` : `${g[0].rank}–${g[g.length - 1].rank}`, m.l - 6, m.t + r * rowH + rowH / 2);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const stepEvery = Math.max(1, Math.ceil(36 / colW));
  for (let c = 0; c < nCols; c += stepEvery) ctx.fillText(`step ${d.steps[c]}`, m.l + c * colW + colW / 2, m.t + nRows * rowH + 5);

  const cellAt = (e) => {
    const rect = canvas.getBoundingClientRect();
    const x = e.clientX - rect.left - m.l;
    const y = e.clientY - rect.top - m.t;
    const r = Math.floor(y / rowH);
    const c = Math.floor(x / colW);
    if (x < 0 || r < 0 || r >= nRows || c < 0 || c >= nCols) return null;
    return {r, c, v: d.cells[r * nCols + c], row: rows[d.who[r * nCols + c]] || (d.groups[r].length === 1 ? d.groups[r][0] : null)};
  };
  canvas.addEventListener("mousemove", (e) => {
    const cell = cellAt(e);
    if (!cell) { hideTooltip(); return; }
    const g = d.groups[cell.r];
    showTooltip([
      {text: g.length === 1 ? `rank ${g[0].rank} (worker ${g[0].worker})` : `ranks ${g[0].rank}–${g[g.length - 1].rank}`, bold: true},
      `step ${d.steps[cell.c]}`,
      `${metric === "wait" ? "wait" : "step time"}: ${fmtUs(cell.v)}${g.length > 1 && cell.row ? ` (slowest: rank ${cell.row.rank})` : ""}`,
      onPick && cell.row ? "click: open this rank's report" : null,
    ], e.clientX, e.clientY);
  });
  canvas.addEventListener("mouseleave", hideTooltip);
  if (onPick) {
    canvas.addEventListener("click", (e) => {
      const cell = cellAt(e);
      if (cell && cell.row) onPick(cell.row.worker);
    });
  }
  return canvas;
}

// ------------------------------------------------------------ tables

const RANK_COLS = [
  {key: "rank", label: "Rank", fmt: (v) => String(v)},
  {key: "worker", label: "Worker", text: true, fmt: (v) => String(v ?? "")},
  {key: "steps", label: "Steps", fmt: fmtCount},
  {key: "avg_step_us", label: "Avg step", fmt: fmtUs},
  // the bar's five parts as % of the rank's step time (the same numbers as the bars)
  {key: "bar_compute_pct", label: "Compute only", fmt: (v) => fmtPct(v),
    title: "Computing with no DataLoader wait and no collective running, % of step time (the bars' first part)"},
  {key: "bar_overlapped_pct", label: "Overlapped", fmt: (v) => fmtPct(v), title: "Compute ∩ communication, % of step time"},
  {key: "bar_exposed_comm_pct", label: "Exposed comm.", fmt: (v) => fmtPct(v),
    title: "Communication with no compute under it (transfer + waiting for other ranks), % of step time"},
  {key: "bar_input_wait_pct", label: "Input wait", fmt: (v) => fmtPct(v),
    title: "Waiting for the DataLoader, % of step time: the rank's input-bound % (its own report)"},
  {key: "bar_other_pct", label: "Other", fmt: (v) => fmtPct(v), title: "None of the above, % of step time"},
  {key: "gpu_utilization_pct", label: "GPU util.", fmt: (v) => fmtPct(v)},
  {key: "mfu_pct", label: "MFU", fmt: (v) => fmtPct(v),
    title: "Model FLOPs utilization of the rank: ideal time at the GPU's peak / step time, summed over its spans (METRICS.md §15)"},
  {key: "straggler_steps", label: "Least wait in (steps)", fmt: fmtCount,
    title: "Steps in which this rank waited least in the collectives: the others waited for it (metrics §12)"},
  {key: "wait_us", label: "Wait (total)", fmt: fmtUs, title: "Wait in the collectives, summed over all steps"},
  {key: "transfer_us", label: "Transfer (total)", fmt: fmtUs, title: "Transfer time of the collectives, summed over all steps"},
];

/** A table row: the rank's row with its bar's parts as % of its step time (bar_*_pct). */
function withBarPct(r) {
  const out = {...r};
  const total = r.steps > 0 && isNum(r.step_us) && r.step_us > 0 ? r.step_us / r.steps : null;
  for (const k of SPLIT) {
    const v = perStep(r, k);
    out[`bar_${k.replace("_us", "_pct")}`] = isNum(v) && total ? (100 * v) / total : null;
  }
  return out;
}

function renderRankTable(rowsIn, {selectedWorker, onPick, flaggedWorker}) {
  const rows = rowsIn.map(withBarPct);
  const st = {key: "rank", dir: 1, all: rows.length <= TABLE_LIMIT};
  const thead = h("thead");
  const tbody = h("tbody");
  const more = h("p", {class: "note muted"});
  const table = h("table", {class: "grid-table rank-table"}, thead, tbody);
  function head() {
    mount(thead, h("tr", {}, RANK_COLS.map((c) => {
      const active = st.key === c.key;
      return h("th", {class: [c.text ? null : "num", "sortable", active ? "sorted" : null], "data-key": c.key, tabindex: "0",
        title: c.title || null,
        "aria-sort": active ? (st.dir > 0 ? "ascending" : "descending") : "none",
        onclick: () => sortBy(c), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(c); } }},
      c.label, h("span", {class: "sort-ind"}, active ? (st.dir > 0 ? " ▲" : " ▼") : ""));
    })));
  }
  function sortBy(c) {
    if (st.key === c.key) st.dir = -st.dir;
    else { st.key = c.key; st.dir = c.text || c.key === "rank" ? 1 : -1; }
    head();
    body();
  }
  function body() {
    const sorted = rows.slice().sort((a, b) => {
      const va = a[st.key];
      const vb = b[st.key];
      const na = va === null || va === undefined;
      const nb = vb === null || vb === undefined;
      if (na || nb) return na === nb ? a.rank - b.rank : na ? 1 : -1; // n/a last in both directions
      if (va < vb) return -st.dir;
      if (va > vb) return st.dir;
      return a.rank - b.rank;
    });
    const shown = st.all ? sorted : sorted.slice(0, TABLE_LIMIT);
    mount(tbody, shown.map((r) => {
      const isStraggler = flaggedWorker !== null && flaggedWorker === r.worker;
      return h("tr", {class: ["rank-row", r.worker === selectedWorker ? "selected" : null, isStraggler ? "straggler" : null],
        "data-worker": String(r.worker), tabindex: onPick ? "0" : null,
        title: onPick ? `Open the report of worker ${r.worker}` : null,
        style: {cursor: onPick ? "pointer" : null, "font-weight": r.worker === selectedWorker ? "600" : null,
          background: isStraggler ? "var(--red-bg)" : null},
        onclick: onPick ? () => onPick(r.worker) : null,
        onkeydown: onPick ? (e) => { if (e.key === "Enter") onPick(r.worker); } : null},
      RANK_COLS.map((c) => h("td", {class: [c.text ? null : "num", `col-${c.key}`]}, c.fmt(r[c.key]))));
    }));
    mount(more, st.all ? null : [`Showing ${TABLE_LIMIT} of ${rows.length} ranks in this order. `,
      h("button", {type: "button", class: "btn", onclick: () => { st.all = true; body(); }}, `Show all ${rows.length}`)]);
  }
  head();
  body();
  return h("div", {}, h("div", {style: {overflow: "auto", "max-height": "480px"}}, table), more);
}

const COLL_COLS = [
  {key: "kind", label: "Collective", text: true, fmt: (v) => String(v ?? "")},
  {key: "calls", label: "Calls", fmt: fmtCount},
  {key: "matched_calls", label: "Matched", fmt: fmtCount},
  {key: "bytes", label: "Bytes", fmt: fmtBytes},
  {key: "total_us", label: "Total", fmt: fmtUs},
  {key: "transfer_us", label: "Transfer", fmt: fmtUs},
  {key: "wait_us", label: "Wait", fmt: fmtUs},
];

function renderCollectives(colls) {
  if (!colls.length) return h("p", {class: "note muted"}, "No collectives in the ranks' steps.");
  return h("table", {class: "grid-table collectives-table"},
    h("thead", {}, h("tr", {}, COLL_COLS.map((c) => h("th", {class: c.text ? null : "num"}, c.label)))),
    h("tbody", {}, colls.map((row) => h("tr", {}, COLL_COLS.map((c) => h("td", {class: [c.text ? null : "num", `col-${c.key}`]},
      c.fmt(row[c.key])))))));
}

// One row per process group (ranks.py process_groups, METRICS.md §12 "Process groups"): its calls
// matched across its ranks, its straggler and the server's sentence for the cause by difference.
const GROUP_COLS = [
  {key: "label", label: "Group", text: true, fmt: (v) => String(v == null ? "" : v)},
  {key: "kinds", label: "Collectives", text: true, fmt: (v) => (Array.isArray(v) ? v.join(", ") : "")},
  {key: "calls", label: "Calls", fmt: fmtCount},
  {key: "matched_calls", label: "Matched", fmt: fmtCount},
  {key: "unmatched_calls", label: "Unmatched", fmt: fmtCount},
  {key: "match_by", label: "Matched by", text: true, fmt: (v) => (v == null ? "n/a" : String(v))},
];

function renderGroups(groups) {
  if (!groups.length) return h("p", {class: "note muted"}, "No collectives in the ranks' steps.");
  const table = h("table", {class: "grid-table groups-table"},
    h("thead", {}, h("tr", {}, GROUP_COLS.map((c) => h("th", {class: c.text ? null : "num"}, c.label)))),
    h("tbody", {}, groups.map((g) => h("tr", {}, GROUP_COLS.map((c) => h("td", {class: [c.text ? null : "num", `col-${c.key}`]},
      c.fmt(g[c.key])))))));
  const notes = [];
  for (const g of groups) {
    const st = g.straggler;
    if (st && st.sentence) notes.push(h("p", {class: "note group-straggler"}, String(st.sentence)));
    if (st && st.cause && st.cause.sentence) notes.push(h("p", {class: "note group-cause"}, `Why: ${st.cause.sentence}`));
    if (Array.isArray(g.unmatched_seqs) && g.unmatched_seqs.length) {
      notes.push(h("p", {class: "note muted"}, `${g.label}: sequence numbers not seen on every rank: ${g.unmatched_seqs.join(", ")}`));
    }
    if (Array.isArray(g.missing_ranks) && g.missing_ranks.length) {
      notes.push(h("p", {class: "note muted"}, `${g.label}: no trace for rank(s) ${g.missing_ranks.join(", ")}`));
    }
  }
  return h("div", {}, table, ...notes);
}

// Pipeline parallelism (ranks.py pipeline, views/pipeline.py; METRICS.md §12): one row per stage
// with its bubble, the measured and theoretical bubble side by side, and the server's priced advice.
const STAGE_COLS = [
  {key: "stage", label: "Stage", fmt: fmtCount},
  {key: "ranks", label: "Ranks", text: true, fmt: (v) => (Array.isArray(v) ? v.join(", ") : "")},
  {key: "bubble_us_per_step", label: "Bubble per step", fmt: fmtUs},
  {key: "bubble_pct", label: "Bubble share", fmt: fmtPct},
  {key: "busy_us_per_step", label: "Busy per step", fmt: fmtUs},
];

function renderPipeline(pp) {
  const head = [`${fmtCount(pp.stages)} stages × ${fmtCount((pp.pipelines || []).length)} replica(s)`];
  if (isNum(pp.microbatches)) head.push(`${fmtCount(pp.microbatches)} microbatches`);
  if (pp.schedule) head.push(`schedule ${pp.schedule}`);
  if (isNum(pp.bubble_pct)) head.push(`bubble ${fmtPct(pp.bubble_pct)} of the step`);
  if (isNum(pp.theoretical_bubble_pct)) head.push(`theoretical (p−1)/(m+p−1) = ${fmtPct(pp.theoretical_bubble_pct)}`);
  const table = h("table", {class: "grid-table stages-table"},
    h("thead", {}, h("tr", {}, STAGE_COLS.map((c) => h("th", {class: c.text ? null : "num"}, c.label)))),
    h("tbody", {}, (pp.per_stage || []).map((st) => h("tr", {}, STAGE_COLS.map((c) => h("td", {class: [c.text ? null : "num", `col-${c.key}`]},
      c.fmt(st[c.key])))))));
  const advice = (pp.advice || []).map((a) => h("p", {class: "note pipeline-advice"},
    `${a.title} (saves about ${fmtUs(a.saving_us_per_step)} per step, ${fmtPct(a.saving_pct)}): ${a.action}`));
  return h("div", {}, h("p", {class: "note pipeline-head"}, head.join(" · ")), table, ...advice);
}
