// Collective bandwidth against the link (METRICS.md §18): one sortable table per selection
// (report.collectives.groups: kind × size bucket × process group) and for the Ranks view
// (ranks route `collective_bandwidth.groups`, matched across ranks). algbw, busbw, % of the link
// and exposed time are the server's; the link is named with its source, and a span's times carry
// the server's caveat that they include waiting for the slowest peer.

import {h, mount} from "./dom.js";
import {isNum, fmtPct, fmtUs, fmtBytes, fmtCount, fmtNum} from "./format.js";
import {note, naReason, sortableHead, sortRows} from "./common.js";
import {registerPanel} from "./panels.js";

const gb = (v) => (isNum(v) ? `${Number(v.toPrecision(3))} GB/s` : "n/a"); // 3 significant digits

/** "NVLink3 (12 links), 300 GB/s per direction (intra-node) — source" from a `link` object. */
export function linkWords(link) {
  if (!link || typeof link !== "object") return "link: unknown";
  const scope = link.scope === "inter_node" ? "inter-node" : link.scope === "intra_node" ? "intra-node" : null;
  const bits = [`link: ${link.link || "unknown"}`];
  if (isNum(link.gbps)) bits.push(`${fmtNum(link.gbps, 0)} GB/s per direction${isNum(link.bidirectional_gbps) ? ` (${fmtNum(link.bidirectional_gbps, 0)} bidirectional)` : ""}`);
  if (scope) bits.push(`${scope}${link.scope_assumed ? " (assumed)" : ""}`);
  if (link.override) bits.push("BOTTLENECKS_LINK_GBPS override");
  if (link.device) bits.push(String(link.device));
  return bits.join(" · ");
}

/**
 * A sortable table of collective rows. opts: {steps (count, for the per-step columns),
 * time: "time_us" (a span: kernel time, waiting included) or "transfer_us" (ranks: shortest
 * among the ranks), exposed: whether rows carry exposed_us}.
 */
export function collectivesTable(rowsIn, {steps = null, time = "time_us", exposed = true} = {}) {
  const per = (v) => (isNum(v) && isNum(steps) && steps > 0 ? v / steps : null);
  const cols = [
    {key: "kind", label: "Collective", text: true,
      get: (r) => `${r.kind ?? ""}${r.implemented_as ? ` (run as ${r.implemented_as})` : ""}`},
    {key: "process_group", label: "Group", text: true, get: (r) => `${r.process_group ?? "?"}${isNum(r.group_size) ? ` (${r.group_size} ranks)` : ""}`},
    {key: "size_bucket", label: "Size", text: true, get: (r) => String(r.size_bucket ?? "")},
    {key: "calls_per_step", label: "Calls/step", get: (r) => per(r.calls), fmt: (v) => (isNum(v) ? fmtNum(v, 1) : "n/a")},
    {key: "bytes_per_call", label: "Bytes/call", get: (r) => r.bytes_per_call, fmt: fmtBytes},
    {key: "time", label: time === "transfer_us" ? "Transfer" : "Time", get: (r) => r[time], fmt: fmtUs},
    {key: "algbw_gbps", label: "algbw", get: (r) => r.algbw_gbps, fmt: gb},
    {key: "busbw_gbps", label: "busbw", get: (r) => r.busbw_gbps, fmt: gb},
    {key: "link_pct", label: "% of link", get: (r) => r.link_pct, fmt: (v) => fmtPct(v)},
    exposed ? {key: "exposed_per_step", label: "Exposed/step", get: (r) => per(r.exposed_us), fmt: fmtUs} : null,
  ].filter(Boolean);
  const titles = {
    time: time === "transfer_us" ? "Σ transfer time: per call, the shortest duration among the ranks that ran it"
      : "Σ kernel time on this rank: includes waiting for the slowest peer",
    algbw_gbps: "bytes / time (10⁹ B/s)", busbw_gbps: "algbw × the collective's bus factor (nccl-tests)",
    link_pct: "busbw / the link's per-direction peak", exposed_per_step: "Kernel time not covered by compute kernels, per step",
    calls_per_step: "Calls / included steps",
  };
  // the cells' values by column key; the server's kind kept apart for data-kind (the "kind"
  // cell adds "(run as …)")
  const rows = rowsIn.map((r) => ({...r, ...Object.fromEntries(cols.map((c) => [c.key, c.get(r)])), serverKind: r.kind}));
  const state = {sortKey: "time", dir: -1};
  const thead = h("thead");
  const tbody = h("tbody");
  const draw = () => {
    sortRows(rows, cols, state);
    mount(tbody, rows.map((r) => h("tr", {"data-kind": String(r.serverKind ?? "")},
      cols.map((c) => h("td", {class: [c.text ? null : "num", `col-${c.key}`]}, c.fmt ? c.fmt(r[c.key]) : r[c.key])))));
  };
  sortableHead(thead, cols, state, titles, draw);
  draw();
  return h("div", {class: "table-scroll"}, h("table", {class: "grid-table compact coll-bw-table"}, thead, tbody));
}

