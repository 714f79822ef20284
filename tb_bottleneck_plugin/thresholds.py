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

# --- recommendations (§9): when a rule fires and how severe it is -----------------
# Input transfer (pageable H2D copies not hidden under kernels), % of step time.
INPUT_TRANSFER_PCT = 2.0
# Matmul/conv kernel time that could use Tensor Cores but does not, % of kernel time.
TC_ELIGIBLE_NOT_USING_PCT = 20.0
TC_ELIGIBLE_NOT_USING_HIGH_PCT = 50.0
# Kernels shorter than SHORT_KERNEL_US taking this share of kernel time: launch-bound.
SHORT_KERNEL_TIME_PCT = 30.0
# Time-weighted theoretical occupancy below this: latency-bound kernels.
LOW_OCCUPANCY_PCT = 25.0
# A GEMM/conv/attention kernel at or above this % of its attainable roofline rate (§15) is
# compute-efficient: never called latency- or launch-bound for its occupancy (Hopper GEMMs
# run one large block per SM, low occupancy by design). When such kernels hold at least
# this share of kernel time, low occupancy is not a reason of rule small_kernels.
ROOFLINE_EFFICIENT_PCT = 50.0
# GPU utilization (kernels / steps window) below this while not input-bound.
LOW_GPU_UTILIZATION_PCT = 50.0
# Allocator slack: reserved but never allocated at the peak, % of peak reserved;
# only on devices that reserved at least SLACK_MIN_RESERVED_BYTES (tiny runs are noise).
SLACK_FRAGMENTATION_PCT = 30.0
SLACK_FRAGMENTATION_HIGH_PCT = 50.0
SLACK_MIN_RESERVED_BYTES = 1 << 30
# ... and only under memory pressure (issue 20): peak reserved at least this share of the
# device capacity (deviceProperties totalGlobalMem). Below it the slack costs nothing (the
# H100 demo pairs reserve 7-12 GiB of 79 GiB); with the capacity unknown the rule is silent.
MEMORY_PRESSURE_PCT = 85.0
# Memory at the peak (METRICS.md §7): the memory_peak rule fires when the peak allocated is at
# least this share of the device's capacity (high at MEMORY_PEAK_HIGH_PCT).
MEMORY_PEAK_PCT = 85.0
MEMORY_PEAK_HIGH_PCT = 95.0
# GPU idle caused by host-device synchronisation (during the wait, and after it until the
# host launches again; sync_cost_pct, §8), % of step time. A host that waits on a busy GPU
# and refills its queue at once costs nothing.
SYNC_PCT = 5.0
SYNC_HIGH_PCT = 15.0
# Device-to-device copies (Memcpy DtoD/PtoP, copies.d2d_pct, METRICS.md §8), % of step time:
# worth a word from this share (the same bar as a host wait that idles the GPU: one step in
# twenty spent moving bytes that are already on the GPU), "high" from D2D_COPY_HIGH_PCT.
# Real steps copy far less: every shared trace at most 2.9 % (MI300 ResNet, aten::copy_).
D2D_COPY_PCT = 5.0
D2D_COPY_HIGH_PCT = 15.0
# Communication kernels, % of kernel time; overlapped share considered fine; exposed
# communication (share x not overlapped) that makes it "high".
COMM_SHARE_PCT = 15.0
COMM_OVERLAP_OK_PCT = 70.0
COMM_EXPOSED_HIGH_PCT = 30.0
# Bucket and prefetch advice (rules ddp_buckets, fsdp_prefetch; METRICS.md §9, issue 24),
# from the collectives section (§18: calls, bytes per call, exposed µs per kind). Exposed
# time of the kinds concerned, % of the step, at or above which the advice is given
# (its estimated gain); COMM_EXPOSED_HIGH_PCT of the step makes it "high".
COMM_ADVICE_EXPOSED_PCT = 5.0
# DDP's gradient all-reduces are "many small" when at least this many run per step ...
DDP_SMALL_ALLREDUCES_PER_STEP = 8
# ... with a mean message at or below this many bytes (DDP's default bucket_cap_mb=25 fills
# 25 MiB buckets; a bucket of 4 MiB or less means small buckets or per-parameter all-reduces).
DDP_SMALL_ALLREDUCE_BYTES = 4 << 20
# Gain estimate of tensor_cores_unused (estimated_gain_pct = eligible-not-using share of the
# step x (1 - 1/speedup)): how much faster an fp32 matmul/conv kernel runs on Tensor Cores
# (bf16/fp16), per NVIDIA compute capability major. About half the dense 16-bit Tensor Core
# to fp32 FMA peak ratio of the generation's data-centre part (real kernels reach less than
# peak): Pascal P100 fp16 2x (no Tensor Cores), V100 125:15.7 TFLOPS, A100 312:19.5,
# H100 SXM 989:67, B200 2250:75 (about 30x; kept at 8x, the size of the one measured pair:
# H100 fp32_matmul -> bf16_autocast ran 6.2x faster end to end).
# Key None: generation unknown (no deviceProperties), another major, or AMD matrix cores
# (MI250 383:47.9, MI300X 1307:163, both about 8x peak): the conservative end. (One dict, not
# a bare 4.0 constant, so test_no_threshold_number_is_compared_outside_thresholds_py does not
# flag every `== 4` in the package.)
# An fp32 matmul/conv moved to Tensor Cores speeds up by the ratio of the bf16 (fp16 before
# Ampere) peak to the fp32 peak times this: it reaches a smaller fraction of the higher peak
# (recommendations.py rule tensor_cores_unused, from the FLOPs section).
TC_FP32_PEAK_FRACTION_KEPT = 0.5
# Rule low_mfu: memory-bound kernels (the roofline, METRICS §15) holding at least this share
# of an eager step are worth fusing; fusion at least halves their memory traffic.
FUSION_MEMORY_BOUND_STEP_PCT = 20.0
FUSION_SPEEDUP = 2.0
# ... counting only the op classes that hold at least this share of the step.
TC_MIN_CLASS_STEP_PCT = 0.5
TC_SPEEDUP_BY_COMPUTE_MAJOR = {6: 2.0, 7: 4.0, 8: 8.0, 9: 7.0, 10: 8.0, None: 4.0}

