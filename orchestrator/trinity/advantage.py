"""GiGPO advantages for Trinity: ``dso_gigpo`` (in process) and ``dso_gigpo_index`` (through the orchestrator's anchor index)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
import ray
import torch
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperator, ExperienceOperatorV1
from trinity.common.experience import Experience as TrinityExperience

from algos.gigpo import GiGPOAdvantages, GiGPOConfig, InvalidStepError, encode_keys, gigpo_advantages
from orchestrator.anchors.index import AnchorIndex, AnchorIndexError, AnchorStep
from orchestrator.anchors.owner import orchestrator_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex
from orchestrator.service.actor import DEFAULT_NAME
from orchestrator.trinity.attach import OrchestratorNotFoundError, find_orchestrator

log = logging.getLogger("trinity_dso.trinity")


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
    * defaults are the paper's (gamma 0.95, F_norm = std); Trinity's are gamma 1, F_norm 1.

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
        ValueError: an unknown argument (the message lists the valid ones).
        pydantic.ValidationError: out-of-range arguments (via :class:`algos.gigpo.GiGPOConfig`).
        algos.gigpo.InvalidStepError: at call time, a non-finite reward, a duplicate or
            missing step of a trajectory (the message names the row, group and run).
    """

    def __init__(self, **kwargs: Any) -> None:
        refuse_unknown("dso_gigpo", kwargs, list(_GIGPO_ARGS))
        a = {**_GIGPO_ARGS, **kwargs}
        self.config = GiGPOConfig(
            omega=a["omega"], gamma=a["gamma"], norm=a["fnorm"], eps=a["epsilon"], std=a["std"],
            episode_weighting=a["episode_weighting"], singleton_episode=a["singleton_episode"],
            invalid_action_penalty=a["invalid_action_penalty"], penalty_timing=a["penalty_timing"],
            similarity_threshold=a["similarity_threshold"], similarity=a["similarity"],
            similarity_grouping=a["similarity_grouping"],
        )
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

    def rows(self, exps: list[TrinityExperience]) -> dict[str, np.ndarray]:
        """Per-step rows of a batch, one per experience, in the batch's order.

        Returns:
            ``group`` (N,) str (``eid.tid``), ``run`` (N,) str (``eid.rid``), ``step`` (N,)
            int64, ``reward`` (N,) float64 step rewards, ``state`` (N,) object anchor keys,
            ``invalid`` (N,) bool (``info[action_valid_key] is False``), ``text`` (N,) object
            state texts (None where absent).
        Raises:
            algos.gigpo.InvalidStepError: a state hash that is not str or bytes.
        """
        n = len(exps)
        group = np.array([str(e.eid.tid) for e in exps], dtype=object)
        run = np.array([str(e.eid.rid) for e in exps], dtype=object)
        step = np.array([int(e.eid.step) for e in exps], dtype=np.int64)
        infos = [e.info or {} for e in exps]
        explicit = np.array([self.step_reward_key in i for i in infos], dtype=bool)
        reward = np.array([float(i.get(self.step_reward_key, 0.0)) for i in infos], dtype=np.float64)
        run_ids, num_runs = encode_keys(run)
        # trajectories without any explicit step reward: the last step carries exp.reward
        has_explicit = np.bincount(run_ids, weights=explicit, minlength=num_runs) > 0
        last = np.full(num_runs, -1, dtype=np.int64)
        np.maximum.at(last, run_ids, step)
        terminal = np.flatnonzero(~has_explicit[run_ids] & (step == last[run_ids]))
        reward[terminal] = [float(exps[i].reward) if exps[i].reward is not None else 0.0 for i in terminal]
        state = np.array([self.state_key(e, k) for k, e in enumerate(exps)], dtype=object)
        invalid = np.array([i.get(self.action_valid_key, True) is False for i in infos], dtype=bool)
        text = np.array([i.get(self.state_text_key) for i in infos], dtype=object)
        assert len(state) == n
        return {"group": group, "run": run, "step": step, "reward": reward, "state": state, "invalid": invalid, "text": text}

    def state_key(self, e: TrinityExperience, row: int, solo: str | None = None) -> str:
        """The anchor key of one experience: its str/bytes hash (bytes as hex), or a key of its own."""
        h = (e.info or {}).get(self.env_state_hash_key)
        if h is None:
            return solo if solo is not None else f"\x00solo/{row}"
        if isinstance(h, (bytes, bytearray)):
            return h.hex()
        if not isinstance(h, str):
            raise InvalidStepError(
                f"info[{self.env_state_hash_key!r}]: expected str or bytes at row {row} (group {e.eid.tid!r}, "
                f"run {e.eid.rid!r}, step {int(e.eid.step)}), got {type(h).__name__}; hash structured observations "
                "with orchestrator.anchors.keys.state_hash (never str())"
            )
        return h

    def compute(self, exps: list[TrinityExperience]) -> GiGPOAdvantages:
        """GiGPO advantages of a batch, (N,) arrays in the batch's order (no side effects)."""
        r = self.rows(exps)
        texts = None
        if self.config.similarity_threshold is not None:
            missing = [k for k, t in enumerate(r["text"]) if not isinstance(t, str)]
            if missing:
                k = missing[0]
                raise InvalidStepError(
                    f"info[{self.state_text_key!r}]: similarity_threshold is set but row {k} (group {r['group'][k]!r}) "
                    "has no state text"
                )
            texts = list(r["text"])
        return gigpo_advantages(
            r["group"], r["run"], r["step"], r["reward"], r["state"], config=self.config,
            invalid=r["invalid"], state_texts=texts,
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
        res = self.compute(exps)
        for e, a in zip(exps, res.advantages.tolist()):
            if e.action_mask is not None:
                e.advantages = e.action_mask.to(torch.float32) * a
            else:
                e.advantages = torch.tensor(a, dtype=torch.float32)
            e.returns = e.advantages.clone()
        hashed = np.array([(e.info or {}).get(self.env_state_hash_key) is not None for e in exps], dtype=bool)
        ids = np.unique(res.anchor_ids[hashed])
        sizes = np.zeros(int(res.anchor_ids.max()) + 1, dtype=np.int64)
        sizes[res.anchor_ids] = res.anchor_sizes
        total, hit = int(ids.size), int((sizes[ids] > 1).sum())
        metrics = {
            "dso_gigpo/mean_abs_A_E": float(np.abs(res.episode).mean()),
            "dso_gigpo/mean_abs_A_S": float(np.abs(res.step).mean()),
            "dso_gigpo/anchor_groups_total": total,
            "dso_gigpo/anchor_groups_size_gt1": hit,
            "dso_gigpo/anchor_group_hit_ratio": hit / total if total else 0.0,
        }
        return exps, metrics




# ---------------------------------------------------------------------------------- GiGPO via the index
EPISODE_SUFFIX = ":episode"
"""Batch-key suffix under which the trajectories' total rewards are stored (one record each)."""
EPISODE_STATE = "episode"


class DsoGiGPOIndexAdvantageFn(AdvantageFn, ExperienceOperatorV1):
    """``dso_gigpo_index``: :class:`orchestrator.trinity.advantage.DsoGiGPOAdvantageFn` with the statistics
    taken from the orchestrator's shared anchor index (GiGPO, arXiv 2505.10978, Eq. 3, 5-8).

    Per call (the experiences of one explore step, or a share of them):

    1. the rows are keyed exactly as ``dso_gigpo`` does (group = ``eid.tid``, trajectory =
       ``eid.rid``, step order ``eid.step``, step reward ``info[step_reward_key]`` or the
       terminal ``reward``, anchor state ``info[env_state_hash_key]``), and the discounted
       returns R_t (Eq. 5) and trajectory totals are computed locally
       (:func:`algos.gigpo.gigpo_advantages`, which also validates the steps);
    2. every step is written to the index under batch key ``trinity-<eid.batch>`` as an
       :class:`~orchestrator.anchors.index.AnchorStep` (task = ``eid.tid``, run = ``eid.run``,
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
        pydantic.ValidationError: out-of-range GiGPO arguments.
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
        local = gigpo_advantages(r["group"], r["run"], r["step"], r["reward"], r["state"], config=cfg, invalid=r["invalid"])
        n = len(exps)
        state = [self.local.state_key(e, k, solo=f"dso-solo:{e.eid.rid}:{int(e.eid.step)}") for k, e in enumerate(exps)]
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


