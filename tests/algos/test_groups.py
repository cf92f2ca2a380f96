"""The shared group normalisation (algos/groups.py)."""

import math

import numpy as np
import pytest

from algos.groups import normalise_in_groups


def test_std_normalisation_by_hand():
    # group 0: [1, 3] -> mean 2, unbiased std sqrt(2); group 1: singleton -> 0
    out = normalise_in_groups(np.array([1.0, 3.0, 5.0]), np.array([0, 0, 9]), norm="std", eps=0.0)
    np.testing.assert_allclose(out, [-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0], rtol=0, atol=1e-15)


def test_equal_values_give_exact_zero_even_without_eps():
    out = normalise_in_groups(np.array([0.35] * 7), np.zeros(7, dtype=int), norm="std", eps=0.0)
    assert (out == 0.0).all()


def test_negative_eps_is_refused_naming_it():
    with pytest.raises(ValueError, match="eps must be >= 0, got -1"):
        normalise_in_groups(np.array([1.0]), np.array([0]), eps=-1)
