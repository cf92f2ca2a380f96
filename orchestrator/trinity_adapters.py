"""Trinity-RFT adapters that talk to the running orchestrator actor.

Registered under ``dso_`` names (importing this module also registers everything of
:mod:`algos.trinity_plugin`), so a one-line plugin shim ``import orchestrator.trinity_adapters``
or the dotted class paths below make them available to ``trinity run``:

==========================  =====================  ===============================================
registry                    name                   class (dotted path usable in the YAML)
==========================  =====================  ===============================================
``EXPERIENCE_OPERATORS``    ``dso_orchestrator``   ``orchestrator.trinity_adapters.OrchestratorOperator``
``SELECTORS``               ``dso_orchestrator``   ``orchestrator.trinity_adapters.OrchestratorTaskSelector``
==========================  =====================  ===============================================

How a Trinity run uses them::

    explorer --(selector.get_indices)--> actor.plan_round / select_tasks --> task indices
    explorer --rollouts--> experience pipeline: OrchestratorOperator.process(exps)
        - one summary per (task, run) -> actor.submit_groups -> keep / drop / carry over
        - actor.pop_batch until empty -> the Trinity experiences of each released batch
    --> advantage fn (grpo / dso_gigpo) --> Trinity queue --> trainer

Task identity: Trinity's ``eid.task`` is a position within an explore step, so the stable task
id is the dataset row, ``info["task_index"]["index"]`` (set by Trinity's workflow runner), as a
string; the selector creates the actor with task ids ``"0" .. str(dataset_size - 1)``. One
training taskset per orchestrator.

The experiences' tensors stay in the pipeline process: the actor only sees per-rollout summaries
(reward, metrics, policy version), which keeps its JSON ``state_dict`` small.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import ray
import torch
from trinity.buffer.operators import EXPERIENCE_OPERATORS, ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

import algos.trinity_plugin as _plugin
from algos.dapo import GroupReason
from orchestrator.actor import DEFAULT_NAME, get_or_create_orchestrator
from orchestrator.policy import ResamplingPolicy
from orchestrator.types import Experience, ExperienceId, Group

log = logging.getLogger("trinity_dso.trinity")

OPERATOR_NAME = _plugin.OPERATOR_NAME
SELECTOR_NAME = _plugin.SELECTOR_NAME


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
    def of_size(cls, n: int) -> "IndexTaskSet":
        if n <= 0:
            raise ValueError(f"num_tasks: must be > 0, got {n}")
        return cls([str(i) for i in range(n)])

    def get(self, task_id: str):
        raise LookupError(f"task {task_id!r}: Trinity's explorer owns the prompts; this orchestrator has no rollout source")


def _namespace(namespace: str | None) -> str:
    return namespace or ray.get_runtime_context().namespace


def find_orchestrator(name: str, namespace: str | None, *, timeout_s: float = 0.0) -> Any:
    """The named actor in ``namespace`` (default: the caller's Ray namespace, i.e. the run's).

    Polls up to ``timeout_s`` seconds (the task selector usually creates it first).
    Raises:
        OrchestratorNotFoundError: not there after ``timeout_s``.
    """
    ns = _namespace(namespace)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(name, namespace=ns)
        except ValueError:
            if time.monotonic() >= deadline:
                raise OrchestratorNotFoundError(
                    f"actor_name: no orchestrator {name!r} in Ray namespace {ns!r}; configure the "
                    f"{SELECTOR_NAME!r} data selector on the taskset, or give the operator num_tasks"
                ) from None
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


# ---------------------------------------------------------------------------------- operator
class OrchestratorOperator(ExperienceOperatorV1):
    """Experience-pipeline operator ``dso_orchestrator``: forward to the orchestrator, pass on what it releases.

    Each call receives the experiences of one explore step. They are grouped into rollouts
    (``eid.rid``: one trajectory, one or more steps) and groups (``eid.tid``: the n rollouts of
    one task). Each rollout is summarised for the actor as one :class:`orchestrator.types.Experience`:

    * ``reward``: the sum of ``info["step_reward"]`` over its steps when present, else the last
      step's ``reward`` (single-turn: the reward);
    * ``metrics``: the last step's metrics (e.g. ``accuracy``, which the filter may judge);
    * ``info["policy_version"]``: Trinity's ``info["model_version"]``.

    Complete groups (exactly ``group_size`` runs) are submitted with ``submit_groups``; every
    batch the actor then releases (``pop_batch`` until empty) is expanded back to its Trinity
    experiences (all steps), in group order, and returned. Groups released as padding
    (``on_cap="pad"``) get an all-zero ``action_mask`` (zero loss weight) and
    ``info["dso_padding"] = True``. Every released experience carries ``info["dso_batch_id"]``
    and ``info["dso_reason"]``.

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
        algos.dapo.InvalidGroupError: a group the orchestrator rejects (e.g. a NaN reward).
        orchestrator.core.ReplenishCapError: cap hit under ``on_cap="raise"``.
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
            eid=ExperienceId(task=task_id, run=int(last.eid.run), step=0, batch=str(last.eid.batch)),
            prompt_length=int(last.prompt_length),
            reward=reward,
            info={"policy_version": version, "trinity_rid": last.eid.rid, "num_steps": len(steps)},
            metrics={k: float(v) for k, v in (last.metrics or {}).items() if isinstance(v, (int, float))},
        )

    def to_groups(self, exps: List[TrinityExperience]) -> tuple[list[Group], dict[str, list[TrinityExperience]], int]:
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
        for tid, rids in tids.items():
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
            version = max(r.info["policy_version"] for r in rollouts)
            groups.append(Group(task_id=task_id, rollouts=rollouts, policy_version=version, round=self._rounds_open))
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

    async def process(self, exps: List[TrinityExperience]) -> Tuple[List[TrinityExperience], Dict]:
        actor = self.actor()
        groups, payload, incomplete = self.to_groups(exps)
        labels: list[str] = []
        if groups:
            labels = await actor.submit_groups.remote(groups)
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
        metrics = {
            "dso/groups_submitted": len(groups),
            "dso/groups_kept": sum(label == GroupReason.INFORMATIVE.label for label in labels),
            "dso/groups_incomplete": incomplete,
            "dso/batches_released": batches,
            "dso/groups_padding": padded,
            "dso/experiences_released": len(released),
            "dso/rollouts_held": len(self._payload),
        }
        return released, metrics


