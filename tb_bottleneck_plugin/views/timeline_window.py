"""Step timeline queries (METRICS.md "Step timeline"): answers for one request, read from
a span's stored timeline (``analysis.timeline.build_store``; the store's layout is in that
module's docstring) and never from the trace: the level-of-detail window of a step
(`window`), the step list, and a step's events as a Chrome trace (`chrome_trace`)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..analysis.timeline import (IDLE_CAUSES, IDLE_LABELS, ROW_CPU, ROW_DATALOADER, ROW_GPU, ROW_IDLE,
                                 ROW_KINDS, ROW_RUNTIME, runtime_api, store_names)

DEFAULT_CAP = 4000
# Events in one step_trace export (~180 bytes of JSON each: ~9 MB; a resnet50 step holds
# ~8,700); a trace without ProfilerStep is one window holding every event of the file.
EXPORT_MAX_EVENTS = 50_000


def step_index(store, number: Optional[int]) -> Optional[int]:
    """Index of step ``number``; None for the default: the slowest included step (the
    slowest step at all when none is included). None when the store has no step."""
    nums = store["step_number"]
    if len(nums) == 0:
        return None
    if number is None:
        dur = store["step_end"] - store["step_start"]
        inc = store["step_included"]
        cand = np.flatnonzero(inc) if inc.any() else np.arange(len(nums))
        return int(cand[np.argmax(dur[cand])])
    hit = np.flatnonzero(nums == number)
    return int(hit[0]) if len(hit) else -1


def steps_list(store) -> List[dict]:
    return [{"step": int(n), "duration_us": float(e - s), "included": bool(inc)}
            for n, s, e, inc in zip(store["step_number"], store["step_start"], store["step_end"],
                                    store["step_included"])]


def row_label(kind: int, a: int, b: int, main: int, api: str = "CUDA") -> Tuple[str, str]:
    """(lane group, label) of a row; ``api``: the runtime's name (runtime_api)."""
    if kind == ROW_CPU:
        tid = a & 0xFFFFFFFF
        who = "CPU main thread" if a == main else f"CPU thread {tid}"
        return ("cpu_main" if a == main else "cpu"), (who if b == 0 else f"{who} · depth {b}")
    if kind == ROW_DATALOADER:
        return "dataloader", "DataLoader"
    if kind == ROW_RUNTIME:
        return "runtime", f"{api} runtime (thread {a & 0xFFFFFFFF})"
    if kind == ROW_GPU:
        return "gpu", f"GPU {a} · stream {b}"
    return "idle", f"GPU idle: {IDLE_LABELS[IDLE_CAUSES[b]]}"


def lod(s: np.ndarray, e: np.ndarray, q: float):
    """Level of detail of one row: events (sorted by start, already clipped to the
    window) narrower than ``q`` µs that follow each other with gaps under ``q`` are
    merged into one block. Returns (group id per event, number of groups); a group of
    one event is that event."""
    n = len(s)
    if n == 0:
        return np.zeros(0, np.int64), 0
    small = (e - s) < q
    prev_end = np.maximum.accumulate(e)
    brk = np.ones(n, bool)
    brk[1:] = ~(small[1:] & small[:-1] & (s[1:] - prev_end[:-1] < q))
    gid = np.cumsum(brk) - 1
    return gid, int(gid[-1]) + 1


