"""One device, one name (METRICS.md "Device names", issue 20 item 2).

Every place that names a device (the header, the GPU and memory cards, the memory
section, ``not_available`` labels, recommendations, the CLI text, the rank table) uses
``label`` here, fed by the report's ``device_labels`` (made once per span by
``device_labels(trace)`` in the trace header unit):

- a GPU that ran activity is "GPU <id>", ``<id>`` the trace's own device id (a kernel's
  ``args.device``, else its ``pid``): the same id the ``gpu`` section is keyed by;
- its name is ``deviceProperties[id].name`` on CUDA; on ROCm a kernel's device is an HSA
  agent index (CPU agents first, shared metrics.md "Per device"), never joined to
  ``deviceProperties[].id``: the name is the one every ``deviceProperties`` entry shares
  (one visible GPU, or a node of one model), else unknown. Unknown is written
  ``UNKNOWN_GPU`` ("unknown GPU") everywhere;
- a ``[memory]`` device (``Device Type`` 1 CUDA or 6 HIP, ``Device Id`` = PyTorch's index,
  the report key "cuda:<N>") is the GPU with that id on CUDA. On ROCm PyTorch's index is
  not the kernels' agent index: when the trace has one GPU that ran activity and one GPU
  memory device, they are the same device and named as the activity's ("GPU 2"); otherwise
  "GPU cuda:<N>" (PyTorch's index, said as such);
- ``memory_properties(trace, device_type, device_id)``: the ``deviceProperties`` entry of a
  memory device (its capacity, ``totalGlobalMem``): ``Device Id`` is PyTorch's index, which
  is the HIP/CUDA ordinal ``deviceProperties[].id`` enumerates on both vendors; on ROCm an
  id without an entry falls back to the entry every GPU shares.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from ..trace.model import DEVICE_TYPE_CPU, DEVICE_TYPE_CUDA, DEVICE_TYPE_HIP, TraceData
from .occupancy import device_properties, is_rocm

UNKNOWN_GPU = "unknown GPU"
GPU_MEMORY_TYPES = (DEVICE_TYPE_CUDA, DEVICE_TYPE_HIP)


def _name(props: Optional[dict]) -> str:
    name = props.get("name") if isinstance(props, dict) else None
    return name.strip() if isinstance(name, str) and name.strip() else UNKNOWN_GPU


def _shared_entry(props_by_id: Dict[int, dict], key: str) -> Optional[dict]:
    """The first entry when every entry agrees on ``key`` (one GPU model on the node)."""
    entries = list(props_by_id.values())
    if not entries:
        return None
    values = {repr(p.get(key)) for p in entries}
    return entries[0] if len(values) == 1 and entries[0].get(key) not in (None, "") else None


def gpu_properties(trace: TraceData, dev: int) -> Tuple[Optional[dict], Optional[str]]:
    """The ``deviceProperties`` entry of the GPU the trace calls ``dev`` (a kernel's device)
    and, when there is none, why."""
    props = device_properties(trace)
    if not props:
        return None, "the trace has no deviceProperties"
    if is_rocm(trace):
        shared = _shared_entry(props, "name")
        if shared is not None:
            return shared, None
        return None, ("ROCm kernel devices are HSA agent indices, not deviceProperties ids, and the "
                      "visible GPUs differ")
    if dev in props:
        return props[dev], None
    return None, f"no deviceProperties entry for device {dev}"


def memory_properties(trace: TraceData, device_type: int, device_id: int) -> Tuple[Optional[dict], Optional[str]]:
    """The ``deviceProperties`` entry of a GPU ``[memory]`` device and, when none, why."""
    props = device_properties(trace)
    if device_type not in GPU_MEMORY_TYPES:
        return None, "not a GPU"
    if not props:
        return None, "the trace has no deviceProperties"
    if device_id in props:
        return props[device_id], None
    if is_rocm(trace) or device_type == DEVICE_TYPE_HIP:
        shared = _shared_entry(props, "totalGlobalMem")
        if shared is not None:
            return shared, None
    return None, f"no deviceProperties entry for device {device_id}"


def memory_devices(trace: TraceData) -> set:
    """The distinct (device type, device id) pairs of the trace's ``[memory]`` events
    (vectorised: a trace holds up to millions of them)."""
    mem = trace.memory
    if not len(mem):
        return set()
    types = np.asarray(mem.device_type, dtype=np.int64)
    ids = np.asarray(mem.device_id, dtype=np.int64)
    # events come in runs of one device: only the first row of each run is looked at (no sort)
    starts = np.flatnonzero(np.concatenate([[True], (types[1:] != types[:-1]) | (ids[1:] != ids[:-1])]))
    return set(zip(types[starts].tolist(), ids[starts].tolist()))


def memory_gpu_ids(trace: TraceData) -> Dict[Tuple[int, int], Optional[int]]:
    """Each GPU ``[memory]`` device (type, id) -> the trace's GPU id it is (None: unknown)."""
    mem = trace.memory
    if not len(mem):
        return {}
    pairs = {p for p in memory_devices(trace) if p[0] in GPU_MEMORY_TYPES}
    rocm = is_rocm(trace) or any(t == DEVICE_TYPE_HIP for t, _ in pairs)
    if not rocm:
        return {p: p[1] for p in pairs}
    active = trace.devices
    if len(active) == 1 and len({i for _, i in pairs}) == 1:
        return {p: active[0] for p in pairs}
    return {p: None for p in pairs}


def memory_key(device_type: int, device_id: int) -> str:
    """The memory section's key of a device: "cpu", "cuda:N" (CUDA and HIP), else "type<T>:<N>"."""
    if device_type == DEVICE_TYPE_CPU:
        return "cpu"
    if device_type in GPU_MEMORY_TYPES:
        return f"cuda:{int(device_id)}"
    return f"type{int(device_type)}:{int(device_id)}"


def device_labels(trace: TraceData) -> Dict[str, dict]:
    """{report key: {"label", "name"}} for every GPU id (the ``gpu`` section's keys) and
    every memory device key; ``name`` None for non-GPU devices."""
    out: Dict[str, dict] = {}
    for dev in trace.devices:
        out[str(dev)] = {"label": f"GPU {dev}", "name": _name(gpu_properties(trace, dev)[0])}
    ids = memory_gpu_ids(trace)
    mem = trace.memory
    if len(mem):
        seen = memory_devices(trace)
        for t, i in sorted(seen):
            key = memory_key(t, i)
            if t == DEVICE_TYPE_CPU:
                out[key] = {"label": "CPU", "name": None}
            elif t in GPU_MEMORY_TYPES:
                gid = ids.get((t, i))
                if gid is not None:
                    name = out[str(gid)]["name"] if str(gid) in out else _name(memory_properties(trace, t, i)[0])
                    out[key] = {"label": f"GPU {gid}", "name": name}
                else:
                    out[key] = {"label": f"GPU cuda:{i}", "name": _name(memory_properties(trace, t, i)[0])}
            else:
                out[key] = {"label": f"Device type {t} id {i}", "name": None}
    return out


def _fallback(key: str) -> str:
    """A key without an entry in ``device_labels`` (an older cached report)."""
    if key == "cpu":
        return "CPU"
    kind, _, num = key.partition(":")
    if kind == "cuda" and num:
        return f"GPU {num}"
    if kind.startswith("type") and num:
        return f"Device type {kind[4:]} id {num}"
    return f"GPU {key}" if key.lstrip("-").isdigit() else key


def label(key, report: Optional[dict] = None, named: bool = False) -> str:
    """How the tab, the CLI and the advice name the device with report key ``key`` (a GPU
    id "2" or a memory key "cuda:0"/"cpu"): "GPU 2", with ``named`` "GPU 2: <name>"
    ("GPU 2: unknown GPU" when the trace does not say)."""
    key = str(key)
    entry = ((report or {}).get("device_labels") or {}).get(key)
    if isinstance(entry, dict) and entry.get("label"):
        text, name = str(entry["label"]), entry.get("name")
    else:
        text = _fallback(key)
        names = (report or {}).get("device_names") or {}
        num = key.partition(":")[2] if key.startswith("cuda:") else key
        name = names.get(num) if text.startswith("GPU ") else None
        if name is None and text.startswith("GPU ") and report is not None:
            name = UNKNOWN_GPU
    return f"{text}: {name}" if named and name else text
