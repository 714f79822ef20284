"""Issue 11: every number the JSON report, the worker/run summaries, the kernel/memory
results, the rank view and the CLI text show is unchanged on all of ../shared/traces
and demo_logs, against a golden file recorded by the code before the metric-unit
refactor (tests/fixtures/before_after/record.py). New keys (e.g. "verdicts") are
allowed; a removed key or a changed number fails."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("before_after_record",
                                               os.path.join(HERE, "fixtures", "before_after", "record.py"))
rec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rec)

pytestmark = pytest.mark.skipif(not os.path.isdir(rec.LOGDIRS["shared"]), reason="../shared/traces not present")


def test_every_number_unchanged_on_all_traces():
    golden = rec.load_golden()
    # The golden file covers every trace of the shared set and of demo_logs.
    assert len(golden["shared"]["spans"]) == 14 and len(golden["demo"]["spans"]) == 11
    problems = rec.diff(golden, rec.record())
    assert not problems, "\n".join(problems)


def test_diff_catches_changes():
    """The comparison itself: a changed number, a removed key, a changed text line fail; a new key does not."""
    old = {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl2"}
    assert rec.diff(old, {"a": {"x": 1.0 + 1e-12, "y": [1, 2], "new": 3}, "t": "l1\nl2"}) == []
    assert rec.diff(old, {"a": {"x": 1.001, "y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"y": [1, 2]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1]}, "t": "l1\nl2"})
    assert rec.diff(old, {"a": {"x": 1.0, "y": [1, 2]}, "t": "l1\nl3"})
    assert rec.diff(old, {"a": {"x": None, "y": [1, 2]}, "t": "l1\nl2"})
