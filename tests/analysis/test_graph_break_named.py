"""Issue 34 item 7, "the graph break named" (analysis/compilation.py ``break_causes``, METRICS.md §16):
the torch_compile advice says what broke the graph when the trace shows it, the op at the break and,
with ``with_stack=True``, its source line, in the words torch._dynamo.explain uses.

- The shared H100 traces against ../shared/oracles/h100_truth.json: toy_graph_break's break is the
  ``.item()`` explain reports ("Unsupported Tensor.item() call with capture_scalar_outputs=False");
  gpt2_bf16_compiled's two breaks per step run no op at all (the dynamo counters: two
  "logging.Logger method not supported" breaks, a Python-only call).
- Hand-built traces, one per kind of break (numbers by hand).
- Real CPU torch.compile runs (Inductor, and aot_eager for the other kinds), profiled with
  ``with_stack=True`` and compared with ``torch._dynamo.explain`` on the same model: the reason's
  first line and the line number of explain's user_stack.
"""
from __future__ import annotations

import json

import pytest

from conftest import ORACLES, TRACES
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.analysis import compilation as C
from tb_bottleneck_plugin.judge import recommendations as R
from tb_bottleneck_plugin.trace.loader import load_trace
from trace_builder import H100, TraceBuilder

H100_DIR = TRACES / "h100"


def _truth(run):
    path = ORACLES / "h100_truth.json"
    if not path.exists():
        pytest.skip("../shared/oracles not present")
    return json.loads(path.read_text())["runs"][run]


def _h100(run):
    files = sorted((H100_DIR / run).glob("*.pt.trace.json.gz"))
    if not files:
        pytest.skip(f"../shared/traces/h100/{run} not present")
    return report.analyze_trace(load_trace(str(files[0])))["report"]


def _rule(rep):
    return next(r for r in rep["recommendations"] if r["rule"] == "torch_compile")


# ---------------------------------------------------------------------------- the shared H100 traces


def test_toy_graph_break_names_the_item_explain_reports():
    truth = _truth("toy_graph_break")
    rep = _h100("toy_graph_break")
    comp = rep["compilation"]
    (cause,) = comp["break_causes"]
    # torch._dynamo.explain: 1 break, "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert cause["reason"] == truth["explain"]["break_reasons"][0]
    assert cause["per_step"] == truth["explain"]["graph_break_count"] == comp["breaks_per_step"] == 1
    assert cause["kind"] == "item" and cause["op"] == "aten::_local_scalar_dense" and cause["call"] == "Tensor.item()"
    assert cause["ops"] == ["aten::item"] and cause["sync"] is True  # cudaStreamSynchronize under it
    assert cause["regions"] == ["0/0"] and cause["count"] == comp["steps"] == 3
    assert cause["source"] is None  # recorded without with_stack
    rule = _rule(rep)
    assert rule["title"].startswith("torch.compile breaks the graph 1x per step at Tensor.item() "
                                    "(aten::_local_scalar_dense) and recompiles 3x")
    line = next(e for e in rule["evidence"] if e.startswith("graph break at"))
    assert truth["explain"]["break_reasons"][0] in line and "with_stack=True" in line
    assert "capture_scalar_outputs = True" in rule["action"]
    assert rule["numbers"]["break_causes"] == [{"kind": "item", "op": "aten::_local_scalar_dense",
                                               "call": "Tensor.item()", "per_step": 1.0}]
    assert rep["verdicts"]["compilation"]["break_cause"] == "Tensor.item() (aten::_local_scalar_dense)"


def test_gpt2_breaks_run_no_op_a_python_only_call():
    """The two logging.Logger breaks (dynamo counters) run nothing the profiler records between
    the compiled graphs: no op, no sync; the trace has no stacks, so the cause is named as a
    Python-only call, the logger among the candidates, never as an op or a sync."""
    truth = _truth("gpt2_bf16_compiled")
    (reason, n), = truth["dynamo_counters"]["graph_break"].items()
    assert reason.startswith("logging.Logger method not supported")
    rep = _h100("gpt2_bf16_compiled")
    comp = rep["compilation"]
    (cause,) = comp["break_causes"]
    assert cause["kind"] == "none" and cause["op"] is None and not cause["sync"] and cause["ops"] == []
    assert cause["per_step"] == comp["breaks_per_step"] == n == 2
    assert cause["regions"] == ["0/0", "1/0"]
    assert "logging.Logger" in cause["explanation"]
    rule = _rule(rep)
    assert "at a Python-only call" in rule["title"]
    assert "logging.Logger" in rule["action"] and "ignore_logger_methods" in rule["action"]
    assert "aten::" not in rule["title"]


