"""FrozenLake multi-turn environment (orchestrator/envs/frozenlake.py)."""

from __future__ import annotations

import numpy as np
import pytest

from algos.gigpo import anchor_group_ids, gigpo_advantages
from orchestrator.anchors.state_hash import text_hash
from orchestrator.core.types import Task
from orchestrator.envs.frozenlake import (
    ACTIONS,
    EnvError,
    canonical_state,
    make_tasks,
    render_grid,
    run_episodes,
)
from orchestrator.envs.policies import engine_act, random_act


def state_hash(desc, row, col):
    """The ``env_state_hash`` the environment writes for an agent at (row, col) on ``desc``."""
    return text_hash(canonical_state(desc, row, col))


def lake(desc, task_id="lake"):
    return Task(task_id=task_id, prompt=[], answer="", kind="frozenlake", meta={"desc": desc})


def scripted(words):
    """A policy that answers words[turn] to every prompt of that turn; records the calls."""
    calls = []

    def act(prompts, choices):
        calls.append(len(prompts))
        w = words[len(calls) - 1]
        return [{"text": w, "token_ids": [7], "prompt_token_ids": [1, 2], "logprobs": [-0.5]} for _ in prompts]

    act.calls = calls
    return act


def test_make_tasks_gives_distinct_maps_skipping_repeated_seeds():
    # seeds 0..99 give only 81 distinct 4x4 maps (gymnasium 1.x), so 90 tasks need skipping
    tasks = make_tasks(90, seed=0)
    maps = {tuple(t.meta["desc"]) for t in tasks}
    assert len(maps) == 90 and len({t.task_id for t in tasks}) == 90
    assert max(t.meta["map_seed"] for t in tasks) > 89


def test_make_tasks_refuses_more_maps_than_exist():
    with pytest.raises(ValueError, match=r"distinct 2x2 maps"):
        make_tasks(50, size=2)


def test_render_grid_is_plain_text():
    assert render_grid(["SF", "HG"], 0, 1) == "S P\nH G"
    assert "\x1b" not in render_grid(["SFFF", "FHFH", "FFFH", "HFFG"], 2, 2)


def test_state_hash_is_the_sha1_of_map_and_cell():
    # the value anchors, tests and GiGPO figures were computed with: sha1 of "SF\nFG\n@0,1"
    assert canonical_state(["SF", "FG"], 0, 1) == "SF\nFG\n@0,1"
    assert state_hash(["SF", "FG"], 0, 1) == "9c714ad5009113d817a52ac9ce69ccd895b7957c"


def test_state_hash_depends_on_map_and_cell_only():
    a = state_hash(["SF", "FG"], 0, 1)
    assert a == state_hash(["SF", "FG"], 0, 1)
    assert a != state_hash(["SF", "FG"], 1, 0)
    assert a != state_hash(["SF", "HG"], 0, 1)


def test_first_states_form_one_anchor_group_of_size_n():
    tasks = make_tasks(3, seed=1)
    exps = run_episodes(tasks, 5, random_act(0), max_steps=6)
    ids, sizes = anchor_group_ids([e.eid.task for e in exps], [e.info["env_state_hash"] for e in exps])
    first = [i for i, e in enumerate(exps) if e.eid.step == 0]
    assert len(first) == 15
    for t in tasks:
        rows = [i for i in first if exps[i].eid.task == t.task_id]
        assert len({int(ids[i]) for i in rows}) == 1
        assert all(sizes[i] >= 5 for i in rows)
        assert exps[rows[0]].info["env_state_hash"] == state_hash(t.meta["desc"], 0, 0)


def test_policy_called_once_per_turn_for_all_live_trajectories():
    # "left" from the start never moves: all 2 tasks x 3 runs stay live for 4 turns
    act = scripted(["left"] * 4)
    exps = run_episodes([lake(["SF", "FG"], "a"), lake(["SF", "FG"], "b")], 3, act, max_steps=4)
    assert act.calls == [6, 6, 6, 6]
    assert len(exps) == 24


def test_state_hash_is_of_the_state_before_the_action():
    act = scripted(["right", "down"])
    exps = run_episodes([lake(["SF", "FG"])], 1, act, max_steps=5)
    assert [e.info["env_state_hash"] for e in exps] == [state_hash(["SF", "FG"], 0, 0), state_hash(["SF", "FG"], 0, 1)]