# ---------------------------------------------------------------------------------- selector
class OrchestratorTaskSelector:
    """Task selector ``dso_orchestrator``: the orchestrator picks the explorer's next tasks.

    Implements the interface of Trinity's ``trinity.buffer.selector.BaseSelector``
    (``get_indices``, ``feedback``, ``state_dict``, ``load_state_dict``) without subclassing
    it, so this module imports without Trinity's file reader (which needs ``datasets``).

    Each ``get_indices(batch_size)`` (one explore step) hands out exactly ``batch_size`` tasks
    (Trinity reads a fixed number per step): first those left over from earlier plans, then
    the tasks of a new ``plan_round`` of the actor (with ``replenish="same_tasks"`` the tasks
    dropped in the open batch come first, then tasks in the actor's epoch order minus those in
    a history cooldown, ``skip_after_all_correct`` / ``skip_after_all_wrong``), topped up with
    ``select_tasks`` when a plan is short. A plan larger than ``batch_size`` is spread over the
    next explore steps (kept in ``pending`` and in ``state_dict``), so no planned task is lost
    from the epoch order.

    Creates the actor (named ``actor_name`` in the run's namespace, task ids ``"0" .. N-1``)
    when it does not exist yet.

    Args:
        data_source: Trinity's ``_HFBatchReader``; only ``dataset_size`` is read.
        config: Trinity's ``DataSelectorConfig``; ``config.seed`` seeds the task order and
            ``config.kwargs`` may hold ``actor_name``, ``namespace`` and ``policy``.
    """

    def __init__(self, data_source: Any, config: Any) -> None:
        kwargs = dict(getattr(config, "kwargs", None) or {})
        self.dataset_size = int(data_source.dataset_size)
        self.actor_name = kwargs.get("actor_name", DEFAULT_NAME)
        self.namespace = kwargs.get("namespace")
        policy = ResamplingPolicy.parse(dict(kwargs.get("policy") or {}))
        self.actor = get_or_create_orchestrator(
            policy, IndexTaskSet.of_size(self.dataset_size), seed=int(getattr(config, "seed", 0) or 0),
            name=self.actor_name, namespace=_namespace(self.namespace),
        )
        self.current_index = 0
        self.pending: list[str] = []  # planned task ids not yet handed out
        self._last_plan: dict = {}

    def get_indices(self, batch_size: int, return_extra_info: bool = False):
        """Exactly ``batch_size`` dataset indices (ints in [0, dataset_size)), per the orchestrator.

        Leftovers of earlier plans first; a new ``plan_round`` only when they do not fill the
        step; ``select_tasks`` tops up a short plan. Extra info: the latest plan's
        ``purpose``, ``round`` and ``batch_id``.
        """
        ids = self.pending[:batch_size]
        self.pending = self.pending[batch_size:]
        if len(ids) < batch_size:
            plan = ray.get(self.actor.plan_round.remote())
            self._last_plan = {"purpose": plan.purpose, "round": plan.round, "batch_id": plan.batch_id}
            planned = list(plan.task_ids)
            take = batch_size - len(ids)
            ids += planned[:take]
            self.pending = planned[take:]
        if len(ids) < batch_size:
            ids += ray.get(self.actor.select_tasks.remote(batch_size - len(ids)))
        indices = [int(t) for t in ids]
        self.current_index += len(indices)
        if return_extra_info:
            return indices, dict(self._last_plan)
        return indices

    def feedback(self, indices: List[int], values: List[float]) -> None:
        """No-op: the orchestrator learns from the pipeline operator's submissions."""

    def state_dict(self) -> Dict:
        """Tasks handed out so far and planned ones not yet handed out; the task order itself
        is in the actor's state."""
        return {"current_index": self.current_index, "pending": list(self.pending)}

    def load_state_dict(self, state_dict: Dict) -> None:
        self.current_index = int(state_dict.get("current_index", 0))
        self.pending = [str(t) for t in state_dict.get("pending", [])]


# ---------------------------------------------------------------------------------- register
def register() -> bool:
    """Register the operator and the selector (and :mod:`algos.trinity_plugin`), idempotently.

    Returns:
        True when the selector was registered too; False when Trinity's selector registry
        cannot be imported (it needs the ``datasets`` package, present in any install that
        reads tasksets) - the dotted path then still works wherever ``datasets`` is installed.
    """
    _plugin.register()
    _plugin.register_into(EXPERIENCE_OPERATORS, OPERATOR_NAME, OrchestratorOperator)
    try:
        from trinity.buffer.selector import SELECTORS
    except ImportError as err:  # pragma: no cover - depends on the install
        log.info("Trinity's selector registry is unavailable (%s); %s not registered", err, SELECTOR_NAME)
        return False
    _plugin.register_into(SELECTORS, SELECTOR_NAME, OrchestratorTaskSelector)
    return True


SELECTOR_REGISTERED = register()
