"""The CUDA occupancy calculator (metrics.md §6), vectorised over kernels: resident blocks
per SM and the limiting factor from a launch configuration and the device's properties,
and the ``est. achieved occupancy %`` Kineto would write (`kineto_estimate`) or the
calculator's own unrounded estimate (`calculator_estimate`). Pure numpy; used by
analysis/occupancy.py (the kernel table and the unit) and analysis/memory.py (`prop_int`).

- ``occupancy_calculator(props, threads, registers, shared_memory)`` -> dict of arrays
  (``blocks_by_warps``, ``blocks_by_registers``, ``blocks_by_shared_memory``,
  ``blocks_by_sm_limit``, ``active_blocks``, ``limiting_factor``,
  ``theoretical_occupancy_pct``).
- ``kineto_estimate(props, threads, registers, shared_memory, blocks_per_sm)`` -> the
  integer ``est. achieved occupancy %`` Kineto would have written.

Calculator rules (cuda_occupancy.h, as used by Kineto), and the simplifications:
- warps: ``floor((maxThreadsPerMultiprocessor / warpSize) / ceil(threads / warpSize))``;
- registers: a warp gets ``roundup(regs * warpSize, 256)`` registers; the register file
  is split into 4 sub-partitions (2 on sm60) of ``regsPerMultiprocessor / 4``; warps per
  sub-partition = floor(sub-partition registers / registers per warp); blocks =
  floor(warps per SM / warps per block). 0 registers (some library kernels) = no limit.
  A block needing more than ``regsPerBlock`` (checked with warps rounded up to the
  sub-partition count) or more than 255 registers per thread cannot launch (0 blocks);
- shared memory: per block = ``roundup(shared memory + reserved, 128)`` (256 before
  sm70) with 1 KB reserved per block on sm80+; blocks = floor(sharedMemPerMultiprocessor
  / that). Simplification: the default carve-out is assumed to give the kernel the whole
  ``sharedMemPerMultiprocessor`` (the calculator's default preference); a kernel's own
  carve-out attribute is not in the trace. More than ``sharedMemPerBlockOptin`` = 0;
- max resident blocks per SM by compute capability (``MAX_BLOCKS_PER_SM``);
- active blocks = min of the four; the limiting factor is the argmin (ties joined with
  "+", in the order warps, registers, shared_memory, blocks). The nested 2026
  ``occupancy.limitingFactors`` of a kernel is preferred when present.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

# Max resident blocks per SM (cuda_occupancy.h __occMaxBlocksPerMultiprocessor / the CUDA
# programming guide's table), by (major, minor); a major alone applies to every minor.
MAX_BLOCKS_PER_SM = {
    (3, None): 16, (5, None): 32, (6, None): 32,
    (7, 0): 32, (7, 2): 32, (7, 5): 16,
    (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24,
    (9, None): 32, (10, None): 32, (11, None): 32, (12, None): 32,
}
REG_ALLOCATION_UNIT = 256  # registers, per warp, every architecture since sm30
MAX_REGS_PER_THREAD = 255
_AMPERE_MAJOR = 8  # compute capability from which each block has 1 KB of shared memory reserved
FACTORS = ("warps", "registers", "shared_memory", "blocks")

_BIG = np.int64(1 << 30)


def max_blocks_per_sm(major: int, minor: int) -> int:
    return MAX_BLOCKS_PER_SM.get((major, minor), MAX_BLOCKS_PER_SM.get((major, None), 32))


def _ceil_div(a, b):
    return -(-a // b)


# Plausible ranges of the deviceProperties the calculator reads: a value outside its
# range, not an integer, or a bool is unknown (a hostile or broken trace must give n/a
# with a reason, never an exception or an overflow in int64 arithmetic).
_PROP_RANGES = {
    "computeMajor": (1, 100), "computeMinor": (0, 100), "warpSize": (1, 1024),
    "maxThreadsPerMultiprocessor": (1, 1 << 16), "regsPerMultiprocessor": (1, 1 << 24),
    "regsPerBlock": (1, 1 << 24), "sharedMemPerMultiprocessor": (1, 1 << 30),
    "maxSharedMemoryPerMultiProcessor": (1, 1 << 30), "sharedMemPerBlock": (1, 1 << 30),
    "sharedMemPerBlockOptin": (1, 1 << 30), "numSms": (1, 1 << 20), "totalGlobalMem": (1, 1 << 50),
}
_REQUIRED_PROPS = ("computeMajor", "warpSize", "maxThreadsPerMultiprocessor", "regsPerMultiprocessor")


def prop_int(props, key: str) -> Optional[int]:
    """``props[key]`` as an int when it is an integral number inside its plausible range
    (``_PROP_RANGES``), else None (missing, "-", 1e30, 0, negative, NaN, bool)."""
    v = props.get(key) if isinstance(props, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    if isinstance(v, (float, np.floating)) and (not np.isfinite(v) or v != int(v)):
        return None
    v = int(v)
    lo, hi = _PROP_RANGES.get(key, (0, 1 << 62))
    return v if lo <= v <= hi else None


def calculator_properties(props) -> Tuple[Optional[dict], Optional[str]]:
    """The deviceProperties the calculator needs, validated: ``(values, None)`` or
    ``(None, reason)`` naming the unknown properties. Optional ones fall back: a missing
    ``computeMinor`` is 0, ``regsPerBlock`` the SM's register file, ``sharedMemPerBlock``
    the SM's shared memory, ``sharedMemPerBlockOptin`` ``sharedMemPerBlock``."""
    if not isinstance(props, dict):
        return None, "no deviceProperties entry for this device"
    vals = {k: prop_int(props, k) for k in _PROP_RANGES}
    smem_sm = vals["sharedMemPerMultiprocessor"] or vals["maxSharedMemoryPerMultiProcessor"]
    missing = [k for k in _REQUIRED_PROPS if vals[k] is None] + ([] if smem_sm else ["sharedMemPerMultiprocessor"])
    if missing:
        return None, ("deviceProperties lack a valid " + ", ".join(f"'{k}'" for k in missing)
                      + ": the occupancy calculator cannot run")
    if vals["warpSize"] > vals["maxThreadsPerMultiprocessor"]:
        return None, "deviceProperties 'warpSize' exceeds 'maxThreadsPerMultiprocessor': the occupancy calculator cannot run"
    regs_sm = vals["regsPerMultiprocessor"]
    smem_default = vals["sharedMemPerBlock"] or smem_sm
    return {"major": vals["computeMajor"], "minor": vals["computeMinor"] or 0, "warp": vals["warpSize"],
            "max_threads_sm": vals["maxThreadsPerMultiprocessor"], "regs_sm": regs_sm,
            "regs_block": vals["regsPerBlock"] or regs_sm, "smem_sm": smem_sm, "smem_default": smem_default,
            "smem_optin": vals["sharedMemPerBlockOptin"] or smem_default, "num_sms": vals["numSms"]}, None