# --- §12 distributed runs: when the rank view flags a straggler -----------------------
# Load imbalance: 100 * (max - mean) / mean of the ranks' compute time per step.
LOAD_IMBALANCE_PCT = 10.0
LOAD_IMBALANCE_HIGH_PCT = 25.0
# One rank is the straggler (waited least) in at least this share of the steps ...
STRAGGLER_STEP_SHARE_PCT = 60.0
# ... and the others' wait for it is at least this share of the step time (so that a
# balanced 2-rank run, where one of the two always waits a few µs less, is not flagged).
STRAGGLER_MIN_WAIT_PCT = 10.0
STRAGGLER_WAIT_HIGH_PCT = 20.0
# The straggler's cause by difference (§12): an activity is named as the cause when the
# straggler spends at least this share of the group's median step more in it than the
# median of the other ranks of its group.
STRAGGLER_CAUSE_MIN_PCT = 5.0
# A kernel family is named in a compute cause when it makes this % of the compute difference.
STRAGGLER_CAUSE_FAMILY_MIN_PCT = 20.0
# Pipeline parallelism (§12): advice when the stages are blocked in point-to-point calls at
# least this share of the step; rebalancing when a stage's busy time exceeds the mean by this.
PIPELINE_BUBBLE_PCT = 10.0
PIPELINE_IMBALANCE_PCT = 10.0

# --- §11 comparing two runs: the noise band of a change (compare.py) --------------------
# A change inside the band is "unchanged" (neither better nor worse, not coloured).
# Percentages: |candidate - baseline| <= this many percentage points ...
COMPARE_NOISE_PP = 0.5
# ... other numbers (times, bytes, throughput, counts; a kernel's or operator's time per
# step in the diff tables): |candidate - baseline| <= this % of |baseline|. A step-time
# category's change is held to this % of the baseline's average step time (its whole).
COMPARE_NOISE_REL_PCT = 3.0

# --- §8 longest runtime call: a first-call warm-up outlier in the profiled steps --------
# One runtime call that does not wait for the GPU holds at least this share of all
# runtime-call time in the included steps ... (MI250 hta amd_trace: one 6.5 ms first
# hipLaunchKernel, 97 %; every other shared trace <= 24 %)
WARMUP_CALL_RUNTIME_PCT = 50.0
# ... and at least this share of the included step time (else it costs the step little):
# the steps are not the steady state; profile after warm-up instead of tuning launches.
WARMUP_CALL_STEP_PCT = 20.0

