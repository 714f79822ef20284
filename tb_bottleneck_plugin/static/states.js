// Generic states of a view: loading (with progress), error (message, file, retry), empty.
// Used by index.js, every view module and the registered panels (ctx.states).

import {h, mount} from "./dom.js";
import {isNum} from "./format.js";

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

