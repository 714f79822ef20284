"""`tb-bottlenecks demo OUTDIR`: real PyTorch training loops that show each bottleneck.

Every run is a small but real training loop under ``torch.profiler.profile`` with
``tensorboard_trace_handler(run_dir, worker_name="worker0", use_gzip=True)``, so OUTDIR
becomes a TensorBoard logdir with one directory per run. The runs come in pairs, a
problem and its fix:

=====================  ====================  =============================================
problem                fix                   what differs
=====================  ====================  =============================================
``input_bound_nw0``    ``input_fixed_nw4``   DataLoader ``num_workers=0`` vs 4 workers
                                             (persistent, prefetching, pinned on CUDA)
``fp32_matmul``        ``bf16_autocast``     FP32 GEMMs vs ``torch.autocast(bfloat16)``:
                                             no Tensor Cores vs Tensor Cores (CUDA only)
``many_small_kernels`` ``compiled``          an elementwise-heavy model, eager vs
                                             ``torch.compile`` (fused kernels; CUDA only)
=====================  ====================  =============================================

Besides the pairs, ``--ground-truth`` writes four small CPU runs whose traces carry
PyTorch's own expected numbers (:mod:`tb_bottleneck_demo.ground_truth`).

The input pair runs on any machine. Its dataset decodes and augments images with numpy
in ``__getitem__`` (a RandAugment-style pipeline), and the depth of that pipeline is
sized to the model's measured step time, so the same story comes out on a 2-core CI box
and on a workstation: with ``num_workers=0`` the DataLoader takes a large share of each
step, with workers it takes next to none.

torch is imported lazily: this module imports without it, and the demo raises
:class:`MissingTorchError` (``pip install "tb_bottleneck_plugin[demo]"``) when it is
missing. The module lives outside the runtime package (``tb_bottleneck_plugin``), which
never imports it; ``tb-bottlenecks demo`` imports it only when that subcommand runs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from tb_bottleneck_plugin.errors import BottleneckError

__all__ = ["MissingTorchError", "AugmentedImageDataset", "generate", "main"]

WORKER_NAME = "worker0"
INPUT_PAIR = ("input_bound_nw0", "input_fixed_nw4")
PRECISION_PAIR = ("fp32_matmul", "bf16_autocast")
FUSION_PAIR = ("many_small_kernels", "compiled")
# The fusion pair's model under torch.compile(mode="reduce-overhead"): the same fused
# kernels, replayed from CUDA graphs (one launch per graph instead of one per kernel).
CUDA_GRAPHS_RUN = "compiled_cuda_graphs"
DDP_PAIR = ("ddp_straggler_2rank", "ddp_balanced_2rank")

# Profiler schedule shared by every run: one waiting step, one warm-up step, two
# recorded steps; ``repeat`` cycles write one trace file ("span") each.
WAIT, WARMUP, ACTIVE = 1, 1, 2


class MissingTorchError(BottleneckError, ImportError):
    """The demo needs PyTorch, which is an optional extra of this package."""


def check_device(torch, device: str) -> None:
    """A device the demo runs on: 'cpu', or 'cuda' where torch sees a GPU."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise BottleneckError("device='cuda' was requested but torch.cuda.is_available() is False")


def _import_torch():
    try:
        import torch
        import torch.profiler  # noqa: F401  (makes torch.profiler.* available)
    except ImportError as exc:
        raise MissingTorchError(
            "the demo runs real PyTorch training loops and needs torch: "
            'pip install "tb_bottleneck_plugin[demo]"'
        ) from exc
    return torch


def _log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------
# Dataset: compressed images, decoded and augmented per sample with numpy
# --------------------------------------------------------------------------------------

_MEAN = np.array([0.5, 0.5, 0.5], dtype=np.float32)
_STD = np.array([0.25, 0.25, 0.25], dtype=np.float32)
_GAUSS5 = np.array([1.0, 4.0, 6.0, 4.0, 1.0], dtype=np.float32) / 16.0


