"""The memory anchor index served by its own named Ray actor, and the one client that reaches it.

:data:`MemoryIndexActor` is ``ray.remote(MemoryAnchorIndex)``: the real implementation, run in
an actor process of its own, so every worker sees the same batches. :class:`RemoteAnchorIndex`
turns ``index.method(*args, **kwargs)`` into ``ray.get(handle.method.remote(*args, **kwargs))``
for any method of the index; no signature is written out here, so ``step_advantages`` (written
once, in :class:`~orchestrator.anchors.index.AnchorIndex`) runs inside the actor.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from orchestrator.anchors.index import incomplete_error
from orchestrator.anchors.memory import MemoryAnchorIndex

__all__ = ["MemoryIndexActor", "RemoteAnchorIndex", "serve_memory_index"]

MemoryIndexActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=32)(MemoryAnchorIndex)
"""The memory index as a Ray actor class (no CPU reserved: it only answers calls). Threaded
(the index is thread safe, one lock): a worker waiting for complete groups
(:meth:`MemoryAnchorIndex.await_complete`, at most ``_WAIT_SLICE_S`` per call) holds one
thread while the inserts that complete the groups are served by the others."""

_WAIT_SLICE_S = 1.0
"""Longest single blocking wait inside the actor; a longer wait is several calls."""


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
        """Block until every task has ``n_runs`` complete runs: the actor waits on its condition,
        woken by the insert that completes them (calls of at most ``_WAIT_SLICE_S``, so that a
        waiter never holds one of the actor's threads for long).

        Raises:
            AnchorIndexError: still incomplete after ``timeout_s`` (names up to 5 tasks).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            short = ray.get(self._handle.await_complete.remote(batch_key, list(tasks), n_runs, min(max(left, 0.0), _WAIT_SLICE_S)))
            if not short:
                return
            if time.monotonic() >= deadline:
                raise incomplete_error(batch_key, short, n_runs, timeout_s)

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
