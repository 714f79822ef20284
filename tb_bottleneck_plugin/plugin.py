"""The Bottlenecks tab: TensorBoard's plugin object (``base_plugin.TBPlugin``).

It builds the engine's long-lived mode (``engine.Analyzer``) from TensorBoard's flags and
hands TensorBoard the routes of routes.py (``get_plugin_apps``); every HTTP handler, the route list and the
error answers are there. Here too: reading the dashboard's files, which sit next to this
module (``_frontend_dir``, ``_static_file``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from tensorboard.plugins import base_plugin

from . import routes
from .analysis import peaks
from .serving.engine import DEFAULT_RESCAN_SECONDS, Analyzer, cache_max_bytes, default_cache_dir, parse_bytes

PLUGIN_NAME = "bottlenecks"  # the tab's name in TensorBoard and in its /data/plugin/<name>/ URLs


def _frontend_dir() -> Optional[Path]:
    """The dashboard's folder, ``tb_bottleneck_plugin/static`` next to this module (in a
    wheel, a source checkout and an editable install alike)."""
    folder = Path(__file__).resolve().parent / "static"
    return folder if (folder / "index.js").is_file() else None


def _static_file(name: str) -> Optional[bytes]:
    """The bytes of the plain file ``name`` directly in the dashboard's folder; None when
    there is none (routes.py has already refused names that are not one plain file name).
    RouteError 404 when this installation lacks the dashboard."""
    folder = _frontend_dir()
    if folder is None:
        raise routes.RouteError(404, routes.NO_DASHBOARD)
    try:
        path = (folder / name).resolve()
        if path.parent != folder.resolve() or not path.is_file():
            return None
        return path.read_bytes()
    except OSError:  # a name the filesystem refuses, a file removed meanwhile
        return None


def _preloaded_static() -> dict:
    """Every dashboard file, read once when TensorBoard loads the plugin (~350 KB): a
    ``pip install`` that replaces or removes the installed package while the server runs
    (README: the test command's ``pip install -e``) no longer blanks the running tab."""
    folder = _frontend_dir()
    if folder is None:
        return {}
    files = {}
    for path in folder.iterdir():
        if path.is_file() and path.suffix in routes.STATIC_TYPES:
            try:
                files[path.name] = path.read_bytes()
            except OSError:
                continue  # read from disk on request instead
    return files


class BottlenecksPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        flags = context.flags
        self._logdir = context.logdir or ""
        self._problem: Optional[str] = None
        if not self._logdir:
            spec = getattr(flags, "logdir_spec", "") if flags else ""
            self._problem = ("--logdir_spec is not supported by the Bottlenecks tab; start TensorBoard "
                             "with --logdir" if spec else "TensorBoard was started without --logdir")
        cache_flag = getattr(flags, "bottlenecks_cache_dir", None) if flags else None
        if cache_flag and cache_flag.lower() == "none":
            cache_dir = None
        else:
            cache_dir = cache_flag or default_cache_dir()
        rescan = getattr(flags, "bottlenecks_rescan_seconds", None) if flags else None
        follow = bool(getattr(flags, "bottlenecks_follow_symlinks", False)) if flags else False
        jobs = getattr(flags, "bottlenecks_analysis_jobs", None) if flags else None
        jobs = jobs if isinstance(jobs, int) and jobs > 0 else None
        memory = getattr(flags, "bottlenecks_analysis_memory", None) if flags else None
        memory = memory if isinstance(memory, str) and memory else None
        dask_address = getattr(flags, "bottlenecks_dask_scheduler", None) if flags else None
        dask_address = dask_address if isinstance(dask_address, str) and dask_address else None
        peak = getattr(flags, "bottlenecks_peak_tflops", None) if flags else None
        if isinstance(peak, str) and peak.strip():
            # Before the Analyzer: its disk cache keys entries by this setting too
            # (cache.analysis_settings), and the analysis processes inherit it.
            os.environ[peaks.ENV_PEAK] = peak.strip()
        cache_mb = getattr(flags, "bottlenecks_cache_max_mb", None) if flags else None
        cache_mb = cache_mb if isinstance(cache_mb, (int, float)) and not isinstance(cache_mb, bool) \
            and 0 < cache_mb < float("inf") else None  # fix_flags refuses others
        self.analyzer = Analyzer(self._logdir, cache_dir=cache_dir, rescan_seconds=rescan or DEFAULT_RESCAN_SECONDS,
                                 cache_max_bytes=cache_max_bytes(cache_mb),
                                 follow_symlinks=follow, max_workers=jobs + 1 if jobs else None,
                                 memory_budget=parse_bytes(memory) if memory else None,
                                 dask_scheduler=dask_address or None) if self._logdir else None
        self._bodies = routes.EncodedBodies()
        self._static = _preloaded_static()

    # ------------------------------------------------------------------ TBPlugin
    def get_plugin_apps(self):
        if self.analyzer is not None:
            # TensorBoard builds its app once, at startup: scan from now on (a background
            # thread), so that runs in the disk cache are ready when the server first answers
            # (warm reopen: ~20 ms to the first report instead of a 202 and a wait for the scan
            # the dashboard's first is_active call would start; benchmarks/bench_first_card.py).
            self.analyzer.start()
        return routes.plugin_apps(self._route_context)

    def _route_context(self) -> routes.RouteContext:
        # built per request: tests replace self.analyzer after TensorBoard took the apps
        return routes.RouteContext(self.analyzer, self._problem, self._bodies, self._read_static)

    def _read_static(self, name: str) -> Optional[bytes]:
        data = self._static.get(name)
        return data if data is not None else _static_file(name)

    def is_active(self) -> bool:
        # Called on every dashboard load: never touch storage here. Until the first
        # background scan finishes, a configured logdir counts as active.
        if self.analyzer is None:
            return False
        state, scanned_at, runs = self.analyzer.activity()  # starts the scan thread, reads state
        if scanned_at is None:
            return True
        return runs > 0 or state == "error"

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Bottlenecks",
                                            disable_reload=False)
