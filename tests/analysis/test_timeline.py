"""Step timeline (analysis/timeline.py): lanes and idle-cause labels on a hand-built
trace where every interval is known, the level-of-detail merge (exact busy time, never
more than the cap; also on random data), and the Chrome-trace export of one step."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import timeline as tl
from tb_bottleneck_plugin.views import timeline_window as tw
from conftest import TraceBuilder

HTML_NAME = "<img src=x onerror=alert(1)>"
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _step(b: TraceBuilder, n: int, off: float, host_dur: float, dl_dur: float, kernel3: str = "short2"):
    """One step at ``off``; every interval written here is used by hand below."""
    b.step(n, off + 0, host_dur)
    b.cpu(DL, off + 10, dl_dur, cat="user_annotation")
    b.cpu("aten::copy_", off + 320, 80)
    corr = b.runtime("cudaMemcpyAsync", off + 330, 10)
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                     "tid": 7, "ts": off + 345, "dur": 50,
                     "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 1024}})
    b.cpu("aten::conv", off + 400, 200)
    b.launch("conv_k", off + 410, off + 420, 100)
    b.launch("short1", off + 500, off + 530, 5)
    b.launch(kernel3, off + 510, off + 545, 5)
    b.cpu("aten::item", off + 600, 100)
    b.runtime("cudaStreamSynchronize", off + 610, 80)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    b = TraceBuilder()
    _step(b, 1, 0, 1000, 300)
    _step(b, 2, 1000, 800, 100, kernel3=HTML_NAME)
    trace = b.load(tmp_path_factory.mktemp("tl"))
    return trace, tl.build_store(trace)


def _lane(w, label):
    hits = [lane for lane in w["lanes"] if lane["label"] == label]
    assert len(hits) == 1, [lane["label"] for lane in w["lanes"]]
    return hits[0]


def _events(w, lane):
    return [(round(a, 3), round(b, 3), w["names"][n] if n is not None else None)
            for a, b, n in zip(lane["t0"], lane["t1"], lane["name"])]


def test_lanes_of_the_hand_built_step(hand):
    _, store = hand
    w = tw.window(store, 1, px=100000)  # every event wider than a pixel: no merging
    assert w["step"] == 1 and w["step_us"] == 1000 and w["included"]
    assert _events(w, _lane(w, "CPU main thread")) == [
        (320, 400, "aten::copy_"), (400, 600, "aten::conv"), (600, 700, "aten::item")]
    assert _events(w, _lane(w, "DataLoader")) == [(10, 310, DL)]
    assert _events(w, _lane(w, "CUDA runtime (thread 1)")) == [
        (330, 340, "cudaMemcpyAsync"), (410, 415, "cudaLaunchKernel"), (500, 505, "cudaLaunchKernel"),
        (510, 515, "cudaLaunchKernel"), (610, 690, "cudaStreamSynchronize")]
    gpu = _lane(w, "GPU 0 · stream 7")
    assert _events(w, gpu) == [(345, 395, "Memcpy HtoD (Pageable -> Device)"), (420, 520, "conv_k"),
                               (530, 535, "short1"), (545, 550, "short2")]
    # hover: the CPU op that launched each GPU activity (through the correlation)
    assert [w["names"][k] for k in gpu["link"]] == ["aten::copy_", "aten::conv", "aten::conv", "aten::conv"]
    assert all(c is not None for c in gpu["corr"])
    # the step span itself is the axis, not a lane event; no DataLoader on the CPU lane
    assert all("ProfilerStep" not in n for n in w["names"])


def test_idle_causes_of_the_hand_built_step(hand):
    trace, store = hand
    w = tw.window(store, 1, px=100000)
    # kernels [420,520] [530,535] [545,550]: idle = [0,420] [520,530] [535,545] [550,1000]
    want = {"h2d_copy": [(345, 395)],                      # the HtoD copy, no kernel under it
            "input_wait": [(10, 310)],                     # DataLoader, nothing else busy
            "sync": [(610, 690)],                          # cudaStreamSynchronize, GPU idle
            "launch": [(535, 545)],                        # gap between two short kernels
            # runtime calls while no kernel runs are not a cause of their own: "other"
            "other": [(0, 10), (310, 345), (395, 420), (520, 530), (550, 610), (690, 1000)]}
    for cause, spans in want.items():
        lane = _lane(w, "GPU idle: " + tl.IDLE_LABELS[cause])
        assert lane["cause"] == cause
        assert [(a, b) for a, b, _ in _events(w, lane)] == spans, cause
        assert w["idle_us"][cause] == sum(b - a for a, b in spans)
    assert w["idle_us"] == {"h2d_copy": 50, "input_wait": 300, "sync": 80, "launch": 10, "other": 450}
    assert sum(w["idle_us"].values()) == 1000 - 110  # the step minus Union(kernels)
    # the shaded input wait is the report's input-bound % of that step, exactly
    rep = report.analyze_trace(trace)["report"]
    per = {p["step"]: p for p in rep["input"]["per_step"]}
    assert w["idle_pct"]["input_wait"] == pytest.approx(per[1]["input_bound_pct"]) == pytest.approx(30.0)
    w2 = tw.window(store, 2, px=100000)
    assert w2["idle_us"]["input_wait"] == 100
    assert w2["idle_pct"]["input_wait"] == pytest.approx(per[2]["input_bound_pct"])


def test_default_step_is_the_slowest_included(hand):
    _, store = hand
    assert tw.window(store)["step"] == 1  # 1000 µs vs 800 µs
    assert [s["step"] for s in tw.window(store)["steps"]] == [1, 2]
    with pytest.raises(KeyError):
        tw.window(store, 99)


def test_lod_merges_subpixel_events_keeping_count_and_busy_time(hand):
    _, store = hand
    w = tw.window(store, 1, px=10)  # 100 µs per pixel
    gpu = _lane(w, "GPU 0 · stream 7")
    assert sum(gpu["count"]) == 4 and sum(gpu["busy_us"]) == pytest.approx(160)
    # [345,395] is narrower than a pixel and 25 µs from the conv kernel: one block with it?
    # conv_k (100 µs) is one pixel wide: kept as itself; the short ones merge into one block
    assert (530, 550) in [(a, b) for a, b in zip(gpu["t0"], gpu["t1"])]
    block = [i for i, (a, b) in enumerate(zip(gpu["t0"], gpu["t1"])) if (a, b) == (530, 550)][0]
    assert gpu["count"][block] == 2 and gpu["busy_us"][block] == pytest.approx(10) and gpu["name"][block] is None
    # zoom: the window [500, 600] at 100 px shows both short kernels on their own again
    z = tw.window(store, 1, t0=500, t1=600, px=100)
    gz = _lane(z, "GPU 0 · stream 7")
    assert _events(z, gz) == [(500, 520, "conv_k"), (530, 535, "short1"), (545, 550, "short2")]
    assert sum(gz["busy_us"]) == pytest.approx(30)  # conv_k clipped to the window


def _random_trace(tmp_path, seed, n):
    rnd = random.Random(seed)
    b = TraceBuilder()
    b.step(1, 0, 100000)
    truth = {}
    for stream in (7, 13):
        t = 0.0
        spans = []
        for _ in range(n):
            t += rnd.expovariate(1 / 20.0)
            d = rnd.choice([0.0, rnd.uniform(0.1, 3), rnd.uniform(1, 50), rnd.uniform(50, 2000)])
            if t + d > 99000:
                break
            b.launch(f"k{rnd.randrange(30)}", 10, t, d)
            spans.append((t, t + d))
            t += d
        truth[stream] = spans
        # launches live in one runtime row; kernels on stream `stream`
        for ev in b.events:
            if ev["cat"] == "kernel" and "done" not in ev["args"]:
                ev["args"]["stream"] = stream
                ev["tid"] = stream
                ev["args"]["done"] = 1
    return b.load(tmp_path), truth


@pytest.mark.parametrize("seed", range(6))
def test_lod_property_random(tmp_path, seed):
    trace, truth = _random_trace(tmp_path, seed, 3000)
    store = tl.build_store(trace)
    rnd = random.Random(1000 + seed)
    for _ in range(25):
        a = rnd.uniform(-100, 100000)
        b = rnd.uniform(a, 100500) if rnd.random() < 0.8 else a + rnd.uniform(0, 50)
        px = rnd.choice([10, 100, 800, 1600, 5000])
        cap = rnd.choice([5, 50, 400, 4000])
        w = tw.window(store, 1, t0=a, t1=b, px=px, cap=cap)
        nonempty = sum(1 for lane in w["lanes"] if lane["t0"])
        assert w["rects"] <= max(cap, nonempty)
        if cap < nonempty:
            assert all(len(lane["t0"]) <= 1 for lane in w["lanes"])
        lo, hi = w["t0"], w["t1"]
        for stream, spans in truth.items():
            lane = _lane(w, f"GPU 0 · stream {stream}")
            want_busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)
            want_count = sum(1 for s, e in spans if s < hi and (e > lo or (e == s and s >= lo)))
            assert sum(lane["busy_us"]) == pytest.approx(want_busy, abs=1e-6)
            assert sum(lane["count"]) == want_count
            # rectangle ends are rounded to 1 ns for the wire
            assert all(lo - 1e-3 <= x <= y <= hi + 1e-3 for x, y in zip(lane["t0"], lane["t1"]))
        total = sum(len(lane["t0"]) for lane in w["lanes"])
        assert total == w["rects"]


def test_lod_cap_smaller_than_rows_still_bounded(hand):
    _, store = hand
    w = tw.window(store, 1, px=100000, cap=3)
    # more non-empty rows than the cap: each row one block at most, busy time kept
    assert all(len(lane["t0"]) <= 1 for lane in w["lanes"])
    assert w["rects"] == sum(1 for lane in w["lanes"] if lane["t0"]) > 3
    assert sum(sum(lane["busy_us"]) for lane in w["lanes"] if lane["kind"] == "idle") == pytest.approx(890)


def test_chrome_trace_export_has_only_that_step(hand):
    _, store = hand
    doc = json.loads(json.dumps(tw.chrome_trace(store, 2)))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert xs and all(1000 <= e["ts"] and e["ts"] + e["dur"] <= 1800 for e in xs)
    names = {e["name"] for e in xs}
    assert HTML_NAME in names and "short2" not in names  # step 2's own third kernel
    assert {"conv_k", "aten::conv", DL, "cudaStreamSynchronize", "waiting for input"} <= names
    conv = [e for e in xs if e["name"] == "conv_k"][0]
    assert conv["args"]["cpu_op"] == "aten::conv" and isinstance(conv["args"]["correlation"], int)
    # thread names name the lanes
    meta = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert {"DataLoader", "GPU 0 · stream 7", "CPU main thread"} <= meta
    assert doc["otherData"]["step"] == 2


def test_store_round_trips_through_npz(hand, tmp_path):
    _, store = hand
    path = tmp_path / "s.npz"
    np.savez(path, **store)
    with np.load(path, allow_pickle=False) as z:
        back = {k: z[k] for k in z.files}
    assert tw.window(back, 1) == tw.window(store, 1)
    assert HTML_NAME in tl.store_names(back)


def test_store_from_the_report_context_is_the_same_and_computed_once(hand, monkeypatch):
    """analyze_trace(timeline=True) builds the store from the report's per-span context:
    the same arrays as a standalone build, the category unions made once (shared with the
    step partition), and the shaded input wait is still the report's input-bound % per step."""
    from tb_bottleneck_plugin.analysis import breakdown

    trace, alone = hand
    calls = []
    real = breakdown.cumulative_unions
    monkeypatch.setattr(breakdown, "cumulative_unions", lambda t: calls.append(1) or real(t))
    monkeypatch.setattr(tl, "cumulative_unions", lambda t: calls.append(1) or real(t))
    out = report.analyze_trace(trace, timeline=True)
    assert len(calls) == 1  # partition and idle causes cut the same unions
    store = out["timeline_store"]
    assert set(store) == set(alone) and all(np.array_equal(store[k], alone[k]) for k in alone)
    per = {p["step"]: p["input_bound_pct"] for p in out["report"]["input"]["per_step"]}
    assert per == pytest.approx({1: 30.0, 2: 12.5})
    for n, want in per.items():
        assert tw.window(store, n, px=100000)["idle_pct"]["input_wait"] == pytest.approx(want)
    assert "timeline_store" not in report.analyze_trace(trace)  # only when asked for


