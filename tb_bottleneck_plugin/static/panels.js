// Panels: the ONE way a panel enters the page (mountPanel), and the registry of the
// single-run view's panels (registerPanel): how a new view joins the Bottlenecks tab.
// Every panel, of the report (views.js, memory, kernels, recommendations), of compare mode,
// the Ranks panel and the registered ones, is a mountPanel section (tests/frontend/test_frontend_architecture.py).
//
// ADDING A PANEL (2 lines outside your own module):
//   1. In your module (static/<yours>.js):
//        import {registerPanel} from "./panels.js";
//        registerPanel({id: "timeline", label: "Step timeline", order: 50, section: "timeline",
//          render(container, ctx) { ... }});
//   2. In index.js, one import line in the "registered panels" block:
//        import "./static/<yours>.js";
//
// index.js then renders every registered panel below the report of the selected
// run / worker / span, each in its own <section class="panel bn-registered" id="bn-panel-<id>">
// with a header (label, optional info text) and a body <div>: render(body, ctx) fills the body.
// It is called again (on a fresh body) whenever the selection or the report changes.
//
// ctx (the same object for every panel of one view; never mutate it):
//   ctx.run, ctx.worker, ctx.span   the selection as the routes name it: worker/span null = summary
//                                   (run summary: worker null; worker summary: span null)
//   ctx.isSummary                   true when span is null (several spans combined)
//   ctx.report                      the report object already shown (docs/report-schema.md)
//   ctx.data                        model.js's selectionData: lazy, memoised fetches of this selection:
//                                     ctx.data.kernels(opts), ctx.data.memory(opts), ctx.data.report(opts),
//                                     ctx.data.get(route, extraParams, opts)  -> any other route
//                                     ctx.data.url(route, extraParams)        -> a relative URL (links)
//                                   each returns a promise of {kind: "ok"|"error"|"aborted", ...}
//                                   (model.js header); 202 answers are polled for you (states.js
//                                   load shows their progress).
//   ctx.get(route, params, opts)    model.get: any route with exactly these params (polled, relative URL)
//   ctx.signal                      an AbortSignal that fires when the selection changes: stop work then
//   ctx.select({worker, span})      changes the selection (e.g. a click that opens another span)
//   ctx.states                      {load, renderError} (states.js): load(body, request, opts) is the
//                                   one loading / progress / error path; use it for every route
//
// Rules (docs/DEVELOPMENT.md): a panel fetches only through ctx.data / ctx.get, inserts trace
// strings as text (dom.js h()), decides no verdict (colours come from the report), and throws
// nothing out of render: an exception is caught and shown in the panel's body.

import {h} from "./dom.js";
import {renderError} from "./states.js";

/**
 * Mounts one panel: <section class="panel [cls]" id> with a header (h2 title, the "?" hover text
 * info, a subtitle; title null: no header) and a <div class="panel-body">. spec: {title, id?, cls?, info?, infoLabel?
 * (the "?"'s aria-label; default info), subtitle?, attrs? (more attributes of the section),
 * render?(body, ctx) (fills the body; an exception, thrown or rejected, is shown in the body
 * unless ctx.signal has fired), ctx?}. children go into the body first.
 * container: the section is appended to it; null: returned unattached for the caller to place
 * (e.g. two panels in a row). Returns the section.
 */
export function mountPanel(container, spec, ...children) {
  const {title, id = null, cls = null, info = null, infoLabel = null, subtitle = null, attrs = {}, render = null, ctx = null} = spec;
  const body = h("div", {class: "panel-body"}, ...children);
  const section = h("section", {...attrs, class: ["panel", cls], id},
    title === null ? null : h("header", {class: "panel-head"},
      h("h2", {}, title),
      info ? h("span", {class: "info", title: info, tabindex: "0", "aria-label": infoLabel || info}, "?") : null,
      subtitle ? h("span", {class: "panel-sub"}, subtitle) : null),
    body);
  if (container) container.appendChild(section);
  if (render) {
    const failed = (err) => {
      if (ctx && ctx.signal && ctx.signal.aborted) return;
      console.error(err); // eslint-disable-line no-console
      renderError(body, {title: `Could not display ${title}`, message: String(err && err.stack ? err.stack : err)});
    };
    try {
      const done = render(body, ctx);
      if (done && typeof done.catch === "function") done.catch(failed);
    } catch (err) {
      failed(err);
    }
  }
  return section;
}

/** Mounts a registered panel (section id "bn-panel-<id>", class bn-registered, data-panel). */
export function mountRegistered(container, panel, ctx, render = panel.render) {
  return mountPanel(container, {title: panel.label, id: `bn-panel-${panel.id}`, cls: "bn-registered", info: panel.info,
    attrs: {"data-panel": panel.id}, render, ctx});
}

/**
 * The registered panels, in order, each in its own section under the report. One panel's
 * failure (an exception in when or render) is shown in that panel and stops nothing else.
 */
export function mountRegisteredPanels(container, ctx, sections = null) {
  for (const panel of registeredPanels()) {
    try {
      if (panel.when && !panel.when(ctx)) continue;
    } catch (err) {
      console.error(err); // eslint-disable-line no-console
      continue;
    }
    if (!sections) {
      mountRegistered(container, panel, ctx);
      continue;
    }
    // the section bar (sections.js): the panel goes into its section, built when that opens;
    // a section the run does not have (the server's list) leaves the panel out
    const s = sections.section(panel.section || "overview");
    if (s) s.onOpen((el) => { if (!(ctx.signal && ctx.signal.aborted)) mountRegistered(el, panel, ctx); });
  }
}

const REGISTRY = [];

/**
 * Registers a panel. spec: {id (unique, [a-z0-9_-]+), label, render(container, ctx),
 * order? (number, lower first; default 100), info? (hover text), when?(ctx) -> bool (default: always),
 * section? (its section of the section bar, judge/layout.py SECTIONS: "kernels", "memory", "source",
 * "compile", "timeline", "operators", "ranks"; default "overview")}.
 * Registering an id again replaces the earlier panel (module reloads).
 */
export function registerPanel(spec) {
  if (!spec || typeof spec.id !== "string" || !/^[a-z0-9_-]+$/.test(spec.id)) throw new Error(`registerPanel: bad id ${spec && spec.id}`);
  if (typeof spec.render !== "function") throw new Error(`registerPanel(${spec.id}): render(container, ctx) is required`);
  const entry = {order: 100, label: spec.id, info: null, when: null, ...spec};
  const i = REGISTRY.findIndex((p) => p.id === spec.id);
  if (i >= 0) REGISTRY.splice(i, 1, entry);
  else REGISTRY.push(entry);
}

/** The registered panels in display order (by order, then registration order). */
export function registeredPanels() {
  return REGISTRY.map((p, i) => [p, i]).sort((a, b) => a[0].order - b[0].order || a[1] - b[1]).map(([p]) => p);
}
