"""The anchor-index lifecycle (orchestrator/anchors/owner.py) in plain Python: no Ray, no actor."""

from __future__ import annotations

import pytest

from orchestrator.anchors.index import AnchorStep
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.owner import AnchorBatchExpiredError, AnchorLifecycle


def test_lifecycle_tracks_batches_at_their_version_and_saves_them():
    version, changes = [3], []
    owner = AnchorLifecycle({"max_age_versions": 1}, version=lambda: version[0], on_change=lambda: changes.append(1))
    assert isinstance(owner.anchor, MemoryAnchorIndex)
    owner.anchor_register("b")
    owner.anchor.insert("b", [AnchorStep("t", 0, 0, "x", 1.0, last=True)])
    assert owner.anchor_register("b", model_version=0) == 3  # the first registration wins
    assert owner._anchor_state_dict() == {"anchor_batches": {"b": 3}, "anchor_expired": {}} and len(changes) == 1
    restored = AnchorLifecycle({}, version=lambda: 0)
    restored._anchor_load_state_dict(owner._anchor_state_dict())
    assert restored.anchor_stats()["tracked_batches"] == {"b": 3}


def test_lifecycle_expires_batches_older_than_max_age_versions():
    version = [0]
    owner = AnchorLifecycle({"max_age_versions": 1}, version=lambda: version[0])
    owner.anchor_register("v0")
    owner.anchor.insert("v0", [AnchorStep("t", 0, 0, "x", 1.0, last=True)])
    version[0] = 1
    owner._anchor_auto_expire()
    assert owner.anchor_stats()["batches"] == 1  # 0 >= 1 - 1: kept
    version[0] = 2
    owner._anchor_auto_expire()
    assert owner.anchor_stats()["tracked_batches"] == {} and owner.anchor_stats()["batches"] == 0


def test_a_batch_expired_by_version_is_refused_when_registered_again():
    # opened at version 0, expired at version 2 (max_age_versions 1): a late worker's register is
    # refused, naming the key and both versions; the refusal survives a checkpoint round trip
    version = [0]
    owner = AnchorLifecycle({"max_age_versions": 1}, version=lambda: version[0])
    owner.anchor_register("v0")
    version[0] = 2
    assert owner.anchor_expire() == ["v0"]
    with pytest.raises(AnchorBatchExpiredError, match=r"batch 'v0' was opened at model version 0 .*max_age_versions 1.*version 2"):
        owner.anchor_register("v0")
    assert owner.anchor_stats()["tracked_batches"] == {}
    restored = AnchorLifecycle({"max_age_versions": 1}, version=lambda: 2)
    restored._anchor_load_state_dict(owner._anchor_state_dict())
    with pytest.raises(AnchorBatchExpiredError):
        restored.anchor_register("v0")


def test_a_dropped_batch_key_may_be_registered_again():
    owner = AnchorLifecycle({"max_age_versions": 1}, version=lambda: 5)
    owner.anchor_register("b")
    owner.anchor_drop("b")
    assert owner.anchor_register("b") == 5
