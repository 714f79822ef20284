// The step timeline (METRICS.md "Step timeline"): one step of one span on one time axis,
// lanes for the main CPU thread (top-level ops and record_function regions, then nested
// levels), other CPU threads, the DataLoader, CUDA (HIP on ROCm) runtime calls and each GPU
// stream, and the time no kernel ran shaded by its cause (the report's own definitions,
// computed by the server); lanes with no event in the step are not sent (hidden_lanes).
// Colours are style.css custom properties (--tl-*), read with getComputedStyle at each
// draw, so the canvas follows the light/dark theme (redrawn when the theme changes). The server sends a level-of-detail summary of the visible window (at most
// a few thousand rectangles, sub-pixel events merged into busy blocks); wheel zoom and
// drag pan ask for the new window at finer detail. Drawn on a canvas: trace names reach
// the page only as canvas text or textContent (hover box), never as HTML.

import {h, mount} from "./dom.js";
import {fmtPct, fmtUs, fmtUsTick, isNum, spanLabel} from "./format.js";
import {registerPanel} from "./panels.js";
import {load as loadRoute, renderEmpty} from "./states.js";

const LANE_H = 18;
const IDLE_H = 22;
const AXIS_H = 22;
const LABEL_W = 190;
const FETCH_DELAY_MS = 90;

const CAUSES = ["input_wait", "h2d_copy", "sync", "launch", "other"];
const CAUSE_LABEL = {
  input_wait: "waiting for input",
  h2d_copy: "host-to-device copy",
  sync: "synchronisation",
  launch: "launch-bound (short kernels)",
  other: "other",
};
// Colours: style.css custom properties (light and dark values there); these are the
// fallbacks when a property is missing (the light theme's values).
const CAUSE_COLOR = {input_wait: "#e15759", h2d_copy: "#edc948", sync: "#b07aa1", launch: "#76b7b2", other: "#c9c3bf"};
const CAUSE_TEXT_COLOR = {input_wait: "#b3262a", h2d_copy: "#8a6d00", sync: "#7b4a6f", launch: "#2f6f6a", other: "#5f6368"};
const KIND_COLOR = {cpu: "#4e79a7", dataloader: "#f28e2b", runtime: "#9c755f", gpu: "#59a14f", copy: "#d4a017"};
const causeVar = (c) => `--tl-${c.replace("_", "-")}`;
const KIND_LABEL = [["cpu", "CPU op"], ["dataloader", "DataLoader"], ["runtime", "runtime call"], ["gpu", "GPU kernel"]];
const EMPTY_TEXT = "none in this window";
const CAUSE_TEXT_MIN_PX = 90; // a shaded stretch this wide gets its cause written in the lane

/** Cause names as the user reads them: without a GPU the shading is the host's time. */
function causeLabel(cause, hasGpu) {
  if (!hasGpu && cause === "other") return "other host time (not waiting for input)";
  return CAUSE_LABEL[cause] || cause;
}

/** What a shaded stretch means, for the lane text and the hover box. */
function causeLine(cause, hasGpu) {
  return hasGpu ? `GPU idle: ${causeLabel(cause, hasGpu)}` : `no compute: ${causeLabel(cause, hasGpu)}`;
}

/** The timeline's colours in the theme of el (style.css --tl-* properties). */
function palette(el) {
  const css = getComputedStyle(el);
  const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  const num = (name, fallback) => { const x = parseFloat(v(name, "")); return Number.isFinite(x) ? x : fallback; };
  const map = (keys, f) => Object.fromEntries(keys.map((k) => [k, f(k)]));
  return {
    fg: v("--fg", "#333"), muted: v("--muted", "#777"), grid: v("--grid", "#eee"), border: v("--border", "#ccc"),
    shade: map(CAUSES, (c) => v(causeVar(c), CAUSE_COLOR[c])),
    ink: map(CAUSES, (c) => v(`${causeVar(c)}-ink`, CAUSE_TEXT_COLOR[c])),
    kind: map(Object.keys(KIND_COLOR), (k) => v(`--tl-${k}`, KIND_COLOR[k])),
    shadeAlpha: num("--tl-shade-alpha", 0.22), otherAlpha: num("--tl-other-alpha", 0.12),
    barText: v("--tl-bar-text", "#fff"), barTextOnLight: v("--tl-bar-text-on-light", "#222"),
  };
}

