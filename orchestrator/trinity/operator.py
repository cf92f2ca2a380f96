"""The ``dso_orchestrator`` experience-pipeline operator: Trinity's rollouts in, the orchestrator's batches out."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch
from trinity.buffer.operators import ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.dapo import GroupReason
from orchestrator.core.machine import DataExhaustedError
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.trinity.attach import (
    AttachConfig,
    create_orchestrator,
    find_orchestrator_async,
    new_session,
    trinity_task_id,
)

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

    Held groups survive an explorer restart: the experiences of every submitted rollout are
    written to ``held_dir`` (Trinity's ``Experience.serialize_many``, one file per rollout)
    before the actor sees it, and deleted when released or dropped. A group carried over by
    the actor is then released by the next explorer process from that file; its ``eid.batch``
    gets ``@<session>`` appended, so that it never shares an ``eid.tid`` (the GRPO grouping key)
    with a group of the new process, which numbers its explore steps from its checkpoint again.

    Args (the pipeline's ``operators[...].args``): an
        :class:`~orchestrator.trinity.attach.AttachConfig` (``actor_name``, ``namespace``,
        ``policy``, ``held_dir``, ...), filled by ``configure_orchestrated_run``. With
        ``num_tasks`` the operator creates the actor when absent; without, it waits up to
        ``lookup_timeout_s`` for the selector (or ``trinity-dso serve``) to create it.
    Raises:
        OrchestratorNotFoundError: at the first call, no actor and no ``num_tasks``.
        orchestrator.service.actor.RunConflictError: the actor serves another run.
        orchestrator.core.machine.ReplenishCapError: cap hit under ``on_cap="raise"``.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.settings = AttachConfig.parse(kwargs, "operators[dso_orchestrator].args")
        self.policy = self.settings.resampling_policy()
        self.session = new_session()
        self.held_dir = Path(self.settings.held_dir) if self.settings.held_dir else None
        self._actor = None
        self._payload: dict[str, list[TrinityExperience]] = {}  # held key -> steps (sorted)
        self._held_dropped: set[str] = set()  # keys of non-informative groups (padding candidates)
        self._rounds_open = 0  # explore steps submitted since the last release
        self.auxiliary_models = {}

    async def actor(self) -> Any:
        """The orchestrator actor (created with ``num_tasks``, else looked up), attached to the run once."""
        if self._actor is None:
            cfg = self.settings
            if cfg.num_tasks:
                actor = create_orchestrator(cfg, cfg.num_tasks)
            else:
                actor = await find_orchestrator_async(cfg.actor_name, cfg.namespace, timeout_s=cfg.lookup_timeout_s)
            await actor.attach_run.remote(
                cfg.run or "trinity-run", session=self.session, role="operator", num_tasks=cfg.num_tasks,
                pinned=dict(cfg.pinned), pinned_by=cfg.pinned_by,
            )
            self._actor = actor
        return self._actor

    # ------------------------------------------------------------- held experiences
    def _file(self, key: str) -> Path | None:
        return self.held_dir / (quote(key, safe="") + ".bin") if self.held_dir is not None else None

    def _hold(self, payload: dict[str, list[TrinityExperience]]) -> None:
        self._payload.update(payload)
        if self.held_dir is None:
            return
        self.held_dir.mkdir(parents=True, exist_ok=True)
        for key, steps in payload.items():
            path = self._file(key)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(TrinityExperience.serialize_many(steps))
            os.replace(tmp, path)

    def _take(self, key: str, task_id: str) -> list[TrinityExperience]:
        steps = self._payload.pop(key, None)
        path = self._file(key)
        if steps is None and path is not None and path.exists():
            steps = TrinityExperience.deserialize_many(path.read_bytes())
            session = key.split(":", 1)[0]
            for s in steps:  # never share an eid.tid with a group of this process
                s.eid.batch = f"{s.eid.batch}@{session}"
        if path is not None:
            path.unlink(missing_ok=True)
        if steps is None:
            raise KeyError(
                f"trinity_rid: no experiences held for {key!r} (task {task_id!r}); set held_dir to a path "
                "that survives an explorer restart"
            )
        return steps

    def _forget(self, key: str) -> None:
        self._payload.pop(key, None)
        path = self._file(key)
        if path is not None:
            path.unlink(missing_ok=True)

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
                summary = self.summarise(task_id, steps)
                summary.info["trinity_rid"] = key = f"{self.session}:{rid}"
                payload[key] = steps
                rollouts.append(summary)
            rollouts.sort(key=lambda r: r.eid.run)
            version = min(r.info["model_version"] for r in rollouts)  # the oldest member: staleness is per member
            groups.append(Group(task_id=task_id, rollouts=rollouts, model_version=version, round=self._rounds_open))
        return groups, payload, incomplete

    def expand(self, batch: Any) -> list[TrinityExperience]:
        """The Trinity experiences of a released batch, padding masked out; frees their payload."""
        out: list[TrinityExperience] = []
        for g in batch.groups:
            for r in g.rollouts:
                key = r.info["trinity_rid"]
                steps = self._take(key, g.task_id)
                self._held_dropped.discard(key)
                for s in steps:
                    s.info["dso_batch_id"] = int(batch.batch_id)
                    s.info["dso_reason"] = g.reason
                    if g.padding:
                        s.info["dso_padding"] = True
                        if s.action_mask is not None:
                            s.action_mask = torch.zeros_like(s.action_mask)
                out.extend(steps)
        # padding candidates not used are dropped by the core at each release
        for key in self._held_dropped:
            self._forget(key)
        self._held_dropped.clear()
        return out

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        actor = await self.actor()
        # the live policy (a REST change of the cap or filter applies from this step on)
        self.policy = ResamplingPolicy.parse((await actor.get_policy.remote())["policy"])
        groups, payload, incomplete = self.to_groups(exps)
        labels: list[str] = []
        if groups:
            self._hold(payload)  # on disk before the actor holds the groups
            labels = await actor.submit_groups.remote(groups, on_invalid="drop")
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


