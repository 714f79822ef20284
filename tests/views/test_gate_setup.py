"""`tb-bottlenecks check --baseline` warns, like `diff`, when the two runs' setups differ
(compare.setup_differences / setup_warning, METRICS.md §11): the WARNING line goes to
stderr, stdout keeps one line per violated bound (or the ok line) and the exit code is the
bounds' alone. The setups are what the traces record (see test_compare_setup.py): the
TraceLens H100 trace is BERT inference on one H100, the MI300X trace DDP training, rank 0
of 8; the two kineto resnet50 runs are one V100 training job (num_workers 0 vs 4)."""
from __future__ import annotations

import pytest

from tb_bottleneck_plugin import cli
from test_compare_setup import H100, MI300, RESNET0, RESNET4, needs_shared


def check(capsys, *args):
    code = cli.main(["check", *[str(a) for a in args]])
    out, err = capsys.readouterr()
    return code, out, err


@needs_shared
def test_check_baseline_on_different_setups_prints_diffs_warning(capsys):
    code, out, err = check(capsys, MI300, "--max", "avg_step_ms=1000000", "--baseline", H100,
                           "--max-regression", "avg_step_us=1000000%")
    assert code == 0, (out, err)  # both bounds hold: the warning does not fail the gate
    assert out.strip() == f"ok: 2 bound(s) hold for {MI300}"
    warnings = [ln for ln in err.splitlines() if ln.startswith("WARNING")]
    # the very line `diff` prints for the same pair (base = the baseline, cand = the checked run)
    _, diff_out, _ = cli.main(["diff", str(H100), str(MI300)]), *capsys.readouterr()
    diff_warnings = [ln for ln in diff_out.splitlines() if ln.startswith("WARNING")]
    assert len(diff_warnings) == 1 and warnings == diff_warnings
    assert warnings[0].startswith(
        "WARNING: These runs differ in GPU (NVIDIA H100 80GB HBM3 vs AMD Instinct MI300X), "
        "mode (inference vs training), world size (1 vs 8): not a before/after of one change")


@needs_shared
def test_check_baseline_warning_does_not_change_a_failing_exit_code(capsys):
    code, out, err = check(capsys, MI300, "--max", "avg_step_ms=0.001", "--baseline", H100)
    assert code == 1
    assert out.splitlines()[0].startswith("FAIL avg_step_ms = ")
    assert "WARNING" not in out and err.count("WARNING: These runs differ in GPU") == 1


@needs_shared
def test_check_baseline_on_the_same_setup_has_no_warning(capsys):
    code, out, err = check(capsys, RESNET4, "--max", "avg_step_ms=1000000", "--baseline", RESNET0,
                           "--max-regression", "avg_step_us=1000%")
    assert code == 0, (out, err)
    assert "WARNING" not in out + err


@needs_shared
def test_check_without_baseline_never_warns(capsys):
    code, out, err = check(capsys, MI300, "--max", "avg_step_ms=1000000")
    assert code == 0 and "WARNING" not in out + err
