"""How Trinity components attach to the one long-running orchestrator actor.

The task selector and the pipeline operator of a Trinity run, the REST service, the CLI and
the dashboard all reach the same actor: ``actor_name`` (default ``dso-orchestrator``) in Ray
namespace ``namespace`` (default ``trinity-dso``, never the run's own namespace, which ends
with the run). The first component to start creates it (detached: it outlives the explorer,
checkpointed: it outlives a cluster restart, with Prometheus metrics), unless ``trinity-dso
serve`` created it before; the others attach. Every actor setting comes from one
:class:`AttachConfig`, filled from the Trinity YAML by
:func:`orchestrator.trinity.algorithms.configure_orchestrated_run`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.service.actor import get_or_create_orchestrator
from orchestrator.service.calls import DEADLINE_S, ActorCalls
from orchestrator.service.names import DEFAULT_NAME, DEFAULT_NAMESPACE, RETRY_WINDOW
from orchestrator.tasks.taskset import IndexTaskSet
from orchestrator.trinity.registry import SELECTOR_NAME

log = logging.getLogger("trinity_dso.trinity")


class OrchestratorNotFoundError(LookupError):
    """The named orchestrator actor does not exist and cannot be created here."""


class AttachConfig(BaseModel):
    """The orchestrator settings of a Trinity run (the selector's ``kwargs`` and the operator's ``args``).

    :func:`~orchestrator.trinity.algorithms.configure_orchestrated_run` merges the two places,
    fills the defaults below from the Trinity config and writes the result back to both, so
    whichever component starts first creates the actor with the same settings.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    actor_name: str = Field(DEFAULT_NAME, min_length=1, description="Name of the orchestrator actor (REST `actor_name`).")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1, description="Its Ray namespace (REST `namespace`); not the run's.")
    policy: dict[str, Any] = Field(default_factory=dict, description="Initial resampling policy; a checkpoint's policy wins.")
    checkpoint_path: str | None = Field(
        None, description="The actor's state file (SQLite); default <checkpoint_job_dir>/dso/orchestrator.db "
        "(orchestrator.json where a run of an earlier version left one)."
    )
    held_dir: str | None = Field(
        None, description="Where the operator keeps the experiences of held (carried) groups; "
        "default <checkpoint_job_dir>/dso/held. Must survive an explorer restart."
    )
    anchor_index: dict[str, Any] | None = Field(
        None, description="Anchor index for dso_gigpo_index (AnchorIndexConfig: redis_url, prefix, ttl_s, "
        "max_age_versions); {} for one in the actor's memory; null for none."
    )
    metrics: bool = Field(True, description="Prometheus metrics in the actor (served by the REST service's /metrics).")
    seed: int = Field(0, description="Seed of the actor's task order.")
    retry_window: int = Field(
        RETRY_WINDOW, ge=1, description="Group keys the actor remembers (newest first) to recognise re-submitted "
        "groups; keep it above the groups of the explore steps between two explorer checkpoints."
    )
    run: str | None = Field(None, description="Run id; default <project>/<name>. One orchestrator serves one run.")
    num_tasks: int | None = Field(None, ge=1, description="Rows of the training taskset (the selector knows it).")
    pinned: dict[str, int] = Field(
        default_factory=dict, description="Policy fields the trainer's batch size depends on (filled from the config)."
    )
    pinned_by: str = Field("", description="Why they are pinned (named in REST 409 errors).")
    lookup_timeout_s: float = Field(60.0, ge=0, description="How long the operator waits for the actor, in seconds.")
    actor_timeout_s: float = Field(60.0, gt=0, description="Timeout of one call to the actor, in seconds.")
    restart_deadline_s: float = Field(
        DEADLINE_S, gt=0, allow_inf_nan=False,
        description="How long the operator and selector keep re-sending a call (same call id) while the actor "
        "is dead or restarting, in seconds; then the call fails and the explorer stops (docs/guide/durability.md).",
    )

    @classmethod
    def parse(cls, data: dict | None, where: str) -> AttachConfig:
        """Validate, naming ``where`` (the YAML path) in the error."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as err:
            parts = [f"{where}.{'.'.join(str(x) for x in e['loc'])}: {e['msg']} (got {e.get('input')!r})" for e in err.errors()]
            raise ValueError("; ".join(parts)) from None

    def resampling_policy(self) -> ResamplingPolicy:
        """The run's policy; screening and the answer screen are refused (Trinity's workflow rolls all
        repeat_times at once, and the orchestrator does not hold its engine)."""
        from orchestrator.rollout.screening import ScreeningUnsupportedError, check_route

        policy = ResamplingPolicy.parse({**self.policy, **self.pinned})
        check_route(policy.screen, "trinity")
        if policy.screen == "answer":
            raise ScreeningUnsupportedError(
                "screen: 'answer' is not possible through Trinity: the orchestrator hands tasks to Trinity's explorer "
                "and does not hold its engine, so it cannot score answers before they are rolled out; set screen: none")
        return policy


def create_orchestrator(cfg: AttachConfig, num_tasks: int) -> Any:
    """The named actor, created (detached, checkpointed, with metrics) when absent."""
    from orchestrator.service.metrics import DSOMetrics

    return get_or_create_orchestrator(
        cfg.resampling_policy(), IndexTaskSet.of_size(int(num_tasks)), seed=cfg.seed,
        name=cfg.actor_name, namespace=cfg.namespace, detached=True,
        checkpoint_path=cfg.checkpoint_path, metrics=DSOMetrics() if cfg.metrics else None,
        anchor_index=cfg.anchor_index, retry_window=cfg.retry_window,
    )


def actor_calls(cfg: AttachConfig, handle: Any) -> ActorCalls:
    """The run's calls to its actor, re-sent while it restarts (up to ``restart_deadline_s``)."""
    return ActorCalls(handle, name=cfg.actor_name, namespace=cfg.namespace, deadline_s=cfg.restart_deadline_s)


