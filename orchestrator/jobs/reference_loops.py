"""The reference arms of ``compare-sampling``: batch loops that do not use the orchestrator.

* :class:`DapoRecipeLoop` - the DAPO recipe's loop (verl ``recipe/dapo``, DAPO arXiv 2503.14476
  Sec. 3.2 "dynamic sampling"): roll out a generation batch of ``gen_batch`` prompts (epoch
  order), keep the informative groups, repeat until ``target`` groups are kept, then truncate:
  the surplus informative groups are discarded.
* :class:`TrinityDifficultyLoop` - the same accumulate-and-truncate loop with the prompts chosen
  by Trinity-RFT 0.6's ``difficulty_based`` selector (``trinity.buffer.selector.selector.
  DifficultyBasedSelector``, the installed class, with its ``InterpolationBetaPREstimator``),
  fed back each group's pass rate as Trinity's explorer does.

Both return a :class:`~orchestrator.core.types.Batch` of exactly ``target`` informative groups and
count every rollout they generate.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from algos.dapo import classify_groups
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.types import Batch, Group

TRINITY_DIFFICULTY_KWARGS = {"target_reward": 0.5, "tau": 0.1, "m": 8, "lamb": 0.2, "rho": 0.2}
"""Settings of Trinity's selector here: prompts closest to a pass rate of 1/2 (Trinity's default
``target_reward`` 1.0 would pick the easiest), softmax temperature 0.1 over scores in [-0.5, 0]
(its default 1.0 is near uniform there), ``m`` = our group size; ``lamb``/``rho`` its defaults."""


class DapoRecipeLoop:
    """Accumulate-and-truncate over a seeded epoch order (see the module docstring)."""

    def __init__(self, source: Any, tasks: list, target: int, n: int, gen_batch: int, seed: int = 0):
        self.source, self.tasks, self.target, self.n, self.gen_batch = source, tasks, target, n, gen_batch
        self.seed = seed
        self.epoch, self.cursor = 0, 0
        self.order = np.random.default_rng([seed, 0]).permutation(len(tasks))
        self.rollouts = self.classified = self.kept = self.discarded = 0
        self.dropped = {r.label: 0 for r in GroupOutcome if r != GroupOutcome.INFORMATIVE}

    def pick(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.cursor >= len(self.order):
                self.epoch += 1
                self.cursor = 0
                self.order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.tasks))
            take = self.order[self.cursor : self.cursor + count - len(out)]
            self.cursor += len(take)
            out += take.tolist()
        return out

    def feedback(self, idx: list[int], acc: np.ndarray) -> None:
        """Pass rates of the rolled groups (the DAPO recipe ignores them)."""

    def next_batch(self, step: int, version: int) -> Batch:
        kept: list[Group] = []
        rounds = 0
        while len(kept) < self.target:
            idx = self.pick(self.gen_batch)
            groups = self.source.generate([self.tasks[i] for i in idx], self.n, model_version=version, round_tag=f"b{step}r{rounds}")
            acc = np.array([[r.metrics["accuracy"] for r in g.rollouts] for g in groups])
            keep, reasons = classify_groups(acc)
            self.feedback(idx, acc)
            for g, code in zip(groups, reasons):
                g.reason = GroupOutcome(int(code)).label
                if g.reason != "informative":
                    self.dropped[g.reason] += 1
            kept += [g for g, k in zip(groups, keep) if k]
            self.rollouts += len(groups) * self.n
            self.classified += len(groups)
            self.kept += int(keep.sum())
            rounds += 1
        self.discarded += len(kept) - self.target
        return Batch(step, kept[: self.target], rounds=rounds - 1, model_version=version)


class TrinityDifficultyLoop(DapoRecipeLoop):
    """Accumulate-and-truncate with Trinity's ``difficulty_based`` selector picking the prompts.

    The selector's estimator needs two per-task features (pass rates of two reference models in
    Trinity's examples); no such offline data exists for these tasks, so both are constants
    (0 and 1): its interpolated prior is then the running mean pass rate of the rolled groups,
    and each task's own Beta counts do the rest (``lamb`` discount, ``rho`` prior weight).
    """

    def __init__(self, source: Any, tasks: list, target: int, n: int, gen_batch: int, seed: int = 0):
        super().__init__(source, tasks, target, n, gen_batch, seed)
        from trinity.buffer.selector.selector import DifficultyBasedSelector
        from trinity.common.config import DataSelectorConfig

        data = SimpleNamespace(dataset={"ref_lo": [0.0] * len(tasks), "ref_hi": [1.0] * len(tasks)})
        config = DataSelectorConfig(selector_type="difficulty_based", seed=seed, feature_keys=["ref_lo", "ref_hi"],
                                    kwargs=dict(TRINITY_DIFFICULTY_KWARGS))
        self.selector = DifficultyBasedSelector(data, config)

    def pick(self, count: int) -> list[int]:
        return [int(i) for i in self.selector.get_indices(count)]

    def feedback(self, idx: list[int], acc: np.ndarray) -> None:
        self.selector.feedback(idx, acc.mean(axis=1).tolist())