def _resize_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize of an HxWxC float32 image (align_corners=False)."""
    h, w = img.shape[:2]
    ys = (np.arange(out_h, dtype=np.float32) + 0.5) * (h / out_h) - 0.5
    xs = (np.arange(out_w, dtype=np.float32) + 0.5) * (w / out_w) - 0.5
    y0 = np.floor(ys).astype(np.int64)
    x0 = np.floor(xs).astype(np.int64)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    y0c, y1c = np.clip(y0, 0, h - 1), np.clip(y0 + 1, 0, h - 1)
    x0c, x1c = np.clip(x0, 0, w - 1), np.clip(x0 + 1, 0, w - 1)
    top, bottom = img[y0c], img[y1c]
    top = top[:, x0c] * (1.0 - wx) + top[:, x1c] * wx
    bottom = bottom[:, x0c] * (1.0 - wx) + bottom[:, x1c] * wx
    return (top * (1.0 - wy) + bottom * wy).astype(np.float32, copy=False)


def _blur(img: np.ndarray) -> np.ndarray:
    """Separable 5-tap Gaussian blur with edge padding."""
    p = np.pad(img, ((2, 2), (2, 2), (0, 0)), mode="edge")
    rows = sum(_GAUSS5[k] * p[k : k + img.shape[0]] for k in range(5))
    return sum(_GAUSS5[k] * rows[:, k : k + img.shape[1]] for k in range(5))


def _op_blur(img, rng):
    return _blur(img)


def _op_sharpen(img, rng):
    amount = rng.uniform(0.3, 1.0)
    return np.clip(img + amount * (img - _blur(img)), 0.0, 1.0)


def _op_color_jitter(img, rng):
    img = img * rng.uniform(0.7, 1.3)  # brightness
    mean = img.mean()
    img = (img - mean) * rng.uniform(0.7, 1.3) + mean  # contrast
    grey = img.mean(axis=2, keepdims=True)
    img = (img - grey) * rng.uniform(0.6, 1.4) + grey  # saturation
    return np.clip(img, 0.0, 1.0)


def _op_gamma(img, rng):
    return np.power(img, rng.uniform(0.6, 1.6))


def _op_equalize(img, rng):
    out = np.empty_like(img)
    for c in range(img.shape[2]):
        hist, edges = np.histogram(img[..., c], bins=64, range=(0.0, 1.0))
        cdf = np.cumsum(hist).astype(np.float32)
        cdf /= cdf[-1]
        out[..., c] = np.interp(img[..., c], edges[1:], cdf)
    return out


def _op_solarize(img, rng):
    return np.where(img > rng.uniform(0.5, 0.9), 1.0 - img, img)


def _op_posterize(img, rng):
    levels = float(rng.integers(4, 16))
    return np.floor(img * levels) / levels


def _op_translate(img, rng):
    dy, dx = rng.integers(-8, 9, size=2)
    return np.roll(img, (int(dy), int(dx)), axis=(0, 1))


_AUGMENTATIONS = (
    _op_blur,
    _op_sharpen,
    _op_color_jitter,
    _op_gamma,
    _op_equalize,
    _op_solarize,
    _op_posterize,
    _op_translate,
)


class AugmentedImageDataset:
    """A map-style dataset of zlib-compressed RGB images with a heavy numpy pipeline.

    ``__getitem__`` does what an image pipeline does on the CPU: decode the stored bytes,
    take a random resized crop, apply ``num_ops`` random augmentations (blur, sharpen,
    colour jitter, gamma, equalize, solarize, posterize, translate), resize to ``size``,
    flip and normalise. It returns ``(CHW float32 array, int64 label)``; the DataLoader's
    default collate turns these into tensors. Pure numpy, so it pickles into spawned
    DataLoader workers without torch.
    """

    def __init__(
        self,
        length: int,
        *,
        num_ops: int = 4,
        size: int = 32,
        source_size: int = 128,
        work_size: int = 96,
        num_classes: int = 10,
        num_sources: int = 40,
        seed: int = 0,
    ):
        self.length = int(length)
        self.num_ops = int(num_ops)
        self.size = int(size)
        self.work_size = int(work_size)
        self.source_size = int(source_size)
        self.seed = int(seed)
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:source_size, 0:source_size].astype(np.float32) / source_size
        self._blobs: List[bytes] = []
        self._labels: List[int] = []
        for i in range(num_sources):
            label = i % num_classes
            angle = np.pi * label / num_classes
            freq = 3.0 + label
            stripes = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))
            phase = rng.uniform(0, 2 * np.pi, size=3).astype(np.float32)
            img = np.stack([0.5 + 0.35 * np.sin(stripes * 2.0 + p) for p in phase], axis=-1)
            img += rng.normal(0.0, 0.04, size=img.shape).astype(np.float32)
            img = np.clip(img * 255.0, 0, 255).astype(np.uint8)
            self._blobs.append(zlib.compress(img.tobytes(), 6))
            self._labels.append(label)

    def __len__(self) -> int:
        return self.length

    def _decode(self, index: int) -> np.ndarray:
        raw = zlib.decompress(self._blobs[index % len(self._blobs)])
        s = self.source_size
        return np.frombuffer(raw, dtype=np.uint8).reshape(s, s, 3).astype(np.float32) / 255.0

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(index)
        rng = np.random.default_rng((self.seed, index))
        img = self._decode(index)
        # random resized crop: 35-100% of the area, aspect ratio 3/4..4/3
        s = self.source_size
        area = rng.uniform(0.35, 1.0) * s * s
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(s, round(np.sqrt(area / aspect))))
        cw = int(min(s, round(np.sqrt(area * aspect))))
        top = int(rng.integers(0, s - ch + 1))
        left = int(rng.integers(0, s - cw + 1))
        img = _resize_bilinear(img[top : top + ch, left : left + cw], self.work_size, self.work_size)
        for op_index in rng.integers(0, len(_AUGMENTATIONS), size=self.num_ops):
            img = _AUGMENTATIONS[op_index](img, rng).astype(np.float32, copy=False)
        img = _resize_bilinear(img, self.size, self.size)
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = (img - _MEAN) / _STD
        label = np.int64(self._labels[index % len(self._labels)])
        return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32), label


# --------------------------------------------------------------------------------------
# Shared training-loop machinery
# --------------------------------------------------------------------------------------


def _profile(torch, run_dir: str, repeat: int):
    """The profiler configuration every demo run uses."""
    return torch.profiler.profile(
        activities=_activities(torch),
        schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=repeat),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            run_dir, worker_name=WORKER_NAME, use_gzip=True
        ),
        profile_memory=True,
        record_shapes=True,
        with_stack=False,
    )


def _activities(torch):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _prepare_run_dir(outdir: str, name: str) -> str:
    """OUTDIR/<name>, emptied of traces from an earlier demo so each run has fresh spans."""
    run_dir = os.path.join(outdir, name)
    os.makedirs(run_dir, exist_ok=True)
    for old in glob.glob(os.path.join(run_dir, f"{WORKER_NAME}.*.pt.trace.json*")):
        os.remove(old)
    return run_dir


def _profiled_loop(
    torch,
    run_dir: str,
    name: str,
    step_fn: Callable[[], None],
    *,
    repeat: int,
    settings: dict,
    warm_steps: int,
) -> None:
    """Run ``warm_steps`` unprofiled steps, then the profiled schedule, ``prof.step()`` each."""
    for _ in range(warm_steps):
        step_fn()
    total = (WAIT + WARMUP + ACTIVE) * repeat
    started = time.perf_counter()
    with warnings.catch_warnings():
        # A second cycle warns that events of the first are dropped from prof.events();
        # the demo never reads them (each cycle is saved as its own file). Under
        # `-W error` that warning would be raised mid-transition and crash torch 2.13.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end")
        with _profile(torch, run_dir, repeat) as prof:
            for _ in range(total):
                if prof.current_action == torch.profiler.ProfilerAction.RECORD_AND_SAVE:
                    # Kineto keeps metadata per recording cycle: add it in every cycle.
                    prof.add_metadata("demo_run", name)
                    prof.add_metadata_json("demo_settings", json.dumps(settings, sort_keys=True))
                step_fn()
                prof.step()
    files = sorted(glob.glob(os.path.join(run_dir, f"{WORKER_NAME}.*.pt.trace.json.gz")))
    sizes = ", ".join(f"{os.path.getsize(f) / 1024:.0f} KB" for f in files)
    _log(
        f"{name}: {total} profiled steps in {time.perf_counter() - started:.1f} s -> "
        f"{len(files)} trace file(s) ({sizes}) in {run_dir}"
    )


# --------------------------------------------------------------------------------------
# Pair 1: input-bound (num_workers=0) vs fixed (worker processes)
# --------------------------------------------------------------------------------------


@dataclass
class _InputPlan:
    device: str
    batch_size: int
    width: int
    num_ops: int
    num_workers: int
    prefetch_factor: int
    worker_parallelism: int
    model_step_ms: float
    data_batch_ms: float
    torch_threads: int


def _make_cnn(torch, width: int):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(4 * width, 4 * width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 10),
    )


def _make_train_step(torch, model, optimizer, device: str, batch_source: Callable[[], tuple]):
    loss_fn = torch.nn.CrossEntropyLoss()
    non_blocking = device == "cuda"

    def step() -> float:
        images, labels = batch_source()
        images = images.to(device, non_blocking=non_blocking)
        labels = labels.to(device, non_blocking=non_blocking)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()  # logging the loss: also waits for the GPU, as real loops do

    return step


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _plan_input_pair(torch, device: str, quick: bool) -> _InputPlan:
    """Size model and augmentation depth so that workers keep up and nw0 is input-bound.

    Measured on this machine: the model's training-step time ``C`` and the cost of one
    sample, ``a + b * num_ops``. The worker processes get about ``P`` cores (the main
    process keeps one), so they keep up when a batch takes them less than ``P * C``. We
    aim for a data time per batch of ``D = C * min(P / 1.25, 2)``: at least 1.25x
    head-room for the workers, while the single-process loader spends ``D / (D + C)``
    (44% on 2 cores, 67% with 4+ spare cores) of each step loading data.
    """
    batch_size = 64 if quick else 128
    num_workers = 4
    worker_parallelism = max(1, min(num_workers, _cpu_count() - 1))
    ratio = min(worker_parallelism / 1.25, 2.0)

    probe = AugmentedImageDataset(64, num_ops=0)
    n_probe = 12 if quick else 24

    def per_sample(num_ops: int) -> float:
        probe.num_ops = num_ops
        probe[0]  # warm the code path
        t0 = time.perf_counter()
        for i in range(n_probe):
            probe[i]
        return (time.perf_counter() - t0) / n_probe

    fixed = per_sample(0)
    per_op = max((per_sample(6) - fixed) / 6, 1e-6)

    images = torch.randn(batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (batch_size,))
    width = 48 if device == "cpu" else 64
    while True:
        torch.manual_seed(0)
        model = _make_cnn(torch, width).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step = _make_train_step(torch, model, opt, device, lambda: (images, labels))
        step()
        step()
        model_step = _median_seconds(step, 3)
        # Grow the model until even a one-augmentation pipeline leaves the workers room.
        if batch_size * (fixed + per_op) <= model_step * ratio or width >= 1024:
            break
        width *= 2

    target_sample = model_step * ratio / batch_size
    num_ops = int(round((target_sample - fixed) / per_op))
    num_ops = max(1, min(num_ops, 40))
    return _InputPlan(
        device=device,
        batch_size=batch_size,
        width=width,
        num_ops=num_ops,
        num_workers=num_workers,
        prefetch_factor=4,
        worker_parallelism=worker_parallelism,
        model_step_ms=round(model_step * 1e3, 2),
        data_batch_ms=round(batch_size * (fixed + per_op * num_ops) * 1e3, 2),
        torch_threads=torch.get_num_threads(),
    )


# How worker processes hand batches to the main process. With the default
# "file_descriptor" strategy every tensor's shared-memory handle is fetched through a socket
# from the worker that made it; on a 2-core machine, where the workers are busy, each such
# round trip waits for a worker to be scheduled (milliseconds per batch, counted as
# DataLoader time). "file_system" passes a name instead. This keeps the demo's numbers
# steady on small machines; it is not part of the input-pipeline fix being shown.
_BATCH_SHARING_STRATEGY = "file_system"


def _fill_prefetch_queues(plan: _InputPlan, steps_ahead: int) -> None:
    """Let freshly started workers fill their prefetch queues before profiling begins.

    Workers that are faster than the model keep ``num_workers * prefetch_factor`` batches
    ready in a long run; a demo run is too short to get there by itself. While the main
    process sleeps, the workers also have its core.
    """
    ready_batches = min(plan.num_workers * plan.prefetch_factor, steps_ahead)
    cores = min(plan.num_workers, plan.worker_parallelism + 1)
    seconds = 1.5 * ready_batches * plan.data_batch_ms / 1e3 / cores
    time.sleep(min(seconds, 6.0))


def _run_input(torch, outdir: str, name: str, plan: _InputPlan, workers: int, quick: bool) -> str:
    repeat = 1 if quick else 2
    warm_steps = 1
    profiled_steps = (WAIT + WARMUP + ACTIVE) * repeat
    # Enough samples for every step plus what the workers prefetch.
    length = plan.batch_size * (warm_steps + profiled_steps + workers * plan.prefetch_factor + 2)
    dataset = AugmentedImageDataset(length, num_ops=plan.num_ops)
    loader_kwargs = dict(batch_size=plan.batch_size, shuffle=True, drop_last=True)
    settings = dict(asdict(plan), num_workers=workers, story=name)
    if workers:
        loader_kwargs.update(
            num_workers=workers,
            persistent_workers=True,
            prefetch_factor=plan.prefetch_factor,
            pin_memory=plan.device == "cuda",
        )
    else:
        settings.pop("prefetch_factor")
    run_dir = _prepare_run_dir(outdir, name)
    strategy = torch.multiprocessing.get_sharing_strategy()
    if workers and _BATCH_SHARING_STRATEGY in torch.multiprocessing.get_all_sharing_strategies():
        torch.multiprocessing.set_sharing_strategy(_BATCH_SHARING_STRATEGY)
    if workers:
        settings["sharing_strategy"] = torch.multiprocessing.get_sharing_strategy()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        # On machines with fewer than 4 cores the DataLoader warns that 4 workers exceed
        # its suggested maximum; the demo keeps the classic num_workers=4 fix anyway.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = torch.utils.data.DataLoader(dataset, **loader_kwargs)
        batches = iter(loader)  # with workers: starts them, and they begin prefetching
    try:
        model = _make_cnn(torch, plan.width).to(plan.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step = _make_train_step(torch, model, opt, plan.device, lambda: next(batches))
        for _ in range(warm_steps):
            step()
        if workers:
            _fill_prefetch_queues(plan, profiled_steps)
        _profiled_loop(torch, run_dir, name, step, repeat=repeat, settings=settings, warm_steps=0)
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:  # stop persistent workers now, not at garbage collection
            shutdown()
        torch.multiprocessing.set_sharing_strategy(strategy)
    return run_dir


def _input_pair(torch, outdir: str, device: str, quick: bool) -> List[str]:
    threads = torch.get_num_threads()
    if device == "cpu":
        # One intra-op thread: the model's step time is then alike on every machine, and
        # the other cores are free for the DataLoader workers of the second run.
        torch.set_num_threads(1)
    try:
        plan = _plan_input_pair(torch, device, quick)
        _log(
            f"input pair plan: model step {plan.model_step_ms:.0f} ms (CNN width {plan.width}, "
            f"batch {plan.batch_size}), data {plan.data_batch_ms:.0f} ms per batch "
            f"({plan.num_ops} augmentations per sample), ~{plan.worker_parallelism} core(s) "
            f"for workers"
        )
        return [
            _run_input(torch, outdir, INPUT_PAIR[0], plan, workers=0, quick=quick),
            _run_input(torch, outdir, INPUT_PAIR[1], plan, workers=plan.num_workers, quick=quick),
        ]
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------
# Pair 2 (CUDA): FP32 GEMMs vs bf16 autocast
# --------------------------------------------------------------------------------------


def _make_mlp_stack(torch, dim: int, depth: int):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    return nn.Sequential(*[Block() for _ in range(depth)])


def _run_precision(torch, outdir: str, name: str, bf16: bool, quick: bool) -> str:
    dim, depth, batch, seq = (1024, 2, 8, 256) if quick else (2048, 4, 8, 512)
    torch.manual_seed(0)
    model = _make_mlp_stack(torch, dim, depth).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        x = torch.randn(batch, seq, dim, device="cuda")
        target = torch.randn(batch, seq, dim, device="cuda")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), target)
        loss.backward()
        opt.step()
        return loss.item()

    run_dir = _prepare_run_dir(outdir, name)
    settings = dict(story=name, dim=dim, depth=depth, batch=batch, seq=seq,
                    autocast="bfloat16" if bf16 else None, float32_matmul_precision="highest")
    _profiled_loop(torch, run_dir, name, step, repeat=1 if quick else 2,
                   settings=settings, warm_steps=2)
    return run_dir


def _precision_pair(torch, outdir: str, quick: bool) -> List[str]:
    if not torch.cuda.is_bf16_supported():
        _log(f"skipping {' vs '.join(PRECISION_PAIR)}: this GPU does not support bfloat16")
        return []
    precision = torch.get_float32_matmul_precision()
    # "highest" = true FP32 GEMMs (no TF32), the baseline whose kernels skip Tensor Cores.
    torch.set_float32_matmul_precision("highest")
    try:
        return [
            _run_precision(torch, outdir, PRECISION_PAIR[0], bf16=False, quick=quick),
            _run_precision(torch, outdir, PRECISION_PAIR[1], bf16=True, quick=quick),
        ]
    finally:
        torch.set_float32_matmul_precision(precision)


# --------------------------------------------------------------------------------------
# Pair 3 (CUDA): many small elementwise kernels vs torch.compile
# --------------------------------------------------------------------------------------


def _make_pointwise_net(torch, dim: int, depth: int):
    nn = torch.nn

    class PointwiseBlock(nn.Module):
        """A gated residual block written op by op: a dozen tiny kernels in eager mode."""

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(dim))
            self.shift = nn.Parameter(torch.zeros(dim))
            self.gate_w = nn.Parameter(torch.full((dim,), 0.5))
            self.gate_b = nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            mean = x.mean(dim=-1, keepdim=True)
            var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
            h = (x - mean) * torch.rsqrt(var + 1e-5) * self.scale + self.shift
            h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
            gate = torch.sigmoid(h * self.gate_w + self.gate_b)
            return x + 0.1 * h * gate

    return nn.Sequential(*[PointwiseBlock() for _ in range(depth)])


def _run_fusion(torch, outdir: str, name: str, compiled: bool, quick: bool,
                mode: Optional[str] = None) -> Optional[str]:
    dim, depth, batch = (1024, 6, 256) if quick else (1024, 12, 512)
    torch.manual_seed(0)
    model = _make_pointwise_net(torch, dim, depth).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    forward = torch.compile(model, mode=mode) if compiled else model

    def step() -> float:
        x = torch.randn(batch, dim, device="cuda")
        opt.zero_grad(set_to_none=True)
        loss = forward(x).square().mean()
        loss.backward()
        opt.step()
        return loss.item()

    if compiled:
        _log("compiling (torch.compile, first steps only; this can take a minute)")
        try:
            step()  # the compilation happens here, outside the profiled steps
            if mode == "reduce-overhead":
                step()  # CUDA graphs are recorded on the second call
        except Exception as exc:  # noqa: BLE001 - missing triton/compiler: skip, say why
            _log(f"skipping {name}: torch.compile failed: {type(exc).__name__}: {exc}")
            return None
    run_dir = _prepare_run_dir(outdir, name)
    settings = dict(story=name, dim=dim, depth=depth, batch=batch, compiled=compiled)
    if mode:
        settings["compile_mode"] = mode
    _profiled_loop(torch, run_dir, name, step, repeat=1 if quick else 2,
                   settings=settings, warm_steps=2)
    return run_dir


def _fusion_pair(torch, outdir: str, quick: bool) -> List[str]:
    runs = [
        _run_fusion(torch, outdir, FUSION_PAIR[0], compiled=False, quick=quick),
        _run_fusion(torch, outdir, FUSION_PAIR[1], compiled=True, quick=quick),
        _run_fusion(torch, outdir, CUDA_GRAPHS_RUN, compiled=True, quick=quick, mode="reduce-overhead"),
    ]
    return [r for r in runs if r is not None]


# --------------------------------------------------------------------------------------
# Pair 4: distributed data parallel on CPU, one slow rank vs balanced (metrics §12)
# --------------------------------------------------------------------------------------

# Each rank's data loading sleeps a known time per batch inside the DataLoader's
# __next__ (a dataset whose __getitem__ returns one whole batch), so the trace shows it as
# DataLoader time. In the straggler run rank 1 sleeps DDP_EXTRA_LOAD_MS longer: rank 0
# then waits about that long in every gradient all-reduce. Sleeping (not computing) keeps
# the injected difference exact on a loaded 2-core machine, and the long base load keeps a
# descheduled rank's hiccup (~10 ms at a load average of 15 on 2 cores) well below the
# straggler rule's STRAGGLER_MIN_WAIT_PCT of the step in the balanced twin.
DDP_BASE_LOAD_MS = 150.0
DDP_EXTRA_LOAD_MS = 150.0
DDP_SLOW_RANK = 1
DDP_WORLD_SIZE = 2
DDP_WAIT, DDP_WARMUP = 1, 1
DDP_ACTIVE_QUICK, DDP_ACTIVE_FULL = 3, 6


class _SleepyBatches:
    """A map-style dataset of whole batches whose loading takes ``load_ms`` (a sleep)."""

    def __init__(self, torch, n: int, batch: int, dim: int, load_ms: float, seed: int):
        self.n, self.load_s = n, load_ms / 1000.0
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(batch, dim, generator=g)
        self.y = torch.randint(0, 10, (batch,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        time.sleep(self.load_s)
        return self.x, self.y


def _slow_backward(torch):
    """Identity in forward; its backward sleeps ``ms`` first (the injected extra backward work
    of the compute straggler: a sleep inside an autograd node is exact on a loaded machine and
    shows in the trace as that node's backward span)."""

    class SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, ms):
            ctx.ms = ms
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(ctx.ms / 1000.0)
            return grad, None

    return SlowBackward


