// Small hand-written SVG charts: stacked bars, a two-axis line chart and a
// histogram, plus one shared hover tooltip. Colours come from CSS variables
// (style.css) so charts follow the light/dark theme. All labels are text nodes.

import {h, s, clear} from "./dom.js";
import {isNum} from "./format.js";

// ---------------------------------------------------------------- tooltip
let tipEl = null;

function tip() {
  if (!tipEl || !tipEl.isConnected) {
    tipEl = h("div", {class: "bn-tooltip", role: "tooltip", "aria-hidden": "true"});
    document.body.appendChild(tipEl);
  }
  return tipEl;
}

/**
 * Shows the tooltip near the pointer. lines: strings, or {text, color, bold}.
 */
export function showTooltip(lines, clientX, clientY) {
  const el = tip();
  clear(el);
  for (const line of lines) {
    if (line === null || line === undefined) continue;
    const o = typeof line === "object" ? line : {text: String(line)};
    const row = h("div", {class: o.bold ? "tip-row tip-title" : "tip-row"});
    if (o.color) row.appendChild(h("span", {class: "swatch", style: {background: o.color}}));
    row.appendChild(document.createTextNode(o.text));
    el.appendChild(row);
  }
  el.style.display = "block";
  const pad = 14;
  const w = el.offsetWidth;
  const hgt = el.offsetHeight;
  let x = clientX + pad;
  let y = clientY + pad;
  if (x + w > window.innerWidth - 4) x = Math.max(4, clientX - pad - w);
  if (y + hgt > window.innerHeight - 4) y = Math.max(4, clientY - pad - hgt);
  el.style.left = `${x}px`;
  el.style.top = `${y}px`;
}

export function hideTooltip() {
  if (tipEl) tipEl.style.display = "none";
}

/** Attaches a tooltip (lines or a function returning lines) to an element. */
export function withTooltip(el, lines) {
  const get = typeof lines === "function" ? lines : () => lines;
  el.addEventListener("mousemove", (e) => showTooltip(get(e), e.clientX, e.clientY));
  el.addEventListener("mouseleave", hideTooltip);
  return el;
}

// ---------------------------------------------------------------- layout helpers

/**
 * Renders draw(width) into container now and again whenever its width changes.
 * draw returns a Node (normally an <svg>).
 */
const REDRAW_MIN_PX = 2; // width changes smaller than this (px) do not redraw

export function responsive(container, draw) {
  let lastW = -1;
  let raf = 0;
  const redraw = () => {
    raf = 0;
    const w = Math.floor(container.clientWidth);
    if (w <= 0 || Math.abs(w - lastW) < REDRAW_MIN_PX) return;
    lastW = w;
    clear(container);
    container.appendChild(draw(w));
  };
  if (typeof ResizeObserver === "function") {
    const ro = new ResizeObserver(() => {
      if (!container.isConnected) { ro.disconnect(); return; }
      if (!raf) raf = requestAnimationFrame(redraw);
    });
    ro.observe(container);
  }
  // First draw as soon as the container is laid out.
  requestAnimationFrame(redraw);
  return container;
}

// [normalised raw step from, nice step multiplier]: the 1-2-5 ladder of tick steps.
const NICE_STEPS = [[5, 10], [2, 5], [1, 2]];

/** About n "nice" ticks covering [min, max]. */
export function niceTicks(min, max, n = 5) {
  if (!isNum(min) || !isNum(max)) return [0];
  if (max === min) max = min + 1;
  const span = max - min;
  const raw = span / Math.max(1, n);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (NICE_STEPS.find(([from]) => norm >= from) || [0, 1])[1] * mag;
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const out = [];
  for (let v = lo; v <= hi + step / 2; v += step) out.push(Math.abs(v) < step / 1e6 ? 0 : v);
  return out;
}

function scale(d0, d1, r0, r1) {
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  return (v) => r0 + (v - d0) * k;
}

function axisText(x, y, text, anchor = "end", extra = {}) {
  return s("text", {x, y, class: "axis-label", "text-anchor": anchor, ...extra}, text);
}

