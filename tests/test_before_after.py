"""Issue 11: every number the JSON report, the worker/run summaries, the kernel/memory
results, the rank view and the CLI text show is unchanged on all of ../shared/traces
and demo_logs, against a golden file recorded by the code before the metric-unit
refactor (tests/fixtures/before_after/record.py). New keys (e.g. "verdicts") are
allowed; a removed key or a changed number fails."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("before_after_record",
                                               os.path.join(HERE, "fixtures", "before_after", "record.py"))
rec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rec)

pytestmark = pytest.mark.skipif(not os.path.isdir(rec.LOGDIRS["shared"]), reason="../shared/traces not present")


# Numbers the refactor corrected on purpose, each checked below against its definition.
# The code before the refactor summed a summary's "kernel time" for the communication share
# only over spans whose own share was a non-zero number, so a run whose spans all had 0 µs
# of communication got null instead of 0 %, and a group mixing spans with and without
# communication got a share of the wrong denominator (metrics §8: comm µs / Union of all
# kernels, summed over the spans).
COMM = "/report/communication/comm_pct_of_kernel_time"
CORRECTIONS = {
    "/shared/summaries/kineto-tb-samples/resnet50_num_workers_0|worker0" + COMM: "0 % (was null)",
    "/shared/summaries/kineto-tb-samples/resnet50_num_workers_4|worker0" + COMM: "0 % (was null)",
    "/all_shared_summary" + COMM: "Σ comm µs / Σ kernel-union µs over all 14 spans",
    # ... whereupon the communication rule no longer fires for the all-spans summary (12 % < 15 %)
    "/all_shared_summary/report/recommendations": "no communication recommendation",
    # sev3b: one 6.5 ms first hipLaunchKernel holds 97 % of the runtime time of the MI250 step
    # (METRICS §8 longest runtime call): warmup_outlier ("profile after warm-up") replaces the
    # small_kernels launch advice (tests/test_recommendations_warmup.py pins it to the raw JSON)
    "/shared/spans/hta/amd_trace|mi250_minitoy_train_ROCm6_2_kineto|mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    "/report/recommendations": "warmup_outlier replaces small_kernels",
}

# sev3b: the host-bound advice (GPU idle, kernels neither short nor low-occupancy) has its own
# rule id; same severity, numbers and gain as when it was called small_kernels.
RENAMED_RULES = {"host_bound": "small_kernels"}


# Parts of the results removed on purpose (a removed key fails the diff otherwise).
# "operators", the per-name CPU operator and kernel tables of the included steps that only
# compare.py read, defined per-op self time a second way (no runtime-call subtraction, no
# same-name merge, clipped to the stretched steps). The comparison now sums the Operator
# view (METRICS §13, pinned to torch-tb-profiler's live numbers in tests/test_operators.py)
# and the §6 kernel table instead (METRICS §11); test_removed_parts_are_gone checks that.
REMOVED = {"operators": "replaced by operator_view (METRICS §11, §13): one definition of op time"}


# Summaries' per-step parts changed shape on purpose (issue 14, 1,000 ranks): one row per step
# number ACROSS the spans (mean of each field over the spans that have the step, min/max and
# the worker/span of the maximum; memory growth without ts_us, each span's clock being its
# own), and steps.numbers/excluded once per number, so a summary grows with steps, not spans
# x steps (METRICS.md §1). A span's own rows are unchanged. test_summary_per_step_rows_are_
# the_spans_rows_grouped_by_step recomputes every such row from the golden SPAN rows by hand.
PER_STEP = ("/report/breakdown_per_step", "/report/input/per_step", "/report/steps/numbers",
            "/report/steps/excluded")


def _summary_bases(golden) -> dict:
    """{path of a summary in the golden file: (logdir, prefix of its spans' keys or None = all)}."""
    out = {"/all_shared_summary": ("shared", None)}
    for logdir in ("shared", "demo"):
        for name in golden[logdir]["summaries"]:
            run, worker = name.split("|")
            out[f"/{logdir}/summaries/{name}"] = (logdir, f"{run}|" if worker == "*" else f"{run}|{worker}|")
    return out


def _per_step_paths(golden) -> set:
    out = set()
    for base in _summary_bases(golden):
        node = golden["all_shared_summary"] if base == "/all_shared_summary" else \
            golden[base.split("/")[1]]["summaries"][base.split("/", 3)[3]]
        out |= {base + p for p in PER_STEP}
        out |= {f"{base}/report/memory/{dev}/growth/per_step" for dev in (node["report"].get("memory") or {})}
    return out


# Words of recommendations changed on purpose in 64207fd (advice that fits the trace: CPU-only
# DataLoader advice without pin_memory, 'GPU 1' for 'cuda:1', 'host does not keep it busy',
# no-deviceProperties Tensor Core advice; METRICS.md §9, tested in test_recommendations*).
# Their rules, severities, numbers and gains are still compared here; only title, action and
# evidence text (and the CLI lines that print them) are masked.
WORDS = ("title", "action", "evidence")


# efc5e73: the allocator_slack rule's numbers are bytes (peak_reserved_bytes/peak_allocated_bytes)
# instead of GiB rounded to 2 decimals, so the tab formats them with a unit; compared here as the
# GiB they were (test_allocator_numbers_are_the_same_peaks_in_bytes checks the bytes themselves).
GIB_KEYS = {"peak_reserved_bytes": "peak_reserved_gib", "peak_allocated_bytes": "peak_allocated_gib"}


def _as_gib(numbers: dict) -> dict:
    return {GIB_KEYS.get(k, k): (round((v or 0) / (1 << 30), 2) if k in GIB_KEYS else v) for k, v in numbers.items()}


def _mask_words(value, key=None):
    if isinstance(value, dict):
        if key in ("recommendation", "cause") or "rule" in value:
            out = {k: ("<words>" if k in WORDS else _mask_words(v, k)) for k, v in value.items()}
            if out.get("rule") in RENAMED_RULES:
                out["rule"] = RENAMED_RULES[out["rule"]]
            if value.get("rule") == "allocator_slack" and isinstance(out.get("numbers"), dict):
                out["numbers"] = _as_gib(out["numbers"])
            return out
        return {k: _mask_words(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_words(v, key) for v in value]
    return value


# 6977612: the CLI names step categories as the tab's legend does and says "matrix cores" on AMD.
CATEGORY_WORDS = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "communication": "Communication",
                  "runtime": "Runtime", "dataloader": "DataLoader", "cpu_exec": "CPU Exec", "other": "Other (idle)"}


def _text_words(line: str, amd: bool) -> str:
    import re

    if line.lstrip().startswith("average step "):
        line = re.sub(r"\b(%s) (\d+\.\d%%)" % "|".join(CATEGORY_WORDS),
                      lambda m: f"{CATEGORY_WORDS[m.group(1)]} {m.group(2)}", line)
    if amd and re.match(r"^\s*GPU \S+: ", line):
        line = line.replace("Tensor Cores ", "matrix cores ")
    return line


# polish3c: `report`'s rank table shows the five parts the Ranks tab draws (ranks.py BAR_KEYS,
# METRICS §12): "input" (the DataLoader wait as % of the rank's step time) between "exposed"
# and "other", the wait taken out of compute/other, and a legend line under the header; the
# old table had the four-way split and the rank's input-bound % last. Each changed row is
# checked against the old row's own numbers: rank, worker, step, overlap, exposed and the
# totals unchanged; the input part = the old input-bound % (the rank's report, §3); compute
# and other only lose what the input part took (new compute + input + other = old compute +
# other, neither grows), to the 0.1 % the table prints (tests/test_ranks_cli_parts.py pins
# the parts on a hand-built run).
RANK_HEADER_OLD = ("rank worker step ms compute overlap exposed other input% stragl wait ms xfer ms")
RANK_HEADER_NEW = ("rank worker step ms compute overlap exposed input other stragl wait ms xfer ms")
RANK_LEGEND = "(% of step time, the five parts the tab draws: the input wait (DataLoader)"


def _rank_row_five_parts(old: str, new: str) -> bool:
    a, b = old.split(), new.split()
    if len(a) != 11 or len(b) != 11 or a[:3] != b[:3] or a[4:6] != b[4:6] or a[8:] != b[8:]:
        return False
    try:
        compute, other, input_pct = float(a[3].rstrip("%")), float(a[6].rstrip("%")), float(a[7].rstrip("%"))
        n_compute, n_input, n_other = (float(v.rstrip("%")) for v in (b[3], b[6], b[7]))
    except ValueError:
        return False
    return (abs(n_input - input_pct) <= 0.1 + 1e-9 and n_compute <= compute + 1e-9 and n_other <= other + 1e-9
            and abs((n_compute + n_input + n_other) - (compute + other)) <= 0.15 + 1e-9)


def _text_lines_match(old: str, new: str) -> list:
    """CLI text: same lines, except recommendation words (same severity tag), a summary's
    'steps [...]' list, now each step number once, and 6977612's words (_text_words; "matrix
    cores" only in the block of a span whose GPU is AMD's)."""
    import ast
    import re

    a, b = old.splitlines(), new.splitlines()
    b = [ln for ln in b if not ln.strip().startswith(RANK_LEGEND)]  # the rank table's new legend line
    bad = [] if len(a) == len(b) else [f"{len(a)} lines now {len(b)}"]
    amd = False
    rank_table = False
    for i, (x, y) in enumerate(zip(a, b)):
        if " ".join(x.split()) == RANK_HEADER_OLD and " ".join(y.split()) == RANK_HEADER_NEW:
            rank_table = True
            continue
        if rank_table and _rank_row_five_parts(x, y):
            continue
        rank_table = rank_table and x.split()[:1] != [] and x.split()[0].isdigit()
        if x.lstrip().startswith(("worker ", "run ")):
            amd = False
        if re.match(r"^\s*GPU devices: .*\b(AMD|Radeon|Instinct|MI\d+)", x):
            amd = True
        x = _text_words(x, amd)
        if x == y:
            continue
        sx, sy = x.strip(), y.strip()
        tag = re.compile(r"^\[(high|medium|low)\] ")
        mx, my = tag.match(sx), tag.match(sy)
        if sx.startswith("->") and sy.startswith("->") or (mx and my and mx.group(0) == my.group(0)):
            continue
        if sx.startswith("steps [") and sy.startswith("steps ["):
            nums = ast.literal_eval(sx[len("steps "):].split("]")[0] + "]")
            if sy.startswith(f"steps {sorted(set(nums))}") and len(nums) > len(set(nums)):
                continue
        bad.append(f"line {i + 1}: {x!r} -> {y!r}")
    return bad


def _diff(golden, now, skip=()) -> list:
    """rec.diff without the documented changes: per-step summary rows, recommendation words,
    the CLI text (compared by _text_lines_match)."""
    skip = set(skip) | _per_step_paths(golden) | {"/shared/text", "/demo/text"}
    out = rec.diff(_mask_words(golden), _mask_words(now), skip=skip)
    for logdir in ("shared", "demo"):
        out += [f"/{logdir}/text {p}" for p in _text_lines_match(golden[logdir]["text"], now[logdir]["text"])]
    return out


def _removed_paths(golden) -> set:
    out = {f"/all_shared_summary/{key}" for key in REMOVED}
    for logdir in ("shared", "demo"):
        for part in ("spans", "summaries"):
            out |= {f"/{logdir}/{part}/{name}/{key}" for name in golden[logdir][part] for key in REMOVED}
    return out


@pytest.fixture(scope="module")
def now():
    return rec.record()


def test_every_number_unchanged_on_all_traces(now):
    golden = rec.load_golden()
    # The golden file covers every trace of the shared set and of demo_logs.
    assert len(golden["shared"]["spans"]) == 14 and len(golden["demo"]["spans"]) == 11
    problems = _diff(golden, now, skip=set(CORRECTIONS) | _removed_paths(golden))
    assert not problems, "\n".join(problems)


def test_removed_parts_are_gone_and_compare_reads_the_operator_view(now):
    from tb_bottleneck_plugin import compare, discovery, report
    from tb_bottleneck_plugin.analysis import operators

    golden = rec.load_golden()
    paths = _removed_paths(golden)
    assert len(paths) == 1 + sum(len(golden[d][p]) for d in ("shared", "demo") for p in ("spans", "summaries"))
    assert all(_diff(golden, now, skip=set(CORRECTIONS) | paths - {p}) for p in sorted(paths)[:3])
    # what replaced it: a span's compare rows are its Operator view summed per name ÷ steps
    logdir = discovery.discover_path(os.path.join(rec.LOGDIRS["shared"], "kineto-tb-samples",
                                                  "resnet50_num_workers_0"))
    run, _, span = next(iter(logdir.spans()))
    res = report.analyze_span(logdir.url, run, span)
    assert "operators" not in res and res["operator_view"]["steps"]
    n = res["report"]["steps"]["count"]
    named = operators.name_totals(res["operator_view"])
    totals = {compare.normalise_op_name(r["name"]): r for r in named}  # one DataLoader name: no merge
    rows = compare.compare(res, res)["ops"]["rows"]
    assert len(rows) == len(totals) == len(named) > 50
    for r in rows:
        t = totals[r["name"]]
        assert r["base_self_us_per_step"] == pytest.approx(t["self_us"] / n, abs=1e-9)
        assert r["base_calls_per_step"] == t["calls"] / n and r["status"] == "same"


def test_the_corrections_are_real_and_right(now):
    golden = rec.load_golden()
    for path in CORRECTIONS:
        assert _diff(golden, now, skip=set(CORRECTIONS) - {path}), f"{path} no longer differs: drop it"

    def comm_share(spans):
        comm = sum(s["report"]["communication"]["comm_us"] for s in spans)
        union = sum(s["report"]["communication"]["kernel_union_us"] for s in spans)
        return 100.0 * comm / union

    for run in ("resnet50_num_workers_0", "resnet50_num_workers_4"):
        spans = [v for k, v in now["shared"]["spans"].items() if k.startswith(f"kineto-tb-samples/{run}|")]
        assert len(spans) == 2 and comm_share(spans) == 0.0
        assert now["shared"]["summaries"][f"kineto-tb-samples/{run}|worker0"]["report"]["communication"][
            "comm_pct_of_kernel_time"] == 0.0
    share = now["all_shared_summary"]["report"]["communication"]["comm_pct_of_kernel_time"]
    assert share == pytest.approx(comm_share(list(now["shared"]["spans"].values())), rel=1e-9)
    assert share < 15.0 and "communication" not in {r["rule"] for r in now["all_shared_summary"]["report"][
        "recommendations"]}
    old = [r["rule"] for r in golden["all_shared_summary"]["report"]["recommendations"]]
    assert [r["rule"] for r in now["all_shared_summary"]["report"]["recommendations"]] == \
        [r for r in old if r != "communication"]


def test_diff_catches_changes():
    """The comparison itself: a changed number, a removed key, a changed text line fail; a new key does not."""
    old = {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl2"}
    assert rec.diff(old, {"a": {"x": 1.0 + 1e-12, "y": [1, 2], "new": 3}, "t": "l1\nl2"}) == []
    assert rec.diff(old, {"a": {"x": 1.001, "y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl3"})
    assert rec.diff(old, {"a": {"x": None, "y": [1, 2]}, "t": "l1\nl2"})


def _grouped_by_hand(rows, fields, rank_key):
    """The independent reference: per step number, the mean of each field over the spans that
    have it, min/max of rank_key and the first span holding the max (plain Python)."""
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    for step in sorted(by_step):
        g = by_step[step]
        ref = {"step": step, "spans": len(g)}
        for f in fields:
            vals = [r.get(f) for r in g]
            ref[f] = None if any(v is None for v in vals) else sum(vals) / len(vals)
        known = [r for r in g if r.get(rank_key) is not None]
        top = max(known, key=lambda r: r[rank_key]) if known else None  # max() keeps the first on a tie
        ref[f"min_{rank_key}"] = min(r[rank_key] for r in known) if known else None
        ref[f"max_{rank_key}"] = top[rank_key] if top else None
        ref["max_worker"], ref["max_span"] = (top["worker"], top["span"]) if top else (None, None)
        out.append(ref)
    return out


def _close(got, want):
    assert set(want) <= set(got), (sorted(want), sorted(got))
    for k, v in want.items():
        if isinstance(v, float):
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
        else:
            assert got[k] == v, k


def test_summary_per_step_rows_are_the_spans_rows_grouped_by_step(now):
    """Every changed per-step part of every summary, recomputed from the golden file's SPAN
    reports (recorded by the code before the change) by hand: PER_STEP above."""
    golden = rec.load_golden()
    checked = 0
    for base, (logdir, prefix) in _summary_bases(golden).items():
        spans = [v["report"] for k, v in golden[logdir]["spans"].items() if prefix is None or k.startswith(prefix)]
        summary = now["all_shared_summary"] if base == "/all_shared_summary" else \
            now[logdir]["summaries"][base.split("/", 3)[3]]
        rep = summary["report"]
        assert len(spans) == len(rep["spans"]) > 1

        def tagged(r, rows):
            return [dict(x, worker=r["worker"], span=r["span"]) for x in rows]

        bd = [x for r in spans for x in tagged(r, r["breakdown_per_step"])]
        cats = ("total_us", "kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec",
                "other")
        want = _grouped_by_hand(bd, cats, "total_us")
        assert len(rep["breakdown_per_step"]) == len(want)
        for got, ref in zip(rep["breakdown_per_step"], want):
            _close(got, ref)
        inp = [x for r in spans if isinstance(r.get("input"), dict) for x in tagged(r, r["input"]["per_step"])]
        want = _grouped_by_hand(inp, ("dataloader_us", "step_us"), "input_bound_pct")
        for ref in want:
            ref["input_bound_pct"] = 100.0 * ref["dataloader_us"] / ref["step_us"] if ref["step_us"] else 0.0
        assert len(rep["input"]["per_step"]) == len(want)
        for got, ref in zip(rep["input"]["per_step"], want):
            _close(got, ref)
        for dev, mem in (rep.get("memory") or {}).items():
            rows = [x for r in spans for x in tagged(r, (((r.get("memory") or {}).get(dev) or {}).get("growth")
                                                         or {}).get("per_step") or [])]
            want = _grouped_by_hand(rows, ("allocated_bytes",), "allocated_bytes")
            assert len(mem["growth"]["per_step"]) == len(want)
            for got, ref in zip(mem["growth"]["per_step"], want):
                _close(got, ref)
                checked += 1
        numbers = [n for r in spans for n in r["steps"]["numbers"]]
        assert rep["steps"]["numbers"] == sorted(set(numbers)) and rep["steps"]["count"] == len(numbers)
        excl = {}
        for r in spans:
            for e in r["steps"]["excluded"]:
                excl.setdefault((e["number"], e["reason"]), []).append(e)
        assert [(e["number"], e["reason"], e["spans"]) for e in rep["steps"]["excluded"]] == \
            [(n, why, len(es)) for (n, why), es in excl.items()]
        checked += len(rep["breakdown_per_step"]) + len(rep["input"]["per_step"])
    assert checked > 100
    # ... and the rows really changed (several spans share step numbers in these summaries)
    old = golden["demo"]["summaries"]["ddp_straggler_2rank|*"]["report"]["breakdown_per_step"]
    new = now["demo"]["summaries"]["ddp_straggler_2rank|*"]["report"]["breakdown_per_step"]
    assert len(old) == 2 * len(new) and all(r["spans"] == 2 for r in new)


def test_recommendation_words_changed_only_where_64207fd_says(now):
    """The masked words: every recommendation keeps its rule, severity and numbers (compared
    unmasked here); the CPU-only DataLoader advice no longer says pin_memory."""
    golden = rec.load_golden()

    def recs(d, path=""):
        if isinstance(d, dict):
            for k, v in d.items():
                if k == "recommendations" and isinstance(v, list):
                    yield path, v
                else:
                    yield from recs(v, f"{path}/{k}")

    new = dict(recs(now))
    changed = 0
    for path, old_list in recs(golden):
        if path.startswith("/all_shared_summary") or path + "/recommendations" in CORRECTIONS:
            continue  # CORRECTIONS: the communication rule no longer fires there; the MI250 warm-up
        new_list = new[path]
        assert [(r["rule"], r["severity"], r.get("numbers"), r.get("estimated_gain_pct")) for r in old_list] == \
            [(RENAMED_RULES.get(r["rule"], r["rule"]), r["severity"], _as_gib(r["numbers"]) if r["rule"] == "allocator_slack" else r.get("numbers"),
              r.get("estimated_gain_pct")) for r in new_list], path
        for o, n in zip(old_list, new_list):
            if o["rule"] == "input_bound" and o["action"] != n["action"]:
                assert "pin_memory" in o["action"] and "pin_memory" not in n["action"] and "CPU-only" in n["action"]
            changed += o != n
    assert changed >= 10


def test_allocator_numbers_are_the_same_peaks_in_bytes(now):
    """efc5e73's allocator_slack numbers: the device's own peak bytes (the GiB the golden file
    holds, unrounded)."""
    golden = rec.load_golden()
    seen = 0
    for key, span in now["shared"]["spans"].items():
        rep = span["report"]
        for r in rep["recommendations"] or []:
            if r["rule"] != "allocator_slack":
                continue
            nums = r["numbers"]
            peaks = {(m.get("peak_reserved_bytes"), m.get("peak_allocated_bytes"))
                     for m in (rep.get("memory") or {}).values() if isinstance(m, dict)}
            assert (nums["peak_reserved_bytes"], nums["peak_allocated_bytes"]) in peaks
            old = next(o for o in golden["shared"]["spans"][key]["report"]["recommendations"]
                       if o["rule"] == "allocator_slack")["numbers"]
            assert _as_gib(nums) == old
            seen += 1
    assert seen >= 1


def test_rank_table_exception_checks_each_row():
    """The five-part rank table exception (polish3c) accepts only rows whose parts follow from
    the old row: the demo's rank 0 as recorded and as printed now, then broken copies."""
    old = "        0 rank0              199.32    90.9%     0.0%     4.1%     5.0%   82.6%      1     14.87      5.53"
    new = "        0 rank0              199.32     8.3%     0.0%     4.1%    82.6%     5.0%      1     14.87      5.53"
    assert _rank_row_five_parts(old, new)
    assert not _rank_row_five_parts(old, new.replace("82.6%", "80.0%"))  # input part != input-bound %
    assert not _rank_row_five_parts(old, new.replace(" 8.3%", "10.3%"))  # parts no longer add up
    assert not _rank_row_five_parts(old, new.replace("14.87", "14.88"))  # a total changed
    head = ("     rank worker            step ms  compute  overlap  exposed    input    other stragl   wait ms   xfer ms\n"
            "    (% of step time, the five parts the tab draws: the input wait (DataLoader) taken out of ...)\n")
    old_head = "     rank worker            step ms  compute  overlap  exposed    other  input% stragl   wait ms   xfer ms\n"
    assert _text_lines_match(old_head + old, head + new) == []
    assert _text_lines_match(old_head + old, head + new.replace("82.6%", "80.0%"))
