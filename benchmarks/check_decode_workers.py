"""Every loaded table, in-process and with decode workers, compared byte for byte (issue 39).

    python benchmarks/check_decode_workers.py [--workers 2] [--chunk-bytes N] [--native] [FILE ...]

Without files: the 292 MB benchmark trace (benchmarks/out/..., built by bench_load.py) and
every trace under ../shared/traces. Each file is loaded twice in fresh child processes, with
TB_BOTTLENECKS_DECODE_PROCESSES=0 and =N (``--chunk-bytes``: both loads' chunks that size, and
workers for files of any size); every column, the string table, the recorded inputs, the
kernel launches and the whole meta are hashed (sha1) and the two digests compared. Prints one
line per file and exits 1 on a difference. Not a test (it takes minutes on the big file).
``--native``: the msgspec way (TB_BOTTLENECKS_NATIVE_DECODE=0) against the native scanner
(trace/native.py), each in-process and with N workers (a load with workers cuts smaller chunks
than one without, and rows are grouped by category within a chunk: each mode against itself);
the line says how many chunks the loading process decoded natively and how many fell back.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BENCH_FILE = REPO / "benchmarks/out/resnet50_num_workers_0_x9/worker0.1623143089861.pt.trace.json.gz"


def digest(trace) -> dict:
    """sha1 of every part of a loaded trace, by part (the same function tests use)."""
    import dataclasses

    out = {"strings": hashlib.sha1("\x00".join(trace.strings).encode("utf-8", "surrogatepass")).hexdigest()}
    for table in ("gpu", "cpu", "runtime", "memory", "gpu_annotations"):
        t = getattr(trace, table)
        for f in dataclasses.fields(t):
            col = getattr(t, f.name)
            out[f"{table}.{f.name}"] = hashlib.sha1(col.dtype.str.encode() + col.tobytes()).hexdigest()
    for part in ("dims", "types", "peers"):
        out[f"op_inputs.{part}"] = hashlib.sha1(repr(sorted(getattr(trace.op_inputs, part).items())).encode()).hexdigest()
    out["kernel_launches"] = hashlib.sha1(repr(sorted(trace.kernel_launches.items())).encode()).hexdigest()
    meta = dataclasses.asdict(trace.meta)
    out["meta"] = hashlib.sha1(repr(sorted(meta.items(), key=lambda kv: kv[0])).encode()).hexdigest()
    return out


def _child(path: str, chunk_bytes: int) -> None:
    from tb_bottleneck_plugin.trace import decode_workers, loader, text

    if chunk_bytes:
        loader.CHUNK_BYTES = loader.PARALLEL_CHUNK_BYTES = chunk_bytes
        text._OUT_BYTES = min(text._OUT_BYTES, chunk_bytes)  # one cut per text block
        decode_workers.PARALLEL_MIN_BYTES = 0
    from tb_bottleneck_plugin.trace import native

    sent = []
    close = decode_workers._ChunkSink.close
    decode_workers._ChunkSink.close = lambda self: (sent.append(self.sent), close(self))[1]
    trace = loader.load_trace(path)
    sys.stdout.write(json.dumps({"digest": digest(trace), "sent": sum(sent), "native": native.stats}))


def load_digest(path: str, workers: int, chunk_bytes: int, native=None) -> dict:
    env = {**os.environ, "TB_BOTTLENECKS_DECODE_PROCESSES": str(workers)}
    if native is not None:
        env["TB_BOTTLENECKS_NATIVE_DECODE"] = "1" if native else "0"
    run = subprocess.run([sys.executable, __file__, "--child", path, "--chunk-bytes", str(chunk_bytes)],
                         cwd=REPO, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    return json.loads(run.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk-bytes", type=int, default=0)
    ap.add_argument("--native", action="store_true",
                    help="msgspec in-process against the native scanner in-process and with --workers")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.chunk_bytes)
        return 0
    if args.native:
        return compare_native(args)
    files = args.files or ([str(BENCH_FILE)] if BENCH_FILE.exists() else []) + sorted(
        str(p) for p in (SHARED / "traces").rglob("*.json*") if p.is_file())
    bad = 0
    for path in files:
        local = load_digest(path, 0, args.chunk_bytes)
        parallel = load_digest(path, args.workers, args.chunk_bytes)
        if "error" in local or "error" in parallel:
            same = local.get("error") == parallel.get("error")
            print(f"{'same' if same else 'DIFFERENT'} (error) {path}: {local.get('error')} | {parallel.get('error')}")
            bad += not same
            continue
        diff = [k for k in local["digest"] if local["digest"][k] != parallel["digest"].get(k)]
        print(f"{'same' if not diff else 'DIFFERENT'} {path} (chunks decoded by workers: {parallel['sent']})"
              + (f": {diff}" if diff else ""))
        bad += bool(diff)
    print(f"{len(files) - bad} of {len(files)} files identical")
    return 1 if bad else 0


def _files(args) -> list:
    return args.files or ([str(BENCH_FILE)] if BENCH_FILE.exists() else []) + sorted(
        str(p) for p in (SHARED / "traces").rglob("*.json*") if p.is_file())


def compare_native(args) -> int:
    """The msgspec way against the native scanner, in-process and with workers."""
    files = _files(args)
    bad = 0
    for path in files:
        parts = []
        same = True
        for workers in (0, args.workers):
            ref = load_digest(path, workers, args.chunk_bytes, native=False)
            got = load_digest(path, workers, args.chunk_bytes, native=True)
            if "error" in ref or "error" in got:
                ok = ref.get("error") == got.get("error")
                parts.append(f"{workers} workers: error {'same' if ok else 'DIFFERENT'} ({got.get('error')})")
            else:
                diff = [k for k in ref["digest"] if ref["digest"][k] != got["digest"].get(k)]
                ok = not diff
                stats = got["native"]  # the loading process's chunks (a worker's are its own)
                parts.append(f"{workers} workers: {'same' if ok else f'DIFFERENT {diff}'} (here native "
                             f"{stats['native']}, fallback {stats['fallback']}; chunks sent {got['sent']})")
            same = same and ok
        print(f"{'same' if same else 'DIFFERENT'} {path}: " + "; ".join(parts))
        bad += not same
    print(f"{len(files) - bad} of {len(files)} files identical (native vs msgspec)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
