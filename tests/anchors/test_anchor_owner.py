"""The anchor-index lifecycle (orchestrator/anchors/owner.py) in plain Python: no Ray, no actor."""

from __future__ import annotations

from orchestrator.anchors.index import AnchorStep
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.owner import AnchorLifecycle


def test_lifecycle_tracks_batches_at_their_version_and_saves_them():
    version, changes = [3], []
    owner = AnchorLifecycle({"max_age_versions": 1}, version=lambda: version[0], on_change=lambda: changes.append(1))
    assert isinstance(owner.anchor, MemoryAnchorIndex)
    owner.anchor_register("b")
    owner.anchor.insert("b", [AnchorStep("t", 0, 0, "x", 1.0, last=True)])
    assert owner.anchor_register("b", model_version=0) == 3  # the first registration wins
    assert owner._anchor_state_dict() == {"anchor_batches": {"b": 3}} and len(changes) == 1
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
