// The operator view (METRICS.md "Operator view"): CPU operators and record_function regions
// of the selection per step or over all included steps: calls, self/total CPU time, the GPU
// time they launched and its Tensor Core share, grouped by op name or by op name + recorded
// inputs. Sortable and filterable like the kernel table. Names, shapes and dtypes come from
// the trace: inserted as text only (dom.js h()), never as HTML.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtCount, fmtNum} from "./format.js";
import {note, sortableHead, sortRows, matchCount} from "./common.js";
import {registerPanel} from "./panels.js";
import {isAmd} from "./cards.js";
import {load as loadRoute} from "./states.js";

const LIMIT = 300; // rows drawn at once; the filter narrows the rest

const COL_DEFS = {
  name: "CPU operator (aten:: op) or record_function region; ProfilerStep#N itself is not listed.",
  dims: "Input shapes as recorded with record_shapes=True (the trace's 'Input Dims').",
  types: "Input dtypes as recorded with record_shapes=True (the trace's 'Input type').",
  calls: "Calls that started inside the chosen step(s) (ProfilerStep#N host span).",
  self_us: "CPU time of the op itself: its duration minus its child ops and the CUDA runtime calls it made directly.",
  total_us: "CPU time from the op's start to its end, children included.",
  gpu_us: "GPU time (kernels, memcpy, memset) launched by the op and everything it called, linked through the correlation id.",
  gpu_self_us: "GPU time launched by the op's own runtime calls (not its child ops).",
  tc_pct: "Share of the op's GPU time spent in Tensor Core kernels (tensor_cores.py's list). n/a when the op launched no GPU work.",
  top_inputs: "The op's most expensive recorded input shapes (by total CPU time), with their call counts.",
  flops: "FLOPs of the op's own calls from their recorded shapes (GEMM 2·M·N·K, convolution, attention; METRICS.md "
    + "'Operator view: FLOPs'): each FLOP once, on the innermost op with a formula, so the column sums to the report's FLOPs.",
  tflops: "Achieved TFLOP/s: the op's FLOPs / the time of the GPU kernels it launched.",
  pct_of_peak: "% of the GPU's dense peak for the precision each call ran in (bf16/fp16, tf32, fp32, fp8): "
    + "the time the FLOPs would take at peak / the kernel time.",
  bound: "Roofline: compute-bound when its arithmetic intensity (FLOPs per byte of inputs and outputs) is at or "
    + "above the GPU's ridge point (peak FLOP/s / HBM bandwidth), memory-bound below it.",
};

// Inputs that are not there, said explicitly: the whole trace was profiled without
// record_shapes=True ("—"), or these calls carry no recorded input (record_function
// regions, ops without tensor arguments) while others do ("no inputs").
const NO_SHAPES_TEXT = "—";
const NO_SHAPES_TITLE = "record_shapes=True was not set: profile with torch.profiler.profile(record_shapes=True) "
  + "to see input shapes and dtypes";
const NO_INPUTS_TEXT = "no inputs";
const NO_INPUTS_TITLE = "No input shapes recorded for these calls (record_function regions and ops without "
  + "tensor arguments have none), although the trace was profiled with record_shapes=True";

function hasInputs(entry) {
  return Boolean(entry) && !(entry.dims === null && entry.types === null);
}

function inputText(entry) {
  if (!hasInputs(entry)) return NO_INPUTS_TEXT;
  return `${entry.dims ?? "?"} ${entry.types ?? ""}`.trim();
}

// FLOPs as the server counted them, with an SI prefix (4.40 T); the exact count on hover
function fmtFlops(v) {
  if (!isNum(v)) return "n/a";
  const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [f, u] of units) if (Math.abs(v) >= f) return `${(v / f).toPrecision(3)} ${u}`;
  return fmtNum(v, 0);
}

