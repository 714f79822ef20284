// The data module of the Bottlenecks tab (like TensorBoard's model.js): the ONLY place
// that talks to the plugin's routes. View builders (views.js, cards.js, compare.js,
// ranks.js, and the panels registered through panels.js) never fetch: they get the
// results of these functions (or a promise of them) from index.js / the panel ctx.
//
// URLs are relative ("./runs"): fetch() resolves them against the document's
// base URL, which TensorBoard's iframe page sets with <base href="plugin/bottlenecks/">,
// so they reach data/plugin/bottlenecks/<route> under any --path_prefix.
//
// Every call resolves (never rejects) to one of:
//   {kind: "ok", data, status}
//   {kind: "loading", progress (0..1 or null), message, status}   HTTP 202 or {state: "loading"}
//                                                                  (only from getJson: the route
//                                                                  helpers below poll until it ends)
//   {kind: "error", status, message, file, errors}                 non-2xx, bad JSON, network error
//                                                                  (errors: [{file, error}] when the body lists several)
//   {kind: "aborted"}                                              the AbortSignal fired
//
// opts everywhere: {signal, onProgress(progress 0..1|null, message), intervalMs}.

/** The relative URL of a route with its query (null/""/undefined parameters are left out). */
export function routeUrl(route, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") qs.set(k, String(v));
  }
  const q = qs.toString();
  return `./${route}${q ? `?${q}` : ""}`;
}

function isAbort(err) {
  return err && (err.name === "AbortError" || err.code === DOMException.ABORT_ERR);
}

/** One GET of a JSON route. */
export async function getJson(route, params, {signal} = {}) {
  const url = routeUrl(route, params);
  let res;
  try {
    res = await fetch(url, {signal, headers: {Accept: "application/json"}, cache: "no-store"});
  } catch (err) {
    if (isAbort(err)) return {kind: "aborted"};
    return {kind: "error", status: 0, message: `Network error while requesting ${route}: ${err && err.message ? err.message : err}`, file: null};
  }
  let text;
  try {
    text = await res.text();
  } catch (err) {
    if (isAbort(err)) return {kind: "aborted"};
    return {kind: "error", status: res.status, message: `Could not read the ${route} response: ${err && err.message ? err.message : err}`, file: null};
  }
  let body = null;
  let parseError = null;
  if (text.length) {
    try {
      body = JSON.parse(text);
    } catch (err) {
      parseError = err;
    }
  }
  if (!res.ok) {
    const message = body && typeof body === "object" && body.error
      ? String(body.error)
      : `HTTP ${res.status} ${res.statusText || ""} from ${route}${text && !body ? `: ${text.slice(0, 300)}` : ""}`.trim();
    // {error, file} or {state: "error", error, errors: [{file, error}]} (one entry per broken file)
    const errors = body && typeof body === "object" && Array.isArray(body.errors)
      ? body.errors.filter((e) => e && typeof e === "object").map((e) => ({file: e.file ? String(e.file) : null, error: String(e.error ?? "")}))
      : [];
    let file = body && typeof body === "object" && body.file ? String(body.file) : null;
    if (!file && errors.length === 1) file = errors[0].file;
    return {kind: "error", status: res.status, message, file, errors};
  }
  if (parseError) {
    return {kind: "error", status: res.status, message: `The ${route} route returned invalid JSON: ${parseError.message}`, file: null};
  }
  if (res.status === 202 || (body && typeof body === "object" && body.state === "loading")) {
    const p = body && typeof body.progress === "number" && Number.isFinite(body.progress) ? body.progress : null;
    return {kind: "loading", status: res.status, progress: p, message: body && body.message ? String(body.message) : null};
  }
  return {kind: "ok", status: res.status, data: body};
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, {once: true});
  });
}

/**
 * GETs a route and, while it answers 202 {state: "loading", progress}, calls
 * onProgress(progress, message) and asks again every intervalMs.
 */
export async function pollJson(route, params, {signal, onProgress, intervalMs = 1000} = {}) {
  for (;;) {
    const r = await getJson(route, params, {signal});
    if (r.kind !== "loading") return r;
    if (onProgress) onProgress(r.progress, r.message);
    await sleep(intervalMs, signal);
    if (signal && signal.aborted) return {kind: "aborted"};
  }
}

/** Any JSON route, polled while it answers 202: the generic entry for new panels. */
export function get(route, params, opts) {
  return pollJson(route, params, opts);
}

/** {logdir, scan: {state, error, scanned_at}, runs: [...]} (one GET: the run list is itself re-polled by index.js) */
export function getRuns(opts) {
  return getJson("runs", {}, opts);
}

/** The report object (docs/report-schema.md). worker/span null = summary. */
export function getReport({run, worker, span}, opts) {
  return pollJson("report", {run, worker, span}, opts);
}

/** {devices: {"cuda:0": {ts_us, allocated_bytes, reserved_bytes}}, not_available?} (docs/route-schema.json; ts_us = trace time in µs) */
export function getMemory({run, worker, span}, opts) {
  return pollJson("memory", {run, worker, span}, opts);
}

/** {kernels: [per-kernel rows as occupancy.kernels]} */
export function getKernels({run, worker, span}, opts) {
  return pollJson("kernels", {run, worker, span}, opts);
}

/** The ranks view of a distributed run (docs/route-schema.json `ranks`). */
export function getRanks({run}, opts) {
  return pollJson("ranks", {run}, opts);
}

/** The compare route: sides = {base: {run, worker, span}, cand: {...}}. */
export function getCompare(sides, opts) {
  const params = {};
  for (const k of ["base", "cand"]) {
    const x = sides[k] || {};
    params[`${k}_run`] = x.run;
    params[`${k}_worker`] = x.worker;
    params[`${k}_span`] = x.span;
  }
  return pollJson("compare", params, opts);
}

/** The "all" of the dashboard's selectors is the route's summary: no worker / no span parameter. */
export function routeSelection(sel) {
  const all = (v) => (v === "all" || v === "" || v === undefined ? null : v);
  return {run: sel.run, worker: all(sel.worker), span: all(sel.span)};
}

/**
 * The data of one selection, fetched lazily and at most once each (a panel that asks
 * for the kernels twice gets the same promise). This object is what view builders get
 * as ctx.data: they call ctx.data.kernels() / ctx.data.memory() and render the result.
 */
export function selectionData(sel, {signal} = {}) {
  const params = routeSelection(sel);
  const memo = {};
  const once = (key, fn) => (opts = {}) => {
    if (!memo[key]) memo[key] = fn(params, {signal, ...opts});
    else if (opts.onProgress) opts.onProgress(null);
    return memo[key];
  };
  return {
    params,
    report: once("report", getReport),
    kernels: once("kernels", getKernels),
    memory: once("memory", getMemory),
    ranks: once("ranks", getRanks),
    /** Any other route for this selection: get(route, extra params) -> promise of a result. */
    get: (route, extra = {}, opts = {}) => pollJson(route, {...params, ...extra}, {signal, ...opts}),
    /** A relative URL of a route for this selection (for links: downloads, exports). */
    url: (route, extra = {}) => routeUrl(route, {...params, ...extra}),
  };
}
