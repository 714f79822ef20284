"""Demo runs whose expected numbers come from PyTorch itself (``--ground-truth``).

Each run is small (a few seconds on a 2-core CPU, one trace file of tens of KB) and
stores, next to ``demo_run`` / ``demo_settings``, a top-level ``demo_truth`` object in
its trace: what the code was built to show, measured by PyTorch or read from the code,
for the tests to compare with the plugin's report (tests/corpus/test_demo_ground_truth.py).

=================================  ====================================================
run                                construction and ground truth
=================================  ====================================================
``stack_item_slow_module``         ``profile(with_stack=True, record_shapes=True)``. Every
                                   step logs its loss through :func:`_log_loss`, whose
                                   ``.item()`` is the known sync line (file and line from
                                   ``inspect``); the model's ``SlowMixer`` module runs
                                   ``SLOW_REPS`` extra dim x dim matmuls, so it holds
                                   most of the forward time (metrics §17).
``compile_graph_break``            ``torch.compile`` (backend ``aot_eager``, no C++ build)
                                   of a model whose forward branches on ``.item()`` (a
                                   graph break) and whose batch grows every step with
                                   automatic dynamic shapes off (a recompile per step).
``compile_static_fixed``           the fix: ``torch.where`` instead of the branch, batches
                                   padded to one static shape. Truth for both:
                                   ``torch._dynamo.explain`` (graph_count,
                                   graph_break_count) and the per-step deltas of
                                   ``torch._dynamo.utils.counters`` (metrics §16).
``collectives_shard_2rank``        2 gloo ranks, a hand-written FSDP/ZeRO-3 step: each
                                   step all-gathers two flat parameter shards
                                   (``dist.all_gather_into_tensor``) and reduce-scatters
                                   their gradients (``dist.reduce_scatter_tensor``);
                                   bytes per call from the code (metrics §12, §18).
``memory_peak_adamw``              fp32 MLP blocks, single-tensor AdamW whose state is made in
                                   the first recorded step, ``with_stack=True``: parameter,
                                   AdamW-state, gradient and saved-activation bytes measured
                                   from the tensors, and the live set at the peak by hand
                                   (metrics §7 "Memory at the peak"). Not part of
                                   ``--ground-truth``: ``run_memory_peak(torch, outdir)``
                                   (tests/corpus/test_memory_peak_demo.py).
=================================  ====================================================

torch is imported inside the functions only (the package imports without it).
"""
from __future__ import annotations

import glob
import inspect
import json
import os
import time
import warnings
from typing import Callable, List, Optional


STACK_RUN = "stack_item_slow_module"
COMPILE_PAIR = ("compile_graph_break", "compile_static_fixed")
COLLECTIVES_RUN = "collectives_shard_2rank"
GROUND_TRUTH_RUNS = (STACK_RUN,) + COMPILE_PAIR + (COLLECTIVES_RUN,)

WORKER_NAME = "worker0"
# One profiling cycle per run: wait 1, warm-up 1, 2 recorded steps (one trace file).
WAIT, WARMUP, ACTIVE = 1, 1, 2

# with_stack run: the slow module's construction.
STACK_DIM, STACK_BATCH, STACK_IN, STACK_CLASSES = 512, 512, 64, 10
# On a GPU the step's kernels must outlast its launches for the .item() to wait on them (a
# real sync, METRICS §8): 32x the rows make SlowMixer's matmuls ~0.3 ms each on an H100.
STACK_BATCH_CUDA = 16384
SLOW_REPS = 8  # dim x dim matmuls (each followed by tanh) in SlowMixer.forward
SLOW_MODULE = "SlowMixer"

# compiled pair: batches of 32, 40, 48, ... rows (broken) or padded to COMPILE_MAX_ROWS.
COMPILE_DIM, COMPILE_ROWS0, COMPILE_ROWS_STEP = 128, 32, 8
COMPILE_WARM = 1
COMPILE_MAX_ROWS = COMPILE_ROWS0 + COMPILE_ROWS_STEP * (COMPILE_WARM + WAIT + WARMUP + ACTIVE)
COMPILE_BACKEND = "aot_eager"
# On CUDA the pair compiles with Inductor, as users do: real Triton kernels, and compile
# times that show what a recompile costs there.
COMPILE_BACKEND_CUDA = "inductor"

