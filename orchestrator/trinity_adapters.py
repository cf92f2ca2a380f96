"""Trinity-RFT adapters that talk to the running orchestrator actor.

Registered under ``dso_`` names (importing this module also registers everything of
:mod:`algos.trinity_plugin`), so a one-line plugin shim ``import orchestrator.trinity_adapters``
or the dotted class paths below make them available to ``trinity run``:

==========================  =====================  ===============================================
registry                    name                   class (dotted path usable in the YAML)
==========================  =====================  ===============================================
``EXPERIENCE_OPERATORS``    ``dso_orchestrator``   ``orchestrator.trinity_adapters.OrchestratorOperator``
``SELECTORS``               ``dso_orchestrator``   ``orchestrator.trinity_adapters.OrchestratorTaskSelector``
``ADVANTAGE_FN``            ``dso_gigpo_index``    ``orchestrator.trinity_adapters.DsoGiGPOIndexAdvantageFn``
==========================  =====================  ===============================================

How a Trinity run uses them::

    explorer --(selector.get_indices)--> actor.plan_round / select_tasks --> task indices
    explorer --rollouts--> experience pipeline: OrchestratorOperator.process(exps)
        - one summary per (task, run) -> actor.submit_groups -> keep / drop / carry over
        - actor.pop_batch until empty -> the Trinity experiences of each released batch
    --> advantage fn (grpo / dso_gigpo / dso_gigpo_index) --> Trinity queue --> trainer

Task identity: Trinity's ``eid.task`` is a position within an explore step, so the stable task
id is the dataset row, ``info["task_index"]["index"]`` (set by Trinity's workflow runner), as a
string; the selector creates the actor with task ids ``"0" .. str(dataset_size - 1)``. One
training taskset per orchestrator.

The experiences' tensors stay in the pipeline process: the actor only sees per-rollout summaries
(reward, metrics, policy version), which keeps its JSON ``state_dict`` small.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import EXPERIENCE_OPERATORS, ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

import algos.trinity_plugin as _plugin
from algos.dapo import GroupReason
from algos.gigpo import encode_keys, gigpo_advantages
from orchestrator.actor import DEFAULT_NAME, get_or_create_orchestrator
from orchestrator.anchor_index import (
    AnchorIndex,
    AnchorIndexError,
    AnchorStep,
    RedisAnchorIndex,
)
from orchestrator.anchor_owner import orchestrator_anchor_index
from orchestrator.policy import ResamplingPolicy
from orchestrator.types import Experience, ExperienceId, Group

log = logging.getLogger("trinity_dso.trinity")

OPERATOR_NAME = _plugin.OPERATOR_NAME
SELECTOR_NAME = _plugin.SELECTOR_NAME
INDEX_ADVANTAGE_NAME = "dso_gigpo_index"
"""Registered name of :class:`DsoGiGPOIndexAdvantageFn` (Trinity's own is ``gigpo``; ours ``dso_gigpo``)."""


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

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
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

    def feedback(self, indices: list[int], values: list[float]) -> None:
        """No-op: the orchestrator learns from the pipeline operator's submissions."""

    def state_dict(self) -> dict:
        """Tasks handed out so far and planned ones not yet handed out; the task order itself
        is in the actor's state."""
        return {"current_index": self.current_index, "pending": list(self.pending)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.current_index = int(state_dict.get("current_index", 0))
        self.pending = [str(t) for t in state_dict.get("pending", [])]


# ---------------------------------------------------------------------------------- GiGPO via the index
EPISODE_SUFFIX = ":episode"
"""Batch-key suffix under which the trajectories' total rewards are stored (one record each)."""
EPISODE_STATE = "episode"


class DsoGiGPOIndexAdvantageFn(AdvantageFn, ExperienceOperatorV1):
    """``dso_gigpo_index``: :class:`algos.trinity_plugin.DsoGiGPOAdvantageFn` with the statistics
    taken from the orchestrator's shared anchor index (GiGPO, arXiv 2505.10978, Eq. 3, 5-8).

    Per call (the experiences of one explore step, or a share of them):

    1. the rows are keyed exactly as ``dso_gigpo`` does (group = ``eid.tid``, trajectory =
       ``eid.rid``, step order ``eid.step``, step reward ``info[step_reward_key]`` or the
       terminal ``reward``, anchor state ``info[env_state_hash_key]``), and the discounted
       returns R_t (Eq. 5) and trajectory totals are computed locally
       (:func:`algos.gigpo.gigpo_advantages`, which also validates the steps);
    2. every step is written to the index under batch key ``trinity-<eid.batch>`` as an
       :class:`~orchestrator.anchor_index.AnchorStep` (task = ``eid.tid``, run = ``eid.run``,
       ``last`` = the trajectory's last step in the call); every trajectory's total reward is
       written once under ``trinity-<eid.batch>:episode`` (state ``"episode"``), so that the
       episode groups (Eq. 3, each trajectory counted once) are shared too. A step without a
       state hash gets a state of its own (A_S = 0, as in ``dso_gigpo``);
    3. with ``group_size`` set, it waits (up to ``wait_timeout_s``) until every group of the
       call has ``group_size`` complete trajectories in the index - written by this or any
       other advantage worker - then queries A_S per (group, state) and A_E per group from the
       index's moments (:meth:`AnchorIndex.step_advantages`, ``n_runs=group_size``);
    4. ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` as ``dso_gigpo`` does.

    When each call holds whole groups (Trinity's default), the numbers equal ``dso_gigpo``'s to
    ~1e-15 (one-pass moments vs. two-pass sums, both float64); when a group's trajectories are
    split over several workers or calls, each gets the statistics of the whole group, which a
    per-batch computation cannot. A trajectory's steps must arrive in one call.

    Where the index is: ``redis_url`` (a :class:`RedisAnchorIndex` opened here), else the
    orchestrator actor ``actor_name`` in ``namespace`` (default: the caller's Ray namespace,
    i.e. the run's), whose ``anchor_spec()`` names its Redis (queried directly) or its memory
    index (queried through the actor). When the actor exists, batch keys are registered with
    it (``anchor_register``, at the experiences' ``model_version``) so its version-based
    expiry drops them; otherwise the index TTL does.

    Args:
        omega, gamma, fnorm, epsilon, step_reward_key, env_state_hash_key: as ``dso_gigpo``.
        actor_name, namespace: the orchestrator actor (default ``dso-orchestrator``).
        redis_url, prefix, ttl_s: a Redis index to use without an actor (prefix and TTL as
            :class:`~orchestrator.anchor_owner.AnchorIndexConfig`).
        group_size: trajectories per group to wait for (usually ``algorithm.repeat_times``);
            None: the groups are whole in each call (no waiting, no completeness check).
        wait_timeout_s: longest wait for incomplete groups, seconds.
        lookup_timeout_s: longest wait for the actor to appear, seconds.
    Raises:
        pydantic.ValidationError: out-of-range GiGPO arguments.
        algos.gigpo.InvalidStepError: a non-finite reward, a duplicate or missing step.
        orchestrator.trinity_adapters.OrchestratorNotFoundError: no ``redis_url`` and no actor.
        orchestrator.anchor_owner.AnchorIndexNotConfiguredError: the actor has no anchor index.
        orchestrator.anchor_index.AnchorIndexError: Redis unreachable, batch state lost, a
            group still incomplete after ``wait_timeout_s``, or a conflicting re-insert.
    """

    def __init__(
        self,
        omega: float = _plugin._PAPER.omega,
        gamma: float = _plugin._PAPER.gamma,
        fnorm: str = _plugin._PAPER.norm,
        epsilon: float = _plugin._PAPER.eps,
        step_reward_key: str = "step_reward",
        env_state_hash_key: str = "env_state_hash",
        actor_name: str = DEFAULT_NAME,
        namespace: str | None = None,
        redis_url: str | None = None,
        prefix: str = "dso",
        ttl_s: float = 6 * 3600.0,
        group_size: int | None = None,
        wait_timeout_s: float = 60.0,
        lookup_timeout_s: float = 60.0,
        **kwargs: Any,
    ) -> None:
        self.local = _plugin.DsoGiGPOAdvantageFn(
            omega=omega, gamma=gamma, fnorm=fnorm, epsilon=epsilon,
            step_reward_key=step_reward_key, env_state_hash_key=env_state_hash_key,
        )
        self.config = self.local.config
        if group_size is not None and int(group_size) < 1:
            raise ValueError(f"group_size: must be >= 1 or null, got {group_size}")
        self.group_size = None if group_size is None else int(group_size)
        self.actor_name = actor_name
        self.namespace = namespace
        self.redis_url = redis_url
        self.prefix = prefix
        self.ttl_s = float(ttl_s)
        self.wait_timeout_s = float(wait_timeout_s)
        self.lookup_timeout_s = float(lookup_timeout_s)
        self._index: AnchorIndex | None = None
        self._actor: Any = None
        self.auxiliary_models = {}

    @classmethod
    def default_args(cls) -> dict:
        return {
            **_plugin.DsoGiGPOAdvantageFn.default_args(),
            "actor_name": DEFAULT_NAME,
            "namespace": None,
            "redis_url": None,
            "prefix": "dso",
            "ttl_s": 6 * 3600.0,
            "group_size": None,
            "wait_timeout_s": 60.0,
            "lookup_timeout_s": 60.0,
        }

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    # -- the index
    def index(self) -> AnchorIndex:
        """The anchor index (opened once): ``redis_url`` if set, else the actor's."""
        if self._index is None:
            if self.redis_url:
                self._index = RedisAnchorIndex(self.redis_url, prefix=self.prefix, ttl_s=self.ttl_s)
                try:
                    self._actor = find_orchestrator(self.actor_name, self.namespace, timeout_s=0.0)
                except OrchestratorNotFoundError:
                    self._actor = None  # no expiry by version: the TTL applies
            else:
                self._actor = find_orchestrator(self.actor_name, self.namespace, timeout_s=self.lookup_timeout_s)
                self._index = orchestrator_anchor_index(self._actor)
        return self._index

    def close_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    async def close(self) -> None:
        self.close_index()

    # -- computation
    def compute(self, exps: list[TrinityExperience]) -> dict[str, np.ndarray]:
        """GiGPO advantages of a call's experiences from the shared index.

        Returns:
            ``advantages``, ``episode`` (A_E), ``step`` (A_S), ``local`` (``dso_gigpo`` over this
            call alone), each (N,) float64 in the call's order; ``anchor_ids`` / ``anchor_sizes``
            (N,) int64 of the local grouping.
        Raises:
            see the class docstring.
        """
        r = self.local.rows(exps)
        cfg = self.config
        local = gigpo_advantages(r["group"], r["run"], r["step"], r["reward"], r["state"], config=cfg)
        n = len(exps)
        hkey = self.local.env_state_hash_key
        state = [
            str(e.info[hkey]) if (e.info or {}).get(hkey) is not None else f"dso-solo:{e.eid.rid}:{int(e.eid.step)}"
            for e in exps
        ]
        batch = np.array([f"trinity-{e.eid.batch}" for e in exps], dtype=object)
        run = np.array([int(e.eid.run) for e in exps], dtype=np.int64)
        traj, num_traj = encode_keys(r["run"])
        last = np.full(num_traj, -1, dtype=np.int64)
        np.maximum.at(last, traj, r["step"])
        first_row = np.full(num_traj, -1, dtype=np.int64)
        first_row[traj[::-1]] = np.arange(n)[::-1]
        versions = [int((e.info or {}).get("model_version", 0) or 0) for e in exps]
        index = self.index()
        episode = np.full(n, np.nan)
        step = np.full(n, np.nan)
        for bk in sorted(set(batch.tolist())):
            rows = np.flatnonzero(batch == bk)
            trajs = np.unique(traj[rows])
            if self._actor is not None:
                ray.get(self._actor.anchor_register.remote(bk, max(versions[i] for i in rows)))
                ray.get(self._actor.anchor_register.remote(bk + EPISODE_SUFFIX, max(versions[i] for i in rows)))
            steps = [
                AnchorStep(str(r["group"][i]), int(run[i]), int(r["step"][i]), state[i], float(local.returns[i]),
                           last=bool(r["step"][i] == last[traj[i]]))
                for i in rows
            ]
            ends = [
                AnchorStep(str(r["group"][i]), int(run[i]), 0, EPISODE_STATE, float(local.episode_returns[i]), last=True)
                for i in first_row[trajs]
            ]
            index.insert(bk, steps)
            index.insert(bk + EPISODE_SUFFIX, ends)
            groups = sorted(set(r["group"][rows].tolist()))
            n_runs = self.group_size
            if n_runs is not None:
                self._wait_complete(index, bk, groups, n_runs)
            tasks = [str(g) for g in r["group"][rows]]
            step[rows] = index.step_advantages(
                bk, tasks, [state[i] for i in rows], local.returns[rows], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs
            )
            episode[rows] = index.step_advantages(
                bk + EPISODE_SUFFIX, tasks, [EPISODE_STATE] * len(rows), local.episode_returns[rows],
                norm=cfg.norm, eps=cfg.eps, n_runs=n_runs,
            )
        return {
            "advantages": episode + cfg.omega * step,
            "episode": episode,
            "step": step,
            "local": local.advantages,
            "anchor_ids": local.anchor_ids,
            "anchor_sizes": local.anchor_sizes,
        }

    def _wait_complete(self, index: AnchorIndex, batch_key: str, groups: list[str], n_runs: int) -> None:
        deadline = time.monotonic() + self.wait_timeout_s
        delay = 0.02
        while True:
            done = index.completed_runs(batch_key)
            ends = index.completed_runs(batch_key + EPISODE_SUFFIX)
            short = {g: done.get(g, 0) for g in groups if done.get(g, 0) < n_runs or ends.get(g, 0) < n_runs}
            if not short:
                return
            if time.monotonic() >= deadline:
                raise AnchorIndexError(
                    f"group_size: after {self.wait_timeout_s:.0f}s these groups of batch {batch_key!r} still have fewer "
                    f"than {n_runs} complete trajectories in the anchor index: {dict(list(short.items())[:5])}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def process_sync(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` / ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the experiences, and the ``dso_gigpo/*`` metrics of ``dso_gigpo`` (anchor counts of
            this call) plus ``dso_gigpo_index/seconds`` (index round trips) and
            ``dso_gigpo_index/max_abs_diff_local`` (vs. ``dso_gigpo`` over this call alone:
            ~0 when the call holds whole groups).
        """
        if not exps:
            return [], {}
        t0 = time.perf_counter()
        res = self.compute(exps)
        seconds = time.perf_counter() - t0
        for e, a in zip(exps, res["advantages"].tolist()):
            if e.action_mask is not None:
                e.advantages = e.action_mask.to(torch.float32) * a
            else:
                e.advantages = torch.tensor(a, dtype=torch.float32)
            e.returns = e.advantages.clone()
        hkey = self.local.env_state_hash_key
        hashed = np.array([(e.info or {}).get(hkey) is not None for e in exps], dtype=bool)
        ids = np.unique(res["anchor_ids"][hashed])
        sizes = np.zeros(int(res["anchor_ids"].max()) + 1, dtype=np.int64)
        sizes[res["anchor_ids"]] = res["anchor_sizes"]
        total, hit = int(ids.size), int((sizes[ids] > 1).sum())
        metrics = {
            "dso_gigpo/mean_abs_A_E": float(np.abs(res["episode"]).mean()),
            "dso_gigpo/mean_abs_A_S": float(np.abs(res["step"]).mean()),
            "dso_gigpo/anchor_groups_total": total,
            "dso_gigpo/anchor_groups_size_gt1": hit,
            "dso_gigpo/anchor_group_hit_ratio": hit / total if total else 0.0,
            "dso_gigpo_index/seconds": seconds,
            "dso_gigpo_index/max_abs_diff_local": float(np.max(np.abs(res["advantages"] - res["local"]))),
        }
        return exps, metrics

    def __call__(self, exps, **kwargs):
        return self.process_sync(exps)

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """:meth:`process_sync` in a worker thread (index round trips block; the pipeline's loop does not)."""
        return await asyncio.to_thread(self.process_sync, exps)


# ---------------------------------------------------------------------------------- register
def register() -> bool:
    """Register the operator, the index GiGPO advantage and the selector (and
    :mod:`algos.trinity_plugin`), idempotently.

    Returns:
        True when the selector was registered too; False when Trinity's selector registry
        cannot be imported (it needs the ``datasets`` package, present in any install that
        reads tasksets) - the dotted path then still works wherever ``datasets`` is installed.
    """
    _plugin.register()
    _plugin.register_into(EXPERIENCE_OPERATORS, OPERATOR_NAME, OrchestratorOperator)
    _plugin.register_into(ADVANTAGE_FN, INDEX_ADVANTAGE_NAME, DsoGiGPOIndexAdvantageFn)
    try:
        from trinity.buffer.selector import SELECTORS
    except ImportError as err:  # pragma: no cover - depends on the install
        log.info("Trinity's selector registry is unavailable (%s); %s not registered", err, SELECTOR_NAME)
        return False
    _plugin.register_into(SELECTORS, SELECTOR_NAME, OrchestratorTaskSelector)
    return True


SELECTOR_REGISTERED = register()
