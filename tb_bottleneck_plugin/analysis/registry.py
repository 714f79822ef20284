"""The registry of metric units (analysis/units.py), in report order: report.analyze_trace
runs them in this order for a span, report.combine_results merges their partials for a
worker or a run. A new metric family: its module with ``UNIT`` and one line here."""
from __future__ import annotations

from typing import List

from . import breakdown, context, gpu, input_bound, memory, occupancy, signals, steps, tensor_cores, units_trace
from . import compilation
from . import flops
from . import source
from . import collectives
from . import copies
from . import memory_peak
from . import step_model
from .units import Unit

UNITS: List[Unit] = [
    units_trace.UNIT,   # device_names, device_properties, trace
    steps.UNIT,         # steps (and span.found for every unit below)
    breakdown.UNIT,     # avg_step_us, breakdown_us, breakdown_pct, breakdown_per_step
    input_bound.UNIT,   # input
    gpu.UNIT,           # gpu
    tensor_cores.UNIT,  # tensor_cores (and gpu[dev].tensor_core_pct, JOINS)
    flops.UNIT,         # flops (FLOPs, MFU, roofline; METRICS.md §15)
    occupancy.UNIT,     # occupancy
    memory.UNIT,        # memory (and the memory curves, the snapshot)
    signals.SYNC_UNIT, signals.COMMUNICATION_UNIT, signals.LAUNCH_UNIT,
    copies.UNIT,        # copies (device-to-device copies: time, exposed, launching ops; METRICS.md §8)
    collectives.UNIT,   # collectives (bytes, algbw/busbw per collective vs the link, exposed; METRICS.md)
    context.UNIT,       # context (training/inference, graphs, compile, distributed)
    compilation.UNIT,   # compilation (torch.compile regions, breaks, recompiles, Triton kernels, CUDA graphs)
    memory_peak.UNIT,   # memory_peak (who holds memory at the peak; METRICS.md §7): before source, which
                        # releases the host nesting both read
    source.UNIT,        # source_attribution (user source lines, nn.Module tree, record_function labels; §17)
    step_model.UNIT,    # step_model (dependency graph, critical path, what-ifs; METRICS.md §19)
]

# Cross-section links, run after every unit (span and summary alike).
JOINS = [tensor_cores.join_gpu, memory_peak.join_recompute]

# Two lanes of units that report.analyze_trace may run at the same time, after `steps` and
# before `step_model` (issue 39: their numpy loops release the GIL, so two cores share the
# work). Every reader of the host and op nesting is in NESTING_LANE, in registry order:
# flops derives the op nesting, source attribution drops the host nesting and may reuse its
# arrays in place. OTHER_LANE shares with it only the per-span caches, which are
# thread-safe (units.SpanContext.once). Neither reads another unit's report section. A unit
# between `steps` and `step_model` in neither lane makes every span run its units one
# after another, as before.
NESTING_LANE = ("flops", "memory_peak", "source_attribution")
OTHER_LANE = ("breakdown", "input", "gpu", "tensor_cores", "occupancy", "memory", "sync", "communication",
              "launch", "copies", "collectives", "context", "compilation")


def by_name(name: str) -> Unit:
    return next(u for u in UNITS if u.name == name)