def init_gloo_rank(torch, dist, rank: int, world: int, port: int) -> None:
    """One rank of a local gloo job: rendezvous on 127.0.0.1:port, one CPU thread, seed 0."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)

def _ddp_worker(rank: int, world: int, port: int, run_dir: str, name: str, load_ms: List[float],
                active: int, backward_ms: Optional[List[float]] = None) -> None:
    """One rank of a gloo DDP run under the profiler (started by torch.multiprocessing).
    ``backward_ms``: per rank, extra time its backward spends (a sleep in an autograd node
    after the first layer), None: none."""
    import torch
    import torch.distributed as dist

    init_gloo_rank(torch, dist, rank, world, port)
    try:
        dim = 256
        extra = (backward_ms or [0.0] * world)[rank]
        slow = _slow_backward(torch)

        class _Extra(torch.nn.Module):
            def forward(self, x):
                return slow.apply(x, extra) if extra > 0 else x

        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(dim, dim), _Extra(), torch.nn.ReLU(), torch.nn.Linear(dim, dim), torch.nn.ReLU(),
            torch.nn.Linear(dim, 10)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        warm = 2
        total = DDP_WAIT + DDP_WARMUP + active
        data = torch.utils.data.DataLoader(
            _SleepyBatches(torch, warm + total, 64, dim, load_ms[rank], seed=rank),
            batch_size=None, num_workers=0)
        batches = iter(data)

        def step() -> None:
            x, y = next(batches)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for _ in range(warm):  # DDP builds its buckets in the first iterations
            step()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=DDP_WAIT, warmup=DDP_WARMUP, active=active, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(run_dir, worker_name=f"rank{rank}",
                                                                    use_gzip=True),
            profile_memory=True, record_shapes=True,
        ) as prof:
            for _ in range(total):
                if prof.current_action == torch.profiler.ProfilerAction.RECORD_AND_SAVE:
                    prof.add_metadata("demo_run", name)
                    settings = {"load_ms": load_ms, "rank": rank, "world_size": world}
                    if backward_ms:
                        settings["backward_ms"] = backward_ms
                    prof.add_metadata_json("demo_settings", json.dumps(settings, sort_keys=True))
                step()
                prof.step()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ddp_load_ms(straggler: bool) -> List[float]:
    """Per-rank data-loading time per batch of the distributed demo runs (ms)."""
    return [DDP_BASE_LOAD_MS + (DDP_EXTRA_LOAD_MS if straggler and r == DDP_SLOW_RANK else 0.0)
            for r in range(DDP_WORLD_SIZE)]


def _run_ddp(torch, outdir: str, name: str, straggler: bool, quick: bool,
             backward_ms: Optional[List[float]] = None) -> str:
    import torch.multiprocessing as mp

    run_dir = os.path.join(outdir, name)
    os.makedirs(run_dir, exist_ok=True)
    for old in glob.glob(os.path.join(run_dir, "rank*.pt.trace.json*")):
        os.remove(old)
    load_ms = ddp_load_ms(straggler)
    active = DDP_ACTIVE_QUICK if quick else DDP_ACTIVE_FULL
    started = time.perf_counter()
    mp.spawn(_ddp_worker, args=(DDP_WORLD_SIZE, _free_port(), run_dir, name, load_ms, active, backward_ms),
             nprocs=DDP_WORLD_SIZE, join=True)
    files = sorted(glob.glob(os.path.join(run_dir, "rank*.pt.trace.json.gz")))
    _log(f"{name}: {DDP_WORLD_SIZE} gloo ranks, data loading {load_ms} ms per batch"
         + (f", extra backward {backward_ms} ms" if backward_ms else "") + f", {active} profiled "
         f"steps in {time.perf_counter() - started:.1f} s -> {len(files)} trace file(s) in {run_dir}")
    return run_dir


def generate_distributed(outdir: str, *, quick: bool = False) -> List[str]:
    """The distributed pair: ``ddp_straggler_2rank`` (rank 1 loads its data
    ``DDP_EXTRA_LOAD_MS`` slower) and ``ddp_balanced_2rank``; 2 gloo processes on CPU."""
    torch = _import_torch()
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    return [_run_ddp(torch, outdir, DDP_PAIR[0], straggler=True, quick=quick),
            _run_ddp(torch, outdir, DDP_PAIR[1], straggler=False, quick=quick)]


# The compute straggler (issue 37): the same DDP job, the same data loading on both ranks, and
# rank 1's backward DDP_EXTRA_BACKWARD_MS longer (a sleep in an autograd node): rank 0 waits
# for it in the gradient all-reduce, and rank 1's own all-reduce looks short (it arrives last).
DDP_COMPUTE_STRAGGLER = "ddp_compute_straggler_2rank"
DDP_EXTRA_BACKWARD_MS = 100.0


def ddp_backward_ms() -> List[float]:
    """Per-rank extra backward time of the compute-straggler demo run (ms)."""
    return [DDP_EXTRA_BACKWARD_MS if r == DDP_SLOW_RANK else 0.0 for r in range(DDP_WORLD_SIZE)]


def generate_compute_straggler(outdir: str, *, quick: bool = False) -> str:
    """``ddp_compute_straggler_2rank``: 2 gloo processes on CPU, rank 1's backward slower."""
    torch = _import_torch()
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    return _run_ddp(torch, outdir, DDP_COMPUTE_STRAGGLER, straggler=False, quick=quick,
                    backward_ms=ddp_backward_ms())


