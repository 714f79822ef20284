"""tb_bottleneck_plugin: where a PyTorch training job loses its time.

Data flows one way (each stage is one module):

    storage.py   fsspec access to local paths and gs:// URLs
    discovery.py runs -> workers -> spans (trace files) in a logdir
    loader.py    streaming, typed decoding of one trace file into model.TraceData
    analysis/    pure, vectorised metric functions over TraceData
    report.py    assembles one report object (schema in METRICS.md / metrics §10)
    plugin.py    TensorBoard routes serving reports to static/ (plugin_loader.py is the
                 tiny entry point TensorBoard imports)
    cli.py       `tb-bottlenecks report|demo`

Keep this module import-free: TensorBoard imports the package on start-up.
"""

__version__ = "0.1.0"
