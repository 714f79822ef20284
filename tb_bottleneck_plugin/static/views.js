// The single-run report view: the summary line, the verdict (verdict.js), what each fix would
// buy (what_if.js), the cards (cards.js), the recommendations (recommendations.js) and the
// panels built from one report object (docs/report-schema.md).
// Every string from a trace goes through h() as text. No fetching here: the memory and
// kernel panels get their data from ctx.data (model.js); no verdicts decided here: colours
// are the server's severities (report.verdicts, recommendations).

import {h, clear} from "./dom.js";
import {responsive, stackedBarChart, histogram, withTooltip} from "./charts.js";
import {isNum, fmtPct, fmtUs, fmtUsTick, fmtCount, fmtNum, readableKey} from "./format.js";
import {CATEGORIES, CAT_NAMES, CAT_COLORS, CAT_DEFS, BREAKDOWN_DEF, DEFS} from "./defs.js";
import {
  kv, note, naReason, gpuEntries, isCpuOnly, cpuOnlyReason, deviceLabel, memoryDevices, verdictSeverity,
} from "./common.js";
import {renderCards, renderCardGroups, coresWord} from "./cards.js";
import {mountSections} from "./sections.js";
import {mountPanel} from "./panels.js";
import {recommendationsPanel} from "./recommendations.js";
import {whatIfPanel} from "./what_if.js";
import {verdictBox} from "./verdict.js";
import {memoryPanel} from "./memory_view.js";
import {kernelPanel} from "./kernel_table.js";

export {CATEGORIES} from "./defs.js";
export {naReason, isCpuOnly} from "./common.js";

/**
 * Renders a whole report into container.
 * ctx: {sel: {run, worker, span}, spans: [{span, file, timestamp}], onPickSpan(span),
 *       data: model.js selectionData (kernels(), memory()), signal,
 *       open: the section ids the URL names (null: the server's), onToggle(openIds),
 *       flat: true for the offline page (no section bar, every panel)}
 * Returns the sections (sections.js mountSections; null when flat) for the registered panels.
 */
