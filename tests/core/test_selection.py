"""Task selection modes: draw weights, weighted order, round filling, revisit bound, state."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.selection import (
    EpochSelection,
    InformativeOptions,
    InformativeSelection,
    SelectionContext,
    draw_weights,
    weighted_order,
)


def informative_selection(num_tasks, seed=0, **options):
    """``informative`` with explore 0.1, sharpness 1 and revisit 4 unless given (the values these tests were computed for)."""
    return InformativeSelection(num_tasks, seed, InformativeOptions(**{"explore": 0.1, "sharpness": 1.0, "revisit_epochs": 4, **options}))


def ctx(informative, skip=None, **kw):
    informative = np.asarray(informative, dtype=np.float64)
    skip = np.zeros(len(informative), dtype=np.int64) if skip is None else np.asarray(skip, dtype=np.int64)
    return SelectionContext(skip_until_epoch=skip, informative=informative, **kw)


def test_draw_weights_by_hand():
    # w = (1, 0.5, 0, -) over the eligible; 0.9 * w / 1.5 + 0.1 / 3
    q = draw_weights(np.array([1.0, 0.5, 0.0, 0.5]), np.array([True, True, True, False]), 0.1, 1.0)
    np.testing.assert_allclose(q, [0.6 + 0.1 / 3, 0.3 + 0.1 / 3, 0.1 / 3, 0.0], atol=1e-12)


def test_draw_weights_sharpness_squares():
    q = draw_weights(np.array([1.0, 0.5]), np.array([True, True]), 0.0, 2.0)
    np.testing.assert_allclose(q, [0.8, 0.2], atol=1e-12)  # 1 : 0.25


def test_draw_weights_uniform_without_any_informativeness():
    q = draw_weights(np.zeros(4), np.array([True, True, False, True]), 0.0, 1.0)
    np.testing.assert_allclose(q, [1 / 3, 1 / 3, 0.0, 1 / 3], atol=1e-12)


def test_weighted_order_draws_first_in_proportion_to_q():
    q = np.array([0.5, 0.3, 0.2, 0.0])
    rng = np.random.default_rng(0)
    firsts = np.bincount([weighted_order(q, rng)[0] for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(firsts, q, atol=0.015)


def test_weighted_order_leaves_out_zero_weights():
    order = weighted_order(np.array([0.0, 0.7, 0.0, 0.3]), np.random.default_rng(1))
    assert sorted(order.tolist()) == [1, 3]


def test_epoch_selection_walks_the_seeded_permutation():
    sel = EpochSelection(5, seed=3)
    perm = np.random.default_rng([3, 0]).permutation(5).tolist()
    c = ctx(np.zeros(5))
    assert sel.select(3, c).tolist() + sel.select(2, c).tolist() == perm
    assert sel.epoch == 1 and sel.cursor == 0


def test_fill_takes_the_shortest_prefix_reaching_need():
    # no exploration and only tasks 0 and 1 informative: they come first in some order
    sel = informative_selection(4, seed=0, explore=0.0)
    picked = sel.fill(1.5, 10, ctx([0.9, 0.8, 0.0, 0.0]))
    assert sorted(picked.tolist()) == [0, 1]  # 0.9 + 0.8 >= 1.5, and no single task reaches it


def test_fill_stops_at_limit():
    sel = informative_selection(4, seed=0, explore=0.0)
    assert len(sel.fill(3.0, 2, ctx([0.9, 0.8, 0.7, 0.6]))) == 2


def test_fill_with_nothing_needed_picks_nothing():
    sel = informative_selection(4, seed=0)
    assert len(sel.fill(0.0, 4, ctx([0.5] * 4))) == 0 and sel.picks == 0


@settings(max_examples=40, deadline=None)
@given(
    informative=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=30),
    need=st.floats(0.01, 10.0),
    seed=st.integers(0, 1000),
)
def test_fill_prefix_is_minimal(informative, need, seed):
    sel = informative_selection(len(informative), seed=seed)
    c = ctx(informative)
    picked = sel.fill(need, len(informative), c)
    got = c.informative[picked].sum()
    assert got >= need - 1e-9 or len(picked) == len(informative)
    assert c.informative[picked[:-1]].sum() < need


def test_ineligible_tasks_are_never_drawn():
    sel = informative_selection(4, seed=0)
    picked = sel.select(4, ctx([1.0, 1.0, 1.0, 1.0], skip=[0, 5, 0, 5]))
    assert sorted(picked.tolist()) == [0, 2]


@settings(max_examples=25, deadline=None)
@given(
    num_tasks=st.integers(2, 40),
    revisit=st.integers(1, 3),
    round_size=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_every_task_is_drawn_within_revisit_plus_one_epochs(num_tasks, revisit, round_size, seed):
    # only task 0 is ever worth drawing and there is no exploration: the others come only when due
    sel = informative_selection(num_tasks, seed=seed, explore=0.0, revisit_epochs=revisit)
    c = ctx([1.0] + [0.0] * (num_tasks - 1))
    last = np.zeros(num_tasks, dtype=np.int64)
    worst = 0
    for _ in range(4 * (revisit + 2) * num_tasks // round_size + 4):
        picked = sel.select(round_size, c)
        gap = sel.picks - last[picked]
        worst = max(worst, int(gap.max(initial=0)))
        last[picked] = sel.picks
    assert worst <= (revisit + 1) * num_tasks + round_size


def test_informative_state_round_trip_repeats_the_next_draw():
    sel = informative_selection(20, seed=5)
    c = ctx(np.linspace(0, 1, 20))
    sel.select(7, c)
    copy = informative_selection(20, seed=5)
    copy.load_state_dict(sel.state_dict())
    assert copy.select(7, c).tolist() == sel.select(7, c).tolist()


def test_informative_state_of_another_task_count_is_refused():
    with pytest.raises(ValueError, match="selection.last_pick: expected 3 tasks"):
        InformativeSelection(3).load_state_dict(InformativeSelection(4).state_dict())