# --- too little data to judge (issue 20): a trace this small says nothing steady -------
# Below this many trace events (every event of the file, as the trace section counts them)
# no card is judged (severity "none", "not judged: too little data ...") and no
# recommendation fires: a 75-event synthetic trace gets no confident advice. (The smallest
# real traces of ../shared/traces hold 220 and 246 events, and are judged.)
MIN_EVENTS_TO_JUDGE = 150
# Below this many GPU kernels the kernel-statistics rules (small_kernels, host_bound,
# tensor_cores_unused, low_mfu, communication) do not fire and their cards (GPU utilization,
# occupancy, short kernels, Tensor Cores, MFU, communication) are not judged: a handful of
# kernels (one 1.8 µs kernel read as "launch-bound") is no evidence. (The smallest real
# GPU traces hold 12 and 14 kernels.)
MIN_KERNELS_TO_JUDGE = 10
# Per-step comparisons (a straggler or load imbalance between ranks, which step is slow)
# need at least this many steps: with one step every rank is "the straggler" of 1 of 1.
MIN_STEPS_TO_COMPARE = 2

# --- torch.compile and CUDA graphs (analysis/compilation.py, METRICS.md §16) -----------------
# The Compilation card. Graph breaks per profiled step at or above this colour it "medium"
# (each break splits the frame: the rest runs as a nested resume frame, with eager code
# between the graphs); 0.5 = a break in at least every other step.
COMPILE_BREAKS_PER_STEP = 0.5
# Steady-state recompiles (a compile id > 0 compiled inside the profiled steps, or first seen
# after the first profiled step) per profiled step at or above this colour it "high" (any
# fewer: "medium"): the cache keeps missing and such steps pay Dynamo + Inductor again
# (toy_graph_break: 1/4, 1/5, 1/6 in 3 steps, 57 % of the step time compiling).
COMPILE_RECOMPILES_PER_STEP = 0.25

# --- §15 FLOPs and MFU (analysis/flops.py; the "mfu" card's own scale) ------------------
# Model FLOPs utilization below this share of the dense peak: "medium" (the GPU does little
# useful arithmetic for its time: GPT-2 small eager on an H100, ~9 %) ...
MFU_LOW_PCT = 10.0
# ... below this: "low" (room left; well-tuned large-model training reaches 35-50 %).
MFU_MODERATE_PCT = 30.0

# --- §19 the step model (analysis/step_model.py) -------------------------------------------
# A GPU activity that starts at most this long after its stream predecessor ended was queued
# behind it (its start is the predecessor's end + this dispatch gap, not its launch).
STEP_MODEL_QUEUED_GAP_US = 3.0
# Launch latency (call start -> kernel start) used for a queued kernel, at most; the trace's
# median latency of kernels that were not queued when smaller.
STEP_MODEL_LAUNCH_LATENCY_US = 10.0
# Host cost of one kernel launch when the trace has none to measure (µs).
STEP_MODEL_LAUNCH_US = 5.0
# One cudaGraphLaunch on the host (µs), and the gap between replayed kernels when the trace
# replays no graph to measure it (µs).
STEP_MODEL_GRAPH_LAUNCH_US = 20.0
STEP_MODEL_REPLAY_GAP_US = 1.5
# Replayed kernels needed to measure the replay gap in the trace itself.
STEP_MODEL_MIN_REPLAYED_KERNELS = 16
# Host time per kernel launch of torch.compile'd code (Inductor's wrapper: Python call of the
# Triton launcher) when the trace has fewer than STEP_MODEL_MIN_COMPILED_LAUNCHES launches in
# compiled regions to measure it (µs).
STEP_MODEL_COMPILED_HOST_US = 33.2
STEP_MODEL_MIN_COMPILED_LAUNCHES = 50
# The model must reproduce the recorded span of its graph within this share (%) for its
# what-ifs to price advice; beyond, the rules' own estimates stay (gain_source "rule").
STEP_MODEL_MAX_ERROR_PCT = 10.0
# Advice whose simulated saving is below this share of the step is information, never
# medium or high (%), and advice an applied fix already took is not repeated below
# GAIN_REPEAT_PCT.
GAIN_INFO_PCT = 1.0
GAIN_REPEAT_PCT = 5.0
# The verdict on top of a report names the first fix only when it is worth this share of the
# step; below, the run reads healthy (issue 35).
VERDICT_MIN_GAIN_PCT = 5.0
# The profiler's own host cost per recorded op (µs), and more per option on (record_shapes,
# profile_memory, with_stack). The demo's launch-bound many_small_kernels step is about half
# profiler (13.9 ms unprofiled, 26.9-30.5 ms profiled on an H200, METRICS §9); on the H100
# trace (17.1 ms profiled, 1,855 ops a step, two options) half is 8.5 ms: 4.6 µs per op. The
# GPU-bound gpt2_bf16_eager gives a lower bound (52.3 ms profiled, 46.9 unprofiled, 3,236 ops,
# three options: >= 1.7 µs per op).
PROFILER_US_PER_OP = 3.5
PROFILER_US_PER_OP_PER_OPTION = 0.5