# collectives run: two "FSDP units", Linear(256, 256) and Linear(256, 16), each a flat
# fp32 parameter padded to a multiple of the world size and sharded over the ranks.
COLL_WORLD = 2
COLL_DIM, COLL_OUT, COLL_BATCH = 256, 16, 32
COLL_ACTIVE = 3
FP32_BYTES = 4


def _log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _repo_relative(path: str) -> str:
    """The path as the profiler names it: relative to the directory above the package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(os.path.abspath(path), root)
    return rel.replace(os.sep, "/")


def _prepare(outdir: str, name: str, pattern: str) -> str:
    run_dir = os.path.join(outdir, name)
    os.makedirs(run_dir, exist_ok=True)
    for old in glob.glob(os.path.join(run_dir, pattern)):
        os.remove(old)
    return run_dir


def _profiled(torch, run_dir: str, name: str, step_fn: Callable[[int], None], *, settings: dict,
              truth_fn: Callable[[], dict], with_stack: bool, worker: str = WORKER_NAME,
              active: int = ACTIVE) -> None:
    """One profiling cycle; ``demo_run``/``demo_settings`` added before the saved step and
    ``demo_truth`` (``truth_fn()``) after it, while the profiler still records."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available() and settings.get("device") == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    total = WAIT + WARMUP + active
    schedule = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=active, repeat=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end")
        with torch.profiler.profile(
            activities=acts, schedule=schedule,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(run_dir, worker_name=worker, use_gzip=True),
            profile_memory=True, record_shapes=True, with_stack=with_stack,
        ) as prof:
            for i in range(total):
                saving = prof.current_action == torch.profiler.ProfilerAction.RECORD_AND_SAVE
                if saving:
                    prof.add_metadata("demo_run", name)
                    prof.add_metadata_json("demo_settings", json.dumps(settings, sort_keys=True))
                step_fn(i)
                if saving:
                    prof.add_metadata_json("demo_truth", json.dumps(truth_fn(), sort_keys=True))
                prof.step()


def _files(run_dir: str, worker: str = WORKER_NAME) -> List[str]:
    return sorted(glob.glob(os.path.join(run_dir, f"{worker}.*.pt.trace.json.gz")))


# --------------------------------------------------------------------------------------
# Issue 22: with_stack=True, a known .item() line and a known slow nn.Module
# --------------------------------------------------------------------------------------


def _log_loss(loss) -> float:
    """Logs the loss every step: .item() copies it to the host (on CUDA: waits for the GPU)."""
    return loss.item()


def item_call_site() -> dict:
    """Where the known sync is, from the source: the file (as the profiler names it, relative
    to the directory above the package), the first line of :func:`_log_loss` (with_stack
    frames are named ``file(first line): function``) and the line of its ``.item()``."""
    lines, first = inspect.getsourcelines(_log_loss)
    call = next(first + k for k, text in enumerate(lines) if ".item()" in text and "return" in text)
    return {"file": _repo_relative(inspect.getsourcefile(_log_loss)), "function": _log_loss.__name__,
            "function_first_line": first, "item_line": call,
            "frame": f"{_repo_relative(inspect.getsourcefile(_log_loss))}({first}): {_log_loss.__name__}"}


