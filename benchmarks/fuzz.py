#!/usr/bin/env python3
"""Structure-aware fuzzing of the whole pipeline on mutated real traces.

    python benchmarks/fuzz.py [--inputs 10000] [--seed 1] [--traces DIR] [--json OUT]

Seed corpus: every trace in ../shared/traces, cut down to a few hundred events each
(a time window of consecutive events, the ProfilerStep spans around it, some
[memory] events and the top-level keys), so one input takes milliseconds.

Each input is one seed trace with 1-3 mutations (see MUTATORS): events dropped or
duplicated, a field given a value of the wrong type, extreme numbers (1e400, -1,
2**70, "NaN", bare NaN/Infinity), a list as `cat`, `args` as a string, deep nesting,
wrong top-level keys, odd deviceProperties, all durations 0, then byte-level: a BOM,
UTF-16, truncation (plain or inside the gzip stream), trailing bytes after the gzip
member, byte flips. The pipeline under test is what the tab and the CLI run:

    loader.load_trace(file) -> report.analyze_trace(trace)
    -> report.combine_results([that result, the clean seed's result])
    -> json.dumps(..., allow_nan=False) of both

Outcome per input: "report" (no section error), "section error" (a report whose
`errors` list is not empty: an analysis raised and was isolated), a typed error
(a BottleneckError subclass, counted by class), or "crash" (any other exception:
a failure, printed with its seed and traceback). Inputs are deterministic: input i
uses random.Random(seed * 1_000_003 + i), so a crash is reproduced with
``--only I``. tests/trace/test_fuzz.py runs a seeded slice of this in CI.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import logging
import os
import random
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import msgspec

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
sys.path.insert(0, str(REPO))

from tb_bottleneck_plugin.trace import loader  # noqa: E402
from tb_bottleneck_plugin import report
from tb_bottleneck_plugin.errors import BottleneckError  # noqa: E402

SEED_EVENTS = 300  # events per seed trace (plus steps and memory events)


# --------------------------------------------------------------------------- seed corpus


class Seed:
    """A small real trace: its object, its clean text and its clean report result."""

    def __init__(self, name: str, obj, container: str):
        self.name = name
        self.obj = obj
        self.text = msgspec.json.encode(obj)  # decoded again for a fast deep copy per input
        self.container = container
        self.clean_result: Optional[dict] = None


def trace_files(root: Path = SHARED_TRACES) -> List[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith((".json", ".json.gz")))


def cut_down(path: Path, n_events: int = SEED_EVENTS, rng: Optional[random.Random] = None) -> Seed:
    """A few hundred consecutive events (by ts) of a real trace, the ProfilerStep spans
    and `Trace` span that overlap them, up to 40 [memory] events in that window, the
    metadata ('M') events and the top-level keys."""
    rng = rng or random.Random(0)
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    data = msgspec.json.decode(raw)
    container = "array" if isinstance(data, list) else "object"
    events = data if container == "array" else data.get("traceEvents", [])
    timed = sorted((e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X"),
                   key=lambda e: e["ts"])
    steps = [e for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")]
    start = 0
    if steps:  # start at a step so that the window holds step, launches and kernels
        first = steps[len(steps) // 2] if len(steps) > 2 else steps[0]
        start = next(i for i, e in enumerate(timed) if e is first)
    window = timed[start:start + n_events]
    lo = window[0]["ts"] if window else 0
    hi = max((e["ts"] + (e.get("dur") or 0) for e in window), default=0)
    chosen = {id(e) for e in window}
    keep = [e for e in events if id(e) in chosen
            or (e.get("ph") == "M")
            or (str(e.get("name", "")).startswith("ProfilerStep#") and isinstance(e.get("ts"), (int, float))
                and e["ts"] < hi and e["ts"] + (e.get("dur") or 0) > lo)]
    memory = [e for e in events if e.get("name") == "[memory]" and isinstance(e.get("ts"), (int, float))
              and lo <= e["ts"] <= hi][:40]
    keep += memory
    if container == "array":
        return Seed(path.name, keep, container)
    top = {k: v for k, v in data.items() if k != "traceEvents"}
    top["traceEvents"] = keep
    return Seed(path.name, top, container)


def events_of(obj) -> list:
    if isinstance(obj, list):
        return obj
    ev = obj.get("traceEvents")
    return ev if isinstance(ev, list) else []


# --------------------------------------------------------------------------- mutators
# Object-level mutators change the decoded trace (a deep copy); byte-level ones the
# serialised text. Each returns a short label for the log.

HOSTILE_VALUES = ["x", "", "-", "N/A", [], [1, 2], [1, 2, 3, 4], {}, {"a": 1}, None, True, False, -1, 0,
                  2 ** 63, 2 ** 70, -2 ** 70, 1e308, -1e308, 1e-300, 1.5, "NaN", "inf", "-Infinity", "1e400",
                  "0x7fffffffffffffffff", "x" * 300, [[[]]], ["kernel"]]
EXTREME_NUMBERS = [-1, 0, 2 ** 63, 2 ** 63 - 1, 2 ** 64, 2 ** 70, -2 ** 63 - 1, 1e308, -1e308, 1e300, 1e-300,
                   "NaN", "1e400", -0.0, 0.5]
EVENT_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARG_FIELDS = ["device", "stream", "correlation", "External id", "external id", "registers per thread",
              "shared memory", "grid", "block", "blocks per SM", "warps per SM", "est. achieved occupancy %",
              "occupancy", "bytes", "size", "Device Type", "Device Id", "Bytes", "Total Allocated",
              "Total Reserved", "Addr", "Input Dims", "Input type"]
DEVICE_PROPS = ["id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "maxThreadsPerBlock",
                "maxThreadsPerMultiprocessor", "regsPerBlock", "regsPerMultiprocessor", "warpSize",
                "sharedMemPerBlock", "sharedMemPerMultiprocessor", "numSms", "sharedMemPerBlockOptin"]


def _pick_event(obj, rng):
    evs = events_of(obj)
    return (rng.randrange(len(evs)), evs) if evs else (None, evs)


def m_drop_events(obj, rng):
    evs = events_of(obj)
    k = rng.randint(1, max(1, len(evs) // 3))
    for _ in range(min(k, len(evs))):
        evs.pop(rng.randrange(len(evs)))
    return f"drop {k}"


def m_duplicate_events(obj, rng):
    evs = events_of(obj)
    if not evs:
        return "duplicate none"
    k = rng.randint(1, 20)
    for _ in range(k):
        evs.insert(rng.randrange(len(evs) + 1), msgspec.json.decode(msgspec.json.encode(evs[rng.randrange(len(evs))])))
    return f"duplicate {k}"


def m_wrong_type(obj, rng):
    i, evs = _pick_event(obj, rng)
    if i is None or not isinstance(evs[i], dict):
        return "wrong type: none"
    field = rng.choice(EVENT_FIELDS)
    evs[i][field] = rng.choice(HOSTILE_VALUES)
    return f"wrong type {field}"


def m_wrong_arg(obj, rng):
    i, evs = _pick_event(obj, rng)
    if i is None or not isinstance(evs[i], dict):
        return "wrong arg: none"
    args = evs[i].get("args")
    if not isinstance(args, dict):
        args = evs[i]["args"] = {}
    field = rng.choice(ARG_FIELDS + list(args))
    args[field] = rng.choice(HOSTILE_VALUES + EXTREME_NUMBERS)
    return f"wrong arg {field}"


def m_same_field_everywhere(obj, rng):
    """One field wrong in many events (one kind of tool writes it for every event)."""
    field = rng.choice(["grid", "block", "dur", "ts", "correlation", "device", "stream", "Bytes", "Total Allocated"])
    value = rng.choice(HOSTILE_VALUES + EXTREME_NUMBERS)
    n = 0
    for e in events_of(obj):
        if not isinstance(e, dict) or rng.random() < 0.5:
            continue
        if field in ("dur", "ts"):
            e[field] = value
        elif isinstance(e.get("args"), dict):
            e["args"][field] = value
        n += 1
    return f"{field}={value!r:.20} x{n}"


def m_extreme_numbers(obj, rng):
    n = rng.randint(1, 10)
    for _ in range(n):
        i, evs = _pick_event(obj, rng)
        if i is None or not isinstance(evs[i], dict):
            break
        e = evs[i]
        keys = [k for k in ("ts", "dur", "pid", "tid") if k in e] + \
               [("args", k) for k, v in (e.get("args") or {}).items() if isinstance(v, (int, float))] \
            if isinstance(e.get("args"), dict) else [k for k in ("ts", "dur", "pid", "tid") if k in e]
        if not keys:
            continue
        key = rng.choice(keys)
        value = rng.choice(EXTREME_NUMBERS)
        if isinstance(key, tuple):
            e["args"][key[1]] = value
        else:
            e[key] = value
    return f"extreme x{n}"


def m_list_as_cat(obj, rng):
    i, evs = _pick_event(obj, rng)
    if i is not None and isinstance(evs[i], dict):
        evs[i]["cat"] = [evs[i].get("cat", "kernel")]
    return "list as cat"


def m_args_as_string(obj, rng):
    i, evs = _pick_event(obj, rng)
    if i is not None and isinstance(evs[i], dict):
        evs[i]["args"] = rng.choice(["x", "", 5, [1, 2], None])
    return "args as string"


def m_all_dur_zero(obj, rng):
    cat = rng.choice(["kernel", None])
    for e in events_of(obj):
        if isinstance(e, dict) and (cat is None or str(e.get("cat", "")).lower() == cat) and "dur" in e:
            e["dur"] = 0
    return f"dur 0 ({cat or 'all'})"


def m_non_object_entries(obj, rng):
    evs = events_of(obj)
    for _ in range(rng.randint(1, 5)):
        evs.insert(rng.randrange(len(evs) + 1), rng.choice([5, "x", None, [1, 2], True, 1e308]))
    return "non-object entries"


def m_step_names(obj, rng):
    steps = [e for e in events_of(obj) if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        return "steps: none"
    e = rng.choice(steps)
    e["name"] = rng.choice(["ProfilerStep#" + "9" * 25, "ProfilerStep#-1", "ProfilerStep#", "ProfilerStep#1.5",
                            "ProfilerStep#9223372036854775808", "ProfilerStep#0" * 3, steps[0]["name"]])
    return f"step name {e['name']:.30}"


def m_top_level(obj, rng):
    if not isinstance(obj, dict):
        return "top: array"
    key = rng.choice(["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion",
                      "displayTimeUnit", "traceName", "traceEvents"])
    if key == "traceEvents" and rng.random() < 0.7:
        return "top: keep events"
    obj[key] = rng.choice(HOSTILE_VALUES + [[{"id": 0, "name": 5}], [None, 1]])
    return f"top {key}"


def m_device_properties(obj, rng):
    if not isinstance(obj, dict):
        return "props: array"
    props = obj.get("deviceProperties")
    if not isinstance(props, list) or not props:
        props = obj["deviceProperties"] = [{"id": 0, "name": "GPU", "computeMajor": 8, "computeMinor": 0,
                                            "warpSize": 32, "numSms": 108, "regsPerBlock": 65536}]
    p = rng.choice(props)
    if isinstance(p, dict):
        for _ in range(rng.randint(1, 4)):
            p[rng.choice(DEVICE_PROPS + list(p))] = rng.choice(HOSTILE_VALUES + EXTREME_NUMBERS + [0, 1e30])
    return "device properties"


def m_memory_events(obj, rng):
    mem = [e for e in events_of(obj) if isinstance(e, dict) and e.get("name") == "[memory]"]
    if not mem:
        return "memory: none"
    if rng.random() < 0.3:  # the whole span in the 2021 format: Bytes only, no totals
        for e in mem:
            if isinstance(e.get("args"), dict):
                e["args"].pop("Total Allocated", None)
                e["args"].pop("Total Reserved", None)
        return "memory: Bytes only"
    for e in rng.sample(mem, min(len(mem), rng.randint(1, 5))):
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        choice = rng.random()
        if choice < 0.3:  # Bytes only, as in 2021
            for k in ("Total Allocated", "Total Reserved"):
                args.pop(k, None)
        else:
            args[rng.choice(["Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id", "Addr"])] = \
                rng.choice(EXTREME_NUMBERS + HOSTILE_VALUES)
        e["args"] = args
    return "memory events"


def m_to_array(obj, rng):
    return "to array"  # handled in mutate(): the object becomes its bare event list


def m_huge_dur(obj, rng):
    for e in events_of(obj):
        if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel":
            e["dur"] = rng.choice([1e308, 1e300, 2 ** 70, 1e19])
    return "huge kernel durations"


OBJECT_MUTATORS: List[Tuple[str, Callable, float]] = [
    ("drop_events", m_drop_events, 1.0), ("duplicate_events", m_duplicate_events, 1.0),
    ("wrong_type", m_wrong_type, 3.0), ("wrong_arg", m_wrong_arg, 3.0),
    ("same_field_everywhere", m_same_field_everywhere, 1.5), ("extreme_numbers", m_extreme_numbers, 2.0),
    ("list_as_cat", m_list_as_cat, 0.5), ("args_as_string", m_args_as_string, 0.5),
    ("all_dur_zero", m_all_dur_zero, 0.5), ("non_object_entries", m_non_object_entries, 0.5),
    ("step_names", m_step_names, 0.7), ("top_level", m_top_level, 0.7),
    ("device_properties", m_device_properties, 1.0), ("memory_events", m_memory_events, 0.7),
    ("to_array", m_to_array, 0.3), ("huge_dur", m_huge_dur, 0.3),
]


def b_bom(data: bytes, rng) -> Tuple[bytes, str]:
    return b"\xef\xbb\xbf" + data, "bom"


def b_utf16(data: bytes, rng):
    codec = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
    return data.decode("utf-8", "replace").encode(codec), codec


def b_truncate(data: bytes, rng):
    return data[:rng.randrange(len(data) + 1)], "truncate"


def b_flip(data: bytes, rng):
    buf = bytearray(data)
    n = rng.randint(1, 8)
    for _ in range(n):
        if buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf), f"flip {n}"


def b_deep(data: bytes, rng):
    depth = rng.choice([999, 1000, 1500, 5000, 20000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    nested = opener * depth + closer * depth
    where = rng.random()
    if where < 0.6:  # an event's value
        return data.replace(b'"args": {', b'"args": {"deep": ' + nested + b", ", 1), f"deep args {depth}"
    if where < 0.8:  # an event of its own
        return data.replace(b"}, {", b"}, " + nested.replace(b"[", b"[", 1) + b", {", 1), f"deep event {depth}"
    return data.replace(b"{", b'{"deep": ' + nested + b", ", 1), f"deep top {depth}"


def b_bare_nonfinite(data: bytes, rng):
    token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"123456789012345678901234567890"])
    key = rng.choice([b'"dur": ', b'"ts": ', b'"correlation": ', b'"pid": '])
    return data.replace(key + b"", key + token + b", \"was\": ", 1), f"bare {token.decode()}"


def b_whitespace(data: bytes, rng):
    pad = rng.choice([b" ", b"\n", b"\t"]) * rng.choice([10, 1000, 100000])
    cut = data.find(b"[") + 1
    return data[:cut] + pad + data[cut:], "whitespace"


def b_empty(data: bytes, rng):
    return rng.choice([b"", b" ", b"{}", b"[]", b'{"traceEvents": []}', b"null", b"5", b'"x"', b"{",
                       b'{"traceEvents": {}}', b'{"traceEvents": "x"}', b'{"traceEvents": [5]}']), "tiny"


BYTE_MUTATORS: List[Tuple[str, Callable, float]] = [
    ("bom", b_bom, 0.5), ("utf16", b_utf16, 0.4), ("truncate", b_truncate, 0.8), ("flip", b_flip, 0.8),
    ("deep", b_deep, 0.8), ("bare_nonfinite", b_bare_nonfinite, 0.6), ("whitespace", b_whitespace, 0.3),
    ("empty", b_empty, 0.2),
]


def _choose(mutators, rng):
    total = sum(w for _, _, w in mutators)
    x = rng.random() * total
    for name, fn, w in mutators:
        x -= w
        if x <= 0:
            return name, fn
    return mutators[-1][:2]


def mutate(seed: Seed, rng: random.Random) -> Tuple[bytes, bool, List[str]]:
    """(file bytes, gzipped, labels of the mutations) for one input."""
    obj = msgspec.json.decode(seed.text)
    labels = []
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        name, fn = _choose(OBJECT_MUTATORS, rng)
        if name == "to_array" and isinstance(obj, dict):
            obj = events_of(obj)
        labels.append(f"{name}: {fn(obj, rng)}")
    data = json.dumps(obj, indent=rng.choice([None, None, 1])).encode()
    if rng.random() < 0.45 or not labels:
        name, fn = _choose(BYTE_MUTATORS, rng)
        data, label = fn(data, rng)
        labels.append(f"{name}: {label}")
    gzipped = rng.random() < 0.5
    if gzipped:
        data = gzip.compress(data, compresslevel=1)
        r = rng.random()
        if r < 0.1:
            data = data[:rng.randrange(len(data) + 1)]
            labels.append("gzip: truncated inside the stream")
        elif r < 0.18:
            data += rng.choice([b"garbage", b"\x00" * 10, b"\x1f\x8bxx", os.urandom(50)])
            labels.append("gzip: trailing bytes")
        elif r < 0.22:
            cut = rng.randrange(len(data))
            raw = gzip.decompress(data)
            data = gzip.compress(raw[:cut]) + gzip.compress(raw[cut:])
            labels.append("gzip: two members")
    return data, gzipped, labels


# --------------------------------------------------------------------------- the pipeline


class _SectionErrors(logging.Handler):
    """Collects the exceptions report.py isolates (it logs them with exc_info), so a
    section error can be classified by the line that raised."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: List[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def root_cause(exc: BaseException) -> str:
    """Exception type and the innermost frame inside the project: one root cause."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "tb_bottleneck_plugin" in f.filename] or frames
    f = mine[-1] if mine else None
    where = f"{Path(f.filename).name}:{f.lineno} ({f.name})" if f else "?"
    return f"{type(exc).__name__} at {where}"


def run_one(path: str, seed: Seed, handler: _SectionErrors) -> Tuple[str, str]:
    """(outcome, detail). outcome: report | section error | <BottleneckError class> | crash."""
    handler.records.clear()
    try:
        trace = loader.load_trace(path)
        result = report.analyze_trace(trace)
        combined = report.combine_results([result, seed.clean_result])
        json.dumps(result, allow_nan=False)
        json.dumps(combined, allow_nan=False)
    except BottleneckError as exc:
        return type(exc).__name__, str(exc)
    except Exception as exc:  # noqa: BLE001 - what the harness exists to find
        return "crash", root_cause(exc) + "\n" + traceback.format_exc()
    errors = list(result["report"].get("errors") or []) + list(combined.get("errors") or [])
    if errors:
        causes = sorted({root_cause(r.exc_info[1]) for r in handler.records if r.exc_info and r.exc_info[1]})
        detail = "; ".join(causes) or "; ".join(sorted({e["error"] for e in errors}))
        return "section error", detail
    return "report", ""


def prepare(files: List[Path], n_events: int = SEED_EVENTS) -> List[Seed]:
    """Cut every file down to a seed and compute its clean result (the second span
    that combine_results gets with each mutated one)."""
    seeds = []
    for p in files:
        seed = cut_down(p, n_events)
        data = json.dumps(seed.obj).encode()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "clean.pt.trace.json")
            Path(path).write_bytes(data)
            seed.clean_result = report.analyze_trace(loader.load_trace(path))
        seeds.append(seed)
    return seeds


def fuzz(seeds: List[Seed], inputs: int, base_seed: int = 1, only: Optional[int] = None,
         verbose: bool = False, log=print) -> dict:
    """Run ``inputs`` mutated inputs round-robin over the seeds; returns the tally."""
    import numpy as np

    np_errors = np.seterr(all="ignore")  # overflow warnings of hostile values are not outcomes
    handler = _SectionErrors()
    logger = logging.getLogger("tb_bottleneck_plugin")
    old_propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # the isolated tracebacks are collected, not printed
    outcomes: collections.Counter = collections.Counter()
    crash_causes: Dict[str, list] = collections.defaultdict(list)
    section_causes: Dict[str, list] = collections.defaultdict(list)
    typed_messages: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            indices = [only] if only is not None else range(inputs)
            for i in indices:
                seed = seeds[i % len(seeds)]
                rng = random.Random(base_seed * 1_000_003 + i)
                data, gzipped, labels = mutate(seed, rng)
                path = os.path.join(tmp, f"w.{i}.pt.trace.json" + (".gz" if gzipped else ""))
                with open(path, "wb") as f:
                    f.write(data)
                outcome, detail = run_one(path, seed, handler)
                os.unlink(path)
                outcomes[outcome] += 1
                if outcome == "crash":
                    cause, tb = detail.split("\n", 1)
                    crash_causes[cause].append(i)
                    if len(crash_causes[cause]) == 1 or verbose:
                        log(f"CRASH input {i} (seed {seed.name}, {labels}): {cause}\n{tb}")
                elif outcome == "section error":
                    section_causes[detail].append(i)
                elif outcome != "report":
                    typed_messages[outcome][re.sub(r"\d[\d,]*", "N", detail.split(": ", 1)[-1])[:90]] += 1
    finally:
        logger.removeHandler(handler)
        logger.propagate = old_propagate
        np.seterr(**np_errors)
    return {
        "inputs": sum(outcomes.values()), "seconds": round(time.perf_counter() - started, 1),
        "seeds": [s.name for s in seeds],
        "outcomes": dict(outcomes.most_common()),
        "crash_root_causes": {k: {"count": len(v), "first_inputs": v[:5]} for k, v in crash_causes.items()},
        "section_error_root_causes": {k: {"count": len(v), "first_inputs": v[:5]}
                                      for k, v in sorted(section_causes.items(), key=lambda kv: -len(kv[1]))},
        "typed_errors": {k: dict(v.most_common(8)) for k, v in typed_messages.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--traces", type=Path, default=SHARED_TRACES)
    ap.add_argument("--only", type=int, help="run input I alone (reproduce a crash)")
    ap.add_argument("--verbose", action="store_true", help="print every crash, not the first per root cause")
    ap.add_argument("--json", type=Path, help="write the tally here")
    args = ap.parse_args(argv)
    files = trace_files(args.traces)
    t = time.perf_counter()
    seeds = prepare(files)
    print(f"{len(seeds)} seed traces cut to ~{SEED_EVENTS} events each in {time.perf_counter() - t:.1f} s")
    tally = fuzz(seeds, args.inputs, args.seed, args.only, args.verbose)
    print(json.dumps(tally, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(tally, indent=1))
    return 1 if tally["outcomes"].get("crash") else 0


if __name__ == "__main__":
    sys.exit(main())