function yAxis({ticks, y, x0, x1, fmt, side = "left"}) {
  const g = s("g", {class: "axis"});
  for (const t of ticks) {
    const yy = y(t);
    if (side === "left") g.appendChild(s("line", {x1: x0, x2: x1, y1: yy, y2: yy, class: "grid"}));
    const tx = side === "left" ? x0 - 6 : x1 + 6;
    g.appendChild(axisText(tx, yy + 4, fmt(t), side === "left" ? "end" : "start"));
  }
  return g;
}

// ---------------------------------------------------------------- stacked bars

/**
 * bars: [{label, parts: {key: value}, total, title}], keys: draw order (bottom first),
 * colors: {key: css colour}, names: {key: display name}, fmt: value -> text.
 */
export function stackedBarChart({width, height = 260, bars, keys, colors, names, fmt, axisFmt = null, yLabel = "", maxLabels = 24}) {
  const m = {l: yLabel ? 74 : 58, r: 12, t: 14, b: 34}; // room for the rotated y label beside the tick labels
  const pw = Math.max(10, width - m.l - m.r);
  const ph = Math.max(10, height - m.t - m.b);
  const totals = bars.map((b) => (isNum(b.total) ? b.total : keys.reduce((a, k) => a + (isNum(b.parts[k]) ? b.parts[k] : 0), 0)));
  const maxV = Math.max(1, ...totals, ...bars.map((b) => keys.reduce((a, k) => a + (isNum(b.parts[k]) ? b.parts[k] : 0), 0)));
  const ticks = niceTicks(0, maxV, 5);
  const top = ticks[ticks.length - 1];
  const y = scale(0, top, m.t + ph, m.t);
  const svg = s("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `Stacked bar chart, ${bars.length} bars`});
  svg.appendChild(yAxis({ticks, y, x0: m.l, x1: m.l + pw, fmt: axisFmt || fmt}));
  if (yLabel) svg.appendChild(axisText(12, m.t + ph / 2, yLabel, "middle", {transform: `rotate(-90 12 ${m.t + ph / 2})`}));
  const slot = pw / Math.max(1, bars.length);
  const bw = Math.max(2, Math.min(56, slot * 0.7));
  const every = Math.max(1, Math.ceil(bars.length / maxLabels));
  bars.forEach((b, i) => {
    const cx = m.l + slot * i + slot / 2;
    let acc = 0;
    const g = s("g", {class: "bar"});
    for (const k of keys) {
      const v = b.parts[k];
      if (!isNum(v) || v <= 0) continue;
      const y0 = y(acc);
      const y1 = y(acc + v);
      acc += v;
      const rect = s("rect", {x: cx - bw / 2, y: y1, width: bw, height: Math.max(0.5, y0 - y1), class: "seg",
        "data-key": k, style: {fill: colors[k]}});
      withTooltip(rect, () => [
        {text: b.title || b.label, bold: true},
        {text: `${names[k] || k}: ${fmt(v)} (${((100 * v) / (totals[i] || 1)).toFixed(1)}% of step)`, color: colors[k]},
        `step total: ${fmt(totals[i])}`,
      ]);
      g.appendChild(rect);
    }
    svg.appendChild(g);
    if (i % every === 0) svg.appendChild(axisText(cx, m.t + ph + 16, b.label, "middle"));
  });
  svg.appendChild(s("line", {x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph, class: "axis-line"}));
  return svg;
}

// ---------------------------------------------------------------- line chart

function decimate(xs, ys, buckets) {
  // Keeps the min and max of each bucket so that peaks survive.
  const n = xs.length;
  if (n <= buckets * 3) return [xs, ys];
  const ox = [];
  const oy = [];
  const per = n / buckets;
  for (let b = 0; b < buckets; b++) {
    const i0 = Math.floor(b * per);
    const i1 = Math.min(n, Math.floor((b + 1) * per));
    let imin = i0;
    let imax = i0;
    for (let i = i0; i < i1; i++) {
      if (!isNum(ys[i])) continue;
      if (!isNum(ys[imin]) || ys[i] < ys[imin]) imin = i;
      if (!isNum(ys[imax]) || ys[i] > ys[imax]) imax = i;
    }
    for (const i of imin <= imax ? [imin, imax] : [imax, imin]) {
      ox.push(xs[i]);
      oy.push(ys[i]);
    }
  }
  return [ox, oy];
}

function lastIndexAtOrBefore(xs, x) {
  let lo = 0;
  let hi = xs.length - 1;
  if (hi < 0 || x < xs[0]) return -1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (xs[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/**
 * series: [{name, xs, ys, axis: "left"|"right", color, dash, step}]
 * A value holds until the next point when step is true (memory totals).
 */
export function lineChart({width, height = 240, series, xFormat, leftFormat, rightFormat, leftLabel = "",
  rightLabel = "", xLabel = "", rightMin = 0, rightMax = null, leftTickUnit = null, markers = []}) {
  const hasRight = series.some((sr) => sr.axis === "right");
  const m = {l: 62, r: hasRight ? 54 : 14, t: 12, b: 38};
  const pw = Math.max(10, width - m.l - m.r);
  const ph = Math.max(10, height - m.t - m.b);
  let xmin = Infinity;
  let xmax = -Infinity;
  let lmax = 0;
  let rmax = 0;
  for (const sr of series) {
    for (let i = 0; i < sr.xs.length; i++) {
      const xv = sr.xs[i];
      const yv = sr.ys[i];
      if (!isNum(xv)) continue;
      if (xv < xmin) xmin = xv;
      if (xv > xmax) xmax = xv;
      if (!isNum(yv)) continue;
      if (sr.axis === "right") rmax = Math.max(rmax, yv); else lmax = Math.max(lmax, yv);
    }
  }
  if (!isNum(xmin)) { xmin = 0; xmax = 1; }
  if (xmax === xmin) xmax = xmin + 1;
  const x = scale(xmin, xmax, m.l, m.l + pw);
  // leftTickUnit (e.g. 2**30 for GiB) puts the ticks on round numbers of that unit.
  const unitFor = typeof leftTickUnit === "function" ? leftTickUnit(lmax) : leftTickUnit;
  const lu = isNum(unitFor) && unitFor > 0 ? unitFor : 1;
  const lt = niceTicks(0, (lmax || lu) / lu, 5).map((t) => t * lu);
  const yl = scale(0, lt[lt.length - 1], m.t + ph, m.t);
  const rt = niceTicks(rightMin, rightMax !== null ? rightMax : rmax || 1, 5);
  const yr = scale(rt[0], rt[rt.length - 1], m.t + ph, m.t);
  const svg = s("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `Line chart: ${series.map((sr) => sr.name).join(", ")}`});
  svg.appendChild(yAxis({ticks: lt, y: yl, x0: m.l, x1: m.l + pw, fmt: leftFormat}));
  if (hasRight) svg.appendChild(yAxis({ticks: rt, y: yr, x0: m.l, x1: m.l + pw, fmt: rightFormat, side: "right"}));
  const xt = niceTicks(xmin, xmax, Math.max(2, Math.floor(pw / 90))).filter((t) => t >= xmin && t <= xmax);
  const gx = s("g", {class: "axis"});
  for (const t of xt) gx.appendChild(axisText(x(t), m.t + ph + 16, xFormat(t), "middle"));
  svg.appendChild(gx);
  svg.appendChild(s("line", {x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph, class: "axis-line"}));
  if (xLabel) svg.appendChild(axisText(m.l + pw / 2, height - 4, xLabel, "middle"));
  if (leftLabel) svg.appendChild(axisText(12, m.t + ph / 2, leftLabel, "middle", {transform: `rotate(-90 12 ${m.t + ph / 2})`}));
  if (hasRight && rightLabel) {
    svg.appendChild(axisText(width - 8, m.t + ph / 2, rightLabel, "middle", {transform: `rotate(90 ${width - 8} ${m.t + ph / 2})`}));
  }
  for (const sr of series) {
    const yf = sr.axis === "right" ? yr : yl;
    const [dx, dy] = decimate(sr.xs, sr.ys, Math.floor(pw));
    let d = "";
    let pen = false;
    for (let i = 0; i < dx.length; i++) {
      if (!isNum(dx[i]) || !isNum(dy[i])) { pen = false; continue; }
      const px = x(dx[i]).toFixed(1);
      const py = yf(dy[i]).toFixed(1);
      if (!pen) { d += `M${px},${py}`; pen = true; } else if (sr.step) d += `H${px}V${py}`; else d += `L${px},${py}`;
    }
    if (sr.step && pen) d += `H${(m.l + pw).toFixed(1)}`;
    svg.appendChild(s("path", {d, class: "series", style: {stroke: sr.color, "stroke-dasharray": sr.dash || null}}));
  }
  // markers: [{x, label, title}] vertical lines at given x values (e.g. the memory peak's instant)
  for (const mk of Array.isArray(markers) ? markers : []) {
    if (!mk || !isNum(mk.x) || mk.x < xmin || mk.x > xmax) continue;
    const mx = x(mk.x);
    const g = s("g", {class: "chart-marker", "data-marker": String(mk.label ?? "")});
    g.appendChild(s("line", {x1: mx, x2: mx, y1: m.t, y2: m.t + ph, class: "marker-line"}));
    if (mk.label) g.appendChild(axisText(mx + 3, m.t + 10, String(mk.label), "start"));
    svg.appendChild(g);
  }
  // Hover: a cursor line and the values at that time.
  const cursor = s("line", {x1: 0, x2: 0, y1: m.t, y2: m.t + ph, class: "cursor", visibility: "hidden"});
  svg.appendChild(cursor);
  const overlay = s("rect", {x: m.l, y: m.t, width: pw, height: ph, class: "overlay"});
  overlay.addEventListener("mousemove", (e) => {
    const box = svg.getBoundingClientRect();
    const sx = box.width ? width / box.width : 1;
    const px = (e.clientX - box.left) * sx;
    const xv = xmin + ((px - m.l) / pw) * (xmax - xmin);
    cursor.setAttribute("x1", px);
    cursor.setAttribute("x2", px);
    cursor.setAttribute("visibility", "visible");
    const lines = [{text: xFormat(xv), bold: true}];
    for (const sr of series) {
      const i = lastIndexAtOrBefore(sr.xs, xv);
      const v = i >= 0 ? sr.ys[i] : null;
      const f = sr.axis === "right" ? rightFormat : leftFormat;
      lines.push({text: `${sr.name}: ${isNum(v) ? f(v) : "n/a"}`, color: sr.color});
    }
    showTooltip(lines, e.clientX, e.clientY);
  });
  overlay.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    hideTooltip();
  });
  svg.appendChild(overlay);
  return svg;
}

// ---------------------------------------------------------------- histogram

/** bins: [{label, value, tooltip: [lines]}]; color: css colour or (bin, i) -> colour. */
export function histogram({width, height = 220, bins, fmt, yLabel = "", xLabel = "", color = "var(--c-accent)"}) {
  const m = {l: 50, r: 10, t: 12, b: xLabel ? 40 : 28};
  const pw = Math.max(10, width - m.l - m.r);
  const ph = Math.max(10, height - m.t - m.b);
  const maxV = Math.max(1, ...bins.map((b) => (isNum(b.value) ? b.value : 0)));
  const ticks = niceTicks(0, maxV, 4);
  const y = scale(0, ticks[ticks.length - 1], m.t + ph, m.t);
  const svg = s("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `Histogram, ${bins.length} buckets`});
  svg.appendChild(yAxis({ticks, y, x0: m.l, x1: m.l + pw, fmt}));
  if (yLabel) svg.appendChild(axisText(12, m.t + ph / 2, yLabel, "middle", {transform: `rotate(-90 12 ${m.t + ph / 2})`}));
  const slot = pw / Math.max(1, bins.length);
  bins.forEach((b, i) => {
    const v = isNum(b.value) ? b.value : 0;
    const x0 = m.l + slot * i + 3;
    const rect = s("rect", {x: x0, y: y(v), width: Math.max(1, slot - 6), height: Math.max(0, m.t + ph - y(v)), class: "seg",
      style: {fill: typeof color === "function" ? color(b, i) : color}});
    withTooltip(rect, b.tooltip || [b.label, fmt(v)]);
    svg.appendChild(rect);
    svg.appendChild(axisText(x0 + (slot - 6) / 2, m.t + ph + 16, b.label, "middle"));
    if (v > 0) svg.appendChild(axisText(x0 + (slot - 6) / 2, y(v) - 4, fmt(v), "middle", {class: "axis-label value-label"}));
  });
  svg.appendChild(s("line", {x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph, class: "axis-line"}));
  if (xLabel) svg.appendChild(axisText(m.l + pw / 2, height - 4, xLabel, "middle"));
  return svg;
}
