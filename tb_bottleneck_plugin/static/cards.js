// Headline cards, driven by the server's card list (no list of cards here).
//
// Which cards, in which order, with which label, unit, explain line, report field and
// `optional` flag: the `cards` block of the runs answer (docs/route-schema.json `runs.cards`;
// the HTML report's data holds the same), declared once in the metric units
// (analysis/units.py `Card`, views/headline.py card_list). index.js and report_page.js hand
// it to setCards. A card's number, colour and verdict words come from the server too:
// report.verdicts[id] = {value, unit, severity, verdict, thresholds, rule}
// (docs/route-schema.json `verdict`, made from thresholds.py). This file only formats the
// value by its unit, picks the style class named by the severity word and adds detail lines
// read from the report (EXTRAS below, per card id). It holds no threshold, decides no
// verdict and lists no card.
//
// ADDING A CARD: a `Card` on the unit's metric (server-side, analysis/units.py) and its
// verdict function (judge/cards.py); nothing here. A verdict the card list does not name is
// still shown, as a plain card titled by its id. Descriptor fields (descriptor() below):
//   id        key in report.verdicts
//   label     card title (or label(report): the server's amd_label on AMD); sublabel(report)? -> small text beside it
//   field     where the report holds the number (a path, shown only when the report has no
//             verdict for the card, i.e. its "verdicts" section failed; the card is then uncoloured)
//   explain   one line under the verdict (or explain(report));   def: hover text (defs.js, else the server's definition)
//   details(report)? -> extra lines (strings or nodes) read from the report's sections
//   optional  true: no card when the value is n/a or exactly 0 (communication on one GPU:
//             nothing to show; a display choice, not a verdict)
//
// renderCards(container, reports[], ctx) renders one row of cards per report (compare:
// baseline and candidate; any list of selections), so every view shows the same cards.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtBytes, fmtCount, fmtFlops, fmtFlopRate, readableKey} from "./format.js";
import {DEFS} from "./defs.js";
import {rememberedAll} from "./sections.js";
import {gpuEntries, deviceLabel, memoryDevices, reservedKnown, memDeviceLabel, naReason, severityClass} from "./common.js";

/** Formats a verdict's value by its unit (docs/route-schema.json `verdict.unit`). */
export function fmtVerdictValue(value, unit) {
  if (!isNum(value)) return "n/a";
  if (unit === "pct") return fmtPct(value);
  if (unit === "bytes") return fmtBytes(value);
  if (unit === "us") return fmtUs(value);
  if (unit === "count") return fmtCount(value);
  return fmtCount(value);
}

function at(obj, path) {
  let v = obj;
  for (const k of path) v = v && typeof v === "object" ? v[k] : undefined;
  return v;
}

/** The memory device a card's verdict is about (verdict.device, the server's choice), else the
 * first GPU device of the report; and that device's section of report.memory. */
function memoryOf(report, v) {
  const mem = report.memory && typeof report.memory === "object" ? report.memory : {};
  const keys = memoryDevices(mem);
  const key = (v && typeof v.device === "string" && mem[v.device]) ? v.device
    : keys.find((k) => k.startsWith("cuda:")) || keys[0] || null;
  return key ? [key, mem[key] || {}] : [null, null];
}

/** True when the trace's devices are AMD GPUs (ROCm): deviceProperties name them AMD / Instinct /
 * Radeon, or give a warp size of 64 or a gcnArchName (the rule recommendations.py uses). */
export function isAmd(report) {
  const props = report && Array.isArray(report.device_properties) ? report.device_properties : [];
  return props.some((p) => p && typeof p === "object"
    && (/AMD|Instinct|Radeon/.test(String(p.name ?? "")) || p.warpSize === 64 || "gcnArchName" in p));
}

/** NVIDIA's "Tensor Cores" are AMD's "matrix cores" (MFMA): the word that fits the trace. */
export function coresWord(report) {
  return isAmd(report) ? "Matrix cores" : "Tensor Cores";
}

