"""Trinity-RFT 0.6.0's real ``Explorer`` loop (``mode: explore``, CPU) with our selector and operator.

One module fixture runs one Trinity run end to end and records what it saw; each test checks
one behaviour of that record:

1. the tiny model is served by our vLLM engine behind Trinity's model wrapper (the harness's
   workaround of Trinity's external-engine bug: see ``dso_trinity_harness``);
2. Trinity's launcher ``explore()`` runs the Explorer (taskset scheduler -> our selector ->
   workflow runners -> rollout coordinator -> experience pipeline with our operator -> queue);
3. while it runs, the REST service (a real Ray Serve HTTP server) scrapes ``/metrics`` and
   sends ``PATCH /v1/policy`` to the run's actor;
4. the Explorer actor is killed mid-run, a new one resumes from Trinity's checkpoint and runs
   to ``total_steps``;
5. the trainer side reads the queue with Trinity's own ``QueueReader``.

Trinity's trainer needs CUDA (verl) and does not run here.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import ray
import yaml

# slow: one Trinity run with a vLLM engine, restarts included; the fixture is timed with the first test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
TASKS = 64  # rows of the taskset; the two phases hand out at most 14 steps x 4 tasks: one epoch
B, N = 4, 4  # tasks per explore step (buffer.batch_size), rollouts per task (repeat_times)
STEPS = 8
ACTOR = "dso-trinity-it"


def label(i: int) -> str:
    return "always" if i % 4 == 3 else "never" if i % 8 == 6 else "split" if i % 8 == 1 else "coin"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from orchestrator.rollout.model import build_tiny_model, ensure_smollm2

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), ensure_smollm2())


NAMESPACE = "dso-it"  # the runs' Ray namespace: one model actor serves both runs of this module


@pytest.fixture(scope="module")
def engine_model(tiny_model, ray_local):
    """The model actor Trinity's workflow runners look up (see dso_trinity_harness), started once."""
    from dso_trinity_harness import start_engine_model

    handle = start_engine_model("explorer_rollout_model_0_0", NAMESPACE, str(tiny_model))
    yield handle
    ray.kill(handle)


def fresh_synchronizer() -> None:
    """Trinity's Synchronizer is a detached actor per namespace: each run of this module gets a new one."""
    try:
        ray.kill(ray.get_actor("synchronizer", namespace=NAMESPACE))
    except ValueError:
        return
    wait_for(lambda: _actor_gone("synchronizer", NAMESPACE), 60, "old synchronizer gone")


def write_rows(tmp: Path, rows: list[dict]) -> Path:
    import json

    data = tmp / "tasks"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def write_config(tmp: Path, model: Path, name: str) -> Path:
    data = write_rows(tmp, [{"prompt": f"Say something about {i}.", "label": label(i)} for i in range(TASKS)])
    cfg = {
        "mode": "explore",
        "project": "dso-it",
        "name": name,
        "ray_namespace": NAMESPACE,
        "checkpoint_root_dir": str(tmp / "ckpt"),
        "continue_from_checkpoint": True,
        "model": {"model_path": str(model), "max_response_tokens": 8, "max_model_len": 256},
        "algorithm": {"algorithm_type": "dso_dapo", "repeat_times": N},
        "cluster": {"node_num": 1, "gpu_per_node": 1},
        "buffer": {
            "total_steps": STEPS,
            "batch_size": B,
            "explorer_input": {
                "taskset": {
                    "name": "labels",
                    "storage_type": "file",
                    "path": str(data),
                    "split": "train",
                    "format": {"prompt_key": "prompt", "response_key": "label"},
                    "rollout_args": {"temperature": 1.0, "max_tokens": 8},
                    "data_selector": {"selector_type": "dso_orchestrator",
                                      "kwargs": {"actor_name": ACTOR, "policy": {"filter": {"judge": "accuracy"},
                                                                                "group_validity": "mask"}}},
                },
                "default_workflow_type": "simple_workflow",
                "default_reward_fn_type": "dso_trinity_harness.LabelReward",
            },
            "trainer_input": {"experience_buffer": {"name": f"dso_it_{name}", "storage_type": "queue",
                                                    "max_read_timeout": 10}},
        },
        "data_processor": {"experience_pipeline": {"operators": [{"name": "dso_orchestrator", "args": {}}]}},
        "explorer": {"rollout_model": {"engine_type": "external", "engine_num": 1}, "runner_per_model": 2,
                     "eval_interval": 1000},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 2},
        "monitor": {"monitor_type": "tensorboard"},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def load(path: Path):
    from trinity.common.config import load_config

    import orchestrator.trinity.plugin  # noqa: F401  (registers the dso_ names)

    cfg = load_config(str(path))
    cfg.check_and_update()
    return cfg


