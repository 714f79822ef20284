"""TensorBoard's entry point for the Bottlenecks tab: deliberately tiny.

TensorBoard imports every `tensorboard_plugins` entry point at start-up and refuses to
start if one fails to import, so this module imports only TensorBoard's base_plugin.
numpy, msgspec and fsspec are imported in `load()`, when TensorBoard builds the
plugin, and a failure there only disables this tab (TensorBoard logs it and goes on).
"""
from tensorboard.plugins import base_plugin


class BottlenecksLoader(base_plugin.TBLoader):
    def define_flags(self, parser):
        group = parser.add_argument_group("bottlenecks plugin")
        group.add_argument(
            "--bottlenecks_cache_dir",
            metavar="DIR",
            default=None,
            help="Where the Bottlenecks tab keeps analysed reports between restarts "
            "(default: ~/.cache/tb_bottleneck_plugin; 'none' disables the disk cache).",
        )
        group.add_argument(
            "--bottlenecks_cache_max_mb",
            metavar="MB",
            type=float,
            default=None,
            help="Size bound of that disk cache in MiB; the least recently used reports are "
            "evicted beyond it (default: $TB_BOTTLENECKS_CACHE_MAX_MB, else 512, about 1,000 "
            "resnet50-sized spans).",
        )
        group.add_argument(
            "--bottlenecks_rescan_seconds",
            metavar="S",
            type=float,
            default=30.0,  # serving/engine.py DEFAULT_RESCAN_SECONDS (this module imports nothing of ours)
            help="How often the Bottlenecks tab rescans the logdir for new trace files (default 30).",
        )

        group.add_argument(
            "--bottlenecks_follow_symlinks",
            action="store_true",
            default=False,
            help="Also follow directory symlinks that point outside the logdir (by default "
            "they are skipped, with a note in the runs listing).",
        )

        group.add_argument(
            "--bottlenecks_analysis_jobs",
            metavar="N",
            type=int,
            default=None,
            help="Spans the Bottlenecks tab analyses at once, one process each (default: the "
            "number of cores, plus one kept free for the run you open).",
        )
        group.add_argument(
            "--bottlenecks_analysis_memory",
            metavar="SIZE",
            default=None,
            help="Memory the concurrent analyses may use together, e.g. 8G or 512M (default: "
            "$TB_BOTTLENECKS_ANALYSIS_MEMORY, else half the machine's memory). Each analysis "
            "reserves about 0.8x its trace's uncompressed JSON size.",
        )
        group.add_argument(
            "--bottlenecks_dask_scheduler",
            metavar="ADDRESS",
            default=None,
            help="Analyse spans on an existing Dask cluster (e.g. tcp://scheduler:8786; needs "
            "dask[distributed]). Workers read the traces themselves. If it cannot be reached, "
            "spans are analysed locally and the runs listing says so.",
        )
        group.add_argument(
            "--bottlenecks_peak_tflops",
            metavar="PEAK",
            default=None,
            help="The GPU's dense peak for MFU and the roofline when the built-in table does not "
            "know it (or to override it): TFLOP/s for every precision (989) or per precision, hbm "
            "in GB/s (bf16=989,fp32=67,hbm=3350). Sets $BOTTLENECKS_PEAK_TFLOPS for the analysis; "
            "cached reports made with another peak are analysed again.",
        )

    def fix_flags(self, flags):
        seconds = getattr(flags, "bottlenecks_rescan_seconds", 30.0)
        if seconds is not None and seconds <= 0:
            raise base_plugin.FlagsError("--bottlenecks_rescan_seconds must be positive")
        cache_mb = getattr(flags, "bottlenecks_cache_max_mb", None)
        if cache_mb is not None and not 0 < cache_mb < float("inf"):
            raise base_plugin.FlagsError("--bottlenecks_cache_max_mb must be a positive number of MiB")
        jobs = getattr(flags, "bottlenecks_analysis_jobs", None)
        if jobs is not None and jobs <= 0:
            raise base_plugin.FlagsError("--bottlenecks_analysis_jobs must be positive")
        memory = getattr(flags, "bottlenecks_analysis_memory", None)
        if memory:
            from .serving.scheduler import parse_bytes  # stdlib only

            try:
                parse_bytes(memory)
            except ValueError as exc:
                raise base_plugin.FlagsError(f"--bottlenecks_analysis_memory: {exc}")

        peak = getattr(flags, "bottlenecks_peak_tflops", None)
        if peak:
            from .analysis.peaks import user_peaks  # stdlib only

            if user_peaks(peak) is None:
                raise base_plugin.FlagsError(
                    f"--bottlenecks_peak_tflops: expected TFLOP/s (989) or precision=value pairs "
                    f"(bf16=989,fp32=67,hbm=3350), got {peak!r}")

    def load(self, context):
        from .plugin import BottlenecksPlugin  # heavy imports happen here, not at start-up

        return BottlenecksPlugin(context)
