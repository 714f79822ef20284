// The roofline panel (METRICS.md §15, report.flops): a log-log chart of arithmetic intensity
// (FLOP/byte) against achieved TFLOP/s with each op class and each top kernel as a point sized
// by its kernel time, the compute roof (the dense peak of the main precision) and the memory
// roof (HBM GB/s × intensity), and a table of the classes. Every number is the server's
// (intensity, achieved_tflops, roofline_pct, bound, step_pct, peak): nothing is judged here.
// Kernel names come from the trace: text only (dom.js h()/s(), SVG <title> as a text node).

import {h, s, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtNum, fmtCount} from "./format.js";
import {note, naReason, kv} from "./common.js";
import {responsive, withTooltip} from "./charts.js";
import {registerPanel} from "./panels.js";

const CLASS_COLORS = {gemm: "var(--c-kernel)", conv: "var(--c-prec-tf32)", attention: "var(--c-prec-fp8)",
  elementwise: "var(--c-memcpy)", other: "var(--c-other)"};
const CHART_H = 320;
const PAD = {l: 58, r: 16, t: 12, b: 40};
const R_MIN = 3; // px: the smallest point
const R_MAX = 18; // px: the point of the longest kernel time

const tf = (x) => (isNum(x) ? String(Number(x.toPrecision(3))) : "n/a"); // 3 significant digits

/** The peak (TFLOP/s) of a precision from report.flops.peak, null without one. */
function peakOf(flops, prec) {
  const p = flops.peak && flops.peak.tflops && typeof flops.peak.tflops === "object" ? flops.peak.tflops : {};
  return prec && isNum(p[prec]) ? p[prec] : null;
}

/** The points of the chart: classes and top kernels that have FLOPs (a log axis has no 0). */
function points(flops) {
  const out = [];
  const byClass = flops.by_class && typeof flops.by_class === "object" ? Object.entries(flops.by_class) : [];
  for (const [name, c] of byClass) {
    if (!c || !isNum(c.intensity) || !isNum(c.achieved_tflops) || !(c.intensity > 0) || !(c.achieved_tflops > 0)) continue;
    out.push({kind: "class", name, cls: name, ...c});
  }
  for (const k of Array.isArray(flops.kernels) ? flops.kernels : []) {
    if (!k || !isNum(k.intensity) || !isNum(k.achieved_tflops) || !(k.intensity > 0) || !(k.achieved_tflops > 0)) continue;
    out.push({kind: "kernel", name: String(k.name ?? ""), cls: k.class, ...k, precision: k.precision || null});
  }
  return out;
}

function pointLines(p, flops) {
  const prec = p.precision || flops.main_precision;
  return [
    {text: `${p.kind === "class" ? "op class" : "kernel"}: ${p.name}`, bold: true},
    p.kind === "kernel" && p.class ? `class ${p.class}${isNum(p.count) ? ` · ${fmtCount(p.count)} launches` : ""}` : null,
    `intensity ${tf(p.intensity)} FLOP/byte · ${tf(p.achieved_tflops)} TFLOP/s achieved`,
    `attainable ${tf(p.attainable_tflops)} TFLOP/s${prec ? ` (${prec})` : ""} · ${fmtPct(p.roofline_pct)} of the roofline`,
    p.bound ? `${p.bound}-bound (ridge ${tf(p.ridge)} FLOP/byte)` : null,
    `kernel time ${fmtUs(p.kernel_us)}${isNum(p.step_pct) ? ` · ${fmtPct(p.step_pct)} of step time` : ""}`,
  ].filter(Boolean);
}

function decades(lo, hi) {
  const a = Math.floor(Math.log10(lo));
  const b = Math.ceil(Math.log10(hi));
  const out = [];
  for (let e = a; e <= b; e++) out.push(10 ** e);
  return out;
}

function tickText(v) {
  if (v >= 1e3 || v < 1e-2) return `1e${Math.round(Math.log10(v))}`;
  return String(Number(v.toPrecision(2)));
}

