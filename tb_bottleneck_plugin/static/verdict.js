// The verdict on top of a report (report.verdict, judge/step_verdict.py, METRICS.md §19
// "Verdict"): the bottleneck in one sentence with its share of the step, the first fix as
// PyTorch code and the step time the step model predicts after it; or, when no fix is worth
// the server's threshold, that the run reads healthy. Every word and number is the server's:
// this module only lays them out. Trace strings as text.

import {h} from "./dom.js";
import {isNum, fmtPct, fmtStepMs, fmtStepMsChange} from "./format.js";

/** The verdict box of one report; null when the server sent none (an old cached report). */
export function verdictBox(report) {
  const v = report && report.verdict && typeof report.verdict === "object" ? report.verdict : null;
  if (!v) return null;
  const healthy = v.healthy === true;
  const fix = v.fix && typeof v.fix === "object" ? v.fix : null;
  const parts = [];
  parts.push(h("p", {class: "verdict-sentence"},
    String(v.sentence || ""),
    !healthy && isNum(v.share_pct) ? h("span", {class: "verdict-share"}, ` (its fix gives back ${fmtPct(v.share_pct, 0)} of the step)`) : null));
  if (fix) {
    const after = isNum(fix.step_ms) && isNum(fix.predicted_step_ms)
      ? `${fix.estimate ? "estimated" : "predicted"} step ${fmtStepMsChange(fix.step_ms, fix.predicted_step_ms)}` : null;
    parts.push(h("p", {class: "verdict-fix"},
      h("span", {class: "muted"}, "First fix: "),
      fix.code ? h("code", {class: "verdict-code"}, String(fix.code)) : String(fix.title || fix.rule || ""),
      after ? h("span", {class: "verdict-after"}, ` → ${after}`) : null,
      fix.estimate ? h("span", {class: "muted"}, " (the rule's estimate: no step model for this trace)") : null));
  }
  const extra = [];
  if (!healthy && isNum(v.all_fixes_step_ms)) extra.push(`all fixes together: ${fmtStepMs(v.all_fixes_step_ms)} per step`);
  const cp = v.critical_path && typeof v.critical_path === "object" ? v.critical_path : null;
  if (!healthy && cp && isNum(cp.host_pct) && isNum(cp.gpu_pct)) {
    extra.push(`critical path ${fmtPct(cp.host_pct, 0)} host, ${fmtPct(cp.gpu_pct, 0)} GPU`
      + (cp.top && cp.top.words ? ` (most of it ${String(cp.top.words)})` : ""));
  }
  if (extra.length) parts.push(h("p", {class: "verdict-extra muted"}, extra.join(" · ")));
  return h("div", {class: ["verdict", healthy ? "verdict-healthy" : "verdict-fix-first"], id: "bn-verdict",
    role: "status", "aria-label": "verdict", "data-healthy": healthy ? "true" : "false"}, parts);
}
