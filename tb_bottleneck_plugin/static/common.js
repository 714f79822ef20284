// Small helpers shared by the view modules: reading a report (devices, not-available
// reasons) and the building blocks of a panel's body (a panel itself: panels.js mountPanel).
// No fetching, no thresholds.

import {h, mount} from "./dom.js";
import {isNum} from "./format.js";

// "none": a value the server did not judge (its verdict says "not judged"): no colour class.
// "info": a rule that fired but whose fix the step model prices too small to pay (METRICS §19).
const SEVERITIES = new Set(["high", "medium", "low", "info", "ok", "none", "na"]);

/** The style.css class suffix of a severity word from the server (verdicts, recommendations):
 * the word itself when known, else "none". A mapping of words, never a decision. */
export function severityClass(sev) {
  const s = String(sev || "").toLowerCase();
  return SEVERITIES.has(s) ? s : "none";
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

export function gpuEntries(report) {
  const g = report && report.gpu && typeof report.gpu === "object" ? report.gpu : {};
  return Object.entries(g).sort((a, b) => Number(a[0]) - Number(b[0]) || a[0].localeCompare(b[0]));
}

/** True when the report has no GPU metrics at all. */
export function isCpuOnly(report) {
  return gpuEntries(report).length === 0;
}

export function cpuOnlyReason(report) {
  const na = report.not_available || {};
  const hit = Object.values(na).find((r) => /cpu[- ]only/i.test(String(r)));
  return hit || naReason(report, "gpu") || null;
}

export function deviceName(report, id) {
  const names = report.device_names || {};
  return names[id] || names[String(id)] || null;
}

export function memoryDevices(obj) {
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
export function reservedKnown(key, value) {
  return isNum(value) && (String(key).startsWith("cuda:") || value > 0);
}

export function memDeviceLabel(report, key) {
  return deviceLabel(report, key, true);
}

/**
 * The one name of a device, from the server's `device_labels` (analysis/devices.py): the
 * trace's device id ("GPU 2"), the same for the GPU section's key "2" and the memory key
 * "cuda:0" of that device; `named` adds the model ("GPU 2: NVIDIA A100", "GPU 2: unknown GPU").
 */
export function deviceLabel(report, key, named = false) {
  const entry = ((report && report.device_labels) || {})[String(key)];
  let text;
  let name = null;
  if (entry && typeof entry === "object" && entry.label) {
    text = String(entry.label);
    name = entry.name || null;
  } else {  // an older cached report: the key itself
    const m = /^cuda:(\d+)$/.exec(String(key));
    const id = m ? m[1] : String(key);
    text = key === "cpu" ? "CPU" : (m || /^-?\d+$/.test(id) ? `GPU ${id}` : String(key));
    if (text.startsWith("GPU ")) name = deviceName(report, id) || "unknown GPU";
  }
  return named && name ? `${text}: ${name}` : text;
}

export function kv(rows) {
  return h("table", {class: "kv"},
    h("tbody", {}, rows.filter(Boolean).map(([k, v, title]) =>
      h("tr", {title: title || null}, h("th", {scope: "row"}, k), h("td", {}, v)))));
}

export function note(text, cls = "") {
  return h("p", {class: ["note", cls]}, text);
}


/** The severity class the server gave a card id (report.verdicts[id].severity), "none" without one. */
export function verdictSeverity(report, id) {
  const v = report && report.verdicts && typeof report.verdicts === "object" ? report.verdicts[id] : null;
  return severityClass(v && v.severity);
}

// A sortable, filterable table (the kernel table, the operator view): columns are
// {key, label, text, sortGet, get}; state holds {sortKey, dir} (1 ascending, -1 descending).

/** Draws a sortable table's header row into thead: a click (or Enter/Space) on a column
 * sorts by it (text columns first ascending, numbers descending; again: reversed), redraws
 * the header and calls onSort (which redraws the body). titles: column key -> header title. */
export function sortableHead(thead, cols, state, titles, onSort) {
  const sortBy = (c) => {
    if (state.sortKey === c.key) state.dir = -state.dir;
    else { state.sortKey = c.key; state.dir = c.text ? 1 : -1; }
    sortableHead(thead, cols, state, titles, onSort);
    onSort();
  };
  mount(thead, h("tr", {}, cols.map((c) => {
    const active = state.sortKey === c.key;
    return h("th", {class: [c.text ? null : "num", "sortable", active ? "sorted" : null], title: titles[c.key] || null,
      "data-key": c.key, "aria-sort": active ? (state.dir > 0 ? "ascending" : "descending") : "none", tabindex: "0",
      onclick: () => sortBy(c), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(c); } }},
    c.label, h("span", {class: "sort-ind"}, active ? (state.dir > 0 ? " ▲" : " ▼") : ""));
  })));
}

/** Sorts rows in place by state's column (cols[0] when it is gone): its sortGet, get or
 * field; strings compared as text, numbers as numbers with a missing number lowest. */
export function sortRows(rows, cols, state) {
  const col = cols.find((c) => c.key === state.sortKey) || cols[0];
  const value = (r) => (col.sortGet ? col.sortGet(r) : col.get ? col.get(r) : r[col.key]);
  return rows.sort((a, b) => {
    const va = value(a);
    const vb = value(b);
    if (typeof va === "string" || typeof vb === "string") return state.dir * String(va ?? "").localeCompare(String(vb ?? ""));
    const na = isNum(va) ? va : -Infinity;
    const nb = isNum(vb) ? vb : -Infinity;
    return state.dir * (na - nb);
  });
}

/** The line beside a filtered table: how many rows match and how many are drawn (limit). */
export function matchCount(matching, total, limit, unit) {
  return matching > limit
    ? `showing ${limit} of ${matching} matching (${total} total); refine the filter`
    : `${matching} of ${total} ${unit}`;
}
