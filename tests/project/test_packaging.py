"""`pip install .` (not only -e) ships every module and the dashboard: build the wheel."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_contains_every_module_and_the_frontend(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, timeout=300)
    wheel, = tmp_path.glob("tb_bottleneck_plugin-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in (REPO / "tb_bottleneck_plugin", REPO / "tb_bottleneck_demo"):
        modules = list(package.rglob("*.py"))
        assert modules, package
        for module in modules:
            assert module.relative_to(REPO).as_posix() in names, module
    assets = [a for a in (REPO / "tb_bottleneck_plugin" / "static").iterdir()
              if a.suffix in (".js", ".css", ".html", ".svg")]
    assert any(a.name == "index.js" for a in assets), assets
    for asset in assets:
        assert f"tb_bottleneck_plugin/static/{asset.name}" in names, asset
    assert "tb_bottleneck_plugin/METRICS.md" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "bottlenecks = tb_bottleneck_plugin.plugin_loader:BottlenecksLoader" in text
