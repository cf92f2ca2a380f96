"""Every numeric setting refuses a non-finite or out-of-range value, naming the field.

The config models are discovered by walking ``algos`` and ``orchestrator`` (every pydantic
model, less the output and data records listed in ``NOT_SETTINGS``, each with its reason), and
their numeric fields and ranges are read off the models themselves, so a new model or field is
covered without editing this file. The public maths functions of ``algos`` are discovered the
same way and must each appear in ``FUNCTIONS`` (with their numeric settings and ranges) or in
``NO_SETTINGS`` (with the reason), so a new function cannot escape either.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import types
import typing

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import algos
import orchestrator
from algos import dapo, gigpo, groups

# ------------------------------------------------------------------------------ discovery
MODULES = [
    importlib.import_module(m.name)
    for pkg in (algos, orchestrator)
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
]

NOT_SETTINGS = {
    "orchestrator.core.stats": "output records (the core's counters and estimates), never read as settings",
    "orchestrator.core.validate": "data (the rollouts): a NaN or inf reward is judged by the core, masked or refused there",
    "orchestrator.service.api.ErrorResponse": "a response body",
    "orchestrator.service.api.PolicyState": "a response body",
    "orchestrator.service.api.Health": "a response body",
}

REQUIRED = {  # the smallest valid values of required fields
    "OverlongConfig": {"max_response_length": 16, "cache_length": 4},
    "FrozenLakeRow": {"seed": 0, "size": 4},
}


def _excluded(cls: type) -> bool:
    return cls.__module__ in NOT_SETTINGS or f"{cls.__module__}.{cls.__qualname__}" in NOT_SETTINGS


def _models() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for mod in MODULES:
        for obj in vars(mod).values():
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == mod.__name__ and not _excluded(obj):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _base(cls: type[BaseModel]) -> dict:
    """Valid keyword arguments of a model: its defaults, or a whole policy for the REST PUT bodies."""
    from orchestrator.core.policy import FilterConfig, ResamplingPolicy

    if cls.__name__ == "PolicyReplace":
        return ResamplingPolicy().model_dump()
    if cls.__name__ == "FilterReplace":
        return FilterConfig().model_dump()
    return dict(REQUIRED.get(cls.__name__, {}))


def _numeric(annotation: typing.Any) -> type | None:
    kinds = {annotation, *typing.get_args(annotation)}
    return float if float in kinds else int if int in kinds else None


def _bounds(metadata: list) -> dict:
    out = {}
    for m in metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


def _outside(kind: type, bounds: dict) -> st.SearchStrategy:
    """Values that are not finite, fractional for an int, or outside ``bounds``."""
    bad: list[st.SearchStrategy] = [st.sampled_from([math.nan, math.inf, -math.inf])]
    if kind is int:
        bad.append(st.floats(0.1, 0.9).map(lambda f: 3 + f))
    finite = {"allow_nan": False, "allow_infinity": False}
    for key, b in bounds.items():
        b = float(b)
        if kind is int:
            edge = {"ge": math.ceil(b) - 1, "gt": math.floor(b), "le": math.floor(b) + 1, "lt": math.ceil(b)}[key]
            bad.append(st.integers(max_value=int(edge)) if key in ("ge", "gt") else st.integers(min_value=int(edge)))
        elif key in ("ge", "gt"):
            bad.append(st.floats(max_value=b, exclude_max=key == "ge", **finite))
        else:
            bad.append(st.floats(min_value=b, exclude_min=key == "le", **finite))
    return st.one_of(bad)


MODEL_CASES = [
    pytest.param(cls, name, _outside(kind, _bounds(info.metadata)), id=f"{cls.__qualname__}.{name}")
    for cls in _models()
    for name, info in cls.model_fields.items()
    if (kind := _numeric(info.annotation)) is not None
]


# ------------------------------------------------------------------------------ maths functions
def _loss_inputs(**kw):
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    return {"logprobs": lp, "old_logprobs": lp, "advantages": torch.ones(2, 3), "response_mask": mask, **kw}


def _from_moments(**kw):
    one = np.ones(2)
    return gigpo.normalise_from_moments(one, 2 * one, one, 0 * one, 0 * one, **kw)


def _adapter(path: str):
    def make(**kw):
        module, name = path.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)(**kw)

    return make


FUNCTIONS = {  # name: (call with the given settings on valid data, {setting: bounds})
    "algos.dapo.classify_groups": (
        lambda **kw: dapo.classify_groups(np.array([[1.0, 0.0]]), **kw),
        {"std_tol": {"ge": 0}, "correct_threshold": {}, "wrong_threshold": {}},
    ),
    "algos.dapo.overlong_penalty": (
        lambda **kw: dapo.overlong_penalty(np.array([5]), **{"max_response_length": 10, "cache_length": 4, **kw}),
        {"max_response_length": {"gt": 0, "int": True}, "cache_length": {"gt": 0, "le": 10, "int": True},
         "penalty_factor": {"ge": 0}},
    ),
    "algos.dapo.group_advantages": (
        lambda **kw: dapo.group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), **kw), {"eps": {"ge": 0}},
    ),
    "algos.dapo.aggregate_loss": (
        lambda **kw: dapo.aggregate_loss(torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]]),
                                         "seq-mean-token-sum-norm", **{"norm_length": 4, **kw}),
        {"global_tokens": {"gt": 0}, "global_seqs": {"gt": 0}, "norm_length": {"gt": 0}},
    ),
    "algos.dapo.batch_share_loss": (
        lambda **kw: dapo.batch_share_loss(torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]]),
                                           "seq-mean-token-sum-norm", torch.tensor([[2.0, 2.0, 3.0]] * 2), **kw),
        {"norm_length": {"gt": 0}},
    ),
    "algos.dapo.clip_higher_policy_loss": (
        lambda **kw: dapo.clip_higher_policy_loss(**_loss_inputs(**kw)),
        {"eps_low": {"ge": 0, "lt": 1}, "eps_high": {"ge": 0}, "dual_clip": {"gt": 1}, "global_tokens": {"gt": 0},
         "global_seqs": {"gt": 0}, "norm_length": {"gt": 0}},
    ),
    "algos.dapo.clip_higher_token_loss": (
        lambda **kw: dapo.clip_higher_token_loss(**_loss_inputs(**kw)),
        {"eps_low": {"ge": 0, "lt": 1}, "eps_high": {"ge": 0}, "dual_clip": {"gt": 1}},
    ),
    "algos.groups.check_norm": (lambda eps: groups.check_norm("std", eps), {"eps": {"ge": 0}}),
    "algos.groups.normalise_in_groups": (
        lambda **kw: groups.normalise_in_groups(np.array([1.0, 0.0]), np.array([0, 0]), **kw), {"eps": {"ge": 0}},
    ),
    "algos.gigpo.discounted_returns": (
        lambda **kw: gigpo.discounted_returns(np.ones(2), np.zeros(2), np.arange(2), **kw), {"gamma": {"ge": 0, "le": 1}},
    ),
    "algos.gigpo.episode_advantages": (
        lambda **kw: gigpo.episode_advantages(np.ones(2), np.zeros(2), np.arange(2), **kw), {"eps": {"ge": 0}},
    ),
    "algos.gigpo.step_advantages": (
        lambda **kw: gigpo.step_advantages(np.array([1.0, 0.0]), np.zeros(2), **kw), {"eps": {"ge": 0}},
    ),
    "algos.gigpo.multi_step_grpo_advantages": (
        lambda **kw: gigpo.multi_step_grpo_advantages(np.zeros(2), np.arange(2), np.zeros(2), np.ones(2), **kw),
        {"eps": {"ge": 0}},
    ),
    "algos.gigpo.normalise_from_moments": (_from_moments, {"eps": {"ge": 0}}),
    "algos.gigpo.similarity_anchor_ids": (
        lambda **kw: gigpo.similarity_anchor_ids(np.zeros(2), ["a b", "a c"], **kw), {"threshold": {"gt": 0, "le": 1}},
    ),
    # the Trinity adapters' numeric arguments (their YAML names)
    "orchestrator.trinity.advantage.grpo.DsoGRPOAdvantageFn": (
        _adapter("orchestrator.trinity.advantage.grpo.DsoGRPOAdvantageFn"), {"epsilon": {"gt": 0}},
    ),
    "orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn": (
        _adapter("orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn"),
        {"omega": {"ge": 0}, "gamma": {"ge": 0, "le": 1}, "epsilon": {"gt": 0}, "invalid_action_penalty": {"ge": 0},
         "similarity_threshold": {"gt": 0, "le": 1}},
    ),
    "orchestrator.trinity.advantage.gigpo_index.DsoGiGPOIndexAdvantageFn": (
        _adapter("orchestrator.trinity.advantage.gigpo_index.DsoGiGPOIndexAdvantageFn"),
        {"ttl_s": {"gt": 0}, "wait_timeout_s": {"ge": 0}, "lookup_timeout_s": {"ge": 0}, "group_size": {"ge": 1, "int": True},
         "omega": {"ge": 0}},
    ),
}

NO_SETTINGS = {
    "algos.checks.check_number": "the shared check itself",
    "algos.dapo.LossAggMode": "a type",
    "algos.dapo.batch_loss_counts": "a mask only",
    "algos.groups.dense_ids": "keys only",
    "algos.groups.first_rows": "codes and their count, derived by the caller",
    "algos.groups.group_value_order": "a permutation of data",
    "algos.gigpo.encode_keys": "keys only",
    "algos.gigpo.anchor_group_ids": "keys only",
    "algos.gigpo.hash_keys": "keys only",
    "algos.gigpo.broadcast_to_tokens": "data only (advantages times a mask)",
    "algos.gigpo.consecutive_order": "a permutation of data (trajectory codes and steps)",
    "algos.gigpo.gigpo_advantages": "settings come as a GiGPOConfig (swept with the models)",
    "algos.gigpo.gigpo_advantages_coded": "settings come as a GiGPOConfig (swept with the models)",
}

FUNCTION_CASES = [
    pytest.param(call, name, _outside(int if b.get("int") else float, {k: v for k, v in b.items() if k != "int"}),
                 id=f"{key.rsplit('.', 1)[1]}.{name}")
    for key, (call, params) in FUNCTIONS.items()
    for name, b in params.items()
]


# ------------------------------------------------------------------------------ the test
@pytest.mark.parametrize(("target", "field", "bad"), MODEL_CASES + FUNCTION_CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_non_finite_or_out_of_range_setting_is_refused_naming_the_field(target, field, bad, data):
    value = data.draw(bad, label=field)
    if inspect.isclass(target) and issubclass(target, BaseModel):
        with pytest.raises(ValidationError) as err:
            target(**{**_base(target), field: value})
        assert field in {str(p) for e in err.value.errors() for p in e["loc"]}, err.value
    else:
        with pytest.raises(ValueError) as err:
            target(**{field: value})
        assert field in str(err.value), err.value


def test_every_public_maths_function_is_swept_or_has_no_numeric_setting():
    public = {
        f"{mod.__name__}.{name}"
        for mod in MODULES if mod.__name__.startswith("algos.")
        for name, obj in vars(mod).items()
        if not name.startswith("_") and isinstance(obj, types.FunctionType) and obj.__module__ == mod.__name__
    }
    assert public - set(FUNCTIONS) - set(NO_SETTINGS) == set()
    assert len(MODEL_CASES) > 100  # the discovery found the models' fields
