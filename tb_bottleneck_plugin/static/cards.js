// Headline cards, driven by ONE list of metric descriptors (CARDS below).
//
// A card's number, colour and verdict words come from the server: report.verdicts[id] =
// {value, unit, severity, verdict, thresholds, rule} (docs/route-schema.json `verdict`,
// made from thresholds.py in report.py). This file only formats the value by its unit,
// picks the style class named by the severity word and adds detail lines read from the
// report. It holds no threshold and decides no verdict.
//
// ADDING A CARD: one descriptor in CARDS, with the id the server uses in report.verdicts
// (and its METRICS.md entry server-side). A verdict without a descriptor is still shown, as a
// plain card titled by its id (value, colour and words are the server's anyway). Fields:
//   id        key in report.verdicts
//   label     card title (or label(report), e.g. "Matrix cores" on AMD); sublabel(report)? -> small text beside it
//   field     where the report holds the number (a path, shown only when the report has no
//             verdict for the card, i.e. its "verdicts" section failed; the card is then uncoloured)
//   explain   one line under the verdict (or explain(report));   def: hover text (definition, from defs.js)
//   details(report)? -> extra lines (strings or nodes) read from the report's sections
//   optional  true: no card when the value is n/a or exactly 0 (communication on one GPU:
//             nothing to show; a display choice, not a verdict)
//
// renderCards(container, reports[], ctx) renders one row of cards per report (compare:
// baseline and candidate; any list of selections), so every view shows the same cards.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtBytes, fmtCount, fmtNum, readableKey} from "./format.js";
import {DEFS} from "./defs.js";
import {gpuEntries, deviceName, memoryDevices, reservedKnown, memDeviceLabel, naReason, severityClass} from "./common.js";

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

