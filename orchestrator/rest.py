"""The REST service: a Ray Serve deployment with a FastAPI app, in front of the named orchestrator actor.

The deployment holds no state of its own: every request is one call to the orchestrator actor
(``dso-orchestrator`` in namespace ``trinity-dso`` by default), found by name and looked up
again when it has been restarted. OpenAPI is served at ``/openapi.json`` (docs at ``/docs``).

Endpoints (mutating ones need ``Authorization: Bearer <token>`` when a token is configured):

=========================  =============================================================
``GET /healthz``           200 when the orchestrator actor answers, else 503
``GET /v1/policy``         the resampling policy and its revision (``ETag: "<revision>"``)
``PUT /v1/policy``         replace the whole policy (omitted fields take their defaults)
``PATCH /v1/policy``       change some fields (``filter`` merged key by key)
``GET /v1/stats``          live counters (``OrchestratorCore.stats()``)
``GET /v1/tasks/{id}``     one task's reward history (404 for an unknown task)
``POST /v1/replenish/pause``   stop starting replenish rounds (a policy change)
``POST /v1/replenish/resume``  start them again
``GET /metrics``           Prometheus text format (see :mod:`orchestrator.metrics`)
=========================  =============================================================

Policy writes: each accepted change bumps the revision, is logged (by the actor and here,
with the client address) and applies from the next round. ``If-Match: "<revision>"`` makes
the write conditional: a stale revision gets 409 and changes nothing. Invalid values get 422
naming the field; malformed JSON 400; an oversized body 413; a body on a wrong content type
415. Errors have one shape, :class:`ErrorResponse`.

Run it with :func:`build_app` (also the ``import_path`` of Serve config files and KubeRay's
RayService: ``orchestrator.rest:build_app``), or ``trinity-dso serve``.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import json
import logging
import os
import random
from typing import Annotated, Any, Literal, Optional

from fastapi import FastAPI, Header, HTTPException, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.actor import DEFAULT_NAME, DEFAULT_NAMESPACE, PolicyConflictError
from orchestrator.core import UnknownTaskError
from orchestrator.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from orchestrator.policy import FilterConfig, InvalidPolicyError, ResamplingPolicy

log = logging.getLogger("trinity_dso.rest")

TOKEN_ENV = "DSO_API_TOKEN"
"""Environment variable read for the bearer token when the settings name none."""

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# --------------------------------------------------------------------------- settings


class ServiceSettings(BaseModel):
    """Settings of the REST deployment (``service`` section of the ``serve`` YAML config)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds to; loopback unless told otherwise.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the Ray Serve proxy.")
    app_name: str = Field("dso", min_length=1, description="Ray Serve application name.")
    route_prefix: str = Field("/", pattern=r"^/", description="Route prefix of the application.")
    actor_name: str = Field(DEFAULT_NAME, min_length=1, description="Name of the orchestrator actor.")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1, description="Ray namespace of the orchestrator actor.")
    auth_token: str | None = Field(
        None, description="Bearer token required on mutating endpoints; None reads $DSO_API_TOKEN (empty: no auth)."
    )
    auth_token_env: str = Field(TOKEN_ENV, description="Environment variable holding the token when auth_token is None.")
    max_body_bytes: int = Field(65536, ge=1, le=16 * 2**20, description="Largest request body accepted, in bytes (else 413).")
    actor_timeout_s: float = Field(10.0, gt=0, le=600, description="Timeout of one call to the orchestrator actor, in seconds (else 504).")
    num_replicas: int = Field(1, ge=1, le=64, description="Serve replicas of the REST deployment.")
    max_ongoing_requests: int = Field(128, ge=1, description="Concurrent requests per replica (Serve's default is 5).")

    def token(self) -> str | None:
        """The configured token: ``auth_token``, else the environment variable, else None."""
        tok = self.auth_token if self.auth_token is not None else os.environ.get(self.auth_token_env)
        return tok or None


# --------------------------------------------------------------------------- API models


class ErrorResponse(BaseModel):
    """Every error response: a short kind, a message naming the field or header, and details."""

    error: str = Field(description="Kind: validation, invalid_json, invalid_policy, conflict, unauthorized, forbidden, not_found, ...")
    message: str = Field(description="What is wrong, naming the field, header or id.")
    detail: list[dict[str, Any]] | None = Field(None, description="Per-field validation errors (loc, msg, type).")


