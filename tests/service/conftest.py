"""A live run for the service's tests: a thread that keeps asking the orchestrator actor for batches."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest


class LiveRun:
    """Drives an orchestrator actor like a trainer does, in a background thread.

    Each step: ``next_batch``; every ``version_every`` batches ``set_model_version(v + 1)`` (a
    weight sync); then ``on_step(step, handle)`` when given; then a pause of ``pause_s``.
    :meth:`hold` stops it between steps (and waits until it has), :meth:`go` lets it run on.
    """

    def __init__(self, handle, *, pause_s: float = 0.2, version_every: int = 2,
                 on_step: Callable[[int, object], None] | None = None):
        self.handle, self.pause_s, self.version_every, self.on_step = handle, pause_s, version_every, on_step
        self.steps = 0
        self.error: BaseException | None = None
        self._run = threading.Event()
        self._idle = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="live-run", daemon=True)

    def _loop(self) -> None:
        import ray

        version = 0
        while not self._stop:
            self._idle.set()
            if not self._run.wait(0.05):
                continue
            self._idle.clear()
            if self._stop:
                break
            try:
                ray.get(self.handle.next_batch.remote(), timeout=60)
                self.steps += 1
                if self.steps % self.version_every == 0:
                    version += 1
                    ray.get(self.handle.set_model_version.remote(version), timeout=60)
                if self.on_step is not None:
                    self.on_step(self.steps, self.handle)
            except BaseException as exc:  # noqa: BLE001  (reported by hold() and stop())
                self.error = exc
                self._stop = True
                break
            time.sleep(self.pause_s)
        self._idle.set()

    def go(self) -> LiveRun:
        if not self._thread.is_alive() and not self._stop:
            self._thread.start()
        self._run.set()
        return self

    def hold(self, timeout: float = 60) -> None:
        """Stop between two steps; returns once no call of the run is in flight."""
        self._run.clear()
        self._idle.clear()
        assert self._idle.wait(timeout), "the live run did not stop within its step's timeout"
        self._raise()

    def stop(self) -> None:
        self._stop = True
        self._run.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None  # said once
            raise AssertionError(f"the live run failed at step {self.steps + 1}: {error!r}") from error


@pytest.fixture
def live_run():
    """A factory of :class:`LiveRun` (``live_run(handle, ...)``); each run is stopped after the test."""
    runs: list[LiveRun] = []

    def make(handle, **kwargs) -> LiveRun:
        runs.append(LiveRun(handle, **kwargs))
        return runs[-1]

    yield make
    for run in runs:
        run.stop()