def test_reaching_goal_gives_reward_and_success_on_every_step():
    exps = run_episodes([lake(["SF", "FG"])], 1, scripted(["right", "down"]), max_steps=5)
    assert [e.reward for e in exps] == [0.0, 1.0]
    assert [e.metrics["success"] for e in exps] == [1.0, 1.0]
    assert exps[-1].info["last"] and exps[-1].info["terminated"]


def test_hole_ends_the_episode_without_success():
    exps = run_episodes([lake(["SH", "FG"])], 1, scripted(["right"]), max_steps=5)
    assert len(exps) == 1 and exps[0].reward == 0.0 and exps[0].metrics["success"] == 0.0


def test_max_steps_truncates():
    exps = run_episodes([lake(["SF", "FG"])], 2, scripted(["up"] * 3), max_steps=3)
    assert [e.eid.step for e in exps] == [0, 1, 2, 0, 1, 2]
    assert exps[2].info["truncated"] and exps[2].info["last"] and not exps[1].info["last"]


def test_invalid_action_keeps_state_and_is_flagged():
    exps = run_episodes([lake(["SF", "FG"])], 1, scripted(["Jump", "right", "down"]), max_steps=5)
    assert exps[0].info["invalid_action"] and exps[0].metrics["invalid_action"] == 1.0
    assert exps[0].info["env_state_hash"] == exps[1].info["env_state_hash"]
    assert [e.info["action"] for e in exps] == [None, "right", "down"]


def test_experience_fields():
    exps = run_episodes([lake(["SF", "FG"], "t1")], 2, scripted(["right"] * 5), max_steps=5, round_tag="b7", model_version=3)
    e = next(x for x in exps if x.eid.run == 1)
    assert (e.eid.task, e.eid.run, e.eid.step, e.eid.round_tag) == ("t1", 1, 0, "b7")
    assert (e.tokens, e.prompt_length, e.logprobs, e.response_text) == ([1, 2, 7], 2, [-0.5], "right")
    assert e.info["model_version"] == 3 and e.info["state_text"] == "P F\nF G"


def test_random_act_is_seeded():
    prompts = [[{"role": "user", "content": "x"}]] * 8
    a, b = random_act(3), random_act(3)
    assert [d["text"] for d in a(prompts, list(ACTIONS))] == [d["text"] for d in b(prompts, list(ACTIONS))]


def test_wrong_number_of_answers_is_refused():
    with pytest.raises(EnvError, match=r"act returned 1 answers for 2 prompts \(turn 0\)"):
        run_episodes([lake(["SF", "FG"])], 2, lambda p, c: [{"text": "left"}], max_steps=2)


def test_task_without_map_is_refused():
    with pytest.raises(EnvError, match=r"task 'x': meta\['desc'\]"):
        run_episodes([Task(task_id="x", prompt=[], answer="")], 1, random_act(0))


def test_rollout_feeds_gigpo():
    exps = run_episodes(make_tasks(4, seed=2), 4, random_act(1, invalid_prob=0.1), max_steps=8)
    out = gigpo_advantages(
        [e.eid.task for e in exps], [e.eid.run for e in exps], [e.eid.step for e in exps],
        [e.reward for e in exps], [e.info["env_state_hash"] for e in exps],
        invalid=[e.info["invalid_action"] for e in exps],
    )
    assert np.all(np.isfinite(out.advantages)) and out.advantages.shape == (len(exps),)


def test_engine_act_adapts_a_chat_choice_object():
    class Engine:
        def __init__(self):
            self.seeds = []

        def chat_choice(self, prompts, choices, temperature, seed):
            self.seeds.append((temperature, seed))
            return [{"text": choices[2], "token_ids": [5], "prompt_token_ids": [1], "logprobs": [-0.1]} for _ in prompts]

    eng = Engine()
    exps = run_episodes([lake(["SFF", "FFG", "FFF"])], 2, engine_act(eng, temperature=0.7, seed=10), max_steps=2)
    assert eng.seeds == [(0.7, 10), (0.7, 10 + 1_000_003)]
    assert [e.info["action"] for e in exps] == ["right"] * 4