// The cards themselves (which, in what order, their labels, units, explain lines, report
// fields, `optional`) come from the server: the `cards` block of the runs answer (the HTML
// report's data), declared once in the metric units (analysis/units.py `Card`, sent by
// views/headline.py card_list) and given to this module by setCards. What needs code or the
// frontend's own definitions stays here, per card id: hover text (defs.js), sublabels and
// detail lines read from the report. A card id without an entry here is shown with the
// server's metadata alone.
const EXTRAS = {
  input_bound: {
    def: DEFS.input,
    details(report) {
      const inp = report.input || {};
      const st = inp.stats || {};
      return [
        isNum(inp.input_transfer_pct) && isNum(inp.xprof_input_pct)
          ? `+ ${fmtPct(inp.input_transfer_pct)} input transfer (H2D); XProf-style input ${fmtPct(inp.xprof_input_pct)}` : null,
        isNum(st.min) && isNum(st.max) ? `per step ${fmtPct(st.min)} – ${fmtPct(st.max)}` : null,
      ];
    },
  },
  gpu_utilization: {
    sublabel: (report) => {
      const n = gpuEntries(report).length;
      return n > 1 ? `mean of ${n} GPUs` : null;
    },
    def: `${DEFS.gpu}\n\n${DEFS.sm}`,
    details(report) {
      const devs = gpuEntries(report);
      if (devs.length === 1) {
        const [id, g] = devs[0];
        return [deviceLabel(report, id, true),
          g && isNum(g.est_sm_efficiency_pct) ? `est. SM efficiency ${fmtPct(g.est_sm_efficiency_pct)}` : null];
      }
      return devs.length ? [devs.map(([id, g]) => `${deviceLabel(report, id)}: ${fmtPct(g && g.utilization_pct)}`).join(" · ")] : [];
    },
  },
  tensor_cores: {
    def: `${DEFS.tc}\n\n${DEFS.eligible}`,
    details(report) {
      const tc = report.tensor_cores || {};
      const split = tc.precision_split_pct && typeof tc.precision_split_pct === "object"
        ? Object.entries(tc.precision_split_pct).filter(([, v]) => isNum(v) && v > 0).sort((a, b) => b[1] - a[1])
          .map(([k, v]) => `${k} ${fmtPct(v, 0)}`).join(" · ")
        : "";
      return [
        split ? `precision: ${split}` : null,
      ];
    },
  },
  // FLOPs and MFU (analysis/flops.py, METRICS.md §15): value, colour and words (e.g. "9 % of
  // H100 SXM bf16 peak · 86 of 989 TFLOP/s") are the server's; the lines below read report.flops.
  mfu: {
    sublabel: (report) => {
      const p = (report.flops || {}).peak;
      return p && typeof p === "object" && typeof p.source === "string" && p.source.startsWith("user")
        ? "user-given peak" : "of the dense peak";
    },
    details(report) {
      const f = report.flops || {};
      const split = f.mfu_split_pct && typeof f.mfu_split_pct === "object"
        ? Object.entries(f.mfu_split_pct).filter(([, v]) => isNum(v) && v > 0).sort((a, b) => b[1] - a[1]) : [];
      const classes = f.by_class && typeof f.by_class === "object"
        ? Object.entries(f.by_class).filter(([, c]) => c && isNum(c.kernel_us) && c.kernel_us > 0 && c.bound)
          .sort((a, b) => b[1].kernel_us - a[1].kernel_us).slice(0, 3) : [];
      const unc = f.uncounted_calls && typeof f.uncounted_calls === "object" ? Object.values(f.uncounted_calls) : [];
      const nUnc = unc.filter(isNum).reduce((a, b) => a + b, 0);
      return [
        isNum(f.flops_per_step) ? `${fmtFlops(f.flops_per_step)} per step · ${fmtFlopRate(f.tflops)} over the step` : null,
        split.length > 1 ? `by precision: ${split.map(([k, v]) => `${k} ${fmtPct(v)}`).join(" · ")}` : null,
        isNum(f.busy_efficiency_pct) ? `${fmtPct(f.busy_efficiency_pct)} of the peak while the GPU is busy` : null,
        classes.length ? `roofline: ${classes.map(([k, c]) => `${k} ${c.bound}-bound${isNum(c.roofline_pct) ? ` ${fmtPct(c.roofline_pct, 0)}` : ""}`).join(" · ")}` : null,
        nUnc > 0 ? `${fmtCount(nUnc)} call(s) with a formula not counted (shapes missing)` : null,
      ];
    },
  },
  occupancy: {
    def: `${DEFS.occupancy}\n\n${DEFS.gridSmall}`,
    details(report) {
      const occ = report.occupancy || {};
      return [isNum(occ.grid_too_small_pct) ? `grid too small: ${fmtPct(occ.grid_too_small_pct)} of kernel time` : null];
    },
  },
  peak_memory: {
    sublabel: (report, v) => {
      const [key] = memoryOf(report, v);
      return key ? memDeviceLabel(report, key) : null;
    },
    def: DEFS.memory,
    details(report, v) {
      const [key, m] = memoryOf(report, v);
      if (!m) return [];
      const mem = report.memory;
      const gpuKeys = memoryDevices(mem).filter((k) => k.startsWith("cuda:"));
      const out = [];
      if (isNum(m.capacity_bytes) && m.capacity_bytes > 0) out.push(`capacity ${fmtBytes(m.capacity_bytes)}`);
      if (reservedKnown(key, m.peak_reserved_bytes)) out.push(`peak reserved ${fmtBytes(m.peak_reserved_bytes)}`);
      else if (key.startsWith("cuda:")) {
        const why = naReason(report, `memory.${key}.peak_reserved_bytes`, "peak_reserved_bytes");
        out.push(`reserved: not recorded${why ? ` (${why})` : ""}`);
      }
      if (m.allocated_is_relative) out.push("growth since profiling start (old trace: rebuilt from Bytes)");
      if (gpuKeys.length > 1) out.push(gpuKeys.map((k) => `${deviceLabel(report, k)}: ${fmtBytes(mem[k] && mem[k].peak_allocated_bytes)}`).join(" · "));
      return out;
    },
  },
  allocator_slack: {
    def: DEFS.slack,
    sublabel: (report, v) => {
      const [key] = memoryOf(report, v);
      return key && memoryDevices(report.memory || {}).length > 1 ? `reserved but unused at the peak (${deviceLabel(report, key)})`
        : "reserved but unused at the peak";
    },
    details(report, v) {
      const [key, m] = memoryOf(report, v);
      if (!m) return [];
      const fb = m.free_block_fragmentation_pct;
      return [
        isNum(m.slack_fragmentation_time_weighted_pct) ? `time-weighted slack ${fmtPct(m.slack_fragmentation_time_weighted_pct)}` : null,
        isNum(fb) ? `free memory outside its largest block ${fmtPct(fb)}`
          : `free memory outside its largest block: ${naReason(report, `memory.${key}.free_block_fragmentation_pct`, "free_block_fragmentation_pct") || "n/a"}`,
      ];
    },
  },
  sync: {
    def: DEFS.sync,
    details(report) {
      const sync = report.sync || {};
      const ops = Array.isArray(sync.top_ops) ? sync.top_ops.slice(0, 2) : [];
      return [
        isNum(sync.sync_us) ? `host in sync calls ${fmtUs(sync.sync_us)}${isNum(sync.sync_pct) ? ` (${fmtPct(sync.sync_pct)} of step time)` : ""}` : null,
        ops.length ? `from ${ops.map((o) => String(o.op ?? "")).join(", ")}` : null,
        isNum(sync.sync_refill_idle_pct) && sync.sync_refill_idle_pct > 0
          ? `GPU idle after the waits until the next launch ${fmtPct(sync.sync_refill_idle_pct)} of step time` : null,
      ];
    },
  },
  // Device-to-device copies (analysis/copies.py, METRICS.md §8): the ops that launch them.
  d2d_copies: {
    details(report) {
      const c = report.copies || {};
      const ops = Array.isArray(c.top_ops) ? c.top_ops.slice(0, 2) : [];
      return [
        isNum(c.d2d_us) ? `${fmtUs(c.d2d_us)} in ${fmtCount(c.count)} copies${isNum(c.d2d_exposed_pct) ? `, ${fmtPct(c.d2d_exposed_pct)} of step time beside no kernel` : ""}` : null,
        ops.length ? `from ${ops.map((o) => `${String(o.op ?? "")} (${fmtUs(o.us)})`).join(", ")}` : null,
      ];
    },
  },
  communication: {
    def: DEFS.comm,
    details(report) {
      const comm = report.communication || {};
      return [
        isNum(comm.comm_us) ? `${fmtUs(comm.comm_us)} of communication kernels` : null,
        isNum(comm.overlap_pct) ? `overlapped with compute ${fmtPct(comm.overlap_pct)}` : null,
      ];
    },
  },
  // torch.compile / CUDA graphs (analysis/compilation.py, METRICS.md §16): the value is the
  // compiled share of the step; colour and words (breaks, steady recompiles) are the server's.
  compilation: {
    details(report) {
      const c = report.compilation || {};
      const ids = Array.isArray(c.recompile_ids) ? c.recompile_ids.filter((r) => r && r.steady).map((r) => String(r.id)) : [];
      const frames = Array.isArray(c.frames) ? c.frames.length : null;
      const broken = Array.isArray(c.broken_regions) ? c.broken_regions.map((b) => String(b.id)) : [];
      return [
        isNum(c.breaks_per_step) ? `${fmtCount(c.breaks_per_step)} graph break(s) per step`
          + (broken.length ? ` (in ${broken.join(", ")})` : "") + (isNum(frames) ? ` · ${fmtCount(frames)} compiled frame(s)` : "") : null,
        isNum(c.steady_recompiles) && c.steady_recompiles > 0 ? `recompiles in the steps: ${ids.join(", ")}` : null,
        isNum(c.compile_pct) && c.compile_pct > 0 ? `compiling inside the steps ${fmtPct(c.compile_pct)} of step time` : null,
        isNum(c.triton_pct) ? `Triton kernels ${fmtPct(c.triton_pct)} of kernel time${isNum(c.gemm_pct) ? `, library GEMMs ${fmtPct(c.gemm_pct)}` : ""}` : null,
        isNum(c.graph_launches) && c.graph_launches > 0 ? `${fmtCount(c.graph_launches)} CUDA graph replays, ${fmtPct(c.graph_gpu_pct)} of kernel time` : null,
      ];
    },
  },
  short_kernels: {
    def: DEFS.shortKernels,
    details(report) {
      const sk = (report.occupancy || {}).short_kernels || {};
      return [
        isNum(sk.count) ? `${fmtCount(sk.count)} kernels shorter than ${fmtUs(sk.threshold_us)}` : null,
        isNum(sk.mean_gap_us) ? `mean launch gap ${fmtUs(sk.mean_gap_us)}` : null,
      ];
    },
  },
};

