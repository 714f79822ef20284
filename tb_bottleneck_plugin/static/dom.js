// Tiny DOM builder. Every string becomes a text node or an attribute value:
// nothing here parses HTML, so names from a trace (kernel names such as
// "<img src=x onerror=...>") are always shown as text. Do not add innerHTML,
// outerHTML, insertAdjacentHTML or document.write anywhere in the frontend.

const SVG_NS = "http://www.w3.org/2000/svg"; // an XML namespace name, never fetched

// Attributes that must be set as DOM properties to take effect after creation.
const PROPS = new Set(["value", "checked", "selected", "disabled", "indeterminate"]);

function applyAttrs(el, attrs) {
  if (!attrs) return;
  for (const [key, val] of Object.entries(attrs)) {
    if (val === undefined || val === null || val === false) continue;
    if (key.startsWith("on") && key.length > "on".length) {
      // Event handlers only as functions; a string handler would be code.
      if (typeof val === "function") el.addEventListener(key.slice(2).toLowerCase(), val);
      continue;
    }
    if (key === "style" && typeof val === "object") {
      for (const [prop, v] of Object.entries(val)) {
        if (v !== undefined && v !== null) el.style.setProperty(prop, String(v));
      }
      continue;
    }
    if (key === "class" && Array.isArray(val)) {
      el.setAttribute("class", val.filter(Boolean).join(" "));
      continue;
    }
    if (PROPS.has(key) && !(el instanceof SVGElement)) {
      el[key] = val;
      continue;
    }
    el.setAttribute(key, val === true ? "" : String(val));
  }
}

function appendChildren(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false || child === true) continue;
    if (Array.isArray(child)) {
      appendChildren(el, child);
    } else if (child instanceof Node) {
      el.appendChild(child);
    } else {
      el.appendChild(document.createTextNode(String(child)));
    }
  }
}

/** h("div", {class: "x", onclick: fn}, "text", otherNode, [more, nodes]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  applyAttrs(el, attrs);
  appendChildren(el, children);
  return el;
}

/** Same as h() for SVG elements. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyAttrs(el, attrs);
  appendChildren(el, children);
  return el;
}

/** Removes every child of el. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Replaces the children of el with the given children. */
export function mount(el, ...children) {
  clear(el);
  appendChildren(el, children);
  return el;
}
