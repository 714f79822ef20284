"""Odd traces are safe (issue 20, items 1 and 14): a GPU-only export (kernels and copies,
with or without runtime calls, no CPU operator), CPU ops without ProfilerStep, a trace of
metadata only, and [memory] counters out of range. Every section either answers or says
why in ``not_available``; no exception, no traceback, no numpy warning on stderr."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from tb_bottleneck_plugin import report as report_mod
from tb_bottleneck_plugin.analysis import memory as mem
from tb_bottleneck_plugin.analysis import signals
from tb_bottleneck_plugin.analysis import timeline as tl
from tb_bottleneck_plugin.views import timeline_window as tw
from tb_bottleneck_plugin.trace.loader import load_trace

from trace_builder import V100, TraceBuilder, write_trace

I64_MAX = (1 << 63) - 1
GIB = 1 << 30


def _memcpy(b, ts, dur, corr=-1, kind="HtoD (Pageable -> Device)"):
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {kind}", "pid": 0, "tid": 7, "ts": ts,
                     "dur": dur, "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096}})


def gpu_only(runtime: bool = False) -> TraceBuilder:
    """Four rounds of a kernel and a copy on device 0; ``runtime``: with the launch calls
    and a blocking cudaDeviceSynchronize each (still no CPU operator)."""
    b = TraceBuilder()
    for i in range(4):
        t = 1000 + i * 1000
        if runtime:
            b.launch("volta_sgemm", t, t + 20, 300)
            b.runtime("cudaDeviceSynchronize", t + 30, 400)
            _memcpy(b, t + 510, 50, corr=b.runtime("cudaMemcpyAsync", t + 500, 10))
        else:
            b.kernel("volta_sgemm", t, 300, correlation=i + 1)
            _memcpy(b, t + 400, 50, corr=100 + i)
    return b


def cpu_no_steps() -> TraceBuilder:
    b = TraceBuilder()
    for i in range(4):
        t = 1000 + i * 1000
        b.cpu("aten::mm", t, 200)
        b.launch("volta_sgemm", t + 10, t + 100, 300)
    return b


# Sections known to fail on a GPU-only export, made visible as xfail until fixed; none now
# (source_attribution indexed an empty host table, fixed with source._at).
KNOWN_ELSEWHERE = ()


def _split_known(errors):
    """(other errors, known ones) of a report's errors rows."""
    known = [e for e in errors if e.get("section") in KNOWN_ELSEWHERE]
    return [e for e in errors if e not in known], known


TRACES = {"gpu_only": lambda: gpu_only(False), "gpu_only_runtime": lambda: gpu_only(True),
          "cpu_no_steps": cpu_no_steps}