const str = (x) => (typeof x === "string" && x ? x : null);

/** A card descriptor from one entry of the server's card list (docs/route-schema.json
 * `runs.cards`) and this module's EXTRAS for its id. */
function descriptor(c) {
  const x = EXTRAS[c.id] || {};
  const label = String(c.label ?? readableKey(c.id));
  const explain = str(c.explain);
  const amdLabel = str(c.amd_label);
  const amdExplain = str(c.amd_explain);
  const sublabel = str(c.sublabel);
  return {
    id: c.id,
    label: amdLabel ? (report) => (isAmd(report) ? amdLabel : label) : label,
    explain: amdExplain ? (report) => (isAmd(report) ? amdExplain : explain) : explain,
    field: Array.isArray(c.field) && c.field.length ? c.field.map(String) : null,
    unit: str(c.unit),
    optional: c.optional === true,
    sublabel: x.sublabel || (sublabel ? () => sublabel : null),
    def: x.def || str(c.definition),
    details: x.details || null,
  };
}

let serverCards = [];

/** Sets the card list the server sent (the runs answer's `cards`; the HTML report's data). */
export function setCards(list) {
  serverCards = (Array.isArray(list) ? list : [])
    .filter((c) => c && typeof c === "object" && typeof c.id === "string" && c.id)
    .map(descriptor);
}

