"""Result files are strict JSON: no NaN or Infinity, numpy and torch values written plain."""

import json
import math

import numpy as np
import pytest
import torch

from orchestrator.jobs.results import write_json


def strict_load(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_written_as_null(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"keep_rate": math.nan, "steps": [{"x": float("inf")}, {"x": -math.inf}], "n": np.float64("nan")})
    assert strict_load(path.read_text()) == {"keep_rate": None, "steps": [{"x": None}, {"x": None}], "n": None}


def test_numpy_and_torch_values_are_written_as_plain_numbers(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"a": np.int64(3), "b": np.array([0.5, 1.5]), "c": torch.tensor(2.5), "d": (1, 2), "e": tmp_path})
    assert strict_load(path.read_text()) == {"a": 3, "b": [0.5, 1.5], "c": 2.5, "d": [1, 2], "e": str(tmp_path)}


def test_an_object_json_cannot_write_is_refused(tmp_path):
    with pytest.raises(TypeError, match="object"):
        write_json(tmp_path / "r.json", {"x": object()})
