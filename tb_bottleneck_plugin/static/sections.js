// The section bar of the single-run view (issue 35): the report's panels by topic (Overview ·
// Kernels & roofline · Memory · Source & modules · Compile · Timeline · Operators ·
// Collectives/Ranks). Which sections the run has, which matter here (marked, with the reason on
// hover) and which are open by default are the server's (report.layout.sections, judge/layout.py); the user's choice lives in the URL
// (router.js `open`, written by index.js through onToggle); "All" opens every section and is
// remembered in this browser (localStorage "bottlenecks.sections"). A closed section's panels are
// built the first time it opens (no fetch, no chart for what nobody looks at).

import {h} from "./dom.js";

/** The server's sections of a report ([{id, label, relevant, open, why}]); one Overview when it sent none. */
export function reportSections(report) {
  const list = report && report.layout && Array.isArray(report.layout.sections) ? report.layout.sections : [];
  const ok = list.filter((s) => s && typeof s.id === "string" && s.id);
  return ok.length ? ok : [{id: "overview", label: "Overview", open: true, why: null}];
}

/**
 * Mounts the bar and one container per section into container. open: the ids the URL names
 * (null: the server's defaults). onToggle(openIds): the user opened or closed one.
 * Returns {section(id) -> {el, onOpen(fn)} | null, openIds()}: onOpen runs fn(el) now when the
 * section is open, else the first time it opens.
 */
export function mountSections(container, report, {open = null, onToggle = null} = {}) {
  const list = reportSections(report);
  const all = !open && rememberedAll();
  const isOpen = new Map(list.map((s) => [s.id, all || (open ? open.includes(s.id) : s.open === true)]));
  if (![...isOpen.values()].some(Boolean)) isOpen.set(list[0].id, true);
  const slots = new Map();
  const buttons = new Map();
  const bar = h("nav", {class: "section-bar", id: "bn-section-bar", "aria-label": "Sections"});
  const openIds = () => list.filter((s) => isOpen.get(s.id)).map((s) => s.id);
  const apply = (id) => {
    const slot = slots.get(id);
    const on = isOpen.get(id);
    slot.el.hidden = !on;
    buttons.get(id).setAttribute("aria-pressed", on ? "true" : "false");
    if (on) {
      const pending = slot.pending.splice(0);
      for (const fn of pending) fn(slot.el);
    }
  };
  for (const s of list) {
    const btn = h("button", {type: "button", class: ["section-btn", s.relevant === true ? "section-relevant" : null],
      "data-section": s.id, "data-relevant": s.relevant === true ? "true" : "false",
      title: s.why ? `Relevant here: ${String(s.why)}` : "Click to show or hide",
      onclick: () => {
        isOpen.set(s.id, !isOpen.get(s.id));
        apply(s.id);
        if (isOpen.get(s.id)) slots.get(s.id).el.scrollIntoView({block: "start", behavior: "smooth"});
        if (onToggle) onToggle(openIds());
      }}, String(s.label || s.id));
    buttons.set(s.id, btn);
    bar.appendChild(btn);
    slots.set(s.id, {el: h("div", {class: "bn-section", id: `bn-section-${s.id}`, "data-section": s.id}), pending: []});
  }
  // "All": every section open, remembered in this browser (the choice of a reader who wants the
  // whole report each time); clicked again, back to the server's defaults
  const allBtn = h("button", {type: "button", class: "section-btn section-all", "data-section": "all",
    title: "Show every section (remembered in this browser); click again for the default sections",
    "aria-pressed": all ? "true" : "false",
    onclick: () => {
      const on = allBtn.getAttribute("aria-pressed") !== "true";
      remember(on);
      allBtn.setAttribute("aria-pressed", on ? "true" : "false");
      for (const s of list) { isOpen.set(s.id, on || s.open === true); apply(s.id); }
      if (onToggle) onToggle(on ? openIds() : null, {rerender: true}); // the cards follow (one row or groups)
    }}, "All");
  bar.appendChild(allBtn);
  container.appendChild(bar);
  for (const s of list) container.appendChild(slots.get(s.id).el);
  for (const s of list) apply(s.id);
  return {
    section(id) {
      const slot = slots.get(id);
      if (!slot) return null;
      return {el: slot.el, onOpen(fn) { if (isOpen.get(id)) fn(slot.el); else slot.pending.push(fn); }};
    },
    openIds,
  };
}

const ALL_KEY = "bottlenecks.sections";

/** True when this browser's reader chose "All" (localStorage; false where storage is blocked):
 * every section open and every card in one row (cards.js renderCardGroups). */
export function rememberedAll() {
  try {
    return window.localStorage.getItem(ALL_KEY) === "all";
  } catch (e) {
    return false;
  }
}

function remember(all) {
  try {
    if (all) window.localStorage.setItem(ALL_KEY, "all");
    else window.localStorage.removeItem(ALL_KEY);
  } catch (e) {
    // storage blocked: the choice lasts for this page only
  }
}
