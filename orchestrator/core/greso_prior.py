"""``greso_prior``: GRESO's streak skip for the tasks rolled out before, a prior skip for the rest.

The two skips save in different parts of a run (``compare-sampling``'s by-pass table,
docs/reference/sampling.md). GRESO (arXiv 2506.02177, Sec. 4; :mod:`orchestrator.core.greso`) skips a
prompt from its own zero-variance streak: nothing in the first pass, where no task has one, and
most later, where its adaptive exploration probability falls towards ``p_min``.
``predicted_skip`` (:mod:`orchestrator.core.skip`) skips from the pass-rate posterior: in the
first pass a task is predicted from its family's prior, which finds the families that are always
or never solved; later its keep probability of a task seen unanimous once stays high, since the
posterior after one group of 8 is still wide.

This mode takes each rule where it pays. When a task's turn in the epoch order comes, it is
rolled out with probability:

* a task rolled out before (``ctx.groups > 0``): GRESO's ``p_easy ** z`` / ``p_hard ** z`` after
  ``z`` consecutive all-correct / all-wrong groups, 1 after an informative one
  (:func:`orchestrator.core.greso.keep_probability`), with GRESO's adaptive ``p_easy`` and
  ``p_hard``;
* a task never rolled out: ``clip(I / keep_at, floor, 1)`` of its predicted chance ``I`` of an
  informative group, from its tag's prior (:func:`orchestrator.core.passrate.keep_probability`).

A task passed over at its last ``max_skip_epochs`` turns is rolled out at the next whatever either
rule says (the bounded skip age of :mod:`orchestrator.core.skip`, :func:`~orchestrator.core.skip.overdue`).

``selection_options`` takes the options of both (:class:`GresoPriorOptions`). This differs from the GRESO
paper on purpose: the paper rolls every prompt out in its first epoch; ``greso`` is that
reference. The draw is counter-based (``default_rng([seed, 4, epoch])``, one uniform per task and
epoch), so a checkpoint restores the same skips.
"""

from __future__ import annotations

import numpy as np

from orchestrator.core import greso, skip
from orchestrator.core.passrate import keep_probability
from orchestrator.core.selection import EpochSelection, SelectionContext, register_selection


class GresoPriorOptions(greso.GresoOptions, skip.PredictedSkipOptions):
    """Options of ``greso_prior``: GRESO's and ``predicted_skip``'s, same defaults and ranges."""


@register_selection
class GresoPriorSelection(greso.GresoSelection):
    """Epoch order; GRESO's keep for tasks rolled out before, the prior's keep for the others."""

    name = "greso_prior"
    Options = GresoPriorOptions

    def keep_probability(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        """(k,) float64: the chance each of ``tasks`` is rolled out when its turn comes; 1 for a task
        passed over at its last ``max_skip_epochs`` turns (:func:`orchestrator.core.skip.overdue`)."""
        prior = keep_probability(ctx.informative[tasks], self.options.keep_at, self.options.floor)
        last = None if ctx.last_drawn_epoch is None else ctx.last_drawn_epoch[tasks]
        due = skip.overdue(self._epoch, last, self.options.max_skip_epochs)
        if ctx.groups is None or ctx.zero_streak_correct is None:
            return np.where(due, 1.0, prior)
        streak = greso.keep_probability(ctx.zero_streak_correct[tasks], ctx.zero_streak_wrong[tasks], self.p_easy, self.p_hard)
        return np.where(due, 1.0, np.where(ctx.groups[tasks] > 0, streak, prior))

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = EpochSelection.eligible(self, tasks, ctx)
        u = np.random.default_rng([self.seed, 4, self._epoch]).random(self.num_tasks)[tasks]
        return base & (u < self.keep_probability(tasks, ctx))

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``keep_probability``: the chance task ``i`` is rolled out when its turn comes."""
        return {"keep_probability": float(self.keep_probability(np.array([i]), ctx)[0])}