# Pipeline parallelism (issue 37): 4 gloo ranks on CPU as 2 data-parallel replicas x 2
# pipeline stages (torch.distributed.pipelining, ScheduleGPipe, PP_MICROBATCHES microbatches),
# groups as a (dp=2, pp=2) mesh: pipelines [0, 1] and [2, 3], gradients all-reduced over [0, 2]
# and [1, 3]. Each rank measures in-process, per step, the time its host spends inside the
# schedule's point-to-point calls (issuing them and waiting for them: the bubble, METRICS.md
# §12), recorded in the trace as demo_truth.
PIPELINE_RUN = "pipeline_2x2_4rank"
PP_WORLD, PP_STAGES, PP_MICROBATCHES = 4, 2, 4
PP_WARM, PP_WARMUP, PP_ACTIVE = 2, 1, 3


def _pipeline_worker(rank: int, world: int, port: int, run_dir: str, name: str) -> None:
    import torch
    import torch.distributed as dist

    init_gloo_rank(torch, dist, rank, world, port)
    try:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        import torch.distributed.pipelining.schedules as schedules

        pp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        pp, dp = pp_groups[rank // PP_STAGES], dp_groups[rank % PP_STAGES]
        stage_index = rank % PP_STAGES
        dim = 512
        module = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.ReLU())
                                       for _ in range(4)])
        stage = PipelineStage(module, stage_index, PP_STAGES, torch.device("cpu"), group=pp)
        schedule = ScheduleGPipe(stage, n_microbatches=PP_MICROBATCHES,
                                 loss_fn=lambda out, target: ((out - target) ** 2).mean())
        blocked = [0.0]

        def timed(fn):
            def call(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    blocked[0] += time.perf_counter() - started
            return call

        # the schedule's own point-to-point helpers: issuing the ops, waiting for them
        schedules._sorted_batch_p2p = timed(schedules._sorted_batch_p2p)
        schedules._wait_batch_p2p = timed(schedules._wait_batch_p2p)
        g = torch.Generator().manual_seed(rank // PP_STAGES)
        x = torch.randn(32 * PP_MICROBATCHES, dim, generator=g)
        y = torch.randn(32 * PP_MICROBATCHES, dim, generator=g)

        def step() -> Tuple[float, float]:
            blocked[0] = 0.0
            started = time.perf_counter()
            if stage_index == 0:
                schedule.step(x)
            else:
                schedule.step(target=y)
            p2p = blocked[0]
            for p in module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp)
            return time.perf_counter() - started, p2p

        for _ in range(PP_WARM):
            step()
        measured: List[Tuple[float, float]] = []
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=PP_WARMUP, active=PP_ACTIVE, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(run_dir, worker_name=f"rank{rank}",
                                                                    use_gzip=True),
            record_shapes=True,
        ) as prof:
            for i in range(PP_WARMUP + PP_ACTIVE):
                last = prof.current_action == torch.profiler.ProfilerAction.RECORD_AND_SAVE
                measured.append(step())
                if last:  # ProfilerStep#0 is the warm-up step: the recorded steps are 1..
                    steps = list(range(PP_WARMUP, PP_WARMUP + PP_ACTIVE))
                    prof.add_metadata("demo_run", name)
                    prof.add_metadata_json("demo_settings", json.dumps(
                        {"rank": rank, "world_size": world, "stages": PP_STAGES, "stage": stage_index,
                         "microbatches": PP_MICROBATCHES, "schedule": "ScheduleGPipe",
                         "pipelines": [[0, 1], [2, 3]]}, sort_keys=True))
                    prof.add_metadata_json("demo_truth", json.dumps(
                        {"steps": steps, "stage": stage_index,
                         "p2p_blocked_ms": [1000.0 * b for _, b in measured[PP_WARMUP:]],
                         "step_ms": [1000.0 * t for t, _ in measured[PP_WARMUP:]],
                         "how": "time.perf_counter around torch.distributed.pipelining.schedules."
                                "_sorted_batch_p2p and _wait_batch_p2p, per step, in the rank's process"},
                        sort_keys=True))
                prof.step()
    finally:
        dist.destroy_process_group()