def _make_stack_model(torch, reps: int):
    nn = torch.nn

    class SlowMixer(nn.Module):
        """The deliberately slow module: ``reps`` dim x dim matmuls, each followed by tanh."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(STACK_DIM, STACK_DIM) / STACK_DIM ** 0.5)

        def forward(self, x):
            for _ in range(reps):
                x = torch.tanh(x @ self.weight)
            return x

    class MixerNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(STACK_IN, STACK_DIM)
            self.mixer = SlowMixer()
            self.head = nn.Sequential(nn.ReLU(), nn.Linear(STACK_DIM, STACK_CLASSES))

        def forward(self, x):
            return self.head(self.mixer(self.embed(x)))

    assert SlowMixer.__name__ == SLOW_MODULE
    return MixerNet()


def run_stack(torch, outdir: str, device: str = "cpu") -> str:
    """Issue 22's run (``stack_item_slow_module``); see the module docstring."""
    torch.manual_seed(0)
    model = _make_stack_model(torch, SLOW_REPS).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = STACK_BATCH_CUDA if device == "cuda" else STACK_BATCH
    x = torch.randn(batch, STACK_IN, device=device)
    y = torch.randint(0, STACK_CLASSES, (batch,), device=device)
    losses: List[float] = []

    def step(_i: int) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(_log_loss(loss))

    site = item_call_site()
    siblings = ["Linear (embed, %d->%d)" % (STACK_IN, STACK_DIM), "ReLU",
                "Linear (head, %d->%d)" % (STACK_DIM, STACK_CLASSES)]
    truth = {
        "sync": dict(site, op="aten::item", calls_per_step=1),
        "slow_module": {
            "class": SLOW_MODULE, "parent_class": "MixerNet", "matmuls_per_call": SLOW_REPS,
            "matmul_flops_per_call": 2 * SLOW_REPS * batch * STACK_DIM * STACK_DIM,
            "sibling_ops": siblings,
            # Each SlowMixer matmul does at least the work of any sibling op (the largest, the
            # embed Linear, is STACK_DIM / STACK_IN times smaller), so SlowMixer holds at least
            # reps / (reps + sibling ops) of the children's time.
            "min_share_of_children": SLOW_REPS / (SLOW_REPS + len(siblings)),
        },
    }
    settings = dict(story=STACK_RUN, device=device, dim=STACK_DIM, batch=batch, slow_reps=SLOW_REPS,
                    with_stack=True, record_shapes=True, torch_threads=torch.get_num_threads())
    run_dir = _prepare(outdir, STACK_RUN, f"{WORKER_NAME}.*.pt.trace.json*")
    started = time.perf_counter()
    for i in range(2):  # warm-up, outside the profiler
        step(-1 - i)
    _profiled(torch, run_dir, STACK_RUN, step, settings=settings, truth_fn=lambda: truth, with_stack=True)
    _done(STACK_RUN, run_dir, started)
    return run_dir


# --------------------------------------------------------------------------------------
# Issue 36: who holds the memory at the peak (a model, optimizer and batch known to the byte)
# --------------------------------------------------------------------------------------

MEMORY_RUN = "memory_peak_adamw"
MEM_IN, MEM_HIDDEN, MEM_OUT, MEM_BATCH, MEM_BLOCKS = 64, 1024, 8, 1024, 2


def _make_memory_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d_in: int, d_out: int):
            super().__init__()
            self.linear = nn.Linear(d_in, d_out)

        def forward(self, x):
            return torch.relu(self.linear(x))

    class MemNet(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [MEM_IN] + [MEM_HIDDEN] * MEM_BLOCKS
            self.blocks = nn.ModuleList(Block(a, b) for a, b in zip(dims[:-1], dims[1:]))
            self.head = nn.Linear(MEM_HIDDEN, MEM_OUT)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return MemNet()


def run_memory_peak(torch, outdir: str, device: str = "cpu") -> str:
    """Issue 36's run (``memory_peak_adamw``): fp32 MLP blocks, AdamW (single-tensor), a fixed
    batch made before profiling, ``zero_grad(set_to_none=True)`` at the end of each step (no
    gradient outlives its step); the first ``opt.step()`` runs in the first recorded step, so
    AdamW's state is allocated inside the window. Truth, measured in this process: parameter
    bytes, AdamW state bytes (exp_avg + exp_avg_sq, = 2 x parameters; the step counters apart),
    the batch, the gradient bytes after backward, the activations saved for backward
    (autograd's own ``saved_tensors_hooks``: distinct storages that are not parameters or the
    batch), and by hand the live set at the peak of the second recorded step (``at_peak``):
    backward of ``blocks[1].linear``, where Block_0's ReLU output (saved) and the loss are the
    activations, ``blocks[1]`` and ``head`` have their gradients, two B x H gradient buffers
    (ReLU's grad and the mm's grad input) are temporaries, and AdamW's state is held."""
    torch.manual_seed(0)
    model = _make_memory_model(torch).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(MEM_BATCH, MEM_IN, device=device)
    params = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}
    measured: dict = {}

    def step(i: int) -> None:
        saved: dict = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                saved[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x).square().mean()
        measured["saved_activation_bytes"] = sum(saved.values())
        measured["loss_bytes"] = loss.untyped_storage().nbytes()
        loss.backward()
        measured["gradient_bytes"] = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
        if i >= WAIT + WARMUP:  # the first step() (AdamW's state) in the first recorded step
            opt.step()
        opt.zero_grad(set_to_none=True)

    def truth() -> dict:
        param_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
        state = [s for s in opt.state.values()]
        moments = sum(s[k].untyped_storage().nbytes() for s in state for k in ("exp_avg", "exp_avg_sq"))
        steps = sum(s["step"].untyped_storage().nbytes() for s in state if torch.is_tensor(s.get("step")))
        hidden_bytes = MEM_BATCH * MEM_HIDDEN * 4
        later = [p for m in list(model.blocks)[1:] + [model.head] for p in m.parameters()]
        at_peak = {"activations": hidden_bytes + measured["loss_bytes"],
                   "gradients": sum(p.untyped_storage().nbytes() for p in later),
                   "other_temporaries": 2 * hidden_bytes, "optimizer_state": moments + steps,
                   "where": "backward of blocks[1].linear (the second recorded step)"}
        return dict(measured, at_peak=at_peak, parameter_bytes=param_bytes, adamw_state_bytes=moments, adamw_step_bytes=steps,
                    batch_bytes=x.untyped_storage().nbytes(), parameter_tensors=len(list(model.parameters())),
                    # by hand: each Block's ReLU output (B x H fp32) is saved (by ReLU's and the next
                    # Linear's backward), the head's output by square()
                    activation_bytes_by_hand=MEM_BLOCKS * hidden_bytes + MEM_BATCH * MEM_OUT * 4,
                    block_activation_bytes=hidden_bytes, module_class="Block")

    settings = dict(story=MEMORY_RUN, device=device, batch=MEM_BATCH, hidden=MEM_HIDDEN, blocks=MEM_BLOCKS,
                    optimizer="AdamW(foreach=False)", dtype="float32", with_stack=True, record_shapes=True)
    run_dir = _prepare(outdir, MEMORY_RUN, f"{WORKER_NAME}.*.pt.trace.json*")
    started = time.perf_counter()
    for i in range(2):  # warm-up outside the profiler: AdamW's state exists before the window
        step(-1 - i)
    _profiled(torch, run_dir, MEMORY_RUN, step, settings=settings, truth_fn=truth, with_stack=True)
    _done(MEMORY_RUN, run_dir, started)
    return run_dir