class FilterBody(FilterConfig):
    """The filter settings as accepted over HTTP: strict types (``"4"`` is not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    band: Annotated[list[float], Field(min_length=2, max_length=2)] | None = Field(
        None, description="Optional band-pass [lo, hi] on the group mean: keep only lo < mean < hi."
    )


class PolicyBody(ResamplingPolicy):
    """A whole resampling policy as accepted by ``PUT /v1/policy`` (strict types, unknown fields refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    filter: FilterBody = Field(default_factory=FilterBody, description="Which groups count as informative.")


def _optional_model(name: str, base: type[BaseModel], nested: dict[str, Any], doc: str) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for fname, info in base.model_fields.items():
        if fname in nested:
            ann = nested[fname]
        elif info.metadata:
            ann = Annotated[(info.annotation, *info.metadata)]
        else:
            ann = info.annotation
        fields[fname] = (Optional[ann], Field(None, description=info.description))  # noqa: UP045
    model = create_model(name, __config__=ConfigDict(extra="forbid", strict=True), **fields)
    model.__doc__ = doc
    return model


FilterPatch = _optional_model("FilterPatch", FilterBody, {}, "Filter fields to change; omitted fields keep their value.")
PolicyPatch = _optional_model(
    "PolicyPatch", PolicyBody, {"filter": FilterPatch},
    "Policy fields to change (``PATCH /v1/policy``); omitted fields keep their value, ``filter`` is merged key by key.",
)


class PolicyState(BaseModel):
    """The resampling policy and its revision (also sent as ``ETag: "<revision>"``)."""

    revision: int = Field(ge=0, description="Bumped by every accepted change (not the model weights' policy version).")
    policy: ResamplingPolicy


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    orchestrator: str = Field(description="The actor's name and namespace.")
    message: str | None = None


class Stats(BaseModel):
    """Live counters of the orchestrator (``OrchestratorCore.stats()``); further keys pass through."""

    model_config = ConfigDict(extra="allow")

    batches_emitted: int
    batches_partial: int
    groups_submitted: int
    groups_emitted: int
    groups_padded: int
    groups_dropped: int
    groups_held: int
    groups_carried: int
    classified_by_reason: dict[str, int]
    dropped_by_reason: dict[str, int]
    rollouts_initial: int
    rollouts_replenish: int
    rollouts_wasted: int
    rollouts_total: int
    replenish_rounds: int
    cap_hits: int
    keep_ratio: float | None = Field(description="Informative / classified groups; null before any.")
    predicted_keep_rate: float
    mean_reward_all: float | None
    mean_reward_kept: float | None
    rollouts_per_emitted_group: float | None
    rounds_per_batch: list[int]
    batch_id: int = Field(description="Id of the batch being filled.")
    policy_revision: int
    model_version: int = Field(description="Newest policy version (model weights) seen.")
    epoch: int
    replenish_paused: bool


class TaskHistory(BaseModel):
    """Reward history of one task (``orchestrator.history.TaskHistory.row``)."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    groups: int
    informative: int
    rollouts: int
    correct: int
    mean: float = Field(description="Running mean reward of its rollouts.")
    variance: float | None = Field(description="Unbiased reward variance; null below 2 rollouts.")
    pass_rate: float | None = Field(description="Correct / rollouts; null before any.")
    consec_all_correct: int
    consec_all_wrong: int
    last_policy_version: int
    skip_until_epoch: int


# --------------------------------------------------------------------------- actor client


class OrchestratorUnavailable(RuntimeError):
    """The orchestrator actor is missing, dead or did not answer in time."""


class ActorClient:
    """Calls the named orchestrator actor; re-resolves the name once when the handle is dead."""

    def __init__(self, name: str, namespace: str, timeout_s: float):
        self.name, self.namespace, self.timeout_s = name, namespace, timeout_s
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

        for attempt in (0, 1):
            handle = self._resolve()
            try:
                ref = getattr(handle, method).remote(*args, **kwargs)
                return await asyncio.wait_for(ref, timeout_s or self.timeout_s)
            except (rex.RayActorError, rex.ActorUnavailableError) as err:
                self._handle = None  # restarted under the same name? look it up again
                if attempt:
                    raise OrchestratorUnavailable(f"orchestrator actor {self.name!r} is unavailable: {type(err).__name__}") from None
            except TimeoutError:
                raise TimeoutError(f"orchestrator actor {self.name!r} did not answer {method} within "
                                   f"{timeout_s or self.timeout_s} s") from None
        raise AssertionError("unreachable")


# --------------------------------------------------------------------------- the app


def _error(status: int, kind: str, message: str, detail: list | None = None, headers: dict | None = None) -> JSONResponse:
    body = ErrorResponse(error=kind, message=message, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


_HTTP_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 503: "unavailable", 504: "timeout"}


def _loc(loc: Any) -> str:
    return ".".join(str(x) for x in loc)


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
            if not length.isdigit():
                return await self._reply(scope, receive, send, 400, "bad_request", f"Content-Length: not a number ({length!r})")
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


def _if_match(value: str | None) -> int | None:
    """The revision in an ``If-Match`` header (``"3"``, ``W/"3"``, ``3``); None for ``*`` or absent."""
    if value is None or value.strip() == "*":
        return None
    v = value.strip()
    v = v.removeprefix("W/")
    v = v.strip('"')
    if not v.isdigit():
        raise HTTPException(400, f"If-Match: expected one revision such as '\"3\"', got {value!r}")
    return int(v)


_BEARER = HTTPBearer(auto_error=False, description="Required on mutating endpoints when the service has a token.")
BearerAuth = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
"""Documents the bearer scheme in OpenAPI; :class:`Guard` enforces it before routing."""


def create_app(settings: ServiceSettings | None = None, client: ActorClient | None = None) -> FastAPI:
    """The FastAPI app (built in each Serve replica; also runnable with any ASGI server)."""
    settings = settings or ServiceSettings()
    client = client or ActorClient(settings.actor_name, settings.namespace, settings.actor_timeout_s)
    token = settings.token()
    app = FastAPI(
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
            return _error(400, "invalid_json", f"body: malformed JSON ({e['msg']}, at {_loc(e['loc'][1:]) or 'start'})", errors)
        message = "; ".join(f"{_loc(e['loc'][1:] if e['loc'][:1] == ['body'] else e['loc']) or 'body'}: {e['msg']}" for e in errors)
        return _error(422, "validation", message, errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, _HTTP_KINDS.get(exc.status_code, "error"), str(exc.detail), headers=exc.headers)

    @app.exception_handler(InvalidPolicyError)
    async def _invalid(request: Request, exc: InvalidPolicyError) -> JSONResponse:
        return _error(422, "invalid_policy", _cause(exc))

    @app.exception_handler(PolicyConflictError)
    async def _conflict(request: Request, exc: PolicyConflictError) -> JSONResponse:
        return _error(409, "conflict", _cause(exc))

    @app.exception_handler(OrchestratorUnavailable)
    async def _unavailable(request: Request, exc: OrchestratorUnavailable) -> JSONResponse:
        return _error(503, "unavailable", str(exc))

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
        body: PolicyBody,
        request: Request,
        response: Response,
        if_match: str | None = Header(None, description='Expected revision, e.g. "3"; a stale one gets 409.'),
        _auth: BearerAuth = None,
    ) -> PolicyState:
        """Replace the whole policy (omitted fields take their defaults); applies from the next round."""
        state = await write_policy(request, body.model_dump(mode="json"), True, if_match)
        return await policy_response(state, response)

    @app.patch("/v1/policy", response_model=PolicyState, tags=["policy"],
               responses={409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
    async def patch_policy(
        body: PolicyPatch,  # type: ignore[valid-type]
        request: Request,
        response: Response,
        if_match: str | None = Header(None, description='Expected revision, e.g. "3"; a stale one gets 409.'),
        _auth: BearerAuth = None,
    ) -> PolicyState:
        """Change the given fields (``filter`` merged key by key); applies from the next round."""
        changes = body.model_dump(mode="json", exclude_unset=True)
        if not changes:
            raise HTTPException(400, "body: no field to change (send at least one policy field)")
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
        return Stats.model_validate(await client.call("get_stats"))

    @app.get("/v1/tasks/{task_id}", response_model=TaskHistory, responses={404: {"model": ErrorResponse}}, tags=["stats"])
    async def task(task_id: str) -> TaskHistory:
        """One task's reward history; 404 for a task outside the task set."""
        try:
            row = await client.call("task_history", task_id)
        except UnknownTaskError as err:
            raise HTTPException(404, _cause(err)) from None
        return TaskHistory.model_validate(row)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"])
    async def metrics() -> Response:
        """The orchestrator's metrics in Prometheus text format 0.0.4."""
        text = await client.call("metrics_text")
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    return app


def _cause(exc: BaseException) -> str:
    """The message of an exception raised in the actor, without Ray's traceback wrapper."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is not None:
            return str(cause)
    text = str(exc)
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__


# --------------------------------------------------------------------------- Serve deployment


def _deployment():
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress()
    class DSOService:
        """Ray Serve deployment: the FastAPI app of :func:`create_app` bound to the named actor."""

        def __init__(self, settings: dict):
            from orchestrator.logs import enable_service_logging

            enable_service_logging()
            self.settings = ServiceSettings.model_validate(settings)

        def __serve_build_asgi_app__(self) -> FastAPI:
            return create_app(self.settings)

    return DSOService


DSOService = _deployment()


def build_app(args: dict | None = None):
    """Serve application builder (``import_path: orchestrator.rest:build_app``).

    Args:
        args: a ``serve`` config (:class:`ServeConfig` as a dict: ``service``, optional
            ``orchestrator``). With an ``orchestrator`` section whose ``create`` is true, the
            named actor is created (detached) when absent.
    Returns:
        The bound Serve application.
    """
    cfg = ServeConfig.model_validate(args or {})
    if cfg.orchestrator is not None and cfg.orchestrator.create:
        ensure_orchestrator(cfg.orchestrator)
    s = cfg.service
    settings = s.model_dump()
    if settings["auth_token"] is None:  # resolve here too, where the driver's environment is
        settings["auth_token"] = s.token() or ""
    return DSOService.options(num_replicas=s.num_replicas, max_ongoing_requests=s.max_ongoing_requests).bind(settings)


# --------------------------------------------------------------------------- orchestrator from config


class ComponentConfig(BaseModel):
    """A task set or rollout source: a built-in ``kind`` or a ``factory`` import path."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["scripted", "default", "factory", "none"] = Field(
        "scripted",
        description="tasks: 'scripted' (bare ids t0..), 'default' (orchestrator.tasks.default_task_set), 'factory'. "
        "rollout: 'scripted' (scripted rewards), 'factory', or 'none' (groups are submitted from outside).",
    )
    count: int = Field(64, ge=1, description="scripted tasks: number of task ids t0..t{count-1}.")
    ids: list[str] | None = Field(None, description="scripted tasks: explicit task ids (overrides count).")
    mix: dict[Literal["informative", "all_correct", "all_wrong"], float] = Field(
        default_factory=lambda: {"informative": 0.4, "all_correct": 0.3, "all_wrong": 0.3},
        description="scripted rollouts: share of each kind of group (each task cycles through 4 draws).",
    )
    script: dict[str, list[list[float]]] | None = Field(None, description="scripted rollouts: explicit reward vectors per task.")
    default: list[float] | None = Field(None, description="scripted rollouts: reward vector of unscripted tasks.")
    seed: int = Field(0, description="Seed of scripted draws / the default task set.")
    size: int = Field(200, ge=1, description="default task set: number of tasks.")
    factory: str | None = Field(None, description="'module:callable' called with kwargs (and task_set= for rollouts).")
    kwargs: dict[str, Any] = Field(default_factory=dict)


