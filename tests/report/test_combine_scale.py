"""Run-level combining at scale (issue 14): the numpy merges of report.combine_results
(operators.combine_views, occupancy.combine_kernel_rows / combine_kernel_names) give the
numbers of adding row after row, in the same order, on real span results; summaries of
N copies of one span are N times its sums; memory stays bounded over hundreds of spans."""
import copy
import math
import os
import random
import tracemalloc

import pytest

from tb_bottleneck_plugin.trace import loader
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import occupancy, operators

HERE = os.path.dirname(os.path.abspath(__file__))
SPAN = os.path.join(HERE, "..", "..", "..", "shared", "traces", "kineto-tb-samples", "resnet50_num_workers_0",
                    "worker0.1623143089861.pt.trace.json.gz")

pytestmark = pytest.mark.skipif(not os.path.exists(SPAN), reason="../shared/traces not present")


@pytest.fixture(scope="module")
def span():
    return report.analyze_trace(loader.load_trace(SPAN), run="r", worker="w", span="s")


def _variants(span, n, seed=0):
    """n copies of the span result with different name tables, scaled times, a null."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = copy.deepcopy(span)
        v = r["operator_view"]
        perm = list(range(len(v["names"])))
        rnd.shuffle(perm)
        where = {old: new for new, old in enumerate(perm)}
        v["names"] = [v["names"][old] for old in perm]
        v["rows"]["name"] = [where[x] for x in v["rows"]["name"]]
        f = 1.0 + rnd.random()
        for field in ("total_us", "self_us", "gpu_us"):
            v["rows"][field] = [x * f + 0.0001 * i for x in v["rows"][field]]
        for k in r["kernels"]:
            k["total_us"] = k["total_us"] * f
        for k in r["kernel_names"]["rows"]:
            k["total_us"] = k["total_us"] * f
        if i == 3:
            v["rows"]["self_us"][5] = None
            r["kernels"][2]["total_us"] = None
            r["kernel_names"]["rows"][1]["total_us"] = None
        if i == 4:  # a smaller table: keys first seen in a later span
            r["kernels"] = r["kernels"][100:]
            r["kernel_names"]["rows"] = r["kernel_names"]["rows"][30:]
        out.append(r)
    return out


def _rows_one_by_one(views):
    """The reference: a dict of (name, inputs) -> sums, added row after row in span order."""
    names, inputs, acc = {}, {}, {}
    for v in views:
        rows = v["rows"]
        for i in range(len(rows["name"])):
            nm = names.setdefault(v["names"][rows["name"][i]], len(names))
            inp = rows["input"][i]
            if inp >= 0:
                inp = inputs.setdefault(tuple(v["inputs"][inp]), len(inputs))
            vals = [math.nan if rows[f][i] is None else float(rows[f][i]) for f in operators.VIEW_FIELDS]
            have = acc.setdefault((nm, inp), [0.0] * len(vals))
            for j, x in enumerate(vals):
                have[j] += x
    return list(names), [list(k) for k in inputs], acc


def test_combined_view_is_row_after_row_sum(span, monkeypatch):
    monkeypatch.setattr(operators, "COMBINE_CHUNK", 5000)  # several chunks: sums carried across them
    results = _variants(span, 7)
    views = [r["operator_view"] for r in results]
    got = operators.combine_views(views)
    names, inputs, acc = _rows_one_by_one(views)
    assert got["names"] == names and got["inputs"] == inputs and got["steps"] == []
    keys = list(acc)
    assert list(zip(got["rows"]["name"], got["rows"]["input"])) == keys
    for j, f in enumerate(operators.VIEW_FIELDS):
        if f in ("calls", "top_calls", "flop_calls", "byte_calls", "inner_calls"):
            want = [int(acc[k][j]) for k in keys]
        elif f in ("flops", "flop_bytes", "peak_us", "hbm_us"):  # exact sums (one tiny op's µs)
            want = [acc[k][j] if math.isfinite(acc[k][j]) else None for k in keys]
        else:
            want = [round(acc[k][j], 3) if math.isfinite(acc[k][j]) else None for k in keys]
        assert got["rows"][f] == want, f
    assert any(x is None for x in got["rows"]["self_us"])  # the null stays unknown, not smaller
    # calls: every span's calls of every name, counted independently from the span itself
    calls = sum(span["operator_view"]["rows"]["calls"])
    assert sum(got["rows"]["calls"]) == 7 * calls


def test_combined_kernel_rows_and_names(span):
    results = _variants(span, 6)
    rows = occupancy.combine_kernel_rows([r["kernels"] for r in results])
    by_key = {}
    for r in results:
        for k in r["kernels"]:
            key = (k["name"], k["device"], str(k["grid"]), str(k["block"]), k["registers_per_thread"],
                   k["shared_memory_bytes"])
            calls, total = by_key.get(key, (0, 0.0))
            by_key[key] = (calls + k["calls"], None if total is None or k["total_us"] is None
                           else total + k["total_us"])
    assert len(rows) == len(by_key) == 200
    for row in rows:
        key = (row["name"], row["device"], str(row["grid"]), str(row["block"]), row["registers_per_thread"],
               row["shared_memory_bytes"])
        assert (row["calls"], row["total_us"]) == by_key[key]
    assert rows[0]["total_us"] is None  # unknown totals sort first, as before
    known = [r["total_us"] for r in rows if r["total_us"] is not None]
    assert known == sorted(known, reverse=True)

    names = occupancy.combine_kernel_names([r["kernel_names"] for r in results])
    want = {}
    for r in results:
        for k in r["kernel_names"]["rows"]:
            c, t = want.get(k["name"], (0, 0.0))
            want[k["name"]] = (c + k["calls"], None if t is None or k["total_us"] is None else t + k["total_us"])
    assert {r["name"]: (r["calls"], r["total_us"]) for r in names["rows"]} == want


def test_summary_of_many_copies_is_n_times_one_span_and_bounded(span):
    n = 300
    results = [copy.deepcopy(span) for _ in range(n)]
    tracemalloc.start()
    try:
        combined = report.combine_results(results, run="r")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rep = combined["report"]
    assert rep["errors"] == []
    assert rep["steps"]["count"] == n * span["report"]["steps"]["count"]
    one = {r["name"]: r for r in span["kernel_names"]["rows"]}
    for r in combined["kernel_names"]["rows"]:
        assert r["calls"] == n * one[r["name"]]["calls"]
    assert sum(combined["operator_view"]["rows"]["calls"]) == n * sum(span["operator_view"]["rows"]["calls"])
    assert [k["calls"] for k in combined["kernels"]] == [n * k["calls"] for k in span["kernels"]]
    # the combine's own allocations (the inputs already exist): a few MB of numpy chunks and
    # the summary, not a copy of the 300 span results (~150 MB as JSON)
    assert peak < 40 * 2**20, peak / 2**20
