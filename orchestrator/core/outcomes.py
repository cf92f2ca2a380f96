"""What became of a group: the filter's outcomes and the orchestrator's own drop reasons.

The filter (:func:`algos.dapo.classify_groups`, DAPO Eq. 11) decides ``informative``,
``all_correct``, ``all_wrong``, ``zero_variance``, ``singleton`` and ``out_of_band``
(:class:`algos.dapo.GroupReason`, pure maths). The orchestrator adds the reasons that are about
running, not about the values: ``stale`` (its members' model versions lag past
``max_staleness``), ``invalid`` (refused by ``group_validity``) and ``lost`` (held, but its
payload died with the submitter). :class:`GroupOutcome` holds both, with the codes they always
had: they are stored in state dicts and batch files.
"""

from __future__ import annotations

from enum import IntEnum

from algos.dapo import GroupReason


class GroupOutcome(IntEnum):
    """Every outcome of a group; the filter's share :class:`algos.dapo.GroupReason`'s codes (0-5)."""

    INFORMATIVE = int(GroupReason.INFORMATIVE)
    ALL_CORRECT = int(GroupReason.ALL_CORRECT)
    ALL_WRONG = int(GroupReason.ALL_WRONG)
    ZERO_VARIANCE = int(GroupReason.ZERO_VARIANCE)
    SINGLETON = int(GroupReason.SINGLETON)
    OUT_OF_BAND = int(GroupReason.OUT_OF_BAND)
    STALE = 6  # a member's model version lags past max_staleness (orchestrator.core.release)
    INVALID = 7  # refused by the group_validity mode (orchestrator.core.submit)
    LOST = 8  # held, but its payload died with the submitter (orchestrator.trinity.held): never a filter outcome

    @property
    def label(self) -> str:
        return self.name.lower()