class OrchestratorConfig(BaseModel):
    """The orchestrator actor to create (``orchestrator`` section of the ``serve`` YAML config)."""

    model_config = ConfigDict(extra="forbid")

    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    create: bool = Field(True, description="Create the named actor when absent (false: it must exist).")
    detached: bool = Field(True, description="Let the actor outlive the process that created it.")
    policy: dict[str, Any] = Field(default_factory=dict, description="Initial resampling policy (orchestrator.policy).")
    tasks: ComponentConfig = Field(default_factory=ComponentConfig)
    rollout: ComponentConfig = Field(default_factory=ComponentConfig)
    sink: str | None = Field(None, description="SQLite file for emitted batches (orchestrator.sink.SQLiteSink).")
    checkpoint_path: str | None = Field(None, description="JSON checkpoint; a restarted actor resumes from it.")
    seed: int = 0


class DriverConfig(BaseModel):
    """Pull batches continuously (a stand-in for a trainer), for demos and dashboards."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    interval_s: float = Field(1.0, ge=0, description="Pause between batches, in seconds.")
    max_batches: int | None = Field(None, ge=1, description="Stop after this many batches; None: until stopped.")


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description="None: start a local Ray; 'auto' or 'ray://...': join a cluster.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray (None: all).")


class ServeConfig(BaseModel):
    """The ``trinity-dso serve`` YAML config (see ``examples/service/service.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    ray: RayConfig = Field(default_factory=RayConfig)
    orchestrator: OrchestratorConfig | None = Field(default_factory=OrchestratorConfig)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    driver: DriverConfig = Field(default_factory=DriverConfig)


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"factory: expected 'module:callable', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def scripted_mix(task_ids: list[str], n: int, mix: dict[str, float], seed: int = 0, cycle: int = 4) -> dict[str, list[list[float]]]:
    """Reward scripts drawing each task's groups from ``mix`` (DAPO rewards +1 / -1).

    Each task cycles through ``cycle`` draws of informative ([+1, -1, ...]), all_correct
    (all +1) or all_wrong (all -1) groups of ``n`` rewards.
    """
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"mix: weights must sum to > 0, got {mix}")
    kinds, weights = list(mix), [w / total for w in mix.values()]
    rng = random.Random(seed)
    vectors = {
        "informative": [1.0 if i % 2 == 0 else -1.0 for i in range(n)] if n > 1 else [1.0],
        "all_correct": [1.0] * n,
        "all_wrong": [-1.0] * n,
    }
    return {t: [list(vectors[rng.choices(kinds, weights)[0]]) for _ in range(cycle)] for t in task_ids}


