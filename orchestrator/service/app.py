"""The REST service: a Ray Serve deployment with a FastAPI app, in front of the named orchestrator actor.

The deployment holds no state of its own: every request is one call to the orchestrator actor
(``dso-orchestrator`` in namespace ``trinity-dso`` by default), found by name and looked up
again when it has been restarted. OpenAPI is served at ``/openapi.json``, browsable at ``/docs``
(Swagger UI) and ``/redoc``, whose scripts are served by the app itself (``fastapi-offline``):
the pages work on a cluster without internet access.

Endpoints (mutating ones need ``Authorization: Bearer <token>`` when a token is configured):

=========================  =============================================================
``GET /healthz``           200 when the orchestrator actor answers, else 503
``GET /v1/policy``         the resampling policy and its revision (``ETag: "<revision>"``)
``PUT /v1/policy``         replace the whole policy (every field; one left out is refused)
``PATCH /v1/policy``       change some fields (``filter`` merged key by key)
``GET /v1/stats``          live counters (``OrchestratorCore.stats()``)
``GET /v1/tasks/{id}``     one task's history, pass-rate estimate, next eligible epoch
``POST /v1/replenish/pause``   stop starting replenish rounds (a policy change)
``POST /v1/replenish/resume``  start them again
``GET /metrics``           Prometheus text format (see :mod:`orchestrator.service.metrics`)
``GET /dashboard``         the live page of the run (see :mod:`orchestrator.service.dashboard`)
=========================  =============================================================

Policy writes: each accepted change bumps the revision, is logged (by the actor and here,
with the client address) and applies from the next round. ``If-Match: "<revision>"`` makes
the write conditional: a stale revision gets 409 and changes nothing. A change of a field that an
attached Trinity run has pinned (``group_size``, ``target_groups``: its trainer's batch size is built
from them) gets 409 ``policy_pinned`` naming the field, and changes nothing. Invalid values get 422
naming the field; malformed JSON 400; an oversized body 413; a body on a wrong content type
415. Errors have one shape, :class:`ErrorResponse`.

Run it with :func:`build_app` (also the ``import_path`` of Serve config files and KubeRay's
RayService: ``orchestrator.service.serve:build_app``), or ``trinity-dso serve``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.core.errors import describe_errors, field_path, short_repr
from orchestrator.core.policy import InvalidPolicyError, valid_fields_hint
from orchestrator.core.stats import Stats, TaskStats
from orchestrator.core.types import UnknownTaskError
from orchestrator.service.api import (
    ErrorResponse,
    Health,
    PolicyPatch,
    PolicyReplace,
    PolicyState,
    ServiceSettings,
)
from orchestrator.service.dashboard import dashboard_router
from orchestrator.service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from orchestrator.service.names import OrchestratorUnavailable, PinnedPolicyError, PolicyConflictError

log = logging.getLogger("trinity_dso.rest")

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# --------------------------------------------------------------------------- actor client


class ActorClient:
    """Calls the named orchestrator actor, looking it up again by name when its handle fails.

    A read (``ping``, ``get_policy``, ``get_stats``, ...) that meets a dead or restarting actor
    is retried on a fresh lookup for up to ``restart_wait_s`` seconds; a write is sent again only
    to an actor created anew under the name, never to the restarting one it failed on (it may
    have been applied). Then :class:`OrchestratorUnavailable` (503 with ``Retry-After``).
    """

    READS = frozenset({"ping", "get_policy", "get_stats", "task_history", "metrics_text"})

    def __init__(self, name: str, namespace: str, timeout_s: float, restart_wait_s: float = 5.0):
        self.name, self.namespace, self.timeout_s, self.restart_wait_s = name, namespace, timeout_s, restart_wait_s
        self._handle = None

    def _resolve(self):
        import ray

        if self._handle is None:
            try:
                self._handle = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                raise OrchestratorUnavailable(
                    f"orchestrator actor {self.name!r} not found in namespace {self.namespace!r}"
                ) from None
        return self._handle

    async def call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        import ray.exceptions as rex

        timeout = timeout_s or self.timeout_s
        deadline = asyncio.get_running_loop().time() + min(self.restart_wait_s, timeout)
        failed_on: str | None = None  # the actor a write failed on
        while True:
            handle = None
            try:
                handle = self._resolve()
                if failed_on is not None and handle._actor_id.hex() == failed_on:
                    raise OrchestratorUnavailable("restarting (a write is not sent again to the actor it failed on)")
                ref = getattr(handle, method).remote(*args, **kwargs)
                return await asyncio.wait_for(ref, timeout)
            except (rex.RayActorError, rex.ActorUnavailableError, OrchestratorUnavailable) as err:
                self._handle = None  # restarted, or created again under the same name: look it up again
                # a read is retried until the deadline; a write once, and only on an actor created anew
                # under the name (the dead one cannot have applied it twice)
                retry = method in self.READS or (failed_on is None and handle is not None
                                                 and not isinstance(err, OrchestratorUnavailable))
                if not retry or asyncio.get_running_loop().time() >= deadline:
                    why = str(err) if isinstance(err, OrchestratorUnavailable) else f"{type(err).__name__} (restarting?)"
                    raise OrchestratorUnavailable(f"orchestrator actor {self.name!r} is unavailable: {why}") from None
                if method not in self.READS:
                    failed_on = handle._actor_id.hex()
                else:
                    await asyncio.sleep(0.2)
            except TimeoutError:
                raise TimeoutError(f"orchestrator actor {self.name!r} did not answer {method} within {timeout} s") from None


# --------------------------------------------------------------------------- the app


def _hints(method: str, errors: list[dict]) -> list[str]:
    """What the usual mistakes behind a 422 of ``/v1/policy`` should have been (said before the errors)."""
    unknown = [e["loc"][-1] for e in errors if e["type"] == "extra_forbidden" and e["loc"]]
    hints = []
    if {"policy", "revision"} & set(unknown):
        hints.append('send the "policy" object of GET /v1/policy, not its whole body')
    if dotted := [k for k in unknown if isinstance(k, str) and "." in k]:
        parent, _, child = dotted[0].partition(".")
        hints.append(f'nested fields are objects: {{"{parent}": {{"{child}": ...}}}}, not "{dotted[0]}"')
    if method == "PUT" and any(e["type"] == "missing" for e in errors):
        hints.append('PUT replaces the whole policy: send every field (the "policy" object of GET /v1/policy, '
                     'without its "revision"), or PATCH the ones to change')
    return hints


def _error(status: int, kind: str, message: str, detail: list | None = None, headers: dict | None = None) -> JSONResponse:
    body = ErrorResponse(error=kind, message=message, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


_HTTP_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 503: "unavailable", 504: "timeout"}


class Guard:
    """ASGI middleware run before routing: bearer token on mutating requests, body size and type.

    Checking here (not in a route dependency) means an unauthenticated request is refused
    before its body is read or parsed.
    """

    def __init__(self, app: Any, token: str | None, max_body_bytes: int):
        self.app, self.token, self.max_body_bytes = app, token, max_body_bytes

    @staticmethod
    async def _reply(scope: dict, receive: Any, send: Any, status: int, kind: str, message: str,
                     headers: dict | None = None) -> None:
        await _error(status, kind, message, headers=headers)(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.token is not None:
            auth = headers.get("authorization")
            if not auth:
                return await self._reply(scope, receive, send, 401, "unauthorized", "Authorization: missing bearer token (send 'Authorization: Bearer <token>')",
                                              {"WWW-Authenticate": 'Bearer realm="trinity-dso"'})
            scheme, _, value = auth.strip().partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                return await self._reply(scope, receive, send, 401, "unauthorized", "Authorization: expected 'Bearer <token>'",
                                              {"WWW-Authenticate": 'Bearer realm="trinity-dso"'})
            if not hmac.compare_digest(value.strip().encode(), self.token.encode()):
                return await self._reply(scope, receive, send, 403, "forbidden", "Authorization: bearer token rejected")
        length = headers.get("content-length")
        if length is not None:
            if re.fullmatch(r"[0-9]{1,18}", length) is None:
                return await self._reply(scope, receive, send, 400, "bad_request", f"Content-Length: not a number ({short_repr(length)})")
            if int(length) > self.max_body_bytes:
                return await self._reply(scope, receive, send, 413, "payload_too_large",
                                              f"body: {length} bytes exceeds the limit of {self.max_body_bytes} bytes")
            has_body = int(length) > 0
        else:
            has_body = "chunked" in headers.get("transfer-encoding", "")
        ctype = headers.get("content-type", "")
        if has_body and ctype.split(";")[0].strip().lower() not in ("application/json", ""):
            return await self._reply(scope, receive, send, 415, "unsupported_media_type", f"Content-Type: expected application/json, got {ctype!r}")

        received = 0
        limit = self.max_body_bytes

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"body: more than the limit of {limit} bytes")
            return message

        await self.app(scope, limited_receive, send)


_REVISION = re.compile(r'(?:W/)?"?([0-9]{1,18})"?')
IF_MATCH_PATTERN = r'^\s*(\*|(W/)?"?[0-9]{1,18}"?)\s*$'
"""``If-Match`` as documented in OpenAPI: ``*`` or one revision (a value outside it gets 422)."""


def _if_match(value: str | None) -> int | None:
    """The revision in an ``If-Match`` header (``"3"``, ``W/"3"``, ``3``); None for ``*`` or absent.

    Only ASCII digits count (``str.isdigit`` also accepts superscripts, which ``int`` refuses).
    Raises:
        HTTPException: 400 for anything else, the header value echoed cut to 80 characters.
    """
    if value is None or value.strip() == "*":
        return None
    m = _REVISION.fullmatch(value.strip())
    if m is None:
        raise HTTPException(400, f"If-Match: expected one revision such as '\"3\"', got {short_repr(value)}")
    return int(m.group(1))


_BEARER = HTTPBearer(auto_error=False, description="Required on mutating endpoints when the service has a token.")
BearerAuth = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
"""Documents the bearer scheme in OpenAPI; :class:`Guard` enforces it before routing."""


def create_app(settings: ServiceSettings | None = None, client: ActorClient | None = None) -> FastAPI:
    """The FastAPI app (built in each Serve replica; also runnable with any ASGI server)."""
    settings = settings or ServiceSettings()
    client = client or ActorClient(settings.actor_name, settings.namespace, settings.actor_timeout_s,
                                   settings.actor_restart_wait_s)
    token = settings.token()
    app = FastAPIOffline(  # /docs and /redoc with their scripts served here, not from a CDN
        title="trinity-dso orchestrator",
        version="1",
        description="Read and change the dynamic-sampling (resampling) policy of a running orchestrator; live stats.",
        responses={k: {"model": ErrorResponse} for k in (400, 401, 403, 413, 503, 504)},
    )
    app.add_middleware(Guard, token=token, max_body_bytes=settings.max_body_bytes)

    # ---------------------------------------------------------------- errors
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        if any(e["type"] == "json_invalid" for e in errors):
            e = next(e for e in errors if e["type"] == "json_invalid")
            return _error(400, "invalid_json", f"body: malformed JSON ({e['msg']}, at {field_path(e['loc'][1:]) or 'start'})", errors)
        located = [{**e, "loc": e["loc"][1:] if e["loc"][:1] == ["body"] else e["loc"]}
                   | ({"input": raw["input"]} if "input" in raw and raw["type"] != "extra_forbidden" else {})
                   for e, raw in zip(errors, exc.errors())]  # values quoted (truncated); an unknown key gets the valid ones
        return _error(422, "validation", "".join(h + ". " for h in _hints(request.method, located))
                      + describe_errors(located, root="body") + valid_fields_hint(located), errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:  # one route per method: Starlette's Allow names only the first route's
            path = request.scope.get("path", "")
            allowed = {m for r in app.router.routes if getattr(r, "path_regex", None) is not None
                       and r.path_regex.match(path) for m in (getattr(r, "methods", None) or ())}
            headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
        return _error(exc.status_code, _HTTP_KINDS.get(exc.status_code, "error"), str(exc.detail), headers=headers)

    @app.exception_handler(InvalidPolicyError)
    async def _invalid(request: Request, exc: InvalidPolicyError) -> JSONResponse:
        return _error(422, "invalid_policy", _cause(exc), getattr(_original(exc), "errors", None))

    @app.exception_handler(PinnedPolicyError)
    async def _pinned(request: Request, exc: PinnedPolicyError) -> JSONResponse:
        return _error(409, "policy_pinned", _cause(exc))

    @app.exception_handler(PolicyConflictError)
    async def _conflict(request: Request, exc: PolicyConflictError) -> JSONResponse:
        return _error(409, "conflict", _cause(exc))

    @app.exception_handler(OrchestratorUnavailable)
    async def _unavailable(request: Request, exc: OrchestratorUnavailable) -> JSONResponse:
        return _error(503, "unavailable", str(exc), headers={"Retry-After": "1"})

    @app.exception_handler(TimeoutError)
    async def _timeout(request: Request, exc: TimeoutError) -> JSONResponse:
        return _error(504, "timeout", str(exc))

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal", f"{type(exc).__name__}: {_cause(exc)}")

    # ---------------------------------------------------------------- helpers
    async def policy_response(state: dict, response: Response) -> PolicyState:
        response.headers["ETag"] = f'"{state["revision"]}"'
        return PolicyState.model_validate(state)

    async def write_policy(request: Request, changes: dict, replace: bool, if_match: str | None) -> dict:
        expected = _if_match(if_match)
        state = await client.call("set_policy", changes, expected_revision=expected, replace=replace)
        log.info("policy revision %d via %s %s from %s: %s", state["revision"], request.method, request.url.path,
                 request.client.host if request.client else "?", json.dumps(changes, sort_keys=True))
        return state

    # ---------------------------------------------------------------- routes
    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}}, tags=["service"])
    async def healthz(response: Response) -> Health:
        """200 when the orchestrator actor answers a ping within 2 s, else 503."""
        who = f"{settings.namespace}/{settings.actor_name}"
        try:
            await client.call("ping", timeout_s=2.0)
        except (OrchestratorUnavailable, TimeoutError) as err:
            response.status_code = 503
            return Health(status="unavailable", orchestrator=who, message=str(err))
        return Health(status="ok", orchestrator=who)

    @app.get("/v1/policy", response_model=PolicyState, tags=["policy"])
    async def get_policy(response: Response) -> PolicyState:
        """The resampling policy and its revision; ``ETag`` carries the revision."""
        return await policy_response(await client.call("get_policy"), response)

    @app.put("/v1/policy", response_model=PolicyState, tags=["policy"],
             responses={409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
    async def put_policy(
        body: PolicyReplace,  # type: ignore[valid-type]
        request: Request,
        response: Response,
        if_match: str | None = Header(None, description='Expected revision, e.g. "3"; a stale one gets 409.',
                                      pattern=IF_MATCH_PATTERN),
        _auth: BearerAuth = None,
    ) -> PolicyState:
        """Replace the whole policy: every field, as the ``policy`` object of ``GET``'s body (a field
        left out is refused with 422 naming it, not reset to its default; ``PATCH`` changes some);
        applies from the next round."""
        state = await write_policy(request, body.model_dump(mode="json"), True, if_match)
        return await policy_response(state, response)

    @app.patch("/v1/policy", response_model=PolicyState, tags=["policy"],
               responses={409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
    async def patch_policy(
        body: PolicyPatch,  # type: ignore[valid-type]
        request: Request,
        response: Response,
        if_match: str | None = Header(None, description='Expected revision, e.g. "3"; a stale one gets 409.',
                                      pattern=IF_MATCH_PATTERN),
        _auth: BearerAuth = None,
    ) -> PolicyState:
        """Change the given fields (``filter`` merged key by key); applies from the next round."""
        changes = body.model_dump(mode="json", exclude_unset=True)
        if not changes:  # nothing to change: the current policy, revision unchanged
            return await policy_response(await client.call("get_policy"), response)
        state = await write_policy(request, changes, False, if_match)
        return await policy_response(state, response)

    @app.post("/v1/replenish/pause", response_model=PolicyState, tags=["policy"])
    async def pause(request: Request, response: Response,
                    _auth: BearerAuth = None) -> PolicyState:
        """Start no further replenish rounds (a policy change: the revision is bumped)."""
        return await policy_response(await write_policy(request, {"replenish_paused": True}, False, None), response)

    @app.post("/v1/replenish/resume", response_model=PolicyState, tags=["policy"])
    async def resume(request: Request, response: Response,
                     _auth: BearerAuth = None) -> PolicyState:
        """Start replenish rounds again (a policy change: the revision is bumped)."""
        return await policy_response(await write_policy(request, {"replenish_paused": False}, False, None), response)

    @app.get("/v1/stats", response_model=Stats, tags=["stats"])
    async def stats() -> Stats:
        """Live counters: groups by outcome and drop reason, rollouts, rounds, keep ratio, rewards."""
        return await client.call("get_stats")

    @app.get("/v1/tasks/{task_id}", response_model=TaskStats, responses={404: {"model": ErrorResponse}}, tags=["stats"])
    async def task(task_id: str) -> TaskStats:
        """One task's reward history, pass-rate estimate and when it is next eligible; 404 for a task
        outside the task set."""
        try:
            return await client.call("task_history", task_id)
        except UnknownTaskError as err:
            raise HTTPException(404, _cause(err)) from None

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"])
    async def metrics() -> Response:
        """The orchestrator's metrics in Prometheus text format 0.0.4."""
        text = await client.call("metrics_text")
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    app.include_router(dashboard_router())
    return app


def _original(exc: BaseException) -> BaseException:
    """The exception raised in the actor, out of Ray's wrapper (``exc`` itself when not wrapped)."""
    import ray.exceptions as rex

    cause = getattr(exc, "cause", None) if isinstance(exc, rex.RayTaskError) else None
    return cause if cause is not None else exc


def _cause(exc: BaseException) -> str:
    """The message of an exception raised in the actor, without Ray's traceback wrapper."""
    original = _original(exc)
    if original is not exc:
        return str(original)
    text = str(exc)
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__