def _done(name: str, run_dir: str, started: float, worker: str = WORKER_NAME) -> None:
    files = _files(run_dir, worker) if worker == WORKER_NAME else sorted(
        glob.glob(os.path.join(run_dir, "rank*.pt.trace.json.gz")))
    sizes = ", ".join(f"{os.path.getsize(f) / 1024:.0f} KB" for f in files)
    _log(f"{name}: {time.perf_counter() - started:.1f} s -> {len(files)} trace file(s) ({sizes}) in {run_dir}")


# --------------------------------------------------------------------------------------
# Issue 23: torch.compile with a graph break and recompiles, and the fixed model
# --------------------------------------------------------------------------------------


def _make_compile_model(torch, broken: bool):
    nn = torch.nn

    class GatedMLP(nn.Module):
        """Two Linears; the gate between them doubles h when its mean is positive."""

        def __init__(self):
            super().__init__()
            self.a = nn.Linear(COMPILE_DIM, COMPILE_DIM)
            self.b = nn.Linear(COMPILE_DIM, COMPILE_DIM)

        def forward(self, x):
            h = torch.relu(self.a(x))
            if broken:
                if h.mean().item() > 0.0:  # data-dependent Python branch: a graph break
                    h = h * 2.0
            else:
                h = torch.where(h.mean() > 0.0, h * 2.0, h)  # the same gate, in the graph
            return self.b(h)

    return GatedMLP()


def compile_rows(step: int) -> int:
    """Rows of the broken run's batch at a step (negative steps: the warm-up)."""
    return COMPILE_ROWS0 + COMPILE_ROWS_STEP * (step + COMPILE_WARM)


