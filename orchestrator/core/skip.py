"""``predicted_skip``: epoch order, skipping the tasks predicted to give a zero-variance group.

GRESO (Zheng et al., arXiv 2506.02177, Sec. 4; :mod:`orchestrator.core.greso`) skips a prompt
before its rollouts from *its own* recent zero-variance streak, so it saves nothing on a prompt
until that prompt was rolled out at least once, and nothing in the first epoch. This mode
skips from the pass-rate posterior instead (:class:`orchestrator.core.passrate.PassRateEstimate`):
a task's predicted chance ``I`` of an informative group (Beta-Binomial predictive, DAPO's Eq. 11
event) combines its own history with the prior of its difficulty tag (its family), so a
never-seen task of a family that is always solved or never solved is skipped in its first
epoch. Each epoch still walks a seeded permutation of all tasks, like ``epoch``, so every task
keeps its turn once per pass (unlike ``informative``, which concentrates on the best-predicted
tasks and may train on the same few again and again).

When its turn comes, a task is rolled out with probability::

    keep(I) = clip(I / keep_at, floor, 1)

so tasks predicted informative at least ``keep_at`` are always kept, and a task predicted
never informative is still tried with probability ``floor`` (GRESO's ``p_min`` plays this part:
the model changes, and a skipped task must be looked at again sometime). ``keep_at`` and
``floor`` are its options (:class:`PredictedSkipOptions`, the policy's ``selection_options``).

A task passed over at its last ``max_skip_epochs`` turns (epochs) is rolled out at the next, whatever
its prediction (:func:`overdue`): the bounded skip age. Over many passes a skip that lets a task
sit out for ever never sees the policy drift on it (forgetting a family it always solved, or
starting to solve one it never did); the bound keeps every task's evidence at most
``max_skip_epochs + 1`` passes old. GRESO has no such bound (its ``p_min`` floor only); ``greso``
keeps GRESO's rule. ``max_skip_epochs`` is an option too. The draw is
counter-based (``default_rng([seed, 3, epoch])``, one uniform per task and epoch), so a
checkpoint restores the same skips; a task passed over stays passed over for the epoch.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from orchestrator.core.passrate import keep_probability
from orchestrator.core.registry import ModeOptions
from orchestrator.core.selection import EpochSelection, SelectionContext, register_selection


class PredictedSkipOptions(ModeOptions):
    """Options of ``predicted_skip`` (the policy's ``selection_options``)."""

    keep_at: float = Field(0.5, gt=0.0, le=1.0, description="Tasks predicted at least this informative are always kept.")
    floor: float = Field(0.05, ge=0.0, le=1.0, description="The least chance a task is kept when its turn comes (GRESO's p_min plays this part).")
    max_skip_epochs: int = Field(3, ge=0, description="A task passed over at this many turns in a row is rolled out at the next (ours).")


def overdue(epoch: int, last_drawn: np.ndarray | None, max_skip_epochs: int) -> np.ndarray | bool:
    """(k,) bool: tasks last drawn more than ``max_skip_epochs + 1`` epochs before ``epoch``, i.e.
    passed over at their last ``max_skip_epochs`` turns (``last_drawn`` -1: never drawn, as if
    drawn in epoch -1). False everywhere when ``last_drawn`` is None.

    Args:
        epoch: the epoch whose turn it is.
        last_drawn: (k,) int64 or None.
    """
    if last_drawn is None:
        return False
    return epoch - np.asarray(last_drawn, dtype=np.int64) > max_skip_epochs


@register_selection
class PredictedSkipSelection(EpochSelection):
    """Epoch order; a task is kept with probability :func:`keep_probability` of its prediction."""

    name = "predicted_skip"
    Options = PredictedSkipOptions

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = super().eligible(tasks, ctx)
        u = np.random.default_rng([self.seed, 3, self._epoch]).random(self.num_tasks)[tasks]
        last = None if ctx.last_drawn_epoch is None else ctx.last_drawn_epoch[tasks]
        keep = u < keep_probability(ctx.informative[tasks], self.options.keep_at, self.options.floor)
        return base & (keep | overdue(self._epoch, last, self.options.max_skip_epochs))

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``keep_probability``: the chance task ``i`` is rolled out when its turn comes."""
        p = keep_probability(ctx.informative[i : i + 1], self.options.keep_at, self.options.floor)
        return {"keep_probability": float(p[0])}