def wait_for(pred, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout} s")


@pytest.fixture(scope="module")
def trinity_run(tmp_path_factory, tiny_model, engine_model, serve_http):
    """Run the explorer, PATCH it, kill it, resume it; return everything observed."""
    from ray import serve
    from trinity.buffer.buffer import get_buffer_reader
    from trinity.cli.launcher import explore

    from orchestrator.service.serve import build_app

    tmp = tmp_path_factory.mktemp("trinity-run")
    name = f"run-{uuid.uuid4().hex[:6]}"
    path = write_config(tmp, tiny_model, name)
    cfg = load(path)
    seen: dict = {"cfg": cfg}
    fresh_synchronizer()
    calls_before = ray.get(engine_model.chat_calls.remote())
    app = build_app({"orchestrator": None, "service": {"actor_name": ACTOR, "namespace": "trinity-dso", "app_name": "trinity-it"}})
    serve.run(app, name="trinity-it", route_prefix="/trinity-it")
    url = f"{serve_http}/trinity-it"
    http = httpx.Client(base_url=url, timeout=30)
    # the trainer side holds the queue (it outlives the explorer, as a trainer's would)
    reader = get_buffer_reader(cfg.buffer.trainer_input.experience_buffer)
    pgs_before = live_placement_groups()
    phase1: dict = {}

    def submitted() -> int:
        if "status" in phase1:  # the explorer ended early: say why
            raise RuntimeError(f"explorer stopped: {phase1['status'].error}")
        if "raised" in phase1:
            raise RuntimeError("explore() raised") from phase1["raised"]
        r = http.get("/v1/stats")
        return r.json()["groups_submitted"] if r.status_code == 200 else 0

    # ---- phase 1: explore until a PATCH has taken effect, then kill the Explorer
    def phase1_explore() -> None:
        try:
            phase1["status"] = explore(cfg)
        except Exception as exc:  # after the kill: explore()'s finally calls shutdown on the dead explorer
            phase1["raised"] = exc

    t = threading.Thread(target=phase1_explore, daemon=True)
    t0 = time.monotonic()
    t.start()
    wait_for(lambda: submitted() >= B, 900, "first explore step reaches the orchestrator")
    seen["metrics_before"] = http.get("/metrics").text
    seen["policy_before"] = http.get("/v1/policy").json()
    seen["patch"] = http.patch("/v1/policy", json={"filter": {"band": [0.3, 0.7]}})
    seen["patch_pinned"] = http.patch("/v1/policy", json={"target_groups": 2})
    seen["submitted_at_patch"] = submitted()

    def band_seen() -> bool:  # two more steps; up to four while none of their groups fell outside the band
        r = http.get("/v1/stats")
        out = r.json()["classified_by_reason"]["out_of_band"] if r.status_code == 200 else 0
        return submitted() >= seen["submitted_at_patch"] + (2 if out else 4) * B

    wait_for(band_seen, 600, "two more explore steps (four while no group fell outside the band)")
    seen["metrics_after_patch"] = http.get("/metrics").text
    seen["stats_after_patch"] = http.get("/v1/stats").json()
    ray.kill(ray.get_actor(cfg.explorer.name, namespace=cfg.ray_namespace))
    t.join(timeout=120)
    if t.is_alive():
        raise TimeoutError("phase 1: explore() did not return within 120 s of its explorer's death")
    if not isinstance(phase1.get("raised"), ray.exceptions.ActorDiedError):
        raise RuntimeError(f"phase 1: explore() ended with {phase1!r}, not with its explorer's death")
    actor = ray.get_actor(ACTOR, namespace="trinity-dso")
    seen["state_at_kill"] = ray.get(actor.state_dict.remote())
    seen["carried_at_kill"] = ray.get(actor.__ray_call__.remote(lambda self: list(self.core.carry.refs)))
    seen["explorer_ckpt_step"] = _explorer_step(cfg)
    wait_for(lambda: _actor_gone(cfg.explorer.name, cfg.ray_namespace), 60, "killed explorer's name is free")
    release_placement_groups(pgs_before)

    # ---- phase 2: a new Explorer resumes from Trinity's checkpoint and runs to total_steps
    cfg2 = load(path)
    seen["resume_status"] = explore(cfg2)
    seen["wall_s"] = time.monotonic() - t0
    seen["state_end"] = ray.get(actor.state_dict.remote())
    seen["held_end"] = ray.get(actor.held_refs.remote())
    seen["stats_end"] = http.get("/v1/stats").json()
    seen["metrics_end"] = http.get("/metrics").text
    seen["chat_calls"] = ray.get(engine_model.chat_calls.remote()) - calls_before
    end_explorer(cfg.explorer.name)  # Trinity's launcher leaves the Explorer actor (and what it owns) alive
    release_placement_groups(pgs_before)

    # ---- the trainer side: Trinity's QueueReader, train_batch_size experiences per read
    seen["batches"] = read_all(reader)
    print(transcript(seen))  # shown with pytest -s
    yield seen
    http.close()
    serve.delete("trinity-it")
    ray.kill(actor)


