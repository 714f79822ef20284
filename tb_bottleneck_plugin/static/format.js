// Number formatting and kernel-name shortening. Pure functions, no DOM.

/** A finite number (TensorBoard's JSON turns NaN/Inf into strings). */
export function isNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}

export function fmtPct(v, digits = 1) {
  return isNum(v) ? `${v.toFixed(digits)}%` : "n/a";
}

/** Microseconds -> "12.3 µs" / "45.6 ms" / "1.23 s". */
export function fmtUs(us) {
  if (!isNum(us)) return "n/a";
  const a = Math.abs(us);
  if (a >= 1e6) return `${(us / 1e6).toFixed(2)} s`;
  if (a >= 1e3) return `${(us / 1e3).toFixed(1)} ms`;
  return `${us.toFixed(a >= 100 || Number.isInteger(us) ? 0 : 1)} µs`;
}

/** Microseconds for axis ticks: "150 ms", "2.5 ms", "0". */
export function fmtUsTick(us) {
  if (!isNum(us)) return "";
  if (us === 0) return "0";
  const a = Math.abs(us);
  const trim = (x) => String(Number(x.toFixed(1)));
  if (a >= 1e6) return `${trim(us / 1e6)} s`;
  if (a >= 1e3) return `${trim(us / 1e3)} ms`;
  return `${trim(us)} µs`;
}

/** Decimals that keep about `most` + 1 significant digits: x in [1, 10) -> most, [10, 100) -> most - 1, ... (never < 0). */
function decimals(x, most) {
  if (!(x > 0)) return most;
  return Math.min(most, Math.max(0, most - Math.floor(Math.log10(x))));
}

/** Binary byte units, largest first (fmtBytes; memory_view.js picks axis ticks from them). */
export const BINARY_UNITS = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

/** Milliseconds for axis labels. */
export function fmtMs(ms) {
  if (!isNum(ms)) return "n/a";
  const a = Math.abs(ms);
  if (a >= 1e4) return `${(ms / 1e3).toFixed(0)} s`;
  if (a >= 1e3) return `${(ms / 1e3).toFixed(1)} s`;
  return `${ms.toFixed(Number.isInteger(ms) ? 0 : decimals(a, 1))} ms`;
}

/** A step time in milliseconds as the step model's rows are read: "177.6 ms" (one decimal
 * from 1 ms), "0.73 ms" (two below), "4.7 µs" under 0.1 ms (fmtUs). */
export function fmtStepMs(ms) {
  if (!isNum(ms)) return "n/a";
  const us = Math.abs(ms) * 1e3;
  if (us >= 1e3) return `${ms.toFixed(1)} ms`;
  if (us >= 100) return `${ms.toFixed(2)} ms`;
  return fmtUs(ms * 1e3);
}

/** A step time before and after a change: "46.9 → 21.0 ms" (one unit when both are at least
 * 1 ms), else each with its own unit (fmtStepMs). */
export function fmtStepMsChange(before, after) {
  if (isNum(before) && isNum(after) && Math.abs(before) * 1e3 >= 1e3 && Math.abs(after) * 1e3 >= 1e3) {
    return `${before.toFixed(1)} → ${after.toFixed(1)} ms`;
  }
  return `${fmtStepMs(before)} → ${fmtStepMs(after)}`;
}

/** Bytes in binary units: "4.76 GiB". */
export function fmtBytes(b) {
  if (!isNum(b)) return "n/a";
  const a = Math.abs(b);
  for (const [u, f] of BINARY_UNITS) {
    if (a >= f) return `${(b / f).toFixed(decimals(a / f, 2))} ${u}`;
  }
  return `${b} B`;
}

/** Three significant digits, no exponent: 989, 86.5, 8.64, 0.0234. */
function sig3(x) {
  const a = Math.abs(x);
  if (a >= 100) return x.toFixed(0);
  return x.toFixed(a > 0 ? Math.min(6, Math.max(0, 2 - Math.floor(Math.log10(a)))) : 0);
}

