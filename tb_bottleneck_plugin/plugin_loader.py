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
            "--bottlenecks_rescan_seconds",
            metavar="S",
            type=float,
            default=30.0,
            help="How often the Bottlenecks tab rescans the logdir for new trace files.",
        )

        group.add_argument(
            "--bottlenecks_follow_symlinks",
            action="store_true",
            default=False,
            help="Also follow directory symlinks that point outside the logdir (by default "
            "they are skipped, with a note in the runs listing).",
        )

    def fix_flags(self, flags):
        seconds = getattr(flags, "bottlenecks_rescan_seconds", 30.0)
        if seconds is not None and seconds <= 0:
            raise base_plugin.FlagsError("--bottlenecks_rescan_seconds must be positive")

    def load(self, context):
        from .plugin import BottlenecksPlugin  # heavy imports happen here, not at start-up

        return BottlenecksPlugin(context)
