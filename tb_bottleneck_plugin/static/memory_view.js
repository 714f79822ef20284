// The "Memory over time" panel: allocated and reserved memory per device of one span,
// from the memory route (fetched by model.js, handed in as ctx.data.memory()).

import {h, clear, mount} from "./dom.js";
import {responsive, lineChart} from "./charts.js";
import {isNum, fmtPct, fmtMs, fmtBytes, spanLabel, BINARY_UNITS} from "./format.js";
import {DEFS} from "./defs.js";
import {note, naReason, memoryDevices, reservedKnown, memDeviceLabel} from "./common.js";
import {load} from "./states.js";
import {mountPanel} from "./panels.js";

/** Allocated / reserved memory over time of one span (ctx.data.memory()); summaries offer the spans. */
export function memoryPanel(report, ctx) {
  const body = h("div", {class: "memory-body"});
  const p = mountPanel(null, {title: "Memory over time", info: `${DEFS.memory}\n\nSlack % = 100 × (reserved − allocated) / reserved at each instant (right axis).`}, body);
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
  load(body, ctx.data.memory, {title: "Loading memory timeline…", errorTitle: "Could not load the memory timeline",
    route: "memory", what: "the memory timeline", valid: () => true, onData: (data) => renderMemoryCharts(body, data || {}, report)});
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
    // the instant of peak allocated whose live set the "Memory at the peak" panel decomposes
    const mp = (report.memory_peak || {})[key];
    const markers = mp && isNum(mp.peak_ts_us) ? [{x: (mp.peak_ts_us - traceStart) / 1000, label: "peak"}] : [];
    const chart = responsive(h("div", {class: "chart-box"}), (w) => lineChart({
      width: w, height: 210, series, markers, xFormat: fmtMs, leftFormat: fmtBytes, rightFormat: (v) => fmtPct(v, 0),
      rightLabel: res ? "slack %" : "",
      leftTickUnit: (max) => (BINARY_UNITS.find(([, f]) => max >= f) || ["B", 1])[1], xLabel: "time since trace start", rightMin: 0, rightMax: 100}));
    const block = h("div", {class: "mem-device"},
      h("div", {class: "mem-head"}, h("strong", {}, memDeviceLabel(report, key)), facts ? h("span", {class: "muted"}, ` ${facts}`) : null),
      legend, chart,
      rm.allocated_is_relative ? note("Allocated is growth since profiling start: this old trace has only signed Bytes per event.") : null,
      resReason ? note(`Reserved: ${resReason}`) : null);
    if (!key.startsWith("cuda:") && keys.some((k) => k.startsWith("cuda:"))) {
      // Host memory matters less here: keep it folded below the GPU curves.
      // its summary carries the peak, so nobody opens it to find "8 B"
      const peak = isNum(rm.peak_allocated_bytes) ? ` · peak ${fmtBytes(rm.peak_allocated_bytes)}` : "";
      body.appendChild(h("details", {class: "mem-more"}, h("summary", {}, `${memDeviceLabel(report, key)} (host) memory${peak}`), block));
    } else {
      body.appendChild(block);
    }
  }
}
