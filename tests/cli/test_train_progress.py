"""The per-step progress line of ``trinity-dso train``."""

from orchestrator.cli.train import progress_line


def test_a_skipped_step_says_no_update_instead_of_trainer_metrics():
    row = {"step": 3, "rollouts": 512, "keep_rate": 0.0, "model_version": 2, "train_skipped": 1.0}
    assert progress_line(row) == "step   3 | rollouts    512 | keep 0.00 | no informative group: no update | v2"