/** The card descriptors, in the server's order (empty until setCards). */
export function cardDescriptors() {
  return serverCards.slice();
}

/** "INPUT_BOUND_HIGH_PCT = 20 · INPUT_BOUND_MODERATE_PCT = 5": the constants the server used. */
function thresholdsText(v) {
  const t = v && v.thresholds && typeof v.thresholds === "object" ? Object.entries(v.thresholds) : [];
  return t.length ? `Thresholds (thresholds.py): ${t.map(([k, x]) => `${k} = ${x}`).join(" · ")}` : "";
}

/** What one card shows for one report: {value, severity, verdict, na, thresholds, rule, raw, v}
 * (all from the server's report.verdicts[id]; v is that verdict object). */
export function cardState(desc, report) {
  const verdicts = report && report.verdicts && typeof report.verdicts === "object" ? report.verdicts : null;
  const v = verdicts ? verdicts[desc.id] : null;
  if (v && typeof v === "object") {
    const na = !isNum(v.value);
    return {
      value: fmtVerdictValue(v.value, v.unit || desc.unit),
      severity: severityClass(v.severity),
      verdict: v.verdict ? String(v.verdict) : (na ? "not available" : ""),
      na,
      thresholds: thresholdsText(v),
      rule: v.rule || null,
      raw: v.value,
      v,
    };
  }
  // No verdict for this card (the report's "verdicts" section failed: report.errors says why):
  // the number the report holds, uncoloured, with no words. Nothing is judged here.
  const raw = desc.field ? at(report, desc.field) : null;
  const why = desc.field ? naReason(report, desc.field[desc.field.length - 1], desc.field[0]) : null;
  return {
    value: fmtVerdictValue(raw, desc.unit),
    severity: "none",
    verdict: isNum(raw) ? "" : (why || "not available"),
    na: !isNum(raw),
    thresholds: "",
    rule: null,
    raw,
    v: null,
  };
}

