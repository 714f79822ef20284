// Views: headline cards, recommendations, charts and tables built from one
// report object (docs/report-schema.md). Every string that comes from a trace
// (kernel, op and file names, messages) goes through h() as text.

import {h, clear, mount} from "./dom.js";
import {responsive, stackedBarChart, lineChart, histogram, withTooltip} from "./charts.js";
import {
  isNum, fmtPct, fmtUs, fmtUsTick, fmtMs, fmtBytes, fmtCount, fmtNum, fmtByName, humanizeKey, readableKey, shortenKernelName, spanLabel,
} from "./format.js";

// ------------------------------------------------------------ definitions (hover texts, from metrics.md)

export const CATEGORIES = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"];

const CAT_NAMES = {
  kernel: "Kernel", memcpy: "Memcpy", memset: "Memset", communication: "Communication",
  runtime: "Runtime", dataloader: "DataLoader", cpu_exec: "CPU Exec", other: "Other (idle)",
};

const CAT_COLORS = Object.fromEntries(CATEGORIES.map((k) => [k, `var(--c-${k.replace("_", "-")})`]));

const CAT_DEFS = {
  kernel: "GPU kernels on any device, except communication kernels.",
  memcpy: "GPU memory copies (gpu_memcpy) on any device, not already covered by a kernel.",
  memset: "GPU memsets on any device, not already covered by a kernel or memcpy.",
  communication: "Collective kernels (nccl/rccl and known custom all-reduce kernels) and CPU spans named nccl:*, gloo:*, rccl:*.",
  runtime: "CUDA/HIP runtime and driver calls (cudaLaunchKernel, cuLaunchKernel, ...) not covered by GPU work.",
  dataloader: "CPU spans enumerate(DataLoader)#...__next__ / enumerate(DataPipe)#...: the host waits for the next batch while nothing else runs.",
  cpu_exec: "Other CPU operator spans (cpu_op, user_annotation), not python_function frames.",
  other: "Time in the step covered by none of the categories above (idle).",
};

const BREAKDOWN_DEF = "Each instant of a step goes to exactly one category, the first that covers it in the order "
  + "Kernel > Memcpy > Memset > Communication > Runtime > DataLoader > CPU Exec > Other, so the categories add up to the "
  + "step time (torch-tb-profiler's definition). Steps are stretched to cover the GPU work they launched.";

const DEFS = {
  input: "Input-bound % = 100 × Σ DataLoader-category time / Σ step time over the included steps (ratio of sums): "
    + "the share of step time in which the host waited for the next batch while neither the GPU nor the CUDA runtime did "
    + "anything else. Verdict thresholds (XProf): ≥ 20% highly, ≥ 5% moderately input-bound. "
    + "Input transfer (H2D copies not overlapped by kernels) is reported beside it; XProf-compatible input % = input-bound % + input transfer %.",
  transfer: "Input transfer % = Union(memcpy HtoD) minus Union(all kernels), inside each step, as a ratio of sums. Not part of input-bound %.",
  gpu: "GPU utilization per device = 100 × Union(kernels on that device, clipped to the steps window) / steps window. "
    + "Kernels only, as torch-tb-profiler; the window runs from the first included step's start to the last one's end, gaps included.",
  sm: "Est. SM efficiency = 100 × ∫ min(1, Σ blocks-per-SM of the kernels running at time t) dt / steps window.",
  tc: "Tensor Core % = 100 × time of Tensor Core kernels / time of all kernels (all kernel time in the trace). "
    + "A kernel is a Tensor Core kernel if its name matches the maintained pattern list (hmma, xmma, s1688, wgmma, nvjet, MFMA, ...).",
  eligible: "Eligible but not using = time of non-Tensor-Core kernels launched by ops that could run on Tensor Cores "
    + "(mm, addmm, bmm, matmul, linear, conv*, convolution_backward, einsum, scaled_dot_product_attention, RNNs) / all kernel time.",
  occupancy: "Est. achieved occupancy = mean of the kernels' 'est. achieved occupancy %' weighted by each kernel's duration clipped "
    + "to the steps window. Kineto computes that field with the CUDA occupancy calculator: a theoretical figure for the launch "
    + "configuration, not a hardware measurement.",
  gridSmall: "Grid too small = weighted time of kernels with blocks per SM < 1 / weighted time of kernels with a numeric blocks per SM "
    + "(fewer blocks than SMs: part of the GPU idles during the kernel).",
  memory: "Peak of Total Allocated from the trace's [memory] events for this device (each event's total holds until the next one). "
    + "Reserved is Total Reserved (the caching allocator's segments); capacity is deviceProperties.totalGlobalMem.",
  slack: "Allocator slack = 100 × (peak reserved − peak allocated) / peak reserved: the share of what PyTorch's caching allocator "
    + "reserved that no tensor used even at the peak. This is NOT XProf's fragmentation (free-block: 1 − largest free block / total free), "
    + "which needs a CUDA memory snapshot. Time-weighted slack = ∫(reserved − allocated) dt / ∫ reserved dt.",
  histogram: "Share of kernel time (weighted by duration clipped to the steps window) per bucket of Kineto's estimated achieved occupancy.",
  sync: "Host time in cudaDeviceSynchronize / cudaStreamSynchronize / cudaEventSynchronize (and hip twins) and synchronous DtoH copies, "
    + "clipped to the host spans of the included steps, with the CPU ops that caused them.",
  launch: "CPU time in cudaLaunchKernel / cuLaunchKernel / hipLaunchKernel, and the number of kernels per step.",
  comm: "Communication kernel time and the share of it overlapped by compute kernels (HTA's comm/comp overlap).",
  idle: "HTA's idle breakdown over the span from the first to the last GPU activity on the device: host wait (the next kernel's launch "
    + "started after the previous kernel ended), kernel wait (gap < 30 µs), other.",
};

