"""Issue 11 item 2: every card's colour (severity) comes from the server and follows from
the card's value and the named thresholds.py constants. This test re-derives each
severity independently (from the report's own numbers and thresholds.py, not through
verdicts.py or recommendations.py) for every span report and every worker/run summary
of ../shared/traces and demo_logs."""
import importlib.util
import os

import pytest

from tb_bottleneck_plugin import thresholds as T
from tb_bottleneck_plugin.judge import cards, verdicts
from tb_bottleneck_plugin.judge import recommendations as R

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
_spec = importlib.util.spec_from_file_location("before_after_record_v",
                                               os.path.join(HERE, "fixtures", "before_after", "record.py"))
rec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rec)

CARDS = {"input_bound", "gpu_utilization", "tensor_cores", "occupancy", "peak_memory", "allocator_slack",
         "sync", "communication", "short_kernels"}


@pytest.fixture(scope="module")
def reports():
    if not os.path.isdir(rec.LOGDIRS["shared"]):
        pytest.skip("../shared/traces not present")
    data = rec.record()
    out = []
    for key in ("shared", "demo"):
        out += [(f"{key} span {k}", v["report"]) for k, v in data[key]["spans"].items()]
        out += [(f"{key} summary {k}", v["report"]) for k, v in data[key]["summaries"].items()]
    out.append(("all shared spans", data["all_shared_summary"]["report"]))
    return out


def _level(v, medium, high):
    return "high" if v >= high else "medium" if v >= medium else "ok"


def _warmup(r):
    """A first-call warm-up outlier (METRICS §8/§9): small_kernels/host_bound stay silent."""
    launch = r.get("launch") or {}
    return (launch.get("longest_runtime_call_pct") or 0) >= T.WARMUP_CALL_RUNTIME_PCT \
        and (launch.get("longest_runtime_call_step_pct") or 0) >= T.WARMUP_CALL_STEP_PCT


def _capture_only(r):
    ctx = r.get("context") or {}
    return bool(ctx.get("cuda_graph_capture")) and not (ctx.get("evidence") or {}).get("graph_kernels")


def _small_kernel_reasons(r):
    if _warmup(r):
        return set(), None
    occ = r.get("occupancy") or {}
    short = occ.get("short_kernels") or {}
    reasons = set()
    if short.get("count") and (short.get("time_pct") or 0) >= T.SHORT_KERNEL_TIME_PCT and not _capture_only(r):
        reasons.add("short")
    if occ.get("est_achieved_occupancy_pct") is not None and occ["est_achieved_occupancy_pct"] < T.LOW_OCCUPANCY_PCT:
        # only kernel time the roofline does not judge compute-efficient counts (METRICS §6)
        from tb_bottleneck_plugin.analysis.flops import roofline_efficient
        from tb_bottleneck_plugin.analysis.occupancy import occupancy_without

        eff = roofline_efficient(r)
        if not eff or not eff["kernel_us"]:
            reasons.add("occupancy")
        elif eff["pct"] < T.ROOFLINE_EFFICIENT_PCT \
                and (occupancy_without(occ, eff["names"]) or 100.0) < T.LOW_OCCUPANCY_PCT:
            reasons.add("occupancy")
    utils = [g["utilization_pct"] for g in (r.get("gpu") or {}).values() if g.get("utilization_pct") is not None]
    if utils and sum(utils) / len(utils) < T.LOW_GPU_UTILIZATION_PCT and not _capture_only(r) \
            and not _compiler_idle(r) and isinstance(short.get("time_pct"), (int, float)) \
            and ((r.get("input") or {}).get("input_bound_pct") or 0) < T.INPUT_BOUND_MODERATE_PCT:
        reasons.add("gpu")
    severity = "medium" if len(reasons) > 1 or "gpu" in reasons else "low"
    return reasons, severity


def _compiler_idle(r) -> bool:
    """The GPU idles because the host compiles (steady recompiles in the steps): idle minus
    the compile share of the step under a tenth of the low-utilization threshold."""
    c = r.get("compilation") or {}
    utils = [g["utilization_pct"] for g in (r.get("gpu") or {}).values() if g.get("utilization_pct") is not None]
    if not (c.get("steady_recompiles") and c.get("compile_pct") and utils):
        return False
    util = sum(utils) / len(utils)
    idle = max(0.0, 100 - util - ((r.get("input") or {}).get("input_bound_pct") or 0))
    return util < T.LOW_GPU_UTILIZATION_PCT and idle - c["compile_pct"] < T.LOW_GPU_UTILIZATION_PCT / 10


