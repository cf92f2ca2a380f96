"""``compare-sampling-trinity``'s arithmetic: the evaluation grid, settled crossings, ratios to ``epoch``."""

import pytest

from orchestrator.jobs.trinity_compare import crossing, eval_grid, ratios


def ev(rollouts, acc, seconds=None):
    return {"rollouts": rollouts, "acc": acc, "train_wall_seconds": float(rollouts if seconds is None else seconds)}


def test_the_grid_holds_the_regimes_grid_and_every_pass_end():
    # the regime's grid up to the budget, and each pass's end (500 x k)
    assert eval_grid([256, 512, 768, 2048, 4096], 2000, 500) == [256, 500, 512, 768, 1000, 1500, 2000]


def test_a_single_evaluation_above_the_target_does_not_cross():
    # start 0.50, target +0.05 = 0.55: the lone 0.60 at 200 averages (0.60 + 0.50 + 0.50) / 3 < 0.55
    evals = [ev(0, 0.50), ev(100, 0.52), ev(200, 0.60), ev(300, 0.50), ev(400, 0.50)]
    assert crossing(evals, 0.05, "acc", 3) is None
    assert crossing(evals, 0.05, "acc", 1) == {"rollouts": 200, "seconds": 200.0, "eval": 2}  # one evaluation decides


def test_the_crossing_is_the_first_evaluation_whose_window_mean_reaches_the_target():
    # window means after the start: (0.52+0.60+0.50)/3 = 0.54, (0.60+0.50+0.58)/3 = 0.56: from rollouts 200
    evals = [ev(0, 0.50), ev(100, 0.52), ev(200, 0.60), ev(300, 0.50), ev(400, 0.58), ev(500, 0.60)]
    assert crossing(evals, 0.05, "acc", 3) == {"rollouts": 200, "seconds": 200.0, "eval": 2}


def test_the_step0_evaluation_never_crosses():
    # the start itself is not a crossing, even with a gain of 0
    evals = [ev(0, 0.50), ev(100, 0.40), ev(200, 0.50)]
    assert crossing(evals, 0.0, "acc", 1) == {"rollouts": 200, "seconds": 200.0, "eval": 2}


def test_ratios_to_epoch_are_per_seed_where_both_reached():
    results = {"epoch": {0: {"late": 1000}, 1: {"late": 2000}, 2: {"late": None}},
               "pass_predictor": {0: {"late": 500}, 1: {"late": 1500}, 2: {"late": 700}}}
    r = ratios(results, "late")
    assert r["pass_predictor"]["per_seed"] == {"0": 0.5, "1": 0.75}
    assert r["pass_predictor"]["mean"] == pytest.approx(0.625)
    assert r["epoch"]["mean"] == 1.0
