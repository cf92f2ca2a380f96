"""Sokoban multi-turn environment (orchestrator/envs/sokoban.py) and the GiGPO job on it."""

from __future__ import annotations

import numpy as np
import pytest

from algos.gigpo import GiGPOConfig, anchor_group_ids, gigpo_advantages
from orchestrator.anchors.state_hash import text_hash
from orchestrator.cli.service import load_yaml_model
from orchestrator.envs.sokoban import (
    EnvError,
    canonical_state,
    make_tasks,
    random_act,
    render_grid,
    run_episodes,
    task_from_grid,
)


def state_hash(layout, boxes, player):
    """The ``env_state_hash`` the environment writes for this room, boxes and player."""
    return text_hash(canonical_state(layout, boxes, player))

# a corridor: player, box, floor, target
CORRIDOR = ["#######", "#PX__O#", "#######"]
# an open 3x4 floor with the box against the right wall and its target above it
OPEN = ["######", "#P__O#", "#___X#", "#____#", "######"]


def by_run(paths):
    """A policy that answers paths[run][turn]; prompts arrive in (task, run) order of the live ones."""
    turn = [0]

    def act(prompts, choices):
        out = [{"text": paths[j][turn[0]], "token_ids": [7], "prompt_token_ids": [1], "logprobs": [-0.5]}
               for j in range(len(prompts))]
        turn[0] += 1
        return out

    return act


def test_same_state_reached_by_two_paths_hashes_equal():
    # run 0: right then down; run 1: down then right - both stand at (2, 2), box untouched
    exps = run_episodes([task_from_grid(OPEN)], 2, by_run([["right", "down", "up"], ["down", "right", "up"]]), max_steps=3)
    third = [e for e in exps if e.eid.step == 2]
    assert third[0].info["env_state_hash"] == third[1].info["env_state_hash"]
    assert third[0].info["env_state_hash"] == state_hash(["######", "#___O#", "#____#", "#____#", "######"], [(2, 4)], (2, 2))
    # the middle states differ (player at (1, 2) against (2, 1))
    second = [e for e in exps if e.eid.step == 1]
    assert second[0].info["env_state_hash"] != second[1].info["env_state_hash"]


def test_hash_depends_on_box_cells_not_their_order_nor_the_turn():
    layout = ["#######", "#____O#", "#___O_#", "#######"]
    a = state_hash(layout, [(1, 2), (2, 3)], (1, 1))
    # the value anchors, tests and GiGPO figures were computed with: sha1 of the canonical text
    assert canonical_state(layout, [(2, 3), (1, 2)], (1, 1)) == "\n".join(layout) + "|boxes=1,2;2,3|@1,1"
    assert a == "dc14d55d011f07c5feb88e7580d587ec62203381"
    assert a == state_hash(layout, [(2, 3), (1, 2)], (1, 1))
    assert a != state_hash(layout, [(1, 3), (2, 3)], (1, 1))  # one box one cell further
    assert a != state_hash(layout, [(1, 2), (2, 3)], (2, 1))  # player elsewhere


def test_pushing_a_box_into_a_wall_is_a_blocked_no_op():
    exps = run_episodes([task_from_grid(["######", "#_PX#O", "######"])], 1, by_run([["right", "right"]]), max_steps=2)
    assert [e.info["blocked"] for e in exps] == [True, True]
    assert exps[0].info["env_state_hash"] == exps[1].info["env_state_hash"]
    assert not exps[0].info["invalid_action"] and exps[0].info["action"] == "right"


def test_pushing_a_box_into_another_box_is_a_blocked_no_op():
    exps = run_episodes([task_from_grid(["########", "#PXX_OO#", "########"])], 1, by_run([["right", "right"]]), max_steps=2)
    assert exps[0].info["blocked"] and not exps[0].info["box_pushed"]
    assert exps[0].info["env_state_hash"] == exps[1].info["env_state_hash"]
    assert exps[1].info["state_text"] == "# # # # # # # #\n# P X X _ O O #\n# # # # # # # #"


def test_invalid_words_are_flagged_and_keep_the_state():
    exps = run_episodes([task_from_grid(CORRIDOR)], 1, by_run([["Jump", "[up]", " Right ", "up"]]), max_steps=4)
    assert [e.info["invalid_action"] for e in exps] == [True, True, False, False]
    assert [e.metrics["invalid_action"] for e in exps] == [1.0, 1.0, 0.0, 0.0]
    assert [e.info["action"] for e in exps] == [None, None, "right", "up"]
    assert exps[0].info["env_state_hash"] == exps[1].info["env_state_hash"] == exps[2].info["env_state_hash"]
    assert not exps[0].info["blocked"] and exps[3].info["blocked"]  # "up" walks into the wall


