"""Run attachment and policy writes of the orchestrator actor: :class:`Attachment`, a part of
:class:`orchestrator.service.actor.Orchestrator`.

One orchestrator serves one Trinity run: the first ``attach_run`` binds it, later ones of the
same run are accepted (a restarted explorer's selector gets the tasks its predecessor took back
first; a restarted operator's previous last hand-out is named as unconfirmed). The run's pinned
policy fields (what Trinity's trainer batch size is built from) are set at attach and refused by
later policy writes; every policy write is checked here (:func:`check_source` included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.service.names import PinnedPolicyError, PolicyConflictError, RunConflictError
from orchestrator.service.persist import Ledger

log = logging.getLogger("trinity_dso.actor")


def check_source(policy: ResamplingPolicy, rollout_source: Any) -> None:
    """Refuse, at config time, a policy the rollout source cannot serve: a ``filter.judge``
    metric it does not produce, or the answer screen with a source that cannot score answers.

    A source declares the metrics it writes in ``metric_names`` (a tuple); sources that do not
    declare it, and ``judge`` values ``reward`` / ``auto``, are not checked. A source scores
    answers when it has ``answer_probability`` (the vLLM source does).

    Raises:
        InvalidPolicyError: names the field, the value and the source.
    """
    judge = policy.filter.judge
    names = getattr(rollout_source, "metric_names", None)
    if not (judge in ("reward", "auto") or names is None or judge in names):
        raise InvalidPolicyError(
            f"invalid resampling policy: filter.judge: {type(rollout_source).__name__} produces metrics "
            f"{sorted(names)}, not {judge!r} (use one of them, 'reward' or 'auto')"
        )
    if policy.screen == "answer" and rollout_source is not None and not hasattr(rollout_source, "answer_probability"):
        raise InvalidPolicyError(
            f"invalid resampling policy: screen: 'answer' needs a rollout source that scores answers "
            f"(answer_probability, e.g. the vLLM source); {type(rollout_source).__name__} cannot"
        )


def policy_view(core: OrchestratorCore) -> dict:
    """``{"revision": int, "policy": dict}``: the core's policy as the actor's ``get_policy`` answers it."""
    return {"revision": core.policy_revision, "policy": core.policy.model_dump(mode="json")}


class Attachment:
    """Attach a run, pin its fields, write the policy.

    Args:
        core: the state machine (its policy is written here).
        ledger: the retry window's last call (:class:`~orchestrator.service.persist.Ledger`),
            named as unconfirmed when the operator restarts.
        rollout_source: what the policy is checked against (:func:`check_source`).
        observe: ``observe()``, called after a policy change (the actor's background jobs).
    Attributes:
        info: the attached run: ``run``, ``pinned``, ``pinned_by``, ``selector_session``,
            ``operator_session``, ``unconfirmed`` (``{}`` before any attach); checkpointed.
    """

    def __init__(self, core: OrchestratorCore, *, ledger: Ledger, rollout_source: Any, observe: Callable[[], None]) -> None:
        self.core, self.ledger, self.rollout_source, self.observe = core, ledger, rollout_source, observe
        self.info: dict[str, Any] = {}

    def state_dict(self) -> dict:
        return {"attachment": dict(self.info)}

    def load_state_dict(self, state: dict) -> None:
        self.info = dict(state.get("attachment") or {})

    def attach_run(self, run: str, session: str, role: str, num_tasks: int | None, pinned: dict | None,
                    pinned_by: str) -> dict:
        bound = self.info.get("run")
        if bound is not None and bound != run:
            raise RunConflictError(
                f"run: orchestrator serves run {bound!r}; run {run!r} must use its own actor_name "
                "(one orchestrator per run, so that each run's groups, history and metrics stay apart)"
            )
        if num_tasks is not None and len(self.core.task_ids) != int(num_tasks):
            raise RunConflictError(
                f"num_tasks: run {run!r} has {num_tasks} tasks but this orchestrator was created with "
                f"{len(self.core.task_ids)}; use another actor_name or delete its checkpoint"
            )
        pinned = {k: v for k, v in (pinned or {}).items() if v is not None}
        changes = {k: v for k, v in pinned.items() if getattr(self.core.policy, k) != v}
        self.info.update(run=run, pinned=pinned, pinned_by=pinned_by)
        if changes:
            self._apply_policy(self.core.policy.updated(changes), changes)
        requeued: list[str] = []
        if role == "selector" and self.info.get("selector_session") != session:
            if self.info.get("selector_session") is not None:
                requeued = self.core.requeue_in_flight()
                log.warning("run %s: explorer restarted (session %s); %d tasks it took are handed out again",
                            run, session, len(requeued))
            self.info["selector_session"] = session
        if role == "operator" and self.info.get("operator_session") != session:
            self._operator_restarted(run, session)
        log.info("run %s: %s attached (session %s, pinned %s)", run, role, session, pinned)
        return {"run": run, "pinned": dict(pinned), "requeued": requeued,
                "unconfirmed": dict(self.info.get("unconfirmed") or {})}

    def _operator_restarted(self, run: str, session: str) -> None:
        """A new operator session (a new explorer process): name the batches handed to the previous
        session's last call. Nothing tells whether its pipeline wrote them to Trinity's buffer
        before it died, and they are not handed out again (at most once: handing them out again
        would duplicate every batch the dead pipeline had written, a far likelier case)."""
        before = self.info.get("operator_session")
        self.info["operator_session"] = session
        if before is None or self.ledger.last_call is None or not self.ledger.last_call[0].startswith(f"{before}:"):
            return
        ids = [int(b.batch_id) for b in self.ledger.last_call[1]]
        self.info["unconfirmed"] = {"session": before, "batch_ids": ids}
        log.warning("run %s: explorer restarted (operator session %s); batches %s, handed to the previous "
                    "session's last call, reached Trinity's buffer only if its pipeline wrote them before it died",
                    run, session, ids)

    def set_policy(self, changes: dict, expected_revision: int | None, replace: bool) -> dict:
        if not isinstance(changes, dict):
            raise InvalidPolicyError(f"policy: expected an object of fields, got {type(changes).__name__}")
        if expected_revision is not None and expected_revision != self.core.policy_revision:
            raise PolicyConflictError(
                f"revision: expected {expected_revision} but the policy is at revision {self.core.policy_revision}"
            )
        new = ResamplingPolicy.parse(changes) if replace else self.core.policy.updated(changes)
        check_source(new, self.rollout_source)
        if new.screen == "rollouts" and self.rollout_source is None:  # an attached explorer rolls whole groups
            raise InvalidPolicyError("screen: 'rollouts' needs the orchestrator's own rollout source; "
                                     "an attached explorer (Trinity) rolls all repeat_times at once, so a screen cannot stop a "
                                     "group (docs/reference/sampling.md); the policy is unchanged")
        if new.screen == "answer" and self.rollout_source is None:
            raise InvalidPolicyError("screen: 'answer' needs the orchestrator's own rollout source (it scores answers "
                                     "before rolling them out); an attached explorer (Trinity) rolls the tasks it is handed "
                                     "(docs/reference/sampling.md); the policy is unchanged")
        pinned = self.info.get("pinned") or {}
        broken = [f"{k}: pinned to {v} by run {self.info.get('run')!r}, got {getattr(new, k)}"
                  for k, v in pinned.items() if getattr(new, k) != v]
        if broken:
            raise PinnedPolicyError(
                "; ".join(broken) + f" ({self.info.get('pinned_by') or 'the trainer batch size depends on it'}); "
                "the policy is unchanged"
            )
        self._apply_policy(new, changes)
        return policy_view(self.core)

    def _apply_policy(self, new: ResamplingPolicy, changes: dict) -> None:
        try:
            self.core.set_policy(new)
        except ValueError as err:
            raise InvalidPolicyError(str(err)) from None
        log.info("policy revision %d: %s", self.core.policy_revision, changes)
        self.observe()
