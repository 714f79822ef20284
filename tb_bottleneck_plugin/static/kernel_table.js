// The kernel table: per-kernel launch statistics, sortable and filterable. Kernel names
// come from traces: inserted as text only (dom.js), the full name in a title.

import {h, clear, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtBytes, fmtCount, fmtNum, shortenKernelName} from "./format.js";
import {KERNEL_COL_DEFS} from "./defs.js";
import {note, naReason, sortableHead, sortRows, matchCount} from "./common.js";
import {load} from "./states.js";
import {mountPanel} from "./panels.js";

/** Launch dimensions, or null when the trace has none (null, or ROCm's -1). */
function validDims(a) {
  return Array.isArray(a) && a.length && a.every((x) => isNum(x) && x > 0) ? a : null;
}

function launchText(k) {
  const grid = validDims(k.grid);
  const block = validDims(k.block);
  if (!grid && !block) return "n/a";
  return `${grid ? grid.join("×") : "n/a"} · ${block ? block.join("×") : "n/a"}`;
}

function product(a) {
  const d = validDims(a);
  return d ? d.reduce((x, y) => x * y, 1) : 0;
}

/** The kernel table (kernels route via ctx.data.kernels(); the report's top kernels if it fails). */
export function kernelPanel(report, ctx, cpuOnly) {
  const body = h("div", {class: "kernel-body"});
  const p = mountPanel(null, {title: "Kernels", info: "Per-kernel launch statistics grouped by name and launch configuration. Click a column header to sort."}, body);
  if (cpuOnly) {
    mount(body, note("CPU-only trace: no GPU metrics."));
    return p;
  }
  const fallback = report.occupancy && Array.isArray(report.occupancy.kernels) ? report.occupancy.kernels : [];
  if (!ctx || !ctx.data) {
    kernelTable(body, fallback, report, null);
    return p;
  }
  load(body, ctx.data.kernels, {title: "Loading kernels…", errorTitle: "Could not load kernels", route: "kernels", what: "the kernel table",
    valid: (d) => Boolean(d && Array.isArray(d.kernels)),
    // the route failed: the report's top kernels, with a warning (nothing else shown when it has none)
    onError: (r) => {
      if (!fallback.length) return false;
      kernelTable(body, fallback, report,
        `The kernels route failed (${r.kind === "error" ? r.message : "unexpected answer"}); showing the report's top kernels.`);
      return true;
    },
    onData: (d) => kernelTable(body, d.kernels, report, null)});
  return p;
}

