"""Advantage functions for Trinity, vectorised over the batch: ``dso_grpo`` (the DAPO bundle's
group-relative advantages), ``dso_gigpo`` (in process) and ``dso_gigpo_index`` (through the
orchestrator's anchor index).

Each reads the fields it needs off the experiences once, into arrays; computes on the arrays;
and writes the token advantages back with
:func:`orchestrator.trinity.writeback.write_token_advantages` (a constant number of
tensor operations for the whole batch, not one multiply and one copy per experience).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import numpy as np
import ray
from pydantic import ValidationError
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperator, ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.checks import check_number
from algos.dapo import InvalidGroupError
from algos.gigpo import (
    GiGPOAdvantages,
    GiGPOConfig,
    InvalidStepError,
    discounted_returns,
    encode_keys,
    gigpo_advantages,
    gigpo_advantages_coded,
)
from algos.groups import first_rows, group_value_order
from orchestrator.anchors.index import AnchorIndex, trajectory_records
from orchestrator.anchors.owner import orchestrator_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex
from orchestrator.service.names import DEFAULT_NAME
from orchestrator.trinity.attach import OrchestratorNotFoundError, find_orchestrator
from orchestrator.trinity.fields import NO_INFO, REWARD, MemoryOrder, group_codes, masked_rows
from orchestrator.trinity.steps import StepRows
from orchestrator.trinity.writeback import TokenMasks, gc_paused, write_token_advantages

log = logging.getLogger("trinity_dso.trinity")


# ---------------------------------------------------------------------------------- GRPO
class DsoGRPOAdvantageFn(AdvantageFn, ExperienceOperator):
    """``dso_grpo``: GRPO group-relative advantages, the baseline DAPO keeps (arXiv 2402.03300
    Sec. 4.1.2; arXiv 2503.14476 Eq. 9), vectorised over the batch.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` over the experiences of one group (``eid.tid``:
    the n rollouts of one task from one explore step), std unbiased, broadcast over
    ``action_mask`` into ``advantages`` and ``returns`` (float32). This is Trinity 0.6's
    ``grpo`` (``GRPOGroupedAdvantage`` with its defaults): float32 rewards, float32 mean and
    std, the same float32 arithmetic after them, a singleton group with mean 0 and std 1
    (Trinity's convention; :func:`algos.dapo.group_advantages` gives it 0), the experiences
    returned grouped, groups in order of first appearance (Trinity's ``group_by`` order), and
    the same metrics.

    Where it differs from Trinity's ``grpo``:

    * the group mean and std are computed exactly (float64 segment sums over the float32
      rewards, two-pass std) and then rounded to float32; Trinity sums in float32 in torch's
      reduction order. The two agree bit for bit when the float32 sums are exact (DAPO's
      +-1 / 0 rewards) and otherwise to float32 rounding (a few 1e-7 relative). Where the
      difference shows: a group of equal non-dyadic rewards (e.g. all 0.7) gets exactly 0
      here, while Trinity's float32 mean can miss 0.7 by one ulp and, divided by ``epsilon``,
      gives each member a spurious advantage of about 0.06;
    * a NaN, infinite or missing reward raises instead of spreading NaN through its group;
    * a member the orchestrator masked (``info["dso_masked"]``, set by
      :class:`~orchestrator.trinity.operator.OrchestratorOperator`: a missing or NaN reward
      under ``group_validity="mask"``, or a stale member) is left out of its group's mean and
      std (its reward may be missing) and gets advantage 0, as in
      :func:`algos.dapo.group_advantages` with ``valid``; the other members are normalised over
      the usable ones (one usable member: Trinity's singleton convention). Trinity's ``grpo``
      counts every member (and fails on a missing reward);
    * ``std_threshold``, ``rank_penalty``, ``std_cal_level="batch"`` and
      ``duplicate_experiences`` are not offered (use ``grpo``).

    Args:
        epsilon: added to the std, > 0 (Trinity's and verl's 1e-6).
    Raises:
        ValueError: ``epsilon`` not a finite number > 0, or one of the options above set to a
            non-default value.
        algos.dapo.InvalidGroupError: at call time, a missing or non-finite reward (names the
            row and the group).
    """

    _UNSUPPORTED = {"std_threshold": None, "duplicate_experiences": False, "rank_penalty": None, "std_cal_level": "group"}

    def __init__(self, epsilon: float = 1e-6, **kwargs: Any) -> None:
        check_number("epsilon", epsilon, gt=0.0)
        for key, default in self._UNSUPPORTED.items():
            if kwargs.get(key, default) != default:
                raise ValueError(f"{key}: {kwargs[key]!r} is not supported by dso_grpo (only {default!r}); use Trinity's grpo")
        self.epsilon = float(epsilon)

    @classmethod
    def default_args(cls) -> dict:
        return {"epsilon": 1e-6}

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    def __call__(self, exps, **kwargs):
        return self.process(exps)

    def compute(
        self, exps: list[TrinityExperience], order: MemoryOrder | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Group codes and advantages of a batch, no side effects (``order``: ``MemoryOrder(exps)``
        when the caller already has it).

        Returns:
            codes: (N,) int64 group of each experience (first-appearance order);
            advantages: (N,) float32 in the batch's order (0 for a masked member);
            mean, std: (G,) float32 per group over its usable members (0 and 1 for a singleton).
        Raises:
            algos.dapo.InvalidGroupError: a missing or non-finite reward of a member not masked.
        """
        order = order if order is not None else MemoryOrder(exps)
        codes, _ = group_codes(order)
        rewards = list(map(REWARD, order.items))  # memory order, put back below
        r64 = np.array([np.nan if x is None else x for x in rewards] if None in rewards else rewards, dtype=np.float64)[order.back]
        masked = masked_rows(exps, order)
        if masked is not None:
            r64[masked] = 0.0  # out of every statistic below
        bad = ~np.isfinite(r64)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidGroupError(f"reward: {exps[i].reward!r} at row {i} (group {exps[i].eid.tid!r}) is not a finite number")
        r32 = r64.astype(np.float32)
        x = r32.astype(np.float64)
        used = None if masked is None else (~masked).astype(np.float64)
        sizes = np.bincount(codes, weights=used)
        mean = np.bincount(codes, weights=x) / np.maximum(sizes, 1.0)  # exact for float32 inputs (< 2**29 per group)
        d = x - mean[codes]
        if used is not None:
            d *= used
        std = np.sqrt(np.bincount(codes, weights=d * d) / np.maximum(sizes - 1.0, 1.0))
        solo = sizes <= 1
        mean32 = np.where(solo, 0.0, mean).astype(np.float32)
        std32 = np.where(solo, 1.0, std).astype(np.float32)
        adv = (r32 - mean32[codes]) / (std32[codes] + np.float32(self.epsilon))
        if masked is not None:
            adv[masked] = 0.0
        return codes, adv, mean32, std32

    def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` / ``returns`` ((T,) float32) on each experience.

        Returns:
            the experiences grouped (see the class docstring), and Trinity's ``grpo`` metrics:
            ``group_advantages/reward_mean/{mean,max,min}``,
            ``group_advantages/reward_std/{mean,max,min}`` (over groups) and
            ``filtered_count`` (0).
        """
        if not exps:
            return [], {}
        with gc_paused():  # no cycles allocated: no collection mid-batch
            order = MemoryOrder(exps)  # shared by the reading and the write-back
            masks = TokenMasks(order)  # joined in a worker thread while the advantages are computed
            codes, adv, mean, std = self.compute(exps, order)
            write_token_advantages(exps, adv, masks=masks)
            out = list(map(exps.__getitem__, np.argsort(codes, kind="stable").tolist()))
        metrics: dict[str, float] = {}
        for name, values in (("reward_mean", mean), ("reward_std", std)):
            v = values.astype(np.float64)
            for stat, fn in (("mean", np.mean), ("max", np.max), ("min", np.min)):
                metrics[f"group_advantages/{name}/{stat}"] = fn(v).item()
        metrics["filtered_count"] = 0
        return out, metrics


# ---------------------------------------------------------------------------------- GiGPO
_PAPER = GiGPOConfig()

_GIGPO_ARGS: dict[str, Any] = {
    "omega": _PAPER.omega,
    "gamma": _PAPER.gamma,
    "fnorm": _PAPER.norm,
    "epsilon": _PAPER.eps,
    "std": _PAPER.std,
    "episode_weighting": _PAPER.episode_weighting,
    "singleton_episode": _PAPER.singleton_episode,
    "invalid_action_penalty": _PAPER.invalid_action_penalty,
    "penalty_timing": _PAPER.penalty_timing,
    "similarity_threshold": _PAPER.similarity_threshold,
    "similarity": _PAPER.similarity,
    "similarity_grouping": _PAPER.similarity_grouping,
    "step_reward_key": "step_reward",
    "env_state_hash_key": "env_state_hash",
    "action_valid_key": "is_action_valid",
    "state_text_key": "env_state_text",
}
"""``advantage_fn_args`` of ``dso_gigpo`` and their defaults (the paper's)."""


def refuse_unknown(kind: str, given: dict, valid: list[str]) -> None:
    """Raise ValueError naming unknown ``advantage_fn_args`` keys and listing the valid ones."""
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"{kind}: unknown argument(s) {unknown}; valid arguments: {sorted(valid)}")