def test_no_break_no_cause():
    rep = _h100("toy_no_break")
    assert rep["compilation"]["break_causes"] == []
    assert "break_cause" not in rep["verdicts"]["compilation"]


# ---------------------------------------------------------------------------- hand-built traces


def _broken(gap, steps=2, stacks=False, resume=True, spans_tid=1):
    """Steps of 1000 µs: region 0/0 [20, 720) runs a graph (CompiledFunction [30, 230)),
    then ``gap(b, t0)`` puts the break's events in [240, 400), then Dynamo looks up the
    guards [400, 410) and calls the resume region 1/0 [420, 670) (its own graph [430, 630)).
    ``stacks``: Python frames, the user's forward around the region and (``resume``) the
    resume frame Dynamo names after the line that broke."""
    b = TraceBuilder([H100])
    for n in range(steps):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.cpu("TorchDynamo Cache Lookup", t0 + 5, 10)
        b.cpu("Torch-Compiled Region: 0/0", t0 + 20, 700)
        b.cpu("CompiledFunction", t0 + 30, 200)
        if stacks:
            b.cpu("train.py(40): forward", t0 + 21, 698, cat="python_function")
            if resume:
                b.cpu("train.py(57): torch_dynamo_resume_in_forward_at_57", t0 + 421, 248, cat="python_function")
        gap(b, t0 + 240)
        b.cpu("TorchDynamo Cache Lookup", t0 + 400, 10)
        b.cpu("Torch-Compiled Region: 1/0", t0 + 420, 250)
        b.cpu("CompiledFunction", t0 + 430, 200)
    return b


def _item(b, t):
    b.cpu("aten::item", t, 60)
    b.cpu("aten::_local_scalar_dense", t + 5, 50)
    b.runtime("cudaMemcpyAsync", t + 10, 5)
    b.runtime("cudaStreamSynchronize", t + 20, 30)


def _branch(b, t):  # `if x.sum() > 0:` -> bool(tensor)
    b.cpu("aten::is_nonzero", t, 70)
    _item(b, t + 5)


def _nonzero(b, t):  # torch.nonzero / x[mask]
    b.cpu("aten::index", t, 80)
    b.cpu("aten::nonzero", t + 5, 70)
    b.runtime("cudaMemcpyAsync", t + 10, 5)
    b.runtime("cudaStreamSynchronize", t + 20, 30)


def _logging(b, t):
    b.cpu("/usr/lib/python3.11/logging/__init__.py(1491): warning", t, 90, cat="python_function")


def _print(b, t):
    b.cpu("<built-in function print>", t, 40, cat="python_function")


def _nothing(b, t):
    """Only Dynamo's own work: a recompile (with ops inside it) and a guard lookup."""
    b.cpu("dynamo", t, 120)
    b.cpu("entire_frame_compile", t + 5, 100)
    b.cpu("aten::empty", t + 10, 5)
    b.cpu("TorchDynamo Cache Lookup", t + 130, 10)


def _other_op(b, t):
    b.cpu("aten::mul", t, 30)
    b.cpu("aten::add", t + 40, 20)


def _section(b, tmp_path, name="t.pt.trace.json"):
    return report.analyze_trace(b.load(tmp_path, name))["report"]