def test_solving_pays_one_and_ends_the_trajectory():
    # the box starts next to the player: three pushes right take it from col 2 onto the target at col 5
    exps = run_episodes([task_from_grid(CORRIDOR)], 1, by_run([["right"] * 5]), max_steps=5)
    assert [e.reward for e in exps] == [0.0, 0.0, 1.0]
    assert [e.info["box_pushed"] for e in exps] == [True, True, True]
    assert [e.metrics["success"] for e in exps] == [1.0, 1.0, 1.0]
    assert exps[-1].info["terminated"] and exps[-1].info["last"]


def test_turn_limit_pays_the_fraction_of_boxes_on_targets():
    # one of two boxes starts on its target; one push does not reach the other target
    exps = run_episodes([task_from_grid(["#######", "#PX_O*#", "#######"])], 1, by_run([["right"]]), max_steps=1)
    assert len(exps) == 1 and exps[0].reward == 0.5
    assert exps[0].info["truncated"] and exps[0].metrics["success"] == 0.0


def test_render_grid_is_plain_text():
    layout = ["#####", "#_OO#", "#####"]
    assert render_grid(layout, [(1, 2), (1, 3)], (1, 1)) == "# # # # #\n# P * * #\n# # # # #"
    assert render_grid(layout, [(1, 3)], (1, 2)) == "# # # # #\n# _ P * #\n# # # # #"


def test_first_states_form_one_anchor_group_of_size_n():
    tasks = make_tasks(3, seed=1)
    exps = run_episodes(tasks, 5, random_act(0), max_steps=6)
    ids, sizes = anchor_group_ids([e.eid.task for e in exps], [e.info["env_state_hash"] for e in exps])
    first = [i for i, e in enumerate(exps) if e.eid.step == 0]
    assert len(first) == 15
    for t in tasks:
        rows = [i for i in first if exps[i].eid.task == t.task_id]
        assert len(rows) == 5 and len({int(ids[i]) for i in rows}) == 1 and all(sizes[i] >= 5 for i in rows)
        assert exps[rows[0]].info["env_state_hash"] == state_hash(t.meta["layout"], t.meta["boxes"], t.meta["player"])


def test_make_tasks_skips_a_seed_that_repeats_a_room():
    # textarena's generator gives seeds 25 and 36 the same 6x6 one-box room (checked by hand)
    tasks = make_tasks(12, seed=25)
    seeds = [t.meta["room_seed"] for t in tasks]
    assert seeds == [*range(25, 36), 37]
    assert len({t.task_id for t in tasks}) == 12
    assert len({(tuple(t.meta["layout"]), str(t.meta["boxes"]), str(t.meta["player"])) for t in tasks}) == 12


def test_make_tasks_refuses_a_room_too_small_for_a_box():
    with pytest.raises(ValueError, match=r"size must be >= 5"):
        make_tasks(1, size=4)


def test_task_without_room_is_refused():
    from orchestrator.core.types import Task

    with pytest.raises(EnvError, match=r"task 'x': meta\['layout', 'boxes', 'player'\]"):
        run_episodes([Task(task_id="x", prompt=[], answer="")], 1, random_act(0))


def test_gigpo_job_on_sokoban_matches_the_pure_function():
    from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

    r = run_gigpo_job(GiGPOJobConfig(env="sokoban", tasks=4, n=4, max_steps=8, workers=2, seed=3, invalid_prob=0.1),
                      return_experiences=True)
    exps = r["experiences"]
    assert (r["env"], r["tasks"], r["trajectories"], r["steps"]) == ("sokoban", 4, 16, len(exps))
    assert all(e.eid.task.startswith("sokoban6x6b1-") for e in exps)
    pure = gigpo_advantages(
        np.array([e.eid.task for e in exps]), np.array([e.eid.run for e in exps]), np.array([e.eid.step for e in exps]),
        np.array([e.reward for e in exps]), np.array([e.info["env_state_hash"] for e in exps]),
        invalid=np.array([e.info["invalid_action"] for e in exps]), config=GiGPOConfig(),
    )
    assert np.allclose([e.info["advantage"] for e in exps], pure.advantages, rtol=0, atol=1e-9)


def test_sokoban_example_config_validates():
    from pathlib import Path

    from orchestrator.jobs.gigpo import GiGPOJobConfig

    cfg = load_yaml_model(Path(__file__).resolve().parents[2] / "examples/demo/gigpo_sokoban.yaml", GiGPOJobConfig)
    assert (cfg.env, cfg.room_size, cfg.num_boxes, cfg.max_steps) == ("sokoban", 6, 1, 15)


def test_cli_env_sokoban_runs_the_job_on_sokoban(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "trinity-dso"), "demo", "--algo", "gigpo", "--env", "sokoban",
         "--backend", "random", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollout: 8 sokoban tasks x 8 runs" in proc.stdout
    summary = json.loads((tmp_path / "gigpo.json").read_text())
    assert (summary["env"], summary["tasks"], summary["trajectories"]) == ("sokoban", 8, 64)
