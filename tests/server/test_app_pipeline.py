"""The app's pipeline where it takes shortcuts, each held to the plain way:

- routing finds a request's route by its path's shape, and must pick exactly the route (or the 404 or 405) a scan
  of every route in registration order picks;
- the worker-plane version header's accepted values are remembered, and must answer as the model's negotiation
  does, every time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_server.app import App
from reference_server.config import Settings
from reference_server.http import Request
from reference_server.server import Server
from suite.protocol.errors import Rejection
from suite.protocol.versions import negotiate_worker_version

Outcome = tuple[str, ...] | tuple[str, str, dict[str, str]] | tuple[str, list[str]]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    server = Server(Settings(db_path=str(Path(tmp_path_factory.mktemp("routing")) / "r.sqlite")))
    try:
        yield server.app
    finally:
        server.store.close()


def scan(app: App, method: str, path: str) -> Outcome:
    """Every route of the path's depth in registration order: the first one matching path and method, else 405
    with the methods of those matching the path, else 404."""
    allowed: list[str] = []
    for route in app.routes:
        if route.pattern.pattern.replace("[^/]", "").count("/") != path.count("/"):
            continue
        m = route.pattern.match(path)
        if m is None:
            continue
        if route.method != method:
            allowed.append(route.method)
            continue
        return ("route", route.name, m.groupdict())
    return ("405", sorted(set(allowed))) if allowed else ("404",)


BASE = Request.from_target("GET", "/", headers={}, body=b"")


def matched(app: App, method: str, path: str) -> Outcome:
    try:
        route, params = app._match(dataclasses.replace(BASE, method=method, path=path), "")
    except Rejection as rejection:
        return ("405", rejection.body()["allowed_methods"]) if rejection.status == 405 else ("404",)
    return ("route", route.name, params)


def literal_segments(app: App) -> list[str]:
    return sorted({seg for r in app.routes for seg in r.pattern.pattern.strip("^$").split("/") if "(?P" not in seg})


# Path segments: the routes' own literals (so most paths are near a real route), ids, and the awkward ones.
ODD = ["", "x", "id-1", "poll\n", "complete\n", "x\n", "a b", "é"]


@st.composite
def paths(draw: st.DrawFn, app: App) -> str:
    literals = literal_segments(app)
    if draw(st.booleans()):  # a route's template with its parameters filled in
        route = draw(st.sampled_from(app.routes))
        segments = route.pattern.pattern.strip("^$").split("/")
        path = "/".join(s if "(?P" not in s else draw(st.sampled_from([*ODD, *literals])) for s in segments)
    else:
        path = "/" + "/".join(draw(st.lists(st.sampled_from([*ODD, *literals]), min_size=0, max_size=7)))
    return path + draw(st.sampled_from(["", "", "\n", "/"]))


@settings(max_examples=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "HEAD"]))
def test_the_route_found_is_the_one_a_scan_of_every_route_finds(app: App, data: st.DataObject, method: str) -> None:
    path = data.draw(paths(app))
    assert matched(app, method, path) == scan(app, method, path)


@pytest.mark.parametrize(
    ("method", "path", "want"),
    [
        ("POST", "/api/worker/workflow-tasks/poll", ("route", "wt_poll", {})),
        ("POST", "/api/worker/workflow-tasks/poll\n", ("route", "wt_poll", {})),  # "$" before a final newline
        ("POST", "/api/worker/workflow-tasks/T1/complete", ("route", "wt_complete", {"task_id": "T1"})),
        ("POST", "/api/worker/workflow-tasks/poll/complete", ("route", "wt_complete", {"task_id": "poll"})),
        ("GET", "/api/worker/workflow-tasks/T1/complete", ("405", ["POST"])),
        ("POST", "/api/worker/workflow-tasks/T1/nothing", ("404",)),
        # A last segment that ends some route literally can still be another route's parameter.
        ("POST", "/api/workflows/wf/signal/complete", ("route", "signal", {"workflow_id": "wf", "name": "complete"})),
        ("GET", "/api/workflows/info", ("route", "describe", {"workflow_id": "info"})),
    ],
)
def test_examples(app: App, method: str, path: str, want: Outcome) -> None:
    assert matched(app, method, path) == want == scan(app, method, path)


def negotiated(negotiate: object, raw: str | None) -> tuple[str, object]:
    assert callable(negotiate)
    try:
        return ("minor", negotiate(raw))
    except Rejection as rejection:
        return ("rejected", (rejection.status, rejection.body()))


HEADER_VALUES = st.one_of(
    st.none(),
    st.sampled_from(["1.20", "1.8", "1.0", " 1.20 ", "\t1.19", "1.21", "2.0", "1.05", "", " ", "v1.2", "1.x"]),
    st.from_regex(r"\A[ \t]{0,3}1\.(0|[1-9][0-9]?)[ \t]{0,3}\Z"),
    st.text(max_size=8),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(HEADER_VALUES, max_size=40))
def test_a_remembered_version_answers_as_the_negotiation_does(app: App, values: list[str | None]) -> None:
    for raw in values + values:  # each value again, after it (and the others) may have been remembered
        assert negotiated(app._worker_minor, raw) == negotiated(negotiate_worker_version, raw)
    assert len(app._accepted_versions) <= 16


def test_the_remembered_values_are_bounded(app: App) -> None:
    for spaces in range(40):
        assert app._worker_minor(" " * spaces + "1.20") == 20
    assert len(app._accepted_versions) == 16
    assert negotiated(app._worker_minor, "1.21")[0] == "rejected"
