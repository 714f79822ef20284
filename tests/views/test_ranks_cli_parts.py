"""`tb-bottlenecks report`'s rank table shows the five parts the Ranks tab draws (ranks.py
BAR_KEYS, static/ranks.js, METRICS §12): compute only, overlapped, exposed communication,
input wait (DataLoader) and other, each as % of the rank's step time, then the totals.
Numbers hand-computed in tests/views/test_ranks_input.py's cpu_input_2rank run: rank 0 = 25, 0,
105, 130, 40 µs of 300 µs; rank 1 = 70, 0, 80, 100, 50 µs of 300 µs."""
from __future__ import annotations

from tb_bottleneck_plugin.views import ranks

from test_ranks_input import _results, cpu_input_2rank  # noqa: F401  (the hand-built run, a fixture)


def test_terminal_table_shows_the_bar_parts(cpu_input_2rank):  # noqa: F811
    text = ranks.format_ranks_text(ranks.rank_view(_results(cpu_input_2rank, "cpuin")))
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.split()[:2] == ["rank", "worker"])
    assert header.split()[4:9] == ["compute", "overlap", "exposed", "input", "other"]
    rows = [ln.split() for ln in lines if ln.split()[:1] in (["0"], ["1"])]
    assert [r[3:8] for r in rows] == [["8.3%", "0.0%", "35.0%", "43.3%", "13.3%"],
                                      ["23.3%", "0.0%", "26.7%", "33.3%", "16.7%"]]
    assert [r[8:10] for r in rows] == [["2", "0.06"], ["1", "0.04"]]  # waited least in; total wait ms (60, 35 µs)
    legend = lines[lines.index(header) + 1]
    assert "input wait (DataLoader)" in legend and "totals over all steps" in legend
