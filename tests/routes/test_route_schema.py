"""One contract, checked from both ends: docs/route-schema.json.

1. Every JSON route (runs, report, memory, kernels; 200, 202, 400, 404 and 422 bodies) of
   every run/worker/span of a logdir holding every trace in ../shared/traces plus demo_logs
   is answered through TensorBoard's own WSGI routing and validated against the schema.
2. The frontend's fixtures (tests/fixtures/route_responses.json, served by the mock server
   tests/fixtures/frontend_mock_server.py, and sample_report.json) validate against the same
   schema AND equal what the backend answers today for the same traces, within the fields
   the frontend reads (the schema's `required` fields). When the backend changes, this
   test fails until the fixtures are re-recorded with
   ``python tests/fixtures/record_route_fixtures.py``.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

HERE = Path(__file__).resolve().parents[1]  # tests/
REPO = HERE.parent
from conftest import TRACES  # noqa: E402  (the one definition, tests/conftest.py)
sys.path.insert(0, str(HERE / "fixtures"))

import record_route_fixtures as rec  # noqa: E402

SCHEMA = json.loads((REPO / "docs" / "route-schema.json").read_text())


def validator(name: str):
    sub = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"}
    jsonschema.Draft202012Validator.check_schema(sub)
    return jsonschema.Draft202012Validator(sub)


VALIDATORS = {name: validator(name) for name in SCHEMA["$defs"]}


def check(route: str, status: int, body, where: str) -> None:
    table = SCHEMA["x-routes"][route]
    assert str(status) in table, f"{where}: status {status} is not part of the contract of {route}"
    errors = sorted(VALIDATORS[table[str(status)]].iter_errors(body), key=lambda e: list(e.path))
    assert not errors, f"{where}: " + "; ".join(
        f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in errors[:8])


# ---------------------------------------------------------------------------- the schema itself


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    for route, table in SCHEMA["x-routes"].items():
        for status, name in table.items():
            assert name in SCHEMA["$defs"], (route, status, name)


def _objects(node, path="#"):
    if isinstance(node, dict):
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects(value, f"{path}/{i}")


def test_schema_objects_tolerate_added_fields():
    """Other parts of the backend add fields: no object of the contract may forbid them."""
    for path, node in _objects(SCHEMA["$defs"]):
        assert node.get("additionalProperties", True) is not False, path
        for req in node.get("required", []):
            assert req in node.get("properties", {}), (path, req)


def test_schema_rejects_what_the_frontend_cannot_read():
    """The check can fail: the old mock's ts_ms memory curves and a missing card field."""
    bad_memory = {"devices": {"cuda:0": {"ts_ms": [0.0, 1.0], "allocated_bytes": [1, 2], "reserved_bytes": None}}}
    assert list(VALIDATORS["memory"].iter_errors(bad_memory))
    report = json.loads((HERE / "fixtures" / "sample_report.json").read_text())
    assert not list(VALIDATORS["report"].iter_errors(report))
    del report["input"]["input_bound_pct"]
    assert list(VALIDATORS["report"].iter_errors(report))
    report["input"]["input_bound_pct"] = "33%"
    assert list(VALIDATORS["report"].iter_errors(report))


# ---------------------------------------------------------------------------- every trace, every route