export function renderReport(container, report, ctx) {
  clear(container);
  const cpuOnly = isCpuOnly(report);
  container.appendChild(summaryBar(report, ctx));
  if (cpuOnly) {
    // One statement: the backend's reason ("CPU-only trace: no GPU activity") says the same.
    const why = cpuOnlyReason(report);
    container.appendChild(h("div", {class: "banner banner-info", role: "status"},
      h("strong", {}, "CPU-only trace: no GPU metrics."),
      " GPU utilization, Tensor Cores, occupancy and the kernel table need GPU kernels in the trace.",
      why && !/cpu[- ]only/i.test(why) ? h("span", {class: "muted"}, ` (${why})`) : null));
  }
  const sectionErrors = Array.isArray(report.errors) ? report.errors.filter((e) => e && typeof e === "object") : [];
  if (sectionErrors.length) {
    container.appendChild(h("div", {class: "banner banner-warn", role: "status"},
      h("strong", {}, `${sectionErrors.length} analysis section${sectionErrors.length === 1 ? "" : "s"} failed on this trace; `
        + "their numbers are shown as n/a:"),
      h("ul", {class: "err-list"}, sectionErrors.map((e) => h("li", {}, h("code", {}, String(e.section ?? "")), " ", String(e.error ?? ""))))));
  }
  const fileErrors = Array.isArray(report.file_errors) ? report.file_errors.filter((e) => e && typeof e === "object") : [];
  if (fileErrors.length) {
    container.appendChild(h("div", {class: "banner banner-warn", role: "status"},
      h("strong", {}, `${fileErrors.length} trace file${fileErrors.length === 1 ? "" : "s"} could not be analysed and ${fileErrors.length === 1 ? "is" : "are"} left out of this summary:`),
      h("ul", {class: "err-list"}, fileErrors.map((e) => {
        const msg = String(e.error ?? "");
        const showFile = e.file && !msg.includes(String(e.file)); // messages usually start with the file
        return h("li", {}, showFile ? h("code", {}, String(e.file)) : null, showFile ? " " : null, msg);
      }))));
  }
  // the verdict first (issue 35), what each fix would buy right under it, then the evidence
  const verdict = verdictBox(report);
  if (verdict) container.appendChild(verdict);
  if (ctx && ctx.flat) {
    // the offline page (report_page.js): every panel, one after the other
    container.appendChild(whatIfPanel(report));
    container.appendChild(renderCards(h("div", {class: "cards-wrap"}), [report])); // every card: a document to read
    container.appendChild(recommendationsPanel(report));
    container.appendChild(h("div", {class: "row row-3-2"}, breakdownPanel(report), inputPanel(report)));
    container.appendChild(h("div", {class: "row row-3-2"}, memoryPanel(report, ctx), occupancyPanel(report, cpuOnly)));
    container.appendChild(kernelPanel(report, ctx, cpuOnly));
    container.appendChild(h("div", {class: "row row-1-1"}, tensorCorePanel(report, cpuOnly), otherSignalsPanel(report, cpuOnly)));
    const na = notAvailablePanel(report);
    if (na) container.appendChild(na);
    return null;
  }
  // the tab: the panels by topic under a section bar (sections.js; open ones the server's or the URL's)
  const sections = mountSections(container, report, {open: ctx && ctx.open, onToggle: ctx && ctx.onToggle});
  const put = (id, build) => {
    const s = sections.section(id); // a section the run does not have (no GPU: no Kernels) is left out
    if (s) s.onOpen((el) => { for (const node of [].concat(build())) if (node) el.appendChild(node); });
  };
  put("overview", () => [whatIfPanel(report), renderCardGroups(h("div", {class: "cards-wrap"}), report),
    recommendationsPanel(report), h("div", {class: "row row-3-2"}, breakdownPanel(report), inputPanel(report))]);
  put("kernels", () => [h("div", {class: "row row-1-1"}, occupancyPanel(report, cpuOnly), tensorCorePanel(report, cpuOnly)),
    kernelPanel(report, ctx, cpuOnly), otherSignalsPanel(report, cpuOnly)]);
  put("memory", () => memoryPanel(report, ctx));
  const na = notAvailablePanel(report);
  if (na) {
    // the n/a numbers and their reasons, one click away at the end of the overview
    const n = Object.keys(report.not_available || {}).length;
    put("overview", () => h("details", {class: "na-details"}, h("summary", {class: "muted"}, `Not available here: ${n} number${n === 1 ? "" : "s"}, with the reason`), na));
  }
  return sections;
}

/** [5,6,7,9] -> ["#5–#7", "#9"] */
function stepRanges(nums) {
  const sorted = [...new Set(nums.filter(isNum))].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    out.push(j > i ? `#${sorted[i]}–#${sorted[j]}` : `#${sorted[i]}`);
    i = j + 1;
  }
  return out;
}

