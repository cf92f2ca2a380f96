"""GiGPO mathematics as pure, vectorised functions (arXiv 2505.10978).

Group-in-Group Policy Optimization (Feng et al., 2025) gives every step of a multi-turn
agent trajectory the advantage

    A(a_t^i) = A^E(tau_i) + omega * A^S(a_t^i)                                    (Eq. 8)

where the *episode* advantage A^E normalises each trajectory's total return within the group
of n trajectories of its task (Eq. 3), and the *step* advantage A^S normalises the discounted
step return R_t (Eq. 5) within the *anchor group* of all steps, across the task's
trajectories, that acted from the same environment state (Eq. 6-7). Equation numbers follow
the paper's v2 and the comments in the authors' verl-agent reference
(``gigpo/core_gigpo.py``).

Everything works on flat per-step rows (S,): ``task_ids``, ``run_ids``, ``steps``,
``rewards``, ``state_hashes``. Rows may come in any order; the step order within a
trajectory is taken from ``steps``, never from row order, and every result is bit-for-bit
independent of row order (statistics are accumulated in a canonical sorted order). Keys
become integer ids once (``np.unique(..., return_inverse=True)``) and statistics come from
``np.bincount`` segment sums; there is no Python loop over steps or trajectories.
Only the optional similarity grouping of free-text states (:func:`similarity_anchor_ids`)
loops, over pairs of *distinct* texts within one task.

Deliberate differences from verl-agent (each documented where it applies, each with the
:class:`GiGPOConfig` option that restores the reference's behaviour):

* a singleton episode group gets ``A^E = 0`` (verl-agent: the raw score over mean 0 / std 1,
  ``singleton_episode="raw"``);
* the episode statistics count each trajectory once (the paper's definition); verl-agent's
  default computes them over step rows (``episode_weighting="step"``);
* the invalid-action penalty is subtracted from the step reward before discounting, so it
  reaches earlier steps' returns; verl-agent subtracts it after the returns are computed
  (``penalty_timing="after_returns"``);
* similarity grouping uses connected components (order independent) instead of
  verl-agent's greedy first-representative clustering, which depends on row order
  (``similarity_grouping="greedy"``);
* group statistics are shifted by the group minimum and accumulated in float64, so equal
  values give exactly 0 (not ~1e-17) in both normalisation modes (no option: a float
  residue is never wanted).

The std is the sample std (ddof 1, ``torch.std`` as in verl-agent and verl);
``std="population"`` (ddof 0) is offered for references that use ``np.std``.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from algos.groups import Norm, StdConvention, check_norm, dense_ids, first_rows, group_value_order, normalise_in_groups

EpisodeWeighting = Literal["trajectory", "step"]
Similarity = Literal["ratio", "jaccard"]
SingletonEpisode = Literal["zero", "raw"]
PenaltyTiming = Literal["before_returns", "after_returns"]
SimilarityGrouping = Literal["components", "greedy"]

__all__ = [
    "GiGPOAdvantages",
    "GiGPOConfig",
    "InvalidStepError",
    "anchor_group_ids",
    "broadcast_to_tokens",
    "discounted_returns",
    "encode_keys",
    "episode_advantages",
    "gigpo_advantages",
    "gigpo_advantages_coded",
    "multi_step_grpo_advantages",
    "normalise_from_moments",
    "similarity_anchor_ids",
    "step_advantages",
]

# gamma ** -(T - 1) beyond this switches the returns scan to a per-position recursion.
_MAX_SCALE = 1e250


class InvalidStepError(ValueError):
    """A step row cannot be used: missing state hash, duplicate (task, run, step), a gap in a
    trajectory's step indices, a non-finite reward, or arrays of different lengths."""