const KERNEL_COL_DEFS = {
  name: "Kernel name (hover for the full C++ name). Rows are grouped by name, grid, block, registers and shared memory.",
  device: "GPU device id.",
  calls: "Number of launches.",
  total_us: "Total duration of all launches.",
  mean_us: "Mean duration per launch.",
  time_pct: "Share of all kernel time.",
  est_achieved_occupancy_pct: "Estimated achieved occupancy: Kineto's value (CUDA occupancy calculator: theoretical, not measured); "
    + "rows marked \"calc\" show our own occupancy-calculator value where Kineto's is missing or 0.",
  blocks_per_sm: "Blocks per SM of the launch; below 1 the grid is too small to fill the GPU.",
  registers_per_thread: "Registers per thread.",
  shared_memory_bytes: "Shared memory per block.",
  launch: "Grid and block dimensions.",
  tensor_core: "Whether the kernel name matches the Tensor Core pattern list.",
  limiting_factor: "What caps the resident blocks per SM, computed like the CUDA occupancy calculator (warps, registers, shared memory, blocks per SM).",
};

const SEVERITY_ORDER = {critical: 0, high: 1, medium: 2, moderate: 2, warning: 2, low: 3, info: 4, ok: 5};

// ------------------------------------------------------------ small helpers

function severityClass(sev) {
  const s = String(sev || "").toLowerCase();
  if (s === "high" || s === "critical") return "high";
  if (s === "medium" || s === "moderate" || s === "warning") return "medium";
  if (s === "ok" || s === "good") return "ok";
  if (s === "low" || s === "info") return "low";
  return "none";
}

/** The severity the server gave a recommendation rule ("ok" when it did not fire):
 * colours come from thresholds.py through the report, never from literals here. */
function ruleSeverity(report, rule) {
  const rec = (report.recommendations || []).find((r) => r.rule === rule);
  return rec ? rec.severity : "ok";
}

/** The reason a metric is not available, looked up by several possible keys. */
export function naReason(report, ...keys) {
  const na = (report && report.not_available) || {};
  for (const k of keys) if (k && typeof na[k] === "string") return na[k];
  for (const k of keys) {
    if (!k) continue;
    for (const [nk, reason] of Object.entries(na)) {
      if (nk.endsWith(`.${k}`) || nk.startsWith(`${k}.`)) return String(reason);
    }
  }
  return null;
}

function gpuEntries(report) {
  const g = report && report.gpu && typeof report.gpu === "object" ? report.gpu : {};
  return Object.entries(g).sort((a, b) => Number(a[0]) - Number(b[0]) || a[0].localeCompare(b[0]));
}

/** True when the report has no GPU metrics at all. */
export function isCpuOnly(report) {
  return gpuEntries(report).length === 0;
}

function cpuOnlyReason(report) {
  const na = report.not_available || {};
  const hit = Object.values(na).find((r) => /cpu[- ]only/i.test(String(r)));
  return hit || naReason(report, "gpu") || null;
}

function deviceName(report, id) {
  const names = report.device_names || {};
  return names[id] || names[String(id)] || null;
}

function memoryDevices(obj) {
  // "cuda:N" first by N, then the rest ("cpu").
  return Object.keys(obj || {}).sort((a, b) => {
    const ca = /^cuda:(\d+)$/.exec(a);
    const cb = /^cuda:(\d+)$/.exec(b);
    if (ca && cb) return Number(ca[1]) - Number(cb[1]);
    if (ca) return -1;
    if (cb) return 1;
    return a.localeCompare(b);
  });
}

/** Reserved memory is a GPU caching-allocator figure: a CPU "reserved" of 0 means "not recorded". */
function reservedKnown(key, value) {
  return isNum(value) && (String(key).startsWith("cuda:") || value > 0);
}

function memDeviceLabel(report, key) {
  const m = /^cuda:(\d+)$/.exec(key);
  const name = m ? deviceName(report, m[1]) : null;
  return name ? `${key} (${name})` : key;
}

function panel(title, {info, subtitle, cls, id} = {}, ...children) {
  return h("section", {class: ["panel", cls], id},
    h("header", {class: "panel-head"},
      h("h2", {}, title),
      info ? h("span", {class: "info", title: info, tabindex: "0", "aria-label": info}, "?") : null,
      subtitle ? h("span", {class: "panel-sub"}, subtitle) : null),
    h("div", {class: "panel-body"}, ...children));
}

function kv(rows) {
  return h("table", {class: "kv"},
    h("tbody", {}, rows.filter(Boolean).map(([k, v, title]) =>
      h("tr", {title: title || null}, h("th", {scope: "row"}, k), h("td", {}, v)))));
}

function note(text, cls = "") {
  return h("p", {class: ["note", cls]}, text);
}

// ------------------------------------------------------------ generic states

