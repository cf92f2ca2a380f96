"""The anchor-index owner (orchestrator/anchors/owner.py) in plain Python: no Ray, no actor."""

from __future__ import annotations

from orchestrator.anchors.index import AnchorStep
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.owner import AnchorIndexOwner


def test_owner_tracks_batches_at_their_version_and_saves_them():
    version, changes = [3], []
    owner = AnchorIndexOwner({"max_age_versions": 1}, version=lambda: version[0], on_change=lambda: changes.append(1))
    assert isinstance(owner.index, MemoryAnchorIndex)
    owner.insert("b", [AnchorStep("t", 0, 0, "x", 1.0, last=True)])
    assert owner.register("b", model_version=0) == 3  # the first registration wins
    assert owner.state_dict() == {"anchor_batches": {"b": 3}} and len(changes) == 1
    restored = AnchorIndexOwner({}, version=lambda: 0)
    restored.load_state_dict(owner.state_dict())
    assert restored.stats()["tracked_batches"] == {"b": 3}


def test_owner_expires_batches_older_than_max_age_versions():
    version = [0]
    owner = AnchorIndexOwner({"max_age_versions": 1}, version=lambda: version[0])
    owner.insert("v0", [AnchorStep("t", 0, 0, "x", 1.0, last=True)])
    version[0] = 1
    owner.auto_expire()
    assert owner.stats()["batches"] == 1  # 0 >= 1 - 1: kept
    version[0] = 2
    owner.auto_expire()
    assert owner.stats()["tracked_batches"] == {} and owner.stats()["batches"] == 0