class GiGPOConfig(BaseModel):
    """GiGPO advantage settings; defaults are the paper's (arXiv 2505.10978, Sec. 5).

    Attributes:
        gamma: discount factor of the step returns (Eq. 5), in [0, 1]. Paper: 0.95.
        omega: weight of the step advantage in Eq. 8, >= 0. Paper: 1 ("without tuning").
        norm: ``"std"``: F_norm = unbiased group std (+ ``eps``), Eq. 3 and 7 as written and
            verl-agent's ``mode=mean_std_norm`` in its example scripts; ``"none"``: F_norm = 1
            (the Dr. GRPO variant the paper also reports, verl-agent's ``mean_norm``).
        eps: added to the std under ``norm="std"``, > 0. verl-agent: 1e-6.
        episode_weighting: ``"trajectory"`` counts each trajectory once in its task's
            statistics (the paper); ``"step"`` counts it once per step, like verl-agent's
            ``episode_norm_reward(compute_mean_std_cross_steps=True)``.
        invalid_action_penalty: subtracted from the reward of each step whose action was
            invalid, before returns are computed, >= 0. Not part of the paper's estimator
            (verl-agent applies ``invalid_action_penalty_coef=0.1`` in its environments);
            default 0.
        similarity_threshold: ``None`` groups anchor states by exact ``env_state_hash``
            (the paper). A value in (0, 1] groups state *texts* whose similarity is
            ``>= threshold`` (verl-agent's ``enable_similarity``, typically 0.9-0.95).
        similarity: ``"ratio"`` (difflib ``SequenceMatcher.ratio``, verl-agent's measure) or
            ``"jaccard"`` (whitespace-token Jaccard), used only with a threshold.
        std: ``"sample"`` (ddof 1; the paper's std as verl-agent computes it with
            ``torch.std``; default) or ``"population"`` (ddof 0, ``np.std``).
        singleton_episode: A^E of a task group with a single trajectory. ``"zero"``
            (default: nothing to compare with) or ``"raw"`` (verl-agent's
            ``episode_norm_reward``: mean 0 and std 1, so ``R / (1 + eps)`` under
            ``norm="std"`` and ``R`` under ``"none"``).
        penalty_timing: when ``invalid_action_penalty`` applies. ``"before_returns"``
            (default: it is part of the step reward, so discounting carries
            ``gamma^k * penalty`` to the k-th earlier step) or ``"after_returns"``
            (verl-agent: subtracted from the token-level reward of the invalid step after
            the step returns were computed from the unpenalised rewards, so only that
            step's R_t drops by the penalty). Both subtract it from the episode return.
        similarity_grouping: ``"components"`` (default: connected components of the
            similarity graph, independent of row order) or ``"greedy"`` (verl-agent's
            ``build_step_group``: each state joins the first existing cluster, in row
            order, whose first member is similar enough, else starts a new one).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gamma: float = Field(0.95, ge=0.0, le=1.0, description="discount factor, Eq. 5")
    omega: float = Field(1.0, ge=0.0, description="step-advantage weight, Eq. 8")
    norm: Norm = Field("std", description="F_norm of Eq. 3 and 7: std or 1")
    eps: float = Field(1e-6, gt=0.0, description="added to the std")
    episode_weighting: EpisodeWeighting = "trajectory"
    invalid_action_penalty: float = Field(0.0, ge=0.0)
    similarity_threshold: float | None = Field(None, gt=0.0, le=1.0)
    max_version_spread: int | None = Field(
        None, ge=0, description="largest model-version difference allowed among the steps of one task's runs "
        "(the staleness limit; checked when gigpo_advantages gets model_versions); None: unchecked")
    similarity: Similarity = "ratio"
    std: StdConvention = "sample"
    singleton_episode: SingletonEpisode = "zero"
    penalty_timing: PenaltyTiming = "before_returns"
    similarity_grouping: SimilarityGrouping = "components"


@dataclass
class GiGPOAdvantages:
    """Result of :func:`gigpo_advantages`, every array (S,) in the caller's row order.

    Attributes:
        advantages: float64, ``A^E + omega * A^S`` (Eq. 8), one scalar per step.
        episode: float64, A^E of the step's trajectory (Eq. 3).
        step: float64, A^S of the step (Eq. 7).
        returns: float64, discounted return R_t (Eq. 5), after any invalid-action penalty.
        episode_returns: float64, undiscounted total reward of the step's trajectory.
        anchor_ids: int64 in [0, K), the anchor group of the step (Eq. 6).
        anchor_sizes: int64, number of steps in the step's anchor group.
    """

    advantages: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    returns: np.ndarray
    episode_returns: np.ndarray
    anchor_ids: np.ndarray
    anchor_sizes: np.ndarray


# --------------------------------------------------------------------------- helpers


def _r(x: Any) -> str:
    """repr of a value for error messages, numpy scalars shown as plain Python values."""
    return repr(x.item() if isinstance(x, np.generic) else x)


def _check_gamma(gamma: float) -> None:
    if not (isinstance(gamma, (int, float, np.floating)) and 0.0 <= float(gamma) <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {_r(gamma)}")


def _as_1d(x: Any, name: str, dtype: Any = None) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    if a.ndim != 1:
        raise InvalidStepError(f"{name}: expected a 1-D array of one value per step, got shape {a.shape}")
    return a


def _same_length(**arrays: np.ndarray) -> int:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise InvalidStepError(f"arrays must have one value per step, got lengths {lengths}")
    return next(iter(lengths.values()))


def _check_finite(values: np.ndarray, name: str, rows: str = "") -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidStepError(f"{name}: non-finite value {_r(values[i])} at row {i}{rows}")


def encode_keys(*columns: Any) -> tuple[np.ndarray, int]:
    """Map rows of one or more key columns to dense integer ids, ordered by sorted key.

    Args:
        columns: each (S,), any dtype ``np.unique`` sorts (ints, strings).
    Returns:
        ids: (S,) int64 in [0, K); equal key tuples get equal ids, and ids follow the
            lexicographic order of the key tuples (so they do not depend on row order).
        K: number of distinct key tuples.
    Raises:
        InvalidStepError: columns of different lengths.
    """
    if not columns:
        raise ValueError("encode_keys needs at least one column")
    cols = [np.asarray(c) for c in columns]
    _same_length(**{f"column{i}": c for i, c in enumerate(cols)})
    ids = dense_ids(cols[0])
    for c in cols[1:]:
        code = dense_ids(c)
        radix = int(code.max()) + 1 if code.size else 1
        top = int(ids.max()) + 1 if ids.size else 1
        if top * radix <= 4 * ids.size + 1024:  # small key space: rank by a presence table, no sort
            combined = ids * radix + code
            present = np.zeros(top * radix, dtype=bool)
            present[combined] = True
            ids = (np.cumsum(present) - 1)[combined]
        elif top * radix < 2**62:  # mixed radix keeps lexicographic order; int sort is fast
            ids = np.unique(ids * radix + code, return_inverse=True)[1].reshape(-1).astype(np.int64)
        else:
            ids = np.unique(np.stack([ids, code], axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return ids, (int(ids.max()) + 1 if ids.size else 0)


def normalise_from_moments(
    values: Any,
    count: Any,
    shift: Any,
    sum_shifted: Any,
    sumsq_shifted: Any,
    *,
    norm: Norm = "std",
    eps: float = 1e-6,
    std: StdConvention = "sample",
) -> np.ndarray:
    """:func:`algos.groups.normalise_in_groups` from running moments of each value's group.

    For incremental stores (the anchor index) that keep, per group, the count ``n``, a
    shift ``c`` (a member's value, e.g. the group minimum) and the shifted sums ``S1 = sum(x - c)`` and
    ``S2 = sum((x - c)^2)``::

        centred = (x - c) - S1 / n,   std = sqrt(max(S2 - S1^2 / n, 0) / (n - ddof))

    Shifting by a member keeps the one-pass variance free of catastrophic cancellation, and
    a group of equal values has ``S1 = S2 = 0`` and ``x - c = 0``: exactly 0, as in the
    two-pass function. Agrees with :func:`algos.groups.normalise_in_groups` to ~1e-15 relative.

    Args:
        values: (N,) float, the values to normalise (members of their groups).
        count, shift, sum_shifted, sumsq_shifted: (N,) float, the moments of each value's
            group (gathered per row).
        norm, eps, std: as :func:`algos.groups.normalise_in_groups`.
    Returns:
        (N,) float64; 0 where ``count <= 1``.
    Raises:
        ValueError: unknown ``norm`` or ``eps <= 0``.
        InvalidStepError: lengths differ or a value is NaN/inf.
    """
    check_norm(norm, eps, std)
    x = _as_1d(values, "values", np.float64)
    n = _as_1d(count, "count", np.float64)
    c = _as_1d(shift, "shift", np.float64)
    s1 = _as_1d(sum_shifted, "sum_shifted", np.float64)
    s2 = _as_1d(sumsq_shifted, "sumsq_shifted", np.float64)
    _same_length(values=x, count=n, shift=c, sum_shifted=s1, sumsq_shifted=s2)
    _check_finite(x, "values")
    safe_n = np.maximum(n, 1.0)
    centred = (x - c) - s1 / safe_n
    if norm == "std":
        ddof = 1.0 if std == "sample" else 0.0
        var = np.maximum(s2 - s1 * s1 / safe_n, 0.0) / np.maximum(n - ddof, 1.0)
        centred = centred / (np.sqrt(var) + eps)
    centred[n <= 1] = 0.0
    return centred


# --------------------------------------------------------------------------- returns


def _trajectory_layout(
    traj_ids: np.ndarray, steps: np.ndarray, describe: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sort rows by (trajectory, step); return order, sorted traj codes, position from end, lengths.

    ``describe(row) -> str`` names a row's trajectory in error messages.
    Raises InvalidStepError on a duplicate (trajectory, step) or a gap in the step indices.
    """
    describe = describe or (lambda i: f"trajectory {_r(traj_ids[i])}")
    t = dense_ids(traj_ids)
    order = consecutive_order(t, steps)
    if order is None:  # a duplicate or a gap: sort, and name the first one below
        order = np.lexsort((steps, t))
    ts, ss = t[order], steps[order]
    same = ts[1:] == ts[:-1]
    step_diff = ss[1:] - ss[:-1]
    dup = same & (step_diff == 0)
    if dup.any():
        k = int(np.flatnonzero(dup)[0])
        raise InvalidStepError(
            f"(task, run, step): duplicate step {int(ss[k])} of {describe(int(order[k]))} at rows "
            f"{int(order[k])} and {int(order[k + 1])}"
        )
    gap = same & (step_diff != 1)
    if gap.any():
        k = int(np.flatnonzero(gap)[0])
        raise InvalidStepError(
            f"steps: {describe(int(order[k]))} jumps from step {int(ss[k])} to {int(ss[k + 1])} "
            f"(rows {int(order[k])}, {int(order[k + 1])}); a missing step would make its returns wrong"
        )
    lengths = np.bincount(ts)
    ends = np.cumsum(lengths) - 1  # sorted index of each trajectory's last step
    q = ends[ts] - np.arange(ts.size)  # position counted from the trajectory's end, 0 = last
    return order, ts, q, lengths


def consecutive_order(t: np.ndarray, steps: np.ndarray) -> np.ndarray | None:
    """``np.lexsort((steps, t))`` without sorting, when every trajectory's steps are distinct
    and consecutive (the valid case): each row's slot is its trajectory's start plus its step
    minus the trajectory's first step. None when that does not place every row in its own slot
    (a duplicate or a gap, which the caller then finds by sorting).

    Args:
        t: (S,) dense trajectory codes in [0, K), S > 0.
        steps: (S,) int.
    """
    if t.size == 0:
        return None
    k = int(t.max()) + 1
    lengths = np.bincount(t, minlength=k)
    first = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, t, steps)
    offset = steps - first[t]
    if (offset >= lengths[t]).any():
        return None
    slot = (np.cumsum(lengths) - lengths)[t] + offset
    if np.bincount(slot, minlength=t.size).max() != 1:
        return None
    order = np.empty_like(slot)
    order[slot] = np.arange(t.size)
    return order


