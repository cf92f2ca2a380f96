"""The task selector reads each row's prompt from Trinity's taskset, as Trinity's own selectors read features."""

from __future__ import annotations

import pytest
from datasets import Dataset
from trinity.buffer.reader.file_reader import _HFBatchReader
from trinity.common.config import DataSelectorConfig

from orchestrator.trinity.selector import prompt_column


def reader(**columns) -> _HFBatchReader:
    return _HFBatchReader(Dataset.from_dict(columns), "t", default_batch_size=2, enable_progress_bar=False)


def test_the_prompt_column_is_read_by_default():
    src = reader(prompt=["1+2", "3,4"], answer=["3", "4"])
    assert prompt_column(src, DataSelectorConfig(selector_type="dso_orchestrator")) == ["1+2", "3,4"]


def test_feature_keys_name_the_columns_joined_by_newlines():
    src = reader(question=["q0", "q1"], context=["c0", "c1"], answer=["a", "b"])
    cfg = DataSelectorConfig(selector_type="dso_orchestrator", feature_keys=["question", "context"])
    assert prompt_column(src, cfg) == ["q0\nc0", "q1\nc1"]


def test_a_taskset_without_a_prompt_column_gives_none():
    assert prompt_column(reader(question=["q0"], answer=["a"]), DataSelectorConfig(selector_type="dso_orchestrator")) is None


def test_a_feature_key_the_taskset_lacks_is_refused_by_name():
    cfg = DataSelectorConfig(selector_type="dso_orchestrator", feature_keys=["nope"])
    with pytest.raises(ValueError, match=r"data_selector\.feature_keys: \['nope'\] not among the taskset's columns"):
        prompt_column(reader(prompt=["p"], answer=["a"]), cfg)
