"""tb_bottleneck_plugin: where a PyTorch training job loses its time.

Data flows one way, one folder per stage (docs/ARCHITECTURE.md has the map):

    trace/      storage (fsspec: local paths and gs://), discovery (runs -> workers -> spans),
                loading: text, events, columns, decode workers -> model.TraceData
    analysis/   pure, vectorised metric units (one module per family, analysis/registry.py)
    judge/      verdicts (cards) and recommendations from the report's numbers (thresholds.py)
    report.py   one report per span and the worker/run summaries (units' partials + judge)
    views/      run-level views over span results: compare, ranks, the gate (diff/check),
                terminal text, the single-file HTML report
    serving/    the analyses behind the routes: Analyzer and child processes, scheduler,
                caches, the timeline store, the Dask backend
    plugin.py   TensorBoard routes serving reports to static/ (plugin_loader.py is the tiny
                entry point TensorBoard imports)
    cli.py      `tb-bottlenecks report|diff|check|demo` (the demo generator is the separate
                tb_bottleneck_demo package)
    api.py      the Python API: analyze(), api.compare() (here: compare_runs), Report, DataFrames

Keep this module import-free: TensorBoard imports the package on start-up; the API below is
imported only when one of its names is first used (`tb_bottleneck_plugin.analyze`).
"""

__version__ = "0.1.0"

# The Python API (api.py), imported on first use only: TensorBoard imports this package at
# start-up, so it must not pull in the analysis code. `compare_runs` is api.compare, whose
# documented spelling is `from tb_bottleneck_plugin.api import compare`.
_API = {"analyze": "analyze", "compare_runs": "compare", "Report": "Report", "Comparison": "Comparison"}


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, _API[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
