// The router of the Bottlenecks tab: the URL hash <-> the view to show. The ONLY module that
// reads or writes window.location and history (tests/frontend/test_frontend_static.py checks it);
// index.js owns the state and asks this module what the URL says and to write it back.
//
// Routes (the hash, so that a copied address opens the same view):
//   report   #run=RUN[&worker=W][&span=S][&open=overview,kernels]  one run / worker / span;
//                                               `open`: the sections shown (sections.js; left out:
//                                               the server's defaults)
//   compare  #compare=1&base=RUN&cand=RUN[&base_worker=&base_span=&cand_worker=&cand_span=]
// An empty selection part is left out of the hash; "all" (a summary) is left out of compare's.

const ALL = "all";
const SIDES = ["base", "cand"];

function params(hash) {
  return new URLSearchParams(String(hash || "").replace(/^#/, ""));
}

/** The hash of the current address. */
export function currentHash() {
  return window.location.hash;
}

/** {view: "compare", compare: {base, cand}} or {view: "report", sel: {run, worker, span}} (null for a missing part). */
export function parseRoute(hash = currentHash()) {
  const p = params(hash);
  if (p.get("compare") === "1") {
    const side = (k) => ({run: p.get(k), worker: p.get(`${k}_worker`), span: p.get(`${k}_span`)});
    return {view: "compare", compare: {base: side("base"), cand: side("cand")}};
  }
  const open = p.get("open");
  return {view: "report", sel: {run: p.get("run"), worker: p.get("worker"), span: p.get("span")},
    open: open === null ? null : open.split(",").filter(Boolean)};
}

/** The hash of a route (parseRoute's shape). */
export function routeHash(route) {
  const p = new URLSearchParams();
  if (route.view === "compare") {
    p.set("compare", "1");
    for (const k of SIDES) {
      const x = (route.compare && route.compare[k]) || {};
      if (x.run) p.set(k, x.run);
      if (x.worker && x.worker !== ALL) p.set(`${k}_worker`, x.worker);
      if (x.span && x.span !== ALL) p.set(`${k}_span`, x.span);
    }
  } else {
    const sel = route.sel || {};
    for (const k of ["run", "worker", "span"]) if (sel[k]) p.set(k, sel[k]);
    if (Array.isArray(route.open)) p.set("open", route.open.join(","));
  }
  return `#${p.toString()}`;
}

/** This document's own absolute URL (the plugin's entry page) with the route's hash (or a hash string). */
export function viewUrl(route, href = window.location.href) {
  const u = new URL(href);
  u.hash = typeof route === "string" ? route : routeHash(route);
  return u.href;
}

/**
 * Writes the route into the address without a history entry and returns the absolute URL
 * (for the "open view in new tab" link). Absolute: a bare "#..." would resolve against
 * <base href="plugin/bottlenecks/"> (data/plugin/bottlenecks/#..., a 404).
 */
export function setRoute(route) {
  const hash = typeof route === "string" ? route : routeHash(route);
  const url = viewUrl(hash);
  if (window.location.hash !== hash) {
    try {
      history.replaceState(null, "", url);
    } catch (e) {
      window.location.hash = hash;
    }
  }
  return url;
}

/** Calls onChange(parseRoute()) when the user edits the hash (back/forward, a pasted link). */
export function onRouteChange(onChange) {
  window.addEventListener("hashchange", () => onChange(parseRoute()));
}

/** The route that opens compare mode from a single-run view: that run against another one. */
export function startCompareRoute(runsPayload, currentRun) {
  const runs = runsPayload && Array.isArray(runsPayload.runs) ? runsPayload.runs : [];
  const names = runs.map((r) => r.run).filter((r) => typeof r === "string");
  const base = names.includes(currentRun) ? currentRun : names[0] || null;
  const cand = names.find((n) => n !== base) || base;
  return {view: "compare", compare: {base: {run: base}, cand: {run: cand}}};
}

/** The page's origin (for TensorBoard's plugin host handshake), "*" when it has none. */
export function pageOrigin() {
  return window.location.origin || "*";
}