def discounted_returns(rewards: Any, traj_ids: Any, steps: Any, *, gamma: float = 0.95) -> np.ndarray:
    """Discounted step returns ``R_t = r_t + gamma * R_{t+1}`` per trajectory (GiGPO Eq. 5).

    The steps of a trajectory are ordered by ``steps`` (not by row order) and must be
    consecutive integers (a gap would silently mis-discount, so it is refused). The scan is
    vectorised: rows go into a (num_traj, T_max) matrix indexed by the position ``q`` counted
    from the trajectory's *end*, and ``R = gamma^q * cumsum_q(gamma^-q * r)`` along each row.
    Aligning at the end makes equal reward suffixes give bit-identical returns. For
    ``gamma^-(T_max-1) > 1e250`` (e.g. gamma = 0.5 beyond ~830 steps; never for the usual
    gamma >= 0.9 and <= 1000 steps) the power form would overflow and the same recursion runs
    per position instead (T_max vectorised iterations). ``gamma = 0`` returns the rewards.

    Args:
        rewards: (S,) float. Step rewards, finite.
        traj_ids: (S,) any sortable key (int or str) identifying a trajectory; combine task
            and run first (e.g. with :func:`encode_keys`).
        steps: (S,) int >= 0. Turn index of the step within its trajectory.
        gamma: discount factor in [0, 1].
    Returns:
        (S,) float64 in the input order.
    Raises:
        ValueError: gamma outside [0, 1].
        InvalidStepError: lengths differ, a non-finite reward, a negative step, a duplicate
            (trajectory, step), or a gap in a trajectory's steps (messages name the row).
    """
    _check_gamma(gamma)
    r = _as_1d(rewards, "rewards", np.float64)
    tr = _as_1d(traj_ids, "traj_ids")
    st = _as_1d(steps, "steps")
    _same_length(rewards=r, traj_ids=tr, steps=st)
    _check_finite(r, "rewards")
    if r.size == 0:
        return r.copy()
    st = _check_steps(st)
    order, ts, q, lengths = _trajectory_layout(tr, st)
    return _returns_sorted(r[order], ts, q, int(lengths.max()), float(gamma), order)


