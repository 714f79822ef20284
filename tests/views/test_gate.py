"""`tb-bottlenecks check` as a CI gate and `tb-bottlenecks diff`: exit codes on the
demo runs, one line per violated bound, n/a violates, relative and absolute
regressions against a baseline, unknown metrics and unreadable input exit 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.views import compare, gate
from test_compare import DEMO_NW0, DEMO_NW4, hand_pair, result_of


def run_cli(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- demo runs


def test_check_passes_on_the_fixed_demo_run(capsys):
    code, out, err = run_cli(capsys, "check", DEMO_NW4, "--max", "input_bound_pct=5", "--max", "avg_step_ms=2000",
                             "--baseline", DEMO_NW0, "--max-regression", "avg_step_us=5%")
    assert code == 0, (out, err)
    assert out.strip() == f"ok: 3 bound(s) hold for {DEMO_NW4}"


def test_check_fails_on_the_input_bound_demo_run_one_line_per_violation(capsys):
    code, out, err = run_cli(capsys, "check", DEMO_NW0, "--max", "input_bound_pct=5",
                             "--max", "avg_step_ms=100000", "--min", "tensor_core_pct=40",
                             "--baseline", DEMO_NW4, "--max-regression", "avg_step_us=5%")
    assert code == 1
    lines = out.strip().splitlines()
    ib = result_of(DEMO_NW0)["report"]["input"]["input_bound_pct"]
    assert len(lines) == 3, lines  # avg_step_ms=100000 holds
    assert lines[0] == f"FAIL input_bound_pct = {ib:.6g} > max 5"
    assert lines[1].startswith("FAIL tensor_core_pct is n/a (") and "CPU-only" in lines[1]
    assert lines[2].startswith("FAIL avg_step_us regressed by +") and "lower is better" in lines[2]


def test_check_as_a_process_exit_codes():
    """What a CI runner sees: the console script's exit status."""
    exe = [sys.executable, "-m", "tb_bottleneck_plugin.cli", "check"]
    ok = subprocess.run(exe + [str(DEMO_NW4), "--max", "input_bound_pct=5"], capture_output=True, text=True)
    bad = subprocess.run(exe + [str(DEMO_NW0), "--max", "input_bound_pct=5"], capture_output=True, text=True)
    assert (ok.returncode, bad.returncode) == (0, 1), (ok.stderr, bad.stderr)


def test_unknown_metric_unreadable_input_and_bad_bounds_exit_2(tmp_path, capsys):
    code, out, err = run_cli(capsys, "check", DEMO_NW4, "--max", "input_bound=5")
    assert code == 2 and "unknown metric 'input_bound'" in err and "input_bound_pct" in err and out == ""
    broken = tmp_path / "w.pt.trace.json"
    broken.write_text('{"traceEvents": [')
    code, out, err = run_cli(capsys, "check", broken, "--max", "input_bound_pct=5")
    assert code == 2 and str(broken) in err and out == ""
    code, _, err = run_cli(capsys, "check", tmp_path / "missing", "--max", "input_bound_pct=5")
    assert code == 2 and "missing" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4, "--max", "input_bound_pct=five")
    assert code == 2 and "not a number" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4, "--max", "input_bound_pct=5%")
    assert code == 2 and "--max-regression" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4, "--max-regression", "avg_step_us=5%")
    assert code == 2 and "--baseline" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4, "--baseline", DEMO_NW0, "--max-regression", "kernels_per_step=1")
    assert code == 2 and "no better direction" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4)
    assert code == 2 and "no bound" in err
    code, _, err = run_cli(capsys, "check", DEMO_NW4.parent, "--max", "input_bound_pct=5")
    assert code == 2 and "runs" in err  # a logdir with several runs: name one


def test_help_lists_every_metric_with_its_direction(capsys):
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    out = capsys.readouterr().out
    for name in gate.GATE_METRICS:
        assert name in out, name
    assert "input_bound_pct" in out and "lower" in out and "higher" in out


# ---------------------------------------------------------------------------- bounds on known values


def test_bounds_and_regressions_on_the_hand_built_pair(tmp_path):
    base_path, cand_path = hand_pair(tmp_path)
    base, cand = result_of(base_path), result_of(cand_path)  # avg step 1000 -> 600 µs, input-bound 40 -> 16.7 %

    def check(maxes=(), mins=(), regressions=(), b=base, c=cand):
        parse = gate.parse_bound
        return gate.evaluate(c, [parse(t, "--max") for t in maxes], [parse(t, "--min") for t in mins],
                             [parse(t, "--max-regression", allow_relative=True) for t in regressions], b)

    assert check(maxes=["avg_step_us=600", "avg_step_ms=0.6", "input_bound_pct=16.7"]) == []
    assert check(maxes=["avg_step_us=599.9"]) == ["avg_step_us = 600 > max 599.9"]
    assert check(maxes=["avg_step_ms=0.5"]) == ["avg_step_ms = 0.6 > max 0.5"]
    assert check(mins=["gpu_utilization_pct=41.6"]) == []
    assert check(mins=["gpu_utilization_pct=42"]) == ["gpu_utilization_pct = 41.6667 < min 42"]
    # the candidate improved: no regression at all, even with a 0 % allowance
    assert check(regressions=["avg_step_us=0%", "input_bound_pct=0", "gpu_utilization_pct=0%"]) == []
    # swapped, the step time regressed by +400 µs = +66.67 %, utilization fell by 11.67 pp
    swapped = check(regressions=["avg_step_us=66%", "avg_step_us=67%", "avg_step_us=399", "gpu_utilization_pct=11"],
                    b=cand, c=base)
    assert swapped == [
        "avg_step_us regressed by +66.67% (600 -> 1000, lower is better); max regression 66%",
        "avg_step_us regressed by +400 (600 -> 1000, lower is better); max regression 399",
        "gpu_utilization_pct regressed by +11.6667 (41.6667 -> 30, higher is better); max regression 11",
    ]
    # a metric that is n/a violates its bound, and says why
    (line,) = check(mins=["est_achieved_occupancy_pct=10"])
    assert line.startswith("est_achieved_occupancy_pct is n/a (")


# ---------------------------------------------------------------------------- diff


def test_diff_json_is_the_compare_object_and_text_tells_the_story(capsys):
    code, out, err = run_cli(capsys, "diff", DEMO_NW0, DEMO_NW4, "--json")
    assert code == 0, err
    body = json.loads(out)
    want = json.loads(json.dumps(compare.compare(result_of(DEMO_NW0), result_of(DEMO_NW4),
                                                 base_label=str(DEMO_NW0), cand_label=str(DEMO_NW4))))
    assert body == want
    code, out, err = run_cli(capsys, "diff", DEMO_NW0, DEMO_NW4, "--batch-size", "128")
    assert code == 0, err
    assert "Input-bound" in out and "better" in out
    waterfall = out.split("by category:")[1].strip().splitlines()
    assert waterfall[0].split()[0] == "DataLoader"  # the largest change first (report's words)
    assert "resolved" in out and "Throughput" in out
    code, _, err = run_cli(capsys, "diff", DEMO_NW0, DEMO_NW4, "--batch-size", "0")
    assert code == 2 and "--batch-size" in err
