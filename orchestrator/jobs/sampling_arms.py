"""The arms of ``compare-sampling``, derived from the mode registries (no torch: the CLI's help reads them).

Every registered task selection is an arm that sets ``selection`` (``epoch``, the baseline, sets
nothing), and every screen but ``none`` an arm that sets ``screen``, each at its mode's
defaults; the references are GRESO (a registered selection) and three loops that are not
policy modes. A new selection mode is an arm of the comparison without an edit here.
"""

from __future__ import annotations

from orchestrator.core.screens import SCREENS
from orchestrator.core.selections import SELECTIONS

BASELINE = "epoch"
"""The arm the others are paired with (drop and carry over, epoch order)."""
SCREEN_ARMS = {"screening": "rollouts", "answer_screen": "answer"}
"""Arm name -> screen mode (the arms' names predate the ``screen`` field; a test checks that every
screen mode but ``none`` has one)."""
REFERENCE_LOOPS: dict[str, dict] = {
    "trinity_difficulty": {"reference_loop": "trinity_difficulty"},
    "dapo_recipe": {"reference_loop": "dapo_recipe"},
    "grpo": {"dynamic_sampling": False},
}
"""References that are not policy modes: Trinity 0.6's selector loop, the DAPO recipe's loop, no filter."""
REFERENCE_SELECTIONS = ("greso",)
"""Registered selections that reproduce another paper's method (references, not ours)."""

ARMS: dict[str, dict] = {
    BASELINE: {},
    **{name: {"policy": {"selection": name}} for name in SELECTIONS if name not in (BASELINE, *REFERENCE_SELECTIONS)},
    **{arm: {"policy": {"screen": mode}} for arm, mode in SCREEN_ARMS.items()},
    **{name: {"policy": {"selection": name}} for name in REFERENCE_SELECTIONS},
    **REFERENCE_LOOPS,
}
"""Arm name -> its changes to the comparison's base configuration (``policy`` merged key by key)."""
REFERENCES = (*REFERENCE_SELECTIONS, *REFERENCE_LOOPS)
OURS = tuple(a for a in ARMS if a != BASELINE and a not in REFERENCES)
SCREEN_K = SCREENS["rollouts"].Options().rollouts
"""Rollouts of a screen (of ``group_size`` 8): the ``rollouts`` screen's default."""
