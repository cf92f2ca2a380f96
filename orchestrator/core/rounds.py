"""Task selection and rounds of :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`Rounds`.

Which tasks come next (the active :class:`~orchestrator.core.selection.TaskSelection`, the
epoch's order), when the data ends (``max_epochs`` / ``max_rollouts``), whether the cap is
reached or replenishment is paused, the plan of the next round (:meth:`Rounds.plan_round`),
screens, the open rounds awaiting their groups (for the predicted-vs-realised keep rate), and
the hand-out of tasks to an attached explorer (:meth:`Rounds.next_tasks`, requeued after its
restart).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.core.passrate import (
    informative_after_unanimous_screen,
    informativeness,
    keep_probability,
    plugin_informativeness,
)
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.selection import SelectionContext, TaskSelection
from orchestrator.core.selections import make_selection
from orchestrator.core.shared import OpenBatch, Run, Tally
from orchestrator.core.tasks import TaskColumns
from orchestrator.core.types import Purpose

SETTLED_KEEP = 0.01
"""A score whose keep probability is below this is settled: reusable for the answer screen's ``reuse_versions``."""

OPEN_ROUNDS_KEPT = 64
"""Planned rounds whose groups are still awaited, kept for the predicted-vs-realised keep rate."""


@dataclass
class RoundPlan:
    """What the next round should roll out.

    Attributes:
        task_ids: tasks to roll out, n rollouts each (empty when nothing is needed).
        purpose: ``initial`` for a batch's first round, ``replenish`` afterwards.
        round: round index within the batch (0 = initial).
        batch_id: the batch the round serves.
    """

    task_ids: list[str]
    purpose: Purpose
    round: int
    batch_id: int


@dataclass
class ScreenPlan:
    """How a round's tasks are screened (:meth:`Rounds.screen_plan`), each (k,) bool over its tasks.

    Attributes:
        screen: roll the screen's ``rollouts`` first, complete the group only when they differ.
        go_if_correct: complete the screen all the same when its rollouts all come out correct.
        go_if_wrong: the same when they all come out wrong.
    """

    screen: np.ndarray
    go_if_correct: np.ndarray
    go_if_wrong: np.ndarray


