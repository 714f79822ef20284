"""The Ranks view's group matching at scale (issue 37 item 5): the sort it uses in place of
lexsort against numpy's own stable orders, and a 64-rank tensor x data parallel run built by
hand (16 TP groups of 4 consecutive ranks, 4 DP groups of 16 ranks with the same rank mod 4;
groups of more than 8 ranks, whose waits numpy sums in SIMD lanes) whose every number is worked
out below."""
from __future__ import annotations

import numpy as np
import pytest

from tb_bottleneck_plugin.analysis.collectives import stable_order
from tb_bottleneck_plugin.views import ranks

N, TP = 64, 4
SLOW = N - 1  # rank 63: in TP group tp15 (ranks 60-63) and DP group dp3 (ranks 3, 7, ..., 63)
STEPS = (1, 2, 3)
MS = 1000.0


def test_stable_order_is_numpys_stable_argsort():
    rng = np.random.default_rng(7)
    for n, top in ((0, 1), (1, 5), (50, 3), (1000, 40), (5000, 10 ** 6)):
        key = rng.integers(0, top, n).astype(np.int64)
        assert np.array_equal(stable_order(key), np.argsort(key, kind="stable"))
    # several columns in one key: lexsort's order (the last column first), ties by position
    a, b = rng.integers(0, 4, 3000), rng.integers(0, 9, 3000)
    assert np.array_equal(stable_order(a * 9 + b), np.lexsort((b, a)))
    # a key too large for key * n + index: numpy's stable sort itself
    big = np.array([2 ** 61, 3, 2 ** 61, 0], np.int64)
    assert stable_order(big).tolist() == [3, 1, 0, 2]


def _partial(r: int) -> dict:
    """Rank r: three steps of 100 ms; in each, an all-reduce in its TP group (Seq 2s-1), one in
    its DP group (Seq s), a second in its TP group (Seq 2s). Every call lasts 5 ms, except:
    rank 63's last 1 ms (it arrives last: its backward takes 30 ms, the others' 20 ms), and its
    peers' first call with it lasts 11 ms (they wait 10 ms for it there)."""
    tp, dp = f"tp{r // TP}", f"dp{r % TP}"
    steps = []
    for s in STEPS:
        durs = [5.0 * MS] * 3
        if r == SLOW:
            durs = [1.0 * MS] * 3
        elif r // TP == SLOW // TP:
            durs[0] = 11.0 * MS  # its TP peers
        elif r % TP == SLOW % TP:
            durs[1] = 11.0 * MS  # its DP peers
        steps.append({
            "step": s, "step_us": 100 * MS, "compute_only_us": 50 * MS, "overlapped_us": 10 * MS,
            "exposed_comm_us": 10 * MS, "other_us": 30 * MS,
            "collectives": {"kind": ["all_reduce"] * 3, "dur_us": durs, "bytes": [4096.0] * 3,
                            "pg": [tp, dp, tp], "seq": [2 * s - 1, s, 2 * s]},
            "activity": {"dataloader_us": 1 * MS, "h2d_us": 0.0, "sync_us": 0.0, "compute_forward_us": 20 * MS,
                         "compute_backward_us": (30 if r == SLOW else 20) * MS, "compute_optimizer_us": 2 * MS,
                         "host_gap_us": 3 * MS}})
    first = r // TP * TP
    return {"version": 1, "rank": r, "world_size": N, "backend": "nccl", "device": "gpu", "steps": steps,
            "process_groups": [{"name": tp, "desc": f"TP {r // TP}", "size": TP, "ranks": list(range(first, first + TP))},
                               {"name": dp, "desc": f"DP {r % TP}", "size": N // TP, "ranks": list(range(r % TP, N, TP))}]}


@pytest.fixture(scope="module")
def view():
    return ranks.rank_view({f"rank{r}": [{"report": {}, "distributed": _partial(r)}] for r in range(N)})


def test_every_group_counted_and_matched_by_sequence_number(view):
    groups = {g["name"]: g for g in view["process_groups"]}
    assert len(groups) == N // TP + TP == 20
    for k in range(N // TP):  # 4 ranks x 2 calls x 3 steps
        g = groups[f"tp{k}"]
        assert (g["calls"], g["matched_calls"], g["match_by"], g["size"]) == (24, 24, "seq", 4)
    for k in range(TP):  # 16 ranks x 1 call x 3 steps
        g = groups[f"dp{k}"]
        assert (g["calls"], g["matched_calls"], g["match_by"], g["size"]) == (48, 48, "seq", 16)
        assert g["ranks"] == g["ranks_present"] == list(range(k, N, TP))
    # every call of the other groups lasts 5 ms on every rank: no one waits, no straggler
    assert {n for n, g in groups.items() if g["straggler"]} == {"tp15", "dp3"}


def test_the_slow_ranks_groups_name_it_with_its_wait_and_cause(view):
    groups = {g["name"]: g for g in view["process_groups"]}
    tp, dp = groups["tp15"]["straggler"], groups["dp3"]["straggler"]
    # tp15: rank 63 is the shortest at both TP calls of each step: late in 6 of 6; each peer
    # waits 11 - 1 + 5 - 1 = 14 ms a step: the others' mean 14 ms of the 100 ms step
    assert (tp["rank"], tp["late_calls"], tp["of_calls"], tp["steps"], tp["of_steps"]) == (SLOW, 6, 6, 3, 3)
    assert tp["wait_caused_pct"] == pytest.approx(14.0, abs=1e-9) and tp["late_steps"] == list(STEPS)
    # dp3 (16 ranks): the 15 others wait 11 - 1 = 10 ms at the DP call: 10 % of the step
    assert (dp["rank"], dp["late_calls"], dp["of_calls"], dp["steps"]) == (SLOW, 3, 3, 3)
    assert dp["wait_caused_pct"] == pytest.approx(10.0, abs=1e-9)
    for st, own_comm, peers_comm in ((tp, 2 * MS, 16 * MS), (dp, 1 * MS, 11 * MS)):
        cause = st["cause"]
        assert cause["activity"] == "compute_backward_us" and cause["diff_us"] == pytest.approx(10 * MS)
        # its own calls in the group are short (it waits for no one): hidden by the all-reduce
        assert cause["hidden_compute"] is True
        assert cause["comm_us_per_step"] == pytest.approx(own_comm)
        assert cause["median_others_comm_us_per_step"] == pytest.approx(peers_comm)


def test_waits_per_rank(view):
    rows = {r["rank"]: r for r in view["ranks"]}
    assert rows[SLOW]["wait_us"] == 0.0
    assert rows[60]["wait_us"] == pytest.approx(3 * 14 * MS)  # tp15 peer: 14 ms a step
    assert rows[3]["wait_us"] == pytest.approx(3 * 10 * MS)  # dp3 peer: 10 ms a step
    assert rows[0]["wait_us"] == 0.0 and rows[0]["per_step"]["wait_us"] == [0.0, 0.0, 0.0]
