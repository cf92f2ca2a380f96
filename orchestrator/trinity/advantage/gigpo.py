"""``dso_gigpo``: GiGPO advantages for Trinity, computed in process over one batch.

The batch is read into per-step rows once (:class:`orchestrator.trinity.steps.StepRows`), the
advantages come from :mod:`algos.gigpo`, and the token advantages are written back with
:func:`orchestrator.trinity.writeback.write_token_advantages`. Nothing here talks to the
orchestrator (the shared-index variant is :mod:`orchestrator.trinity.advantage.gigpo_index`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from pydantic import ValidationError
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperator
from trinity.common.experience import Experience as TrinityExperience

from algos.gigpo import GiGPOAdvantages, GiGPOConfig, InvalidStepError, gigpo_advantages, gigpo_advantages_coded
from orchestrator.trinity.fields import MemoryOrder, masked_rows
from orchestrator.trinity.steps import StepRows
from orchestrator.trinity.writeback import TokenMasks, gc_paused, write_token_advantages

_PAPER = GiGPOConfig()

GIGPO_ARGS: dict[str, Any] = {
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
      :func:`orchestrator.anchors.state_hash.state_hash`); a step without one is its own anchor
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
        refuse_unknown("dso_gigpo", kwargs, list(GIGPO_ARGS))
        a = {**GIGPO_ARGS, **kwargs}
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
        return dict(GIGPO_ARGS)

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
