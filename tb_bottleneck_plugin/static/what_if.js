// "What would each fix buy?": the step model's what-if table (report.step_model, METRICS.md
// §19) as a horizontal waterfall: today's step, each fix alone (its predicted step and the
// saving against today), all fixes together, then the roofline ceiling apart (a bound, never
// a recommendation), the critical path's parts per step and how well the model reproduces the
// measured step. Every number is the server's (step_ms, predicted_step_ms, saving_us,
// saving_pct, critical_path_us): this module only divides by the step count and formats.
// A row that prices a recommendation that fired (the recommendation's `what_if`, else the
// row's rule) is a button that scrolls to that recommendation (recommendations.js gives each
// one data-rule / data-what-if) and highlights it. No fetching, no verdicts, trace strings as text.

import {h} from "./dom.js";
import {isNum, fmtPct, fmtStepMs, humanizeKey} from "./format.js";
import {note, naReason} from "./common.js";
import {mountPanel} from "./panels.js";

const TITLE = "What would each fix buy?";
const INFO = "The step model (METRICS.md §19) replays the trace's host calls, kernels, copies and syncs as a "
  + "dependency graph and reproduces the measured step; each what-if changes what one fix would change "
  + "(its assumption is in the row's hover text) and replays the graph again. Each fix is priced alone "
  + "against today's step; all fixes together is replayed once with every fix applied (savings overlap, "
  + "so it is not their sum). The roofline ceiling is a bound, not advice.";

// critical_path_us keys in words (the rest: format.js humanizeKey)
const PART_NAMES = {
  input_wait: "input wait", compile: "compiling", host_compute: "host compute", launch_overhead: "launch overhead",
  sync_overhead: "sync overhead", runtime_other: "other runtime calls", gpu_gemm: "GPU GEMM", gpu_conv: "GPU conv",
  gpu_attention: "GPU attention", gpu_elementwise: "GPU elementwise", gpu_other_kernels: "GPU other kernels",
  gpu_communication: "GPU communication", gpu_h2d: "H2D copies", gpu_d2h: "D2H copies", gpu_d2d: "D2D copies",
  gpu_memset: "memsets", gpu_compiled_kernels: "GPU compiled kernels", gpu_launch_latency: "GPU launch latency",
};

const HIGHLIGHT = "rec-highlight";

/** The rules a what-if row prices: `rule` (one id or null), or `rules` (a list). */
function rowRules(row) {
  if (typeof row.rule === "string" && row.rule) return [row.rule];
  return Array.isArray(row.rules) ? row.rules.filter((r) => typeof r === "string" && r) : [];
}

/** The recommendation (of this report) that a what-if row prices: the one whose `what_if`
 * names the row, else the first (server order) whose rule the row prices; null when none fired. */
function recommendationOf(row, recs) {
  const byId = recs.find((r) => r && r.what_if === row.id && r.rule);
  if (byId) return byId;
  const rules = rowRules(row);
  return recs.find((r) => r && r.rule && rules.includes(r.rule)) || null;
}

/** Scrolls to the recommendation of `rule` in the report holding `from` and highlights it (and
 * only it). Returns the element, or null when that report shows none. */
export function showRecommendation(from, rule) {
  for (let root = from.parentElement; root; root = root.parentElement) {
    const recs = [...root.querySelectorAll("li.rec[data-rule]")];
    const li = recs.find((el) => el.getAttribute("data-rule") === rule);
    if (!li) continue;
    for (const el of recs) el.classList.remove(HIGHLIGHT);
    li.classList.add(HIGHLIGHT);
    if (!li.hasAttribute("tabindex")) li.setAttribute("tabindex", "-1");
    li.classList.remove("rec-folded"); // a folded recommendation (recommendations.js) opens
    li.scrollIntoView({behavior: "smooth", block: "center"});
    li.focus({preventScroll: true});
    return li;
  }
  return null;
}

/** The ms per step of a saving the server gives summed over the steps (saving_us), else the
 * difference of its per-step numbers. */
