"""The per-step progress line of ``trinity-dso train``."""

from orchestrator.cli.train import progress_line


def test_a_skipped_step_says_no_update_instead_of_trainer_metrics():
    row = {"step": 3, "rollouts": 512, "keep_rate": 0.0, "model_version": 2, "train_skipped": 1.0}
    assert progress_line(row) == "step   3 | rollouts    512 | keep 0.00 | no informative group: no update | v2"


def test_a_trained_step_shows_its_metrics_and_the_held_out_accuracy():
    row = {"step": 12, "rollouts": 2048, "keep_rate": 0.5, "model_version": 12, "reward_mean": 0.25, "entropy": 0.5,
           "pg_clipfrac": 0.01, "pg_clipfrac_lower": 0.0, "kl_ref": 0.0123, "heldout_acc": 0.5}
    assert progress_line(row) == ("step  12 | rollouts   2048 | keep 0.50 | reward 0.25 | entropy 0.500 | "
                                  "clip 0.010/0.000 | kl 0.0123 | v12 | held-out acc 0.500")
