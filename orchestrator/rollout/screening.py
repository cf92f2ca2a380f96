"""Screening (SPEED-RL, Zhang et al., arXiv 2506.09016, as we build it for the standalone route):
roll ``k < n`` rollouts of a task first and complete the group to ``n`` only when the screen
predicts an informative group.

Verdict: a screen whose ``k`` judged values are not all equal (DAPO's filter,
:func:`algos.dapo.classify_groups`, on the ``k`` values) is completed: the full group is then
informative for certain. A screen whose values are all equal stops: its ``k`` rollouts are
spent and never trained on (counted as ``rollouts_screen_stopped``). SPEED-RL screens with a
pass-rate band on the screening rollouts; with a 0/1 judge and small ``k`` "not all equal" is
that band's tightest form. Tasks whose predicted chance of an informative group is at least
``screen_options.skip_above`` are rolled out in full without a screen (the task's history says a
screen would rarely stop it). Emitted groups always have exactly ``n`` rollouts: the screen's
``k`` (runs ``0..k-1``) then ``n - k`` more (runs ``k..n-1``), all under the round's tag.

**The bias it introduces** (stated in docs/reference/sampling.md; measured in
tests/rollout/test_screening.py). Let p be a task's pass rate and S the correct rollouts of
its group. The filter keeps a group when ``0 < S < n``; a screen keeps it when ``0 < S_k < k``
(``S_k``: correct among the first k), a stricter event:

* kept share: ``1 - p**k - (1-p)**k`` instead of ``1 - p**n - (1-p)**n``: tasks far from
  p = 1/2 are kept much less often than the filter would keep them (fewer easy/hard groups);
* kept groups' mean: ``E[S/n | kept] = (E[S_k | 0 < S_k < k] + (n - k) p) / n`` with
  ``E[S_k | 0 < S_k < k] = k (p - p**k) / (1 - p**k - (1-p)**k)``: pulled towards 1/2 further
  than the filter's ``(p - p**n) / (1 - p**n - (1-p)**n)`` (:func:`kept_group_mean`);
* advantages: the group baseline is that mean, but the first k members are biased towards a
  mixed outcome and the other ``n - k`` are not, so for an easy task (p > 1/2) the screen's
  members get a negative expected advantage and the rest a positive one (p = 0.8, n = 8, k = 2:
  -0.225 and +0.075 per member in reward units of a 0/1 judge; zero for every member under the
  filter). The gradient's direction per task is unchanged (correct members still get positive
  advantages); the weight of the screened members is.

Through Trinity a workflow rolls all ``repeat_times`` rollouts of a task at once, so the
orchestrator cannot stop a group after k: ``screen: rollouts`` is refused on that route
(:func:`check_route`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from algos.dapo import classify_groups
from orchestrator.core.passrate import plugin_informativeness
from orchestrator.core.types import Group, Task


class ScreeningUnsupportedError(ValueError):
    """Screening was asked for on a route that rolls a whole group at once."""


def check_route(screen: str, route: str) -> None:
    """Refuse the policy's ``screen: rollouts`` on a route that rolls whole groups (``route="trinity"``).

    Raises:
        ScreeningUnsupportedError: names the field, its value and why.
    """
    if screen == "rollouts" and route == "trinity":
        raise ScreeningUnsupportedError(
            "screen: 'rollouts' is not possible through Trinity: its workflow rolls all repeat_times "
            "rollouts of a task in one call, so a group cannot be stopped after a screen; set screen: none "
            "(the orchestrator's selection still skips tasks predicted uninformative before they are rolled)")


def keep_probability(p: np.ndarray, n: int, k: int | None = None) -> np.ndarray:
    """Chance a group is kept: ``1 - p**m - (1-p)**m`` with m = k (screen) or n (filter, k None)."""
    return plugin_informativeness(p, n if k is None else k)


def kept_group_mean(p: np.ndarray, n: int, k: int | None = None) -> np.ndarray:
    """Expected share of correct rollouts in a kept group of n, at pass rate p (module docstring).

    ``k`` None: the filter's ``(p - p**n) / (1 - p**n - (1-p)**n)``; else the screen's
    ``(k (p - p**k) / (1 - p**k - (1-p)**k) + (n - k) p) / n``.
    """
    p = np.asarray(p, dtype=np.float64)
    if k is None:
        return (p - p**n) / keep_probability(p, n)
    return (k * (p - p**k) / keep_probability(p, n, k) + (n - k) * p) / n


def continue_mask(values: np.ndarray, **filter_kwargs) -> np.ndarray:
    """(G,) bool: screens to complete, from their (G, k) judged values (not all equal)."""
    keep, _ = classify_groups(np.asarray(values, dtype=np.float64), **filter_kwargs)
    return np.asarray(keep, dtype=bool)


@dataclasses.dataclass
class ScreenResult:
    """One screened round: the completed and unscreened groups (n rollouts each, in task order)
    and the stopped screens (task ids, correct rollouts, k)."""

    groups: list[Group]
    stopped_task_ids: list[str]
    stopped_correct: np.ndarray
    stopped_trials: np.ndarray
    screened: int


def _judged(e, judge: str) -> float:
    """The value the filter judges (``judge``: ``"reward"``, ``"auto"``: ``accuracy`` when present, or a metric)."""
    if judge == "reward" or (judge == "auto" and "accuracy" not in e.metrics):
        return float(e.reward)
    return float(e.metrics["accuracy" if judge == "auto" else judge])


def _renumber(group: Group, first_run: int, round_tag: str) -> Group:
    for j, e in enumerate(group.rollouts):
        e.eid = dataclasses.replace(e.eid, run=first_run + j, round_tag=round_tag)
    return group


def screened_generate(source, tasks: list[Task], n: int, k: int, screen: np.ndarray, *, judge: str,
                      correct_threshold: float, model_version: int, round_tag: str,
                      go_if_correct: np.ndarray | None = None, go_if_wrong: np.ndarray | None = None,
                      **filter_kwargs) -> ScreenResult:
    """Roll a round with screens: tasks with ``screen[i]`` get k rollouts first, the others n.

    Args:
        source: a rollout source (``generate(tasks, n, model_version=..., round_tag=...)``).
        screen: (len(tasks),) bool.
        go_if_correct, go_if_wrong: (len(tasks),) bool or None (all False): complete task i's
            screen also when its k rollouts are all correct / all wrong
            (:meth:`orchestrator.core.rounds.Rounds.screen_continue`).
        judge: the metric the filter judges (``"reward"`` or a metric name).
        correct_threshold: a judged value at or above it counts as correct (evidence of a stopped screen).
    Returns:
        :class:`ScreenResult`; ``groups`` keep the tasks' order.
    """
    screen = np.asarray(screen, dtype=bool)
    full = np.flatnonzero(~screen)
    scr = np.flatnonzero(screen)
    out: list[Group | None] = [None] * len(tasks)
    for i, g in zip(full, source.generate([tasks[i] for i in full], n, model_version=model_version, round_tag=round_tag)):
        out[i] = g
    stopped, correct = [], []
    if len(scr):
        first = source.generate([tasks[i] for i in scr], k, model_version=model_version, round_tag=round_tag + "s")
        values = np.array([[_judged(e, judge) for e in g.rollouts] for g in first])
        right = (values >= correct_threshold).sum(axis=1)
        go = continue_mask(values, correct_threshold=correct_threshold, **filter_kwargs)
        if go_if_correct is not None:
            go |= (right == k) & np.asarray(go_if_correct, dtype=bool)[scr]
        if go_if_wrong is not None:
            go |= (right == 0) & np.asarray(go_if_wrong, dtype=bool)[scr]
        rest = source.generate([tasks[i] for i in scr[go]], n - k, model_version=model_version, round_tag=round_tag + "c")
        for i, g, r in zip(scr[go], [g for g, c in zip(first, go) if c], rest, strict=True):
            _renumber(g, 0, round_tag)
            g.rollouts = g.rollouts + _renumber(r, k, round_tag).rollouts
            out[i] = g
        stopped = [tasks[i].task_id for i in scr[~go]]
        correct = [int(r) for r, c in zip(right, go) if not c]
    return ScreenResult([g for g in out if g is not None], stopped, np.array(correct, dtype=np.int64),
                        np.full(len(stopped), k, dtype=np.int64), len(scr))