function summaryBar(report, ctx) {
  const steps = report.steps || {};
  const nums = Array.isArray(steps.numbers) ? steps.numbers : [];
  const bits = [];
  for (const [id] of gpuEntries(report)) bits.push(deviceLabel(report, id, true));
  if (!bits.length) {
    for (const id of Object.keys(report.device_names || {})) bits.push(deviceLabel(report, id, true));
  }
  if (steps.found === false) {
    bits.push("one window (no ProfilerStep)");
  } else if (isNum(steps.count)) {
    let range = "";
    if (nums.length) {
      const rs = stepRanges(nums);
      range = ` (${rs.length > 6 ? `${rs.slice(0, 3).join(", ")}, … ${rs[rs.length - 1]}` : rs.join(", ")})`;
    }
    bits.push(`${steps.count} step${steps.count === 1 ? "" : "s"}${range}`);
  }
  if (isNum(report.avg_step_us)) bits.push(`${steps.found === false ? "window" : "avg step"} ${fmtUs(report.avg_step_us)}`);
  const tr = report.trace || {};
  if (tr.era) bits.push(`format ${tr.era}`);
  if (isNum(tr.events)) bits.push(`${fmtCount(tr.events)} events`);
  const lines = [];
  const isSummary = report.span === null || report.span === undefined || (ctx && ctx.sel && ctx.sel.span === "all");
  if (isSummary && Array.isArray(report.spans) && report.spans.length > 1) {
    lines.push(note(`Summary of ${report.spans.length} trace files: ratio of sums over all included steps of every span.`));
  }
  if (steps.found === false) lines.push(note("No ProfilerStep found: the whole trace is analysed as one window.", "warn"));
  const excl = Array.isArray(steps.excluded) ? steps.excluded : [];
  if (excl.length) {
    lines.push(note(`Excluded: ${excl.map((e) => `step ${e.number} (${e.reason}${isNum(e.spans) && e.spans > 1 ? `, in ${e.spans} spans` : ""})`).join("; ")}`));
  }
  const warnings = Array.isArray(tr.warnings) ? tr.warnings : [];
  for (const w of warnings) lines.push(note(`⚠ ${w}`, "warn"));
  return h("div", {class: "summary"},
    h("div", {class: "summary-line"}, bits.map((b, i) => [i ? h("span", {class: "dot"}, "·") : null, h("span", {}, b)])),
    report.source ? h("div", {class: "source", title: report.source}, report.source) : null,
    ...lines);
}

function breakdownPanel(report) {
  const per = Array.isArray(report.breakdown_per_step) ? report.breakdown_per_step : [];
  const pct = report.breakdown_pct || {};
  const us = report.breakdown_us || {};
  // A summary has one bar per step number across its spans (the mean; "spans" how many
  // have that step, min/max and the worker/span of the slowest): bounded by steps, not ranks.
  const stepTitle = (p) => {
    if (!isNum(p.spans) || p.spans <= 1) return `Step ${p.step}`;
    const slowest = p.max_worker != null ? ` · slowest ${fmtUs(p.max_total_us)} (worker ${p.max_worker}, span ${p.max_span})` : "";
    return `Step ${p.step}: mean of ${p.spans} spans · fastest ${fmtUs(p.min_total_us)}${slowest}`;
  };
  let bars = per.map((p) => ({label: `#${p.step}`, title: stepTitle(p), total: p.total_us,
    parts: Object.fromEntries(CATEGORIES.map((k) => [k, p[k]]))}));
  if (!bars.length && Object.keys(us).length) {
    bars = [{label: "avg", title: "Average step", total: report.avg_step_us, parts: us}];
  }
  if (!bars.length) {
    return mountPanel(null, {title: "Step-time breakdown", info: BREAKDOWN_DEF}, note(naReason(report, "breakdown_pct", "breakdown_us") || "No breakdown in this report."));
  }
  const present = CATEGORIES.filter((k) => bars.some((b) => isNum(b.parts[k]) && b.parts[k] > 0));
  const legend = h("div", {class: "legend"}, CATEGORIES.map((k) => h("span", {
    class: ["legend-item", present.includes(k) ? null : "legend-zero"], title: CAT_DEFS[k]},
  h("span", {class: "swatch", style: {background: CAT_COLORS[k]}}),
  h("span", {}, CAT_NAMES[k]),
  h("span", {class: "legend-v"}, isNum(pct[k]) ? fmtPct(pct[k]) : (isNum(us[k]) ? fmtUs(us[k]) : "")))));
  const chart = responsive(h("div", {class: "chart-box"}), (w) => stackedBarChart({
    width: w, height: 250, bars, keys: CATEGORIES, colors: CAT_COLORS, names: CAT_NAMES,
    fmt: fmtUs, axisFmt: fmtUsTick}));
  const avg = isNum(report.avg_step_us) ? `average step ${fmtUs(report.avg_step_us)}` : null;
  return mountPanel(null, {title: "Step-time breakdown", info: BREAKDOWN_DEF, subtitle: avg}, legend, chart,
    note("Percentages in the legend are shares of the average step. Hover a segment for its time."),
    per.some((p) => isNum(p.spans) && p.spans > 1)
      ? note("Each bar is one step number: the mean over the trace files that ran it; its tooltip names the slowest (open that worker for its own steps).")
      : null);
}