def test_export_window_and_cap(hand):
    """step_trace exports the events overlapping the asked window, at most max_events of
    them (the earliest-starting), and says so in otherData."""
    _, store = hand
    full = tw.chrome_trace(store, 1)
    xs = [e for e in full["traceEvents"] if e["ph"] == "X"]
    od = full["otherData"]
    assert od["events_total"] == od["events_exported"] == len(xs) and not od["truncated"] and od["note"] is None
    assert od["window_us"] == [0.0, 1000.0] and od["steps_found"] is True
    assert tw.window(store, 1)["export"] == {"events": len(xs), "max_events": tw.EXPORT_MAX_EVENTS,
                                             "truncated": False, "note": None}
    # window [500, 600] µs of step 1: by hand, every stored event overlapping it
    z = tw.chrome_trace(store, 1, 500, 600)
    zx = [e for e in z["traceEvents"] if e["ph"] == "X"]
    want = sorted((e["name"], e["ts"]) for e in xs if e["ts"] < 600 and e["ts"] + e["dur"] > 500)
    assert sorted((e["name"], e["ts"]) for e in zx) == want
    assert {"aten::conv", "conv_k", "short1", "short2", "launch-bound (short kernels)"} <= {n for n, _ in want}
    assert "aten::item" not in {n for n, _ in want}  # starts at 600
    # the cap: the 5 earliest-starting events, and the note says what was cut
    c = tw.chrome_trace(store, 1, max_events=5)
    cx = [e for e in c["traceEvents"] if e["ph"] == "X"]
    assert len(cx) == 5 == c["otherData"]["events_exported"] and c["otherData"]["truncated"]
    assert sorted(e["ts"] for e in cx) == sorted(e["ts"] for e in xs)[:5]
    assert c["otherData"]["events_total"] == len(xs) and "export cap of 5" in c["otherData"]["note"]


