"""The task-selection modes shipped with the package, registered, and their lookup by name.

:mod:`orchestrator.core.selection` holds the base class, the registry and the two basic modes;
each other mode is one file that subclasses them and registers itself (:mod:`orchestrator.core.greso`,
:mod:`orchestrator.core.skip`, :mod:`orchestrator.core.greso_prior`, :mod:`orchestrator.core.pass_predictor`). This module imports them all, so the imports run one way:
modes -> base, and this module -> both. Code that looks a mode up by name imports it from here.
"""

from __future__ import annotations

from orchestrator.core import greso, greso_prior, pass_predictor, skip  # noqa: F401  (registers 'greso', 'greso_prior', 'pass_predictor', 'predicted_skip')
from orchestrator.core.selection import SELECTIONS, TaskSelection


def selection_class(name: str) -> type[TaskSelection]:
    """The registered class of mode ``name``.

    Raises:
        ValueError: unknown name (the known ones are listed).
    """
    if name not in SELECTIONS:
        raise ValueError(f"selection: unknown mode {name!r}; registered: {sorted(SELECTIONS)}")
    return SELECTIONS[name]


def make_selection(name: str, num_tasks: int, seed: int, policy) -> TaskSelection:
    """A new selection of mode ``name``, configured from ``policy`` (:func:`selection_class` refuses an unknown one)."""
    sel = selection_class(name)(num_tasks, seed)
    sel.configure(policy)
    return sel
