// The panel registry of the single-run view: how a new view joins the Bottlenecks tab.
//
// ADDING A PANEL (2 lines outside your own module):
//   1. In your module (static/<yours>.js):
//        import {registerPanel} from "./panels.js";
//        registerPanel({id: "timeline", label: "Step timeline", order: 50,
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
//                                   (model.js header); 202 answers are polled for you
//                                   (opts.onProgress(progress, message) reports them).
//   ctx.get(route, params, opts)    model.get: any route with exactly these params (polled, relative URL)
//   ctx.signal                      an AbortSignal that fires when the selection changes: stop work then
//   ctx.select({worker, span})      changes the selection (e.g. a click that opens another span)
//   ctx.states                      {renderLoading, renderError} (states.js) for a uniform look
//
// Rules (docs/DEVELOPMENT.md): a panel fetches only through ctx.data / ctx.get, inserts trace
// strings as text (dom.js h()), decides no verdict (colours come from the report), and throws
// nothing out of render: an exception is caught and shown in the panel's body.

const REGISTRY = [];

/**
 * Registers a panel. spec: {id (unique, [a-z0-9_-]+), label, render(container, ctx),
 * order? (number, lower first; default 100), info? (hover text), when?(ctx) -> bool (default: always)}.
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
