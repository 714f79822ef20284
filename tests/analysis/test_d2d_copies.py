"""Device-to-device copies are judged (issue 20 item 6; METRICS.md §8 "Device-to-device
copies"): a hand-built trace whose every number is written below, and the shared traces,
none of which copies enough to be advised (checked against the raw files)."""
from __future__ import annotations

import glob
import gzip
import json

import pytest

from conftest import TRACES, needs_traces
from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.trace.loader import load_trace

from trace_builder import H100, TraceBuilder

T0 = 1_000_000


def _copy(b: TraceBuilder, op: str, ts: float, dur: float, stream: int, kind="DtoD"):
    """``op`` (enclosing aten::copy_) issues a cudaMemcpyAsync whose copy runs at ``ts``."""
    b.cpu(op, ts - 30, 25, tid=2)  # a second host thread: no overlap with the aten::mm ops
    b.cpu("aten::copy_", ts - 28, 20, tid=2)
    corr = b.runtime("cudaMemcpyAsync", ts - 25, 10, tid=2)
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {kind} (Device -> Device)", "pid": 0,
                     "tid": stream, "ts": ts, "dur": dur,
                     "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": 1 << 20}})


def d2d_trace(contiguous_us=150.0, clone_us=50.0) -> TraceBuilder:
    """Three 1000 µs steps. Each: 20 aten::mm launching a 30 µs kernel (at 40 µs spacing from
    +10: kernels cover [10, 40), [50, 80), ... [770, 800) of the step), an aten::contiguous
    copy of ``contiguous_us`` at +850 (no kernel beside it) and an aten::clone copy of
    ``clone_us`` at +50 on another stream (under the kernels [50, 80) and onwards: hidden for
    the parts overlapping kernels)."""
    b = TraceBuilder(props=(H100,))
    for s in range(3):
        start = T0 + s * 1000
        b.step(s + 1, start, 1000)
        for k in range(20):
            t = start + 10 + k * 40
            b.cpu("aten::mm", t - 5, 20)
            c = b.runtime("cudaLaunchKernel", t - 3, 5)
            b.kernel("sm90_xmma_gemm_bf16", t, 30, correlation=c)
        _copy(b, "aten::contiguous", start + 850, contiguous_us, stream=7)
        _copy(b, "aten::clone", start + 50, clone_us, stream=9, kind="PtoP")
    return b


def test_d2d_copies_measured_and_advised(tmp_path):
    rep = report_mod.analyze_trace(d2d_trace().load(tmp_path))["report"]
    c = rep["copies"]
    # by hand: per step 150 + 50 µs of copies; the clone [50, 100) overlaps kernels [50, 80)
    # -> 20 µs exposed ([80, 90) is a gap between kernels [50,80) and [90,120): 10 µs, and
    # [90, 100) is under a kernel): exposed 150 + 10 = 160 µs per step
    assert c["count"] == 6 and c["bytes"] == 6 << 20
    assert c["d2d_us"] == pytest.approx(3 * 200.0)
    assert c["d2d_exposed_us"] == pytest.approx(3 * 160.0)
    assert c["step_us"] == pytest.approx(3000.0)
    assert c["d2d_pct"] == pytest.approx(20.0) and c["d2d_exposed_pct"] == pytest.approx(16.0)
    assert [(o["op"], o["count"]) for o in c["top_ops"]] == [("aten::contiguous", 3), ("aten::clone", 3)]
    assert c["top_ops"][0]["us"] == pytest.approx(450.0)
    rec = next(r for r in rep["recommendations"] if r["rule"] == "d2d_copies")
    # fired by the copy share (20 % >= D2D_COPY_HIGH_PCT), priced by the step model (§19): the
    # host sets these steps (no sync; its gaps fill each 1000 µs step) and the copies run on
    # their own streams beside it, so removing them saves nothing: "info", never high
    assert rec["rule_estimate_pct"] == pytest.approx(16.0)  # the exposed copy time
    assert rec["what_if"] == "d2d" and rec["estimated_gain_pct"] == pytest.approx(0.0)
    assert rec["severity"] == "info"
    assert rec["evidence"][0] == "aten::contiguous: 0.45 ms in 3 copies"
    for api in (".contiguous()", ".clone()", "torch.cat", "out=", "channels_last", "non_blocking=True"):
        assert api in rec["action"], api
    v = rep["verdicts"]["d2d_copies"]
    # the card takes the rule's severity: the copies hold 20 % of the GPU's time but cost the step nothing
    assert v["severity"] == "info" and v["value"] == pytest.approx(20.0) and v["verdict"] == rec["title"]
    # ranked among the others by the time it saves
    gains = [r["estimated_gain_pct"] or 0 for r in rep["recommendations"]]
    assert gains == sorted(gains, reverse=True)


def test_small_d2d_share_is_not_advised(tmp_path):
    """10 + 5 µs of copies per 1000 µs step: 1.5 % < D2D_COPY_PCT: no advice, an "ok" card."""
    rep = report_mod.analyze_trace(d2d_trace(10.0, 5.0).load(tmp_path))["report"]
    assert rep["copies"]["d2d_pct"] == pytest.approx(1.5)
    assert rep["copies"]["d2d_pct"] < T.D2D_COPY_PCT
    assert "d2d_copies" not in [r["rule"] for r in rep["recommendations"]]
    assert rep["verdicts"]["d2d_copies"]["severity"] == "ok"


def _raw_d2d_us(path: str) -> float:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sum(float(e.get("dur") or 0) for e in events if e.get("cat") in ("gpu_memcpy", "Memcpy")
               and any(w in str(e.get("name")) for w in ("DtoD", "PtoP")))


@needs_traces
@pytest.mark.parametrize("path", sorted(glob.glob(str(TRACES / "**" / "*.json*"), recursive=True)),
                         ids=lambda p: p.split("traces/")[-1][:60])
def test_shared_traces_not_advised_on_copies(path):
    """No real trace copies D2D_COPY_PCT of its steps: no advice. The union counted (inside the
    steps) never exceeds the raw sum of the file's DtoD/PtoP copy durations."""
    if path.endswith(".md"):
        pytest.skip("not a trace")
    rep = report_mod.analyze_trace(load_trace(path))["report"]
    assert "d2d_copies" not in [r["rule"] for r in rep.get("recommendations") or []]
    c = rep.get("copies")
    if c:
        # the loader keeps times to ~1 ns (float32 offsets): allow that per copy
        assert c["d2d_us"] <= _raw_d2d_us(path) * (1 + 1e-4) + 0.01 * c["count"]
        assert c["d2d_exposed_us"] <= c["d2d_us"] + 1e-6
