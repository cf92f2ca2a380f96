"""The group outcomes keep the codes stored in state dicts and batch files."""

from algos.dapo import GroupReason
from orchestrator.core.outcomes import GroupOutcome


def test_the_stored_codes_are_unchanged():
    assert {r.label: int(r) for r in GroupOutcome} == {
        "informative": 0, "all_correct": 1, "all_wrong": 2, "zero_variance": 3, "singleton": 4, "out_of_band": 5,
        "stale": 6, "invalid": 7, "lost": 8,
    }


def test_the_maths_enum_holds_the_filter_outcomes_alone_with_the_same_codes():
    assert [r.name for r in GroupReason] == ["INFORMATIVE", "ALL_CORRECT", "ALL_WRONG", "ZERO_VARIANCE", "SINGLETON", "OUT_OF_BAND"]
    assert all(GroupOutcome[r.name] == r for r in GroupReason)