def _strict(fn, *args, **kwargs):
    """fn(...) with every warning an error: no numpy warning may reach stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_every_section_and_the_timeline_answer(tmp_path, name):
    trace = TRACES[name]().load(tmp_path)
    out = _strict(report_mod.analyze_trace, trace, timeline=True)
    rep = out["report"]
    others, known = _split_known(rep["errors"])
    assert others == [], others
    assert not any("internal error" in str(v) for k, v in rep["not_available"].items()
                   if k.split(".")[0] not in KNOWN_ELSEWHERE), rep["not_available"]
    for section in ("sync", "communication", "launch", "input", "breakdown_pct", "steps", "gpu"):
        assert isinstance(rep[section], dict), section
    store = out["timeline_store"]
    assert isinstance(store, dict)
    body = _strict(tw.window, store, None, None, None, px=1200, cap=tw.DEFAULT_CAP)
    assert body["steps_found"] is False and body["step_us"] > 0
    doc = _strict(tw.chrome_trace, store, None, None, None)
    assert doc["otherData"]["events_exported"] == doc["otherData"]["events_total"] > 0
    json.dumps(rep, allow_nan=False)
    if known:
        pytest.xfail(f"known elsewhere: {known}")


def test_gpu_only_sync_is_measured_and_its_ops_are_na(tmp_path):
    rep = report_mod.analyze_trace(gpu_only(True).load(tmp_path))["report"]
    sync = rep["sync"]
    assert sync["sync_us"] == 1600.0 and sync["calls"] == [{"name": "cudaDeviceSynchronize", "us": 1600.0,
                                                           "count": 4}]
    assert sync["top_ops"] == []
    assert rep["not_available"]["sync.top_ops"] == signals.NO_CPU_OPS
    assert rep["verdicts"]["sync"]["value"] is not None  # the card still reads the share
    # the timeline links no op (there is none), and still draws the runtime and GPU lanes
    store = tl.build_store(gpu_only(True).load(tmp_path, name="again.pt.trace.json"))
    assert (store["ev_link"] == -1).all()
    kinds = {tl.ROW_KINDS[k] for k in store["row_kind"].tolist()}
    assert {"runtime", "gpu", "idle"} <= kinds


def test_op_names_without_cpu_rows(tmp_path):
    trace = gpu_only(True).load(tmp_path)
    assert len(trace.cpu) == 0
    assert signals.op_names(trace, np.array([-1, -1])).tolist() == [-1, -1]
    assert signals.op_names(trace, np.zeros(0, np.int64)).tolist() == []


def test_metadata_only_trace_is_one_line_exit_2(tmp_path):
    path = write_trace(tmp_path / "w.1.pt.trace.json",
                       [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}],
                       props=[V100])
    p = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "not a profiler event" in p.stderr or "profiler event" in p.stderr


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cli_on_gpu_only_runs_is_quiet(tmp_path, jobs):
    run = tmp_path / "run"
    gpu_only(True).write(run / "w0.1.pt.trace.json")
    gpu_only(False).write(run / "w1.1.pt.trace.json")
    known = []
    for args in (["report", str(run), "--jobs", jobs], ["report", str(run), "--jobs", jobs, "--json"],
                 ["report", str(run / "w0.1.pt.trace.json")]):
        p = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", *args], capture_output=True,
                           text=True, timeout=300)
        lines = p.stderr.splitlines()
        known += [x for x in lines if any(f"internal error in {k}:" in x for k in KNOWN_ELSEWHERE)]
        others = [x for x in lines if not any(f"internal error in {k}:" in x for k in KNOWN_ELSEWHERE)]
        assert p.returncode == 0 and others == [], (args, p.stderr)
        assert "Traceback" not in p.stderr
    if known:
        pytest.xfail(f"known elsewhere: {known[0]}")


def test_timeline_route_on_a_gpu_only_run(tmp_path, monkeypatch):
    from tensorboard.backend import application
    from tensorboard.plugins import base_plugin
    from werkzeug import test as wtest
    from werkzeug import wrappers

    from tb_bottleneck_plugin.plugin import BottlenecksPlugin

    monkeypatch.setenv("TB_BOTTLENECKS_ANALYSIS_PROCESSES", "0")
    gpu_only(True).write(tmp_path / "logs" / "gpu" / "worker0.1700000000000.pt.trace.json")
    write_trace(tmp_path / "logs" / "meta" / "worker0.1700000000000.pt.trace.json",
                [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}])
    ns = argparse.Namespace(bottlenecks_cache_dir="none", bottlenecks_rescan_seconds=60.0, logdir_spec="")
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(tmp_path / "logs"), flags=ns))
    client = wtest.Client(application.TensorBoardWSGI([plugin]), wrappers.Response)
    try:
        assert plugin.analyzer.wait_idle(60)
        for route in ("timeline", "step_trace", "report"):
            r = client.get(f"/data/plugin/bottlenecks/{route}", query_string={"run": "gpu"})
            assert r.status_code == 200, (route, r.get_data()[:300])
        body = json.loads(client.get("/data/plugin/bottlenecks/timeline", query_string={"run": "gpu"}).get_data())
        assert body["has_gpu"] is True
        # a trace of metadata only: its own error, not a missing-store guess about Dask
        r = client.get("/data/plugin/bottlenecks/timeline", query_string={"run": "meta"})
        assert r.status_code == 422
        err = json.loads(r.get_data())["error"]
        assert "profiler event" in err and "Dask" not in err
    finally:
        plugin.analyzer.stop()


# ------------------------------------------------------------------ memory counters out of range


def _m(ts, nbytes, alloc=None, reserved=None, dtype=1, did=0):
    args = {"Device Type": dtype, "Device Id": did, "Bytes": nbytes}
    if alloc is not None:
        args.update({"Total Allocated": alloc, "Total Reserved": reserved, "Addr": 1})
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
            "ts": ts, "args": args}


def _mem_trace(tmp_path, events, name="m.pt.trace.json"):
    span = {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 50}
    return load_trace(str(write_trace(tmp_path / name, events + [span], props=[V100])))


def test_total_reserved_of_int64_max_is_na_not_negative(tmp_path):
    trace = _mem_trace(tmp_path, [_m(0, GIB, GIB, 2 * GIB), _m(10, GIB, 2 * GIB, I64_MAX),
                                  _m(30, -GIB, GIB, I64_MAX)])
    out = _strict(report_mod.analyze_trace, trace)
    rep, curves = out["report"], out["memory"]
    d = rep["memory"]["cuda:0"]
    assert d["peak_allocated_bytes"] == 2 * GIB  # allocated is fine: still known
    assert d["peak_reserved_bytes"] is None and d["slack_fragmentation_pct"] is None
    assert d["slack_fragmentation_time_weighted_pct"] is None
    na = rep["not_available"]
    for metric in ("peak_reserved_bytes", "slack_fragmentation_pct", "slack_fragmentation_time_weighted_pct"):
        assert "Total Reserved out of range" in na[f"memory.cuda:0.{metric}"] and str(I64_MAX) in na[
            f"memory.cuda:0.{metric}"]
    curve = curves["devices"]["cuda:0"]
    assert curve["allocated_bytes"] == [GIB, 2 * GIB, GIB]
    assert curve["reserved_bytes"] == [2 * GIB, None, None]  # never a wrapped negative number
    assert all(v is None or v >= 0 for v in curve["reserved_bytes"])
    assert rep["errors"] == []
    json.dumps(out["memory"], allow_nan=False)


def test_total_allocated_out_of_range_and_bytes_only(tmp_path):
    trace = _mem_trace(tmp_path, [_m(0, GIB, GIB, 2 * GIB), _m(10, GIB, I64_MAX, 4 * GIB)])
    rep = _strict(report_mod.analyze_trace, trace)["report"]
    d = rep["memory"]["cuda:0"]
    assert d["peak_allocated_bytes"] is None and d["peak_reserved_bytes"] == 4 * GIB
    assert d["slack_fragmentation_pct"] is None
    assert "Total Allocated out of range" in rep["not_available"]["memory.cuda:0.slack_fragmentation_pct"]
    assert rep["verdicts"]["peak_memory"]["severity"] == "na"
    # 2021 format (signed Bytes only): unknown from the first out-of-range delta on
    trace = _mem_trace(tmp_path, [_m(0, GIB), _m(10, I64_MAX), _m(20, GIB)], name="b.pt.trace.json")
    out = _strict(report_mod.analyze_trace, trace)
    assert out["report"]["memory"]["cuda:0"]["peak_allocated_bytes"] is None
    assert "Bytes out of range" in out["report"]["not_available"]["memory.cuda:0.peak_allocated_bytes"]
    assert out["memory"]["devices"]["cuda:0"]["allocated_bytes"] == [GIB, None, None]


def test_out_of_range_spans_combine_to_na(tmp_path):
    bad = _mem_trace(tmp_path, [_m(0, GIB, GIB, I64_MAX)], name="a.pt.trace.json")
    good = _mem_trace(tmp_path, [_m(0, GIB, GIB, 2 * GIB)], name="b.pt.trace.json")
    results = [_strict(report_mod.analyze_trace, t, run="r", worker="w", span=s) for t, s in ((bad, "a"), (good, "b"))]
    summary = _strict(report_mod.combine_results, results, run="r", worker="w")["report"]
    d = summary["memory"]["cuda:0"]
    assert d["peak_reserved_bytes"] is None and d["peak_allocated_bytes"] == GIB
    assert d["slack_fragmentation_pct"] is None


def test_int_list_and_byte_series():
    assert mem._int_list(np.array([1.0, np.nan, 2.0 ** 63, -1.0])) == [1, None, None, -1]
    series, reason = mem._byte_series(np.array([5, I64_MAX]), "Total Reserved")
    assert np.isnan(series[1]) and series[0] == 5 and "Total Reserved" in reason
    assert mem._byte_series(np.array([5, 6]), "x")[1] is None


def test_cli_prints_no_warning_on_out_of_range_memory(tmp_path):
    write_trace(tmp_path / "w.1.pt.trace.json",
                [_m(0, GIB, GIB, 2 * GIB), _m(10, GIB, 2 * GIB, I64_MAX),
                 {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 50}],
                props=[V100])
    for extra in ([], ["--json"]):
        p = subprocess.run([sys.executable, "-m", "tb_bottleneck_plugin.cli", "report",
                            str(tmp_path / "w.1.pt.trace.json"), *extra], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert "-9223372036854775808" not in p.stdout