# Cards that read kernel statistics: not judged below MIN_KERNELS_TO_JUDGE kernels (issue 20)
KERNEL_CARDS = {"gpu_utilization", "occupancy", "short_kernels", "tensor_cores", "mfu", "communication"}


def _too_little_data(card, r) -> bool:
    """Issue 20's guard: too few trace events for any card, too few kernels for the
    kernel-statistics cards (thresholds MIN_EVENTS_TO_JUDGE, MIN_KERNELS_TO_JUDGE)."""
    t = r.get("trace") or {}
    events, kernels = t.get("events"), t.get("kernels")
    if not events:
        return False
    return events < T.MIN_EVENTS_TO_JUDGE or (card in KERNEL_CARDS and kernels is not None
                                               and kernels < T.MIN_KERNELS_TO_JUDGE)


def expected(card, r, v):
    value = v["value"]
    if _too_little_data(card, r):
        return "none"
    reasons, sk_severity = _small_kernel_reasons(r)
    if card == "input_bound":
        # the wait, or synchronous (pageable) input copies of INPUT_TRANSFER_PCT or more on the
        # same scale (issue 34 item 4), the louder
        wait = _level(value, T.INPUT_BOUND_MODERATE_PCT, T.INPUT_BOUND_HIGH_PCT)
        inp = r.get("input") or {}
        transfer = inp.get("input_transfer_pct") or 0.0
        if not (inp.get("evidence") or {}).get("pageable_h2d_copies") or transfer < T.INPUT_TRANSFER_PCT:
            return wait
        copies = "low" if transfer < T.INPUT_BOUND_MODERATE_PCT else _level(transfer, T.INPUT_BOUND_MODERATE_PCT,
                                                                             T.INPUT_BOUND_HIGH_PCT)
        order = ("ok", "low", "medium", "high")
        return max(wait, copies, key=order.index)
    if card == "gpu_utilization":
        if "gpu" in reasons:
            return sk_severity
        # not read by any rule here: uncoloured ("none"), never a green "ok"
        no_stats = not isinstance(((r.get("occupancy") or {}).get("short_kernels") or {}).get("time_pct"), (int, float))
        not_judged = _warmup(r) or _capture_only(r) or _compiler_idle(r) or (no_stats and value < T.LOW_GPU_UTILIZATION_PCT) or \
            ((r.get("input") or {}).get("input_bound_pct") or 0) >= T.INPUT_BOUND_MODERATE_PCT
        return "none" if not_judged else "ok"
    if card == "occupancy":
        return sk_severity if "occupancy" in reasons else "none" if _warmup(r) else "ok"
    if card == "short_kernels":
        return sk_severity if "short" in reasons else "none" if _warmup(r) or _capture_only(r) else "ok"
    if card == "tensor_cores":
        return _level(r["tensor_cores"]["eligible_not_using_pct"] or 0, T.TC_ELIGIBLE_NOT_USING_PCT,
                      T.TC_ELIGIBLE_NOT_USING_HIGH_PCT)
    if card == "peak_memory":
        leak = any((m.get("growth") or {}).get("possible_leak") for m in (r.get("memory") or {}).values())
        return "medium" if leak else "ok"
    if card == "allocator_slack":
        # issue 20: judged only under memory pressure (peak reserved >= MEMORY_PRESSURE_PCT of capacity)
        judged = [m["slack_fragmentation_pct"] for m in (r.get("memory") or {}).values()
                  if m.get("slack_fragmentation_pct") is not None
                  and (m.get("peak_reserved_bytes") or 0) >= T.SLACK_MIN_RESERVED_BYTES
                  and m.get("capacity_bytes")
                  and 100 * m["peak_reserved_bytes"] / m["capacity_bytes"] >= T.MEMORY_PRESSURE_PCT]
        if judged:
            return _level(max(judged), T.SLACK_FRAGMENTATION_PCT, T.SLACK_FRAGMENTATION_HIGH_PCT)
        # under the reserve floor, capacity unknown or memory to spare: not judged (uncoloured)
        return "none"
    if card == "sync":
        if R.capture_only(r):  # captured, never replayed: not judged
            return "none"
        # the GPU idle the syncs cause: during the wait plus after it (§8)
        s = r.get("sync") or {}
        cost = (s.get("sync_gpu_idle_pct") or 0) + (s.get("sync_refill_idle_pct") or 0)
        return _level(cost, T.SYNC_PCT, T.SYNC_HIGH_PCT)
    if card == "communication":
        overlap = r["communication"].get("overlap_pct")
        if value < T.COMM_SHARE_PCT or (overlap is not None and overlap >= T.COMM_OVERLAP_OK_PCT) \
                or (r.get("context") or {}).get("distributed") is False:
            return "ok"
        return "high" if value * (1 - (overlap or 0) / 100) >= T.COMM_EXPOSED_HIGH_PCT else "medium"
    if card == "d2d_copies":  # device-to-device copies, % of step time (METRICS.md §8)
        return _level(value, T.D2D_COPY_PCT, T.D2D_COPY_HIGH_PCT)
    if card == "compilation":  # analysis/compilation.py's own scale (METRICS.md §16)
        c = r["compilation"]
        if not c["has_regions"]:
            return "none"
        if c["steady_recompiles"]:
            per_step = c["steady_recompiles"] / c["steps"]
            return "high" if per_step >= T.COMPILE_RECOMPILES_PER_STEP else "medium"
        return "medium" if c["breaks_per_step"] >= T.COMPILE_BREAKS_PER_STEP else "ok"
    if card == "mfu":  # analysis/flops.py's own scale (METRICS.md §15)
        return "medium" if value < T.MFU_LOW_PCT else "low" if value < T.MFU_MODERATE_PCT else "ok"
    raise AssertionError(card)


