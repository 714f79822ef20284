"""Discovery on local logdirs built from the real traces in ../shared/traces (symlinked,
never copied into the repository), and on ../shared/traces itself."""
from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from tb_bottleneck_plugin.trace import discovery, storage
from tb_bottleneck_plugin.trace.discovery import ROOT_RUN, classify_head
from tb_bottleneck_plugin.errors import StorageError

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
NW0 = TRACES / "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json"
NW2 = TRACES / "generated-cpu-torch2.13/nw2_gzip/worker0.1795274789574029385.pt.trace.json.gz"
KINETO_MS = TRACES / "kineto-tb-samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
KINETO_2020 = TRACES / "kineto-tb-samples/resnet50_num_workers_0_2020-12/worker0.pt.trace.json.gz"
CONTROL = TRACES / "hta/trace_diff/control/control.json.gz"
AMD = TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
H100 = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"

# A run is every folder of ../shared/traces that holds trace files (the corpus grows:
# derived from the files, not listed by hand).
SHARED_FILES = sorted(p for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
SHARED_RUNS = sorted({p.parent.relative_to(TRACES).as_posix() for p in SHARED_FILES})


def link(dst: Path, src: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


def write(dst: Path, data: bytes) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return dst


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    root = tmp_path / "logdir"
    # A trace directly in the logdir: run ".".
    link(root / NW0.name, NW0)
    # A run at depth 4 with two workers; 13-digit (ms) and 19-digit (ns) names mixed.
    deep = root / "exp1/2024/a/run1"
    link(deep / "worker0.1623143089861.pt.trace.json.gz", KINETO_MS)
    link(deep / "worker0.1795274789574029385.pt.trace.json.gz", NW2)
    link(deep / "worker1.1623143566756.pt.trace.json.gz", KINETO_MS)
    link(deep / "worker0.1623143089861.pt.trace.json.gz.tmp", KINETO_MS)  # kineto mid-write
    # Numeric, not lexical: 999 < 1000 < 10000; no-timestamp first.
    num = root / "numeric"
    for name in ("w.1000.pt.trace.json", "w.999.pt.trace.json", "w.10000.pt.trace.json.gz",
                 "w.pt.trace.json"):
        link(num / name, NW0)
    # Kineto traces under other names: recognised by content.
    renamed = root / "renamed"
    link(renamed / "control.json.gz", CONTROL)  # object with schemaVersion, gzip
    link(renamed / "rank3_copy.json", NW0)  # plain JSON object
    link(renamed / "legacy.json.gz", KINETO_2020)  # 2020 bare array, first event has "ph"
    link(renamed / "gaunernst.json.gz", H100)  # 26 KB of "metadata" before traceEvents
    write(renamed / "gzip_but_named.json", AMD.read_bytes())  # gzip content, no .gz
    write(renamed / "plain_but_named.json.gz", gzip.decompress(AMD.read_bytes()))
    write(renamed / "cut_head.json", gzip.decompress(AMD.read_bytes())[:100])  # a head is enough
    # Not traces.
    write(renamed / "config.json", b'{"a": 1}')
    write(renamed / "nested.json", b'{"a": {"traceEvents": []}, "b": 2}')
    write(renamed / "numbers.json", b"[1, 2, 3]")
    write(renamed / "events_without_ph.json", b'[{"name": "x", "ts": 1}]')
    write(renamed / "broken.json.gz", b"\x1f\x8bnot really gzip")
    write(renamed / "undecided.json", b'{"metadata": "' + b"x" * 70000 + b'", "traceEvents": []}')
    write(renamed / "empty.json", b"")
    write(renamed / "notes.txt", b"{}")
    link(renamed / "control.json.gz.tmp", CONTROL)
    link(renamed / ".hidden.pt.trace.json", NW0)
    link(root / ".ipynb_checkpoints/worker0.1.pt.trace.json", NW0)
    # A named trace of size 0 is listed (the loader reports it).
    write(root / "empties/worker9.1700000000000.pt.trace.json", b"")
    return root


def test_runs_workers_spans(logdir: Path):
    found = discovery.scan_logdir(str(logdir))
    assert found.url == str(logdir)
    assert found.tree() == {
        ".": {"worker0": ["1795274786665165565"]},
        "empties": {"worker9": ["1700000000000"]},
        "exp1/2024/a/run1": {
            "worker0": ["1623143089861", "1795274789574029385"],
            "worker1": ["1623143566756"],
        },
        "numeric": {"w": ["w.pt.trace.json", "999", "1000", "10000"]},
        "renamed": {
            "control": ["control.json.gz"],
            "gaunernst": ["gaunernst.json.gz"],
            "cut_head": ["cut_head.json"],
            "gzip_but_named": ["gzip_but_named.json"],
            "legacy": ["legacy.json.gz"],
            "plain_but_named": ["plain_but_named.json.gz"],
            "rank3_copy": ["rank3_copy.json"],
        },
    }
    run1 = discovery.resolve(found, "exp1/2024/a/run1").run
    assert run1.path == str(logdir / "exp1/2024/a/run1")
    span = run1.workers[0].spans[1]
    assert span.timestamp == 1795274789574029385 and span.time_ns == 1795274789574029385
    assert run1.workers[0].spans[0].time_ns == 1623143089861 * 1_000_000
    assert span.path == span.url == str(logdir / "exp1/2024/a/run1/worker0.1795274789574029385.pt.trace.json.gz")
    assert span.size == NW2.stat().st_size  # the symlink's target
    root_span = found.runs[0].workers[0].spans[0]
    assert found.runs[0].name == ROOT_RUN and found.runs[0].path == str(logdir)
    assert root_span.size == NW0.stat().st_size
    renamed = {w.name: w.spans[0] for w in discovery.resolve(found, "renamed").run.workers}
    assert renamed["control"].timestamp is None and renamed["control"].size == CONTROL.stat().st_size
    empty = discovery.resolve(found, "empties", "worker9").worker.spans[0]
    assert empty.size == 0 and empty.timestamp == 1700000000000


def test_span_order_is_numeric_and_chronological(tmp_path: Path):
    run = tmp_path / "run"
    names = ["w.1700000000000.pt.trace.json",  # ms, Nov 2023
             "w.1695000000000000000.pt.trace.json",  # ns, Sep 2023: lexically first, older
             "w.99.pt.trace.json", "w.100.pt.trace.json"]
    for name in names:
        write(run / name, b"")
    spans = discovery.scan_logdir(str(tmp_path)).runs[0].workers[0].spans
    assert [s.name for s in spans] == ["99", "100", "1695000000000000000", "1700000000000"]


def test_pattern_files_are_never_read_and_heads_are_small(logdir: Path, monkeypatch):
    reads = []
    real = storage.read_head

    def spy(fs, path, nbytes, url=None):
        reads.append((os.path.basename(path), nbytes))
        return real(fs, path, nbytes, url=url)

    monkeypatch.setattr(storage, "read_head", spy)
    discovery.scan_logdir(str(logdir))
    names = {name for name, _ in reads}
    assert not any(".pt.trace." in name for name in names)
    assert "empty.json" not in names and "notes.txt" not in names and "control.json.gz.tmp" not in names
    twice = ("gaunernst.json.gz", "undecided.json")
    assert all(n == discovery.SNIFF_BYTES for name, n in reads if name not in twice)
    # The TraceLens file and a 70 KB string need the second, larger read; nothing more.
    for name in twice:
        assert [n for nm, n in reads if nm == name] == [discovery.SNIFF_BYTES, discovery.SNIFF_MAX_BYTES]


def test_rescan_reuses_sniff_results_until_a_file_changes(logdir: Path):
    first = discovery.scan_logdir(str(logdir))
    sniffed = discovery.sniff_reads()
    assert sniffed == 13  # every unnamed, non-empty .json/.json.gz once
    again = discovery.scan_logdir(str(logdir))
    assert discovery.sniff_reads() == sniffed and again == first
    config = logdir / "renamed/config.json"
    config.write_bytes(b'{"schemaVersion": 1, "traceEvents": []}')
    os.utime(config, ns=(1, 1))  # a different mtime even on coarse clocks
    third = discovery.scan_logdir(str(logdir))
    assert discovery.sniff_reads() == sniffed + 1
    assert "config" in third.tree()["renamed"]


def test_fingerprint_changes_with_the_file(tmp_path: Path):
    path = write(tmp_path / "run/w.1.pt.trace.json", b"{}")
    before = discovery.scan_logdir(str(tmp_path)).runs[0].workers[0].spans[0].fingerprint
    os.utime(path, ns=(5_000_000_000, 5_000_000_000))
    after = discovery.scan_logdir(str(tmp_path)).runs[0].workers[0].spans[0].fingerprint
    assert before != after and after == "2:m5.0"


def test_shared_traces_runs():
    found = discovery.scan_logdir(str(TRACES))
    assert [r.name for r in found.runs] == SHARED_RUNS
    tree = found.tree()
    assert tree["hta/ns_resolution_trace"] == {"rank-0.Apr_03_18_51_38": ["1102"]}  # tb_plugin's pattern
    assert tree["hta/trace_diff/control"] == {"control": ["control.json.gz"]}
    assert tree["tracelens/h100"] == {"gaunernst_bert-small-uncased__1016001":
                                      ["gaunernst_bert-small-uncased__1016001.json.gz"]}
    assert tree["kineto-tb-samples/resnet50_num_workers_0"] == {"worker0": ["1623143089861", "1623143566756"]}
    assert tree["kineto-tb-samples/resnet50_num_workers_0_2020-12"] == {"worker0": ["worker0.pt.trace.json.gz"]}
    assert sum(len(w.spans) for r in found.runs for w in r.workers) == len(SHARED_FILES)
    # 2025+ tensorboard_trace_handler names: one worker, one span per file
    assert tree["h100/gpt2_bf16_eager"] == {"worker0": ["1795701567436882984"]}


def test_resolve_accepts_only_discovered_names(logdir: Path):
    found = discovery.scan_logdir(str(logdir))
    sel = discovery.resolve(found, "exp1/2024/a/run1")
    assert sel.worker is None and sel.span is None and len(sel.items) == 3
    sel = discovery.resolve(found, "exp1/2024/a/run1", "worker0")
    assert sel.worker.name == "worker0" and [s.name for _, s in sel.items] == ["1623143089861", "1795274789574029385"]
    sel = discovery.resolve(found, "exp1/2024/a/run1", "worker1", "1623143566756")
    assert sel.span.url.endswith("worker1.1623143566756.pt.trace.json.gz")
    sel = discovery.resolve(found, "exp1/2024/a/run1", None, "1623143566756")  # implies worker1
    assert sel.worker.name == "worker1" and sel.span.name == "1623143566756"
    for args in [("nope",), ("exp1",), ("exp1/2024/a/run1/",), ("../logdir",), (str(logdir),),
                 ("exp1/2024/a/run1", "worker2"), ("exp1/2024/a/run1", "worker0", "1623143566756"),
                 ("exp1/2024/a/run1", None, "123"), (".", "worker0", NW0.name), (".", "../../etc/passwd")]:
        with pytest.raises(KeyError):
            discovery.resolve(found, *args)


def test_discover_path_file_run_and_logdir(logdir: Path):
    one = discovery.discover_path(str(logdir / "renamed/control.json.gz"))
    assert one.url == str(logdir / "renamed")
    assert one.tree() == {".": {"control": ["control.json.gz"]}}
    assert one.runs[0].workers[0].spans[0].size == CONTROL.stat().st_size
    named = discovery.discover_path(str(logdir / "exp1/2024/a/run1/worker1.1623143566756.pt.trace.json.gz"))
    assert named.tree() == {".": {"worker1": ["1623143566756"]}}
    # A file named explicitly is taken as is; the loader will say if it is no trace.
    assert discovery.discover_path(str(logdir / "renamed/config.json")).tree() == {".": {"config": ["config.json"]}}
    run = discovery.discover_path(str(logdir / "exp1/2024/a/run1"))
    assert run.tree() == {".": {"worker0": ["1623143089861", "1795274789574029385"],
                                "worker1": ["1623143566756"]}}
    whole = discovery.discover_path(str(logdir))
    assert whole == discovery.scan_logdir(str(logdir))
    with pytest.raises(StorageError, match="not found"):
        discovery.discover_path(str(logdir / "missing"))


def test_missing_or_empty_local_logdir(tmp_path: Path):
    with pytest.raises(StorageError) as info:
        discovery.scan_logdir(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in str(info.value)
    with pytest.raises(StorageError, match="not a directory"):
        discovery.scan_logdir(str(write(tmp_path / "f.json", b"{}")))
    (tmp_path / "empty").mkdir()
    assert discovery.scan_logdir(str(tmp_path / "empty")).runs == []


def test_symlinked_run_directory(tmp_path: Path):
    """Directory links are followed inside the logdir; outside only with follow_symlinks
    (a note says what was skipped)."""
    link(tmp_path / "logdir/real/run_a" / NW0.name, NW0)
    link(tmp_path / "logdir/linked_run", tmp_path / "logdir/real/run_a")  # inside: followed
    link(tmp_path / "logdir/outside_run", NW0.parent)  # outside: skipped by default
    link(tmp_path / "logdir/loop", tmp_path / "logdir")  # a loop must not hang the scan
    found = discovery.scan_logdir(str(tmp_path / "logdir"))
    assert found.tree() == {"linked_run": {"worker0": ["1795274786665165565"]},
                            "real/run_a": {"worker0": ["1795274786665165565"]}}
    assert found.notes == (f"skipped symlink outside_run -> {NW0.parent} (points outside the logdir; "
                           "--bottlenecks_follow_symlinks follows it)",)
    allowed = discovery.scan_logdir(str(tmp_path / "logdir"), follow_symlinks=True)
    assert allowed.tree()["outside_run"] == {"worker0": ["1795274786665165565"]}
    assert allowed.notes == ()


def test_symlink_to_the_root_does_not_walk_the_machine(tmp_path: Path):
    root = tmp_path / "logdir"
    link(root / "runs" / "mine" / NW0.name, NW0)
    (root / "runs" / "link").symlink_to("/")
    t0 = time.perf_counter()
    found = discovery.scan_logdir(str(root))
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, elapsed
    assert list(found.tree()) == ["runs/mine"]  # no foreign runs
    assert found.notes == ("skipped symlink runs/link -> / (points outside the logdir; "
                           "--bottlenecks_follow_symlinks follows it)",)


@pytest.mark.parametrize("text,complete,verdict", [
    (b'{\n  "schemaVersion": 1,', False, True),
    (b'{"deviceProperties": [', False, True),
    (b'\xef\xbb\xbf {"traceEvents": [', False, True),
    (b'{"metadata": {"a": {"b": [1, 2, {"c": "}"}]}}, "traceEvents": [', False, True),
    (b'{"metadata": {"a": "x\\"traceEvents\\": 1", "b', False, None),
    (b'{"a": {"traceEvents": []}, "b": 2}', True, False),
    (b'{"a": {"traceEvents": []}, "b": 2', False, None),
    (b'{"a": 1}', True, False),
    (b'{"a": 1}   ', False, False),  # the object closed: decided
    (b'[\n  {\n "ph": "X", "cat": "Operator"', False, True),
    (b'[{"args": {"ph": 1}}, {"ph": "X"}]', True, False),
    (b'[{"name": "a", "args": {"x": [1]}, "ph": "X"}', False, True),
    (b'[1, {"ph": "X"}]', True, False),
    (b"[", False, None),
    (b"", True, False),
    (b"  ", False, None),
    (b"\x00\x01binary", False, False),
    (b'"traceEvents"', True, False),
])
def test_classify_head(text, complete, verdict):
    assert classify_head(text, complete) is verdict


def test_parse_trace_name():
    assert discovery.parse_trace_name("worker0.1623143089861.pt.trace.json.gz") == ("worker0", "1623143089861", 1623143089861)
    assert discovery.parse_trace_name("vm_7129.1795274792083492153.pt.trace.json") == ("vm_7129", "1795274792083492153", 1795274792083492153)
    assert discovery.parse_trace_name("worker0.pt.trace.json.gz") == ("worker0", "worker0.pt.trace.json.gz", None)
    assert discovery.parse_trace_name("worker0.1.pt.trace.json.tmp") is None
    assert discovery.parse_trace_name("control.json.gz") is None
    assert discovery.json_stem("rank-0.Apr_03_18_51_38.1102.json.gz") == "rank-0.Apr_03_18_51_38.1102"
    assert discovery.json_stem(".json") is None
