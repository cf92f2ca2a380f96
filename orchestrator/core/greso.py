"""``greso``: GRESO's pre-rollout skip of prompts that were zero-variance in their recent epochs.

Reference: Zheng et al., "Act Only When It Pays: Efficient Reinforcement Learning for LLM
Reasoning via Selective Rollouts" (GRESO, arXiv 2506.02177), Sec. 4, as we read it: each epoch
goes over the prompts in order; a prompt whose last ``z`` groups were all zero-variance (``z``
consecutive all-correct, or all-wrong, groups) is rolled out with probability ``p ** z`` and
skipped otherwise, ``p = p_easy`` for an all-correct streak and ``p_hard`` for an all-wrong one.
Both exploration probabilities adapt: after each round, ``p`` falls by ``step`` when the share
of that kind of zero-variance group among the round's groups exceeds its target, and rises by
``step`` otherwise (clamped to [``p_min``, 1]). Defaults (``p`` starts at 0.5, ``step`` 0.01,
targets 0.25 of the groups zero-variance in all, a third of it easy and two thirds hard) are our
reading of the paper's settings (:class:`GresoOptions`, the policy's ``selection_options``).

Everything else is :class:`~orchestrator.core.selection.EpochSelection` (seeded permutation per
epoch, skip-rule cooldowns). The skip draw is counter-based (``default_rng([seed, 2, epoch])``,
one uniform per task and epoch), so a checkpoint restores the same skips.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from orchestrator.core.registry import ModeOptions
from orchestrator.core.selection import EpochSelection, SelectionContext, register_selection


class GresoOptions(ModeOptions):
    """Options of ``greso`` (the policy's ``selection_options``; defaults: our reading of the paper's settings)."""

    p_start: float = Field(0.5, gt=0.0, le=1.0, description="Exploration probability p_easy and p_hard start at (0 would never roll a skipped task again).")
    step: float = Field(0.01, ge=0.0, le=1.0, description="Change of p_easy / p_hard after each round.")
    p_min: float = Field(0.05, gt=0.0, le=1.0, description="Least exploration probability.")
    target_zero_share: float = Field(0.25, ge=0.0, le=1.0, description="Target share of zero-variance groups among a round's groups.")
    easy_share: float = Field(1 / 3, ge=0.0, le=1.0, description="Part of target_zero_share that is all-correct (the rest all-wrong).")


def keep_probability(streak_correct: np.ndarray, streak_wrong: np.ndarray, p_easy: float, p_hard: float) -> np.ndarray:
    """GRESO's chance to roll a prompt out: ``p_easy ** z_correct * p_hard ** z_wrong``.

    At most one of the two streaks is non-zero for a task (a group is either), so this is
    ``p_easy ** z`` after ``z`` all-correct groups, ``p_hard ** z`` after ``z`` all-wrong ones,
    and 1 for a task whose last group was informative (or that was never rolled out).

    Args:
        streak_correct, streak_wrong: (k,) int >= 0.
        p_easy, p_hard: in (0, 1].
    Returns:
        (k,) float64 in (0, 1].
    """
    return np.power(p_easy, np.asarray(streak_correct, dtype=np.float64)) * np.power(p_hard, np.asarray(streak_wrong, dtype=np.float64))


@register_selection
class GresoSelection(EpochSelection):
    """Epoch order with GRESO's probabilistic skip of recently zero-variance tasks."""

    name = "greso"
    Options = GresoOptions

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, options, max_idle_epochs)
        self.p_easy = self.p_hard = self.options.p_start

    def configure(self, policy, options: ModeOptions | None = None) -> None:
        """A ``p_start`` other than the one in force resets both probabilities to it."""
        if options is not None and options.p_start != self.options.p_start:
            self.p_easy = self.p_hard = options.p_start
        super().configure(policy, options)

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = super().eligible(tasks, ctx)
        if ctx.zero_streak_correct is None:
            return base
        u = np.random.default_rng([self.seed, 2, self._epoch]).random(self.num_tasks)[tasks]
        return base & (u < keep_probability(ctx.zero_streak_correct[tasks], ctx.zero_streak_wrong[tasks], self.p_easy,
                                            self.p_hard))

    def observe(self, task_idx: np.ndarray, informative: np.ndarray, all_correct: np.ndarray) -> None:
        """Adapt ``p_easy`` / ``p_hard`` to the zero-variance shares of these groups (one round)."""
        g = len(task_idx)
        if g == 0:
            return
        o = self.options.model_dump()
        easy = float(np.mean(all_correct))
        hard = float(np.mean(~np.asarray(informative, dtype=bool) & ~np.asarray(all_correct, dtype=bool)))
        t_easy, t_hard = o["target_zero_share"] * o["easy_share"], o["target_zero_share"] * (1 - o["easy_share"])
        self.p_easy = float(np.clip(self.p_easy + (-o["step"] if easy > t_easy else o["step"]), o["p_min"], 1.0))
        self.p_hard = float(np.clip(self.p_hard + (-o["step"] if hard > t_hard else o["step"]), o["p_min"], 1.0))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "p_easy": self.p_easy, "p_hard": self.p_hard}

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``greso_keep_probability``: the chance task ``i`` is rolled out when its turn comes."""
        if ctx.zero_streak_correct is None:
            return {}
        p = keep_probability(ctx.zero_streak_correct[i : i + 1], ctx.zero_streak_wrong[i : i + 1], self.p_easy, self.p_hard)
        return {"greso_keep_probability": float(p[0])}
