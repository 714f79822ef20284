"""Compare of runs whose setup differs (GPU model, training vs inference, world size) and the
words of `tb-bottlenecks diff`.

The setups are pinned to what the traces themselves record (../shared/traces/INDEX.md and
the files' own deviceProperties / distributedInfo): TraceLens' H100 trace is bf16 BERT
inference on one "NVIDIA H100 80GB HBM3"; its MI300X trace is DDP training, rank 0 of 8 on
"AMD Instinct MI300X". The two kineto resnet50 runs are the same V100 training job with
num_workers 0 and 4 (one change): no warning.
"""
from __future__ import annotations

import json
import re

import pytest

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.views import compare
from conftest import TRACES
from test_compare import DEMO_NW0, hand_pair, result_of

H100 = TRACES / "tracelens/h100"
MI300 = TRACES / "tracelens/mi300"
RESNET0 = TRACES / "kineto-tb-samples/resnet50_num_workers_0"
RESNET4 = TRACES / "kineto-tb-samples/resnet50_num_workers_4"
CPU_NW0 = TRACES / "generated-cpu-torch2.13/nw0"
needs_shared = pytest.mark.skipif(not MI300.exists(), reason="../shared/traces is not available")


def diff_text(capsys, base, cand, *extra):
    code = cli.main(["diff", str(base), str(cand), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@needs_shared
def test_h100_inference_vs_mi300_training_states_every_difference():
    cmp = compare.compare(engine.run_result(str(H100)), engine.run_result(str(MI300)))
    assert cmp["setup_differences"] == [
        {"key": "gpu", "label": "GPU", "base": "NVIDIA H100 80GB HBM3", "cand": "AMD Instinct MI300X"},
        {"key": "mode", "label": "mode", "base": "inference", "cand": "training"},
        {"key": "world_size", "label": "world size", "base": 1, "cand": 8},
    ]
    assert cmp["setup_warning"] == (
        "These runs differ in GPU (NVIDIA H100 80GB HBM3 vs AMD Instinct MI300X), mode (inference vs training), "
        "world size (1 vs 8): not a before/after of one change; every delta below mixes the effects of all the "
        "differences.")
    assert cmp["base"]["setup"] == {"gpu": "NVIDIA H100 80GB HBM3", "mode": "inference", "world_size": 1}
    # the verdicts are still there (the numbers are real), the warning says how to read them
    assert next(m for m in cmp["metrics"] if m["key"] == "avg_step_us")["verdict"] == "worse"
    json.dumps(cmp, allow_nan=False)


@needs_shared
def test_one_change_on_the_same_setup_has_no_warning():
    cmp = compare.compare(engine.run_result(str(RESNET0)), engine.run_result(str(RESNET4)))
    assert cmp["setup_differences"] == [] and cmp["setup_warning"] is None
    assert cmp["cand"]["setup"] == {"gpu": "Tesla V100-DGXS-32GB", "mode": "training", "world_size": 1}


@needs_shared
def test_cpu_only_against_gpu_and_unknown_sides():
    cpu = engine.run_result(str(CPU_NW0))
    assert compare.setup(cpu["report"]) == {"gpu": "none (CPU only)", "mode": "training", "world_size": 1}
    cmp = compare.compare(cpu, engine.run_result(str(H100)))
    assert [(d["key"], d["base"], d["cand"]) for d in cmp["setup_differences"]] == [
        ("gpu", "none (CPU only)", "NVIDIA H100 80GB HBM3"), ("mode", "training", "inference")]
    # a side that cannot tell (no deviceProperties, no context) is not a difference
    unknown = {"gpu": {"0": {}}, "device_names": {}, "context": {"mode": "unknown", "distributed": True}}
    assert compare.setup(unknown) == {"gpu": None, "mode": None, "world_size": None}
    assert compare.setup_differences(unknown, cpu["report"]) == []


def test_same_run_twice_has_no_warning(tmp_path):
    base_path, _ = hand_pair(tmp_path)
    cmp = compare.compare(result_of(base_path), result_of(base_path))
    assert cmp["setup_differences"] == [] and cmp["setup_warning"] is None
    assert "WARNING" not in compare.format_text(cmp)


@needs_shared
def test_diff_text_warns_counts_steps_and_says_na_once(capsys):
    out = diff_text(capsys, H100, MI300)
    lines = out.splitlines()
    assert lines[0] == f"baseline:  {H100} (1 step)"
    assert lines[1] == f"candidate: {MI300} (3 steps)"
    assert lines[3].startswith("WARNING: These runs differ in GPU (NVIDIA H100 80GB HBM3 vs AMD Instinct MI300X)")
    occ = next(ln for ln in lines if ln.strip().startswith("Est. achieved occupancy"))
    assert occ.split() == ["Est.", "achieved", "occupancy", "6.58%", "->", "n/a", "n/a", "on", "one", "side"]
    assert not re.search(r"n/a\s+n/a\s*$", out, re.M)
    # CPU memory of 16 B is 16 B, not "0.0 MiB"
    assert re.search(r"Peak CPU memory allocated\s+16 B ->\s+n/a", out)
    # step categories in the words of `report` (text_report._CATEGORY_WORDS), not keys
    waterfall = out.split("by category:\n")[1].split("\n\n")[0].splitlines()
    assert [ln.split("  ")[1].strip() for ln in waterfall[:3]] == ["Communication", "Kernel", "Other (idle)"]
    assert not re.search(r"^\s+(cpu_exec|dataloader|other|communication)\s", out, re.M)


@needs_shared
def test_diff_text_bytes_in_gib_and_no_empty_heading(capsys):
    out = diff_text(capsys, RESNET0, RESNET4)
    assert "WARNING" not in out
    # 2662.3 MiB peak allocated (the report's size(): GiB from 1 GiB on, two decimals)
    assert re.search(r"Peak GPU memory allocated\s+2\.60 GiB ->\s+2\.60 GiB\s+-128\.0 KiB \(-0\.0%\)\s+unchanged", out)
    waterfall = out.split("by category:\n")[1].split("\n\n")[0].splitlines()
    assert waterfall[0].split()[0] == "DataLoader" and "CPU Exec" in out
    assert_every_heading_has_lines(out)


def assert_every_heading_has_lines(out):
    blocks = out.split("\n\n")
    for block in blocks[1:]:
        head, *body = block.splitlines()
        if head.startswith(("step time", "WARNING")) and ":" in head and not head.endswith(":"):
            continue  # one-line sections ("step time ...: no category changed", the warning)
        assert body and all(ln.startswith("  ") for ln in body), block


def test_diff_text_omits_headings_with_nothing_under_them(tmp_path):
    # the same run twice: no kernel or operator changed, nothing n/a on one side only
    base_path, _ = hand_pair(tmp_path)
    cmp = compare.compare(result_of(base_path), result_of(base_path))
    text = compare.format_text(cmp)
    assert "kernels:" not in text and "CPU operators" not in text
    assert "step time 1.00 ms -> 1.00 ms (±0.00 ms): no category changed" in text
    assert_every_heading_has_lines(text)
    # every metric n/a and nothing else: no "not available" heading without a line under it
    cmp["not_available"] = {}
    assert "not available" not in compare.format_text(cmp)
    cmp["recommendations"] = []
    assert "recommendations" not in compare.format_text(cmp)


def test_demo_diff_text_words(capsys):
    out = diff_text(capsys, DEMO_NW0, DEMO_NW0)
    assert "WARNING" not in out and "(1 steps)" not in out
    assert_every_heading_has_lines(out)