/** Loading state with a progress bar; returns {set(progress, message)}. */
export function renderLoading(container, {title = "Loading…", detail = "", progress = null} = {}) {
  const fill = h("div", {class: "progress-fill"});
  const bar = h("div", {class: "progress", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100"}, fill);
  const pctText = h("span", {class: "progress-text"});
  const detailEl = h("p", {class: "note"}, detail);
  mount(container, h("div", {class: "state state-loading"},
    h("div", {class: "spinner", "aria-hidden": "true"}),
    h("h2", {}, title), bar, pctText, detailEl));
  const set = (p, message) => {
    if (isNum(p)) {
      const v = Math.max(0, Math.min(100, p * 100));
      bar.classList.remove("indeterminate");
      fill.style.width = `${v.toFixed(1)}%`;
      bar.setAttribute("aria-valuenow", v.toFixed(0));
      pctText.textContent = `${v.toFixed(0)}%`;
    } else {
      bar.classList.add("indeterminate");
      fill.style.width = "";
      bar.removeAttribute("aria-valuenow");
      pctText.textContent = "";
    }
    if (message) detailEl.textContent = message;
  };
  set(progress);
  return {set};
}

/** Error state: title, the API message, the file it concerns, and a retry button. */
export function renderError(container, {title = "Something went wrong", message = "", file = null, status = null, hint = null,
  errors = [], onRetry = null} = {}) {
  const more = (errors || []).length > 1 ? errors : [];
  mount(container, h("div", {class: "state state-error", role: "alert"},
    h("h2", {}, title),
    file ? h("p", {class: "err-file"}, h("span", {class: "muted"}, "File: "), h("code", {}, file)) : null,
    message && !more.length ? h("pre", {class: "err-message"}, message) : null,
    more.length ? h("ul", {class: "err-list"}, more.map((e) => h("li", {},
      e.file ? h("code", {}, e.file) : null, h("pre", {class: "err-message"}, e.error)))) : null,
    status ? h("p", {class: "note"}, `HTTP status ${status}`) : null,
    hint ? h("p", {class: "note"}, hint) : null,
    onRetry ? h("button", {type: "button", class: "btn", onclick: onRetry}, "Retry") : null));
}

/** Empty state. */
export function renderEmpty(container, {title, body = []} = {}) {
  mount(container, h("div", {class: "state state-empty"}, h("h2", {}, title), ...body));
}

export const TRACE_HOWTO = `import torch
from torch.profiler import profile, schedule, tensorboard_trace_handler

with profile(
    schedule=schedule(wait=1, warmup=1, active=3),
    on_trace_ready=tensorboard_trace_handler("LOGDIR/my_run"),
    record_shapes=True, profile_memory=True,
) as prof:
    for batch in loader:
        train_step(batch)
        prof.step()`;

// ------------------------------------------------------------ the report

/**
 * Renders a whole report into container.
 * ctx: {sel: {run, worker, span}, spans: [{span, file, timestamp}], onPickSpan(span),
 *       api: {getMemory, getKernels}, signal}
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
  container.appendChild(cards(report, cpuOnly));
  container.appendChild(recommendations(report));
  container.appendChild(h("div", {class: "row row-3-2"}, breakdownPanel(report), inputPanel(report)));
  container.appendChild(h("div", {class: "row row-3-2"}, memoryPanel(report, ctx), occupancyPanel(report, cpuOnly)));
  container.appendChild(kernelPanel(report, ctx, cpuOnly));
  container.appendChild(h("div", {class: "row row-1-1"}, tensorCorePanel(report, cpuOnly), otherSignalsPanel(report, cpuOnly)));
  const na = notAvailablePanel(report);
  if (na) container.appendChild(na);
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
  for (const [id] of gpuEntries(report)) {
    const n = deviceName(report, id);
    bits.push(`GPU ${id}${n ? `: ${n}` : ""}`);
  }
  if (!bits.length) {
    for (const [id, n] of Object.entries(report.device_names || {})) bits.push(`GPU ${id}: ${n}`);
  }
  if (isNum(steps.count)) {
    let range = "";
    if (nums.length) {
      const rs = stepRanges(nums);
      range = ` (${rs.length > 6 ? `${rs.slice(0, 3).join(", ")}, … ${rs[rs.length - 1]}` : rs.join(", ")})`;
    }
    bits.push(`${steps.count} step${steps.count === 1 ? "" : "s"}${range}`);
  }
  if (isNum(report.avg_step_us)) bits.push(`avg step ${fmtUs(report.avg_step_us)}`);
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
    lines.push(note(`Excluded: ${excl.map((e) => `step ${e.number} (${e.reason})`).join("; ")}`));
  }
  const warnings = Array.isArray(tr.warnings) ? tr.warnings : [];
  for (const w of warnings) lines.push(note(`⚠ ${w}`, "warn"));
  return h("div", {class: "summary"},
    h("div", {class: "summary-line"}, bits.map((b, i) => [i ? h("span", {class: "dot"}, "·") : null, h("span", {}, b)])),
    report.source ? h("div", {class: "source", title: report.source}, report.source) : null,
    ...lines);
}

// ------------------------------------------------------------ cards

function card({label, sublabel, value, verdict, severity = "none", explain, details = [], def}) {
  // A missing value's verdict is the reason it is missing: muted, clamped, full text on hover.
  const na = value === "n/a";
  return h("div", {class: ["card", `sev-${severity}`], title: def || null, tabindex: "0"},
    h("div", {class: "card-label"}, label, sublabel ? h("span", {class: "card-sublabel"}, sublabel) : null),
    h("div", {class: "card-value"}, value),
    verdict ? h("div", {class: ["card-verdict", na ? "na" : null], title: na ? String(verdict) : null}, verdict) : null,
    explain ? h("div", {class: "card-explain"}, explain) : null,
    ...details.filter(Boolean).map((d) => h("div", {class: "card-detail", title: typeof d === "string" ? d : null}, d)));
}

function cards(report, cpuOnly) {
  const out = h("div", {class: "cards"});
  const inp = report.input || {};
  const cpuMsg = "CPU-only trace: no GPU metrics";

  // Input-bound %
  {
    const pct = inp.input_bound_pct;
    const sev = isNum(pct) ? (inp.severity || "none") : "none";  // verdicts come from the server (thresholds.py)
    const st = inp.stats || {};
    out.appendChild(card({
      label: "Input-bound",
      value: fmtPct(pct),
      verdict: isNum(pct) ? (inp.verdict || "") : (naReason(report, "input_bound_pct", "input") || "not available"),
      severity: sev,
      explain: "Share of step time spent only waiting for the DataLoader.",
      details: [
        isNum(inp.input_transfer_pct) ? `+ ${fmtPct(inp.input_transfer_pct)} input transfer (H2D); XProf-style input ${fmtPct(isNum(inp.xprof_input_pct) ? inp.xprof_input_pct : pct + inp.input_transfer_pct)}` : null,
        isNum(st.min) && isNum(st.max) ? `per step ${fmtPct(st.min)} – ${fmtPct(st.max)}` : null,
      ],
      def: DEFS.input,
    }));
  }

  // GPU utilization
  {
    const devs = gpuEntries(report);
    if (!devs.length) {
      out.appendChild(card({label: "GPU utilization", value: "n/a", verdict: cpuOnly ? cpuMsg : naReason(report, "gpu", "utilization_pct"),
        explain: "Share of the steps window with a kernel running.", def: DEFS.gpu}));
    } else {
      const utils = devs.map(([, g]) => g && g.utilization_pct).filter(isNum);
      const mean = utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null;
      const sev = !isNum(mean) ? "none" : mean >= 80 ? "ok" : mean >= 50 ? "medium" : "high";
      const verdict = !isNum(mean) ? (naReason(report, "utilization_pct", "gpu") || "not available")
        : mean >= 80 ? "GPU mostly busy" : mean >= 50 ? `idle ${fmtPct(100 - mean, 0)} of the time` : "GPU mostly idle";
      const [id0, g0] = devs[0];
      const details = [];
      if (devs.length === 1) {
        const n = deviceName(report, id0);
        if (n) details.push(`GPU ${id0}: ${n}`);
        if (g0 && isNum(g0.est_sm_efficiency_pct)) details.push(`est. SM efficiency ${fmtPct(g0.est_sm_efficiency_pct)}`);
      } else {
        details.push(devs.map(([id, g]) => `GPU ${id}: ${fmtPct(g && g.utilization_pct)}`).join(" · "));
      }
      out.appendChild(card({label: "GPU utilization", sublabel: devs.length > 1 ? `mean of ${devs.length} GPUs` : null,
        value: fmtPct(mean), verdict, severity: sev,
        explain: "Share of the steps window with a kernel running.", details, def: `${DEFS.gpu}\n\n${DEFS.sm}`}));
    }
  }

  // Tensor Cores
  {
    const tc = report.tensor_cores || {};
    if (cpuOnly) {
      out.appendChild(card({label: "Tensor Cores", value: "n/a", verdict: cpuMsg, explain: "Share of kernel time on Tensor Cores.", def: DEFS.tc}));
    } else {
      const el = tc.eligible_not_using_pct;
      const sev = !isNum(el) ? "none" : el >= 30 ? "high" : el >= 10 ? "medium" : "ok";
      const verdict = isNum(el) && el >= 1
        ? `${fmtPct(el)} of kernel time eligible but unused`
        : isNum(tc.tensor_core_pct) ? (tc.tensor_core_pct > 0 ? "in use; no eligible op left out" : "no eligible work found")
          : (naReason(report, "tensor_core_pct", "tensor_cores") || "not available");
      const split = tc.precision_split_pct && typeof tc.precision_split_pct === "object"
        ? Object.entries(tc.precision_split_pct).filter(([, v]) => isNum(v) && v >= 0.5).sort((a, b) => b[1] - a[1])
          .map(([k, v]) => `${k} ${fmtPct(v, 0)}`).join(" · ")
        : "";
      out.appendChild(card({label: "Tensor Cores", value: fmtPct(tc.tensor_core_pct), verdict, severity: sev,
        explain: "Share of kernel time in Tensor Core kernels.",
        details: [split ? `precision: ${split}` : null], def: `${DEFS.tc}\n\n${DEFS.eligible}`}));
    }
  }

  // Est. achieved occupancy
  {
    const occ = report.occupancy || {};
    let v = occ.est_achieved_occupancy_pct;
    if (!isNum(v)) {
      const per = gpuEntries(report).map(([, g]) => g && g.est_achieved_occupancy_pct).filter(isNum);
      if (per.length) v = per.reduce((a, b) => a + b, 0) / per.length;
    }
    const sk = occ.short_kernels || null;
    out.appendChild(card({label: "Est. achieved occupancy", sublabel: "theoretical, from the occupancy calculator",
      value: fmtPct(v),
      verdict: isNum(v) ? null : (cpuOnly ? cpuMsg : (naReason(report, "est_achieved_occupancy_pct", "occupancy") || "not available")),
      explain: "Kernel-time-weighted estimate per launch; not a measurement.",
      details: [
        isNum(occ.grid_too_small_pct) ? `grid too small: ${fmtPct(occ.grid_too_small_pct)} of kernel time` : null,
        sk && isNum(sk.count) ? `${fmtCount(sk.count)} kernels < ${isNum(sk.threshold_us) ? sk.threshold_us : 10} µs (${fmtPct(sk.time_pct)} of time)` : null,
      ],
      def: `${DEFS.occupancy}\n\n${DEFS.gridSmall}`}));
  }

  // Peak memory and allocator slack
  {
    const mem = report.memory && typeof report.memory === "object" ? report.memory : {};
    const keys = memoryDevices(mem);
    const gpuKeys = keys.filter((k) => k.startsWith("cuda:"));
    const key = gpuKeys[0] || keys[0];
    const m = key ? mem[key] || {} : null;
    if (!m) {
      const why = naReason(report, "memory") || "no [memory] events: profile with profile_memory=True";
      out.appendChild(card({label: "Peak memory", value: "n/a", verdict: why, explain: "Peak memory allocated by tensors.", def: DEFS.memory}));
      out.appendChild(card({label: "Fragmentation", sublabel: "allocator slack, not XProf's fragmentation", value: "n/a",
        verdict: why, explain: "Reserved by the caching allocator but unused at the peak.", def: DEFS.slack}));
    } else {
      const details = [];
      if (reservedKnown(key, m.peak_reserved_bytes)) details.push(`peak reserved ${fmtBytes(m.peak_reserved_bytes)}`);
      else if (key.startsWith("cuda:")) {
        const why = naReason(report, `memory.${key}.peak_reserved_bytes`, "peak_reserved_bytes");
        details.push(`reserved: not recorded${why ? ` (${why})` : ""}`);
      }
      if (m.allocated_is_relative) details.push("growth since profiling start (old trace: rebuilt from Bytes)");
      if (gpuKeys.length > 1) details.push(gpuKeys.slice(1).map((k) => `${k}: ${fmtBytes(mem[k] && mem[k].peak_allocated_bytes)}`).join(" · "));
      const leak = m.growth && m.growth.possible_leak;
      if (leak) details.push("⚠ allocated memory rises every step: possible leak");
      const capPct = isNum(m.capacity_bytes) && isNum(m.peak_allocated_bytes) && m.capacity_bytes > 0
        ? 100 * m.peak_allocated_bytes / m.capacity_bytes : null;
      out.appendChild(card({label: "Peak memory", sublabel: memDeviceLabel(report, key),
        value: fmtBytes(m.peak_allocated_bytes),
        verdict: isNum(capPct) ? `${fmtPct(capPct)} of ${fmtBytes(m.capacity_bytes)}` : null,
        severity: leak ? "medium" : "none",  // the leak flag is the server's (thresholds.py)
        explain: "Peak memory allocated by tensors.", details, def: DEFS.memory}));

      const slack = m.slack_fragmentation_pct;
      const sev = !isNum(slack) ? "none" : slack >= 30 ? "medium" : "ok";
      const fb = m.free_block_fragmentation_pct;
      out.appendChild(card({label: "Fragmentation", sublabel: "allocator slack, not XProf's fragmentation",
        value: fmtPct(slack),
        verdict: isNum(slack) ? (slack >= 30 ? "much reserved memory unused at the peak" : "little unused reserved memory")
          : (naReason(report, `memory.${key}.slack_fragmentation_pct`, "slack_fragmentation_pct")
             || (key.startsWith("cuda:") ? "not available" : "GPU devices only")),
        severity: sev,
        explain: "Reserved by the caching allocator but unused at the peak.",
        details: [
          isNum(m.slack_fragmentation_time_weighted_pct) ? `time-weighted slack ${fmtPct(m.slack_fragmentation_time_weighted_pct)}` : null,
          isNum(fb) ? `free-block (XProf/BFC) ${fmtPct(fb)}`
            : `free-block (XProf/BFC): ${naReason(report, `memory.${key}.free_block_fragmentation_pct`, "free_block_fragmentation_pct") || "n/a"}`,
        ],
        def: DEFS.slack}));
    }
  }
  return out;
}

// ------------------------------------------------------------ recommendations

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

function recommendations(report) {
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

// ------------------------------------------------------------ step-time breakdown

function breakdownPanel(report) {
  const per = Array.isArray(report.breakdown_per_step) ? report.breakdown_per_step : [];
  const pct = report.breakdown_pct || {};
  const us = report.breakdown_us || {};
  // Summaries tag each step with its span: the same step number can come from several files.
  const multiSpan = new Set(per.map((p) => p.span).filter((x) => x !== undefined && x !== null)).size > 1;
  let bars = per.map((p) => ({label: `#${p.step}`, title: multiSpan ? `Step ${p.step} (span ${p.span})` : `Step ${p.step}`, total: p.total_us,
    parts: Object.fromEntries(CATEGORIES.map((k) => [k, p[k]]))}));
  if (!bars.length && Object.keys(us).length) {
    bars = [{label: "avg", title: "Average step", total: report.avg_step_us, parts: us}];
  }
  if (!bars.length) {
    return panel("Step-time breakdown", {info: BREAKDOWN_DEF}, note(naReason(report, "breakdown_pct", "breakdown_us") || "No breakdown in this report."));
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
  return panel("Step-time breakdown", {info: BREAKDOWN_DEF, subtitle: avg}, legend, chart,
    note("Percentages in the legend are shares of the average step. Hover a segment for its time."));
}

// ------------------------------------------------------------ input pipeline

function inputPanel(report) {
  const inp = report.input || {};
  const ev = inp.evidence || {};
  const st = inp.stats || {};
  const its = Array.isArray(ev.dataloader_iterators) ? ev.dataloader_iterators : [];
  const rows = [
    ["Input-bound (DataLoader wait)", h("span", {class: `sev-text-${isNum(inp.input_bound_pct) ? (inp.severity || "none") : "none"}`},
      `${fmtPct(inp.input_bound_pct)}${isNum(inp.input_bound_pct) && inp.verdict ? ` · ${inp.verdict}` : ""}`), DEFS.input],
    ["Input transfer (H2D not under kernels)", fmtPct(inp.input_transfer_pct), DEFS.transfer],
    isNum(inp.xprof_input_pct) ? ["XProf-compatible input %", `${fmtPct(inp.xprof_input_pct)} (input-bound + input transfer)`] : null,
    isNum(st.mean) ? ["Per step", `mean ${fmtPct(st.mean)} · min ${fmtPct(st.min)} · max ${fmtPct(st.max)} · std ${fmtNum(st.std)} pp`] : null,
    its.length ? ["DataLoader iterator", h("span", {}, its.map((it, i) => [i ? ", " : null, h("code", {}, it)]),
      ev.num_workers_zero ? h("span", {class: "sev-text-high"}, " → num_workers=0") : null)] : null,
    isNum(ev.pageable_h2d_copies) ? ["H2D copies from pageable memory",
      ev.pageable_h2d_copies > 0
        ? h("span", {}, `${fmtCount(ev.pageable_h2d_copies)} (${fmtUs(ev.pageable_h2d_us)}) → `, h("code", {}, "pin_memory=True"))
        : "none"] : null,
  ];
  const slow = Array.isArray(ev.slowest_steps) ? ev.slowest_steps : [];
  const slowTable = slow.length ? h("table", {class: "grid-table compact"},
    h("thead", {}, h("tr", {}, h("th", {}, "Slowest steps"), h("th", {class: "num"}, "Step time"), h("th", {class: "num"}, "DataLoader"), h("th", {class: "num"}, "share"))),
    h("tbody", {}, slow.map((sl) => h("tr", {},
      h("td", {}, `#${sl.step}`), h("td", {class: "num"}, fmtUs(sl.step_us)), h("td", {class: "num"}, fmtUs(sl.dataloader_us)),
      h("td", {class: "num"}, isNum(sl.step_us) && sl.step_us > 0 && isNum(sl.dataloader_us) ? fmtPct(100 * sl.dataloader_us / sl.step_us) : "n/a"))))) : null;
  return panel("Input pipeline", {info: DEFS.input}, kv(rows), slowTable);
}

// ------------------------------------------------------------ memory over time

function memoryPanel(report, ctx) {
  const body = h("div", {class: "memory-body"});
  const p = panel("Memory over time", {info: `${DEFS.memory}\n\nSlack % = 100 × (reserved − allocated) / reserved at each instant (right axis).`}, body);
  const sel = (ctx && ctx.sel) || {};
  if (!sel.span || sel.span === "all") {
    const spans = (ctx && ctx.spans) || [];
    mount(body, note("Memory timelines are per trace file. Pick a span to see allocated and reserved memory over time:"),
      spans.length ? h("div", {class: "span-buttons"}, spans.map((sp, i) => h("button", {type: "button", class: "btn btn-small",
        title: [`span ${sp.span}`, sp.file].filter(Boolean).join("\n"), onclick: () => ctx.onPickSpan && ctx.onPickSpan(sp.span)},
      spanLabel(sp, i)))) : null);
    return p;
  }
  const memRep = report.memory && typeof report.memory === "object" ? report.memory : {};
  if (!Object.keys(memRep).length && naReason(report, "memory")) {
    mount(body, note(naReason(report, "memory")));
    return p;
  }
  const loader = renderLoading(body, {title: "Loading memory timeline…"});
  ctx.api.getMemory({run: sel.run, worker: sel.worker === "all" ? null : sel.worker, span: sel.span}, {
    signal: ctx.signal, onProgress: (pr) => loader.set(pr)})
    .then((r) => {
      if (r.kind === "aborted") return;
      if (r.kind === "error") {
        renderError(body, {title: "Could not load the memory timeline", message: r.message, file: r.file, status: r.status});
        return;
      }
      renderMemoryCharts(body, r.data || {}, report);
    });
  return p;
}

function renderMemoryCharts(body, data, report) {
  clear(body);
  const devs = data.devices && typeof data.devices === "object" ? data.devices : {};
  // The route sends ts_us: trace timestamps in µs (docs/route-schema.json). The x axis shows
  // milliseconds since the trace's first event (the first sample when the report lacks it).
  const keys = memoryDevices(devs).filter((k) => devs[k] && Array.isArray(devs[k].ts_us) && devs[k].ts_us.length);
  if (!keys.length) {
    const na = typeof data.not_available === "string" ? data.not_available
      : data.not_available && typeof data.not_available === "object" ? Object.values(data.not_available)[0] : null;
    body.appendChild(note(na || naReason(report, "memory")
      || "No [memory] events in this trace. Profile with torch.profiler.profile(profile_memory=True) to record them."));
    return;
  }
  const naMem = data.not_available && typeof data.not_available === "object" ? data.not_available : {};
  const firstSample = Math.min(...keys.map((k) => devs[k].ts_us.find(isNum)).filter(isNum));
  const traceStart = report.trace && isNum(report.trace.first_ts_us) && report.trace.first_ts_us <= firstSample
    ? report.trace.first_ts_us : firstSample;
  for (const key of keys) {
    const d = devs[key];
    const xs = d.ts_us.map((t) => (isNum(t) ? (t - traceStart) / 1000 : null));
    const alloc = Array.isArray(d.allocated_bytes) ? d.allocated_bytes : [];
    const res = Array.isArray(d.reserved_bytes) && d.reserved_bytes.length === xs.length ? d.reserved_bytes : null;
    const series = [{name: "allocated", xs, ys: alloc, color: "var(--c-alloc)", step: true}];
    if (res) {
      series.push({name: "reserved", xs, ys: res, color: "var(--c-reserved)", step: true});
      const slack = res.map((r, i) => (isNum(r) && r > 0 && isNum(alloc[i]) ? (100 * (r - alloc[i])) / r : null));
      series.push({name: "slack %", xs, ys: slack, axis: "right", color: "var(--c-slack)", dash: "4 3", step: true});
    }
    const rm = (report.memory || {})[key] || {};
    const facts = [
      isNum(rm.peak_allocated_bytes) ? `peak allocated ${fmtBytes(rm.peak_allocated_bytes)}` : null,
      reservedKnown(key, rm.peak_reserved_bytes) ? `peak reserved ${fmtBytes(rm.peak_reserved_bytes)}` : null,
      isNum(rm.slack_fragmentation_pct) ? `allocator slack ${fmtPct(rm.slack_fragmentation_pct)}` : null,
      isNum(rm.capacity_bytes) ? `capacity ${fmtBytes(rm.capacity_bytes)}` : null,
    ].filter(Boolean).join(" · ");
    const resReason = res ? null : (naMem[`${key}.reserved_bytes`] || naMem[key] || naReason(report, `memory.${key}.peak_reserved_bytes`)
      || (key.startsWith("cuda:") ? "reserved memory not recorded in this trace" : null));
    const legend = h("div", {class: "legend"}, series.map((sr) => h("span", {class: "legend-item"},
      h("span", {class: ["swatch", sr.dash ? "swatch-dash" : null], style: {background: sr.color}}), h("span", {}, sr.name))));
    const chart = responsive(h("div", {class: "chart-box"}), (w) => lineChart({
      width: w, height: 210, series, xFormat: fmtMs, leftFormat: fmtBytes, rightFormat: (v) => fmtPct(v, 0),
      rightLabel: res ? "slack %" : "",
      leftTickUnit: (max) => (max >= 2 ** 30 ? 2 ** 30 : max >= 2 ** 20 ? 2 ** 20 : max >= 2 ** 10 ? 2 ** 10 : 1), xLabel: "time since trace start", rightMin: 0, rightMax: 100}));
    const block = h("div", {class: "mem-device"},
      h("div", {class: "mem-head"}, h("strong", {}, memDeviceLabel(report, key)), facts ? h("span", {class: "muted"}, ` ${facts}`) : null),
      legend, chart,
      rm.allocated_is_relative ? note("Allocated is growth since profiling start: this old trace has only signed Bytes per event.") : null,
      resReason ? note(`Reserved: ${resReason}`) : null);
    if (!key.startsWith("cuda:") && keys.some((k) => k.startsWith("cuda:"))) {
      // Host memory matters less here: keep it folded below the GPU curves.
      body.appendChild(h("details", {class: "mem-more"}, h("summary", {}, `${memDeviceLabel(report, key)} (host) memory`), block));
    } else {
      body.appendChild(block);
    }
  }
}

// ------------------------------------------------------------ occupancy histogram

function occupancyPanel(report, cpuOnly) {
  const occ = report.occupancy || {};
  const title = "Occupancy";
  const subtitle = "est., theoretical (occupancy calculator)";
  if (cpuOnly) return panel(title, {subtitle, info: DEFS.histogram}, note("CPU-only trace: no GPU metrics."));
  const hist = Array.isArray(occ.histogram) ? occ.histogram : [];
  if (!hist.length) {
    return panel(title, {subtitle, info: DEFS.histogram},
      note(naReason(report, "histogram", "est_achieved_occupancy_pct", "occupancy") || "No kernel carries an occupancy estimate (for example ROCm traces)."));
  }
  const colors = ["var(--c-occ-0)", "var(--c-occ-1)", "var(--c-occ-2)", "var(--c-occ-3)", "var(--c-occ-4)"];
  const bins = hist.map((b) => ({label: String(b.bucket ?? `${b.lo}-${b.hi}`), value: b.pct,
    tooltip: [{text: `occupancy ${b.bucket ?? `${b.lo}-${b.hi}`} %`, bold: true}, `${fmtPct(b.pct)} of weighted kernel time`]}));
  const chart = responsive(h("div", {class: "chart-box"}), (w) => histogram({
    width: w, height: 210, bins, fmt: (v) => fmtPct(v, 0), yLabel: "% of kernel time", xLabel: "est. achieved occupancy (%)",
    color: (b, i) => colors[Math.min(colors.length - 1, Math.round((i * (colors.length - 1)) / Math.max(1, bins.length - 1)))]}));
  const sk = occ.short_kernels || null;
  return panel(title, {subtitle, info: DEFS.histogram},
    kv([
      ["Est. achieved occupancy", fmtPct(occ.est_achieved_occupancy_pct), DEFS.occupancy],
      isNum(occ.grid_too_small_pct) ? ["Grid too small (blocks/SM < 1)", `${fmtPct(occ.grid_too_small_pct)} of kernel time`, DEFS.gridSmall] : null,
      sk && isNum(sk.count) ? [`Short kernels (< ${isNum(sk.threshold_us) ? sk.threshold_us : 10} µs)`,
        `${fmtCount(sk.count)} · ${fmtPct(sk.time_pct)} of kernel time${isNum(sk.mean_gap_us) ? ` · mean gap ${fmtUs(sk.mean_gap_us)}` : ""}`,
        "Many short kernels with small launch gaps point at launch overhead: torch.compile or CUDA graphs help."] : null,
    ]),
    chart,
    note("Computed by Kineto with the CUDA occupancy calculator for each launch: theoretical, not measured."));
}

// ------------------------------------------------------------ kernel table

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

function kernelPanel(report, ctx, cpuOnly) {
  const body = h("div", {class: "kernel-body"});
  const p = panel("Kernels", {info: "Per-kernel launch statistics grouped by name and launch configuration. Click a column header to sort."}, body);
  if (cpuOnly) {
    mount(body, note("CPU-only trace: no GPU metrics."));
    return p;
  }
  const fallback = report.occupancy && Array.isArray(report.occupancy.kernels) ? report.occupancy.kernels : [];
  const sel = (ctx && ctx.sel) || {};
  if (!ctx || !ctx.api || !ctx.api.getKernels) {
    kernelTable(body, fallback, report, null);
    return p;
  }
  const loader = renderLoading(body, {title: "Loading kernels…"});
  ctx.api.getKernels({run: sel.run, worker: sel.worker === "all" ? null : sel.worker, span: sel.span === "all" ? null : sel.span},
    {signal: ctx.signal, onProgress: (pr) => loader.set(pr)})
    .then((r) => {
      if (r.kind === "aborted") return;
      if (r.kind === "ok" && r.data && Array.isArray(r.data.kernels)) {
        kernelTable(body, r.data.kernels, report, null);
      } else if (fallback.length) {
        kernelTable(body, fallback, report,
          `The kernels route failed (${r.kind === "error" ? r.message : "unexpected answer"}); showing the report's top kernels.`);
      } else {
        renderError(body, {title: "Could not load kernels", message: r.message || "unexpected answer", file: r.file, status: r.status});
      }
    });
  return p;
}

function kernelTable(body, kernels, report, warning) {
  clear(body);
  if (!kernels.length) {
    body.appendChild(note(naReason(report, "kernels", "occupancy") || "No kernels in this selection."));
    return;
  }
  const multiDev = new Set(kernels.map((k) => k.device)).size > 1;
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
  ].filter(Boolean);
  const state = {sortKey: "total_us", dir: -1, filter: ""};
  const filterBox = h("input", {type: "search", class: "filter", placeholder: "Filter kernels by name…", "aria-label": "Filter kernels by name"});
  const count = h("span", {class: "muted count"});
  const thead = h("thead");
  const tbody = h("tbody");
  const table = h("table", {class: "grid-table kernels"}, thead, tbody);
  const LIMIT = 200;

  const value = (k, c) => (c.sortGet ? c.sortGet(k) : c.get ? c.get(k) : k[c.key]);

  function drawHead() {
    mount(thead, h("tr", {}, cols.map((c) => {
      const active = state.sortKey === c.key;
      return h("th", {class: [c.text ? null : "num", "sortable", active ? "sorted" : null], title: KERNEL_COL_DEFS[c.key] || null,
        "aria-sort": active ? (state.dir > 0 ? "ascending" : "descending") : "none", tabindex: "0",
        onclick: () => sortBy(c), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(c); } }},
      c.label, h("span", {class: "sort-ind"}, active ? (state.dir > 0 ? " ▲" : " ▼") : ""));
    })));
  }

  function sortBy(c) {
    if (state.sortKey === c.key) state.dir = -state.dir;
    else { state.sortKey = c.key; state.dir = c.text ? 1 : -1; }
    drawHead();
    drawBody();
  }

  function drawBody() {
    const f = state.filter.trim().toLowerCase();
    const col = cols.find((c) => c.key === state.sortKey) || cols[0];
    const rows = kernels.filter((k) => !f || String(k.name ?? "").toLowerCase().includes(f)
      || String(k.limiting_factor ?? "").toLowerCase().includes(f));
    rows.sort((a, b) => {
      const va = value(a, col);
      const vb = value(b, col);
      if (typeof va === "string" || typeof vb === "string") return state.dir * String(va ?? "").localeCompare(String(vb ?? ""));
      const na = isNum(va) ? va : -Infinity;
      const nb = isNum(vb) ? vb : -Infinity;
      return state.dir * (na - nb);
    });
    const shown = rows.slice(0, LIMIT);
    mount(tbody, shown.map((k) => h("tr", {}, cols.map((c) => {
      if (c.key === "name") {
        const full = String(k.name ?? "");
        return h("td", {class: "kname", title: full}, shortenKernelName(full));
      }
      if (c.key === "tensor_core") {
        return h("td", {class: ["num", k.tensor_core ? "tc-yes" : "tc-no"]}, c.get(k));
      }
      if (c.key === "limiting_factor") return h("td", {class: "lim"}, String(k.limiting_factor ?? "n/a"));
      if (c.key === "est_achieved_occupancy_pct") return occupancyCell(k);
      const v = c.get ? c.get(k) : k[c.key];
      return h("td", {class: ["num", c.cls]}, c.get ? v : c.fmt(v));
    }))));
    if (!shown.length) tbody.appendChild(h("tr", {}, h("td", {colspan: String(cols.length), class: "empty-row"}, "No kernel matches the filter.")));
    count.textContent = rows.length > LIMIT
      ? `showing ${LIMIT} of ${rows.length} matching (${kernels.length} total); refine the filter`
      : `${rows.length} of ${kernels.length} kernels`;
  }

  filterBox.addEventListener("input", () => { state.filter = filterBox.value; drawBody(); });
  drawHead();
  drawBody();
  mount(body,
    warning ? note(warning, "warn") : null,
    h("div", {class: "table-tools"}, filterBox, count),
    h("div", {class: "table-scroll"}, table));
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

// ------------------------------------------------------------ tensor cores

function tensorCorePanel(report, cpuOnly) {
  const tc = report.tensor_cores || {};
  if (cpuOnly) return panel("Tensor Cores", {info: DEFS.tc}, note("CPU-only trace: no GPU metrics."));
  const per = tc.per_device && typeof tc.per_device === "object" ? Object.entries(tc.per_device) : [];
  const rows = [
    ["Tensor Core kernel time", fmtPct(tc.tensor_core_pct), DEFS.tc],
    per.length > 1 ? ["Per device", per.map(([d, v]) => `GPU ${d}: ${fmtPct(v)}`).join(" · ")] : null,
    ["Eligible but not using", isNum(tc.eligible_not_using_pct)
      ? h("span", {class: `sev-text-${ruleSeverity(report, "tensor_cores_unused")}`},
        `${fmtPct(tc.eligible_not_using_pct)} of kernel time`)
      : (naReason(report, "eligible_not_using_pct") || "n/a"), DEFS.eligible],
  ];
  const split = tc.precision_split_pct && typeof tc.precision_split_pct === "object" ? tc.precision_split_pct : null;
  let splitBar = null;
  if (split) {
    const entries = Object.entries(split).filter(([, v]) => isNum(v) && v > 0);
    const total = entries.reduce((a, [, v]) => a + v, 0) || 1;
    splitBar = h("div", {class: "split"},
      h("div", {class: "split-label muted"}, "Precision of kernel time (from kernel names)"),
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
      h("th", {}, "Eligible op not on Tensor Cores"), h("th", {class: "num"}, "Kernel time"), h("th", {class: "num", title: "Share of all kernel time"}, "Share"),
      h("th", {}, "Input types"), h("th", {title: "Whether the op's sizes are multiples of 8 (Tensor Core friendly)."}, "×8 sizes"))),
    h("tbody", {}, top.map((o) => h("tr", {},
      h("td", {class: "mono"}, String(o.op ?? "")),
      h("td", {class: "num"}, fmtUs(o.kernel_us)),
      h("td", {class: "num"}, fmtPct(o.pct)),
      h("td", {class: "mono"}, Array.isArray(o.input_types) ? o.input_types.join(", ") : ""),
      h("td", {}, o.shapes_multiple_of_8 === true ? "yes" : o.shapes_multiple_of_8 === false ? "no" : "unknown")))))) : null;
  return panel("Tensor Cores", {info: `${DEFS.tc}\n\n${DEFS.eligible}`}, kv(rows), splitBar, topTable);
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
      : `kernels per step: n/a${stepsFound ? "" : " (no profiler steps)"}`;
    rows.push(["Kernel launch", `${fmtUs(launch.launch_us)} CPU${isNum(launch.launch_pct) ? ` (${fmtPct(launch.launch_pct)} of step time)` : ""}`
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
    rows.push([`GPU ${id} idle (HTA)`, `${fmtPct(idle.idle_pct)} of its active span: host wait ${fmtUs(idle.host_wait_us)}`
      + ` · kernel wait ${fmtUs(idle.kernel_wait_us)} · other ${fmtUs(idle.other_us)}`, DEFS.idle]);
    if (isNum(g.est_sm_efficiency_pct)) rows.push([`GPU ${id} est. SM efficiency`, fmtPct(g.est_sm_efficiency_pct), DEFS.sm]);
  }
  const memGrowth = [];
  for (const key of memoryDevices(report.memory || {})) {
    const gr = report.memory[key] && report.memory[key].growth;
    if (gr && gr.possible_leak) memGrowth.push(key);
  }
  if (memGrowth.length) rows.push(["Memory growth", h("span", {class: "sev-text-medium"}, `allocated memory rises across steps on ${memGrowth.join(", ")}: possible leak`)]);
  return panel("Other signals", {}, rows.length ? kv(rows) : note("Nothing else to report."));
}

// ------------------------------------------------------------ not available

function notAvailablePanel(report) {
  const na = report.not_available && typeof report.not_available === "object" ? Object.entries(report.not_available) : [];
  if (!na.length) return null;
  const labels = report.not_available_labels && typeof report.not_available_labels === "object" ? report.not_available_labels : {};
  return panel("Not available", {info: "Metrics that could not be computed from this trace, with the reason. They are never reported as 0."},
    h("ul", {class: "na-list"}, na.map(([k, v]) => h("li", {title: k},
      h("span", {class: "na-what"}, typeof labels[k] === "string" && labels[k] ? labels[k] : readableKey(k)),
      h("span", {class: "muted"}, " — "), String(v)))));
}