/** The log-log roofline chart (an <svg>) at a given width. */
export function rooflineChart(flops, pts, width) {
  const peak = isNum(flops.peak_tflops) ? flops.peak_tflops : peakOf(flops, flops.main_precision);
  const bw = flops.peak && isNum(flops.peak.hbm_gbps) ? flops.peak.hbm_gbps : null; // GB/s
  const ridge = isNum(peak) && isNum(bw) && bw > 0 ? (peak * 1e3) / bw : null; // FLOP/byte
  const xs = pts.map((p) => p.intensity).concat(isNum(ridge) ? [ridge] : []);
  const ys = pts.map((p) => p.achieved_tflops).concat(isNum(peak) ? [peak] : []);
  const xlo = 10 ** Math.floor(Math.log10(Math.min(...xs) / 2));
  const xhi = 10 ** Math.ceil(Math.log10(Math.max(...xs) * 2));
  const ylo = 10 ** Math.floor(Math.log10(Math.min(...ys) / 2));
  const yhi = 10 ** Math.ceil(Math.log10(Math.max(...ys) * 1.5));
  const W = Math.max(280, width);
  const x = (v) => PAD.l + ((Math.log10(v) - Math.log10(xlo)) / (Math.log10(xhi) - Math.log10(xlo))) * (W - PAD.l - PAD.r);
  const y = (v) => PAD.t + (1 - (Math.log10(v) - Math.log10(ylo)) / (Math.log10(yhi) - Math.log10(ylo))) * (CHART_H - PAD.t - PAD.b);
  const svg = s("svg", {class: "chart roofline-chart", width: W, height: CHART_H, role: "img",
    "aria-label": "Roofline: arithmetic intensity (FLOP/byte) against achieved TFLOP/s"});
  for (const t of decades(xlo, xhi)) {
    svg.appendChild(s("line", {x1: x(t), x2: x(t), y1: PAD.t, y2: CHART_H - PAD.b, class: "grid"}));
    svg.appendChild(s("text", {x: x(t), y: CHART_H - PAD.b + 14, class: "axis-label", "text-anchor": "middle"}, tickText(t)));
  }
  for (const t of decades(ylo, yhi)) {
    svg.appendChild(s("line", {x1: PAD.l, x2: W - PAD.r, y1: y(t), y2: y(t), class: "grid"}));
    svg.appendChild(s("text", {x: PAD.l - 6, y: y(t) + 4, class: "axis-label", "text-anchor": "end"}, tickText(t)));
  }
  svg.appendChild(s("text", {x: (PAD.l + W - PAD.r) / 2, y: CHART_H - 6, class: "axis-label", "text-anchor": "middle"},
    "arithmetic intensity (FLOP/byte, log)"));
  svg.appendChild(s("text", {x: 12, y: (PAD.t + CHART_H - PAD.b) / 2, class: "axis-label", "text-anchor": "middle",
    transform: `rotate(-90 12 ${(PAD.t + CHART_H - PAD.b) / 2})`}, "achieved TFLOP/s (log)"));
  // the roofs: memory (bw × intensity, up to the ridge) then compute (the peak, from the ridge)
  if (isNum(bw) && bw > 0) {
    const xEnd = isNum(ridge) ? Math.min(ridge, xhi) : xhi;
    const x0 = Math.max(xlo, (ylo * 1e3) / bw);
    if (x0 < xEnd) {
      svg.appendChild(s("line", {x1: x(x0), y1: y((x0 * bw) / 1e3), x2: x(xEnd), y2: y((xEnd * bw) / 1e3),
        class: "roof roof-memory", stroke: "var(--c-memcpy)", "stroke-width": 2, "data-roof": "memory"},
      s("title", {}, `memory roof: HBM ${fmtNum(bw, 0)} GB/s × intensity`)));
    }
  }
  if (isNum(peak)) {
    const xStart = isNum(ridge) ? Math.max(ridge, xlo) : xlo;
    svg.appendChild(s("line", {x1: x(xStart), y1: y(peak), x2: x(xhi), y2: y(peak),
      class: "roof roof-compute", stroke: "var(--c-kernel)", "stroke-width": 2, "data-roof": "compute"},
    s("title", {}, `compute roof: ${flops.main_precision || ""} dense peak ${tf(peak)} TFLOP/s`)));
    svg.appendChild(s("text", {x: W - PAD.r - 4, y: y(peak) - 5, class: "axis-label", "text-anchor": "end"},
      `${flops.main_precision || ""} peak ${tf(peak)} TFLOP/s`));
  }
  const maxUs = Math.max(...pts.map((p) => (isNum(p.kernel_us) ? p.kernel_us : 0)), 1e-9);
  // largest first so small points stay on top
  for (const p of pts.slice().sort((a, b) => (b.kernel_us || 0) - (a.kernel_us || 0))) {
    const r = R_MIN + (R_MAX - R_MIN) * Math.sqrt(Math.max(0, p.kernel_us || 0) / maxUs);
    const color = CLASS_COLORS[p.cls] || "var(--c-other)";
    const lines = pointLines(p, flops);
    const c = s("circle", {cx: x(p.intensity), cy: y(p.achieved_tflops), r: p.kind === "class" ? r : Math.max(R_MIN, r * 0.6),
      class: ["roof-point", `roof-${p.kind}`], "data-kind": p.kind, "data-name": p.name,
      fill: p.kind === "class" ? color : "none", "fill-opacity": p.kind === "class" ? 0.55 : null,
      stroke: color, "stroke-width": p.kind === "class" ? 1 : 1.6},
    s("title", {}, lines.map((l) => (typeof l === "string" ? l : l.text)).join("\n")));
    withTooltip(c, lines);
    svg.appendChild(c);
  }
  return svg;
}