def build_orchestrator_args(cfg: OrchestratorConfig) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of :class:`orchestrator.actor.Orchestrator` for a config."""
    from orchestrator.metrics import DSOMetrics
    from orchestrator.policy import ResamplingPolicy as Policy
    from orchestrator.scripted import ScriptedRolloutSource, ScriptedTasks

    policy = Policy.parse(cfg.policy)
    t = cfg.tasks
    if t.kind == "scripted":
        task_set = ScriptedTasks(t.ids or [f"t{i}" for i in range(t.count)])
    elif t.kind == "default":
        from orchestrator.tasks import default_task_set

        task_set = default_task_set(seed=t.seed, size=t.size)
    elif t.kind == "factory" and t.factory:
        task_set = _import(t.factory)(**t.kwargs)
    else:
        raise ValueError(f"orchestrator.tasks.kind: {t.kind!r} needs a factory or is not a task set kind")
    r = cfg.rollout
    if r.kind == "none":
        source = None
    elif r.kind == "scripted":
        script = r.script if r.script is not None else (
            None if r.default is not None else scripted_mix(task_set.task_ids, policy.group_size, r.mix, r.seed))
        source = ScriptedRolloutSource(script, default=r.default)
    elif r.kind == "factory" and r.factory:
        source = _import(r.factory)(task_set=task_set, **r.kwargs)
    else:
        raise ValueError(f"orchestrator.rollout.kind: {r.kind!r} needs a factory or is not a rollout kind")
    sink = None
    if cfg.sink:
        from orchestrator.sink import SQLiteSink

        sink = SQLiteSink(cfg.sink)
    kwargs = {"sink": sink, "checkpoint_path": cfg.checkpoint_path, "metrics": DSOMetrics(), "seed": cfg.seed}
    return (policy, task_set, source), kwargs


def ensure_orchestrator(cfg: OrchestratorConfig):
    """The named orchestrator actor, created from ``cfg`` when absent (needs a connected Ray)."""
    import ray

    from orchestrator.actor import get_or_create_orchestrator

    try:
        return ray.get_actor(cfg.name, namespace=cfg.namespace)
    except ValueError:
        pass
    if not cfg.create:
        raise OrchestratorUnavailable(f"orchestrator actor {cfg.name!r} not found in namespace {cfg.namespace!r} (create: false)")
    args, kwargs = build_orchestrator_args(cfg)
    handle = get_or_create_orchestrator(*args, name=cfg.name, namespace=cfg.namespace, detached=cfg.detached, **kwargs)
    ray.get(handle.ping.remote())
    if not cfg.detached:
        _KEEP_ALIVE.append(handle)  # a non-detached actor dies with its last handle
    return handle


_KEEP_ALIVE: list = []
