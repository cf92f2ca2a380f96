"""``compare-sampling-trinity``, short: ``epoch`` and ``pass_predictor`` inside Trinity-RFT 0.6.0's explorer.

One module fixture runs the comparison once (reasoning regime, 1 seed, 512 rollouts per arm) with
the session's Ray and Ray Serve. Each test checks one promise: the predictor ran beside Trinity's explorer with the
prompts of Trinity's taskset, and ``comparison.json`` holds what anyone needs to recompute the ratios.
Here (not in tests/jobs/) because tests/trinity/conftest.py sets the environment Trinity's workers need.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

BUDGET = 512


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, ray_local, serve_http):
    from orchestrator.jobs.trinity_compare import run_comparison

    out = tmp_path_factory.mktemp("trinity-compare")
    data = run_comparison(out, seeds=1, budget=BUDGET, regime="reasoning", serve_url=serve_http, log=print)
    return {"data": data, "file": json.loads((out / "comparison.json").read_text()), "md": (out / "comparison.md").read_text()}


def test_both_arms_ran_their_budget_inside_trinitys_explorer(comparison):
    arms = comparison["file"]["arms"]
    assert list(arms) == ["epoch", "pass_predictor"] and comparison["file"]["route"] == "trinity"
    for arm in arms.values():
        run = arm["runs"]["0"]
        # Trinity's explore steps hand out the budget (8 steps of 8 tasks x 8); the selector asks one
        # step ahead, so the last may stay unrolled; the trainer's last batch read counts no more
        assert BUDGET - 64 <= run["rollouts_total"] <= BUDGET
        assert 0 < run["final_rollouts"] <= run["rollouts_total"]


def test_the_predictor_learned_from_the_groups_with_the_prompts_of_trinitys_taskset(comparison):
    run = comparison["file"]["arms"]["pass_predictor"]["runs"]["0"]
    assert run["prompts_from_taskset"] == comparison["file"]["train_size"]  # the selector read Trinity's prompt column
    assert run["predictions_scored"] >= 8  # at least one batch of groups scored before it was learned from
    assert comparison["file"]["arms"]["epoch"]["runs"]["0"]["predictions_scored"] is None  # epoch has no model


def test_comparison_json_records_regime_route_flags_and_late_crossings_per_seed(comparison):
    f = comparison["file"]
    assert f["regime"] == "reasoning" and f["accuracy"] == "heldout_acc"
    for arm in f["arms"].values():
        assert any("trinity" in k and v is True for k, v in arm.items())
        assert "0" in arm["late_rollouts_per_seed"]
    assert "pass_predictor" in f["late_rollouts_ratio_vs_epoch"]
    assert "| pass_predictor | 0 |" in comparison["md"]