function columns(group, recordShapes, hasGpu, amd = false, hasFlops = false) {
  const byShape = group === "op_shape";
  const flop = hasGpu && hasFlops;
  return [
    {key: "name", label: "Operator", text: true},
    {key: "calls", label: "Calls", fmt: fmtCount},
    {key: "self_us", label: "Self CPU", fmt: fmtUs},
    {key: "total_us", label: "Total CPU", fmt: fmtUs},
    hasGpu ? {key: "gpu_self_us", label: "Self GPU", fmt: fmtUs} : null,
    hasGpu ? {key: "gpu_us", label: "Total GPU", fmt: fmtUs} : null,
    // AMD's matrix cores (MFMA) are NVIDIA's Tensor Cores: "MC %" on ROCm traces
    hasGpu ? {key: "tc_pct", label: amd ? "MC %" : "TC %", fmt: (v) => fmtPct(v)} : null,
    hasFlops ? {key: "flops", label: "FLOPs", fmt: fmtFlops, na: "flops_na"} : null,
    flop ? {key: "tflops", label: "TFLOP/s", fmt: (v) => fmtNum(Number(v.toPrecision(3)), 4), na: "peak_na"} : null,
    flop ? {key: "pct_of_peak", label: "% peak", fmt: (v) => fmtPct(v, 1), na: "peak_na"} : null,
    flop ? {key: "bound", label: "Bound", text: true, na: "peak_na"} : null,
    // the (long) recorded inputs last, so the numbers stay in view
    byShape ? {key: "dims", label: "Input shapes", text: true, cls: "mono"} : null,
    byShape ? {key: "types", label: "Input types", text: true, cls: "mono"} : null,
    !byShape && recordShapes ? {key: "top_inputs", label: "Top input shapes", text: true,
      sortGet: (r) => (r.top_inputs && r.top_inputs[0] ? String(r.top_inputs[0].dims ?? "") : "")} : null,
  ].filter(Boolean);
}