class DsoGiGPOAdvantageFn(AdvantageFn, ExperienceOperator):
    """``dso_gigpo``: GiGPO advantages over one batch of Trinity experiences (arXiv 2505.10978).

    A thin adapter: it flattens the batch into per-step rows and calls
    :func:`algos.gigpo.gigpo_advantages` (see there for the equations). Rows are keyed so that

    * a *group* (GiGPO's "task" in Eq. 3) is Trinity's ``eid.tid`` (explore step and task):
      the n trajectories of one task from one round;
    * a trajectory is ``eid.rid``; its steps are ordered by ``eid.step`` (consecutive from 0);
    * the step reward is ``info[step_reward_key]``; a trajectory with none takes its last
      step's ``reward`` as a terminal reward (Trinity's convention), other steps 0;
    * the anchor state is ``info[env_state_hash_key]`` (str or bytes; anything else is refused,
      never ``str()``-ed: hash structured observations with
      :func:`orchestrator.anchors.keys.state_hash`); a step without one is its own anchor
      group (so A_S = 0 for it, as in Trinity);
    * an action is invalid when ``info[action_valid_key]`` is False (verl-agent's
      ``is_action_valid``); the state text for similarity grouping is ``info[state_text_key]``.

    The scalar ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` into
    ``advantages`` and ``returns`` ((T,) float32).

    Where it differs from Trinity's built-in ``gigpo`` (``GiGPOAdvantageFn``):

    * anchor groups are keyed by (group, state) (Eq. 6 groups states *within a task's group*):
      two tasks whose observations render to the same text, e.g. two FrozenLake maps where the
      agent sees the same window, are kept apart; Trinity buckets states across the whole
      batch and would compare their returns;
    * a singleton episode group gets A_E = 0 (Trinity: ``R / (1 + epsilon)``);
    * statistics are float64 (Trinity: float32);
    * defaults are the paper's (gamma 0.95, F_norm = std); Trinity's are gamma 1, F_norm 1;
    * the steps of a trajectory the orchestrator masked (``info["dso_masked"]``: a missing or
      NaN reward under ``group_validity="mask"``, or a stale member) are left out of their
      episode group and of every anchor group (their step rewards may be missing) and get
      advantage 0; the others get exactly what the batch without them gives. Trinity's
      ``gigpo`` counts every trajectory (and fails on a missing reward).

    On a batch of one task with n > 1 trajectories and the same arguments the two agree up to
    float32 rounding.

    Args (every :class:`algos.gigpo.GiGPOConfig` field is reachable from the YAML's
    ``advantage_fn_args``; the options that restore verl-agent's behaviour are documented there):
        omega: weight of the step advantage, >= 0 (paper: 1).
        gamma: discount in [0, 1] (paper: 0.95).
        fnorm: ``"std"`` (paper, Eq. 3 and 7) or ``"none"`` (F_norm = 1).
        epsilon: added to the std, > 0.
        std: ``"sample"`` (ddof 1, verl-agent) or ``"population"`` (ddof 0).
        episode_weighting: ``"trajectory"`` (paper) or ``"step"`` (verl-agent's default).
        singleton_episode: ``"zero"`` or ``"raw"`` (verl-agent).
        invalid_action_penalty: >= 0, subtracted for each invalid action.
        penalty_timing: ``"before_returns"`` or ``"after_returns"`` (verl-agent).
        similarity_threshold: None (exact hashes) or in (0, 1]: group similar state texts.
        similarity: ``"ratio"`` or ``"jaccard"``.
        similarity_grouping: ``"components"`` or ``"greedy"`` (verl-agent).
        step_reward_key, env_state_hash_key, action_valid_key, state_text_key:
            ``Experience.info`` keys.
    Raises:
        ValueError: an unknown argument (the message lists the valid ones), or an argument that
            is not finite or out of range (checked by :class:`algos.gigpo.GiGPOConfig`; the
            message names the ``advantage_fn_args`` key and the value).
        algos.gigpo.InvalidStepError: at call time, a non-finite reward, a duplicate or
            missing step of a trajectory (the message names the row, group and run).
    """

    def __init__(self, **kwargs: Any) -> None:
        refuse_unknown("dso_gigpo", kwargs, list(_GIGPO_ARGS))
        a = {**_GIGPO_ARGS, **kwargs}
        try:
            self.config = GiGPOConfig(
                omega=a["omega"], gamma=a["gamma"], norm=a["fnorm"], eps=a["epsilon"], std=a["std"],
                episode_weighting=a["episode_weighting"], singleton_episode=a["singleton_episode"],
                invalid_action_penalty=a["invalid_action_penalty"], penalty_timing=a["penalty_timing"],
                similarity_threshold=a["similarity_threshold"], similarity=a["similarity"],
                similarity_grouping=a["similarity_grouping"],
            )
        except ValidationError as err:  # named as the YAML names them (fnorm, epsilon)
            e = err.errors(include_url=False)[0]
            field = {"norm": "fnorm", "eps": "epsilon"}.get(str(e["loc"][0]), str(e["loc"][0])) if e["loc"] else "?"
            raise ValueError(f"advantage_fn_args.{field}: {e['msg']}, got {e.get('input')!r}") from None
        self.step_reward_key = str(a["step_reward_key"])
        self.env_state_hash_key = str(a["env_state_hash_key"])
        self.action_valid_key = str(a["action_valid_key"])
        self.state_text_key = str(a["state_text_key"])

    @classmethod
    def default_args(cls) -> dict:
        return dict(_GIGPO_ARGS)

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    def __call__(self, exps, **kwargs):
        return self.process(exps)

    def rows(self, exps: list[TrinityExperience], order: MemoryOrder | None = None) -> StepRows:
        """Per-step rows of a batch, one per experience, in the batch's order (one pass per field).

        A trajectory without any explicit step reward takes its last step's ``reward`` (0 when
        None) as a terminal reward, other steps 0 (Trinity's ``gigpo`` convention). State texts
        are read only when similarity grouping needs them.
        """
        return StepRows.read(
            exps, self.step_reward_key, self.env_state_hash_key, self.action_valid_key, self.state_text_key,
            texts=self.config.similarity_threshold is not None, order=order,
        )

    def compute(self, exps: list[TrinityExperience]) -> GiGPOAdvantages:
        """GiGPO advantages of a batch, (N,) arrays in the batch's order (no side effects): the
        numbers :meth:`process` writes.

        A step of a member the orchestrator masked (``info["dso_masked"]``) is left out as
        :meth:`process` leaves it out: the other rows get exactly what the batch without it
        gives, and its own row gets ``advantages``, ``episode`` and ``step`` 0, ``returns`` and
        ``episode_returns`` NaN (its reward may be missing), ``anchor_ids`` -1 and
        ``anchor_sizes`` 0 (it is in no anchor group).
        """
        order = MemoryOrder(exps)
        masked = masked_rows(exps, order)
        if masked is None:
            return self._compute(exps, self.rows(exps, order))
        n = len(exps)
        out = GiGPOAdvantages(
            advantages=np.zeros(n), episode=np.zeros(n), step=np.zeros(n), returns=np.full(n, np.nan),
            episode_returns=np.full(n, np.nan), anchor_ids=np.full(n, -1, dtype=np.int64),
            anchor_sizes=np.zeros(n, dtype=np.int64),
        )
        keep = np.flatnonzero(~masked)
        if keep.size:
            used = list(map(exps.__getitem__, keep.tolist()))
            res = self._compute(used, self.rows(used))
            for name in ("advantages", "episode", "step", "returns", "episode_returns", "anchor_ids", "anchor_sizes"):
                getattr(out, name)[keep] = getattr(res, name)
        return out

    def _compute(self, exps: list[TrinityExperience], r: StepRows) -> GiGPOAdvantages:
        if self.config.similarity_threshold is None:  # integer keys all the way (the usual case)
            return gigpo_advantages_coded(
                r.group, r.run, r.step, r.reward, r.state, config=self.config, invalid=r.invalid, group_names=r.group_names()
            )
        missing = [k for k, t in enumerate(r.text) if not isinstance(t, str)]
        if missing:
            k = missing[0]
            raise InvalidStepError(
                f"info[{self.state_text_key!r}]: similarity_threshold is set but row {k} (group {exps[k].eid.tid!r}) "
                "has no state text"
            )
        return gigpo_advantages(
            r.group, r.run, r.step, r.reward, r.state_keys(), config=self.config, invalid=r.invalid, state_texts=list(r.text)
        )

    def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` and ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the same experiences, and metrics ``dso_gigpo/mean_abs_A_E``,
            ``dso_gigpo/mean_abs_A_S``, ``dso_gigpo/anchor_groups_total`` (anchor groups of
            states with a hash), ``dso_gigpo/anchor_groups_size_gt1`` and
            ``dso_gigpo/anchor_group_hit_ratio`` (their share of size > 1).
        """
        if not exps:
            return [], {}
        with gc_paused():  # reading, maths and write-back allocate no cycles: no collection mid-batch
            order = MemoryOrder(exps)  # shared by the reading and the write-back
            masked = masked_rows(exps, order)
            if masked is not None:  # computed without them; their steps get 0
                _, metrics = self.process(list(itertools.compress(exps, ~masked))) if not masked.all() else ([], {})
                write_token_advantages(list(itertools.compress(exps, masked)), np.zeros(int(masked.sum())))
                return exps, metrics
            masks = TokenMasks(order)  # joined in a worker thread while the rows are read and the maths runs
            r = self.rows(exps, order)
            res = self._compute(exps, r)
            write_token_advantages(exps, res.advantages, masks=masks)
        return exps, gigpo_metrics(res.episode, res.step, res.anchor_ids, res.anchor_sizes, r.hashed)


def gigpo_metrics(
    episode: np.ndarray, step: np.ndarray, anchor_ids: np.ndarray, anchor_sizes: np.ndarray, hashed: np.ndarray
) -> dict[str, float | int]:
    """The ``dso_gigpo/*`` metrics of a batch: mean |A_E| and |A_S|, anchor groups of hashed
    states, those of size > 1 and their share.

    Args:
        episode, step: (N,) float64, A_E and A_S per step.
        anchor_ids, anchor_sizes: (N,) int64, anchor group and its size per step.
        hashed: (N,) bool, the step has an ``env_state_hash``.
    """
    sizes = np.zeros(int(anchor_ids.max()) + 1, dtype=np.int64)
    sizes[anchor_ids] = anchor_sizes
    present = np.zeros(sizes.size, dtype=bool)  # anchor groups of hashed states (a table, no sort)
    present[anchor_ids[hashed]] = True
    total, hit = int(present.sum()), int((sizes[present] > 1).sum())
    return {
        "dso_gigpo/mean_abs_A_E": float(np.abs(episode).mean()),
        "dso_gigpo/mean_abs_A_S": float(np.abs(step).mean()),
        "dso_gigpo/anchor_groups_total": total,
        "dso_gigpo/anchor_groups_size_gt1": hit,
        "dso_gigpo/anchor_group_hit_ratio": hit / total if total else 0.0,
    }


# ---------------------------------------------------------------------------------- GiGPO via the index
EPISODE_SUFFIX = ":episode"
"""Batch-key suffix under which the trajectories' total rewards are stored (one record each)."""
EPISODE_STATE = "episode"


class DsoGiGPOIndexAdvantageFn(AdvantageFn, ExperienceOperatorV1):
    """``dso_gigpo_index``: :class:`orchestrator.trinity.advantage.DsoGiGPOAdvantageFn` with the statistics
    taken from the orchestrator's shared anchor index (GiGPO, arXiv 2505.10978, Eq. 3, 5-8).

    Per call (the experiences of one explore step, or a share of them):

    1. the rows are read as ``dso_gigpo`` reads them (group = ``eid.tid``, trajectory =
       ``eid.rid``, step order ``eid.step``, step reward ``info[step_reward_key]`` or the
       terminal ``reward``, anchor state ``info[env_state_hash_key]``); only what the index
       cannot hold is computed here: the discounted returns R_t (Eq. 5, which also validates
       the steps) and each trajectory's total reward;
    2. the call's trajectories are written to the index under batch key ``trinity-<eid.batch>``
       as whole trajectories (:meth:`AnchorIndex.insert_trajectories`: task = ``eid.tid``,
       run = ``eid.run``, steps 0..L-1; one record per trajectory and one per anchor group, the
       group moments prepared here in numpy), then every trajectory's total reward under
       ``trinity-<eid.batch>:episode`` (state ``"episode"``), so that the episode groups (Eq.
       3, each trajectory counted once) are shared too. A step without a state hash gets a
       state of its own (A_S = 0, as in ``dso_gigpo``);
    3. the episode insert reports, atomically with its write, each group's complete
       trajectories: with ``group_size`` set, groups the call holds whole are queried at once,
       and only groups split over calls or workers are waited for (up to ``wait_timeout_s``)
       until the index holds ``group_size`` complete trajectories of each - written by this or
       any other advantage worker. The wait blocks (Redis: on the batch's event stream; an
       in-process memory index: on its condition), except through an index served by a Ray
       actor, which is polled. A_S per (group, state) and A_E per group then come from the
       index's moments (:meth:`AnchorIndex.group_step_advantages`, one read of each distinct
       group, ``n_runs=group_size``, which refuses an incomplete group);
    4. ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` as ``dso_gigpo`` does.

    When each call holds whole groups (Trinity's default), the numbers equal ``dso_gigpo``'s to
    ~1e-15 (one-pass moments vs. two-pass sums, both float64); when a group's trajectories are
    split over several workers or calls, each gets the statistics of the whole group, which a
    per-batch computation cannot. A trajectory's steps must arrive in one call, numbered from 0.

    Where the index is: ``redis_url`` (a :class:`RedisAnchorIndex` opened here), else the
    orchestrator actor ``actor_name`` in ``namespace`` (default: the caller's Ray namespace,
    i.e. the run's), whose ``anchor_spec()`` names its Redis or the Ray actor serving its memory
    index (both queried directly, never through the orchestrator). When the actor exists, batch keys are registered with
    it (``anchor_register``, at the experiences' ``model_version``) so its version-based
    expiry drops them; otherwise the index TTL does.

    Args:
        every ``dso_gigpo`` argument (keyword), except that the shared index needs
            ``singleton_episode="zero"``, ``std="sample"``, ``episode_weighting="trajectory"``
            and no ``similarity_threshold`` (other values are refused, naming them).
        actor_name, namespace: the orchestrator actor (default ``dso-orchestrator``).
        redis_url, prefix, ttl_s: a Redis index to use without an actor (prefix and TTL as
            :class:`~orchestrator.anchors.owner.AnchorIndexConfig`).
        group_size: trajectories per group to wait for (usually ``algorithm.repeat_times``);
            None: the groups are whole in each call (no waiting, no completeness check).
        wait_timeout_s: longest wait for incomplete groups, seconds.
        lookup_timeout_s: longest wait for the actor to appear, seconds.
    Raises:
        ValueError: an unknown argument (the valid ones are listed) or an option the index
            cannot honour.
        ValueError: GiGPO arguments or timeouts that are not finite or out of range (named).
        algos.gigpo.InvalidStepError: a non-finite reward, a duplicate or missing step.
        orchestrator.trinity.attach.OrchestratorNotFoundError: no ``redis_url`` and no actor.
        orchestrator.anchors.owner.AnchorIndexNotConfiguredError: the actor has no anchor index.
        orchestrator.anchors.index.AnchorIndexError: Redis unreachable, batch state lost, a
            group still incomplete after ``wait_timeout_s``, or a conflicting re-insert.
    """

    def __init__(
        self,
        actor_name: str = DEFAULT_NAME,
        namespace: str | None = None,
        redis_url: str | None = None,
        prefix: str = "dso",
        ttl_s: float = 6 * 3600.0,
        group_size: int | None = None,
        wait_timeout_s: float = 60.0,
        lookup_timeout_s: float = 60.0,
        **gigpo: Any,
    ) -> None:
        own = ["actor_name", "namespace", "redis_url", "prefix", "ttl_s", "group_size", "wait_timeout_s", "lookup_timeout_s"]
        refuse_unknown("dso_gigpo_index", gigpo, list(_GIGPO_ARGS) + own)
        self.local = DsoGiGPOAdvantageFn(**gigpo)
        self.config = self.local.config
        unsupported = {
            k: getattr(self.config, f) for k, f, ok in (
                ("singleton_episode", "singleton_episode", "zero"),
                ("similarity_threshold", "similarity_threshold", None),
                ("std", "std", "sample"),
                ("episode_weighting", "episode_weighting", "trajectory"),
            ) if getattr(self.config, f) != ok
        }
        if unsupported:
            raise ValueError(
                f"dso_gigpo_index: {unsupported} need the whole batch in one place; the shared index supports "
                "singleton_episode='zero', std='sample', episode_weighting='trajectory' and exact state hashes "
                "only (use dso_gigpo for these options)"
            )
        if group_size is not None:
            check_number("group_size", group_size, ge=1, integer=True)
        check_number("ttl_s", ttl_s, gt=0.0)
        check_number("wait_timeout_s", wait_timeout_s, ge=0.0)
        check_number("lookup_timeout_s", lookup_timeout_s, ge=0.0)
        self.group_size = None if group_size is None else int(group_size)
        self.actor_name = actor_name
        self.namespace = namespace
        self.redis_url = redis_url
        self.prefix = prefix
        self.ttl_s = float(ttl_s)
        self.wait_timeout_s = float(wait_timeout_s)
        self.lookup_timeout_s = float(lookup_timeout_s)
        self._index: AnchorIndex | RemoteAnchorIndex | None = None
        self._actor: Any = None
        self.auxiliary_models = {}

    @classmethod
    def default_args(cls) -> dict:
        return {
            **DsoGiGPOAdvantageFn.default_args(),
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
    def index(self) -> AnchorIndex | RemoteAnchorIndex:
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
    def compute(self, exps: list[TrinityExperience], order: MemoryOrder | None = None) -> dict[str, np.ndarray]:
        """GiGPO advantages of a call's experiences from the shared index (``order``: as
        :meth:`StepRows.read`).

        Only what the index cannot hold is computed here: the discounted returns R_t (Eq. 5)
        and each trajectory's total reward, from this call's steps; the write itself is
        prepared in numpy (one record per trajectory and per anchor group, see
        :func:`orchestrator.anchors.index.trajectory_records`). The anchor groups' statistics
        (A_S, Eq. 6-7) and the episode groups' (A_E, Eq. 3) come from the index, read once per
        distinct group. The insert reports, atomically with the write, how many complete
        trajectories each group now has, so groups the call holds whole (the usual Trinity
        case) are queried at once; only groups split over calls or workers are waited for, by
        :meth:`AnchorIndex.wait_complete` (Redis: blocking on the batch's event stream; an
        in-process memory index: woken by each insert; an index behind a Ray actor: polled),
        up to ``wait_timeout_s``.

        Returns:
            ``advantages``, ``episode`` (A_E), ``step`` (A_S), each (N,) float64 in the call's order.
        Raises:
            see the class docstring.
        """
        cfg = self.config
        r = self.local.rows(exps, order)
        n = len(exps)
        # the invalid-action penalty as algos.gigpo.gigpo_advantages applies it
        penalty = cfg.invalid_action_penalty * r.invalid
        if cfg.penalty_timing == "before_returns":
            returns = discounted_returns(r.reward - penalty, r.traj, r.step, gamma=cfg.gamma)
        else:
            returns = discounted_returns(r.reward, r.traj, r.step, gamma=cfg.gamma) - penalty
        ep_reward = r.reward - penalty
        num_traj = int(r.traj.max()) + 1
        order = group_value_order(r.traj, ep_reward)  # canonical summation order, as algos.gigpo
        totals = np.bincount(r.traj[order], weights=ep_reward[order], minlength=num_traj)
        first_row = first_rows(r.traj, num_traj)
        traj_group, traj_run = r.group[first_row], r.run[first_row]
        # names shared by every worker: group = eid.tid, batch key = trinity-<eid.batch>, state = hash text
        group_name = r.group_names()
        group_batch = np.array([f"trinity-{b}" for b, _ in r.group_keys], dtype=object)
        solo = np.flatnonzero(~r.hashed)  # their codes follow the hashed ones, in row order
        state_name = r.state_names + [f"dso-solo:{exps[i].eid.rid}:{int(r.step[i])}" for i in solo.tolist()]
        runs_per_group = np.bincount(traj_group, minlength=len(group_name))
        index = self.index()
        episode = np.full(n, np.nan)
        step = np.full(n, np.nan)
        n_runs = self.group_size
        for bk in sorted(set(group_batch.tolist())):
            in_batch = group_batch == bk
            rows = np.flatnonzero(in_batch[r.group])
            trajs = np.flatnonzero(in_batch[traj_group])
            if self._actor is not None:
                version = max(int((exps[i].info or NO_INFO).get("model_version", 0) or 0) for i in rows.tolist())
                ray.get(self._actor.anchor_register.remote(bk, version))
                ray.get(self._actor.anchor_register.remote(bk + EPISODE_SUFFIX, version))
            steps_receipt = index.insert_trajectories(bk, trajectory_records(
                r.group[rows], group_name, r.run[rows], r.step[rows], r.state[rows], state_name, returns[rows]
            ))
            # the episode returns after the steps: a complete episode group implies complete steps
            zeros = np.zeros(trajs.size, dtype=np.int64)
            receipt = index.insert_trajectories(bk + EPISODE_SUFFIX, trajectory_records(
                traj_group[trajs], group_name, traj_run[trajs], zeros, zeros, [EPISODE_STATE], totals[trajs]
            ))
            gid, _ = encode_keys(r.group[rows], r.state[rows])  # the records' anchor-group codes
            egid, enum = encode_keys(traj_group[trajs])  # and their episode-group codes
            # groups complete when written: the index's moments came back with the writes
            a_s = steps_receipt.step_advantages(gid, returns[rows], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
            a_e = receipt.step_advantages(egid, totals[trajs], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
            if a_s is None or a_e is None:  # a group split over calls or workers: wait, then read
                if n_runs is not None:
                    groups = np.flatnonzero(in_batch)
                    split = [group_name[g] for g in groups[runs_per_group[groups] != n_runs].tolist()]
                    if any(receipt.done.get(g, 0) < n_runs for g in split):
                        index.wait_complete(bk + EPISODE_SUFFIX, sorted(split), n_runs, self.wait_timeout_s, receipt=receipt)
                first = np.full(int(gid.max()) + 1, -1, dtype=np.int64)
                first[gid] = rows
                keys = [(group_name[g], state_name[h]) for g, h in zip(r.group[first].tolist(), r.state[first].tolist())]
                a_s = index.group_step_advantages(bk, keys, gid, returns[rows], norm=cfg.norm, eps=cfg.eps, n_runs=n_runs)
                efirst = np.full(enum, -1, dtype=np.int64)
                efirst[egid] = traj_group[trajs]
                a_e = index.group_step_advantages(
                    bk + EPISODE_SUFFIX, [(group_name[g], EPISODE_STATE) for g in efirst.tolist()], egid, totals[trajs],
                    norm=cfg.norm, eps=cfg.eps, n_runs=n_runs,
                )
            step[rows] = a_s
            per_traj = np.full(num_traj, np.nan)
            per_traj[trajs] = a_e
            episode[rows] = per_traj[r.traj[rows]]
        return {"advantages": episode + cfg.omega * step, "episode": episode, "step": step}

    def process_sync(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` / ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the experiences, and ``dso_gigpo/mean_abs_A_E``, ``dso_gigpo/mean_abs_A_S`` and
            ``dso_gigpo_index/seconds`` (reading, index round trips and waiting).
        Raises:
            algos.gigpo.InvalidStepError: a step of a member the orchestrator masked
                (``info["dso_masked"]``): the index's anchor groups wait for every run of a
                task and cannot leave it out (names the first, and the policy fields to change).
        """
        if not exps:
            return [], {}
        t0 = time.perf_counter()
        order = MemoryOrder(exps)  # shared by the reading and the write-back
        masked = masked_rows(exps, order)
        if masked is not None:
            k = int(np.flatnonzero(masked)[0])
            raise InvalidStepError(
                f"dso_gigpo_index: {int(masked.sum())} steps of members the orchestrator masked (first: row {k}, group "
                f"{exps[k].eid.tid!r}, run {exps[k].eid.run}); the index's anchor groups wait for every run of a task, so it "
                "cannot leave them out: set the policy's group_validity to 'reject' and stale_members to 'oldest', or use dso_gigpo"
            )
        masks = TokenMasks(order)  # joined in a worker thread while the rows are read and the index answers
        res = self.compute(exps, order)
        seconds = time.perf_counter() - t0
        write_token_advantages(exps, res["advantages"], masks=masks)
        metrics = {
            "dso_gigpo/mean_abs_A_E": float(np.abs(res["episode"]).mean()),
            "dso_gigpo/mean_abs_A_S": float(np.abs(res["step"]).mean()),
            "dso_gigpo_index/seconds": seconds,
        }
        return exps, metrics

    def __call__(self, exps, **kwargs):
        return self.process_sync(exps)

    async def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """:meth:`process_sync` in a worker thread (index round trips block; the pipeline's loop does not)."""
        return await asyncio.to_thread(self.process_sync, exps)