function headerLine(flops) {
  const p = flops.peak;
  if (!p || typeof p !== "object") return null;
  const prec = flops.main_precision;
  const peak = isNum(flops.peak_tflops) ? flops.peak_tflops : peakOf(flops, prec);
  return h("p", {class: "roof-gpu", "data-gpu": String(p.gpu ?? ""), "data-precision": String(prec ?? "")},
    h("strong", {}, `GPU: ${p.gpu ?? "unknown"}`), p.device_name ? ` (${p.device_name})` : null,
    prec ? ` · main precision ${prec}` : null,
    isNum(peak) ? ` · ${prec || ""} dense peak ${tf(peak)} TFLOP/s` : null,
    isNum(p.hbm_gbps) ? ` · HBM ${fmtNum(p.hbm_gbps, 0)} GB/s` : null,
    p.source ? h("span", {class: "muted", title: [p.note, p.url].filter(Boolean).join("\n")}, ` · peak: ${p.source}`) : null);
}

const CLASS_COLS = [["class", "Op class"], ["precision", "Precision"], ["tflops", "TFLOP/s"], ["roofline_pct", "% of roofline"],
  ["bound", "Bound"], ["step_pct", "% of step"], ["kernel_us", "Kernel time"]];

function classTable(flops) {
  const rows = flops.by_class && typeof flops.by_class === "object"
    ? Object.entries(flops.by_class).filter(([, c]) => c && typeof c === "object")
      .sort((a, b) => (b[1].kernel_us || 0) - (a[1].kernel_us || 0)) : [];
  if (!rows.length) return null;
  return h("div", {class: "table-scroll"}, h("table", {class: "grid-table compact roofline-table"},
    h("thead", {}, h("tr", {}, CLASS_COLS.map(([k, label]) => h("th", {class: k === "class" || k === "precision" || k === "bound" ? null : "num",
      title: k === "roofline_pct" ? "Achieved / attainable at the class's intensity (classes without FLOPs: achieved GB/s / HBM GB/s)" : null}, label)))),
    h("tbody", {}, rows.map(([name, c]) => {
      const noFlops = !(isNum(c.flops) && c.flops > 0);
      return h("tr", {"data-class": name},
        h("td", {}, h("span", {class: "swatch", style: {background: CLASS_COLORS[name] || "var(--c-other)"}}), " ", name),
        h("td", {}, c.precision ? String(c.precision) : "—"),
        h("td", {class: "num"}, noFlops ? (isNum(c.achieved_gbps) ? `— (${fmtNum(c.achieved_gbps, 0)} GB/s)` : "—") : tf(c.achieved_tflops)),
        h("td", {class: "num"}, fmtPct(c.roofline_pct)),
        h("td", {}, c.bound ? String(c.bound) : "n/a"),
        h("td", {class: "num"}, fmtPct(c.step_pct)),
        h("td", {class: "num"}, fmtUs(c.kernel_us)));
    }))));
}

const TEXT_HEADS = new Set(["Kernel", "Class", "Bound"]);