def _check_steps(st: np.ndarray) -> np.ndarray:
    if not np.issubdtype(st.dtype, np.integer):
        if not np.issubdtype(st.dtype, np.floating) or not np.all(np.mod(st, 1) == 0):
            raise InvalidStepError(f"steps: expected integers, got dtype {st.dtype}")
        st = st.astype(np.int64)
    if (st < 0).any():
        i = int(np.flatnonzero(st < 0)[0])
        raise InvalidStepError(f"steps: negative step {int(st[i])} at row {i}")
    return st.astype(np.int64, copy=False)


def _returns_sorted(rs: np.ndarray, ts: np.ndarray, q: np.ndarray, t_max: int, gamma: float, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(rs)
    if gamma == 0.0:
        out[order] = rs
        return out
    mat = np.zeros((int(ts[-1]) + 1, t_max), dtype=np.float64)
    mat[ts, q] = rs
    if gamma == 1.0:
        ret = np.cumsum(mat, axis=1)
    elif (t_max - 1) * -math.log(gamma) <= math.log(_MAX_SCALE):
        powers = np.power(gamma, np.arange(t_max, dtype=np.float64))
        ret = np.cumsum(mat / powers, axis=1) * powers
    else:  # per-position recursion, vectorised over trajectories (see docstring)
        ret = mat.copy()
        for j in range(1, t_max):
            ret[:, j] += gamma * ret[:, j - 1]
    out[order] = ret[ts, q]
    return out


# --------------------------------------------------------------------------- advantages


def episode_advantages(
    rewards: Any,
    task_ids: Any,
    traj_ids: Any,
    *,
    norm: Norm = "std",
    eps: float = 1e-6,
    weighting: EpisodeWeighting = "trajectory",
    std: StdConvention = "sample",
    singleton: SingletonEpisode = "zero",
) -> tuple[np.ndarray, np.ndarray]:
    """Episode relative advantage A^E (GiGPO Eq. 3), broadcast to each step row.

    The episode return of a trajectory is the undiscounted sum of its step rewards. It is
    normalised within its task group: with ``weighting="trajectory"`` each trajectory counts
    once (the paper); with ``"step"`` it counts once per step row, as verl-agent's
    ``episode_norm_reward`` does by default (longer trajectories weigh more in the mean and
    std). A task with equal returns gets exactly 0; a task with one trajectory (one row under
    ``"step"``) gets 0, or with ``singleton="raw"`` verl-agent's ``R / F`` with mean 0 and
    std 1 (``F = 1 + eps`` under ``norm="std"``, 1 under ``"none"``).

    Args:
        rewards: (S,) float. Step rewards, finite.
        task_ids: (S,) the task of each step (any sortable key).
        traj_ids: (S,) the trajectory of each step; must be unique across tasks (e.g. ids
            from ``encode_keys(task_ids, run_ids)``). A trajectory must not span tasks.
        norm, eps, std: see :func:`algos.groups.normalise_in_groups`.
        weighting: ``"trajectory"`` or ``"step"``.
        singleton: ``"zero"`` or ``"raw"`` (see above).
    Returns:
        advantage: (S,) float64, A^E of each row's trajectory.
        episode_return: (S,) float64, the trajectory's total reward.
    Raises:
        InvalidStepError: lengths differ, a non-finite reward, a trajectory in two tasks.
        ValueError: unknown ``norm``, ``std``, ``weighting`` or ``singleton``.
    """
    check_norm(norm, eps, std)
    if singleton not in ("zero", "raw"):
        raise ValueError(f"singleton_episode must be 'zero' or 'raw', got {_r(singleton)}")
    if weighting not in ("trajectory", "step"):
        raise ValueError(f"episode_weighting must be 'trajectory' or 'step', got {_r(weighting)}")
    r = _as_1d(rewards, "rewards", np.float64)
    tk = _as_1d(task_ids, "task_ids")
    tr = _as_1d(traj_ids, "traj_ids")
    _same_length(rewards=r, task_ids=tk, traj_ids=tr)
    _check_finite(r, "rewards")
    if r.size == 0:
        return r.copy(), r.copy()
    task_code, _ = encode_keys(tk)
    traj_code = dense_ids(tr)
    # canonical summation order: by (trajectory, reward) so totals do not depend on row order
    order = group_value_order(traj_code, r)  # sums from +0.0: the order of equal values is invisible
    num_traj = int(traj_code.max()) + 1
    totals = np.bincount(traj_code[order], weights=r[order], minlength=num_traj)
    traj_task = np.full(num_traj, -1, dtype=np.int64)
    traj_task[traj_code] = task_code
    mismatch = traj_task[traj_code] != task_code
    if mismatch.any():
        i = int(np.flatnonzero(mismatch)[0])
        raise InvalidStepError(f"traj_ids: trajectory {_r(tr[i])} at row {i} appears in more than one task")
    if weighting == "trajectory":
        adv_traj = normalise_in_groups(totals, traj_task, norm=norm, eps=eps, std=std)
        adv = adv_traj[traj_code]
        members = np.bincount(traj_task, minlength=int(task_code.max()) + 1)[task_code]
    else:
        adv = normalise_in_groups(totals[traj_code], task_code, norm=norm, eps=eps, std=std)
        members = np.bincount(task_code)[task_code]
    if singleton == "raw":
        solo = members == 1
        adv[solo] = totals[traj_code][solo] / ((1.0 + eps) if norm == "std" else 1.0)
    return adv, totals[traj_code]


def multi_step_grpo_advantages(
    task_ids: Any, run_ids: Any, steps: Any, rewards: Any, *, norm: Norm = "std", eps: float = 1e-6
) -> np.ndarray:
    """Multi-step GRPO, the baseline GiGPO is compared with: each trajectory's *last-step*
    reward, normalised within its task's trajectories, broadcast to every step.

    Reference: Trinity-RFT 0.6's ``multi_step_grpo``
    (``trinity/algorithm/advantage_fn/multi_step_grpo_advantage.py``,
    ``StepWiseGRPOAdvantageFn`` with its defaults: ``std_cal_level="group"``, no step norm):
    ``(r_last - mean) / (std + eps)``, sample std (``torch.std``), and a task with one
    trajectory scored against mean 0 and std 1 (``r_last / (1 + eps)``). Under ``norm="none"``
    the std is replaced by 1 (no Trinity counterpart).

    When only the last step is rewarded (FrozenLake) the last-step reward is the episode
    return and this equals A^E of Eq. 3 with ``singleton_episode="raw"``, i.e. GiGPO with
    ``omega = 0``.

    Args:
        task_ids, run_ids, steps: (S,) the task, run and turn of each step row.
        rewards: (S,) float, step rewards (all finite; only the last step's is used).
    Returns:
        (S,) float64, the trajectory's advantage on each of its rows.
    Raises:
        InvalidStepError: lengths differ or a non-finite reward (names row, task, run, step).
    """
    tk = _as_1d(task_ids, "task_ids")
    rn = _as_1d(run_ids, "run_ids")
    st = _as_1d(steps, "steps", np.int64)
    r = _as_1d(rewards, "rewards", np.float64)
    _same_length(task_ids=tk, run_ids=rn, steps=st, rewards=r)
    bad = ~np.isfinite(r)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidStepError(f"reward: non-finite value {_r(r[i])} at row {i} (task {_r(tk[i])}, run {_r(rn[i])}, step {_r(st[i])})")
    if r.size == 0:
        return r.copy()
    traj, num = encode_keys(tk, rn)
    last_step = np.full(num, np.iinfo(np.int64).min)
    np.maximum.at(last_step, traj, st)
    adv, _ = episode_advantages(np.where(st == last_step[traj], r, 0.0), tk, traj, norm=norm, eps=eps, singleton="raw")
    return adv


def anchor_group_ids(task_ids: Any, state_hashes: Any) -> tuple[np.ndarray, np.ndarray]:
    """Anchor-state groups keyed by (task, env_state_hash) (GiGPO Eq. 6).

    Steps of different tasks never share a group, even with equal state hashes.

    Args:
        task_ids: (S,) task of each step.
        state_hashes: (S,) str or bytes, hash of the environment state the step acted from.
            Bytes are taken as their hex form, so ``sha1(...).digest()`` and
            ``.hexdigest()`` fall in the same group. Anything else (a dict observation, a
            number) is refused, never ``str()``-ed: ``str`` of a dict depends on key order.
            Hash structured observations with ``orchestrator.anchors.state_hash.state_hash``.
    Returns:
        ids: (S,) int64 in [0, K), ordered by sorted (task, hash).
        sizes: (S,) int64, size of each row's anchor group.
    Raises:
        InvalidStepError: a missing (None or empty) or non-str/bytes state hash, or lengths differ.
    """
    tk = _as_1d(task_ids, "task_ids")
    h = _as_1d(state_hashes, "state_hashes", object)
    _same_length(task_ids=tk, state_hashes=h)
    _check_hashes(h, tk)
    ids, num = encode_keys(tk, hash_keys(h))
    return ids, np.bincount(ids, minlength=num)[ids]


def hash_keys(hashes: Any) -> np.ndarray:
    """State hashes as one str dtype: str kept, bytes as their hex form (see :func:`anchor_group_ids`).

    Args:
        hashes: (S,) str or bytes (checked by the caller).
    Returns:
        (S,) numpy str array.
    """
    h = np.asarray(hashes, dtype=object)
    return np.array([x.hex() if isinstance(x, (bytes, bytearray)) else x for x in h.tolist()], dtype=str).reshape(h.shape)


def _check_versions(v: np.ndarray, tk: np.ndarray, rn: np.ndarray, st: np.ndarray, spread: int) -> None:
    """Refuse a task whose steps' model versions differ by more than ``spread``; the message names
    the task, the run and step of its oldest step, and both versions."""
    _same_length(task_ids=tk, model_versions=v)
    if v.size == 0:
        return
    task_code, num = encode_keys(tk)
    newest = np.full(num, np.iinfo(np.int64).min)
    np.maximum.at(newest, task_code, v)
    lag = newest[task_code] - v
    if (lag > spread).any():
        i = int(np.argmax(lag))
        raise InvalidStepError(
            f"model_versions: task {_r(tk[i])} run {_r(rn[i])} step {_r(st[i])} was produced by model version {int(v[i])}, "
            f"{int(lag[i])} versions before the task's newest step ({int(newest[task_code[i]])}); max_version_spread is {spread}"
        )


def _check_hashes(h: np.ndarray, tk: np.ndarray, runs: np.ndarray | None = None, steps: np.ndarray | None = None) -> None:
    def where(i: int) -> str:
        w = f"task {_r(tk[i])}"
        if runs is not None and steps is not None:
            w += f", run {_r(runs[i])}, step {_r(steps[i])}"
        return w

    missing = np.asarray((h == None) | (h == ""), dtype=bool)  # noqa: E711 (element-wise on an object array)
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InvalidStepError(f"env_state_hash: missing ({_r(h[i])}) at row {i} ({where(i)})")
    bad = [i for i, x in enumerate(h.tolist()) if not isinstance(x, (str, bytes, bytearray))]
    if bad:
        i = bad[0]
        raise InvalidStepError(
            f"env_state_hash: expected str or bytes at row {i} ({where(i)}), got {type(h[i]).__name__} {_r(h[i])}; "
            "hash structured observations with orchestrator.anchors.state_hash.state_hash (never str())"
        )


def step_advantages(
    returns: Any, anchor_ids: Any, *, norm: Norm = "std", eps: float = 1e-6, std: StdConvention = "sample"
) -> np.ndarray:
    """Step relative advantage A^S (GiGPO Eq. 7): R_t normalised within its anchor group.

    A singleton anchor group gets 0 (no other action from that state to compare with), as
    does every member of a group with identical returns (exactly 0, see
    :func:`algos.groups.normalise_in_groups`).

    Args:
        returns: (S,) float. Discounted returns from :func:`discounted_returns`.
        anchor_ids: (S,) int. From :func:`anchor_group_ids` or :func:`similarity_anchor_ids`.
        norm, eps, std: see :func:`algos.groups.normalise_in_groups`.
    Returns:
        (S,) float64.
    Raises:
        InvalidStepError: lengths differ or a non-finite return.
        ValueError: unknown ``norm``.
    """
    return normalise_in_groups(returns, anchor_ids, norm=norm, eps=eps, std=std)


def _similarity(a: str, b: str, kind: Similarity, tokens: dict[str, frozenset[str]]) -> float:
    if kind == "ratio":
        return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    ta, tb = tokens[a], tokens[b]
    union = len(ta | tb)
    return 1.0 if union == 0 else len(ta & tb) / union


def similarity_anchor_ids(
    task_ids: Any,
    texts: Sequence[str],
    *,
    threshold: float,
    similarity: Similarity = "ratio",
    grouping: SimilarityGrouping = "components",
) -> tuple[np.ndarray, np.ndarray]:
    """Anchor groups of similar (not only identical) text states, within each task.

    Two distinct texts of the same task are linked when their similarity is ``>= threshold``
    (``"ratio"``: difflib ``SequenceMatcher(autojunk=False).ratio()``, in [0, 1], verl-agent's
    measure; ``"jaccard"``: Jaccard index of the whitespace-token sets). Anchor groups are the
    connected components of this graph, labelled by their smallest (task, text), so the
    grouping does not depend on row order (verl-agent's greedy clustering does). Components
    are transitive: a chain of similar texts forms one group even if its ends are dissimilar.

    With ``grouping="greedy"`` (verl-agent's ``build_step_group``) the texts of a task are
    visited in row order; each joins the first cluster, in creation order, whose
    representative (its first text) is similar enough, else founds a new cluster. The result
    then depends on row order and is not transitive. Groups are labelled by their
    representative's (task, text).

    Cost: one comparison per pair of *distinct* texts within a task (Python loop over pairs,
    O(U^2) per task); fine for the hundreds of distinct states of a batch.

    Args:
        task_ids: (S,) task of each step.
        texts: (S,) str, the state text of each step.
        threshold: in (0, 1]; 1 links identical texts only.
        similarity: ``"ratio"`` or ``"jaccard"``.
        grouping: ``"components"`` (default) or ``"greedy"``.
    Returns:
        ids: (S,) int64 in [0, K); sizes: (S,) int64 group size per row.
    Raises:
        ValueError: threshold outside (0, 1], unknown similarity or grouping.
        InvalidStepError: a text is not a string, or lengths differ.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1], got {_r(threshold)}")
    if similarity not in ("ratio", "jaccard"):
        raise ValueError(f"similarity must be 'ratio' or 'jaccard', got {_r(similarity)}")
    if grouping not in ("components", "greedy"):
        raise ValueError(f"similarity_grouping must be 'components' or 'greedy', got {_r(grouping)}")
    tk = _as_1d(task_ids, "task_ids")
    tx = _as_1d(texts, "texts", object)
    _same_length(task_ids=tk, texts=tx)
    for i, x in enumerate(tx):
        if not isinstance(x, str):
            raise InvalidStepError(f"texts: expected str at row {i} (task {_r(tk[i])}), got {type(x).__name__}")
    # distinct (task, text) pairs in sorted order; compare only within a task
    key_ids, num = encode_keys(tk, tx.astype(str))
    first_row = first_rows(key_ids, num)
    uniq_task, uniq_text = tk[first_row], tx[first_row]
    parent = np.arange(num)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return int(x)

    tokens = {t: frozenset(re.findall(r"\S+", t)) for t in uniq_text} if similarity == "jaccard" else {}
    task_code, _ = encode_keys(uniq_task)
    bounds = np.flatnonzero(np.r_[True, task_code[1:] != task_code[:-1], True])
    if grouping == "greedy":
        # distinct texts visited in order of first appearance (a repeated text compares as its first copy)
        for lo, hi in itertools.pairwise(bounds):
            reps: list[int] = []
            for k in sorted(range(lo, hi), key=lambda k: first_row[k]):
                rep_k = next(
                    (r for r in reps if _similarity(uniq_text[k], uniq_text[r], similarity, tokens) >= threshold), None
                )
                if rep_k is None:
                    reps.append(k)
                else:
                    parent[k] = rep_k
        _, comp = np.unique(parent, return_inverse=True)
        ids = comp.reshape(-1)[key_ids].astype(np.int64)
        return ids, np.bincount(ids)[ids]
    for lo, hi in itertools.pairwise(bounds):
        for a in range(lo, hi):
            for b in range(a + 1, hi):
                if _similarity(uniq_text[a], uniq_text[b], similarity, tokens) >= threshold:
                    ra, rb = find(a), find(b)
                    if ra != rb:
                        parent[max(ra, rb)] = min(ra, rb)  # root = smallest sorted key
    roots = np.array([find(k) for k in range(num)], dtype=np.int64)
    _, comp = np.unique(roots, return_inverse=True)
    ids = comp.reshape(-1)[key_ids].astype(np.int64)
    return ids, np.bincount(ids)[ids]


def gigpo_advantages(
    task_ids: Any,
    run_ids: Any,
    steps: Any,
    rewards: Any,
    state_hashes: Any,
    *,
    config: GiGPOConfig | None = None,
    invalid: Any = None,
    state_texts: Sequence[str] | None = None,
    model_versions: Any = None,
) -> GiGPOAdvantages:
    """GiGPO advantages for a batch of step rows: ``A = A^E + omega * A^S`` (Eq. 8).

    Steps are validated, rewards penalised for invalid actions
    (``r - invalid_action_penalty * invalid``, before or after discounting per
    ``config.penalty_timing``), then: returns R_t (Eq. 5, ordered by
    ``steps``), episode advantages over each task's trajectories (Eq. 3), anchor groups by
    (task, state hash) or by text similarity (Eq. 6), step advantages (Eq. 7). Results do
    not depend on row order.

    Args:
        task_ids: (S,) task of each step (str or int).
        run_ids: (S,) int, index of the trajectory within its task group.
        steps: (S,) int >= 0, turn index; consecutive within a trajectory.
        rewards: (S,) float, step rewards (finite).
        state_hashes: (S,) str, ``env_state_hash`` of the state the step acted from.
        config: :class:`GiGPOConfig`; defaults to the paper's settings.
        invalid: optional (S,) bool, True where the action was invalid.
        state_texts: (S,) str, needed when ``config.similarity_threshold`` is set.
        model_versions: optional (S,) int, the model version that produced each step; with
            ``config.max_version_spread`` set, a task whose runs span more versions is refused
            (their steps are not comparable samples of one policy, Eq. 3 and 7).
    Returns:
        :class:`GiGPOAdvantages`, each field (S,) in the input order.
    Raises:
        InvalidStepError: lengths differ; a missing state hash; a duplicate
            (task, run, step); a gap in a trajectory's steps; a negative step; a non-finite
            reward (messages name the field, row, task and value).
        ValueError: similarity grouping without ``state_texts``.
    """
    cfg = config or GiGPOConfig()
    tk = _as_1d(task_ids, "task_ids")
    rn = _as_1d(run_ids, "run_ids")
    st = _as_1d(steps, "steps")
    r = _as_1d(rewards, "rewards", np.float64)
    h = _as_1d(state_hashes, "state_hashes", object)
    _same_length(task_ids=tk, run_ids=rn, steps=st, rewards=r, state_hashes=h)
    _check_rewards(r, tk, rn, st)
    _check_hashes(h, tk, rn, st)
    st = _check_steps(st)
    if model_versions is not None and cfg.max_version_spread is not None:
        _check_versions(_as_1d(model_versions, "model_versions", np.int64), tk, rn, st, cfg.max_version_spread)
    penalty = _penalty(cfg, r, invalid)
    task_code, _ = encode_keys(tk)  # string keys are sorted once; the rest works on ints
    if cfg.similarity_threshold is None:
        anchor_ids, sizes = anchor_group_ids(task_code, h)
    else:
        if state_texts is None:
            raise ValueError("similarity_threshold is set but state_texts were not given")
        anchor_ids, sizes = similarity_anchor_ids(
            tk, state_texts, threshold=cfg.similarity_threshold, similarity=cfg.similarity, grouping=cfg.similarity_grouping
        )
    return _gigpo_from_codes(task_code, rn, st, r, penalty, anchor_ids, sizes, cfg, lambda i: f"task {_r(tk[i])} run {_r(rn[i])}")


def gigpo_advantages_coded(
    group_ids: Any,
    run_ids: Any,
    steps: Any,
    rewards: Any,
    state_ids: Any,
    *,
    config: GiGPOConfig | None = None,
    invalid: Any = None,
    group_names: Any = None,
) -> GiGPOAdvantages:
    """:func:`gigpo_advantages` on integer-coded keys, for adapters that factorise their keys once.

    ``A = A^E + omega * A^S`` (Eq. 8) with A^E over each group's trajectories (Eq. 3), R_t
    discounted along ``steps`` (Eq. 5), anchor groups (Eq. 6) = rows of one group with equal
    ``state_ids``, and A^S within them (Eq. 7). Every number equals, bit for bit,
    :func:`gigpo_advantages` on the keys the codes stand for (the statistics of a group do not
    depend on how groups are labelled); only the labels in ``anchor_ids`` may differ. No
    state-hash check (the codes are already the states) and no similarity grouping.

    Args:
        group_ids: (S,) int, the task group of each step (GiGPO's "task").
        run_ids: (S,) int, the trajectory within its group.
        steps: (S,) int >= 0, consecutive within a trajectory.
        rewards: (S,) float, finite.
        state_ids: (S,) int, the anchor state; equal codes within a group are one anchor group.
            A step that must stay alone gets a code of its own.
        config: :class:`GiGPOConfig` (``similarity_threshold`` must be None).
        invalid: optional (S,) bool, True where the action was invalid.
        group_names: optional (G,) names of the group codes, used in error messages.
    Returns:
        :class:`GiGPOAdvantages`, each field (S,) in the input order.
    Raises:
        InvalidStepError: lengths differ, a non-finite reward, a negative, duplicate or
            missing step (messages name the row, group, run and step).
        ValueError: ``config.similarity_threshold`` is set (use :func:`gigpo_advantages`).
    """
    cfg = config or GiGPOConfig()
    if cfg.similarity_threshold is not None:
        raise ValueError("gigpo_advantages_coded: similarity_threshold needs state texts; use gigpo_advantages")
    g = _as_1d(group_ids, "group_ids", np.int64)
    rn = _as_1d(run_ids, "run_ids", np.int64)
    st = _as_1d(steps, "steps")
    r = _as_1d(rewards, "rewards", np.float64)
    sid = _as_1d(state_ids, "state_ids", np.int64)
    _same_length(group_ids=g, run_ids=rn, steps=st, rewards=r, state_ids=sid)
    names = _GroupNames(g, group_names)  # looked up only for an error message
    _check_rewards(r, names, rn, st)
    st = _check_steps(st)
    anchor_ids, num = encode_keys(g, sid)
    sizes = np.bincount(anchor_ids, minlength=num)[anchor_ids]
    penalty = _penalty(cfg, r, invalid)
    return _gigpo_from_codes(g, rn, st, r, penalty, anchor_ids, sizes, cfg, lambda i: f"task {_r(names[i])} run {_r(rn[i])}")


class _GroupNames:
    """``names[row]``: the name of a row's group code (the code itself without names)."""

    def __init__(self, codes: np.ndarray, names: Any) -> None:
        self.codes, self.names = codes, names

    def __getitem__(self, row: int) -> Any:
        code = self.codes[row]
        return code if self.names is None else self.names[int(code)]


def _check_rewards(r: np.ndarray, tk: np.ndarray, rn: np.ndarray, st: np.ndarray) -> None:
    bad = ~np.isfinite(r)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidStepError(f"reward: non-finite value {_r(r[i])} at row {i} (task {_r(tk[i])}, run {_r(rn[i])}, step {_r(st[i])})")


def _penalty(cfg: GiGPOConfig, r: np.ndarray, invalid: Any) -> np.ndarray:
    """(S,) ``invalid_action_penalty * invalid`` (zeros without ``invalid``)."""
    if invalid is None:
        return np.zeros_like(r)
    inv = _as_1d(invalid, "invalid", bool)
    _same_length(rewards=r, invalid=inv)
    return cfg.invalid_action_penalty * inv


def _gigpo_from_codes(
    task_code: np.ndarray,
    rn: np.ndarray,
    st: np.ndarray,
    r: np.ndarray,
    penalty: np.ndarray,
    anchor_ids: np.ndarray,
    sizes: np.ndarray,
    cfg: GiGPOConfig,
    describe: Any,
) -> GiGPOAdvantages:
    """Eq. 3, 5, 7 and 8 on validated integer rows (``describe(row)`` names a trajectory in errors)."""
    traj, _ = encode_keys(task_code, rn)
    order, ts, q, lengths = _trajectory_layout(traj, st, describe)
    before = cfg.penalty_timing == "before_returns"
    r_disc = r - penalty if before else r
    returns = _returns_sorted(r_disc[order], ts, q, int(lengths.max()), float(cfg.gamma), order) if r.size else r.copy()
    if not before:
        returns = returns - penalty
    ep_adv, ep_ret = episode_advantages(
        r - penalty, task_code, traj, norm=cfg.norm, eps=cfg.eps, weighting=cfg.episode_weighting,
        std=cfg.std, singleton=cfg.singleton_episode,
    )
    st_adv = step_advantages(returns, anchor_ids, norm=cfg.norm, eps=cfg.eps, std=cfg.std)
    return GiGPOAdvantages(
        advantages=ep_adv + cfg.omega * st_adv,
        episode=ep_adv,
        step=st_adv,
        returns=returns,
        episode_returns=ep_ret,
        anchor_ids=anchor_ids,
        anchor_sizes=sizes,
    )


def broadcast_to_tokens(advantages: Any, response_mask: Any) -> Any:
    """Spread one advantage per step over its response tokens: ``A[s] * mask[s, t]``.

    Args:
        advantages: (S,) float, numpy or torch.
        response_mask: (S, T) bool or {0, 1}, numpy or torch; 1 on the step's action tokens.
    Returns:
        (S, T) float64 numpy array, or a torch tensor of the mask's device and float dtype
        (float32 for an integer or bool mask) when the mask is a tensor.
    Raises:
        ValueError: shapes do not match.
    """
    if type(response_mask).__module__.startswith("torch"):
        import torch

        adv = torch.as_tensor(advantages, device=response_mask.device)
        if adv.ndim != 1 or response_mask.ndim != 2 or adv.shape[0] != response_mask.shape[0]:
            raise ValueError(f"advantages {tuple(adv.shape)} and response_mask {tuple(response_mask.shape)} do not match")
        dtype = response_mask.dtype if response_mask.is_floating_point() else torch.float32
        return adv.to(dtype).unsqueeze(-1) * response_mask.to(dtype)
    adv = np.asarray(advantages, dtype=np.float64)
    mask = np.asarray(response_mask)
    if adv.ndim != 1 or mask.ndim != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"advantages {adv.shape} and response_mask {mask.shape} do not match")
    return adv[:, None] * mask.astype(np.float64)
