// The single-file HTML report (`tb-bottlenecks report PATH --html FILE`, `diff --html`,
// `check --html`; html_report.py): the dashboard's own views (views.js renderReport, the
// cards, recommendations, step breakdown, kernel table, memory; operators.js; compare.js
// compareView; ranks.js renderRanksPanel for a run of several workers) over data embedded
// in the page, opened from disk with no server and no network. html_report.py inlines this
// module and the modules it imports into one <script type="module"> and the data as JSON
// in <script type="application/json" id="bn-data">.
//
// The page's data (html_report.page_data):
//   {kind: "report"|"compare"|"check", title, generated, tool,
//    views: [{id, label, report, kernels, memory, operators: {op, op_shape},
//             ranks?: ranks route body, rank_reports?: {worker: report}}],
//    compare: compare object | null, check: {ok, lines, summary} | null}
// The data functions below answer like model.js's selectionData (kind "ok"/"error"), from
// the embedded data: nothing is fetched.

import {h, mount, clear} from "./dom.js";
import {renderReport} from "./views.js";
import {renderOperators} from "./operators.js";
import {compareView} from "./compare.js";
import {renderCards, setCards} from "./cards.js";
import {renderError} from "./states.js";
import {renderRanksPanel} from "./ranks.js";
import {mountPanel} from "./panels.js";
import {renderMemoryPeak} from "./memory_peak_view.js";

const NOT_HERE = "not part of this offline report (open the run in TensorBoard's Bottlenecks tab)";

function ok(data) {
  return Promise.resolve({kind: "ok", data, status: 200});
}

function missing(what) {
  return Promise.resolve({kind: "error", status: 0, message: `${what}: ${NOT_HERE}`, file: null});
}

/** ctx.data of one embedded view (model.js selectionData's shape, no fetches). */
export function offlineData(view) {
  return {
    params: {},
    report: () => ok(view.report),
    kernels: () => (Array.isArray(view.kernels) ? ok({kernels: view.kernels}) : missing("The kernel table")),
    memory: () => (view.memory && typeof view.memory === "object" ? ok(view.memory) : missing("The memory timeline")),
    ranks: () => (view.ranks && typeof view.ranks === "object" ? ok(view.ranks) : missing("The ranks view")),
    get: (route, extra = {}) => {
      if (route === "operators") {
        const group = (extra && extra.group) || "op";
        const step = (extra && extra.step) || "all";
        const table = view.operators && view.operators[group];
        if (table && step === "all") return ok(table);
        return missing(`The operator view${step !== "all" ? ` of step ${step}` : ""}`);
      }
      return missing(`The ${route} route`);
    },
    url: () => "#",
  };
}

function reportView(container, view) {
  const rep = view.report || {};
  const sel = {run: rep.run ?? null, worker: rep.worker ?? null, span: rep.span ?? null};
  const ctx = {sel, spans: [], signal: new AbortController().signal, data: offlineData(view), report: rep,
    onPickSpan: null, run: sel.run, worker: sel.worker, span: sel.span, isSummary: sel.span === null, flat: true};
  renderReport(container, rep, ctx);
  // the tab's registered "Memory at the peak" panel, from the embedded report
  mountPanel(container, {title: "Memory at the peak", id: "bn-panel-memory_peak", cls: "bn-registered",
    attrs: {"data-panel": "memory_peak"}, ctx, render: (body) => renderMemoryPeak(body, rep)});
  // the tab's registered Operators panel (no "?": the offline page has no other registered panel)
  mountPanel(container, {title: "Operators", id: "bn-panel-operators", cls: "bn-registered", attrs: {"data-panel": "operators"}, ctx,
    render: view.operators ? renderOperators
      : (body) => mount(body, h("p", {class: "note"}, `n/a: ${view.operators_na || "the operator view could not be computed"}`))});
  if (view.ranks && typeof view.ranks === "object") container.insertBefore(ranksSlot(view), container.firstChild);
}

/** A run of several workers: the tab's Ranks panel (ranks.js) above the report, from the
 * embedded rank view; "Cards per rank" from the embedded per-worker reports. */