def window(store, step: Optional[int] = None, t0: Optional[float] = None, t1: Optional[float] = None,
           px: int = 1200, cap: int = DEFAULT_CAP, rows: Optional[List[int]] = None) -> dict:
    """One level-of-detail answer for step number ``step`` (None: the default step) in
    the window [t0, t1] µs from the step start (default: the whole step), drawn ``px``
    pixels wide: per row, rectangles (events, or merged busy blocks with their count and
    busy time), at most ``cap`` rectangles in all (or one per non-empty row when there
    are more such rows than ``cap``). Only the rows with an event in the step are sent
    (see the module docstring; ``hidden_lanes`` counts the others). Raises KeyError for
    an unknown step."""
    i = step_index(store, step)
    if i is None or i < 0:
        raise KeyError(step)
    px = int(min(max(px, 10), 20000))
    cap = int(max(cap, 1))
    base = float(store["step_start"][i])
    span_us = float(store["step_end"][i] - base)
    w0 = 0.0 if t0 is None or not np.isfinite(t0) else float(t0)
    w1 = span_us if t1 is None or not np.isfinite(t1) else float(t1)
    w0, w1 = max(min(w0, span_us), 0.0), max(min(w1, span_us), 0.0)
    if w1 <= w0:
        w0, w1 = 0.0, span_us
    if w1 <= w0:
        w1 = w0 + 1.0
    n_rows = len(store["row_kind"])
    seg_off = store["seg_off"]
    ts, dur = store["ev_ts"], store["ev_dur"]
    sel_rows = list(range(n_rows) if rows is None else rows)
    # the lanes with an event in the step (idle lanes always; the GPU lanes when none has
    # one, so that the step's GPU idle time has a lane to be shaded on)
    kinds = store["row_kind"]
    in_step = [int(seg_off[i * n_rows + r + 1]) > int(seg_off[i * n_rows + r]) for r in sel_rows]
    gpu_busy = any(h_ for r, h_ in zip(sel_rows, in_step) if int(kinds[r]) == ROW_GPU)
    shown = [r for r, h_ in zip(sel_rows, in_step)
             if h_ or int(kinds[r]) == ROW_IDLE or (int(kinds[r]) == ROW_GPU and not gpu_busy)]
    hidden = len(sel_rows) - len(shown)
    per_row = []
    for r in shown:
        a, b = int(seg_off[i * n_rows + r]), int(seg_off[i * n_rows + r + 1])
        s = ts[a:b] - base
        e = s + dur[a:b]
        if b > a:
            run_end = np.maximum.accumulate(e)
            j0 = int(np.searchsorted(run_end, w0, side="right"))
            j0 = min(j0, int(np.searchsorted(s, w0, side="left")))
            j1 = int(np.searchsorted(s, w1, side="left"))
            idx = np.arange(j0, max(j0, j1))
            ss, ee = s[idx], e[idx]
            keep = (ee > w0) | ((ee == ss) & (ss >= w0))
            idx = idx[keep]
            cs, ce = np.clip(s[idx], w0, w1), np.clip(e[idx], w0, w1)
        else:
            idx = np.zeros(0, np.int64)
            cs = ce = np.zeros(0)
        per_row.append((r, a + idx, cs, ce))

    # one block per non-empty row is the coarsest answer that keeps every row's busy time
    cap = max(cap, sum(1 for _, _, cs, _ in per_row if len(cs)))
    q = (w1 - w0) / px  # one pixel
    while True:
        groups = [lod(cs, ce, q) for _, _, cs, ce in per_row]
        total = sum(n for _, n in groups)
        if total <= cap or q > 2 * (w1 - w0):
            break
        q *= 2.0
    if total > cap:  # every row one block at most (rows are far fewer than the cap)
        groups = [(np.zeros(len(cs), np.int64), 1 if len(cs) else 0) for _, _, cs, _ in per_row]

    main = int(store["main_thread"][0])
    api = runtime_api(store)
    built = []
    for (r, ev, cs, ce), (gid, ng) in zip(per_row, groups):
        if ng:
            first = np.searchsorted(gid, np.arange(ng), side="left")
            cnt = np.bincount(gid, minlength=ng)
            single = cnt == 1
            ev_first = ev[first]
            built.append((r, ng, cs[first], np.maximum.reduceat(ce, first), cnt,
                          np.bincount(gid, weights=ce - cs, minlength=ng),
                          np.where(single, store["ev_name"][ev_first], -1),
                          np.where(single, store["ev_link"][ev_first], -1),
                          np.where(single, store["ev_corr"][ev_first], -1)))
        else:
            built.append((r, 0) + (None,) * 7)
    # the answer's own string table: the names of the single events only
    ids = [x for b in built if b[1] for x in (b[6], b[7])]
    used = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    used = used[used >= 0]
    all_names = store_names(store) if len(used) else []
    out_names = [all_names[k] for k in used.tolist()]

    def local(arr):
        pos = np.searchsorted(used, arr)
        return [None if v < 0 else p_ for v, p_ in zip(arr.tolist(), pos.tolist())]

    lanes = []
    n_rects = 0
    for r, ng, t0s, t1s, cnt, busy, nm, lk, co in built:
        kind, a_, b_ = int(store["row_kind"][r]), int(store["row_a"][r]), int(store["row_b"][r])
        group, label = row_label(kind, a_, b_, main, api)
        lane = {"row": int(r), "kind": ROW_KINDS[kind], "group": group, "label": label,
                "t0": [], "t1": [], "count": [], "busy_us": [], "name": [], "link": [], "corr": []}
        if kind == ROW_IDLE:
            lane["cause"] = IDLE_CAUSES[b_]
        if ng:
            lane["t0"] = np.round(t0s, 3).tolist()
            lane["t1"] = np.round(t1s, 3).tolist()
            lane["count"] = cnt.tolist()
            lane["busy_us"] = busy.tolist()
            lane["name"] = local(nm)
            lane["link"] = local(lk)
            lane["corr"] = [None if v < 0 else v for v in co.tolist()]
            n_rects += ng
        lanes.append(lane)

    idle_us = {}
    for r in range(n_rows):
        if int(store["row_kind"][r]) == ROW_IDLE:
            a, b = int(seg_off[i * n_rows + r]), int(seg_off[i * n_rows + r + 1])
            idle_us[IDLE_CAUSES[int(store["row_b"][r])]] = float(dur[a:b].sum())
    return {
        "step": int(store["step_number"][i]), "included": bool(store["step_included"][i]),
        "step_us": span_us, "t0": w0, "t1": w1, "px": px, "cap": cap,
        "detail_us": q, "rects": n_rects, "names": out_names, "lanes": lanes,
        "hidden_lanes": hidden, "runtime_api": api,
        "idle_us": idle_us,
        "idle_pct": {k: (100.0 * v / span_us if span_us > 0 else None) for k, v in idle_us.items()},
        "steps": steps_list(store),
        "steps_found": bool(store["steps_found"][0]),
        "export": _export_info(store, i),
    }