function savingMs(row, steps) {
  if (isNum(row.saving_us) && isNum(steps) && steps > 0) return row.saving_us / steps / 1000;
  if (isNum(row.step_ms) && isNum(row.predicted_step_ms)) return row.step_ms - row.predicted_step_ms;
  return null;
}

function savingText(ms, pct) {
  return `−${fmtStepMs(ms)} (−${fmtPct(pct)})`;
}

/** One waterfall row: label, a track with the predicted step (and the saving against today
 * hatched at its end), the value text. */
function wfRow({cls, id, label, title, ms, todayMs, scaleMs, value, extra = {}}) {
  const width = (v) => `${Math.max(0, Math.min(100, (100 * v) / scaleMs))}%`;
  const bars = [h("span", {class: "wf-bar wf-kept", style: {width: width(ms)}})];
  if (isNum(todayMs) && isNum(ms) && todayMs > ms) {
    bars.push(h("span", {class: "wf-bar wf-saving", style: {left: width(ms), width: width(todayMs - ms)}}));
  }
  return h("div", {class: ["wf-row", cls], role: "listitem", title: title || null, "data-id": id,
    "data-ms": isNum(ms) ? String(ms) : null, ...extra},
  label,
  h("span", {class: "wf-track", "aria-hidden": "true"}, bars),
  h("span", {class: "wf-value"}, value));
}

