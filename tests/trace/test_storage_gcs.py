"""storage.py and discovery over gs:// against a real GCS emulator (fake-gcs-server),
plus the error paths: missing bucket, missing gcsfs, forbidden and network errors."""
from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import pytest

from tb_bottleneck_plugin.trace import discovery, loader, storage
from tb_bottleneck_plugin.errors import MissingExtraError, StorageError

from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
NW0 = TRACES / "generated-cpu-torch2.13/nw0/worker0.1795274786665165565.pt.trace.json"
NW2 = TRACES / "generated-cpu-torch2.13/nw2_gzip/worker0.1795274789574029385.pt.trace.json.gz"
AMD = TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
H100 = TRACES / "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"


@pytest.fixture
def local_logdir(tmp_path: Path) -> Path:
    """Small real traces: pattern names, a renamed .json.gz and a plain .json Kineto trace,
    a non-trace .json, a .tmp and a hidden file."""
    root = tmp_path / "logdir"
    files = {
        NW0.name: NW0.read_bytes(),
        f"exp/run1/{NW2.name}": NW2.read_bytes(),
        "exp/run1/worker1.999.pt.trace.json.gz": NW2.read_bytes(),
        "exp/run1/worker1.1000.pt.trace.json.gz": NW2.read_bytes(),
        "exp/run2/amd_rank0.json.gz": AMD.read_bytes(),
        "exp/run2/amd_plain.json": gzip.decompress(AMD.read_bytes()),
        "exp/run2/tracelens.json.gz": H100.read_bytes(),
        "exp/run2/config.json": b'{"a": 1}',
        "exp/run2/amd_rank0.json.gz.tmp": AMD.read_bytes(),
        "exp/run2/.hidden.json": gzip.decompress(AMD.read_bytes()),
        "empty/worker0.5.pt.trace.json": b"",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


EXPECTED_TREE = {
    ".": {"worker0": ["1795274786665165565"]},
    "empty": {"worker0": ["5"]},
    "exp/run1": {"worker0": ["1795274789574029385"], "worker1": ["999", "1000"]},
    "exp/run2": {"amd_plain": ["amd_plain.json"], "amd_rank0": ["amd_rank0.json.gz"],
                 "tracelens": ["tracelens.json.gz"]},
}


def span_facts(found: discovery.Logdir):
    return [(r.name, w.name, s.name, s.size, s.timestamp) for r, w, s in found.spans()]


def test_gcs_scan_equals_local_scan(gcs, local_logdir: Path):
    bucket = gcs.new_bucket()
    gcs.upload_tree(local_logdir, bucket, "team/logs")
    local = discovery.scan_logdir(str(local_logdir))
    remote = discovery.scan_logdir(f"gs://{bucket}/team/logs")
    assert local.tree() == EXPECTED_TREE
    assert remote.tree() == local.tree()
    assert span_facts(remote) == span_facts(local)
    assert remote.url == f"gs://{bucket}/team/logs" and remote.root == f"{bucket}/team/logs"
    run, worker, span = remote.spans()[0]
    assert run.path == f"{bucket}/team/logs"
    assert span.path == f"{bucket}/team/logs/{NW0.name}" and span.url == "gs://" + span.path
    assert span.fingerprint.startswith(f"{NW0.stat().st_size}:g")  # size + generation
    # A trailing slash and the gcs:// alias name the same logdir.
    assert discovery.scan_logdir(f"gs://{bucket}/team/logs/").tree() == local.tree()


def test_gcs_listing_is_one_flat_call_and_rescans_reread_nothing(gcs, local_logdir: Path, monkeypatch):
    bucket = gcs.new_bucket()
    gcs.upload_tree(local_logdir, bucket, "logs")
    url = f"gs://{bucket}/logs"
    fs, _ = storage.get_fs(url)
    assert type(fs).__module__ == "gcsfs.core" and fs.credentials.token == "anon"
    assert storage.get_fs(url)[0] is fs  # the instance scan_logdir will use

    calls = {"find": 0, "ls": 0, "list_objects": 0, "info": 0, "cat_file": 0}

    def counting(name, method, is_async=False):
        if is_async:
            async def wrapper(*args, **kwargs):
                calls[name] += 1
                return await method(*args, **kwargs)
        else:
            def wrapper(*args, **kwargs):
                calls[name] += 1
                return method(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(fs, "find", counting("find", fs.find))
    monkeypatch.setattr(fs, "ls", counting("ls", fs.ls))
    monkeypatch.setattr(fs, "_ls", counting("ls", fs._ls, True))
    monkeypatch.setattr(fs, "_do_list_objects", counting("list_objects", fs._do_list_objects, True))
    monkeypatch.setattr(fs, "info", counting("info", fs.info))
    monkeypatch.setattr(fs, "_info", counting("info", fs._info, True))
    monkeypatch.setattr(fs, "cat_file", counting("cat_file", fs.cat_file))

    first = discovery.scan_logdir(url)
    # One listing request; one ranged read per unnamed .json[.gz] (4 of them; the
    # TraceLens file needs a second, larger one), none for *.pt.trace.json files.
    assert calls == {"find": 1, "ls": 0, "list_objects": 1, "info": 0, "cat_file": 5}
    second = discovery.scan_logdir(url)
    assert second == first
    assert calls == {"find": 2, "ls": 0, "list_objects": 2, "info": 0, "cat_file": 5}
    # Overwriting an object gives it a new generation: only that file is read again.
    gcs.upload_bytes(bucket, "logs/exp/run2/config.json", b'{"schemaVersion": 1, "traceEvents": []}')
    third = discovery.scan_logdir(url)
    assert calls["cat_file"] == 6
    assert "config" in third.tree()["exp/run2"]


def test_gcs_open_and_load(gcs):
    bucket = gcs.new_bucket()
    gcs.upload_file(bucket, "r/amd.json.gz", AMD)
    found = discovery.scan_logdir(f"gs://{bucket}")
    span = found.runs[0].workers[0].spans[0]
    assert (found.runs[0].name, span.name) == ("r", "amd.json.gz")
    fs, path = storage.get_fs(span.url)
    assert path == span.path
    with storage.open_binary(fs, span.path) as f:
        assert f.read() == AMD.read_bytes()
    assert storage.read_head(fs, span.path, 2) == b"\x1f\x8b"
    trace = loader.load_trace(span.path, fs=fs, source=span.url)  # what report.py does
    assert trace is not None
    with pytest.raises(StorageError) as info:
        storage.open_binary(fs, f"{bucket}/r/missing.json.gz")
    assert f"gs://{bucket}/r/missing.json.gz" in str(info.value)


def test_gcs_directory_placeholders_and_empty_prefix(gcs):
    bucket = gcs.new_bucket()
    gcs.upload_bytes(bucket, "logs/run/", b"")  # a "folder" made by the console
    gcs.upload_file(bucket, "logs/run/w.1.pt.trace.json.gz", NW2)
    assert discovery.scan_logdir(f"gs://{bucket}/logs").tree() == {"run": {"w": ["1"]}}
    empty = discovery.scan_logdir(f"gs://{bucket}/not-yet-written")
    assert empty.runs == [] and empty.url == f"gs://{bucket}/not-yet-written"


def test_gcs_discover_path(gcs):
    bucket = gcs.new_bucket()
    gcs.upload_file(bucket, "logs/run/amd.json.gz", AMD)
    one = discovery.discover_path(f"gs://{bucket}/logs/run/amd.json.gz")
    assert one.url == f"gs://{bucket}/logs/run" and one.tree() == {".": {"amd": ["amd.json.gz"]}}
    assert one.runs[0].workers[0].spans[0].size == AMD.stat().st_size
    assert discovery.discover_path(f"gs://{bucket}/logs").tree() == {"run": {"amd": ["amd.json.gz"]}}
    with pytest.raises(StorageError, match="not found"):
        discovery.discover_path(f"gs://{bucket}/nothing/here")


def test_missing_bucket_is_a_storage_error(gcs):
    url = "gs://no-such-bucket-here/logs"
    with pytest.raises(StorageError) as info:
        discovery.scan_logdir(url)
    assert str(info.value).startswith(url + ":") and "not found" in str(info.value)
    assert not isinstance(info.value, MissingExtraError)


def test_gcs_fingerprint_uses_generation(gcs):
    bucket = gcs.new_bucket()
    gcs.upload_bytes(bucket, "a.json", b"{}")
    fs, root = storage.get_fs(f"gs://{bucket}/a.json")
    first = storage.file_fingerprint(storage.info(fs, root))
    gcs.upload_bytes(bucket, "a.json", b"{}")  # same size, same bytes, new generation
    fs.invalidate_cache()
    second = storage.file_fingerprint(storage.info(fs, root))
    assert first.startswith("2:g") and second.startswith("2:g") and first != second


def test_missing_gcsfs_gives_install_hint(monkeypatch):
    for name in [m for m in sys.modules if m == "gcsfs" or m.startswith("gcsfs.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError
    for env in ("", "http://127.0.0.1:9"):
        if env:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", env)
        else:
            monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        for call in (storage.get_fs, discovery.scan_logdir, discovery.discover_path):
            with pytest.raises(MissingExtraError) as info:
                call("gs://bucket/logs")
            message = str(info.value)
            assert message.startswith("gs://bucket/logs:")
            assert 'pip install "tb_bottleneck_plugin[gcs]"' in message and "gcsfs" in message
            assert isinstance(info.value, StorageError)


def test_other_missing_protocol_package():
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed")
    except ImportError:
        pass
    with pytest.raises(MissingExtraError, match="s3fs"):
        storage.get_fs("s3://bucket/logs")


def _raise(exc):
    def method(*args, **kwargs):
        raise exc
    return method


def test_listing_errors_become_storage_errors(gcs, monkeypatch):
    import aiohttp
    from gcsfs.retry import HttpError

    url = "gs://some-bucket/logs"
    fs, _ = storage.get_fs(url)
    cases = [
        (OSError("Forbidden: b/some-bucket/o\nanonymous caller does not have storage.objects.list"),
         "permission denied"),
        (PermissionError("nope"), "permission denied"),
        (HttpError({"code": 403, "message": "Forbidden"}), "permission denied"),
        (HttpError({"code": 503, "message": "backend unavailable"}), "HTTP 503"),
        (aiohttp.ClientConnectionError("Cannot connect to host storage.googleapis.com:443"), "network error"),
        (FileNotFoundError("b/some-bucket/o"), "not found"),
        (TimeoutError("read timed out"), "timed out"),
    ]
    for exc, expected in cases:
        monkeypatch.setattr(fs, "find", _raise(exc))
        with pytest.raises(StorageError) as info:
            discovery.scan_logdir(url)
        assert str(info.value).startswith(f"{url}: cannot list: ") and expected in str(info.value), exc
        assert info.value.__cause__ is exc


def test_unreadable_candidate_is_skipped_not_fatal(gcs, monkeypatch):
    bucket = gcs.new_bucket()
    gcs.upload_file(bucket, "run/amd.json.gz", AMD)
    gcs.upload_file(bucket, "run/w.1.pt.trace.json.gz", NW2)
    url = f"gs://{bucket}"
    fs, _ = storage.get_fs(url)
    monkeypatch.setattr(fs, "cat_file", _raise(PermissionError("denied")))
    assert discovery.scan_logdir(url).tree() == {"run": {"w": ["1"]}}
    monkeypatch.undo()
    # The failure was not cached: the next scan reads it.
    assert discovery.scan_logdir(url).tree() == {"run": {"amd": ["amd.json.gz"], "w": ["1"]}}


def test_local_get_fs_and_fingerprint(tmp_path: Path):
    fs, root = storage.get_fs(str(tmp_path / "a" / ".." / "b"))
    assert storage.is_local(fs) and root == str(tmp_path / "b")
    assert storage.get_fs(f"file://{tmp_path}")[1] == str(tmp_path)
    path = tmp_path / "x.json"
    path.write_bytes(b"abc")
    os.utime(path, ns=(1_500_000_000, 1_500_000_000))
    assert storage.file_fingerprint(storage.info(fs, str(path))) == "3:m1.5"
    with pytest.raises(StorageError, match="not found"):
        storage.info(fs, str(tmp_path / "missing"))
    with pytest.raises(StorageError) as info:
        storage.open_binary(fs, str(tmp_path / "missing"))
    assert str(tmp_path / "missing") in str(info.value)


def test_fingerprint_forms():
    import datetime as dt

    assert storage.file_fingerprint({"size": 5, "generation": "17", "mtime": 1.0}) == "5:g17"
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert storage.file_fingerprint({"size": 5, "mtime": when}) == f"5:m{when.timestamp()!r}"
    assert storage.file_fingerprint({"size": 5, "LastModified": "2026-01-01"}) == "5:u2026-01-01"
    assert storage.file_fingerprint({"size": 5}) == "5:"


def test_an_object_uploaded_after_its_directory_was_listed_opens(gcs):
    """A long-lived analysis process lists a run directory for one span (the memory-snapshot
    lookup) and later analyses a span uploaded since: gcsfs answers from the cached listing
    ("file not found") unless report.analyze_span drops it first (storage.forget_listing)."""
    from tb_bottleneck_plugin import report

    import dataclasses

    bucket = gcs.new_bucket()
    gcs.upload_file(bucket, f"live/run/{NW0.name}", NW0)
    found = discovery.scan_logdir(f"gs://{bucket}/live")
    run = found.runs[0]
    old_span = run.workers[0].spans[0]
    fs, _ = storage.get_fs(old_span.url)
    assert len(fs.ls(f"{bucket}/live/run", detail=False)) == 1  # now cached by gcsfs
    gcs.upload_file(bucket, f"live/run/{NW2.name}", NW2)  # uploaded after; no rescan here
    path = f"{bucket}/live/run/{NW2.name}"
    new_span = dataclasses.replace(old_span, name=NW2.name, path=path, url=f"gs://{path}")
    # the mechanism: the stale listing hides the new object from this filesystem instance
    with pytest.raises(FileNotFoundError):
        fs.info(path)
    result = report.analyze_span(f"gs://{bucket}/live", run, new_span)
    assert result["report"]["spans"] == [new_span.url]
