"""The memory anchor index served by its own named Ray actor, and the one client that reaches it.

:data:`MemoryIndexActor` is ``ray.remote(MemoryAnchorIndex)``: the real implementation, run in
an actor process of its own, so every worker sees the same batches. :class:`RemoteAnchorIndex`
turns ``index.method(*args, **kwargs)`` into ``ray.get(handle.method.remote(*args, **kwargs))``
for any method of the index; no signature is written out here, so ``step_advantages`` (written
once, in :class:`~orchestrator.anchors.index.AnchorIndex`) runs inside the actor.
"""

from __future__ import annotations

from typing import Any

import ray

from orchestrator.anchors.index import poll_complete
from orchestrator.anchors.memory import MemoryAnchorIndex

__all__ = ["MemoryIndexActor", "RemoteAnchorIndex", "serve_memory_index"]

MemoryIndexActor = ray.remote(num_cpus=0, max_restarts=0)(MemoryAnchorIndex)
"""The memory index as a Ray actor class (no CPU reserved: it only answers calls)."""


class RemoteAnchorIndex:
    """Client of an anchor index served by a Ray actor: every public method of the index, each one
    blocking round trip (errors re-raised as the index raised them, e.g. ``AnchorIndexError``).

    Picklable (it holds only the actor handle), so Ray tasks and actors can use it.

    Args:
        handle: a :data:`MemoryIndexActor` handle.
    """

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private and dunder lookups (pickling, copying) stay local
            raise AttributeError(name)
        method = getattr(self._handle, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))

    def wait_complete(self, batch_key: str, tasks: Any, n_runs: int, timeout_s: float, receipt: Any = None) -> None:
        """Poll the actor (:func:`~orchestrator.anchors.index.poll_complete`): a blocking wait
        inside it would hold up the inserts that complete the groups (it answers one call at a time)."""
        poll_complete(self, batch_key, tasks, n_runs, timeout_s)

    def __repr__(self) -> str:
        return f"RemoteAnchorIndex({self._handle!r})"


def serve_memory_index(name: str, namespace: str, *, ttl_s: float) -> RemoteAnchorIndex:
    """The memory index served by the named actor ``name`` in ``namespace``, created if absent.

    The actor is owned by the caller (not detached): it lives as long as the calling actor or
    driver, so an orchestrator actor's memory index ends with it.

    Args:
        name, namespace: where workers find it (``ray.get_actor(name, namespace=namespace)``).
        ttl_s: seconds an idle batch is kept, > 0 (:class:`MemoryAnchorIndex`).
    """
    handle = MemoryIndexActor.options(name=name, namespace=namespace, get_if_exists=True).remote(ttl_s=ttl_s)
    return RemoteAnchorIndex(handle)