def test_every_card_colour_follows_from_value_and_thresholds(reports):
    seen = {}
    for where, r in reports:
        assert set(r["verdicts"]) >= CARDS, where
        for card, v in r["verdicts"].items():
            # The thresholds it names are thresholds.py's constants, with their values.
            assert v["thresholds"], (where, card)
            for name, number in v["thresholds"].items():
                assert getattr(T, name) == number, (where, card, name)
            assert isinstance(v["verdict"], str) and v["verdict"], (where, card)
            if v["value"] is None:
                assert v["severity"] == "na", (where, card)
                continue
            want = expected(card, r, v)
            # a rule that fired but that the step model prices under GAIN_INFO_PCT (METRICS §19)
            # colours its card "info": the number is there, the fix would not pay
            # ... and under VERDICT_MIN_GAIN_PCT a high/medium rule is "low" (METRICS §19)
            priced = [x for x in r["recommendations"] if x["rule"] == v["rule"]
                      and x.get("gain_source") == "step_model" and x["severity"] in ("info", "low")]
            if priced and want not in ("ok", "none", "low") and card not in ("input_bound", "compilation", "mfu"):
                gain = priced[0]["estimated_gain_pct"]
                assert gain < (T.GAIN_INFO_PCT if priced[0]["severity"] == "info" else T.VERDICT_MIN_GAIN_PCT), \
                    (where, card)
                want = priced[0]["severity"]
            assert v["severity"] == want, (where, card, v, want)
            seen.setdefault(card, set()).add(v["severity"])
            if v["severity"] not in ("ok", "none", "na") and card not in ("input_bound", "compilation", "mfu"):
                fired = [x for x in r["recommendations"] if x["rule"] == v["rule"]]
                assert fired and fired[0]["severity"] == v["severity"], (where, card)
    # The traces exercise both colours of every card that has data, and n/a (allocator slack:
    # no device of the traces is near full, so it is never judged: "none", issue 20).
    for card in ("input_bound", "gpu_utilization", "tensor_cores", "occupancy", "short_kernels",
                 "communication"):
        assert seen[card] - {"ok", "none"} and "ok" in seen[card], (card, seen[card])
    assert seen["allocator_slack"] == {"none"}, seen["allocator_slack"]
    # ... and "not judged" (uncoloured) where the rules do not read the number: GPU utilization
    # of input-bound runs and the MI250 warm-up, slack under 1 GiB reserved, MI250 short kernels
    for card in ("gpu_utilization", "allocator_slack", "short_kernels"):
        assert "none" in seen[card], (card, seen[card])
    for where, r in reports:
        for v in r["verdicts"].values():
            if v["severity"] == "none":
                assert "not judged" in v["verdict"], (where, v)


def test_warmup_outlier_fires_only_where_one_call_holds_the_steps(reports):
    """Over every span and summary of the shared traces and demo_logs: the warm-up rule fires
    exactly where the launch section says one call holds >= the thresholds (among them the
    MI250 span, whose first hipLaunchKernel holds 97 % of the runtime time, pinned to the raw
    JSON in test_recommendations_warmup.py), and small_kernels/host_bound never fire beside it."""
    fired = {where for where, r in reports if any(x["rule"] == "warmup_outlier" for x in r["recommendations"])}
    assert fired == {where for where, r in reports if _warmup(r)}
    assert any("amd_trace" in where for where in fired), fired
    for where, r in reports:
        if where in fired:
            assert not {x["rule"] for x in r["recommendations"]} & {"small_kernels", "host_bound"}, where