@pytest.mark.parametrize("gap, kind, op, call, reason_start, sync", [
    (_item, "item", "aten::_local_scalar_dense", "Tensor.item()", "Unsupported Tensor.item() call", True),
    (_branch, "branch", "aten::is_nonzero", "bool(tensor) in a Python `if`", "generic_jump", True),
    (_nonzero, "dynamic_shape", "aten::nonzero", "torch.nonzero", "Dynamic shape operator", True),
    (_logging, "logging", None, "logging.Logger.warning()", "logging.Logger method not supported", False),
    (_print, "print", None, "print()", "Failed to trace builtin operator", False),
    (_other_op, "op", "aten::mul", None, None, False),
    (_nothing, "none", None, None, None, False),
])
def test_each_kind_of_break(tmp_path, gap, kind, op, call, reason_start, sync):
    rep = _section(_broken(gap), tmp_path)
    comp = rep["compilation"]
    assert comp["breaks_per_step"] == 1
    (cause,) = comp["break_causes"]
    assert (cause["kind"], cause["op"], cause["call"], cause["sync"]) == (kind, op, call, sync)
    assert (cause["reason"] or "").startswith(reason_start or "")
    assert cause["count"] == 2 and cause["per_step"] == 1 and cause["regions"] == ["0/0"]
    assert cause["source"] is None
    if kind == "op":
        assert cause["ops"] == ["aten::mul", "aten::add"] and cause["us"] == pytest.approx(2 * 50)
    if kind == "none":  # the recompile's aten::empty is Dynamo's work, not the break
        assert cause["ops"] == [] and cause["us"] == 0
    if kind == "logging":
        assert cause["python"].endswith("logging/__init__.py(1491): warning") and cause["us"] == pytest.approx(180)
    rule = R.rule_torch_compile(rep)
    assert rule is not None and rule["severity"] == "medium"
    words = C.break_cause_words(cause)
    assert rule["title"] == f"torch.compile breaks the graph 1x per step at {words}: part of every step runs eager"
    if kind in C.BREAK_FIXES:
        assert C.BREAK_FIXES[kind] in rule["action"]


def test_the_source_line_from_the_resume_frame(tmp_path):
    """With stacks, Dynamo's resume frame names the line that broke
    (``torch_dynamo_resume_in_forward_at_57``): the line explain's user_stack shows."""
    rep = _section(_broken(_item, stacks=True), tmp_path)
    (cause,) = rep["compilation"]["break_causes"]
    assert cause["source"] == {"frame": "train.py(57): torch_dynamo_resume_in_forward_at_57", "file": "train.py",
                               "line": 57, "function": "forward", "exact": True}
    rule = R.rule_torch_compile(rep)
    assert "at Tensor.item() (aten::_local_scalar_dense), train.py:57 in forward" in rule["title"]
    assert "with_stack" not in next(e for e in rule["evidence"] if e.startswith("graph break at"))


def test_without_a_resume_frame_the_enclosing_user_function(tmp_path):
    """Stacks but no resume frame (the nested region is a function called eagerly): the user
    frame around the break, which Python names by the function's first line."""
    rep = _section(_broken(_print, stacks=True, resume=False), tmp_path)
    (cause,) = rep["compilation"]["break_causes"]
    assert cause["source"] == {"frame": "train.py(40): forward", "file": "train.py", "line": 40,
                               "function": "forward", "exact": False}
    line = next(e for e in R.rule_torch_compile(rep)["evidence"] if e.startswith("graph break at"))
    assert "where the function begins" in line


def test_a_region_without_a_graph_before_its_break(tmp_path):
    """A frame that breaks before any graph ran (gpt2's 0/0): the window is the region's start
    to the nested region; its guard lookup is Dynamo's, the logging call the break."""
    b = TraceBuilder([H100])
    for n in range(3):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.cpu("Torch-Compiled Region: 0/0", t0 + 20, 700)
        b.cpu("Pregraph bytecode", t0 + 25, 5)
        b.cpu("/opt/venv/lib/python3.11/logging/__init__.py(1530): info", t0 + 40, 50, cat="python_function")
        b.cpu("TorchDynamo Cache Lookup", t0 + 100, 10)
        b.cpu("Torch-Compiled Region: 1/0", t0 + 120, 500)
        b.cpu("CompiledFunction", t0 + 130, 400)
    (cause,) = _section(b, tmp_path)["compilation"]["break_causes"]
    assert cause["kind"] == "logging" and cause["call"] == "logging.Logger.info()" and cause["per_step"] == 1