def end_explorer(name: str) -> None:
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))
    except ValueError:
        return
    wait_for(lambda: _actor_gone(name, NAMESPACE), 60, "explorer gone")


def transcript(seen: dict) -> str:
    """What a user sees of the run over REST: the policy change and the metrics scrapes."""
    keep = ("dso_resampling_policy_revision", "dso_groups_emitted_total", "dso_groups_classified_total",
            "dso_groups_dropped_total", "dso_batches_emitted_total")

    def lines(text: str) -> str:
        return "\n".join(f"    {x}" for x in text.splitlines() if x.startswith(keep) and not x.endswith(" 0.0"))

    p, q = seen["patch"], seen["patch_pinned"]
    return (
        f"PATCH /v1/policy {{'filter': {{'band': [0.3, 0.7]}}}} -> {p.status_code} {p.json()}\n"
        f"PATCH /v1/policy {{'target_groups': 2}} -> {q.status_code} {q.json()}\n"
        f"GET /metrics after the change:\n{lines(seen['metrics_after_patch'])}\n"
        f"GET /metrics at the end:\n{lines(seen['metrics_end'])}"
    )


def live_placement_groups() -> set[str]:
    """Ids of the placement groups that still reserve resources."""
    return {pg for pg, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}


def release_placement_groups(before: set[str]) -> None:
    """Remove the placement groups reserved since ``before``: those of explorers that are gone.

    Trinity's ``Allocator.create_all_models`` reserves one placement group per Explorer
    (``{"GPU": 0, "CPU": 1}`` per engine, external engines included), and nothing frees it:
    not ``Explorer.shutdown``, and not the Explorer's death, since Ray scopes a placement group
    created by a non-detached actor to its job, here this pytest session's driver (a
    ``trinity`` CLI process frees them when it exits). On the session's 2-CPU Ray, the two
    Explorers of the dso_dapo run (killed, then resumed) would hold both CPUs, and the next
    Explorer would wait in ``pg.ready()`` (in ``prepare``) for ever.
    """
    from ray.util.placement_group import PlacementGroup

    for pg in live_placement_groups() - before:
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg))))
    wait_for(lambda: not (live_placement_groups() - before), 60, "explorers' placement groups removed")


def read_all(reader) -> list:
    """Every batch left in the queue, read with Trinity's ``QueueReader`` until it is empty or closed."""
    import asyncio

    batches: list = []

    async def drain() -> None:
        while True:
            try:
                batches.append(await reader.read())
            except (StopAsyncIteration, TimeoutError):
                return

    asyncio.run(drain())
    return batches


