"""The shared group normalisation (algos/groups.py)."""

import math

import numpy as np
import pytest

from algos.groups import first_rows, group_value_order, normalise_in_groups


def test_std_normalisation_by_hand():
    # group 0: [1, 3] -> mean 2, unbiased std sqrt(2); group 1: singleton -> 0
    out = normalise_in_groups(np.array([1.0, 3.0, 5.0]), np.array([0, 0, 9]), norm="std", eps=0.0)
    np.testing.assert_allclose(out, [-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0], rtol=0, atol=1e-15)


def test_equal_values_give_exact_zero_even_without_eps():
    out = normalise_in_groups(np.array([0.35] * 7), np.zeros(7, dtype=int), norm="std", eps=0.0)
    assert (out == 0.0).all()


def test_negative_eps_is_refused_naming_it():
    with pytest.raises(ValueError, match="eps: must be a finite number >= 0, got -1"):
        normalise_in_groups(np.array([1.0]), np.array([0]), eps=-1)


def test_group_value_order_sorts_by_group_then_value():
    g = np.array([1, 0, 1, 0, 1])
    v = np.array([0.5, 2.0, -1.0, 1.0, 3.0])
    # group 0: rows 3 (1.0), 1 (2.0); group 1: rows 2 (-1.0), 0 (0.5), 4 (3.0)
    assert group_value_order(g, v).tolist() == [3, 1, 2, 0, 4]


def test_group_value_order_past_16_bit_codes_sorts_the_same():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 2**17, 5000)
    v = rng.integers(0, 50, 5000).astype(np.float64)
    order = group_value_order(g, v)
    ref = np.lexsort((v, g))
    assert (g[order] == g[ref]).all() and (v[order] == v[ref]).all()


def test_a_negative_zero_normalises_as_zero_in_either_order():
    # two equal values: both exactly +0.0 whichever of 0.0 and -0.0 comes first (lexsort's
    # order made the second -0.0 - 0.0 = -0.0)
    for values in ([0.0, -0.0], [-0.0, 0.0]):
        out = normalise_in_groups(np.array(values), np.array([0, 0]), eps=0.0)
        assert out.tolist() == [0.0, 0.0] and not np.signbit(out).any()


def test_first_rows_gives_each_codes_first_row_and_n_for_absent_codes():
    # code 2 first at row 1, code 0 at row 2, code 3 never (-> 5, the row count)
    assert first_rows(np.array([1, 2, 0, 2, 1]), 4).tolist() == [2, 0, 1, 5]
