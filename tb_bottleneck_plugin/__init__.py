"""tb_bottleneck_plugin: where a PyTorch training job loses its time.

Data flows one way (docs/ARCHITECTURE.md has the map):

    storage.py     fsspec access to local paths and gs:// URLs
    discovery.py   runs -> workers -> spans (trace files) in a logdir
    loader.py      streaming, typed decoding of one trace file into model.TraceData
    analysis/      pure, vectorised metric units (one module per family, analysis/registry.py)
    report.py      one report per span and the worker/run summaries (from the units' partials);
                   verdicts.py / recommendations.py from thresholds.py
    ranks.py, compare.py   run-level views over span results
    service.py     the analyses behind the routes (scheduler.py, cache.py)
    plugin.py      TensorBoard routes serving reports to static/ (plugin_loader.py is the
                   tiny entry point TensorBoard imports)
    cli.py         `tb-bottlenecks report|diff|check|demo` (text: text_report.py; the demo
                   generator is the separate tb_bottleneck_demo package)
    api.py         the Python API: analyze(), api.compare() (here: compare_runs), Report, DataFrames (pandas, lazily)
    html_report.py the single-file HTML report (`--html FILE`): static/ inlined, data embedded

Keep this module import-free: TensorBoard imports the package on start-up; the API below is
imported only when one of its names is first used (`tb_bottleneck_plugin.analyze`).
"""

__version__ = "0.1.0"

# The Python API (api.py), imported on first use only: TensorBoard imports this package at
# start-up, so it must not pull in the analysis code. `compare_runs` is api.compare, whose
# documented spelling is `from tb_bottleneck_plugin.api import compare` (the package's own
# `compare` is the compare.py module, so the package-level name is the alias).
_API = {"analyze": "analyze", "compare_runs": "compare", "Report": "Report", "Comparison": "Comparison"}


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, _API[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