/** The Ranks view's section (ranks.js): view.collective_bandwidth, or n/a with the server's reason. */
export function rankCollectivesSection(view) {
  const cb = view && view.collective_bandwidth && typeof view.collective_bandwidth === "object" ? view.collective_bandwidth : null;
  const na = (view && view.not_available) || {};
  const why = na["ranks.collective_bandwidth"] || (cb && cb.not_available && cb.not_available.collective_bandwidth) || null;
  const groups = cb && Array.isArray(cb.groups) ? cb.groups : [];
  if (!cb || !cb.available || !groups.length) {
    return h("div", {class: "coll-bw"}, note(`Collective bandwidth: n/a — ${why || "no collective call in the ranks' steps"}`, "na coll-na"));
  }
  const steps = Array.isArray(view.steps) ? view.steps.length : null;
  const transferWhy = na["ranks.collective_bandwidth.transfer"];
  return h("div", {class: "coll-bw"},
    h("p", {class: "note coll-link"}, linkWords(cb.link)),
    collectivesTable(groups, {steps, time: "transfer_us", exposed: false}),
    note(`Time: ${cb.time_source || "shortest duration among the ranks"}. ${fmtCount(cb.matched_calls)} of ${fmtCount(cb.calls)} calls matched`
      + `${cb.match_by ? ` (by ${cb.match_by})` : ""}; kernel durations on one rank include waiting for the slowest peer, `
      + "the shortest among the ranks is the closest to the transfer itself."),
    transferWhy ? note(`n/a: ${transferWhy}`, "na") : null);
}

/** The panel body for one report (a span or a summary). */
export function renderCollectives(container, report) {
  const c = report && report.collectives && typeof report.collectives === "object" ? report.collectives : null;
  if (!c) {
    mount(container, note(`n/a: ${naReason(report, "collectives") || "no collectives section in this report"}`, "na"));
    return container;
  }
  const groups = Array.isArray(c.groups) ? c.groups : [];
  const steps = report.steps && isNum(report.steps.count) ? report.steps.count : (Array.isArray(c.per_step) ? c.per_step.length : null);
  const bytesWhy = naReason(report, "collectives.bytes");
  const linkWhy = naReason(report, "collectives.link_pct");
  mount(container,
    h("p", {class: "note coll-link"}, linkWords(c.link)),
    groups.length ? collectivesTable(groups, {steps, time: "time_us", exposed: true}) : note("No collective call in the steps."),
    c.time_includes_wait ? note(`Includes waiting: ${c.time_source || "kernel duration on this rank, waiting for the slowest peer included"}. `
      + "The Ranks view matches each call across ranks for the transfer time.", "warn coll-wait") : null,
    note(`${fmtCount(c.calls)} calls in ${fmtCount(steps)} steps · communication ${fmtUs(c.comm_us)}, exposed ${fmtUs(c.exposed_us)}`
      + `${Array.isArray(c.bytes_sources) && c.bytes_sources.length ? ` · bytes from ${c.bytes_sources.join(", ")}` : ""}`),
    bytesWhy ? note(`Bytes n/a: ${bytesWhy}`, "na") : null,
    linkWhy ? note(`% of link ${/^n\/a\b/.test(linkWhy) ? linkWhy : `n/a: ${linkWhy}`}`, "na") : null,
    // CPU runs (source "cpu_spans": gloo spans, not kernels): the conventions the server states
    ...(c.source === "cpu_spans" && Array.isArray(c.notes) ? c.notes.map((t) => note(String(t), "coll-note")) : []));
  return container;
}

registerPanel({
  id: "collectives",
  label: "Collectives",
  order: 45,
  section: "ranks", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "Collective bandwidth against the link (METRICS.md §18): per kind, message size and process group, the calls, "
    + "bytes, algbw and busbw (nccl-tests' definitions), % of the link's per-direction peak and the exposed time.",
  render(container, ctx) {
    renderCollectives(container, ctx.report);
  },
});