def new_session() -> str:
    """One id per explorer process (the selector's attach)."""
    return uuid.uuid4().hex[:12]


def attach_args(cfg: AttachConfig, role: str, session: str, num_tasks: int) -> dict:
    """Keyword arguments of ``Orchestrator.attach_run`` for this run."""
    return {"session": session, "role": role, "num_tasks": int(num_tasks), "pinned": dict(cfg.pinned),
            "pinned_by": cfg.pinned_by}


def find_orchestrator(name: str, namespace: str | None = None, *, timeout_s: float = 0.0) -> Any:
    """The named actor in ``namespace`` (default ``trinity-dso``), alive, for synchronous callers.

    Polls up to ``timeout_s`` seconds, and until the actor answers a ping: a name still bound
    to a dead actor, or an actor restarting from its state file, is looked up again rather than
    handed out. A handle found here follows Ray's restarts of the actor (``max_restarts``); call
    this again after ``RayActorError`` to find an actor created anew under the name. Not for
    async code: see :func:`find_orchestrator_async`.

    Raises:
        OrchestratorNotFoundError: not there, or not answering, after ``timeout_s``.
    """
    import ray.exceptions as rex

    ns = namespace or DEFAULT_NAMESPACE
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            handle = ray.get_actor(name, namespace=ns)
            ray.get(handle.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return handle
        except ValueError:
            why = _not_found(name, ns)
        except (rex.RayActorError, rex.ActorUnavailableError, rex.GetTimeoutError) as err:
            why = OrchestratorNotFoundError(
                f"actor_name: orchestrator {name!r} in Ray namespace {ns!r} does not answer ({type(err).__name__})"
            )
        if time.monotonic() >= deadline:
            raise why from None
        time.sleep(0.2)


async def find_orchestrator_async(name: str, namespace: str | None = None, *, timeout_s: float = 0.0) -> Any:
    """:func:`find_orchestrator` for async code: waits with ``asyncio.sleep``, never blocks the loop."""
    ns = namespace or DEFAULT_NAMESPACE
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(name, namespace=ns)
        except ValueError:
            if time.monotonic() >= deadline:
                raise _not_found(name, ns) from None
            await asyncio.sleep(0.2)


def _not_found(name: str, ns: str) -> OrchestratorNotFoundError:
    return OrchestratorNotFoundError(
        f"actor_name: no orchestrator {name!r} in Ray namespace {ns!r}; configure the {SELECTOR_NAME!r} data "
        "selector on the taskset (it creates it), start `trinity-dso serve`, or give the operator num_tasks"
    )


def trinity_task_id(exp: Any) -> str:
    """Stable task id of a Trinity experience: its dataset row, else ``eid.task``.

    Raises:
        ValueError: the experience comes from a second taskset (``taskset_id`` > 0).
    """
    index = (exp.info or {}).get("task_index") or {}
    if int(index.get("taskset_id", 0) or 0) != 0:
        raise ValueError(
            f"info.task_index.taskset_id: {index['taskset_id']} - an orchestrated run supports one training taskset"
        )
    if "index" in index:
        return str(int(index["index"]))
    return str(exp.eid.task)
