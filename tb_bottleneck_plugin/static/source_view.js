// Source lines, nn.Modules and record_function labels (METRICS.md §17, report.source_attribution):
// the lines that stall the step (sync, DataLoader), the top lines by CPU + GPU time, the module
// tree (expand/collapse, siblings sorted by GPU time) and the label table. All numbers are the
// server's. File paths are text, never links this tab opens.
//
// VS Code: inside VS Code's TensorBoard view, a click on a line posts
//   {filename: "<file as the trace names it>", line: <number>}
// with targetOrigin "*" to window.parent.parent: the message torch-tb-profiler's frontend sends
// (its navToCode(filename, line), tb_plugin/fe/src/utils/vscode.ts), which VS Code's Python
// extension answers by opening the file at that line. The plugin's iframe sits in TensorBoard's
// page (window.parent), itself in VS Code's webview (window.parent.parent); elsewhere the message
// reaches TensorBoard's page, which ignores it. Nothing is posted when the tab is opened alone.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtCount} from "./format.js";
import {note, naReason} from "./common.js";
import {registerPanel} from "./panels.js";

const TREE_OPEN_DEPTH = 1; // module rows open to this depth at first (roots and their children shown)
const LINES_SHOWN = 20;

/** Posts torch-tb-profiler's "open this file at this line" message to VS Code (see the header). */
export function navToCode(filename, line) {
  try {
    const target = window.parent && window.parent !== window ? window.parent.parent : null;
    if (target) target.postMessage({filename: String(filename), line: Number(line)}, "*");
  } catch (e) {
    // not inside a frame that can be posted to: nothing to do
  }
}

function lineCell(row) {
  const frame = String(row.frame ?? `${row.file ?? "?"}(${row.line ?? "?"})`);
  if (!row.file || !isNum(row.line)) return h("span", {class: "mono src-frame"}, frame);
  return h("button", {type: "button", class: "src-line mono", "data-file": String(row.file), "data-line": String(row.line),
    title: `${row.file}:${row.line}\nIn VS Code's TensorBoard view a click opens this line in the editor.`,
    onclick: () => navToCode(row.file, row.line)}, frame);
}

