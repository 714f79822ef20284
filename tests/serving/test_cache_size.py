"""The disk cache's size bound is a setting (issue 14: the default 512 MiB holds only
~1,000 span results): --bottlenecks_cache_max_mb, else $TB_BOTTLENECKS_CACHE_MAX_MB."""
import argparse
import json

import pytest
from tensorboard.plugins import base_plugin

from tb_bottleneck_plugin.serving import cache
from tb_bottleneck_plugin.plugin import BottlenecksPlugin
from tb_bottleneck_plugin.plugin_loader import BottlenecksLoader


def test_bound_from_flag_env_or_default(monkeypatch):
    monkeypatch.delenv(cache.CACHE_MAX_ENV, raising=False)
    assert cache.cache_max_bytes() == 512 * 2**20
    assert cache.cache_max_bytes(2048) == 2048 * 2**20
    monkeypatch.setenv(cache.CACHE_MAX_ENV, "1.5")
    assert cache.cache_max_bytes() == int(1.5 * 2**20)
    assert cache.cache_max_bytes(10) == 10 * 2**20  # the flag wins over the env
    monkeypatch.setenv(cache.CACHE_MAX_ENV, "lots")
    assert cache.cache_max_bytes() == 512 * 2**20  # ignored with a warning, not a dead tab
    for bad in (0, -1, "x", float("nan"), float("inf")):
        with pytest.raises(ValueError):
            cache.cache_max_bytes(bad)


def test_flag_reaches_the_disk_cache_and_bounds_it(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_MAX_ENV, raising=False)
    parser = argparse.ArgumentParser()
    BottlenecksLoader().define_flags(parser)
    flags = parser.parse_args(["--bottlenecks_cache_dir", str(tmp_path / "c"), "--bottlenecks_cache_max_mb", "3"])
    BottlenecksLoader().fix_flags(flags)
    for bad in ("0", "-2"):
        with pytest.raises(base_plugin.FlagsError):
            BottlenecksLoader().fix_flags(parser.parse_args(["--bottlenecks_cache_max_mb", bad]))
    flags.logdir_spec = ""
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(tmp_path / "logs"), flags=flags))
    disk = plugin.analyzer._cache
    assert disk.max_bytes == 3 * 2**20
    # ... and it is the bound that eviction keeps: 1 MiB entries, the oldest go beyond 3 MiB
    entry = {"report": {"schema_version": 1}, "memory": {}, "kernels": [], "pad": "x" * (1 << 20)}
    for i in range(6):
        disk.put(f"k{i}", entry)
    files = list((tmp_path / "c").glob("*.json"))
    assert 0 < sum(f.stat().st_size for f in files) <= 3 * 2**20
    assert len(files) < 6
    monkeypatch.setenv(cache.CACHE_MAX_ENV, "7")
    flags2 = parser.parse_args(["--bottlenecks_cache_dir", str(tmp_path / "d")])
    flags2.logdir_spec = ""
    assert BottlenecksPlugin(base_plugin.TBContext(logdir=str(tmp_path / "logs"),
                                                   flags=flags2)).analyzer._cache.max_bytes == 7 * 2**20
    json.dumps(entry)  # plain JSON, as the cache stores it
