// The recommendations panel: every rule that fired on the server (recommendations.py),
// with its severity, action, numbers and evidence, in the server's order (by the step time
// each could give back, recommendations.py); nothing is decided or re-ordered here.
// Each item carries data-rule (and data-what-if: the step model's what-if that priced it), so
// the what-if panel (what_if.js) can scroll to it; a priced one says its predicted step
// ("predicted step 46.9 → 21.0 ms (−55.0%)": the server's step_ms, predicted_step_ms and
// estimated_gain_pct, only formatted here).

import {h} from "./dom.js";
import {fmtByName, humanizeKey, isNum, fmtPct, fmtStepMsChange} from "./format.js";
import {note, severityClass} from "./common.js";
import {mountPanel} from "./panels.js";

const CODE_LIKE = /^(?:[A-Za-z_][\w.]*\s*\(.*\)\s*$|[A-Z_][A-Z0-9_]*=\S|torch\.|model\s*=|with\s|import\s|from\s|python\s)/s;

function actionNode(action) {
  const text = String(action ?? "");
  if (!text) return null;
  if (text.includes("`")) {
    const parts = text.split(/`([^`]*)`/);
    return h("p", {class: "rec-action"}, parts.map((p, i) => (i % 2 ? h("code", {}, p) : p)));
  }
  if (CODE_LIKE.test(text.trim()) || text.includes("\n")) {
    return h("pre", {class: "code rec-code"}, h("code", {}, text));
  }
  return h("p", {class: "rec-action"}, text);
}

/** "predicted step 46.9 → 21.0 ms (−55.0%)" from the step model's price of the fix (server numbers). */
function predictedNode(r) {
  if (!isNum(r.step_ms) || !isNum(r.predicted_step_ms)) return null;
  const gain = isNum(r.estimated_gain_pct) ? ` (−${fmtPct(r.estimated_gain_pct)})` : "";
  return h("p", {class: "rec-predicted", title: r.what_if ? `step model what-if: ${String(r.what_if)}` : null},
    `predicted step ${fmtStepMsChange(r.step_ms, r.predicted_step_ms)}${gain}`);
}

/** The recommendations panel of one report, in the server's order (most step time first). */
export function recommendationsPanel(report) {
  const recs = Array.isArray(report.recommendations) ? report.recommendations : [];
  const body = recs.length
    ? h("ol", {class: "recs"}, recs.map((r, i) => {
      const sev = severityClass(r.severity);
      const nums = r.numbers && typeof r.numbers === "object" ? Object.entries(r.numbers) : [];
      const ev = Array.isArray(r.evidence) ? r.evidence : (r.evidence ? [r.evidence] : []);
      // the first (most step time) in full; the others by their title, a click shows the rest
      const li = h("li", {class: ["rec", `sev-${sev}`, i > 0 ? "rec-folded" : null], "data-rule": r.rule ? String(r.rule) : null,
        "data-what-if": r.what_if ? String(r.what_if) : null},
        h("div", {class: "rec-head", title: i > 0 ? "Click to show or hide the details" : null,
          onclick: () => li.classList.toggle("rec-folded")},
          h("span", {class: ["badge", `sev-${sev}`]}, String(r.severity || "info")),
          h("span", {class: "rec-title"}, String(r.title || r.rule || "Recommendation")),
          r.rule ? h("span", {class: "rec-rule", title: "rule name"}, String(r.rule)) : null),
        actionNode(r.action),
        predictedNode(r),
        r.gain_assumption ? h("p", {class: "rec-gain"}, typeof r.estimated_gain_pct === "number"
          ? `Could give back up to ${fmtByName("estimated_gain_pct", r.estimated_gain_pct)} of the step: ${r.gain_assumption}`
          : String(r.gain_assumption)) : null,
        nums.length ? h("div", {class: "chips"}, nums.map(([k, v]) =>
          h("span", {class: "chip", title: k}, h("span", {class: "chip-k"}, `${humanizeKey(k)}:`), " ", h("span", {class: "chip-v"}, fmtByName(k, v))))) : null,
        ev.length ? h("ul", {class: "evidence"}, ev.map((e) => h("li", {}, typeof e === "string" ? e : JSON.stringify(e)))) : null);
      return li;
    }))
    : note("No bottleneck rule fired for this selection.");
  return mountPanel(null, {title: "Recommendations", subtitle: recs.length ? "most step time first" : null,
    info: "Each recommendation names the rule that fired, the measured numbers behind it and the evidence in the trace."}, body);
}
