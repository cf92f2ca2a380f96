"""How Trinity components attach to the orchestrator actor: finding it, and the stable task id of an experience."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from trinity.common.experience import Experience as TrinityExperience

from orchestrator.trinity.registry import SELECTOR_NAME

log = logging.getLogger("trinity_dso.trinity")


class OrchestratorNotFoundError(LookupError):
    """The named orchestrator actor does not exist and cannot be created here."""


@dataclass
class IndexTaskSet:
    """The task set of a Trinity-driven orchestrator: ids only (Trinity owns the prompts).

    Attributes:
        task_ids: ``"0" .. str(N - 1)``, the rows of the training taskset.
    """

    task_ids: list[str] = field(default_factory=list)

    @classmethod
    def of_size(cls, n: int) -> IndexTaskSet:
        if n <= 0:
            raise ValueError(f"num_tasks: must be > 0, got {n}")
        return cls([str(i) for i in range(n)])

    def get(self, task_id: str):
        raise LookupError(f"task {task_id!r}: Trinity's explorer owns the prompts; this orchestrator has no rollout source")


def _namespace(namespace: str | None) -> str:
    return namespace or ray.get_runtime_context().namespace


def find_orchestrator(name: str, namespace: str | None, *, timeout_s: float = 0.0) -> Any:
    """The named actor in ``namespace`` (default: the caller's Ray namespace, i.e. the run's), alive.

    Polls up to ``timeout_s`` seconds (the task selector usually creates it first), and until the
    actor answers a ping: a name still bound to a dead actor, or an actor restarting from its
    state file, is looked up again rather than handed out. A handle found here follows Ray's
    restarts of the actor (``max_restarts``); call this again after ``RayActorError`` to find an
    actor created anew under the name.

    Raises:
        OrchestratorNotFoundError: not there, or not answering, after ``timeout_s``.
    """
    import ray.exceptions as rex

    ns = _namespace(namespace)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            handle = ray.get_actor(name, namespace=ns)
            ray.get(handle.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return handle
        except ValueError:
            why = (f"no orchestrator {name!r} in Ray namespace {ns!r}; configure the {SELECTOR_NAME!r} data "
                   "selector on the taskset, or give the operator num_tasks")
        except (rex.RayActorError, rex.ActorUnavailableError, rex.GetTimeoutError) as err:
            why = f"orchestrator {name!r} in Ray namespace {ns!r} does not answer ({type(err).__name__})"
        if time.monotonic() >= deadline:
            raise OrchestratorNotFoundError(f"actor_name: {why}") from None
        time.sleep(0.2)


def trinity_task_id(exp: TrinityExperience) -> str:
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