def occupancy_calculator(props: dict, threads, registers, shared_memory,
                         per_block_limit: str = "optin") -> Dict[str, np.ndarray]:
    """Theoretical resident blocks per SM for launches on one device (arrays in, arrays
    out). ``props`` is one ``deviceProperties`` entry of the trace; ValueError when its
    properties are unusable (see ``calculator_properties``).

    ``per_block_limit``: the most shared memory one block may use. "optin" (default):
    ``sharedMemPerBlockOptin`` -- the kernel did launch, so a block above 48 KB had
    opted in. "default": ``sharedMemPerBlock`` (48 KB), which is what Kineto passes to
    the calculator (``FUNC_SHMEM_LIMIT_DEFAULT``), so such kernels get 0 blocks there."""
    p, reason = calculator_properties(props)
    if p is None:
        raise ValueError(reason)
    # Clip the per-kernel inputs to sane ranges so int64 arithmetic cannot overflow.
    threads = np.clip(np.asarray(threads, dtype=np.int64), 0, 1 << 20)
    regs = np.clip(np.asarray(registers, dtype=np.int64), 0, 1 << 20)
    smem = np.clip(np.asarray(shared_memory, dtype=np.int64), 0, 1 << 40)
    major, minor, warp = p["major"], p["minor"], p["warp"]
    max_threads_sm, regs_sm, regs_block, smem_sm = p["max_threads_sm"], p["regs_sm"], p["regs_block"], p["smem_sm"]
    smem_limit = p["smem_default"] if per_block_limit == "default" else max(p["smem_optin"], p["smem_default"])

    warps_block = np.maximum(_ceil_div(threads, warp), 1)
    by_warps = (max_threads_sm // warp) // warps_block

    sub_parts = 2 if (major, minor) == (6, 0) else 4
    regs_warp = _ceil_div(regs * warp, REG_ALLOCATION_UNIT) * REG_ALLOCATION_UNIT
    assumed_block = regs_warp * (_ceil_div(warps_block, sub_parts) * sub_parts)
    warps_per_sub = (regs_sm // sub_parts) // np.maximum(regs_warp, 1)
    by_regs = np.where(regs == 0, _BIG, (warps_per_sub * sub_parts) // warps_block)
    by_regs = np.where((assumed_block > regs_block) | (regs > MAX_REGS_PER_THREAD), 0, by_regs)

    granularity = 128 if major >= 7 else 256
    reserved = 1024 if major >= _AMPERE_MAJOR else 0  # 1 KB per block reserved by the system from sm_80
    smem_block = _ceil_div(smem + reserved, granularity) * granularity
    by_smem = np.where(smem_block > 0, smem_sm // np.maximum(smem_block, 1), _BIG)
    by_smem = np.where(smem > smem_limit, 0, by_smem)

    by_blocks = np.full(len(threads), max_blocks_per_sm(major, minor), dtype=np.int64)
    stack = np.stack([by_warps, by_regs, by_smem, by_blocks]).astype(np.int64)
    active = stack.min(axis=0)
    is_min = stack == active
    # the "+"-joined names of the limiting factors, one text per combination of them
    combo = (is_min * (1 << np.arange(len(FACTORS)))[:, None]).sum(axis=0)
    texts = np.array(["+".join(f for i, f in enumerate(FACTORS) if c >> i & 1) for c in range(1 << len(FACTORS))],
                     dtype=object)
    limiting = texts[combo] if len(threads) else np.zeros(0, dtype=object)
    theo = 100.0 * active * warps_block / (max_threads_sm // warp)
    return {"blocks_by_warps": by_warps, "blocks_by_registers": by_regs, "blocks_by_shared_memory": by_smem,
            "blocks_by_sm_limit": by_blocks, "active_blocks": active, "limiting_factor": limiting,
            "theoretical_occupancy_pct": theo}


def kineto_estimate(props: dict, threads, registers, shared_memory, blocks_per_sm) -> np.ndarray:
    """The ``est. achieved occupancy %`` Kineto computes (CudaDeviceProperties.cpp):
    min(active blocks, blocks per SM) * threads / maxThreadsPerMultiprocessor in float32
    (``blocks per SM`` is a C++ float), times 100 in double, rounded half up; the calculator run with
    the default 48 KB per-block shared-memory limit, as Kineto calls it."""
    calc = occupancy_calculator(props, threads, registers, shared_memory, per_block_limit="default")
    f32 = np.float32
    b = np.minimum(calc["active_blocks"].astype(f32), np.asarray(blocks_per_sm, dtype=f32))
    max_threads_sm = calculator_properties(props)[0]["max_threads_sm"]
    occ = b * np.asarray(threads, f32) / f32(max_threads_sm)
    return np.floor(occ.astype(np.float64) * 100.0 + 0.5)


def calculator_estimate(props: dict, threads, registers, shared_memory, blocks_per_sm, grid_blocks
                        ) -> np.ndarray:
    """Kineto's formula with the calculator run as the kernel launched (opt-in shared
    memory): ``100 * min(resident blocks per SM, blocks per SM) * threads / max threads
    per SM``, unrounded. ``blocks per SM`` is the trace's where it is a positive number,
    else grid blocks / numSms. NaN where it cannot be computed (no block size, no blocks
    per SM, or the calculator says the kernel could not launch). ValueError for unusable
    ``props``."""
    p, reason = calculator_properties(props)
    if p is None:
        raise ValueError(reason)
    threads = np.asarray(threads, dtype=np.int64)
    regs = np.asarray(registers, dtype=np.int64)
    smem = np.asarray(shared_memory, dtype=np.int64)
    bps = np.asarray(blocks_per_sm, dtype=np.float64)
    grid_blocks = np.asarray(grid_blocks, dtype=np.float64)
    if p["num_sms"]:
        bps = np.where(np.isfinite(bps) & (bps > 0), bps,
                       np.where(grid_blocks > 0, grid_blocks / p["num_sms"], np.nan))
    else:
        bps = np.where(np.isfinite(bps) & (bps > 0), bps, np.nan)
    ok = (threads > 0) & (regs >= 0) & (smem >= 0) & np.isfinite(bps)
    out = np.full(len(threads), np.nan)
    if ok.any():
        calc = occupancy_calculator(props, threads[ok], regs[ok], smem[ok])
        active = calc["active_blocks"].astype(np.float64)
        est = 100.0 * np.minimum(active, bps[ok]) * threads[ok] / p["max_threads_sm"]
        out[ok] = np.where(active > 0, est, np.nan)
    return out
