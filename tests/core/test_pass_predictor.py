"""``pass_predictor``: a pass-rate model shared over all tasks' prompts, the epoch order, a bounded skip age."""

import json
import zlib

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.pass_predictor import PassPredictorSelection, fit_logistic, prompt_features
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.selection import SELECTIONS, SelectionContext
from orchestrator.core.types import Experience, ExperienceId, Group


def group(task, rewards, version=0):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r, info={"model_version": version})
                                         for i, r in enumerate(rewards)])


def ctx(n, **kw):
    return SelectionContext(skip_until_epoch=np.zeros(n, dtype=np.int64), informative=np.zeros(n), **kw)


def policy(**opts):
    return ResamplingPolicy.parse({"selection": "pass_predictor", "selection_options": opts, "target_groups": 2, "group_size": 4})


def configure(sel, p):
    sel.configure(p, p.mode_options("selection"))


def test_the_mode_is_registered():
    assert SELECTIONS["pass_predictor"] is PassPredictorSelection


def test_features_are_the_unit_normalised_counts_of_hashed_ngrams():
    indptr, indices, values = prompt_features(["ab", ""])
    # "ab": 1-grams a, b, the 2-gram ab (no 3-gram, no shape n-gram of length 3 or 5) and the whole
    # shape "$ab": 4 buckets of 1 / sqrt(4); "": its whole shape "$" alone, one bucket of 1
    want = sorted(zlib.crc32(g.encode()) % 1024 for g in ("a", "b", "ab", "$ab"))
    assert indptr.tolist() == [0, 4, 5]
    assert indices.tolist() == [*want, zlib.crc32(b"$") % 1024]
    np.testing.assert_allclose(values, [0.5] * 4 + [1.0])


def test_a_digit_shape_ngram_is_shared_by_prompts_with_other_numbers():
    (_, a, _), (_, b, _) = prompt_features(["12+34"]), prompt_features(["56+78"])
    shape = {zlib.crc32(g.encode()) % 1024 for g in ("#00+", "#0+0", "#+00", "#00+00")}
    assert shape <= set(a.tolist()) and shape <= set(b.tolist())


def test_the_fit_of_the_bias_alone_reaches_the_pooled_log_odds():
    X = (np.array([0, 0, 0]), np.zeros(0, dtype=np.int64), np.zeros(0))  # two empty rows: the bias alone
    w, b = fit_logistic(np.zeros(1024), 0.0, X, np.array([6.0, 0.0]), np.array([2.0, 0.0]), lr=4.0, steps=500, l2=0.0)
    assert b == pytest.approx(np.log(6 / 2), abs=1e-6)  # pooled rate 6/8: log-odds ln 3
    assert not w.any()


def test_evidence_decays_by_half_life_in_model_versions():
    sel = PassPredictorSelection(1)
    configure(sel, policy(half_life=2.0))
    sel.observe_rates(np.array([0]), np.array([8]), np.array([8]), np.array([0]))
    sel.observe_rates(np.array([0]), np.array([0]), np.array([8]), np.array([2]))
    # the 8 correct of version 0 count half at version 2; the 8 wrong of version 2 count whole
    assert sel.successes[0] == pytest.approx(4.0) and sel.failures[0] == pytest.approx(8.0) and sel.version[0] == 2


def test_an_unseen_task_is_predicted_from_tasks_with_prompts_like_it():
    texts = [f"{a}+{b}" for a, b in zip(range(100, 120), range(300, 320))] + [str(a) for a in range(500, 520)]
    sel = PassPredictorSelection(40)
    configure(sel, policy())
    sel._bind(ctx(40, prompts=texts))
    seen = np.r_[0:10, 20:30]  # half of each family; additions never solved, copies always
    correct = np.where(seen < 20, 0, 8)
    for v in range(5):
        sel.observe_rates(seen, correct, np.full(20, 8), np.full(20, v))
    m = sel.model_pass_rate()
    assert m[10:20].max() < 0.2 and m[30:40].mean() > 0.8 and m[30:40].min() > 0.5  # the unseen ones of either family


