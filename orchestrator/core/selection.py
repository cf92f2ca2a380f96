"""Task selection: which tasks the next round rolls out.

A small extension point (a base class with ``state_dict`` / ``load_state_dict`` /
``metrics``, as prime-rl's curriculum buffers and Trinity's ``BaseSelector``) behind one
registry (:data:`SELECTIONS`, filled by :func:`register_selection`), chosen by name in the
resampling policy's ``selection`` field. Adding a mode is one class with the decorator (see
:mod:`orchestrator.core.greso` for one in its own file), imported by
:mod:`orchestrator.core.selections`, which looks modes up by name; the orchestrator only calls
the base class's methods. The modes here:

* ``epoch`` - each epoch a seeded permutation of the task set, tasks in a skip-rule cooldown
  left out (the orchestrator's original order).
* ``informative`` - tasks drawn with probability growing with their predicted chance of an
  informative group (:mod:`orchestrator.core.passrate`), mixed with uniform exploration, every
  task revisited within a bounded number of epochs, and each round sized from the predicted
  keep rate of the tasks actually drawn.

Pure numpy, no I/O. Randomness is a counter-based stream (``default_rng([seed, kind, draw])``),
so the state is a few integers and a checkpoint restores the exact next draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from orchestrator.core.registry import Mode, ModeOptions, Registry


@dataclass
class SelectionContext:
    """What a selection reads from the orchestrator when it picks (its own settings are its
    typed options, :attr:`TaskSelection.options`).

    Attributes:
        skip_until_epoch: (T,) int64. A task is eligible when this is <= the selection's epoch.
        informative: (T,) float64 in [0, 1]. Predicted chance each task's next group is informative.
        max_epochs: no task is drawn in epoch ``max_epochs`` or later (end of data); None = no end.
        zero_streak_correct, zero_streak_wrong: (T,) int64, each task's consecutive all-correct /
            all-wrong groups up to now (the history's; zero-variance streaks, as GRESO reads them).
        groups: (T,) int64, each task's groups classified up to now (0: never rolled out); None
            when not given.
        prompts: T prompt texts (the task set's, in task order), or None when the orchestrator
            has none (a mode reading prompts then reads the task ids).
        model_version: the newest model version the orchestrator has seen.
        group_size: rollouts per group (n of DAPO's Eq. 11).
        last_drawn_epoch: (T,) int64, the active selection's epoch each task was last drawn in (-1:
            never; the orchestrator's ``pick_epoch``) as the draw starts, or None when not given.
        drawn: (T,) bool, the tasks already in the round being drawn (its re-rolls, its earlier
            draws); None: none. A draw never takes one of them again: in epoch order it ends
            before the first one (which keeps its place for the next round), weighted draws
            leave them out.
    """

    skip_until_epoch: np.ndarray
    informative: np.ndarray
    max_epochs: int | None = None
    zero_streak_correct: np.ndarray | None = None
    zero_streak_wrong: np.ndarray | None = None
    groups: np.ndarray | None = None
    prompts: list[str] | None = None
    model_version: int = 0
    group_size: int = 8
    last_drawn_epoch: np.ndarray | None = None
    drawn: np.ndarray | None = None

    def in_round(self, tasks: np.ndarray) -> np.ndarray:
        """(k,) bool: which of ``tasks`` are already in the round (:attr:`drawn`)."""
        return np.zeros(len(tasks), dtype=bool) if self.drawn is None else self.drawn[tasks]


class TaskSelection(Mode):
    """Base class of a task-selection mode.

    Subclasses implement :meth:`select` (exactly ``count`` tasks when enough are eligible)
    and may override :meth:`fill` (a round: enough tasks for ``need`` expected informative
    groups). ``epoch`` is the pass over the task set the selection is in; skip-rule cooldowns
    are counted in it, and no draw enters epoch ``ctx.max_epochs``. After a draw,
    :attr:`picked_epochs` holds the epoch each drawn task was drawn in (a draw may cross an
    epoch boundary); the orchestrator counts a skip-rule cooldown from it.

    Class attributes a mode sets:
        name: the registry name (the policy's ``selection`` value).
        Options: its typed options (:class:`~orchestrator.core.registry.ModeOptions`), given in
            the policy's ``selection_options`` and held in :attr:`options`.
        sizes_by_prediction: True when :meth:`fill` sizes a round from the per-task predictions
            (the orchestrator then passes the ``need`` of informative groups and sizes by
            ``min_keep_rate``); False: the round is sized from the observed keep rate.
    """

    name = "base"
    sizes_by_prediction = False

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None):
        super().__init__(options)
        if num_tasks < 1:
            raise ValueError(f"num_tasks: the task set is empty ({num_tasks})")
        self.num_tasks = num_tasks
        self.seed = seed
        self.picked_epochs = np.zeros(0, dtype=np.int64)

    def configure(self, policy, options: ModeOptions | None = None) -> None:
        """Read the policy's shared settings (at construction and each policy change) and, when this
        is the active mode, its own ``options`` (validated by the policy; None: keep the ones held)."""
        if options is not None:
            self.options = options

    def observe(self, task_idx: np.ndarray, informative: np.ndarray, all_correct: np.ndarray) -> None:
        """Feedback of classified groups: (G,) int64 task indices and (G,) bool outcomes.
        Called on every registered selection that exists, active or not. Default: nothing."""

    def observe_rates(self, task_idx: np.ndarray, correct: np.ndarray, trials: np.ndarray, versions: np.ndarray) -> None:
        """Feedback of the same groups as :meth:`observe`, as pass rates: (G,) int64 task indices,
        (G,) int correct and valid rollouts, (G,) int64 model versions that produced them.
        Called on every selection that exists, after :meth:`observe`. Default: nothing."""

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """Mode-specific fields of ``GET /v1/tasks/{id}`` for task ``i`` (default: none)."""
        return {}

    @property
    def epoch(self) -> int:
        raise NotImplementedError

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        """(k,) int64 task indices, k <= count; distinct, and none of ``ctx.drawn``, in a round's
        draw (``ctx.drawn`` given)."""
        raise NotImplementedError

    def fill(self, need: float, limit: int, ctx: SelectionContext) -> np.ndarray:
        """Tasks for a round expected to give ``need`` informative groups, at most ``limit``.

        The base rule draws ``limit`` tasks (the caller sized ``limit`` from a keep rate).
        """
        return self.select(limit, ctx)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Plain numbers for stats and Prometheus."""
        return {"epoch": float(self.epoch)}


SELECTIONS: Registry[TaskSelection] = Registry("selection", TaskSelection)
"""The registry: selection name -> class (the policy's ``selection`` values)."""
register_selection = SELECTIONS.register


@register_selection
class EpochSelection(TaskSelection):
    """Epoch order: a seeded permutation per epoch, tasks in a skip-rule cooldown left out.

    When every remaining task is cooling down the order moves to the next epoch, at most
    ``cooldown_epochs + 1`` epochs ahead of the last pick (the caller passes it as
    ``max_idle_epochs``), so selection always terminates.
    """

    name = "epoch"

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None, max_idle_epochs: int = 2):
        super().__init__(num_tasks, seed, options)
        self._epoch = 0
        self.cursor = 0
        self.max_idle_epochs = max_idle_epochs
        self.passed_over = 0  # tasks the order passed without drawing them (cooldown or a mode's skip), counter

    def configure(self, policy, options: ModeOptions | None = None) -> None:
        """``max_idle_epochs = cooldown_epochs + 1``: every task is out of its cooldown by then."""
        super().configure(policy, options)
        self.max_idle_epochs = policy.cooldown_epochs + 1

    @property
    def epoch(self) -> int:
        return self._epoch

    def order(self, epoch: int) -> np.ndarray:
        """(T,) int64: the permutation of epoch ``epoch`` (``default_rng([seed, epoch])``)."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)

    def eligible(self, tasks: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        """(k,) bool: which of ``tasks`` (the rest of this epoch's order) may be drawn now: those
        out of a skip-rule cooldown. A subclass may leave out more (GRESO's skips)."""
        return ctx.skip_until_epoch[tasks] <= self._epoch

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        """Up to ``count`` tasks in epoch order, crossing into the next epochs as needed.

        A round's draw (``ctx.drawn`` given: the round's tasks so far) ends before the first
        eligible task already in the round or drawn in this call: a draw that wraps into the next
        epoch meets the tasks it began with, and those wait for the next round, in their place in
        the new epoch's order. Without ``ctx.drawn`` (``select_tasks``: picks for an external
        explorer) a call may take a task once per epoch it crosses."""
        chosen: list[np.ndarray] = []
        epochs: list[np.ndarray] = []
        got = idle = 0
        round_draw = ctx.drawn is not None
        taken = np.asarray(ctx.drawn, dtype=bool).copy() if round_draw else np.zeros(self.num_tasks, dtype=bool)
        while got < count and idle <= self.max_idle_epochs and (ctx.max_epochs is None or self._epoch < ctx.max_epochs):
            rest = self.order(self._epoch)[self.cursor :]
            ok = self.eligible(rest, ctx)
            again = np.flatnonzero(ok & taken[rest]) if round_draw else np.zeros(0, dtype=np.int64)
            limit = int(again[0]) if len(again) else len(rest)  # a task already in the round ends the draw
            take = np.flatnonzero(ok[:limit])[: count - got]
            full = got + len(take) == count and len(take) > 0
            passed = int(take[-1]) + 1 if full else limit
            self.passed_over += passed - len(take)
            chosen.append(rest[take])
            epochs.append(np.full(len(take), self._epoch, dtype=np.int64))
            taken[rest[take]] = True
            got += len(take)
            idle = 0 if len(take) else idle + 1
            self.cursor += passed
            if self.cursor >= self.num_tasks:
                self._epoch += 1
                self.cursor = 0
            if not full and limit < len(rest):
                break
        self.picked_epochs = np.concatenate(epochs) if epochs else np.zeros(0, dtype=np.int64)
        return np.concatenate(chosen).astype(np.int64) if chosen else np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "cursor": self.cursor, "passed_over": self.passed_over}

    def load_state_dict(self, state: dict) -> None:
        self._epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.passed_over = int(state.get("passed_over", 0))

    def metrics(self) -> dict[str, float]:
        return {"epoch": float(self._epoch), "passed_over": float(self.passed_over)}


def draw_weights(informative: np.ndarray, eligible: np.ndarray, explore: float, sharpness: float) -> np.ndarray:
    """Draw probabilities: ``(1 - explore) * w / sum(w) + explore / |eligible|``, ``w = I ** sharpness``.

    Args:
        informative: (T,) float64 in [0, 1]. Predicted informativeness I per task.
        eligible: (T,) bool.
        explore: in [0, 1]. With no informativeness anywhere (``sum(w) == 0``) the draw is uniform.
        sharpness: > 0. 1 draws in proportion to I; larger values concentrate on the best tasks.
    Returns:
        (T,) float64, summing to 1 over eligible tasks, 0 elsewhere (all 0 if none is eligible).
    """
    k = int(eligible.sum())
    q = np.zeros(len(informative), dtype=np.float64)
    if k == 0:
        return q
    w = np.where(eligible, np.asarray(informative, dtype=np.float64) ** sharpness, 0.0)
    total = w.sum()
    uniform = eligible / k
    if total <= 0:
        return uniform.astype(np.float64)
    return (1.0 - explore) * w / total + explore * uniform


def weighted_order(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random order of the tasks with q > 0, drawn one at a time with probability
    proportional to q among those not yet drawn (Efraimidis and Spirakis 2006, "Weighted random
    sampling with a reservoir": sort by ``u ** (1 / q)``, here its log ``log(u) / q``).

    Args:
        q: (T,) float64 >= 0.
    Returns:
        (k,) int64 indices of the k tasks with q > 0, first drawn first.
    """
    idx = np.flatnonzero(q > 0)
    keys = np.log(rng.random(len(idx))) / q[idx]
    return idx[np.argsort(-keys, kind="stable")]


class InformativeOptions(ModeOptions):
    """Options of ``informative`` (the policy's ``selection_options``)."""

    explore: float = Field(
        0.01, ge=0.0, le=1.0,
        description="Share of the draw probability spread uniformly over eligible tasks (exploration; 0.01 measured "
        "cheapest of 0.005 / 0.01 / 0.02 on bench/bench_selection.py).",
    )
    sharpness: float = Field(4.0, gt=0.0, le=64.0, description="Draw weight = predicted informativeness ** sharpness (1 = in proportion).")
    revisit_epochs: int = Field(
        8, ge=1, le=10_000,
        description="A task not drawn for this many epochs (epoch = as many draws as tasks) is drawn first, so every "
        "task is revisited within revisit_epochs + 1 epochs.",
    )


@register_selection
class InformativeSelection(TaskSelection):
    """Draw tasks by predicted informativeness, with exploration and a revisit bound.

    Order of a round: first the *due* tasks (eligible, not drawn for ``revisit_epochs``
    epochs of picks, oldest first), then a weighted random order (:func:`weighted_order` with
    :func:`draw_weights`). :meth:`fill` takes the shortest prefix of that order whose summed
    predicted informativeness reaches ``need``, at most ``limit`` tasks.

    An epoch is ``T`` picks (T tasks); so every eligible task is drawn at least once every
    ``revisit_epochs + 1`` epochs (due tasks go first, and at most T can be due).

    State: ``picks`` (tasks drawn so far), ``draws`` (rounds drawn, the random stream's
    counter) and ``last_pick`` ((T,) int64, ``picks`` when each task was last drawn; 0 at start).
    """

    name = "informative"
    Options = InformativeOptions
    sizes_by_prediction = True

    def __init__(self, num_tasks: int, seed: int = 0, options: ModeOptions | None = None):
        super().__init__(num_tasks, seed, options)
        self.picks = 0
        self.draws = 0
        self.last_pick = np.zeros(num_tasks, dtype=np.int64)
        self.revisits = 0  # due tasks drawn (counter)

    @property
    def epoch(self) -> int:
        return self.picks // self.num_tasks

    def due(self, ctx: SelectionContext) -> np.ndarray:
        """(T,) bool: eligible tasks not drawn for ``revisit_epochs`` epochs of picks (and not in the round)."""
        eligible = (ctx.skip_until_epoch <= self.epoch) & ~ctx.in_round(np.arange(self.num_tasks))
        return eligible & (self.picks - self.last_pick >= self.options.revisit_epochs * self.num_tasks)

    def order(self, ctx: SelectionContext) -> tuple[np.ndarray, int]:
        """(order, n_due): due tasks oldest first, then the weighted random order of the rest."""
        eligible = ctx.skip_until_epoch <= self.epoch
        due = self.due(ctx)
        due_idx = np.flatnonzero(due)
        due_idx = due_idx[np.argsort(self.last_pick[due_idx], kind="stable")]
        rng = np.random.default_rng([self.seed, 1, self.draws])
        self.draws += 1
        q = draw_weights(ctx.informative, eligible & ~due & ~ctx.in_round(np.arange(self.num_tasks)), self.options.explore,
                         self.options.sharpness)
        return np.concatenate([due_idx, weighted_order(q, rng)]).astype(np.int64), len(due_idx)

    def left(self, count: int, ctx: SelectionContext) -> int:
        """``count``, capped so the picks do not enter epoch ``ctx.max_epochs``."""
        if ctx.max_epochs is None:
            return count
        return max(0, min(count, ctx.max_epochs * self.num_tasks - self.picks))

    def _take(self, chosen: np.ndarray, n_due: int) -> np.ndarray:
        self.revisits += min(n_due, len(chosen))
        self.picked_epochs = (self.picks + np.arange(len(chosen), dtype=np.int64)) // self.num_tasks
        self.picks += len(chosen)
        self.last_pick[chosen] = self.picks
        return chosen

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        order, n_due = self.order(ctx)
        return self._take(order[: self.left(count, ctx)], n_due)

    def fill(self, need: float, limit: int, ctx: SelectionContext) -> np.ndarray:
        """Shortest prefix of :meth:`order` with ``sum(I) >= need``, at most ``limit`` tasks (>= 1
        when ``need > 0`` and a task is eligible)."""
        order, n_due = self.order(ctx)
        if need <= 0 or limit <= 0:
            return self._take(order[:0], n_due)
        cum = np.cumsum(ctx.informative[order])
        count = int(np.searchsorted(cum, need - 1e-12)) + 1
        return self._take(order[: self.left(min(count, limit), ctx)], n_due)

    def state_dict(self) -> dict:
        """The counters, and ``last_pick`` itself, not a copy (copy it to keep it past the next change)."""
        return {"picks": self.picks, "draws": self.draws, "revisits": self.revisits, "last_pick": self.last_pick}

    def load_state_dict(self, state: dict) -> None:
        last = np.array(state["last_pick"], dtype=np.int64)
        if last.shape != (self.num_tasks,):
            raise ValueError(f"selection.last_pick: expected {self.num_tasks} tasks, got shape {last.shape}")
        self.picks, self.draws, self.revisits = int(state["picks"]), int(state["draws"]), int(state["revisits"])
        self.last_pick = last

    def metrics(self) -> dict[str, float]:
        return {"epoch": float(self.epoch), "picks": float(self.picks), "revisits": float(self.revisits)}

    def task_row(self, i: int, ctx: SelectionContext) -> dict:
        """``revisit_due_in_picks``: after how many more picks task ``i`` is drawn first (0 = due now)."""
        wait = self.options.revisit_epochs * self.num_tasks - (self.picks - int(self.last_pick[i]))
        return {"revisit_due_in_picks": max(0, int(wait))}

