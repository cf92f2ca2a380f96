"""The `trinity-dso serve` configuration and the orchestrator actor it creates from it."""

from __future__ import annotations

import importlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.service.api import ServiceSettings
from orchestrator.service.names import DEFAULT_NAME, DEFAULT_NAMESPACE, RETRY_WINDOW, OrchestratorUnavailable

# --------------------------------------------------------------------------- orchestrator from config


class ComponentConfig(BaseModel):
    """A task set or rollout source: a built-in ``kind`` or a ``factory`` import path."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["scripted", "default", "index", "factory", "none"] = Field(
        "scripted",
        description="tasks: 'scripted' (bare ids t0..), 'default' (orchestrator.tasks.generators.default_task_set), "
        "'index' (ids '0'..'count-1': the rows of a Trinity run's taskset, which then attaches), 'factory'. "
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

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    create: bool = Field(True, description="Create the named actor when absent (false: it must exist).")
    detached: bool = Field(True, description="Let the actor outlive the process that created it.")
    policy: ResamplingPolicy = Field(default_factory=ResamplingPolicy, description="Initial resampling policy (orchestrator.core.policy); a resumed state file's policy wins.")
    tasks: ComponentConfig = Field(default_factory=ComponentConfig)
    rollout: ComponentConfig = Field(default_factory=ComponentConfig)
    sink: str | None = Field(None, description="SQLite file for emitted batches (orchestrator.service.sink.SQLiteSink).")
    checkpoint_path: str | None = Field(None, description="SQLite state file when there is no sink (with a sink, its file holds the state); a restarted actor resumes from it.")
    seed: int = 0
    retry_window: int = Field(RETRY_WINDOW, ge=1, description="Group keys remembered (newest first) to recognise a group submitted again; an older one counts as new.")


class DriverConfig(BaseModel):
    """Pull batches continuously (a stand-in for a trainer), for demos and dashboards."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = False
    interval_s: float = Field(1.0, ge=0, description="Pause between batches, in seconds.")
    max_batches: int | None = Field(None, ge=1, description="Stop after this many batches; None: until stopped.")


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    address: str | None = Field(None, description="None: start a local Ray; 'auto' or 'ray://...': join a cluster.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray (None: all).")


class ServeConfig(BaseModel):
    """The ``trinity-dso serve`` YAML config (see ``examples/service/service.yaml``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ray: RayConfig = Field(default_factory=RayConfig)
    orchestrator: OrchestratorConfig | None = Field(default_factory=OrchestratorConfig)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    driver: DriverConfig = Field(default_factory=DriverConfig)

    @model_validator(mode="after")
    def _one_actor(self) -> ServeConfig:
        """The REST service serves the ``orchestrator`` section's actor: ``service.actor_name`` and
        ``service.namespace`` follow ``orchestrator.name`` and ``orchestrator.namespace``; given
        both ways with different values, the config is refused (naming both fields)."""
        if self.orchestrator is None:
            return self
        follow = {}
        for field, source in (("actor_name", "name"), ("namespace", "namespace")):
            mine, theirs = getattr(self.service, field), getattr(self.orchestrator, source)
            if field in self.service.model_fields_set and mine != theirs:
                raise ValueError(
                    f"service.{field} {mine!r} differs from orchestrator.{source} {theirs!r}: the REST service serves "
                    f"the orchestrator actor; set orchestrator.{source} only (service.{field} follows it)"
                )
            follow[field] = theirs
        self.service = self.service.model_copy(update=follow)
        return self


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"factory: expected 'module:callable', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def build_orchestrator_args(cfg: OrchestratorConfig) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of :class:`orchestrator.service.actor.Orchestrator` for a config."""
    from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks, scripted_mix
    from orchestrator.service.metrics import DSOMetrics

    policy = cfg.policy
    t = cfg.tasks
    if t.kind == "scripted":
        task_set = ScriptedTasks(t.ids or [f"t{i}" for i in range(t.count)])
    elif t.kind == "index":
        from orchestrator.tasks.taskset import IndexTaskSet

        task_set = IndexTaskSet.of_size(t.count)
    elif t.kind == "default":
        from orchestrator.tasks.generators import default_task_set

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
        from orchestrator.service.sink import SQLiteSink

        sink = SQLiteSink(cfg.sink)
    kwargs = {"sink": sink, "checkpoint_path": cfg.checkpoint_path, "metrics": DSOMetrics(), "seed": cfg.seed,
              "retry_window": cfg.retry_window}
    return (policy, task_set, source), kwargs


def ensure_orchestrator(cfg: OrchestratorConfig):
    """The named orchestrator actor, created from ``cfg`` when absent (needs a connected Ray)."""
    import ray

    from orchestrator.service.actor import get_or_create_orchestrator

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