def _export_info(store, i: int) -> dict:
    """What a step_trace export of the whole step ``i`` holds: its event count, the cap,
    whether it is cut, and the note the UI shows (export_note)."""
    n_rows = len(store["row_kind"])
    events = int(store["seg_off"][(i + 1) * n_rows] - store["seg_off"][i * n_rows])
    cap = EXPORT_MAX_EVENTS
    exported = min(events, cap)
    return {"events": events, "max_events": cap, "truncated": exported < events,
            "note": export_note(store, i, events, exported, cap)}


def export_note(store, i: int, events: int, exported: int, cap: Optional[int] = None) -> Optional[str]:
    """What the user should know about an export of step index ``i``: cut by the cap,
    or a trace without ProfilerStep (the whole trace is one window); None otherwise."""
    cap = EXPORT_MAX_EVENTS if cap is None else cap
    notes = []
    if not bool(store["steps_found"][0]):
        notes.append("this trace has no ProfilerStep#N steps: the whole trace is one window")
    if exported < events:
        notes.append(f"{events} events in the window, more than the export cap of {cap}: "
                     f"only the first {exported} (by start time) are exported; zoom in to export a later part")
    return "; ".join(notes) or None


def chrome_trace(store, step: Optional[int] = None, t0: Optional[float] = None, t1: Optional[float] = None,
                 max_events: Optional[int] = None) -> dict:
    """The events of one step as a Chrome trace (Perfetto, chrome://tracing): the stored
    events of the step (idle causes as their own track), times as in the trace, that
    overlap the window [t0, t1] µs from the step start (default: the whole step), at most
    ``max_events`` (EXPORT_MAX_EVENTS) of them: the earliest-starting ones, the cut said
    in ``otherData`` (``events_total``, ``events_exported``, ``truncated``, ``note``)."""
    i = step_index(store, step)
    if i is None or i < 0:
        raise KeyError(step)
    cap = EXPORT_MAX_EVENTS if max_events is None else max(int(max_events), 1)
    n_rows = len(store["row_kind"])
    a, b = int(store["seg_off"][i * n_rows]), int(store["seg_off"][(i + 1) * n_rows])
    names = store_names(store)
    main = int(store["main_thread"][0])
    api = runtime_api(store)
    pids = {"cpu_main": 1, "cpu": 1, "dataloader": 1, "runtime": 1, "gpu": 2, "idle": 3}
    # columns of the step's events, then one dict per event (no per-event numpy access)
    base = float(store["step_start"][i])
    span_us = float(store["step_end"][i]) - base
    w0 = 0.0 if t0 is None or not np.isfinite(t0) else min(max(float(t0), 0.0), span_us)
    w1 = span_us if t1 is None or not np.isfinite(t1) else min(max(float(t1), 0.0), span_us)
    if w1 <= w0:
        w0, w1 = 0.0, span_us
    sel = np.arange(a, b)
    if w0 > 0.0 or w1 < span_us:  # a zoomed window: the events overlapping it
        s_ = store["ev_ts"][a:b] - base
        e_ = s_ + store["ev_dur"][a:b]
        sel = sel[(s_ < w1) & ((e_ > w0) | ((e_ == s_) & (s_ >= w0)))]
    total = len(sel)
    if total > cap:  # the earliest-starting events (a contiguous stretch of time)
        sel = np.sort(sel[np.argsort(store["ev_ts"][sel], kind="stable")[:cap]])
    row = store["ev_row"][sel].astype(np.int64)
    kinds = store["row_kind"].astype(np.int64)
    # metadata only for the lanes (threads) and processes that carry an exported event
    events, used_pids = [], set()
    for r in np.unique(row).tolist():
        group, label = row_label(int(kinds[r]), int(store["row_a"][r]), int(store["row_b"][r]), main, api)
        used_pids.add(pids[group])
        events.append({"ph": "M", "name": "thread_name", "pid": pids[group], "tid": r, "args": {"name": label}})
    for pid, pname in ((1, "host"), (2, "GPU"), (3, "GPU idle causes")):
        if pid in used_pids:
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
    kind = kinds[row]
    label_of_row = {r: IDLE_LABELS[IDLE_CAUSES[int(store["row_b"][r])]] for r in range(n_rows)
                    if int(kinds[r]) == ROW_IDLE}
    pid_of_row = [pids[row_label(int(kinds[r]), int(store["row_a"][r]), 0, main)[0]] for r in range(n_rows)]
    nm = store["ev_name"][sel]
    lk = store["ev_link"][sel]
    co = np.where(np.isin(kind, (ROW_RUNTIME, ROW_GPU)), store["ev_corr"][sel], -1)
    for r, k, t, d, n, l_, c in zip(row.tolist(), kind.tolist(), store["ev_ts"][sel].tolist(),
                                    store["ev_dur"][sel].tolist(), nm.tolist(), lk.tolist(), co.tolist()):
        name = label_of_row[r] if k == ROW_IDLE else (names[n] if n >= 0 else "?")
        ev = {"ph": "X", "name": name, "cat": ROW_KINDS[k], "pid": pid_of_row[r], "tid": r, "ts": t, "dur": d}
        if c >= 0 or l_ >= 0:
            args = {}
            if c >= 0:
                args["correlation"] = c
            if l_ >= 0:
                args["cpu_op"] = names[l_]
            ev["args"] = args
        events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step": int(store["step_number"][i]),
                          "step_start_us": float(store["step_start"][i]),
                          "step_end_us": float(store["step_end"][i]),
                          "steps_found": bool(store["steps_found"][0]),
                          "window_us": [w0, w1],
                          "events_total": total, "events_exported": len(sel), "max_events": cap,
                          "truncated": len(sel) < total,
                          "note": export_note(store, i, total, len(sel), cap)}}
