"""Pipeline parallelism in the Ranks view (issue 37, METRICS.md §12 "Pipeline parallelism"):
a hand-built 2-stage GPipe run with a known bubble, its stages, schedule, theoretical bubble
and priced advice; the peer-less variant said as n/a."""
from __future__ import annotations

from pathlib import Path

import pytest

from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.trace import discovery
from tb_bottleneck_plugin.views import ranks

from conftest import write_trace  # noqa: E402

MS = 1000.0


def _x(name, ts, dur, cat="cpu_op", args=None):
    e = {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 1, "ts": ts * MS, "dur": dur * MS}
    if args:
        e["args"] = args
    return e


def _p2p(kind, ts, dur, peer, with_peer=True):
    """A c10d::send / c10d::recv_ op and the gloo: span it runs (its last 1 ms)."""
    args = {"Input Dims": [[[64, 256]], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]}
    if with_peer:
        args["Concrete Inputs"] = ["", "", str(peer), "0"]
    op = "c10d::send" if kind == "send" else "c10d::recv_"
    return [_x(op, ts, dur, args=args),
            _x(f"gloo:{kind}", ts + dur - 1, 1, cat="user_annotation",
               args={"Input Dims": [[64, 256]], "Input type": ["float"]})]


def _rank(rank, with_peer=True, names=None):
    """One step of 100 ms per ProfilerStep (steps 1 and 2, the same pattern). GPipe with two
    microbatches (m = 2) over two stages (p = 2); compute is aten::mm.

    rank 0 (stage 0): mm [0,18) send [18,20) | mm [20,38) send [38,40) | recv [40,60) (gradient
      of microbatch 0: 20 ms waiting) mm [60,80) | recv [80,82) mm [82,100)
      bubble = 2 + 2 + 20 + 2 = 26 ms
    rank 1 (stage 1): recv [0,20) (activation 0: 20 ms) mm [20,38) | recv [38,40) mm [40,58) |
      mm [58,76) send [76,78) | mm [78,96) send [96,98) | idle [98,100)
      bubble = 20 + 2 + 2 + 2 = 26 ms
    """
    peer = 1 - rank
    if rank == 0:
        plan = [("mm", 0, 18), ("send", 18, 2), ("mm", 20, 18), ("send", 38, 2), ("recv", 40, 20), ("mm", 60, 20),
                ("recv", 80, 2), ("mm", 82, 18)]
        labels = [("Forward 0", 0, 20), ("Forward 1", 20, 20), ("Backward 0", 40, 40), ("Backward 1", 80, 20)]
    else:
        plan = [("recv", 0, 20), ("mm", 20, 18), ("recv", 38, 2), ("mm", 40, 18), ("mm", 58, 18), ("send", 76, 2),
                ("mm", 78, 18), ("send", 96, 2)]
        labels = [("Forward 0", 0, 38), ("Forward 1", 38, 20), ("Backward 0", 58, 20), ("Backward 1", 78, 20)]
    events = []
    for step in (1, 2):
        t0 = (step - 1) * 100
        events.append(_x(f"ProfilerStep#{step}", t0, 100, cat="user_annotation"))
        events += [_x(n if names is None else names[rank][i], t0 + a, d, cat="user_annotation")
                   for i, (n, a, d) in enumerate(labels)]
        for what, a, d in plan:
            events += [_x("aten::mm", t0 + a, d)] if what == "mm" else _p2p(what, t0 + a, d, peer, with_peer)
    return events


