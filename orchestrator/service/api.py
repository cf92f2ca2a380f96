"""The REST API's typed models: service settings, request and response bodies (OpenAPI is generated from them)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from orchestrator.core.policy import FilterConfig, ResamplingPolicy
from orchestrator.service.names import DEFAULT_NAME, DEFAULT_NAMESPACE

TOKEN_ENV = "DSO_API_TOKEN"
"""Environment variable read for the bearer token when the settings name none."""

# --------------------------------------------------------------------------- settings


class ServiceSettings(BaseModel):
    """Settings of the REST deployment (``service`` section of the ``serve`` YAML config)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    actor_restart_wait_s: float = Field(
        5.0, ge=0, le=600, description="How long a read waits for a restarting orchestrator actor (looked up again by "
        "name), in seconds, before answering 503."
    )
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
    """The policy's fields as accepted over HTTP (strict types, unknown fields refused): all of
    them in ``PUT /v1/policy`` (:data:`PolicyReplace`), some in ``PATCH`` (:data:`PolicyPatch`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    filter: FilterBody = Field(default_factory=FilterBody, description="Which groups count as informative.")


def _variant_model(name: str, base: type[BaseModel], nested: dict[str, Any], doc: str, *, required: bool) -> type[BaseModel]:
    """``base``'s fields, each required (``required``: a whole policy; null only where the policy
    allows None) or each optional (omitted = keep; null only where the policy allows None),
    nested models replaced per ``nested``. Cross-field rules are the actor's (``ResamplingPolicy``)."""
    fields: dict[str, Any] = {}
    for fname, info in base.model_fields.items():
        if fname in nested:
            ann = nested[fname]
        elif info.metadata:
            ann = Annotated[(info.annotation, *info.metadata)]
        else:
            ann = info.annotation
        nullable = type(None) in getattr(info.annotation, "__args__", ())
        ann = Optional[ann] if nullable else ann  # noqa: UP045
        fields[fname] = (ann, Field(... if required else None, description=info.description))
    model = create_model(name, __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False), **fields)
    model.__doc__ = doc
    return model


FilterReplace = _variant_model("FilterReplace", FilterBody, {}, "Every filter field.", required=True)
PolicyReplace = _variant_model(
    "PolicyReplace", PolicyBody, {"filter": FilterReplace},
    "A whole policy (``PUT /v1/policy``): every field, as ``GET /v1/policy`` returns it under ``policy`` "
    "(a field left out is refused, not reset to its default; ``PATCH`` changes some).", required=True,
)
FilterPatch = _variant_model("FilterPatch", FilterBody, {}, "Filter fields to change; omitted fields keep their value.",
                             required=False)
PolicyPatch = _variant_model(
    "PolicyPatch", PolicyBody, {"filter": FilterPatch},
    "Policy fields to change (``PATCH /v1/policy``); omitted fields keep their value, ``filter`` is merged key by key.",
    required=False,
)


class PolicyState(BaseModel):
    """The resampling policy and its revision (also sent as ``ETag: "<revision>"``)."""

    revision: int = Field(ge=0, description="Bumped by every accepted change (not the model weights' model version).")
    policy: ResamplingPolicy


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    orchestrator: str = Field(description="The actor's name and namespace.")
    message: str | None = None


