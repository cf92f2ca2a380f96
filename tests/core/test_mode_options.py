"""Every registered mode takes a typed options model: an unknown or misplaced option is refused
naming the field, when the policy is built and on a run-time change (no Ray; the REST route is
tests/service/test_rest.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.modes import MODES
from orchestrator.core.policy import MODE_FIELDS, InvalidPolicyError, ResamplingPolicy
from orchestrator.core.registry import ModeOptions
from orchestrator.core.selections import make_selection

EVERY_MODE = [(field, name) for field, reg in MODES.items() for name in reg]


def misplaced(field: str, name: str) -> list[str]:
    """Options of other modes of ``field`` that mode ``name`` does not take."""
    own = MODES[field][name].Options.model_fields
    return sorted({k for other in MODES[field].values() for k in other.Options.model_fields} - set(own))


def test_the_mode_fields_are_the_registries():
    assert set(MODE_FIELDS) == set(MODES) == {"selection", "screen", "group_validity", "stale_members", "replenish", "on_cap"}
    assert len(EVERY_MODE) == 19  # 6 selections (pass_predictor the newest), 3 screens, 2 + 2 + 3 + 3 others


@pytest.mark.parametrize(("field", "name"), EVERY_MODE)
def test_a_mode_has_a_typed_options_model_refusing_unknown_keys(field, name):
    cls = MODES[field][name].Options
    assert issubclass(cls, ModeOptions) and cls.model_config["extra"] == "forbid"
    cls()  # every option has a default
    with pytest.raises(ValidationError, match="no_such_option"):
        cls(no_such_option=1)


@pytest.mark.parametrize(("field", "name"), EVERY_MODE)
def test_a_mode_built_directly_refuses_an_unknown_option(field, name):
    cls = MODES[field][name]
    with pytest.raises(ValidationError, match="no_such_option"):
        cls(4, 0, {"no_such_option": 1}) if field == "selection" else cls({"no_such_option": 1})


@pytest.mark.parametrize(("field", "name"), EVERY_MODE)
def test_an_unknown_option_is_refused_naming_the_field(field, name):
    message = f"{field}_options.no_such_option: not an option of {field} {name!r}"
    with pytest.raises(InvalidPolicyError, match=message):
        ResamplingPolicy.parse({field: name, f"{field}_options": {"no_such_option": 1.0}})
    with pytest.raises(InvalidPolicyError, match=message):
        ResamplingPolicy().updated({field: name, f"{field}_options": {"no_such_option": 1.0}})  # REST PATCH, CLI


@pytest.mark.parametrize(("field", "name", "option"), [(f, n, o) for f, n in EVERY_MODE for o in misplaced(f, n)])
def test_an_option_of_another_mode_is_refused_naming_its_owner(field, name, option):
    with pytest.raises(InvalidPolicyError, match=rf"{field}_options\.{option}: not an option of {field} '{name}' \(an option of"):
        ResamplingPolicy.parse({field: name, f"{field}_options": {option: 0.5}})


def test_the_misplaced_options_of_the_issue_are_refused():
    # selection 'epoch' with predicted_skip's keep_at; 'informative' with GRESO's p_start
    with pytest.raises(ValueError, match="selection_options.keep_at: not an option of selection 'epoch'"):
        ResamplingPolicy(selection="epoch", selection_options={"keep_at": 0.3})
    with pytest.raises(ValueError, match="selection_options.p_start: not an option of selection 'informative'"):
        ResamplingPolicy(selection="informative", selection_options={"p_start": 0.3})


def test_an_out_of_range_option_is_refused_naming_it_and_the_value():
    with pytest.raises(ValueError, match=r"selection_options.sharpness: Input should be greater than 0 \(got 0\)"):
        ResamplingPolicy(selection="informative", selection_options={"sharpness": 0})


def test_the_active_selection_is_built_with_its_options_and_the_others_with_defaults():
    p = ResamplingPolicy(selection="greso", selection_options={"p_start": 0.8})
    assert make_selection("greso", 4, 0, p).p_easy == 0.8
    assert make_selection("greso_prior", 4, 0, p).p_easy == 0.5  # not the active mode: its defaults


def test_changing_the_mode_drops_the_old_modes_options():
    p = ResamplingPolicy(selection="greso", selection_options={"p_start": 0.8})
    q = p.updated({"selection": "informative"})
    assert q.selection_options == {} and q.mode_options("selection").explore == 0.01
    with pytest.raises(InvalidPolicyError, match="selection_options.p_start"):
        p.updated({"selection": "informative", "selection_options": {"p_start": 0.8}})


def test_a_run_time_change_of_the_options_reaches_the_active_selection():
    c = OrchestratorCore(ResamplingPolicy(selection="informative"), ["a", "b"], seed=0)
    c.set_policy(c.policy.updated({"selection_options": {"revisit_epochs": 2}}))
    assert c.selection.options.revisit_epochs == 2


def test_old_informative_fields_keep_loading_into_selection_options():
    p = ResamplingPolicy.parse({"selection": "informative", "selection_explore": 0.0, "selection_revisit_epochs": 2})
    assert p.selection_options == {"explore": 0.0, "revisit_epochs": 2}
    assert p.mode_options("selection").revisit_epochs == 2
    # a dump of an old policy carries them at their defaults whatever the selection: dropped
    old = {"selection": "epoch", "selection_explore": 0.01, "selection_sharpness": 4.0, "selection_revisit_epochs": 8}
    assert ResamplingPolicy.parse(old).selection_options == {}


def test_an_old_informative_field_under_another_selection_is_refused_saying_what_to_write():
    with pytest.raises(InvalidPolicyError, match=r"selection_explore: moved to selection_options.explore, an option of "
                                                 r"selection 'informative' \(selection is 'greso'\); write selection: "
                                                 r"informative, selection_options: \{explore: 0.3\}"):
        ResamplingPolicy.parse({"selection": "greso", "selection_explore": 0.3})


def test_old_screen_fields_keep_loading_as_the_screen_mode():
    p = ResamplingPolicy.parse({"group_size": 8, "screen_rollouts": 3, "screen_skip_above": 0.9})
    assert (p.screen, p.screen_options) == ("rollouts", {"rollouts": 3, "skip_above": 0.9})
    p = ResamplingPolicy.parse({"answer_screen": True, "answer_keep_at": 0.8, "answer_floor": 0.0})
    assert (p.screen, p.screen_options) == ("answer", {"keep_at": 0.8, "floor": 0.0})
    assert p.mode_options("screen").keep_power == 4.0
    # an old dump: both switches off, every option at its old default
    old = {"screen_rollouts": 0, "screen_skip_above": 1.0, "screen_continue_above": 1.0, "answer_screen": False,
           "answer_keep_at": 0.5, "answer_keep_power": 4.0, "answer_reuse_versions": 8, "answer_floor": 0.0}
    assert ResamplingPolicy.parse(old).screen == "none"


def test_an_old_switch_turns_the_screen_off_on_a_run_time_change():
    p = ResamplingPolicy(screen="answer", screen_options={"keep_at": 0.8})
    q = p.updated({"answer_screen": False})
    assert (q.screen, q.screen_options) == ("none", {})


def test_both_old_screens_at_once_are_refused_saying_what_to_write():
    with pytest.raises(InvalidPolicyError, match="screen_rollouts and answer_screen: one screen at a time; write screen: rollouts"):
        ResamplingPolicy.parse({"group_size": 8, "screen_rollouts": 2, "answer_screen": True})


def test_an_old_answer_option_without_the_answer_screen_is_refused_saying_what_to_write():
    with pytest.raises(InvalidPolicyError, match=r"answer_keep_at: moved to screen_options.keep_at, an option of screen "
                                                 r"'answer' \(screen is 'none'\); write screen: answer, screen_options: \{keep_at: 0.8\}"):
        ResamplingPolicy.parse({"answer_keep_at": 0.8})


def test_a_screen_as_long_as_the_group_is_refused():
    with pytest.raises(InvalidPolicyError, match=r"screen_options.rollouts \(8\) must be < group_size \(8\)"):
        ResamplingPolicy.parse({"group_size": 8, "screen": "rollouts", "screen_options": {"rollouts": 8}})


def test_the_json_schema_lists_every_registered_name():
    props = ResamplingPolicy.model_json_schema()["properties"]
    for field, reg in MODES.items():
        assert props[field]["enum"] == list(reg)
    assert props["selection"]["enum"] == ["epoch", "informative", "greso", "predicted_skip", "greso_prior", "pass_predictor"]