def test_card_values_are_the_numbers_the_report_shows(reports):
    for where, r in reports:
        v = r["verdicts"]
        assert v["input_bound"]["value"] == (r.get("input") or {}).get("input_bound_pct"), where
        assert v["tensor_cores"]["value"] == (r.get("tensor_cores") or {}).get("tensor_core_pct"), where
        assert v["occupancy"]["value"] == (r.get("occupancy") or {}).get("est_achieved_occupancy_pct"), where
        assert v["communication"]["value"] == (r.get("communication") or {}).get("comm_pct_of_kernel_time"), where
        utils = [g["utilization_pct"] for g in (r.get("gpu") or {}).values() if g.get("utilization_pct") is not None]
        if utils:
            assert v["gpu_utilization"]["value"] == pytest.approx(sum(utils) / len(utils)), where
        dev = v["peak_memory"]["device"]
        if dev is not None:
            assert dev.startswith("cuda:") or not any(k.startswith("cuda:") for k in r["memory"]), where
            assert v["peak_memory"]["value"] == r["memory"][dev]["peak_allocated_bytes"], where


def test_na_verdict_is_the_reason():
    """A null value: severity na and the not_available reason as the words."""
    rep = {"input": None, "not_available": {"input": "needs steps, which failed (boom)"}, "recommendations": []}
    v = cards.card_verdicts(rep)
    assert v["input_bound"]["severity"] == "na"
    assert v["input_bound"]["verdict"] == "needs steps, which failed (boom)"
    assert all(c["severity"] == "na" for c in v.values())


def test_every_card_id_has_one_function_and_every_function_a_card():
    """Units name their cards by id (data); judge/cards.py holds the functions. An id without
    a function would only show up at run time, as an n/a "internal error" card, and a function
    no unit (nor cards.CARDS) names would never run: both are caught here."""
    from tb_bottleneck_plugin.analysis import registry
    from tb_bottleneck_plugin.judge import cards

    ids = list(cards.CARDS) + [c for u in registry.UNITS for c in u.cards]
    assert ids and all(isinstance(c, str) for c in ids), ids
    assert len(ids) == len(set(ids)), ids
    assert set(ids) == set(cards.CARD_FUNCTIONS), (set(ids) ^ set(cards.CARD_FUNCTIONS))
    assert CARDS < set(ids)
    with pytest.raises(ValueError, match="already has a function"):
        cards.register("mfu")(lambda rep: {})


def test_a_card_id_without_a_function_is_an_na_card_not_an_exception(monkeypatch):
    from tb_bottleneck_plugin.judge import cards

    monkeypatch.delitem(cards.CARD_FUNCTIONS, "mfu")
    v = cards.card_verdicts({"recommendations": []})
    assert v["mfu"]["severity"] == "na" and "internal error in verdict mfu" in v["mfu"]["verdict"]
    assert v["input_bound"]["severity"] == "na" and "internal error" not in v["input_bound"]["verdict"]


def test_no_threshold_number_is_compared_outside_thresholds_py():
    """Issue 11: grep finds each threshold once. No comparison in the package compares with a
    literal equal to a thresholds.py value (0-3 excepted: counts and indices)."""
    import ast
    from pathlib import Path

    import tb_bottleneck_plugin

    values = {v for k, v in vars(T).items() if k.isupper() and isinstance(v, (int, float))}
    assert {20.0, 5.0, 50.0, 30.0, 1 << 30} <= values
    pkg = Path(tb_bottleneck_plugin.__file__).parent
    found = []
    for path in pkg.rglob("*.py"):
        if path.name == "thresholds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left] + node.comparators:
                    v = getattr(side, "value", None) if isinstance(side, ast.Constant) else None
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v in values and v not in (0, 1, 2, 3):
                        found.append(f"{path.relative_to(pkg)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_gpu_cards_are_na_with_the_gpu_reason_on_cpu_only_traces(reports):
    """A CPU-only trace has no GPU to starve or to share kernel time with: the
    synchronisation and communication cards are n/a with the trace's own gpu reason,
    never "ok" with words about a GPU that is not there."""
    cpu_only = [(where, r) for where, r in reports
                if "gpu" in (r.get("not_available") or {}) and not r.get("gpu")]
    assert len(cpu_only) >= 2  # the generated CPU traces and the demo's CPU pair
    for where, r in cpu_only:
        for card in ("sync", "communication", "gpu_utilization", "tensor_cores", "occupancy"):
            v = r["verdicts"][card]
            assert v["severity"] == "na" and v["value"] is None, (where, card, v)
            assert "GPU" in v["verdict"], (where, card, v["verdict"])
