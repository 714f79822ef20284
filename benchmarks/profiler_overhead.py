"""How much the profiler's options inflate a step (issue 20 item 13; METRICS.md §9).

Kineto writes ``record_shapes``, ``profile_memory`` and ``with_stack`` into the trace; each
adds host work to every op. This times the same training steps of the demo generator's
models unprofiled and under ``torch.profiler.profile`` with each option alone and all three,
and prints one JSON object: per model and setting, the median step time (ms) and its ratio
to the unprofiled step.

    python benchmarks/profiler_overhead.py [--device cuda] [--steps 30] [--json OUT]

Models: ``many_small_kernels`` (the launch-bound pointwise net: host cost per op matters
most) and ``fp32_matmul`` (large GEMMs: the GPU hides the host). On a CPU the models are
shrunk so that a run takes seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = {
    "unprofiled": None,
    "profiled": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
    "all_three": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}


def _models(torch, device: str):
    from tb_bottleneck_demo import generator

    big = device == "cuda"
    out = {}
    p_dim, p_depth, p_batch = (1024, 12, 512) if big else (256, 4, 64)
    net = generator._make_pointwise_net(torch, p_dim, p_depth).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def pointwise():
        x = torch.randn(p_batch, p_dim, device=device)
        opt.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        opt.step()

    out["many_small_kernels"] = pointwise
    m_dim, m_depth, m_batch, m_seq = (2048, 4, 8, 512) if big else (256, 2, 4, 64)
    mlp = generator._make_mlp_stack(torch, m_dim, m_depth).to(device)
    opt2 = torch.optim.AdamW(mlp.parameters(), lr=1e-4)

    def matmul():
        x = torch.randn(m_batch, m_seq, m_dim, device=device)
        opt2.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(mlp(x), x).backward()
        opt2.step()

    out["fp32_matmul"] = matmul
    return out


def _time_steps(torch, step, device: str, steps: int, options):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []

    def run():
        for _ in range(steps):
            sync()
            t = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t)

    if options is None:
        run()
    else:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts, **options):
            run()
    return statistics.median(times[steps // 3:]) * 1e3  # ms, after the first third (warm-up)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.set_float32_matmul_precision("highest")
    result = {"torch": torch.__version__, "device": device,
              "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "steps": args.steps, "models": {}}
    for name, step in _models(torch, device).items():
        for _ in range(3):
            step()  # warm-up: allocator, cuBLAS handles, first-call costs
        row = {}
        for setting, options in SETTINGS.items():
            row[setting] = {"median_ms": round(_time_steps(torch, step, device, args.steps, options), 3)}
        base = row["unprofiled"]["median_ms"]
        for setting in row:
            row[setting]["x_unprofiled"] = round(row[setting]["median_ms"] / base, 3)
        result["models"][name] = row
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
