"""Screens: what a planned round's tasks go through before their full group is rolled out.

The policy's ``screen`` field names one mode of :data:`SCREENS` (a
:class:`~orchestrator.core.registry.Registry`, like every mode of the policy), its options in
``screen_options``. Standalone route only: through Trinity the explorer rolls whole groups and
the orchestrator holds no engine (:mod:`orchestrator.trinity.attach` refuses a screen).

* ``none``: every planned task is rolled out in full.
* ``rollouts``: SPEED-RL's screen (Zhang et al., arXiv 2506.09016): roll ``rollouts`` of a task
  first and complete the group to ``group_size`` only when they are not all equal (an informative
  group is then certain); :meth:`orchestrator.core.rounds.Rounds.screen_plan`.
* ``answer``: score each task's reference answer under the current policy (one forward pass,
  nothing sampled) and roll the task out with the keep rule's chance
  (:func:`orchestrator.core.passrate.keep_probability`) of its informativeness;
  :meth:`orchestrator.core.rounds.Rounds.answer_screen`.

The modes hold no code yet: the round planner and the service read the active mode's name and
options.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.core.registry import Mode, ModeOptions, Registry


class Screen(Mode):
    """Base of a screen mode: ``name`` (the policy's ``screen`` value) and its ``Options``."""


SCREENS: Registry[Screen] = Registry("screen", Screen)
register_screen = SCREENS.register


@register_screen
class NoScreen(Screen):
    """``none``: no screen."""

    name = "none"


class RolloutScreenOptions(ModeOptions):
    """Options of the ``rollouts`` screen."""

    rollouts: int = Field(
        2, ge=1, le=4095,
        description="Rollouts of each task rolled first, fewer than group_size (2 of 8 in the sampling comparison).",
    )
    skip_above: float = Field(
        1.0, ge=0.0, le=1.0,
        description="A task whose predicted chance of an informative group is at least this is rolled out in full "
        "without a screen (its history says a screen would rarely stop it); 1 = screen every task.",
    )
    continue_above: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Complete a screen whose rollouts are all correct (or all wrong) when the task's pass-rate "
        "posterior, updated by the screen, gives the completed group at least this chance of being informative; "
        "1 = stop every such screen (SPEED-RL's rule).",
    )


@register_screen
class RolloutScreen(Screen):
    """``rollouts``: SPEED-RL's screen (arXiv 2506.09016)."""

    name = "rollouts"
    Options = RolloutScreenOptions


class AnswerScreenOptions(ModeOptions):
    """Options of the ``answer`` screen: a task is rolled out with probability
    ``clip((I / keep_at) ** keep_power, floor, 1)``, ``I = 1 - p**n - (1-p)**n``, p the chance
    that one response is exactly the answer."""

    keep_at: float = Field(
        0.5, gt=0.0, le=1.0,
        description="Tasks whose group is at least this likely to be informative are always rolled out.",
    )
    keep_power: float = Field(
        4.0, gt=0.0, le=16.0,
        description="How sharply the chance of a roll falls below keep_at; 1 = in proportion to I (predicted_skip's "
        "rule). 4 (a soft threshold: p = 0.95 of n = 8 is rolled with chance 0.21, p = 0.97 with 0.035) was chosen "
        "on seeds 30-39 of the comparison, not on its evaluation seeds (docs/reference/sampling.md).",
    )
    reuse_versions: int = Field(
        8, ge=0,
        description="A task whose last score, at most this many model versions old, gave it less than a 1 % chance of "
        "a roll is decided from that score again instead of being scored (its p moves little while settled; late "
        "in a run most tasks are, and each batch would otherwise score hundreds). 0 = score every time.",
    )
    floor: float = Field(
        0.0, ge=0.0, le=1.0,
        description="The least chance a scored task is rolled out. 0: p is the pass rate for exact answers; with a "
        "scorer that accepts other forms p is only a lower bound, and a floor (e.g. 0.05) keeps trying the tasks "
        "scored as never solved.",
    )


@register_screen
class AnswerScreen(Screen):
    """``answer``: the answer screen (needs a rollout source that scores answers, e.g. vLLM)."""

    name = "answer"
    Options = AnswerScreenOptions
