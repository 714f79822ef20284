"""No answer of any route names a server path: every path is relative to the logdir.

The logdir (test_plugin_routes' fixture, plus a two-rank run with one truncated rank file
and a file that is no trace) is analysed to the end (``wait_idle``), then every route the
plugin registers (``get_plugin_apps``) is asked for every selection of every run, for the
error answers too (unknown names, failed spans, missing parameters). The one path allowed
is the runs route's ``logdir``, shown as given on the command line (TensorBoard's own
/data/environment sends it too).
"""
from __future__ import annotations

import json

import pytest

from test_plugin_routes import (  # noqa: F401  (fixtures: pytest finds them by name here)
    CPU_NW0, harnesses, in_process_analysis, link, logdir, pytestmark)

DIST_RUN = "dist"  # two ranks, the second one's file cut in the middle of its JSON
TRUNCATED = "worker1.1700000000003.pt.trace.json"
DATA_ROUTES = ("report", "findings", "memory", "kernels", "operators", "timeline", "step_trace")


@pytest.fixture
def served(harnesses, logdir):
    link(logdir / DIST_RUN / CPU_NW0.name, CPU_NW0)
    data = CPU_NW0.read_bytes()
    (logdir / DIST_RUN / TRUNCATED).write_bytes(data[: len(data) // 2])
    (logdir / "cpu" / "notes.txt").write_text("not a trace\n")  # beside the traces, never listed
    h = harnesses(logdir)
    assert h.plugin.analyzer.wait_idle(120)  # every span analysed or failed: no 202 below
    return h


def _selections(runs_body):
    """(run, worker, span) of every selection the dashboard can make: each run, worker and span."""
    out = []
    for r in runs_body["runs"]:
        out.append((r["run"], None, None))
        for w in r["workers"]:
            out.append((r["run"], w["worker"], None))
            out += [(r["run"], w["worker"], s["span"]) for s in w["spans"]]
    return out


def _requests(runs_body):
    """{registered route: [(path under the plugin, query)]}: sensible queries per route."""
    picks = _selections(runs_body)
    run_names = [r["run"] for r in runs_body["runs"]]

    def query(run, worker, span, **extra):
        return {k: v for k, v in (("run", run), ("worker", worker), ("span", span)) if v} | extra

    data = {f"/{route}": [(route, query(*pick)) for pick in picks]
            + [(route, {}), (route, {"run": "no_such_run"}), (route, {"run": "cpu", "worker": "nobody"})]
            for route in DATA_ROUTES}
    data["/timeline"] += [("timeline", {"run": "cpu", "step": "999"})]
    run, worker, span = next(p for p in picks if p[0] == "cpu" and p[2])
    data["/operators"] += [("operators", {"run": run, "worker": worker, "span": span, "step": "999"})]
    compares = [{"base_run": a, "cand_run": b} for a in run_names for b in run_names]
    return {
        **data,
        "/index.js": [("index.js", {})],
        "/static/*": [("static/style.css", {}), ("static/no_such_file.js", {})],
        "/runs": [("runs", {})],
        "/ranks": [("ranks", {"run": name}) for name in run_names] + [("ranks", {"run": "no_such_run"})],
        "/compare": [("compare", q) for q in compares] + [("compare", {"base_run": "cpu", "cand_run": "nope"})],
    }


def test_no_route_answer_names_a_server_path(served, logdir, tmp_path):
    h = served
    runs_body = h.json("runs")
    assert runs_body["logdir"] == str(logdir)
    registered = set(h.plugin.get_plugin_apps())
    requests = _requests(runs_body)
    assert set(requests) == registered, "a route without requests here: add its queries"

    forbidden = {str(logdir), str(logdir.resolve()), str(tmp_path), str(tmp_path.resolve())}
    seen_status = set()
    leaks = []
    for route in sorted(registered):
        for path, query in requests[route]:
            resp = h.get(path, **query)
            assert resp.status_code < 500 and resp.status_code != 202, (path, query, resp.status_code)
            seen_status.add(resp.status_code)
            text = resp.get_data(as_text=True)
            if path == "runs":  # the logdir as given is the one path this answer may carry
                body = json.loads(text)
                body.pop("logdir")
                text = json.dumps(body)
            text += json.dumps(dict(resp.headers))  # the download's file name too
            leaks += [f"{path}?{query}: {bad}" for bad in forbidden if bad in text]
    assert not leaks, leaks
    assert {200, 400, 404, 422} <= seen_status  # the error answers were asked for too

    # the case that once leaked: /ranks' file_errors name the truncated rank as /report does
    ranks = h.json("ranks", run=DIST_RUN)
    report = h.json("report", run=DIST_RUN)
    assert [e["error"] for e in ranks["file_errors"]] == [e["error"] for e in report["file_errors"]]
    assert ranks["file_errors"][0]["error"].startswith(f"{DIST_RUN}/{TRUNCATED}: JSON ends early")
    assert report["file_errors"][0]["file"] == f"{DIST_RUN}/{TRUNCATED}"