def _explorer_step(cfg) -> int:
    from trinity.manager.state_manager import StateManager

    return int(StateManager(path=cfg.checkpoint_job_dir, explorer_name=cfg.explorer.name, config=cfg)
               .load_explorer().get("latest_iteration", 0))


def _actor_gone(name: str, ns: str) -> bool:
    try:
        ray.get_actor(name, namespace=ns)
    except ValueError:
        return True
    return False


def _metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} " if labels else f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name}{{{want}}} not in the scrape")


# ----------------------------------------------------------------------------- the run
def test_the_resumed_explorer_finishes_all_steps(trinity_run):
    assert trinity_run["resume_status"].success, trinity_run["resume_status"].error
    assert _explorer_step(trinity_run["cfg"]) == STEPS


def test_every_batch_at_the_buffer_has_exactly_target_groups_times_n_experiences(trinity_run):
    batches = trinity_run["batches"]
    assert batches, "the trainer side read nothing"
    for batch in batches:
        assert len(batch) == B * N
        assert len({e.info["dso_batch_id"] for e in batch}) == 1
        tasks = [e.info["task_index"]["index"] for e in batch]
        assert sorted(tasks.count(t) for t in set(tasks)) == [N] * B


def test_no_group_is_duplicated_and_only_the_dead_pipelines_last_batches_can_be_lost(trinity_run):
    batches, stats = trinity_run["batches"], trinity_run["stats_end"]
    released = [e for b in batches for e in b]
    keys = [(e.info["task_index"]["index"], e.eid.run) for e in released]
    assert len(keys) == len(set(keys))  # each task is in one group, each run once
    read = {e.info["dso_batch_id"] for e in released}
    emitted = set(range(stats["batches_emitted"]))
    # at most once: a batch is missing only if the killed explorer's pipeline got it in its last
    # call and died before writing it to the queue (the actor names those when the new one attaches)
    unconfirmed = trinity_run["state_end"]["attachment"].get("unconfirmed", {}).get("batch_ids", [])
    assert read <= emitted and emitted - read <= set(unconfirmed), (
        f"batches read {sorted(read)} of {len(emitted)} emitted; the dead pipeline's last call got {unconfirmed}; "
        f"at the kill the actor was at batch {trinity_run['state_at_kill']['batch_id']}"
    )
    assert stats["groups_emitted"] + stats["groups_padded"] == len(released) // N + B * len(emitted - read)
    assert stats["groups_submitted"] == (stats["groups_emitted"] + stats["groups_padded"] + stats["groups_dropped"]
                                         + stats["groups_held"])


def test_the_groups_carried_over_at_the_kill_are_released_from_held_dir_or_counted_lost(trinity_run):
    # held_dir: a group the dead explorer left carried over comes back with eid.batch "<step>@<its session>";
    # only one whose payload the kill cut off before it was written may be missing, dropped as "lost"
    carried = set(trinity_run["carried_at_kill"])
    restored = set()
    for e in (e for b in trinity_run["batches"] for e in b):
        step, at, session = str(e.eid.batch).partition("@")
        if at:
            restored.add(f"{session}:{step}/{e.eid.task}")
    lost = trinity_run["stats_end"]["dropped_by_reason"]["lost"]
    missing = carried - restored - set(trinity_run["held_end"])
    assert len(missing) <= lost, (sorted(carried), sorted(restored), lost)


def test_no_task_is_rerolled_or_skipped_across_the_restart(trinity_run):
    from orchestrator.core.machine import OrchestratorCore
    from orchestrator.core.policy import ResamplingPolicy

    state = trinity_run["state_end"]
    groups = state["history"]["groups"]
    assert max(groups) == 1  # no task rolled out twice in the run's one epoch
    order = OrchestratorCore(ResamplingPolicy(), [str(i) for i in range(TASKS)], seed=state["seed"]).select_tasks(TASKS)
    done = [t for t in order if groups[int(t)]]
    assert done == order[: len(done)]  # the epoch order's prefix: nothing skipped
    # in flight at the end: only the step the selector reserved ahead, right after the prefix
    assert state["requeued"] == [] and state["in_flight"] == order[len(done): len(done) + B]


