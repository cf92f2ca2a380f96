"""``dso_grpo``: the DAPO bundle's group-relative advantages for Trinity, vectorised over the batch.

The fields are read off the experiences once, into arrays; the statistics are computed on the
arrays; the token advantages are written back with
:func:`orchestrator.trinity.writeback.write_token_advantages` (a constant number of tensor
operations for the whole batch, not one multiply and one copy per experience). Nothing here
talks to the orchestrator: no Ray actor, no anchor index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.buffer.operators import ExperienceOperator
from trinity.common.experience import Experience as TrinityExperience

from algos.checks import check_number
from algos.dapo import InvalidGroupError
from orchestrator.trinity.fields import REWARD, MemoryOrder, group_codes, masked_rows
from orchestrator.trinity.writeback import TokenMasks, gc_paused, write_token_advantages


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
