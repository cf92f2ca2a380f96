"""The GiGPO comparison: its settings and arms, its measures on hand-made runs, and a short
end-to-end smoke of the Sokoban setting through the real engine, orchestrator actors and trainer."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer

from orchestrator.envs import sokoban
from orchestrator.jobs import gigpo_compare
from orchestrator.jobs.gigpo_compare import ARMS, SETTINGS, _quarters, arm_config, run_comparison, separation
from orchestrator.train.tiny import SOKOBAN_ACTIONS, SOKOBAN_CHARS, SOKOBAN_TEMPLATE, build_tiny_llama


def test_the_sokoban_policy_sees_the_room_as_one_row_string(tmp_path):
    tok = AutoTokenizer.from_pretrained(build_tiny_llama(tmp_path, chars=SOKOBAN_CHARS, chat_template=SOKOBAN_TEMPLATE))
    task = sokoban.task_from_grid(["#####", "#P_##", "#_X_#", "#__O#", "#####"])
    text = tok.apply_chat_template(task.prompt, tokenize=False, add_generation_prompt=True)
    assert text == "#####|#P_##|#_X_#|#__O#|#####="
    assert tok.unk_token_id not in tok.apply_chat_template(task.prompt, tokenize=True, add_generation_prompt=True)
    assert [tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(a)) for a in SOKOBAN_ACTIONS] == list(SOKOBAN_ACTIONS)


def test_the_sokoban_setting_changes_the_environment_and_keeps_each_arms_change(tmp_path):
    base = arm_config("gigpo", 3, tmp_path, setting="sokoban")
    assert (base.env, base.room_size, base.max_turns, base.train_maps, base.n) == ("sokoban", 6, 20, 4, 8)
    assert base.rollout_budget == SETTINGS["sokoban"]["budget"] and base.seed == 3 and base.trainer.seed == 3
    assert base.gigpo.omega == 1.0 and base.gigpo.norm == "std" and base.advantage == "gigpo"
    assert arm_config("omega0", 3, tmp_path, setting="sokoban").gigpo.omega == 0.0
    assert arm_config("multi_step_grpo", 3, tmp_path, setting="sokoban").advantage == "multi_step_grpo"
    assert arm_config("gigpo_norm_none", 3, tmp_path, setting="sokoban").gigpo.norm == "none"
    assert arm_config("gigpo", 0, tmp_path).env == "frozenlake"  # the default setting is unchanged
    assert SETTINGS["sokoban"]["seeds"] >= 5


def test_quarters_average_the_steps_that_fall_in_each_quarter_of_the_budget():
    steps = [{"trajectories": t, "x": x} for t, x in ((32, 0.0), (64, 1.0), (96, 0.5), (128, 0.25))]
    got = _quarters(steps, "x", 128)
    assert got == [0.0, 1.0, 0.5, 0.25]
    first, *rest = _quarters(steps[:2], "x", 256)  # both steps in the first quarter; none in the others
    assert first == 0.5 and all(math.isnan(x) for x in rest) and len(rest) == 3


def _row(arm, trains):
    import statistics

    return {"arm": arm, "runs": [{"seed": s, "train": x} for s, x in enumerate(trains)],
            "train": {"mean": statistics.fmean(trains), "std": statistics.stdev(trains)}}


def test_separation_compares_the_difference_of_means_with_the_larger_seed_std():
    rows = [_row("gigpo", [0.6, 0.7, 0.8]), _row("omega0", [0.2, 0.3, 0.4]), _row("multi_step_grpo", [0.5, 0.8, 0.5])]
    by = {s["arm"]: s for s in separation(rows)}
    # gigpo mean 0.7, std 0.1; omega0 mean 0.3, std 0.1: difference 0.4 > 0.1
    assert by["omega0"]["diff"] == pytest.approx(0.4) and by["omega0"]["spread"] == pytest.approx(0.1)
    assert by["omega0"]["separated"] and by["omega0"]["paired_mean"] == pytest.approx(0.4) and by["omega0"]["paired_std"] == pytest.approx(0.0)
    # multi_step_grpo mean 0.6, std sqrt(0.03) = 0.1732: difference 0.1 < 0.1732
    assert by["multi_step_grpo"]["diff"] == pytest.approx(0.1)
    assert by["multi_step_grpo"]["spread"] == pytest.approx(0.03**0.5) and not by["multi_step_grpo"]["separated"]
    # per-seed differences 0.1, -0.1, 0.3: mean 0.1, std 0.2
    assert by["multi_step_grpo"]["paired_mean"] == pytest.approx(0.1) and by["multi_step_grpo"]["paired_std"] == pytest.approx(0.2)
    assert "gigpo" not in by


@pytest.mark.slow
def test_a_short_sokoban_comparison_runs_every_arm_on_one_shared_engine(tmp_path, monkeypatch, ray_local):
    # one 2-room x 2-run step of at most 4 turns per arm and seed, the warm start kept short
    monkeypatch.setenv("TRINITY_DSO_CACHE", str(tmp_path / "cache"))
    small = {**SETTINGS["sokoban"]["changes"], "train_maps": 2, "heldout_maps": 2, "n": 2, "max_turns": 4, "eval_runs": 1,
             "warm_steps": 2}
    monkeypatch.setitem(gigpo_compare.SETTINGS, "sokoban", {**SETTINGS["sokoban"], "changes": small})
    result = run_comparison(tmp_path / "cmp", seeds=1, budget=4, setting="sokoban")
    assert [r["arm"] for r in result["rows"]] == list(ARMS)
    for r in result["rows"]:
        (run,) = r["runs"]
        assert run["trajectories"] == 4
        # the 2 runs of a room share at least their first state: >= 2 of the step's steps are in a group of 2
        assert 0 < run["start_anchor_fraction"] <= 1 and run["wall_seconds"] > 0
    assert {s["arm"] for s in result["separation"]} == set(ARMS) - {"gigpo"}
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["setting"] == "sokoban" and len(saved["rows"]) == len(ARMS)
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 0
    assert "| gigpo |" in (tmp_path / "cmp" / "comparison.md").read_text()
