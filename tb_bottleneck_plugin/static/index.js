// Entry point of the Bottlenecks tab: TensorBoard imports this module in its
// plugin iframe and calls render().
//
// HOW URLS RESOLVE HERE (read before adding an import or a fetch):
// - The plugin serves this file at  data/plugin/bottlenecks/index.js
//   and every other frontend file at data/plugin/bottlenecks/static/<file>
//   (on disk they all sit side by side in tb_bottleneck_plugin/static/).
// - ES module imports resolve against the URL of the importing module. So
//   in index.js we write  import ... from "./static/model.js",  while the
//   modules under static/ import each other as "./views.js" (no "static/").
// - fetch() and <link href> resolve against the document's base URL, which
//   TensorBoard's iframe page sets with <base href="plugin/bottlenecks/">;
//   so fetch("./runs") reaches data/plugin/bottlenecks/runs. The stylesheet
//   is resolved from import.meta.url, i.e. from this module's own URL.
// - Only relative URLs: absolute ones break under --path_prefix and
//   /experiment/<id>/, and the iframe's CSP allows only 'self'.
// - No inline <script>: TensorBoard's CSP forbids it. Inline styles are fine.

import {h, mount, clear} from "./static/dom.js";
import * as model from "./static/model.js";
import {renderReport} from "./static/views.js";
import {setCards} from "./static/cards.js";
import {renderLoading, renderError, renderEmpty, load, TRACE_HOWTO} from "./static/states.js";
import {mountRanks} from "./static/ranks.js";
import {fmtTimestamp, fmtPct, spanLabel} from "./static/format.js";
import {renderCompare, compareAvailability, normaliseCompare} from "./static/compare.js";
import {parseRoute, setRoute, onRouteChange, startCompareRoute, pageOrigin} from "./static/router.js";
import {mountRegisteredPanels} from "./static/panels.js";

// ---- registered panels: each module below calls registerPanel() (static/panels.js) when
// imported; index.js renders them under the report. Add a panel with ONE import line here.
// (keep this block; add new lines at its end)
import "./static/operators.js";
import "./static/timeline.js";
import "./static/roofline.js";
import "./static/source_view.js";
import "./static/compilation_view.js";
import "./static/collectives_view.js";
import "./static/memory_peak_view.js";
// ---- end of registered panels

const RUNS_POLL_MS = 10000;
const RUNS_POLL_FAST_MS = 2000; // while the first scan runs

/** How new runs reach this list: the server's rescan period (the /runs answer's
 * scan.rescan_seconds, --bottlenecks_rescan_seconds) and this page's re-read of the list. */
function rescanWords(scan) {
  const every = scan && typeof scan.rescan_seconds === "number" ? `the server rescans the logdir every ${scan.rescan_seconds} s and ` : "";
  return `New runs appear here automatically: ${every}this list is re-read every ${RUNS_POLL_MS / 1000} s.`;
}
const ALL = "all";
const NAME_CHARS = 40; // run/worker names longer than this are shortened in the menus (full name on hover)

const state = {
  runs: null, // last good `runs` payload
  runsError: null,
  sel: {run: null, worker: null, span: null}, // the report view's selection
  open: null, // the sections shown (router.js `open`; null: the server's defaults)
  comparing: false, // compare mode (router.js route "compare") owns the view
  compareSel: null, // compare mode's {base, cand}
  viewKey: null,
  viewAbort: null,
  pollTimer: 0,
  refreshing: false,
};

const ui = {};

// ------------------------------------------------------------ bootstrap

export async function render() {
  ensureStylesheet();
  setupTheme();
  buildShell();
  takeRoute(parseRoute());
  onRouteChange(onRouteChange_);
  connectTensorBoardReload(() => refreshRuns({forceView: true}));
  await refreshRuns({forceView: true});
}

function ensureStylesheet() {
  if (document.querySelector("link[data-bottlenecks-style]")) return;
  const href = new URL("./static/style.css", import.meta.url).href;
  document.head.appendChild(h("link", {rel: "stylesheet", href, "data-bottlenecks-style": ""}));
}