function kernelTable(flops) {
  const ks = Array.isArray(flops.kernels) ? flops.kernels : [];
  if (!ks.length) return null;
  return h("details", {class: "roof-kernels"}, h("summary", {}, `Top ${ks.length} kernels on the roofline`),
    h("div", {class: "table-scroll"}, h("table", {class: "grid-table compact wrap"},
      h("thead", {}, h("tr", {}, ["Kernel", "Class", "TFLOP/s", "FLOP/byte", "% of roofline", "Bound", "Kernel time"]
        .map((l) => h("th", {class: TEXT_HEADS.has(l) ? null : "num"}, l)))),
      h("tbody", {}, ks.map((k) => h("tr", {},
        h("td", {class: "mono"}, String(k.name ?? "")), h("td", {}, String(k.class ?? "")),
        h("td", {class: "num"}, tf(k.achieved_tflops)), h("td", {class: "num"}, tf(k.intensity)),
        h("td", {class: "num"}, fmtPct(k.roofline_pct)), h("td", {}, k.bound ? String(k.bound) : "n/a"),
        h("td", {class: "num"}, fmtUs(k.kernel_us))))))));
}

/** The panel body for one report. */
export function renderRoofline(container, report) {
  const flops = report && report.flops && typeof report.flops === "object" ? report.flops : null;
  if (!flops) {
    mount(container, note(`n/a: ${naReason(report, "flops") || "no FLOPs section in this report"}`, "na"));
    return container;
  }
  const pts = points(flops);
  const mfuWhy = naReason(report, "flops.mfu_pct", "mfu_pct");
  let chart;
  if (!flops.peak) {
    chart = note(`Roofline n/a: ${mfuWhy || "no peak for this GPU"}`, "na");
  } else if (!pts.length) {
    chart = note(`Roofline n/a: ${mfuWhy || "no op class or kernel with FLOPs and bytes in the steps"}`, "na");
  } else {
    chart = responsive(h("div", {class: "chart-box roofline-box"}), (w) => rooflineChart(flops, pts, w));
  }
  const mfu = report.verdicts && report.verdicts.mfu ? report.verdicts.mfu : null;
  const legend = h("div", {class: "legend"},
    Object.entries(CLASS_COLORS).filter(([k]) => pts.some((p) => p.cls === k)).map(([k, c]) =>
      h("span", {class: "legend-item"}, h("span", {class: "swatch", style: {background: c}}), k)),
    pts.some((p) => p.kind === "kernel") ? h("span", {class: "legend-item muted"}, "filled: op class · ring: top kernel · size: kernel time") : null);
  mount(container,
    headerLine(flops) || note(`Peak n/a: ${mfuWhy || "unknown GPU"}`, "na"),
    kv([
      ["MFU", mfu && mfu.verdict ? `${isNum(flops.mfu_pct) ? fmtPct(flops.mfu_pct) : "n/a"} · ${mfu.verdict}` : fmtPct(flops.mfu_pct)],
      isNum(flops.flops_per_step) ? ["FLOPs per step", `${tf(flops.flops_per_step / 1e9)} GFLOP · ${tf(flops.tflops)} TFLOP/s over the step`
        + ` · ${tf(flops.achieved_tflops)} TFLOP/s over the counted ops' kernel time`] : null,
      isNum(flops.busy_efficiency_pct) ? ["While the GPU is busy", `${fmtPct(flops.busy_efficiency_pct)} of the peak`] : null,
    ]),
    pts.length && flops.peak ? legend : null,
    chart,
    classTable(flops),
    note("Classes without FLOPs (elementwise, norms, copies) are not on the log chart: their % of roofline is achieved GB/s over the HBM bandwidth. "
      + "Bytes are tensors touched once (METRICS.md §15): cache reuse can put a class above the memory roof."),
    kernelTable(flops));
  return container;
}

registerPanel({
  id: "roofline",
  label: "FLOPs & roofline",
  order: 20,
  section: "kernels", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "MFU and the roofline (METRICS.md §15): FLOPs counted from the recorded shapes, each op class and top kernel placed by "
    + "its arithmetic intensity (FLOP/byte) and achieved TFLOP/s under the compute roof (the dense peak of the main precision) "
    + "and the memory roof (HBM bandwidth × intensity). Numbers and bounds are the server's.",
  render(container, ctx) {
    renderRoofline(container, ctx.report);
  },
});