function cardEl(desc, report) {
  const st = cardState(desc, report);
  if (desc.optional && (st.na || st.raw === 0)) return null;
  const sub = desc.sublabel ? desc.sublabel(report, st.v) : null;
  const details = st.na ? [] : (desc.details ? desc.details(report, st.v) : []).filter(Boolean);
  const title = [desc.def, st.thresholds, st.rule ? `Recommendation rule: ${st.rule}` : ""].filter(Boolean).join("\n\n");
  const label = typeof desc.label === "function" ? desc.label(report) : desc.label;
  const explain = typeof desc.explain === "function" ? desc.explain(report) : desc.explain;
  return h("div", {class: ["card", `sev-${st.severity}`], title: title || null, tabindex: "0",
    "data-card": desc.id, "data-severity": st.severity},
  h("div", {class: "card-label"}, label, sub ? h("span", {class: "card-sublabel"}, sub) : null),
  h("div", {class: "card-value"}, st.value),
  st.verdict ? h("div", {class: ["card-verdict", st.na ? "na" : null], title: st.na ? st.verdict : null}, st.verdict) : null,
  explain ? h("div", {class: "card-explain"}, explain) : null,
  ...details.map((d) => h("div", {class: "card-detail", title: typeof d === "string" ? d : null}, d)));
}

/** A card for a verdict id that has no descriptor yet (a new metric): its id in words. */
function genericDescriptor(id) {
  return {id, label: readableKey(id), field: null, unit: null};
}

/** One row of cards (div.cards) for one report: the descriptors, then any other verdict the
 * server sends (so a new metric shows up before it gets its own descriptor). */
export function cardRow(report, {cards = null} = {}) {
  const list = cards || serverCards;
  const known = new Set(list.map((d) => d.id));
  const verdicts = report && report.verdicts && typeof report.verdicts === "object" ? Object.keys(report.verdicts) : [];
  const extra = cards ? [] : verdicts.filter((id) => !known.has(id)).map(genericDescriptor);
  const all = [...list, ...extra];
  // Cards the server marks n/a because the trace has no GPU activity (verdict na_cause
  // "cpu_only", verdicts.py GPU_SECTIONS) are one line, not a card each: the banner says why.
  const folded = all.filter((d) => { const v = cardState(d, report).v; return v && v.severity === "na" && v.na_cause === "cpu_only"; });
  const shown = all.filter((d) => !folded.includes(d));
  return h("div", {class: "cards"}, shown.map((d) => cardEl(d, report)), folded.length ? foldedLine(folded, report) : null);
}

/** The one line that stands for the folded GPU cards: their names, each card's own reason on hover. */
function foldedLine(folded, report) {
  const name = (d) => (typeof d.label === "function" ? d.label(report) : d.label);
  const reasons = folded.map((d) => `${name(d)}: ${cardState(d, report).verdict}`).join("\n");
  return h("p", {class: "note cards-folded", "data-folded": folded.map((d) => d.id).join(" "), title: reasons},
    h("strong", {}, "GPU cards: n/a"), ` — ${foldedWhy(report)}: `, folded.map(name).join(", "), ".");
}

/** Why the GPU cards are folded: another accelerator's trace (MTIA, XPU: the server's
 * `trace.accelerators`) is named as such, not called CPU-only. */
function foldedWhy(report) {
  const acc = (report && report.trace && report.trace.accelerators) || {};
  const names = Object.keys(acc);
  return names.length ? `${names.join("/")} trace, not CUDA/ROCm (its events counted, not analysed)`
    : "CPU-only trace (no GPU kernels)";
}

