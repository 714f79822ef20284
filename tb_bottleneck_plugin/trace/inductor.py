"""What Inductor's generated code says its kernels fused, read from the local disk.

An Inductor (Triton) launch in a trace (cpu_op named after the kernel, torch >= 2.5)
carries ``kernel_file`` (the generated kernel's path on the machine that recorded it,
``<cache>/<2 chars>/<hash>.py``), ``kernel_hash`` (that file's stem) and ``kernel_backend``.
The kernel file holds only the Triton source. The fused ATen ops are written by Inductor in
the graph's *wrapper* (output code, a sibling file of the same cache), above each kernel's
definition (torch/_inductor/codegen/triton.py ``_emit_kernel_to_wrapper``, utils.py
``get_kernel_metadata``)::

    # kernel path: /tmp/torchinductor_root/7f/c7f5....py
    # Topologically Sorted Source Nodes: [y, add], Original ATen: [aten.add, aten.mul]

The kernel's name holds the same ops only up to ``kernel_name_max_ops`` (10), and not at all
with descriptive names off; these lines hold all. They are read only when the kernel file
itself is on this machine (the same host recorded the run), with bounded reads; nothing else
of the files is kept, and never their paths (only basenames leave the loader's data).
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterable, Tuple

from . import model, storage

MAX_KERNEL_FILE_BYTES = 4 << 20  # a generated Triton kernel is a few KB
MAX_WRAPPER_BYTES = 16 << 20  # one graph's output code
MAX_CACHE_FILES = 20000  # files of the cache looked at for wrappers
MAX_READ_BYTES = 512 << 20  # all wrapper text read for one trace

# Inductor names every generated file by a content hash ("c" + 51 base32 characters).
_HASHED_NAME = re.compile(r"^[a-z0-9]{20,80}\.py$")
# utils.get_kernel_metadata's first line (the same above extern kernels, cpp and Triton ones)
ORIGIN_LINE = re.compile(r"^\s*# (?:Topologically Sorted|Unsorted) Source Nodes: \[(?P<nodes>[^\n]*)\], "
                         r"Original ATen: \[(?P<aten>[^\n]*)\]\s*$")
_KERNEL_PATH = re.compile(r"^# kernel path: (?P<path>[^\n]+)$", re.M)


def _split(text: str) -> Tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def parse_origin_line(line: str):
    """KernelOrigin of one ``# ... Source Nodes: [...], Original ATen: [...]`` line, else None."""
    m = ORIGIN_LINE.match(line)
    return model.KernelOrigin(_split(m.group("aten")), _split(m.group("nodes"))) if m else None


def parse_wrapper(text: str) -> Dict[str, model.KernelOrigin]:
    """Kernel file basename -> KernelOrigin for every ``# kernel path:`` line of a wrapper
    (output code) text followed by the origin line; the first of a basename wins."""
    out: Dict[str, model.KernelOrigin] = {}
    for m in _KERNEL_PATH.finditer(text):
        base = m.group("path").strip().replace("\\", "/").rsplit("/", 1)[-1]
        end = text.find("\n", m.end() + 1)
        origin = parse_origin_line(text[m.end() + 1:end if end >= 0 else len(text)])
        if base and origin is not None and base not in out:
            out[base] = origin
    return out


def _local_kernel_files(launches: Iterable[Tuple[model.KernelLaunch, str]]) -> Dict[str, str]:
    """basename -> local path of the kernel files that are on this disk: a hash-named file
    (its stem the launch's kernel_hash when there is one) that defines the kernel."""
    found: Dict[str, str] = {}
    for launch, kernel_name in launches:
        path = launch.file
        base = os.path.basename(path)
        if base in found or not os.path.isabs(path) or not _HASHED_NAME.match(base):
            continue
        if launch.hash and base[:-3] != launch.hash:
            continue
        text = storage.local_text(path, MAX_KERNEL_FILE_BYTES)
        if text is not None and (not kernel_name or kernel_name in text):
            found[base] = path
    return found


def kernel_origins(trace: model.TraceData) -> Dict[str, model.KernelOrigin]:
    """Kernel file basename -> KernelOrigin for the trace's Inductor launches whose kernel
    file is on this machine, from the wrappers of the same cache; {} when none is."""
    if not trace.kernel_launches:
        return {}
    names = trace.cpu.name
    pairs = {}
    for row, launch in trace.kernel_launches.items():
        if launch not in pairs and launch.backend in ("", "triton") and launch.file:
            pairs[launch] = trace.strings[int(names[row])] if row < len(names) else ""
    local = _local_kernel_files(pairs.items())
    if not local:
        return {}
    wanted = set(local)
    out: Dict[str, model.KernelOrigin] = {}
    budget = MAX_READ_BYTES
    for root in sorted({os.path.dirname(os.path.dirname(p)) for p in local.values()}):
        for path in storage.local_subfolder_files(root, MAX_CACHE_FILES):
            base = os.path.basename(path)
            if not _HASHED_NAME.match(base) or base in local or budget <= 0:
                continue
            text = storage.local_text(path, MAX_WRAPPER_BYTES)
            if text is None:
                continue
            budget -= len(text)
            if "# kernel path: " not in text:
                continue
            for k, origin in parse_wrapper(text).items():
                if k in wanted and k not in out:
                    out[k] = origin
            if len(out) == len(wanted):
                return out
    return out
