"""``compare-sampling-trinity``'s arithmetic: the evaluation grid, settled crossings, ratios to ``epoch``."""

import pytest

from orchestrator.jobs.trinity_compare import crossing, eval_grid, ratios


def ev(rollouts, acc, seconds=None):
    return {"rollouts": rollouts, "acc": acc, "train_wall_seconds": float(rollouts if seconds is None else seconds)}


def test_the_grid_holds_every_step_and_every_pass_end():
    # every 384 rollouts and each pass's end (768 x k), to 2,000
    assert eval_grid(2000, 768, 384) == [384, 768, 1152, 1536, 1920]
    assert eval_grid(2000, 500, 768) == [500, 768, 1000, 1500, 1536, 2000]


def test_a_single_evaluation_above_the_target_does_not_cross():
    # start 0.50, target +0.05 = 0.55: the lone 0.60 at 200 averages (0.60 + 0.50 + 0.50) / 3 < 0.55
    evals = [ev(0, 0.50), ev(100, 0.52), ev(200, 0.60), ev(300, 0.50), ev(400, 0.50)]
    assert crossing(evals, 0.05, "acc") is None


def test_the_crossing_is_the_first_evaluation_from_which_the_window_mean_stays_above():
    # window means from index 1: (0.52+0.60+0.50)/3 = 0.54, (0.60+0.50+0.58)/3 = 0.56, (0.50+0.58+0.60)/3 = 0.56,
    # (0.58+0.60)/2 = 0.59, 0.60: the means stay >= 0.55 from index 2 (rollouts 200)
    evals = [ev(0, 0.50), ev(100, 0.52), ev(200, 0.60), ev(300, 0.50), ev(400, 0.58), ev(500, 0.60)]
    assert crossing(evals, 0.05, "acc") == {"rollouts": 200, "seconds": 200.0, "eval": 2}


def test_a_crossing_lost_later_does_not_count():
    # means at 100 and 200 reach 0.56, then the run falls back: (0.50 + 0.50) / 2 < 0.55
    evals = [ev(0, 0.50), ev(100, 0.58), ev(200, 0.60), ev(300, 0.50), ev(400, 0.50)]
    assert crossing(evals, 0.05, "acc") is None


def test_ratios_to_epoch_are_per_seed_where_both_reached():
    results = {"epoch": {0: {"late": 1000}, 1: {"late": 2000}, 2: {"late": None}},
               "pass_predictor": {0: {"late": 500}, 1: {"late": 1500}, 2: {"late": 700}}}
    r = ratios(results, "late")
    assert r["pass_predictor"]["per_seed"] == {"0": 0.5, "1": 0.75}
    assert r["pass_predictor"]["mean"] == pytest.approx(0.625)
    assert r["epoch"]["mean"] == 1.0