/** The panel of one report (placed under the recommendations by views.js renderReport). */
export function whatIfPanel(report) {
  const sm = report && report.step_model && typeof report.step_model === "object" ? report.step_model : null;
  const spec = {title: TITLE, id: "bn-what-if", cls: "what-if", info: INFO, attrs: {"data-panel": "what_if"}};
  if (!sm) {
    const why = naReason(report, "step_model") || "no step model in this report";
    return mountPanel(null, spec, note(`n/a: ${why}`, "na wf-na"));
  }
  const steps = sm.steps;
  const rows = (Array.isArray(sm.what_if) ? sm.what_if : []).filter((r) => r && typeof r === "object");
  const all = sm.all_fixes && typeof sm.all_fixes === "object" ? sm.all_fixes : null;
  const ceiling = sm.ceiling && typeof sm.ceiling === "object" ? sm.ceiling : null;
  const firstMs = [all, ...rows, ceiling].find((r) => r && isNum(r.step_ms));
  const todayMs = firstMs ? firstMs.step_ms
    : (isNum(sm.step_us) && isNum(steps) && steps > 0 ? sm.step_us / steps / 1000 : null);
  if (!isNum(todayMs)) return mountPanel(null, spec, note("n/a: the step model gave no step time", "na wf-na"));
  const shown = rows.filter((r) => isNum(r.saving_us) && r.saving_us > 0);
  const scaleMs = Math.max(todayMs, ...[...shown, all, ceiling].filter((r) => r && isNum(r.predicted_step_ms)).map((r) => r.predicted_step_ms));
  const recs = Array.isArray(report.recommendations) ? report.recommendations.filter((r) => r && typeof r === "object") : [];

  const list = h("div", {class: "wf", role: "list", "aria-label": "predicted step time per fix"});
  list.appendChild(wfRow({cls: "wf-today", id: "today", label: h("span", {class: "wf-label"}, "Today"),
    title: `The measured step: ${fmtStepMs(todayMs)}${isNum(steps) ? ` (the mean over the profiled steps: ${steps})` : ""}`,
    ms: todayMs, todayMs, scaleMs, value: fmtStepMs(todayMs)}));
  for (const r of shown) {
    const label = String(r.label || r.id || "");
    const rec = recommendationOf(r, recs);
    const title = [String(r.assumption || ""), rec ? `Prices the recommendation “${rec.rule}”: click to show it.` : null]
      .filter(Boolean).join("\n");
    const labelNode = rec
      ? h("button", {type: "button", class: "wf-label wf-link", "data-rule": String(rec.rule),
        "aria-label": `${label}: show the recommendation ${rec.rule}`,
        onclick: (e) => showRecommendation(e.currentTarget, String(rec.rule))}, label)
      : h("span", {class: "wf-label"}, label);
    list.appendChild(wfRow({cls: "wf-fix", id: String(r.id ?? ""), label: labelNode, title, ms: r.predicted_step_ms, todayMs, scaleMs,
      value: [savingText(savingMs(r, steps), r.saving_pct), h("span", {class: "muted"}, ` → ${fmtStepMs(r.predicted_step_ms)}`)],
      extra: {"data-rule": rec ? String(rec.rule) : null, "data-saving-ms": isNum(savingMs(r, steps)) ? String(savingMs(r, steps)) : null}}));
  }
  if (all && isNum(all.predicted_step_ms)) {
    const ids = Array.isArray(all.ids) ? all.ids.map(String) : [];
    list.appendChild(wfRow({cls: "wf-all", id: "all_fixes", label: h("span", {class: "wf-label"}, "All fixes"),
      title: `Every fix at once${ids.length ? ` (${ids.join(", ")})` : ""}: replayed together, so not the sum of the rows above`,
      ms: all.predicted_step_ms, todayMs, scaleMs,
      value: [savingText(savingMs(all, steps), all.saving_pct), h("span", {class: "muted"}, ` → ${fmtStepMs(all.predicted_step_ms)}`)]}));
  }
  const legend = h("div", {class: "legend wf-legend"},
    h("span", {class: "legend-item"}, h("span", {class: "swatch wf-kept"}), h("span", {}, "predicted step")),
    h("span", {class: "legend-item"}, h("span", {class: "swatch wf-saving"}), h("span", {}, "what the fix gives back")),
    recs.length ? h("span", {class: "legend-item muted"}, "a linked row prices a recommendation above: click it to see that one") : null);
  const body = [legend, list];
  if (!shown.length) body.push(note("No fix the model knows would shorten this step."));
  if (ceiling && isNum(ceiling.predicted_step_ms)) {
    body.push(h("div", {class: "wf wf-bound", role: "list", "aria-label": "a bound, not a recommendation"},
      wfRow({cls: "wf-ceiling", id: String(ceiling.id ?? "ceiling"),
        label: h("span", {class: "wf-label"}, `Bound: ${String(ceiling.label || ceiling.id || "ceiling")}`),
        title: String(ceiling.assumption || "a bound, never a recommendation"),
        ms: ceiling.predicted_step_ms, todayMs, scaleMs,
        value: [fmtStepMs(ceiling.predicted_step_ms), h("span", {class: "muted"}, " (a bound, not a fix)")]})));
  }
  const cp = sm.critical_path_us && typeof sm.critical_path_us === "object" ? sm.critical_path_us : {};
  const parts = isNum(steps) && steps > 0
    ? Object.entries(cp).filter(([, v]) => isNum(v) && v > 0).sort((a, b) => b[1] - a[1]) : [];
  if (parts.length) {
    body.push(h("p", {class: "note wf-critical"}, h("span", {class: "wf-k"}, "critical path:"), " ",
      parts.map(([k, v], i) => [i ? h("span", {class: "dot"}, " · ") : null,
        h("span", {class: "wf-part", "data-part": k, title: k}, `${PART_NAMES[k] || humanizeKey(k)} ${fmtStepMs(v / steps / 1000)}`)]),
      " per step"));
  }
  if (isNum(sm.model_error_pct)) {
    body.push(note(`model reproduces the measured step within ${fmtPct(Math.abs(sm.model_error_pct))}`, "wf-error"));
  }
  // the server's reason when the model misses the trace by more than its limit (not_available)
  const unpriced = naReason(report, "step_model.what_if");
  if (unpriced) body.push(note(`n/a as prices: ${unpriced}`, "na wf-unpriced"));
  const subtitle = `each fix alone against today's ${fmtStepMs(todayMs)} step`;
  return mountPanel(null, {...spec, subtitle}, ...body);
}