function buildShell() {
  clear(document.body);
  document.body.classList.add("bn");
  ui.run = h("select", {id: "bn-run", "aria-label": "Run", onchange: () => select({run: ui.run.value, worker: null, span: null})});
  ui.worker = h("select", {id: "bn-worker", "aria-label": "Worker", onchange: () => select({worker: ui.worker.value, span: null})});
  ui.span = h("select", {id: "bn-span", "aria-label": "Span", onchange: () => select({span: ui.span.value})});
  ui.scanInfo = h("span", {class: "scan-info muted"});
  ui.share = h("a", {class: "share", target: "_blank", rel: "noopener", href: "#",
    title: "Opens this exact view (run, worker, span) in its own tab; copy that address to share it."}, "Open view in new tab ↗");
  ui.refresh = h("button", {type: "button", class: "btn", title: "Re-read the run list and this report",
    onclick: () => refreshRuns({forceView: true})}, "Refresh");
  ui.compare = h("button", {type: "button", class: "btn", id: "bn-compare-toggle", disabled: true,
    title: "Compare needs two runs: the run list is loading", onclick: toggleCompare}, "Compare");
  ui.banners = h("div", {class: "banners"});
  ui.view = h("main", {class: "view", id: "bn-view"});
  document.body.appendChild(h("header", {class: "topbar"},
    h("div", {class: "brand", title: "Why is training slow, and what to change"}, "Bottlenecks"),
    h("label", {class: "sel"}, h("span", {}, "Run"), ui.run),
    h("label", {class: "sel"}, h("span", {}, "Worker"), ui.worker),
    h("label", {class: "sel"}, h("span", {}, "Span"), ui.span),
    h("div", {class: "spacer"}),
    ui.scanInfo, ui.compare, ui.share, ui.refresh));
  document.body.appendChild(ui.banners);
  document.body.appendChild(ui.view);
  renderLoading(ui.view, {title: "Loading runs…"});
}

// ------------------------------------------------------------ theme

function setupTheme() {
  // One place decides the theme: <html data-theme="light|dark">, which style.css
  // (one dark palette) and the canvas panels (timeline.js observes the attribute)
  // follow. In TensorBoard (same origin) it follows TensorBoard's own dark mode
  // (body.dark-mode); elsewhere, or cross-origin, the OS's prefers-color-scheme.
  const root = document.documentElement;
  let hostBody = null;
  try {
    if (window.parent && window.parent !== window) {
      const doc = window.parent.document;
      if (doc && doc.body && (doc.querySelector("tb-webapp, tf-tensorboard") || doc.body.classList.contains("dark-mode"))) {
        hostBody = doc.body;
      }
    }
  } catch (e) {
    hostBody = null; // cross-origin host: follow prefers-color-scheme
  }
  const os = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  const isDark = () => (hostBody ? hostBody.classList.contains("dark-mode") : Boolean(os && os.matches));
  const apply = () => root.setAttribute("data-theme", isDark() ? "dark" : "light");
  apply();
  try {
    if (hostBody) new MutationObserver(apply).observe(hostBody, {attributes: true, attributeFilter: ["class"]});
    else if (os && os.addEventListener) os.addEventListener("change", apply);
  } catch (e) {
    // ignore: the theme then only follows the host at load time
  }
}

// ------------------------------------------------------------ TensorBoard reload

