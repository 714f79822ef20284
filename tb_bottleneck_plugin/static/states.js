// Generic states of a view: loading (with progress), error (message, file, retry), empty,
// and load(): the ONE path by which a view or panel waits on a route (model.js polls the
// route while it answers 202; load shows that progress, then the error or the data).
// Used by index.js, every view module and the registered panels (ctx.states).

import {h, mount} from "./dom.js";
import {isNum, fmtPct} from "./format.js";

/** Loading state with a progress bar; returns {set(progress, message)}. */
export function renderLoading(container, {title = "Loading…", detail = "", progress = null} = {}) {
  const fill = h("div", {class: "progress-fill"});
  const bar = h("div", {class: "progress", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100"}, fill);
  const pctText = h("span", {class: "progress-text"});
  const detailEl = h("p", {class: "note"}, detail);
  mount(container, h("div", {class: "state state-loading"},
    h("div", {class: "spinner", "aria-hidden": "true"}),
    h("h2", {}, title), bar, pctText, detailEl));
  const set = (p, message) => {
    if (isNum(p)) {
      const v = Math.max(0, Math.min(100, p * 100));
      bar.classList.remove("indeterminate");
      fill.style.width = `${v.toFixed(1)}%`;
      bar.setAttribute("aria-valuenow", v.toFixed(0));
      pctText.textContent = `${v.toFixed(0)}%`;
    } else {
      bar.classList.add("indeterminate");
      fill.style.width = "";
      bar.removeAttribute("aria-valuenow");
      pctText.textContent = "";
    }
    if (message) detailEl.textContent = message;
  };
  set(progress);
  return {set};
}

/** Error state: title, the API message, the file it concerns, and a retry button. */
export function renderError(container, {title = "Something went wrong", message = "", file = null, status = null, hint = null,
  errors = [], onRetry = null} = {}) {
  const more = (errors || []).length > 1 ? errors : [];
  mount(container, h("div", {class: "state state-error", role: "alert"},
    h("h2", {}, title),
    file ? h("p", {class: "err-file"}, h("span", {class: "muted"}, "File: "), h("code", {}, file)) : null,
    message && !more.length ? h("pre", {class: "err-message"}, message) : null,
    more.length ? h("ul", {class: "err-list"}, more.map((e) => h("li", {},
      e.file ? h("code", {}, e.file) : null, h("pre", {class: "err-message"}, e.error)))) : null,
    status ? h("p", {class: "note"}, `HTTP status ${status}`) : null,
    hint ? h("p", {class: "note"}, hint) : null,
    onRetry ? h("button", {type: "button", class: "btn", onclick: onRetry}, "Retry") : null));
}

/** A one-line loading note ("Ranks: loading…", "Ranks: analysing 40%…"); returns {set(progress)}. */
function renderLoadingLine(container, label) {
  const status = h("p", {class: "note muted"}, `${label}: loading…`);
  mount(container, status);
  return {set: (p) => { status.textContent = `${label}: analysing${isNum(p) ? ` ${fmtPct(100 * p, 0)}` : ""}…`; }};
}

function renderErrorLine(container, text, detail) {
  mount(container, h("div", {class: "banner banner-warn", role: "status"}, text, detail));
}

const errText = (err) => String(err && err.stack ? err.stack : err);

/**
 * Loads one route's answer into container: the one loading / progress / error path.
 * request({onProgress}) is a model.js call (ctx.data.kernels, (o) => ctx.data.get(route, params, o), ...)
 * resolving to {kind: "ok"|"error"|"aborted", ...}; model.js polls while the route answers 202.
 * opts:
 *   look: "state" (the loading state with a progress bar; errors replace the container),
 *         "line" (a one-line note and a warning banner, for a part that must not take the
 *         place of what is shown: the Ranks panel above the report; needs label),
 *         "quiet" (no loading look: a refresh of a panel that keeps showing the last answer)
 *   title, detail, progress   the loading state's words and first progress (look "state")
 *   label                     the part's name in the line look ("Ranks")
 *   route                     the route's name, for "Unexpected answer from the <route> route"
 *   valid(data)               false: the answer is unexpected (shown as an error)
 *   errorTitle                string or (result) -> string; errorFile: (result) -> file when the answer names none
 *   onRetry                   a Retry button on errors
 *   onError(result)           called first on an error or an unexpected answer; true: handled (nothing shown)
 *   isCurrent()               false: a newer load owns the container, this answer is dropped
 *   onData(data)              renders the answer; an exception is shown as "Could not display <what>"
 *   what                      the words after "Could not display" (default "this view")
 * Resolves to the model's result.
 */
export async function load(container, request, {look = "state", title = "Loading…", detail = "", progress = null, label = "",
  route = "", valid = (d) => Boolean(d && typeof d === "object"), errorTitle = "Could not load this view", errorFile = null,
  onRetry = null, onError = null, isCurrent = () => true, onData, what = "this view"} = {}) {
  const shown = look === "state" ? renderLoading(container, {title, detail, progress})
    : look === "line" ? renderLoadingLine(container, label) : null;
  const r = await request({onProgress: (p, message) => { if (shown && isCurrent()) shown.set(p, message); }});
  if (r.kind === "aborted" || !isCurrent()) return r;
  const ok = r.kind === "ok" && valid(r.data);
  if (!ok && onError && onError(r)) return r;
  if (!ok) {
    const failed = r.kind === "error";
    if (look === "line") {
      renderErrorLine(container, `Could not load the ${label} view: `, (failed && r.message) || `unexpected answer from the ${route} route`);
    } else if (failed) {
      renderError(container, {title: typeof errorTitle === "function" ? errorTitle(r) : errorTitle, message: r.message,
        file: r.file || (errorFile && errorFile(r)) || null, status: r.status, errors: r.errors || [], onRetry});
    } else {
      renderError(container, {title: `Unexpected answer from the ${route || "data"} route`,
        message: JSON.stringify(r.data ?? null).slice(0, 500), onRetry});
    }
    return r;
  }
  try {
    onData(r.data);
  } catch (err) {
    console.error(err); // eslint-disable-line no-console
    if (look === "line") renderErrorLine(container, `Could not display the ${label} view: `, String(err));
    else renderError(container, {title: `Could not display ${what}`, message: errText(err)});
  }
  return r;
}

/** Empty state. */
export function renderEmpty(container, {title, body = []} = {}) {
  mount(container, h("div", {class: "state state-empty"}, h("h2", {}, title), ...body));
}

export const TRACE_HOWTO = `import torch
from torch.profiler import profile, schedule, tensorboard_trace_handler

with profile(
    schedule=schedule(wait=1, warmup=1, active=3),
    on_trace_ready=tensorboard_trace_handler("LOGDIR/my_run"),
    record_shapes=True, profile_memory=True,
) as prof:
    for batch in loader:
        train_step(batch)
        prof.step()`;

