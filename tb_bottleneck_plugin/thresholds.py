"""Named thresholds of ../shared/docs/metrics.md, in one flat list.

Each constant says where its value comes from. Analyses and recommendation rules
import them from here (``from tb_bottleneck_plugin import thresholds as T``); never
repeat the numbers elsewhere.
"""

# §3 Input-bound verdict, XProf's thresholds (percent of step time).
INPUT_BOUND_HIGH_PCT = 20.0  # >= this: "highly input-bound" (severity "high")
INPUT_BOUND_MODERATE_PCT = 5.0  # >= this: "moderately input-bound" (severity "medium")

# §1 tbp's tail-step rule: the last step that launched GPU work is dropped when it
# launched fewer than this share of the GPU activities of the step before it.
STEP_TAIL_MIN_GPU_RATIO = 0.8

# §4 HTA idle breakdown: a gap between consecutive kernels on a stream shorter than
# this is "kernel wait" (HTA's consecutive_kernel_delay default, µs).
HTA_KERNEL_WAIT_US = 30.0

# §6 Short kernels: kernels shorter than this (µs) are counted as "short" (launch-bound sign).
SHORT_KERNEL_US = 10.0

# §7 Possible memory leak: allocated memory at step boundaries rose at least this many
# times in a row (i.e. across >= this many consecutive steps) ...
MEMORY_LEAK_MIN_RISES = 3
# ... and by at least this much in total (bytes), so allocator noise does not fire it.
MEMORY_LEAK_MIN_GROWTH_BYTES = 1 << 20