class Rounds:
    """Select tasks, plan rounds and track the open ones; a part of
    :class:`~orchestrator.core.machine.OrchestratorCore`.

    Args:
        run: the policy and the model version.
        tasks: the per-task columns (history, pass-rate evidence, draw epochs).
        tally: the counters (rollouts planned, screens, rounds).
        batch: the open batch (its rounds, held groups and tasks to roll again).
        view: the core, as the ``replenish`` mode reads it (:mod:`orchestrator.core.modes`).
    """

    def __init__(self, run: Run, tasks: TaskColumns, tally: Tally, batch: OpenBatch, view: Any) -> None:
        self.run, self.tasks, self.tally, self.batch, self.view = run, tasks, tally, batch, view
        # task order: one selection per mode used so far (the registry's, made on first use), each
        # keeping its place while another is active
        policy = run.policy
        self.selections: dict[str, TaskSelection] = {policy.selection: make_selection(policy.selection, len(tasks), tasks.seed, policy)}
        # planned rounds awaiting their groups: round key -> counts; task index -> round keys
        self.open_rounds: dict[str, dict] = {}
        self.awaited: dict[int, list[str]] = {}
        self.last_round: dict | None = None
        # the answer screen's tally of the round being planned (answer_top_up); not kept in
        # checkpoints: it lives from plan_round to the round's rollouts, within one next_batch call
        self.answer_tally: dict[str, float] = {"scored": 0, "expected": 0.0}
        self.round_drawn = np.zeros(len(tasks.task_ids), dtype=bool)  # (T,) the tasks of that round, same lifetime
        # tasks handed to an external explorer (next_tasks) whose groups have not come back yet
        self.in_flight: list[str] = []
        self.requeued: list[str] = []  # in-flight tasks of an explorer that restarted: handed out first

    def use_policy(self, policy: ResamplingPolicy) -> None:
        """Make (on first use) and configure the selection of a new policy, before it applies: every
        selection made so far is configured, and may refuse it (nothing has changed then); a switch
        of ``selection`` moves the cooldowns to the new selection's epochs."""
        old = self.selection
        new = self.selections.get(policy.selection) or make_selection(policy.selection, len(self.tasks), self.tasks.seed, policy)
        for sel in {**self.selections, policy.selection: new}.values():
            sel.configure(policy, policy.mode_options("selection") if sel is new else None)
        self.selections[policy.selection] = new
        if new is not old:
            self._move_cooldowns(old.epoch, new.epoch)

    def _move_cooldowns(self, old_epoch: int, new_epoch: int) -> None:
        """Re-express cooldowns and draw epochs in another selection's epoch count (a PATCH of
        ``selection``): a task keeps the epochs it has left to sit out, counted from the new
        selection's current epoch."""
        h = self.tasks.history
        left = np.maximum(h.skip_until_epoch - old_epoch, 0)
        h.skip_until_epoch[:] = np.where(left > 0, new_epoch + left, 0)
        self.tasks.pick_epoch[:] = np.where(self.tasks.pick_epoch >= 0, np.maximum(new_epoch + self.tasks.pick_epoch - old_epoch, 0), -1)
        self.tasks.touch(np.arange(len(self.tasks), dtype=np.int64))

    def observe(self, idx: np.ndarray, keep: np.ndarray, all_correct: np.ndarray, correct: np.ndarray,
                trials: np.ndarray, versions: np.ndarray) -> None:
        """Every selection made so far learns from submitted groups: (G,) task rows, kept and
        all-correct flags, then their correct and valid rollouts and model versions (pass rates)."""
        for sel in self.selections.values():
            sel.observe(idx, keep, all_correct)
            sel.observe_rates(idx, correct, trials, versions)

    def state(self) -> dict:
        """This part's entries of the core's state (:meth:`~orchestrator.core.state.CoreState.state`):
        ``selections``, ``open_rounds``, ``awaited``, ``last_round``, ``in_flight``, ``requeued``."""
        return {
            "selections": {name: sel.state_dict() for name, sel in self.selections.items()},
            "open_rounds": {k: dict(v) for k, v in self.open_rounds.items()},
            "awaited": {str(i): list(keys) for i, keys in self.awaited.items()},
            "last_round": dict(self.last_round) if self.last_round else None,
            "in_flight": list(self.in_flight),
            "requeued": list(self.requeued),
        }

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state`'s entries, after the core restored the policy and the seed (a
        version-1 state holds only the epoch order: the other entries stay as they are)."""
        n, seed, policy = len(self.tasks), self.tasks.seed, self.run.policy
        self.selections = {}
        if "selections" in state:
            for name, sel_state in state["selections"].items():
                self.selections[name] = make_selection(name, n, seed, policy)
                self.selections[name].load_state_dict(sel_state)
            self.open_rounds = {k: dict(v) for k, v in state["open_rounds"].items()}
            self.awaited = {int(i): list(keys) for i, keys in state["awaited"].items()}
            self.last_round = dict(state["last_round"]) if state["last_round"] else None
        else:  # version 1: epoch order only, no estimates
            self.selections["epoch"] = make_selection("epoch", n, seed, policy)
            self.selections["epoch"].load_state_dict({"epoch": state["epoch"], "cursor": state["cursor"]})
        self.in_flight = list(state.get("in_flight", []))
        self.requeued = list(state.get("requeued", []))

    @property
    def selection(self) -> TaskSelection:
        """The active task selection (``policy.selection``; made from the registry on first use)."""
        name = self.run.policy.selection
        if name not in self.selections:
            self.selections[name] = make_selection(name, len(self.tasks.task_ids), self.tasks.seed, self.run.policy)
        return self.selections[name]

    @property
    def epoch(self) -> int:
        """The active selection's epoch (skip-rule cooldowns count in it)."""
        return self.selection.epoch

    def predicted_informative(self) -> np.ndarray:
        """(T,) float64: each task's predicted chance that its next group is informative
        (Beta-Binomial posterior predictive, :mod:`orchestrator.core.passrate`)."""
        return self.tasks.passrate.informativeness(self.run.model_version, self.run.policy.group_size)

    def context(self) -> SelectionContext:
        p = self.run.policy
        return SelectionContext(
            skip_until_epoch=self.tasks.history.skip_until_epoch,
            informative=self.predicted_informative(),
            max_epochs=p.max_epochs,
            zero_streak_correct=self.tasks.history.consec_all_correct,
            zero_streak_wrong=self.tasks.history.consec_all_wrong,
            groups=self.tasks.history.groups,
            prompts=self.tasks.texts if self.tasks.texts is not None else self.tasks.task_ids,
            model_version=self.run.model_version,
            group_size=p.group_size,
            last_drawn_epoch=self.tasks.pick_epoch,
        )

    def select_tasks(self, count: int) -> list[str]:
        """Up to ``count`` next tasks (see :meth:`_draw_tasks`), within ``max_epochs`` and the rollout
        budget (``max_rollouts`` counts ``group_size`` rollouts per task handed out)."""
        tasks = self.draw_tasks(self.affordable(count))
        self.tally.counters["rollouts_planned"] += len(tasks) * self.run.policy.group_size
        return tasks

    def draw_tasks(self, count: int, need: float | None = None, ctx: SelectionContext | None = None) -> list[str]:
        """Up to ``count`` next tasks of the active selection (``policy.selection``).

        ``epoch``: each epoch is a seeded permutation of the task set. A task skipped by the
        rules ``skip_after_all_correct`` / ``skip_after_all_wrong`` sits out ``cooldown_epochs``.
        When every task is cooling down, the order moves to the next epoch (at most
        ``cooldown_epochs + 1`` epochs ahead), so selection always terminates.
        ``informative``: see :class:`orchestrator.core.selection.InformativeSelection`; an epoch
        is as many picks as there are tasks. With ``need`` (informative only), the draw stops
        once the tasks drawn are predicted to give ``need`` informative groups
        (:meth:`~orchestrator.core.selection.TaskSelection.fill`).

        Nothing is drawn once ``max_epochs`` epochs have passed, and a draw never enters epoch
        ``max_epochs`` (the selection stops at its boundary).
        """
        if self.epochs_done() or count <= 0:
            return []
        ctx = ctx if ctx is not None else self.context()
        idx = self.selection.select(count, ctx) if need is None else self.selection.fill(need, count, ctx)
        self.tasks.pick_epoch[idx] = self.selection.picked_epochs
        self.tasks.touch(idx)  # the selection's last_pick
        return [self.tasks.task_ids[i] for i in idx]

    def epochs_done(self) -> bool:
        """True once the task order has passed ``policy.max_epochs`` epochs."""
        return self.run.policy.max_epochs is not None and self.epoch >= self.run.policy.max_epochs

    def rollouts_left(self) -> int | None:
        """Rollouts the budget still allows (None without ``max_rollouts``)."""
        if self.run.policy.max_rollouts is None:
            return None
        c = self.tally.counters
        return max(0, self.run.policy.max_rollouts - c["rollouts_planned"])

    def affordable(self, count: int) -> int:
        """``count`` tasks, capped at the groups (``group_size`` rollouts each) the rollout budget still pays for."""
        left = self.rollouts_left()
        return count if left is None else min(count, left // self.run.policy.group_size)

    def exhausted(self) -> bool:
        """True when no further round can be planned: epochs done, or no budget for one more group."""
        left = self.rollouts_left()
        return self.epochs_done() or (left is not None and left < self.run.policy.group_size)

    def predicted_keep_rate(self) -> float:
        """Laplace-smoothed informative groups per task rolled out so far: (k + 1) / (g + s + 2),
        with k groups classified informative, g groups submitted and s screens stopped or tasks
        skipped by the answer screen.

        A stopped screen is a task of a round that yielded no group; without it in the
        denominator a screened run would count only its completed screens, nearly all
        informative, plan each round as if every task yielded a group, and emit short batches
        after ``max_replenish_rounds`` (measured: a median of 2-3 groups of 8 with screens of 2).
        Without screening ``s`` is 0."""
        c = self.tally.counters
        return (c["groups_kept_classified"] + 1) / (c["groups_submitted"] + c["screens_stopped"] + c["answer_skips"] + 2)

    def missing_groups(self) -> int:
        return max(0, self.run.policy.target_groups - len(self.batch.carry))

    def cap_reached(self) -> bool:
        """True when the open batch may not start another replenish round.

        The ``replenish`` mode decides (:meth:`orchestrator.core.modes.Replenish.capped`):
        after ``max_replenish_rounds`` replenish rounds, or filter-only (``replenish='none'``) as
        soon as the initial round has run.
        """
        if self.missing_groups() == 0 or self.batch.rounds_started == 0:
            return False
        if self.run.policy.screen != "none" and not self.batch.carry and not self.batch.candidates:
            return False  # every task so far was a stopped screen or skipped: nothing to release yet (no empty batch)
        return self.run.policy.mode("replenish").capped(self.batch.rounds_started, self.run.policy.max_replenish_rounds)

    def replenish_blocked(self) -> bool:
        """True when the next round would be a replenish round and replenishment is paused."""
        return self.run.policy.replenish_paused and self.batch.rounds_started > 0

    def plan_round(self) -> RoundPlan:
        """Plan the next round: only the missing count, sized by the predicted keep rate.

        ``count = min(ceil(missing / max(min_keep_rate, p_keep)), max_tasks_per_round)``,
        and no more than the rollout budget pays for. Tasks of stale groups (``requeue_stale``)
        come first; in a replenish round, the ``replenish`` mode's re-rolls next
        (:meth:`orchestrator.core.modes.Replenish.rerolls`: with ``same_tasks``, this batch's
        dropped tasks, oldest first, not those a skip rule has just put in cooldown); fresh
        tasks top up. Plans nothing once :meth:`exhausted`.
        """
        missing = self.missing_groups()
        rnd = self.batch.rounds_started
        purpose: Purpose = "initial" if rnd == 0 else "replenish"
        if missing == 0 or self.exhausted():
            return RoundPlan([], purpose, rnd, self.batch.batch_id)
        ctx = self.context()
        informative = self.selection.sizes_by_prediction
        p = self.run.policy.min_keep_rate if informative else max(self.run.policy.min_keep_rate, self.predicted_keep_rate())
        count = self.affordable(min(math.ceil(missing / p), self.run.policy.max_tasks_per_round))
        task_ids, self.batch.requeue = self.batch.requeue[:count], self.batch.requeue[count:]
        if rnd > 0:
            task_ids += self.run.policy.mode("replenish").rerolls(self.view, count - len(task_ids))
        taken = np.array([self.tasks.index[t] for t in task_ids], dtype=np.int64)
        need = missing - float(ctx.informative[taken].sum()) if informative else None
        ctx.drawn = np.zeros(len(self.tasks.task_ids), dtype=bool)
        ctx.drawn[taken] = True  # a fresh draw takes none of the round's re-rolls again
        task_ids += self.draw_tasks(count - len(task_ids), need=need, ctx=ctx)
        self.tally.counters["rollouts_planned"] += len(task_ids) * self.run.policy.group_size
        self.batch.rounds_started += 1
        self.answer_tally = {"scored": 0, "expected": 0.0}
        idx = np.array([self.tasks.index[t] for t in task_ids], dtype=np.int64)
        self.round_drawn = np.zeros(len(self.tasks.task_ids), dtype=bool)
        self.round_drawn[idx] = True
        self._open_round(idx, ctx.informative)
        return RoundPlan(task_ids, purpose, rnd, self.batch.batch_id)

    def screen_plan(self, task_ids: list[str]) -> ScreenPlan:
        """Which of a round's tasks to screen first, and which unanimous screens to complete, from
        one posterior (:mod:`orchestrator.rollout.screening`).

        A task is screened when ``policy.screen`` is ``rollouts`` and its predicted chance of an
        informative group is below the screen's ``skip_above``. Its screen is completed when its
        rollouts all come out correct (all wrong) and the chance that the completed group is
        informative, from the task's posterior
        (:func:`~orchestrator.core.passrate.informative_after_unanimous_screen`), is at least
        ``continue_above``: never at its default 1 (SPEED-RL's rule)
        (:class:`~orchestrator.core.screens.RolloutScreenOptions`)."""
        p = self.run.policy
        none = np.zeros(len(task_ids), dtype=bool)
        if p.screen != "rollouts" or not task_ids:
            return ScreenPlan(none, none.copy(), none.copy())
        o = p.mode_options("screen")
        idx = np.array([self.tasks.index[t] for t in task_ids], dtype=np.int64)
        alpha, beta = (x[idx] for x in self.tasks.passrate.posterior(self.run.model_version, p.group_size))
        screen = informativeness(alpha, beta, p.group_size) < o.skip_above
        if o.continue_above >= 1.0:
            return ScreenPlan(screen, none, none.copy())
        after_correct, after_wrong = informative_after_unanimous_screen(alpha, beta, p.group_size, o.rollouts)
        return ScreenPlan(screen, after_correct >= o.continue_above, after_wrong >= o.continue_above)

    def record_screens(self, screened: int, task_ids: list[str], correct: np.ndarray, trials: np.ndarray) -> None:
        """Count a round's screens and take the evidence of those that stopped (all rollouts equal,
        never completed): their rollouts count as generated (``rollouts_screen_stopped``), the
        rollouts they did not spend go back to the ``max_rollouts`` budget, the pass-rate estimate
        learns from them, and their planned round counts them as not informative."""
        c = self.tally.counters
        c["screens"] += screened
        if not task_ids:
            return
        idx = np.array([self.tasks.task_index(t) for t in task_ids], dtype=np.int64)
        trials = np.asarray(trials, dtype=np.int64)
        versions = np.full(len(idx), self.run.model_version, dtype=np.int64)
        self.tasks.passrate.observe(idx, np.asarray(correct), trials, np.zeros(len(idx), dtype=bool), versions)
        self.close_rounds(idx, np.zeros(len(idx), dtype=bool))
        c["screens_stopped"] += len(idx)
        c["rollouts_screen_stopped"] += int(trials.sum())
        c["rollouts_planned"] -= int((self.run.policy.group_size - trials).sum())
        self.tasks.touch(idx)

    def answer_reused(self, task_ids: list[str]) -> np.ndarray:
        """The last answer probability of each task whose score can be reused instead of scoring it
        again (the answer screen's ``reuse_versions``), NaN for the others.

        Reusable: scored at most ``reuse_versions`` model versions ago, with a keep
        probability then below :data:`SETTLED_KEEP` (nearly sure to be skipped: p near 0 or 1).
        Such a task's p moves little between versions, and late in a run most tasks are settled,
        so without reuse each batch scores hundreds of tasks to find a few to roll (measured on
        the comparison's seed 0: 118,062 scores in 12,000 rollouts, the rollout phase 6x
        ``epoch``'s). A reused score is not refreshed: the task is scored again once it is older.

        Args:
            task_ids: the k tasks about to be screened.
        Returns:
            (k,) float64, p or NaN.
        Raises:
            UnknownTaskError: a task id not in the task set.
        """
        idx = np.array([self.tasks.task_index(t) for t in task_ids], dtype=np.int64)
        pol = self.run.policy
        o = pol.mode_options("screen")  # the answer screen's (AnswerScreenOptions)
        out = np.full(len(idx), np.nan)
        if not o.reuse_versions or not len(idx):
            return out
        p, version = self.tasks.history.answer_prob[idx], self.tasks.history.answer_prob_version[idx]  # version -1: never scored
        keep = keep_probability(plugin_informativeness(p, pol.group_size), o.keep_at, o.floor, o.keep_power)
        ok = (version >= 0) & (self.run.model_version - version <= o.reuse_versions) & (keep < SETTLED_KEEP)
        out[ok] = p[ok]
        return out

    def answer_screen(self, task_ids: list[str], answer_prob: np.ndarray, round_tag: str,
                      fresh: np.ndarray | None = None) -> np.ndarray:
        """Which of a planned round's tasks to roll out, from their answer probabilities
        (``policy.screen: answer``, :class:`~orchestrator.core.screens.AnswerScreenOptions`; the rollout source's ``answer_probability``, taken under the
        current weights just before).

        A task is rolled out with probability ``clip((I / keep_at) ** keep_power,
        floor, 1)``, ``I = 1 - p**n - (1-p)**n`` the chance that a group of n rollouts with
        pass rate p is informative (DAPO Eq. 11's event under a binomial,
        :func:`~orchestrator.core.passrate.plugin_informativeness`;
        :func:`orchestrator.core.passrate.keep_probability`). Power 1 is ``predicted_skip``'s keep rule;
        the default 4 is close to a threshold at ``keep_at``: with p exact, a roll's worth is
        its chance ``I`` of an informative group against the same n rollouts for every task, so
        the cheapest rule rolls the tasks of highest ``I`` (docs/reference/sampling.md, "Answer screen").
        The draw is counter-based (``default_rng([seed, 5, crc32(round_tag)])``), so a replayed
        round skips the same tasks. A skipped task costs no rollout: its planned rollouts go back
        to the ``max_rollouts`` budget, its round counts it as not informative (the next rounds
        are sized for it, :meth:`predicted_keep_rate`), and the pass-rate estimate learns nothing.
        Each scored task's p and the model version are kept in its history (``GET /v1/tasks/{id}``:
        ``answer_prob``, ``answer_prob_version``; checkpointed with the history).

        Args:
            task_ids: the round's k tasks.
            answer_prob: (k,) float, each task's answer probability p in [0, 1].
            round_tag: the round's tag (``b<batch>r<round>``), seeds the draw.
            fresh: (k,) bool, False where ``answer_prob`` is a reused score (:meth:`answer_reused`):
                counted in ``answers_reused``, and the task's score and its version are left as
                they were. None: every score is fresh.
        Returns:
            (k,) bool, True: roll the task out.
        Raises:
            ValueError: ``answer_prob`` is not k finite values in [0, 1] (names the first bad task).
        """
        p = np.asarray(answer_prob, dtype=np.float64)
        if p.shape != (len(task_ids),):
            raise ValueError(f"answer_prob: expected {len(task_ids)} values, got shape {p.shape}")
        bad = np.flatnonzero(~(np.isfinite(p) & (p >= 0.0) & (p <= 1.0)))
        if len(bad):
            raise ValueError(f"answer_prob: task {task_ids[bad[0]]!r} has {p[bad[0]]!r}, expected a probability in [0, 1]")
        pol, o = self.run.policy, self.run.policy.mode_options("screen")
        informative = plugin_informativeness(p, pol.group_size)
        keep_p = keep_probability(informative, o.keep_at, o.floor, o.keep_power)
        u = np.random.default_rng([self.tasks.seed, 5, zlib.crc32(round_tag.encode())]).random(len(p))
        keep = u < keep_p
        fresh = np.ones(len(p), dtype=bool) if fresh is None else np.asarray(fresh, dtype=bool)
        tally = self.answer_tally
        tally["scored"] += len(p)
        tally["expected"] += float(informative[keep].sum())
        scored = np.array([self.tasks.task_index(t) for t in task_ids], dtype=np.int64)
        self.tasks.history.answer_prob[scored[fresh]] = p[fresh]
        self.tasks.history.answer_prob_version[scored[fresh]] = self.run.model_version
        self.tasks.touch(scored)
        c = self.tally.counters
        c["answers_scored"] += int(fresh.sum())
        c["answers_reused"] += int((~fresh).sum())
        if (~keep).any():
            idx = scored[~keep]
            self.close_rounds(idx, np.zeros(len(idx), dtype=bool))
            c["answer_skips"] += len(idx)
            c["rollouts_planned"] -= len(idx) * pol.group_size
        return keep

    def answer_top_up(self) -> list[str]:
        """More tasks for the open round, before its rollouts, when the tasks the answer screen
        kept so far are expected to give fewer informative groups than the batch misses.

        The kept tasks' chances ``I`` of an informative group are known from their scores
        (:meth:`answer_screen`), so a round can be sized from them instead of from the run's keep
        rate: while ``sum(I) < missing``, ``ceil((missing - sum(I)) / max(min_keep_rate, r))``
        more tasks are drawn into the same round (``r``: expected informative groups per task
        scored in this round so far), up to ``max_tasks_per_round`` tasks scored in the round,
        within the rollout budget, none of them a task the round holds already (the draw ends
        before one: a top-up that wraps into the next epoch meets the round's first tasks). The
        caller scores them and calls :meth:`answer_screen` again.
        A batch then needs about one rollout call: sized by the run's keep rate, which falls as
        more tasks are skipped, the rounds fell short again and again (measured on seed 0 of the
        comparison: 230 rollout rounds in the run without the top-up, 89 with it, ``epoch`` 107).

        Returns:
            the task ids drawn (empty: the round is full, capped, or the data or budget ended).
        """
        tally = self.answer_tally
        cap = self.run.policy.max_tasks_per_round
        short = self.missing_groups() - tally["expected"]
        if short <= 0 or tally["scored"] >= cap or self.exhausted():
            return []
        rate = tally["expected"] / tally["scored"] if tally["scored"] else 0.0
        count = min(math.ceil(short / max(self.run.policy.min_keep_rate, rate)), cap - tally["scored"])
        ctx = self.context()  # one pass-rate prediction for the draw and the round's record
        ctx.drawn = self.round_drawn  # never a task the round holds already (a draw wrapping into the next epoch)
        ids = self.draw_tasks(self.affordable(count), ctx=ctx)
        if ids:
            idx = np.array([self.tasks.index[t] for t in ids], dtype=np.int64)
            self.round_drawn[idx] = True
            self.tally.counters["rollouts_planned"] += len(ids) * self.run.policy.group_size
            self._extend_round(idx, ctx.informative)
        return ids

    def _extend_round(self, idx: np.ndarray, informative: np.ndarray) -> None:
        """Add tasks to the open round's record (:meth:`_open_round`), awaited like its own."""
        key = f"b{self.batch.batch_id}r{self.batch.rounds_started - 1}"
        r = self.open_rounds.get(key)
        if r is None:
            return self._open_round(idx, informative)
        total = r["tasks"] + len(idx)
        r["predicted_informative"] += float(informative[idx].sum())
        r["predicted_keep_rate"] = r["predicted_informative"] / total
        r["tasks"] = total
        for i in idx.tolist():
            self.awaited.setdefault(i, []).append(key)

    def _open_round(self, idx: np.ndarray, informative: np.ndarray) -> None:
        """Remember a planned round's predicted keep rate until all its groups are submitted."""
        if not len(idx):
            return
        key = f"b{self.batch.batch_id}r{self.batch.rounds_started - 1}"
        self.open_rounds[key] = {
            "predicted_keep_rate": float(informative[idx].mean()),
            "predicted_informative": float(informative[idx].sum()),
            "tasks": int(len(idx)),
            "submitted": 0,
            "informative": 0,
        }
        for i in idx.tolist():
            self.awaited.setdefault(i, []).append(key)
        while len(self.open_rounds) > OPEN_ROUNDS_KEPT:  # groups never came back: forget the oldest round
            old = next(iter(self.open_rounds))
            del self.open_rounds[old]
            for i in [i for i, keys in self.awaited.items() if old in keys]:
                self.awaited[i] = [k for k in self.awaited[i] if k != old]
                if not self.awaited[i]:
                    del self.awaited[i]

    def close_rounds(self, idx: np.ndarray, keep: np.ndarray) -> None:
        """Count submitted groups against the planned rounds awaiting them (oldest round first)."""
        if not self.awaited:  # no planned round awaits a group (e.g. tasks chosen by the caller)
            return
        c = self.tally.counters
        for i, kept in zip(idx.tolist(), keep.tolist(), strict=True):
            keys = self.awaited.get(i)
            if not keys:
                continue
            key = keys.pop(0)
            if not keys:
                del self.awaited[i]
            r = self.open_rounds.get(key)
            if r is None:
                continue
            r["submitted"] += 1
            r["informative"] += int(kept)
            if r["submitted"] == r["tasks"]:
                del self.open_rounds[key]
                c["rounds_completed"] += 1
                c["round_predicted_informative"] += r["predicted_informative"]
                c["round_realised_informative"] += r["informative"]
                c["round_groups"] += r["tasks"]
                self.last_round = {
                    "round": key,
                    "tasks": r["tasks"],
                    "predicted_keep_rate": r["predicted_keep_rate"],
                    "realised_keep_rate": r["informative"] / r["tasks"],
                }

    def next_tasks(self, count: int) -> list[str]:
        """``count`` tasks for one step of an external explorer (Trinity reads a fixed number).

        Order: tasks requeued after an explorer restart (:meth:`requeue_in_flight`), then the
        ``replenish`` mode's re-rolls (:meth:`orchestrator.core.modes.Replenish.rerolls`; with
        ``same_tasks``, this batch's dropped tasks not in a skip-rule cooldown), then fresh tasks
        in epoch order (:meth:`select_tasks`). Every task
        handed out stays "in flight" until its group is submitted. At the end of data
        (:meth:`exhausted`: ``max_epochs`` passed, or the ``max_rollouts`` budget spent) fewer
        come back, none once only requeued tasks were left; new tasks (re-rolls included)
        count against the rollout budget, requeued ones were counted when first handed out.

        Raises:
            ValueError: ``count`` < 1.
        """
        if count < 1:
            raise ValueError(f"count: must be >= 1, got {count}")
        tasks, self.requeued = self.requeued[:count], self.requeued[count:]
        want = 0 if self.epochs_done() else self.affordable(count - len(tasks))
        if want > 0:
            take = self.run.policy.mode("replenish").rerolls(self.view, want)
            tasks += take
            want -= len(take)
            self.tally.counters["rollouts_planned"] += len(take) * self.run.policy.group_size
        while want > 0 and not self.exhausted():  # select_tasks may fall short when every task cools down
            more = self.select_tasks(want)
            if not more and not self.exhausted():
                more = self.tasks.task_ids[:want]
                self.tally.counters["rollouts_planned"] += len(more) * self.run.policy.group_size
            tasks += more
            want -= len(more)
        self.in_flight.extend(tasks)
        return tasks

    def came_back(self, task_ids: list) -> None:
        """Tasks whose groups were submitted are no longer in flight."""
        if self.in_flight:
            back = {t for t in task_ids if isinstance(t, str)}
            self.in_flight = [t for t in self.in_flight if t not in back]

    def requeue_in_flight(self) -> list[str]:
        """Hand the in-flight tasks out again first: their explorer restarted before their groups came back.

        Returns:
            the requeued task ids (oldest first).
        """
        moved, self.in_flight = self.in_flight, []
        self.requeued = moved + self.requeued
        return list(moved)
