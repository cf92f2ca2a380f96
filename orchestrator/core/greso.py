"""``greso``: GRESO's pre-rollout skip of prompts that were zero-variance in their recent epochs.

Reference: Zheng et al., "Act Only When It Pays: Efficient Reinforcement Learning for LLM
Reasoning via Selective Rollouts" (GRESO, arXiv 2506.02177), Sec. 4, and the authors' released
code, github.com/Infini-AI-Lab/GRESO at commit b27784315479921ea1977178d7e6c4858b2ae5a1 (files
``verl/trainer/ttis/presampling_selector.py``: ``easy_probabilistic_skip``,
``hard_probabilistic_skip``, ``filter_examples_all_probabilistic``; ``verl/trainer/ppo/ray_trainer.py``,
the ``all_probabilistic`` branch of ``fit``; ``train-scripts/*_greso.sh``: the settings). The rule
this mode follows, as released:

* each epoch goes over the prompts in order; a prompt whose last ``z`` groups were all correct
  (``z`` >= 1) is rolled out with probability ``max(p_easy ** z, keep_floor)``, one whose last
  ``z`` groups were all wrong with ``max(p_hard ** z, keep_floor)``, any other prompt always
  (``keep_floor`` = 0.01: ``skip_probability = 1 - max(p ** count, 0.01)``, the exploration floor);
* ``p_easy`` and ``p_hard`` start at 0.5 (``data.p_easy``, ``data.p_hard``) and adapt **once per
  training step**, from the shares of all-correct and all-wrong groups among every group rolled
  out for that step (all its sampling rounds together): a share at or above its target lowers
  ``p`` by ``step`` = 0.01, a share below raises it; targets are ``target_zero_share`` = 0.25 of
  the groups (``data.target_zero_variance``), a third of it all-correct and two thirds all-wrong;
* ``p`` stays in [``p_min``, ``p_max``] = [0.05, 0.95] (``data.min_p``, ``data.max_p``: the cap);
* the adaptation starts in the second epoch (``if epoch > 0``): through the first pass, every
  prompt is new and ``p`` stays at its start (``adapt_from_epoch`` = 1).

A training step here is one batch of the policy's ``target_groups`` informative groups: the
selection counts the groups it observes and adapts when the informative ones reach
``target_groups`` (what GRESO's loop does when its dynamic-sampling batch is full). Every
setting is an option (:class:`GresoOptions`, the policy's ``selection_options``) with the released
value as its default; the rule of this mode up to session 12 (``p`` adapted after every round, from the first, by a
strict ``>``; no floor; cap 1) is ``keep_floor=0, p_max=1, adapt_from_epoch=0,
adapt_per_batch=False`` (except the strict comparison).

Everything else is :class:`~orchestrator.core.selection.EpochSelection` (seeded permutation per
epoch, skip-rule cooldowns). The skip draw is counter-based (``default_rng([seed, 2, epoch])``,
one uniform per task and epoch), so a checkpoint restores the same skips.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from orchestrator.core.registry import ModeOptions
from orchestrator.core.selection import EpochSelection, SelectionContext, register_selection


class GresoOptions(ModeOptions):
    """Options of ``greso`` (the policy's ``selection_options``); defaults: the released code's
    (Infini-AI-Lab/GRESO b277843, module docstring)."""

    p_start: float = Field(0.5, gt=0.0, le=1.0, description="Where p_easy and p_hard start (data.p_easy, data.p_hard: 0.5).")
    step: float = Field(0.01, ge=0.0, le=1.0, description="Change of p_easy / p_hard at each adaptation (0.01).")
    p_min: float = Field(0.05, gt=0.0, le=1.0, description="Least exploration probability (data.min_p: 0.05).")
    p_max: float = Field(0.95, gt=0.0, le=1.0, description="Cap of the exploration probability (data.max_p: 0.95).")
    keep_floor: float = Field(0.01, ge=0.0, le=1.0, description="Least chance a prompt with a streak is rolled out (0.01).")
    target_zero_share: float = Field(0.25, ge=0.0, le=1.0, description="Target share of zero-variance groups (data.target_zero_variance: 0.25).")
    easy_share: float = Field(1 / 3, ge=0.0, le=1.0, description="Part of target_zero_share that is all-correct (the rest all-wrong).")
    adapt_from_epoch: int = Field(1, ge=0, description="First epoch (0-based) whose training batches adapt p (released: 1).")
    adapt_per_batch: bool = Field(True, description="Adapt once per training batch (GRESO), else after every round of groups.")

    @field_validator("p_max")
    @classmethod
    def _cap_above_minimum(cls, v: float, info: ValidationInfo) -> float:
        p_min = info.data.get("p_min")
        if p_min is not None and v < p_min:
            raise ValueError(f"must be >= p_min ({p_min!r}), got {v!r}")
        return v


def keep_probability(streak_correct: np.ndarray, streak_wrong: np.ndarray, p_easy: float, p_hard: float,
                     floor: float = 0.0) -> np.ndarray:
    """GRESO's chance to roll a prompt out: ``max(p_easy ** z_correct * p_hard ** z_wrong, floor)`` for
    a prompt with a streak, 1 without one (released code: ``skip_probability = 1 - max(p ** count,
    0.01)`` in ``easy_probabilistic_skip`` / ``hard_probabilistic_skip``, ``count`` >= 1).

    At most one of the two streaks is non-zero for a task (a group is either), so this is
    ``max(p_easy ** z, floor)`` after ``z`` all-correct groups, ``max(p_hard ** z, floor)`` after
    ``z`` all-wrong ones, and 1 for a task whose last group was informative (or that was never
    rolled out).

    Args:
        streak_correct, streak_wrong: (k,) int >= 0.
        p_easy, p_hard: in (0, 1].
        floor: the exploration floor in [0, 1] (GRESO's 0.01).
    Returns:
        (k,) float64 in (0, 1].
    """
    zc, zw = np.asarray(streak_correct, dtype=np.float64), np.asarray(streak_wrong, dtype=np.float64)
    p = np.power(p_easy, zc) * np.power(p_hard, zw)
    return np.where((zc > 0) | (zw > 0), np.maximum(p, floor), 1.0)


def adapt(p: float, share: float, target: float, step: float, p_min: float, p_max: float) -> float:
    """One GRESO update of an exploration probability (released ``ray_trainer.py``): ``p - step`` when
    the step's share of that kind of zero-variance group is at or above its target, ``p + step``
    below it, clamped to [``p_min``, ``p_max``]."""
    return float(min(max(p - step if share >= target else p + step, p_min), p_max))


@register_selection
class GresoSelection(EpochSelection):
    """Epoch order with GRESO's probabilistic skip of recently zero-variance tasks."""

    name = "greso"
    Options = GresoOptions

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, options, max_idle_epochs)
        self.p_easy = self.p_hard = self.options.p_start
        self.batch_groups = 8  # the policy's target_groups: informative groups of one training batch
        # groups observed since the last adaptation: all, all-correct, all-wrong, informative
        self.pending = {"groups": 0, "easy": 0, "hard": 0, "informative": 0}

    def configure(self, policy, options: ModeOptions | None = None) -> None:
        """Reads ``target_groups`` (a training batch's informative groups); a ``p_start`` other than
        the one in force resets both probabilities to it."""
        if options is not None and options.p_start != self.options.p_start:
            self.p_easy = self.p_hard = options.p_start
        super().configure(policy, options)
        self.batch_groups = int(policy.target_groups)

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = super().eligible(tasks, ctx)
        if ctx.zero_streak_correct is None:
            return base
        u = np.random.default_rng([self.seed, 2, self._epoch]).random(self.num_tasks)[tasks]
        return base & (u < keep_probability(ctx.zero_streak_correct[tasks], ctx.zero_streak_wrong[tasks], self.p_easy,
                                            self.p_hard, self.options.keep_floor))

    def observe(self, task_idx: np.ndarray, informative: np.ndarray, all_correct: np.ndarray) -> None:
        """Count these groups (one round); once a training batch's worth of informative groups is in
        (``adapt_per_batch``; else after every round), adapt ``p_easy`` / ``p_hard`` to the shares of
        all-correct and all-wrong groups among all counted, from epoch ``adapt_from_epoch`` on
        (:func:`adapt`), and start counting afresh."""
        if len(task_idx) == 0:
            return
        informative, all_correct = np.asarray(informative, dtype=bool), np.asarray(all_correct, dtype=bool)
        c = self.pending
        c["groups"] += len(task_idx)
        c["easy"] += int(all_correct.sum())
        c["hard"] += int((~informative & ~all_correct).sum())
        c["informative"] += int(informative.sum())
        o = self.options
        if o.adapt_per_batch and c["informative"] < self.batch_groups:
            return
        if self._epoch >= o.adapt_from_epoch:
            t_easy, t_hard = o.target_zero_share * o.easy_share, o.target_zero_share * (1 - o.easy_share)
            self.p_easy = adapt(self.p_easy, c["easy"] / c["groups"], t_easy, o.step, o.p_min, o.p_max)
            self.p_hard = adapt(self.p_hard, c["hard"] / c["groups"], t_hard, o.step, o.p_min, o.p_max)
        self.pending = {k: 0 for k in c}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "p_easy": self.p_easy, "p_hard": self.p_hard, "pending": dict(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
        self.pending = {k: int(v) for k, v in state.get("pending", {}).items()} or {k: 0 for k in self.pending}

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "p_easy": self.p_easy, "p_hard": self.p_hard}

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``greso_keep_probability``: the chance task ``i`` is rolled out when its turn comes."""
        if ctx.zero_streak_correct is None:
            return {}
        p = keep_probability(ctx.zero_streak_correct[i : i + 1], ctx.zero_streak_wrong[i : i + 1], self.p_easy, self.p_hard,
                             self.options.keep_floor)
        return {"greso_keep_probability": float(p[0])}
