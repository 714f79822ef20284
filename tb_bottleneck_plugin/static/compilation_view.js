// torch.compile details (METRICS.md §16, report.compilation): the graph breaks and recompiles the
// server found, the compiled frames, and the Inductor (Triton) kernels with the ATen ops each one
// fused. The Compilation card (cards.js) holds the verdict; this panel only lists. Kernel names
// and op lists come from the trace: text only.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtCount} from "./format.js";
import {note, naReason, kv} from "./common.js";
import {registerPanel} from "./panels.js";

function table(cls, head, rows) {
  return h("div", {class: "table-scroll"}, h("table", {class: ["grid-table", "compact", "wrap", cls]},
    h("thead", {}, h("tr", {}, head.map(([label, num, title]) => h("th", {class: num ? "num" : null, title: title || null}, label)))),
    h("tbody", {}, rows)));
}

function breaksSection(c) {
  const broken = Array.isArray(c.broken_regions) ? c.broken_regions : [];
  const recs = Array.isArray(c.recompile_ids) ? c.recompile_ids : [];
  const out = [];
  if (c.breaks_per_step === null || c.breaks_per_step === undefined) {
    out.push(note(`Graph breaks and recompiles: n/a (${c.has_regions === false ? "no Torch-Compiled Region markers in this trace" : "not recorded"})`, "na"));
    return out;
  }
  out.push(h("h3", {class: "sub-h"}, `Graph breaks: ${fmtCount(c.breaks_per_step)} per step`));
  out.push(broken.length ? table("compile-breaks", [["Region (frame/compile)"], ["Frame", true], ["Breaks", true], ["Per step", true], ["Nested regions", true]],
    broken.map((b) => h("tr", {}, h("td", {class: "mono"}, String(b.id ?? "")), h("td", {class: "num"}, String(b.frame ?? "")),
      h("td", {class: "num"}, fmtCount(b.count)), h("td", {class: "num"}, fmtCount(b.per_step)), h("td", {class: "num"}, fmtCount(b.nested)))))
    : note("No compiled frame broke into pieces in the steps."));
  out.push(h("h3", {class: "sub-h"}, `Recompiles: ${fmtCount(c.recompiles)}${isNum(c.steady_recompiles) ? ` (${fmtCount(c.steady_recompiles)} in the steady state)` : ""}`));
  out.push(recs.length ? table("compile-recompiles", [["Compile id"], ["Frame", true], ["First step", true], ["Regions", true], ["Compiled in that step"], ["Steady state"]],
    recs.map((r) => h("tr", {}, h("td", {class: "mono"}, String(r.id ?? "")), h("td", {class: "num"}, String(r.frame ?? "")),
      h("td", {class: "num"}, String(r.first_step ?? "")), h("td", {class: "num"}, fmtCount(r.regions)),
      h("td", {}, r.compiled_in_step ? "yes" : "no"), h("td", {}, r.steady ? "yes" : "no"))))
    : note("No recompile in the steps."));
  return out;
}

function kernelsSection(c) {
  const ks = Array.isArray(c.kernels) ? c.kernels : [];
  if (!ks.length) return [note("No Inductor (Triton) kernels in the steps.")];
  const total = isNum(c.triton_kernels) ? c.triton_kernels : ks.length;
  return [h("h3", {class: "sub-h"}, `Triton kernels and the ops they fused${total > ks.length ? ` (top ${ks.length} of ${fmtCount(total)})` : ""}`),
    table("triton-kernels", [["Kernel"], ["Kind"], ["Fused ops", false, "ATen/Inductor ops from Inductor's generated code when it is on this machine, else read from the kernel name (unknown: neither tells); hover a cell for its source"],
      ["Launches", true], ["Time / step", true], ["% of Triton", true], ["In CUDA graphs", true]],
    ks.map((k) => h("tr", {"data-kernel": String(k.name ?? "")},
      h("td", {class: "mono"}, String(k.name ?? "")), h("td", {}, String(k.kind ?? "")),
      h("td", {class: "mono fused-ops", title: k.fused_ops_source ? `source: ${String(k.fused_ops_source)}` : null}, Array.isArray(k.ops) ? k.ops.map(String).join(", ") : ""),
      h("td", {class: "num"}, fmtCount(k.count)), h("td", {class: "num"}, fmtUs(k.us_per_step)),
      h("td", {class: "num"}, fmtPct(k.pct_of_triton)), h("td", {class: "num"}, fmtCount(k.graph_count)))))];
}