function connectTensorBoardReload(onReload) {
  // TensorBoard's plugin host protocol: hand the parent a MessagePort with
  // "experimental.bootstrap"; it then sends JSON {type, id, payload, isReply}
  // messages and waits for a reply to each; its reload button broadcasts
  // "experimental.DataReloaded".
  if (!window.parent || window.parent === window || typeof MessageChannel !== "function") return;
  try {
    const channel = new MessageChannel();
    channel.port1.onmessage = (event) => {
      let msg = null;
      try {
        msg = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (!msg || msg.isReply) return;
      channel.port1.postMessage(JSON.stringify({type: msg.type, id: msg.id, payload: null, error: null, isReply: true}));
      if (msg.type === "experimental.DataReloaded") onReload();
    };
    window.parent.postMessage("experimental.bootstrap", pageOrigin(), [channel.port2]);
  } catch (e) {
    // not inside TensorBoard: polling alone keeps the run list fresh
  }
}

// ------------------------------------------------------------ route (router.js)

function takeRoute(route) {
  state.comparing = route.view === "compare";
  if (state.comparing) state.compareSel = route.compare;
  else {
    state.sel = route.sel;
    state.open = route.open || null;
  }
}

function onRouteChange_(route) {
  if (route.view === "compare" || state.comparing) {
    takeRoute(route);
    applySelection({forceView: true});
    return;
  }
  const want = route.sel;
  if (want.run === state.sel.run && want.worker === state.sel.worker && want.span === state.sel.span) return;
  state.sel = want;
  state.open = route.open || null;
  applySelection({forceView: false});
}

/** The top bar's Compare button: into compare mode (this run against another), or back. */
function toggleCompare() {
  if (state.comparing) state.comparing = false;
  else takeRoute(startCompareRoute(state.runs, state.sel.run));
  applySelection({forceView: true});
}

// ------------------------------------------------------------ runs

function schedulePoll() {
  clearTimeout(state.pollTimer);
  const scanning = state.runs && state.runs.scan && /^(scanning|loading|pending)$/.test(String(state.runs.scan.state || ""))
    && !(state.runs.runs || []).length;
  state.pollTimer = setTimeout(() => refreshRuns({forceView: false}), scanning ? RUNS_POLL_FAST_MS : RUNS_POLL_MS);
}

async function refreshRuns({forceView}) {
  if (state.refreshing) return;
  state.refreshing = true;
  try {
    const r = await model.getRuns();
    if (r.kind === "ok" && r.data && typeof r.data === "object") {
      state.runs = r.data;
      state.runsError = null;
      setCards(r.data.cards); // the headline cards to render (routes.py: declared in the metric units)
    } else if (r.kind !== "aborted") {
      state.runsError = r.kind === "error" ? r : {message: "The runs route answered that it is still loading.", status: r.status};
    }
    applySelection({forceView});
  } finally {
    state.refreshing = false;
    schedulePoll();
  }
}

function findRun(name) {
  const runs = (state.runs && Array.isArray(state.runs.runs)) ? state.runs.runs : [];
  return runs.find((r) => r.run === name) || null;
}

function workersOf(run) {
  return run && Array.isArray(run.workers) ? run.workers : [];
}

function spansOf(run, worker) {
  if (!run) return [];
  if (worker === ALL) return [];
  const w = workersOf(run).find((x) => x.worker === worker);
  return w && Array.isArray(w.spans) ? w.spans : [];
}

/** Makes the selection valid for the current run list (keeps what still exists). */
function normalizeSelection() {
  const runs = (state.runs && Array.isArray(state.runs.runs)) ? state.runs.runs : [];
  const sel = {...state.sel};
  let run = findRun(sel.run);
  if (!run) {
    // the server's choice (runs answer default_run: the run written last), else the first ready one
    run = findRun(state.runs && state.runs.default_run) || runs.find((r) => r.state === "ready") || runs[0] || null;
    sel.run = run ? run.run : null;
    sel.worker = null;
    sel.span = null;
  }
  const workers = workersOf(run);
  const wnames = workers.map((w) => w.worker);
  if (!(sel.worker && (wnames.includes(sel.worker) || (sel.worker === ALL && wnames.length > 1)))) {
    sel.worker = wnames[0] || null;
    sel.span = null;
  }
  const spans = spansOf(run, sel.worker);
  const snames = spans.map((x) => x.span);
  if (sel.worker === ALL) sel.span = ALL;
  else if (!(sel.span && (snames.includes(sel.span) || sel.span === ALL))) {
    sel.span = snames.length === 1 ? snames[0] : snames.length ? ALL : null;
  }
  state.sel = sel;
  return run;
}

function option(value, label, selected, title) {
  return h("option", {value, selected: selected || false, title: title || null}, label);
}

/** The select's tooltip is the full text of its selected option (labels may be shortened). */
function titleFromSelected(sel) {
  const o = sel.options[sel.selectedIndex];
  sel.setAttribute("title", o ? (o.getAttribute("title") || o.textContent) : "");
}

function runLabel(r) {
  const name = ellipsize(r.run, NAME_CHARS);
  if (r.state === "loading") {
    const p = typeof r.progress === "number" ? ` ${fmtPct(100 * r.progress, 0)}` : "";
    return `${name} (loading${p})`;
  }
  if (r.state === "error") return `${name} (error)`;
  return name;
}


function renderSelectors(run) {
  const runs = (state.runs && Array.isArray(state.runs.runs)) ? state.runs.runs : [];
  mount(ui.run, runs.length
    ? runs.map((r) => option(r.run, runLabel(r), r.run === state.sel.run, r.error ? `${r.run}\n${r.error}` : r.run))
    : option("", "(no runs)", true));
  ui.run.disabled = !runs.length;
  const workers = workersOf(run);
  const wopts = workers.map((w) => option(w.worker, ellipsize(w.worker, NAME_CHARS), w.worker === state.sel.worker, w.worker));
  if (workers.length > 1) wopts.push(option(ALL, "all (run summary)", state.sel.worker === ALL));
  mount(ui.worker, wopts.length ? wopts : option("", "(none)", true));
  ui.worker.disabled = workers.length <= 1;
  const spans = spansOf(run, state.sel.worker);
  const sopts = [];
  if (spans.length > 1 || state.sel.worker === ALL) {
    sopts.push(option(ALL, state.sel.worker === ALL ? "all (run summary)" : `all ${spans.length} (worker summary)`, state.sel.span === ALL));
  }
  spans.forEach((sp, i) => {
    const st = sp.state === "error" ? " (error)"
      : (sp.state === "loading" || sp.state === "queued") ? ` (${sp.state}${typeof sp.progress === "number" && sp.progress > 0 ? ` ${fmtPct(100 * sp.progress, 0)}` : ""})` : "";
    const when = fmtTimestamp(sp.timestamp);
    // The full span id (a 13- or 19-digit timestamp, or a file name) and the file on hover.
    const full = [`span ${sp.span}`, when, sp.file, sp.error].filter(Boolean).join("\n");
    sopts.push(option(sp.span, `${spanLabel(sp, i)}${st}`, sp.span === state.sel.span, full));
  });
  mount(ui.span, sopts.length ? sopts : option("", "(none)", true));
  ui.span.disabled = sopts.length <= 1;
  for (const sel of [ui.run, ui.worker, ui.span]) titleFromSelected(sel);
}

/** Long names keep their start and end: "very_long_experi…_seed3". */
function ellipsize(name, max) {
  const s = String(name ?? "");
  if (s.length <= max) return s;
  const head = Math.ceil((max - 1) * 0.6);
  return `${s.slice(0, head)}…${s.slice(s.length - (max - 1 - head))}`;
}

function renderScanInfo() {
  const p = state.runs || {};
  const scan = p.scan || {};
  const bits = [];
  if (p.logdir) bits.push(`logdir ${p.logdir}`);
  if (scan.scanned_at) {
    const when = fmtTimestamp(scan.scanned_at);
    if (when) bits.push(`scanned ${when.slice(11)}`);
  }
  ui.scanInfo.textContent = bits.join(" · ");
  ui.scanInfo.setAttribute("title", p.logdir ? String(p.logdir) : "");
  clear(ui.banners);
  if (state.runsError && state.runs) {
    ui.banners.appendChild(h("div", {class: "banner banner-warn", role: "status"},
      "Could not refresh the run list: ", state.runsError.message || "unknown error", " (showing the last list)"));
  }
  const notes = Array.isArray(scan.notes) ? scan.notes.filter((n) => typeof n === "string" && n) : [];
  if (notes.length) {
    ui.banners.appendChild(h("div", {class: "banner banner-info", role: "status"},
      h("strong", {}, "While scanning the logdir: "), notes.length === 1 ? notes[0] : h("ul", {class: "err-list"}, notes.map((n) => h("li", {}, n)))));
  }
  if (scan.state === "error" && scan.error && (p.runs || []).length) {
    ui.banners.appendChild(h("div", {class: "banner banner-error", role: "alert"}, "Logdir scan failed: ", String(scan.error)));
  }
}

function viewKeyFor(run) {
  const s = state.sel;
  const files = [];
  if (run) {
    for (const w of workersOf(run)) {
      if (s.worker !== ALL && w.worker !== s.worker) continue;
      for (const sp of w.spans || []) {
        if (s.span !== ALL && sp.span !== s.span) continue;
        files.push([w.worker, sp.span, sp.file, sp.timestamp]);
      }
    }
  }
  return JSON.stringify([s.run, s.worker, s.span, run ? (run.state === "error" ? `error:${run.error}` : "ok") : "none", files]);
}

function applySelection({forceView}) {
  if (!state.runs) {
    // never got a run list
    renderScanInfo();
    ui.compare.title = state.runsError ? "Compare needs the run list, which could not be loaded" : "Compare needs two runs: the run list is loading";
    if (state.runsError) {
      abortView();
      state.viewKey = null;
      renderError(ui.view, {title: "Could not load the run list", message: state.runsError.message,
        file: state.runsError.file, status: state.runsError.status, onRetry: () => refreshRuns({forceView: true})});
    }
    return;
  }
  // Compare mode (compare.js) owns the view while the route is "compare".
  for (const el of [ui.run, ui.worker, ui.span]) el.parentElement.style.display = state.comparing ? "none" : "";
  ui.compare.textContent = state.comparing ? "Single run" : "Compare";
  // fewer than 2 comparable things: disabled, the title says why (compare mode can always be left)
  const can = state.comparing ? {enabled: true, title: "Back to the single-run view"} : compareAvailability(state.runs);
  ui.compare.disabled = !can.enabled;
  ui.compare.title = can.title;
  if (state.comparing) {
    abortView();
    state.viewKey = null;
    renderScanInfo();
    const runs = Array.isArray(state.runs.runs) ? state.runs.runs : [];
    state.compareSel = normaliseCompare(state.compareSel || {}, runs);
    ui.share.setAttribute("href", setRoute({view: "compare", compare: state.compareSel}));
    renderCompare(ui.view, {runs: state.runs, sel: state.compareSel, onExit: () => ui.compare.click(),
      onSelect: (next) => { state.compareSel = next; applySelection({forceView: false}); }}, {force: forceView});
    return;
  }
  const run = normalizeSelection();
  renderSelectors(run);
  renderScanInfo();
  ui.share.setAttribute("href", setRoute({view: "report", sel: state.sel, open: state.open}));
  const key = viewKeyFor(run);
  if (!forceView && key === state.viewKey) return;
  state.viewKey = key;
  loadView(run);
}

function select(change) {
  state.sel = {...state.sel, ...change};
  state.open = null; // another report: its own default sections
  applySelection({forceView: false});
}

// ------------------------------------------------------------ the view

function abortView() {
  if (state.viewAbort) state.viewAbort.abort();
  state.viewAbort = null;
}

async function loadView(run) {
  abortView();
  const ac = new AbortController();
  state.viewAbort = ac;
  const p = state.runs || {};
  const scan = p.scan || {};
  const runs = Array.isArray(p.runs) ? p.runs : [];

  if (!run) {
    if (scan.state === "error") {
      renderError(ui.view, {title: "Could not scan the logdir", message: String(scan.error || "unknown error"),
        file: p.logdir || null, onRetry: () => refreshRuns({forceView: true})});
    } else if (/^(scanning|loading|pending)$/.test(String(scan.state || "")) && !runs.length) {
      renderLoading(ui.view, {title: "Scanning the logdir for PyTorch profiler traces…", detail: p.logdir ? String(p.logdir) : ""});
    } else {
      renderEmpty(ui.view, {title: "No PyTorch profiler traces found", body: [
        h("p", {}, "Looked for Kineto trace files (", h("code", {}, "*.pt.trace.json"), ", ", h("code", {}, "*.pt.trace.json.gz"),
          ", and any other ", h("code", {}, "*.json"), " / ", h("code", {}, "*.json.gz"), " whose content is a Kineto trace) under ",
          h("code", {}, String(p.logdir || "the logdir")), ". Record some with:"),
        h("pre", {class: "code"}, h("code", {}, TRACE_HOWTO.replace("LOGDIR", String(p.logdir || "logdir")))),
        h("p", {class: "note"}, rescanWords(scan)),
      ]});
    }
    return;
  }

  if (run.state === "error") {
    // Each span's own error: the selected span's when one is selected, else every span's
    // (run.error names only the first file, which is wrong for the others).
    const spans = [];
    for (const w of workersOf(run)) for (const sp of w.spans || []) spans.push({...sp, worker: w.worker});
    const picked = spans.filter((sp) => sp.worker === state.sel.worker && sp.span === state.sel.span);
    const shown = picked.length ? picked : spans;
    const errors = shown.filter((sp) => sp.error).map((sp) => ({file: sp.file || null, error: String(sp.error)}));
    renderError(ui.view, {title: `Run "${run.run}" could not be analysed`,
      message: errors.length === 1 ? errors[0].error : String(run.error || "unknown error"),
      file: shown.length === 1 ? shown[0].file || null : null,
      errors,
      onRetry: () => refreshRuns({forceView: true})});
    return;
  }

  const sel = {...state.sel};
  const data = model.selectionData(sel, {signal: ac.signal});
  const spanFile = spansOf(run, sel.worker).find((x) => x.span === sel.span);
  let report = null;
  let sections = null;
  const onToggle = (open, {rerender = false} = {}) => { // null: the defaults again
    state.open = open;
    ui.share.setAttribute("href", setRoute({view: "report", sel: state.sel, open}));
    if (rerender) applySelection({forceView: true}); // "All": the cards' layout changes too
  };
  await load(ui.view, data.report, {
    title: run.state === "loading" ? `Analysing "${run.run}"…` : "Loading report…",
    progress: run.state === "loading" ? run.progress : null,
    detail: "Large traces take a while the first time; the result is cached.",
    route: "report", what: "this report", isCurrent: () => !ac.signal.aborted,
    errorTitle: (r) => (r.status === 404 ? "Not found" : "Could not analyse this trace"),
    errorFile: () => (spanFile ? spanFile.file : null),
    onRetry: () => { state.viewKey = null; applySelection({forceView: true}); },
    onData: (rep) => {
      sections = renderReport(ui.view, rep, {sel, spans: spansOf(run, sel.worker), signal: ac.signal, data,
        onPickSpan: (span) => select({span}), open: state.open, onToggle});
      report = rep;
    },
  });
  if (!report || ac.signal.aborted) return;
  renderRegisteredPanels(ui.view, report, data, sel, ac.signal, sections);
  // Distributed runs: the Ranks panel (ranks.js) on top of the Collectives/Ranks section, from the
  // ranks route (model.js); above the report when the server sent no such section.
  const ranksSection = sections && sections.section("ranks");
  if (workersOf(run).length > 1) {
    const mountIt = (el) => mountRanks(el, {request: data.ranks, worker: sel.worker, signal: ac.signal,
      loadReports: (workers) => Promise.all(workers.map((worker) => model.getReport({run: sel.run, worker, span: null}, {signal: ac.signal}))),
      onPick: (worker) => select({worker, span: null})});
    if (ranksSection) ranksSection.onOpen((el) => { if (!ac.signal.aborted) mountIt(el); });
    else mountIt(ui.view);
  }
}

/** The panels registered through panels.js, under the report, with the ctx of panels.js's header. */
function renderRegisteredPanels(container, report, data, sel, signal, sections = null) {
  const p = data.params;
  mountRegisteredPanels(container, Object.freeze({
    run: p.run, worker: p.worker, span: p.span, isSummary: p.span === null, report, data, signal,
    get: (route, params, opts = {}) => model.get(route, params, {signal, ...opts}),
    select: (change) => select(change),
    states: {load, renderError},
  }), sections);
}
