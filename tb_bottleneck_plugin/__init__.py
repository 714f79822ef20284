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

Keep this module import-free: TensorBoard imports the package on start-up.
"""

__version__ = "0.1.0"