const LABEL_KINDS = {compiled_graph: "Compiled graph calls (## Call CompiledFxGraph … ##)", compile_pass: "Compile passes (… compile_id=N/M)"};

/** torch.compile's own record_function labels (report.source_attribution.labels, the server's
 * `kind`): one row per kind (calls, CPU span), the labels themselves on hover; they are left
 * out of the Source section's label table. */
function compileLabelsSection(report) {
  const sa = report && report.source_attribution && typeof report.source_attribution === "object" ? report.source_attribution : {};
  const labels = Array.isArray(sa.labels) ? sa.labels.filter((r) => r && LABEL_KINDS[r.kind]) : [];
  if (!labels.length) return [];
  const rows = Object.entries(LABEL_KINDS).map(([kind, words]) => {
    const of = labels.filter((r) => r.kind === kind);
    if (!of.length) return null;
    const sum = (k) => of.reduce((a, r) => a + (isNum(r[k]) ? r[k] : 0), 0);
    return h("tr", {"data-kind": kind, title: of.slice(0, 20).map((r) => String(r.name ?? "")).join("\n")},
      h("td", {}, words), h("td", {class: "num"}, fmtCount(of.length)), h("td", {class: "num"}, fmtCount(sum("count"))),
      h("td", {class: "num"}, fmtUs(sum("cpu_us"))));
  });
  return [h("h3", {class: "sub-h"}, "torch.compile's own record_function labels"),
    table("compile-labels", [["Kind"], ["Labels", true], ["Calls", true], ["CPU span", true]], rows)];
}

/** The panel body for one report. */
export function renderCompilation(container, report) {
  const c = report && report.compilation && typeof report.compilation === "object" ? report.compilation : null;
  if (!c) {
    mount(container, note(`n/a: ${naReason(report, "compilation") || "no compilation section in this report"}`, "na"));
    return container;
  }
  const frames = Array.isArray(c.frames) ? c.frames : [];
  mount(container,
    kv([
      ["Compiled share of the step", isNum(c.compiled_pct) ? `${fmtPct(c.compiled_pct)} (eager ${fmtPct(c.eager_pct)}, compiling ${fmtPct(c.compile_pct)})`
        : `n/a${naReason(report, "compilation.compiled_pct") ? ` (${naReason(report, "compilation.compiled_pct")})` : ""}`],
      isNum(c.compiled_gpu_pct) ? ["GPU time launched from compiled code", `${fmtPct(c.compiled_gpu_pct)} of kernel time`] : null,
      isNum(c.triton_pct) ? ["Kernel families", `Triton ${fmtPct(c.triton_pct)} · library GEMMs ${fmtPct(c.gemm_pct)} · attention ${fmtPct(c.attention_pct)} of kernel time`] : null,
      isNum(c.guard_us) ? ["Guard checks", `${fmtUs(c.guard_us)} in ${fmtCount(c.guard_calls)} calls (${fmtPct(c.guard_pct)} of step time)`] : null,
      isNum(c.graph_launches) && c.graph_launches > 0 ? ["CUDA graphs", `${fmtCount(c.graph_launches)} replays, ${fmtPct(c.graph_gpu_pct)} of kernel time`] : null,
      frames.length ? ["Compiled frames", frames.map((f) => `${f.frame} (compile ids ${(f.compile_ids || []).join(", ")})`).join(" · ")] : null,
    ]),
    ...breaksSection(c),
    ...kernelsSection(c),
    ...compileLabelsSection(report));
  return container;
}

registerPanel({
  id: "compilation",
  label: "torch.compile details",
  order: 35,
  section: "compile", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "torch.compile and CUDA graphs (METRICS.md §16): graph breaks, recompiles, the compiled frames and the "
    + "Inductor (Triton) kernels with the ATen ops each fused. The Compilation card holds the verdict.",
  render(container, ctx) {
    renderCompilation(container, ctx.report);
  },
});
