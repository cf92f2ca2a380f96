"""The task-selection modes shipped with the package, registered, and the one factory that builds a selection.

:mod:`orchestrator.core.selection` holds the base class, the registry and the two basic modes;
each other mode is one file that subclasses them and registers itself (:mod:`orchestrator.core.greso`,
:mod:`orchestrator.core.skip`, :mod:`orchestrator.core.greso_prior`, :mod:`orchestrator.core.pass_predictor`). This module imports them all, so the imports run one way:
modes -> base, and this module -> both. Code that looks a mode up by name imports it from here.
"""

from __future__ import annotations

from orchestrator.core import greso, greso_prior, pass_predictor, skip  # noqa: F401  (registers 'greso', 'greso_prior', 'pass_predictor', 'predicted_skip')
from orchestrator.core.selection import SELECTIONS, TaskSelection


def make_selection(name: str, num_tasks: int, seed: int, policy) -> TaskSelection:
    """A new selection of mode ``name`` over ``num_tasks`` tasks, seeded with ``seed``: with the
    policy's ``selection_options`` when ``name`` is the policy's selection, else its defaults;
    then configured from the policy's shared settings.

    Raises:
        ValueError: unknown name (the registered ones are listed).
    """
    cls = SELECTIONS.mode_class(name)
    options = policy.mode_options("selection") if policy.selection == name else None
    sel = cls(num_tasks, seed, options)
    sel.configure(policy)
    return sel
