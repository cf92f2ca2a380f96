"""``ranked_skip``: each pass over the tasks, most informative first, with ``predicted_skip``'s keep.

``epoch`` and ``predicted_skip`` (:mod:`orchestrator.core.skip`) walk each pass in a random
order. When a target is reached part-way through a pass, as in ``compare-sampling`` where every
arm crosses it in the first one, what that part of the pass cost is what counts, and a random
order spends it on the average task. This mode walks each pass in the order of the tasks'
predicted chance ``I`` of an informative group (Beta-Binomial predictive of the pass-rate
posterior, :class:`orchestrator.core.passrate.PassRateEstimate`, DAPO's Eq. 11 event), highest
first, re-ranked at every round as groups come back. In the first pass ``I`` is the family
prior, so the families that give informative groups most often are rolled out first; in later
passes a task's own last groups rank it, so the tasks last seen informative go first (the
``history_skip`` rule of ``compare-sampling``'s ``pass_costs``).

Like ``epoch`` and unlike ``informative`` (which draws with replacement and may train on the
same few tasks again and again), a task is taken at most once per pass, so training stays as
broad as ``epoch``'s. A task is eligible with ``predicted_skip``'s probability
``clip(I / keep_at, floor, 1)`` (:func:`orchestrator.core.skip.keep_probability`; the same
``selection_options`` ``keep_at`` and ``floor``; one uniform per task and pass, compared with
the current prediction), so the end of a pass, where the tasks predicted all-correct or
all-wrong sit, is mostly skipped.

Ordering by predicted value is prioritised sampling (Schaul et al., arXiv 1511.05952; Kimi k1.5's
prioritised sampling, arXiv 2501.12599, draws problems by ``1 - success rate``); here the priority is
the chance of an informative group and the order is without replacement within a pass. Ties
(tasks with the same ``I``, e.g. never-seen tasks of one family) keep the pass's seeded
permutation (``default_rng([seed, epoch])``, as ``epoch``), and the keep draw is counter-based
(``default_rng([seed, 3, epoch])``, one uniform per task and pass), so a checkpoint restores the
same next draw.
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.selection import SelectionContext, register_selection
from orchestrator.core.skip import PredictedSkipSelection


def ranked(informative: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Indices into ``informative``, highest first; ties by ``position``, lowest first.

    Args:
        informative: (k,) float, predicted chance of an informative group.
        position: (k,) int, each task's place in the pass's permutation (distinct).
    Returns:
        (k,) int64.
    """
    return np.lexsort((np.asarray(position), -np.asarray(informative, dtype=np.float64))).astype(np.int64)


@register_selection
class RankedSkipSelection(PredictedSkipSelection):
    """Each pass: the tasks not yet taken in it, ranked by ``I`` at every round, kept as in ``predicted_skip``.

    A task whose keep draw fails now stays in the pass (its prediction may rise before the pass
    ends); the pass ends when a round asks for more tasks than its eligible rest holds, and the
    tasks it never took count as ``passed_over``.

    State: the pass (``epoch``), ``taken_epoch`` ((T,) int64, the last pass each task was taken
    in, -1 before its first; only the rows of tasks drawn change, as the state store expects of
    a per-task column) and the ``passed_over`` counter; ``cursor`` is the tasks taken in the pass.
    """

    name = "ranked_skip"

    def __init__(self, num_tasks: int, seed: int = 0, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, max_idle_epochs)
        self.taken_epoch = np.full(num_tasks, -1, dtype=np.int64)

    def rest(self, ctx: SelectionContext) -> np.ndarray:
        """(k,) int64: the tasks not yet taken in this pass, most informative first."""
        left = np.flatnonzero(self.taken_epoch != self._epoch)
        position = np.argsort(self.order(self._epoch))[left]
        return left[ranked(ctx.informative[left], position)]

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        chosen: list[np.ndarray] = []
        epochs: list[np.ndarray] = []
        got = idle = 0
        while got < count and idle <= self.max_idle_epochs and (ctx.max_epochs is None or self._epoch < ctx.max_epochs):
            rest = self.rest(ctx)
            take = rest[np.flatnonzero(self.eligible(rest, ctx))[: count - got]]
            self.taken_epoch[take] = self._epoch
            chosen.append(take)
            epochs.append(np.full(len(take), self._epoch, dtype=np.int64))
            got += len(take)
            idle = 0 if len(take) else idle + 1
            if got < count:  # the pass has nothing more to give now: it ends
                self.passed_over += len(rest) - len(take)
                self._epoch += 1
        self.cursor = int((self.taken_epoch == self._epoch).sum())
        self.picked_epochs = np.concatenate(epochs) if epochs else np.zeros(0, dtype=np.int64)
        return np.concatenate(chosen).astype(np.int64) if chosen else np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict:
        """The pass, the counters and ``taken_epoch`` itself, not a copy."""
        return {**super().state_dict(), "taken_epoch": self.taken_epoch}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        taken = np.asarray(state["taken_epoch"], dtype=np.int64)
        if taken.shape != (self.num_tasks,):
            raise ValueError(f"ranked_skip state: taken_epoch has shape {taken.shape}, expected ({self.num_tasks},)")
        self.taken_epoch = taken.copy()
        self.cursor = int((self.taken_epoch == self._epoch).sum())
