"""The modes of the resampling policy: one small strategy class per mode, one registry per extension point.

Six policy fields name a mode: ``selection`` (which tasks a round rolls out; its modes live in
their own files, collected by :mod:`orchestrator.core.selections`), ``screen`` (what a round's
tasks go through first, :mod:`orchestrator.core.screens`), ``group_validity`` (what a
group with unusable members gets), ``stale_members`` (what a group with stale members gets at
assembly), ``replenish`` (which tasks a replenish round rolls out) and ``on_cap`` (how a batch
closes at the replenish-round cap). Every one is a
:class:`~orchestrator.core.registry.Registry` (:data:`MODES`), registered the same way: one
class with a ``name`` and a typed ``Options`` model (its options, given in the policy's
``<field>_options``), decorated with the registry's ``register``. The policy's field accepts
exactly the registered names and refuses an option the mode does not take; the core builds the
active mode with its options (``policy.mode("on_cap")``) and calls only the base class's methods.

The modes here hold no state: they read and change the core they are given, as the core's parts
do, and are built afresh from the policy when used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algos.dapo import classify_groups
from orchestrator.core.errors import ReplenishCapError
from orchestrator.core.registry import Mode, Registry
from orchestrator.core.rows import GroupRows, flagged
from orchestrator.core.screens import SCREENS
from orchestrator.core.selections import SELECTIONS


# ------------------------------------------------------------------------------ group_validity
class GroupValidity(Mode):
    """What a submitted group with unusable members (a missing, non-finite or out-of-range reward
    or judged value) gets, on both submit routes (:mod:`orchestrator.core.submit`,
    :mod:`orchestrator.core.table`). The member rules themselves are
    :func:`orchestrator.core.validate.member_problem`.

    Class attributes a mode sets:
        name: the registry name (the policy's ``group_validity`` value).
        accepts_short: True when a group of fewer than ``group_size`` rollouts may be submitted
            (the list route; the absent members are unusable).
    """

    name = "base"
    accepts_short = False

    def min_usable(self, policy: Any, width: int) -> int:
        """The fewest usable members a group of ``width`` members needs (the table route's vectorised test)."""
        raise NotImplementedError

    def refusal(self, task: str, usable: int, policy: Any, problems: list[str]) -> str | None:
        """The message refusing a group of task ``task`` with ``usable`` usable members and the
        member ``problems`` found (in run order), or None when the group is accepted."""
        raise NotImplementedError


GROUP_VALIDITY: Registry[GroupValidity] = Registry("group_validity", GroupValidity)
register_group_validity = GROUP_VALIDITY.register


@register_group_validity
class RejectInvalid(GroupValidity):
    """``reject``: a group with any unusable member, or short of ``group_size``, is refused whole."""

    name = "reject"

    def min_usable(self, policy: Any, width: int) -> int:
        return width

    def refusal(self, task: str, usable: int, policy: Any, problems: list[str]) -> str | None:
        return problems[0] if problems else None


@register_group_validity
class MaskInvalid(GroupValidity):
    """``mask``: unusable (and absent) members get zero loss weight and leave the filter and the
    baseline; the group is kept while ``min_valid_group_size`` members remain."""

    name = "mask"
    accepts_short = True

    def min_usable(self, policy: Any, width: int) -> int:
        return policy.min_valid_group_size

    def refusal(self, task: str, usable: int, policy: Any, problems: list[str]) -> str | None:
        if usable >= policy.min_valid_group_size:
            return None
        why = f" ({problems[0]})" if problems else ""
        return (f"group_validity: task {task!r} has {usable} usable rollouts of {policy.group_size}, below "
                f"min_valid_group_size={policy.min_valid_group_size}{why}")


# ------------------------------------------------------------------------------ stale_members
class StaleMembers(Mode):
    """What a carried group with stale members gets when a batch is assembled
    (:meth:`orchestrator.core.release.Release._drop_stale`)."""

    name = "base"

    def keep(self, core: Any, rows: GroupRows, i: int, stale: np.ndarray) -> np.ndarray | None:
        """Group ``i`` of ``rows`` has the (n,) ``stale`` members: its new (n,) valid flags when it
        stays in the carry pool, or None to drop it as ``stale``."""
        raise NotImplementedError


STALE_MEMBERS: Registry[StaleMembers] = Registry("stale_members", StaleMembers)
register_stale_members = STALE_MEMBERS.register


@register_stale_members
class DropOldest(StaleMembers):
    """``oldest``: the oldest member decides; a group with a stale member is dropped whole."""

    name = "oldest"

    def keep(self, core: Any, rows: GroupRows, i: int, stale: np.ndarray) -> np.ndarray | None:
        return None


@register_stale_members
class MaskStale(StaleMembers):
    """``mask``: the stale members are masked (zero loss weight, out of the baseline; their
    rollouts flagged, on copies) if the group stays usable: ``min_valid_group_size`` members
    remain and, with the filter on, it is still informative."""

    name = "mask"

    def keep(self, core: Any, rows: GroupRows, i: int, stale: np.ndarray) -> np.ndarray | None:
        values, valid = rows.values[i], rows.valid[i] & ~stale
        if valid.sum() < core.policy.min_valid_group_size:
            return None
        f = core.policy.filter
        if f.enabled:
            keep, _ = classify_groups(
                values[None], std_tol=f.std_tol, correct_threshold=f.correct_threshold,
                wrong_threshold=f.wrong_threshold, band=f.band, valid=valid[None],
            )
            if not keep[0]:
                return None
        if rows.rollouts[i]:
            rows.rollouts[i] = flagged(rows.rollouts[i], {"dso_masked": "stale", "dso_loss_weight": 0.0}, lambda r: stale[r.eid.run])
        core.counters["rollouts_masked"] += int(stale.sum())
        return valid


# ------------------------------------------------------------------------------ replenish
class Replenish(Mode):
    """Which tasks a replenish round rolls out, and when the open batch stops replenishing
    (:mod:`orchestrator.core.rounds`). Fresh tasks of the active selection fill whatever
    :meth:`rerolls` leaves of a round."""

    name = "base"

    def rerolls(self, core: Any, take: int) -> list[str]:
        """Up to ``take`` tasks to roll out again ahead of fresh ones (the caller counts them
        against the rollout budget). Default: none."""
        return []

    def capped(self, rounds_started: int, max_rounds: int) -> bool:
        """True when the open batch, after ``rounds_started`` rounds (its initial round
        included), may start no further replenish round. Default: ``max_rounds`` replenish
        rounds (``max_replenish_rounds``; 0 = unlimited)."""
        return max_rounds > 0 and rounds_started > max_rounds


REPLENISH: Registry[Replenish] = Registry("replenish", Replenish)
register_replenish = REPLENISH.register


@register_replenish
class FreshTasks(Replenish):
    """``fresh_tasks``: replenish rounds draw new tasks (as the DAPO paper)."""

    name = "fresh_tasks"


@register_replenish
class SameTasks(Replenish):
    """``same_tasks``: replenish rounds first re-roll this batch's dropped tasks (oldest first),
    except those a skip rule has just put in a cooldown, then top up with fresh tasks."""

    name = "same_tasks"

    def rerolls(self, core: Any, take: int) -> list[str]:
        """Takes them from ``core.dropped_task_ids``; the tasks in a cooldown leave it too."""
        skip_until, epoch = core.history.skip_until_epoch, core.epoch
        rerolls = [t for t in core.dropped_task_ids if skip_until[core.task_index(t)] <= epoch]
        core.dropped_task_ids = rerolls[take:]
        return rerolls[:take]


@register_replenish
class NoReplenish(Replenish):
    """``none``: filter only; each batch closes after its initial round (per ``on_cap``)."""

    name = "none"

    def capped(self, rounds_started: int, max_rounds: int) -> bool:
        return True


# ------------------------------------------------------------------------------ on_cap
class OnCap(Mode):
    """How the open batch closes when the replenish-round cap is reached, or the data ends
    short of a batch (:meth:`orchestrator.core.release.Release.close_at_cap`)."""

    name = "base"

    def padding(self, core: Any, kept: GroupRows) -> int:
        """How many of the padding candidates (``core.candidates``, the most recent last) join
        the ``kept`` groups as padding; raise to refuse closing (the core then changes nothing).
        A batch short of ``target_groups`` is flagged partial."""
        raise NotImplementedError


ON_CAP: Registry[OnCap] = Registry("on_cap", OnCap)
register_on_cap = ON_CAP.register


@register_on_cap
class PadOnCap(OnCap):
    """``pad``: fill up to ``target_groups`` with the most recent dropped groups, flagged padding (zero loss weight)."""

    name = "pad"

    def padding(self, core: Any, kept: GroupRows) -> int:
        return min(core.policy.target_groups - len(kept), len(core.candidates))


@register_on_cap
class PartialOnCap(OnCap):
    """``partial``: release the kept groups alone."""

    name = "partial"

    def padding(self, core: Any, kept: GroupRows) -> int:
        return 0


@register_on_cap
class RaiseOnCap(OnCap):
    """``raise``: refuse with :class:`~orchestrator.core.errors.ReplenishCapError`; the open batch is kept."""

    name = "raise"

    def padding(self, core: Any, kept: GroupRows) -> int:
        p = core.policy
        raise ReplenishCapError(
            f"max_replenish_rounds: batch {core.batch_id} has {len(kept)} of {p.target_groups} informative "
            f"groups after {max(0, core.rounds_submitted - 1)} replenish rounds (cap {p.max_replenish_rounds})"
        )


MODES: dict[str, Registry] = {r.field: r for r in (SELECTIONS, SCREENS, GROUP_VALIDITY, STALE_MEMBERS, REPLENISH, ON_CAP)}
"""Policy field -> its registry (the policy's fields accept the names registered here:
:class:`orchestrator.core.policy.Registered`)."""