def test_summary_adds_the_causes_of_its_spans(tmp_path):
    results = [report.analyze_trace(_broken(_item, steps=s).load(tmp_path, f"r{s}.pt.trace.json"), run="r",
                                    worker=f"w{s}", span="s") for s in (2, 3)]
    summary = report.combine_results(results, run="r")["report"]
    (cause,) = summary["compilation"]["break_causes"]
    assert cause["kind"] == "item" and cause["count"] == 5 and cause["regions"] == ["0/0"]
    # one row per step number across the spans (steps 1-3): 5 breaks over 3 step rows
    assert cause["per_step"] == pytest.approx(5 / summary["compilation"]["steps"])
    assert "Tensor.item()" in R.rule_torch_compile(summary)["title"]


# ---------------------------------------------------------------------------- real CPU torch.compile runs


def _compile_and_profile(tmp_path, kind, backend):
    """torch._dynamo.explain on a tiny model whose forward breaks at ``kind``, then the same
    model under torch.compile(backend=...), three profiled training steps with with_stack=True.
    -> (explain's break reasons, the report)."""
    torch = pytest.importorskip("torch")
    import logging

    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    log = logging.getLogger("tb_bottleneck_test_graph_break")
    log.addHandler(logging.NullHandler())
    log.propagate = False

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            x = torch.relu(self.a(x)) * 2 + 1
            if kind == "item":
                if x.mean().item() > -1e9:
                    x = x + 1
            elif kind == "branch":
                if x.sum() > 0:
                    x = x + 1
            elif kind == "nonzero":
                x = x[torch.nonzero(x > 0)[:, 0]]
            elif kind == "logging":
                log.warning("step")
            elif kind == "print":
                print("x", end="")
            return torch.tanh(self.b(x)).sum()

    torch.manual_seed(0)
    model, x = Toy(), torch.randn(8, 16)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    for _ in range(2):
        compiled(x).backward()
    out = tmp_path / kind
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(out), worker_name="worker0")) as prof:
        for _ in range(4):
            compiled(x).backward()
            prof.step()
    torch._dynamo.reset()
    (path,) = sorted(out.glob("*.pt.trace.json"))
    return explained, report.analyze_trace(load_trace(str(path)))["report"]


def _check_against_explain(explained, rep, kind, op):
    comp = rep["compilation"]
    assert explained.graph_break_count == 1 and comp["breaks_per_step"] == 1
    (cause,) = comp["break_causes"]
    (br,) = explained.break_reasons
    frame = br.user_stack[-1]
    assert cause["kind"] == kind and cause["op"] == op and cause["per_step"] == explained.graph_break_count
    # the reason as explain words it (its first line), and the line of explain's user_stack
    assert str(br.reason).splitlines()[0] == cause["reason"]
    assert cause["source"]["exact"] and cause["source"]["line"] == frame.lineno
    assert frame.filename.endswith(cause["source"]["file"]) and cause["source"]["function"] == frame.name
    rule = R.rule_torch_compile(rep)
    assert f"{cause['source']['file']}:{frame.lineno} in forward" in rule["title"]
    return cause


def test_cpu_inductor_item_break_matches_explain(tmp_path):
    """torch.compile with Inductor on CPU (the C++ kernels the profiler does not record):
    the .item() break, its op and its line equal torch._dynamo.explain's."""
    explained, rep = _compile_and_profile(tmp_path, "item", "inductor")
    cause = _check_against_explain(explained, rep, "item", "aten::_local_scalar_dense")
    assert cause["reason"] == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert cause["python"].startswith("<built-in method item of Tensor object")
    assert not cause["sync"]  # on CPU .item() waits for nothing


@pytest.mark.parametrize("model, kind, op", [("branch", "branch", "aten::is_nonzero"),
                                             ("nonzero", "dynamic_shape", "aten::nonzero"),
                                             ("logging", "logging", None), ("print", "print", None)])
def test_cpu_breaks_of_each_kind_match_explain(tmp_path, model, kind, op):
    """The other kinds with the aot_eager backend (the eager ops at the break do not depend on
    the backend; seconds instead of an Inductor build each)."""
    explained, rep = _compile_and_profile(tmp_path, model, "aot_eager")
    _check_against_explain(explained, rep, kind, op)
