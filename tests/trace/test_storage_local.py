"""`storage.LocalFiles` answers local calls as fsspec's LocalFileSystem does, without
importing fsspec (a report of one local file never pays for fsspec and asyncio)."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from tb_bottleneck_plugin.trace import storage

pytestmark = pytest.mark.skipif(os.sep != "/", reason="LocalFiles serves POSIX paths only")


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "w.pt.trace.json").write_bytes(b'{"traceEvents": []}')
    (tmp_path / "run" / "sub").mkdir()
    os.symlink(tmp_path / "run" / "w.pt.trace.json", tmp_path / "run" / "link.json")
    os.symlink(tmp_path / "run" / "gone.json", tmp_path / "run" / "broken.json")
    os.mkfifo(tmp_path / "run" / "pipe")
    return tmp_path


def _names(tree):
    run = tree / "run"
    return [str(run), str(run) + "/", str(run / "w.pt.trace.json"), str(run / "sub"), str(run / "link.json"),
            str(run / "broken.json"), str(run / "pipe"), str(run / "missing"), "file://" + str(run / "w.pt.trace.json"),
            "local://" + str(run), str(run / "sub" / ".." / "w.pt.trace.json")]


def _answer(call):
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 - the comparison covers the errors too
        return ("error", type(exc))


@pytest.mark.parametrize("method", ["info", "exists", "isfile", "isdir", "ls"])
def test_calls_answer_as_fsspec(tree, method):
    ours, theirs = storage.LocalFiles(), LocalFileSystem()
    for name in _names(tree):
        mine, fsspecs = _answer(lambda: getattr(ours, method)(name)), _answer(lambda: getattr(theirs, method)(name))
        if method == "ls" and mine[0] == "ok":
            mine, fsspecs = ("ok", sorted(mine[1])), ("ok", sorted(fsspecs[1]))
        assert mine == fsspecs, (method, name)


def test_relative_and_home_paths_resolve_as_fsspec(tree, monkeypatch):
    monkeypatch.chdir(tree)
    monkeypatch.setenv("HOME", str(tree))
    for name in ("run", "./run", "run/w.pt.trace.json", "~/run", ".", "run/sub/../w.pt.trace.json"):
        fs, root = storage.get_fs(name)
        assert isinstance(fs, storage.LocalFiles)
        theirs, their_root = url_to_fs(name)
        assert root == os.path.abspath(their_root), name
        assert fs.info(root) == theirs.info(root), name


def test_open_reads_the_bytes_and_the_rest_is_fsspecs(tree):
    fs, root = storage.get_fs(str(tree / "run"))
    with fs.open(root + "/w.pt.trace.json", "rb") as f:
        assert f.read() == b'{"traceEvents": []}'
    found = fs.find(root, detail=True)  # not answered here: fsspec's own
    assert found == LocalFileSystem().find(root, detail=True)
    assert fs.cat_file(root + "/w.pt.trace.json", start=0, end=5) == b'{"tra'
    assert storage.is_local(fs)
    copy = pickle.loads(pickle.dumps(fs))
    assert copy == fs and copy.info(root) == fs.info(root)


def test_a_report_of_one_local_file_does_not_import_fsspec(tree):
    (tree / "run" / "w.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
                                                  '"pid": 1, "tid": 1, "ts": 10, "dur": 5}]}')
    code = ("import sys\nfrom tb_bottleneck_plugin import cli\n"
            f"rc = cli.main(['report', {str(tree / 'run' / 'w.pt.trace.json')!r}, '--json'])\n"
            "print('FSSPEC' if 'fsspec' in sys.modules else 'NO-FSSPEC', rc, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "NO-FSSPEC 0", done.stderr
