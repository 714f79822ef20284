"""A deterministic, seeded slice of the fuzzing harness (benchmarks/fuzz.py) in CI.

600 mutated inputs built from four small real traces (cut to 150 events each) go
through the whole pipeline: load_trace -> analyze_trace -> combine_results with the
clean seed -> json.dumps(allow_nan=False). Each must give a report or a typed
BottleneckError; any other exception fails the test, printing the input number, its
mutations and the traceback (rerun one with ``python benchmarks/fuzz.py --only I``
after the same seed selection). benchmarks/fuzz.py runs >= 10,000 over every trace.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED_FILES = ("generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json",
              "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
              "hta/nccl_parser_config/nccl_data.json.gz",
              "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz")
INPUTS = 600


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("tb_bottleneck_fuzz", REPO / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzzed_inputs_give_a_report_or_a_typed_error(capsys):
    fuzz = _fuzz_module()
    files = [fuzz.SHARED_TRACES / f for f in SEED_FILES]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        pytest.skip(f"shared traces missing: {missing}")
    seeds = fuzz.prepare(files, n_events=150)
    lines = []
    tally = fuzz.fuzz(seeds, INPUTS, base_seed=20261123, log=lines.append)
    with capsys.disabled():
        print(f"\nfuzz slice: {tally['inputs']} inputs in {tally['seconds']} s: {tally['outcomes']}")
        if tally["section_error_root_causes"]:
            print("section errors (isolated by report.py):", list(tally["section_error_root_causes"]))
    assert tally["inputs"] == INPUTS
    assert "crash" not in tally["outcomes"], "\n".join(lines)
    # the slice exercises both outcomes: most inputs still give a report
    assert tally["outcomes"].get("report", 0) > INPUTS // 2
    assert sum(n for k, n in tally["outcomes"].items() if k.endswith("Error")) > 20
