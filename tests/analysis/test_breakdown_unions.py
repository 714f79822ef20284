"""breakdown.cumulative_unions: each C_k is the merge of every interval of the categories up to
k, taken all together (the definition), whatever way the unions are combined."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, TRACES
from tb_bottleneck_plugin.analysis import breakdown, intervals as iv
from tb_bottleneck_plugin.trace.loader import load_trace

REAL = ["h100/demo-generator/bf16_autocast/worker0.1795701588922636685.pt.trace.json.gz",
        "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json",
        "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"]


def _merged(rng, n, scale):
    s = rng.integers(0, scale, n).astype(float)
    return iv.merge(s, s + rng.integers(0, 6, n))


def test_union_of_merged_sets_equals_merge_of_both():
    rng = np.random.default_rng(7)
    for t in range(3000):
        scale = 40 * (1 + t % 3 * 20)
        a = _merged(rng, int(rng.integers(0, 8)), scale)
        b = _merged(rng, int(rng.integers(0, 400)), scale)
        want = iv.merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
        for got in (breakdown.union_merged(a, [b]), breakdown.union_merged(b, [a])):
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """Tiny CPU events, a runtime call and a kernel every 100 (benchmarks/make_tiny_events.py):
    one large union of CPU ops that the few kernels and calls touch."""
    out = tmp_path_factory.mktemp("tiny") / "tiny.pt.trace.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_tiny_events.py"), str(out), "--events", "20000",
                    "--kernel-every", "100"], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("rel", REAL + ["tiny"])
def test_cumulative_unions_by_definition(rel, tiny_path):
    path = tiny_path if rel == "tiny" else TRACES / rel
    if not path.exists():
        pytest.skip(f"{path} not here")
    trace = load_trace(str(path))
    masks = breakdown.category_masks(trace)
    unions = breakdown.cumulative_unions(trace)
    starts, ends = [], []
    for cat in breakdown.CATEGORIES[:-1]:
        for table_name, mask in masks[cat]:
            t = getattr(trace, table_name)
            starts.append(t.ts[mask])
            ends.append(t.ts[mask] + t.dur[mask])
        want = iv.merge(np.concatenate(starts), np.concatenate(ends))
        assert np.array_equal(unions[cat][0], want[0]) and np.array_equal(unions[cat][1], want[1]), cat