/**
 * Renders the cards of N reports into container: one row per report, each headed by
 * ctx.labels[i] when there is more than one report (e.g. ["Baseline", "Candidate"]).
 * ctx: {labels?: string[], cards?: descriptor list (a subset of cardDescriptors())}.
 */
export function renderCards(container, reports, ctx = {}) {
  const list = (reports || []).filter((r) => r && typeof r === "object");
  const labels = ctx.labels || [];
  if (list.length === 1 && !labels.length) {
    mount(container, cardRow(list[0], ctx));
    return container;
  }
  mount(container, list.map((r, i) => h("div", {class: "cards-row", "data-row": String(i)},
    h("div", {class: "cards-row-label"}, labels[i] || `#${i + 1}`),
    cardRow(r, ctx))));
  return container;
}

/**
 * The cards of one report by topic (report.layout, judge/layout.py): each group the server
 * judged (a card in it warns) shows its cards; the others are one line (the server's `line`:
 * the group's most important number), a click shows their cards. The cards that do not apply
 * to this run are one "Not applicable" line (each card's reason on hover). Without a layout
 * (an old cached report), or when the reader chose "All" sections, the plain card row.
 */
export function renderCardGroups(container, report) {
  const layout = report && report.layout && typeof report.layout === "object" ? report.layout : null;
  const groups = layout && Array.isArray(layout.groups) ? layout.groups.filter((g) => g && typeof g === "object") : null;
  if (!groups || rememberedAll()) return renderCards(container, [report]); // "All" (sections.js): every card
  const byId = new Map(serverCards.map((d) => [d.id, d]));
  const descOf = (id) => byId.get(id) || genericDescriptor(id);
  const groupEl = (g) => {
    const ids = Array.isArray(g.cards) ? g.cards.filter((x) => typeof x === "string") : [];
    const row = (list = ids) => h("div", {class: "cards"}, list.map((id) => cardEl(descOf(id), report)));
    if (g.judged === true) {
      // the judged cards (the server's `warn` ids); the group's other cards one click away
      const warn = Array.isArray(g.warn) ? ids.filter((id) => g.warn.includes(id)) : ids;
      const rest = ids.filter((id) => !warn.includes(id));
      const wrap = h("div", {class: "card-group card-group-judged", "data-group": String(g.id)},
        h("div", {class: "card-group-label"}, String(g.label ?? g.id)), row(warn));
      if (rest.length) {
        const more = h("button", {type: "button", class: "card-group-line card-group-more", "aria-expanded": "false",
          onclick: () => { more.replaceWith(row(rest)); }}, `+ ${rest.length} more card${rest.length === 1 ? "" : "s"} of ${String(g.label ?? g.id)}`);
        wrap.appendChild(more);
      }
      return wrap;
    }
    const wrap = h("div", {class: "card-group card-group-collapsed", "data-group": String(g.id)});
    const line = h("button", {type: "button", class: "card-group-line", "aria-expanded": "false",
      title: "Nothing here is judged a problem; click to show the cards",
      onclick: () => {
        const shown = wrap.querySelector(".cards");
        if (shown) shown.remove();
        else wrap.appendChild(row());
        line.setAttribute("aria-expanded", shown ? "false" : "true");
      }},
    h("span", {class: "card-group-label"}, String(g.label ?? g.id)), " ", h("span", {class: "card-group-text"}, String(g.line ?? "")));
    wrap.appendChild(line);
    return wrap;
  };
  const na = Array.isArray(layout.not_applicable) ? layout.not_applicable.filter((x) => x && typeof x === "object") : [];
  const judged = groups.filter((g) => g.judged === true);
  const calm = groups.filter((g) => g.judged !== true);
  mount(container, h("div", {class: "card-groups"},
    judged.length ? h("div", {class: "card-groups-judged"}, judged.map(groupEl)) : null,
    calm.length ? h("div", {class: "card-group-lines"}, calm.map(groupEl)) : null,
    na.length ? h("p", {class: "note cards-na", "data-not-applicable": na.map((x) => String(x.id)).join(" "),
      title: na.map((x) => `${String(x.label ?? x.id)}: ${String(x.why ?? "")}`).join("\n")},
    h("strong", {}, "Not applicable: "), na.map((x) => String(x.label ?? x.id)).join(", "), " (hover for why).") : null));
  return container;
}