def test_trace_without_steps_is_one_window_said_everywhere(tmp_path):
    b = TraceBuilder()
    b.cpu(DL, 0, 300, cat="user_annotation")
    b.cpu("aten::conv", 400, 200)
    b.launch("conv_k", 410, 420, 100)
    trace = b.load(tmp_path)
    store = tl.build_store(trace)
    w = tw.window(store, px=100000)
    assert w["steps_found"] is False and len(w["steps"]) == 1
    assert "no ProfilerStep" in w["export"]["note"] and not w["export"]["truncated"]
    doc = tw.chrome_trace(store)
    assert doc["otherData"]["steps_found"] is False and "no ProfilerStep" in doc["otherData"]["note"]
    assert {"aten::conv", "conv_k", DL} <= {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}


# ----------------------------------------------------------------------------- HIP and empty lanes

ROCM_TRACES = {  # ../shared/traces ROCm traces: (path, the runtime threads of the default step)
    "mi300": "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "mi250": "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}


def _rocm_store(key):
    from conftest import TRACES
    from tb_bottleneck_plugin.trace.loader import load_trace

    path = TRACES / ROCM_TRACES[key]
    if not path.exists():
        pytest.skip(f"../shared/traces/{ROCM_TRACES[key]} is missing")
    return tl.build_store(load_trace(str(path)))


