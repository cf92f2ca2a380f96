"""The reasoning regime of ``compare-sampling``: its tasks, the crossings a noisy evaluation cannot
decide, accuracy at each pass's end, tasks left out and coming back, the Trinity-route mark."""

import random

import pytest

from orchestrator.jobs.sampling_compare import (
    REASONING,
    arm_config,
    base_config,
    pass_end_evals,
    run_summary,
    runs_on_trinity,
    settled_crossing,
    task_returns,
)
from orchestrator.tasks.scoring import score_response
from orchestrator.train.tiny import REASONING_CHARS, encode, mixed_tasks, reference_response, sample_reasoning


def test_reasoning_tasks_are_the_same_problems_scored_on_the_final_answer():
    exact, _, _ = mixed_tasks(families={"copy3": 1, "max2": 2, "add3": 1}, train_size=8, heldout_size=4)
    reason, _, _ = mixed_tasks(families={"copy3": 1, "max2": 2, "add3": 1}, train_size=8, heldout_size=4, reasoning=True)
    assert exact.task_ids == reason.task_ids
    t = reason.get(next(i for i in reason.task_ids if i.startswith("add3")))
    a, b = t.meta["a"], t.meta["b"]
    assert t.meta["format"] == "final_number" and t.meta["reference_response"] == f"{a},{b}#{a + b}"
    assert score_response(t, t.meta["reference_response"])[0] == 1.0


def test_copy_reasoning_lists_the_digits_in_some_order():
    train, _, _ = mixed_tasks(families=["copy3"], train_size=30, heldout_size=2, reasoning=True)
    t = next(t for t in train if len(set(t.answer)) == 3 and t.answer[0] != "0")
    forms = {sample_reasoning(t, random.Random(i)) for i in range(200)}
    # 3 distinct digits: 3! = 6 orders, each followed by '#' and the number
    assert len(forms) == 6 and all(sorted(f.split("#")[0].split(",")) == sorted(t.answer) for f in forms)
    assert all(f.endswith("#" + t.answer) for f in forms)


def test_add_reasoning_has_eight_forms_all_scored_correct():
    t = mixed_tasks(families=["add2"], train_size=200, heldout_size=2, reasoning=True)[0]
    t = next(x for x in t if x.meta["a"] == 12 and x.meta["b"] == 34) if any(
        x.meta["a"] == 12 and x.meta["b"] == 34 for x in t) else next(x for x in t if len({str(x.meta["a"]), str(x.meta["a"])[::-1],
                                                                                          str(x.meta["b"]), str(x.meta["b"])[::-1]}) == 4)
    forms = {sample_reasoning(t, random.Random(i)) for i in range(400)}
    assert len(forms) == 8  # 2 orders x forwards/reversed for each operand
    assert all(score_response(t, f)[0] == 1.0 for f in forms)
    assert reference_response(t) in forms


def test_the_reasoning_vocabulary_has_the_mark_and_keeps_the_exact_one():
    assert REASONING_CHARS[-1] == "#" and encode("12#3", REASONING_CHARS)[2] == 3 + len(REASONING_CHARS) - 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        encode("12#3")


def test_reasoning_config_makes_at_least_ten_passes_and_samples_every_evaluation(tmp_path):
    cfg = base_config(tmp_path, 0, regime="reasoning")
    assert cfg.rollout_budget >= 10 * cfg.train_size * cfg.policy.group_size
    assert cfg.regime == "reasoning" and cfg.eval_samples_between == REASONING["eval_samples"] > 0


def test_an_unknown_regime_is_refused(tmp_path):
    with pytest.raises(ValueError, match="regime must be one of"):
        base_config(tmp_path, 0, regime="cot")


def test_settled_crossing_needs_the_mean_of_three_evaluations():
    evals = [{"a": x} for x in (0.50, 0.56, 0.50, 0.53, 0.55, 0.56, 0.52)]
    assert settled_crossing(evals, "a", 0.55) == 1  # one evaluation: the lone 0.56
    # windows: 0.52, 0.53, 0.5267, 0.5467, 0.5433: never 0.55 over three
    assert settled_crossing(evals, "a", 0.55, window=3) is None
    assert settled_crossing(evals, "a", 0.545, window=3) == 3  # (0.53 + 0.55 + 0.56) / 3 = 0.5467


def test_pass_end_evals_take_the_first_evaluation_at_or_past_each_pass():
    evals = [{"rollouts": r} for r in (0, 400, 770, 1150, 1540, 1600)]
    ends = pass_end_evals(evals, 768)
    assert [(e["pass"], e["evaluation"]) for e in ends] == [(1, 2), (2, 4), (3, 5)]
    # a batch spanning two passes' ends: both passes read the evaluation after it
    evals = [{"rollouts": r} for r in (0, 500, 1700)]
    assert [(e["pass"], e["evaluation"]) for e in pass_end_evals(evals, 768)] == [(1, 2), (2, 2), (3, 2)]
    # a budget of 2 passes: the last batch's overshoot into a third adds no pass
    assert [e["pass"] for e in pass_end_evals(evals, 768, passes=2)] == [1, 2]