// ------------------------------------------------------------ input pipeline

function inputPanel(report) {
  const inp = report.input || {};
  const ev = inp.evidence || {};
  const st = inp.stats || {};
  const its = Array.isArray(ev.dataloader_iterators) ? ev.dataloader_iterators : [];
  const rows = [
    ["Input-bound (DataLoader wait)", h("span", {class: `sev-text-${verdictSeverity(report, "input_bound")}`},
      `${fmtPct(inp.input_bound_pct)}${isNum(inp.input_bound_pct) && inp.verdict ? ` · ${inp.verdict}` : ""}`), DEFS.input],
    ["Input transfer (H2D not under kernels)", fmtPct(inp.input_transfer_pct), DEFS.transfer],
    isNum(inp.xprof_input_pct) ? ["XProf-compatible input %", `${fmtPct(inp.xprof_input_pct)} (input-bound + input transfer)`] : null,
    isNum(st.mean) ? ["Per step", `mean ${fmtPct(st.mean)} · min ${fmtPct(st.min)} · max ${fmtPct(st.max)} · std ${fmtNum(st.std)} pp`] : null,
    its.length ? ["DataLoader iterator", h("span", {}, its.map((it, i) => [i ? ", " : null, h("code", {}, it)]),
      ev.num_workers_zero ? h("span", {class: `sev-text-${verdictSeverity(report, "input_bound")}`}, " → num_workers=0") : null)] : null,
    isNum(ev.pageable_h2d_copies) ? ["H2D copies from pageable memory",
      ev.pageable_h2d_copies > 0
        ? h("span", {}, `${fmtCount(ev.pageable_h2d_copies)} (${fmtUs(ev.pageable_h2d_us)}) → `, h("code", {}, "pin_memory=True"))
        : "none"] : null,
  ];
  const slow = Array.isArray(ev.slowest_steps) ? ev.slowest_steps : [];
  const slowTable = slow.length ? h("table", {class: "grid-table compact"},
    h("thead", {}, h("tr", {}, h("th", {}, "Slowest steps"), h("th", {class: "num"}, "Step time"), h("th", {class: "num"}, "DataLoader"), h("th", {class: "num"}, "share"))),
    h("tbody", {}, slow.map((sl) => h("tr", {},
      h("td", {}, `#${sl.step}${sl.worker != null ? ` · worker ${sl.worker}` : ""}`), h("td", {class: "num"}, fmtUs(sl.step_us)), h("td", {class: "num"}, fmtUs(sl.dataloader_us)),
      h("td", {class: "num"}, isNum(sl.step_us) && sl.step_us > 0 && isNum(sl.dataloader_us) ? fmtPct(100 * sl.dataloader_us / sl.step_us) : "n/a"))))) : null;
  return mountPanel(null, {title: "Input pipeline", info: DEFS.input}, kv(rows), slowTable);
}

// ------------------------------------------------------------ occupancy histogram