def _view(tmp_path: Path, with_peer=True, names=None):
    run = tmp_path / "pp2"
    for r in (0, 1):
        write_trace(run / f"rank{r}.1795000000000000000.pt.trace.json.gz", _rank(r, with_peer, names),
                    distributed_info={"backend": "gloo", "rank": r, "world_size": 2, "pg_count": 1,
                                      "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                                                     "ranks": [0, 1]}]})
    scanned = discovery.scan_logdir(str(tmp_path))
    run_ = next(x for x in scanned.runs if x.name == "pp2")
    results = {w.name: [report.analyze_span(str(tmp_path), run_, s) for s in w.spans] for w in run_.workers}
    return ranks.rank_view(results)


def test_two_stage_gpipe_bubble(tmp_path):
    view = _view(tmp_path)
    pp = view["pipeline"]
    assert pp["available"] and pp["pipelines"] == [[0, 1]] and pp["stages"] == 2
    assert (pp["microbatches"], pp["microbatches_labelled"], pp["schedule"]) == (2, 2, "GPipe")
    # measured: 26 ms of each 100 ms step on both stages; theoretical (p-1)/(m+p-1) = 1/3
    for stage in pp["per_stage"]:
        assert stage["bubble_us_per_step"] == pytest.approx(26 * MS)
        assert stage["bubble_pct"] == pytest.approx(26.0)
        assert stage["busy_us_per_step"] == pytest.approx(74 * MS)
    assert [(s["stage"], s["step"], s["bubble_us"]) for s in pp["per_step"]] == [
        (0, 1, 26 * MS), (0, 2, 26 * MS), (1, 1, 26 * MS), (1, 2, 26 * MS)]
    assert pp["bubble_pct"] == pytest.approx(26.0)
    assert pp["theoretical_bubble_pct"] == pytest.approx(100 / 3)
    # advice priced on the 100 ms step: zero bubble <= the measured 26 ms; 2 -> 4 microbatches and
    # the interleaved schedule: 100 x (1/3 - 1/5) = 13.33 ms; stages balanced: no rebalancing
    adv = pp["advice"]
    assert [a["rule"] for a in adv] == ["pipeline_zero_bubble", "pipeline_microbatches", "pipeline_interleaved"]
    assert [a["saving_us_per_step"] for a in adv] == pytest.approx([26 * MS, 100 * MS * (1 / 3 - 1 / 5),
                                                                     100 * MS * (1 / 3 - 1 / 5)])
    assert "ScheduleInterleavedZeroBubble" in adv[0]["action"] and "ScheduleInterleaved1F1B" in adv[2]["action"]
    # the sends and receives are the pipeline's, not unmatched collectives of the group
    (g,) = view["process_groups"]
    assert (g["calls"], g["p2p_calls"], g["unmatched_calls"]) == (0, 16, 0)
    text = ranks.format_ranks_text(view)
    assert "pipeline: 2 stages x 1 replica(s), 2 microbatches, schedule GPipe; bubble 26.0% of the step " \
           "(theoretical 33.3%)" in text


def test_without_peers_the_pipeline_is_not_available(tmp_path):
    view = _view(tmp_path, with_peer=False)
    assert not view["pipeline"]["available"]
    assert "record_shapes=True" in view["not_available"]["ranks.pipeline"]


def test_demo_pipeline_2x2_bubbles_match_the_in_process_truth():
    """demo_logs/pipeline_2x2_4rank: 4 gloo ranks, 2 replicas x 2 GPipe stages
    (torch.distributed.pipelining, 4 microbatches, pipelines [0, 1] and [2, 3] on their own
    process groups, so the recorded peers are group-local). Each rank measured in-process the
    time inside the schedule's point-to-point calls per step (demo_truth.p2p_blocked_ms): per
    stage, the bubble read from the traces is within 10 % of it."""
    import gzip
    import json

    from conftest import DEMO_LOGS

    run = DEMO_LOGS / "pipeline_2x2_4rank"
    truth = {}
    for f in sorted(run.glob("*.pt.trace.json.gz")):
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        truth[doc["distributedInfo"]["rank"]] = doc["demo_truth"]
        settings = doc["demo_settings"]
    scanned = discovery.scan_logdir(str(DEMO_LOGS))
    run_ = next(x for x in scanned.runs if x.name == "pipeline_2x2_4rank")
    results = {w.name: [report.analyze_span(str(DEMO_LOGS), run_, s) for s in w.spans] for w in run_.workers}
    view = ranks.rank_view(results)
    pp = view["pipeline"]
    assert pp["pipelines"] == settings["pipelines"] == [[0, 1], [2, 3]]
    # the gradient all-reduces run on the data-parallel groups [0, 2] and [1, 3], but gloo's spans
    # name no group and each rank declares several: they are not matched across all four ranks
    (g,) = view["process_groups"]
    assert (g["name"], g["matched_calls"], g["unmatched_calls"]) == ("unknown", 0, g["calls"])
    assert "not matched" in view["not_available"]["ranks.process_groups.unknown"]
    assert view["straggler"] is None and view["straggler_cause"] is None
    assert (pp["stages"], pp["microbatches"], pp["schedule"]) == (2, settings["microbatches"], "GPipe")
    assert pp["theoretical_bubble_pct"] == pytest.approx(100 * 1 / (4 + 1))
    for stage in pp["per_stage"]:
        ours = sum(s["bubble_us"] for s in pp["per_step"] if s["stage"] == stage["stage"])
        want = sum(ms * MS for r in stage["ranks"] for ms in truth[r]["p2p_blocked_ms"])
        assert ours == pytest.approx(want, rel=0.10), (stage["stage"], ours, want)
        assert sorted(stage["ranks"]) == sorted(r for r, t in truth.items() if t["stage"] == stage["stage"])
    for s in pp["per_step"]:  # each rank's steps are the ones it measured
        assert s["step"] in truth[s["rank"]]["steps"]
    assert pp["advice"] and pp["advice"][0]["saving_us_per_step"] >= pp["advice"][-1]["saving_us_per_step"]


@pytest.mark.parametrize("names, schedule", [
    # the runtime schedules' action labels: two stages per rank (0 and 2 on rank 0): interleaved
    ({0: ["PP:0F0", "PP:2F0", "PP:2B0", "PP:0B0"], 1: ["PP:1F0", "PP:3F0", "PP:3B0", "PP:1B0"]}, "Interleaved 1F1B"),
    # backward split into input (I) and weight (W) gradients: zero bubble
    ({0: ["PP:0F0", "PP:0F1", "PP:0I0", "PP:0W0"], 1: ["PP:1F0", "PP:1F1", "PP:1I0", "PP:1W0"]}, "zero bubble"),
])
def test_schedule_from_the_action_labels(tmp_path, names, schedule):
    pp = _view(tmp_path, names=names)["pipeline"]
    assert pp["schedule"] == schedule
    assert pp["bubble_pct"] == pytest.approx(26.0)  # labels are not compute: the bubble is unchanged