function ranksSlot(view) {
  const slot = h("div", {class: "ranks-slot", id: "bn-ranks-slot"});
  const reports = view.rank_reports && typeof view.rank_reports === "object" ? view.rank_reports : {};
  const loadReports = (workers) => Promise.resolve(workers.map((w) => (reports[w] && typeof reports[w] === "object"
    ? {kind: "ok", data: reports[w], status: 200}
    : {kind: "error", status: 0, message: `the report of ${w}: ${NOT_HERE}`, file: null})));
  try {
    mount(slot, renderRanksPanel(view.ranks, {loadReports}));
  } catch (err) {
    console.error(err); // eslint-disable-line no-console
    mount(slot, h("div", {class: "banner banner-warn", role: "status"}, "Could not display the Ranks view: ", String(err)));
  }
  return slot;
}

function compareViewOf(container, cmp, views) {
  mount(container, compareView(cmp));
  const slot = container.querySelector("#bn-cmp-cards .panel-body");
  const reports = views.map((v) => v.report).filter((r) => r && typeof r === "object");
  // both sides present (a side whose report is missing leaves the side-by-side cards out)
  if (slot && reports.length === views.length) renderCards(slot, reports, {labels: views.map((v) => v.label)});
}

function gateBanner(check) {
  const lines = Array.isArray(check.lines) ? check.lines : [];
  return h("div", {class: ["banner", check.ok ? "banner-info" : "banner-error"], id: "bn-gate", role: "status",
    "data-gate": check.ok ? "pass" : "fail"},
  h("strong", {}, check.ok ? "Gate passed: " : "Gate FAILED: "), String(check.summary || ""),
  lines.length ? h("ul", {class: "err-list"}, lines.map((l) => h("li", {}, h("code", {}, String(l))))) : null);
}

/** Renders the embedded page data into document.body. */
export function renderPage(data) {
  setCards(data.cards); // the server's card list (html_report.page_data), as the runs answer gives the tab
  clear(document.body);
  document.body.classList.add("bn");
  const views = Array.isArray(data.views) ? data.views : [];
  const choices = [];
  if (data.compare) choices.push({id: "compare", label: "Comparison", draw: (c) => compareViewOf(c, data.compare, views)});
  for (const v of views) choices.push({id: v.id, label: v.label, draw: (c) => reportView(c, v)});
  const main = h("main", {class: "view", id: "bn-view"});
  const picker = h("select", {id: "bn-run", "aria-label": "View", onchange: () => show(picker.value)},
    choices.map((c) => h("option", {value: c.id}, c.label)));
  document.body.appendChild(h("header", {class: "topbar"},
    h("div", {class: "brand", title: "Why is training slow, and what to change"}, "Bottlenecks"),
    choices.length > 1 ? h("label", {class: "sel"}, h("span", {}, "View"), picker) : h("span", {class: "sel"}, choices.length ? choices[0].label : ""),
    h("div", {class: "spacer"}),
    h("span", {class: "scan-info muted", title: String(data.tool || "")},
      `offline report${data.generated ? ` · ${data.generated}` : ""}`)));
  const banners = h("div", {class: "banners"});
  if (data.check) banners.appendChild(gateBanner(data.check));
  for (const e of Array.isArray(data.errors) ? data.errors : []) {
    banners.appendChild(h("div", {class: "banner banner-warn", role: "status"}, String(e)));
  }
  document.body.appendChild(banners);
  document.body.appendChild(main);

  function show(id) {
    const choice = choices.find((c) => c.id === id) || choices[0];
    clear(main);
    if (!choice) {
      renderError(main, {title: "Nothing to show", message: "this report holds no analysed run"});
      return;
    }
    try {
      choice.draw(main);
    } catch (err) {
      console.error(err); // eslint-disable-line no-console
      renderError(main, {title: "Could not display this report", message: String(err && err.stack ? err.stack : err)});
    }
  }
  show(choices.length ? choices[0].id : null);
}

const holder = typeof document !== "undefined" ? document.getElementById("bn-data") : null;
if (holder) renderPage(JSON.parse(holder.textContent));