export const CARDS = [
  {
    id: "input_bound",
    label: "Input-bound",
    field: ["input", "input_bound_pct"],
    unit: "pct",
    explain: "Share of step time spent only waiting for the DataLoader.",
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
  {
    id: "gpu_utilization",
    label: "GPU utilization",
    field: ["gpu", "0", "utilization_pct"],
    unit: "pct",
    sublabel: (report) => {
      const n = gpuEntries(report).length;
      return n > 1 ? `mean of ${n} GPUs` : null;
    },
    explain: "Share of the steps window with a kernel running.",
    def: `${DEFS.gpu}\n\n${DEFS.sm}`,
    details(report) {
      const devs = gpuEntries(report);
      if (devs.length === 1) {
        const [id, g] = devs[0];
        const n = deviceName(report, id);
        return [n ? `GPU ${id}: ${n}` : null,
          g && isNum(g.est_sm_efficiency_pct) ? `est. SM efficiency ${fmtPct(g.est_sm_efficiency_pct)}` : null];
      }
      return devs.length ? [devs.map(([id, g]) => `GPU ${id}: ${fmtPct(g && g.utilization_pct)}`).join(" · ")] : [];
    },
  },
  {
    id: "tensor_cores",
    label: (report) => coresWord(report),
    field: ["tensor_cores", "tensor_core_pct"],
    unit: "pct",
    explain: (report) => (isAmd(report) ? "Share of kernel time in matrix-core (MFMA) kernels." : "Share of kernel time in Tensor Core kernels."),
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
  {
    // FLOPs and MFU (analysis/flops.py, METRICS.md §15): value, colour and words (e.g. "9 % of
    // H100 SXM bf16 peak · 86 of 989 TFLOP/s") are the server's; the lines below read report.flops.
    id: "mfu",
    label: "MFU",
    sublabel: (report) => {
      const p = (report.flops || {}).peak;
      return p && typeof p === "object" && typeof p.source === "string" && p.source.startsWith("user")
        ? "user-given peak" : "of the dense peak";
    },
    field: ["flops", "mfu_pct"],
    unit: "pct",
    explain: "Model FLOPs (from recorded shapes) per step time, as a share of the GPU's dense peak.",
    def: "MFU: FLOPs counted from the recorded shapes of GEMM, convolution and attention ops (as "
      + "FlopCounterMode counts them) over the step time, divided by the GPU's dense peak for each "
      + "precision. Roofline: FLOPs per byte against the ridge point peak / memory bandwidth.",
    details(report) {
      const f = report.flops || {};
      const tf = (x) => (isNum(x) ? fmtNum(x, 1) : "n/a");
      const split = f.mfu_split_pct && typeof f.mfu_split_pct === "object"
        ? Object.entries(f.mfu_split_pct).filter(([, v]) => isNum(v) && v > 0).sort((a, b) => b[1] - a[1]) : [];
      const classes = f.by_class && typeof f.by_class === "object"
        ? Object.entries(f.by_class).filter(([, c]) => c && isNum(c.kernel_us) && c.kernel_us > 0 && c.bound)
          .sort((a, b) => b[1].kernel_us - a[1].kernel_us).slice(0, 3) : [];
      const unc = f.uncounted_calls && typeof f.uncounted_calls === "object" ? Object.values(f.uncounted_calls) : [];
      const nUnc = unc.filter(isNum).reduce((a, b) => a + b, 0);
      return [
        isNum(f.flops_per_step) ? `${tf(f.flops_per_step / 1e9)} GFLOP per step · ${tf(f.tflops)} TFLOP/s over the step` : null,
        split.length > 1 ? `by precision: ${split.map(([k, v]) => `${k} ${fmtPct(v)}`).join(" · ")}` : null,
        isNum(f.busy_efficiency_pct) ? `${fmtPct(f.busy_efficiency_pct)} of the peak while the GPU is busy` : null,
        classes.length ? `roofline: ${classes.map(([k, c]) => `${k} ${c.bound}-bound${isNum(c.roofline_pct) ? ` ${fmtPct(c.roofline_pct, 0)}` : ""}`).join(" · ")}` : null,
        nUnc > 0 ? `${fmtCount(nUnc)} call(s) with a formula not counted (shapes missing)` : null,
      ];
    },
  },
  {
    id: "occupancy",
    label: "Est. achieved occupancy",
    sublabel: () => "theoretical, from the occupancy calculator",
    field: ["occupancy", "est_achieved_occupancy_pct"],
    unit: "pct",
    explain: "Kernel-time-weighted estimate per launch; not a measurement.",
    def: `${DEFS.occupancy}\n\n${DEFS.gridSmall}`,
    details(report) {
      const occ = report.occupancy || {};
      return [isNum(occ.grid_too_small_pct) ? `grid too small: ${fmtPct(occ.grid_too_small_pct)} of kernel time` : null];
    },
  },
  {
    id: "peak_memory",
    label: "Peak memory",
    sublabel: (report, v) => {
      const [key] = memoryOf(report, v);
      return key ? memDeviceLabel(report, key) : null;
    },
    field: null, // per device: report.memory[device].peak_allocated_bytes
    unit: "bytes",
    explain: "Peak memory allocated by tensors.",
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
      if (gpuKeys.length > 1) out.push(gpuKeys.map((k) => `${k.replace("cuda:", "GPU ")}: ${fmtBytes(mem[k] && mem[k].peak_allocated_bytes)}`).join(" · "));
      return out;
    },
  },
  {
    id: "allocator_slack",
    label: "Fragmentation",
    field: null, // per device: report.memory[device].slack_fragmentation_pct
    unit: "pct",
    explain: "Reserved by the caching allocator but unused at the peak.",
    def: DEFS.slack,
    sublabel: (report, v) => {
      const [key] = memoryOf(report, v);
      return key && memoryDevices(report.memory || {}).length > 1 ? `allocator slack (${key.replace("cuda:", "GPU ")}), not XProf's fragmentation`
        : "allocator slack, not XProf's fragmentation";
    },
    details(report, v) {
      const [key, m] = memoryOf(report, v);
      if (!m) return [];
      const fb = m.free_block_fragmentation_pct;
      return [
        isNum(m.slack_fragmentation_time_weighted_pct) ? `time-weighted slack ${fmtPct(m.slack_fragmentation_time_weighted_pct)}` : null,
        isNum(fb) ? `free-block (XProf/BFC) ${fmtPct(fb)}`
          : `free-block (XProf/BFC): ${naReason(report, `memory.${key}.free_block_fragmentation_pct`, "free_block_fragmentation_pct") || "n/a"}`,
      ];
    },
  },
  {
    id: "sync",
    label: "Synchronisation",
    field: ["sync", "sync_gpu_idle_pct"],
    unit: "pct",
    explain: "GPU idle while the host waits in synchronisation calls, share of step time.",
    def: DEFS.sync,
    details(report) {
      const sync = report.sync || {};
      const ops = Array.isArray(sync.top_ops) ? sync.top_ops.slice(0, 2) : [];
      return [
        isNum(sync.sync_us) ? `host in sync calls ${fmtUs(sync.sync_us)}${isNum(sync.sync_pct) ? ` (${fmtPct(sync.sync_pct)} of step time)` : ""}` : null,
        ops.length ? `from ${ops.map((o) => String(o.op ?? "")).join(", ")}` : null,
      ];
    },
  },
  {
    id: "communication",
    label: "Communication",
    field: ["communication", "comm_pct_of_kernel_time"],
    unit: "pct",
    optional: true,
    explain: "Share of kernel time in collective (communication) kernels.",
    def: DEFS.comm,
    details(report) {
      const comm = report.communication || {};
      return [
        isNum(comm.comm_us) ? `${fmtUs(comm.comm_us)} of communication kernels` : null,
        isNum(comm.overlap_pct) ? `overlapped with compute ${fmtPct(comm.overlap_pct)}` : null,
      ];
    },
  },
  {
    // torch.compile / CUDA graphs (analysis/compilation.py, METRICS.md §16): the value is the
    // compiled share of the step; colour and words (breaks, steady recompiles) are the server's.
    id: "compilation",
    label: "Compilation",
    sublabel: () => "torch.compile",
    field: ["compilation", "compiled_pct"],
    unit: "pct",
    optional: true,
    explain: "Share of step time inside torch.compile'd regions and compiled backward graphs (CPU wall).",
    def: "torch.compile: CPU time inside 'Torch-Compiled Region' spans and CompiledFunctionBackward, share of "
      + "step time. A graph break splits a compiled frame (the rest runs as a nested resume frame); a compile "
      + "id above 0 is a recompile. Triton kernel names reveal the ATen ops Inductor fused.",
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
  {
    id: "short_kernels",
    label: "Short kernels",
    field: ["occupancy", "short_kernels", "time_pct"],
    unit: "pct",
    explain: "Share of kernel time in very short kernels (launch overhead).",
    def: DEFS.shortKernels,
    details(report) {
      const sk = (report.occupancy || {}).short_kernels || {};
      return [
        isNum(sk.count) ? `${fmtCount(sk.count)} kernels shorter than ${fmtUs(sk.threshold_us)}` : null,
        isNum(sk.mean_gap_us) ? `mean launch gap ${fmtUs(sk.mean_gap_us)}` : null,
      ];
    },
  },
];

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
export function cardRow(report, {cards = CARDS} = {}) {
  const known = new Set(CARDS.map((d) => d.id));
  const verdicts = report && report.verdicts && typeof report.verdicts === "object" ? Object.keys(report.verdicts) : [];
  const extra = cards === CARDS ? verdicts.filter((id) => !known.has(id)).map(genericDescriptor) : [];
  const all = [...cards, ...extra];
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
    h("strong", {}, "GPU cards: n/a"), " — CPU-only trace (no GPU kernels): ", folded.map(name).join(", "), ".");
}

/**
 * Renders the cards of N reports into container: one row per report, each headed by
 * ctx.labels[i] when there is more than one report (e.g. ["Baseline", "Candidate"]).
 * ctx: {labels?: string[], cards?: descriptor list (a subset of CARDS)}.
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