def test_task_returns_count_left_out_tasks_and_their_return():
    # 2 max2 tasks, 3 pass-sized windows: task a rolled in every window; task b in the first, left
    # out of the second, back in the third
    evals = [{"rollouts": 0, "task_groups": [0, 0]}, {"rollouts": 16, "task_groups": [1, 1]},
             {"rollouts": 32, "task_groups": [2, 1]}, {"rollouts": 48, "task_groups": [3, 2]}]
    out = task_returns(evals, ["max2-1-2", "max2-3-4"], 16)
    assert out == {"max2": {"rolled_share": [1.0, 0.5, 1.0], "left_out": 1, "came_back": 1.0, "never_after_first": 0.0}}


def test_summary_reads_the_late_target_and_accuracy_at_each_pass_end():
    accs = [0.40, 0.43, 0.47, 0.46, 0.49, 0.50, 0.52]
    evals = [{"step": i, "rollouts": 8 * i, "heldout_acc": a, "heldout_acc_by_family": {"max2": a}} for i, a in enumerate(accs)]
    steps = [{"rollouts": 8 * (i + 1), "rollout_seconds": 1.0, "train_seconds": 1.0, "groups_classified": 1, "dropped": {}}
             for i in range(6)]
    s = {"evals": evals, "steps": steps, "rollouts": 48, "rollouts_per_emitted_group": 8.0, "wall_seconds": 1.0,
         "config": {"train_size": 2, "rollout_budget": 48, "seed": 3, "policy": {"group_size": 8}}}
    r = run_summary(s, 0.05, "heldout_acc", late_gain=0.08, window=3)
    # +5 (0.45): evals 0-2 average 0.4333, evals 1-3 0.4533: at eval 1; late +8 (0.48): evals 2-4
    # average 0.4733, evals 3-5 0.4833: at eval 3
    assert (r["to_target_rollouts"], r["to_late_rollouts"]) == (8, 24)
    assert r["to_late_seconds"] == 6.0  # three steps of 2 s
    assert r["heldout_at_pass_end"] == [0.47, 0.49, 0.52]  # every 16 rollouts
    assert r["heldout_by_family_at_pass_end"] == {"max2": [0.47, 0.49, 0.52]}


def test_only_screens_and_the_recipe_loop_are_off_the_trinity_route(tmp_path):
    on = {a: runs_on_trinity(arm_config(a, 0, tmp_path)) for a in ("epoch", "greso", "predicted_skip", "screening",
                                                                     "answer_screen", "dapo_recipe", "trinity_difficulty")}
    assert on == {"epoch": True, "greso": True, "predicted_skip": True, "screening": False, "answer_screen": False,
                  "dapo_recipe": False, "trinity_difficulty": True}


@pytest.mark.slow
def test_reasoning_smoke_writes_the_comparison(tmp_path):
    import json

    from orchestrator.jobs.sampling_compare import run_comparison

    out = run_comparison(tmp_path, seeds=1, budget=256, arms=["epoch", "greso"], gain=0.0, spread=False, regime="reasoning")
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert data["regime"] == "reasoning" and data["on_trinity"] == {"epoch": True, "greso": True}
    assert all(r["on_trinity"] is True for r in data["rows"])
    assert all("to_late_rollouts" in x for r in data["rows"] for x in r["per_seed"])
    run = json.loads((tmp_path / "epoch-s0" / "train.json").read_text())
    assert all("heldout_acc" in e and "heldout_expected_acc" not in e for e in run["evals"])  # sampled accuracy
    assert "Late target" in out["markdown"]


def test_cli_refuses_an_unknown_regime_naming_the_option():
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    res = CliRunner().invoke(app, ["compare-sampling", "--regime", "chain", "--seeds", "1"])
    assert res.exit_code == 2 and "--regime" in res.output and "'chain'" in res.output


def test_late_gain_is_a_share_of_the_mean_final_gain_over_three_evaluations():
    from orchestrator.jobs.sampling_compare import late_gain

    a = {"evals": [{"heldout_acc": x} for x in (0.50, 0.55, 0.58, 0.60, 0.62)]}  # last three 0.60: +0.10
    b = {"evals": [{"heldout_acc": x} for x in (0.40, 0.45, 0.42, 0.44, 0.46)]}  # last three 0.44: +0.04
    assert late_gain([a, b]) == pytest.approx(0.8 * 0.07)
    with pytest.raises(ValueError, match="at least one"):
        late_gain([])


def test_task_returns_give_windows_sharing_an_evaluation_the_same_rollouts():
    # one batch spans the ends of passes 2 and 3: both windows take what it rolled
    evals = [{"rollouts": 0, "task_groups": [0, 0]}, {"rollouts": 16, "task_groups": [1, 1]},
             {"rollouts": 48, "task_groups": [3, 1]}]
    out = task_returns(evals, ["max2-1-2", "max2-3-4"], 16)
    assert out["max2"]["rolled_share"] == [1.0, 0.5, 0.5] and out["max2"]["left_out"] == 2