function laneColor(pal, lane, name) {
  if (lane.kind === "gpu" && name && /^Mem(cpy|set)/.test(name)) return pal.kind.copy;
  return pal.kind[lane.kind] || pal.muted;
}

/** Renders the timeline panel of ctx's selection into container. */
export function renderTimeline(container, ctx) {
  const st = {
    data: null, // last answer
    step: null, worker: null, span: null, // what the user picked (null: the server's default)
    view: null, // [t0, t1] µs from the step start
    seq: 0, timer: null, drag: null,
  };
  const controls = h("div", {class: "table-tools tl-tools"});
  const legend = h("div", {class: "tl-legend", style: {margin: "4px 0", "font-size": "12px"}});
  const canvas = h("canvas", {class: "tl-canvas", style: {width: "100%", display: "block", cursor: "grab"}});
  const tip = h("div", {class: "tl-tip", role: "tooltip", style: {position: "absolute", display: "none", "pointer-events": "none",
    background: "var(--tip-bg, rgba(20,20,20,0.92))", color: "var(--tip-fg, #fff)", padding: "4px 6px", "border-radius": "3px", "font-size": "12px",
    "white-space": "pre-wrap", "overflow-wrap": "anywhere", "max-width": "520px", "z-index": "10"}});
  const stage = h("div", {class: "tl-stage", style: {position: "relative"}}, canvas, tip);
  const body = h("div", {class: "tl-body"});
  mount(container, controls, legend, body);

  function params(extra) {
    const p = {px: Math.max(200, Math.round(plotWidth()))};
    if (st.step !== null) p.step = st.step;
    if (st.worker) p.worker = st.worker;
    if (st.span) p.span = st.span;
    if (st.view) { p.t0 = st.view[0].toFixed(3); p.t1 = st.view[1].toFixed(3); }
    return {...p, ...(extra || {})};
  }

  function plotWidth() {
    const w = (body.clientWidth || container.clientWidth || 1000) - LABEL_W;
    return Math.max(200, w);
  }

  function load(first) {
    const mine = ++st.seq;
    loadRoute(body, (opts) => ctx.data.get("timeline", params(), opts), {
      look: first ? "state" : "quiet", title: "Loading the step timeline…", errorTitle: "Could not load the step timeline",
      route: "timeline", what: "the step timeline", isCurrent: () => mine === st.seq, valid: (d) => Boolean(d && Array.isArray(d.lanes)),
      onError: (r) => {
        if (r.kind !== "error" || r.status !== 422) return false;
        // the span has nothing to draw (the route's reason): n/a, not a failure
        renderEmpty(body, {title: "No step timeline for this span", body: [h("p", {class: "note"}, String(r.message || "no step"))]});
        return true;
      },
      onData: (data) => show(data, first),
    });
  }

  function show(data, first) {
    st.data = data;
    // the spans to pick from: the panel's selection's (the first answer); an answer for one
    // picked span lists only that span's worker, and the picker must keep the others
    if (!st.spans && Array.isArray(data.spans)) st.spans = data.spans;
    st.worker = data.worker;
    st.span = data.span;
    st.step = data.step;
    if (!st.view) st.view = [data.t0, data.t1];
    if (first || !stage.isConnected) {
      mount(body, stage);
      drawControls();
      drawLegend();
    }
    draw();
  }

  function schedule() {
    clearTimeout(st.timer);
    st.timer = setTimeout(() => load(false), FETCH_DELAY_MS);
  }

  // ---------------------------------------------------------------- controls
  function drawControls() {
    const d = st.data;
    const spans = st.spans || d.spans || [];
    const workers = new Set(spans.map((x) => x.worker));
    const nth = {};
    const spanSel = spans.length > 1
      ? h("select", {class: "tl-span", "aria-label": "Span", onchange: (e) => {
        const [w, s] = JSON.parse(e.target.value);
        st.worker = w; st.span = s; st.step = null; st.view = null; load(true);
      }}, spans.map((x) => {
        const i = nth[x.worker] = (nth[x.worker] ?? -1) + 1;
        const text = `${workers.size > 1 ? `${x.worker} · ` : ""}${spanLabel({timestamp: x.span}, i)}`;
        return h("option", {value: JSON.stringify([x.worker, x.span]), title: `${x.worker} · span ${x.span}`}, text);
      }))
      : null;
    if (spanSel) spanSel.value = JSON.stringify([d.worker, d.span]);
    const slowest = slowestStep(d.steps);
    const stepSel = h("select", {class: "tl-step", "aria-label": "Step", onchange: (e) => {
      st.step = Number(e.target.value); st.view = null; load(true);
    }}, d.steps.map((s) => h("option", {value: String(s.step)},
      `Step ${s.step} · ${fmtUs(s.duration_us)}${s.step === slowest ? " (slowest)" : ""}${s.included ? "" : " (excluded)"}`)));
    stepSel.value = String(d.step);
    const reset = h("button", {type: "button", class: "btn tl-reset", onclick: () => {
      st.view = [0, st.data.step_us]; draw(); load(false);
    }}, "Reset zoom");
    // the export: the whole step, or the visible window when zoomed in; at most
    // d.export.max_events events (the server cuts and says so in d.export.note)
    const exportQuery = (a, b) => Object.assign({worker: d.worker, span: d.span, step: d.step},
      a > 0 || b < d.step_us ? {t0: String(a), t1: String(b)} : {});
    const exportLink = h("a", {class: "btn tl-export", download: "",
      href: ctx.data.url("step_trace", exportQuery(0, d.step_us)),
      onclick: (e) => { const [a, b] = st.view || [0, d.step_us]; e.currentTarget.href = ctx.data.url("step_trace", exportQuery(a, b)); },
      title: "This step's events (the visible window when zoomed in) as a Chrome trace JSON: open it in ui.perfetto.dev or chrome://tracing"},
    d.steps_found === false ? "Download window (Chrome trace)" : "Download step (Chrome trace)");
    const exportNote = d.export && d.export.note ? h("span", {class: "note tl-export-note"}, ` ${d.export.note}.`) : null;
    mount(controls, spanSel ? h("label", {}, "Span ", spanSel) : null,
      h("label", {}, d.steps_found === false ? "Whole trace (no ProfilerStep#N) " : "Step ", stepSel), reset, exportLink,
      exportNote, h("span", {class: "note tl-hint"}, " Wheel: zoom · drag: pan · hover: details"));
  }

  function slowestStep(steps) {
    let best = null;
    for (const s of steps || []) if (s.included && (best === null || s.duration_us > best.duration_us)) best = s;
    return best ? best.step : null;
  }

  function drawLegend() {
    const d = st.data;
    const drawn = drawnIdlePct(d);
    const items = CAUSES.filter((c) => isNum(d.idle_pct[c]) && d.idle_us[c] > 0).map((c) =>
      h("span", {class: "tl-cause", "data-cause": c, "data-pct": String(d.idle_pct[c]),
        "data-drawn-pct": drawn[c] === undefined ? "" : String(drawn[c]), style: {"margin-right": "14px"}},
      h("span", {style: {display: "inline-block", width: "10px", height: "10px", background: `var(${causeVar(c)}, ${CAUSE_COLOR[c]})`,
        "margin-right": "4px", "vertical-align": "middle"}}),
      `${causeLabel(c, d.has_gpu)}: ${fmtPct(d.idle_pct[c])}`));
    const what = d.has_gpu ? "Shaded: GPU idle in this step (no kernel running), by cause: "
      : "No GPU activity in this trace. Shaded: the host's time in this step, by cause: ";
    const swatch = (color, alpha) => h("span", {style: {display: "inline-block", width: "10px", height: "10px", background: color,
      opacity: String(alpha), "margin-right": "4px", "vertical-align": "middle"}});
    const kinds = new Set(d.lanes.map((l) => l.kind));
    const kindSwatch = (k) => swatch(`var(--tl-${k}, ${KIND_COLOR[k]})`, 1);
    const bars = KIND_LABEL.filter(([k]) => kinds.has(k)).map(([k, text]) =>
      h("span", {class: "tl-kind", "data-kind": k, style: {"margin-right": "14px"}}, kindSwatch(k),
        k === "runtime" ? `${d.runtime_api || "CUDA"} ${text}` : text));
    if (kinds.has("gpu")) bars.push(h("span", {class: "tl-kind", "data-kind": "copy", style: {"margin-right": "14px"}}, kindSwatch("copy"), "memcpy / memset"));
    const hidden = d.hidden_lanes > 0
      ? h("div", {class: "note tl-hidden", "data-hidden": String(d.hidden_lanes)},
        `${d.hidden_lanes} ${d.hidden_lanes === 1 ? "lane has" : "lanes have"} no event in this step and ${d.hidden_lanes === 1 ? "is" : "are"} not shown (other steps may show ${d.hidden_lanes === 1 ? "it" : "them"}).`)
      : null;
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", `Step ${d.step} timeline, ${d.lanes.filter((l) => l.kind !== "idle").length} lanes. ${what}`
      + CAUSES.filter((c) => isNum(d.idle_pct[c]) && d.idle_us[c] > 0).map((c) => `${causeLabel(c, d.has_gpu)} ${fmtPct(d.idle_pct[c])}`).join(", "));
    mount(legend, h("div", {class: "tl-legend-causes"}, h("span", {class: "muted"}, what), items),
      h("div", {class: "tl-legend-kinds"}, h("span", {class: "muted"}, "Bars: "), bars,
        h("span", {class: "muted"}, "(faded: several events merged at this zoom; zoom in to separate them)")), hidden);
  }

  /** Shaded share per cause from the rectangles of a whole-step answer (equals idle_pct). */
  function drawnIdlePct(d) {
    const out = {};
    if (!(d.t0 === 0 && Math.abs(d.t1 - d.step_us) < 1e-6) || !(d.step_us > 0)) return out;
    for (const lane of d.lanes) {
      if (lane.kind !== "idle") continue;
      out[lane.cause] = (100 * lane.busy_us.reduce((a, b) => a + b, 0)) / d.step_us;
    }
    return out;
  }

  // ---------------------------------------------------------------- drawing
  function rows() {
    // every non-idle lane is a row; the idle lanes share one row at the bottom
    const d = st.data;
    const out = [];
    let y = AXIS_H;
    for (const lane of d.lanes) {
      if (lane.kind === "idle") continue;
      out.push({lane, y, h: LANE_H});
      y += LANE_H;
    }
    out.push({idle: d.lanes.filter((l) => l.kind === "idle"), y: y + 4, h: IDLE_H});
    return {rows: out, height: y + 4 + IDLE_H + 4};
  }

  function draw() {
    const d = st.data;
    if (!d) return;
    const {rows: rs, height} = rows();
    const cssW = body.clientWidth || container.clientWidth || 1000;
    const dpr = window.devicePixelRatio || 1;
    canvas.style.height = `${height}px`;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(height * dpr);
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, height);
    g.font = "11px sans-serif";
    g.textBaseline = "middle";
    // every colour from the theme (style.css --tl-* and text variables: TensorBoard's light or
    // dark mode); the cause words: dark shades on a light page, bright ones on a dark page
    const pal = palette(container);
    const FG = pal.fg;
    const MUTED = pal.muted;
    const GRID = pal.grid;
    const causeInk = pal.ink;
    const [v0, v1] = st.view;
    const W = cssW - LABEL_W;
    const x = (t) => LABEL_W + ((t - v0) / (v1 - v0)) * W;
    // shading of the idle causes across the GPU lanes (every lane when there is no GPU)
    const shadeRows = rs.filter((r) => r.lane && (d.has_gpu ? r.lane.kind === "gpu" : true));
    const idleRow = rs[rs.length - 1];
    const textRow = shadeRows.find((r) => r.lane.kind !== "dataloader");
    const written = []; // the cause texts drawn in textRow: {cause, text, x0, x1} (CSS px)
    if (shadeRows.length) {
      const top = shadeRows[0].y;
      const bottom = shadeRows[shadeRows.length - 1].y + LANE_H;
      for (const lane of idleRow.idle) {
        g.fillStyle = pal.shade[lane.cause];
        g.globalAlpha = lane.cause === "other" ? pal.otherAlpha : pal.shadeAlpha;
        for (let i = 0; i < lane.t0.length; i++) {
          const a = x(lane.t0[i]);
          g.fillRect(a, top, Math.max(1, x(lane.t1[i]) - a), bottom - top);
        }
      }
      g.globalAlpha = 1;
      // the cause written in the shaded stretches of the first shaded lane that is not the DataLoader
      // (the GPU's own lane when there is a GPU): "GPU idle: waiting for input" where nothing runs
      if (textRow) {
        g.save();
        g.beginPath();
        g.rect(LABEL_W, textRow.y, W, LANE_H);
        g.clip();
        for (const lane of idleRow.idle) {
          if (lane.cause === "other") continue;
          for (let i = 0; i < lane.t0.length; i++) {
            const a = Math.max(LABEL_W, x(lane.t0[i]));
            const b = Math.min(cssW, x(lane.t1[i]));
            if (b - a < CAUSE_TEXT_MIN_PX) continue;
            g.fillStyle = causeInk[lane.cause] || FG;
            g.fillText(causeLine(lane.cause, d.has_gpu), a + 4, textRow.y + LANE_H / 2);
            written.push({cause: lane.cause, text: causeLine(lane.cause, d.has_gpu), x0: a, x1: b});
          }
        }
        g.restore();
      }
    }
    // lanes
    for (const r of rs) {
      g.fillStyle = FG;
      const label = r.lane ? r.lane.label : (d.has_gpu ? "GPU idle · cause" : "Host time · cause (no GPU)");
      g.save();
      g.beginPath();
      g.rect(0, r.y, LABEL_W - 6, r.h);
      g.clip();
      g.fillText(label, 4, r.y + r.h / 2);
      g.restore();
      g.strokeStyle = GRID;
      g.beginPath();
      g.moveTo(LABEL_W, r.y + r.h - 0.5);
      g.lineTo(cssW, r.y + r.h - 0.5);
      g.stroke();
      g.save();
      g.beginPath();
      g.rect(LABEL_W, r.y, W, r.h);
      g.clip();
      const lanes = r.lane ? [r.lane] : r.idle;
      if (r.lane && !r.lane.t0.length && r !== textRow) {
        g.fillStyle = MUTED;
        g.fillText(EMPTY_TEXT, LABEL_W + 4, r.y + r.h / 2);
      }
      for (const lane of lanes) {
        for (let i = 0; i < lane.t0.length; i++) {
          const a = x(lane.t0[i]);
          const w = Math.max(1, x(lane.t1[i]) - a);
          const nm = lane.name[i] !== null && lane.name[i] !== undefined ? d.names[lane.name[i]] : null;
          const merged = lane.count[i] > 1;
          g.fillStyle = lane.kind === "idle" ? pal.shade[lane.cause] : laneColor(pal, lane, nm);
          g.globalAlpha = merged ? 0.55 : 1;
          g.fillRect(a, r.y + 2, w, r.h - 4);
          g.globalAlpha = 1;
          const text = lane.kind === "idle" ? causeLabel(lane.cause, d.has_gpu) : (nm || (merged ? `${lane.count[i]} events` : ""));
          if (w > 40 && text) {
            g.save();
            g.beginPath();
            g.rect(a, r.y, w, r.h);
            g.clip();
            g.fillStyle = lane.kind === "idle" && lane.cause !== "input_wait" ? pal.barTextOnLight : pal.barText;
            g.fillText(text, a + 3, r.y + r.h / 2);
            g.restore();
          }
        }
      }
      g.restore();
    }
    // axis
    g.fillStyle = MUTED;
    g.strokeStyle = pal.border;
    const ticks = niceTicks(v0, v1, Math.max(2, Math.floor(W / 110)));
    for (const t of ticks) {
      const xx = x(t);
      g.beginPath();
      g.moveTo(xx, AXIS_H - 4);
      g.lineTo(xx, height);
      g.stroke();
      g.fillText(fmtUsTick(t), xx + 2, AXIS_H / 2);
    }
    g.fillText(`step ${d.step}`, 4, AXIS_H / 2);
    canvas.dataset.rects = String(d.lanes.reduce((a, l) => a + l.t0.length, 0));
    canvas.dataset.window = `${v0.toFixed(3)},${v1.toFixed(3)}`;
    canvas.dataset.step = String(d.step);
    canvas.dataset.causeText = JSON.stringify({row: textRow ? textRow.lane.label : null, y: textRow ? textRow.y : null,
      color: causeInk, shade: pal.shade, labels: written});
    // where each row is drawn (CSS px), for tests and tools reading the canvas
    canvas.dataset.layout = JSON.stringify({label_w: LABEL_W, width: cssW, has_gpu: d.has_gpu,
      rows: rs.map((r) => ({label: r.lane ? r.lane.label : "idle", kind: r.lane ? r.lane.kind : "idle", y: r.y, h: r.h,
        shaded: shadeRows.includes(r), rects: r.lane ? r.lane.t0.length : r.idle.reduce((a, l) => a + l.t0.length, 0)}))});
    st.layout = {rs, x, W, cssW, shadeRows, idleRow};
  }

  function niceTicks(a, b, n) {
    const span = b - a;
    if (!(span > 0)) return [];
    const raw = span / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
    const out = [];
    for (let t = Math.ceil(a / step) * step; t <= b; t += step) out.push(t);
    return out;
  }

  // ---------------------------------------------------------------- interaction
  function timeAt(px) {
    const [v0, v1] = st.view;
    const W = (canvas.clientWidth || 1) - LABEL_W;
    return v0 + ((px - LABEL_W) / W) * (v1 - v0);
  }

  function clampView(a, b) {
    const total = st.data.step_us;
    let w = Math.min(Math.max(b - a, 1e-3), total);
    a = Math.max(0, Math.min(a, total - w));
    return [a, a + w];
  }

  canvas.addEventListener("wheel", (e) => {
    if (!st.data) return;
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const px = e.clientX - rect.left;
    if (px < LABEL_W) return;
    const t = timeAt(px);
    const f = Math.exp(Math.sign(e.deltaY) * Math.min(Math.abs(e.deltaY), 300) / 300);
    const [v0, v1] = st.view;
    st.view = clampView(t - (t - v0) * f, t + (v1 - t) * f);
    draw();
    schedule();
  }, {passive: false});

  canvas.addEventListener("mousedown", (e) => {
    if (!st.data) return;
    st.drag = {x: e.clientX, view: st.view.slice()};
    canvas.style.cursor = "grabbing";
  });
  const onMouseUp = () => {
    if (st.drag) {
      st.drag = null;
      canvas.style.cursor = "grab";
      schedule();
    }
  };
  window.addEventListener("mouseup", onMouseUp);
  canvas.addEventListener("mousemove", (e) => {
    if (!st.data) return;
    const rect = canvas.getBoundingClientRect();
    if (st.drag) {
      const [v0, v1] = st.drag.view;
      const dt = ((e.clientX - st.drag.x) / Math.max(1, rect.width - LABEL_W)) * (v1 - v0);
      st.view = clampView(v0 - dt, v1 - dt);
      draw();
      tip.style.display = "none";
      return;
    }
    hover(e.clientX - rect.left, e.clientY - rect.top);
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });

  function hover(px, py) {
    const lay = st.layout;
    if (!lay || px < LABEL_W) { tip.style.display = "none"; return; }
    const r = lay.rs.find((row) => py >= row.y && py < row.y + row.h);
    if (!r) { tip.style.display = "none"; return; }
    const t = timeAt(px);
    const slack = (st.view[1] - st.view[0]) / Math.max(1, lay.W) * 2; // 2 px
    const d = st.data;
    let hit = null;
    for (const lane of r.lane ? [r.lane] : r.idle) {
      for (let i = 0; i < lane.t0.length; i++) {
        if (lane.t0[i] - slack <= t && t <= lane.t1[i] + slack) { hit = {lane, i}; break; }
      }
      if (hit) break;
    }
    if (!hit && lay.shadeRows.includes(r)) {
      // an empty stretch of a shaded lane: say why nothing runs there
      for (const lane of lay.idleRow.idle) {
        for (let i = 0; i < lane.t0.length; i++) {
          if (lane.t0[i] <= t && t <= lane.t1[i]) { hit = {lane, i}; break; }
        }
        if (hit) break;
      }
    }
    if (!hit) { tip.style.display = "none"; return; }
    const {lane, i} = hit;
    const lines = [];
    if (lane.kind === "idle") {
      lines.push(causeLine(lane.cause, d.has_gpu));
      lines.push(`${fmtUs(lane.busy_us[i])}${lane.count[i] > 1 ? ` in ${lane.count[i]} stretches` : ""}`);
    } else if (lane.count[i] > 1) {
      lines.push(`${lane.count[i]} events (merged at this zoom; zoom in for each)`);
      lines.push(`busy ${fmtUs(lane.busy_us[i])} of ${fmtUs(lane.t1[i] - lane.t0[i])}`);
    } else {
      lines.push(lane.name[i] !== null ? d.names[lane.name[i]] : "(unnamed)");
      lines.push(`duration ${fmtUs(lane.busy_us[i])} (inside this window)`);
      if (lane.link[i] !== null) lines.push(`launched by CPU op: ${d.names[lane.link[i]]}`);
      if (lane.corr[i] !== null) lines.push(`${lane.kind === "cpu" || lane.kind === "dataloader" ? "external id" : "correlation"} ${lane.corr[i]}`);
    }
    lines.push(`at ${fmtUs(lane.t0[i])} into the step · ${lane.kind === "idle" ? r.lane ? `shaded on ${r.lane.label}` : "cause row" : lane.label}`);
    tip.textContent = lines.join("\n");
    tip.style.display = "block";
    // inside the canvas: left of the pointer near the right edge, above the row near the bottom
    const cw = canvas.clientWidth || 600;
    const ch = canvas.clientHeight || 0;
    const tw = tip.offsetWidth;
    const th = tip.offsetHeight;
    tip.style.left = `${Math.max(0, px + 12 + tw > cw ? px - 12 - tw : px + 12)}px`;
    tip.style.top = `${r.y + r.h + 2 + th > ch && r.y - 2 - th >= 0 ? r.y - 2 - th : r.y + r.h + 2}px`;
  }

  const onResize = () => { if (st.data && stage.isConnected) { draw(); schedule(); } };
  window.addEventListener("resize", onResize);
  // the theme changes (index.js sets data-theme on <html>, following TensorBoard or the OS): redraw
  const onTheme = () => { if (st.data && stage.isConnected) draw(); };
  const themeObs = new MutationObserver(onTheme);
  themeObs.observe(document.documentElement, {attributes: true, attributeFilter: ["data-theme", "class", "style"]});
  if (ctx.signal) ctx.signal.addEventListener("abort", () => {
    window.removeEventListener("resize", onResize);
    themeObs.disconnect();
    window.removeEventListener("mouseup", onMouseUp);
    clearTimeout(st.timer);
    st.seq++;
  }, {once: true});

  load(true);
}

registerPanel({
  id: "timeline",
  label: "Step timeline",
  order: 40,
  section: "timeline", // its place in the section bar (sections.js, judge/layout.py SECTIONS)
  info: "One step on one time axis: CPU threads, DataLoader, CUDA (or HIP) runtime and GPU streams, with the time no kernel ran shaded by its cause (the report's definitions). Default: the slowest included step.",
  render: renderTimeline,
});