def _all_traces():
    if not TRACES.is_dir():
        return []
    return sorted(p for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    traces = _all_traces()
    if not traces:
        pytest.skip("../shared/traces is not available")
    root = tmp_path_factory.mktemp("all_traces")
    for path in traces:
        rel = path.relative_to(TRACES)
        dst = root / "shared" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(path)
    for path in sorted((REPO / "demo_logs").rglob("*.json.gz")):
        dst = root / "demo" / path.relative_to(REPO / "demo_logs")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(path)
    harness = rec.harness(root)
    yield harness, len(traces)
    harness.plugin.analyzer.stop()


def test_every_route_of_every_trace_follows_the_schema(everything):
    harness, n_traces = everything
    status, runs = rec.get(harness, "runs")
    check("runs", status, runs, "runs")
    spans = [(r["run"], w["worker"], s["span"]) for r in runs["runs"] for w in r["workers"] for s in w["spans"]]
    assert len(spans) >= n_traces  # every shared trace is discovered (plus the demo runs)
    checked = 0
    for run_name in sorted({r for r, _, _ in spans}):
        workers = sorted({w for r, w, _ in spans if r == run_name})
        queries = [{"run": run_name}]  # run summary
        for worker in workers:
            queries.append({"run": run_name, "worker": worker})  # worker summary
            queries += [{"run": run_name, "worker": worker, "span": s}
                        for r, w, s in spans if r == run_name and w == worker]
        for query in queries:
            for route in ("report", "memory", "kernels", "operators", "findings"):
                status, body = rec.get(harness, route, **query)
                assert status == 200, (route, query, status, str(body)[:300])
                check(route, status, body, f"{route} {query}")
                checked += 1
    assert checked >= 3 * len(spans)


def test_error_bodies_follow_the_schema(everything):
    harness, _ = everything
    for route in ("report", "memory", "kernels", "operators", "findings"):
        status, body = rec.get(harness, route)
        assert status == 400
        check(route, status, body, f"{route} without run")
        status, body = rec.get(harness, route, run="no such run")
        assert status == 404
        check(route, status, body, f"{route} of an unknown run")


def test_timeline_routes_follow_the_schema(everything):
    """timeline and step_trace (tests/routes/test_timeline_routes.py checks their numbers) on
    every run of every shared trace: the default step, a zoomed window, the export, and
    the error bodies."""
    harness, _ = everything
    _, runs = rec.get(harness, "runs")
    answered = 0
    for run in sorted(r["run"] for r in runs["runs"]):
        status, body = rec.get(harness, "timeline", run=run, px="900")
        check("timeline", status, body, f"timeline {run}")
        if status != 200:
            continue
        answered += 1
        assert body["rects"] <= body["cap"] and body["rects"] == sum(len(lane["t0"]) for lane in body["lanes"])
        mid = body["step_us"] / 2
        status, zoom = rec.get(harness, "timeline", run=run, worker=body["worker"], span=body["span"],
                               step=str(body["step"]), t0=str(mid), t1=str(mid + 100), px="500")
        check("timeline", status, zoom, f"timeline zoom {run}")
        status, doc = rec.get(harness, "step_trace", run=run, worker=body["worker"], span=body["span"],
                              step=str(body["step"]))
        check("step_trace", status, doc, f"step_trace {run}")
    assert answered >= len(runs["runs"]) // 2
    for route in ("timeline", "step_trace"):
        for query, want in (({}, 400), ({"run": "no such run"}, 404), ({"run": runs["runs"][0]["run"], "step": "x"}, 400)):
            status, body = rec.get(harness, route, **query)
            assert status == want, (route, query, status)
            check(route, status, body, f"{route} {query}")


# ---------------------------------------------------------------------------- the frontend's fixtures


@pytest.fixture(scope="module")
def recorded():
    return json.loads((HERE / "fixtures" / "route_responses.json").read_text())


def test_fixture_responses_follow_the_schema(recorded):
    assert recorded["responses"], "no recorded responses"
    routes = set()
    for key, entry in recorded["responses"].items():
        route = key.split("?")[0]
        routes.add((route, entry["status"]))
        check(route, entry["status"], entry["body"], f"fixture {key}")
    # The fixture covers every route and every status the frontend handles.
    assert {("runs", 200), ("report", 200), ("memory", 200), ("kernels", 200),
            ("report", 202), ("report", 404), ("report", 422),
            ("timeline", 200), ("timeline", 202), ("timeline", 404), ("timeline", 422),
            ("step_trace", 200)} <= routes
    # the timeline's step selector: every step of every recorded span
    for key, entry in recorded["responses"].items():
        if key.startswith("timeline?") and "span=" in key and "step=" not in key and entry["status"] == 200:
            for st in entry["body"]["steps"]:
                if st["step"] != entry["body"]["step"]:
                    assert recorded["responses"][f"{key}&step={st['step']}"]["body"]["step"] == st["step"]
    for scenario, runs in recorded["scenarios"].items():
        check("runs", 200, runs, f"fixture scenario {scenario}")


def test_sample_report_is_a_recorded_response(recorded):
    sample = json.loads((HERE / "fixtures" / "sample_report.json").read_text())
    check("report", 200, sample, "sample_report.json")
    assert sample == recorded["responses"][rec.SAMPLE_KEY]["body"]


def project(value, schema, defs):
    """Only the parts of value the schema names as required (what the frontend reads)."""
    if isinstance(schema, dict) and "$ref" in schema:
        schema = defs[schema["$ref"].split("/")[-1]]
    if isinstance(value, dict) and isinstance(schema, dict):
        if schema.get("required"):
            props = schema.get("properties", {})
            return {k: project(value.get(k), props.get(k, {}), defs) for k in schema["required"] if k in value}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return {k: project(v, extra, defs) for k, v in value.items()}
        return value
    if isinstance(value, list) and isinstance(schema, dict) and isinstance(schema.get("items"), dict):
        return [project(v, schema["items"], defs) for v in value]
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else value
    return value


def test_fixtures_equal_what_the_backend_answers_now(recorded, tmp_path):
    """The mock cannot drift: re-record from the current backend and compare what the
    frontend reads. On failure: python tests/fixtures/record_route_fixtures.py"""
    fresh = rec.record(tmp_path)
    assert sorted(fresh["responses"]) == sorted(recorded["responses"])
    defs = SCHEMA["$defs"]
    for key, entry in recorded["responses"].items():
        now = fresh["responses"][key]
        assert now["status"] == entry["status"], key
        name = SCHEMA["x-routes"][key.split("?")[0]][str(entry["status"])]
        a = project(rec.volatile_free(entry["body"]), defs[name], defs)
        b = project(rec.volatile_free(now["body"]), defs[name], defs)
        assert a == b, (f"{key}: the recorded fixture differs from the backend's answer; "
                        "re-record with python tests/fixtures/record_route_fixtures.py")
    for scenario, runs in recorded["scenarios"].items():
        assert project(rec.volatile_free(runs), defs["runs"], defs) == \
            project(rec.volatile_free(fresh["scenarios"][scenario]), defs["runs"], defs), scenario