def test_the_restart_happened_with_the_actor_ahead_of_trinitys_checkpoint(trinity_run):
    # the actor had consumed more steps than Trinity's explorer checkpoint records
    state = trinity_run["state_at_kill"]
    assert sum(state["history"]["groups"]) >= trinity_run["explorer_ckpt_step"] * B
    assert state["attachment"]["run"].endswith(trinity_run["cfg"].name)


def test_a_member_without_a_usable_reward_reaches_the_trainer_masked(trinity_run):
    # label "split": a group's first response scores NaN; group_validity "mask" keeps the group
    released = [e for b in trinity_run["batches"] for e in b]
    masked = [e for e in released if e.info.get("dso_masked")]
    assert masked, "no masked member reached the trainer side"
    assert all(e.reward == 0.0 and math.isnan(e.info["dso_reward"]) for e in masked)
    assert all(float(e.advantages.abs().max()) == 0.0 and float(e.action_mask.sum()) == 0 for e in masked)
    assert all(math.isfinite(e.reward) for e in released)  # Trinity's trainer gathers every reward


def test_rest_patch_reaches_the_running_explorer(trinity_run):
    assert trinity_run["patch"].status_code == 200, trinity_run["patch"].text
    assert trinity_run["patch"].json()["policy"]["filter"]["band"] == [0.3, 0.7]
    assert trinity_run["patch"].json()["revision"] == trinity_run["policy_before"]["revision"] + 1
    # groups submitted after the PATCH were judged with the band
    assert _metric(trinity_run["metrics_before"], "dso_groups_classified_total", outcome="out_of_band") == 0
    assert trinity_run["stats_after_patch"]["classified_by_reason"]["out_of_band"] > 0


def test_rest_refuses_a_policy_change_that_breaks_the_trainer_batch_size(trinity_run):
    r = trinity_run["patch_pinned"]
    assert r.status_code == 409
    assert r.json()["error"] == "policy_pinned"
    assert "target_groups: pinned to 4" in r.json()["message"] and "train_batch_size" in r.json()["message"]


def test_metrics_show_the_runs_kept_and_dropped_groups(trinity_run):
    text, stats = trinity_run["metrics_end"], trinity_run["stats_end"]
    assert _metric(text, "dso_groups_emitted_total") == stats["groups_emitted"] > 0
    assert _metric(text, "dso_groups_dropped_total", reason="all_correct") == stats["dropped_by_reason"]["all_correct"] > 0
    assert _metric(text, "dso_groups_classified_total", outcome="informative") == stats["classified_by_reason"]["informative"]


def test_rounds_and_rollouts_are_counted_by_purpose(trinity_run):
    # one explore step = one round of B groups: the first into a batch is initial, later ones replenish
    stats = trinity_run["stats_end"]
    assert stats["rollouts_initial"] + stats["rollouts_replenish"] == stats["groups_submitted"] * N
    assert stats["rollouts_replenish"] == stats["replenish_rounds"] * B * N
    initial_rounds = stats["rollouts_initial"] // (B * N)
    assert stats["rollouts_initial"] == initial_rounds * B * N
    assert 1 <= initial_rounds <= stats["batches_emitted"] + 1
    assert sum(stats["rounds_per_batch"]) <= stats["replenish_rounds"]