function occupancyPanel(report, cpuOnly) {
  const occ = report.occupancy || {};
  const title = "Occupancy";
  const subtitle = "est., theoretical (occupancy calculator)";
  if (cpuOnly) return mountPanel(null, {title, subtitle, info: DEFS.histogram}, note("CPU-only trace: no GPU metrics."));
  const hist = Array.isArray(occ.histogram) ? occ.histogram : [];
  if (!hist.length) {
    return mountPanel(null, {title, subtitle, info: DEFS.histogram},
      note(naReason(report, "histogram", "est_achieved_occupancy_pct", "occupancy") || "No kernel carries an occupancy estimate (for example ROCm traces)."));
  }
  const colors = ["var(--c-occ-0)", "var(--c-occ-1)", "var(--c-occ-2)", "var(--c-occ-3)", "var(--c-occ-4)"];
  const bins = hist.map((b) => ({label: String(b.bucket ?? `${b.lo}-${b.hi}`), value: b.pct,
    tooltip: [{text: `occupancy ${b.bucket ?? `${b.lo}-${b.hi}`} %`, bold: true}, `${fmtPct(b.pct)} of weighted kernel time`]}));
  const chart = responsive(h("div", {class: "chart-box"}), (w) => histogram({
    width: w, height: 210, bins, fmt: (v) => fmtPct(v, 0), yLabel: "% of kernel time", xLabel: "est. achieved occupancy (%)",
    color: (b, i) => colors[Math.min(colors.length - 1, Math.round((i * (colors.length - 1)) / Math.max(1, bins.length - 1)))]}));
  const sk = occ.short_kernels || null;
  return mountPanel(null, {title, subtitle, info: DEFS.histogram},
    kv([
      ["Est. achieved occupancy", fmtPct(occ.est_achieved_occupancy_pct), DEFS.occupancy],
      isNum(occ.grid_too_small_pct) ? ["Grid too small (blocks/SM < 1)", `${fmtPct(occ.grid_too_small_pct)} of kernel time`, DEFS.gridSmall] : null,
      sk && isNum(sk.count) ? [`Short kernels (< ${fmtUs(sk.threshold_us)})`,
        `${fmtCount(sk.count)} · ${fmtPct(sk.time_pct)} of kernel time${isNum(sk.mean_gap_us) ? ` · mean gap ${fmtUs(sk.mean_gap_us)}` : ""}`,
        "Many short kernels with small launch gaps point at launch overhead: torch.compile or CUDA graphs help."] : null,
    ]),
    chart,
    note(occupancySourceText(occ)));
}

/** Where the occupancy values come from (metrics §4): Kineto's per-launch estimate, or the
 * plugin's calculator where Kineto's is missing or a 0 artefact (calculator_kernel_time_pct). */
export function occupancySourceText(occ) {
  const calc = occ && isNum(occ.calculator_kernel_time_pct) ? occ.calculator_kernel_time_pct : null;
  if (calc !== null && calc >= 99.95) {
    return "Computed by this plugin's CUDA occupancy calculator for each launch (Kineto wrote no usable estimate): theoretical, not measured.";
  }
  if (calc !== null && calc > 0) {
    return `Kineto's estimate for each launch (CUDA occupancy calculator); this plugin's calculator where Kineto's is missing or a 0 artefact (${fmtPct(calc)} of kernel time, marked "calc" in the kernel table): theoretical, not measured.`;
  }
  return "Computed by Kineto with the CUDA occupancy calculator for each launch: theoretical, not measured.";
}

// ------------------------------------------------------------ tensor cores