function table(cls, cols, rows) {
  return h("div", {class: "table-scroll"}, h("table", {class: ["grid-table", "compact", "wrap", cls]},
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", {class: c.num ? "num" : null, title: c.title || null}, c.label)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, cols.map((c) => h("td", {class: [c.num ? "num" : null, `col-${c.key}`]}, c.get(r))))))));
}

function bottleneckSection(sa) {
  const b = sa.bottlenecks && typeof sa.bottlenecks === "object" ? sa.bottlenecks : {};
  const out = [];
  for (const [key, title] of [["sync", "Synchronisation by line"], ["dataloader", "DataLoader wait by line"]]) {
    const rows = Array.isArray(b[key]) ? b[key] : [];
    if (!rows.length) continue;
    out.push(h("h3", {class: "sub-h"}, title), table(`src-${key}`, [
      {key: "frame", label: "Line (user frame)", get: lineCell},
      {key: "op", label: "Caused by", get: (r) => h("span", {class: "mono"}, String(r.op ?? ""))},
      {key: "us", label: "Time", num: true, get: (r) => fmtUs(r.us)},
      {key: "pct", label: "% of step", num: true, get: (r) => fmtPct(r.pct)},
      {key: "count", label: "Calls", num: true, get: (r) => fmtCount(r.count)},
    ], rows));
  }
  return out;
}

function linesSection(sa) {
  const rows = Array.isArray(sa.lines) ? sa.lines.slice(0, LINES_SHOWN) : [];
  if (!rows.length) return [];
  return [h("h3", {class: "sub-h"}, `Top lines by CPU + GPU time${sa.lines.length > rows.length ? ` (${rows.length} of ${sa.lines.length})` : ""}`),
    table("src-lines", [
      {key: "frame", label: "Line", get: lineCell},
      {key: "cpu_us", label: "CPU (top-level ops)", num: true, get: (r) => fmtUs(r.cpu_us)},
      {key: "gpu_us", label: "GPU launched", num: true, get: (r) => fmtUs(r.gpu_us)},
      {key: "kernels", label: "Kernels", num: true, get: (r) => fmtCount(r.kernels)},
      {key: "sync_us", label: "Sync", num: true, get: (r) => fmtUs(r.sync_us)},
      {key: "dataloader_us", label: "DataLoader", num: true, get: (r) => fmtUs(r.dataloader_us)},
      {key: "calls", label: "Op calls", num: true, get: (r) => fmtCount(r.calls)},
    ], rows),
    sa.frame_naming ? note(`Lines are named by ${sa.frame_naming === "function's first line" ? "the first line of the function (with_stack frames)" : String(sa.frame_naming)}.`
      + (isNum(sa.unattributed_gpu_us) && sa.unattributed_gpu_us > 0 ? ` GPU time launched from no user frame: ${fmtUs(sa.unattributed_gpu_us)}.` : "")) : null];
}

const gpuOf = (r) => (isNum(r.gpu_us) ? r.gpu_us : (r.gpu_fwd_us || 0) + (r.gpu_bwd_us || 0));

/** The module tree: one row per module path, children under their parent, siblings by GPU time. */
export function moduleTree(rows) {
  const byParent = new Map();
  const paths = new Set(rows.map((r) => r.path));
  for (const r of rows) {
    const parent = r.parent && paths.has(r.parent) ? r.parent : null;
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(r);
  }
  for (const list of byParent.values()) list.sort((a, b) => gpuOf(b) - gpuOf(a) || String(a.path).localeCompare(String(b.path)));
  const open = new Set(rows.filter((r) => isNum(r.depth) && r.depth < TREE_OPEN_DEPTH).map((r) => r.path));
  const tbody = h("tbody");
  function draw() {
    const out = [];
    const walk = (parent, depth) => {
      for (const r of byParent.get(parent) || []) {
        const kids = byParent.get(r.path) || [];
        const isOpen = open.has(r.path);
        const toggle = kids.length ? h("button", {type: "button", class: "tree-toggle", "aria-expanded": isOpen ? "true" : "false",
          title: isOpen ? "Collapse" : `Expand (${kids.length} child module${kids.length === 1 ? "" : "s"})`,
          onclick: () => { if (isOpen) open.delete(r.path); else open.add(r.path); draw(); }}, isOpen ? "▾" : "▸")
          : h("span", {class: "tree-leaf"}, "·");
        out.push(h("tr", {class: "module-row", "data-path": String(r.path), "data-depth": String(depth)},
          h("td", {class: "module-name", style: {"padding-left": `${4 + depth * 16}px`}, title: String(r.path)},
            toggle, " ", h("span", {class: "mono"}, String(r.module ?? r.path))),
          h("td", {class: "num"}, fmtCount(r.calls)),
          h("td", {class: "num"}, fmtUs(r.gpu_fwd_us)),
          h("td", {class: "num"}, fmtUs(r.gpu_bwd_us)),
          h("td", {class: "num"}, fmtUs(gpuOf(r))),
          h("td", {class: "num"}, fmtUs(r.self_us)),
          h("td", {class: "num"}, fmtUs(r.total_us))));
        if (isOpen) walk(r.path, depth + 1);
      }
    };
    walk(null, 0);
    mount(tbody, out);
  }
  draw();
  const head = [["Module", null], ["Calls", null], ["GPU fwd", "GPU time launched inside the module's forward (children included)"],
    ["GPU bwd", "GPU time of the backward ops matched to the module's forward ops (children included)"], ["GPU total", null],
    ["Self CPU", "The module frame's CPU time minus its child modules' frames"], ["Total CPU", null]];
  return h("div", {class: "table-scroll"}, h("table", {class: "grid-table compact module-tree"},
    h("thead", {}, h("tr", {}, head.map(([l, t], i) => h("th", {class: i ? "num" : null, title: t}, l)))), tbody));
}

function labelsSection(sa) {
  // the program's own labels; torch.compile's (the server's kind) are in the Compile section
  const all = Array.isArray(sa.labels) ? sa.labels : [];
  const rows = all.filter((r) => !r.kind || r.kind === "user").sort((a, b) => (b.cpu_us || 0) - (a.cpu_us || 0));
  const compiled = all.length - rows.length;
  const moved = compiled ? note(`${fmtCount(compiled)} label${compiled === 1 ? "" : "s"} of torch.compile (compiled graph calls, compile passes) are listed in the Compile section.`) : null;
  if (!rows.length) return [note("No record_function labels of the program in the steps."), moved];
  return [table("src-labels", [
    {key: "name", label: "Label", get: (r) => h("span", {class: "mono"}, String(r.name ?? ""))},
    {key: "count", label: "Calls", num: true, get: (r) => fmtCount(r.count)},
    {key: "cpu_us", label: "CPU span", num: true, get: (r) => fmtUs(r.cpu_us)},
    {key: "gpu_us", label: "GPU launched", num: true, get: (r) => fmtUs(r.gpu_us)},
    {key: "gpu_annotation_us", label: "GPU range", num: true, title: "The label's GPU-side range (gpu_user_annotation), idle gaps included",
      get: (r) => fmtUs(r.gpu_annotation_us)},
  ], rows), moved,
  isNum(sa.label_coverage_pct) ? note(`The labels cover ${fmtPct(sa.label_coverage_pct)} of the host step time (their union).`) : null];
}

/** The panel body for one report. */
export function renderSource(container, report) {
  const sa = report && report.source_attribution && typeof report.source_attribution === "object" ? report.source_attribution : null;
  if (!sa) {
    mount(container, note(`n/a: ${naReason(report, "source_attribution") || "no source attribution in this report"}`, "na"));
    return container;
  }
  const parts = [];
  const noLines = !Array.isArray(sa.lines);
  if (noLines) {
    // one line for lines, bottlenecks and modules: the server's reason carries the with_stack hint
    const why = naReason(report, "source_attribution.lines") || sa.hint || "the trace has no Python stacks";
    parts.push(note(`Source lines and modules: n/a — ${why}${sa.hint && !String(why).includes(sa.hint) ? ` (${sa.hint})` : ""}`, "na src-na"));
  } else {
    parts.push(...bottleneckSection(sa), ...linesSection(sa));
    const mods = Array.isArray(sa.modules) ? sa.modules : [];
    parts.push(h("h3", {class: "sub-h"}, "nn.Modules (sorted by GPU time)"));
    parts.push(mods.length ? moduleTree(mods)
      : note(`n/a: ${naReason(report, "source_attribution.modules") || "no nn.Module frames in the trace"}`, "na"));
  }
  parts.push(h("h3", {class: "sub-h"}, "record_function labels"), ...labelsSection(sa));
  mount(container, parts);
  return container;
}

registerPanel({
  id: "source",
  label: "Source lines & modules",
  order: 30,
  section: "source", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "Which line of your code the time belongs to (METRICS.md §17): the lines that stall the step on a "
    + "synchronisation or the DataLoader, the CPU and GPU time of each line, of each nn.Module (forward and backward) "
    + "and of each record_function label. Needs torch.profiler.profile(with_stack=True) for lines and modules.",
  render(container, ctx) {
    renderSource(container, ctx.report);
  },
});