@pytest.mark.parametrize("key", sorted(ROCM_TRACES))
def test_runtime_lane_is_named_hip_on_rocm_traces(key):
    store = _rocm_store(key)
    w = tw.window(store)
    rt = [lane for lane in w["lanes"] if lane["kind"] == "runtime"]
    assert rt and w["runtime_api"] == "HIP"
    assert all(lane["label"].startswith("HIP runtime (thread ") for lane in rt), [lane["label"] for lane in rt]
    assert not any("CUDA" in lane["label"] for lane in w["lanes"])
    # the calls on those lanes are hip* calls (what the label says)
    names = {w["names"][n] for lane in rt for n in lane["name"] if n is not None}
    assert names and all(n.startswith("hip") for n in names), names
    meta = [e["args"]["name"] for e in tw.chrome_trace(store)["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(m.startswith("HIP runtime") for m in meta) and not any(m.startswith("CUDA runtime") for m in meta)


def test_runtime_api_from_call_names_props_and_old_stores(hand, tmp_path):
    _, cuda_store = hand
    assert tw.window(cuda_store, 1)["runtime_api"] == "CUDA"
    # hip* calls without deviceProperties: HIP by the names
    b = TraceBuilder(props=())
    b.step(1, 0, 1000)
    b.cpu("aten::mm", 100, 300)
    b.launch("Cijk_Ailk_Bljk_SB_MT64x64x16_MI16x16x1", 110, 200, 100, call="hipLaunchKernel")
    b.runtime("hipDeviceSynchronize", 400, 50)
    store = tl.build_store(b.load(tmp_path))
    w = tw.window(store, 1, px=100000)
    assert w["runtime_api"] == "HIP"
    assert _events(w, _lane(w, "HIP runtime (thread 1)")) == [
        (110, 115, "hipLaunchKernel"), (400, 450, "hipDeviceSynchronize")]
    # no runtime call at all: the device's vendor says
    b = TraceBuilder(props=({"id": 0, "name": "AMD Instinct MI300X", "warpSize": 64},))
    b.step(1, 0, 1000)
    b.kernel("k", 100, 50)
    assert tw.window(tl.build_store(b.load(tmp_path, "amd.pt.trace.json")))["runtime_api"] == "HIP"
    # a store written before runtime_api existed: from its runtime events' names
    old = {k: v for k, v in store.items() if k != "runtime_api"}
    assert tw.window(old, 1, px=100000) == w
    old_cuda = {k: v for k, v in cuda_store.items() if k != "runtime_api"}
    assert tw.window(old_cuda, 1)["runtime_api"] == "CUDA"


def _second_thread_busy_in_step_2_only():
    """Step 1: a conv on the main thread and its kernel; step 2: an add on the main thread
    and a region on CPU thread 2 (thread 2 has nothing in step 1)."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.cpu("aten::conv", 100, 200)
    b.launch("conv_k", 110, 120, 100)
    b.step(2, 1000, 1000)
    b.cpu("aten::add", 1100, 100)
    b.cpu("worker_region", 1500, 200, tid=2)
    return b


def test_lanes_without_an_event_in_the_step_are_not_sent(tmp_path):
    """A thread busy in step 2 only: no lane in step 1 (counted in hidden_lanes), its lanes in
    step 2, kept when zoomed into a stretch of step 2 where it has nothing; a step with no GPU
    activity keeps the GPU lane (the idle time is shaded on it); idle lanes always sent."""
    b = _second_thread_busy_in_step_2_only()
    b.cpu("aten::mul", 1550, 50, tid=2)  # depth 1 of thread 2
    trace = b.load(tmp_path)
    store = tl.build_store(trace)
    labels2 = ["CPU main thread", "CPU thread 2", "CPU thread 2 · depth 1", "DataLoader",
               "CUDA runtime (thread 1)", "GPU 0 · stream 7"]
    idle = [f"GPU idle: {tl.IDLE_LABELS[c]}" for c in tl.IDLE_CAUSES]
    assert len(store["row_kind"]) == len(labels2) + len(idle)

    w1 = tw.window(store, 1, px=100000)
    assert [lane["label"] for lane in w1["lanes"]] == [
        "CPU main thread", "CUDA runtime (thread 1)", "GPU 0 · stream 7"] + idle
    assert w1["hidden_lanes"] == 3  # thread 2 (two depths) and the DataLoader: nothing in step 1
    assert all(lane["t0"] for lane in w1["lanes"] if lane["kind"] != "idle")

    w2 = tw.window(store, 2, px=100000)
    # step 2 launches nothing: the runtime lane goes, the GPU lane stays (empty, shaded "other")
    assert [lane["label"] for lane in w2["lanes"]] == [
        "CPU main thread", "CPU thread 2", "CPU thread 2 · depth 1", "GPU 0 · stream 7"] + idle
    assert w2["hidden_lanes"] == 2 and not _lane(w2, "GPU 0 · stream 7")["t0"]
    assert w2["idle_us"]["other"] == pytest.approx(1000)
    # zoomed into [0, 300] µs of step 2: thread 2 has nothing there, its lanes stay
    z = tw.window(store, 2, t0=0, t1=300, px=1000)
    assert [lane["label"] for lane in z["lanes"]] == [lane["label"] for lane in w2["lanes"]]
    assert not _lane(z, "CPU thread 2")["t0"] and _lane(z, "CPU main thread")["t0"]
    assert z["hidden_lanes"] == 2


def test_mi300_slowest_step_sends_no_empty_lane():
    """QA: on the MI300 trace the slowest step drew 8 CPU lanes with nothing in them."""
    store = _rocm_store("mi300")
    w = tw.window(store)
    n_rows = len(store["row_kind"])
    i = tw.step_index(store, w["step"])
    # independent of window(): the rows with an event in the step, from the store's offsets
    busy = [r for r in range(n_rows) if store["seg_off"][i * n_rows + r + 1] > store["seg_off"][i * n_rows + r]]
    kinds = store["row_kind"]
    want = sorted(set(busy) | {r for r in range(n_rows) if kinds[r] == tl.ROW_IDLE})
    assert [lane["row"] for lane in w["lanes"]] == want
    assert w["hidden_lanes"] == n_rows - len(want) >= 8
    assert all(lane["t0"] for lane in w["lanes"] if lane["kind"] != "idle")
    assert sum(1 for r in range(n_rows) if kinds[r] == tl.ROW_CPU) >= 8  # the lanes the QA saw
    # the LOD invariants hold on what is sent
    for px, cap in ((50, 10), (1200, 4000)):
        v = tw.window(store, w["step"], px=px, cap=cap)
        assert v["rects"] == sum(len(lane["t0"]) for lane in v["lanes"]) <= max(cap, len(v["lanes"]))
        for lane in v["lanes"]:
            whole = next(x for x in w["lanes"] if x["row"] == lane["row"])
            assert sum(lane["busy_us"]) == pytest.approx(sum(whole["busy_us"]), rel=1e-9, abs=1e-6)


def test_export_names_only_the_lanes_that_carry_events(tmp_path):
    """The step_trace export lists thread_name (and process_name) metadata only for lanes
    with an exported event: a thread busy in step 2 only is not named in step 1's export,
    and a zoomed window names only the lanes with an event in it. Hand-built: every event
    and its lane known."""
    store = tl.build_store(_second_thread_busy_in_step_2_only().load(tmp_path))

    def meta(doc, what):
        return sorted(e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == what)

    def lanes_with_events(doc):
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
        assert used <= set(names), "an exported event on an unnamed lane"
        return sorted(names[k] for k in used)

    d1 = tw.chrome_trace(store, 1)
    # step 1: the main thread (step span, conv), the runtime call, the kernel, and the idle
    # causes of the GPU's 900 µs without a kernel (the step's own interval is its only cause)
    want1 = ["CPU main thread", "CUDA runtime (thread 1)", "GPU 0 · stream 7"]
    assert [m for m in meta(d1, "thread_name") if not m.startswith("GPU idle")] == want1
    assert meta(d1, "thread_name") == lanes_with_events(d1)
    assert "CPU thread 2" not in meta(d1, "thread_name") and "DataLoader" not in meta(d1, "thread_name")
    assert meta(d1, "process_name") == ["GPU", "GPU idle causes", "host"]

    d2 = tw.chrome_trace(store, 2)
    assert [m for m in meta(d2, "thread_name") if not m.startswith("GPU idle")] == \
        ["CPU main thread", "CPU thread 2"]  # no kernel, no runtime call in step 2
    assert meta(d2, "thread_name") == lanes_with_events(d2)
    assert meta(d2, "process_name") == ["GPU idle causes", "host"]  # no GPU event in step 2

    # zoomed into [450, 750] µs of step 2: only thread 2's region (and the idle track) overlap it
    # (the ProfilerStep span is the step itself, not an event of a lane)
    z = tw.chrome_trace(store, 2, 450, 750)
    assert [m for m in meta(z, "thread_name") if not m.startswith("GPU idle")] == ["CPU thread 2"]
    assert meta(z, "thread_name") == lanes_with_events(z)
    z2 = tw.chrome_trace(store, 2, 800, 900)  # nothing but the GPU's idle time
    assert meta(z2, "thread_name") == lanes_with_events(z2) == ["GPU idle: other"]
    assert meta(z2, "process_name") == ["GPU idle causes"]