def _dynamo_counts(counters) -> dict:
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "frames_ok": int(counters["frames"].get("ok", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def run_compiled(torch, outdir: str, broken: bool, device: str = "cpu") -> str:
    """Issue 23's pair (``compile_graph_break`` / ``compile_static_fixed``)."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    name = COMPILE_PAIR[0] if broken else COMPILE_PAIR[1]
    torch.manual_seed(0)
    dynamo.reset()
    backend = COMPILE_BACKEND_CUDA if device == "cuda" else COMPILE_BACKEND
    explained = dynamo.explain(_make_compile_model(torch, broken).to(device))(
        torch.randn(compile_rows(0), COMPILE_DIM, device=device))
    explain = {"graph_count": int(explained.graph_count), "graph_break_count": int(explained.graph_break_count),
               "break_reasons": [str(getattr(b, "reason", b)).splitlines()[0][:200]
                                 for b in explained.break_reasons]}
    dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = _make_compile_model(torch, broken).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend=backend)
    per_step: List[dict] = []

    def step(i: int) -> None:
        rows = compile_rows(i)
        x = torch.randn(rows, COMPILE_DIM, device=device)
        if not broken:  # the fix: pad every batch to one static shape, mask the padding out
            x = torch.nn.functional.pad(x, (0, 0, 0, COMPILE_MAX_ROWS - rows))
        before = _dynamo_counts(counters)
        opt.zero_grad(set_to_none=True)
        loss = compiled(x)[:rows].square().mean()
        loss.backward()
        opt.step()
        after = _dynamo_counts(counters)
        per_step.append(dict({k: after[k] - before[k] for k in after}, step=i, rows=rows,
                             shape=list(x.shape)))

    def truth() -> dict:
        recorded = [s for s in per_step if s["step"] >= WAIT + WARMUP]
        return {
            "explain": explain,
            "counters_per_step": per_step,
            "recorded_steps": [s["step"] for s in recorded],
            # every frame was first compiled in the warm-up step (outside the profiler), so
            # each graph compiled in a recorded step is a recompile
            "recompiles_in_recorded_steps": sum(s["unique_graphs"] for s in recorded),
            "graph_breaks_per_call": explain["graph_break_count"],
            "graphs_per_call": explain["graph_count"],
            "counters_total": _dynamo_counts(counters),
        }

    settings = dict(story=name, backend=backend, dim=COMPILE_DIM, device=device,
                    rows=("growing" if broken else f"padded to {COMPILE_MAX_ROWS}"),
                    automatic_dynamic_shapes=not broken)
    run_dir = _prepare(outdir, name, f"{WORKER_NAME}.*.pt.trace.json*")
    started = time.perf_counter()
    # Broken: every new batch size recompiles (automatic dynamic shapes off, as for a model
    # marked static); COMPILE_WARM + 4 compiles stay under dynamo's recompile limit (8).
    with dynamo.config.patch(automatic_dynamic_shapes=not broken):
        for i in range(-COMPILE_WARM, 0):
            step(i)
        _profiled(torch, run_dir, name, step, settings=settings, truth_fn=truth, with_stack=False)
    dynamo.reset()
    _done(name, run_dir, started)
    return run_dir


# --------------------------------------------------------------------------------------
# Issue 24: all_gather_into_tensor / reduce_scatter_tensor on 2 gloo ranks
# --------------------------------------------------------------------------------------


def _flat_size(n: int, world: int) -> int:
    return -(-n // world) * world


def shard_units(world: int = COLL_WORLD) -> List[dict]:
    """The two flat-parameter units (name, numel, padded numel, shard numel)."""
    units = []
    for name, fan_in, fan_out in (("hidden", COLL_DIM, COLL_DIM), ("head", COLL_DIM, COLL_OUT)):
        numel = fan_in * fan_out + fan_out
        padded = _flat_size(numel, world)
        units.append({"unit": name, "fan_in": fan_in, "fan_out": fan_out, "numel": numel,
                      "padded_numel": padded, "shard_numel": padded // world})
    return units


def expected_calls(world: int = COLL_WORLD) -> List[dict]:
    """The collectives of one step, in issue order, with their sizes in bytes (fp32):
    ``input_bytes`` / ``output_bytes`` of the call and ``nccl_tests_bytes`` (the full
    array, as nccl-tests and metrics §18 count all-gather and reduce-scatter)."""
    units = shard_units(world)
    calls = []
    for u in units:  # forward: gather each unit's parameters
        calls.append({"op": "all_gather_into_tensor", "unit": u["unit"],
                      "input_bytes": u["shard_numel"] * FP32_BYTES, "output_bytes": u["padded_numel"] * FP32_BYTES,
                      "nccl_tests_bytes": u["padded_numel"] * FP32_BYTES})
    for u in reversed(units):  # backward order: the head's gradient first
        calls.append({"op": "reduce_scatter_tensor", "unit": u["unit"],
                      "input_bytes": u["padded_numel"] * FP32_BYTES, "output_bytes": u["shard_numel"] * FP32_BYTES,
                      "nccl_tests_bytes": u["padded_numel"] * FP32_BYTES})
    return calls


def _shard_worker(rank: int, world: int, port: int, run_dir: str, active: int) -> None:
    """One rank of the sharded-parameter run (started by torch.multiprocessing)."""
    import torch
    import torch.distributed as dist

    from .generator import init_gloo_rank

    # torch 2.13 suggests all_gather_single / reduce_scatter_single; the demo keeps the
    # names that FSDP and most code in the wild call (same c10d ops underneath).
    warnings.filterwarnings("ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
                            category=FutureWarning)
    init_gloo_rank(torch, dist, rank, world, port)
    try:
        units = shard_units(world)
        shards = []
        for u in units:  # the same full init on every rank, then keep this rank's shard
            full = torch.zeros(u["padded_numel"])
            full[: u["numel"]] = torch.randn(u["numel"]) / u["fan_in"] ** 0.5
            shards.append(full[rank * u["shard_numel"]: (rank + 1) * u["shard_numel"]].clone())
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(COLL_BATCH, COLL_DIM, generator=g)
        y = torch.randint(0, COLL_OUT, (COLL_BATCH,), generator=g)

        def step(_i: int) -> None:
            fulls = []
            for u, shard in zip(units, shards):
                full = torch.empty(u["padded_numel"])
                dist.all_gather_into_tensor(full, shard)
                fulls.append(full.requires_grad_(True))
            h = x
            for k, (u, full) in enumerate(zip(units, fulls)):
                w = full[: u["fan_in"] * u["fan_out"]].view(u["fan_out"], u["fan_in"])
                b = full[u["fan_in"] * u["fan_out"]: u["numel"]]
                h = torch.nn.functional.linear(h, w, b)
                if k + 1 < len(units):
                    h = torch.relu(h)
            loss = torch.nn.functional.cross_entropy(h, y)
            loss.backward()
            with torch.no_grad():
                for u, full, shard in reversed(list(zip(units, fulls, shards))):
                    grad = torch.empty(u["shard_numel"])
                    dist.reduce_scatter_tensor(grad, full.grad)
                    shard -= 0.01 * grad / world

        settings = {"story": COLLECTIVES_RUN, "rank": rank, "world_size": world, "backend": "gloo",
                    "units": units, "profiled_steps": WAIT + WARMUP + active}
        truth = {"calls_per_step": expected_calls(world), "world_size": world, "dtype": "float32",
                 "recorded_steps": active}
        for i in range(2):
            step(-1 - i)
        _profiled(torch, run_dir, COLLECTIVES_RUN, step, settings=settings, truth_fn=lambda: truth,
                  with_stack=False, worker=f"rank{rank}", active=active)
    finally:
        dist.destroy_process_group()


def run_collectives(torch, outdir: str, active: int = COLL_ACTIVE) -> str:
    """Issue 24's run (``collectives_shard_2rank``), 2 gloo processes."""
    import torch.multiprocessing as mp

    from .generator import _free_port

    run_dir = _prepare(outdir, COLLECTIVES_RUN, "rank*.pt.trace.json*")
    started = time.perf_counter()
    mp.spawn(_shard_worker, args=(COLL_WORLD, _free_port(), run_dir, active), nprocs=COLL_WORLD, join=True)
    _done(COLLECTIVES_RUN, run_dir, started, worker="rank")
    return run_dir


def generate_ground_truth(outdir: str, *, device: Optional[str] = "cpu") -> List[str]:
    """Write the four ground-truth runs into ``outdir``; return their directories.
    ``device`` applies to the with_stack run (on CUDA its ``.item()`` is a real sync that
    metrics §8/§17 report) and the compiled pair (Inductor on CUDA); the gloo run is on CPU."""
    from .generator import _import_torch, check_device

    torch = _import_torch()
    check_device(torch, device or "cpu")
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same work per op on every machine
    try:
        runs = [run_stack(torch, outdir, device or "cpu"),
                run_compiled(torch, outdir, broken=True, device=device or "cpu"),
                run_compiled(torch, outdir, broken=False, device=device or "cpu")]
    finally:
        torch.set_num_threads(threads)
    runs.append(run_collectives(torch, outdir))
    return runs
