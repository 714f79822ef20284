"""Holistic Trace Analysis's comm/comp overlap on the multi-GPU traces of ../shared/traces.

The oracle for tests/views/test_ranks_hta.py (metrics §12). It needs HTA, which is NOT a
dependency of the project: install it into a separate virtualenv so the project's
environment does not change, then run this script with that interpreter:

    python3 -m venv /tmp/htavenv
    /tmp/htavenv/bin/pip install -q HolisticTraceAnalysis==0.5.0 "pandas<3"
    /tmp/htavenv/bin/python benchmarks/hta_overlap_oracle.py [SHARED_TRACES_DIR]

(HTA 0.5.0 with pandas 3 fails in transform_correlation_to_index: "Invalid value ...
for dtype int16"; pandas 2.3.3 works.) HTA reads a directory of rank files (the rank
from each file's distributedInfo.rank), so each trace is symlinked alone into its own
temporary directory. Prints JSON:
``{"hta_version", "traces": {relative path: {"rank", "comp_comm_overlap_pctg"}}}``
(HTA returns only the percentage, rounded to 2 decimals).

HTA 0.5.0's ``get_comm_comp_overlap`` (hta/analyzers/communication_analysis.py) is, per
rank, over one window (no iterations): the GPU kernels launched before the last
ProfilerStep starts (include_last_profiler_step=False), |merged compute kernels ∩ merged
communication kernels| / |merged communication kernels|, where communication kernels
are GPU events (stream != -1) whose name matches ``^nccl.*Kernel``, memory kernels are
``^Memcpy|^Memset|^dma``, and every other GPU event on a stream is compute.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

TRACES = (
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
)


def main() -> None:
    from hta.trace_analysis import TraceAnalysis

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "traces"
    out = {"hta_version": version("HolisticTraceAnalysis"), "traces": {}}
    for rel in TRACES:
        with tempfile.TemporaryDirectory() as d:
            os.symlink(root / rel, Path(d) / Path(rel).name)
            analysis = TraceAnalysis(trace_dir=d)
            df = analysis.get_comm_comp_overlap(visualize=False)
            (row,) = df.to_dict("records")
            out["traces"][rel] = {
                "rank": int(row["rank"]),
                "comp_comm_overlap_pctg": float(row["comp_comm_overlap_pctg"]),
            }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
