"""The ``dso_orchestrator`` experience-pipeline operator: Trinity's rollouts in, the orchestrator's batches out."""

from __future__ import annotations

import logging
from typing import Any

import torch
from trinity.buffer.operators import ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.dapo import GroupReason
from orchestrator.core.machine import DataExhaustedError
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.service.actor import DEFAULT_NAME, get_or_create_orchestrator
from orchestrator.trinity.attach import IndexTaskSet, _namespace, find_orchestrator, trinity_task_id

log = logging.getLogger("trinity_dso.trinity")


class OrchestratorOperator(ExperienceOperatorV1):
    """Experience-pipeline operator ``dso_orchestrator``: forward to the orchestrator, pass on what it releases.

    Each call receives the experiences of one explore step. They are grouped into rollouts
    (``eid.rid``: one trajectory, one or more steps) and groups (``eid.tid``: the n rollouts of
    one task). Each rollout is summarised for the actor as one :class:`orchestrator.core.types.Experience`:

    * ``reward``: the sum of ``info["step_reward"]`` over its steps when present, else the last
      step's ``reward`` (single-turn: the reward);
    * ``metrics``: the last step's metrics (e.g. ``accuracy``, which the filter may judge);
    * ``info["model_version"]``: Trinity's ``info["model_version"]`` (each member keeps its own;
      the group is stamped with its *oldest* member's, so staleness is judged per member).

    Complete groups (exactly ``group_size`` runs) are submitted with ``submit_groups(...,
    on_invalid="drop")``: a group the orchestrator cannot use (e.g. a ``None`` reward under
    ``group_validity="reject"``) is dropped with reason ``invalid``, counted
    (``dso/groups_invalid``) and logged by the actor, and the other groups of the step go on. Every
    batch the actor then releases (``pop_batch`` until empty) is expanded back to its Trinity
    experiences (all steps), in group order, and returned. Groups released as padding
    (``on_cap="pad"``) get an all-zero ``action_mask`` (zero loss weight) and
    ``info["dso_padding"] = True``. Every released experience carries ``info["dso_batch_id"]``
    and ``info["dso_reason"]``.

    End of data: when the actor is exhausted (``max_epochs`` / ``max_rollouts``) and nothing
    was released, its kept groups are released as a last batch (``finish_batch``, per ``on_cap``).

    Replenish cap: one explore step counts as one round. When ``policy.max_replenish_rounds``
    is > 0 and that many rounds after the first passed without a release, the operator closes
    the open batch (``close_batch``: pad, partial or raise per ``policy.on_cap``).

    Args:
        actor_name: the actor's name (default ``dso-orchestrator``).
        namespace: its Ray namespace; default the pipeline's own (the Trinity run's).
        policy: resampling policy fields, used only if this operator creates the actor.
        num_tasks: size of the training taskset; needed only to create the actor here.
        lookup_timeout_s: how long to wait for the actor to appear, in seconds.
        seed: seed of the actor's task order (only when created here).
    Raises:
        OrchestratorNotFoundError: at the first call, no actor and no ``num_tasks``.
        orchestrator.core.machine.ReplenishCapError: cap hit under ``on_cap="raise"``.
    """

    def __init__(
        self,
        actor_name: str = DEFAULT_NAME,
        namespace: str | None = None,
        policy: dict | None = None,
        num_tasks: int | None = None,
        lookup_timeout_s: float = 60.0,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        self.actor_name = actor_name
        self.namespace = namespace
        self.policy = ResamplingPolicy.parse(dict(policy or {}))
        self.num_tasks = num_tasks
        self.lookup_timeout_s = float(lookup_timeout_s)
        self.seed = seed
        self._actor = None
        self._payload: dict[str, list[TrinityExperience]] = {}  # rid -> steps (sorted)
        self._held_dropped: set[str] = set()  # rids of non-informative groups (padding candidates)
        self._rounds_open = 0  # explore steps submitted since the last release
        self.auxiliary_models = {}

    def actor(self) -> Any:
        """The orchestrator actor handle (looked up once, created when ``num_tasks`` is given)."""
        if self._actor is None:
            if self.num_tasks:
                self._actor = get_or_create_orchestrator(
                    self.policy, IndexTaskSet.of_size(int(self.num_tasks)), seed=self.seed,
                    name=self.actor_name, namespace=_namespace(self.namespace),
                )
            else:
                self._actor = find_orchestrator(self.actor_name, self.namespace, timeout_s=self.lookup_timeout_s)
        return self._actor

    @staticmethod
    def summarise(task_id: str, steps: list[TrinityExperience]) -> Experience:
        """One summary rollout for the actor from the (step-sorted) experiences of one run."""
        last = steps[-1]
        if any("step_reward" in (s.info or {}) for s in steps):
            reward = float(sum(float((s.info or {}).get("step_reward", 0.0)) for s in steps))
        else:
            reward = float(last.reward) if last.reward is not None else float("nan")
        version = int((last.info or {}).get("model_version", 0) or 0)
        return Experience(
            eid=ExperienceId(task=task_id, run=int(last.eid.run), step=0, round_tag=str(last.eid.batch)),
            prompt_length=int(last.prompt_length),
            reward=reward,
            info={"model_version": version, "trinity_rid": last.eid.rid, "num_steps": len(steps)},
            metrics={k: float(v) for k, v in (last.metrics or {}).items() if isinstance(v, (int, float))},
        )

    def to_groups(self, exps: list[TrinityExperience]) -> tuple[list[Group], dict[str, list[TrinityExperience]], int]:
        """Group one explore step's experiences.

        Returns:
            complete groups (summaries, runs sorted), the payload per rid of those groups, and
            the number of incomplete groups left out (fewer or more runs than ``group_size``).
        """
        runs: dict[str, list[TrinityExperience]] = {}
        tids: dict[str, list[str]] = {}
        for e in exps:
            rid = e.eid.rid
            if rid not in runs:
                runs[rid] = []
                tids.setdefault(e.eid.tid, []).append(rid)
            runs[rid].append(e)
        n = self.policy.group_size
        groups, payload, incomplete = [], {}, 0
        for rids in tids.values():
            if len(rids) != n:
                incomplete += 1
                continue
            task_id = trinity_task_id(runs[rids[0]][0])
            rollouts = []
            for rid in rids:
                steps = sorted(runs[rid], key=lambda s: int(s.eid.step))
                payload[rid] = steps
                rollouts.append(self.summarise(task_id, steps))
            rollouts.sort(key=lambda r: r.eid.run)
            version = min(r.info["model_version"] for r in rollouts)  # the oldest member: staleness is per member
            groups.append(Group(task_id=task_id, rollouts=rollouts, model_version=version, round=self._rounds_open))
        return groups, payload, incomplete

    def expand(self, batch: Any) -> list[TrinityExperience]:
        """The Trinity experiences of a released batch, padding masked out; frees their payload."""
        out: list[TrinityExperience] = []
        for g in batch.groups:
            for r in g.rollouts:
                rid = r.info["trinity_rid"]
                steps = self._payload.pop(rid, None)
                if steps is None:
                    raise KeyError(
                        f"trinity_rid: no experiences held for {rid!r} (task {g.task_id!r}); the pipeline "
                        "restarted while the orchestrator kept this group"
                    )
                self._held_dropped.discard(rid)
                for s in steps:
                    s.info["dso_batch_id"] = int(batch.batch_id)
                    s.info["dso_reason"] = g.reason
                    if g.padding:
                        s.info["dso_padding"] = True
                        if s.action_mask is not None:
                            s.action_mask = torch.zeros_like(s.action_mask)
                out.extend(steps)
        # padding candidates not used are dropped by the core at each release
        for rid in self._held_dropped:
            self._payload.pop(rid, None)
        self._held_dropped.clear()
        return out

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        actor = self.actor()
        groups, payload, incomplete = self.to_groups(exps)
        labels: list[str] = []
        if groups:
            labels = await actor.submit_groups.remote(groups, on_invalid="drop")
            self._payload.update(payload)
            for g, label in zip(groups, labels):
                if label != GroupReason.INFORMATIVE.label:
                    self._held_dropped.update(r.info["trinity_rid"] for r in g.rollouts)
            self._rounds_open += 1
        released: list[TrinityExperience] = []
        batches = 0
        padded = 0
        while (batch := await actor.pop_batch.remote()) is not None:
            released.extend(self.expand(batch))
            batches += 1
            padded += batch.num_padding
            self._rounds_open = 0
        cap = self.policy.max_replenish_rounds
        if not batches and cap > 0 and self._rounds_open > cap:
            batch = await actor.close_batch.remote()
            released.extend(self.expand(batch))
            batches += 1
            padded += batch.num_padding
            self._rounds_open = 0
        if not batches and await actor.exhausted.remote():
            try:
                batch = await actor.finish_batch.remote()
            except DataExhaustedError:
                batch = None
            if batch is not None:
                released.extend(self.expand(batch))
                batches += 1
                padded += batch.num_padding
                self._rounds_open = 0
        metrics = {
            "dso/groups_submitted": len(groups),
            "dso/groups_kept": sum(label == GroupReason.INFORMATIVE.label for label in labels),
            "dso/groups_incomplete": incomplete,
            "dso/groups_invalid": sum(label == GroupReason.INVALID.label for label in labels),
            "dso/batches_released": batches,
            "dso/groups_padding": padded,
            "dso/experiences_released": len(released),
            "dso/rollouts_held": len(self._payload),
        }
        return released, metrics


