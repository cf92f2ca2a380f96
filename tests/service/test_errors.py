"""Failures made visible (dso_errors_total, last_error), metrics built once, and the re-send rule."""

import threading
import time

import pytest
import ray

from orchestrator.rollout.scripted import ScriptedTasks
from orchestrator.service.actor import Orchestrator, get_or_create_orchestrator
from orchestrator.service.calls import ActorCalls
from orchestrator.service.metrics import ERROR_KINDS, DSOMetrics


def test_a_reported_failure_is_counted_and_is_the_last_error_with_its_step():
    o = Orchestrator({"target_groups": 1, "group_size": 2}, ScriptedTasks(["t"]), metrics=DSOMetrics())
    assert o.get_stats().last_error is None and o.get_stats().errors == dict.fromkeys(ERROR_KINDS, 0)
    o.report_error("operator", "ActorDiedError: gone", step=7)
    stats = o.get_stats()
    assert stats.errors["operator"] == 1
    assert stats.last_error["kind"] == "operator" and stats.last_error["step"] == "7"
    assert stats.last_error["message"] == "ActorDiedError: gone"
    text = o.metrics.exposition()
    assert 'dso_errors_total{kind="operator"} 1.0' in text and 'dso_errors_total{kind="selector"} 0.0' in text


def test_trinity_dso_status_shows_the_last_error():
    from rich.console import Console

    from orchestrator.cli.service import status_table

    o = Orchestrator({"target_groups": 1, "group_size": 2}, ScriptedTasks(["t"]))
    o.report_error("selector", "next_tasks: deadline passed", step=3)
    console = Console(width=300, record=True)
    console.print(status_table(o.get_stats().model_dump(mode="json")))
    text = console.export_text()
    assert "selector at" in text and "explore step 3: next_tasks: deadline passed" in text


def test_metrics_built_from_many_threads_at_once_are_built_once():
    for _ in range(20):
        m = DSOMetrics()
        start = threading.Barrier(6)
        failed = []

        def first_use(i: int, m=m, start=start, failed=failed) -> None:
            start.wait()
            try:
                (m.set_anchor_index_up if i % 2 else lambda up: m.count_error("commit"))(True)
            except Exception as exc:  # noqa: BLE001 - DuplicateTimeseries before the lock
                failed.append(exc)

        threads = [threading.Thread(target=first_use, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failed == []
        assert 'dso_errors_total{kind="commit"} 3.0' in m.exposition()


@pytest.mark.slow
def test_a_call_that_hands_out_without_a_call_id_is_not_re_sent(ray_local, tmp_path):
    actor = get_or_create_orchestrator({"target_groups": 1, "group_size": 2}, ScriptedTasks(["t"]), name="dso-no-id",
                                       checkpoint_path=str(tmp_path / "s.db"), max_restarts=0)
    ray.get(actor.ping.remote())
    ray.kill(actor)
    calls = ActorCalls(actor, deadline_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        calls.call("pop_batch")  # at most once: raised at once, never re-sent
    assert time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        calls.call("pop_batch", call_id="c1")  # re-sent until the deadline (the actor never comes back)
    assert time.monotonic() - t0 >= 3.0


@pytest.mark.slow
def test_a_call_to_an_actor_killed_for_good_fails_at_once(ray_local, tmp_path):
    actor = get_or_create_orchestrator({"target_groups": 1, "group_size": 2}, ScriptedTasks(["t"]), name="dso-gone",
                                       checkpoint_path=str(tmp_path / "s.db"))
    ray.get(actor.ping.remote())
    ray.kill(actor)  # no restart: the name is freed
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        ActorCalls(actor, name="dso-gone", deadline_s=60).call("pop_batch", call_id="c1")
    assert time.monotonic() - t0 < 10.0
