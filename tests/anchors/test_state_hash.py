"""The canonical state hash for env_state_hash."""

import numpy as np
import pytest

from orchestrator.anchors.state_hash import state_hash, text_hash


def test_mapping_key_order_does_not_matter():
    assert state_hash({"agent": [1, 2], "box": {"x": 3, "y": 4}}) == state_hash({"box": {"y": 4, "x": 3}, "agent": [1, 2]})


def test_list_order_matters():
    assert state_hash([1, 2]) != state_hash([2, 1])


def test_kinds_are_told_apart():
    assert len({state_hash(1), state_hash(1.0), state_hash(True), state_hash("1")}) == 4


def test_numpy_array_hashes_dtype_shape_and_values():
    a = np.arange(4, dtype=np.int64)
    assert state_hash(a) == state_hash(np.arange(4, dtype=np.int64))
    assert state_hash(a) != state_hash(a.reshape(2, 2))
    assert state_hash(a) != state_hash(a.astype(np.int32))


def test_result_is_a_sha1_hex_string():
    h = state_hash({"pos": (0, 1)})
    assert len(h) == 40 and int(h, 16) >= 0


def test_unsupported_object_is_refused_naming_the_path():
    with pytest.raises(TypeError, match=r"object at \['grid'\]"):
        state_hash({"grid": object()})


def test_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        state_hash([0.0, float("nan")])


def test_text_hash_is_the_sha1_of_the_utf8_text_and_state_hash_hashes_its_canonical_text_with_it():
    assert text_hash("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d"  # FIPS 180-2, appendix A.1
    assert state_hash("1") == text_hash('["s","1"]') and state_hash(1) == text_hash('["i",1]')


def test_text_hash_refuses_what_is_not_a_str():
    with pytest.raises(TypeError, match="text_hash: expected str, got bytes"):
        text_hash(b"abc")
