// Definitions shown on hover (from ../shared/docs/metrics.md and METRICS.md) and the
// step-time categories. Words only: no thresholds (verdicts come from the report).

export const CATEGORIES = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"];

export const CAT_NAMES = {
  kernel: "Kernel", memcpy: "Memcpy", memset: "Memset", communication: "Communication",
  runtime: "Runtime", dataloader: "DataLoader", cpu_exec: "CPU Exec", other: "Other (idle)",
};

export const CAT_COLORS = Object.fromEntries(CATEGORIES.map((k) => [k, `var(--c-${k.replace("_", "-")})`]));

export const CAT_DEFS = {
  kernel: "GPU kernels on any device, except communication kernels.",
  memcpy: "GPU memory copies (gpu_memcpy) on any device, not already covered by a kernel.",
  memset: "GPU memsets on any device, not already covered by a kernel or memcpy.",
  communication: "Collective kernels (nccl/rccl and known custom all-reduce kernels) and CPU spans named nccl:*, gloo:*, rccl:*.",
  runtime: "CUDA/HIP runtime and driver calls (cudaLaunchKernel, cuLaunchKernel, ...) not covered by GPU work.",
  dataloader: "CPU spans enumerate(DataLoader)#...__next__ / enumerate(DataPipe)#...: the host waits for the next batch while nothing else runs.",
  cpu_exec: "Other CPU operator spans (cpu_op, user_annotation), not python_function frames.",
  other: "Time in the step covered by none of the categories above (idle).",
};

export const BREAKDOWN_DEF = "Each instant of a step goes to exactly one category, the first that covers it in the order "
  + "Kernel > Memcpy > Memset > Communication > Runtime > DataLoader > CPU Exec > Other, so the categories add up to the "
  + "step time (torch-tb-profiler's definition). Steps are stretched to cover the GPU work they launched.";

export const DEFS = {
  input: "Input-bound % = 100 × Σ DataLoader-category time / Σ step time over the included steps (ratio of sums): "
    + "the share of step time in which the host waited for the next batch while neither the GPU nor the CUDA runtime did "
    + "anything else. The verdict uses XProf's two thresholds (highly / moderately input-bound; values below). "
    + "Input transfer (H2D copies not overlapped by kernels) is reported beside it; XProf-compatible input % = input-bound % + input transfer %.",
  transfer: "Input transfer % = Union(memcpy HtoD) minus Union(all kernels), inside each step, as a ratio of sums. Not part of input-bound %.",
  gpu: "GPU utilization per device = 100 × Union(kernels on that device, clipped to the steps window) / steps window. "
    + "Kernels only, as torch-tb-profiler; the window runs from the first included step's start to the last one's end, gaps included.",
  sm: "Est. SM efficiency = 100 × ∫ min(1, Σ blocks-per-SM of the kernels running at time t) dt / steps window.",
  tc: "Tensor Core % = 100 × time of Tensor Core kernels / time of all kernels (all kernel time in the trace). "
    + "A kernel is a Tensor Core kernel if its name matches the maintained pattern list (hmma, xmma, s1688, wgmma, nvjet, MFMA, ...).",
  eligible: "Eligible but not using = time of non-Tensor-Core kernels launched by ops that could run on Tensor Cores "
    + "(mm, addmm, bmm, matmul, linear, conv*, convolution_backward, einsum, scaled_dot_product_attention, RNNs) / all kernel time.",
  occupancy: "Est. achieved occupancy = mean of the kernels' 'est. achieved occupancy %' weighted by each kernel's duration clipped "
    + "to the steps window. Kineto computes that field with the CUDA occupancy calculator: a theoretical figure for the launch "
    + "configuration, not a hardware measurement.",
  gridSmall: "Grid too small = weighted time of kernels with blocks per SM < 1 / weighted time of kernels with a numeric blocks per SM "
    + "(fewer blocks than SMs: part of the GPU idles during the kernel).",
  memory: "Peak of Total Allocated from the trace's [memory] events for this device (each event's total holds until the next one). "
    + "Reserved is Total Reserved (the caching allocator's segments); capacity is deviceProperties.totalGlobalMem.",
  slack: "Allocator slack = 100 × (peak reserved − peak allocated) / peak reserved: the share of what PyTorch's caching allocator "
    + "reserved that no tensor used even at the peak. This is NOT XProf's fragmentation (free-block: 1 − largest free block / total free), "
    + "which needs a CUDA memory snapshot. Time-weighted slack = ∫(reserved − allocated) dt / ∫ reserved dt.",
  histogram: "Share of kernel time (weighted by duration clipped to the steps window) per bucket of Kineto's estimated achieved occupancy.",
  sync: "Host time in cudaDeviceSynchronize / cudaStreamSynchronize / cudaEventSynchronize (and hip twins) and synchronous DtoH copies, "
    + "clipped to the host spans of the included steps, with the CPU ops that caused them. The card's value is the GPU idle they cause: "
    + "during the waits, and after each until the host launches again (no longer than the wait).",
  launch: "CPU time in cudaLaunchKernel / cuLaunchKernel / hipLaunchKernel, and the number of kernels per step.",
  comm: "Communication kernel time and the share of it overlapped by compute kernels (HTA's comm/comp overlap).",
  idle: "HTA's idle breakdown over the span from the first to the last GPU activity on the device: host wait (the next kernel's launch "
    + "started after the previous kernel ended), kernel wait (a short gap between kernels, HTA's consecutive_kernel_delay), other.",
  shortKernels: "Short kernels: kernels shorter than the threshold the report names (thresholds.py SHORT_KERNEL_US), their count and their share "
    + "of kernel time. Many short kernels with small launch gaps point at launch overhead: torch.compile or CUDA graphs help.",
};

export const KERNEL_COL_DEFS = {
  name: "Kernel name (hover for the full C++ name). Rows are grouped by name, grid, block, registers and shared memory.",
  device: "GPU device id.",
  calls: "Number of launches.",
  total_us: "Total duration of all launches.",
  mean_us: "Mean duration per launch.",
  time_pct: "Share of all kernel time.",
  est_achieved_occupancy_pct: "Estimated achieved occupancy: Kineto's value (CUDA occupancy calculator: theoretical, not measured); "
    + "rows marked \"calc\" show our own occupancy-calculator value where Kineto's is missing or 0.",
  blocks_per_sm: "Blocks per SM of the launch; below 1 the grid is too small to fill the GPU.",
  registers_per_thread: "Registers per thread.",
  shared_memory_bytes: "Shared memory per block.",
  launch: "Grid and block dimensions.",
  tensor_core: "Whether the kernel name matches the Tensor Core pattern list.",
  limiting_factor: "What caps the resident blocks per SM, computed like the CUDA occupancy calculator (warps, registers, shared memory, blocks per SM).",
  achieved_tflops: "Achieved TFLOP/s of this kernel name: the FLOPs of the ops that launched it over its kernel time (report's top kernels only; METRICS.md §15).",
  pct_of_peak: "Achieved TFLOP/s as % of the GPU's dense peak for the kernel's precision.",
  bound: "Where the kernel sits on the roofline: compute-bound (arithmetic intensity at or above the ridge) or memory-bound.",
};

