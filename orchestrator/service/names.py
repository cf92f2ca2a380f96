"""The orchestrator's names, limits and error types that other modules need without loading the
actor (Ray, the store, the metrics): clients (:mod:`orchestrator.service.calls`,
:mod:`orchestrator.service.config`, the REST app), the Trinity plug-ins and the trainer side
(:mod:`orchestrator.trinity.advantage.gigpo_index`) import them from here. :mod:`orchestrator.service.actor`
re-exports them."""

from __future__ import annotations

DEFAULT_NAME = "dso-orchestrator"
DEFAULT_NAMESPACE = "trinity-dso"

RETRIES = 3
"""Ray's retries (``max_task_retries``) of a read when the actor died under it. Calls that change
state are never retried by Ray (a refusal while the actor restarts spends a retry, and Ray would
re-send a call without its caller knowing): callers re-send them with the same ``call_id``
through :class:`orchestrator.service.calls.ActorCalls` (see docs/guide/durability.md)."""

RETRY_WINDOW = 1_000_000
"""Group keys remembered to recognise a re-submitted group (the default ``retry_window``; its
memory and loading time: bench/README.md, "Sizes and run times"). A resumed Trinity explorer
re-submits the explore steps since its last checkpoint, a few thousand to tens of thousands of
groups in usual runs."""


class OrchestratorUnavailable(RuntimeError):
    """The orchestrator actor is missing, dead or did not answer in time."""


class PolicyConflictError(ValueError):
    """A policy write based on a stale revision (the REST layer maps it to 409)."""


class PinnedPolicyError(PolicyConflictError):
    """A policy write that would change a field an attached run has pinned (409, naming the field)."""


class RunConflictError(RuntimeError):
    """A second run (or a different task set) tried to attach to an orchestrator that serves another run."""