def test_a_task_passed_over_max_skip_epochs_turns_is_rolled_out_at_the_next():
    sel = PassPredictorSelection(4, seed=1)
    configure(sel, policy(max_skip_epochs=1, floor=0.0, power=50.0))
    c = ctx(4, group_size=8)
    assert sorted(sel.select(4, c).tolist()) == [0, 1, 2, 3]  # epoch 0: the untrained model predicts 0.5, all kept
    for v in range(3):  # all solved: predicted never informative, keep chance (I / 0.5) ** 50 ~ 0
        sel.observe_rates(np.arange(4), np.full(4, 8), np.full(4, 8), np.full(4, v))
    picked = sel.select(4, c)
    # epoch 1 passes all four over; at epoch 2 each was passed over at 1 turn: due
    assert sorted(picked.tolist()) == [0, 1, 2, 3] and sel.picked_epochs.tolist() == [2, 2, 2, 2]
    assert sel.forced == 4 and sel.passed_over == 4


def test_unknown_and_out_of_range_options_are_refused_by_name():
    with pytest.raises(ValueError, match=r"selection_options\.keep_att"):
        OrchestratorCore(policy(keep_att=0.5), ["a", "b"])
    with pytest.raises(ValueError, match=r"selection_options\.floor.*1\.5"):
        OrchestratorCore(policy(floor=1.5), ["a", "b"])


def test_the_state_restores_the_model_the_evidence_and_the_next_draw():
    tasks = [f"t{i}" for i in range(12)]
    texts = [("7+" if i % 2 else "") + str(i) for i in range(12)]
    core = OrchestratorCore(policy(), tasks, seed=4, task_texts=texts)
    ids = core.select_tasks(4)
    core.submit([group(t, [1.0, 1.0, 1.0, -1.0], version=1) for t in ids])
    saved = json.loads(json.dumps(core.state_dict()))
    other = OrchestratorCore(policy(), tasks, seed=4)  # no texts given: they come back from the state
    other.load_state_dict(saved)
    assert other.task_texts == texts
    a, b = core.selection, other.selection
    assert b.bias == a.bias and np.array_equal(b.weights, a.weights) and np.array_equal(b.successes, a.successes)
    assert other.task_stats(ids[0]).selection_row == core.task_stats(ids[0]).selection_row
    assert other.select_tasks(6) == core.select_tasks(6)


def test_the_task_row_shows_the_prediction():
    core = OrchestratorCore(policy(), ["a", "b"], task_texts=["1+1", "2+2"])
    ids = core.select_tasks(2)
    core.submit([group(t, [1.0, -1.0, -1.0, -1.0]) for t in ids])
    row = core.task_stats("a").selection_row
    assert set(row) == {"model_pass_rate", "predicted_pass_rate", "predicted_informative", "keep_probability",
                        "own_evidence_rollouts", "epochs_since_drawn"}
    assert row["own_evidence_rollouts"] == pytest.approx(4.0) and row["epochs_since_drawn"] == 1
    # posterior mean (k m + s) / (k + s + f) with k = 4, s = 1, f = 3
    assert row["predicted_pass_rate"] == pytest.approx((4 * row["model_pass_rate"] + 1) / 8)


def test_prediction_quality_is_scored_before_learning():
    sel = PassPredictorSelection(2)
    configure(sel, policy())
    sel.observe_rates(np.array([0, 1]), np.array([8, 0]), np.array([8, 8]), np.array([0, 0]))
    m = sel.metrics()
    # both predicted 0.5 by the untrained model: Brier ((0.5 - 1)^2 + (0.5 - 0)^2) / 2; no spread of predictions, no correlation
    assert m["predictions_scored"] == 2 and m["prediction_brier"] == pytest.approx(0.25) and "prediction_corr" not in m
