// The recommendations panel: every rule that fired on the server (recommendations.py),
// with its severity, action, numbers and evidence. The order words come from the server's
// severities; nothing is decided here.

import {h} from "./dom.js";
import {fmtByName, humanizeKey} from "./format.js";
import {panel, note, severityClass} from "./common.js";

const SEVERITY_ORDER = {high: 0, medium: 1, low: 2, ok: 3};

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

/** The recommendations panel of one report, most severe first. */
export function recommendationsPanel(report) {
  const recs = Array.isArray(report.recommendations) ? [...report.recommendations] : [];
  recs.forEach((r, i) => { r.__i = i; });
  recs.sort((a, b) => {
    const sa = SEVERITY_ORDER[String(a.severity || "").toLowerCase()] ?? 3.5;
    const sb = SEVERITY_ORDER[String(b.severity || "").toLowerCase()] ?? 3.5;
    return sa - sb || a.__i - b.__i;
  });
  const body = recs.length
    ? h("ol", {class: "recs"}, recs.map((r) => {
      const sev = severityClass(r.severity);
      const nums = r.numbers && typeof r.numbers === "object" ? Object.entries(r.numbers) : [];
      const ev = Array.isArray(r.evidence) ? r.evidence : (r.evidence ? [r.evidence] : []);
      return h("li", {class: ["rec", `sev-${sev}`]},
        h("div", {class: "rec-head"},
          h("span", {class: ["badge", `sev-${sev}`]}, String(r.severity || "info")),
          h("span", {class: "rec-title"}, String(r.title || r.rule || "Recommendation")),
          r.rule ? h("span", {class: "rec-rule", title: "rule name"}, String(r.rule)) : null),
        actionNode(r.action),
        nums.length ? h("div", {class: "chips"}, nums.map(([k, v]) =>
          h("span", {class: "chip", title: k}, h("span", {class: "chip-k"}, `${humanizeKey(k)}:`), " ", h("span", {class: "chip-v"}, fmtByName(k, v))))) : null,
        ev.length ? h("ul", {class: "evidence"}, ev.map((e) => h("li", {}, typeof e === "string" ? e : JSON.stringify(e)))) : null);
    }))
    : note("No bottleneck rule fired for this selection.");
  return panel("Recommendations", {subtitle: recs.length ? "most severe first" : null,
    info: "Each recommendation names the rule that fired, the measured numbers behind it and the evidence in the trace."}, body);
}
