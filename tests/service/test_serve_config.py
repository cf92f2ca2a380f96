"""The ``serve`` config: the REST service serves the actor its ``orchestrator`` section names."""

import pytest
from pydantic import ValidationError

from orchestrator.service.config import ServeConfig


def test_the_service_serves_the_actor_the_orchestrator_section_names():
    cfg = ServeConfig.model_validate({"orchestrator": {"name": "run-a-orchestrator", "namespace": "runs"}})
    assert (cfg.service.actor_name, cfg.service.namespace) == ("run-a-orchestrator", "runs")


def test_without_an_orchestrator_section_the_service_names_the_actor():
    cfg = ServeConfig.model_validate({"orchestrator": None, "service": {"actor_name": "run-b", "namespace": "runs"}})
    assert (cfg.service.actor_name, cfg.service.namespace) == ("run-b", "runs")


def test_two_different_actor_names_are_refused_naming_both_fields():
    with pytest.raises(ValidationError, match=r"service\.actor_name 'other' differs from orchestrator\.name 'run-a'"):
        ServeConfig.model_validate({"orchestrator": {"name": "run-a"}, "service": {"actor_name": "other"}})


def test_the_same_actor_name_given_twice_is_accepted():
    cfg = ServeConfig.model_validate({"orchestrator": {"name": "run-a"}, "service": {"actor_name": "run-a"}})
    assert cfg.service.actor_name == "run-a"


def test_the_orchestrator_section_sets_the_actors_retry_window():
    from orchestrator.service.config import build_orchestrator_args

    cfg = ServeConfig.model_validate({"orchestrator": {"retry_window": 7}})
    assert build_orchestrator_args(cfg.orchestrator)[1]["retry_window"] == 7


def test_a_retry_window_below_one_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match=r"orchestrator\.retry_window\n  Input should be greater than or equal to 1"):
        ServeConfig.model_validate({"orchestrator": {"retry_window": 0}})