function kernelTable(body, kernels, report, warning) {
  clear(body);
  if (!kernels.length) {
    body.appendChild(note(naReason(report, "kernels", "occupancy") || "No kernels in this selection."));
    return;
  }
  const multiDev = new Set(kernels.map((k) => k.device)).size > 1;
  const roof = rooflineByName(report);
  const rf = (k) => roof.get(String(k.name ?? "")) || null;
  const cols = [
    {key: "name", label: "Kernel", text: true},
    multiDev ? {key: "device", label: "GPU", fmt: (v) => String(v ?? "")} : null,
    {key: "calls", label: "Calls", fmt: fmtCount},
    {key: "total_us", label: "Total", fmt: fmtUs},
    {key: "mean_us", label: "Mean", fmt: fmtUs},
    {key: "time_pct", label: "% time", fmt: (v) => fmtPct(v)},
    {key: "est_achieved_occupancy_pct", label: "Est. occ.", fmt: (v) => fmtPct(v, 0)},
    {key: "blocks_per_sm", label: "Blocks/SM", fmt: (v) => fmtNum(v, 2)},
    {key: "registers_per_thread", label: "Regs", fmt: fmtCount},
    {key: "shared_memory_bytes", label: "Shared", fmt: (v) => (v === 0 ? "0" : fmtBytes(v))},
    {key: "launch", label: "Grid · Block", get: launchText, sortGet: (k) => product(k.grid) * product(k.block), cls: "mono"},
    {key: "tensor_core", label: "TC", get: (k) => (k.tensor_core === true ? "yes" : k.tensor_core === false ? "no" : "?"),
      sortGet: (k) => (k.tensor_core ? 1 : 0)},
    {key: "limiting_factor", label: "Limited by", text: true},
    roof.size ? {key: "achieved_tflops", label: "TFLOP/s", get: (k) => rf(k)?.achieved_tflops,
      sortGet: (k) => rf(k)?.achieved_tflops ?? -1, fmt: (v) => (isNum(v) ? fmtNum(Number(v.toPrecision(3)), 4) : "")} : null,
    roof.size ? {key: "pct_of_peak", label: "% peak", get: (k) => rf(k)?.pct_of_peak,
      sortGet: (k) => rf(k)?.pct_of_peak ?? -1, fmt: (v) => (isNum(v) ? fmtPct(v, 0) : "")} : null,
    roof.size ? {key: "bound", label: "Bound", get: (k) => rf(k)?.bound,
      sortGet: (k) => String(rf(k)?.bound ?? ""), fmt: (v) => v ?? ""} : null,
  ].filter(Boolean);
  const state = {sortKey: "total_us", dir: -1, filter: ""};
  const filterBox = h("input", {type: "search", class: "filter", placeholder: "Filter kernels by name…", "aria-label": "Filter kernels by name"});
  const count = h("span", {class: "muted count"});
  const thead = h("thead");
  const tbody = h("tbody");
  const table = h("table", {class: ["grid-table", "kernels", roof.size ? "with-roof" : null]}, thead, tbody);
  const LIMIT = 200;

  const drawHead = () => sortableHead(thead, cols, state, KERNEL_COL_DEFS, drawBody);

  function drawBody() {
    const f = state.filter.trim().toLowerCase();
    const rows = sortRows(kernels.filter((k) => !f || String(k.name ?? "").toLowerCase().includes(f)
      || String(k.limiting_factor ?? "").toLowerCase().includes(f)), cols, state);
    const shown = rows.slice(0, LIMIT);
    mount(tbody, shown.map((k) => h("tr", {}, cols.map((c) => {
      if (c.key === "name") {
        const full = String(k.name ?? "");
        return h("td", {class: "kname", title: full}, shortenKernelName(full));
      }
      if (c.key === "tensor_core") {
        return h("td", {class: ["num", k.tensor_core ? "tc-yes" : "tc-no"]}, c.get(k));
      }
      if (c.key === "limiting_factor") return limitCell(k.limiting_factor);
      if (c.key === "est_achieved_occupancy_pct") return occupancyCell(k);
      if (c.key === "achieved_tflops" || c.key === "pct_of_peak" || c.key === "bound") return rooflineCell(c, rf(k));
      const v = c.get ? c.get(k) : k[c.key];
      return h("td", {class: ["num", c.cls]}, c.get ? v : c.fmt(v));
    }))));
    if (!shown.length) tbody.appendChild(h("tr", {}, h("td", {colspan: String(cols.length), class: "empty-row"}, "No kernel matches the filter.")));
    count.textContent = matchCount(rows.length, kernels.length, LIMIT, "kernels");
  }

  filterBox.addEventListener("input", () => { state.filter = filterBox.value; drawBody(); });
  drawHead();
  drawBody();
  mount(body,
    warning ? note(warning, "warn") : null,
    h("div", {class: "table-tools"}, filterBox, count),
    h("div", {class: "table-scroll"}, table));
}

/** "registers+shared_memory" is one long token: it may wrap after each "+" (and the CSS
 *  breaks anywhere as a last resort) so the column stays narrow at 1280 px. */
function limitCell(v) {
  const parts = String(v ?? "n/a").split("+");
  return h("td", {class: "lim", title: String(v ?? "n/a")},
    parts.flatMap((p, i) => (i < parts.length - 1 ? [`${p}+`, h("wbr")] : [p])));
}

/** The report's roofline rows (flops.kernels: the top kernels by time) by kernel name. */
function rooflineByName(report) {
  const rows = report && report.flops && Array.isArray(report.flops.kernels) ? report.flops.kernels : [];
  return new Map(rows.filter((r) => r && isNum(r.achieved_tflops)).map((r) => [String(r.name), r]));
}

/** TFLOP/s, % of peak and bound of a kernel name, as the server computed them (blank when
 *  the name is not among the report's top kernels or has no FLOPs). */
function rooflineCell(c, r) {
  if (!r) return h("td", {class: "num muted", title: "Not among the report's top kernels by time with counted FLOPs."}, "");
  const v = c.get({name: r.name});
  const title = `${r.class}: ${isNum(r.achieved_tflops) ? fmtNum(r.achieved_tflops, 1) : "n/a"} TFLOP/s, `
    + `${isNum(r.roofline_pct) ? fmtPct(r.roofline_pct, 0) : "n/a"} of its attainable roof`
    + `${r.bound ? ` (${r.bound}-bound)` : ""}; all launches of this name`;
  return h("td", {class: "num", title}, c.fmt(v));
}

function occupancyCell(k) {
  const v = k.est_achieved_occupancy_pct;
  if (k.occupancy_source === "calculator" && isNum(v)) {
    return h("td", {class: "num", title: "Computed by this plugin's occupancy calculator: Kineto's value is missing or 0 for this kernel "
      + "(common on Hopper and newer GPUs). Theoretical, not measured."},
    fmtPct(v, 0), h("span", {class: "occ-src"}, "calc"));
  }
  const title = k.occupancy_source === "kineto" ? "Kineto's estimate (CUDA occupancy calculator): theoretical, not measured." : null;
  return h("td", {class: "num", title}, fmtPct(v, 0));
}
