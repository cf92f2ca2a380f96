"""Calls to the orchestrator actor that outlive its restarts: the one retry helper every client uses.

Ray restarts the actor when its process dies (``max_restarts=-1``); the actor resumes from its
state file within seconds. Ray's own retries (``max_task_retries``) do not cover that window:
each refusal while the actor restarts spends one, so three are gone within the seconds a
restart takes (see bench/README.md, "Sizes and run times"), and Ray re-sends a call without the caller knowing whether the first attempt was
committed. So Ray retries only the actor's reads; every call of the Trinity operator and task
selector, the CLI and the fault tests goes through :class:`ActorCalls`, which re-sends the
*same* call (same arguments, same ``call_id``) until the actor answers or a deadline passes.

Only calls that are idempotent by construction may be re-sent this way:

* reads (``ping``, ``get_policy``, ``get_stats``, ``exhausted``, ``held_refs``, ...);
* ``attach_run`` (the same session attaches once), ``set_model_version`` (sets a value);
* the calls that hand something out, with a ``call_id``: ``submit_and_pop``,
  ``submit_groups``, ``submit_experiences``, ``pop_batch``, ``next_batch``, ``close_batch``, ``finish_batch``,
  ``next_tasks``: a retry of a committed call is answered with what the first attempt handed
  out, and a re-submitted group is recognised by its key (a group without a round tag gets
  its identity from the call id and its position in the call).

A call that hands something out *without* a ``call_id`` is the documented at-most-once
exception: when its reply is lost, what it handed out stays handed out (in the sink), and it
is not re-sent (the helper refuses to retry it; see :data:`NEEDS_CALL_ID`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
import ray.exceptions as rex

from orchestrator.service.names import DEFAULT_NAMESPACE

log = logging.getLogger("trinity_dso.calls")

DEADLINE_S = 120.0
"""How long a call keeps being re-sent while the actor is dead or restarting, in seconds: well
above a restart from the state file (see bench/README.md, "Sizes and run times"), which a busy
node, or a large state file, makes longer."""

NEEDS_CALL_ID = frozenset({"submit_and_pop", "submit_groups", "submit_experiences", "pop_batch", "next_batch",
                           "close_batch", "finish_batch", "next_tasks"})
"""Methods re-sent only with a ``call_id`` (without one, a lost reply is at most once)."""

RETRIED = (rex.ActorUnavailableError, rex.RayActorError)
"""What a dead or restarting actor answers (``ActorDiedError`` is a ``RayActorError``)."""


class ActorCalls:
    """Call the named orchestrator actor, re-sending each call until it answers or ``deadline_s``.

    Args:
        handle: the actor's handle; None looks it up by ``name``.
        name, namespace: the actor's name (looked up again after each failure, so a handle of an
            actor created anew under the name is found); None: only ``handle`` is used.
        deadline_s: seconds a call keeps being re-sent after the first failure
            (default :data:`DEADLINE_S`), > 0.
    Raises:
        ValueError: neither ``handle`` nor ``name``, or ``deadline_s`` not a positive finite number.
    """

    def __init__(self, handle: Any = None, *, name: str | None = None, namespace: str | None = None,
                 deadline_s: float = DEADLINE_S) -> None:
        if handle is None and not name:
            raise ValueError("ActorCalls: give the actor's handle or its name")
        if not isinstance(deadline_s, (int, float)) or not 0 < float(deadline_s) < float("inf"):
            raise ValueError(f"deadline_s: must be a positive finite number of seconds, got {deadline_s!r}")
        self._handle, self.name, self.namespace = handle, name, namespace or DEFAULT_NAMESPACE
        self._creator = handle  # kept: a non-detached actor lives while its creator's handle does
        self.deadline_s = float(deadline_s)

    @property
    def handle(self) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle

    def _check(self, method: str, kwargs: dict) -> bool:
        """Whether ``method`` may be re-sent with these arguments."""
        return method not in NEEDS_CALL_ID or kwargs.get("call_id") is not None

    def _failed(self, method: str, err: Exception, started: float, attempt: int, retry: bool) -> float:
        """After a failed attempt: raise when no retry is allowed, else the seconds to wait."""
        left = started + self.deadline_s - time.monotonic()
        if not retry or left <= 0 or self._gone(err):
            raise err
        if self.name:
            self._handle = None  # look it up again (a restart keeps the handle valid; a new actor does not)
        wait = min(2.0, 0.1 * 2 ** min(attempt, 5), max(left, 0.0))
        log.warning("orchestrator %r unavailable (%s); %s re-sent in %.1f s (attempt %d, %.0f s left of %.0f s)",
                    self.name or "actor", type(err).__name__, method, wait, attempt + 1, left, self.deadline_s)
        return wait

    def _gone(self, err: Exception) -> bool:
        """The actor died for good: it died (not merely unavailable) and its name is free (a
        restarting actor keeps its name). Unknown without a name: then retried to the deadline."""
        if not self.name or isinstance(err, rex.ActorUnavailableError) or not isinstance(err, rex.ActorDiedError):
            return False
        try:
            ray.get_actor(self.name, namespace=self.namespace)
        except ValueError:
            return True
        return False

    def _send(self, method: str, args: tuple, kwargs: dict) -> Any:
        """One attempt: the ``ObjectRef`` of ``actor.<method>.remote(*args, **kwargs)``, on the
        handle looked up again after a failure. Raises ``ActorUnavailableError`` while the name is
        not registered (an actor being created anew), which the caller retries."""
        try:
            handle = self.handle
        except ValueError:
            raise rex.ActorUnavailableError(f"orchestrator {self.name!r} not registered (being created?)", None) from None
        return getattr(handle, method).remote(*args, **kwargs)

    def call(self, method: str, *args: Any, wait_s: float | None = None, **kwargs: Any) -> Any:
        """``ray.get(actor.<method>.remote(*args, **kwargs))``, re-sent while the actor restarts.

        Args:
            wait_s: the wait for one attempt's answer (None: no limit); a timeout is raised,
                not retried (the call may still be running).
        Raises:
            the actor's own errors, ``GetTimeoutError``; the last ``RayActorError`` once the
            deadline passed (or at once for a call that needs a ``call_id`` and has none).
        """
        started, attempt = time.monotonic(), 0
        retry = self._check(method, kwargs)
        while True:
            try:
                return ray.get(self._send(method, args, kwargs), timeout=wait_s)
            except RETRIED as err:
                time.sleep(self._failed(method, err, started, attempt, retry))
                attempt += 1

    async def acall(self, method: str, *args: Any, wait_s: float | None = None, **kwargs: Any) -> Any:
        """:meth:`call` for async code (awaits the reply and the back-off; never blocks the loop
        beyond a name lookup)."""
        started, attempt = time.monotonic(), 0
        retry = self._check(method, kwargs)
        while True:
            try:
                ref = self._send(method, args, kwargs)
                return await (asyncio.wait_for(ref, wait_s) if wait_s is not None else ref)
            except RETRIED as err:
                await asyncio.sleep(self._failed(method, err, started, attempt, retry))
                attempt += 1


def call_with_retry(handle: Any, method: str, *args: Any, deadline_s: float = DEADLINE_S, **kwargs: Any) -> Any:
    """One :meth:`ActorCalls.call` on ``handle`` (no lookup by name)."""
    return ActorCalls(handle, deadline_s=deadline_s).call(method, *args, **kwargs)


async def acall_with_retry(handle: Any, method: str, *args: Any, deadline_s: float = DEADLINE_S, **kwargs: Any) -> Any:
    """One :meth:`ActorCalls.acall` on ``handle`` (no lookup by name)."""
    return await ActorCalls(handle, deadline_s=deadline_s).acall(method, *args, **kwargs)
