"""Faults of the request pipeline and the worker envelope: credentials, version negotiation, the order of the
pipeline's checks, registration's runtime, and what an answer carries."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from suite.protocol.errors import Rejection
from suite.protocol.versions import (
    ADVERTISED_MAJOR,
    ADVERTISED_MINOR,
    ADVERTISED_VERSION,
    format_version,
    negotiate_worker_version,
    parse_version,
)

from .. import app, workers
from ..app import CONTROL, WORKER, WORKER_VERSION_HEADER, App, Ctx, Route, namespace_of
from ..http import Request, Response, json_response
from ..routes.worker import registrations
from .patching import wraps

_HEADER = WORKER_VERSION_HEADER.lower()


@wraps("ignore-version-header", App, "negotiate")
def _any_version(original: Callable[..., int | None], self: App, route: Route, request: Request) -> int | None:
    return None if route.plane == WORKER else original(self, route, request)  # any header, or none, is served


@wraps("accept-minor-above", App, "negotiate")
def _newer_minor_served(original: Callable[..., int | None], self: App, route: Route, request: Request) -> int | None:
    asked = parse_version(request.header(_HEADER) or "")
    if route.plane == WORKER and asked is not None and asked[0] == ADVERTISED_MAJOR and asked[1] > ADVERTISED_MINOR:
        # A newer minor is served as the advertised one instead of being rejected.
        request = dataclasses.replace(request, headers={**request.headers, _HEADER: ADVERTISED_VERSION})
    return original(self, route, request)


@wraps("namespace-before-version", App, "negotiate")
def _namespace_first(original: Callable[..., int | None], self: App, route: Route, request: Request) -> int | None:
    if route.plane in (WORKER, CONTROL):  # the 404 comes before the version check's 400
        ns = namespace_of(request)
        if not self.namespace_exists(ns):
            raise Rejection(404, "namespace_not_found", f"Namespace '{ns}' does not exist.", {"namespace": ns})
    return original(self, route, request)


@wraps("version-before-auth", App, "authorize")
def _version_first(original: Callable[..., str | None], self: App, route: Route, request: Request) -> str | None:
    if route.plane == WORKER:
        negotiate_worker_version(request.header(_HEADER))  # a bad version is answered before the 401
    return original(self, route, request)


@wraps("full-token-worker-only", app, "full_token_role")
def _worker_only(original: Callable[..., str], **kwargs: Any) -> str:
    return app.ROLE_WORKER  # one token for both planes serves the worker plane alone


@wraps("echo-requested-minor", App, "answer")
def _echo_minor(
    original: Callable[..., Response], self: App, plane: str, ctx: Ctx, status: int, body: dict[str, Any]
) -> Response:
    if plane != WORKER or ctx.minor is None:
        return original(self, plane, ctx, status, body)
    echoed = format_version(ADVERTISED_MAJOR, ctx.minor)  # the requested minor, not the advertised
    envelope = {**self.worker_envelope(body), "protocol_version": echoed}
    return json_response(status, envelope, [*ctx.extra_headers, (WORKER_VERSION_HEADER, echoed)])


@wraps("bare-worker-errors", App, "reject")
def _bare_errors(original: Callable[..., Response], self: App, plane: str, rejection: Rejection) -> Response:
    if plane == WORKER:
        return json_response(rejection.status, rejection.body())  # no worker envelope on errors
    return original(self, plane, rejection)


@wraps("accept-unknown-runtime", workers, "known_runtime")
def _any_runtime(original: Callable[[object], bool], runtime: object) -> bool:
    return isinstance(runtime, str) and bool(runtime)  # any runtime string is registered


@wraps("metrics-crash-heartbeat", registrations.Routes, "worker_heartbeat")
async def _metrics_read_unchecked(
    original: Callable[..., Any], self: registrations.Routes, ctx: Ctx
) -> tuple[int, dict[str, Any]]:
    metrics = ctx.obj().get("process_metrics")
    if metrics is not None:
        dict(metrics)  # the bug: telemetry read as an object without a check; a string or a list raises (500)
    return await original(self, ctx)  # type: ignore[no-any-return]
