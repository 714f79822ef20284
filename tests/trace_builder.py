"""Small synthetic Kineto traces for tests: events as the profiler writes them, written
to a file and loaded through the real loader, so every expected number can be checked
by hand from the intervals written in the test."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from tb_bottleneck_plugin.trace.loader import load_trace

V100 = {"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0,
        "totalGlobalMem": 34089730048, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
        "sharedMemPerMultiprocessor": 98304, "numSms": 80, "sharedMemPerBlockOptin": 98304}
A100 = dict(V100, name="NVIDIA A100-SXM4-80GB", computeMajor=8, sharedMemPerMultiprocessor=167936,
            sharedMemPerBlockOptin=166912, numSms=108)
H100 = dict(V100, name="NVIDIA H100 80GB HBM3", computeMajor=9, sharedMemPerMultiprocessor=233472,
            sharedMemPerBlockOptin=232448, numSms=132)
B200 = dict(V100, name="NVIDIA B200", computeMajor=10, sharedMemPerMultiprocessor=233472,
            sharedMemPerBlockOptin=232448, numSms=148, totalGlobalMem=191514935296)
MI250 = {"id": 0, "name": "AMD Instinct MI250X", "computeMajor": 9, "computeMinor": 0, "warpSize": 64,
         "maxThreadsPerMultiprocessor": 2048, "maxSharedMemoryPerMultiProcessor": 65536, "numSms": 110}
MI300 = dict(MI250, name="AMD Instinct MI300X", computeMinor=4, numSms=304)


class TraceBuilder:
    """Append events with the helpers, then ``load(tmp_path)``."""

    def __init__(self, props=(V100,), distributed_info=None):
        self.props = list(props)
        self.distributed_info = distributed_info
        self.events = []
        self._corr = 0

    def cpu(self, name, ts, dur, cat="cpu_op", tid=1, **args):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})
        return self

    def step(self, n, ts, dur):
        return self.cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def runtime(self, name, ts, dur, correlation=None, tid=1):
        if correlation is None:
            self._corr += 1
            correlation = self._corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"correlation": correlation}})
        return correlation

    def kernel(self, name, ts, dur, correlation=-1, device=0, stream=7, **args):
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts,
                            "dur": dur, "args": dict({"device": device, "stream": stream,
                                                      "correlation": correlation}, **args)})
        return self

    def launch(self, name, ts, kernel_ts, kernel_dur, call="cudaLaunchKernel", call_dur=5, **args):
        """A launch call at ``ts`` and the kernel it launched."""
        corr = self.runtime(call, ts, call_dur)
        return self.kernel(name, kernel_ts, kernel_dur, correlation=corr, **args)

    def memory(self, ts, nbytes, addr, total, device=0, device_type=1, reserved=None, tid=1):
        """A ``[memory]`` event as the profiler writes it (``Bytes`` < 0 for a free)."""
        self.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                            "tid": tid, "ts": ts,
                            "args": {"Device Type": device_type, "Device Id": device, "Bytes": nbytes,
                                     "Total Allocated": total, "Addr": addr,
                                     "Total Reserved": total if reserved is None else reserved}})
        return self

    def to_json(self):
        doc = {"schemaVersion": 1, "deviceProperties": self.props, "traceEvents": self.events}
        if self.distributed_info is not None:
            doc["distributedInfo"] = self.distributed_info
        return doc

    def write(self, path):
        """Write the trace to ``path`` (gzipped when it ends in .gz); returns the path."""
        return write_trace(path, self.events, props=self.props, distributed_info=self.distributed_info)

    def load(self, tmp_path, name="t.pt.trace.json"):
        return load_trace(str(self.write(tmp_path / name)))


def write_trace(path, events, props=(), distributed_info=None, **top):
    """A Kineto trace document around ``events`` (plus any extra top-level keys), written to
    ``path`` (parents created; gzipped when the name ends in .gz). Returns the path. For a
    run directory use a profiler-style name: ``<worker>.<ts>.pt.trace.json[.gz]``."""
    path = Path(path)
    doc = {"schemaVersion": 1, "deviceProperties": list(props), "traceEvents": list(events)}
    if distributed_info is not None:
        doc["distributedInfo"] = distributed_info
    doc.update(top)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(doc, f)
    else:
        path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def occupancy_args(pct, bps, grid=(80, 1, 1), block=(256, 1, 1), regs=64, smem=0):
    """The launch arguments Kineto writes on a CUDA kernel."""
    return {"grid": list(grid), "block": list(block), "registers per thread": regs, "shared memory": smem,
            "blocks per SM": bps, "est. achieved occupancy %": pct}


XSS_KERNEL = "<img src=x onerror=alert(1)>"  # a kernel named like an HTML tag
XSS_OP = "<b id=injected>op</b>"             # a CPU operator named like markup


def write_html_names_trace(path, kernel_dur=500):
    """Three 900 µs steps, each with one CPU operator ``XSS_OP`` and one launched kernel
    ``XSS_KERNEL`` of ``kernel_dur`` µs (with Kineto's occupancy arguments): every trace
    string the dashboard shows must stay text. Returns the path."""
    b = TraceBuilder(props=())
    for step in range(3):
        t0 = 1000 + step * 1000
        b.step(step, t0, 900)
        b.cpu(XSS_OP, t0 + 50, 200)
        b.launch(XSS_KERNEL, t0 + 100, t0 + 120, kernel_dur, call_dur=10,
                 **occupancy_args(6, 0.0125, grid=(1, 1, 1), block=(128, 1, 1), regs=32))
    return b.write(path)