# ----------------------------------------------------------------------------- GiGPO, multi-turn, Redis index
REDIS_URL = __import__("os").environ.get("DSO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="module")
def gigpo_run(tmp_path_factory, tiny_model, engine_model):
    """A ``dso_gigpo`` run with ``advantage_fn: dso_gigpo_index`` and the anchor index in Redis."""
    import asyncio

    import redis
    from trinity.buffer.buffer import get_buffer_reader
    from trinity.cli.launcher import explore

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} is not reachable: {exc}")
    tmp = tmp_path_factory.mktemp("gigpo-run")
    name, prefix, actor_name = f"gigpo-{uuid.uuid4().hex[:6]}", f"dso-test:{uuid.uuid4().hex[:12]}", "dso-trinity-gigpo"
    data = write_rows(tmp, [{"prompt": "walk", "goal": 2} for _ in range(16)])
    orchestrator = {"actor_name": actor_name, "anchor_index": {"redis_url": REDIS_URL, "prefix": prefix},
                    "policy": {"filter": {"judge": "reward", "correct_threshold": 1.0, "wrong_threshold": 0.0}}}
    cfg = {
        "mode": "explore", "project": "dso-it", "name": name, "ray_namespace": NAMESPACE,
        "checkpoint_root_dir": str(tmp / "ckpt"), "continue_from_checkpoint": True,
        "model": {"model_path": str(tiny_model), "max_response_tokens": 4, "max_model_len": 256},
        "algorithm": {"algorithm_type": "dso_gigpo", "repeat_times": N, "advantage_fn": "dso_gigpo_index"},
        "cluster": {"node_num": 1, "gpu_per_node": 1},
        "buffer": {
            "total_steps": 3, "batch_size": 2,
            "explorer_input": {
                "taskset": {"name": "walk", "storage_type": "file", "path": str(data), "split": "train",
                            "format": {"prompt_key": "prompt"},
                            "data_selector": {"selector_type": "dso_orchestrator", "kwargs": orchestrator}},
                "default_workflow_type": "dso_trinity_harness.WalkWorkflow",
            },
            "trainer_input": {"experience_buffer": {"name": f"dso_it_{name}", "storage_type": "queue", "max_read_timeout": 5}},
        },
        "data_processor": {"experience_pipeline": {"operators": [{"name": "dso_orchestrator", "args": {}}]}},
        "explorer": {"rollout_model": {"engine_type": "external", "engine_num": 1}, "runner_per_model": 2,
                     "eval_interval": 1000},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 3},
        "monitor": {"monitor_type": "tensorboard"},
    }
    path = tmp / "gigpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    config = load(path)
    fresh_synchronizer()
    reader = get_buffer_reader(config.buffer.trainer_input.experience_buffer)
    pgs_before = live_placement_groups()
    t0 = time.monotonic()
    status = explore(config)
    wall = time.monotonic() - t0
    end_explorer(config.explorer.name)
    release_placement_groups(pgs_before)
    exps: list = []

    async def read_all():
        # one experience per read: Trinity's QueueReader drops a short final batch (TimeoutError after
        # taking it off the queue), and a multi-turn batch's size is not a multiple of any read size
        while True:
            try:
                exps.extend(await reader.read(batch_size=1))
            except (StopAsyncIteration, TimeoutError):
                return

    asyncio.run(read_all())
    actor = ray.get_actor(actor_name, namespace="trinity-dso")
    seen = {"status": status, "exps": exps, "wall_s": wall, "config": config,
            "anchor_stats": ray.get(actor.anchor_stats.remote()), "stats": ray.get(actor.get_stats.remote()),
            "redis_keys": [k.decode() for k in client.scan_iter(match=f"{prefix}*", count=1000)]}
    yield seen
    ray.kill(actor)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_gigpo_index_run_with_redis_finishes(gigpo_run):
    assert gigpo_run["status"].success, gigpo_run["status"].error
    assert gigpo_run["config"].algorithm.advantage_fn_args["namespace"] == "trinity-dso"
    assert gigpo_run["anchor_stats"]["backend"] == "redis" and gigpo_run["redis_keys"]


def test_gigpo_index_advantages_at_the_buffer_equal_the_per_batch_computation(gigpo_run):
    from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn

    exps = gigpo_run["exps"]
    assert exps and len({e.eid.step for e in exps}) > 1  # multi-turn: several steps per trajectory
    by_batch: dict[int, list] = {}
    for e in exps:
        by_batch.setdefault(e.info["dso_batch_id"], []).append(e)
    for batch in by_batch.values():
        expected = DsoGiGPOAdvantageFn().compute(batch).advantages
        got = [float(e.advantages[e.action_mask.bool()][0]) if e.action_mask.any() else 0.0 for e in batch]
        assert got == pytest.approx(expected.tolist(), abs=1e-5)
        assert len({e.eid.tid for e in batch}) == 2  # target_groups groups per released batch