def generate_pipeline(outdir: str) -> str:
    """``pipeline_2x2_4rank``: 4 gloo processes on CPU, 2 replicas x 2 GPipe stages."""
    import torch.multiprocessing as mp

    _import_torch()
    run_dir = os.path.join(os.path.abspath(outdir), PIPELINE_RUN)
    os.makedirs(run_dir, exist_ok=True)
    for old in glob.glob(os.path.join(run_dir, "rank*.pt.trace.json*")):
        os.remove(old)
    started = time.perf_counter()
    mp.spawn(_pipeline_worker, args=(PP_WORLD, _free_port(), run_dir, PIPELINE_RUN), nprocs=PP_WORLD, join=True)
    _log(f"{PIPELINE_RUN}: {PP_WORLD} gloo ranks, {PP_STAGES} stages x 2 replicas, {PP_MICROBATCHES} microbatches, "
         f"{PP_ACTIVE} profiled steps in {time.perf_counter() - started:.1f} s -> {run_dir}")
    return run_dir


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def generate(outdir: str, *, quick: bool = False, device: Optional[str] = None,
             distributed: bool = False) -> List[str]:
    """Write the demo runs into ``outdir`` and return the run directories created.

    ``device``: ``"cpu"``, ``"cuda"`` or None (CUDA when available). The input pair
    always runs (on ``device``); the precision and fusion pairs need CUDA and are skipped
    with a message otherwise. ``quick`` makes smaller, shorter runs (one trace file per
    run instead of two) for tests ``distributed`` adds the 2-rank gloo pair
    (``generate_distributed``; the CLI's default).
    """
    torch = _import_torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(torch, device)
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    started = time.perf_counter()
    _log(f"torch {torch.__version__}, device {device}, {_cpu_count()} CPU core(s), "
         f"{'quick' if quick else 'full'} mode -> {outdir}")

    runs = _input_pair(torch, outdir, device, quick)
    if device == "cuda":
        runs += _precision_pair(torch, outdir, quick)
        runs += _fusion_pair(torch, outdir, quick)
    else:
        _log(
            "skipping the GPU pairs (fp32_matmul vs bf16_autocast, many_small_kernels vs "
            "compiled): they need CUDA; run `tb-bottlenecks demo OUTDIR` on a CUDA machine"
        )
    if distributed:
        runs += generate_distributed(outdir, quick=quick)
        runs.append(generate_compute_straggler(outdir, quick=quick))
        runs.append(generate_pipeline(outdir))
    _log(f"done in {time.perf_counter() - started:.1f} s: {len(runs)} runs. "
         f"View them with: tensorboard --logdir {outdir}")
    return runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``tb-bottlenecks demo OUTDIR [--quick] [--device cpu|cuda] [--ground-truth]``.

    ``--ground-truth`` writes only the runs of :mod:`tb_bottleneck_demo.ground_truth`
    (``python -m tb_bottleneck_demo OUTDIR --ground-truth``)."""
    parser = argparse.ArgumentParser(
        prog="tb-bottlenecks demo",
        description=(
            "Run small real PyTorch training loops under torch.profiler and write their "
            "traces as a TensorBoard logdir, one run per directory, in problem/fix pairs: "
            + ", ".join(f"{a} vs {b}" for a, b in (INPUT_PAIR, PRECISION_PAIR, FUSION_PAIR))
            + ". The last two pairs need CUDA. Earlier demo traces in these run "
            "directories are replaced."
        ),
    )
    parser.add_argument("outdir", help="logdir to write the runs into (created if missing)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller, shorter runs with one trace file each")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="where to train (default: cuda when available, else cpu)")
    parser.add_argument("--no-distributed", action="store_true",
                        help="skip the distributed pair (2 gloo ranks on CPU: "
                             + " vs ".join(DDP_PAIR) + ")")
    parser.add_argument("--ground-truth", action="store_true",
                        help="write only the ground-truth runs (tb_bottleneck_demo/ground_truth.py: "
                             "with_stack + a known .item() line and slow module, a torch.compile "
                             "graph-break/recompile pair, gloo all-gather/reduce-scatter on 2 ranks), "
                             "each with PyTorch's own expected numbers in its trace (demo_truth)")
    args = parser.parse_args(argv)
    try:
        if args.ground_truth:
            from tb_bottleneck_demo.ground_truth import generate_ground_truth

            generate_ground_truth(args.outdir, device=args.device or "cpu")
            return 0
        generate(args.outdir, quick=args.quick, device=args.device, distributed=not args.no_distributed)
    except BottleneckError as exc:
        print(f"tb-bottlenecks demo: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover  (python -m tb_bottleneck_demo is the usual spelling)
    sys.exit(main())
