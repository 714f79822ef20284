"""A user-given GPU peak (issue 21): `--peak-tflops` on report/diff/check and
TensorBoard's `--bottlenecks_peak_tflops` set BOTTLENECKS_PEAK_TFLOPS for the analysis,
and the disk cache keys its entries by that setting, so a changed peak analyses again.
Also the MFU rows of compare/diff and `check --min mfu_pct` (METRICS.md §11, §15)."""
import argparse
import json

import pytest
from tensorboard.plugins import base_plugin

from conftest import DEMO_LOGS
from tb_bottleneck_plugin.serving import cache
from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.views import compare
from tb_bottleneck_plugin.analysis import collectives, peaks
from tb_bottleneck_plugin.plugin import BottlenecksPlugin
from tb_bottleneck_plugin.plugin_loader import BottlenecksLoader

BF16 = DEMO_LOGS / "h100_bf16_autocast"  # H100 SXM, bf16 autocast GEMMs: MFU 29 % of 989 TFLOP/s
FP32 = DEMO_LOGS / "h100_fp32_matmul"

needs_demo = pytest.mark.skipif(not BF16.is_dir() or not FP32.is_dir(), reason="demo_logs H100 runs missing")


@pytest.fixture(autouse=True)
def _no_peak(monkeypatch):
    for name in (peaks.ENV_PEAK, collectives.ENV_LINK):
        monkeypatch.setenv(name, "")  # recorded: restored after the test, whatever sets it meanwhile
        monkeypatch.delenv(name)


def run_cli(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def worker_flops(out: str) -> dict:
    (run,) = json.loads(out)["runs"]
    return run["workers"][0]["summary"]["flops"]


@needs_demo
def test_report_peak_flag_sets_the_peak_for_the_analysis_only(capsys):
    import os

    code, out, err = run_cli(capsys, "report", BF16, "--json", "--jobs", "1")
    assert code == 0, err
    table = worker_flops(out)
    assert table["peak"]["gpu"] == "H100 SXM" and table["peak_tflops"] == pytest.approx(989.4, abs=0.1)
    code, out, err = run_cli(capsys, "report", BF16, "--json", "--jobs", "2", "--peak-tflops", "bf16=1978.8")
    assert code == 0, err
    given = worker_flops(out)
    assert given["peak"]["source"].startswith("user-given")
    assert given["peak_tflops"] == 1978.8
    assert given["mfu_pct"] == pytest.approx(table["mfu_pct"] / 2, rel=1e-9)  # twice the peak: half the MFU
    assert peaks.ENV_PEAK not in os.environ  # restored after the command


@needs_demo
def test_check_min_mfu_and_peak_flag(capsys):
    code, out, err = run_cli(capsys, "check", BF16, "--min", "mfu_pct=20")  # 29.3 % of 989 TFLOP/s
    assert code == 0, (out, err)
    code, out, err = run_cli(capsys, "check", BF16, "--min", "mfu_pct=20", "--peak-tflops", "1978.8")
    assert code == 1, (out, err)
    assert out.startswith("FAIL mfu_pct = 14.6") and "< min 20" in out
    code, out, err = run_cli(capsys, "check", BF16, "--min", "tflops=200", "--min", "achieved_tflops=500")
    assert code == 0, (out, err)  # 290 TFLOP/s over the step time, 791 in the GEMM kernels
    code, out, err = run_cli(capsys, "check", BF16, "--min", "mfu_pct=20", "--peak-tflops", "bf16=fast")
    assert code == 2 and "--peak-tflops" in err and out == ""


@needs_demo
def test_diff_mfu_rows_higher_is_better_and_peak_flag(capsys):
    from test_compare import result_of

    cmp = compare.compare(result_of(FP32), result_of(BF16))
    rows = {m["key"]: m for m in cmp["metrics"]}
    for key in ("mfu_pct", "tflops", "achieved_tflops"):
        assert rows[key]["better"] == "higher" and rows[key]["direction"] == "higher_is_better"
    # one peak for both runs (issue 34 item 11): the dense bf16 peak, 4.7 % -> 29 %; each
    # precision at its own peak (69 % of fp32 -> 29 % of bf16) is the detail row, no direction
    assert rows["mfu_pct"]["verdict"] == "better" and rows["tflops"]["verdict"] == "better"
    assert rows["mfu_own_peak_pct"]["verdict"] == "changed"
    assert rows["tflops"]["unit"] == rows["achieved_tflops"]["unit"] == "TFLOP/s"
    code, out, err = run_cli(capsys, "diff", FP32, BF16, "--json", "--peak-tflops", "1000")
    assert code == 0, err
    rows = {m["key"]: m for m in json.loads(out)["metrics"]}
    assert rows["mfu_pct"]["verdict"] == "better"  # one peak for both precisions: the rate decides
    code, out, err = run_cli(capsys, "diff", FP32, BF16)
    assert code == 0 and "MFU" in out and "TFLOP/s over the step time" in out


def test_tensorboard_flag_is_checked_and_reaches_the_analysis_environment(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    BottlenecksLoader().define_flags(parser)
    with pytest.raises(base_plugin.FlagsError):
        BottlenecksLoader().fix_flags(parser.parse_args(["--bottlenecks_peak_tflops", "lots"]))
    flags = parser.parse_args(["--bottlenecks_peak_tflops", "bf16=989,hbm=3350",
                               "--bottlenecks_cache_dir", str(tmp_path / "c")])
    BottlenecksLoader().fix_flags(flags)
    flags.logdir_spec = ""
    before = cache.current_version()
    plugin = BottlenecksPlugin(base_plugin.TBContext(logdir=str(tmp_path / "logs"), flags=flags))
    try:
        import os

        assert os.environ[peaks.ENV_PEAK] == "bf16=989,hbm=3350"  # analysis processes inherit it
        assert plugin.analyzer._cache.version == cache.current_version() != before
    finally:
        plugin.analyzer.stop()


def test_cache_version_follows_the_peak_and_link_settings(tmp_path, monkeypatch):
    assert set(cache.SETTINGS_ENV) == {peaks.ENV_PEAK, collectives.ENV_LINK}
    plain = cache.current_version()
    assert "+env:" not in plain  # entries written without a setting stay valid
    monkeypatch.setenv(peaks.ENV_PEAK, "989")
    with_989 = cache.current_version()
    monkeypatch.setenv(peaks.ENV_PEAK, "bf16=989,hbm=3350")
    other = cache.current_version()
    assert len({plain, with_989, other}) == 3
    # an entry written under one peak is not served under another
    disk = cache.DiskCache(tmp_path / "c")
    key = disk.key_for("file:///run/w.pt.trace.json", "10:1")
    from test_service import entry

    disk.put(key, entry())
    assert disk.get(key) is not None
    monkeypatch.setenv(peaks.ENV_PEAK, "989")
    again = cache.DiskCache(tmp_path / "c")
    assert again.key_for("file:///run/w.pt.trace.json", "10:1") != key
    assert again.get(key) is None  # same file name, other version: discarded
    monkeypatch.setenv(collectives.ENV_LINK, "450")
    assert cache.current_version() != with_989