const FLOP_SCALES = [["P", 1e15], ["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]];

/** A FLOP count with its unit scaled: "8.19 GFLOP", "4.92 MFLOP" (never "2.26e-05 TFLOP"). */
export function fmtFlops(flops) {
  if (!isNum(flops)) return "n/a";
  const a = Math.abs(flops);
  for (const [p, f] of FLOP_SCALES) if (a >= f) return `${sig3(flops / f)} ${p}FLOP`;
  return `${sig3(flops)} FLOP`;
}

/** A FLOP rate given in TFLOP/s, its unit scaled: "989 TFLOP/s", "1.85 TFLOP/s", "23.4 GFLOP/s". */
export function fmtFlopRate(tflops) {
  return isNum(tflops) ? `${fmtFlops(tflops * 1e12)}/s` : "n/a";
}

export function fmtCount(n) {
  if (!isNum(n)) return "n/a";
  if (Number.isInteger(n)) return n.toLocaleString("en-US");
  return n.toLocaleString("en-US", {maximumFractionDigits: 2});
}

export function fmtNum(n, digits = 2) {
  if (!isNum(n)) return "n/a";
  if (Number.isInteger(n)) return n.toLocaleString("en-US");
  return n.toLocaleString("en-US", {maximumFractionDigits: digits});
}

function nameTokens(name) {
  return String(name).toLowerCase().split(/[_.\s]+/).filter(Boolean);
}

/** Formats a value by the unit in its JSON name (..._pct, ..._pct_of_..., _us, _ms, _bytes, ...). */
export function fmtByName(name, v) {
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (!isNum(v)) return v === null || v === undefined ? "n/a" : String(v);
  const t = nameTokens(name);
  if (t.includes("pct") || t.includes("percent")) return fmtPct(v);
  const last = t[t.length - 1];
  if (last === "us") return fmtUs(v);
  if (last === "ms") return fmtMs(v);
  if (last === "bytes") return fmtBytes(v);
  return fmtNum(v);
}

const WORDS = {comm: "communication", h2d: "H2D", d2h: "D2H", htod: "HtoD", dtoh: "DtoH", sm: "SM", gpu: "GPU",
  cpu: "CPU", tc: "Tensor Core", num: "number of", dl: "DataLoader", pp: "pp"};

/**
 * A JSON name in words, without its unit (the formatted value carries it):
 * "input_bound_pct" -> "input bound", "comm_pct_of_kernel_time" -> "communication of kernel time".
 */
export function humanizeKey(name) {
  const words = nameTokens(name).filter((w) => !["pct", "percent", "us", "ms", "bytes"].includes(w))
    .map((w) => WORDS[w] || w);
  return words.join(" ") || String(name);
}

/**
 * A not_available key in words when the backend sent no label:
 * "memory.cpu.slack_fragmentation_time_weighted_pct" -> "memory (CPU): slack fragmentation time weighted".
 */
export function readableKey(key) {
  const parts = String(key).split(".");
  const metric = humanizeKey(parts[parts.length - 1]);
  const where = parts.slice(0, -1).map((p) => (/^cuda:\d+$/.test(p) ? p.replace("cuda:", "GPU ") : humanizeKey(p)));
  if (!where.length) return metric.charAt(0).toUpperCase() + metric.slice(1);
  const [area, ...rest] = where;
  return `${area.charAt(0).toUpperCase()}${area.slice(1)}${rest.length ? ` (${rest.join(", ")})` : ""}: ${metric}`;
}

/** A timestamp that may be ms or s since the epoch -> local "YYYY-MM-DD HH:MM:SS", else "". */
export function fmtTimestamp(ts) {
  let n = typeof ts === "string" ? Number(ts) : ts;
  if (!isNum(n) || n <= 0) return "";
  if (n > 1e17) n = n / 1e6; // ns
  else if (n > 1e14) n = n / 1e3; // µs
  else if (n < 1e11) n = n * 1e3; // s
  const d = new Date(n);
  if (Number.isNaN(d.getTime()) || d.getFullYear() < 2000 || d.getFullYear() > 2200) return "";
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** "span 2 · 09:04:12" (time of day from the file name's timestamp), else "span 2". */
export function spanLabel(sp, index) {
  const when = fmtTimestamp(sp && sp.timestamp);
  return `span ${index + 1}${when ? ` · ${when.slice(11)}` : ""}`;
}

/**
 * Shortens a C++ kernel name for a table cell: drops a leading "void ",
 * collapses template arguments to <…> and parameter lists to (…), then
 * truncates. The full name belongs in a title attribute.
 */
export function shortenKernelName(name, max = 72) {
  const full = String(name ?? "");
  let src = full.replace(/^void\s+/, "");
  let out = "";
  let depth = 0;
  let open = "";
  let close = "";
  for (let i = 0; i < src.length; i++) {
    const c = src[i];
    if (depth > 0) {
      if (c === open) depth++;
      else if (c === close) depth--;
      continue;
    }
    const prev = out.length ? out[out.length - 1] : "";
    const identBefore = /[A-Za-z0-9_\]>)]/.test(prev);
    if (c === "<" && identBefore && src[i + 1] !== "<" && src[i + 1] !== "=") {
      depth = 1; open = "<"; close = ">";
      out += "<…>";
      continue;
    }
    if (c === "(" && identBefore) {
      if (src[i + 1] === ")") { out += "()"; i++; continue; }
      depth = 1; open = "("; close = ")";
      out += "(…)";
      continue;
    }
    out += c;
  }
  if (depth > 0) out = src; // unbalanced: do not guess
  out = out.replace(/\s+/g, " ").trim();
  if (out.length > max) out = `${out.slice(0, max - 1)}…`;
  return out || full.slice(0, max);
}
