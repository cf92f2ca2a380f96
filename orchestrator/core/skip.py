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
``floor`` are keys of the policy's ``selection_options`` (defaults :data:`DEFAULTS`).

A task passed over at its last ``max_skip_epochs`` turns (epochs) is rolled out at the next, whatever
its prediction (:func:`overdue`): the bounded skip age. Over many passes a skip that lets a task
sit out for ever never sees the policy drift on it (forgetting a family it always solved, or
starting to solve one it never did); the bound keeps every task's evidence at most
``max_skip_epochs + 1`` passes old. GRESO has no such bound (its ``p_min`` floor only); ``greso``
keeps GRESO's rule. ``max_skip_epochs`` is a key of ``selection_options`` too. The draw is
counter-based (``default_rng([seed, 3, epoch])``, one uniform per task and epoch), so a
checkpoint restores the same skips; a task passed over stays passed over for the epoch.
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.selection import EpochSelection, SelectionContext, check_unit_ranges, mode_options, register_selection

DEFAULTS = {"keep_at": 0.5, "floor": 0.05, "max_skip_epochs": 3.0}
"""``selection_options`` keys of ``predicted_skip`` and their defaults (see the module docstring)."""


def keep_probability(informative: np.ndarray, keep_at: float, floor: float, power: float = 1.0) -> np.ndarray:
    """``clip((I / keep_at) ** power, floor, 1)``: the chance a task is rolled out when its turn comes.

    ``power`` 1 keeps a task in proportion to its chance of an informative group below ``keep_at``
    (``predicted_skip``'s rule, like GRESO's probabilistic skip); a larger power is a softer form
    of a threshold at ``keep_at`` (the answer screen's default, :mod:`orchestrator.core.policy`).

    Args:
        informative: (k,) float in [0, 1], predicted chance of an informative group.
        keep_at: in (0, 1]; tasks predicted at least this informative are always kept.
        floor: in [0, 1]; the least chance of a turn.
        power: > 0; how sharply the chance falls below ``keep_at``.
    Returns:
        (k,) float64 in [floor, 1].
    """
    return np.clip((np.asarray(informative, dtype=np.float64) / keep_at) ** power, floor, 1.0)


def overdue(epoch: int, last_drawn: np.ndarray | None, max_skip_epochs: float) -> np.ndarray | bool:
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


def check_options(opts: dict[str, float]) -> None:
    """Refuse a ``keep_at`` outside (0, 1], a ``floor`` outside [0, 1] or a negative ``max_skip_epochs``.

    Raises:
        ValueError: naming the key and the value (:func:`check_unit_ranges`).
    """
    check_unit_ranges(opts, open_low=("keep_at",), closed=("floor",))
    if not opts["max_skip_epochs"] >= 0:
        raise ValueError(f"selection_options.max_skip_epochs: must be >= 0, got {opts['max_skip_epochs']!r}")


@register_selection
class PredictedSkipSelection(EpochSelection):
    """Epoch order; a task is kept with probability :func:`keep_probability` of its prediction."""

    name = "predicted_skip"

    def __init__(self, num_tasks: int, seed: int = 0, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, max_idle_epochs)
        self.options = dict(DEFAULTS)

    def configure(self, policy) -> None:
        super().configure(policy)
        if policy.selection != self.name:
            return
        opts = mode_options(policy, self.name, DEFAULTS)
        check_options(opts)
        self.options = opts

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        base = super().eligible(tasks, ctx)
        u = np.random.default_rng([self.seed, 3, self._epoch]).random(self.num_tasks)[tasks]
        last = None if ctx.last_drawn_epoch is None else ctx.last_drawn_epoch[tasks]
        keep = u < keep_probability(ctx.informative[tasks], self.options["keep_at"], self.options["floor"])
        return base & (keep | overdue(self._epoch, last, self.options["max_skip_epochs"]))

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``keep_probability``: the chance task ``i`` is rolled out when its turn comes."""
        p = keep_probability(ctx.informative[i : i + 1], self.options["keep_at"], self.options["floor"])
        return {"keep_probability": float(p[0])}
