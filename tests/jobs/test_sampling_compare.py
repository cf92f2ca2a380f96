"""``compare-sampling``: the task family's split, the summary figures by hand, the reference
loops' accounting, and a real two-arm smoke run (vLLM engine, orchestrator actor, trainer)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.core.screens import AnswerScreenOptions
from orchestrator.jobs.reference_loops import DapoRecipeLoop, TrinityDifficultyLoop
from orchestrator.jobs.sampling_compare import (
    ARMS,
    FAMILIES,
    arm_config,
    by_pass_table,
    paired_ratio,
    pass_costs,
    pass_costs_table,
    pass_windows,
    run_comparison,
    run_summary,
    table,
)
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedTasks
from orchestrator.train.tiny import mixed_tasks


def test_mixed_tasks_are_disjoint_and_share_the_mix():
    train, held, pool = mixed_tasks(families=["max1", "add2"], train_size=10, heldout_size=6, pool_size=20)
    ids = [set(train.task_ids), set(held.task_ids), set(pool.task_ids)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    fam = lambda ts: sorted(t.meta["family"] for t in ts)  # noqa: E731
    assert fam(train) == ["add2"] * 5 + ["max1"] * 5 and fam(held) == ["add2"] * 3 + ["max1"] * 3
    assert held.get(held.task_ids[0]).answer == str(max(*map(int, held.task_ids[0].split("-")[1:])))


def test_weighted_families_split_by_largest_remainder():
    train, held, pool = mixed_tasks(families={"copy3": 1, "max2": 2, "add3": 1}, train_size=10, heldout_size=6, pool_size=8)
    count = lambda ts, f: sum(t.meta["family"] == f for t in ts)  # noqa: E731
    # 10 * (1/4, 2/4, 1/4) = 2.5, 5, 2.5 -> remainders to the earlier family: 3, 5, 2
    assert [count(train, f) for f in ("copy3", "max2", "add3")] == [3, 5, 2]
    assert [count(held, f) for f in ("copy3", "max2", "add3")] == [2, 3, 1]  # 1.5, 3, 1.5
    assert [count(pool, f) for f in ("copy3", "max2", "add3")] == [2, 4, 2]


def test_copy_tasks_answer_their_prompt():
    train, _, _ = mixed_tasks(families=["copy3"], train_size=5, heldout_size=2)
    t = train.get(train.task_ids[0])
    assert t.answer == t.prompt[0]["content"] and t.task_id == f"copy3-{t.answer}"


def test_a_family_too_small_for_its_share_is_refused():
    with pytest.raises(ValueError, match="'max1' has 100 problems"):
        mixed_tasks(families=["max1"], train_size=90, heldout_size=20)


def test_an_evaluation_grid_out_of_order_is_refused_naming_the_field():
    from pydantic import ValidationError

    from orchestrator.jobs.dapo_train import DapoTrainConfig

    with pytest.raises(ValidationError, match="eval_at_rollouts must be strictly increasing, got \\[512, 256\\]"):
        DapoTrainConfig(eval_at_rollouts=[512, 256])


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="'mul2'"):
        mixed_tasks(families=["mul2"])


def test_every_arm_builds_a_valid_config(tmp_path):
    for arm in ARMS:
        cfg = arm_config(arm, 1, tmp_path)
        assert cfg.seed == 1 and cfg.task == "mix"
    screening = arm_config("screening", 0, tmp_path).policy
    assert (screening.screen, screening.mode_options("screen").rollouts) == ("rollouts", 2)
    assert arm_config("answer_screen", 0, tmp_path).policy.screen == "answer"


def test_the_arms_are_every_registered_selection_and_screen_and_the_reference_loops():
    from orchestrator.core.modes import MODES

    selections = {a: c["policy"]["selection"] for a, c in ARMS.items() if "selection" in c.get("policy", {})}
    screens = {a: c["policy"]["screen"] for a, c in ARMS.items() if "screen" in c.get("policy", {})}
    assert sorted(selections.values()) == sorted(set(MODES["selection"]) - {"epoch"}) and ARMS["epoch"] == {}
    assert sorted(screens.values()) == sorted(set(MODES["screen"]) - {"none"})
    assert list(ARMS) == ["epoch", "informative", "predicted_skip", "greso_prior", "pass_predictor", "screening", "answer_screen", "greso",
                          "trinity_difficulty", "dapo_recipe", "grpo"]


def test_the_cli_help_lists_every_arm_in_order():
    from orchestrator.cli.train import SAMPLING_ARMS

    assert [a.strip() for a in SAMPLING_ARMS.split(",")] == list(ARMS)


def ev(step: int, rollouts: int, acc: float, sampled: float | None = None, **more) -> dict:
    """An evaluation row: expected accuracy ``acc`` (the crossings' key) and avg@4 ``sampled`` (default: the same)."""
    return {"step": step, "rollouts": rollouts, "heldout_expected_acc": acc, "heldout_acc": acc if sampled is None else sampled, **more}


def test_summary_reads_the_first_crossing():
    # expected accuracy (the crossings' key) 0.30, 0.45, 0.52, 0.49; avg@4 0.31, 0.51, 0.48, 0.50
    evals = [ev(0, 0, 0.3, 0.31), ev(4, 400, 0.45, 0.51, train_wall_seconds=10.0),
             ev(8, 900, 0.52, 0.48, train_wall_seconds=21.0), ev(12, 1300, 0.49, 0.50, train_wall_seconds=30.0)]
    # 12 steps of 0.5 s rollouts + 0.25 s training + 0.2 s sync + 0.05 s verify = 1 s each
    steps = [{"step": i + 1, "rollout_seconds": 0.5, "train_seconds": 0.25, "sync_seconds": 0.2, "verify_seconds": 0.05}
             for i in range(12)]
    s = {"evals": evals, "steps": steps, "start_heldout_acc": 0.3, "end_heldout_acc": 0.49, "rollouts": 1300,
         "rollouts_per_emitted_group": 13.0, "wall_seconds": 40.0}
    r = run_summary(s, 0.2)  # target 0.3 + 0.2: first reached at step 8
    assert (r["to_target_rollouts"], r["to_target_seconds"], r["to_target_wall_seconds"], r["final"]) == (900, 8.0, 21.0, 0.49)
    # avg@4 (0.51 at step 4 would be a crossing by it) decides nothing; its start and end are kept
    assert (r["sampled_start"], r["sampled_final"]) == (0.31, 0.5)
    rows, md = table({"epoch": [r, {**r, "to_target_rollouts": 1100, "final": 0.51}],
                      "a": [{**r, "to_target_rollouts": 500, "to_target_seconds": 6.0}]}, 0.2)
    assert rows[0]["to_target_rollouts"]["mean"] == 1000 and rows[0]["to_target_rollouts"]["std"] == pytest.approx(141.42, abs=0.01)
    assert "| epoch | 2/2 | 1000 ± 141 | 1.00x | 8.0 ± 0.0 | 1.00x |" in md
    # "x epoch" pairs by seed: "a" ran seed 0 only, so 500 / 900 (not 500 / 1000, epoch's mean over both seeds)
    assert "| a | 1/1 | 500 ± 0 | 0.56x | 6.0 ± 0.0 | 0.75x |" in md


def test_summary_reads_where_the_crossing_falls():
    # 4 steps, each 5 groups of 4 classified, 2 dropped (3 informative), 2 new tasks trained per step
    steps = [{"step": i + 1, "rollouts": 20 * (i + 1), "groups_classified": 5, "dropped": {"all_correct": 1, "all_wrong": 1},
              "distinct_tasks_trained": 2 * (i + 1)} for i in range(4)]
    evals = [ev(0, 0, 0.3), ev(3, 60, 0.4), ev(4, 80, 0.41)]
    s = {"evals": evals, "steps": steps, "start_heldout_acc": 0.3, "end_heldout_acc": 0.41, "rollouts": 80,
         "rollouts_per_emitted_group": 80 / 12, "wall_seconds": 1.0, "config": {"train_size": 10, "policy": {"group_size": 4}}}
    r = run_summary(s, 0.1)  # crossed at step 3, after 60 rollouts: 1.5 passes over 10 tasks x 4
    assert (r["to_target_passes"], r["to_target_steps"]) == (1.5, 3)
    assert (r["to_target_informative_groups"], r["to_target_informative_rollouts"]) == (9, 36)  # 3 steps x 3 groups x 4
    assert (r["to_target_distinct_tasks"], r["distinct_tasks_trained"]) == (6, 8)
    _, md = table({"epoch": [r]}, 0.1)
    assert "| epoch | 1.50 ± 0.00 | 3.0 ± 0.0 | 9 ± 0 | 0.60x | 6 ± 0 | 8 ± 0 |" in md


def test_by_pass_table_gives_rollouts_per_informative_group_and_the_ratio_to_epoch():
    # windows of 10 tasks x 4 = 40 rollouts: epoch spends 40 for 5 informative groups in pass 1 (8.0),
    # the arm 40 for 8 (5.0, 0.62x); pass 2: 40 for 4 (10.0) against 40 for 2 (20.0, 2.00x)
    def run(seed, windows):
        return {"seed": seed, "by_pass": [{"rollouts": r, "informative": i} for r, i in windows]}
    md = "\n".join(by_pass_table({"epoch": [run(0, [(40, 5), (40, 4)])], "arm": [run(0, [(40, 8), (40, 2)])]}))
    assert "| epoch | 8.0 | 10.0 |" in md and "| arm | 5.0 (0.62x) | 20.0 (2.00x) |" in md


def test_a_ratio_to_an_epoch_mean_of_zero_is_left_blank():
    # gain 0: every arm reaches the target at step 0, after 0 rollouts and 0 loop seconds
    r = {"to_target_rollouts": 0, "to_target_seconds": 0.0, "to_target_wall_seconds": 0.0, "final": 0.3, "start": 0.3,
         "rollouts_per_emitted_group": 8.0, "trained_token_share": 1.0, "useful_token_share": 0.5}
    _, md = table({"epoch": [r], "a": [r]}, 0.0)
    assert "| a | 1/1 | 0 ± 0 | - | 0.0 ± 0.0 | - |" in md


def test_summary_reads_the_first_crossing_of_every_reported_gain():
    # start 0.3: +4 points at step 2, +6 at step 5, +8 at step 9; every step 1 s of loop time
    evals = [ev(0, 0, 0.3), ev(2, 200, 0.34), ev(5, 500, 0.36), ev(9, 900, 0.38)]
    steps = [{"step": i + 1, "rollout_seconds": 1.0} for i in range(9)]
    s = {"evals": evals, "steps": steps, "start_heldout_acc": 0.3, "end_heldout_acc": 0.38, "rollouts": 900,
         "rollouts_per_emitted_group": 10.0, "wall_seconds": 9.0}
    r = run_summary(s, 0.05)
    assert r["by_gain"] == {"0.03": {"to_target_rollouts": 200, "to_target_seconds": 2.0},
                            "0.05": {"to_target_rollouts": 500, "to_target_seconds": 5.0},
                            "0.07": {"to_target_rollouts": 900, "to_target_seconds": 9.0}}
    # an arm at half epoch's rollouts to +3 and +5 that never gains 7 points
    other = {**r, "by_gain": {"0.03": {"to_target_rollouts": 100}, "0.05": {"to_target_rollouts": 250},
                              "0.07": {"to_target_rollouts": None}}}
    _, md = table({"epoch": [r], "a": [other]}, 0.05)
    assert "| a | 0.50x [0.50, 0.50] (1), 1/1 | 0.50x [0.50, 0.50] (1), 1/1 | -, 0/1 |" in md


def test_paired_ratio_pairs_seeds_and_bounds_by_the_extreme_seeds():
    # seed 2 did not reach the target in the arm: it is left out of both means
    arm = [{"k": 500}, {"k": 900}, {"k": None}]
    base = [{"k": 1000}, {"k": 1000}, {"k": 800}]
    r = paired_ratio(arm, base, "k")
    assert (r["ratio"], r["n"], r["per_seed"]) == (pytest.approx(0.7), 2, [0.5, 0.9, None])
    # two seeds: a resample is both seed 0 (0.5), both seed 1 (0.9) or one of each (0.7), each pure case 1/4 of the time
    assert (r["low"], r["high"]) == (pytest.approx(0.5), pytest.approx(0.9))


def test_paired_ratio_pairs_by_the_runs_seeds_when_a_run_is_missing():
    # the arm's seed-1 run failed: its runs are seeds 0 and 2, epoch's 0, 1 and 2
    arm = [{"seed": 0, "k": 500}, {"seed": 2, "k": 400}]
    base = [{"seed": 0, "k": 1000}, {"seed": 1, "k": 300}, {"seed": 2, "k": 800}]
    r = paired_ratio(arm, base, "k")
    assert (r["ratio"], r["per_seed"]) == (pytest.approx(900 / 1800), [0.5, None, 0.5])


def test_paired_ratio_without_a_common_seed_is_none():
    assert paired_ratio([{"k": None}], [{"k": 100}], "k") is None


def test_the_paired_table_gives_the_interval_and_each_seed():
    runs = [{"to_target_rollouts": x, "to_target_seconds": 1.0, "final": 0.5, "start": 0.3, "rollouts_per_emitted_group": 8.0}
            for x in (1000, 1000)]
    _, md = table({"epoch": runs, "a": [{**runs[0], "to_target_rollouts": 500}, {**runs[1], "to_target_rollouts": 900}]}, 0.1)
    # runs without a seed (no config) are paired by position
    assert "| a | 0.70x [0.50, 0.90] (2) | 1.00x [1.00, 1.00] (2) | 0.50, 0.90 |" in md


def _bernoulli(rates):
    ids = [f"t{i}" for i in range(len(rates))]
    src = BernoulliRolloutSource(dict(zip(ids, rates)), seed=0)
    tasks = [ScriptedTasks(ids).get(t) for t in ids]
    for t in tasks:
        t.meta["family"] = "x"
    return src, tasks


def test_dapo_recipe_loop_truncates_and_counts_every_rollout():
    src, tasks = _bernoulli([0.5] * 10 + [1.0] * 10)
    loop = DapoRecipeLoop(src, tasks, target=4, n=4, gen_batch=4, seed=0)
    batch = loop.next_batch(0, 0)
    assert len(batch.groups) == 4 and all(g.reason == "informative" for g in batch.groups)
    assert loop.rollouts == loop.classified * 4 and loop.kept - loop.discarded == 4


def test_trinity_selector_prefers_tasks_near_half_once_it_has_feedback():
    src, tasks = _bernoulli([0.5] * 10 + [1.0] * 10)
    loop = TrinityDifficultyLoop(src, tasks, target=4, n=8, gen_batch=20, seed=0)
    loop.feedback(list(range(20)), np.array([[1, 0] * 4] * 10 + [[1] * 8] * 10, dtype=float))
    picks = loop.pick(8)
    assert sum(i < 10 for i in picks) >= 7


def _refuse(name: str):
    raise ValueError(f"train.json is not strict JSON: {name}")


@pytest.mark.slow
def test_two_arm_smoke_writes_the_comparison(tmp_path):
    # seed 1 alone (first_seed): runs, files and the per-seed lines are named by the seed
    out = run_comparison(tmp_path, seeds=1, first_seed=1, budget=512, arms=["epoch", "screening"], gain=0.0, spread=False)
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert [r["arm"] for r in data["rows"]] == ["epoch", "screening"]
    assert all(r["reached"] == 1 for r in data["rows"])  # gain 0: reached at the start
    assert (tmp_path / "comparison.png").stat().st_size > 0 and "| epoch |" in out["markdown"]
    assert "- epoch: s1: 0;" in out["markdown"] and data["rows"][0]["per_seed"][0]["seed"] == 1
    screening = json.loads((tmp_path / "screening-s1" / "train.json").read_text(), parse_constant=_refuse)  # strict JSON
    assert screening["stats"]["screens"] > 0
    # what each step learned from: informative groups (1 to 7 correct of 8) by family and by correct rollouts
    steps = json.loads((tmp_path / "epoch-s1" / "train.json").read_text())["steps"]
    fams = [n for s in steps for n in s["informative_by_family"].values()]
    correct = {k: n for s in steps for k, n in s["informative_by_correct"].items()}
    assert sum(fams) == sum(n for s in steps for n in s["informative_by_correct"].values()) > 0
    assert set(correct) <= {str(k) for k in range(1, 8)} and {k for s in steps for k in s["informative_by_family"]} <= set(FAMILIES)
    # every evaluation gives the expected accuracy; at the start it is avg@4's expectation: within 4
    # standard errors of avg@4 (at most sqrt(0.25 / (4 x 300)) = 0.0144 on the 300 held-out tasks)
    evals = json.loads((tmp_path / "epoch-s1" / "train.json").read_text())["evals"]
    assert all(0.0 <= e["heldout_expected_acc"] <= 1.0 for e in evals)
    assert "heldout_acc" in evals[-1] and not any("heldout_acc" in e for e in evals[1:-1])  # avg@4 at the ends only
    assert abs(evals[0]["heldout_expected_acc"] - evals[0]["heldout_acc"]) < 4 * 0.0144


def test_pass_costs_count_rollouts_per_informative_group_by_hand():
    # task 0: earlier group mixed; its group mixed, but its screen (first 2) all correct
    # task 1: earlier group and group all correct; task 2: earlier mixed, group and screen mixed
    a = [1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    b = [1] * 16
    c = [1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1]
    out = pass_costs(np.array([a, b, c], dtype=bool), np.array(["f", "f", "f"]), n=8, k=2)
    assert out["full"]["rollouts_per_informative"] == 24 / 2
    assert out["screen"]["rollouts_per_informative"] == (2 + 2 + 8) / 1
    assert out["family_skip_screen"]["rollouts_per_informative"] == 12.0  # the family's earlier groups: 2 of 3 informative
    assert out["history_skip"]["rollouts_per_informative"] == 16 / 2  # tasks 0 and 2 rolled, both informative
    assert out["history_skip"]["x_full"] == 8 / 12


def test_pass_costs_skip_a_family_whose_earlier_groups_were_never_informative():
    mixed = [1, 0] * 8
    out = pass_costs(np.array([mixed, [0] * 16], dtype=bool), np.array(["f", "z"]), n=8, k=2)
    assert out["screen"]["rollouts_per_informative"] == (8 + 2) / 1
    assert out["family_skip_screen"]["rollouts_per_informative"] == 8 / 1


def test_pass_costs_refuse_outcomes_that_are_not_two_groups_per_task():
    with pytest.raises(ValueError, match=r"outcomes: expected shape \(tasks, 16\), got \(2, 8\)"):
        pass_costs(np.zeros((2, 8), dtype=bool), np.array(["f", "f"]), n=8)


def test_pass_costs_table_gives_mean_and_std_over_seeds():
    per_seed = {"0": {"full": {"rollouts_per_informative": 18.0, "x_full": 1.0}, "history_skip": {"rollouts_per_informative": 10.0, "x_full": 0.5}},
                "1": {"full": {"rollouts_per_informative": 20.0, "x_full": 1.0}, "history_skip": {"rollouts_per_informative": 12.0, "x_full": 0.7}}}
    md = pass_costs_table(per_seed)
    assert "| full | 19.0 ± 1.4 | 1.00 ± 0.00 |" in md  # stdev of 18, 20: sqrt(2) = 1.41
    assert "| history_skip | 11.0 ± 1.4 | 0.60 ± 0.14 |" in md


def test_pass_windows_count_rollouts_and_informative_groups_by_hand():
    # window 100: step 1 (0 -> 60: 5 groups, 2 dropped) and step 2 (60 -> 130: 4, 1 dropped) start in
    # window 0; step 3 (130 -> 250: 6, 6 dropped) in window 1; step 4 (250 -> 400: 3, 0 dropped) starts
    # in window 2, past the last of 2 windows: it counts in the last
    steps = [{"rollouts": 60, "groups_classified": 5, "dropped": {"all_correct": 2}},
             {"rollouts": 130, "groups_classified": 4, "dropped": {"all_wrong": 1}},
             {"rollouts": 250, "groups_classified": 6, "dropped": {"all_correct": 4, "all_wrong": 2}},
             {"rollouts": 400, "groups_classified": 3, "dropped": {}}]
    assert pass_windows(steps, 100, count=2) == [{"rollouts": 130, "informative": 6}, {"rollouts": 270, "informative": 3}]


def test_pass_costs_of_the_answer_screen_by_hand():
    # answer probabilities 1, 0.5, 0.95 (n = 8): I = 0, 0.992, 0.3366 -> keep (I / 0.5) ** 4 with
    # floor 0 (the policy's defaults): 0, 1, 0.2053; groups: task 0 all correct, tasks 1 and 2
    # mixed. Expected cost (0 + 1 + 0.2053) x 8 over expected informative groups 1 + 0.2053
    mixed = [1, 0] * 8
    out = pass_costs(np.array([[1] * 16, mixed, mixed], dtype=bool), np.array(["f", "f", "f"]), n=8, k=2,
                     answer_prob=np.array([1.0, 0.5, 0.95]))
    keep2 = 0.205339
    assert out["answer_screen"]["rollouts_per_informative"] == pytest.approx((1 + keep2) * 8 / (1 + keep2), rel=1e-5)
    assert out["answer_screen"]["x_full"] == pytest.approx(8 / 12, rel=1e-5)


def test_pass_costs_of_the_answer_screen_with_the_proportional_rule_by_hand():
    # answer keep_at 0.5, floor 0.05, keep_power 1: keep 0.05, 1, 0.6732 -> cost (0.05 + 1 + 0.6732) x 8 over 1 + 0.6732
    mixed = [1, 0] * 8
    out = pass_costs(np.array([[1] * 16, mixed, mixed], dtype=bool), np.array(["f", "f", "f"]), n=8, k=2,
                     answer_prob=np.array([1.0, 0.5, 0.95]),
                     answer=AnswerScreenOptions(keep_at=0.5, floor=0.05, keep_power=1.0))
    keep2 = 0.673159
    assert out["answer_screen"]["rollouts_per_informative"] == pytest.approx((0.05 + 1 + keep2) * 8 / (1 + keep2), rel=1e-5)