function tensorCorePanel(report, cpuOnly) {
  const tc = report.tensor_cores || {};
  const word = coresWord(report); // "Matrix cores" on AMD
  if (cpuOnly) return mountPanel(null, {title: word, info: DEFS.tc}, note("CPU-only trace: no GPU metrics."));
  const per = tc.per_device && typeof tc.per_device === "object" ? Object.entries(tc.per_device) : [];
  const rows = [
    [`${word === "Tensor Cores" ? "Tensor Core" : "Matrix-core"} kernel time`, fmtPct(tc.tensor_core_pct), DEFS.tc],
    per.length > 1 ? ["Per device", per.map(([d, v]) => `${deviceLabel(report, d)}: ${fmtPct(v)}`).join(" · ")] : null,
    ["Eligible but not using", isNum(tc.eligible_not_using_pct)
      ? h("span", {class: `sev-text-${verdictSeverity(report, "tensor_cores")}`},
        `${fmtPct(tc.eligible_not_using_pct)} of kernel time`)
      : (naReason(report, "eligible_not_using_pct") || "n/a"), DEFS.eligible],
  ];
  const split = tc.precision_split_pct && typeof tc.precision_split_pct === "object" ? tc.precision_split_pct : null;
  let splitBar = null;
  if (split) {
    const entries = Object.entries(split).filter(([, v]) => isNum(v) && v > 0);
    const total = entries.reduce((a, [, v]) => a + v, 0) || 1;
    splitBar = h("div", {class: "split"},
      h("div", {class: "split-label muted"}, "Precision of kernel time (the launching op's dtype, else the kernel name)"),
      h("div", {class: "split-bar"}, entries.map(([k, v]) => withTooltip(
        h("span", {class: "split-seg", style: {width: `${(100 * v) / total}%`, background: `var(--c-prec-${k}, var(--c-prec-unknown))`}}),
        [`${k}: ${fmtPct(v)} of kernel time`]))),
      h("div", {class: "legend"}, entries.map(([k, v]) => h("span", {class: "legend-item"},
        h("span", {class: "swatch", style: {background: `var(--c-prec-${k}, var(--c-prec-unknown))`}}), h("span", {}, k),
        h("span", {class: "legend-v"}, fmtPct(v, 0))))));
  }
  const top = Array.isArray(tc.top_eligible_not_using) ? tc.top_eligible_not_using : [];
  const topTable = top.length ? h("div", {class: "table-scroll"}, h("table", {class: "grid-table compact wrap"},
    h("thead", {}, h("tr", {},
      h("th", {}, `Eligible op not on ${word}`), h("th", {class: "num"}, "Kernel time"), h("th", {class: "num", title: "Share of all kernel time"}, "Share"),
      h("th", {}, "Input types"), h("th", {title: "Whether the op's sizes are multiples of 8 (Tensor Core friendly)."}, "×8 sizes"))),
    h("tbody", {}, top.map((o) => h("tr", {},
      h("td", {class: "mono"}, String(o.op ?? "")),
      h("td", {class: "num"}, fmtUs(o.kernel_us)),
      h("td", {class: "num"}, fmtPct(o.pct)),
      h("td", {class: "mono"}, Array.isArray(o.input_types) ? o.input_types.join(", ") : ""),
      h("td", {}, o.shapes_multiple_of_8 === true ? "yes" : o.shapes_multiple_of_8 === false ? "no" : "unknown")))))) : null;
  return mountPanel(null, {title: word, info: `${DEFS.tc}\n\n${DEFS.eligible}`}, kv(rows), splitBar, topTable);
}

// ------------------------------------------------------------ other signals

