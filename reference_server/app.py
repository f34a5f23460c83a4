"""The pure handler: ``App.handle(request) -> response``.

The pipeline every request goes through, in the order the protocol pins (docs/reference.md: Auth) so a caller cannot
learn whether a namespace exists from the status code:

1. route lookup (404 ``route_not_found`` / 405 ``method_not_allowed``);
2. authentication — 401 ``unauthorized``;
3. role — 403 ``forbidden``;
4. protocol version header — 400 (worker or control plane);
5. namespace existence — 404 ``namespace_not_found``;
6. body parsing and validation — 400 / 415 / 422;
7. the domain operation, which raises :class:`Rejection` for every protocol rejection.

Every ``/api/worker/*`` response, success or error, carries the worker envelope (§2.1); control-plane
responses carry the control-plane header and never the worker envelope.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from suite.protocol.capabilities import server_capabilities
from suite.protocol.commands import validation_failed
from suite.protocol.errors import Rejection
from suite.protocol.versions import (
    ADVERTISED_VERSION,
    CONTROL_PLANE_VERSION,
    negotiate_control_plane_version,
    negotiate_worker_version,
)

from .http import Request, Response, ShellError, encoded_json_response, json_bytes, json_response

__all__ = ["CONTROL_VERSION_HEADER", "WORKER_VERSION_HEADER", "App", "Ctx", "Route", "route"]

log = logging.getLogger(__name__)

WORKER_VERSION_HEADER = "X-Durable-Workflow-Protocol-Version"
CONTROL_VERSION_HEADER = "X-Durable-Workflow-Control-Plane-Version"

WORKER = "worker"
CONTROL = "control"
OPEN = "open"  # health, ready: no auth, no headers
DISCOVERY = "discovery"  # cluster/info: any authenticated role, exempt from version headers and namespaces

ROLE_WORKER = "worker"
ROLE_OPERATOR = "operator"
ROLE_ADMIN = "admin"
# AUTH-FULL-ACCESS-TOKEN: what the full-access token authenticates as — every role, on every plane.
ROLE_FULL = "full_access"


@dataclass
class Ctx:
    """Everything a route function needs about one request."""

    request: Request
    params: dict[str, str]
    namespace: str
    body: Any = None
    role: str | None = None
    minor: int | None = None
    extra_headers: list[tuple[str, str]] = field(default_factory=list)

    def obj(self) -> dict[str, Any]:
        """The body as a JSON object; anything else is a 422 (checked before the route runs)."""
        assert isinstance(self.body, dict)
        return self.body


RouteFn = Callable[[Ctx], Awaitable[tuple[int, dict[str, Any]]]]
_F = TypeVar("_F", bound=Callable[..., Any])


def route(method: str, *templates: str, plane: str | None = None, body: bool | None = None) -> Callable[[_F], _F]:
    """Mark a method of a route group as the handler of ``method`` on each of ``templates``.

    :meth:`App.mount` registers the marked methods of a group, in the order they are defined; ``plane``
    overrides the plane the group is mounted on (a discovery route in the open group); ``body=True`` parses
    a JSON object body on a method other than POST (the SDK's DELETE of a worker session carries one).
    """

    def mark(fn: _F) -> _F:
        fn.__dict__.setdefault(_ROUTES_ATTR, []).extend((method, template, plane, body) for template in templates)
        return fn

    return mark


_ROUTES_ATTR = "__routes__"


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    plane: str
    fn: RouteFn
    roles: frozenset[str]
    body: bool  # a JSON object body is expected (POST routes)
    name: str


# How many accepted worker-plane version header values are remembered: "1.20", "1.8", " 1.20 " … A bound, so a
# fuzzer sending a new valid spelling each time cannot grow the map without limit.
_ACCEPTED_VERSIONS_KEPT = 16


def compile_path(template: str) -> re.Pattern[str]:
    """``/api/workflows/{workflow_id}`` → a regex with named groups; a segment never spans a ``/``."""
    out = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>[^/]+)", template)
    return re.compile(f"^{out}$")


class App:
    """Routes requests to route functions and applies the cross-cutting protocol rules."""

    def __init__(
        self,
        *,
        worker_token: str | None,
        operator_token: str | None,
        admin_token: str | None,
        auth_token: str | None = None,
        auth_token_admin_beside_roles: bool = False,
        namespace_exists: Callable[[str], bool],
    ) -> None:
        self.routes: list[Route] = []
        self._accepted_versions: dict[str, int] = {}  # worker-plane header value → its negotiated minor
        # The routes a path can match, by its shape, in registration order (as in ``routes``). A path parameter
        # never spans a "/", so only the routes with as many "/" as the path can match it; of those, a path whose
        # last segment ends some route literally can match those routes and the ones ending in a parameter (key:
        # that segment), any other path only the latter (key: None).
        self._routes_by_shape: dict[tuple[int, str | None], list[Route]] = {}
        self._route_shapes: list[tuple[Route, int, str | None]] = []
        self.tokens: dict[str, str] = {}
        for role, token in (
            (ROLE_WORKER, worker_token),
            (ROLE_OPERATOR, operator_token),
            (ROLE_ADMIN, admin_token),
        ):
            if token:
                self.tokens[token] = role
        if auth_token:
            # §4.1: upstream's legacy DW_AUTH_TOKEN "grants full access when no role tokens are configured, and only
            # admin when they are". By default it grants full access in both cases, so a client configured with one
            # token for both planes keeps working when role tokens are added (docs/reference-server.md, "Deliberate
            # deviations"); ``auth_token_admin_beside_roles`` follows upstream.
            self.tokens[auth_token] = full_token_role(
                admin_beside_roles=bool(auth_token_admin_beside_roles and self.tokens)
            )
        self.namespace_exists = namespace_exists
        self.advertise(server_capabilities())

    @property
    def capabilities(self) -> dict[str, Any]:
        """What every worker-plane response and cluster/info advertise (§2.1); set by :meth:`advertise`."""
        return self._capabilities

    def advertise(self, capabilities: dict[str, Any]) -> None:
        """Advertise ``capabilities`` from now on; the dict must not change afterwards. It is encoded here, once:
        the same few kilobytes close every worker-plane response, and encoding them again for each one was a
        good part of a request's cost."""
        self._capabilities = capabilities
        self._capabilities_member = b',"server_capabilities":' + json_bytes(capabilities) + b"}"

    # -- registration ---------------------------------------------------------------------------------

    def add(
        self,
        method: str,
        template: str,
        plane: str,
        fn: RouteFn,
        *,
        roles: frozenset[str] | None = None,
        body: bool | None = None,
    ) -> None:
        if roles is None:
            roles = {
                WORKER: frozenset({ROLE_WORKER}),
                CONTROL: frozenset({ROLE_OPERATOR, ROLE_ADMIN}),
                DISCOVERY: frozenset({ROLE_WORKER, ROLE_OPERATOR, ROLE_ADMIN}),
                OPEN: frozenset(),
            }[plane]
        route = Route(
            method,
            compile_path(template),
            plane,
            fn,
            roles,
            body if body is not None else method == "POST",
            fn.__name__,
        )
        self.routes.append(route)
        last = template.rsplit("/", 1)[-1]
        self._route_shapes.append((route, template.count("/"), None if "{" in last else last))
        self._routes_by_shape = _index_by_shape(self._route_shapes)

    def mount(self, plane: str, group: object) -> None:
        """Register every method of ``group`` marked with :func:`route`, in definition order."""
        for name, fn in vars(type(group)).items():
            for method, template, own_plane, body in getattr(fn, _ROUTES_ATTR, ()):
                self.add(method, template, own_plane or plane, getattr(group, name), body=body)

    # -- envelopes ------------------------------------------------------------------------------------

    def worker_envelope(self, body: dict[str, Any]) -> dict[str, Any]:
        # §2.1: the advertised version, never the requested minor; the same object as cluster/info.
        return {**body, "protocol_version": ADVERTISED_VERSION, "server_capabilities": self.capabilities}

    def worker_json(self, body: dict[str, Any]) -> bytes:
        """:meth:`worker_envelope` of ``body`` as JSON, with the capabilities encoded once (:meth:`advertise`):
        ``body``'s members, then ``protocol_version``, then ``server_capabilities``."""
        if "server_capabilities" in body:  # named by the body itself: overridden in its place, as the dict does
            return json_bytes(self.worker_envelope(body))
        members = json_bytes({**body, "protocol_version": ADVERTISED_VERSION})
        return members[:-1] + self._capabilities_member  # the object's closing brace comes after the capabilities

    def respond(
        self, plane: str, status: int, body: dict[str, Any], extra: list[tuple[str, str]] | None = None
    ) -> Response:
        headers = list(extra or [])
        if plane == WORKER:
            headers.append((WORKER_VERSION_HEADER, ADVERTISED_VERSION))
            return encoded_json_response(status, self.worker_json(body), headers)
        if plane == CONTROL:
            headers.append((CONTROL_VERSION_HEADER, CONTROL_PLANE_VERSION))
        return json_response(status, body, headers)

    def reject(self, plane: str, rejection: Rejection) -> Response:
        return self.respond(plane, rejection.status, rejection.body())

    def plane_of(self, path: str | None) -> str:
        if path is None:
            return OPEN
        if path.startswith("/api/worker/") or path == "/api/worker":
            return WORKER
        if path in ("/api/health", "/api/ready", "/api/cluster/info"):
            return OPEN
        if path.startswith("/api/"):
            return CONTROL
        return OPEN

    def shell_error(self, error: ShellError) -> Response:
        """Errors the HTTP shell detects itself (413, 431, 400 framing) still get the right envelope."""
        body = {"reason": error.reason, "error": error.message, "message": error.message}
        return self.respond(self.plane_of(error.path), error.status, body)

    # -- the pipeline ---------------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        plane = self.plane_of(request.path)
        try:
            return await self._handle(request, plane)
        except Rejection as rejection:
            return self.reject(plane, rejection)

    def _match(self, request: Request, plane: str) -> tuple[Route, dict[str, str]]:
        allowed: list[str] = []
        path = request.path
        # A pattern's "$" also matches before a final newline (a decoded "%0A"): that path has the shape of the one
        # without it.
        last = path[path.rfind("/") + 1 :].removesuffix("\n")
        depth = path.count("/")
        candidates = self._routes_by_shape.get((depth, last)) or self._routes_by_shape.get((depth, None), [])
        for route in candidates:
            m = route.pattern.match(path)
            if m is None:
                continue
            if route.method != request.method:
                allowed.append(route.method)
                continue
            return route, m.groupdict()
        if allowed:
            raise Rejection(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {request.path}.",
                {"allowed_methods": sorted(set(allowed))},
            )
        raise Rejection(404, "route_not_found", f"No route for {request.method} {request.path}.")

    def _worker_minor(self, raw: str | None) -> int:
        """:func:`negotiate_worker_version` of a worker-plane header value, remembered for the few values that
        were accepted (a worker sends the same one on every request); a rejected one is negotiated each time."""
        minor = self._accepted_versions.get(raw) if raw is not None else None
        if minor is None:
            minor = negotiate_worker_version(raw)
            if raw is not None and len(self._accepted_versions) < _ACCEPTED_VERSIONS_KEPT:
                self._accepted_versions[raw] = minor
        return minor

    def _authenticate(self, request: Request) -> str | None:
        """The caller's role, or None for "full access" when no tokens are configured (§4.1 driver none)."""
        if not self.tokens:
            return None
        header = request.header("authorization") or ""
        scheme, _, token = header.partition(" ")
        role = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if role is None:
            raise Rejection(401, "unauthorized", "Invalid or missing authentication token.")
        return role

    async def _handle(self, request: Request, plane: str) -> Response:
        route, params = self._match(request, plane)
        role = self.authorize(route, request)
        minor = self.negotiate(route, request)
        namespace = namespace_of(request)
        if route.plane in (WORKER, CONTROL) and not self.namespace_exists(namespace):
            raise Rejection(
                404,
                "namespace_not_found",
                f"Namespace '{namespace}' does not exist.",
                {
                    "namespace": namespace,
                    "remediation": "Create the namespace or send an existing one in X-Namespace.",
                },
            )
        ctx = Ctx(request=request, params=params, namespace=namespace, role=role, minor=minor)
        if route.body:
            ctx.body = parse_json_object(request)
        status, body = await route.fn(ctx)
        return self.answer(route.plane, ctx, status, body)

    def authorize(self, route: Route, request: Request) -> str | None:
        """§4.1, first in the pipeline: the caller's role (None: auth is off), refused when the route does not
        admit it."""
        if route.plane == OPEN:
            return None
        role = self._authenticate(request)
        if role is not None and role != ROLE_FULL and role not in route.roles:
            raise Rejection(
                403,
                "forbidden",
                "Authenticated role is not allowed to access this endpoint.",
                {"role": role, "allowed_roles": sorted(route.roles)},
            )
        return role

    def negotiate(self, route: Route, request: Request) -> int | None:
        """§2.2, after auth and before the namespace: the worker plane's negotiated minor (None on the other
        planes), or the version's rejection; the control plane's header is checked too."""
        if route.plane == WORKER:
            return self._worker_minor(request.header(WORKER_VERSION_HEADER.lower()))
        if route.plane == CONTROL:
            negotiate_control_plane_version(request.header(CONTROL_VERSION_HEADER.lower()))
        return None

    def answer(self, plane: str, ctx: Ctx, status: int, body: dict[str, Any]) -> Response:
        """A route's answer on its plane (:meth:`respond`, with the headers the route added)."""
        return self.respond(plane, status, body, ctx.extra_headers)


def full_token_role(*, admin_beside_roles: bool) -> str:
    """The role of §4.1's full-access token: every role on both planes, or admin alone where upstream's rule is
    followed and role tokens exist."""
    return ROLE_ADMIN if admin_beside_roles else ROLE_FULL


def _index_by_shape(shapes: list[tuple[Route, int, str | None]]) -> dict[tuple[int, str | None], list[Route]]:
    """The candidates of each path shape (:attr:`App._routes_by_shape`): a path ending in a segment that some
    route of its depth ends in literally can match those routes and the ones ending in a parameter; any other
    path only the latter. Every route a path's regex could match is among its shape's candidates, in order."""
    index: dict[tuple[int, str | None], list[Route]] = {}
    for depth in {d for _, d, _ in shapes}:
        same = [(route, last) for route, d, last in shapes if d == depth]
        for literal in {last for _, last in same}:
            index[(depth, literal)] = [route for route, last in same if last is None or last == literal]
    return index


def namespace_of(request: Request) -> str:
    """§4.2: X-Namespace, then ?namespace=, then "default"; lower-cased."""
    raw = request.header("x-namespace") or request.query.get("namespace") or "default"
    return raw.strip().lower() or "default"


def parse_json_object(request: Request) -> dict[str, Any]:
    """A JSON object body. An empty body counts as ``{}``: every POST body field is optional at this
    layer and the route's own validation names what is missing."""
    raw = request.body
    if not raw.strip():
        return {}
    content_type = (request.header("content-type") or "application/json").split(";")[0].strip().lower()
    if content_type not in ("application/json", "") and not content_type.endswith("+json"):
        raise Rejection(415, "unsupported_media_type", f"Content-Type {content_type!r} is not application/json.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejection(400, "malformed_json", f"The body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        doc = _BODY_DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise Rejection(400, "malformed_json", f"The body is not valid JSON: {exc}.") from None
    if _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(doc):
        # RFC 8259 §8.2: a "\ud800" escape with no partner is no Unicode text; it cannot reach UTF-8 storage.
        raise Rejection(400, "malformed_json", "The body holds a lone UTF-16 surrogate escape (e.g. \\ud800).")
    if not isinstance(doc, dict):
        raise Rejection(
            422,
            "validation_failed",
            "The body must be a JSON object.",
            {
                "errors": {"body": ["must be a JSON object"]},
                "validation_errors": {"body": ["must be a JSON object"]},
            },
        )
    return doc


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(doc: Any) -> bool:
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except RecursionError:  # too deep to re-encode here; the route's own validation decides
        return False
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON (RFC 8259 §6). One decoder for every body: json.loads builds a new one per call
# when given an option.
_BODY_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


validation_error = validation_failed
"""422 ``validation_failed`` with the per-field errors (the model's, so server and checks share it)."""