/** Renders the operator view of ctx's selection into container (the panel body). */
export function renderOperators(container, ctx) {
  const state = {step: "all", group: "op", sortKey: "self_us", dir: -1, filter: "", steps: null};
  const controls = h("div", {class: "table-tools op-tools"});
  const body = h("div", {class: "op-body"});
  mount(container, controls, body);
  let seq = 0;

  function load() {
    const mine = ++seq;
    if (state.count) state.count.textContent = ""; // not the last table's count while this one loads
    loadRoute(body, (opts) => ctx.data.get("operators", {step: state.step, group: state.group}, opts), {
      title: "Loading operators…", errorTitle: "Could not load the operator view", route: "operators", what: "the operator view",
      isCurrent: () => mine === seq, valid: (d) => Boolean(d && Array.isArray(d.rows)),
      onData: (data) => {
        if (state.steps === null) state.steps = Array.isArray(data.steps) ? data.steps : [];
        drawControls();
        drawTable(data);
      },
    });
  }

  function drawControls() {
    const stepSel = h("select", {class: "op-step", "aria-label": "Step",
      onchange: (e) => { state.step = e.target.value; load(); }},
    h("option", {value: "all"}, "All steps"),
    (state.steps || []).map((n) => h("option", {value: String(n)}, `Step ${n}`)));
    stepSel.value = state.step;
    const groupSel = h("select", {class: "op-group", "aria-label": "Group by",
      onchange: (e) => { state.group = e.target.value; load(); }},
    h("option", {value: "op"}, "Group by operator"),
    h("option", {value: "op_shape"}, "Group by operator + input shape"));
    groupSel.value = state.group;
    const filterBox = h("input", {type: "search", class: "filter op-filter", placeholder: "Filter operators by name or shape…",
      "aria-label": "Filter operators by name or shape", value: state.filter});
    filterBox.value = state.filter;
    const count = h("span", {class: "muted count op-count"});
    mount(controls, stepSel, groupSel, filterBox, count);
    filterBox.addEventListener("input", () => { state.filter = filterBox.value; if (state.redraw) state.redraw(); });
    state.count = count;
  }

  function drawTable(data) {
    const rows = data.rows;
    const gpuNa = data.not_available && data.not_available.gpu;
    const flopsNa = data.not_available && data.not_available.flops;
    const peakNa = data.not_available && data.not_available.pct_of_peak;
    const cols = columns(data.group, data.record_shapes, !gpuNa, isAmd(ctx && ctx.report), !flopsNa);
    const thead = h("thead");
    const tbody = h("tbody");
    const table = h("table", {class: "grid-table operators"}, thead, tbody);
    if (!cols.some((c) => c.key === state.sortKey)) { state.sortKey = "self_us"; state.dir = -1; }

    const drawHead = () => sortableHead(thead, cols, state, COL_DEFS, drawBody);

    function cell(r, c) {
      if (c.key === "name") return h("td", {class: "opname", title: String(r.name ?? "")}, String(r.name ?? ""));
      if (c.key === "dims" || c.key === "types") {
        const v = r[c.key];
        if (v !== null && v !== undefined) return h("td", {class: ["mono", "op-input"], title: v}, v);
        // nothing recorded: the whole trace (record_shapes off) or these calls (no inputs)
        return data.record_shapes
          ? h("td", {class: ["op-input", "muted", "op-no-inputs"], title: NO_INPUTS_TITLE}, NO_INPUTS_TEXT)
          : h("td", {class: ["op-input", "muted", "op-no-shapes"], title: NO_SHAPES_TITLE}, NO_SHAPES_TEXT);
      }
      if (c.key === "top_inputs") {
        const list = Array.isArray(r.top_inputs) ? r.top_inputs : [];
        // the call count first: a long shape list is cut at the cell's end (full text on hover)
        return h("td", {class: ["mono", "op-inputs"]}, list.map((e) => hasInputs(e)
          ? h("div", {title: `${inputText(e)}\n${e.calls} calls, ${fmtUs(e.total_us)} CPU`},
            h("span", {class: "op-calls muted"}, `×${e.calls} `), inputText(e))
          : h("div", {class: "op-no-inputs muted", title: `${NO_INPUTS_TITLE}\n${e.calls} calls, ${fmtUs(e.total_us)} CPU`},
            h("span", {class: "op-calls"}, `×${e.calls} `), NO_INPUTS_TEXT)));
      }
      if (c.key === "tc_pct" && !isNum(r.tc_pct)) {
        return h("td", {class: "num muted", title: "n/a: the op launched no GPU work"}, "n/a");
      }
      if (c.na) { // a FLOP column: the server's value, or n/a with the server's reason
        const v = r[c.key];
        if (v === null || v === undefined) {
          const why = r.flops_na || r[c.na];
          return h("td", {class: "num muted", title: why ? `n/a: ${why}` : "n/a"}, why ? "n/a" : "");
        }
        const title = c.key === "flops" ? `${fmtCount(v)} FLOPs${isNum(r.flop_bytes) ? `, ${fmtCount(r.flop_bytes)} bytes` : ""}` : null;
        return h("td", {class: ["num", c.key === "bound" ? `bound-${v}` : null], title}, c.text ? String(v) : c.fmt(v));
      }
      return h("td", {class: ["num", c.cls]}, c.fmt(r[c.key]));
    }

    function drawBody() {
      const f = state.filter.trim().toLowerCase();
      const hay = (r) => [r.name, r.dims, r.types, ...(r.top_inputs || []).map((e) => e.dims)]
        .map((x) => String(x ?? "").toLowerCase()).join("\n");
      const shown = sortRows(rows.filter((r) => !f || hay(r).includes(f)), cols, state);
      const page = shown.slice(0, LIMIT);
      mount(tbody, page.map((r) => h("tr", {}, cols.map((c) => cell(r, c)))));
      if (!page.length) {
        tbody.appendChild(h("tr", {}, h("td", {colspan: String(cols.length), class: "empty-row"},
          rows.length ? "No operator matches the filter." : "No CPU operators in this selection.")));
      }
      const unit = data.group === "op_shape" ? "operator/shape rows" : "operators";
      if (state.count) {
        state.count.textContent = matchCount(shown.length, rows.length, LIMIT, unit);
      }
    }

    state.redraw = drawBody;
    drawHead();
    drawBody();
    const notes = [];
    if (gpuNa) notes.push(note(`GPU columns n/a: ${gpuNa}.`));
    if (flopsNa) notes.push(note(`FLOP columns n/a: ${flopsNa}.`));
    else if (peakNa) notes.push(note(`% of peak and bound n/a: ${peakNa}.`));
    else if (data.peak_gpu) notes.push(note(`% of peak: the dense peak of ${data.peak_gpu} for each call's precision.`));
    if (!data.record_shapes) {
      notes.push(note("Input shapes were not recorded: profile with torch.profiler.profile(record_shapes=True) to see them."));
    }
    if (data.rows_left_out) notes.push(note(`${data.rows_left_out} smaller rows are not listed.`, "warn"));
    if (data.inputs_merged) notes.push(note("Rare input shapes of a very long table are merged into 'other'.", "warn"));
    if (ctx.isSummary) notes.push(note("Several spans combined: all their included steps together."));
    mount(body, notes, h("div", {class: "table-scroll"}, table));
  }

  load();
}

registerPanel({
  id: "operators",
  label: "Operators",
  order: 60,
  section: "operators", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "CPU operators per step: calls, self and total CPU time, GPU time they launched (through the correlation id, children included) and its Tensor Core share; FLOPs, achieved TFLOP/s, % of the GPU's peak and roofline bound from the recorded shapes. Click a column header to sort.",
  render: renderOperators,
});
