"""The example demo configs validate, and a bad value is refused naming the field."""

from pathlib import Path

import pytest
import typer

from orchestrator.cli.service import load_yaml_model
from orchestrator.jobs.dapo_demo import DemoConfig
from orchestrator.jobs.gigpo import GiGPOJobConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "demo"


def test_dapo_example_config_validates_with_overrides():
    cfg = load_yaml_model(EXAMPLES / "dapo.yaml", DemoConfig, {"batches": 2, "backend": None})
    assert cfg.batches == 2 and cfg.backend == "vllm"
    assert cfg.policy.replenish == "same_tasks" and cfg.policy.filter.judge == "accuracy"


def test_gigpo_example_config_validates():
    cfg = load_yaml_model(EXAMPLES / "gigpo.yaml", GiGPOJobConfig)
    assert cfg.redis_url == "redis://127.0.0.1:6379/0" and cfg.gigpo.gamma == 0.95


def test_bad_config_value_names_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  target_groups: 0\n")
    with pytest.raises(typer.BadParameter, match=r"policy.target_groups: .* \(got 0\)"):
        load_yaml_model(bad, DemoConfig)


def test_the_selection_comparison_configs_differ_only_in_selection_and_output():
    from orchestrator.jobs.dapo_train import DapoTrainConfig

    inf = load_yaml_model(EXAMPLES / "train_informative.yaml", DapoTrainConfig)
    epoch = load_yaml_model(EXAMPLES / "train_epoch.yaml", DapoTrainConfig)
    assert inf.policy.selection == "informative" and epoch.policy.selection == "epoch"
    assert inf.policy.model_copy(update={"selection": "epoch"}) == epoch.policy
    assert inf.rollout_budget == epoch.rollout_budget == 12000


def test_the_answer_screen_config_differs_from_epoch_only_in_the_screen_and_output():
    from orchestrator.jobs.dapo_train import DapoTrainConfig

    screen = load_yaml_model(EXAMPLES / "train_answer_screen.yaml", DapoTrainConfig)
    epoch = load_yaml_model(EXAMPLES / "train_epoch.yaml", DapoTrainConfig)
    assert (screen.policy.screen, epoch.policy.screen) == ("answer", "none")
    assert screen.policy.model_copy(update={"screen": "none"}) == epoch.policy
    assert screen.rollout_budget == epoch.rollout_budget and screen.out_dir != epoch.out_dir