function otherSignalsPanel(report, cpuOnly) {
  const sync = report.sync || {};
  const launch = report.launch || {};
  const comm = report.communication || {};
  const rows = [];
  if (sync && (isNum(sync.sync_us) || Array.isArray(sync.top_ops))) {
    const ops = Array.isArray(sync.top_ops) ? sync.top_ops : [];
    rows.push(["Synchronisation", h("span", {},
      `${fmtUs(sync.sync_us)}${isNum(sync.sync_pct) ? ` (${fmtPct(sync.sync_pct)} of step time)` : ""}`,
      ops.length ? h("span", {class: "muted"}, " from ") : null,
      ops.map((o, i) => [i ? ", " : null, h("code", {}, String(o.op ?? "")), ` ${fmtUs(o.sync_us)}${isNum(o.count) ? ` ×${o.count}` : ""}`])),
    DEFS.sync]);
  }
  if (!cpuOnly && (isNum(launch.launch_us) || isNum(launch.kernels_per_step))) {
    // Without ProfilerStep#N there are no steps to count per: n/a, never "0 kernels per step".
    const stepsFound = !(report.steps && report.steps.found === false);
    const perStep = stepsFound && isNum(launch.kernels_per_step) && launch.kernels_per_step > 0
      ? `${fmtCount(Math.round(launch.kernels_per_step))} kernels per step`
      : !stepsFound && isNum(launch.kernels_per_window)
        ? `${fmtCount(Math.round(launch.kernels_per_window))} kernels in the one window`
        : `kernels per step: n/a${stepsFound ? "" : " (no ProfilerStep)"}`;
    const of = stepsFound ? "of step time" : "of the window";
    rows.push(["Kernel launch", `${fmtUs(launch.launch_us)} CPU${isNum(launch.launch_pct) ? ` (${fmtPct(launch.launch_pct)} ${of})` : ""}`
      + ` · ${perStep}`, DEFS.launch]);
  }
  if (!cpuOnly) {
    rows.push(["Communication", isNum(comm.comm_us) && comm.comm_us > 0
      ? `${fmtUs(comm.comm_us)}${isNum(comm.comm_pct_of_kernel_time) ? ` (${fmtPct(comm.comm_pct_of_kernel_time)} of kernel time)` : ""}`
        + ` · overlapped ${isNum(comm.overlap_pct) ? fmtPct(comm.overlap_pct) : "n/a"}`
      : (naReason(report, "overlap_pct", "communication") || "none"), DEFS.comm]);
  }
  for (const [id, g] of gpuEntries(report)) {
    const idle = g && g.idle;
    if (!idle || !isNum(idle.idle_us)) continue;
    rows.push([`${deviceLabel(report, id)} idle (HTA)`, `${fmtPct(idle.idle_pct)} of its active span: host wait ${fmtUs(idle.host_wait_us)}`
      + ` · kernel wait ${fmtUs(idle.kernel_wait_us)} · other ${fmtUs(idle.other_us)}`, DEFS.idle]);
    if (isNum(g.est_sm_efficiency_pct)) rows.push([`${deviceLabel(report, id)} est. SM efficiency`, fmtPct(g.est_sm_efficiency_pct), DEFS.sm]);
  }
  const memGrowth = [];
  for (const key of memoryDevices(report.memory || {})) {
    const gr = report.memory[key] && report.memory[key].growth;
    if (gr && gr.possible_leak) memGrowth.push(key);
  }
  if (memGrowth.length) rows.push(["Memory growth", h("span", {class: `sev-text-${verdictSeverity(report, "peak_memory")}`}, `allocated memory rises across steps on ${memGrowth.join(", ")}: possible leak`)]);
  return mountPanel(null, {title: "Other signals"}, rows.length ? kv(rows) : note("Nothing else to report."));
}

// ------------------------------------------------------------ not available

function notAvailablePanel(report) {
  const na = report.not_available && typeof report.not_available === "object" ? Object.entries(report.not_available) : [];
  if (!na.length) return null;
  const labels = report.not_available_labels && typeof report.not_available_labels === "object" ? report.not_available_labels : {};
  // one line per cause: a CPU-only trace has a dozen n/a numbers and a few causes
  const byCause = new Map();
  for (const [k, v] of na) {
    const why = String(v);
    if (!byCause.has(why)) byCause.set(why, []);
    byCause.get(why).push(k);
  }
  const label = (k) => (typeof labels[k] === "string" && labels[k] ? labels[k] : readableKey(k));
  return mountPanel(null, {title: "Not available", info: "Metrics that could not be computed from this trace, with the reason. They are never reported as 0."},
    h("ul", {class: "na-list"}, [...byCause].map(([why, keys]) => h("li", {title: keys.join(", "), "data-keys": keys.join(" ")},
      h("span", {class: "na-what"}, keys.map(label).join("; ")),
      h("span", {class: "muted"}, " — "), why))));
}
