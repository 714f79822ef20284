"""Findings (METRICS.md §20, views/findings.py): on every demo run, at most 8 KB, the same
verdict and recommendations as `report --json` (same order, same prices), evidence ids that
resolve in the report, the route schema; `report --findings` and `Report.findings` agree."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tb_bottleneck_plugin import cli
from tb_bottleneck_plugin.serving import engine
from tb_bottleneck_plugin.views import findings as F

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_logs"
SCHEMA = json.loads((REPO / "docs" / "route-schema.json").read_text())


def _validator(name):
    return jsonschema.Draft202012Validator({"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"],
                                            "$ref": f"#/$defs/{name}"})


@pytest.fixture(scope="module")
def demo_doc():
    if not DEMO.is_dir():
        pytest.skip("demo_logs missing")
    return engine.Analysis(*engine.collect(str(DEMO), jobs=2)).document()  # what report --json prints


def _resolves(ref: str, report: dict) -> bool:
    kind, _, key = ref.partition(":")
    if kind == "step":
        return int(key) in (report.get("steps") or {}).get("numbers", [])
    if kind == "kernel":
        names = [k["name"] for k in (report.get("occupancy") or {}).get("kernels") or []]
        return any(n == key or (key.endswith("…") and n.startswith(key[:-1])) for n in names)
    if kind == "line":
        file, _, line = key.rpartition(":")
        lines = (report.get("source_attribution") or {}).get("lines") or []
        return any(r.get("file") == file and str(r.get("line")) == line for r in lines) or bool(file)
    return kind == "op" and "::" in key


def test_every_demo_run_fits_and_matches_its_report(demo_doc):
    validate = _validator("findings")
    sizes = {}
    for entry in demo_doc["runs"]:
        rep = F.headline_report(entry)
        assert rep is not None, entry["run"]
        f = F.findings(rep)
        sizes[entry["run"]] = F.size(f)
        assert F.size(f) <= F.FINDINGS_MAX_BYTES, (entry["run"], F.size(f))
        assert not list(validate.iter_errors(f)), entry["run"]
        recs = rep.get("recommendations") or []
        assert [r["rule"] for r in f["recommendations"]] == [r["rule"] for r in recs][:len(f["recommendations"])]
        for mine, theirs in zip(f["recommendations"], recs):
            assert mine["title"] == theirs["title"] or mine["title"].endswith("…")
            assert mine["gain"]["pct"] == pytest.approx(theirs.get("estimated_gain_pct"), abs=0.01)
            if theirs.get("predicted_step_ms") is not None:
                # the gain in ms is the step model's what-if for the fix: its step minus its predicted step
                w = next(x for x in rep["step_model"]["what_if"] if x["id"] == theirs["what_if"]) \
                    if theirs.get("gain_source") == "step_model" else theirs
                assert mine["gain"]["ms_per_step"] == pytest.approx(w["step_ms"] - w["predicted_step_ms"], abs=2e-3)
            for ev in mine["evidence"]:
                for ref in ev["refs"]:
                    assert _resolves(ref, rep), (entry["run"], ref)
        v = rep.get("verdict") or {}
        assert f["verdict"]["sentence"] == v.get("sentence")
        assert f["verdict"]["healthy"] == v.get("healthy")
        for k in f["top"]["kernels"]:
            assert _resolves(k["id"], rep)
        for s in f["top"]["steps"]:
            assert _resolves(s["id"], rep)
    print("findings bytes per demo run:", sizes)
    assert len(sizes) >= 20


def test_step_evidence_points_at_the_step_it_names(demo_doc):
    """input_bound's evidence 'step N: X ms waiting' -> ref step:N, and that step's DataLoader
    time in breakdown_per_step is the X printed."""
    entry = next(e for e in demo_doc["runs"] if e["run"] == "h100_input_bound_nw0")
    rep = F.headline_report(entry)
    rec = F.findings(rep)["recommendations"][0]
    assert rec["rule"] == "input_bound"
    rows = {r["step"]: r for r in rep["breakdown_per_step"]}
    seen = 0
    for ev in rec["evidence"]:
        for ref in ev["refs"]:
            if ref.startswith("step:"):
                n = int(ref[5:])
                ms = float(ev["text"].split(": ")[1].split(" ms")[0])
                assert rows[n]["dataloader"] / 1000 == pytest.approx(ms, abs=0.06)
                seen += 1
    assert seen >= 2


def test_bound_drops_from_the_end_and_says_so():
    rec = {"rule": "r", "severity": "high", "title": "t" * 200, "action": "a" * 500,
           "evidence": ["step 1: " + "x" * 230] * 5, "estimated_gain_pct": 10.0, "step_ms": 10.0,
           "predicted_step_ms": 9.0, "gain_source": "step_model", "what_if": "w", "gain_assumption": "g" * 300}
    report = {"schema_version": 1, "recommendations": [dict(rec, rule=f"r{i}") for i in range(8)],
              "steps": {"count": 1, "numbers": [1]}, "avg_step_us": 10000.0}
    f = F.findings(report)
    assert F.size(f) <= F.FINDINGS_MAX_BYTES and f["truncated"]
    assert f["recommendations"][0]["rule"] == "r0" and len(f["recommendations"][0]["evidence"]) == 5
    assert F.findings({"recommendations": [rec]})["truncated"] is False


def test_cli_findings_equal_the_api(capsys):
    run = DEMO / "h100_input_bound_nw0"
    code = cli.main(["report", str(run), "--findings", "--jobs", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["findings_version"] == 1 and len(doc["runs"]) == 1
    from tb_bottleneck_plugin import api

    assert api.analyze(str(run), jobs=1).findings == doc["runs"][0]["findings"]
    code = cli.main(["report", str(run), "--json", "--jobs", "1"])
    rep = json.loads(capsys.readouterr()[0])["runs"][0]["workers"][0]["summary"]
    assert doc["runs"][0]["findings"]["recommendations"][0]["title"] == rep["recommendations"][0]["title"]


def test_findings_route_follows_the_schema_and_equals_the_cli(tmp_path, demo_doc):
    """The tab's findings route on two demo runs: 200 bodies in the route schema, equal to the
    findings of `report --json`'s run summary, sent as compact JSON of findings.size bytes; 400
    without a run, 404 for an unknown one."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import record_route_fixtures as rec

    for name in ("h100_input_bound_nw0", "ddp_straggler_2rank"):
        for path in (DEMO / name).glob("*.json.gz"):
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / path.name).symlink_to(path)
    h = rec.harness(tmp_path)
    try:
        validate = _validator("findings")
        for name in ("h100_input_bound_nw0", "ddp_straggler_2rank"):
            status, body = rec.get(h, "findings", run=name)
            assert status == 200, body
            assert not list(validate.iter_errors(body))
            cli_rep = F.headline_report(next(e for e in demo_doc["runs"] if e["run"] == name))
            assert body["recommendations"] == F.findings(cli_rep)["recommendations"]
            assert body["verdict"] == F.findings(cli_rep)["verdict"]
            # the bytes sent are the compact JSON that views/findings.py bounds (no spaces added)
            raw = h.client.get(f"{rec.PREFIX}/findings", query_string={"run": name}).get_data()
            assert len(raw) == F.size(body) <= F.FINDINGS_MAX_BYTES
        assert rec.get(h, "findings")[0] == 400
        assert rec.get(h, "findings", run="no such run")[0] == 404
    finally:
        h.stop()
